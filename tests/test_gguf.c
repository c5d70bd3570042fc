/* test_gguf.c - the GGUF reader: the real model files in tests/data/models read back as
 * their provenance describes them; files written here (a small GGUF writer below) with
 * every value type, alignment and tensor layout; every malformed header the reader must
 * refuse, each with its message; every truncation of a valid file refused; random byte
 * flips never crash; every allocation failing in turn. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvcache/gguf.h"
#include "test_helpers.h"

#define STORIES KVC_DATA_DIR "/models/stories260K.gguf"
#define TINY    KVC_DATA_DIR "/models/llama-2-tiny-random.gguf"

#include "gguf_writer.h"

/* A valid file with every value type, a string array, alignment 64 and three tensors
 * (f32 [4, 3], q8_0 [64], f16 [2]) with their data. */
static buf_t full_file(void)
{
    buf_t b = {0};
    header(&b, 3, 3, 16);
    put_str(&b, "u8"), put_u32(&b, KVC_GGUF_UINT8), put_u8(&b, 200);
    put_str(&b, "i8"), put_u32(&b, KVC_GGUF_INT8), put_u8(&b, (uint8_t)-5);
    put_str(&b, "u16"), put_u32(&b, KVC_GGUF_UINT16), put(&b, &(uint16_t){60000}, 2);
    put_str(&b, "i16"), put_u32(&b, KVC_GGUF_INT16), put(&b, &(int16_t){-30000}, 2);
    kv_u32(&b, "u32", 4000000000u);
    put_str(&b, "i32"), put_u32(&b, KVC_GGUF_INT32), put(&b, &(int32_t){-7}, 4);
    put_str(&b, "f32"), put_u32(&b, KVC_GGUF_FLOAT32), put(&b, &(float){1e-5f}, 4);
    put_str(&b, "yes"), put_u32(&b, KVC_GGUF_BOOL), put_u8(&b, 1);
    kv_str(&b, "general.architecture", "llama");
    put_str(&b, "u64"), put_u32(&b, KVC_GGUF_UINT64), put_u64(&b, UINT64_MAX);
    put_str(&b, "i64"), put_u32(&b, KVC_GGUF_INT64), put(&b, &(int64_t){INT64_MIN}, 8);
    put_str(&b, "f64"), put_u32(&b, KVC_GGUF_FLOAT64), put(&b, &(double){500000.0}, 8);
    put_str(&b, "tokens"), put_u32(&b, KVC_GGUF_ARRAY), put_u32(&b, KVC_GGUF_STRING);
    put_u64(&b, 3), put_str(&b, "<s>"), put_str(&b, ""), put_str(&b, "\xe2\x96\x81the");
    put_str(&b, "scores"), put_u32(&b, KVC_GGUF_ARRAY), put_u32(&b, KVC_GGUF_FLOAT32);
    put_u64(&b, 2), put(&b, &(float){-1.5f}, 4), put(&b, &(float){2.0f}, 4);
    put_str(&b, "types"), put_u32(&b, KVC_GGUF_ARRAY), put_u32(&b, KVC_GGUF_INT32);
    put_u64(&b, 2), put(&b, &(int32_t){-2}, 4), put(&b, &(int32_t){6}, 4);
    kv_u32(&b, "general.alignment", 64);
    tensor_info(&b, "a.weight", 2, (uint64_t[]){4, 3}, KVC_GGML_F32, 0);
    tensor_info(&b, "q.weight", 1, (uint64_t[]){64}, KVC_GGML_Q8_0, 64);
    tensor_info(&b, "h", 1, (uint64_t[]){2}, KVC_GGML_F16, 192);
    pad_to(&b, 64);
    for (int i = 0; i < 12; i++) put(&b, &(float){(float)i}, 4);
    pad_to(&b, 64);
    for (int i = 0; i < 68; i++) put_u8(&b, (uint8_t)i); /* 2 blocks of 34 */
    pad_to(&b, 64);
    put(&b, &(uint16_t){0x3c00}, 2), put(&b, &(uint16_t){0xc000}, 2);
    return b;
}

static int open_buf(const buf_t *b, kvc_gguf_t **g, char *err)
{
    return kvc_gguf_open_memory(b->p, b->n, NULL, g, err, 256);
}

