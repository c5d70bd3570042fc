/* kvcache/attn.h - attention over a paged KV cache.
 *
 * The kernels read K/V through a view of block storage (kvc_kv_view_t: the
 * pool's, or any buffer laid out the same way) and per-sequence block tables
 * in the CSR form FlashInfer uses:
 *
 *     sequence s owns blocks kv_indices[kv_indptr[s] .. kv_indptr[s + 1]),
 *     its last block holds kv_last_len[s] tokens (1 .. block_size), so it has
 *     S = (n_blocks - 1) * block_size + kv_last_len[s] keys;
 *     its queries are rows qo_indptr[s] .. qo_indptr[s + 1] of q (decode: one).
 *
 * A contiguous cache is the same thing with table 0, 1, ..., n - 1 over one
 * buffer (kvc_kv_view_contiguous).
 *
 * Masks (DESIGN.md invariant 8).  The T queries of a sequence are its last
 * T tokens: query i sits at position p = S - T + i and sees keys
 * max(0, p - window + 1) .. p (window 0: keys 0 .. p).  Not the top-left
 * aligned triangle (keys 0 .. i), which is only right when T = S.
 *
 * Math, per query head h with KV head h / (n_q_heads / n_kv_heads):
 *     z_t = sm_scale * q . k_t;  z_t = softcap * tanh(z_t / softcap) if softcap > 0
 *     out = sum_t softmax(z)_t v_t
 * with K/V dequantised by their block's scales (quant.h).  Softmax runs
 * online (flash-style rescaling) in fp32.
 *
 * Compute paths.  f32 and f16 storage are multiplied in fp32 (FMA).  With
 * KVC_ATTN_COMPUTE_AUTO, bf16 and FP8 storage on a CPU with AVX512-BF16 use
 * VDPBF16PS: K/V are exact in bf16 (FP8 decodes exactly to bf16), and the
 * query (times sm_scale) and the softmax weights are rounded to bf16 before
 * their dot products (fp32 accumulation).  KVC_ATTN_COMPUTE_F32 forces fp32
 * products everywhere.  No path allocates; each works in a caller-provided
 * workspace (kvc_attn_workspace_bytes) and writes only its output rows.
 *
 * Work is split into items (kvc_attn_n_items): one (sequence, run of KV
 * heads whose query rows fit in 64), or one (sequence, KV head, group of up
 * to 64 query rows) for long chunks, or one (sequence, query head, ...) when
 * GQA packing is off.  Items are independent: callers split [0, n_items)
 * across threads, each thread with its own workspace.  A packed item reads
 * each K/V row once for all query heads that share it.
 *
 * Return values.  The functions that return int return 0 or a KVC_E* code,
 * each one named at the declaration; a failed call writes nothing.  These
 * return something else: kvc_kv_block_bytes and kvc_attn_workspace_bytes
 * (sizes, 0 for invalid arguments), kvc_attn_n_items and
 * kvc_attn_mla_n_items (counts, 0 for invalid arguments),
 * kvc_attn_params_default (a struct), kvc_attn_kernel_name (a string).
 *
 * Thread-safety: reentrant.  Concurrent calls may read the same storage;
 * kvc_attn_write_kv must not run concurrently with readers of the slots it
 * writes, nor with another write to the same blocks.
 */
#ifndef KVCACHE_ATTN_H
#define KVCACHE_ATTN_H

#include "kvcache/pool.h"
#include "kvcache/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest head dims the kernels take: K rows up to 576 elements (MLA's
 * latent 512 + RoPE 64), V rows up to 512. */
#define KVC_ATTN_MAX_DK 576
#define KVC_ATTN_MAX_DV 512

/* ---- views of KV storage --------------------------------------------------
 * One layer of block storage laid out as pool.h describes: block b starts at
 * base + b * block_bytes and holds, for this layer, K at k_offset and V at
 * v_offset, each (n_kv_heads, block_size, head_dim) elements of the dtype,
 * and the block's scales at scale_offset (quant.h has their layout).  The
 * view borrows the storage. */
typedef struct {
    void *base;          /* block 0 */
    size_t block_bytes;  /* stride between blocks */
    uint32_t n_blocks;   /* valid block ids: 0 .. n_blocks - 1 */
    uint32_t layer;      /* which layer of the side data (and of the storage) */
    size_t k_offset;     /* this layer's K (or latent) slab within a block */
    size_t v_offset;     /* this layer's V slab; == k_offset for a latent (n_kv = 1) */
    size_t scale_offset; /* the block's side data (all layers) within a block */
    kvc_scale_shape_t shape;
} kvc_kv_view_t;

