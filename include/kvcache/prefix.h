/* kvcache/prefix.h - block identity and the prefix cache.
 *
 * A full block's identity is a chained 128-bit hash (XXH3-128, seeded per
 * process unless a deployment seed is given) of
 *
 *     parent block's hash | namespace digest | the block's tokens | extra keys
 *
 * where the namespace carries the weight epoch, the LoRA adapter, the
 * tenant's cache salt and the KV group, and the extra keys are the
 * multimodal inputs that overlap the block, with their offsets.  Only full
 * blocks are cached.
 *
 * The hash only finds candidates.  A hit also requires exact identity: the
 * cached block's parent is the very block the lookup matched one step
 * before (or it is a root in the same namespace), its tokens are equal and
 * its extra keys are equal.  By induction a hit covers exactly the
 * request's token prefix, whatever the hash does: a forced collision can
 * cost a hit, never hand out another prompt's KV.
 *
 * Cached blocks form a tree (a block's parent is the cached block before it).
 * Eviction is the pool's: it reuses the free queue's head, and asks this
 * layer first; a block with cached children is refused, so no cached block
 * is ever stranded behind an evicted parent.  Which free cached block the
 * queue offers first is the eviction policy's (kvc_eviction_t): LRU by
 * default, or LFU, or by priority; all of them evict leaves only, except
 * the deliberately naive one, which strands the children of what it evicts
 * and counts them (kvc_prefix_stats_t.n_stranded_blocks).
 *
 * Sliding-window groups are different on purpose: a request releases the
 * blocks that fall out of its window while it still holds later ones, so
 * their blocks keep no parent links and may be evicted in any order.  A hit
 * needs only the blocks of the last window, found block by block.  Their
 * identity check is the block's own tokens, namespace and extra keys
 * (exactly) plus a second, independent 128-bit fingerprint of the whole
 * prefix (XXH3-128 under its own random seed, never the test hook): the
 * earlier blocks that would prove the prefix exactly are legitimately gone.
 *
 * Tiers (host, disk, remote copies of blocks) build on three things here:
 * fenced blocks, whose identity is known before their bytes are copied in
 * and which no lookup can match until committed (DESIGN.md invariant 11;
 * the cache holds a reference of its own on each, so a block's refcount is
 * the tables that hold it plus one while it is fenced); pins for copy, which
 * keep a cached block from eviction while a tier reads it, without moving it
 * in the eviction order; and the hashes and fingerprints that name a block
 * across processes that share a deployment seed.
 *
 * Memory: per-block metadata is reserved at creation but only touched for
 * blocks that get cached, so a huge metadata-only pool (a simulator's) costs
 * memory in proportion to the blocks its requests use.
 *
 * Errors: functions that return int return 0 or a negative KVC_E* code (each
 * one's are listed at it).  kvc_prefix_seed, kvc_prefix_block_parent,
 * kvc_prefix_count_stranded and kvc_prefix_eviction return values, not codes;
 * kvc_prefix_block_tokens and the *_name functions return pointers.
 * Test hooks (a replacement or weakened index hash) are in kvcache/testing.h.
 *
 * Thread-safety: not thread-safe; the owner of the pool calls it.  Hashing
 * (kvc_prefix_hash) only reads the cache and may run on other threads while
 * nobody destroys it.
 */
#ifndef KVCACHE_PREFIX_H
#define KVCACHE_PREFIX_H

#include "kvcache/pool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t kvc_token_t;

#define KVC_SALT_BYTES 32 /* a SHA-256 digest */

/* Everything outside the tokens that changes the KV of a block.  Every field
 * is compared exactly when a block is matched (never only through a hash). */
typedef struct {
    uint64_t weight_epoch;        /* bump when weights change: older KV is never hit again */
    uint64_t lora_id;             /* adapter id; 0 = base model */
    uint8_t salt[KVC_SALT_BYTES]; /* SHA-256 of the tenant's cache salt; all zero = shared
                                     across tenants */
    uint32_t group; /* KV cache group (hybrid models), < KVC_MAX_GROUPS; 0 otherwise */
} kvc_namespace_t;