/* ---- the real files ------------------------------------------------------------------ */
static void stories260k_reads_as_its_provenance_says(void **state)
{
    (void)state;
    char err[256];
    kvc_gguf_t *g;
    assert_ok(kvc_gguf_open(STORIES, NULL, &g, err, sizeof err));
    assert_int_equal(kvc_gguf_version(g), 3);
    assert_int_equal(kvc_gguf_n_tensors(g), 48);
    assert_int_equal(kvc_gguf_file_bytes(g), 1185376);
    kvc_gguf_str_t s;
    assert_ok(kvc_gguf_get_str(g, "general.architecture", &s));
    assert_true(kvc_gguf_str_eq(s, "llama"));
    const struct {
        const char *key;
        uint32_t want;
    } hp[] = {{"llama.context_length", 2048},     {"llama.embedding_length", 64},
              {"llama.feed_forward_length", 172}, {"llama.block_count", 5},
              {"llama.attention.head_count", 8},  {"llama.attention.head_count_kv", 4},
              {"llama.rope.dimension_count", 8},  {"tokenizer.ggml.bos_token_id", 1},
              {"tokenizer.ggml.eos_token_id", 2}, {"tokenizer.ggml.unknown_token_id", 0}};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++) {
        uint32_t v;
        assert_ok(kvc_gguf_get_u32(g, hp[i].key, &v));
        assert_int_equal(v, hp[i].want);
    }
    double eps;
    assert_ok(kvc_gguf_get_f64(g, "llama.attention.layer_norm_rms_epsilon", &eps));
    assert_true(eps > 0.99e-5 && eps < 1.01e-5);
    assert_ok(kvc_gguf_get_str(g, "tokenizer.ggml.model", &s));
    assert_true(kvc_gguf_str_eq(s, "llama"));
    kvc_gguf_arr_t tok, scores, types;
    assert_ok(kvc_gguf_get_arr(g, "tokenizer.ggml.tokens", &tok));
    assert_ok(kvc_gguf_get_arr(g, "tokenizer.ggml.scores", &scores));
    assert_ok(kvc_gguf_get_arr(g, "tokenizer.ggml.token_type", &types));
    assert_int_equal(tok.type, KVC_GGUF_STRING);
    assert_int_equal(tok.n, 512);
    assert_int_equal(scores.n, 512);
    assert_int_equal(types.n, 512);
    /* 1 unknown, 2 control, 256 byte tokens, 253 normal (PROVENANCE.md) */
    uint32_t count[8] = {0};
    for (uint64_t i = 0; i < types.n; i++) {
        int64_t t;
        assert_ok(kvc_gguf_arr_i64(&types, i, &t));
        assert_true(t >= 0 && t < 8);
        count[t]++;
    }
    assert_int_equal(count[1], 253);
    assert_int_equal(count[2], 1);
    assert_int_equal(count[3], 2);
    assert_int_equal(count[6], 256);
    assert_ok(kvc_gguf_arr_str(g, &tok, 1, &s));
    assert_true(kvc_gguf_str_eq(s, "<s>"));
    assert_ok(kvc_gguf_arr_str(g, &tok, 3, &s));
    assert_true(kvc_gguf_str_eq(s, "<0x00>"));
    double sc;
    assert_ok(kvc_gguf_arr_f64(&scores, 0, &sc));
    assert_true(sc == 0.0);
    /* scores go down to -252 */
    double lo = 0;
    for (uint64_t i = 0; i < scores.n; i++) {
        assert_ok(kvc_gguf_arr_f64(&scores, i, &sc));
        lo = sc < lo ? sc : lo;
    }
    assert_true(lo == -252.0);
    /* tensors: all F32, inside the file, aligned, and output.weight equal to token_embd */
    const kvc_gguf_tensor_t *emb = kvc_gguf_find_tensor(g, "token_embd.weight");
    const kvc_gguf_tensor_t *outw = kvc_gguf_find_tensor(g, "output.weight");
    assert_non_null(emb);
    assert_non_null(outw);
    assert_int_equal(emb->n_dims, 2);
    assert_int_equal(emb->ne[0], 64);
    assert_int_equal(emb->ne[1], 512);
    assert_int_equal(emb->bytes, 64 * 512 * 4);
    assert_memory_equal(emb->data, outw->data, emb->bytes);
    uint64_t total = 0;
    for (uint64_t i = 0; i < kvc_gguf_n_tensors(g); i++) {
        const kvc_gguf_tensor_t *t = kvc_gguf_tensor(g, i);
        assert_int_equal(t->type, KVC_GGML_F32);
        assert_int_equal((uintptr_t)t->data % kvc_gguf_alignment(g), 0);
        assert_true(kvc_gguf_find_tensor(g, "blk.4.attn_q.weight") != NULL);
        total += t->bytes;
    }
    assert_true(total <= kvc_gguf_file_bytes(g) - kvc_gguf_data_offset(g));
    assert_null(kvc_gguf_find_tensor(g, "blk.5.attn_q.weight"));
    assert_null(kvc_gguf_tensor(g, 48));
    kvc_gguf_close(g);
}

static void tiny_random_has_the_llama2_vocab_in_f16(void **state)
{
    (void)state;
    char err[256];
    kvc_gguf_t *g;
    assert_ok(kvc_gguf_open(TINY, NULL, &g, err, sizeof err));
    assert_int_equal(kvc_gguf_n_tensors(g), 12);
    uint32_t v;
    assert_ok(kvc_gguf_get_u32(g, "general.file_type", &v));
    assert_int_equal(v, 1);
    assert_ok(kvc_gguf_get_u32(g, "llama.embedding_length", &v));
    assert_int_equal(v, 8);
    kvc_gguf_arr_t tok;
    assert_ok(kvc_gguf_get_arr(g, "tokenizer.ggml.tokens", &tok));
    assert_int_equal(tok.n, 32000);
    kvc_gguf_str_t s;
    assert_ok(kvc_gguf_arr_str(g, &tok, 31999, &s));
    assert_true(s.len > 0);
    assert_int_equal(kvc_gguf_arr_str(g, &tok, 32000, &s), KVC_ERANGE);
    bool any_f16 = false;
    for (uint64_t i = 0; i < kvc_gguf_n_tensors(g); i++)
        any_f16 |= kvc_gguf_tensor(g, i)->type == KVC_GGML_F16;
    assert_true(any_f16);
    kvc_gguf_close(g);
}

static void files_that_cannot_be_read_say_why(void **state)
{
    (void)state;
    char err[256];
    kvc_gguf_t *g = (kvc_gguf_t *)1;
    assert_int_equal(kvc_gguf_open(KVC_DATA_DIR "/models/absent.gguf", NULL, &g, err, sizeof err),
                     KVC_EIO);
    assert_null(g);
    assert_non_null(strstr(err, "No such file"));
    assert_int_equal(kvc_gguf_open(KVC_DATA_DIR "/models", NULL, &g, err, sizeof err), KVC_EIO);
    assert_non_null(strstr(err, "not a regular file"));
    assert_int_equal(kvc_gguf_open(KVC_DATA_DIR "/PROVENANCE.md", NULL, &g, err, sizeof err),
                     KVC_EPARSE);
    assert_non_null(strstr(err, "magic"));
    assert_int_equal(kvc_gguf_open(NULL, NULL, &g, err, sizeof err), KVC_EINVAL);
    assert_int_equal(kvc_gguf_open_memory(NULL, 4, NULL, &g, err, sizeof err), KVC_EINVAL);
    kvc_gguf_close(NULL);
}