/* A view of one layer of a pool's storage with the given scale layout.
 * KVC_EINVAL if pool or out is NULL, the pool has no storage, the layer is
 * out of range, the layout does not suit the dtype (kvc_scale_shape_check),
 * the pool's scale_bytes are fewer than kvc_scale_bytes() asks for, or a
 * block's data is not a whole number of floats (the scales that follow it
 * would be misaligned).  No other error. */
KVC_API int kvc_kv_view_from_pool(kvc_pool_t *pool, uint32_t layer, kvc_scale_layout_t layout,
                                  kvc_kv_view_t *out);

/* Bytes one block takes when laid out as a pool would lay it out (data,
 * then kvc_scale_bytes of side data, padded to 64). 0 if the shape is bad. */
KVC_API size_t kvc_kv_block_bytes(const kvc_scale_shape_t *shape);
/* A view of one layer of a caller buffer of n_blocks blocks laid out as a
 * pool lays them out (kvc_kv_block_bytes each).  KVC_EINVAL if out is NULL,
 * the shape is bad (kvc_scale_shape_check), layer >= n_layers, n_blocks is
 * 0 or a block's data is not a whole number of floats; KVC_ERANGE if buf is
 * NULL or `bytes` is less than n_blocks blocks. */
KVC_API int kvc_kv_view_contiguous(void *buf, size_t bytes, uint32_t n_blocks,
                                   const kvc_scale_shape_t *shape, uint32_t layer,
                                   kvc_kv_view_t *out);

/* ---- batches ------------------------------------------------------------- */
typedef struct {
    uint32_t n_seqs;
    const uint32_t *kv_indptr;   /* (n_seqs + 1), nondecreasing, starting at 0 */
    const uint32_t *kv_indices;  /* block ids; KVC_NONE allowed only for blocks no query sees
                                    (sliding-window layers release those) */
    const uint32_t *kv_last_len; /* (n_seqs): tokens in the last block, 1 .. block_size */
    const uint32_t *qo_indptr;   /* (n_seqs + 1): query rows per sequence; NULL: one each */
} kvc_attn_batch_t;

typedef enum {
    KVC_ATTN_COMPUTE_AUTO = 0, /* the fastest exact-storage path (BF16 dot where the CPU has it) */
    KVC_ATTN_COMPUTE_F32,      /* fp32 products for every storage type */
} kvc_attn_compute_t;

typedef struct {
    uint32_t n_q_heads; /* a multiple of the view's n_kv_heads (MLA: the number of heads) */
    float sm_scale;     /* logit scale; 0: 1 / sqrt(head_dim) (MLA: 1 / sqrt(nope + rope)) */
    uint32_t window;    /* sliding window in tokens; 0: full attention */
    float softcap;      /* logit soft-capping; 0: off */
    bool per_head;      /* true: one item per query head (reads K/V once per query head,
                           for comparison); false: GQA packed */
    uint32_t kv_heads_per_item; /* packed decode: at most this many KV heads per item
                                   (0: as many as fit in 64 query rows); fewer heads
                                   per item means more items to share among threads */
    kvc_attn_compute_t compute;
    kvc_isa_t isa; /* KVC_ISA_AUTO or a forced one */
    bool batch_invariant; /* every query row computed on its own, in one fixed order (one row
                             per tile), so a row's output is bit-identical whatever other rows,
                             sequences or item split the call has (DESIGN.md invariant 10);
                             false lets tiles share K/V loads across rows */
} kvc_attn_params_t;

/* n_q_heads 1, sm_scale 0 (1/sqrt(d)), full attention, no capping, packed,
 * AUTO compute, AUTO ISA. */
KVC_API kvc_attn_params_t kvc_attn_params_default(void);

/* Bytes of workspace one thread needs for attention over this view (with
 * `mla` non-NULL: for kvc_attn_mla); 0 if kv is NULL or its shape is bad.
 * 64-byte aligned memory is best. */
typedef struct kvc_mla_dims kvc_mla_dims_t;
KVC_API size_t kvc_attn_workspace_bytes(const kvc_kv_view_t *kv, const kvc_mla_dims_t *mla);

