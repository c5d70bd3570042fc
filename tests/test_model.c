/* test_model.c - a model's hyperparameters from GGUF metadata: the real files in
 * tests/data/models read as their provenance says; every architecture's variants (QKV
 * bias, Q/K norms, Mistral's window, gemma2's alternating windows and soft-caps, RoPE
 * scalings) from files written here; every missing, mistyped or out-of-range key refused
 * with its name; and the planner's view of the same model, KV bytes per token by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gguf_writer.h"
#include "kvcache/model.h"
#include "kvcache/quant.h"
#include "ref_llama.h"
#include "test_helpers.h"

#define STORIES KVC_DATA_DIR "/models/stories260K.gguf"
#define TINY    KVC_DATA_DIR "/models/llama-2-tiny-random.gguf"

static void stories260k_hyperparameters(void **state)
{
    (void)state;
    char msg[256];
    kvc_gguf_t *g;
    assert_ok(kvc_gguf_open(STORIES, NULL, &g, msg, sizeof msg));
    kvc_model_hparams_t h;
    assert_ok(kvc_model_hparams_from_gguf(g, &h, msg, sizeof msg));
    assert_int_equal(h.arch, KVC_ARCH_LLAMA);
    assert_int_equal(h.n_layers, 5);
    assert_int_equal(h.dim, 64);
    assert_int_equal(h.n_heads, 8);
    assert_int_equal(h.n_kv_heads, 4);
    assert_int_equal(h.head_dim, 8); /* 64 / 8: the file has no key_length */
    assert_int_equal(h.ff, 172);
    assert_int_equal(h.vocab, 512); /* from the tokenizer */
    assert_int_equal(h.ctx, 2048);
    assert_int_equal(h.rope_dim, 8);
    assert_true(h.rope_theta == 10000.0);
    assert_int_equal(h.rope_scaling, KVC_ROPE_SCALING_NONE);
    assert_false(h.tied); /* output.weight is stored, though equal to the embedding */
    assert_false(h.qkv_bias);
    assert_int_equal(h.sliding_window, 0);
    /* the planner's view: 2 x 5 layers x 4 KV heads x 8 dims x 2 bytes = 640 */
    kvc_plan_model_t pm;
    kvc_model_hparams_to_plan(&h, "fallback", &pm);
    assert_ok(kvc_plan_model_check(&pm, msg, sizeof msg));
    assert_string_equal(pm.name, "llama"); /* general.name */
    assert_int_equal(kvc_plan_kv_bytes_per_token(&pm, KVC_PLAN_BF16), 640);
    assert_int_equal(kvc_plan_kv_bytes_per_token(&pm, KVC_PLAN_FP8), 320);
    kvc_gguf_close(g);
    /* the same through the file path the CLI uses */
    kvc_plan_model_t pm2;
    assert_ok(kvc_model_plan_from_gguf_file(STORIES, &pm2, msg, sizeof msg));
    assert_memory_equal(&pm, &pm2, sizeof pm);
    assert_int_equal(
        kvc_model_plan_from_gguf_file(KVC_DATA_DIR "/none.gguf", &pm2, msg, sizeof msg), KVC_EIO);
}

static void tiny_random_hyperparameters(void **state)
{
    (void)state;
    char msg[256];
    kvc_plan_model_t pm;
    assert_ok(kvc_model_plan_from_gguf_file(TINY, &pm, msg, sizeof msg));
    assert_int_equal(pm.n_layers, 1);
    assert_int_equal(pm.hidden_size, 8);
    assert_int_equal(pm.n_heads, 2);
    assert_int_equal(pm.head_dim, 4);
    assert_int_equal(pm.vocab_size, 32000);
    assert_int_equal(pm.intermediate_size, 32);
    assert_int_equal(pm.max_position_embeddings, 4096);
    /* 2 x 1 x 2 x 4 x 2 B */
    assert_int_equal(kvc_plan_kv_bytes_per_token(&pm, KVC_PLAN_BF16), 32);
}

/* ---- files written here ---- */
typedef struct {
    const char *arch;
    uint32_t layers, dim, heads, kv_heads, ff, ctx;
    const char *extra_key; /* one more uint32 key (NULL: none) */
    uint32_t extra_val;
    const char *extra_key2;
    uint32_t extra_val2;
    const char *rope_type; /* rope.scaling.type (NULL: absent) */
    const char *tensor;    /* one tensor to add (NULL: none) */
    bool no_eps;
} spec_t;

