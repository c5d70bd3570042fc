/* llm.c - a loaded model: hyperparameters, tokenizer and the weights bound in place.
 *
 * Every tensor the architecture needs is looked up by llama.cpp's name and checked against the
 * hyperparameters (shape, a type the kernels take) before the engine ever touches it: a file
 * that passes here cannot make the forward pass read out of bounds.  Matrices stay in the
 * mapping (kvc_mat_t over the tensor's bytes); norms and biases, which are small and read in
 * fp32 every step, are converted once into memory the model owns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm_int.h"
#include "util/msg.h"

const kvc_model_hparams_t *kvc_llm_hparams(const kvc_llm_t *m)
{
    return &m->h;
}
const kvc_tokenizer_t *kvc_llm_tokenizer(const kvc_llm_t *m)
{
    return m->tok;
}
const kvc_gguf_t *kvc_llm_gguf(const kvc_llm_t *m)
{
    return m->g;
}
uint64_t kvc_llm_weight_bytes_per_token(const kvc_llm_t *m)
{
    return m->weight_bytes_per_token;
}

void kvc_llm_free(kvc_llm_t *m)
{
    if (!m) return;
    if (m->layer)
        for (uint32_t l = 0; l < m->h.n_layers; l++) {
            kvc__llm_layer_t *L = &m->layer[l];
            free(L->attn_norm), free(L->ffn_norm), free(L->post_attn_norm), free(L->post_ffn_norm);
            free(L->bq), free(L->bk), free(L->bv), free(L->q_norm), free(L->k_norm);
        }
    free(m->layer);
    free(m->packed);
    free(m->out_norm);
    free(m->rope_freqs);
    kvc_tokenizer_destroy(m->tok);
    kvc_gguf_close(m->g);
    free(m);
}

/* The tensor `name` with exactly the dims given (ne[0] first), or NULL with msg set. */
static const kvc_gguf_tensor_t *need(const kvc_gguf_t *g, const char *name, uint32_t n_dims,
                                     uint64_t ne0, uint64_t ne1, int *rc, char *msg, size_t cap)
{
    const kvc_gguf_tensor_t *t = kvc_gguf_find_tensor(g, name);
    if (!t) {
        *rc = kvc__msgf(KVC_EPARSE, msg, cap, "tensor %s is missing", name);
        return NULL;
    }
    if (t->n_dims != n_dims || t->ne[0] != ne0 || (n_dims > 1 && t->ne[1] != ne1)) {
        *rc = kvc__msgf(KVC_EPARSE, msg, cap,
                        "tensor %s has shape [%llu, %llu], the model needs [%llu, %llu]", name,
                        (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                        (unsigned long long)ne0, (unsigned long long)(n_dims > 1 ? ne1 : 1));
        return NULL;
    }
    return t;
}

/* A 1-D tensor of n values converted to f32 (malloc'd), or NULL with *rc set. */
static float *vec(const kvc_gguf_t *g, const char *name, uint64_t n, int *rc, char *msg, size_t cap)
{
    const kvc_gguf_tensor_t *t = need(g, name, 1, n, 1, rc, msg, cap);
    if (!t) return NULL;
    if (!kvc_ggml_codec_supported(t->type)) {
        *rc = kvc__msgf(KVC_ENOTSUP, msg, cap, "tensor %s has type %s, which is not supported",
                        name, kvc_ggml_type_name(t->type));
        return NULL;
    }
    float *v = malloc(n * sizeof *v);
    if (!v) {
        *rc = kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
        return NULL;
    }
    int e = kvc_ggml_dequantize_row(t->type, t->data, v, n);
    if (e) {
        free(v);
        *rc = kvc__msgf(e, msg, cap, "tensor %s: cannot convert %s to f32", name,
                        kvc_ggml_type_name(t->type));
        return NULL;
    }
    return v;
}

static int mat(const kvc_gguf_t *g, const char *name, uint64_t n_in, uint64_t n_out, kvc_mat_t *out,
               uint64_t *bytes, char *msg, size_t cap)
{
    int rc = 0;
    const kvc_gguf_tensor_t *t = need(g, name, 2, n_in, n_out, &rc, msg, cap);
    if (!t) return rc;
    if (!kvc_matmul_type_supported(t->type))
        return kvc__msgf(KVC_ENOTSUP, msg, cap, "tensor %s has type %s, which is not supported",
                         name, kvc_ggml_type_name(t->type));
    rc = kvc_mat_from_tensor(t, out);
    if (rc) return kvc__msgf(rc, msg, cap, "tensor %s: %s", name, kvc_strerror(rc));
    *bytes += t->bytes;
    return 0;
}

static int bind(kvc_llm_t *m, char *msg, size_t cap)
{
    const kvc_gguf_t *g = m->g;
    const kvc_model_hparams_t *h = &m->h;
    const uint64_t dim = h->dim, q_dim = (uint64_t)h->n_heads * h->head_dim,
                   kv_dim = (uint64_t)h->n_kv_heads * h->head_dim, ff = h->ff;
    int rc = 0;
    if (h->v_head_dim != h->head_dim)
        return kvc__msgf(KVC_ENOTSUP, msg, cap, "value head dim %u differs from key head dim %u",
                         h->v_head_dim, h->head_dim);
    if (h->head_dim > KVC_ATTN_MAX_DV)
        return kvc__msgf(KVC_ENOTSUP, msg, cap, "head dim %u is above %u", h->head_dim,
                         KVC_ATTN_MAX_DV);
    if (h->rope_dim > h->head_dim || h->rope_dim % 2)
        return kvc__msgf(KVC_EPARSE, msg, cap, "rope dimension %u does not fit head dim %u",
                         h->rope_dim, h->head_dim);

    /* The token embedding: read one row per token, any codec type. */
    const kvc_gguf_tensor_t *te = need(g, "token_embd.weight", 2, dim, h->vocab, &rc, msg, cap);
    if (!te) return rc;
    if (!kvc_ggml_codec_supported(te->type))
        return kvc__msgf(KVC_ENOTSUP, msg, cap,
                         "tensor token_embd.weight has type %s, which is not supported",
                         kvc_ggml_type_name(te->type));
    m->embd = te;
    m->embd_row_bytes = te->bytes / h->vocab;
    uint64_t bytes = m->embd_row_bytes; /* one row per token */

    if (h->tied) {
        if ((rc = mat(g, "token_embd.weight", dim, h->vocab, &m->out, &bytes, msg, cap))) return rc;
    } else if ((rc = mat(g, "output.weight", dim, h->vocab, &m->out, &bytes, msg, cap)))
        return rc;
    if (!(m->out_norm = vec(g, "output_norm.weight", dim, &rc, msg, cap))) return rc;
    bytes += dim * 4;
    if (h->rope_scaling == KVC_ROPE_SCALING_LLAMA3 &&
        !(m->rope_freqs = vec(g, "rope_freqs.weight", h->rope_dim / 2, &rc, msg, cap)))
        return rc;

    m->layer = calloc(h->n_layers, sizeof *m->layer);
    if (!m->layer) return kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    for (uint32_t l = 0; l < h->n_layers; l++) {
        kvc__llm_layer_t *L = &m->layer[l];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%u." s, l), n)
#define MAT(field, s, in, out_) \
    if ((rc = mat(g, NAME(s ".weight"), (in), (out_), &L->field, &bytes, msg, cap))) return rc
#define VEC(field, s, len)                                              \
    if (!(L->field = vec(g, NAME(s), (len), &rc, msg, cap))) return rc; \
    bytes += (len)*4
        VEC(attn_norm, "attn_norm.weight", dim);
        MAT(wq, "attn_q", dim, q_dim);
        MAT(wk, "attn_k", dim, kv_dim);
        MAT(wv, "attn_v", dim, kv_dim);
        MAT(wo, "attn_output", q_dim, dim);
        VEC(ffn_norm, "ffn_norm.weight", dim);
        MAT(w_gate, "ffn_gate", dim, ff);
        MAT(w_up, "ffn_up", dim, ff);
        MAT(w_down, "ffn_down", ff, dim);
        if (h->qkv_bias) {
            VEC(bq, "attn_q.bias", q_dim);
            VEC(bk, "attn_k.bias", kv_dim);
            VEC(bv, "attn_v.bias", kv_dim);
        }
        if (h->qk_norm) {
            VEC(q_norm, "attn_q_norm.weight", h->head_dim);
            VEC(k_norm, "attn_k_norm.weight", h->head_dim);
        }
        if (h->arch == KVC_ARCH_GEMMA2) {
            VEC(post_attn_norm, "post_attention_norm.weight", dim);
            VEC(post_ffn_norm, "post_ffw_norm.weight", dim);
        }
#undef NAME
#undef MAT
#undef VEC
        /* Which KV group the layer's K/V live in, and its slab within that group's blocks. */
        bool sliding = h->sliding_window &&
                       (h->sliding_even_layers ? l % 2 == 0 : h->n_sliding_layers == h->n_layers);
        L->window = sliding ? h->sliding_window : 0;
    }
    m->weight_bytes_per_token = bytes;

    /* KV groups: one for a model whose layers all attend alike; two (full, sliding) for a
     * hybrid one, each block holding the K/V of its group's layers only. */
    uint32_t n_slide = 0, n_full = 0;
    for (uint32_t l = 0; l < h->n_layers; l++) {
        kvc__llm_layer_t *L = &m->layer[l];
        if (L->window)
            n_slide++;
        else
            n_full++;
    }
    if (n_slide && n_full) {
        m->n_groups = 2;
        m->group_window[0] = 0;
        m->group_window[1] = h->sliding_window;
        uint32_t next[2] = {0, 0};
        for (uint32_t l = 0; l < h->n_layers; l++) {
            kvc__llm_layer_t *L = &m->layer[l];
            L->group = L->window ? 1 : 0;
            L->slab = next[L->group]++;
        }
        m->storage_layers = KVC_MAX(n_slide, n_full);
    } else {
        m->n_groups = 1;
        m->group_window[0] = n_slide ? h->sliding_window : 0;
        for (uint32_t l = 0; l < h->n_layers; l++) m->layer[l].group = 0, m->layer[l].slab = l;
        m->storage_layers = h->n_layers;
    }
    m->neox = h->arch != KVC_ARCH_LLAMA; /* qwen2, qwen3, gemma2 rotate halves */
    return 0;
}

/* Every matrix of a type with a packed form gets its packed copy (kvc_mat_pack), in one
 * allocation, when this CPU runs the kernels that read it (AVX2 and up); the rows stay in the
 * mapping for the scalar kernels and the embedding lookup. */
/* Matrix i of the model (0: the LM head, then 7 per layer), NULL past the last. */
static kvc_mat_t *nth_mat(kvc_llm_t *m, uint32_t i)
{
    if (i == 0) return &m->out;
    const uint32_t l = (i - 1) / 7;
    if (l >= m->h.n_layers) return NULL;
    kvc__llm_layer_t *L = &m->layer[l];
    kvc_mat_t *ls[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return ls[(i - 1) % 7];
}

static int pack(kvc_llm_t *m, char *msg, size_t cap)
{
    if (!kvc_isa_supported(KVC_ISA_AVX2)) return 0;
    size_t total = 0;
    for (uint32_t i = 0; nth_mat(m, i); i++) total += kvc_mat_pack_bytes(nth_mat(m, i));
    if (total == 0) return 0;
    if (!(m->packed = aligned_alloc(64, total)))
        return kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory packing the weights");
    m->packed_bytes = total;
    uint8_t *p = m->packed;
    kvc_mat_t *w;
    for (uint32_t i = 0; (w = nth_mat(m, i)); i++) {
        const size_t b = kvc_mat_pack_bytes(w);
        if (!b) continue;
        const int rc = kvc_mat_pack(w, p, b);
        if (rc) return kvc__msgf(rc, msg, cap, "packing the weights: %s", kvc_strerror(rc));
        p += b;
        /* the rows stay mapped for the scalar kernels, out of memory until read; the tied
         * embedding's rows are still looked up every step */
        if (w->data != m->embd->data)
            kvc_gguf_release(m->g, w->data, (size_t)w->n_out * w->row_bytes);
    }
    return 0;
}

size_t kvc_llm_packed_bytes(const kvc_llm_t *m)
{
    return m ? m->packed_bytes : 0;
}

int kvc_llm_load_gguf(kvc_gguf_t *g, kvc_llm_t **out, char *msg, size_t cap)
{
    if (!g || !out) {
        kvc_gguf_close(g);
        return kvc__msgf(KVC_EINVAL, msg, cap, "no model");
    }
    *out = NULL;
    kvc_llm_t *m = calloc(1, sizeof *m);
    if (!m) {
        kvc_gguf_close(g);
        return kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    }
    m->g = g;
    int rc = kvc_model_hparams_from_gguf(g, &m->h, msg, cap);
    if (!rc) rc = kvc_tokenizer_create_gguf(g, NULL, &m->tok, msg, cap);
    if (rc == KVC_ENOENT) rc = KVC_EPARSE; /* no tokenizer: as a missing tensor */
    if (!rc && kvc_tokenizer_n_vocab(m->tok) > m->h.vocab)
        rc = kvc__msgf(KVC_EPARSE, msg, cap, "the tokenizer has %u tokens, the model %u",
                       kvc_tokenizer_n_vocab(m->tok), m->h.vocab);
    if (!rc) rc = bind(m, msg, cap);
    if (!rc) rc = pack(m, msg, cap);
    if (rc) {
        kvc_llm_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

int kvc_llm_load(const char *path, kvc_llm_t **out, char *msg, size_t cap)
{
    if (!path || !out) return kvc__msgf(KVC_EINVAL, msg, cap, "no model path");
    kvc_gguf_t *g = NULL;
    int rc = kvc_gguf_open(path, NULL, &g, msg, cap);
    if (rc) return rc;
    return kvc_llm_load_gguf(g, out, msg, cap);
}