/* KV cache groups a model may have (e.g. full-attention and sliding-window layers). */
#define KVC_MAX_GROUPS 4

/* Set ns->salt to the SHA-256 digest of `len` bytes at `salt` (OpenSSL
 * libcrypto; unkeyed, so a salt names the same namespace in every process).
 * len = 0 clears it (shared across tenants).  A salt is a trust boundary:
 * finding two salts with one digest is as hard as a SHA-256 collision.
 * Errors: KVC_EINVAL (ns NULL, or salt NULL with len > 0), KVC_ENOMEM
 * (libcrypto could not run the digest); on error ns is unchanged. */
KVC_API KVC_NODISCARD int kvc_namespace_set_salt_bytes(kvc_namespace_t *ns, const void *salt,
                                                       size_t len);
/* The same for a NUL-terminated string; NULL or "" clears the salt. */
KVC_API KVC_NODISCARD int kvc_namespace_set_salt(kvc_namespace_t *ns, const char *salt);

/* A multimodal input (image, audio clip) whose placeholder tokens occupy
 * positions [start, start + length) of the request.  Its hash is computed
 * by the caller from the input's content.  Every block that overlaps it
 * carries (hash, start - block start, length) as an extra key. */
typedef struct {
    kvc_hash128_t hash;
    uint64_t start;
    uint32_t length;
} kvc_mm_input_t;

/* A request's key: what lookup, match and insert read.  Borrowed. */
typedef struct {
    const kvc_namespace_t *ns; /* NULL: the default namespace (all zero) */
    const kvc_token_t *tokens; /* (n_tokens) */
    size_t n_tokens;
    const kvc_mm_input_t *mm; /* (n_mm), any order; NULL when n_mm = 0 */
    size_t n_mm;
    const kvc_hash128_t *hashes;       /* optional: the full blocks' hashes from
                                          kvc_prefix_hash; NULL: computed on demand */
    const kvc_hash128_t *fingerprints; /* optional, sliding-window groups only: from
                                    kvc_prefix_fingerprint; NULL: computed on demand */
    uint32_t priority; /* under the "priority" eviction policy, how long the blocks this
                          query inserts or hits are kept: 0 (the default) goes first,
                          KVC_PREFIX_MAX_PRIORITY last; the request's class gives it.  A
                          block keeps the highest priority that used it.  Not identity. */
} kvc_prefix_query_t;

#define KVC_PREFIX_MAX_PRIORITY 63

typedef enum { KVC_EVENT_STORED = 1, KVC_EVENT_REMOVED = 2 } kvc_event_type_t;

/* A stored or removed block, for tiers and routers.  Pointers are borrowed
 * for the duration of the callback. */
typedef struct {
    kvc_event_type_t type;
    kvc_hash128_t hash;
    kvc_hash128_t parent_hash; /* zero for a root block */
    uint32_t block;
    uint32_t parent_block; /* KVC_NONE for a root block */
    uint32_t group;
    uint32_t n_tokens;
    const kvc_token_t *tokens; /* (n_tokens) */
} kvc_prefix_event_t;

/* Called at the end of the operation that stored or removed the block.  KVC_EVENT_STORED fires
 * when a block becomes matchable: on kvc_prefix_insert of a new identity and on
 * kvc_prefix_commit of a fenced block, never on kvc_prefix_insert_pending.  At that point the
 * block's bytes are complete (computed, or copied in and verified) and readable; they stay
 * unchanged while it is cached (cached blocks are immutable), but the block may be evicted
 * and reused once the callback returns.  A write-through tier that copies asynchronously pins
 * it first: the callback may call kvc_prefix_pin_for_copy on ev->block (and no other function
 * of the cache).  REMOVED fires before an identity is dropped (eviction); an aborted pending
 * block was never stored and sends nothing. */
typedef void (*kvc_prefix_event_fn)(void *ctx, const kvc_prefix_event_t *ev);

/* ---- eviction policies ------------------------------------------------------
 * The order in which free cached blocks are evicted when the pool needs
 * memory.  Every policy but the naive one takes only blocks with no cached
 * children (leaf-first), so no cached prefix is ever stranded.  Selectable by
 * name (kvc_eviction_parse); one row here (ID, name, summary) plus its
 * behaviour in src/prefix/prefix.c make a policy. */