/* Work items of a call (see above): a count, 0 for any argument that
 * kvc_attn_forward would refuse with KVC_EINVAL. */
KVC_API uint32_t kvc_attn_n_items(const kvc_attn_params_t *p, const kvc_kv_view_t *kv,
                                  const kvc_attn_batch_t *batch);

/* Attention for the queries of a batch: q (n_rows, n_q_heads, head_dim) fp32,
 * out (n_rows, n_q_heads, head_dim) fp32, where n_rows = n_seqs for decode
 * (qo_indptr NULL) or qo_indptr[n_seqs].  Computes items [item_begin,
 * item_end) (clamped to n_items) and writes only their output rows.
 * Fails without writing anything: KVC_EINVAL (p, kv, q, out or ws NULL; a
 * bad view; n_q_heads 0 or not a multiple of the view's n_kv_heads; bad
 * tables: missing arrays, kv_indptr[0] or qo_indptr[0] not 0, a sequence
 * with no block, indptrs that decrease, kv_last_len 0 or above block_size,
 * T > S, more than 2^31 keys, block ids out of range or KVC_NONE where a
 * query looks; a workspace smaller than kvc_attn_workspace_bytes; an
 * invalid isa or compute value), KVC_ENOTSUP (a forced ISA this CPU lacks,
 * or head_dim above KVC_ATTN_MAX_DV).  An item range beyond n_items is
 * clamped, not an error.  The same call over a paged and a contiguous copy
 * of the same data gives bit-identical outputs. */
KVC_API int kvc_attn_forward(const kvc_attn_params_t *p, const kvc_kv_view_t *kv,
                             const kvc_attn_batch_t *batch, const float *q, float *out, void *ws,
                             size_t ws_bytes, uint32_t item_begin, uint32_t item_end);

/* ---- which kernel runs ----------------------------------------------------
 * The kernel that kvc_attn_forward (mla NULL) or kvc_attn_mla (mla: its dims)
 * runs with these parameters over this view on this CPU, chosen by the same
 * code: the ISA that p->isa resolves to (AUTO: kvc_isa_best()), except that
 * a K or V head dim that is not a multiple of 32 runs the scalar kernel, and
 * that on AVX-512, KVC_ATTN_COMPUTE_AUTO over bf16 or FP8 storage runs the
 * BF16 dot-product path where the CPU has AVX512-BF16 and VBMI (fp32
 * products otherwise).  For reports and tests: what runs, not what was
 * asked for. */
typedef enum {
    KVC_ATTN_KERNEL_SCALAR = 0,
    KVC_ATTN_KERNEL_AVX2,
    KVC_ATTN_KERNEL_AVX512,      /* fp32 products */
    KVC_ATTN_KERNEL_AVX512_BF16, /* VDPBF16PS on bf16 operands, fp32 accumulation */
    KVC_ATTN_KERNEL__COUNT
} kvc_attn_kernel_t;

/* Sets *out.  KVC_EINVAL (p, kv or out NULL, a bad view, mla dims that do not
 * match the view, an invalid isa or compute value), KVC_ENOTSUP (a forced
 * ISA this CPU lacks): the codes the call itself would return for them. */
KVC_API KVC_NODISCARD int kvc_attn_kernel(const kvc_attn_params_t *p, const kvc_kv_view_t *kv,
                                          const kvc_mla_dims_t *mla, kvc_attn_kernel_t *out);
/* "scalar", "avx2", "avx512", "avx512-bf16"; "?" for an invalid value. */
KVC_API const char *kvc_attn_kernel_name(kvc_attn_kernel_t k);

/* ---- writing new K/V ------------------------------------------------------
 * Store n_tokens new tokens: token i goes to slot slots[i] (= block *
 * block_size + offset, as kvc_seq_reserve gives them; negative:
 * KVC_EINVAL); k and v are (n_tokens, n_kv_heads, head_dim) fp32 (v NULL
 * for a latent cache, n_kv = 1).  Quantises for the view's dtype
 * and scale layout, setting block scales as quant.h describes (quant may
 * be NULL only for KVC_SCALE_NONE; clipping is still counted if given).
 * n_tokens 0 writes nothing and returns 0 (for a valid view).  Fails
 * without writing anything: KVC_EINVAL (a bad view; slots or k NULL; v
 * given for a latent view or missing for a K/V one; a negative slot or one
 * whose block is out of range; quant NULL for a scaled layout, or a state
 * array it needs that is neither given nor has maxima; given scales that
 * are not positive and finite; an invalid isa value), KVC_ENOTSUP (a
 * forced ISA this CPU lacks). */
