/* synth.c - random-weight models for tests and benchmarks (kvcache model synth): a llama
 * model of any shape, its tokenizer copied from a vocab GGUF, written through the GGUF
 * writer one tensor at a time, so a 0.5B-parameter file needs one matrix in memory. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kvcache/model.h"
#include "util/msg.h"

kvc_model_synth_t kvc_model_synth_default(void)
{
    return (kvc_model_synth_t){.arch = KVC_ARCH_LLAMA,
                               .dim = 512,
                               .n_layers = 8,
                               .n_heads = 8,
                               .n_kv_heads = 4,
                               .ff = 1536,
                               .ctx = 2048,
                               .type = KVC_GGML_Q8_0,
                               .seed = 1};
}

/* llama.cpp's general.file_type for a model whose matrices are all `type`. */
static uint32_t file_type(uint32_t type)
{
    switch (type) {
    case KVC_GGML_F16:
        return 1;
    case KVC_GGML_Q4_0:
        return 2;
    case KVC_GGML_Q8_0:
        return 7;
    case KVC_GGML_Q4_K:
        return 15; /* llama.cpp's MOSTLY_Q4_K_M: the nearest name for all-Q4_K */
    case KVC_GGML_Q6_K:
        return 18;
    case KVC_GGML_BF16:
        return 32;
    default:
        return 0; /* all F32 */
    }
}

typedef struct {
    const kvc_model_synth_t *p;
    kvc_allocator_t a;
    float *row; /* one tensor's values */
    uint64_t row_cap;
    uint32_t n_tensors;
    struct {
        uint64_t ne0, ne1;
        uint32_t type;
        bool norm;
    } t[3 + 9 * KVC_PLAN_MAX_LAYERS];
} synth_t;

/* Tensor i's values: a PRNG stream of its own (seed, tensor index), so that every tensor is
 * the same whatever order or thread computes it. */
static int fill(void *ctx, uint64_t i, void *dst, uint64_t bytes)
{
    synth_t *s = ctx;
    const uint64_t n = s->t[i].ne0 * s->t[i].ne1;
    (void)bytes;
    if (s->t[i].norm) {
        for (uint64_t k = 0; k < n; k++) ((float *)dst)[k] = 1.0f;
        return 0;
    }
    kvc_rng_t r;
    kvc_rng_seed(&r, s->p->seed * 0x9E3779B97F4A7C15ull + i);
    const float a = 1.0f / sqrtf((float)s->t[i].ne0);
    /* one row at a time: ne0 values */
    if (s->t[i].ne0 > s->row_cap) return KVC_ECORRUPT;
    uint32_t blk, bb;
    int rc = kvc_ggml_type_size(s->t[i].type, &blk, &bb);
    if (rc) return rc;
    const uint64_t row_bytes = s->t[i].ne0 / blk * bb;
    for (uint64_t rrow = 0; rrow < s->t[i].ne1; rrow++) {
        for (uint64_t k = 0; k < s->t[i].ne0; k++)
            s->row[k] = a * (float)(2.0 * kvc_rng_double(&r) - 1.0);
        rc = kvc_ggml_quantize_row(s->t[i].type, s->row, (uint8_t *)dst + rrow * row_bytes,
                                   s->t[i].ne0);
        if (rc) return rc;
    }
    return 0;
}

static int check(const kvc_model_synth_t *p, char *msg, size_t cap)
{
    if (p->arch != KVC_ARCH_LLAMA)
        return kvc__msgf(KVC_ENOTSUP, msg, cap, "synth writes llama models only (not %s)",
                         kvc_arch_name(p->arch));
    if (!kvc_ggml_codec_supported(p->type))
        return kvc__msgf(KVC_ENOTSUP, msg, cap,
                         "--dtype %s: synth writes f32, f16, bf16, q8_0, q4_0, q4_K and q6_K",
                         kvc_ggml_type_name(p->type) ? kvc_ggml_type_name(p->type) : "?");
    if (!p->n_heads || !p->n_kv_heads || !p->dim || !p->n_layers || !p->ff || !p->ctx)
        return kvc__msgf(KVC_EINVAL, msg, cap, "every count must be at least 1");
    if (p->n_heads % p->n_kv_heads)
        return kvc__msgf(KVC_EINVAL, msg, cap, "%u KV heads do not divide %u heads", p->n_kv_heads,
                         p->n_heads);
    if (p->dim % p->n_heads)
        return kvc__msgf(KVC_EINVAL, msg, cap, "dim %u is not a multiple of %u heads", p->dim,
                         p->n_heads);
    uint32_t blk;
    (void)kvc_ggml_type_size(p->type, &blk, NULL); /* checked above */
    if (p->dim % blk || p->ff % blk)
        return kvc__msgf(KVC_EINVAL, msg, cap, "%s needs dim and ff multiples of %u (%u, %u)",
                         kvc_ggml_type_name(p->type), blk, p->dim, p->ff);
    if ((p->dim / p->n_heads) % 2)
        return kvc__msgf(KVC_EINVAL, msg, cap, "the head dim %u must be even (RoPE pairs)",
                         p->dim / p->n_heads);
    return 0;
}

static int add(kvc_gguf_writer_t *w, synth_t *s, const char *name, uint64_t ne0, uint64_t ne1,
               bool norm)
{
    uint32_t type = norm ? KVC_GGML_F32 : s->p->type;
    s->t[s->n_tensors].ne0 = ne0;
    s->t[s->n_tensors].ne1 = ne1;
    s->t[s->n_tensors].type = type;
    s->t[s->n_tensors].norm = norm;
    s->n_tensors++;
    return kvc_gguf_writer_add_tensor(w, name, type, norm ? 1 : 2, (uint64_t[]){ne0, ne1});
}

