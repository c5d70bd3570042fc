/* kvcache/pool.h - the fixed set of KV blocks.
 *
 * A pool owns N blocks of `block_size` tokens each: their reference counts,
 * the free queue, and (unless it is metadata-only) the bytes behind them.
 * It decides nothing about identity: the prefix layer marks blocks as cached,
 * ranks them for eviction and is asked before a cached block is reused.
 *
 * The free queue holds every block whose refcount is 0, in this order:
 *
 *     head -> [uncached blocks ...][cached, level 0][cached, level 1] ... <- tail
 *
 * Uncached blocks (which no lookup can ever hit) are reused first; cached
 * blocks stay hittable until their memory is needed (lazy eviction), lowest
 * level first and, within a level, least recently freed first.  The prefix
 * layer's eviction policy (kvc_eviction_t in prefix.h) gives each cached
 * block its level; under the default policy every block is at level 0 and
 * the queue is plain LRU.  A request's table is released tail-first, so
 * within one request the tail blocks are evicted before the head blocks.
 * Every operation is O(1) except allocation, which is O(n) in the blocks it
 * hands out (plus the cached blocks the evictor holds back).
 *
 * Memory is proportional to use: the metadata of a block is initialised the
 * first time the block is handed out, so the blocks no request has touched
 * cost address space but no memory (for a simulator's 10^8-block pool).
 * Block storage, when there is any, is allocated and zeroed at creation.
 *
 * Errors: functions that return int return 0 or a negative KVC_E* code
 * (each one's are listed at it).  kvc_pool_refcount, kvc_pool_n_blocks,
 * kvc_pool_n_free, kvc_pool_block_size and kvc_pool_block_bytes return
 * counts, kvc_pool_is_cached a boolean, the *_data functions pointers: they
 * cannot fail, and a bad id gives 0, false or NULL.
 *
 * Thread-safety: a pool is not thread-safe; one owner (the scheduler thread)
 * calls it.  Block storage may be read and written by kernels on other threads
 * while the owner is not freeing those blocks.
 */
#ifndef KVCACHE_POOL_H
#define KVCACHE_POOL_H

#include "kvcache/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Storage number formats for K/V. */
typedef enum {
    KVC_DTYPE_F32 = 0,
    KVC_DTYPE_F16,
    KVC_DTYPE_BF16,
    KVC_DTYPE_FP8_E4M3, /* the "fn" variant: max 448, no infinities */
    KVC_DTYPE_FP8_E5M2, /* IEEE-like: max 57344, infinities and NaN */
    KVC_DTYPE__COUNT
} kvc_dtype_t;

/* Bytes per element (4, 2, 2, 1, 1); 0 for an invalid dtype. */
KVC_API size_t kvc_dtype_bytes(kvc_dtype_t dt);
/* "f32", "f16", "bf16", "fp8-e4m3", "fp8-e5m2"; "?" for an invalid dtype. */
KVC_API const char *kvc_dtype_name(kvc_dtype_t dt);
/* Parse a name as printed by kvc_dtype_name (also "fp32", "fp16", "fp8" = e4m3).
 * Returns 0 or KVC_EINVAL. */
KVC_API int kvc_dtype_parse(const char *name, kvc_dtype_t *out);

/* What lives behind one block.  Per block the layout is
 *
 *     data: (n_layers, n_kv, n_kv_heads, block_size, head_dim) elements of dtype
 *     then: scale_bytes of per-block side data (quantisation scales; layout
 *           decided by the attn layer), then padding to 64 bytes.
 *
 * n_kv is 2 for separate K and V, 1 for one shared latent (MLA: n_kv_heads = 1,
 * head_dim = kv_lora_rank + rope dim).  A zeroed descriptor means "no storage":
 * the pool keeps metadata only (the simulator uses this). */
typedef struct {
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t n_kv; /* 2 = K and V (the default when 0 and n_layers > 0), 1 = latent */
    kvc_dtype_t dtype;
    uint32_t scale_bytes;
} kvc_storage_desc_t;