KVC_API int kvc_attn_write_kv(const kvc_kv_view_t *kv, const int64_t *slots, uint32_t n_tokens,
                              const float *k, const float *v, kvc_kv_quant_t *quant, kvc_isa_t isa);

/* ---- MLA (multi-head latent attention), absorbed form ----------------------
 * The cache holds one latent row per token: c (kv_lora_rank) then the
 * shared RoPE key (rope_dim); the view has n_kv = 1, n_kv_heads = 1,
 * head_dim = kv_lora_rank + rope_dim.  Per head h:
 *     k_h,t = [W_UK_h c_t ; k_rope_t],  v_h,t = W_UV_h c_t
 * and instead of up-projecting every token the query is absorbed:
 *     q~_h = [W_UK_h^T q_nope_h ; q_rope_h],  o~_h = sum_t p_t c_t,
 *     out_h = W_UV_h o~_h,
 * so the kernel is attention with one shared KV head of dim 576 / 512. */
struct kvc_mla_dims {
    uint32_t n_heads;      /* H */
    uint32_t kv_lora_rank; /* latent dim, e.g. 512 */
    uint32_t rope_dim;     /* e.g. 64 */
    uint32_t nope_dim;     /* per-head query/key dim without RoPE, e.g. 128 */
    uint32_t v_head_dim;   /* per-head value dim, e.g. 128 */
};

/* Work items of an MLA call: one per (sequence, group of up to 64 query
 * rows); a count, 0 for arguments kvc_attn_mla would refuse with KVC_EINVAL. */
KVC_API uint32_t kvc_attn_mla_n_items(const kvc_attn_params_t *p, const kvc_mla_dims_t *dims,
                                      const kvc_kv_view_t *kv, const kvc_attn_batch_t *batch);

/* Absorbed MLA attention.  q_nope (n_rows, H, nope_dim), q_rope (n_rows, H,
 * rope_dim), w_uk (H, nope_dim, kv_lora_rank), w_uv (H, v_head_dim,
 * kv_lora_rank), out (n_rows, H, v_head_dim), all fp32; p->n_q_heads is
 * ignored (H is dims->n_heads), p->window / softcap apply as usual.
 * Failures as kvc_attn_forward, and also KVC_EINVAL for dims that do not
 * match the view (n_kv must be 1 and head_dim kv_lora_rank + rope_dim; no
 * dim but rope_dim may be 0), q_rope NULL with rope_dim > 0, or w_uk / w_uv
 * NULL; KVC_ENOTSUP for a head_dim above KVC_ATTN_MAX_DK or a kv_lora_rank
 * above KVC_ATTN_MAX_DV.  The workspace must hold
 * kvc_attn_workspace_bytes(kv, dims). */
KVC_API int kvc_attn_mla(const kvc_attn_params_t *p, const kvc_mla_dims_t *dims,
                         const kvc_kv_view_t *kv, const kvc_attn_batch_t *batch,
                         const float *q_nope, const float *q_rope, const float *w_uk,
                         const float *w_uv, float *out, void *ws, size_t ws_bytes,
                         uint32_t item_begin, uint32_t item_end);

/* ---- the reference ----------------------------------------------------------
 * The same attention computed directly in double precision (two passes over
 * the keys, exact decoding, exp/tanh from libm): what every kernel is tested
 * against.  out is double (n_rows, n_q_heads, head_dim).  p->isa,
 * p->compute and p->per_head are ignored.  Slow; no workspace.  KVC_EINVAL
 * (p, kv, batch, q or out NULL, a bad view, n_q_heads 0 or not a multiple
 * of n_kv_heads, missing table arrays, a sequence with no block or a
 * decreasing kv_indptr, kv_last_len 0 or above block_size, T > S, a block
 * id out of range or KVC_NONE where a query looks); no other error, and
 * nothing is written then. */
KVC_API int kvc_attn_reference(const kvc_attn_params_t *p, const kvc_kv_view_t *kv,
                               const kvc_attn_batch_t *batch, const float *q, double *out);

#ifdef __cplusplus
}
#endif
#endif /* KVCACHE_ATTN_H */