#define KVC_EVICTION_MAP(XX)                                                                   \
    XX(LRU, "lru", "least recently used leaf first (the default; O(1))")                       \
    XX(LFU, "lfu",                                                                             \
       "fewest uses first (insert + lookups that hit it, counted up to 64), least recently "   \
       "used first among equals; leaves only")                                                 \
    XX(PRIORITY, "priority",                                                                   \
       "lowest query priority first (a block keeps the highest that used it), least recently " \
       "used first within a priority; leaves only")                                            \
    XX(NAIVE_LRU, "naive-lru",                                                                 \
       "least recently used block first even when it has cached children, which it strands "   \
       "(cached, resident, unreachable; counted): what leaf-first prevents")

typedef enum {
#define KVC__EVICT_ENUM(id, name, summary) KVC_EVICT_##id,
    KVC_EVICTION_MAP(KVC__EVICT_ENUM)
#undef KVC__EVICT_ENUM
        KVC_EVICT__COUNT
} kvc_eviction_t;

/* The policy's name ("lru", "lfu", "priority", "naive-lru"); "?" if invalid. */
KVC_API const char *kvc_eviction_name(kvc_eviction_t p);
/* One line on what the policy evicts first; "?" if invalid. */
KVC_API const char *kvc_eviction_summary(kvc_eviction_t p);
/* Parse a name as kvc_eviction_name prints it.  0, or KVC_EINVAL (unknown name,
 * or a NULL argument). */
KVC_API KVC_NODISCARD int kvc_eviction_parse(const char *name, kvc_eviction_t *out);
/* Every policy's name, in enum order, NULL-terminated (static storage). */
KVC_API const char *const *kvc_eviction_names(void);

typedef struct {
    uint64_t hash_seed;           /* 0: random per process (kvc_random_seed).  The deployment
                                     seed: every process that shares a tier (replicas behind
                                     one Redis) must set the same nonzero value, or their
                                     hashes and fingerprints never meet */
    uint32_t max_extra_keys;      /* extra keys one block may carry (0..16); default 4 */
    kvc_prefix_event_fn on_event; /* NULL: no events */
    void *event_ctx;
    uint32_t group_window[KVC_MAX_GROUPS]; /* per KV group: 0 = full attention (the
                                    default), else the sliding window in tokens */
    kvc_eviction_t eviction;               /* KVC_EVICT_LRU (0) by default */
    kvc_allocator_t allocator;             /* zeroed: the C library */
} kvc_prefix_params_t;

/* Random seed, 4 extra keys per block, no events, LRU eviction, libc. */
KVC_API kvc_prefix_params_t kvc_prefix_params_default(void);

typedef struct kvc_prefix kvc_prefix_t;

/* Why a block of a query did or did not hit (kvc_prefix_match). */
typedef enum {
    KVC_BLOCK_HIT = 0,       /* cached with exactly this identity */
    KVC_BLOCK_MISS,          /* no cached block has this hash */
    KVC_BLOCK_COLLISION,     /* cached blocks have this hash, none this identity */
    KVC_BLOCK_AFTER_MISS,    /* an earlier block missed, so this one cannot hit */
    KVC_BLOCK_LAST_TOKEN,    /* cached, but a hit here would cover the last prompt
                                token, which must be computed to get logits */
    KVC_BLOCK_PARTIAL,       /* the last, partially filled block: never cached */
    KVC_BLOCK_OUT_OF_WINDOW, /* sliding-window group: before the window of the hit, not
                                needed (its table entry is KVC_NONE) */
} kvc_block_status_t;

/* "hit", "miss", "collision", "after-miss", "last-token", "partial", "out-of-window". */
KVC_API const char *kvc_block_status_name(kvc_block_status_t s);