static buf_t model_file(const spec_t *s)
{
    char k[128];
    buf_t b = {0};
    uint64_t n_kv = 9 + !!s->extra_key + !!s->extra_key2 + (s->rope_type ? 2 : 0) - s->no_eps;
    header(&b, 3, s->tensor ? 1 : 0, n_kv);
    kv_str(&b, "general.architecture", s->arch);
#define AK(suffix) (snprintf(k, sizeof k, "%s.%s", s->arch, suffix), k)
    kv_u32(&b, AK("block_count"), s->layers);
    kv_u32(&b, AK("embedding_length"), s->dim);
    kv_u32(&b, AK("attention.head_count"), s->heads);
    kv_u32(&b, AK("attention.head_count_kv"), s->kv_heads);
    kv_u32(&b, AK("feed_forward_length"), s->ff);
    kv_u32(&b, AK("context_length"), s->ctx);
    kv_u32(&b, AK("vocab_size"), 1000);
    if (!s->no_eps) kv_f32(&b, AK("attention.layer_norm_rms_epsilon"), 1e-6f);
    if (s->extra_key) kv_u32(&b, AK(s->extra_key), s->extra_val);
    if (s->extra_key2) kv_u32(&b, AK(s->extra_key2), s->extra_val2);
    if (s->rope_type) {
        kv_str(&b, AK("rope.scaling.type"), s->rope_type);
        kv_f32(&b, AK("rope.scaling.factor"), 8.0f);
    }
#undef AK
    if (s->tensor) {
        tensor_info(&b, s->tensor, 1, (uint64_t[]){8}, KVC_GGML_F32, 0);
        pad_to(&b, 32);
        for (int i = 0; i < 32; i++) put_u8(&b, 0);
    }
    return b;
}

static int read_spec(const spec_t *s, kvc_model_hparams_t *h, char *msg)
{
    buf_t b = model_file(s);
    kvc_gguf_t *g;
    int rc = kvc_gguf_open_memory(b.p, b.n, NULL, &g, msg, 256);
    if (rc == 0) {
        rc = kvc_model_hparams_from_gguf(g, h, msg, 256);
        kvc_gguf_close(g);
    }
    free(b.p);
    return rc;
}

static const spec_t base = {"llama", 32, 4096, 32, 8,    14336, 131072,
                            NULL,    0,  NULL, 0,  NULL, NULL,  false};

