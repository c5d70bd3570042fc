/* prefix.c - block identity and the prefix cache (see include/kvcache/prefix.h).
 *
 * Per physical block this layer keeps the identity of the cached content:
 * its hash, its parent block, its tokens, its namespace and extra keys.  The
 * index is a chained hash table whose chains run through the entries
 * themselves (no allocation after creation).  Identity is checked exactly on
 * every candidate, so the hash function only affects speed, never results.
 *
 * Memory proportional to use: per-block arrays are allocated uninitialised
 * and only written for blocks that are inserted (entries [0, hw) are
 * initialised; the pool hands blocks out in id order the first time, so hw
 * follows its high-water mark); the bucket array is initialised a page-sized
 * chunk at a time, the first time an entry lands in the chunk.
 *
 * Speed: the two hot loops, the chained block hash and the full-attention match of a query
 * with no multimodal inputs, have one-loop versions with XXH3 inlined and the common block
 * sizes (16, 32 tokens) as constants; they compute exactly what the general code computes,
 * which tests/test_prefix_fastpath.c checks block for block.
 */
#include "kvcache/prefix.h"
#include "kvcache/testing.h"
#include "pool/pool_int.h"
#include "util/msg.h"

#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))

#define MAX_EXTRA_KEYS 16
#define NS_BYTES       (20 + KVC_SALT_BYTES) /* epoch 8 | lora 8 | salt 32 | group 4 */

typedef struct {
    kvc_hash128_t hash;
    uint64_t offset; /* start of the input minus the block's first position (two's complement) */
    uint32_t length;
    uint32_t pad;
} extra_t;

/* A full-attention block whose parent was evicted under it (only the naive eviction policy
 * does that) keeps this as its parent: no lookup names it, so the block can never be reached. */
#define STRANDED (UINT32_MAX - 1)

typedef struct {
    kvc_hash128_t hash;
    uint32_t hnext;          /* next entry in the same bucket, KVC_NONE at the end */
    uint32_t parent;         /* KVC_NONE for a root, and always in sliding-window groups;
                                STRANDED once evicted from under this block */
    uint32_t n_children;     /* cached and pending blocks whose parent is this one */
    uint8_t cached : 1;      /* committed: in the index, matchable */
    uint8_t sliding : 1;     /* belongs to a sliding-window group */
    uint8_t unreachable : 1; /* stranded, or below a stranded block */
    uint8_t pending : 1;     /* fenced: identity given, copy not committed; on the pending
                                list, never in the index, held by the cache's own reference */
    uint8_t copying : 1;     /* cached and pinned for copy: the evictor refuses it */
    uint8_t offloaded : 1;   /* cached, and a tier holds a copy made since its last use */
    uint8_t doomed : 1;      /* scratch for kvc_prefix_abort's cascade; 0 between calls */
    uint8_t n_extra;
    uint8_t uses;     /* the insert and every lookup that pinned it (counted only when the
                         policy ranks by uses or priority, or some block is marked
                         offloaded), saturating at 255 */
    uint8_t priority; /* the highest query priority that inserted or pinned it */
} entry_t;

_Static_assert(sizeof(entry_t) == 32, "lookups touch one entry per block: keep it half a line");

/* ---- eviction policies --------------------------------------------------------
 * A policy ranks free cached blocks by giving each one a level of the pool's free queue (level
 * 0 goes first, least recently freed first within a level); its level is set when the block is
 * inserted and each time a lookup pins it.  Adding a policy: a row in KVC_EVICTION_MAP
 * (prefix.h, its name) and its behaviour here, in policy_<ID>. */
typedef struct {
    /* The block's level (< KVC__POOL_LEVELS); NULL: every block at level 0 (plain LRU). */
    uint32_t (*level)(const entry_t *e);
    /* Evicts blocks that have cached children, stranding them (counted). */
    bool strands;
} policy_t;

static uint32_t level_lfu(const entry_t *e)
{
    return KVC_MIN((uint32_t)e->uses - 1, KVC__POOL_LEVELS - 1);
}

static uint32_t level_priority(const entry_t *e)
{
    return e->priority;
}

static const policy_t policy_LRU = {.level = NULL};
static const policy_t policy_LFU = {.level = level_lfu};
static const policy_t policy_PRIORITY = {.level = level_priority};
static const policy_t policy_NAIVE_LRU = {.level = NULL, .strands = true};

static const struct {
    const char *name, *summary;
    const policy_t *policy;
} policies[] = {
#define KVC__POLICY_ROW(id, name, summary) {name, summary, &policy_##id},
    KVC_EVICTION_MAP(KVC__POLICY_ROW)
#undef KVC__POLICY_ROW
};
_Static_assert(KVC_ARRAY_LEN(policies) == KVC_EVICT__COUNT, "one row per policy");
_Static_assert(KVC_PREFIX_MAX_PRIORITY < KVC__POOL_LEVELS, "a priority is a level");

#define CHUNK_SHIFT 10 /* buckets per lazily initialised chunk: 4 KiB of chain heads */

struct kvc_prefix {
    kvc_pool_t *pool;
    kvc_prefix_params_t params;
    const policy_t *policy;
    uint32_t (*level)(const entry_t *e); /* policy->level, kept here for the hot paths */
    uint64_t seed;
    uint64_t fp_seed;    /* fingerprints: independent of seed and of the test hook */
    kvc_hash_fn hash_fn; /* testing.h: replaces XXH3-128 for the index hash; NULL normally */
    uint32_t hash_bits;  /* testing.h: the index hash keeps this many low bits (128: all) */
    bool hooked;         /* hash_fn set or hash_bits < 128 */
    uint32_t n_blocks;
    uint32_t block_size;
    uint32_t bs_shift; /* log2(block_size): the pool's block size is a power of two */
    uint32_t bucket_mask;
    uint32_t hw;           /* entries [0, hw) are initialised; the rest are uncached */
    uint32_t *buckets;     /* (bucket_mask + 1) chain heads, valid where their chunk is ready */
    uint8_t *bucket_ready; /* (chunks) 1 once a chunk of buckets is initialised */
    entry_t *entries;      /* (n_blocks) */
    kvc_token_t *tokens;   /* (n_blocks, block_size), valid for cached blocks */
    kvc_namespace_t *ns;   /* (n_blocks), valid for cached blocks */
    extra_t *extras;       /* (n_blocks, max_extra_keys), valid for cached blocks */
    kvc_hash128_t *fp;     /* (n_blocks) fingerprints of cached sliding-window blocks */
    kvc_hash128_t *phash;  /* (n_blocks) the hash each cached block chains from (zero for a
                              root); kept out of entry_t so lookups touch one line per block */
    uint32_t n_cached;
    uint32_t n_unreachable; /* cached blocks no lookup can reach (naive eviction only) */
    /* Pending (fenced) blocks, linked through hnext in insertion order, so that a pending
     * block's pending parent is always ahead of it (insert_pending needs the parent first). */
    uint32_t pending_head, pending_tail;
    uint32_t n_pending;
    uint32_t n_copying;   /* cached blocks pinned for copy */
    uint32_t n_offloaded; /* cached blocks marked offloaded */
    bool installed;       /* the pool's evictor is ours */
    kvc_prefix_stats_t stats;
};

static const kvc_namespace_t default_ns;

/* ---- small helpers ------------------------------------------------------- */
const char *kvc_block_status_name(kvc_block_status_t s)
{
    static const char *const names[] = {"hit",        "miss",    "collision",    "after-miss",
                                        "last-token", "partial", "out-of-window"};
    return (unsigned)s < KVC_ARRAY_LEN(names) ? names[s] : "?";
}

int kvc_namespace_set_salt_bytes(kvc_namespace_t *ns, const void *salt, size_t len)
{
    if (!ns || (len && !salt)) return KVC_EINVAL;
    uint8_t digest[KVC_SALT_BYTES] = {0};
    if (len) {
        /* SHA-256, not the index hash: a salt crosses a trust boundary, and two salts with one
         * digest would share a tenant's KV.  Unkeyed, so the same salt gives the same namespace
         * in every process. */
        unsigned int n = 0;
        if (!EVP_Digest(salt, len, digest, &n, EVP_sha256(), NULL) || n != KVC_SALT_BYTES)
            return KVC_ENOMEM;
    }
    memcpy(ns->salt, digest, sizeof ns->salt);
    return 0;
}

int kvc_namespace_set_salt(kvc_namespace_t *ns, const char *salt)
{
    return kvc_namespace_set_salt_bytes(ns, salt, salt ? strlen(salt) : 0);
}

/* a and b hold the same n bytes, n a multiple of 16.  Inline, in 16-byte vectors (GCC's vector
 * extension: SSE2 on x86-64, NEON on arm64) and without an early exit (a mismatch after a
 * hash match is a collision, rare): where n is a constant this is a few loads, not a call to
 * memcmp. */
typedef uint64_t v2u64 __attribute__((vector_size(16)));

static ALWAYS_INLINE bool words_equal(const void *a, const void *b, size_t n)
{
    const uint8_t *x = a, *y = b;
    v2u64 d = {0, 0};
#pragma GCC unroll 16
    for (size_t i = 0; i < n; i += 16) {
        v2u64 u, v;
        memcpy(&u, x + i, 16);
        memcpy(&v, y + i, 16);
        d |= u ^ v;
    }
    return (d[0] | d[1]) == 0;
}

_Static_assert(KVC_SALT_BYTES % 16 == 0, "salts compare a vector at a time");

static ALWAYS_INLINE bool ns_equal(const kvc_namespace_t *a, const kvc_namespace_t *b)
{
    return ((a->weight_epoch ^ b->weight_epoch) | (a->lora_id ^ b->lora_id) |
            (uint64_t)(a->group ^ b->group)) == 0 &&
           words_equal(a->salt, b->salt, KVC_SALT_BYTES);
}

/* The tokens of two blocks (tb bytes each) are equal. */
static ALWAYS_INLINE bool tokens_equal(const kvc_token_t *a, const kvc_token_t *b, size_t tb)
{
    return __builtin_constant_p(tb) && tb % 16 == 0 ? words_equal(a, b, tb) : memcmp(a, b, tb) == 0;
}

/* XXH3-128, the function and the values of kvc_hash128, inlined here: the chained block hash
 * calls it once per block, and where the length is a constant the compiler drops XXH3's length
 * dispatch along with the call. */
static ALWAYS_INLINE kvc_hash128_t xxh128(const void *data, size_t len, uint64_t seed)
{
    XXH128_hash_t h = XXH3_128bits_withSeed(data, len, seed);
    return (kvc_hash128_t){.lo = h.low64, .hi = h.high64};
}

static kvc_hash128_t hooked_hash(const kvc_prefix_t *pc, const void *data, size_t len)
{
    kvc_hash128_t h =
        pc->hash_fn ? pc->hash_fn(data, len, pc->seed) : kvc_hash128(data, len, pc->seed);
    if (pc->hash_bits < 128)
        h = (kvc_hash128_t){.lo = pc->hash_bits >= 64 ? h.lo : h.lo & ((1ull << pc->hash_bits) - 1),
                            .hi = 0};
    return h;
}