typedef struct {
    size_t n_full_blocks;    /* full blocks in the query */
    size_t n_matched_blocks; /* leading full blocks cached with the exact identity */
    size_t n_hit_blocks;     /* after the last-token rule (<= n_matched_blocks) */
    size_t n_hit_tokens;     /* n_hit_blocks * block_size */
    size_t first_hit_block;  /* sliding-window group: hit blocks before this one lie
                                outside the window and are not held; 0 otherwise */
    bool cut_by_last_token;  /* the last-token rule removed a matched block */
} kvc_prefix_hit_t;

typedef struct {
    uint64_t n_lookups;      /* kvc_prefix_lookup calls */
    uint64_t n_lookups_hit;  /* ... that hit at least one block */
    uint64_t n_query_tokens; /* tokens in the queries */
    uint64_t n_query_blocks; /* full blocks in the queries */
    uint64_t n_hit_blocks;   /* blocks returned as hits */
    uint64_t n_hit_tokens;
    uint64_t n_miss_blocks;     /* full blocks not hit (n_query_blocks - n_hit_blocks) */
    uint64_t n_collisions;      /* candidates whose hash matched but identity did not */
    uint64_t n_inserts;         /* blocks inserted */
    uint64_t n_duplicates;      /* inserts that found the identity already cached */
    uint64_t n_evictions;       /* cached blocks dropped */
    uint64_t n_strandings;      /* blocks made unreachable, ever (naive-lru only: evicting a
                                   block with cached children strands them and all below) */
    uint32_t n_cached_blocks;   /* current: blocks with an identity */
    uint32_t n_cached_free;     /* current: cached blocks in the free queue (hittable,
                                   reclaimable) */
    uint32_t n_stranded_blocks; /* current: cached, resident, unreachable (no lookup can
                                   hit them); 0 under every policy but naive-lru */
    uint64_t n_stranded_bytes;  /* current: n_stranded_blocks * the pool's block bytes (0 in
                                   a metadata-only pool: multiply by the model's) */
    /* Tiers (see "fenced blocks" and "pins for copy" below). */
    uint32_t n_pending;       /* current: fenced blocks (identity given, not matchable yet) */
    uint64_t n_commits;       /* kvc_prefix_commit calls that succeeded (resolved ones too) */
    uint64_t n_aborts;        /* pending blocks dropped by kvc_prefix_abort, cascades included */
    uint32_t n_copy_pinned;   /* current: cached blocks pinned for copy */
    uint32_t n_offloaded;     /* current: cached blocks marked offloaded (copied since last use) */
    uint64_t n_copies_begun;  /* pins for copy taken (offload_begin and pin_for_copy) */
    uint64_t n_copies_done;   /* ... ended with copied = true */
    uint64_t n_copies_failed; /* ... ended with copied = false */
} kvc_prefix_stats_t;

/* Create a prefix cache over `pool` (borrowed: it must outlive the cache)
 * and install it as the pool's evictor.  One cache per pool.  Fails with
 * KVC_EINVAL (an argument NULL, max_extra_keys > 16, an unknown eviction
 * policy) or KVC_ENOMEM.  The caller frees it with kvc_prefix_destroy. */
KVC_API KVC_NODISCARD int kvc_prefix_create(kvc_pool_t *pool, const kvc_prefix_params_t *params,
                                            kvc_prefix_t **out);
/* What a cache over a pool of n_blocks blocks of block_size tokens costs in
 * metadata, without creating it: *reserved receives the address space it
 * reserves, *per_block (either may be NULL) the most it writes for each block
 * that gets cached (a page of the hash index included); the rest stays
 * untouched.  For messages that say what a refused size would need.
 * KVC_EINVAL for params NULL, n_blocks 0 or above 2^31, block_size 0 or
 * above 256, max_extra_keys above 16. */
KVC_API int kvc_prefix_metadata_bytes(const kvc_prefix_params_t *params, uint32_t n_blocks,
                                      uint32_t block_size, size_t *reserved, size_t *per_block);
/* Forget every identity (the blocks stay where they are, uncached), remove
 * the evictor, free the cache.  No events are sent.  NULL is a no-op. */
KVC_API void kvc_prefix_destroy(kvc_prefix_t *pc);

