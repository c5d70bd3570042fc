/* synth.c - random-weight models for tests and benchmarks (kvcache model synth): a llama,
 * qwen2, qwen3 or gemma2 model of any shape (with Mistral's sliding window or a RoPE scaling
 * as options), its tokenizer copied from a vocab GGUF, written through the GGUF writer one
 * tensor at a time, so a 0.5B-parameter file needs one matrix in memory.  The metadata keys
 * are the ones model.c reads, which are llama.cpp's. */
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
                               .seed = 1,
                               .norm_jitter = -1,
                               .attn_softcap = -1,
                               .final_softcap = -1};
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

/* What a synth tensor holds. */
typedef enum { T_MAT, T_NORM, T_BIAS, T_FREQS } kind_t;

/* The options with every "the architecture's default" resolved. */
typedef struct {
    kvc_model_synth_t p;
    uint32_t head_dim;
    float norm_jitter;
    double rms_eps;
} resolved_t;

#define MAX_LAYER_TENSORS 12 /* qwen2: 9 + 3 biases */

typedef struct {
    const resolved_t *r;
    kvc_allocator_t a;
    float *row; /* one tensor's values */
    uint64_t row_cap;
    uint32_t n_tensors;
    struct {
        uint64_t ne0, ne1;
        uint32_t type;
        kind_t kind;
    } t[4 + MAX_LAYER_TENSORS * KVC_PLAN_MAX_LAYERS];
} synth_t;

/* llama3's per-dimension frequency divisors (Llama 3.1's rope_scaling: low_freq_factor 1,
 * high_freq_factor 4), as llama.cpp's converter writes rope_freqs.weight. */
static void llama3_freqs(const resolved_t *r, float *out, uint64_t n)
{
    const double factor = r->p.rope_factor, orig = r->p.rope_orig_ctx, lo_f = 1, hi_f = 4;
    const double lo_wave = orig / lo_f, hi_wave = orig / hi_f;
    for (uint64_t i = 0; i < n; i++) {
        const double freq = pow(r->p.rope_theta, -2.0 * (double)i / (2.0 * (double)n));
        const double wave = 2 * M_PI / freq;
        double f;
        if (wave < hi_wave)
            f = 1;
        else if (wave > lo_wave)
            f = factor;
        else {
            const double smooth = (orig / wave - lo_f) / (hi_f - lo_f);
            f = 1 / ((1 - smooth) / factor + smooth);
        }
        out[i] = (float)f;
    }
}

/* Tensor i's values: a PRNG stream of its own (seed, tensor index), so that every tensor is
 * the same whatever order or thread computes it. */