static inline kvc_hash128_t do_hash(const kvc_prefix_t *pc, const void *data, size_t len)
{
    return KVC_UNLIKELY(pc->hooked) ? hooked_hash(pc, data, len) : xxh128(data, len, pc->seed);
}

static void ns_bytes(const kvc_namespace_t *ns, uint8_t buf[NS_BYTES])
{
    memcpy(buf, &ns->weight_epoch, 8);
    memcpy(buf + 8, &ns->lora_id, 8);
    memcpy(buf + 16, ns->salt, KVC_SALT_BYTES);
    memcpy(buf + 16 + KVC_SALT_BYTES, &ns->group, 4);
}

static kvc_hash128_t ns_digest(const kvc_prefix_t *pc, const kvc_namespace_t *ns)
{
    uint8_t buf[NS_BYTES];
    ns_bytes(ns, buf);
    return do_hash(pc, buf, sizeof buf);
}

static kvc_hash128_t ns_fp_digest(const kvc_prefix_t *pc, const kvc_namespace_t *ns)
{
    uint8_t buf[NS_BYTES];
    ns_bytes(ns, buf);
    return xxh128(buf, sizeof buf, pc->fp_seed);
}

static inline bool is_sliding(const kvc_prefix_t *pc, const kvc_namespace_t *ns)
{
    return pc->params.group_window[ns->group] != 0;
}

static inline const kvc_namespace_t *query_ns(const kvc_prefix_query_t *q)
{
    return q->ns ? q->ns : &default_ns;
}

static inline bool query_ok(const kvc_prefix_query_t *q)
{
    return q && (q->tokens || q->n_tokens == 0) && (q->mm || q->n_mm == 0) &&
           (!q->ns || q->ns->group < KVC_MAX_GROUPS) && q->priority <= KVC_PREFIX_MAX_PRIORITY;
}

/* The extra keys of block `index`: every multimodal input overlapping it, sorted so that the
 * order of q->mm does not matter.  Returns the count, or -1 if more than `max` overlap. */
static int block_extras(const kvc_prefix_query_t *q, size_t index, uint32_t block_size,
                        uint32_t max, extra_t *out)
{
    uint64_t lo = (uint64_t)index * block_size, hi = lo + block_size;
    int n = 0;
    for (size_t i = 0; i < q->n_mm; i++) {
        const kvc_mm_input_t *m = &q->mm[i];
        if (m->length == 0 || m->start >= hi || m->start + m->length <= lo) continue;
        if ((uint32_t)n == max) return -1;
        extra_t e = {.hash = m->hash, .offset = m->start - lo, .length = m->length};
        int j = n++;
        /* insertion sort by (offset, length, hash) */
        while (j > 0) {
            const extra_t *p = &out[j - 1];
            bool after =
                (int64_t)p->offset > (int64_t)e.offset ||
                (p->offset == e.offset &&
                 (p->length > e.length ||
                  (p->length == e.length && (p->hash.hi > e.hash.hi || (p->hash.hi == e.hash.hi &&
                                                                        p->hash.lo > e.hash.lo)))));
            if (!after) break;
            out[j] = out[j - 1];
            j--;
        }
        out[j] = e;
    }
    return n;
}

/* hash = H(parent hash | namespace digest | tokens | extra keys); fingerprints chain the same
 * inputs under their own seed and always with XXH3 (fp = true). */
static kvc_hash128_t chain_hash(const kvc_prefix_t *pc, bool fp, kvc_hash128_t parent,
                                kvc_hash128_t nsd, const kvc_token_t *tokens, const extra_t *extras,
                                int n_extra)
{
    uint8_t buf[32 + 256 * sizeof(kvc_token_t) + MAX_EXTRA_KEYS * 28];
    size_t len = 0;
    memcpy(buf, &parent, 16);
    memcpy(buf + 16, &nsd, 16);
    len = 32;
    size_t tb = (size_t)pc->block_size * sizeof(kvc_token_t);
    memcpy(buf + len, tokens, tb);
    len += tb;
    for (int i = 0; i < n_extra; i++) {
        memcpy(buf + len, &extras[i].hash, 16);
        memcpy(buf + len + 16, &extras[i].offset, 8);
        memcpy(buf + len + 24, &extras[i].length, 4);
        len += 28;
    }
    return fp ? xxh128(buf, len, pc->fp_seed) : do_hash(pc, buf, len);
}

static inline kvc_hash128_t block_hash(const kvc_prefix_t *pc, kvc_hash128_t parent,
                                       kvc_hash128_t nsd, const kvc_token_t *tokens,
                                       const extra_t *extras, int n_extra)
{
    return chain_hash(pc, false, parent, nsd, tokens, extras, n_extra);
}

/* The hashes of n consecutive blocks with no extra keys, chained from `parent` under XXH3-128
 * (what chain_hash computes for each, unhooked): one stack buffer whose namespace digest is
 * written once, one call per block.  Inlined with tb (token bytes per block) a constant for
 * the common block sizes. */
static ALWAYS_INLINE void chain_plain(const uint8_t *tokens, size_t n, size_t tb,
                                      kvc_hash128_t parent, kvc_hash128_t nsd, uint64_t seed,
                                      kvc_hash128_t *out)
{
    uint8_t buf[32 + 256 * sizeof(kvc_token_t)];
    memcpy(buf + 16, &nsd, 16);
    for (size_t i = 0; i < n; i++) {
        memcpy(buf, &parent, 16);
        memcpy(buf + 32, tokens + i * tb, tb);
        parent = out[i] = xxh128(buf, 32 + tb, seed);
    }
}

/* flatten: XXH3 is inlined into each case, so that its length dispatch folds away. */
static __attribute__((flatten)) void chain_plain_any(uint32_t block_size, const kvc_token_t *tokens,
                                                     size_t n, kvc_hash128_t parent,
                                                     kvc_hash128_t nsd, uint64_t seed,
                                                     kvc_hash128_t *out)
{
    const uint8_t *t = (const uint8_t *)tokens;
    switch (block_size) {
    case 16:
        chain_plain(t, n, 16 * sizeof(kvc_token_t), parent, nsd, seed, out);
        break;
    case 32:
        chain_plain(t, n, 32 * sizeof(kvc_token_t), parent, nsd, seed, out);
        break;
    default:
        chain_plain(t, n, block_size * sizeof(kvc_token_t), parent, nsd, seed, out);
        break;
    }
}

static inline uint32_t bucket_of(const kvc_prefix_t *pc, kvc_hash128_t h)
{
    return (uint32_t)(h.lo ^ (h.lo >> 32)) & pc->bucket_mask;
}

/* The first entry of bucket k's chain (KVC_NONE if its chunk was never initialised). */
static inline uint32_t bucket_head(const kvc_prefix_t *pc, uint32_t k)
{
    return pc->bucket_ready[k >> CHUNK_SHIFT] ? pc->buckets[k] : KVC_NONE;
}

static void bucket_chunk_init(kvc_prefix_t *pc, uint32_t c)
{
    size_t first = (size_t)c << CHUNK_SHIFT;
    size_t n = KVC_MIN((size_t)1 << CHUNK_SHIFT, (size_t)pc->bucket_mask + 1 - first);
    memset(pc->buckets + first, 0xff, n * sizeof(uint32_t));
    pc->bucket_ready[c] = 1;
}

/* Bucket k's chain head, for writing: its chunk is initialised on first use. */
static inline uint32_t *bucket_slot(kvc_prefix_t *pc, uint32_t k)
{
    uint32_t c = k >> CHUNK_SHIFT;
    if (KVC_UNLIKELY(!pc->bucket_ready[c])) bucket_chunk_init(pc, c);
    return &pc->buckets[k];
}

/* Entries [hw, b] become valid (uncached).  The pool hands blocks out in id order the first
 * time, so this follows its high-water mark. */
static void entries_upto(kvc_prefix_t *pc, uint32_t b)
{
    for (; pc->hw <= b; pc->hw++)
        pc->entries[pc->hw] = (entry_t){.hnext = KVC_NONE, .parent = KVC_NONE};
}

static inline bool is_cached(const kvc_prefix_t *pc, uint32_t b)
{
    return b < pc->hw && pc->entries[b].cached;
}

static inline bool is_pending(const kvc_prefix_t *pc, uint32_t b)
{
    return b < pc->hw && pc->entries[b].pending;
}

static inline kvc_token_t *entry_tokens(const kvc_prefix_t *pc, uint32_t b)
{
    return pc->tokens + (size_t)b * pc->block_size;
}

/* One block's tokens compared and copied, with the common block sizes inline. */
static inline bool block_tokens_equal(const kvc_prefix_t *pc, const kvc_token_t *a,
                                      const kvc_token_t *b)
{
    switch (pc->block_size) {
    case 16:
        return tokens_equal(a, b, 16 * sizeof(kvc_token_t));
    case 32:
        return tokens_equal(a, b, 32 * sizeof(kvc_token_t));
    default:
        return memcmp(a, b, (size_t)pc->block_size * sizeof(kvc_token_t)) == 0;
    }
}

static inline void block_tokens_copy(const kvc_prefix_t *pc, kvc_token_t *dst,
                                     const kvc_token_t *src)
{
    switch (pc->block_size) {
    case 16:
        memcpy(dst, src, 16 * sizeof(kvc_token_t));
        break;
    case 32:
        memcpy(dst, src, 32 * sizeof(kvc_token_t));
        break;
    default:
        memcpy(dst, src, (size_t)pc->block_size * sizeof(kvc_token_t));
        break;
    }
}

static inline extra_t *entry_extras(const kvc_prefix_t *pc, uint32_t b)
{
    return pc->extras ? pc->extras + (size_t)b * pc->params.max_extra_keys : NULL; /* none kept */
}

/* What a candidate must equal besides its hash: for full-attention groups the exact parent
 * block; for sliding-window groups the parent hash and the prefix fingerprint. */
typedef struct {
    uint32_t parent;
    kvc_hash128_t parent_hash;
    kvc_hash128_t fp;
    bool sliding;
} link_t;

/* Exact identity: same parent (see link_t), namespace, tokens and extra keys. */
static ALWAYS_INLINE bool identity_equal(const kvc_prefix_t *pc, uint32_t b, const link_t *link,
                                         const kvc_namespace_t *ns, const kvc_token_t *tokens,
                                         const extra_t *extras, int n_extra)
{
    const entry_t *e = &pc->entries[b];
    if (e->n_extra != n_extra || e->sliding != link->sliding) return false;
    if (link->sliding) {
        if (!kvc_hash128_eq(pc->phash[b], link->parent_hash) ||
            !kvc_hash128_eq(pc->fp[b], link->fp))
            return false;
    } else if (e->parent != link->parent) {
        return false;
    }
    if (!block_tokens_equal(pc, entry_tokens(pc, b), tokens)) return false;
    if (!ns_equal(&pc->ns[b], ns)) return false;
    for (int i = 0; i < n_extra; i++) {
        const extra_t *x = &entry_extras(pc, b)[i];
        if (!kvc_hash128_eq(x->hash, extras[i].hash) || x->offset != extras[i].offset ||
            x->length != extras[i].length)
            return false;
    }
    return true;
}

