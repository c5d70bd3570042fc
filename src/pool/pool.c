/* pool.c - the fixed set of KV blocks: refcounts, the free queue and the
 * storage behind the blocks.  See include/kvcache/pool.h for the queue's
 * shape; the prefix layer above decides identity and eviction levels through
 * src/pool/pool_int.h.
 *
 * Memory proportional to use: blocks [hw, n_blocks) have never been handed
 * out.  They are free and uncached, sit in the queue right after the `early`
 * run, and their block_t has never been written (the array comes from
 * kvc_alloc, so with the C library its pages stay untouched until then). */
#include "pool/pool_int.h"
#include "util/msg.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

enum {
    BLOCK_CACHED = 1u << 0,
    BLOCK_EARLY = 1u << 1, /* in the early run (see below) */
};

typedef struct {
    kvc_list_t link; /* in the free queue iff refcount == 0 */
    uint32_t refcount;
    uint8_t flags;
    uint8_t level; /* eviction level while cached, < KVC__POOL_LEVELS */
    uint16_t pad;
} block_t;

/* The free queue is a sequence of segments, walked in this order:
 *   early:     blocks below hw initialised out of turn (a never-used block pinned or marked by id
 *              makes every fresh block before it explicit, in order, so the queue's order is
 *              exactly what it would have been with every block initialised up front)
 *   fresh:     the implicit run [hw, n_blocks), never touched
 *   uncached:  freed uncached blocks, oldest first
 *   cached[L]: free cached blocks of level L, least recently freed first. */
enum { SEG_EARLY, SEG_FRESH, SEG_UNCACHED, SEG_CACHED0, N_SEGS = SEG_CACHED0 + KVC__POOL_LEVELS };

struct kvc_pool {
    kvc_pool_params_t params;
    size_t block_bytes; /* 0: metadata only */
    size_t kv_bytes;    /* one (layer, kv) slab: n_kv_heads * block_size * head_dim * dtype */
    uint8_t *storage;   /* (n_blocks, block_bytes) */
    block_t *blocks;    /* (n_blocks); only [0, hw) ever written */
    uint32_t hw;        /* high-water mark: blocks [0, hw) are initialised */
    uint32_t *scratch;  /* (n_blocks) for the checkers above: kvc__pool_check_scratch */
    kvc_list_t early, uncached;
    kvc_list_t cached[KVC__POOL_LEVELS];
    uint64_t levels_used; /* bit L set iff cached[L] is not empty */
    uint32_t n_free;      /* every free block, the fresh ones included */
    uint32_t n_free_cached;
    kvc__evict_fn evict;
    void *evict_ctx;
    uint64_t n_allocated, n_evicted, n_alloc_failed;
};

_Static_assert(KVC__POOL_LEVELS <= 64, "levels_used is a 64-bit mask");

/* ---- dtypes -------------------------------------------------------------- */
static const struct {
    const char *name;
    size_t bytes;
} dtypes[KVC_DTYPE__COUNT] = {
    [KVC_DTYPE_F32] = {"f32", 4},           [KVC_DTYPE_F16] = {"f16", 2},
    [KVC_DTYPE_BF16] = {"bf16", 2},         [KVC_DTYPE_FP8_E4M3] = {"fp8-e4m3", 1},
    [KVC_DTYPE_FP8_E5M2] = {"fp8-e5m2", 1},
};

size_t kvc_dtype_bytes(kvc_dtype_t dt)
{
    return (unsigned)dt < KVC_DTYPE__COUNT ? dtypes[dt].bytes : 0;
}

const char *kvc_dtype_name(kvc_dtype_t dt)
{
    return (unsigned)dt < KVC_DTYPE__COUNT ? dtypes[dt].name : "?";
}

