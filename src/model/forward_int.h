/* forward_int.h - internal: the batched forward pass over a paged cache (forward.c). */
#ifndef KVC_MODEL_FORWARD_INT_H
#define KVC_MODEL_FORWARD_INT_H

#include "llm_int.h"

/* One sequence's rows in a pass: positions first_pos .. first_pos + n_tokens - 1, whose slots
 * are reserved (kvc_seq_reserve) in every KV group. */
typedef struct {
    kvc_seq_t seq;
    uint32_t first_pos, n_tokens;
} kvc__seg_t;

/* Buffers for passes of up to max_rows rows over max_seqs sequences, each holding at most
 * max_seq_blocks blocks per group, with up to max_sel rows of logits. */
typedef struct {
    const kvc_llm_t *m;
    kvc_pool_t *pool;
    kvc_threadpool_t *tp;
    kvc_isa_t isa;
    uint32_t n_threads, max_rows, max_seqs, max_sel;
    float *x, *xn, *q, *k, *v, *ao, *o, *g, *u; /* (rows, width) activations */
    float *rc, *rs;                             /* (rows, rope_dim / 2) rotations */
    uint32_t *pos;
    kvc_token_t *tok;
    int64_t *slots; /* (groups, max_rows) */
    kvc_seq_t *rows;
    uint32_t *qo_indptr;
    uint32_t *kv_indptr[KVC_MAX_GROUPS], *kv_indices[KVC_MAX_GROUPS], *kv_last[KVC_MAX_GROUPS];
    size_t kv_cap;
    float *sel_x;
    void *mm_ws;
    size_t mm_ws_bytes;
    void **attn_ws; /* one per thread */
    size_t attn_ws_bytes;
    kvc_kv_view_t *views; /* per model layer */
    bool fast_attn;       /* attention tiles share K/V across query rows: faster, but a row's
                             result then depends on its batch (kvc_engine_params_t) */
} kvc__fwd_t;

/* 0, KVC_ENOMEM, or a view error. kvc__fwd_free releases whatever was set up. */
int kvc__fwd_init(kvc__fwd_t *f, const kvc_llm_t *m, kvc_pool_t *pool, uint32_t max_rows,
                  uint32_t max_seqs, uint32_t max_seq_blocks, uint32_t max_sel,
                  kvc_threadpool_t *tp, kvc_isa_t isa);
void kvc__fwd_free(kvc__fwd_t *f);

/* Run the segments through the model, writing their K/V at their slots, and the logits of
 * global rows sel[0..n_sel) (rows numbered across the segments in order) into logits
 * (n_sel, vocab).  The errors of the layers below; KVC_EINVAL for more rows, sequences or
 * selected rows than the buffers hold. */
int kvc__fwd_run(kvc__fwd_t *f, kvc_seqs_t *seqs, const kvc__seg_t *segs, uint32_t n_segs,
                 const uint32_t *sel, uint32_t n_sel, float *logits);

#endif