/* Find the cached block with this exact identity; *collided is set if a candidate had the
 * same hash but another identity. */
static ALWAYS_INLINE uint32_t find_exact(const kvc_prefix_t *pc, kvc_hash128_t h,
                                         const link_t *link, const kvc_namespace_t *ns,
                                         const kvc_token_t *tokens, const extra_t *extras,
                                         int n_extra, bool *collided)
{
    for (uint32_t b = bucket_head(pc, bucket_of(pc, h)); b != KVC_NONE; b = pc->entries[b].hnext) {
        if (!kvc_hash128_eq(pc->entries[b].hash, h)) continue;
        if (identity_equal(pc, b, link, ns, tokens, extras, n_extra)) return b;
        *collided = true;
    }
    return KVC_NONE;
}

static void emit_event(kvc_prefix_t *pc, kvc_event_type_t type, uint32_t b)
{
    const entry_t *e = &pc->entries[b];
    kvc_prefix_event_t ev = {
        .type = type,
        .hash = e->hash,
        .parent_hash = pc->phash[b],
        .block = b,
        .parent_block = e->parent,
        .group = pc->ns[b].group,
        .n_tokens = pc->block_size,
        .tokens = entry_tokens(pc, b),
    };
    pc->params.on_event(pc->params.event_ctx, &ev);
}

static inline void emit(kvc_prefix_t *pc, kvc_event_type_t type, uint32_t b)
{
    if (pc->params.on_event) emit_event(pc, type, b);
}

/* Drop a childless cached block's identity.  Does not touch the pool's mark: the caller does
 * (kvc_pool_alloc clears it itself after the evictor returns). */
static void drop(kvc_prefix_t *pc, uint32_t b)
{
    entry_t *e = &pc->entries[b];
    KVC_ASSERT(e->cached && e->n_children == 0 && !e->copying);
    emit(pc, KVC_EVENT_REMOVED, b);
    uint32_t *link = bucket_slot(pc, bucket_of(pc, e->hash));
    while (*link != b) {
        KVC_ASSERT(*link != KVC_NONE);
        link = &pc->entries[*link].hnext;
    }
    *link = e->hnext;
    if (e->parent < pc->n_blocks) pc->entries[e->parent].n_children--;
    if (e->unreachable) pc->n_unreachable--;
    if (e->offloaded) pc->n_offloaded--;
    *e = (entry_t){.hnext = KVC_NONE, .parent = KVC_NONE};
    pc->n_cached--;
    pc->stats.n_evictions++;
}

/* The naive policy evicts a block with cached children: they lose their parent for good, and
 * they and every cached block below them can never be reached again (until evicted in turn).
 * Deliberately simple: O(blocks ever used) per stranding, like the policy it serves. */
static void strand_children(kvc_prefix_t *pc, uint32_t b)
{
    uint32_t newly = 0;
    for (uint32_t c = 0; c < pc->hw; c++) {
        entry_t *e = &pc->entries[c];
        if (!e->cached || e->parent != b) continue;
        e->parent = STRANDED;
        if (!e->unreachable) e->unreachable = 1, newly++;
    }
    pc->entries[b].n_children = 0;
    for (bool changed = newly > 0; changed;) { /* everything below them, level by level */
        changed = false;
        for (uint32_t c = 0; c < pc->hw; c++) {
            entry_t *e = &pc->entries[c];
            if (e->cached && !e->unreachable && e->parent < pc->n_blocks &&
                pc->entries[e->parent].unreachable) {
                e->unreachable = 1;
                newly++;
                changed = true;
            }
        }
    }
    pc->n_unreachable += newly;
    pc->stats.n_strandings += newly;
}

/* Block b is the parent of a pending block.  O(pending blocks); only naive-lru asks. */
static bool has_pending_child(const kvc_prefix_t *pc, uint32_t b)
{
    for (uint32_t x = pc->pending_head; x != KVC_NONE; x = pc->entries[x].hnext)
        if (pc->entries[x].parent == b) return true;
    return false;
}

/* Drop a free cached block's identity if the policy allows it now: KVC_EBUSY while it is
 * pinned for copy, or has cached or pending children (leaf-first) unless the policy strands
 * them (never pending ones). */

static inline int evict_one(kvc_prefix_t *pc, uint32_t b)
{
    if (!is_cached(pc, b)) return 0;
    /* Pinned for copy: a tier is reading its bytes (the pool would hand them out). */
    if (pc->entries[b].copying) return KVC_EBUSY;
    if (pc->entries[b].n_children) {
        /* A pending child must find its parent at commit: not even naive-lru strands it. */
        if (!pc->policy->strands || has_pending_child(pc, b)) return KVC_EBUSY;
        strand_children(pc, b);
    }
    drop(pc, b);
    return 0;
}

static int evict_cb(void *ctx, uint32_t block)
{
    return evict_one(ctx, block);
}

/* A lookup pinned block b, or an insert gave it (or found) its identity: count the use and
 * rank it again under the policy. */
static inline void touch(kvc_prefix_t *pc, uint32_t b, uint32_t priority)
{
    entry_t *e = &pc->entries[b];
    if (e->uses < UINT8_MAX) e->uses++;
    if (priority > e->priority) e->priority = (uint8_t)priority;
    if (e->offloaded) { /* used again: a tier may have dropped its copy since */
        e->offloaded = 0;
        pc->n_offloaded--;
    }
    if (pc->level) (void)kvc__pool_set_level(pc->pool, b, pc->level(e));
}

/* ---- lifecycle ------------------------------------------------------------ */
kvc_prefix_params_t kvc_prefix_params_default(void)
{
    return (kvc_prefix_params_t){.max_extra_keys = 4};
}

static uint64_t n_buckets_for(uint32_t n_blocks)
{
    uint64_t n_buckets = 16;
    while (n_buckets < 2ull * n_blocks) n_buckets <<= 1;
    return n_buckets;
}

static bool any_sliding_group(const kvc_prefix_params_t *params)
{
    bool any = false;
    for (int g = 0; g < KVC_MAX_GROUPS; g++) any |= params->group_window[g] != 0;
    return any;
}

/* Bytes of the per-block arrays for one block (what create reserves n_blocks times). */
static size_t per_block_bytes(const kvc_prefix_params_t *params, uint32_t block_size)
{
    return sizeof(entry_t) + block_size * sizeof(kvc_token_t) + sizeof(kvc_namespace_t) +
           params->max_extra_keys * sizeof(extra_t) +
           (any_sliding_group(params) ? 2 : 1) * sizeof(kvc_hash128_t);
}

int kvc_prefix_metadata_bytes(const kvc_prefix_params_t *params, uint32_t n_blocks,
                              uint32_t block_size, size_t *reserved, size_t *per_block)
{
    if (!params || n_blocks == 0 || n_blocks > (1u << 31) || block_size == 0 || block_size > 256 ||
        params->max_extra_keys > MAX_EXTRA_KEYS)
        return KVC_EINVAL;
    uint64_t n_buckets = n_buckets_for(n_blocks);
    size_t one = per_block_bytes(params, block_size);
    if (reserved)
        *reserved = sizeof(kvc_prefix_t) + n_buckets * sizeof(uint32_t) +
                    (n_buckets >> CHUNK_SHIFT) + 1 + (size_t)n_blocks * one;
    if (per_block) *per_block = one + ((size_t)sizeof(uint32_t) << CHUNK_SHIFT);
    return 0;
}

int kvc_prefix_create(kvc_pool_t *pool, const kvc_prefix_params_t *params, kvc_prefix_t **out)
{
    if (!pool || !params || !out) return KVC_EINVAL;
    *out = NULL;
    if (params->max_extra_keys > MAX_EXTRA_KEYS || (unsigned)params->eviction >= KVC_EVICT__COUNT)
        return KVC_EINVAL;
    const bool any_sliding = any_sliding_group(params);
    const kvc_allocator_t *a = &params->allocator;
    kvc_prefix_t *pc = kvc_calloc(a, 1, sizeof *pc, 0);
    if (!pc) return KVC_ENOMEM;
    pc->pool = pool;
    pc->params = *params;
    pc->policy = policies[params->eviction].policy;
    pc->level = pc->policy->level;
    pc->hash_bits = 128;
    pc->pending_head = pc->pending_tail = KVC_NONE;
    pc->seed = params->hash_seed ? params->hash_seed : kvc_random_seed();
    /* The fingerprint seed is independent of the index seed; derived from it when a deployment
     * fixes the seed (so fingerprints agree across its processes), random otherwise. */
    pc->fp_seed = params->hash_seed
                      ? kvc_hash128(&pc->seed, sizeof pc->seed, 0x66696e6765727072ULL).lo
                      : kvc_random_seed();
    pc->n_blocks = kvc_pool_n_blocks(pool);
    pc->block_size = kvc_pool_block_size(pool);
    pc->bs_shift = (uint32_t)__builtin_ctz(pc->block_size);
    KVC_ASSERT(pc->block_size == 1u << pc->bs_shift); /* kvc_pool_create's contract */
    uint64_t n_buckets = n_buckets_for(pc->n_blocks);
    pc->bucket_mask = (uint32_t)(n_buckets - 1);
    /* Uninitialised on purpose (see the banner): nothing is read before it is written. */
    const size_t n = pc->n_blocks;
    pc->buckets = kvc_alloc(a, n_buckets * sizeof(uint32_t), 64);
    pc->bucket_ready =
        kvc_calloc(a, (size_t)((n_buckets + (1u << CHUNK_SHIFT) - 1) >> CHUNK_SHIFT), 1, 0);
    pc->entries = kvc_alloc(a, n * sizeof(entry_t), 64);
    pc->tokens = kvc_alloc(a, n * pc->block_size * sizeof(kvc_token_t), 64);
    pc->ns = kvc_alloc(a, n * sizeof(kvc_namespace_t), 64);
    if (params->max_extra_keys)
        pc->extras = kvc_alloc(a, n * params->max_extra_keys * sizeof(extra_t), 64);
    if (any_sliding) pc->fp = kvc_alloc(a, n * sizeof(kvc_hash128_t), 64);
    pc->phash = kvc_alloc(a, n * sizeof(kvc_hash128_t), 64);
    if (!pc->buckets || !pc->bucket_ready || !pc->entries || !pc->tokens || !pc->ns || !pc->phash ||
        (params->max_extra_keys && !pc->extras) || (any_sliding && !pc->fp)) {
        kvc_prefix_destroy(pc);
        return KVC_ENOMEM;
    }
    kvc__pool_set_evictor(pool, evict_cb, pc);
    pc->installed = true;
    *out = pc;
    return 0;
}

