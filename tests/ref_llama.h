/* ref_llama.h - the tests' own reference forward pass of every architecture the engine runs
 * (llama, with Mistral's sliding window and the RoPE scalings; qwen2; qwen3; gemma2): one
 * sequence, a contiguous KV cache, weights dequantized to f32 once, every activation, cached
 * key and value, dot product and norm in double precision.  Written from the architectures'
 * definitions (the papers, Hugging Face's modeling code, llama.cpp's graphs), independently
 * of the engine's forward.c, so that the engine's logits can be checked against it:
 *
 *  - all: pre-norm blocks, RMSNorm y = x / sqrt(mean(x^2) + eps) * w, grouped-query
 *    attention with logits q.k / sqrt(head_dim) over keys 0 .. pos, a gated MLP
 *    down(act(gate x) * up x), a final RMSNorm and the LM head (the embedding when tied);
 *  - llama: SiLU; RoPE on adjacent pairs (2i, 2i + 1), because llama.cpp's converter permutes
 *    llama's Q and K rows so that GGUF's pairs are adjacent; a sliding window (Mistral) on
 *    every layer: query pos sees keys pos - window + 1 .. pos;
 *  - qwen2, qwen3, gemma2: RoPE on halves (i, i + rope_dim / 2) ("NEOX" in llama.cpp);
 *  - qwen2: biases on Q, K and V;  qwen3: RMSNorm of each head of Q and K (one weight of
 *    head_dim shared by the heads) before RoPE;
 *  - gemma2: embeddings times sqrt(dim), GELU (tanh form), RMSNorm of the attention output
 *    and of the MLP output before each residual add (post_attention_norm, post_ffw_norm;
 *    every gemma2 norm weight stored with its +1 already added, as llama.cpp's converter
 *    writes them, so they multiply as they are), attention logits soft-capped
 *    cap * tanh(z / cap), final logits likewise, layers 0, 2, 4, ... sliding, logits scaled
 *    by 1 / sqrt(query_pre_attn_scalar): head_dim, but dim / heads for the 27B (46 layers);
 *  - RoPE frequencies base^(-2i / rope_dim) at position pos, scaled: linear (pos / factor),
 *    llama3 (each frequency divided by rope_freqs[i], a tensor of the file), YaRN (Peng et al.,
 *    as HF's _compute_yarn_parameters and llama.cpp compute it: frequencies interpolated by
 *    1 / factor below the correction range, kept above it, a linear ramp over the dimension
 *    index in between (beta_fast 32, beta_slow 1, the range floored / ceiled), cos and sin
 *    times 1 + 0.1 ln(factor); the original context, when the file has none, is the
 *    context length, as in llama.cpp and HF).
 * The hyperparameters come from the metadata reader (model.c), which is what the file
 * means; everything after that is here. */
#ifndef KVC_TEST_REF_LLAMA_H
#define KVC_TEST_REF_LLAMA_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvcache/model.h"

typedef struct {
    float *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w1, *w3, *w2;
    float *bq, *bk, *bv;                   /* qwen2, else NULL */
    float *q_norm, *k_norm;                /* qwen3: (head_dim), else NULL */
    float *post_attn_norm, *post_ffn_norm; /* gemma2, else NULL */
    uint32_t window;                       /* this layer's sliding window; 0: full */
} ref_layer_t;

typedef struct {
    kvc_model_hparams_t h;
    uint32_t q_dim, kv_dim;
    float *embd, *out_norm, *out; /* (vocab, dim), (dim), (vocab, dim) */
    float *rope_freqs;            /* llama3: (rope_dim / 2) divisors, else NULL */
    ref_layer_t *layer;
    double *k_cache, *v_cache; /* (n_layers, max_pos, kv_dim) */
    uint32_t max_pos;
    double *x, *xb, *q, *k, *v, *att, *ao, *h1, *h3, *hb;
    double *logits; /* (vocab) */
} ref_llama_t;

