/* test_llama2c.c - llama2.c checkpoints: stories260K.gguf written as a .bin and a
 * tokenizer.bin and read back gives the same tensors bit for bit, the same metadata and
 * hyperparameters, and a tokenizer that encodes and decodes the llama-spm test strings as
 * the original does; shared and unshared classifiers; a q8_0 model written dequantized;
 * every refusal of a truncated, oversized or lying checkpoint or tokenizer, and of a model
 * the format cannot hold; allocation failures. */
#include "test_helpers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvcache/llama2c.h"
#include "ref_llama.h"

static const char *data_dir(void)
{
    const char *d = getenv("KVC_DATA_DIR");
    return d && *d ? d : KVC_DATA_DIR;
}

static void data_path(char *out, size_t cap, const char *rel)
{
    snprintf(out, cap, "%s/%s", data_dir(), rel);
}

static void tmp_path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/kvc_test_llama2c_%d_%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid(), name);
}

static uint8_t *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

static kvc_gguf_t *open_gguf(const char *rel)
{
    char path[1024], err[256];
    data_path(path, sizeof path, rel);
    kvc_gguf_t *g;
    if (kvc_gguf_open(path, NULL, &g, err, sizeof err)) fail_msg("%s: %s", path, err);
    return g;
}

/* b's tensors equal a's dequantized to f32, in the same order and shapes. */
static void assert_same_tensors(const kvc_gguf_t *a, const kvc_gguf_t *b)
{
    assert_int_equal(kvc_gguf_n_tensors(a), kvc_gguf_n_tensors(b));
    for (uint64_t i = 0; i < kvc_gguf_n_tensors(a); i++) {
        const kvc_gguf_tensor_t *x = kvc_gguf_tensor(a, i), *y = kvc_gguf_tensor(b, i);
        if (x->name.len != y->name.len || memcmp(x->name.s, y->name.s, x->name.len))
            fail_msg("tensor %llu: %.*s, want %.*s", (unsigned long long)i, (int)y->name.len,
                     y->name.s, (int)x->name.len, x->name.s);
        assert_int_equal(y->type, KVC_GGML_F32);
        assert_int_equal(x->n_dims, y->n_dims);
        for (uint32_t d = 0; d < KVC_GGUF_MAX_DIMS; d++) assert_int_equal(x->ne[d], y->ne[d]);
        float *f = malloc(x->n_elems * sizeof *f);
        assert_non_null(f);
        assert_int_equal(kvc_ggml_dequantize_row(x->type, x->data, f, x->n_elems), 0);
        if (memcmp(f, y->data, x->n_elems * 4))
            fail_msg("tensor %.*s differs", (int)x->name.len, x->name.s);
        free(f);
    }
}

/* Every key of a is in b with the same type and value (bytes of fixed-size values, every
 * string and array element). */
static void assert_same_metadata(const kvc_gguf_t *a, const kvc_gguf_t *b)
{
    assert_int_equal(kvc_gguf_n_kv(a), kvc_gguf_n_kv(b));
    for (uint64_t i = 0; i < kvc_gguf_n_kv(a); i++) {
        kvc_gguf_str_t k = kvc_gguf_key(a, i);
        char key[256];
        memcpy(key, k.s, k.len);
        key[k.len] = 0;
        const int64_t j = kvc_gguf_find(b, key);
        if (j < 0) fail_msg("key %s missing", key);
        const kvc_gguf_type_t t = kvc_gguf_kv_type(a, i);
        assert_int_equal(kvc_gguf_kv_type(b, (uint64_t)j), t);
        if (t == KVC_GGUF_STRING) {
            kvc_gguf_str_t s, u;
            assert_int_equal(kvc_gguf_get_str(a, key, &s), 0);
            assert_int_equal(kvc_gguf_get_str(b, key, &u), 0);
            assert_int_equal(s.len, u.len);
            assert_memory_equal(s.s, u.s, s.len);
        } else if (t == KVC_GGUF_ARRAY) {
            kvc_gguf_arr_t x, y;
            assert_int_equal(kvc_gguf_get_arr(a, key, &x), 0);
            assert_int_equal(kvc_gguf_get_arr(b, key, &y), 0);
            assert_int_equal(x.type, y.type);
            assert_int_equal(x.n, y.n);
            for (uint64_t e = 0; e < x.n; e++) {
                if (x.type == KVC_GGUF_STRING) {
                    kvc_gguf_str_t s, u;
                    assert_int_equal(kvc_gguf_arr_str(a, &x, e, &s), 0);
                    assert_int_equal(kvc_gguf_arr_str(b, &y, e, &u), 0);
                    if (s.len != u.len || memcmp(s.s, u.s, s.len))
                        fail_msg("%s[%llu]: '%.*s' want '%.*s'", key, (unsigned long long)e,
                                 (int)u.len, u.s, (int)s.len, s.s);
                } else {
                    const uint32_t sz = kvc_gguf_type_size(x.type);
                    assert_memory_equal((const uint8_t *)x.data + e * sz,
                                        (const uint8_t *)y.data + e * sz, sz);
                }
            }
        } else {
            double f, h;
            int64_t v, w;
            if (kvc_gguf_get_i64(a, key, &v) == 0) {
                assert_int_equal(kvc_gguf_get_i64(b, key, &w), 0);
                assert_int_equal(v, w);
            } else {
                assert_int_equal(kvc_gguf_get_f64(a, key, &f), 0);
                assert_int_equal(kvc_gguf_get_f64(b, key, &h), 0);
                assert_memory_equal(&f, &h, sizeof f);
            }
        }
    }
}