void kvc_prefix_destroy(kvc_prefix_t *pc)
{
    if (!pc) return;
    if (pc->installed) { /* give the pool back its marks and the fences' references */
        kvc__pool_set_evictor(pc->pool, NULL, NULL);
        for (uint32_t b = 0; b < pc->hw; b++) {
            if (pc->entries[b].cached) (void)kvc__pool_set_cached(pc->pool, b, false);
            if (pc->entries[b].pending) (void)kvc_pool_unref(pc->pool, b);
        }
    }
    kvc_allocator_t a = pc->params.allocator;
    kvc_free(&a, pc->buckets);
    kvc_free(&a, pc->bucket_ready);
    kvc_free(&a, pc->entries);
    kvc_free(&a, pc->tokens);
    kvc_free(&a, pc->ns);
    kvc_free(&a, pc->extras);
    kvc_free(&a, pc->fp);
    kvc_free(&a, pc->phash);
    kvc_free(&a, pc);
}

uint64_t kvc_prefix_seed(const kvc_prefix_t *pc)
{
    return pc->seed;
}

kvc_pool_t *kvc_prefix_pool(const kvc_prefix_t *pc)
{
    return pc->pool;
}

uint32_t kvc_prefix_group_window(const kvc_prefix_t *pc, uint32_t group)
{
    return group < KVC_MAX_GROUPS ? pc->params.group_window[group] : 0;
}

/* ---- testing.h ------------------------------------------------------------ */
static int set_hooks(kvc_prefix_t *pc, kvc_hash_fn fn, uint32_t bits)
{
    /* Cached blocks carry hashes made by the old function: they could not be found again. */
    if (pc->n_cached) return KVC_EBUSY;
    pc->hash_fn = fn;
    pc->hash_bits = bits;
    pc->hooked = fn || bits < 128;
    return 0;
}

int kvc_testing_prefix_set_hash(kvc_prefix_t *pc, kvc_hash_fn fn)
{
    if (!pc) return KVC_EINVAL;
    return set_hooks(pc, fn, pc->hash_bits);
}

int kvc_testing_prefix_set_hash_bits(kvc_prefix_t *pc, uint32_t bits)
{
    if (!pc || bits == 0 || (bits > 64 && bits != 128)) return KVC_EINVAL;
    return set_hooks(pc, pc->hash_fn, bits);
}

/* ---- hashing -------------------------------------------------------------- */
static int hash_chain(const kvc_prefix_t *pc, bool fp, const kvc_prefix_query_t *q,
                      kvc_hash128_t *out, size_t cap, size_t *n_out)
{
    if (!pc || !query_ok(q) || !n_out) return KVC_EINVAL;
    size_t n_full = q->n_tokens >> pc->bs_shift;
    *n_out = n_full;
    if (n_full > cap || (n_full && !out)) return KVC_ERANGE;
    kvc_hash128_t nsd = fp ? ns_fp_digest(pc, query_ns(q)) : ns_digest(pc, query_ns(q));
    kvc_hash128_t parent = {0, 0};
    if (q->n_mm == 0 && (fp || !pc->hooked)) {
        chain_plain_any(pc->block_size, q->tokens, n_full, parent, nsd, fp ? pc->fp_seed : pc->seed,
                        out);
        return 0;
    }
    extra_t extras[MAX_EXTRA_KEYS];
    for (size_t i = 0; i < n_full; i++) {
        int n_extra =
            q->n_mm ? block_extras(q, i, pc->block_size, pc->params.max_extra_keys, extras) : 0;
        if (n_extra < 0) return KVC_ERANGE;
        parent = out[i] =
            chain_hash(pc, fp, parent, nsd, q->tokens + i * pc->block_size, extras, n_extra);
    }
    return 0;
}

int kvc_prefix_hash(const kvc_prefix_t *pc, const kvc_prefix_query_t *q, kvc_hash128_t *out,
                    size_t cap, size_t *n_out)
{
    return hash_chain(pc, false, q, out, cap, n_out);
}

int kvc_prefix_hash_next(const kvc_prefix_t *pc, const kvc_prefix_query_t *q, size_t index,
                         const kvc_hash128_t *prev_hash, const kvc_hash128_t *prev_fp,
                         kvc_hash128_t *hash, kvc_hash128_t *fp)
{
    if (!pc || !query_ok(q) || !hash || index >= q->n_tokens >> pc->bs_shift) return KVC_EINVAL;
    if (index > 0 && (!prev_hash || (fp && !prev_fp))) return KVC_EINVAL;
    extra_t extras[MAX_EXTRA_KEYS];
    int n_extra =
        q->n_mm ? block_extras(q, index, pc->block_size, pc->params.max_extra_keys, extras) : 0;
    if (n_extra < 0) return KVC_ERANGE;
    const kvc_token_t *tok = q->tokens + index * pc->block_size;
    const kvc_hash128_t zero = {0, 0};
    *hash =
        block_hash(pc, index ? *prev_hash : zero, ns_digest(pc, query_ns(q)), tok, extras, n_extra);
    if (fp)
        *fp = chain_hash(pc, true, index ? *prev_fp : zero, ns_fp_digest(pc, query_ns(q)), tok,
                         extras, n_extra);
    return 0;
}

int kvc_prefix_fingerprint(const kvc_prefix_t *pc, const kvc_prefix_query_t *q, kvc_hash128_t *out,
                           size_t cap, size_t *n_out)
{
    return hash_chain(pc, true, q, out, cap, n_out);
}

/* ---- lookup --------------------------------------------------------------- */
/* First block of the window a hit of h blocks needs: the next position is h * bs and it sees
 * keys from h * bs - window + 1. */
static size_t window_first_block(size_t h, uint32_t bs, uint32_t window)
{
    size_t next = h * bs;
    size_t first = next + 1 > window ? next + 1 - window : 0;
    return KVC_MIN(first / bs, h);
}

/* Walks the query's full blocks, computing hashes (and fingerprints) as it goes unless the
 * query brings them. */
typedef struct {
    const kvc_prefix_t *pc;
    const kvc_prefix_query_t *q;
    const kvc_namespace_t *ns;
    bool sliding;
    kvc_hash128_t nsd, nsd_fp, h, prev_h, fp;
    extra_t extras[MAX_EXTRA_KEYS];
    int n_extra;
} walker_t;

static void walker_init(walker_t *w, const kvc_prefix_t *pc, const kvc_prefix_query_t *q)
{
    memset(w, 0, sizeof *w);
    w->pc = pc;
    w->q = q;
    w->ns = query_ns(q);
    w->sliding = is_sliding(pc, w->ns);
    if (!q->hashes) w->nsd = ns_digest(pc, w->ns);
    if (w->sliding && !q->fingerprints) w->nsd_fp = ns_fp_digest(pc, w->ns);
}

/* Advance to block i (called for i = 0, 1, 2, ... in order).  False if the block carries more
 * extra keys than a block can store (so it cannot be cached). */
static inline bool walker_step(walker_t *w, size_t i)
{
    const kvc_prefix_t *pc = w->pc;
    const kvc_prefix_query_t *q = w->q;
    const uint32_t bs = pc->block_size;
    w->n_extra = q->n_mm ? block_extras(q, i, bs, pc->params.max_extra_keys, w->extras) : 0;
    if (w->n_extra < 0) return false;
    const kvc_token_t *tok = q->tokens + i * bs;
    w->prev_h = w->h;
    w->h = q->hashes ? q->hashes[i] : block_hash(pc, w->h, w->nsd, tok, w->extras, w->n_extra);
    if (w->sliding)
        w->fp = q->fingerprints
                    ? q->fingerprints[i]
                    : chain_hash(pc, true, w->fp, w->nsd_fp, tok, w->extras, w->n_extra);
    return true;
}

static inline uint32_t walker_find(kvc_prefix_t *pc, walker_t *w, size_t i, uint32_t prev,
                                   bool *collided)
{
    link_t link = {.parent = prev, .parent_hash = w->prev_h, .fp = w->fp, .sliding = w->sliding};
    *collided = false;
    uint32_t b = find_exact(pc, w->h, &link, w->ns, w->q->tokens + i * pc->block_size, w->extras,
                            w->n_extra, collided);
    if (*collided) pc->stats.n_collisions++;
    return b;
}

/* The full-attention walk for a query with no multimodal inputs, and hashes that are given or
 * unhooked: what the walker and find_exact do, block by block, with the same exact identity
 * (hash, parent block, no extra keys, tokens, namespace), in one loop.  Returns the number of
 * blocks matched; *collided says whether the block that missed met a candidate with its hash.
 * Inlined with tb (token bytes per block) and `given` (q->hashes != NULL) constants; the
 * cache's fields are read once into locals, since a store to blocks[] could alias them. */
#define PREFETCH_AHEAD 8

static ALWAYS_INLINE size_t match_plain(kvc_prefix_t *pc, const kvc_prefix_query_t *q,
                                        const kvc_namespace_t *ns, kvc_hash128_t nsd, size_t n_full,
                                        uint32_t *blocks, size_t cap, bool *collided, size_t tb,
                                        bool given)
{
    const uint8_t *tok = (const uint8_t *)q->tokens;
    const kvc_hash128_t *hashes = q->hashes;
    const entry_t *entries = pc->entries;
    const uint8_t *cached_tokens = (const uint8_t *)pc->tokens;
    const kvc_namespace_t *cached_ns = pc->ns;
    const uint32_t *buckets = pc->buckets;
    const uint8_t *ready = pc->bucket_ready;
    const uint32_t mask = pc->bucket_mask;
    const uint64_t seed = pc->seed;
    uint8_t buf[32 + 256 * sizeof(kvc_token_t)]; /* parent | nsd | tokens, when computing */
    kvc_hash128_t h = {0, 0};
    if (!given) memcpy(buf + 16, &nsd, 16);
    /* given: the hash PREFETCH_AHEAD blocks on, clamped to the last one */
    const kvc_hash128_t *last = given && n_full ? hashes + n_full - 1 : NULL;
    const kvc_hash128_t *ahead =
        given && n_full ? hashes + KVC_MIN(n_full - 1, PREFETCH_AHEAD) : NULL;
    uint32_t prev = KVC_NONE;
    uint64_t n_coll = 0;
    size_t i = 0;
    for (; i < n_full; i++) {
        const uint8_t *t = tok + i * tb;
        if (given) {
            h = hashes[i];
            /* Cold metadata: the bucket a few blocks ahead is fetched while this block is
             * compared (about 1.6x on lookups whose metadata is out of cache). */
            __builtin_prefetch(&buckets[(uint32_t)(ahead->lo ^ (ahead->lo >> 32)) & mask]);
            ahead += ahead < last;
        } else {
            memcpy(buf, &h, 16);
            memcpy(buf + 32, t, tb);
            h = xxh128(buf, 32 + tb, seed);
        }
        uint32_t k = (uint32_t)(h.lo ^ (h.lo >> 32)) & mask; /* bucket_of */
        uint32_t b = ready[k >> CHUNK_SHIFT] ? buckets[k] : KVC_NONE;
        bool coll = false;
        for (; b != KVC_NONE; b = entries[b].hnext) {
            const entry_t *e = &entries[b];
            if (((e->hash.lo ^ h.lo) | (e->hash.hi ^ h.hi)) != 0) continue;
            if (e->parent == prev && e->n_extra == 0 && !e->sliding &&
                tokens_equal((const kvc_token_t *)(cached_tokens + (size_t)b * tb),
                             (const kvc_token_t *)t, tb) &&
                ns_equal(&cached_ns[b], ns))
                break;
            coll = true;
        }
        n_coll += coll;
        if (b == KVC_NONE) {
            *collided = coll;
            break;
        }
        if (i < cap) blocks[i] = b;
        prev = b;
    }
    pc->stats.n_collisions += n_coll;
    return i;
}