static inline float *ref_tensor(const kvc_gguf_t *g, const char *name, uint64_t want_elems)
{
    const kvc_gguf_tensor_t *t = kvc_gguf_find_tensor(g, name);
    if (!t || t->n_elems != want_elems) return NULL;
    float *f = malloc(t->n_elems * sizeof *f);
    if (f && kvc_ggml_dequantize_row(t->type, t->data, f, t->n_elems)) {
        free(f);
        return NULL;
    }
    return f;
}

static inline void ref_llama_free(ref_llama_t *m)
{
    if (m->layer)
        for (uint32_t l = 0; l < m->h.n_layers; l++) {
            ref_layer_t *L = &m->layer[l];
            free(L->attn_norm), free(L->wq), free(L->wk), free(L->wv), free(L->wo);
            free(L->ffn_norm), free(L->w1), free(L->w3), free(L->w2);
            free(L->bq), free(L->bk), free(L->bv), free(L->q_norm), free(L->k_norm);
            free(L->post_attn_norm), free(L->post_ffn_norm);
        }
    if (m->out != m->embd) free(m->out);
    free(m->embd), free(m->out_norm), free(m->rope_freqs), free(m->layer);
    free(m->k_cache), free(m->v_cache);
    free(m->x), free(m->xb), free(m->q), free(m->k), free(m->v), free(m->att), free(m->ao);
    free(m->h1), free(m->h3), free(m->hb), free(m->logits);
    memset(m, 0, sizeof *m);
}

/* 0, or -1 (everything freed) if a tensor is missing, of the wrong size, or of a type the
 * reference cannot read. */
static inline int ref_llama_init(ref_llama_t *m, const kvc_gguf_t *g, uint32_t max_pos)
{
    memset(m, 0, sizeof *m);
    char msg[256];
    if (kvc_model_hparams_from_gguf(g, &m->h, msg, sizeof msg)) return -1;
    const kvc_model_hparams_t *h = &m->h;
    const bool qwen2 = h->arch == KVC_ARCH_QWEN2, qwen3 = h->arch == KVC_ARCH_QWEN3,
               gemma2 = h->arch == KVC_ARCH_GEMMA2;
    m->q_dim = h->n_heads * h->head_dim;
    m->kv_dim = h->n_kv_heads * h->head_dim;
    m->max_pos = max_pos;
    const uint64_t dim = h->dim, vocab = h->vocab;
    m->embd = ref_tensor(g, "token_embd.weight", dim * vocab);
    m->out_norm = ref_tensor(g, "output_norm.weight", dim);
    m->out = h->tied ? m->embd : ref_tensor(g, "output.weight", dim * vocab);
    m->layer = calloc(h->n_layers, sizeof *m->layer);
    if (!m->embd || !m->out_norm || !m->out || !m->layer) goto fail;
    if (kvc_gguf_find_tensor(g, "rope_freqs.weight") &&
        !(m->rope_freqs = ref_tensor(g, "rope_freqs.weight", h->rope_dim / 2)))
        goto fail;
    for (uint32_t l = 0; l < h->n_layers; l++) {
        ref_layer_t *L = &m->layer[l];
        char n[64];
#define LT(field, name, elems)                \
    snprintf(n, sizeof n, "blk.%u." name, l); \
    if (!(L->field = ref_tensor(g, n, (elems)))) goto fail
        LT(attn_norm, "attn_norm.weight", dim);
        LT(wq, "attn_q.weight", dim * m->q_dim);
        LT(wk, "attn_k.weight", dim * m->kv_dim);
        LT(wv, "attn_v.weight", dim * m->kv_dim);
        LT(wo, "attn_output.weight", (uint64_t)m->q_dim * dim);
        LT(ffn_norm, "ffn_norm.weight", dim);
        LT(w1, "ffn_gate.weight", dim * h->ff);
        LT(w3, "ffn_up.weight", dim * h->ff);
        LT(w2, "ffn_down.weight", (uint64_t)h->ff * dim);
        if (qwen2) {
            LT(bq, "attn_q.bias", m->q_dim);
            LT(bk, "attn_k.bias", m->kv_dim);
            LT(bv, "attn_v.bias", m->kv_dim);
        }
        if (qwen3) {
            LT(q_norm, "attn_q_norm.weight", h->head_dim);
            LT(k_norm, "attn_k_norm.weight", h->head_dim);
        }
        if (gemma2) {
            LT(post_attn_norm, "post_attention_norm.weight", dim);
            LT(post_ffn_norm, "post_ffw_norm.weight", dim);
        }
#undef LT
        /* gemma2 (HF's Gemma2DecoderLayer: is_sliding = not layer_idx % 2) slides on even
         * layers; a llama file with a window (Mistral) on all of them */
        L->window = gemma2 ? (l % 2 == 0 ? h->sliding_window : 0) : h->sliding_window;
    }
    const size_t kv = (size_t)h->n_layers * max_pos * m->kv_dim;
    m->k_cache = calloc(kv, sizeof(double));
    m->v_cache = calloc(kv, sizeof(double));
    m->x = calloc(dim, sizeof(double));
    m->xb = calloc(dim > m->q_dim ? dim : m->q_dim, sizeof(double));
    m->q = calloc(m->q_dim, sizeof(double));
    m->k = calloc(m->kv_dim, sizeof(double));
    m->v = calloc(m->kv_dim, sizeof(double));
    m->att = calloc(max_pos, sizeof(double));
    m->ao = calloc(m->q_dim, sizeof(double));
    m->h1 = calloc(h->ff, sizeof(double));
    m->h3 = calloc(h->ff, sizeof(double));
    m->hb = calloc(h->ff, sizeof(double));
    m->logits = calloc(vocab, sizeof(double));
    if (!m->k_cache || !m->v_cache || !m->x || !m->xb || !m->q || !m->k || !m->v || !m->att ||
        !m->ao || !m->h1 || !m->h3 || !m->hb || !m->logits)
        goto fail;
    return 0;
fail:
    ref_llama_free(m);
    return -1;
}