typedef struct {
    uint32_t n_blocks;          /* 1 .. 2^31 */
    uint32_t block_size;        /* tokens per block: a power of two, 1 .. 256 */
    kvc_storage_desc_t storage; /* zeroed: metadata only */
    kvc_allocator_t allocator;  /* zeroed: the C library */
} kvc_pool_params_t;

/* n_blocks 1024, block_size 16, metadata only, libc allocator. */
KVC_API kvc_pool_params_t kvc_pool_params_default(void);

typedef struct kvc_pool kvc_pool_t;

typedef struct {
    uint32_t n_blocks;
    uint32_t n_free;         /* refcount 0: in the free queue (cached or not) */
    uint32_t n_free_cached;  /* free and still hittable */
    uint32_t n_used;         /* refcount > 0 */
    uint32_t n_high_water;   /* blocks whose metadata was ever initialised (ever handed out
                                or pinned); the others cost no memory */
    uint64_t n_allocated;    /* blocks handed out by kvc_pool_alloc, ever */
    uint64_t n_evicted;      /* cached blocks whose identity was dropped to reuse them */
    uint64_t n_alloc_failed; /* kvc_pool_alloc calls that failed */
} kvc_pool_stats_t;

/* Create a pool.  Fails with KVC_EINVAL (params or out NULL, n_blocks or
 * block_size out of range, a half-filled storage descriptor, a bad dtype,
 * n_kv > 2), KVC_EOVERFLOW (the storage's size does not fit) or KVC_ENOMEM;
 * the params are not changed.  Block storage is 64-byte aligned and zeroed.
 * The caller owns *out and frees it with kvc_pool_destroy. */
KVC_API KVC_NODISCARD int kvc_pool_create(const kvc_pool_params_t *params, kvc_pool_t **out);
/* Free the pool and its storage.  NULL is a no-op. */
KVC_API void kvc_pool_destroy(kvc_pool_t *pool);

/* What a pool of params->n_blocks blocks costs in metadata, without creating
 * it: *reserved receives the address space it reserves, *per_block (either
 * may be NULL) the bytes written for each block the first time it is handed
 * out; the rest stays untouched.  Block storage is on top of this (see
 * kvc_storage_block_bytes).  For messages that say what a refused size would
 * need.  KVC_EINVAL for params NULL or n_blocks out of range. */
KVC_API int kvc_pool_metadata_bytes(const kvc_pool_params_t *params, size_t *reserved,
                                    size_t *per_block);

/* Take n blocks from the head of the free queue, refcount 1 each, into
 * out[0..n).  All or nothing: on failure no block changes hands (out[0..n) may
 * have been used as scratch and holds nothing meaningful).  Fails with
 * KVC_EINVAL (pool NULL, or out NULL with n > 0), KVC_ENOSPC when fewer than
 * n blocks are free (nothing at all changes), or KVC_EBUSY when enough are
 * free but the prefix cache refuses to give up enough of them (cached blocks
 * held back by their cached or fenced children, or pinned for a copy to a tier): then the free
 * cached blocks it did evict on the way stay free but uncached (their identity is gone, counted in
 * n_evicted), since knowing in advance which blocks a chain of leaf-first
 * evictions would release costs the walk itself.  n = 0 is a no-op. */
KVC_API KVC_NODISCARD int kvc_pool_alloc(kvc_pool_t *pool, uint32_t n, uint32_t *out);

/* Add a reference (pin).  A free block leaves the free queue but keeps its
 * identity.  KVC_EINVAL for a bad id (or pool NULL), KVC_EOVERFLOW at the
 * counter's limit; nothing changes on error. */
KVC_API KVC_NODISCARD int kvc_pool_ref(kvc_pool_t *pool, uint32_t block);