/* The seed the cache hashes with (the random one if none was given). */
KVC_API uint64_t kvc_prefix_seed(const kvc_prefix_t *pc);
/* The pool the cache was created over, and a group's window (its
 * params.group_window[group]; 0 for full attention or a group out of range):
 * what kvc_seqs_create checks its own parameters against. */
KVC_API kvc_pool_t *kvc_prefix_pool(const kvc_prefix_t *pc);
KVC_API uint32_t kvc_prefix_group_window(const kvc_prefix_t *pc, uint32_t group);

/* Hash the query's full blocks: out[i] for block i, i < n_tokens / block_size,
 * into out[0..cap).  *n_out receives the number of full blocks (even when it
 * exceeds cap, in which case nothing is written and KVC_ERANGE is returned).
 * KVC_ERANGE also when more multimodal inputs than max_extra_keys overlap one
 * block; KVC_EINVAL for a malformed query (NULL, tokens or mm NULL with a
 * count, a group >= KVC_MAX_GROUPS, a priority > KVC_PREFIX_MAX_PRIORITY),
 * pc or n_out NULL. */
KVC_API int kvc_prefix_hash(const kvc_prefix_t *pc, const kvc_prefix_query_t *q, kvc_hash128_t *out,
                            size_t cap, size_t *n_out);

/* Incremental hashing for a growing sequence: the hash (and, if fp is not
 * NULL, the fingerprint) of full block `index` of the query, chained from
 * block index - 1's values (prev_hash / prev_fp; ignored when index is 0).
 * KVC_EINVAL for a partial or missing block, a malformed query, pc or hash
 * NULL, or prev_hash (prev_fp when fp is wanted) NULL with index > 0;
 * KVC_ERANGE for too many extra keys. */
KVC_API int kvc_prefix_hash_next(const kvc_prefix_t *pc, const kvc_prefix_query_t *q, size_t index,
                                 const kvc_hash128_t *prev_hash, const kvc_hash128_t *prev_fp,
                                 kvc_hash128_t *hash, kvc_hash128_t *fp);

/* The fingerprints of the query's full blocks, as kvc_prefix_hash gives the hashes; same
 * errors.  A fingerprint is a second chained 128-bit hash of the whole prefix up to the end of
 * the block, under its own seed (derived from hash_seed when one is given, so replicas agree;
 * random otherwise) and always XXH3-128 (never the test hook).  Sliding-window groups use it
 * as identity; it is defined for every group, so a tier can store (hash, fingerprint) as a
 * block's identity and check a fetched record against both.
 *
 * Continuing a lookup in the tiers: after kvc_prefix_lookup hits h blocks, blocks h, h+1, ...
 * of the query are looked up by out[h], out[h + 1], ... of kvc_prefix_hash (and of this
 * function for their fingerprints); kvc_prefix_hash_next gives them one at a time, chained
 * from block h - 1's values (kvc_prefix_block_hash of the last hit block gives its hash). */
KVC_API int kvc_prefix_fingerprint(const kvc_prefix_t *pc, const kvc_prefix_query_t *q,
                                   kvc_hash128_t *out, size_t cap, size_t *n_out);

/* Which of the query's first `limit` full blocks are cached with the exact
 * identity: present[i] = the block, or KVC_NONE.  For a full-attention group
 * the chain stops at the first miss; for a sliding-window group each block is
 * looked up on its own; in both, a block with too many extra keys ends the
 * walk (every later identity chains through it).  Pins nothing, counts
 * nothing.  *n_present (if not NULL) receives how many were found.
 * KVC_EINVAL for pc NULL, a malformed query or present NULL with limit > 0. */
KVC_API int kvc_prefix_probe(kvc_prefix_t *pc, const kvc_prefix_query_t *q, size_t limit,
                             uint32_t *present, size_t *n_present);

/* The longest cached prefix of the query, without pinning anything.
 * For a sliding-window group, the longest prefix whose last window is cached:
 * hit blocks before that window are reported as KVC_NONE in blocks[] and as
 * KVC_BLOCK_OUT_OF_WINDOW in status[].
 * blocks[i] (if blocks != NULL, for i < min(cap, n_hit_blocks)) receives the
 * physical block of hit i; status[i] (if status != NULL) receives the status of
 * block i for every block of the query, partial one included (status needs
 * ceil(n_tokens / block_size) entries).  A block with too many extra keys
 * (which can never be cached) ends the match in every group.  KVC_EINVAL for
 * pc or hit NULL, a malformed query, or blocks NULL with cap > 0; never fails
 * otherwise. */