/* The llama-spm vocabulary's test strings (NAME.gguf.inp, each followed by a separator
 * line) encoded and decoded by both tokenizers. */
static void assert_same_tokenizer(const kvc_gguf_t *a, const kvc_gguf_t *b)
{
    kvc_tokenizer_t *ta, *tb;
    char err[256];
    assert_int_equal(kvc_tokenizer_create_gguf(a, NULL, &ta, err, sizeof err), 0);
    assert_int_equal(kvc_tokenizer_create_gguf(b, NULL, &tb, err, sizeof err), 0);
    char path[1024];
    data_path(path, sizeof path, "models/vocab/ggml-vocab-llama-spm.gguf.inp");
    size_t n;
    char *inp = (char *)read_all(path, &n);
    inp[n] = 0;
    static const char sep[] = "\n__ggml_vocab_test__\n";
    int cases = 0;
    for (char *p = inp, *q; (q = strstr(p, sep)); p = q + strlen(sep), cases++) {
        const size_t len = (size_t)(q - p);
        kvc_token_t ia[4096], ib[4096];
        size_t na, nb;
        assert_int_equal(kvc_tokenizer_encode(ta, p, len, KVC_TOK_ADD_SPECIAL, ia, 4096, &na), 0);
        assert_int_equal(kvc_tokenizer_encode(tb, p, len, KVC_TOK_ADD_SPECIAL, ib, 4096, &nb), 0);
        assert_int_equal(na, nb);
        assert_memory_equal(ia, ib, na * sizeof *ia);
        char da[16384], db[16384];
        size_t la, lb;
        assert_int_equal(kvc_tokenizer_decode(ta, ia, na, 0, da, sizeof da, &la), 0);
        assert_int_equal(kvc_tokenizer_decode(tb, ib, nb, 0, db, sizeof db, &lb), 0);
        assert_int_equal(la, lb);
        assert_memory_equal(da, db, la);
    }
    assert_int_equal(cases, 46);
    for (kvc_token_t id = 0; id < (kvc_token_t)kvc_tokenizer_n_vocab(ta); id++) {
        assert_string_equal(kvc_tokenizer_token_text(ta, id), kvc_tokenizer_token_text(tb, id));
        assert_int_equal(kvc_tokenizer_token_type(ta, id), kvc_tokenizer_token_type(tb, id));
        assert_true(kvc_tokenizer_token_score(ta, id) == kvc_tokenizer_token_score(tb, id));
    }
    free(inp);
    kvc_tokenizer_destroy(ta);
    kvc_tokenizer_destroy(tb);
}

static void assert_same_hparams(const kvc_gguf_t *a, const kvc_gguf_t *b)
{
    kvc_model_hparams_t x, y;
    char err[256];
    assert_int_equal(kvc_model_hparams_from_gguf(a, &x, err, sizeof err), 0);
    assert_int_equal(kvc_model_hparams_from_gguf(b, &y, err, sizeof err), 0);
    assert_memory_equal(&x, &y, sizeof x);
}