int kvc_dtype_parse(const char *name, kvc_dtype_t *out)
{
    static const struct {
        const char *alias;
        kvc_dtype_t dt;
    } aliases[] = {{"fp32", KVC_DTYPE_F32},          {"float32", KVC_DTYPE_F32},
                   {"fp16", KVC_DTYPE_F16},          {"float16", KVC_DTYPE_F16},
                   {"bfloat16", KVC_DTYPE_BF16},     {"fp8", KVC_DTYPE_FP8_E4M3},
                   {"fp8_e4m3", KVC_DTYPE_FP8_E4M3}, {"fp8_e5m2", KVC_DTYPE_FP8_E5M2}};
    if (!name || !out) return KVC_EINVAL;
    for (int i = 0; i < KVC_DTYPE__COUNT; i++)
        if (strcmp(name, dtypes[i].name) == 0) return *out = (kvc_dtype_t)i, 0;
    for (size_t i = 0; i < KVC_ARRAY_LEN(aliases); i++)
        if (strcmp(name, aliases[i].alias) == 0) return *out = aliases[i].dt, 0;
    return KVC_EINVAL;
}

/* ---- creation ------------------------------------------------------------ */
kvc_pool_params_t kvc_pool_params_default(void)
{
    return (kvc_pool_params_t){.n_blocks = 1024, .block_size = 16};
}

static bool storage_is_empty(const kvc_storage_desc_t *s)
{
    return s->n_layers == 0 && s->n_kv_heads == 0 && s->head_dim == 0 && s->scale_bytes == 0;
}

/* Bytes per block and per (layer, kv) slab; KVC_EINVAL/EOVERFLOW for bad descriptors. */
static int storage_sizes(const kvc_storage_desc_t *s, uint32_t block_size, size_t *block_bytes,
                         size_t *kv_bytes)
{
    *block_bytes = *kv_bytes = 0;
    if (storage_is_empty(s)) return 0;
    uint32_t n_kv = s->n_kv ? s->n_kv : 2;
    if (s->n_layers == 0 || s->n_kv_heads == 0 || s->head_dim == 0 || n_kv > 2) return KVC_EINVAL;
    size_t el = kvc_dtype_bytes(s->dtype);
    if (el == 0) return KVC_EINVAL;
    /* Each factor is < 2^32; check the products stay below 2^62. */
    kvc__u128 slab = (kvc__u128)s->n_kv_heads * block_size * s->head_dim * el;
    kvc__u128 total = slab * s->n_layers * n_kv + s->scale_bytes;
    total = (total + 63) & ~(kvc__u128)63;
    if (total > ((kvc__u128)1 << 62)) return KVC_EOVERFLOW;
    *kv_bytes = (size_t)slab;
    *block_bytes = (size_t)total;
    return 0;
}

/* Zeroed block storage.  With the C library's allocator, large storage is 2 MiB aligned and
 * asks for transparent huge pages: a paged cache reads small runs at scattered addresses,
 * and with 4 KiB pages every block costs a TLB miss (the attention benchmark measured
 * 10-20% on paged rows).  A caller's allocator gets plain 64-byte alignment. */
static uint8_t *alloc_storage(const kvc_allocator_t *a, size_t bytes)
{
    const size_t huge = (size_t)2 << 20;
    bool default_alloc = !a || !a->alloc;
    uint8_t *p = kvc_alloc(a, bytes, default_alloc && bytes >= 2 * huge ? huge : 64);
    if (!p) return NULL;
#ifdef MADV_HUGEPAGE
    if (default_alloc && bytes >= 2 * huge) (void)madvise(p, bytes / huge * huge, MADV_HUGEPAGE);
#endif
    memset(p, 0, bytes);
    return p;
}

int kvc_storage_block_bytes(const kvc_storage_desc_t *desc, uint32_t block_size, size_t *bytes)
{
    if (!desc || !bytes || block_size == 0) return KVC_EINVAL;
    size_t kv_bytes;
    return storage_sizes(desc, block_size, bytes, &kv_bytes);
}