static __attribute__((flatten, noinline)) size_t
match_plain_any(kvc_prefix_t *pc, const kvc_prefix_query_t *q, const kvc_namespace_t *ns,
                kvc_hash128_t nsd, size_t n_full, uint32_t *blocks, size_t cap, bool *collided)
{
    const size_t tb = pc->block_size * sizeof(kvc_token_t);
#define KVC__MATCH(TB)                                                                \
    (q->hashes ? match_plain(pc, q, ns, nsd, n_full, blocks, cap, collided, TB, true) \
               : match_plain(pc, q, ns, nsd, n_full, blocks, cap, collided, TB, false))
    switch (pc->block_size) {
    case 16:
        return KVC__MATCH(16 * sizeof(kvc_token_t));
    case 32:
        return KVC__MATCH(32 * sizeof(kvc_token_t));
    default:
        return KVC__MATCH(tb);
    }
#undef KVC__MATCH
}

/* Match with the hit limited to h_limit blocks (lookup passes its capacity). */
static int match_impl(kvc_prefix_t *pc, const kvc_prefix_query_t *q, uint32_t *blocks, size_t cap,
                      kvc_block_status_t *status, kvc_prefix_hit_t *hit, size_t h_limit)
{
    if (!pc || !query_ok(q) || !hit || (cap && !blocks)) return KVC_EINVAL;
    const uint32_t bs = pc->block_size;
    size_t n_full = q->n_tokens >> pc->bs_shift;
    size_t n_all = n_full + ((q->n_tokens & (bs - 1)) != 0);
    *hit = (kvc_prefix_hit_t){.n_full_blocks = n_full};
    /* The last-token rule: the hit may cover at most n_tokens - 1 tokens. */
    const size_t lt = q->n_tokens ? (q->n_tokens - 1) >> pc->bs_shift : 0;
    const size_t max_hit = KVC_MIN(lt, h_limit);

    walker_t w;
    walker_init(&w, pc, q);
    if (!w.sliding) {
        uint32_t prev = KVC_NONE;
        size_t i = 0;
        kvc_block_status_t miss_status = KVC_BLOCK_MISS;
        if (q->n_mm == 0 && (q->hashes || !pc->hooked)) {
            bool collided = false;
            i = match_plain_any(pc, q, w.ns, w.nsd, n_full, blocks, cap, &collided);
            if (collided) miss_status = KVC_BLOCK_COLLISION;
        } else {
            for (; i < n_full; i++) {
                if (!walker_step(&w, i)) break; /* cannot have been inserted: a miss */
                bool collided;
                uint32_t b = walker_find(pc, &w, i, prev, &collided);
                if (b == KVC_NONE) {
                    miss_status = collided ? KVC_BLOCK_COLLISION : KVC_BLOCK_MISS;
                    break;
                }
                if (blocks && i < cap) blocks[i] = b;
                prev = b;
            }
        }
        hit->n_matched_blocks = i;
        hit->n_hit_blocks = KVC_MIN(i, max_hit);
        hit->cut_by_last_token = lt < KVC_MIN(i, h_limit);
        if (status) {
            for (size_t j = 0; j < n_all; j++)
                status[j] = j >= n_full             ? KVC_BLOCK_PARTIAL
                            : j < hit->n_hit_blocks ? KVC_BLOCK_HIT
                            : j < i                 ? KVC_BLOCK_LAST_TOKEN
                            : j == i                ? miss_status
                                                    : KVC_BLOCK_AFTER_MISS;
        }
    } else {
        /* Each block on its own; a hit of h blocks needs blocks [first(h), h).  `run` counts the
         * present blocks ending at block i. */
        const uint32_t window = pc->params.group_window[w.ns->group];
        size_t run = 0, best = 0, best_no_rule = 0, matched = 0;
        for (size_t i = 0; i < n_full; i++) {
            if (!walker_step(&w, i)) {
                /* Unhashable (more extra keys than a block holds): it was never cached, and
                 * every later block's identity chains through it, so nothing after it can hit
                 * either.  The match ends here. */
                if (status) {
                    status[i] = KVC_BLOCK_MISS;
                    for (size_t j = i + 1; j < n_full; j++) status[j] = KVC_BLOCK_AFTER_MISS;
                }
                break;
            }
            bool collided;
            uint32_t b = walker_find(pc, &w, i, KVC_NONE, &collided);
            kvc_block_status_t st = b != KVC_NONE ? KVC_BLOCK_HIT
                                    : collided    ? KVC_BLOCK_COLLISION
                                                  : KVC_BLOCK_MISS;
            if (blocks && i < cap) blocks[i] = b;
            if (status) status[i] = st;
            run = b != KVC_NONE ? run + 1 : 0;
            size_t h = i + 1;
            if (run >= h - window_first_block(h, bs, window)) {
                matched = h;
                if (h <= max_hit) best = h;
                if (h <= h_limit) best_no_rule = h;
            }
        }
        hit->n_matched_blocks = matched;
        hit->n_hit_blocks = best;
        hit->cut_by_last_token = best_no_rule > best;
        hit->first_hit_block = window_first_block(best, bs, window);
        if (blocks)
            for (size_t j = 0; j < KVC_MIN(hit->first_hit_block, cap); j++) blocks[j] = KVC_NONE;
        if (status) {
            for (size_t j = 0; j < n_all; j++) {
                if (j >= n_full)
                    status[j] = KVC_BLOCK_PARTIAL;
                else if (j < hit->first_hit_block)
                    status[j] = KVC_BLOCK_OUT_OF_WINDOW;
                else if (j < best)
                    status[j] = KVC_BLOCK_HIT;
                else if (j < matched && status[j] == KVC_BLOCK_HIT)
                    status[j] = KVC_BLOCK_LAST_TOKEN;
                else if (status[j] == KVC_BLOCK_HIT)
                    status[j] = KVC_BLOCK_AFTER_MISS; /* cached, but its window is incomplete */
            }
        }
    }
    hit->n_hit_tokens = hit->n_hit_blocks * bs;
    return 0;
}

int kvc_prefix_match(kvc_prefix_t *pc, const kvc_prefix_query_t *q, uint32_t *blocks, size_t cap,
                     kvc_block_status_t *status, kvc_prefix_hit_t *hit)
{
    return match_impl(pc, q, blocks, cap, status, hit, SIZE_MAX);
}

int kvc_prefix_probe(kvc_prefix_t *pc, const kvc_prefix_query_t *q, size_t limit, uint32_t *present,
                     size_t *n_present)
{
    if (!pc || !query_ok(q) || (limit && !present)) return KVC_EINVAL;
    size_t n = KVC_MIN(limit, q->n_tokens / pc->block_size), found = 0;
    walker_t w;
    walker_init(&w, pc, q);
    uint32_t prev = KVC_NONE;
    bool broken = false;
    for (size_t i = 0; i < n; i++) {
        uint32_t b = KVC_NONE;
        /* An unhashable block ends the walk in every group: all later identities chain through
         * it.  In a full-attention group so does a miss. */
        if (!broken && !walker_step(&w, i)) broken = true;
        if (!broken) {
            bool collided;
            b = walker_find(pc, &w, i, prev, &collided);
        }
        present[i] = b;
        found += b != KVC_NONE;
        if (!w.sliding) {
            if (b == KVC_NONE) broken = true;
            prev = b;
        }
    }
    if (n_present) *n_present = found;
    return 0;
}

int kvc_prefix_lookup(kvc_prefix_t *pc, const kvc_prefix_query_t *q, uint32_t *blocks, size_t cap,
                      kvc_prefix_hit_t *hit)
{
    int rc = match_impl(pc, q, blocks, cap, NULL, hit, cap);
    if (rc) return rc;
    const size_t n_pin = hit->n_hit_blocks - hit->first_hit_block;
    rc = n_pin ? kvc__pool_ref_n(pc->pool, blocks + hit->first_hit_block, n_pin) : 0;
    if (rc) { /* refcount overflow: nothing was taken */
        hit->n_hit_blocks = hit->n_hit_tokens = hit->first_hit_block = 0;
        return rc;
    }
    if (pc->level || pc->n_offloaded) /* a use: the policy's rank, the offloaded marks */
        for (size_t i = hit->first_hit_block; i < hit->n_hit_blocks; i++)
            touch(pc, blocks[i], q->priority);
    kvc_prefix_stats_t *s = &pc->stats;
    s->n_lookups++;
    s->n_lookups_hit += hit->n_hit_blocks > 0;
    s->n_query_tokens += q->n_tokens;
    s->n_query_blocks += hit->n_full_blocks;
    s->n_hit_blocks += hit->n_hit_blocks;
    s->n_hit_tokens += hit->n_hit_tokens;
    s->n_miss_blocks += hit->n_full_blocks - hit->n_hit_blocks;
    return 0;
}

/* ---- insertion and eviction ------------------------------------------------ */
/* Hash (or fingerprint) of block `index` of the query, from the query's arrays or computed. */
static int query_chain_at(const kvc_prefix_t *pc, bool fp, const kvc_prefix_query_t *q,
                          size_t index, kvc_hash128_t *out)
{
    const kvc_hash128_t *given = fp ? q->fingerprints : q->hashes;
    if (given) {
        *out = given[index];
        return 0;
    }
    kvc_hash128_t nsd = fp ? ns_fp_digest(pc, query_ns(q)) : ns_digest(pc, query_ns(q)), h = {0, 0};
    extra_t extras[MAX_EXTRA_KEYS];
    for (size_t i = 0; i <= index; i++) {
        int n_extra =
            q->n_mm ? block_extras(q, i, pc->block_size, pc->params.max_extra_keys, extras) : 0;
        if (n_extra < 0) return KVC_ERANGE;
        h = chain_hash(pc, fp, h, nsd, q->tokens + i * pc->block_size, extras, n_extra);
    }
    *out = h;
    return 0;
}

/* The pending block with this exact identity (link.parent may itself be pending), or KVC_NONE.
 * O(pending blocks): the list holds only fetches in flight. */