static void each_architecture_reads_its_variant(void **state)
{
    (void)state;
    char msg[256];
    kvc_model_hparams_t h;
    /* Llama 3.1-8B's shape; llama3 RoPE scaling is the rope_freqs tensor */
    spec_t s = base;
    s.tensor = "rope_freqs.weight";
    assert_ok(read_spec(&s, &h, msg));
    assert_int_equal(h.head_dim, 128);
    assert_int_equal(h.rope_scaling, KVC_ROPE_SCALING_LLAMA3);
    assert_true(h.tied); /* tensors, but no output.weight */
    kvc_plan_model_t pm;
    kvc_model_hparams_to_plan(&h, "x", &pm);
    assert_string_equal(pm.name, "x");
    /* 2 x 32 x 8 x 128 x 2 B = 131,072 B, Llama-3.1-8B's planner number */
    assert_int_equal(kvc_plan_kv_bytes_per_token(&pm, KVC_PLAN_BF16), 131072);
    /* Mistral: a window on every layer */
    s = base;
    s.extra_key = "attention.sliding_window";
    s.extra_val = 4096;
    assert_ok(read_spec(&s, &h, msg));
    assert_int_equal(h.sliding_window, 4096);
    assert_int_equal(h.n_sliding_layers, 32);
    assert_false(h.sliding_even_layers);
    /* qwen2: QKV bias, seen in its tensors */
    s = base;
    s.arch = "qwen2";
    s.tensor = "blk.0.attn_q.bias";
    assert_ok(read_spec(&s, &h, msg));
    assert_int_equal(h.arch, KVC_ARCH_QWEN2);
    assert_true(h.qkv_bias);
    /* qwen3: per-head Q/K norms, and an explicit head dim wider than dim / heads */
    s = base;
    s.arch = "qwen3";
    s.tensor = "blk.0.attn_q_norm.weight";
    s.extra_key = "attention.key_length";
    s.extra_val = 256;
    assert_ok(read_spec(&s, &h, msg));
    assert_true(h.qk_norm);
    assert_int_equal(h.head_dim, 256);
    assert_int_equal(h.v_head_dim, 256);
    /* gemma2: alternating windows on half the layers (rounded up), soft-caps, embed scale */
    s = base;
    s.arch = "gemma2";
    s.layers = 5;
    s.dim = 2304;
    s.heads = 8;
    s.kv_heads = 4;
    s.extra_key = "attention.sliding_window";
    s.extra_val = 4096;
    s.extra_key2 = "attn_logit_softcapping";
    s.extra_val2 = 50;
    assert_ok(read_spec(&s, &h, msg));
    assert_int_equal(h.n_sliding_layers, 3);
    assert_true(h.sliding_even_layers);
    assert_true(h.attn_softcap == 50.0);
    assert_true(h.final_softcap == 0.0);
    assert_true(h.embed_scale == 48.0); /* sqrt(2304) */
    /* RoPE scalings by name */
    s = base;
    s.rope_type = "yarn";
    assert_ok(read_spec(&s, &h, msg));
    assert_int_equal(h.rope_scaling, KVC_ROPE_SCALING_YARN);
    assert_true(h.rope_factor == 8.0);
    s.rope_type = "linear";
    assert_ok(read_spec(&s, &h, msg));
    assert_int_equal(h.rope_scaling, KVC_ROPE_SCALING_LINEAR);
    assert_string_equal(kvc_rope_scaling_name(h.rope_scaling), "linear");
    assert_string_equal(kvc_arch_name(KVC_ARCH_GEMMA2), "gemma2");
    assert_string_equal(kvc_arch_name(KVC_ARCH__COUNT), "?");
}

static void expect_refused(const spec_t *s, int want_rc, const char *want)
{
    char msg[256] = "";
    kvc_model_hparams_t h;
    memset(&h, 0x5a, sizeof h);
    kvc_model_hparams_t before = h;
    int rc = read_spec(s, &h, msg);
    if (rc != want_rc || !strstr(msg, want))
        fail_msg("want %s with '%s', got %s: '%s'", kvc_errname(want_rc), want, kvc_errname(rc),
                 msg);
    assert_memory_equal(&h, &before, sizeof h); /* untouched */
}

static void bad_metadata_is_refused_by_name(void **state)
{
    (void)state;
    spec_t s = base;
    s.arch = "mamba";
    expect_refused(&s, KVC_ENOTSUP, "architecture 'mamba' is not supported");
    s = base;
    s.extra_key = "expert_count";
    s.extra_val = 8;
    expect_refused(&s, KVC_ENOTSUP, "mixture-of-experts");
    s = base;
    s.layers = 0;
    expect_refused(&s, KVC_EPARSE, "llama.block_count: 0 is out of range");
    s = base;
    s.layers = 5000;
    expect_refused(&s, KVC_EPARSE, "llama.block_count: 5000 is out of range: 1..4096");
    s = base;
    s.kv_heads = 5;
    expect_refused(&s, KVC_EPARSE, "5 KV heads do not divide 32 query heads");
    s = base;
    s.no_eps = true;
    expect_refused(&s, KVC_EPARSE, "llama.attention.layer_norm_rms_epsilon: missing");
    s = base;
    s.extra_key = "rope.dimension_count";
    s.extra_val = 130; /* more than the head dim */
    expect_refused(&s, KVC_EPARSE, "llama.rope.dimension_count: 130 is out of range: 1..128");
    s = base;
    s.rope_type = "dynamic";
    expect_refused(&s, KVC_ENOTSUP, "only none, linear and yarn");
    s = base;
    s.arch = "gemma2";
    expect_refused(&s, KVC_EPARSE, "gemma2.attention.sliding_window: missing");
    /* a key of the wrong type */
    buf_t b = {0};
    header(&b, 3, 0, 1);
    put_str(&b, "general.architecture");
    put_u32(&b, KVC_GGUF_UINT32);
    put_u32(&b, 1);
    kvc_gguf_t *g;
    char msg[256];
    assert_ok(kvc_gguf_open_memory(b.p, b.n, NULL, &g, msg, sizeof msg));
    kvc_model_hparams_t h;
    assert_int_equal(kvc_model_hparams_from_gguf(g, &h, msg, sizeof msg), KVC_EPARSE);
    assert_non_null(strstr(msg, "general.architecture: not a string"));
    assert_int_equal(kvc_model_hparams_from_gguf(NULL, &h, msg, sizeof msg), KVC_EINVAL);
    kvc_gguf_close(g);
    free(b.p);
}