KVC_API int kvc_prefix_match(kvc_prefix_t *pc, const kvc_prefix_query_t *q, uint32_t *blocks,
                             size_t cap, kvc_block_status_t *status, kvc_prefix_hit_t *hit);

/* Look up the query's longest cached prefix and pin it: the hit blocks get
 * one reference each (they leave the free queue if they were in it) and are
 * written to blocks[0..n_hit_blocks) (KVC_NONE before a sliding window).  The
 * hit never covers the last token and never exceeds cap blocks.  The caller
 * owns the references (release them with kvc_pool_release).  Counts in the
 * stats, and counts as a use of each hit block for the eviction policy.
 * Errors: as kvc_prefix_match, and KVC_EOVERFLOW if a block's refcount is at
 * its limit (then nothing is pinned and the hit is reported empty). */
KVC_API KVC_NODISCARD int kvc_prefix_lookup(kvc_prefix_t *pc, const kvc_prefix_query_t *q,
                                            uint32_t *blocks, size_t cap, kvc_prefix_hit_t *hit);

/* Give physical `block` the identity of full block `index` of the query.
 * `parent` is the cached block holding block index - 1 (KVC_NONE iff index is
 * 0; ignored for sliding-window groups, which keep no parent links); the
 * caller must hold references to both.  If a block with this exact
 * identity is already cached, nothing changes and *canonical (if not NULL)
 * receives that block; otherwise *canonical = block.  A caller that wants to
 * continue the chain uses *canonical as the next parent (and may swap it into
 * its table to share the memory).  Inserting (or finding) counts as a use
 * for the eviction policy, at the query's priority.  Errors: KVC_EINVAL (pc
 * NULL, a malformed query, bad ids, a partial block, a parent that is not
 * cached or does not hold block index - 1's tokens or namespace, a
 * precomputed hash that disagrees, a block that is free or already cached
 * with another identity), KVC_ERANGE (too many extra keys in this block or,
 * in a sliding-window group, an earlier one).  Nothing changes on error. */
KVC_API KVC_NODISCARD int kvc_prefix_insert(kvc_prefix_t *pc, const kvc_prefix_query_t *q,
                                            size_t index, uint32_t parent, uint32_t block,
                                            uint32_t *canonical);

/* ---- fenced (pending) blocks: DESIGN.md invariant 11 ----------------------------
 * A block being filled from a tier has its identity before its bytes are in: it is pending.
 * A pending block is not in the index: lookup, match and probe treat it (and so everything
 * that would chain below it) as a miss, kvc_prefix_block_hash / _parent / _tokens report it
 * as uncached, no event fires for it, and it is never evicted or offered for offload: the
 * cache holds a reference of its own on it (counted in its refcount) from insert_pending to
 * commit or abort, so its fetcher may release its own reference at any time.
 *
 * Order rule: commit root first.  A block may be committed only once its parent is
 * committed (or it is a root, or in a sliding-window group); a fetched run is committed in
 * chain order as its copies complete.  A pending block may have a pending parent.
 *
 * Duplicates: a computed block wins.  kvc_prefix_insert of an identity that is pending
 * elsewhere inserts the computed block as usual (it is complete now); the pending one, when
 * committed, resolves to the cached block (see kvc_prefix_commit).  Two fetches of one
 * identity are refused (KVC_EBUSY from insert_pending). */

/* As kvc_prefix_insert, with the same validation and errors, but the block becomes pending,
 * not matchable; `parent` may be a pending block (not one no lookup can reach, under
 * naive-lru).  If the identity is already cached (committed), nothing changes and *canonical
 * receives that block, as with kvc_prefix_insert: no fetch is needed.  If it is pending in
 * another block (another fetch), nothing changes, *canonical receives that block and the
 * result is KVC_EBUSY.  Otherwise *canonical = block, the cache takes its own reference on
 * it, and the caller copies the bytes in, verifies them, and calls kvc_prefix_commit or
 * kvc_prefix_abort.  Errors: as kvc_prefix_insert (KVC_EINVAL also for a block that is
 * already pending), KVC_EBUSY (above), KVC_EOVERFLOW (the block's refcount is at its
 * limit).  Nothing changes on error.  O(pending blocks). */