/* ---- files written here ----------------------------------------------------------------- */
static void every_value_type_reads_back(void **state)
{
    (void)state;
    buf_t b = full_file();
    char err[256];
    kvc_gguf_t *g;
    assert_ok(open_buf(&b, &g, err));
    assert_int_equal(kvc_gguf_n_kv(g), 16);
    assert_int_equal(kvc_gguf_alignment(g), 64);
    uint64_t u;
    int64_t i;
    uint32_t u32;
    double f;
    bool yes;
    kvc_gguf_str_t s;
    assert_ok(kvc_gguf_get_u64(g, "u8", &u));
    assert_int_equal(u, 200);
    assert_ok(kvc_gguf_get_i64(g, "i8", &i));
    assert_int_equal(i, -5);
    assert_ok(kvc_gguf_get_u64(g, "u16", &u));
    assert_int_equal(u, 60000);
    assert_ok(kvc_gguf_get_i64(g, "i16", &i));
    assert_int_equal(i, -30000);
    assert_ok(kvc_gguf_get_u32(g, "u32", &u32));
    assert_int_equal(u32, 4000000000u);
    assert_ok(kvc_gguf_get_i64(g, "i32", &i));
    assert_int_equal(i, -7);
    assert_ok(kvc_gguf_get_f64(g, "f32", &f));
    assert_true(f == (double)1e-5f);
    assert_ok(kvc_gguf_get_bool(g, "yes", &yes));
    assert_true(yes);
    assert_ok(kvc_gguf_get_u64(g, "u64", &u));
    assert_true(u == UINT64_MAX);
    assert_ok(kvc_gguf_get_i64(g, "i64", &i));
    assert_true(i == INT64_MIN);
    assert_ok(kvc_gguf_get_f64(g, "f64", &f));
    assert_true(f == 500000.0);
    assert_ok(kvc_gguf_get_f64(g, "i32", &f));
    assert_true(f == -7.0); /* integers widen */
    assert_ok(kvc_gguf_get_str(g, "general.architecture", &s));
    assert_true(kvc_gguf_str_eq(s, "llama"));
    /* what does not fit or is another type */
    assert_int_equal(kvc_gguf_get_u64(g, "i8", &u), KVC_ERANGE);
    assert_int_equal(kvc_gguf_get_u32(g, "u64", &u32), KVC_ERANGE);
    assert_int_equal(kvc_gguf_get_i64(g, "u64", &i), KVC_ERANGE);
    assert_int_equal(kvc_gguf_get_u64(g, "f32", &u), KVC_EPARSE);
    assert_int_equal(kvc_gguf_get_str(g, "u32", &s), KVC_EPARSE);
    assert_int_equal(kvc_gguf_get_bool(g, "u8", &yes), KVC_EPARSE);
    assert_int_equal(kvc_gguf_get_u64(g, "missing", &u), KVC_ENOENT);
    assert_int_equal(kvc_gguf_find(g, "missing"), -1);
    assert_int_equal(kvc_gguf_find(g, "u"), -1); /* a prefix of a key is not the key */
    /* arrays */
    kvc_gguf_arr_t a;
    assert_ok(kvc_gguf_get_arr(g, "tokens", &a));
    assert_int_equal(a.n, 3);
    assert_ok(kvc_gguf_arr_str(g, &a, 0, &s));
    assert_true(kvc_gguf_str_eq(s, "<s>"));
    assert_ok(kvc_gguf_arr_str(g, &a, 1, &s));
    assert_int_equal(s.len, 0);
    assert_ok(kvc_gguf_arr_str(g, &a, 2, &s));
    assert_true(kvc_gguf_str_eq(s, "\xe2\x96\x81the"));
    assert_int_equal(kvc_gguf_arr_f64(&a, 0, &f), KVC_EPARSE);
    assert_ok(kvc_gguf_get_arr(g, "scores", &a));
    assert_ok(kvc_gguf_arr_f64(&a, 1, &f));
    assert_true(f == 2.0);
    assert_int_equal(kvc_gguf_arr_f64(&a, 2, &f), KVC_ERANGE);
    assert_int_equal(kvc_gguf_arr_i64(&a, 0, &i), KVC_EPARSE);
    assert_int_equal(kvc_gguf_arr_str(g, &a, 0, &s), KVC_EPARSE);
    assert_ok(kvc_gguf_get_arr(g, "types", &a));
    assert_ok(kvc_gguf_arr_i64(&a, 0, &i));
    assert_int_equal(i, -2);
    assert_int_equal(kvc_gguf_get_arr(g, "u8", &a), KVC_EPARSE);
    /* keys by index */
    assert_true(kvc_gguf_str_eq(kvc_gguf_key(g, 0), "u8"));
    assert_int_equal(kvc_gguf_kv_type(g, 12), KVC_GGUF_ARRAY);
    assert_int_equal(kvc_gguf_kv_type(g, 16), KVC_GGUF_TYPE__COUNT);
    /* tensors, in place at aligned offsets */
    assert_int_equal(kvc_gguf_data_offset(g) % 64, 0);
    const kvc_gguf_tensor_t *t = kvc_gguf_find_tensor(g, "a.weight");
    assert_non_null(t);
    assert_int_equal(t->n_elems, 12);
    assert_int_equal(t->ne[2], 1);
    float x;
    memcpy(&x, (const uint8_t *)t->data + 11 * 4, 4);
    assert_true(x == 11.0f);
    t = kvc_gguf_find_tensor(g, "q.weight");
    assert_int_equal(t->bytes, 68);
    assert_int_equal(((const uint8_t *)t->data)[67], 67);
    t = kvc_gguf_find_tensor(g, "h");
    assert_int_equal(t->bytes, 4);
    assert_ptr_equal(t, kvc_gguf_tensor(g, 2));
    kvc_gguf_close(g);
    free(b.p);
}