/* The embedding's shape must agree with the metadata. */
static void an_embedding_of_another_shape_is_refused(void **state)
{
    (void)state;
    spec_t s = base;
    buf_t b = model_file(&s);
    /* rewrite with a token_embd of [4096, 999] (the metadata says vocab 1000) */
    free(b.p);
    b = (buf_t){0};
    char msg[256];
    header(&b, 3, 1, 8);
    kv_str(&b, "general.architecture", "llama");
    kv_u32(&b, "llama.block_count", 1);
    kv_u32(&b, "llama.embedding_length", 64);
    kv_u32(&b, "llama.attention.head_count", 4);
    kv_u32(&b, "llama.feed_forward_length", 128);
    kv_u32(&b, "llama.context_length", 128);
    kv_u32(&b, "llama.vocab_size", 10);
    kv_f32(&b, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    tensor_info(&b, "token_embd.weight", 2, (uint64_t[]){64, 9}, KVC_GGML_F32, 0);
    pad_to(&b, 32);
    for (int i = 0; i < 64 * 9 * 4; i++) put_u8(&b, 0);
    kvc_gguf_t *g;
    assert_ok(kvc_gguf_open_memory(b.p, b.n, NULL, &g, msg, sizeof msg));
    kvc_model_hparams_t h;
    assert_int_equal(kvc_model_hparams_from_gguf(g, &h, msg, sizeof msg), KVC_EPARSE);
    assert_non_null(strstr(msg, "token_embd.weight is [64, 9], the metadata says [64, 10]"));
    kvc_gguf_close(g);
    free(b.p);
}

/* ---- tensor encodings ---- */
static void q8_0_and_q4_0_blocks_are_ggml_s(void **state)
{
    (void)state;
    float x[64], y[64];
    for (int i = 0; i < 64; i++) x[i] = (float)(i - 16) / 4.0f; /* block 0: -4 .. 3.75 */
    uint8_t q8[68], q4[36];
    assert_ok(kvc_ggml_quantize_row(KVC_GGML_Q8_0, x, q8, 64));
    /* block 0: amax 4, d = 4/127 in f16; q = round(x * 127 / 4): x = -4 -> -127 */
    uint16_t dh;
    memcpy(&dh, q8, 2);
    assert_int_equal(dh, kvc_f16_from_f32(4.0f / 127.0f));
    assert_int_equal((int8_t)q8[2], -127);
    assert_int_equal((int8_t)q8[2 + 16], 0);
    assert_int_equal((int8_t)q8[2 + 20], 32); /* x = 1: 31.75 rounds to 32 */
    assert_ok(kvc_ggml_dequantize_row(KVC_GGML_Q8_0, q8, y, 64));
    for (int b = 0; b < 2; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
        for (int i = 0; i < 32; i++) /* half a step, plus the f16 scale's rounding */
            assert_true(fabsf(y[32 * b + i] - x[32 * b + i]) <=
                        amax / 127.0f * 0.5f + amax * 1e-3f);
    }
    assert_ok(kvc_ggml_quantize_row(KVC_GGML_Q4_0, x, q4, 64));
    /* block 0: the value of largest magnitude is -4, d = -4 / -8 = 0.5; -4 -> q 0, 0 -> 8 */
    memcpy(&dh, q4, 2);
    assert_int_equal(dh, kvc_f16_from_f32(0.5f));
    assert_int_equal(q4[2] & 0xF, 0);     /* x[0] = -4 */
    assert_int_equal(q4[2] >> 4, 8);      /* x[16] = 0 */
    assert_int_equal(q4[2 + 8] >> 4, 12); /* x[24] = 2: (int)(2 / 0.5 + 8.5) = 12 */
    assert_ok(kvc_ggml_dequantize_row(KVC_GGML_Q4_0, q4, y, 64));
    for (int i = 0; i < 32; i++) assert_true(fabsf(y[i] - x[i]) <= 0.25f + 1e-6f);
    /* f16 / bf16 / f32 */
    uint16_t h[64];
    assert_ok(kvc_ggml_quantize_row(KVC_GGML_F16, x, h, 64));
    assert_ok(kvc_ggml_dequantize_row(KVC_GGML_F16, h, y, 64));
    assert_memory_equal(x, y, sizeof x); /* quarters are exact in f16 */
    assert_ok(kvc_ggml_quantize_row(KVC_GGML_BF16, x, h, 64));
    assert_ok(kvc_ggml_dequantize_row(KVC_GGML_BF16, h, y, 64));
    assert_memory_equal(x, y, sizeof x);
    assert_int_equal(kvc_ggml_quantize_row(KVC_GGML_Q8_0, x, q8, 33), KVC_EINVAL);
    assert_int_equal(kvc_ggml_quantize_row(KVC_GGML_Q5_K, x, q8, 256), KVC_ENOTSUP);
    /* the codecs there are, and only those */
    const uint32_t have[] = {KVC_GGML_F32,  KVC_GGML_F16,  KVC_GGML_BF16, KVC_GGML_Q8_0,
                             KVC_GGML_Q4_0, KVC_GGML_Q4_K, KVC_GGML_Q6_K};
    uint32_t n_have = 0;
    for (uint32_t ty = 0; ty < KVC_GGML_TYPE__END + 2; ty++) n_have += kvc_ggml_codec_supported(ty);
    assert_int_equal(n_have, sizeof have / sizeof have[0]);
    for (size_t k = 0; k < sizeof have / sizeof have[0]; k++)
        assert_true(kvc_ggml_codec_supported(have[k]));
    assert_int_equal(kvc_ggml_dequantize_row(KVC_GGML_Q2_K, q8, y, 256), KVC_ENOTSUP);
}

/* ---- synth ---- */
static void synth_path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/kvc_test_model_%d_%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid(), name);
}