static void stories260k_round_trips_bit_for_bit(void **state)
{
    (void)state;
    kvc_gguf_t *g = open_gguf("models/stories260K.gguf");
    char bin[512], tok[512], err[256];
    tmp_path(bin, sizeof bin, "stories.bin");
    tmp_path(tok, sizeof tok, "tokenizer.bin");
    if (kvc_llama2c_write(g, bin, tok, err, sizeof err)) fail_msg("write: %s", err);
    /* the legacy header: dim 64, hidden 172, 5 layers, 8 heads, 4 KV heads, a shared
     * classifier (stories260K.gguf's output.weight is its embedding, copied there by
     * llama.cpp's converter), seq_len 2048 */
    size_t n;
    uint8_t *b = read_all(bin, &n);
    const int32_t want[7] = {64, 172, 5, 8, 4, 512, 2048};
    assert_memory_equal(b, want, sizeof want);
    const size_t floats =
        512 * 64 + 5 * (64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 + 64 + 3 * 172 * 64) + 64 + 2048 * 8;
    assert_int_equal(n, 28 + 4 * floats);
    free(b);
    /* tokenizer.bin as llama2.c's exporter writes it: BOS "\n<s>\n", spaces for U+2581 */
    b = read_all(tok, &n);
    uint32_t max_len;
    memcpy(&max_len, b, 4);
    assert_true(max_len >= 6);
    assert_memory_equal(b + 4 + 8 + 5 + 8, "\n<s>\n", 5); /* token 1, after <unk> */
    free(b);
    kvc_gguf_t *r;
    if (kvc_llama2c_open(bin, tok, NULL, &r, err, sizeof err)) fail_msg("open: %s", err);
    assert_same_tensors(g, r);
    assert_same_metadata(g, r);
    assert_same_hparams(g, r);
    assert_same_tokenizer(g, r);
    /* written again from the converted GGUF: the same bytes */
    char bin2[512], tok2[512];
    tmp_path(bin2, sizeof bin2, "stories2.bin");
    tmp_path(tok2, sizeof tok2, "tokenizer2.bin");
    assert_int_equal(kvc_llama2c_write(r, bin2, tok2, err, sizeof err), 0);
    size_t n1, n2;
    uint8_t *b1 = read_all(bin, &n1), *b2 = read_all(bin2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    free(b1);
    free(b2);
    b1 = read_all(tok, &n1);
    b2 = read_all(tok2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    free(b1);
    free(b2);
    /* without a tokenizer: the vocabulary's size stands in for it */
    kvc_gguf_t *nt;
    assert_int_equal(kvc_llama2c_open(bin, NULL, NULL, &nt, err, sizeof err), 0);
    uint32_t vs;
    assert_int_equal(kvc_gguf_get_u32(nt, "llama.vocab_size", &vs), 0);
    assert_int_equal(vs, 512);
    assert_int_equal(kvc_gguf_find(nt, "tokenizer.ggml.tokens"), -1);
    assert_same_tensors(g, nt);
    kvc_gguf_close(nt);
    kvc_gguf_close(r);
    kvc_gguf_close(g);
    unlink(bin);
    unlink(tok);
    unlink(bin2);
    unlink(tok2);
}

/* A copy of g's keys and tensors, leaving out the tensor named `drop` and the keys whose
 * names start with `drop_keys`, with `extra` (a float key) set. */
typedef struct {
    const kvc_gguf_t *g;
    uint64_t *map;
    bool negate_output; /* output.weight (f32) written negated: a classifier of its own */
} copy_t;

static int copy_fill(void *ctx, uint64_t i, void *dst, uint64_t bytes)
{
    const copy_t *c = ctx;
    const kvc_gguf_tensor_t *t = kvc_gguf_tensor(c->g, c->map[i]);
    memcpy(dst, t->data, (size_t)bytes);
    if (c->negate_output && kvc_gguf_str_eq(t->name, "output.weight"))
        for (uint64_t k = 0; k < bytes / 4; k++) ((float *)dst)[k] = -((float *)dst)[k];
    return 0;
}

/* Keys copy_gguf sets besides its float one (NULL: none); the tests run one at a time. */
static const char *set_u32_key, *set_str_key, *set_str_val;
static uint32_t set_u32_val;

static void copy_gguf(const kvc_gguf_t *g, const char *drop, const char *drop_key,
                      const char *f32_key, float f32_val, const char *path)
{
    kvc_gguf_writer_t *w;
    assert_int_equal(kvc_gguf_writer_create(NULL, &w), 0);
    for (uint64_t i = 0; i < kvc_gguf_n_kv(g); i++) {
        kvc_gguf_str_t k = kvc_gguf_key(g, i);
        if (drop_key && k.len == strlen(drop_key) && !memcmp(k.s, drop_key, k.len)) continue;
        assert_int_equal(kvc_gguf_writer_copy_kv(w, g, i), 0);
    }
    if (f32_key) assert_int_equal(kvc_gguf_writer_set_f32(w, f32_key, f32_val), 0);
    if (set_u32_key) assert_int_equal(kvc_gguf_writer_set_u32(w, set_u32_key, set_u32_val), 0);
    if (set_str_key)
        assert_int_equal(kvc_gguf_writer_set_str(w, set_str_key, set_str_val, strlen(set_str_val)),
                         0);
    copy_t c = {g, calloc(kvc_gguf_n_tensors(g), sizeof(uint64_t)),
                drop && !strcmp(drop, "-output")}; /* "-output": negate it, drop nothing */
    uint64_t n = 0;
    for (uint64_t i = 0; i < kvc_gguf_n_tensors(g); i++) {
        const kvc_gguf_tensor_t *t = kvc_gguf_tensor(g, i);
        char name[256];
        memcpy(name, t->name.s, t->name.len);
        name[t->name.len] = 0;
        if (drop && !strcmp(name, drop)) continue;
        assert_int_equal(kvc_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne), 0);
        c.map[n++] = i;
    }
    char err[256];
    assert_int_equal(kvc_gguf_writer_write(w, path, copy_fill, &c, err, sizeof err), 0);
    kvc_gguf_writer_destroy(w);
    free(c.map);
}

static void shared_and_unshared_classifiers_round_trip(void **state)
{
    (void)state;
    kvc_gguf_t *g = open_gguf("models/stories260K.gguf");
    char path[512], bin[512], err[256];
    tmp_path(path, sizeof path, "cls.gguf");
    tmp_path(bin, sizeof bin, "cls.bin");
    const size_t body =
        512 * 64 + 5 * (64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 + 64 + 3 * 172 * 64) + 64 + 2048 * 8;
    /* an unshared classifier (the embedding negated): a negative vocab and wcls at the end */
    copy_gguf(g, "-output", NULL, NULL, 0, path);
    kvc_gguf_t *u;
    assert_int_equal(kvc_gguf_open(path, NULL, &u, err, sizeof err), 0);
    assert_int_equal(kvc_llama2c_write(u, bin, NULL, err, sizeof err), 0);
    size_t n;
    uint8_t *b = read_all(bin, &n);
    int32_t vocab;
    memcpy(&vocab, b + 20, 4);
    assert_int_equal(vocab, -512);
    assert_int_equal(n, 28 + 4 * (body + 512 * 64));
    free(b);
    kvc_gguf_t *r;
    assert_int_equal(kvc_llama2c_open(bin, NULL, NULL, &r, err, sizeof err), 0);
    assert_same_tensors(u, r);
    kvc_gguf_close(r);
    kvc_gguf_close(u);
    /* tied embeddings (no output.weight): shared, read back with the embedding copied to
     * output.weight as llama.cpp's converter does */
    copy_gguf(g, "output.weight", NULL, NULL, 0, path);
    kvc_gguf_t *t;
    assert_int_equal(kvc_gguf_open(path, NULL, &t, err, sizeof err), 0);
    assert_int_equal(kvc_llama2c_write(t, bin, NULL, err, sizeof err), 0);
    b = read_all(bin, &n);
    memcpy(&vocab, b + 20, 4);
    assert_int_equal(vocab, 512);
    assert_int_equal(n, 28 + 4 * body);
    free(b);
    assert_int_equal(kvc_llama2c_open(bin, NULL, NULL, &r, err, sizeof err), 0);
    const kvc_gguf_tensor_t *e = kvc_gguf_find_tensor(r, "token_embd.weight");
    const kvc_gguf_tensor_t *o = kvc_gguf_find_tensor(r, "output.weight");
    assert_non_null(o);
    assert_memory_equal(e->data, o->data, e->bytes);
    assert_memory_equal(e->data, kvc_gguf_find_tensor(g, "token_embd.weight")->data, e->bytes);
    kvc_gguf_close(r);
    kvc_gguf_close(t);
    kvc_gguf_close(g);
    unlink(path);
    unlink(bin);
}

/* A q8_0 model with the 32000-token llama-spm vocabulary, written as f32 and read back. */
static void a_quantized_model_is_written_dequantized(void **state)
{
    (void)state;
    kvc_gguf_t *vocab = open_gguf("models/vocab/ggml-vocab-llama-spm.gguf");
    kvc_model_synth_t p = kvc_model_synth_default();
    p.dim = 64;
    p.n_layers = 2;
    p.n_heads = 2;
    p.n_kv_heads = 1;
    p.ff = 96;
    p.ctx = 64;
    p.type = KVC_GGML_Q8_0;
    char path[512], bin[512], tok[512], err[256];
    tmp_path(path, sizeof path, "q8.gguf");
    tmp_path(bin, sizeof bin, "q8.bin");
    tmp_path(tok, sizeof tok, "q8.tok");
    assert_int_equal(kvc_model_synth(&p, vocab, path, err, sizeof err), 0);
    kvc_gguf_t *g;
    assert_int_equal(kvc_gguf_open(path, NULL, &g, err, sizeof err), 0);
    if (kvc_llama2c_write(g, bin, tok, err, sizeof err)) fail_msg("%s", err);
    size_t n;
    uint8_t *b = read_all(bin, &n);
    int32_t vocab_field;
    memcpy(&vocab_field, b + 20, 4);
    assert_int_equal(vocab_field, -32000); /* synth draws an output.weight of its own */
    free(b);
    kvc_gguf_t *r;
    if (kvc_llama2c_open(bin, tok, NULL, &r, err, sizeof err)) fail_msg("%s", err);
    /* synth writes tensors in its own order: compare by name */
    assert_int_equal(kvc_gguf_n_tensors(g), kvc_gguf_n_tensors(r));
    for (uint64_t i = 0; i < kvc_gguf_n_tensors(g); i++) {
        const kvc_gguf_tensor_t *x = kvc_gguf_tensor(g, i);
        char name[256];
        memcpy(name, x->name.s, x->name.len);
        name[x->name.len] = 0;
        const kvc_gguf_tensor_t *y = kvc_gguf_find_tensor(r, name);
        if (!y) fail_msg("%s missing", name);
        float *f = malloc(x->n_elems * 4);
        assert_int_equal(kvc_ggml_dequantize_row(x->type, x->data, f, x->n_elems), 0);
        assert_memory_equal(f, y->data, x->n_elems * 4);
        free(f);
    }
    /* the tokenizer: the vocabulary's texts, scores and types come back (the 32000 tokens
     * of llama-spm, with its 256 byte tokens) and encode the test strings the same */
    assert_same_tokenizer(vocab, r);
    kvc_gguf_close(r);
    kvc_gguf_close(g);
    kvc_gguf_close(vocab);
    unlink(path);
    unlink(bin);
    unlink(tok);
}

/* The GGUF writer's memory sink writes the bytes its file sink writes, and the reader
 * takes the buffer over (freed at close: the ASan build checks). */
static void the_memory_sink_writes_the_file_sinks_bytes(void **state)
{
    (void)state;
    kvc_gguf_t *g = open_gguf("models/stories260K.gguf");
    char path[512], err[256];
    tmp_path(path, sizeof path, "sink.gguf");
    copy_gguf(g, NULL, NULL, NULL, 0, path);
    size_t n;
    uint8_t *file = read_all(path, &n);
    kvc_gguf_writer_t *w;
    assert_int_equal(kvc_gguf_writer_create(NULL, &w), 0);
    for (uint64_t i = 0; i < kvc_gguf_n_kv(g); i++)
        assert_int_equal(kvc_gguf_writer_copy_kv(w, g, i), 0);
    copy_t c = {g, calloc(kvc_gguf_n_tensors(g), sizeof(uint64_t)), false};
    for (uint64_t i = 0; i < kvc_gguf_n_tensors(g); i++) {
        const kvc_gguf_tensor_t *t = kvc_gguf_tensor(g, i);
        char name[256];
        memcpy(name, t->name.s, t->name.len);
        name[t->name.len] = 0;
        assert_int_equal(kvc_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne), 0);
        c.map[i] = i;
    }
    void *mem = NULL;
    size_t bytes = 0;
    assert_int_equal(kvc_gguf_writer_write_memory(w, copy_fill, &c, &mem, &bytes, err, sizeof err),
                     0);
    assert_int_equal(bytes, n);
    assert_memory_equal(mem, file, n);
    /* and again: the writer can write twice */
    void *mem2 = NULL;
    size_t bytes2 = 0;
    assert_int_equal(
        kvc_gguf_writer_write_memory(w, copy_fill, &c, &mem2, &bytes2, err, sizeof err), 0);
    assert_int_equal(bytes2, n);
    assert_memory_equal(mem2, file, n);
    kvc_free(NULL, mem2);
    assert_int_equal(kvc_gguf_writer_write_memory(w, copy_fill, &c, NULL, &bytes2, err, sizeof err),
                     KVC_EINVAL);
    assert_int_equal(kvc_gguf_writer_write_memory(w, copy_fill, &c, &mem2, NULL, err, sizeof err),
                     KVC_EINVAL);
    assert_int_equal(
        kvc_gguf_writer_write_memory(NULL, copy_fill, &c, &mem2, &bytes2, err, sizeof err),
        KVC_EINVAL);
    kvc_gguf_writer_destroy(w);
    free(c.map);
    kvc_gguf_t *r;
    assert_int_equal(kvc_gguf_open_memory_owned(mem, bytes, NULL, &r, err, sizeof err), 0);
    assert_same_metadata(g, r);
    assert_same_tensors(g, r);
    kvc_gguf_close(r); /* frees mem */
    /* refused bytes stay the caller's */
    uint8_t *junk = kvc_alloc(NULL, 8, 8);
    memcpy(junk, "NOTGGUF!", 8);
    assert_int_equal(kvc_gguf_open_memory_owned(junk, 8, NULL, &r, err, sizeof err), KVC_EPARSE);
    kvc_free(NULL, junk);
    free(file);
    kvc_gguf_close(g);
    unlink(path);
}

