/* ref_llama.h - the tests' own reference forward pass of a llama model: one sequence, a
 * contiguous KV cache, weights dequantized to f32 once, every dot product and norm in double
 * precision.  Written from the architecture's definition (RMSNorm, RoPE on adjacent pairs
 * as GGUF stores llama's Q and K, grouped-query attention, SwiGLU), independently of the
 * engine, so that the engine's logits can be checked against it. */
#ifndef KVC_TEST_REF_LLAMA_H
#define KVC_TEST_REF_LLAMA_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvcache/model.h"

typedef struct {
    kvc_model_hparams_t h;
    uint32_t q_dim, kv_dim;
    float *embd, *out_norm, *out; /* (vocab, dim), (dim), (vocab, dim) */
    struct {
        float *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w1, *w3, *w2;
    } * layer;
    float *k_cache, *v_cache; /* (n_layers, max_pos, kv_dim) */
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

/* 0, or -1 if a tensor is missing, of the wrong size, or of a type the reference cannot read. */
static inline int ref_llama_init(ref_llama_t *m, const kvc_gguf_t *g, uint32_t max_pos)
{
    memset(m, 0, sizeof *m);
    char msg[256];
    if (kvc_model_hparams_from_gguf(g, &m->h, msg, sizeof msg)) return -1;
    const kvc_model_hparams_t *h = &m->h;
    m->q_dim = h->n_heads * h->head_dim;
    m->kv_dim = h->n_kv_heads * h->head_dim;
    m->max_pos = max_pos;
    const uint64_t dim = h->dim, vocab = h->vocab;
    m->embd = ref_tensor(g, "token_embd.weight", dim * vocab);
    m->out_norm = ref_tensor(g, "output_norm.weight", dim);
    m->out = h->tied ? m->embd : ref_tensor(g, "output.weight", dim * vocab);
    if (!m->embd || !m->out_norm || !m->out) return -1;
    m->layer = calloc(h->n_layers, sizeof *m->layer);
    for (uint32_t l = 0; l < h->n_layers; l++) {
        char n[64];
#define LT(field, name, elems)                          \
    snprintf(n, sizeof n, "blk.%u." name ".weight", l); \
    if (!(m->layer[l].field = ref_tensor(g, n, (elems)))) return -1
        LT(attn_norm, "attn_norm", dim);
        LT(wq, "attn_q", dim * m->q_dim);
        LT(wk, "attn_k", dim * m->kv_dim);
        LT(wv, "attn_v", dim * m->kv_dim);
        LT(wo, "attn_output", (uint64_t)m->q_dim * dim);
        LT(ffn_norm, "ffn_norm", dim);
        LT(w1, "ffn_gate", dim * h->ff);
        LT(w3, "ffn_up", dim * h->ff);
        LT(w2, "ffn_down", (uint64_t)h->ff * dim);
#undef LT
    }
    const size_t kv = (size_t)h->n_layers * max_pos * m->kv_dim;
    m->k_cache = calloc(kv, sizeof(float));
    m->v_cache = calloc(kv, sizeof(float));
    m->x = calloc(dim, sizeof(double));
    m->xb = calloc(dim, sizeof(double));
    m->q = calloc(m->q_dim, sizeof(double));
    m->k = calloc(m->kv_dim, sizeof(double));
    m->v = calloc(m->kv_dim, sizeof(double));
    m->att = calloc(max_pos, sizeof(double));
    m->ao = calloc(m->q_dim, sizeof(double));
    m->h1 = calloc(h->ff, sizeof(double));
    m->h3 = calloc(h->ff, sizeof(double));
    m->hb = calloc(h->ff, sizeof(double));
    m->logits = calloc(vocab, sizeof(double));
    return 0;
}

static inline void ref_llama_free(ref_llama_t *m)
{
    if (m->layer)
        for (uint32_t l = 0; l < m->h.n_layers; l++) {
            free(m->layer[l].attn_norm), free(m->layer[l].wq), free(m->layer[l].wk);
            free(m->layer[l].wv), free(m->layer[l].wo), free(m->layer[l].ffn_norm);
            free(m->layer[l].w1), free(m->layer[l].w3), free(m->layer[l].w2);
        }
    if (m->out != m->embd) free(m->out);
    free(m->embd), free(m->out_norm), free(m->layer), free(m->k_cache), free(m->v_cache);
    free(m->x), free(m->xb), free(m->q), free(m->k), free(m->v), free(m->att), free(m->ao);
    free(m->h1), free(m->h3), free(m->hb), free(m->logits);
}

static inline void ref_rmsnorm(double *out, const double *x, const float *w, uint32_t n, double eps)
{
    double ss = 0;
    for (uint32_t i = 0; i < n; i++) ss += x[i] * x[i];
    const double s = 1.0 / sqrt(ss / n + eps);
    for (uint32_t i = 0; i < n; i++) out[i] = x[i] * s * w[i];
}

/* out[o] = sum_i W[o * n_in + i] x[i]: GGUF's (ne0 = n_in, ne1 = n_out) matrices. */
static inline void ref_matvec(double *out, const float *w, const double *x, uint32_t n_in,
                              uint32_t n_out)
{
    for (uint32_t o = 0; o < n_out; o++) {
        double s = 0;
        const float *row = w + (size_t)o * n_in;
        for (uint32_t i = 0; i < n_in; i++) s += row[i] * x[i];
        out[o] = s;
    }
}

static inline void ref_rope(double *v, uint32_t n_heads, uint32_t head_dim, uint32_t rope_dim,
                            uint32_t pos, double theta)
{
    for (uint32_t h = 0; h < n_heads; h++)
        for (uint32_t i = 0; i < rope_dim / 2; i++) {
            const double f = pow(theta, -2.0 * i / rope_dim), a = pos * f;
            double *p = v + h * head_dim + 2 * i;
            const double x0 = p[0], x1 = p[1];
            p[0] = x0 * cos(a) - x1 * sin(a);
            p[1] = x0 * sin(a) + x1 * cos(a);
        }
}

/* Run token `tok` at position `pos` (< max_pos, positions in order); logits in m->logits. */
static inline void ref_llama_step(ref_llama_t *m, uint32_t tok, uint32_t pos)
{
    const kvc_model_hparams_t *h = &m->h;
    const uint32_t dim = h->dim, hd = h->head_dim, group = h->n_heads / h->n_kv_heads;
    for (uint32_t i = 0; i < dim; i++) m->x[i] = m->embd[(size_t)tok * dim + i];
    for (uint32_t l = 0; l < h->n_layers; l++) {
        ref_rmsnorm(m->xb, m->x, m->layer[l].attn_norm, dim, h->rms_eps);
        ref_matvec(m->q, m->layer[l].wq, m->xb, dim, m->q_dim);
        ref_matvec(m->k, m->layer[l].wk, m->xb, dim, m->kv_dim);
        ref_matvec(m->v, m->layer[l].wv, m->xb, dim, m->kv_dim);
        ref_rope(m->q, h->n_heads, hd, h->rope_dim, pos, h->rope_theta);
        ref_rope(m->k, h->n_kv_heads, hd, h->rope_dim, pos, h->rope_theta);
        float *kc = m->k_cache + ((size_t)l * m->max_pos) * m->kv_dim;
        float *vc = m->v_cache + ((size_t)l * m->max_pos) * m->kv_dim;
        for (uint32_t i = 0; i < m->kv_dim; i++) {
            kc[(size_t)pos * m->kv_dim + i] = (float)m->k[i];
            vc[(size_t)pos * m->kv_dim + i] = (float)m->v[i];
        }
        for (uint32_t hh = 0; hh < h->n_heads; hh++) {
            const uint32_t kvh = hh / group;
            double mx = -INFINITY, sum = 0;
            for (uint32_t t = 0; t <= pos; t++) {
                double s = 0;
                for (uint32_t i = 0; i < hd; i++)
                    s += m->q[hh * hd + i] * kc[(size_t)t * m->kv_dim + kvh * hd + i];
                m->att[t] = s / sqrt((double)hd);
                mx = fmax(mx, m->att[t]);
            }
            for (uint32_t t = 0; t <= pos; t++) sum += m->att[t] = exp(m->att[t] - mx);
            for (uint32_t i = 0; i < hd; i++) {
                double o = 0;
                for (uint32_t t = 0; t <= pos; t++)
                    o += m->att[t] * vc[(size_t)t * m->kv_dim + kvh * hd + i];
                m->ao[hh * hd + i] = o / sum;
            }
        }
        ref_matvec(m->xb, m->layer[l].wo, m->ao, m->q_dim, dim);
        for (uint32_t i = 0; i < dim; i++) m->x[i] += m->xb[i];
        ref_rmsnorm(m->xb, m->x, m->layer[l].ffn_norm, dim, h->rms_eps);
        ref_matvec(m->h1, m->layer[l].w1, m->xb, dim, h->ff);
        ref_matvec(m->h3, m->layer[l].w3, m->xb, dim, h->ff);
        for (uint32_t i = 0; i < h->ff; i++)
            m->hb[i] = m->h1[i] / (1.0 + exp(-m->h1[i])) * m->h3[i];
        ref_matvec(m->xb, m->layer[l].w2, m->hb, h->ff, dim);
        for (uint32_t i = 0; i < dim; i++) m->x[i] += m->xb[i];
    }
    ref_rmsnorm(m->xb, m->x, m->out_norm, dim, h->rms_eps);
    ref_matvec(m->logits, m->out, m->xb, dim, h->vocab);
}

static inline uint32_t ref_argmax(const double *v, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

#endif /* KVC_TEST_REF_LLAMA_H */