static void type_tables_match_ggml(void **state)
{
    (void)state;
    uint32_t blk, bytes;
    const struct {
        uint32_t type, blk, bytes;
        const char *name;
    } want[] = {{KVC_GGML_F32, 1, 4, "f32"},      {KVC_GGML_F16, 1, 2, "f16"},
                {KVC_GGML_BF16, 1, 2, "bf16"},    {KVC_GGML_Q8_0, 32, 34, "q8_0"},
                {KVC_GGML_Q4_0, 32, 18, "q4_0"},  {KVC_GGML_Q4_K, 256, 144, "q4_K"},
                {KVC_GGML_Q6_K, 256, 210, "q6_K"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        assert_ok(kvc_ggml_type_size(want[i].type, &blk, &bytes));
        assert_int_equal(blk, want[i].blk);
        assert_int_equal(bytes, want[i].bytes);
        assert_string_equal(kvc_ggml_type_name(want[i].type), want[i].name);
    }
    /* 4 and 5 were Q4_2 and Q4_3, removed from ggml; 31 is past the table */
    assert_int_equal(kvc_ggml_type_size(4, &blk, &bytes), KVC_ENOTSUP);
    assert_int_equal(kvc_ggml_type_size(31, NULL, NULL), KVC_ENOTSUP);
    assert_null(kvc_ggml_type_name(5));
    assert_string_equal(kvc_gguf_type_name(KVC_GGUF_FLOAT64), "float64");
    assert_string_equal(kvc_gguf_type_name(KVC_GGUF_TYPE__COUNT), "?");
    assert_int_equal(kvc_gguf_type_size(KVC_GGUF_UINT16), 2);
    assert_int_equal(kvc_gguf_type_size(KVC_GGUF_FLOAT64), 8);
    assert_int_equal(kvc_gguf_type_size(KVC_GGUF_BOOL), 1);
    assert_int_equal(kvc_gguf_type_size(KVC_GGUF_STRING), 0);
    assert_int_equal(kvc_gguf_type_size(KVC_GGUF_ARRAY), 0);
    assert_int_equal(kvc_gguf_type_size(KVC_GGUF_TYPE__COUNT), 0);
}

/* A vocab-only file: no tensors, and it may end right after its metadata. */
static void a_file_without_tensors_needs_no_padding(void **state)
{
    (void)state;
    buf_t b = {0};
    header(&b, 2, 0, 1);
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    char err[256];
    kvc_gguf_t *g;
    assert_ok(open_buf(&b, &g, err));
    assert_int_equal(kvc_gguf_version(g), 2);
    assert_int_equal(kvc_gguf_data_offset(g), b.n);
    kvc_gguf_close(g);
    free(b.p);
}

/* ---- malformed files ------------------------------------------------------------------ */
typedef void (*build_fn)(buf_t *b);

static void expect_refused(build_fn build, const char *want)
{
    buf_t b = {0};
    build(&b);
    char err[256] = "";
    kvc_gguf_t *g = (kvc_gguf_t *)1;
    int rc = open_buf(&b, &g, err);
    if (rc != KVC_EPARSE || !strstr(err, want))
        fail_msg("want EPARSE with '%s', got %s: '%s'", want, kvc_errname(rc), err);
    assert_null(g);
    free(b.p);
}

static void bad_magic(buf_t *b)
{
    put(b, "GGML\3\0\0\0", 8);
}
static void v1(buf_t *b)
{
    header(b, 1, 0, 0);
}
static void v4(buf_t *b)
{
    header(b, 4, 0, 0);
}
static void big_endian(buf_t *b)
{
    header(b, 0x03000000u, 0, 0);
}
static void huge_counts(buf_t *b)
{
    header(b, 3, 0, UINT64_MAX / 2);
}
static void huge_tensor_count(buf_t *b)
{
    header(b, 3, UINT64_MAX, 0);
}
static void empty_key(buf_t *b)
{
    header(b, 3, 0, 1);
    kv_u32(b, "", 1);
}
static void nul_in_key(buf_t *b)
{
    header(b, 3, 0, 1);
    put_u64(b, 3), put(b, "a\0b", 3), put_u32(b, KVC_GGUF_UINT32), put_u32(b, 1);
}
static void long_string(buf_t *b)
{
    header(b, 3, 0, 1);
    put_str(b, "k"), put_u32(b, KVC_GGUF_STRING), put_u64(b, 1000), put(b, "abc", 3);
}
static void bad_value_type(buf_t *b)
{
    header(b, 3, 0, 1);
    put_str(b, "k"), put_u32(b, 13), put_u32(b, 0);
}
static void nested_array(buf_t *b)
{
    header(b, 3, 0, 1);
    put_str(b, "k"), put_u32(b, KVC_GGUF_ARRAY), put_u32(b, KVC_GGUF_ARRAY), put_u64(b, 0);
}
static void array_too_long(buf_t *b)
{
    header(b, 3, 0, 1);
    put_str(b, "k"), put_u32(b, KVC_GGUF_ARRAY), put_u32(b, KVC_GGUF_UINT64);
    put_u64(b, UINT64_MAX / 4), put_u64(b, 0);
}
static void string_array_too_long(buf_t *b)
{
    header(b, 3, 0, 1);
    put_str(b, "k"), put_u32(b, KVC_GGUF_ARRAY), put_u32(b, KVC_GGUF_STRING);
    put_u64(b, 1u << 30), put_u64(b, 0);
}
static void bad_bool(buf_t *b)
{
    header(b, 3, 0, 1);
    put_str(b, "k"), put_u32(b, KVC_GGUF_BOOL), put_u8(b, 2);
}
static void bad_bool_in_array(buf_t *b)
{
    header(b, 3, 0, 1);
    put_str(b, "k"), put_u32(b, KVC_GGUF_ARRAY), put_u32(b, KVC_GGUF_BOOL), put_u64(b, 2);
    put_u8(b, 1), put_u8(b, 7);
}
static void duplicate_key(buf_t *b)
{
    header(b, 3, 0, 3);
    kv_u32(b, "a", 1), kv_u32(b, "b", 2), kv_u32(b, "a", 3);
}
static void bad_alignment(buf_t *b)
{
    header(b, 3, 0, 1);
    kv_u32(b, "general.alignment", 48);
}
static void alignment_of_wrong_type(buf_t *b)
{
    header(b, 3, 0, 1);
    kv_str(b, "general.alignment", "32");
}
static void one_tensor(buf_t *b, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                       uint64_t offset, size_t data_bytes)
{
    header(b, 3, 1, 0);
    tensor_info(b, "t", n_dims, ne, type, offset);
    pad_to(b, 32);
    for (size_t i = 0; i < data_bytes; i++) put_u8(b, 0);
}
static void zero_dims(buf_t *b)
{
    one_tensor(b, 0, NULL, KVC_GGML_F32, 0, 4);
}
static void five_dims(buf_t *b)
{
    one_tensor(b, 5, (uint64_t[]){1, 1, 1, 1, 1}, 0, 0, 4);
}
static void zero_dim(buf_t *b)
{
    one_tensor(b, 2, (uint64_t[]){4, 0}, KVC_GGML_F32, 0, 16);
}
static void elems_overflow(buf_t *b)
{
    one_tensor(b, 3, (uint64_t[]){1ull << 30, 1ull << 30, 1ull << 30}, KVC_GGML_F32, 0, 4);
}
static void unknown_type(buf_t *b)
{
    one_tensor(b, 1, (uint64_t[]){4}, 5, 0, 16);
}
static void partial_block(buf_t *b)
{
    one_tensor(b, 1, (uint64_t[]){33}, KVC_GGML_Q8_0, 0, 68);
}
static void misaligned(buf_t *b)
{
    one_tensor(b, 1, (uint64_t[]){4}, KVC_GGML_F32, 4, 32);
}
static void past_the_end(buf_t *b)
{
    one_tensor(b, 1, (uint64_t[]){16}, KVC_GGML_F32, 0, 60);
}
static void offset_past_the_end(buf_t *b)
{
    one_tensor(b, 1, (uint64_t[]){1}, KVC_GGML_F32, UINT64_MAX - 31, 4);
}
static void data_start_past_the_end(buf_t *b)
{
    header(b, 3, 1, 0);
    tensor_info(b, "t", 1, (uint64_t[]){1}, KVC_GGML_F32, 0); /* no padding, no data */
}
static void overlap(buf_t *b)
{
    header(b, 3, 2, 0);
    tensor_info(b, "a", 1, (uint64_t[]){16}, KVC_GGML_F32, 0); /* 64 bytes */
    tensor_info(b, "b", 1, (uint64_t[]){8}, KVC_GGML_F32, 32);
    pad_to(b, 32);
    for (int i = 0; i < 96; i++) put_u8(b, 0);
}
static void duplicate_tensor(buf_t *b)
{
    header(b, 3, 2, 0);
    tensor_info(b, "a", 1, (uint64_t[]){8}, KVC_GGML_F32, 0);
    tensor_info(b, "a", 1, (uint64_t[]){8}, KVC_GGML_F32, 32);
    pad_to(b, 32);
    for (int i = 0; i < 64; i++) put_u8(b, 0);
}
static void long_name(buf_t *b)
{
    char name[300];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = 0;
    header(b, 3, 1, 0);
    tensor_info(b, name, 1, (uint64_t[]){1}, KVC_GGML_F32, 0);
    pad_to(b, 32);
    put_u32(b, 0);
}

static void malformed_headers_are_refused_with_a_reason(void **state)
{
    (void)state;
    expect_refused(bad_magic, "magic");
    expect_refused(v1, "version 1 is not supported");
    expect_refused(v4, "version 4 is not supported");
    expect_refused(big_endian, "big-endian");
    expect_refused(huge_counts, "cannot fit in a file");
    expect_refused(huge_tensor_count, "cannot fit in a file");
    expect_refused(empty_key, "empty or holds a NUL");
    expect_refused(nul_in_key, "empty or holds a NUL");
    expect_refused(long_string, "a string value needs 1000 bytes");
    expect_refused(bad_value_type, "value type 13");
    expect_refused(nested_array, "nested arrays");
    expect_refused(array_too_long, "cannot fit in the");
    expect_refused(string_array_too_long, "strings cannot fit");
    expect_refused(bad_bool, "bool of value 2");
    expect_refused(bad_bool_in_array, "element 1 is a bool of value 7");
    expect_refused(duplicate_key, "key 'a' appears twice");
    expect_refused(bad_alignment, "power of two");
    expect_refused(alignment_of_wrong_type, "power of two");
}

static void malformed_tensors_are_refused_with_a_reason(void **state)
{
    (void)state;
    expect_refused(zero_dims, "0 dimensions");
    expect_refused(five_dims, "5 dimensions");
    expect_refused(zero_dim, "dimension 1 is 0");
    expect_refused(elems_overflow, "more than 2^62 elements");
    expect_refused(unknown_type, "type 5 is not a tensor type");
    expect_refused(partial_block, "not a multiple of q8_0's block of 32");
    expect_refused(misaligned, "not a multiple of the alignment");
    expect_refused(past_the_end, "run past the end");
    expect_refused(offset_past_the_end, "run past the end");
    expect_refused(data_start_past_the_end, "past the end");
    expect_refused(overlap, "tensors 'a' and 'b' overlap");
    expect_refused(duplicate_tensor, "tensor name 'a' appears twice");
    expect_refused(long_name, "a tensor name at byte");
}

/* Every prefix of a valid file with tensors is refused, cleanly. */
static void every_truncation_is_refused(void **state)
{
    (void)state;
    buf_t b = full_file();
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* its own allocation: ASan sees any overread */
        memcpy(copy, b.p, n);
        char err[256] = "";
        kvc_gguf_t *g = (kvc_gguf_t *)1;
        int rc = kvc_gguf_open_memory(copy, n, NULL, &g, err, sizeof err);
        if (rc != KVC_EPARSE) fail_msg("truncated to %zu bytes: %s (%s)", n, kvc_errname(rc), err);
        assert_null(g);
        assert_true(err[0] != 0);
        free(copy);
    }
    free(b.p);
}