static void synth_writes_the_model_it_was_asked_for(void **state)
{
    (void)state;
    char msg[256], path[512], path2[512];
    kvc_gguf_t *vocab;
    assert_ok(kvc_gguf_open(STORIES, NULL, &vocab, msg, sizeof msg));
    const uint32_t types[] = {KVC_GGML_F32, KVC_GGML_F16, KVC_GGML_BF16, KVC_GGML_Q8_0,
                              KVC_GGML_Q4_0};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        kvc_model_synth_t p = kvc_model_synth_default();
        p.dim = 64;
        p.n_layers = 2;
        p.n_heads = 4;
        p.n_kv_heads = 2;
        p.ff = 96;
        p.ctx = 256;
        p.type = types[ti];
        synth_path(path, sizeof path, "a.gguf");
        assert_ok(kvc_model_synth(&p, vocab, path, msg, sizeof msg));
        kvc_gguf_t *g;
        assert_ok(kvc_gguf_open(path, NULL, &g, msg, sizeof msg));
        kvc_model_hparams_t h;
        assert_ok(kvc_model_hparams_from_gguf(g, &h, msg, sizeof msg));
        assert_int_equal(h.dim, 64);
        assert_int_equal(h.n_layers, 2);
        assert_int_equal(h.n_heads, 4);
        assert_int_equal(h.n_kv_heads, 2);
        assert_int_equal(h.head_dim, 16);
        assert_int_equal(h.ff, 96);
        assert_int_equal(h.vocab, 512); /* stories260K's tokenizer */
        assert_int_equal(h.ctx, 256);
        assert_false(h.tied);
        assert_int_equal(kvc_gguf_n_tensors(g), 3 + 9 * 2);
        /* the tokenizer came over whole */
        kvc_gguf_arr_t a;
        kvc_gguf_str_t s;
        assert_ok(kvc_gguf_get_arr(g, "tokenizer.ggml.tokens", &a));
        assert_ok(kvc_gguf_arr_str(g, &a, 1, &s));
        assert_true(kvc_gguf_str_eq(s, "<s>"));
        /* shapes, types, values: norms 1, weights within +-1/sqrt(fan-in) (plus rounding) */
        const kvc_gguf_tensor_t *t = kvc_gguf_find_tensor(g, "blk.1.ffn_down.weight");
        assert_non_null(t);
        assert_int_equal(t->ne[0], 96);
        assert_int_equal(t->ne[1], 64);
        assert_int_equal(t->type, types[ti]);
        float *y = malloc(t->n_elems * sizeof *y);
        assert_ok(kvc_ggml_dequantize_row(t->type, t->data, y, t->n_elems));
        const float bound = 1.0f / sqrtf(96.0f) * 1.01f;
        double sum_abs = 0;
        for (uint64_t k = 0; k < t->n_elems; k++) {
            assert_true(fabsf(y[k]) <= bound);
            sum_abs += fabsf(y[k]);
        }
        /* uniform in +-a has mean |x| = a / 2 */
        assert_true(fabs(sum_abs / (double)t->n_elems - 0.5 / sqrt(96.0)) < 0.01);
        free(y);
        t = kvc_gguf_find_tensor(g, "blk.0.attn_norm.weight");
        assert_int_equal(t->type, KVC_GGML_F32);
        float one;
        memcpy(&one, t->data, 4);
        assert_true(one == 1.0f);
        assert_int_equal(kvc_gguf_find_tensor(g, "blk.0.attn_k.weight")->ne[1], 32); /* 2 x 16 */
        /* the same seed writes the same file; another seed another */
        synth_path(path2, sizeof path2, "b.gguf");
        assert_ok(kvc_model_synth(&p, vocab, path2, msg, sizeof msg));
        kvc_gguf_t *g2;
        assert_ok(kvc_gguf_open(path2, NULL, &g2, msg, sizeof msg));
        assert_int_equal(kvc_gguf_file_bytes(g2), kvc_gguf_file_bytes(g));
        for (uint64_t i = 0; i < kvc_gguf_n_tensors(g); i++)
            assert_memory_equal(kvc_gguf_tensor(g, i)->data, kvc_gguf_tensor(g2, i)->data,
                                kvc_gguf_tensor(g, i)->bytes);
        kvc_gguf_close(g2);
        p.seed = 2;
        assert_ok(kvc_model_synth(&p, vocab, path2, msg, sizeof msg));
        assert_ok(kvc_gguf_open(path2, NULL, &g2, msg, sizeof msg));
        const kvc_gguf_tensor_t *x = kvc_gguf_find_tensor(g, "blk.0.attn_q.weight"),
                                *z = kvc_gguf_find_tensor(g2, "blk.0.attn_q.weight");
        assert_true(memcmp(x->data, z->data, x->bytes) != 0);
        kvc_gguf_close(g2);
        kvc_gguf_close(g);
        unlink(path);
        unlink(path2);
    }
    kvc_gguf_close(vocab);
}