static int declare(kvc_gguf_writer_t *w, synth_t *s, uint32_t vocab)
{
    const kvc_model_synth_t *p = s->p;
    const uint32_t hd = p->dim / p->n_heads;
    int rc = add(w, s, "token_embd.weight", p->dim, vocab, false);
    if (!rc) rc = add(w, s, "output_norm.weight", p->dim, 1, true);
    if (!rc) rc = add(w, s, "output.weight", p->dim, vocab, false);
    for (uint32_t l = 0; l < p->n_layers && !rc; l++) {
        const struct {
            const char *name;
            uint64_t ne0, ne1;
            bool norm;
        } t[] = {{"attn_norm", p->dim, 1, true},
                 {"attn_q", p->dim, (uint64_t)p->n_heads * hd, false},
                 {"attn_k", p->dim, (uint64_t)p->n_kv_heads * hd, false},
                 {"attn_v", p->dim, (uint64_t)p->n_kv_heads * hd, false},
                 {"attn_output", (uint64_t)p->n_heads * hd, p->dim, false},
                 {"ffn_norm", p->dim, 1, true},
                 {"ffn_gate", p->dim, p->ff, false},
                 {"ffn_up", p->dim, p->ff, false},
                 {"ffn_down", p->ff, p->dim, false}};
        for (size_t k = 0; k < sizeof t / sizeof t[0] && !rc; k++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%u.%s.weight", l, t[k].name);
            rc = add(w, s, name, t[k].ne0, t[k].ne1, t[k].norm);
        }
    }
    return rc;
}

static int metadata(kvc_gguf_writer_t *w, const kvc_model_synth_t *p, const kvc_gguf_t *vocab)
{
    const char *name = p->name ? p->name : "kvcache-synth";
    int rc = kvc_gguf_writer_set_str(w, "general.architecture", "llama", 5);
    if (!rc) rc = kvc_gguf_writer_set_str(w, "general.name", name, strlen(name));
    if (!rc) rc = kvc_gguf_writer_set_u32(w, "general.file_type", file_type(p->type));
    if (!rc) rc = kvc_gguf_writer_set_u32(w, "llama.context_length", p->ctx);
    if (!rc) rc = kvc_gguf_writer_set_u32(w, "llama.embedding_length", p->dim);
    if (!rc) rc = kvc_gguf_writer_set_u32(w, "llama.feed_forward_length", p->ff);
    if (!rc) rc = kvc_gguf_writer_set_u32(w, "llama.block_count", p->n_layers);
    if (!rc) rc = kvc_gguf_writer_set_u32(w, "llama.attention.head_count", p->n_heads);
    if (!rc) rc = kvc_gguf_writer_set_u32(w, "llama.attention.head_count_kv", p->n_kv_heads);
    if (!rc) rc = kvc_gguf_writer_set_u32(w, "llama.rope.dimension_count", p->dim / p->n_heads);
    if (!rc) rc = kvc_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f);
    if (!rc) rc = kvc_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    for (uint64_t i = 0; i < kvc_gguf_n_kv(vocab) && !rc; i++) {
        kvc_gguf_str_t k = kvc_gguf_key(vocab, i);
        if (k.len > 10 && !memcmp(k.s, "tokenizer.", 10)) rc = kvc_gguf_writer_copy_kv(w, vocab, i);
    }
    return rc;
}

int kvc_model_synth(const kvc_model_synth_t *p, const kvc_gguf_t *vocab, const char *path,
                    char *msg, size_t cap)
{
    if (msg && cap) msg[0] = 0;
    if (!p || !vocab || !path) return kvc__msgf(KVC_EINVAL, msg, cap, "invalid argument");
    int rc = check(p, msg, cap);
    if (rc) return rc;
    kvc_gguf_arr_t tok;
    if (kvc_gguf_get_arr(vocab, "tokenizer.ggml.tokens", &tok) || tok.n == 0 ||
        tok.n > KVC_PLAN_MAX_VOCAB)
        return kvc__msgf(KVC_EPARSE, msg, cap, "the vocab file has no tokenizer.ggml.tokens");
    /* the planner's bounds on the whole model */
    kvc_model_hparams_t h = {.arch = KVC_ARCH_LLAMA,
                             .n_layers = p->n_layers,
                             .dim = p->dim,
                             .n_heads = p->n_heads,
                             .n_kv_heads = p->n_kv_heads,
                             .head_dim = p->dim / p->n_heads,
                             .v_head_dim = p->dim / p->n_heads,
                             .ff = p->ff,
                             .vocab = (uint32_t)tok.n,
                             .ctx = p->ctx};
    kvc_plan_model_t pm;
    kvc_model_hparams_to_plan(&h, "synth", &pm);
    char why[160];
    if (kvc_plan_model_check(&pm, why, sizeof why))
        return kvc__msgf(KVC_EINVAL, msg, cap, "%s", why);
    synth_t *s = kvc_calloc(NULL, 1, sizeof *s, 64);
    if (!s) return kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    s->p = p;
    s->row_cap = p->dim > p->ff ? p->dim : p->ff;
    s->row = kvc_alloc(NULL, (size_t)s->row_cap * sizeof(float), 64);
    kvc_gguf_writer_t *w = NULL;
    if (!s->row || (rc = kvc_gguf_writer_create(NULL, &w))) {
        rc = kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    } else if ((rc = metadata(w, p, vocab)) || (rc = declare(w, s, (uint32_t)tok.n))) {
        kvc__msgf(rc, msg, cap, "building the file: %s", kvc_strerror(rc));
    } else {
        rc = kvc_gguf_writer_write(w, path, fill, s, msg, cap);
    }
    kvc_gguf_writer_destroy(w);
    kvc_free(NULL, s->row);
    kvc_free(NULL, s);
    return rc;
}