/* Greedy from BOS through the tests' reference forward pass: the checkpoint read back gives
 * the original's ids, and its tokenizer decodes them to the story llama2.c documents. */
static uint32_t greedy(const kvc_gguf_t *g, uint32_t *ids, uint32_t n)
{
    ref_llama_t m;
    assert_int_equal(ref_llama_init(&m, g, n + 1), 0);
    uint32_t t = 1; /* BOS */
    for (uint32_t pos = 0; pos < n; pos++) {
        ref_llama_step(&m, t, pos);
        ids[pos] = t = ref_argmax(m.logits, m.h.vocab);
    }
    ref_llama_free(&m);
    return n;
}

static void the_checkpoint_tells_the_same_story(void **state)
{
    (void)state;
    kvc_gguf_t *g = open_gguf("models/stories260K.gguf");
    char bin[512], tok[512], err[256];
    tmp_path(bin, sizeof bin, "story.bin");
    tmp_path(tok, sizeof tok, "story.tok");
    assert_int_equal(kvc_llama2c_write(g, bin, tok, err, sizeof err), 0);
    kvc_gguf_t *r;
    assert_int_equal(kvc_llama2c_open(bin, tok, NULL, &r, err, sizeof err), 0);
    enum { N = 40 };
    uint32_t a[N], b[N];
    greedy(g, a, N);
    greedy(r, b, N);
    assert_memory_equal(a, b, sizeof a);
    kvc_tokenizer_t *t;
    assert_int_equal(kvc_tokenizer_create_gguf(r, NULL, &t, err, sizeof err), 0);
    kvc_token_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (kvc_token_t)b[i];
    char text[1024];
    size_t len;
    assert_int_equal(kvc_tokenizer_decode(t, ids, N, 0, text, sizeof text, &len), 0);
    const char *want = "Once upon a time, there was a little girl named Lily. She loved to play "
                       "outside in the park.";
    if (strncmp(text, want, strlen(want))) fail_msg("the story went: '%s'", text);
    kvc_tokenizer_destroy(t);
    kvc_gguf_close(r);
    kvc_gguf_close(g);
    unlink(bin);
    unlink(tok);
}