static void synth_refuses_shapes_it_cannot_write(void **state)
{
    (void)state;
    char msg[256], path[512];
    kvc_gguf_t *vocab;
    assert_ok(kvc_gguf_open(STORIES, NULL, &vocab, msg, sizeof msg));
    synth_path(path, sizeof path, "bad.gguf");
    kvc_model_synth_t p = kvc_model_synth_default();
    p.type = KVC_GGML_Q5_K;
    assert_int_equal(kvc_model_synth(&p, vocab, path, msg, sizeof msg), KVC_ENOTSUP);
    assert_non_null(strstr(msg, "--dtype q5_K"));
    p = kvc_model_synth_default();
    p.dim = 80; /* 80 % 32 != 0 for q8_0 */
    p.n_heads = 4;
    p.n_kv_heads = 2;
    assert_int_equal(kvc_model_synth(&p, vocab, path, msg, sizeof msg), KVC_EINVAL);
    assert_non_null(strstr(msg, "q8_0 needs dim and ff multiples of 32 (80, 1536)"));
    p = kvc_model_synth_default();
    p.n_kv_heads = 3;
    assert_int_equal(kvc_model_synth(&p, vocab, path, msg, sizeof msg), KVC_EINVAL);
    assert_non_null(strstr(msg, "3 KV heads do not divide 8 heads"));
    p = kvc_model_synth_default();
    p.n_layers = 5000;
    assert_int_equal(kvc_model_synth(&p, vocab, path, msg, sizeof msg), KVC_EINVAL);
    p = kvc_model_synth_default();
    p.arch = KVC_ARCH__COUNT;
    assert_int_equal(kvc_model_synth(&p, vocab, path, msg, sizeof msg), KVC_ENOTSUP);
    assert_int_equal(access(path, F_OK), -1); /* nothing written */
    /* a vocab file with no tokenizer */
    buf_t b = {0};
    header(&b, 3, 0, 1);
    kv_str(&b, "general.architecture", "llama");
    kvc_gguf_t *empty;
    assert_ok(kvc_gguf_open_memory(b.p, b.n, NULL, &empty, msg, sizeof msg));
    p = kvc_model_synth_default();
    assert_int_equal(kvc_model_synth(&p, empty, path, msg, sizeof msg), KVC_EPARSE);
    kvc_gguf_close(empty);
    free(b.p);
    kvc_gguf_close(vocab);
}

