/* pool_int.h - what the pool offers the prefix and seq layers above it (and the
 * pool's own tests): cached marks, eviction levels, the evictor hook and a walk of
 * the free queue.  Private: not installed, not exported from the shared
 * library (kvc__ names, no KVC_API).  A caller-supplied bad id is an error
 * code here too, never an assert.
 */
#ifndef KVC_POOL_INT_H
#define KVC_POOL_INT_H

#include "kvcache/pool.h"

/* Cached free blocks are ranked in levels 0 .. KVC__POOL_LEVELS - 1: the pool
 * evicts level 0 first, and within a level the least recently freed block
 * first.  The prefix layer's eviction policy decides each block's level. */
#define KVC__POOL_LEVELS 64

/* The prefix layer's hook: called when the pool is about to reuse a free
 * block marked cached.  Return 0 after dropping the block's identity (the
 * pool then clears the mark), or KVC_EBUSY if the block cannot be evicted yet
 * (it has cached children); the pool then tries the next block in order.
 * It must not change the free queue. */
typedef int (*kvc__evict_fn)(void *ctx, uint32_t block);

/* kvc_pool_ref on blocks[0 .. n) in order, all or nothing: on an error (KVC_EINVAL for a bad
 * id, pool NULL or blocks NULL with n > 0; KVC_EOVERFLOW for a refcount at its maximum) the
 * references taken are given back, as kvc_pool_unref would, and the error is returned. */
int kvc__pool_ref_n(kvc_pool_t *pool, const uint32_t *blocks, size_t n);

/* Set the evictor (NULL: cached blocks are reused without asking). */
void kvc__pool_set_evictor(kvc_pool_t *pool, kvc__evict_fn fn, void *ctx);

/* Mark a block cached (hittable) or not.  A free block moves to the run of
 * the queue its new state belongs to (a cached block to the tail of its
 * level, an uncached one to the end of the uncached run).  KVC_EINVAL for a
 * bad id or pool NULL. */
int kvc__pool_set_cached(kvc_pool_t *pool, uint32_t block, bool cached);

/* Set a block's eviction level (< KVC__POOL_LEVELS; 0 when a block is first
 * handed out).  A free cached block whose level changes moves to the tail of
 * its new level.  KVC_EINVAL for a bad id, a bad level or pool NULL. */
int kvc__pool_set_level(kvc_pool_t *pool, uint32_t block, uint32_t level);
/* A block's level; 0 for a bad id. */
uint32_t kvc__pool_level(const kvc_pool_t *pool, uint32_t block);

/* Walk the free queue from head to tail: *next receives the free block after
 * `block`, or the head when block is KVC_NONE; KVC_NONE past the tail.  O(1)
 * except across empty levels.  KVC_EINVAL for a bad id (or pool / next NULL),
 * KVC_EBUSY if `block` is in use (it is in no queue). */
int kvc__pool_free_next(const kvc_pool_t *pool, uint32_t block, uint32_t *next);
/* The first free cached block in eviction order (the head of the lowest
 * non-empty level), or KVC_NONE. */
uint32_t kvc__pool_free_cached_first(const kvc_pool_t *pool);

/* Blocks [high water, n_blocks) have never been handed out or pinned: they
 * are free and uncached, and their metadata has never been touched. */
uint32_t kvc__pool_high_water(const kvc_pool_t *pool);

/* An array of n_blocks uint32_t that the invariant checkers of the layers above (prefix,
 * seq) use as scratch, so that a checker never allocates: it runs under injected allocation
 * faults and inside runs whose memory is watched.  Its contents are undefined between uses:
 * a checker zeroes the part it uses, [0, kvc__pool_high_water) at most, which keeps untouched
 * pages untouched.  One checker at a time (the pool is single-threaded). */
uint32_t *kvc__pool_check_scratch(const kvc_pool_t *pool);

#endif /* KVC_POOL_INT_H */