static uint32_t find_pending(const kvc_prefix_t *pc, kvc_hash128_t h, const link_t *link,
                             const kvc_namespace_t *ns, const kvc_token_t *tokens,
                             const extra_t *extras, int n_extra)
{
    for (uint32_t b = pc->pending_head; b != KVC_NONE; b = pc->entries[b].hnext)
        if (kvc_hash128_eq(pc->entries[b].hash, h) &&
            identity_equal(pc, b, link, ns, tokens, extras, n_extra))
            return b;
    return KVC_NONE;
}

/* Unlink pending block b from the pending list (O(its position): commits come in list order,
 * so usually O(1)). */
static void pending_unlink(kvc_prefix_t *pc, uint32_t b)
{
    uint32_t prev = KVC_NONE, x = pc->pending_head;
    while (x != b) {
        KVC_ASSERT(x != KVC_NONE);
        prev = x;
        x = pc->entries[x].hnext;
    }
    uint32_t next = pc->entries[b].hnext;
    if (prev == KVC_NONE)
        pc->pending_head = next;
    else
        pc->entries[prev].hnext = next;
    if (pc->pending_tail == b) pc->pending_tail = prev;
    pc->entries[b].hnext = KVC_NONE;
    pc->n_pending--;
}

/* kvc_prefix_insert (pending = false) and kvc_prefix_insert_pending (pending = true). */
static int insert_impl(kvc_prefix_t *pc, const kvc_prefix_query_t *q, size_t index, uint32_t parent,
                       uint32_t block, uint32_t *canonical, bool pending)
{
    if (!pc || !query_ok(q)) return KVC_EINVAL;
    const uint32_t bs = pc->block_size;
    if (index >= q->n_tokens >> pc->bs_shift || block >= pc->n_blocks) return KVC_EINVAL;
    if (kvc_pool_refcount(pc->pool, block) == 0) return KVC_EINVAL; /* so block < high water */
    if (is_pending(pc, block)) return KVC_EINVAL; /* it has an identity, not yet committed */
    const kvc_namespace_t *ns = query_ns(q);
    const kvc_token_t *tok = q->tokens + index * bs;
    const bool sliding = is_sliding(pc, ns);
    link_t link = {.parent = KVC_NONE, .sliding = sliding};
    int rc;
    if (sliding) {
        if (index > 0 && (rc = query_chain_at(pc, false, q, index - 1, &link.parent_hash)))
            return rc;
        if ((rc = query_chain_at(pc, true, q, index, &link.fp))) return rc;
    } else if (index == 0) {
        if (parent != KVC_NONE) return KVC_EINVAL;
    } else {
        /* A computed block chains from a committed parent; a fetched one may also chain from a
         * pending parent (a fetched run is a chain), never from one no lookup can reach. */
        const bool parent_ok = is_cached(pc, parent) ? !(pending && pc->entries[parent].unreachable)
                                                     : pending && is_pending(pc, parent);
        if (!parent_ok || pc->entries[parent].sliding) return KVC_EINVAL;
        if (kvc_pool_refcount(pc->pool, parent) == 0) return KVC_EINVAL;
        if (!block_tokens_equal(pc, entry_tokens(pc, parent), tok - bs) ||
            !ns_equal(&pc->ns[parent], ns))
            return KVC_EINVAL;
        if (q->hashes && !kvc_hash128_eq(q->hashes[index - 1], pc->entries[parent].hash))
            return KVC_EINVAL;
        link.parent = parent;
        link.parent_hash = pc->entries[parent].hash;
    }
    extra_t extras[MAX_EXTRA_KEYS];
    int n_extra = q->n_mm ? block_extras(q, index, bs, pc->params.max_extra_keys, extras) : 0;
    if (n_extra < 0) return KVC_ERANGE;
    kvc_hash128_t h =
        q->hashes ? q->hashes[index]
                  : block_hash(pc, link.parent_hash, ns_digest(pc, ns), tok, extras, n_extra);
    /* A computed block wins over a pending copy of the same identity: it is complete now, and
     * the pending one, when committed, resolves to it (kvc_prefix_commit).  So the index is
     * searched exactly as before: pending blocks are not in it. */
    bool collided = false;
    uint32_t found = find_exact(pc, h, &link, ns, tok, extras, n_extra, &collided);
    if (found != KVC_NONE) {
        if (found != block) { /* computed (or fetched) twice: a use of the cached copy */
            pc->stats.n_duplicates++;
            touch(pc, found, q->priority);
        }
        if (canonical) *canonical = found;
        return 0;
    }
    if (is_cached(pc, block)) return KVC_EINVAL; /* cached with another identity */
    if (pending) {
        /* One fetch per identity: a second one would copy the same bytes again. */
        uint32_t other = find_pending(pc, h, &link, ns, tok, extras, n_extra);
        if (other != KVC_NONE) {
            if (canonical) *canonical = other;
            return KVC_EBUSY;
        }
        /* The fence's own reference: the block can be neither evicted nor reallocated until
         * it is committed or aborted, whatever its fetcher releases meanwhile. */
        if ((rc = kvc_pool_ref(pc->pool, block))) return rc;
    }
    entries_upto(pc, block);
    entry_t *e = &pc->entries[block];
    /* Below a block no lookup can reach (naive eviction stranded it), nothing can be reached.
     * (A pending block takes its parent's mark when committed.) */
    const bool unreachable =
        !pending && link.parent != KVC_NONE && pc->entries[link.parent].unreachable;
    *e = (entry_t){.hash = h,
                   .hnext = KVC_NONE,
                   .parent = link.parent,
                   .cached = !pending,
                   .sliding = sliding,
                   .unreachable = unreachable,
                   .pending = pending,
                   .n_extra = (uint8_t)n_extra,
                   .uses = 1, /* its first use */
                   .priority = (uint8_t)q->priority};
    block_tokens_copy(pc, entry_tokens(pc, block), tok);
    pc->ns[block] = *ns;
    pc->phash[block] = link.parent_hash;
    if (sliding) pc->fp[block] = link.fp;
    if (n_extra) memcpy(entry_extras(pc, block), extras, (size_t)n_extra * sizeof(extra_t));
    if (link.parent != KVC_NONE) pc->entries[link.parent].n_children++;
    if (canonical) *canonical = block;
    if (pending) { /* on the pending list, at its tail: after its parent */
        if (pc->pending_tail == KVC_NONE)
            pc->pending_head = block;
        else
            pc->entries[pc->pending_tail].hnext = block;
        pc->pending_tail = block;
        pc->n_pending++;
        return 0; /* no event: nothing can be matched yet */
    }
    uint32_t *head = bucket_slot(pc, bucket_of(pc, h));
    e->hnext = *head;
    *head = block;
    pc->n_cached++;
    pc->n_unreachable += unreachable;
    pc->stats.n_strandings += unreachable;
    pc->stats.n_inserts++;
    if (pc->level) (void)kvc__pool_set_level(pc->pool, block, pc->level(e));
    rc = kvc__pool_set_cached(pc->pool, block, true);
    KVC_ASSERT(rc == 0);               /* block < n_blocks, checked above */
    emit(pc, KVC_EVENT_STORED, block); /* last: the callback may pin the block for copy */
    return 0;
}

int kvc_prefix_insert(kvc_prefix_t *pc, const kvc_prefix_query_t *q, size_t index, uint32_t parent,
                      uint32_t block, uint32_t *canonical)
{
    return insert_impl(pc, q, index, parent, block, canonical, false);
}

int kvc_prefix_insert_pending(kvc_prefix_t *pc, const kvc_prefix_query_t *q, size_t index,
                              uint32_t parent, uint32_t block, uint32_t *canonical)
{
    return insert_impl(pc, q, index, parent, block, canonical, true);
}

int kvc_prefix_commit(kvc_prefix_t *pc, uint32_t block, uint32_t *canonical)
{
    if (!pc || block >= pc->n_blocks) return KVC_EINVAL;
    if (!is_pending(pc, block)) return KVC_ENOENT;
    entry_t *e = &pc->entries[block];
    const uint32_t parent = e->parent;
    /* Root first: a committed block below a pending one could be matched only through it, and
     * would be stranded if that one were aborted. */
    if (parent != KVC_NONE && !is_cached(pc, parent)) {
        KVC_ASSERT(is_pending(pc, parent)); /* a parent with children is never dropped */
        return KVC_EBUSY;
    }
    link_t link = {.parent = parent,
                   .parent_hash = pc->phash[block],
                   .fp = e->sliding ? pc->fp[block] : (kvc_hash128_t){0, 0},
                   .sliding = e->sliding};
    bool collided = false;
    uint32_t found = find_exact(pc, e->hash, &link, &pc->ns[block], entry_tokens(pc, block),
                                entry_extras(pc, block), e->n_extra, &collided);
    pending_unlink(pc, block);
    pc->stats.n_commits++;
    int rc;
    if (found != KVC_NONE) {
        /* Computed (or committed) meanwhile: that copy is the block, this one's identity goes.
         * Its pending children chain from the same hash, so they move to the canonical block. */
        for (uint32_t x = pc->pending_head; x != KVC_NONE; x = pc->entries[x].hnext)
            if (pc->entries[x].parent == block) {
                pc->entries[x].parent = found;
                pc->entries[found].n_children++;
            }
        if (parent != KVC_NONE) pc->entries[parent].n_children--;
        const uint32_t priority = e->priority;
        *e = (entry_t){.hnext = KVC_NONE, .parent = KVC_NONE};
        pc->stats.n_duplicates++;
        touch(pc, found, priority);
        rc = kvc_pool_unref(pc->pool, block); /* the fence's reference */
        KVC_ASSERT(rc == 0);
        if (canonical) *canonical = found;
        return 0;
    }
    e->pending = 0;
    e->cached = 1;
    e->unreachable = parent != KVC_NONE && pc->entries[parent].unreachable;
    uint32_t *head = bucket_slot(pc, bucket_of(pc, e->hash));
    e->hnext = *head;
    *head = block;
    pc->n_cached++;
    pc->n_unreachable += e->unreachable;
    pc->stats.n_strandings += e->unreachable;
    pc->stats.n_inserts++;
    if (pc->level) (void)kvc__pool_set_level(pc->pool, block, pc->level(e));
    rc = kvc__pool_set_cached(pc->pool, block, true);
    KVC_ASSERT(rc == 0);
    /* Marked cached before the fence's reference goes, so that a block its fetcher already
     * released joins the free queue as a cached block. */
    rc = kvc_pool_unref(pc->pool, block);
    KVC_ASSERT(rc == 0);
    if (canonical) *canonical = block;
    emit(pc, KVC_EVENT_STORED, block); /* last: the callback may pin the block for copy */
    return 0;
}