/* Drop a reference.  At zero the block joins the free queue: at the tail of
 * its level if cached, at the end of the uncached run otherwise.  KVC_EINVAL
 * for a bad id (or pool NULL); KVC_EUNDERFLOW if the refcount is already zero
 * (nothing changes: no block is freed twice). */
KVC_API int kvc_pool_unref(kvc_pool_t *pool, uint32_t block);

/* Release a block table: unref table[n-1] down to table[0] (tail first), so
 * that a request's tail blocks are evicted before its head blocks.  Entries
 * equal to KVC_NONE are skipped.  The table is validated first: on
 * KVC_EINVAL (pool NULL, table NULL with n > 0, a bad id) or KVC_EUNDERFLOW
 * (a free block, or one listed more times than it is referenced) nothing
 * changes. */
KVC_API int kvc_pool_release(kvc_pool_t *pool, const uint32_t *table, uint32_t n);

/* Whether a block is cached (hittable); false for a bad id. */
KVC_API bool kvc_pool_is_cached(const kvc_pool_t *pool, uint32_t block);
/* A block's reference count; 0 for a bad id. */
KVC_API uint32_t kvc_pool_refcount(const kvc_pool_t *pool, uint32_t block);
KVC_API uint32_t kvc_pool_n_blocks(const kvc_pool_t *pool);
KVC_API uint32_t kvc_pool_n_free(const kvc_pool_t *pool);
KVC_API uint32_t kvc_pool_block_size(const kvc_pool_t *pool);
KVC_API void kvc_pool_stats(const kvc_pool_t *pool, kvc_pool_stats_t *out);

/* ---- storage --------------------------------------------------------- */
/* Bytes one block of `block_size` tokens takes under a storage descriptor,
 * padding included (0 for a zeroed descriptor), without creating a pool: for
 * accounting in metadata-only runs.  KVC_EINVAL (NULL arguments, block_size
 * 0, a bad descriptor) or KVC_EOVERFLOW (too large). */
KVC_API int kvc_storage_block_bytes(const kvc_storage_desc_t *desc, uint32_t block_size,
                                    size_t *bytes);

/* The storage descriptor (zeroed for a metadata-only pool). */
KVC_API const kvc_storage_desc_t *kvc_pool_storage(const kvc_pool_t *pool);
/* Bytes behind one block, padding included (0 when metadata-only). */
KVC_API size_t kvc_pool_block_bytes(const kvc_pool_t *pool);
/* Pointer to a block's bytes; NULL when metadata-only.  Borrowed: valid
 * until the pool is destroyed. */
KVC_API void *kvc_pool_block_data(kvc_pool_t *pool, uint32_t block);
/* Pointer to (n_kv_heads, block_size, head_dim) elements for one layer and
 * kv (0 = K, 1 = V) of a block; NULL when metadata-only. */
KVC_API void *kvc_pool_kv_data(kvc_pool_t *pool, uint32_t block, uint32_t layer, uint32_t kv);
/* Pointer to a block's scale bytes (NULL when there are none). */
KVC_API void *kvc_pool_scale_data(kvc_pool_t *pool, uint32_t block);
/* Copy one block's bytes to another (copy-on-write); no-op when
 * metadata-only.  KVC_EINVAL for bad ids (or pool NULL). */
KVC_API int kvc_pool_copy_block(kvc_pool_t *pool, uint32_t dst, uint32_t src);

/* Check the pool's invariants (DESIGN.md invariant 1, pool side): a block is
 * in the free queue iff its refcount is 0; the queue's links, length and
 * cached count agree with the blocks; uncached free blocks precede cached
 * ones and each cached block sits in its level's run.  Returns 0, KVC_EINVAL
 * (pool NULL) or KVC_ECORRUPT with a description in msg (if msg_cap > 0).
 * O(blocks ever handed out). */
KVC_API int kvc_pool_check(const kvc_pool_t *pool, char *msg, size_t msg_cap);

#ifdef __cplusplus
}
#endif
#endif /* KVCACHE_POOL_H */