/* Random byte flips: open either fails with EPARSE or gives a file whose every lookup and
 * tensor stays inside the buffer (ASan checks the reads). */
static void random_corruptions_never_read_out_of_bounds(void **state)
{
    (void)state;
    buf_t b = full_file();
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 11);
    uint8_t *copy = malloc(b.n);
    uint32_t opened = 0, refused = 0;
    const int rounds = 20000 / KVC_TEST_SANITIZER_DIVISOR;
    for (int r = 0; r < rounds; r++) {
        memcpy(copy, b.p, b.n);
        uint32_t flips = 1 + (uint32_t)kvc_rng_below(&rng, 4);
        for (uint32_t k = 0; k < flips; k++)
            copy[kvc_rng_below(&rng, b.n)] ^= (uint8_t)(1u << kvc_rng_below(&rng, 8));
        char err[256];
        kvc_gguf_t *g;
        int rc = kvc_gguf_open_memory(copy, b.n, NULL, &g, err, sizeof err);
        if (rc) {
            assert_int_equal(rc, KVC_EPARSE);
            refused++;
            continue;
        }
        opened++;
        for (uint64_t i = 0; i < kvc_gguf_n_kv(g); i++) {
            kvc_gguf_str_t k = kvc_gguf_key(g, i), s;
            char key[128];
            if (k.len >= sizeof key) continue;
            memcpy(key, k.s, k.len);
            key[k.len] = 0;
            kvc_gguf_arr_t a;
            uint64_t u;
            double f;
            if (kvc_gguf_get_arr(g, key, &a) == 0) {
                for (uint64_t j = 0; j < a.n && j < 8; j++) {
                    int64_t v;
                    (void)kvc_gguf_arr_str(g, &a, j, &s);
                    (void)kvc_gguf_arr_i64(&a, j, &v);
                    (void)kvc_gguf_arr_f64(&a, j, &f);
                }
            }
            (void)kvc_gguf_get_str(g, key, &s);
            (void)kvc_gguf_get_u64(g, key, &u);
            (void)kvc_gguf_get_f64(g, key, &f);
        }
        for (uint64_t i = 0; i < kvc_gguf_n_tensors(g); i++) {
            const kvc_gguf_tensor_t *t = kvc_gguf_tensor(g, i);
            const uint8_t *p = t->data;
            assert_true(p >= copy && p + t->bytes <= copy + b.n);
            volatile uint8_t sink = t->bytes ? p[t->bytes - 1] : 0;
            (void)sink;
        }
        kvc_gguf_close(g);
    }
    assert_true(opened > 0 && refused > 0); /* both outcomes were exercised */
    free(copy);
    free(b.p);
}