/* ---- refusals ---------------------------------------------------------------------------- */

static uint8_t *stories_bin(size_t *n, uint8_t **tok, size_t *nt)
{
    kvc_gguf_t *g = open_gguf("models/stories260K.gguf");
    char bin[512], tp[512], err[256];
    tmp_path(bin, sizeof bin, "bad.bin");
    tmp_path(tp, sizeof tp, "bad.tok");
    assert_int_equal(kvc_llama2c_write(g, bin, tp, err, sizeof err), 0);
    kvc_gguf_close(g);
    uint8_t *b = read_all(bin, n);
    *tok = read_all(tp, nt);
    unlink(bin);
    unlink(tp);
    return b;
}

static void expect_refused(const uint8_t *bin, size_t n, const uint8_t *tok, size_t nt, int want_rc,
                           const char *want)
{
    char err[512] = "";
    kvc_gguf_t *g = (kvc_gguf_t *)0x1;
    const int rc = kvc_llama2c_open_memory(bin, n, tok, nt, NULL, &g, err, sizeof err);
    if (rc != want_rc || !strstr(err, want) || strchr(err, '\n'))
        fail_msg("want %s '%s', got %s '%s'", kvc_errname(want_rc), want, kvc_errname(rc), err);
    assert_ptr_equal(g, (kvc_gguf_t *)0x1);
}

static void set_i32(uint8_t *b, size_t at, int32_t v)
{
    memcpy(b + at, &v, 4);
}