int kvc_pool_create(const kvc_pool_params_t *params, kvc_pool_t **out)
{
    if (!params || !out) return KVC_EINVAL;
    *out = NULL;
    const kvc_pool_params_t *p = params;
    if (p->n_blocks == 0 || p->n_blocks > (1u << 31)) return KVC_EINVAL;
    if (p->block_size == 0 || p->block_size > 256 || (p->block_size & (p->block_size - 1)))
        return KVC_EINVAL;
    size_t block_bytes, kv_bytes;
    int rc = storage_sizes(&p->storage, p->block_size, &block_bytes, &kv_bytes);
    if (rc) return rc;
    if (block_bytes && (kvc__u128)block_bytes * p->n_blocks > ((kvc__u128)1 << 62))
        return KVC_EOVERFLOW;

    const kvc_allocator_t *a = &p->allocator;
    kvc_pool_t *pool = kvc_calloc(a, 1, sizeof *pool, 0);
    if (!pool) return KVC_ENOMEM;
    pool->params = *p;
    if (pool->params.storage.n_layers && pool->params.storage.n_kv == 0)
        pool->params.storage.n_kv = 2;
    pool->block_bytes = block_bytes;
    pool->kv_bytes = kv_bytes;
    /* Not zeroed, never written beyond the high-water mark: see the banner. */
    pool->blocks = kvc_alloc(a, (size_t)p->n_blocks * sizeof(block_t), 64);
    if (!pool->blocks) goto oom;
    /* Reserved now so that the invariant checkers never allocate (they run under injected
     * faults and inside runs whose memory is watched); only [0, hw) is ever touched. */
    pool->scratch = kvc_alloc(a, (size_t)p->n_blocks * sizeof(uint32_t), 64);
    if (!pool->scratch) goto oom;
    if (block_bytes) {
        pool->storage = alloc_storage(a, (size_t)p->n_blocks * block_bytes);
        if (!pool->storage) goto oom;
    }
    kvc_list_init(&pool->early);
    kvc_list_init(&pool->uncached);
    for (int l = 0; l < KVC__POOL_LEVELS; l++) kvc_list_init(&pool->cached[l]);
    pool->n_free = p->n_blocks;
    *out = pool;
    return 0;
oom:
    kvc_free(a, pool->scratch);
    kvc_free(a, pool->blocks);
    kvc_free(a, pool);
    return KVC_ENOMEM;
}

int kvc_pool_metadata_bytes(const kvc_pool_params_t *params, size_t *reserved, size_t *per_block)
{
    if (!params || params->n_blocks == 0 || params->n_blocks > (1u << 31)) return KVC_EINVAL;
    const size_t per = sizeof(block_t) + sizeof(uint32_t); /* + the checkers' scratch */
    if (reserved) *reserved = sizeof(kvc_pool_t) + (size_t)params->n_blocks * per;
    if (per_block) *per_block = per;
    return 0;
}

void kvc_pool_destroy(kvc_pool_t *pool)
{
    if (!pool) return;
    kvc_allocator_t a = pool->params.allocator;
    kvc_free(&a, pool->storage);
    kvc_free(&a, pool->scratch);
    kvc_free(&a, pool->blocks);
    kvc_free(&a, pool);
}

uint32_t *kvc__pool_check_scratch(const kvc_pool_t *pool)
{
    return pool ? pool->scratch : NULL;
}

void kvc__pool_set_evictor(kvc_pool_t *pool, kvc__evict_fn fn, void *ctx)
{
    if (!pool) return;
    pool->evict = fn;
    pool->evict_ctx = ctx;
}

/* ---- the free queue ------------------------------------------------------- */
static inline uint32_t block_id(const kvc_pool_t *pool, const block_t *b)
{
    return (uint32_t)(b - pool->blocks);
}

static inline block_t *node_block(const kvc_list_t *node)
{
    return kvc_container_of(node, block_t, link);
}