static inline void ref_rmsnorm(double *out, const double *x, const float *w, uint32_t n, double eps)
{
    double ss = 0;
    for (uint32_t i = 0; i < n; i++) ss += x[i] * x[i];
    const double s = 1.0 / sqrt(ss / n + eps);
    for (uint32_t i = 0; i < n; i++) out[i] = x[i] * s * w[i];
}

/* out[o] = sum_i W[o * n_in + i] x[i]: GGUF's (ne0 = n_in, ne1 = n_out) matrices.  Four
 * partial sums, for speed only: in double the order is far below what the tests resolve. */
static inline void ref_matvec(double *out, const float *w, const double *x, uint32_t n_in,
                              uint32_t n_out)
{
    for (uint32_t o = 0; o < n_out; o++) {
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        const float *row = w + (size_t)o * n_in;
        uint32_t i = 0;
        for (; i + 4 <= n_in; i += 4) {
            s0 += row[i] * x[i];
            s1 += row[i + 1] * x[i + 1];
            s2 += row[i + 2] * x[i + 2];
            s3 += row[i + 3] * x[i + 3];
        }
        for (; i < n_in; i++) s0 += row[i] * x[i];
        out[o] = (s0 + s1) + (s2 + s3);
    }
}

/* The rotation angle of frequency pair i at `pos`, and the factor cos and sin are scaled by. */
static inline double ref_rope_angle(const ref_llama_t *m, uint32_t i, uint32_t pos, double *mscale)
{
    const kvc_model_hparams_t *h = &m->h;
    const double d = h->rope_dim, freq = pow(h->rope_theta, -2.0 * i / d);
    *mscale = 1;
    switch (h->rope_scaling) {
    case KVC_ROPE_SCALING_LINEAR:
        return pos / h->rope_factor * freq;
    case KVC_ROPE_SCALING_LLAMA3:
        return pos * freq / m->rope_freqs[i];
    case KVC_ROPE_SCALING_YARN: {
        const double s = h->rope_factor;
        const double orig = h->rope_orig_ctx ? (double)h->rope_orig_ctx : (double)h->ctx;
        /* the dimension (of d) whose wavelength makes n_rot turns over the original context */
        const double lo_dim = floor(d * log(orig / (32 * 2 * M_PI)) / (2 * log(h->rope_theta)));
        const double hi_dim = ceil(d * log(orig / (1 * 2 * M_PI)) / (2 * log(h->rope_theta)));
        const double lo = fmax(lo_dim, 0), hi = fmin(hi_dim, d - 1);
        const double ramp = fmin(1, fmax(0, (i - lo) / (hi == lo ? 0.001 : hi - lo)));
        const double keep = 1 - ramp; /* 1: the frequency extrapolates (kept as it is) */
        *mscale = 1 + 0.1 * log(s);
        return pos * (freq / s * (1 - keep) + freq * keep);
    }
    default:
        return pos * freq;
    }
}