KVC_API KVC_NODISCARD int kvc_prefix_insert_pending(kvc_prefix_t *pc, const kvc_prefix_query_t *q,
                                                    size_t index, uint32_t parent, uint32_t block,
                                                    uint32_t *canonical);

/* The copy into pending `block` is complete and verified: make it matchable.  Sends
 * KVC_EVENT_STORED, counts as an insert, and drops the cache's reference.  If a block with
 * the same identity was committed or computed meanwhile, that block is the cached one: this
 * block loses its identity (uncached, no event), its pending children are re-parented to
 * that block, and *canonical (if not NULL) receives it (a use of it, as a duplicate insert);
 * the caller may swap it into its table.  Otherwise *canonical = block.  Errors: KVC_EINVAL
 * (pc NULL, a bad id), KVC_ENOENT (the block is not pending: never was, committed already,
 * or aborted, perhaps by a cascade from its parent), KVC_EBUSY (its parent is still pending:
 * the order rule).  Nothing changes on error.  O(pending blocks). */
KVC_API KVC_NODISCARD int kvc_prefix_commit(kvc_prefix_t *pc, uint32_t block, uint32_t *canonical);

/* The copy into pending `block` failed (checksum, timeout, tier fault): drop its identity and,
 * in cascade, that of every pending block below it (their copies chain from bytes that will
 * never be there; their fetchers' commits then fail with KVC_ENOENT).  The blocks stay where
 * they are, uncached; the cache drops its references; the callers still hold theirs.
 * *n_aborted (if not NULL) receives how many blocks were dropped.  No event.  Errors:
 * KVC_EINVAL (pc NULL, a bad id), KVC_ENOENT (not pending).  O(pending blocks). */
KVC_API int kvc_prefix_abort(kvc_prefix_t *pc, uint32_t block, uint32_t *n_aborted);

/* ---- pins for copy: offload without a race --------------------------------------
 * A cached block is copied out to a tier only while pinned for copy.  The pin is the
 * evictor's refusal, not a reference: the block keeps its place in the free queue (a copy is
 * not a use, so it does not make the block look recently used), the pool cannot evict or
 * reuse it (kvc_pool_alloc skips it, and may report KVC_EBUSY when only pinned blocks are
 * left), and a lookup may hit and pin it meanwhile (the copy keeps reading unchanged bytes:
 * cached blocks are immutable).  One pin for copy per block at a time. */

/* Pin for copy up to n of the blocks the pool would evict next: free cached blocks with no
 * cached or pending children (any, under naive-lru), in the pool's eviction order, skipping
 * blocks pinned for copy already and blocks marked offloaded.  blocks[0 .. *n_out) receives
 * them.  Not a use for the eviction policy.  Errors: KVC_EINVAL (pc or n_out NULL, blocks
 * NULL with n > 0).  O(free cached blocks walked). */
KVC_API KVC_NODISCARD int kvc_prefix_offload_begin(kvc_prefix_t *pc, uint32_t n, uint32_t *blocks,
                                                   uint32_t *n_out);

/* Pin one cached block for copy by id (a write-through tier, from KVC_EVENT_STORED or later),
 * whether free or in use.  Not a use.  Errors: KVC_EINVAL (pc NULL), KVC_ENOENT (not cached:
 * uncached, pending, or a bad id), KVC_EBUSY (pinned for copy already). */
KVC_API KVC_NODISCARD int kvc_prefix_pin_for_copy(kvc_prefix_t *pc, uint32_t block);