/* Hand out the next fresh block: its metadata is written for the first time. */
static inline uint32_t take_fresh(kvc_pool_t *pool)
{
    uint32_t id = pool->hw++;
    block_t *b = &pool->blocks[id];
    *b = (block_t){.refcount = 1};
    kvc_list_init(&b->link);
    pool->n_free--;
    return id;
}

/* Make blocks [hw, block] explicit (free, uncached) at the end of the early run, keeping the
 * queue's order.  O(block - hw): only a caller that names never-used blocks by id pays it. */
static void materialize(kvc_pool_t *pool, uint32_t block)
{
    while (pool->hw <= block) {
        block_t *b = &pool->blocks[pool->hw++];
        *b = (block_t){.flags = BLOCK_EARLY};
        kvc_list_push_back(&pool->early, &b->link);
    }
}

/* A block whose refcount just reached 0 (or whose cached mark or level changed while free) joins
 * the queue: a cached one at the tail of its level, an uncached one at the end of the uncached
 * run.  Reuse order among never-hittable blocks does not matter, but keeping them FIFO makes
 * allocation patterns easy to follow in traces. */
static inline void queue_push(kvc_pool_t *pool, block_t *b)
{
    if (b->flags & BLOCK_CACHED) {
        kvc_list_push_back(&pool->cached[b->level], &b->link);
        pool->levels_used |= 1ull << b->level;
        pool->n_free_cached++;
    } else {
        kvc_list_push_back(&pool->uncached, &b->link);
    }
    pool->n_free++;
}

static inline void queue_remove(kvc_pool_t *pool, block_t *b)
{
    kvc_list_remove(&b->link);
    if (b->flags & BLOCK_CACHED) {
        pool->n_free_cached--;
        if (kvc_list_empty(&pool->cached[b->level])) pool->levels_used &= ~(1ull << b->level);
    }
    b->flags &= (uint8_t)~BLOCK_EARLY;
    pool->n_free--;
}

static const kvc_list_t *seg_list(const kvc_pool_t *pool, int seg)
{
    return seg == SEG_EARLY      ? &pool->early
           : seg == SEG_UNCACHED ? &pool->uncached
                                 : &pool->cached[seg - SEG_CACHED0];
}

/* The first free block in segment `seg` or any later one, or KVC_NONE. */
static uint32_t seg_first(const kvc_pool_t *pool, int seg)
{
    for (; seg < N_SEGS; seg++) {
        if (seg == SEG_FRESH) {
            if (pool->hw < pool->params.n_blocks) return pool->hw;
            continue;
        }
        if (seg >= SEG_CACHED0) {
            uint64_t rest = pool->levels_used >> (seg - SEG_CACHED0);
            if (!rest) return KVC_NONE;
            seg += __builtin_ctzll(rest); /* skip empty levels */
        }
        const kvc_list_t *l = seg_list(pool, seg);
        if (!kvc_list_empty(l)) return block_id(pool, node_block(l->next));
    }
    return KVC_NONE;
}

static int block_seg(const block_t *b)
{
    return (b->flags & BLOCK_CACHED)  ? SEG_CACHED0 + b->level
           : (b->flags & BLOCK_EARLY) ? SEG_EARLY
                                      : SEG_UNCACHED;
}

/* ---- allocation and references ------------------------------------------ */
static inline void take(kvc_pool_t *pool, block_t *b)
{
    queue_remove(pool, b);
    b->refcount = 1;
}

