/* kvcache/testing.h - hooks for tests and demonstrations, never for serving.
 *
 * The prefix cache's index hash only finds candidates; a hit needs the exact
 * identity (prefix.h).  These hooks make the index hash deliberately weak so
 * that tests, fuzzers and `kvcache explain --hash-bits N` can show
 * collisions happening and never handing out another prompt's KV.  They
 * never touch the sliding-window fingerprints (an independent XXH3-128).
 *
 * Not part of the umbrella header kvcache/kvcache.h: include it explicitly.
 * Thread-safety: as the cache's other mutating calls (its owner only).
 */
#ifndef KVCACHE_TESTING_H
#define KVCACHE_TESTING_H

#include "kvcache/prefix.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A replacement for XXH3-128 (data, len, the cache's seed). */
typedef kvc_hash128_t (*kvc_hash_fn)(const void *data, size_t len, uint64_t seed);

/* Hash the index with `fn` instead of XXH3-128 (NULL: XXH3-128 again).  Only
 * while the cache holds no block: KVC_EBUSY once a block is cached (its
 * stored hash would no longer be found), KVC_EINVAL if pc is NULL. */
KVC_API KVC_NODISCARD int kvc_testing_prefix_set_hash(kvc_prefix_t *pc, kvc_hash_fn fn);

/* Weaken the index hash to its low `bits` bits (1..64; the rest are zero), so
 * that unrelated blocks collide about once in 2^bits; 128 restores the full
 * hash.  Applies to whichever function hashes (XXH3-128 or kvc_testing's).
 * KVC_EINVAL for another bit count or pc NULL, KVC_EBUSY once a block is
 * cached. */
KVC_API KVC_NODISCARD int kvc_testing_prefix_set_hash_bits(kvc_prefix_t *pc, uint32_t bits);

#ifdef __cplusplus
}
#endif
#endif /* KVCACHE_TESTING_H */