int kvc_prefix_abort(kvc_prefix_t *pc, uint32_t block, uint32_t *n_aborted)
{
    if (!pc || block >= pc->n_blocks) return KVC_EINVAL;
    if (!is_pending(pc, block)) return KVC_ENOENT;
    /* The block and every pending block below it: the list has parents before children, so
     * one pass from the block marks them all. */
    const uint32_t parent = pc->entries[block].parent;
    if (parent != KVC_NONE) pc->entries[parent].n_children--;
    pc->entries[block].doomed = 1;
    uint32_t prev = KVC_NONE, x = pc->pending_head, n = 0;
    uint32_t doomed = KVC_NONE, doomed_tail = KVC_NONE; /* unlinked, chained through hnext */
    bool seen = false;
    while (x != KVC_NONE) {
        entry_t *e = &pc->entries[x];
        const uint32_t next = e->hnext;
        seen |= x == block;
        if (seen && !e->doomed && e->parent != KVC_NONE && pc->entries[e->parent].doomed)
            e->doomed = 1;
        if (!e->doomed) {
            prev = x;
            x = next;
            continue;
        }
        if (prev == KVC_NONE)
            pc->pending_head = next;
        else
            pc->entries[prev].hnext = next;
        if (pc->pending_tail == x) pc->pending_tail = prev;
        e->hnext = KVC_NONE;
        if (doomed_tail == KVC_NONE)
            doomed = x;
        else
            pc->entries[doomed_tail].hnext = x;
        doomed_tail = x;
        x = next;
        n++;
    }
    /* Now reset them (a child was marked by reading its parent's mark, so not before). */
    while (doomed != KVC_NONE) {
        const uint32_t next = pc->entries[doomed].hnext;
        pc->entries[doomed] = (entry_t){.hnext = KVC_NONE, .parent = KVC_NONE};
        int rc = kvc_pool_unref(pc->pool, doomed); /* the fence's reference */
        KVC_ASSERT(rc == 0);
        doomed = next;
    }
    pc->n_pending -= n;
    pc->stats.n_aborts += n;
    if (n_aborted) *n_aborted = n;
    return 0;
}

/* ---- pins for copy ------------------------------------------------------------ */
static void copy_pin(kvc_prefix_t *pc, uint32_t b)
{
    pc->entries[b].copying = 1;
    pc->n_copying++;
    pc->stats.n_copies_begun++;
}

int kvc_prefix_offload_begin(kvc_prefix_t *pc, uint32_t n, uint32_t *blocks, uint32_t *n_out)
{
    if (!pc || !n_out || (n && !blocks)) return KVC_EINVAL;
    uint32_t got = 0;
    /* The free cached blocks in the pool's eviction order, as kvc_pool_alloc would take them:
     * leaves only (but under naive-lru), the blocks pinned or offloaded already skipped. */
    for (uint32_t b = n ? kvc__pool_free_cached_first(pc->pool) : KVC_NONE;
         got < n && b != KVC_NONE;) {
        uint32_t next;
        int rc = kvc__pool_free_next(pc->pool, b, &next);
        KVC_ASSERT(rc == 0); /* b came from the queue */
        const entry_t *e = &pc->entries[b];
        KVC_ASSERT(is_cached(pc, b));
        if (!e->copying && !e->offloaded && (e->n_children == 0 || pc->policy->strands)) {
            copy_pin(pc, b);
            blocks[got++] = b;
        }
        b = next;
    }
    *n_out = got;
    return 0;
}

int kvc_prefix_pin_for_copy(kvc_prefix_t *pc, uint32_t block)
{
    if (!pc) return KVC_EINVAL;
    if (!is_cached(pc, block)) return KVC_ENOENT;
    if (pc->entries[block].copying) return KVC_EBUSY;
    copy_pin(pc, block);
    return 0;
}

int kvc_prefix_offload_end(kvc_prefix_t *pc, uint32_t block, bool copied)
{
    if (!pc) return KVC_EINVAL;
    if (!is_cached(pc, block) || !pc->entries[block].copying) return KVC_ENOENT;
    entry_t *e = &pc->entries[block];
    e->copying = 0;
    pc->n_copying--;
    if (copied) {
        pc->stats.n_copies_done++;
        if (!e->offloaded) {
            e->offloaded = 1;
            pc->n_offloaded++;
        }
    } else {
        pc->stats.n_copies_failed++;
    }
    /* Its place in the free queue never changed (a pin for copy is the evictor's refusal, not a
     * reference), so it is evicted exactly when it would have been. */
    return 0;
}

uint32_t kvc_prefix_block_flags(const kvc_prefix_t *pc, uint32_t block)
{
    if (!pc || block >= pc->hw) return 0;
    const entry_t *e = &pc->entries[block];
    return (e->cached ? KVC_PREFIX_BLOCK_CACHED : 0u) |
           (e->pending ? KVC_PREFIX_BLOCK_PENDING : 0u) |
           (e->copying ? KVC_PREFIX_BLOCK_COPYING : 0u) |
           (e->offloaded ? KVC_PREFIX_BLOCK_OFFLOADED : 0u);
}

int kvc_prefix_evict(kvc_prefix_t *pc, uint32_t n, uint32_t *n_evicted)
{
    if (!pc) return KVC_EINVAL;
    uint32_t done = 0;
    uint32_t b = kvc__pool_free_cached_first(pc->pool);
    while (done < n && b != KVC_NONE) {
        uint32_t next;
        int rc = kvc__pool_free_next(pc->pool, b, &next);
        KVC_ASSERT(rc == 0); /* b came from the queue */
        if (evict_one(pc, b) == 0) {
            rc = kvc__pool_set_cached(pc->pool, b, false); /* moves it to the uncached run */
            KVC_ASSERT(rc == 0);
            done++;
        }
        b = next;
    }
    if (n_evicted) *n_evicted = done;
    return 0;
}

/* ---- introspection ------------------------------------------------------------ */
int kvc_prefix_block_hash(const kvc_prefix_t *pc, uint32_t block, kvc_hash128_t *hash)
{
    if (!pc || !hash) return KVC_EINVAL;
    if (!is_cached(pc, block)) return KVC_ENOENT;
    *hash = pc->entries[block].hash;
    return 0;
}

uint32_t kvc_prefix_block_parent(const kvc_prefix_t *pc, uint32_t block)
{
    /* a stranded block's parent is gone */
    return is_cached(pc, block) && pc->entries[block].parent < pc->n_blocks
               ? pc->entries[block].parent
               : KVC_NONE;
}

const kvc_token_t *kvc_prefix_block_tokens(const kvc_prefix_t *pc, uint32_t block)
{
    return is_cached(pc, block) ? entry_tokens(pc, block) : NULL;
}

void kvc_prefix_stats(const kvc_prefix_t *pc, kvc_prefix_stats_t *out)
{
    *out = pc->stats;
    out->n_cached_blocks = pc->n_cached;
    kvc_pool_stats_t ps;
    kvc_pool_stats(pc->pool, &ps);
    out->n_cached_free = ps.n_free_cached;
    out->n_stranded_blocks = pc->n_unreachable;
    out->n_pending = pc->n_pending;
    out->n_copy_pinned = pc->n_copying;
    out->n_offloaded = pc->n_offloaded;
    out->n_stranded_bytes = (uint64_t)pc->n_unreachable * kvc_pool_block_bytes(pc->pool);
}

kvc_eviction_t kvc_prefix_eviction(const kvc_prefix_t *pc)
{
    return pc->params.eviction;
}

/* ---- eviction policies by name ---------------------------------------------------- */
const char *kvc_eviction_name(kvc_eviction_t p)
{
    return (unsigned)p < KVC_EVICT__COUNT ? policies[p].name : "?";
}

const char *kvc_eviction_summary(kvc_eviction_t p)
{
    return (unsigned)p < KVC_EVICT__COUNT ? policies[p].summary : "?";
}

int kvc_eviction_parse(const char *name, kvc_eviction_t *out)
{
    if (!name || !out) return KVC_EINVAL;
    for (int p = 0; p < KVC_EVICT__COUNT; p++)
        if (strcmp(name, policies[p].name) == 0) return *out = (kvc_eviction_t)p, 0;
    return KVC_EINVAL;
}

const char *const *kvc_eviction_names(void)
{
    static const char *const names[] = {
#define KVC__POLICY_NAME(id, name, summary) name,
        KVC_EVICTION_MAP(KVC__POLICY_NAME)
#undef KVC__POLICY_NAME
            NULL};
    return names;
}

/* ---- invariants ------------------------------------------------------------- */
#define fail(msg, cap, ...) kvc__msgf(KVC_ECORRUPT, msg, cap, __VA_ARGS__)

/* The hash block b's stored identity chains to, from its stored parent hash. */
static kvc_hash128_t recompute(const kvc_prefix_t *pc, uint32_t b)
{
    const entry_t *e = &pc->entries[b];
    return block_hash(pc, pc->phash[b], ns_digest(pc, &pc->ns[b]), entry_tokens(pc, b),
                      entry_extras(pc, b), e->n_extra);
}

/* A full-attention entry's link to its parent is sound: the parent is cached and holds the
 * hash this one chains from (a root chains from zero). */
static bool link_sound(const kvc_prefix_t *pc, uint32_t b)
{
    const entry_t *e = &pc->entries[b];
    kvc_hash128_t ph = pc->phash[b];
    if (e->parent == KVC_NONE) return ph.lo == 0 && ph.hi == 0;
    if (!is_cached(pc, e->parent)) return false; /* STRANDED included */
    const entry_t *p = &pc->entries[e->parent];
    return !p->sliding && kvc_hash128_eq(p->hash, ph);
}

/* A pending full-attention block's link: its parent (cached or pending) holds the hash it chains
 * from (a root chains from zero). */
static bool pending_link_sound(const kvc_prefix_t *pc, uint32_t b)
{
    const entry_t *e = &pc->entries[b];
    kvc_hash128_t ph = pc->phash[b];
    if (e->parent == KVC_NONE) return ph.lo == 0 && ph.hi == 0;
    const entry_t *p = &pc->entries[e->parent];
    return !p->sliding && kvc_hash128_eq(p->hash, ph);
}

/* Block b, taken alone, may be on a reachable path: cached, its stored hash chaining from its
 * identity, and its link to its parent sound. */
static bool block_sound(const kvc_prefix_t *pc, uint32_t b)
{
    return is_cached(pc, b) && link_sound(pc, b) &&
           kvc_hash128_eq(recompute(pc, b), pc->entries[b].hash);
}