int kvc_pool_alloc(kvc_pool_t *pool, uint32_t n, uint32_t *out)
{
    if (!pool) return KVC_EINVAL;
    if (n == 0) return 0;
    if (!out) return KVC_EINVAL;
    if (n > pool->n_free) {
        pool->n_alloc_failed++;
        return KVC_ENOSPC;
    }
    uint32_t got = 0;
    /* Uncached blocks first, in queue order; nobody can refuse them. */
    while (got < n && !kvc_list_empty(&pool->early)) {
        block_t *b = node_block(pool->early.next);
        take(pool, b);
        out[got++] = block_id(pool, b);
    }
    while (got < n && pool->hw < pool->params.n_blocks) out[got++] = take_fresh(pool);
    while (got < n && !kvc_list_empty(&pool->uncached)) {
        block_t *b = node_block(pool->uncached.next);
        take(pool, b);
        out[got++] = block_id(pool, b);
    }
    /* Then cached blocks, level by level, oldest first.  A block whose evictor says "busy" is
     * skipped; if a whole pass takes nothing we are stuck.  Skipped blocks are retried on the
     * next pass because evicting their children (later in the queue) can free them. */
    while (got < n) {
        uint32_t before = got;
        for (int l = 0; l < KVC__POOL_LEVELS && got < n; l++) {
            if (!(pool->levels_used >> l & 1)) continue;
            kvc_list_t *head = &pool->cached[l];
            for (kvc_list_t *node = head->next; node != head && got < n;) {
                kvc_list_t *next = node->next;
                block_t *b = node_block(node);
                uint32_t id = block_id(pool, b);
                node = next;
                if (pool->evict && pool->evict(pool->evict_ctx, id) != 0) continue;
                take(pool, b);
                b->flags = 0; /* its identity is gone */
                b->level = 0;
                pool->n_evicted++;
                out[got++] = id;
            }
        }
        if (got == before) break;
    }
    if (got < n) {
        /* Undo: the blocks taken go back uncached (their identities are gone). */
        for (uint32_t i = got; i-- > 0;) {
            block_t *b = &pool->blocks[out[i]];
            b->refcount = 0;
            queue_push(pool, b);
        }
        pool->n_alloc_failed++;
        return KVC_EBUSY;
    }
    pool->n_allocated += n;
    return 0;
}

/* kvc_pool_ref and kvc_pool_unref once the id is known to be valid (< n_blocks; for unref, a
 * block in use).  Inline: the prefix layer pins and the seq layer frees whole tables. */
static inline int ref_valid(kvc_pool_t *pool, uint32_t block)
{
    if (block >= pool->hw) materialize(pool, block);
    block_t *b = &pool->blocks[block];
    if (b->refcount == UINT32_MAX) return KVC_EOVERFLOW;
    if (b->refcount++ == 0) queue_remove(pool, b);
    return 0;
}

static inline void unref_valid(kvc_pool_t *pool, block_t *b)
{
    if (--b->refcount == 0) queue_push(pool, b);
}

int kvc_pool_ref(kvc_pool_t *pool, uint32_t block)
{
    if (!pool || block >= pool->params.n_blocks) return KVC_EINVAL;
    return ref_valid(pool, block);
}

int kvc__pool_ref_n(kvc_pool_t *pool, const uint32_t *blocks, size_t n)
{
    if (!pool || (n && !blocks)) return KVC_EINVAL;
    const uint32_t n_blocks = pool->params.n_blocks;
    int rc = 0;
    size_t i = 0;
    for (; i < n; i++) {
        rc = blocks[i] < n_blocks ? ref_valid(pool, blocks[i]) : KVC_EINVAL;
        if (rc) break;
    }
    if (rc) /* give back what was taken, as n calls to kvc_pool_unref would */
        while (i-- > 0) unref_valid(pool, &pool->blocks[blocks[i]]);
    return rc;
}

int kvc_pool_unref(kvc_pool_t *pool, uint32_t block)
{
    if (!pool || block >= pool->params.n_blocks) return KVC_EINVAL;
    if (block >= pool->hw) return KVC_EUNDERFLOW; /* never handed out: free */
    block_t *b = &pool->blocks[block];
    if (b->refcount == 0) return KVC_EUNDERFLOW;
    unref_valid(pool, b);
    return 0;
}