static int fill(void *ctx, uint64_t i, void *dst, uint64_t bytes)
{
    synth_t *s = ctx;
    const uint64_t n = s->t[i].ne0 * s->t[i].ne1;
    (void)bytes;
    kvc_rng_t r;
    kvc_rng_seed(&r, s->r->p.seed * 0x9E3779B97F4A7C15ull + i);
    float *f = dst;
    switch (s->t[i].kind) {
    case T_NORM: {
        const float j = s->r->norm_jitter;
        for (uint64_t k = 0; k < n; k++)
            f[k] = j > 0 ? 1.0f + j * (float)(2.0 * kvc_rng_double(&r) - 1.0) : 1.0f;
        return 0;
    }
    case T_BIAS:
        for (uint64_t k = 0; k < n; k++) f[k] = 0.2f * (float)(2.0 * kvc_rng_double(&r) - 1.0);
        return 0;
    case T_FREQS:
        llama3_freqs(s->r, f, n);
        return 0;
    case T_MAT:
        break;
    }
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

/* Check p and resolve its defaults into *r. */
static int check(const kvc_model_synth_t *p, resolved_t *r, char *msg, size_t cap)
{
    if ((unsigned)p->arch >= KVC_ARCH__COUNT)
        return kvc__msgf(KVC_ENOTSUP, msg, cap,
                         "synth writes llama, qwen2, qwen3 and gemma2 models (not arch %d)",
                         (int)p->arch);
    if (!kvc_ggml_codec_supported(p->type))
        return kvc__msgf(KVC_ENOTSUP, msg, cap,
                         "--dtype %s: synth writes f32, f16, bf16, q8_0, q4_0, q4_K and q6_K",
                         kvc_ggml_type_name(p->type) ? kvc_ggml_type_name(p->type) : "?");
    if (!p->n_heads || !p->n_kv_heads || !p->dim || !p->n_layers || !p->ff || !p->ctx)
        return kvc__msgf(KVC_EINVAL, msg, cap, "every count must be at least 1");
    if (p->n_heads % p->n_kv_heads)
        return kvc__msgf(KVC_EINVAL, msg, cap, "%u KV heads do not divide %u heads", p->n_kv_heads,
                         p->n_heads);
    if (!p->head_dim && p->dim % p->n_heads)
        return kvc__msgf(KVC_EINVAL, msg, cap, "dim %u is not a multiple of %u heads", p->dim,
                         p->n_heads);
    uint32_t blk;
    (void)kvc_ggml_type_size(p->type, &blk, NULL); /* checked above */
    if (p->dim % blk || p->ff % blk)
        return kvc__msgf(KVC_EINVAL, msg, cap, "%s needs dim and ff multiples of %u (%u, %u)",
                         kvc_ggml_type_name(p->type), blk, p->dim, p->ff);
    const uint32_t hd = p->head_dim ? p->head_dim : p->dim / p->n_heads;
    if (hd % 2)
        return kvc__msgf(KVC_EINVAL, msg, cap, "the head dim %u must be even (RoPE pairs)", hd);
    if (hd > KVC_PLAN_MAX_HEAD_DIM)
        return kvc__msgf(KVC_EINVAL, msg, cap, "the head dim %u is above %u", hd,
                         KVC_PLAN_MAX_HEAD_DIM);
    if (((uint64_t)p->n_heads * hd) % blk)
        return kvc__msgf(KVC_EINVAL, msg, cap, "%s needs heads x head dim (%llu) a multiple of %u",
                         kvc_ggml_type_name(p->type), (unsigned long long)p->n_heads * hd, blk);
    memset(r, 0, sizeof *r);
    r->p = *p;
    r->head_dim = hd;
    const bool gemma = p->arch == KVC_ARCH_GEMMA2;
    if (!(p->norm_jitter < 1)) /* NaN included */
        return kvc__msgf(KVC_EINVAL, msg, cap, "--norm-jitter %g: below 1, so norms stay positive",
                         (double)p->norm_jitter);
    r->norm_jitter = p->norm_jitter >= 0 ? p->norm_jitter : p->arch == KVC_ARCH_LLAMA ? 0 : 0.1f;
    r->rms_eps = p->arch == KVC_ARCH_LLAMA ? 1e-5 : 1e-6;
    if (p->sliding_window && (p->arch == KVC_ARCH_QWEN2 || p->arch == KVC_ARCH_QWEN3))
        return kvc__msgf(KVC_EINVAL, msg, cap, "%s files have no sliding window",
                         kvc_arch_name(p->arch));
    if (p->sliding_window > KVC_PLAN_MAX_WINDOW)
        return kvc__msgf(KVC_EINVAL, msg, cap, "--sliding-window %u is above %u", p->sliding_window,
                         KVC_PLAN_MAX_WINDOW);
    if (gemma && !p->sliding_window) r->p.sliding_window = 4096;
    if (!gemma && (p->attn_softcap > 0 || p->final_softcap > 0))
        return kvc__msgf(KVC_EINVAL, msg, cap, "soft-capping is gemma2's, not %s's",
                         kvc_arch_name(p->arch));
    if (!(p->attn_softcap <= 1e6 && p->final_softcap <= 1e6))
        return kvc__msgf(KVC_EINVAL, msg, cap, "a soft-cap is at most 1e6");
    r->p.attn_softcap = !gemma ? 0 : p->attn_softcap < 0 ? 50 : p->attn_softcap;
    r->p.final_softcap = !gemma ? 0 : p->final_softcap < 0 ? 30 : p->final_softcap;
    if (p->rope_theta == 0) r->p.rope_theta = 10000;
    if (!(r->p.rope_theta > 1 && r->p.rope_theta <= 1e12))
        return kvc__msgf(KVC_EINVAL, msg, cap, "--rope-theta %g: in (1, 1e12]", p->rope_theta);
    if ((unsigned)p->rope_scaling >= KVC_ROPE_SCALING__COUNT)
        return kvc__msgf(KVC_EINVAL, msg, cap, "no RoPE scaling %d", (int)p->rope_scaling);
    if (p->rope_scaling == KVC_ROPE_SCALING_NONE) {
        if (p->rope_factor != 0 || p->rope_orig_ctx)
            return kvc__msgf(KVC_EINVAL, msg, cap,
                             "a RoPE factor or original context needs a "
                             "RoPE scaling (linear, yarn or llama3)");
        return 0;
    }
    if (p->rope_factor == 0) r->p.rope_factor = p->rope_scaling == KVC_ROPE_SCALING_LLAMA3 ? 8 : 4;
    if (!(r->p.rope_factor >= 1 && r->p.rope_factor <= 1e6))
        return kvc__msgf(KVC_EINVAL, msg, cap, "--rope-factor %g: in [1, 1e6]",
                         (double)p->rope_factor);
    if (p->rope_scaling == KVC_ROPE_SCALING_LINEAR && p->rope_orig_ctx)
        return kvc__msgf(KVC_EINVAL, msg, cap, "linear RoPE scaling has no original context");
    if (p->rope_scaling == KVC_ROPE_SCALING_LLAMA3 && !p->rope_orig_ctx) r->p.rope_orig_ctx = 8192;
    return 0;
}

static int add(kvc_gguf_writer_t *w, synth_t *s, const char *name, uint64_t ne0, uint64_t ne1,
               kind_t kind)
{
    uint32_t type = kind == T_MAT ? s->r->p.type : KVC_GGML_F32;
    s->t[s->n_tensors].ne0 = ne0;
    s->t[s->n_tensors].ne1 = ne1;
    s->t[s->n_tensors].type = type;
    s->t[s->n_tensors].kind = kind;
    s->n_tensors++;
    return kvc_gguf_writer_add_tensor(w, name, type, kind == T_MAT ? 2 : 1, (uint64_t[]){ne0, ne1});
}

static int declare(kvc_gguf_writer_t *w, synth_t *s, uint32_t vocab)
{
    const kvc_model_synth_t *p = &s->r->p;
    const uint32_t hd = s->r->head_dim;
    const uint64_t q_dim = (uint64_t)p->n_heads * hd, kv_dim = (uint64_t)p->n_kv_heads * hd;
    const bool bias = p->arch == KVC_ARCH_QWEN2, qk_norm = p->arch == KVC_ARCH_QWEN3,
               gemma = p->arch == KVC_ARCH_GEMMA2;
    int rc = add(w, s, "token_embd.weight", p->dim, vocab, T_MAT);
    if (!rc) rc = add(w, s, "output_norm.weight", p->dim, 1, T_NORM);
    if (!rc && !p->tied) rc = add(w, s, "output.weight", p->dim, vocab, T_MAT);
    if (!rc && p->rope_scaling == KVC_ROPE_SCALING_LLAMA3)
        rc = add(w, s, "rope_freqs.weight", hd / 2, 1, T_FREQS);
    for (uint32_t l = 0; l < p->n_layers && !rc; l++) {
        /* llama.cpp's order within a block; a tensor the architecture lacks is skipped */
        const struct {
            const char *name;
            uint64_t ne0, ne1;
            kind_t kind;
            bool on;
        } t[] = {{"attn_norm.weight", p->dim, 1, T_NORM, true},
                 {"attn_q.weight", p->dim, q_dim, T_MAT, true},
                 {"attn_q.bias", q_dim, 1, T_BIAS, bias},
                 {"attn_k.weight", p->dim, kv_dim, T_MAT, true},
                 {"attn_k.bias", kv_dim, 1, T_BIAS, bias},
                 {"attn_v.weight", p->dim, kv_dim, T_MAT, true},
                 {"attn_v.bias", kv_dim, 1, T_BIAS, bias},
                 {"attn_q_norm.weight", hd, 1, T_NORM, qk_norm},
                 {"attn_k_norm.weight", hd, 1, T_NORM, qk_norm},
                 {"attn_output.weight", q_dim, p->dim, T_MAT, true},
                 {"post_attention_norm.weight", p->dim, 1, T_NORM, gemma},
                 {"ffn_norm.weight", p->dim, 1, T_NORM, true},
                 {"ffn_gate.weight", p->dim, p->ff, T_MAT, true},
                 {"ffn_up.weight", p->dim, p->ff, T_MAT, true},
                 {"ffn_down.weight", p->ff, p->dim, T_MAT, true},
                 {"post_ffw_norm.weight", p->dim, 1, T_NORM, gemma}};
        for (size_t k = 0; k < sizeof t / sizeof t[0] && !rc; k++) {
            if (!t[k].on) continue;
            char name[64];
            snprintf(name, sizeof name, "blk.%u.%s", l, t[k].name);
            rc = add(w, s, name, t[k].ne0, t[k].ne1, t[k].kind);
        }
    }
    return rc;
}

static int metadata(kvc_gguf_writer_t *w, const resolved_t *r, const kvc_gguf_t *vocab)
{
    const kvc_model_synth_t *p = &r->p;
    const char *name = p->name ? p->name : "kvcache-synth";
    const char *arch = kvc_arch_name(p->arch);
    char key[96];
#define K(s) (snprintf(key, sizeof key, "%s.%s", arch, (s)), key)
    int rc = kvc_gguf_writer_set_str(w, "general.architecture", arch, strlen(arch));
    if (!rc) rc = kvc_gguf_writer_set_str(w, "general.name", name, strlen(name));
    if (!rc) rc = kvc_gguf_writer_set_u32(w, "general.file_type", file_type(p->type));
    if (!rc) rc = kvc_gguf_writer_set_u32(w, K("context_length"), p->ctx);
    if (!rc) rc = kvc_gguf_writer_set_u32(w, K("embedding_length"), p->dim);
    if (!rc) rc = kvc_gguf_writer_set_u32(w, K("feed_forward_length"), p->ff);
    if (!rc) rc = kvc_gguf_writer_set_u32(w, K("block_count"), p->n_layers);
    if (!rc) rc = kvc_gguf_writer_set_u32(w, K("attention.head_count"), p->n_heads);
    if (!rc) rc = kvc_gguf_writer_set_u32(w, K("attention.head_count_kv"), p->n_kv_heads);
    if (!rc) rc = kvc_gguf_writer_set_u32(w, K("rope.dimension_count"), r->head_dim);
    if (!rc) rc = kvc_gguf_writer_set_f32(w, K("rope.freq_base"), (float)p->rope_theta);
    if (!rc)
        rc = kvc_gguf_writer_set_f32(w, K("attention.layer_norm_rms_epsilon"), (float)r->rms_eps);
    /* the keys below appear only where a llama model of today's defaults has none */
    if (!rc && (p->arch != KVC_ARCH_LLAMA || r->head_dim * p->n_heads != p->dim)) {
        rc = kvc_gguf_writer_set_u32(w, K("attention.key_length"), r->head_dim);
        if (!rc) rc = kvc_gguf_writer_set_u32(w, K("attention.value_length"), r->head_dim);
    }
    if (!rc && p->sliding_window)
        rc = kvc_gguf_writer_set_u32(w, K("attention.sliding_window"), p->sliding_window);
    if (!rc && p->arch == KVC_ARCH_GEMMA2) {
        rc = kvc_gguf_writer_set_f32(w, K("attn_logit_softcapping"), p->attn_softcap);
        if (!rc) rc = kvc_gguf_writer_set_f32(w, K("final_logit_softcapping"), p->final_softcap);
    }
    if (!rc &&
        (p->rope_scaling == KVC_ROPE_SCALING_LINEAR || p->rope_scaling == KVC_ROPE_SCALING_YARN)) {
        const char *type = kvc_rope_scaling_name(p->rope_scaling);
        rc = kvc_gguf_writer_set_str(w, K("rope.scaling.type"), type, strlen(type));
        if (!rc) rc = kvc_gguf_writer_set_f32(w, K("rope.scaling.factor"), p->rope_factor);
        if (!rc && p->rope_scaling == KVC_ROPE_SCALING_YARN && p->rope_orig_ctx)
            rc = kvc_gguf_writer_set_u32(w, K("rope.scaling.original_context_length"),
                                         p->rope_orig_ctx);
    }
#undef K
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
    resolved_t r;
    int rc = check(p, &r, msg, cap);
    if (rc) return rc;
    kvc_gguf_arr_t tok;
    if (kvc_gguf_get_arr(vocab, "tokenizer.ggml.tokens", &tok) || tok.n == 0 ||
        tok.n > KVC_PLAN_MAX_VOCAB)
        return kvc__msgf(KVC_EPARSE, msg, cap, "the vocab file has no tokenizer.ggml.tokens");
    /* the planner's bounds on the whole model */
    kvc_model_hparams_t h = {.arch = p->arch,
                             .n_layers = p->n_layers,
                             .dim = p->dim,
                             .n_heads = p->n_heads,
                             .n_kv_heads = p->n_kv_heads,
                             .head_dim = r.head_dim,
                             .v_head_dim = r.head_dim,
                             .ff = p->ff,
                             .vocab = (uint32_t)tok.n,
                             .ctx = p->ctx,
                             .tied = p->tied,
                             .qkv_bias = p->arch == KVC_ARCH_QWEN2,
                             .sliding_window = r.p.sliding_window,
                             .n_sliding_layers = !r.p.sliding_window ? 0
                                                 : p->arch == KVC_ARCH_GEMMA2
                                                     ? (p->n_layers + 1) / 2
                                                     : p->n_layers};
    kvc_plan_model_t pm;
    kvc_model_hparams_to_plan(&h, "synth", &pm);
    char why[160];
    if (kvc_plan_model_check(&pm, why, sizeof why))
        return kvc__msgf(KVC_EINVAL, msg, cap, "%s", why);
    synth_t *s = kvc_calloc(NULL, 1, sizeof *s, 64);
    if (!s) return kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    s->r = &r;
    s->row_cap = KVC_MAX(KVC_MAX(p->dim, p->ff), (uint64_t)p->n_heads * r.head_dim);
    s->row = kvc_alloc(NULL, (size_t)s->row_cap * sizeof(float), 64);
    kvc_gguf_writer_t *w = NULL;
    if (!s->row || (rc = kvc_gguf_writer_create(NULL, &w))) {
        rc = kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    } else if ((rc = metadata(w, &r, vocab)) || (rc = declare(w, s, (uint32_t)tok.n))) {
        kvc__msgf(rc, msg, cap, "building the file: %s", kvc_strerror(rc));
    } else {
        rc = kvc_gguf_writer_write(w, path, fill, s, msg, cap);
    }
    kvc_gguf_writer_destroy(w);
    kvc_free(NULL, s->row);
    kvc_free(NULL, s);
    return rc;
}