static void every_allocation_can_fail_cleanly(void **state)
{
    (void)state;
    buf_t b = full_file();
    uint64_t n_total = 0;
    {
        kvc_failing_alloc_t st = {0};
        kvc_allocator_t a = kvc_failing_allocator(&st);
        kvc_gguf_t *g;
        char err[256];
        assert_ok(kvc_gguf_open_memory(b.p, b.n, &a, &g, err, sizeof err));
        n_total = st.n_allocs;
        kvc_gguf_close(g);
        assert_int_equal(st.n_live, 0);
    }
    assert_true(n_total >= 5);
    for (uint64_t k = 1; k <= n_total; k++) {
        kvc_failing_alloc_t st = {.fail_at = k};
        kvc_allocator_t a = kvc_failing_allocator(&st);
        kvc_gguf_t *g = (kvc_gguf_t *)1;
        char err[256];
        assert_int_equal(kvc_gguf_open_memory(b.p, b.n, &a, &g, err, sizeof err), KVC_ENOMEM);
        assert_null(g);
        assert_int_equal(st.n_live, 0);
        assert_string_equal(err, "out of memory");
    }
    free(b.p);
}

/* ---- the writer ---------------------------------------------------------------------- */
static int fill_pattern(void *ctx, uint64_t i, void *dst, uint64_t bytes)
{
    (void)ctx;
    for (uint64_t k = 0; k < bytes; k++) ((uint8_t *)dst)[k] = (uint8_t)(i * 31 + k);
    return 0;
}

static void tmp_path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/kvc_test_gguf_%d_%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid(), name);
}

static void the_writer_round_trips_every_record(void **state)
{
    (void)state;
    kvc_gguf_writer_t *w;
    assert_ok(kvc_gguf_writer_create(NULL, &w));
    assert_ok(kvc_gguf_writer_set_str(w, "general.architecture", "llama", 5));
    assert_ok(kvc_gguf_writer_set_u32(w, "general.alignment", 64));
    assert_ok(kvc_gguf_writer_set_u32(w, "u32", 4000000000u));
    assert_ok(kvc_gguf_writer_set_i32(w, "i32", -7));
    assert_ok(kvc_gguf_writer_set_u64(w, "u64", UINT64_MAX));
    assert_ok(kvc_gguf_writer_set_f32(w, "f32", 0.25f));
    assert_ok(kvc_gguf_writer_set_bool(w, "no", false));
    assert_ok(kvc_gguf_writer_set_str(w, "empty", NULL, 0));
    const float scores[3] = {-1, 0, 2.5f};
    assert_ok(kvc_gguf_writer_set_arr(w, "scores", KVC_GGUF_FLOAT32, scores, 3));
    const kvc_gguf_str_t toks[3] = {{"<s>", 3}, {"", 0}, {"a\0b", 3}};
    assert_ok(kvc_gguf_writer_set_arr(w, "tokens", KVC_GGUF_STRING, toks, 3));
    assert_ok(kvc_gguf_writer_set_arr(w, "none", KVC_GGUF_INT32, NULL, 0));
    assert_ok(kvc_gguf_writer_add_tensor(w, "a", KVC_GGML_F32, 2, (uint64_t[]){3, 5}));
    assert_ok(kvc_gguf_writer_add_tensor(w, "q", KVC_GGML_Q4_K, 1, (uint64_t[]){512}));
    assert_ok(kvc_gguf_writer_add_tensor(w, "h", KVC_GGML_BF16, 4, (uint64_t[]){2, 1, 3, 1}));
    char path[512], err[256];
    tmp_path(path, sizeof path, "rt.gguf");
    assert_ok(kvc_gguf_writer_write(w, path, fill_pattern, NULL, err, sizeof err));
    kvc_gguf_writer_destroy(w);

    kvc_gguf_t *g;
    assert_ok(kvc_gguf_open(path, NULL, &g, err, sizeof err));
    assert_int_equal(kvc_gguf_n_kv(g), 11);
    assert_int_equal(kvc_gguf_alignment(g), 64);
    uint64_t u;
    int64_t i;
    double f;
    bool b;
    kvc_gguf_str_t str;
    assert_ok(kvc_gguf_get_u64(g, "u32", &u));
    assert_int_equal(u, 4000000000u);
    assert_ok(kvc_gguf_get_i64(g, "i32", &i));
    assert_int_equal(i, -7);
    assert_ok(kvc_gguf_get_u64(g, "u64", &u));
    assert_true(u == UINT64_MAX);
    assert_ok(kvc_gguf_get_f64(g, "f32", &f));
    assert_true(f == 0.25);
    assert_ok(kvc_gguf_get_bool(g, "no", &b));
    assert_false(b);
    assert_ok(kvc_gguf_get_str(g, "empty", &str));
    assert_int_equal(str.len, 0);
    kvc_gguf_arr_t a;
    assert_ok(kvc_gguf_get_arr(g, "scores", &a));
    assert_ok(kvc_gguf_arr_f64(&a, 2, &f));
    assert_true(f == 2.5);
    assert_ok(kvc_gguf_get_arr(g, "tokens", &a));
    assert_ok(kvc_gguf_arr_str(g, &a, 2, &str));
    assert_int_equal(str.len, 3);
    assert_memory_equal(str.s, "a\0b", 3); /* binary-safe */
    assert_ok(kvc_gguf_get_arr(g, "none", &a));
    assert_int_equal(a.n, 0);
    assert_int_equal(kvc_gguf_n_tensors(g), 3);
    const uint64_t want_bytes[3] = {60, 288, 12};
    for (uint64_t t = 0; t < 3; t++) {
        const kvc_gguf_tensor_t *x = kvc_gguf_tensor(g, t);
        assert_int_equal(x->bytes, want_bytes[t]);
        assert_int_equal(x->offset % 64, 0);
        for (uint64_t k = 0; k < x->bytes; k++)
            assert_int_equal(((const uint8_t *)x->data)[k], (uint8_t)(t * 31 + k));
    }
    assert_int_equal(kvc_gguf_find_tensor(g, "h")->ne[2], 3);
    kvc_gguf_close(g);
    unlink(path);
}

static const kvc_gguf_t *copy_src;
static int fill_from_src(void *ctx, uint64_t i, void *dst, uint64_t bytes)
{
    (void)ctx;
    const kvc_gguf_tensor_t *t = kvc_gguf_tensor(copy_src, i);
    if (t->bytes != bytes) return KVC_ECORRUPT;
    memcpy(dst, t->data, bytes);
    return 0;
}