uint32_t kvc_prefix_count_stranded(const kvc_prefix_t *pc)
{
    /* A cached block is reachable iff it is sound and its parent is reachable (a sound root
     * is).  Computed from the structure alone, so that it can check the counter kept for the
     * stats, and in linear time: each block's verdict is kept in the pool's checker scratch,
     * so every block is hashed once however deep the prefixes (200K-token prompts make
     * chains of thousands of blocks).  A parent link that loops is unreachable. */
    enum { UNKNOWN = 0, REACHABLE, UNREACHABLE, VISITING };
    if (!pc->hw) return 0;
    uint32_t *state = kvc__pool_check_scratch(pc->pool); /* never allocates: see pool_int.h */
    memset(state, 0, pc->hw * sizeof *state);
    for (uint32_t b = 0; b < pc->hw; b++) {
        if (!pc->entries[b].cached || pc->entries[b].sliding || state[b] != UNKNOWN) continue;
        /* Up the ancestry until a root, a block already decided, or a broken link. */
        uint32_t x = b, verdict = REACHABLE;
        for (;;) {
            if (!block_sound(pc, x)) {
                state[x] = verdict = UNREACHABLE; /* x is cached: b, or a sound link's parent */
                break;
            }
            state[x] = VISITING;
            const uint32_t p = pc->entries[x].parent; /* cached: link_sound held */
            if (p == KVC_NONE) break;
            if (state[p] != UNKNOWN) {
                verdict = state[p] == VISITING ? UNREACHABLE : state[p];
                break;
            }
            x = p;
        }
        /* Down again: the path shares the verdict. */
        for (x = b; x < pc->hw && state[x] == VISITING; x = pc->entries[x].parent)
            state[x] = verdict;
    }
    uint32_t stranded = 0;
    for (uint32_t b = 0; b < pc->hw; b++)
        stranded += pc->entries[b].cached && !pc->entries[b].sliding && state[b] == UNREACHABLE;
    return stranded;
}

int kvc_prefix_check(const kvc_prefix_t *pc, char *msg, size_t cap)
{
    if (!pc) return KVC_EINVAL;
    int rc = kvc_pool_check(pc->pool, msg, cap);
    if (rc) return rc;
    const bool strands = pc->policy->strands;
    uint32_t n_cached = 0, n_unreachable = 0, n_pending = 0, n_copying = 0, n_offloaded = 0;
    /* Chains: every entry in a chain is cached, in the right bucket, and appears once. */
    uint32_t in_chains = 0;
    for (uint32_t k = 0; k <= pc->bucket_mask; k++) {
        if (!pc->bucket_ready[k >> CHUNK_SHIFT]) {
            k |= (1u << CHUNK_SHIFT) - 1; /* a whole chunk never used: empty */
            continue;
        }
        for (uint32_t b = pc->buckets[k]; b != KVC_NONE; b = pc->entries[b].hnext) {
            if (b >= pc->hw) return fail(msg, cap, "bucket %u: bad block id %u", k, b);
            if (pc->entries[b].pending)
                return fail(msg, cap, "pending block %u is in the index (matchable) in bucket %u",
                            b, k);
            if (!pc->entries[b].cached)
                return fail(msg, cap, "uncached block %u in bucket %u", b, k);
            if (bucket_of(pc, pc->entries[b].hash) != k)
                return fail(msg, cap, "block %u is in bucket %u, its hash says another", b, k);
            if (++in_chains > pc->hw) return fail(msg, cap, "hash chains: cycle");
        }
    }
    const uint32_t pool_hw = kvc__pool_high_water(pc->pool);
    for (uint32_t b = pc->hw; b < pool_hw; b++)
        if (kvc_pool_is_cached(pc->pool, b))
            return fail(msg, cap, "block %u: cache says uncached, pool says cached", b);
    for (uint32_t b = 0; b < pc->hw; b++) {
        const entry_t *e = &pc->entries[b];
        bool pool_cached = kvc_pool_is_cached(pc->pool, b);
        if (!!e->cached != pool_cached)
            return fail(msg, cap, "block %u: cache says %s, pool says %s", b,
                        e->cached ? "cached" : "uncached", pool_cached ? "cached" : "uncached");
        if (e->doomed) return fail(msg, cap, "block %u: abort's scratch mark left set", b);
        if (e->pending) {
            n_pending++;
            if (e->cached) return fail(msg, cap, "block %u is both pending and committed", b);
            if (e->copying || e->offloaded || e->unreachable)
                return fail(msg, cap, "pending block %u has copy or reachability marks", b);
            if (kvc_pool_refcount(pc->pool, b) == 0)
                return fail(msg, cap, "pending block %u has no reference (its fence's)", b);
            if (!!e->sliding != is_sliding(pc, &pc->ns[b]))
                return fail(msg, cap, "pending block %u: sliding mark disagrees", b);
            if (e->sliding ? e->parent != KVC_NONE || e->n_children
                           : e->parent != KVC_NONE && !is_cached(pc, e->parent) &&
                                 !is_pending(pc, e->parent))
                return fail(msg, cap, "pending block %u: parent %u is neither cached nor pending",
                            b, e->parent);
            if (!e->sliding && !pending_link_sound(pc, b))
                return fail(msg, cap, "pending block %u: parent hash does not match its parent", b);
            if (!kvc_hash128_eq(recompute(pc, b), e->hash))
                return fail(msg, cap,
                            "pending block %u: stored hash does not chain from its identity", b);
            continue;
        }
        if (!e->cached) {
            if (e->n_children)
                return fail(msg, cap, "uncached block %u has %u children", b, e->n_children);
            if (e->copying || e->offloaded)
                return fail(msg, cap, "uncached block %u is marked for copy or offloaded", b);
            continue;
        }
        n_cached++;
        n_copying += e->copying;
        n_offloaded += e->offloaded;
        n_unreachable += e->unreachable;
        if (!!e->sliding != is_sliding(pc, &pc->ns[b]))
            return fail(msg, cap, "block %u: sliding mark disagrees with its group", b);
        if (e->uses == 0) return fail(msg, cap, "cached block %u has never been used", b);
        if (e->priority > KVC_PREFIX_MAX_PRIORITY)
            return fail(msg, cap, "block %u: priority %u out of range", b, e->priority);
        if (pc->level && kvc__pool_level(pc->pool, b) != pc->level(e))
            return fail(msg, cap, "block %u: queue level %u, the %s policy says %u", b,
                        kvc__pool_level(pc->pool, b), kvc_eviction_name(pc->params.eviction),
                        pc->level(e));
        if (e->sliding) {
            if (e->parent != KVC_NONE || e->n_children || e->unreachable)
                return fail(msg, cap, "sliding-window block %u has parent links", b);
        } else if (e->parent == STRANDED) {
            if (!strands)
                return fail(msg, cap, "block %u: stranded (its parent was evicted under it)", b);
            if (!e->unreachable) return fail(msg, cap, "stranded block %u not counted", b);
        } else if (e->parent != KVC_NONE) {
            if (!is_cached(pc, e->parent))
                return fail(msg, cap, "block %u: parent %u is not cached (stranded)", b, e->parent);
            if (!ns_equal(&pc->ns[e->parent], &pc->ns[b]))
                return fail(msg, cap, "block %u: namespace differs from its parent's", b);
            if (e->unreachable != pc->entries[e->parent].unreachable)
                return fail(msg, cap, "block %u: %s below a%s block", b,
                            e->unreachable ? "unreachable" : "reachable",
                            e->unreachable ? " reachable" : "n unreachable");
        } else if (e->unreachable) {
            return fail(msg, cap, "root block %u counted unreachable", b);
        }
        if (!e->sliding && e->parent != STRANDED && !link_sound(pc, b))
            return fail(msg, cap, "block %u: parent hash does not match its parent", b);
        if (!kvc_hash128_eq(recompute(pc, b), e->hash))
            return fail(msg, cap, "block %u: stored hash does not chain from its identity", b);
    }
    if (n_cached != in_chains || n_cached != pc->n_cached)
        return fail(msg, cap, "%u cached blocks, %u in chains, counter says %u", n_cached,
                    in_chains, pc->n_cached);
    if (n_copying != pc->n_copying || n_offloaded != pc->n_offloaded)
        return fail(msg, cap, "%u blocks pinned for copy and %u offloaded, counters say %u, %u",
                    n_copying, n_offloaded, pc->n_copying, pc->n_offloaded);
    /* The pending list: exactly the pending blocks, each after its pending parent. */
    {
        uint32_t *order = kvc__pool_check_scratch(pc->pool), pos = 0, last = KVC_NONE;
        if (pc->hw) memset(order, 0, pc->hw * sizeof *order);
        for (uint32_t b = pc->pending_head; b != KVC_NONE; b = pc->entries[b].hnext) {
            if (b >= pc->hw || !pc->entries[b].pending)
                return fail(msg, cap, "pending list holds block %u, not pending", b);
            if (order[b]) return fail(msg, cap, "pending list: cycle at block %u", b);
            order[b] = ++pos;
            const uint32_t p = pc->entries[b].parent;
            if (p != KVC_NONE && is_pending(pc, p) && (order[p] == 0 || order[p] >= pos))
                return fail(msg, cap, "pending block %u is listed before its pending parent %u", b,
                            p);
            last = b;
        }
        if (pos != n_pending || pos != pc->n_pending)
            return fail(msg, cap, "%u pending blocks, %u listed, counter says %u", n_pending, pos,
                        pc->n_pending);
        if (last != pc->pending_tail)
            return fail(msg, cap, "pending list: tail is %u, the last block %u", pc->pending_tail,
                        last);
    }
    if (n_unreachable != pc->n_unreachable)
        return fail(msg, cap, "%u unreachable blocks, counter says %u", n_unreachable,
                    pc->n_unreachable);
    uint32_t structural = kvc_prefix_count_stranded(pc);
    if (structural != n_unreachable)
        return fail(msg, cap, "%u blocks cannot be reached, %u are marked so", structural,
                    n_unreachable);
    /* Exactly one reachable cached block per identity, and the index finds it.  (Unreachable
     * blocks may repeat an identity: none of them can be found.) */
    for (uint32_t b = 0; b < pc->hw; b++) {
        const entry_t *e = &pc->entries[b];
        if (!e->cached || e->unreachable) continue;
        bool collided = false;
        link_t link = {.parent = e->parent,
                       .parent_hash = pc->phash[b],
                       .sliding = e->sliding,
                       .fp = e->sliding ? pc->fp[b] : (kvc_hash128_t){0, 0}};
        uint32_t f = find_exact(pc, e->hash, &link, &pc->ns[b], entry_tokens(pc, b),
                                entry_extras(pc, b), e->n_extra, &collided);
        if (f != b) return fail(msg, cap, "block %u: the index finds %u for its identity", b, f);
    }
    /* Child counts, exactly: count again from the children's side. */
    if (!pc->hw) return 0;
    uint32_t *counted = kvc__pool_check_scratch(pc->pool);
    KVC_ASSERT(pc->hw <= kvc_pool_n_blocks(pc->pool));
    memset(counted, 0, pc->hw * sizeof *counted);
    for (uint32_t b = 0; b < pc->hw; b++)
        if ((pc->entries[b].cached || pc->entries[b].pending) && pc->entries[b].parent < pc->hw)
            counted[pc->entries[b].parent]++;
    for (uint32_t b = 0; b < pc->hw; b++) {
        if (counted[b] != pc->entries[b].n_children) {
            uint32_t want = counted[b];
            return fail(msg, cap, "block %u: %u cached children, counter says %u", b, want,
                        pc->entries[b].n_children);
        }
    }
    return 0;
}