int kvc_pool_release(kvc_pool_t *pool, const uint32_t *table, uint32_t n)
{
    if (!pool || (n && !table)) return KVC_EINVAL;
    /* Validate before touching the queue: a bad id or a double release changes nothing.  The
     * refcounts are counted down while validating (so a block listed twice must hold two
     * references), and restored if anything is wrong. */
    block_t *const blocks = pool->blocks;
    const uint32_t n_blocks = pool->params.n_blocks, hw = pool->hw;
    int rc = 0;
    uint32_t i = 0;
    for (; i < n; i++) {
        uint32_t id = table[i];
        if (id == KVC_NONE) continue;
        if (id >= n_blocks) {
            rc = KVC_EINVAL;
            break;
        }
        if (id >= hw || blocks[id].refcount == 0) {
            rc = KVC_EUNDERFLOW;
            break;
        }
        blocks[id].refcount--;
    }
    if (rc) {
        for (uint32_t j = 0; j < i; j++)
            if (table[j] != KVC_NONE) blocks[table[j]].refcount++;
        return rc;
    }
    /* The refcounts are final.  Queue the blocks that reached 0 in reverse table order, as n
     * kvc_pool_unref calls from the end would: there a block listed twice joins the queue at
     * its first (lowest-index) place, so here it moves to the tail again at each place. */
    for (uint32_t j = n; j-- > 0;) {
        if (table[j] == KVC_NONE) continue;
        block_t *b = &blocks[table[j]];
        if (b->refcount != 0) continue;
        if (KVC_UNLIKELY(kvc_list_linked(&b->link))) queue_remove(pool, b); /* listed twice */
        queue_push(pool, b);
    }
    return 0;
}

int kvc__pool_set_cached(kvc_pool_t *pool, uint32_t block, bool cached)
{
    if (!pool || block >= pool->params.n_blocks) return KVC_EINVAL;
    if (block >= pool->hw) {
        if (!cached) return 0; /* never handed out: uncached already */
        materialize(pool, block);
    }
    block_t *b = &pool->blocks[block];
    if (!!(b->flags & BLOCK_CACHED) == cached) return 0;
    bool free_ = b->refcount == 0;
    if (free_) queue_remove(pool, b);
    if (cached) {
        b->flags |= BLOCK_CACHED;
    } else {
        b->flags &= (uint8_t)~BLOCK_CACHED;
        b->level = 0; /* a level ranks cached blocks only */
    }
    if (free_) queue_push(pool, b);
    return 0;
}

int kvc__pool_set_level(kvc_pool_t *pool, uint32_t block, uint32_t level)
{
    if (!pool || block >= pool->params.n_blocks || level >= KVC__POOL_LEVELS) return KVC_EINVAL;
    if (block >= pool->hw) {
        if (level == 0) return 0;
        materialize(pool, block);
    }
    block_t *b = &pool->blocks[block];
    if (b->level == level) return 0;
    bool move = b->refcount == 0 && (b->flags & BLOCK_CACHED);
    if (move) queue_remove(pool, b);
    b->level = (uint8_t)level;
    if (move) queue_push(pool, b);
    return 0;
}

uint32_t kvc__pool_level(const kvc_pool_t *pool, uint32_t block)
{
    return pool && block < pool->hw ? pool->blocks[block].level : 0;
}

bool kvc_pool_is_cached(const kvc_pool_t *pool, uint32_t block)
{
    return pool && block < pool->hw && (pool->blocks[block].flags & BLOCK_CACHED);
}

uint32_t kvc_pool_refcount(const kvc_pool_t *pool, uint32_t block)
{
    return pool && block < pool->hw ? pool->blocks[block].refcount : 0;
}

uint32_t kvc_pool_n_blocks(const kvc_pool_t *pool)
{
    return pool->params.n_blocks;
}

uint32_t kvc_pool_n_free(const kvc_pool_t *pool)
{
    return pool->n_free;
}