/* Copying stories260K key by key and tensor by tensor gives the same file, value for value. */
static void copying_a_real_file_keeps_every_value(void **state)
{
    (void)state;
    char err[256], path[512];
    kvc_gguf_t *src;
    assert_ok(kvc_gguf_open(STORIES, NULL, &src, err, sizeof err));
    kvc_gguf_writer_t *w;
    assert_ok(kvc_gguf_writer_create(NULL, &w));
    for (uint64_t i = 0; i < kvc_gguf_n_kv(src); i++) assert_ok(kvc_gguf_writer_copy_kv(w, src, i));
    for (uint64_t i = 0; i < kvc_gguf_n_tensors(src); i++) {
        const kvc_gguf_tensor_t *t = kvc_gguf_tensor(src, i);
        char name[KVC_GGUF_MAX_NAME + 1];
        memcpy(name, t->name.s, t->name.len);
        name[t->name.len] = 0;
        assert_ok(kvc_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne));
    }
    tmp_path(path, sizeof path, "copy.gguf");
    copy_src = src;
    assert_ok(kvc_gguf_writer_write(w, path, fill_from_src, NULL, err, sizeof err));
    kvc_gguf_writer_destroy(w);
    kvc_gguf_t *g;
    assert_ok(kvc_gguf_open(path, NULL, &g, err, sizeof err));
    assert_int_equal(kvc_gguf_n_kv(g), kvc_gguf_n_kv(src));
    for (uint64_t i = 0; i < kvc_gguf_n_kv(src); i++) {
        kvc_gguf_str_t k = kvc_gguf_key(src, i);
        assert_true(kvc_gguf_key(g, i).len == k.len);
        assert_memory_equal(kvc_gguf_key(g, i).s, k.s, k.len);
        assert_int_equal(kvc_gguf_kv_type(g, i), kvc_gguf_kv_type(src, i));
    }
    /* the tokenizer, string for string and score for score */
    kvc_gguf_arr_t a1, a2, s1, s2;
    assert_ok(kvc_gguf_get_arr(src, "tokenizer.ggml.tokens", &a1));
    assert_ok(kvc_gguf_get_arr(g, "tokenizer.ggml.tokens", &a2));
    assert_ok(kvc_gguf_get_arr(src, "tokenizer.ggml.scores", &s1));
    assert_ok(kvc_gguf_get_arr(g, "tokenizer.ggml.scores", &s2));
    assert_int_equal(a1.n, a2.n);
    for (uint64_t j = 0; j < a1.n; j++) {
        kvc_gguf_str_t x, y;
        assert_ok(kvc_gguf_arr_str(src, &a1, j, &x));
        assert_ok(kvc_gguf_arr_str(g, &a2, j, &y));
        assert_true(x.len == y.len && !memcmp(x.s, y.s, x.len));
    }
    assert_memory_equal(s1.data, s2.data, s1.n * 4);
    double e1, e2;
    assert_ok(kvc_gguf_get_f64(src, "llama.attention.layer_norm_rms_epsilon", &e1));
    assert_ok(kvc_gguf_get_f64(g, "llama.attention.layer_norm_rms_epsilon", &e2));
    assert_true(e1 == e2);
    for (uint64_t i = 0; i < kvc_gguf_n_tensors(src); i++) {
        const kvc_gguf_tensor_t *x = kvc_gguf_tensor(src, i), *y = kvc_gguf_tensor(g, i);
        assert_int_equal(x->bytes, y->bytes);
        assert_memory_equal(x->data, y->data, x->bytes);
    }
    /* and the same file, byte for byte: llama.cpp's converter lays files out as this
     * writer does (metadata in order, records, each tensor at the next aligned offset) */
    assert_int_equal(kvc_gguf_file_bytes(g), kvc_gguf_file_bytes(src));
    FILE *f1 = fopen(STORIES, "rb"), *f2 = fopen(path, "rb");
    assert_non_null(f1);
    assert_non_null(f2);
    for (int c1 = 0, c2 = 0; c1 != EOF;) {
        c1 = fgetc(f1);
        c2 = fgetc(f2);
        assert_int_equal(c1, c2);
    }
    fclose(f1);
    fclose(f2);
    kvc_gguf_close(g);
    kvc_gguf_close(src);
    unlink(path);
}

static int fill_fails_on_second(void *ctx, uint64_t i, void *dst, uint64_t bytes)
{
    (void)ctx;
    memset(dst, 0, bytes);
    return i == 1 ? KVC_EIO : 0;
}

static void the_writer_refuses_what_the_reader_would(void **state)
{
    (void)state;
    kvc_gguf_writer_t *w;
    assert_ok(kvc_gguf_writer_create(NULL, &w));
    assert_ok(kvc_gguf_writer_set_u32(w, "k", 1));
    assert_int_equal(kvc_gguf_writer_set_u32(w, "k", 2), KVC_EEXIST);
    assert_int_equal(kvc_gguf_writer_set_str(w, "k", "x", 1), KVC_EEXIST);
    assert_int_equal(kvc_gguf_writer_set_u32(w, "", 2), KVC_EINVAL);
    assert_int_equal(kvc_gguf_writer_set_u32(w, NULL, 2), KVC_EINVAL);
    assert_int_equal(kvc_gguf_writer_set_u32(w, "general.alignment", 48), KVC_EINVAL);
    assert_int_equal(kvc_gguf_writer_set_arr(w, "a", KVC_GGUF_ARRAY, "", 0), KVC_EINVAL);
    assert_int_equal(kvc_gguf_writer_set_arr(w, "a", KVC_GGUF_BOOL, "\x02", 1), KVC_EINVAL);
    assert_int_equal(kvc_gguf_writer_set_arr(w, "a", KVC_GGUF_UINT8, NULL, 1), KVC_EINVAL);
    assert_int_equal(kvc_gguf_writer_add_tensor(w, "t", 4, 1, (uint64_t[]){32}), KVC_EINVAL);
    assert_int_equal(kvc_gguf_writer_add_tensor(w, "t", KVC_GGML_Q8_0, 1, (uint64_t[]){33}),
                     KVC_EINVAL);
    assert_int_equal(kvc_gguf_writer_add_tensor(w, "t", KVC_GGML_F32, 2, (uint64_t[]){4, 0}),
                     KVC_EINVAL);
    assert_int_equal(
        kvc_gguf_writer_add_tensor(w, "t", KVC_GGML_F32, 5, (uint64_t[]){1, 1, 1, 1, 1}),
        KVC_EINVAL);
    assert_ok(kvc_gguf_writer_add_tensor(w, "t", KVC_GGML_F32, 1, (uint64_t[]){8}));
    assert_int_equal(kvc_gguf_writer_add_tensor(w, "t", KVC_GGML_F32, 1, (uint64_t[]){8}),
                     KVC_EEXIST);
    assert_ok(kvc_gguf_writer_add_tensor(w, "u", KVC_GGML_F16, 1, (uint64_t[]){8}));
    /* after all those refusals, what was kept is a valid file of 1 key and 2 tensors */
    char path[512], err[256];
    tmp_path(path, sizeof path, "refuse.gguf");
    assert_ok(kvc_gguf_writer_write(w, path, NULL, NULL, err, sizeof err));
    kvc_gguf_t *g;
    assert_ok(kvc_gguf_open(path, NULL, &g, err, sizeof err));
    assert_int_equal(kvc_gguf_n_kv(g), 1);
    assert_int_equal(kvc_gguf_n_tensors(g), 2);
    kvc_gguf_close(g);
    /* a failing fill stops the write and leaves no file */
    assert_int_equal(kvc_gguf_writer_write(w, path, fill_fails_on_second, NULL, err, sizeof err),
                     KVC_EIO);
    assert_non_null(strstr(err, "tensor 'u': the fill callback failed"));
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(
        kvc_gguf_writer_write(w, "/nonexistent/dir/x.gguf", NULL, NULL, err, sizeof err), KVC_EIO);
    assert_non_null(strstr(err, "cannot create"));
    kvc_gguf_writer_destroy(w);
    kvc_gguf_writer_destroy(NULL);
}

