/* llm_int.h - internal: a loaded model's weights, as the forward pass reads them. */
#ifndef KVC_MODEL_LLM_INT_H
#define KVC_MODEL_LLM_INT_H

#include "kvcache/attn.h"
#include "kvcache/engine.h"

typedef struct {
    kvc_mat_t wq, wk, wv, wo, w_gate, w_up, w_down;
    float *attn_norm, *ffn_norm;           /* (dim) */
    float *post_attn_norm, *post_ffn_norm; /* gemma2 */
    float *bq, *bk, *bv;                   /* qwen2 */
    float *q_norm, *k_norm;                /* qwen3: (head_dim) */
    uint32_t window;                       /* sliding window of this layer (0: full) */
    uint32_t group;                        /* KV group its K/V live in */
    uint32_t slab;                         /* its layer index within the group's blocks */
} kvc__llm_layer_t;

struct kvc_llm {
    kvc_gguf_t *g;
    kvc_model_hparams_t h;
    kvc_tokenizer_t *tok;
    const kvc_gguf_tensor_t *embd;
    size_t embd_row_bytes;
    kvc_mat_t out;     /* LM head (the embedding when tied) */
    float *out_norm;   /* (dim) */
    float *rope_freqs; /* llama3: (rope_dim / 2) frequency divisors, else NULL */
    kvc__llm_layer_t *layer;
    uint32_t n_groups, group_window[KVC_MAX_GROUPS];
    uint32_t storage_layers; /* layers each pool block holds */
    bool neox;               /* RoPE on (i, i + d/2) pairs; false: adjacent pairs */
    uint64_t weight_bytes_per_token;
    void *packed; /* the packed copies of the matrices (kvc_mat_pack), packed_bytes in all */
    size_t packed_bytes;
};

#endif