/* Q4_K and Q6_K: every sub-block's scale (and Q4_K's min) survives its 6- or 8-bit packing:
 * sub-blocks of very different ranges and offsets each come back within their own step. */
static void k_quant_blocks_keep_every_sub_block_scale(void **state)
{
    (void)state;
    float x[512], y[512];
    uint8_t q[512 / 256 * 210];
    kvc_rng_t r;
    kvc_rng_seed(&r, 3);
    for (int i = 0; i < 512; i++) {
        const int sub = (i % 256) / 32; /* Q4_K's sub-blocks of 32: ranges 0.01 .. 1.28 */
        const float amp = 0.01f * (float)(1 << sub), off = (sub % 3 - 1) * amp * 0.5f;
        x[i] = off + amp * (float)(2 * kvc_rng_double(&r) - 1);
    }
    assert_ok(kvc_ggml_quantize_row(KVC_GGML_Q4_K, x, q, 512));
    assert_ok(kvc_ggml_dequantize_row(KVC_GGML_Q4_K, q, y, 512));
    for (int i = 0; i < 512; i++) {
        const int sub = (i % 256) / 32;
        const float amp = 0.01f * (float)(1 << sub);
        /* step = (range) / 15 of a sub-block, its scale within 1/63 of the block's largest:
         * an error of at most a step plus the scale's and min's rounding */
        const float step = 3.0f * amp / 15.0f + 2.56f / 63.0f;
        if (fabsf(y[i] - x[i]) > step) fail_msg("q4_K element %d: %f vs %f", i, y[i], x[i]);
    }
    assert_ok(kvc_ggml_quantize_row(KVC_GGML_Q6_K, x, q, 512));
    assert_ok(kvc_ggml_dequantize_row(KVC_GGML_Q6_K, q, y, 512));
    for (int i = 0; i < 512; i++) {
        const int sub = (i % 256) / 32;
        const float amp = 0.01f * (float)(1 << sub) * 1.5f;
        const float step = amp / 32.0f + 1.92f / 128.0f; /* q step + the int8 scale's rounding */
        if (fabsf(y[i] - x[i]) > step) fail_msg("q6_K element %d: %f vs %f", i, y[i], x[i]);
    }
    /* a block of zeros stays zeros (no division by a zero scale) */
    float z[256] = {0};
    assert_ok(kvc_ggml_quantize_row(KVC_GGML_Q4_K, z, q, 256));
    assert_ok(kvc_ggml_dequantize_row(KVC_GGML_Q4_K, q, y, 256));
    for (int i = 0; i < 256; i++) assert_true(y[i] == 0.0f);
    assert_ok(kvc_ggml_quantize_row(KVC_GGML_Q6_K, z, q, 256));
    assert_ok(kvc_ggml_dequantize_row(KVC_GGML_Q6_K, q, y, 256));
    for (int i = 0; i < 256; i++) assert_true(y[i] == 0.0f);
    assert_int_equal(kvc_ggml_quantize_row(KVC_GGML_Q4_K, x, q, 255), KVC_EINVAL);
}