static int build_and_write(const kvc_allocator_t *a, const char *path)
{
    kvc_gguf_writer_t *w;
    int rc = kvc_gguf_writer_create(a, &w);
    if (rc) return rc;
    const kvc_gguf_str_t toks[2] = {{"x", 1}, {"yz", 2}};
    char err[256];
    for (int k = 0; k < 40 && !rc; k++) {
        char key[32];
        snprintf(key, sizeof key, "key.%d", k);
        rc = kvc_gguf_writer_set_u32(w, key, (uint32_t)k);
    }
    if (!rc) rc = kvc_gguf_writer_set_arr(w, "toks", KVC_GGUF_STRING, toks, 2);
    for (int t = 0; t < 20 && !rc; t++) {
        char name[32];
        snprintf(name, sizeof name, "t.%d", t);
        rc = kvc_gguf_writer_add_tensor(w, name, KVC_GGML_F32, 1, (uint64_t[]){4});
    }
    if (!rc) rc = kvc_gguf_writer_write(w, path, fill_pattern, NULL, err, sizeof err);
    kvc_gguf_writer_destroy(w);
    return rc;
}

static void every_writer_allocation_can_fail_cleanly(void **state)
{
    (void)state;
    char path[512];
    tmp_path(path, sizeof path, "faults.gguf");
    kvc_failing_alloc_t st = {0};
    kvc_allocator_t a = kvc_failing_allocator(&st);
    assert_ok(build_and_write(&a, path));
    const uint64_t n = st.n_allocs;
    assert_int_equal(st.n_live, 0);
    for (uint64_t k = 1; k <= n; k++) {
        kvc_failing_alloc_t s2 = {.fail_at = k};
        kvc_allocator_t a2 = kvc_failing_allocator(&s2);
        assert_int_equal(build_and_write(&a2, path), KVC_ENOMEM);
        assert_int_equal(s2.n_live, 0);
    }
    unlink(path);
}

/* kvc_gguf_release drops mapped pages and nothing else: every tensor reads back the same
 * bytes (the pages come back from the file), and over a GGUF in memory it is a no-op (it must
 * never zero anonymous memory); out-of-range and NULL arguments are ignored. */
static void released_pages_read_back_the_same(void **state)
{
    (void)state;
    char err[256];
    kvc_gguf_t *g = NULL;
    assert_ok(kvc_gguf_open(STORIES, NULL, &g, err, sizeof err));
    const uint64_t n = kvc_gguf_n_tensors(g);
    uint8_t **copy = calloc(n, sizeof *copy);
    for (uint64_t i = 0; i < n; i++) {
        const kvc_gguf_tensor_t *t = kvc_gguf_tensor(g, i);
        copy[i] = malloc(t->bytes + 1);
        memcpy(copy[i], t->data, t->bytes);
        kvc_gguf_release(g, t->data, t->bytes);
    }
    kvc_gguf_release(g, NULL, 10);
    kvc_gguf_release(g, (const uint8_t *)kvc_gguf_tensor(g, 0)->data, SIZE_MAX);
    int x;
    kvc_gguf_release(g, &x, sizeof x);
    kvc_gguf_release(NULL, &x, sizeof x);
    for (uint64_t i = 0; i < n; i++) {
        const kvc_gguf_tensor_t *t = kvc_gguf_tensor(g, i);
        assert_memory_equal(copy[i], t->data, t->bytes);
    }
    /* in memory: untouched */
    const size_t bytes = kvc_gguf_file_bytes(g);
    uint8_t *buf = malloc(bytes);
    FILE *f = fopen(STORIES, "rb");
    assert_non_null(f);
    assert_int_equal(fread(buf, 1, bytes, f), bytes);
    fclose(f);
    kvc_gguf_t *m = NULL;
    assert_ok(kvc_gguf_open_memory(buf, bytes, NULL, &m, err, sizeof err));
    for (uint64_t i = 0; i < n; i++) {
        const kvc_gguf_tensor_t *t = kvc_gguf_tensor(m, i);
        kvc_gguf_release(m, t->data, t->bytes);
        assert_memory_equal(copy[i], t->data, t->bytes);
    }
    kvc_gguf_close(m);
    free(buf);
    for (uint64_t i = 0; i < n; i++) free(copy[i]);
    free(copy);
    kvc_gguf_close(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stories260k_reads_as_its_provenance_says),
        cmocka_unit_test(tiny_random_has_the_llama2_vocab_in_f16),
        cmocka_unit_test(files_that_cannot_be_read_say_why),
        cmocka_unit_test(every_value_type_reads_back),
        cmocka_unit_test(type_tables_match_ggml),
        cmocka_unit_test(a_file_without_tensors_needs_no_padding),
        cmocka_unit_test(malformed_headers_are_refused_with_a_reason),
        cmocka_unit_test(malformed_tensors_are_refused_with_a_reason),
        cmocka_unit_test(every_truncation_is_refused),
        cmocka_unit_test(random_corruptions_never_read_out_of_bounds),
        cmocka_unit_test(every_allocation_can_fail_cleanly),
        cmocka_unit_test(the_writer_round_trips_every_record),
        cmocka_unit_test(copying_a_real_file_keeps_every_value),
        cmocka_unit_test(the_writer_refuses_what_the_reader_would),
        cmocka_unit_test(every_writer_allocation_can_fail_cleanly),
        cmocka_unit_test(released_pages_read_back_the_same),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