static void truncated_oversized_and_lying_checkpoints_are_refused(void **state)
{
    (void)state;
    size_t n, nt;
    uint8_t *tok, *good = stories_bin(&n, &tok, &nt);
    uint8_t *b = calloc(1, n + 4 * 512 * 64 + 8);
    /* truncated anywhere: the header, then the sizes */
    expect_refused(good, 0, NULL, 0, KVC_EPARSE, "the header needs 28 bytes, 0 remain");
    expect_refused(good, 27, NULL, 0, KVC_EPARSE, "the header needs 28 bytes, 27 remain");
    expect_refused(good, 28, NULL, 0, KVC_EPARSE, "needs 1105692 bytes, the file has 28");
    expect_refused(good, n - 1, NULL, 0, KVC_EPARSE, "the file has 1105691");
    expect_refused(good, n - 4 * 512 * 64, NULL, 0, KVC_EPARSE, "needs 1105692 bytes");
    /* oversized: a trailing classifier is allowed only with a negative vocab */
    memcpy(b, good, n);
    expect_refused(b, n + 4, NULL, 0, KVC_EPARSE, "the file has 1105696");
    /* a whole classifier's worth of trailing bytes, with a positive vocab */
    expect_refused(b, n + 4 * 512 * 64, NULL, 0, KVC_EPARSE,
                   "vocab 512, seq_len 2048) needs 1105692 bytes, the file has 1236764");
    set_i32(b, 20, -512); /* an unshared classifier: the file lacks it */
    expect_refused(b, n, NULL, 0, KVC_EPARSE, "needs 1236764 bytes, the file has 1105692");
    /* each field zero or negative (vocab: zero or INT32_MIN) */
    static const char *const field[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                         "n_kv_heads", "vocab_size", "seq_len"};
    for (int f = 0; f < 7; f++) {
        const int32_t bad[3] = {0, f == 5 ? INT32_MIN : -1, f == 5 ? INT32_MIN : INT32_MIN};
        for (int k = 0; k < 3; k++) {
            memcpy(b, good, n);
            set_i32(b, (size_t)4 * f, bad[k]);
            char want[64];
            snprintf(want, sizeof want, "header field %d (%s) is %d", f + 1, field[f], bad[k]);
            expect_refused(b, n, NULL, 0, KVC_EPARSE, want);
        }
    }
    /* shapes: heads that do not divide, an odd head size, a lying dimension */
    memcpy(b, good, n);
    set_i32(b, 12, 7);
    expect_refused(b, n, NULL, 0, KVC_EPARSE, "n_heads 7 does not divide dim 64");
    memcpy(b, good, n);
    set_i32(b, 16, 3);
    expect_refused(b, n, NULL, 0, KVC_EPARSE, "n_kv_heads 3 does not divide n_heads 8");
    memcpy(b, good, n);
    set_i32(b, 12, 64); /* head size 1 */
    set_i32(b, 16, 64);
    expect_refused(b, n, NULL, 0, KVC_EPARSE, "head size 1 is odd");
    memcpy(b, good, n);
    set_i32(b, 4, 173);
    expect_refused(b, n, NULL, 0, KVC_EPARSE, "hidden 173");
    memcpy(b, good, n);
    set_i32(b, 24, 2049);
    expect_refused(b, n, NULL, 0, KVC_EPARSE, "seq_len 2049) needs 1105724 bytes");
    /* sizes that overflow 64 bits are still compared, not wrapped */
    memcpy(b, good, n);
    for (int f = 0; f < 7; f++) set_i32(b, (size_t)4 * f, f == 3 || f == 4 ? 1 : INT32_MAX - 1);
    expect_refused(b, n, NULL, 0, KVC_EPARSE, "needs more than 2^64 bytes");
    free(b);
    free(good);
    free(tok);
}

static void lying_tokenizers_are_refused(void **state)
{
    (void)state;
    size_t n, nt;
    uint8_t *tok, *bin = stories_bin(&n, &tok, &nt);
    uint8_t *t = malloc(nt + 16);
    expect_refused(bin, n, tok, 0, KVC_EPARSE, "max_token_length needs 4 bytes, 0 remain");
    expect_refused(bin, n, tok, 3, KVC_EPARSE, "max_token_length needs 4 bytes, 3 remain");
    expect_refused(bin, n, tok, 4, KVC_EPARSE, "token 0 of 512 needs 8 bytes");
    expect_refused(bin, n, tok, 4 + 8 + 2, KVC_EPARSE, "token 0 needs 5 bytes, 2 remain");
    expect_refused(bin, n, tok, nt - 1, KVC_EPARSE, "token 511 needs");
    memcpy(t, tok, nt);
    memset(t + nt, 0, 16);
    expect_refused(bin, n, t, nt + 3, KVC_EPARSE,
                   "3 bytes after the last of the checkpoint's 512 tokens");
    set_i32(t, 0, 0);
    expect_refused(bin, n, t, nt, KVC_EPARSE, "max_token_length 0 is out of range");
    set_i32(t, 0, 70000);
    expect_refused(bin, n, t, nt, KVC_EPARSE, "max_token_length 70000 is out of range");
    memcpy(t, tok, nt);
    set_i32(t, 0, 4); /* token 0, "<unk>", is 5 bytes */
    expect_refused(bin, n, t, nt, KVC_EPARSE, "token 0: length 5 is out of range: 0..4");
    memcpy(t, tok, nt);
    set_i32(t, 8, -1);
    expect_refused(bin, n, t, nt, KVC_EPARSE, "token 0: length -1 is out of range");
    memcpy(t, tok, nt);
    const float inf = INFINITY;
    memcpy(t + 4, &inf, 4);
    expect_refused(bin, n, t, nt, KVC_EPARSE, "token 0: score is not finite");
    /* what only the tokenizer can see: a NUL inside a token */
    memcpy(t, tok, nt);
    t[4 + 8 + 1] = 0;
    expect_refused(bin, n, t, nt, KVC_EPARSE, "tokenizer: ");
    /* a tokenizer of a smaller vocabulary than the checkpoint's */
    expect_refused(bin, n, tok, nt - 20, KVC_EPARSE, "tokenizer: truncated");
    free(t);
    free(bin);
    free(tok);
}