uint32_t kvc_pool_block_size(const kvc_pool_t *pool)
{
    return pool->params.block_size;
}

uint32_t kvc__pool_high_water(const kvc_pool_t *pool)
{
    return pool->hw;
}

void kvc_pool_stats(const kvc_pool_t *pool, kvc_pool_stats_t *out)
{
    *out = (kvc_pool_stats_t){
        .n_blocks = pool->params.n_blocks,
        .n_free = pool->n_free,
        .n_free_cached = pool->n_free_cached,
        .n_used = pool->params.n_blocks - pool->n_free,
        .n_high_water = pool->hw,
        .n_allocated = pool->n_allocated,
        .n_evicted = pool->n_evicted,
        .n_alloc_failed = pool->n_alloc_failed,
    };
}

int kvc__pool_free_next(const kvc_pool_t *pool, uint32_t block, uint32_t *next)
{
    if (!pool || !next) return KVC_EINVAL;
    if (block == KVC_NONE) {
        *next = seg_first(pool, SEG_EARLY);
        return 0;
    }
    if (block >= pool->params.n_blocks) return KVC_EINVAL;
    if (block >= pool->hw) { /* fresh: the next fresh block, then the uncached run */
        *next = block + 1 < pool->params.n_blocks ? block + 1 : seg_first(pool, SEG_UNCACHED);
        return 0;
    }
    const block_t *b = &pool->blocks[block];
    if (b->refcount != 0) return KVC_EBUSY;
    int seg = block_seg(b);
    const kvc_list_t *node = b->link.next;
    *next =
        node != seg_list(pool, seg) ? block_id(pool, node_block(node)) : seg_first(pool, seg + 1);
    return 0;
}

uint32_t kvc__pool_free_cached_first(const kvc_pool_t *pool)
{
    return pool ? seg_first(pool, SEG_CACHED0) : KVC_NONE;
}

/* ---- storage ------------------------------------------------------------- */
const kvc_storage_desc_t *kvc_pool_storage(const kvc_pool_t *pool)
{
    return &pool->params.storage;
}

size_t kvc_pool_block_bytes(const kvc_pool_t *pool)
{
    return pool->block_bytes;
}

void *kvc_pool_block_data(kvc_pool_t *pool, uint32_t block)
{
    if (!pool->storage || block >= pool->params.n_blocks) return NULL;
    return pool->storage + (size_t)block * pool->block_bytes;
}

void *kvc_pool_kv_data(kvc_pool_t *pool, uint32_t block, uint32_t layer, uint32_t kv)
{
    const kvc_storage_desc_t *s = &pool->params.storage;
    if (!pool->storage || block >= pool->params.n_blocks || layer >= s->n_layers || kv >= s->n_kv)
        return NULL;
    return pool->storage + (size_t)block * pool->block_bytes +
           ((size_t)layer * s->n_kv + kv) * pool->kv_bytes;
}

void *kvc_pool_scale_data(kvc_pool_t *pool, uint32_t block)
{
    const kvc_storage_desc_t *s = &pool->params.storage;
    if (!pool->storage || !s->scale_bytes || block >= pool->params.n_blocks) return NULL;
    return pool->storage + (size_t)block * pool->block_bytes +
           (size_t)s->n_layers * s->n_kv * pool->kv_bytes;
}

int kvc_pool_copy_block(kvc_pool_t *pool, uint32_t dst, uint32_t src)
{
    if (!pool || dst >= pool->params.n_blocks || src >= pool->params.n_blocks) return KVC_EINVAL;
    if (pool->storage && dst != src)
        memcpy(pool->storage + (size_t)dst * pool->block_bytes,
               pool->storage + (size_t)src * pool->block_bytes, pool->block_bytes);
    return 0;
}

/* ---- invariants ---------------------------------------------------------- */
#define fail(msg, cap, ...) kvc__msgf(KVC_ECORRUPT, msg, cap, __VA_ARGS__)