/* End a pin for copy.  copied: the tier now holds the block's bytes; the block is marked
 * offloaded, and offload_begin does not offer it again until a use (a lookup hit, a duplicate
 * insert or commit) clears the mark; a use while the copy ran does not (the copy is of the
 * bytes the block still holds).  Either way the block is where it was in the eviction
 * order (earlier than a block freed after it), evictable again.  Errors: KVC_EINVAL (pc
 * NULL), KVC_ENOENT (not pinned for copy, or a bad id). */
KVC_API int kvc_prefix_offload_end(kvc_prefix_t *pc, uint32_t block, bool copied);

/* A block's state for the tiers and tests: a set of KVC_PREFIX_BLOCK_* bits (0 for an
 * uncached block or a bad id). */
#define KVC_PREFIX_BLOCK_CACHED    1u /* committed: matchable */
#define KVC_PREFIX_BLOCK_PENDING   2u /* fenced: identity given, not matchable */
#define KVC_PREFIX_BLOCK_COPYING   4u /* pinned for copy */
#define KVC_PREFIX_BLOCK_OFFLOADED 8u /* copied to a tier since its last use */
KVC_API uint32_t kvc_prefix_block_flags(const kvc_prefix_t *pc, uint32_t block);

/* Evict up to n free cached blocks, in the pool's order (leaves only, except
 * under naive-lru), and report how many went (n_evicted may be NULL).  For
 * tiers and for tests; allocation evicts on its own.  KVC_EINVAL if pc is
 * NULL. */
KVC_API int kvc_prefix_evict(kvc_prefix_t *pc, uint32_t n, uint32_t *n_evicted);

/* Identity of a cached block: KVC_ENOENT if it is not cached (or a bad id),
 * KVC_EINVAL if pc or hash is NULL. */
KVC_API int kvc_prefix_block_hash(const kvc_prefix_t *pc, uint32_t block, kvc_hash128_t *hash);
/* Parent of a cached block (KVC_NONE for roots, stranded blocks, uncached
 * blocks and bad ids). */
KVC_API uint32_t kvc_prefix_block_parent(const kvc_prefix_t *pc, uint32_t block);
/* Tokens of a cached block (block_size of them), NULL if it is not cached
 * (or a bad id).  Borrowed: valid until the block is evicted. */
KVC_API const kvc_token_t *kvc_prefix_block_tokens(const kvc_prefix_t *pc, uint32_t block);

KVC_API void kvc_prefix_stats(const kvc_prefix_t *pc, kvc_prefix_stats_t *out);
/* The eviction policy the cache was created with. */
KVC_API kvc_eviction_t kvc_prefix_eviction(const kvc_prefix_t *pc);

/* Cached blocks that no lookup can reach, counted from the structure alone: a
 * parent that is not cached, or not the parent its hash was chained from, or
 * such a block above.  Zero under every eviction policy but naive-lru, where
 * it equals the stats' n_stranded_blocks.  O(blocks): each cached block is
 * hashed once.  Never allocates (it uses scratch the pool reserved), so it
 * may not run concurrently with the checkers on the same pool. */
KVC_API uint32_t kvc_prefix_count_stranded(const kvc_prefix_t *pc);

/* Check invariants 2 to 4 and 11 of DESIGN.md and the index's own consistency:
 * each reachable cached block is in its hash chain exactly once and nothing
 * else is; its stored hash recomputes from its stored identity; its parent
 * is cached and counts it as a child; child counts are exact; the pool's
 * cached marks and eviction levels match the policy's.  A stranded block
 * (cached behind an evicted parent) fails the check under every policy but
 * naive-lru, where the stranded blocks must be exactly the ones counted.
 * Pending blocks: none is in the index; each is on the pending list (after its pending
 * parent), holds a reference, chains from its parent's hash and counts in its parent's
 * children; the marks for copy and offload are on cached blocks only and match the counters.
 * Also runs kvc_pool_check.  Returns 0, KVC_ECORRUPT with a description in
 * msg, KVC_EINVAL (pc NULL) or KVC_ENOMEM (it allocates a scratch count).
 * O(blocks ever used * block_size). */
KVC_API int kvc_prefix_check(const kvc_prefix_t *pc, char *msg, size_t msg_cap);

#ifdef __cplusplus
}
#endif
#endif /* KVCACHE_PREFIX_H */