static inline void ref_rope(const ref_llama_t *m, double *v, uint32_t n_heads, uint32_t pos)
{
    const kvc_model_hparams_t *h = &m->h;
    const uint32_t half = h->rope_dim / 2;
    const bool halves = h->arch != KVC_ARCH_LLAMA;
    for (uint32_t hh = 0; hh < n_heads; hh++)
        for (uint32_t i = 0; i < half; i++) {
            double ms;
            const double a = ref_rope_angle(m, i, pos, &ms), c = cos(a) * ms, s = sin(a) * ms;
            double *p = v + (size_t)hh * h->head_dim;
            const uint32_t i0 = halves ? i : 2 * i, i1 = halves ? i + half : 2 * i + 1;
            const double x0 = p[i0], x1 = p[i1];
            p[i0] = x0 * c - x1 * s;
            p[i1] = x0 * s + x1 * c;
        }
}

static inline double ref_gelu_tanh(double x)
{
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* Run token `tok` at position `pos` (< max_pos, positions in order); with `logits`, the
 * LM head too, into m->logits (a prompt's earlier positions need only their K/V). */
static inline void ref_llama_forward(ref_llama_t *m, uint32_t tok, uint32_t pos, bool logits)
{
    const kvc_model_hparams_t *h = &m->h;
    const uint32_t dim = h->dim, hd = h->head_dim, group = h->n_heads / h->n_kv_heads;
    const bool gemma2 = h->arch == KVC_ARCH_GEMMA2;
    const double emb_scale = gemma2 ? sqrt((double)dim) : 1;
    for (uint32_t i = 0; i < dim; i++) m->x[i] = m->embd[(size_t)tok * dim + i] * emb_scale;
    for (uint32_t l = 0; l < h->n_layers; l++) {
        const ref_layer_t *L = &m->layer[l];
        ref_rmsnorm(m->xb, m->x, L->attn_norm, dim, h->rms_eps);
        ref_matvec(m->q, L->wq, m->xb, dim, m->q_dim);
        ref_matvec(m->k, L->wk, m->xb, dim, m->kv_dim);
        ref_matvec(m->v, L->wv, m->xb, dim, m->kv_dim);
        if (L->bq) {
            for (uint32_t i = 0; i < m->q_dim; i++) m->q[i] += L->bq[i];
            for (uint32_t i = 0; i < m->kv_dim; i++) m->k[i] += L->bk[i], m->v[i] += L->bv[i];
        }
        if (L->q_norm) {
            for (uint32_t hh = 0; hh < h->n_heads; hh++)
                ref_rmsnorm(m->q + hh * hd, m->q + hh * hd, L->q_norm, hd, h->rms_eps);
            for (uint32_t hh = 0; hh < h->n_kv_heads; hh++)
                ref_rmsnorm(m->k + hh * hd, m->k + hh * hd, L->k_norm, hd, h->rms_eps);
        }
        ref_rope(m, m->q, h->n_heads, pos);
        ref_rope(m, m->k, h->n_kv_heads, pos);
        double *kc = m->k_cache + ((size_t)l * m->max_pos) * m->kv_dim;
        double *vc = m->v_cache + ((size_t)l * m->max_pos) * m->kv_dim;
        memcpy(kc + (size_t)pos * m->kv_dim, m->k, m->kv_dim * sizeof(double));
        memcpy(vc + (size_t)pos * m->kv_dim, m->v, m->kv_dim * sizeof(double));
        const uint32_t t0 = L->window && pos + 1 > L->window ? pos + 1 - L->window : 0;
        /* gemma2 divides by sqrt(query_pre_attn_scalar), which GGUF does not store: the
         * head dim for Gemma 2 2B and 9B, dim / heads (144, not 128) for the 27B, which
         * llama.cpp tells by its 46 layers */
        const double scale_dim = gemma2 && h->n_layers == 46 ? (double)(dim / h->n_heads) : hd;
        for (uint32_t hh = 0; hh < h->n_heads; hh++) {
            const uint32_t kvh = hh / group;
            double mx = -INFINITY, sum = 0;
            for (uint32_t t = t0; t <= pos; t++) {
                double s = 0;
                for (uint32_t i = 0; i < hd; i++)
                    s += m->q[hh * hd + i] * kc[(size_t)t * m->kv_dim + kvh * hd + i];
                s /= sqrt(scale_dim);
                if (h->attn_softcap > 0) s = h->attn_softcap * tanh(s / h->attn_softcap);
                m->att[t] = s;
                mx = fmax(mx, s);
            }
            for (uint32_t t = t0; t <= pos; t++) sum += m->att[t] = exp(m->att[t] - mx);
            for (uint32_t i = 0; i < hd; i++) {
                double o = 0;
                for (uint32_t t = t0; t <= pos; t++)
                    o += m->att[t] * vc[(size_t)t * m->kv_dim + kvh * hd + i];
                m->ao[hh * hd + i] = o / sum;
            }
        }
        ref_matvec(m->xb, L->wo, m->ao, m->q_dim, dim);
        if (L->post_attn_norm) ref_rmsnorm(m->xb, m->xb, L->post_attn_norm, dim, h->rms_eps);
        for (uint32_t i = 0; i < dim; i++) m->x[i] += m->xb[i];
        ref_rmsnorm(m->xb, m->x, L->ffn_norm, dim, h->rms_eps);
        ref_matvec(m->h1, L->w1, m->xb, dim, h->ff);
        ref_matvec(m->h3, L->w3, m->xb, dim, h->ff);
        for (uint32_t i = 0; i < h->ff; i++) {
            const double g = m->h1[i];
            m->hb[i] = (gemma2 ? ref_gelu_tanh(g) : g / (1.0 + exp(-g))) * m->h3[i];
        }
        ref_matvec(m->xb, L->w2, m->hb, h->ff, dim);
        if (L->post_ffn_norm) ref_rmsnorm(m->xb, m->xb, L->post_ffn_norm, dim, h->rms_eps);
        for (uint32_t i = 0; i < dim; i++) m->x[i] += m->xb[i];
    }
    if (!logits) return;
    ref_rmsnorm(m->xb, m->x, m->out_norm, dim, h->rms_eps);
    ref_matvec(m->logits, m->out, m->xb, dim, h->vocab);
    if (h->final_softcap > 0)
        for (uint32_t v = 0; v < h->vocab; v++)
            m->logits[v] = h->final_softcap * tanh(m->logits[v] / h->final_softcap);
}

/* Run token `tok` at position `pos` (< max_pos, positions in order); logits in m->logits. */
static inline void ref_llama_step(ref_llama_t *m, uint32_t tok, uint32_t pos)
{
    ref_llama_forward(m, tok, pos, true);
}

static inline uint32_t ref_argmax(const double *v, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* out[i] = v[i] - log(sum_j exp(v[j])): the log-probabilities of logits v. */
static inline void ref_log_softmax(const double *v, uint32_t n, double *out)
{
    double mx = v[ref_argmax(v, n)], sum = 0;
    for (uint32_t i = 0; i < n; i++) sum += exp(v[i] - mx);
    const double lse = mx + log(sum);
    for (uint32_t i = 0; i < n; i++) out[i] = v[i] - lse;
}

#endif /* KVC_TEST_REF_LLAMA_H */