/* Walk one segment's list: links, membership, flags; adds to the counts. */
static int check_list(const kvc_pool_t *pool, int seg, uint32_t *in_queue, uint32_t *n_cached,
                      char *msg, size_t cap)
{
    const kvc_list_t *head = seg_list(pool, seg), *prev = head;
    const char *name = seg == SEG_EARLY ? "early" : seg == SEG_UNCACHED ? "uncached" : "cached";
    for (const kvc_list_t *node = head->next; node != head; node = node->next) {
        if (node->prev != prev) return fail(msg, cap, "free queue (%s): broken back link", name);
        const block_t *b = node_block(node);
        if (b < pool->blocks || b >= pool->blocks + pool->hw)
            return fail(msg, cap, "free queue (%s): foreign node", name);
        uint32_t id = block_id(pool, b);
        if (b->refcount != 0)
            return fail(msg, cap, "block %u is in the free queue with refcount %u", id,
                        b->refcount);
        if (++*in_queue > pool->hw) return fail(msg, cap, "free queue: cycle");
        if (block_seg(b) != seg)
            return fail(msg, cap, "block %u (%s, level %u) is in the %s run", id,
                        (b->flags & BLOCK_CACHED) ? "cached" : "uncached", b->level, name);
        if (seg >= SEG_CACHED0 && !(pool->levels_used >> (seg - SEG_CACHED0) & 1))
            return fail(msg, cap, "level %d holds blocks, its bit is clear", seg - SEG_CACHED0);
        *n_cached += seg >= SEG_CACHED0;
        prev = node;
    }
    if (head->prev != prev) return fail(msg, cap, "free queue (%s): broken tail link", name);
    if (seg >= SEG_CACHED0 && prev == head && (pool->levels_used >> (seg - SEG_CACHED0) & 1))
        return fail(msg, cap, "level %d is empty, its bit is set", seg - SEG_CACHED0);
    return 0;
}

int kvc_pool_check(const kvc_pool_t *pool, char *msg, size_t cap)
{
    if (!pool) return KVC_EINVAL;
    const uint32_t n_blocks = pool->params.n_blocks, hw = pool->hw;
    if (hw > n_blocks) return fail(msg, cap, "high-water mark %u past %u blocks", hw, n_blocks);
    uint32_t in_queue = 0, cached_in_queue = 0;
    for (int seg = 0; seg < N_SEGS; seg++) {
        if (seg == SEG_FRESH) continue;
        int rc = check_list(pool, seg, &in_queue, &cached_in_queue, msg, cap);
        if (rc) return rc;
    }
    const uint32_t n_fresh = n_blocks - hw;
    if (in_queue + n_fresh != pool->n_free)
        return fail(msg, cap, "free queue holds %u blocks (%u fresh), n_free says %u",
                    in_queue + n_fresh, n_fresh, pool->n_free);
    if (cached_in_queue != pool->n_free_cached)
        return fail(msg, cap, "free queue holds %u cached blocks, counter says %u", cached_in_queue,
                    pool->n_free_cached);
    uint32_t n_zero = 0;
    for (uint32_t i = 0; i < hw; i++) {
        const block_t *b = &pool->blocks[i];
        bool linked = kvc_list_linked(&b->link);
        if (b->refcount == 0 && !linked)
            return fail(msg, cap, "block %u has refcount 0 but is not in the free queue", i);
        if (b->refcount != 0 && linked)
            return fail(msg, cap, "block %u has refcount %u but is in the free queue", i,
                        b->refcount);
        if (b->level >= KVC__POOL_LEVELS) return fail(msg, cap, "block %u: bad level", i);
        n_zero += b->refcount == 0;
    }
    if (n_zero != in_queue)
        return fail(msg, cap, "%u initialised blocks have refcount 0, %u are queued", n_zero,
                    in_queue);
    return 0;
}