static void synth_writes_k_quants(void **state)
{
    (void)state;
    char msg[256], path[512];
    kvc_gguf_t *vocab;
    assert_ok(kvc_gguf_open(STORIES, NULL, &vocab, msg, sizeof msg));
    const uint32_t types[2] = {KVC_GGML_Q4_K, KVC_GGML_Q6_K};
    for (int ti = 0; ti < 2; ti++) {
        kvc_model_synth_t p = kvc_model_synth_default();
        p.dim = 256;
        p.n_layers = 1;
        p.n_heads = 4;
        p.n_kv_heads = 4;
        p.ff = 512;
        p.type = types[ti];
        synth_path(path, sizeof path, "k.gguf");
        assert_ok(kvc_model_synth(&p, vocab, path, msg, sizeof msg));
        kvc_gguf_t *g;
        assert_ok(kvc_gguf_open(path, NULL, &g, msg, sizeof msg));
        const kvc_gguf_tensor_t *t = kvc_gguf_find_tensor(g, "blk.0.ffn_gate.weight");
        assert_int_equal(t->type, types[ti]);
        assert_int_equal(t->bytes, 256 * 512 / 256 * (ti ? 210 : 144));
        float *y = malloc(t->n_elems * sizeof *y);
        assert_ok(kvc_ggml_dequantize_row(t->type, t->data, y, t->n_elems));
        for (uint64_t k = 0; k < t->n_elems; k++) assert_true(fabsf(y[k]) <= 1.05f / 16.0f);
        free(y);
        kvc_gguf_close(g);
        unlink(path);
    }
    kvc_model_synth_t p = kvc_model_synth_default(); /* dim 512, ff 1536: both multiples */
    p.type = KVC_GGML_Q4_K;
    p.ff = 1000;
    assert_int_equal(kvc_model_synth(&p, vocab, path, msg, sizeof msg), KVC_EINVAL);
    assert_non_null(strstr(msg, "q4_K needs dim and ff multiples of 256"));
    kvc_gguf_close(vocab);
}

/* The real model, end to end through the reader and the hyperparameters: the tests' own
 * reference forward pass, greedy from BOS, tells the story llama2.c documents for
 * stories260K (tests/data/PROVENANCE.md). */
static void stories260k_tells_its_story_through_the_reference_pass(void **state)
{
    (void)state;
    char msg[256];
    kvc_gguf_t *g;
    assert_ok(kvc_gguf_open(STORIES, NULL, &g, msg, sizeof msg));
    ref_llama_t m;
    const uint32_t n = 40;
    assert_int_equal(ref_llama_init(&m, g, n + 1), 0);
    kvc_gguf_arr_t tok;
    assert_ok(kvc_gguf_get_arr(g, "tokenizer.ggml.tokens", &tok));
    char text[1024] = "";
    size_t len = 0;
    uint32_t t = 1; /* BOS */
    for (uint32_t pos = 0; pos < n; pos++) {
        ref_llama_step(&m, t, pos);
        t = ref_argmax(m.logits, m.h.vocab);
        kvc_gguf_str_t piece;
        assert_ok(kvc_gguf_arr_str(g, &tok, t, &piece));
        /* SentencePiece pieces: U+2581 is a space; these stories need no byte tokens */
        for (uint64_t i = 0; i < piece.len && len < sizeof text - 1; i++) {
            if (i + 2 < piece.len && !memcmp(piece.s + i, "\xe2\x96\x81", 3)) {
                text[len++] = ' ';
                i += 2;
            } else {
                text[len++] = piece.s[i];
            }
        }
    }
    text[len] = 0;
    const char *want = " Once upon a time, there was a little girl named Lily. She loved to play "
                       "outside in the park.";
    if (strncmp(text, want, strlen(want))) fail_msg("the story went: '%s'", text);
    ref_llama_free(&m);
    kvc_gguf_close(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stories260k_hyperparameters),
        cmocka_unit_test(tiny_random_hyperparameters),
        cmocka_unit_test(each_architecture_reads_its_variant),
        cmocka_unit_test(bad_metadata_is_refused_by_name),
        cmocka_unit_test(an_embedding_of_another_shape_is_refused),
        cmocka_unit_test(q8_0_and_q4_0_blocks_are_ggml_s),
        cmocka_unit_test(synth_writes_the_model_it_was_asked_for),
        cmocka_unit_test(synth_refuses_shapes_it_cannot_write),
        cmocka_unit_test(k_quant_blocks_keep_every_sub_block_scale),
        cmocka_unit_test(synth_writes_k_quants),
        cmocka_unit_test(stories260k_tells_its_story_through_the_reference_pass),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