/* A consistent checkpoint the model layer refuses: 4097 layers of width 2. */
static void a_shape_the_model_layer_refuses_is_refused(void **state)
{
    (void)state;
    const int32_t h[7] = {2, 1, 4097, 1, 1, 1, 1};
    const size_t floats = 2 + 4097 * (2 + 4 + 2 * 2 * 2 + 4 + 2 + 3 * 2) + 2 + 2;
    uint8_t *b = calloc(1, 28 + 4 * floats);
    memcpy(b, h, sizeof h);
    expect_refused(b, 28 + 4 * floats, NULL, 0, KVC_EPARSE,
                   "checkpoint: llama.block_count: 4097 is out of range");
    free(b);
}

static void files_that_cannot_be_read_are_eio(void **state)
{
    (void)state;
    char err[512], dir[1024], bin[512];
    kvc_gguf_t *g;
    data_path(dir, sizeof dir, "models");
    assert_int_equal(kvc_llama2c_open("/nonexistent/x.bin", NULL, NULL, &g, err, sizeof err),
                     KVC_EIO);
    assert_non_null(strstr(err, "checkpoint /nonexistent/x.bin: cannot open"));
    assert_int_equal(kvc_llama2c_open(dir, NULL, NULL, &g, err, sizeof err), KVC_EIO);
    assert_non_null(strstr(err, "not a regular file"));
    size_t n, nt;
    uint8_t *tok, *b = stories_bin(&n, &tok, &nt);
    tmp_path(bin, sizeof bin, "eio.bin");
    FILE *f = fopen(bin, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
    assert_int_equal(kvc_llama2c_open(bin, "/nonexistent/tok.bin", NULL, &g, err, sizeof err),
                     KVC_EIO);
    assert_non_null(strstr(err, "tokenizer /nonexistent/tok.bin: cannot open"));
    /* an empty tokenizer file is a truncated tokenizer, not "no tokenizer" */
    char empty[512];
    tmp_path(empty, sizeof empty, "empty.tok");
    fclose(fopen(empty, "wb"));
    assert_int_equal(kvc_llama2c_open(bin, empty, NULL, &g, err, sizeof err), KVC_EPARSE);
    assert_non_null(strstr(err, "max_token_length needs 4 bytes, 0 remain"));
    assert_int_equal(kvc_llama2c_open(NULL, NULL, NULL, &g, err, sizeof err), KVC_EINVAL);
    assert_int_equal(kvc_llama2c_open(bin, NULL, NULL, NULL, err, sizeof err), KVC_EINVAL);
    assert_int_equal(kvc_llama2c_open_memory(NULL, 4, NULL, 0, NULL, &g, err, sizeof err),
                     KVC_EINVAL);
    assert_int_equal(kvc_llama2c_open_memory(b, n, NULL, 4, NULL, &g, err, sizeof err), KVC_EINVAL);
    unlink(bin);
    unlink(empty);
    free(b);
    free(tok);
}

static void allocation_failures_are_clean(void **state)
{
    (void)state;
    size_t n, nt;
    uint8_t *tok, *b = stories_bin(&n, &tok, &nt);
    for (uint64_t k = 1;; k++) {
        kvc_failing_alloc_t st = {.fail_at = k};
        kvc_allocator_t a = kvc_failing_allocator(&st);
        kvc_gguf_t *g = NULL;
        char err[256];
        int rc = kvc_llama2c_open_memory(b, n, tok, nt, &a, &g, err, sizeof err);
        if (rc == 0) {
            assert_int_equal(st.n_failed, 0);
            kvc_gguf_close(g);
            assert_int_equal(st.n_live, 0);
            break;
        }
        assert_int_equal(rc, KVC_ENOMEM);
        assert_int_equal(st.n_live, 0);
        assert_true(k < 10000);
    }
    free(b);
    free(tok);
}

static void models_the_format_cannot_hold_are_refused(void **state)
{
    (void)state;
    kvc_gguf_t *g = open_gguf("models/stories260K.gguf");
    char path[512], bin[512], tok[512], err[512];
    tmp_path(path, sizeof path, "theta.gguf");
    tmp_path(bin, sizeof bin, "refused.bin");
    tmp_path(tok, sizeof tok, "refused.tok");
    static const struct {
        const char *drop_key, *f32_key;
        float f;
        const char *u32_key;
        uint32_t u;
        const char *str_key, *str;
        int rc;
        const char *want;
    } cases[] = {
        {NULL, "llama.rope.freq_base", 500000.0f, NULL, 0, NULL, NULL, KVC_ENOTSUP,
         "only RoPE theta 10000"},
        {"llama.attention.layer_norm_rms_epsilon", "llama.attention.layer_norm_rms_epsilon", 1e-6f,
         NULL, 0, NULL, NULL, KVC_ENOTSUP, "only RMSNorm eps 1e-5"},
        {"llama.rope.dimension_count", NULL, 0, "llama.rope.dimension_count", 4, NULL, NULL,
         KVC_ENOTSUP, "only RoPE over the whole head"},
        {NULL, NULL, 0, "llama.attention.key_length", 16, NULL, NULL, KVC_ENOTSUP,
         "only head_dim x heads = dim"},
        {NULL, NULL, 0, "llama.attention.sliding_window", 64, NULL, NULL, KVC_ENOTSUP,
         "no sliding window"},
        {NULL, NULL, 0, NULL, 0, "llama.rope.scaling.type", "linear", KVC_EPARSE,
         "llama.rope.scaling.factor: missing"},
        {"llama.feed_forward_length", NULL, 0, "llama.feed_forward_length", 170, NULL, NULL,
         KVC_EPARSE,
         "tensor blk.0.ffn_gate.weight: shape [64, 172], the hyperparameters say [64, 170]"},
        {"tokenizer.ggml.model", NULL, 0, NULL, 0, "tokenizer.ggml.model", "gpt2", KVC_ENOTSUP,
         "tokenizer.bin holds SentencePiece vocabularies"},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(cases); i++) {
        set_u32_key = cases[i].u32_key, set_u32_val = cases[i].u;
        set_str_key = cases[i].str_key, set_str_val = cases[i].str;
        copy_gguf(g, NULL, cases[i].drop_key, cases[i].f32_key, cases[i].f, path);
        set_u32_key = set_str_key = NULL;
        kvc_gguf_t *c;
        assert_int_equal(kvc_gguf_open(path, NULL, &c, err, sizeof err), 0);
        const int rc = kvc_llama2c_write(c, bin, tok, err, sizeof err);
        if (rc != cases[i].rc || !strstr(err, cases[i].want))
            fail_msg("case %zu: want %s '%s', got %s '%s'", i, kvc_errname(cases[i].rc),
                     cases[i].want, kvc_errname(rc), err);
        assert_int_equal(access(bin, F_OK), -1);
        kvc_gguf_close(c);
    }
    /* a missing tensor: nothing is left behind */
    copy_gguf(g, "blk.3.ffn_up.weight", NULL, NULL, 0, path);
    kvc_gguf_t *c;
    assert_int_equal(kvc_gguf_open(path, NULL, &c, err, sizeof err), 0);
    assert_int_equal(kvc_llama2c_write(c, bin, tok, err, sizeof err), KVC_EPARSE);
    assert_non_null(strstr(err, "tensor blk.3.ffn_up.weight: missing"));
    assert_int_equal(access(bin, F_OK), -1);
    kvc_gguf_close(c);
    /* no BOS id in the file: the default, 1, is run.c's */
    copy_gguf(g, NULL, "tokenizer.ggml.bos_token_id", NULL, 0, path);
    assert_int_equal(kvc_gguf_open(path, NULL, &c, err, sizeof err), 0);
    assert_int_equal(kvc_llama2c_write(c, bin, tok, err, sizeof err), 0);
    kvc_gguf_close(c);
    /* Phi-3's vocabulary has EOS 32000, which run.c cannot know: refused, and the .bin
     * written before the tokenizer is removed */
    kvc_gguf_t *phi = open_gguf("models/vocab/ggml-vocab-phi-3.gguf");
    kvc_model_synth_t p = kvc_model_synth_default();
    p.dim = 32, p.n_layers = 1, p.n_heads = 2, p.n_kv_heads = 2, p.ff = 32, p.ctx = 16;
    p.type = KVC_GGML_F32;
    assert_int_equal(kvc_model_synth(&p, phi, path, err, sizeof err), 0);
    kvc_gguf_close(phi);
    assert_int_equal(kvc_gguf_open(path, NULL, &c, err, sizeof err), 0);
    unlink(bin);
    unlink(tok);
    assert_int_equal(kvc_llama2c_write(c, bin, tok, err, sizeof err), KVC_ENOTSUP);
    assert_non_null(strstr(err, "needs BOS <s> = 1 and EOS </s> = 2"));
    assert_int_equal(access(bin, F_OK), -1);
    assert_int_equal(access(tok, F_OK), -1);
    assert_int_equal(kvc_llama2c_write(c, bin, NULL, err, sizeof err), 0); /* weights alone */
    kvc_gguf_close(c);
    kvc_gguf_t *tiny = open_gguf("models/llama-2-tiny-random.gguf");
    /* tiny-random: head dim 4 over 2 heads of an 8-wide model, rope 4: writable */
    assert_int_equal(kvc_llama2c_write(tiny, bin, NULL, err, sizeof err), 0);
    kvc_gguf_close(tiny);
    assert_int_equal(kvc_llama2c_write(NULL, bin, NULL, err, sizeof err), KVC_EINVAL);
    assert_int_equal(kvc_llama2c_write(g, NULL, NULL, err, sizeof err), KVC_EINVAL);
    assert_int_equal(kvc_llama2c_write(g, "/nonexistent/dir/x.bin", NULL, err, sizeof err),
                     KVC_EIO);
    assert_int_equal(kvc_llama2c_write(g, bin, "/nonexistent/dir/t.bin", err, sizeof err), KVC_EIO);
    assert_int_equal(access(bin, F_OK), -1); /* the .bin went with the failed tokenizer */
    kvc_gguf_close(g);
    unlink(path);
    unlink(bin);
    unlink(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stories260k_round_trips_bit_for_bit),
        cmocka_unit_test(the_memory_sink_writes_the_file_sinks_bytes),
        cmocka_unit_test(the_checkpoint_tells_the_same_story),
        cmocka_unit_test(shared_and_unshared_classifiers_round_trip),
        cmocka_unit_test(a_quantized_model_is_written_dequantized),
        cmocka_unit_test(truncated_oversized_and_lying_checkpoints_are_refused),
        cmocka_unit_test(lying_tokenizers_are_refused),
        cmocka_unit_test(a_shape_the_model_layer_refuses_is_refused),
        cmocka_unit_test(files_that_cannot_be_read_are_eio),
        cmocka_unit_test(allocation_failures_are_clean),
        cmocka_unit_test(models_the_format_cannot_hold_are_refused),
    };
    if (getenv("KVC_TEST_FILTER")) cmocka_set_test_filter(getenv("KVC_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
