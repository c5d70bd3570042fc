/* pool.c - the fixed set of KV blocks: refcounts, the LRU free queue and the
 * storage behind the blocks.  See include/kvcache/pool.h for the queue's
 * shape; the prefix layer above decides identity through the evictor hook. */
#include "kvcache/pool.h"
#include "util/msg.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

enum { BLOCK_CACHED = 1u << 0 };

typedef struct {
    kvc_list_t link; /* in the free queue iff refcount == 0 */
    uint32_t refcount;
    uint32_t flags;
} block_t;

struct kvc_pool {
    kvc_pool_params_t params;
    size_t block_bytes; /* 0: metadata only */
    size_t kv_bytes;    /* one (layer, kv) slab: n_kv_heads * block_size * head_dim * dtype */
    uint8_t *storage;   /* (n_blocks, block_bytes) */
    block_t *blocks;    /* (n_blocks) */
    kvc_list_t free_q;
    kvc_list_t *cached_first; /* first cached block in free_q, or &free_q if none */
    uint32_t n_free;
    uint32_t n_free_cached;
    kvc_evict_fn evict;
    void *evict_ctx;
    uint64_t n_allocated, n_evicted, n_alloc_failed;
};

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
    pool->blocks = kvc_calloc(a, p->n_blocks, sizeof(block_t), 64);
    if (!pool->blocks) goto oom;
    if (block_bytes) {
        pool->storage = alloc_storage(a, (size_t)p->n_blocks * block_bytes);
        if (!pool->storage) goto oom;
    }
    kvc_list_init(&pool->free_q);
    for (uint32_t i = 0; i < p->n_blocks; i++)
        kvc_list_push_back(&pool->free_q, &pool->blocks[i].link);
    pool->cached_first = &pool->free_q;
    pool->n_free = p->n_blocks;
    *out = pool;
    return 0;
oom:
    kvc_free(a, pool->blocks);
    kvc_free(a, pool);
    return KVC_ENOMEM;
}

void kvc_pool_destroy(kvc_pool_t *pool)
{
    if (!pool) return;
    kvc_allocator_t a = pool->params.allocator;
    kvc_free(&a, pool->storage);
    kvc_free(&a, pool->blocks);
    kvc_free(&a, pool);
}

void kvc_pool_set_evictor(kvc_pool_t *pool, kvc_evict_fn fn, void *ctx)
{
    pool->evict = fn;
    pool->evict_ctx = ctx;
}

/* ---- the free queue ---------------------------------------------------------
 * cached_first marks where the cached run starts, so that an uncached block can
 * join the end of the uncached run in O(1) and the boundary stays exact. */
static inline uint32_t block_id(const kvc_pool_t *pool, const block_t *b)
{
    return (uint32_t)(b - pool->blocks);
}

static void queue_push(kvc_pool_t *pool, block_t *b)
{
    if (b->flags & BLOCK_CACHED) {
        kvc_list_push_back(&pool->free_q, &b->link);
        if (pool->cached_first == &pool->free_q) pool->cached_first = &b->link;
        pool->n_free_cached++;
    } else {
        /* Uncached: at the end of the uncached run, i.e. just before the first cached block.
         * Reuse order among never-hittable blocks does not matter, but keeping them FIFO makes
         * allocation patterns easy to follow in traces. */
        kvc__list_insert(&b->link, pool->cached_first->prev, pool->cached_first);
    }
    pool->n_free++;
}

static void queue_remove(kvc_pool_t *pool, block_t *b)
{
    if (pool->cached_first == &b->link) pool->cached_first = b->link.next;
    if (b->flags & BLOCK_CACHED) pool->n_free_cached--;
    kvc_list_remove(&b->link);
    pool->n_free--;
}

/* ---- allocation and references ------------------------------------------ */
int kvc_pool_alloc(kvc_pool_t *pool, uint32_t n, uint32_t *out)
{
    if (n == 0) return 0;
    if (!out) return KVC_EINVAL;
    if (n > pool->n_free) {
        pool->n_alloc_failed++;
        return KVC_ENOSPC;
    }
    uint32_t got = 0;
    /* Walk from the head.  A cached block whose evictor says "busy" is skipped; if a whole pass
     * takes nothing we are stuck.  Skipped blocks are retried on the next pass because evicting
     * their children (later in the queue) can free them. */
    while (got < n) {
        uint32_t before = got;
        kvc_list_t *node = pool->free_q.next;
        while (node != &pool->free_q && got < n) {
            kvc_list_t *next = node->next;
            block_t *b = kvc_container_of(node, block_t, link);
            if (b->flags & BLOCK_CACHED) {
                if (pool->evict && pool->evict(pool->evict_ctx, block_id(pool, b)) != 0) {
                    node = next;
                    continue;
                }
                queue_remove(pool, b);
                b->flags &= ~(uint32_t)BLOCK_CACHED;
                pool->n_evicted++;
            } else {
                queue_remove(pool, b);
            }
            b->refcount = 1;
            out[got++] = block_id(pool, b);
            node = next;
        }
        if (got == before) break;
    }
    if (got < n) {
        /* Undo: the blocks taken go back to the head, uncached (their identities are gone). */
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

int kvc_pool_ref(kvc_pool_t *pool, uint32_t block)
{
    if (block >= pool->params.n_blocks) return KVC_EINVAL;
    block_t *b = &pool->blocks[block];
    if (b->refcount == UINT32_MAX) return KVC_EOVERFLOW;
    if (b->refcount++ == 0) queue_remove(pool, b);
    return 0;
}

int kvc_pool_unref(kvc_pool_t *pool, uint32_t block)
{
    if (block >= pool->params.n_blocks) return KVC_EINVAL;
    block_t *b = &pool->blocks[block];
    if (b->refcount == 0) return KVC_EUNDERFLOW;
    if (--b->refcount == 0) queue_push(pool, b);
    return 0;
}

int kvc_pool_release(kvc_pool_t *pool, const uint32_t *table, uint32_t n)
{
    if (n && !table) return KVC_EINVAL;
    /* Validate before touching anything: a bad id or a double release changes nothing.  The
     * refcount field is borrowed as a countdown while validating, then restored. */
    int rc = 0;
    uint32_t i = 0;
    for (; i < n; i++) {
        uint32_t id = table[i];
        if (id == KVC_NONE) continue;
        if (id >= pool->params.n_blocks) {
            rc = KVC_EINVAL;
            break;
        }
        if (pool->blocks[id].refcount == 0) {
            rc = KVC_EUNDERFLOW;
            break;
        }
        pool->blocks[id].refcount--;
    }
    for (uint32_t j = 0; j < i; j++)
        if (table[j] != KVC_NONE) pool->blocks[table[j]].refcount++;
    if (rc) return rc;
    for (uint32_t j = n; j-- > 0;)
        if (table[j] != KVC_NONE) (void)kvc_pool_unref(pool, table[j]);
    return 0;
}

void kvc_pool_set_cached(kvc_pool_t *pool, uint32_t block, bool cached)
{
    KVC_ASSERT(block < pool->params.n_blocks);
    block_t *b = &pool->blocks[block];
    if (!!(b->flags & BLOCK_CACHED) == cached) return;
    bool free_ = b->refcount == 0;
    if (free_) queue_remove(pool, b);
    if (cached)
        b->flags |= BLOCK_CACHED;
    else
        b->flags &= ~(uint32_t)BLOCK_CACHED;
    if (free_) queue_push(pool, b);
}

bool kvc_pool_is_cached(const kvc_pool_t *pool, uint32_t block)
{
    return block < pool->params.n_blocks && (pool->blocks[block].flags & BLOCK_CACHED);
}

uint32_t kvc_pool_refcount(const kvc_pool_t *pool, uint32_t block)
{
    return block < pool->params.n_blocks ? pool->blocks[block].refcount : 0;
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

void kvc_pool_stats(const kvc_pool_t *pool, kvc_pool_stats_t *out)
{
    *out = (kvc_pool_stats_t){
        .n_blocks = pool->params.n_blocks,
        .n_free = pool->n_free,
        .n_free_cached = pool->n_free_cached,
        .n_used = pool->params.n_blocks - pool->n_free,
        .n_allocated = pool->n_allocated,
        .n_evicted = pool->n_evicted,
        .n_alloc_failed = pool->n_alloc_failed,
    };
}

uint32_t kvc_pool_free_next(const kvc_pool_t *pool, uint32_t block)
{
    const kvc_list_t *node;
    if (block == KVC_NONE) {
        node = pool->free_q.next;
    } else {
        KVC_ASSERT(block < pool->params.n_blocks && pool->blocks[block].refcount == 0);
        node = pool->blocks[block].link.next;
    }
    return node == &pool->free_q ? KVC_NONE : block_id(pool, kvc_container_of(node, block_t, link));
}

uint32_t kvc_pool_free_cached_first(const kvc_pool_t *pool)
{
    const kvc_list_t *node = pool->cached_first;
    return node == &pool->free_q ? KVC_NONE : block_id(pool, kvc_container_of(node, block_t, link));
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
    if (dst >= pool->params.n_blocks || src >= pool->params.n_blocks) return KVC_EINVAL;
    if (pool->storage && dst != src)
        memcpy(pool->storage + (size_t)dst * pool->block_bytes,
               pool->storage + (size_t)src * pool->block_bytes, pool->block_bytes);
    return 0;
}

/* ---- invariants ---------------------------------------------------------- */
#define fail(msg, cap, ...) kvc__msgf(KVC_ECORRUPT, msg, cap, __VA_ARGS__)

int kvc_pool_check(const kvc_pool_t *pool, char *msg, size_t cap)
{
    uint32_t n_blocks = pool->params.n_blocks;
    uint32_t in_queue = 0, cached_in_queue = 0;
    bool seen_cached = false, boundary_ok = pool->cached_first == &pool->free_q;
    const kvc_list_t *prev = &pool->free_q;
    for (const kvc_list_t *node = pool->free_q.next; node != &pool->free_q; node = node->next) {
        if (node->prev != prev) return fail(msg, cap, "free queue: broken back link");
        const block_t *b = kvc_container_of(node, block_t, link);
        if (b < pool->blocks || b >= pool->blocks + n_blocks)
            return fail(msg, cap, "free queue: foreign node");
        uint32_t id = block_id(pool, b);
        if (b->refcount != 0)
            return fail(msg, cap, "block %u is in the free queue with refcount %u", id,
                        b->refcount);
        if (++in_queue > n_blocks) return fail(msg, cap, "free queue: cycle");
        bool cached = b->flags & BLOCK_CACHED;
        if (cached && !seen_cached) {
            if (pool->cached_first != node)
                return fail(msg, cap, "free queue: cached run starts at block %u, marker elsewhere",
                            id);
            boundary_ok = true;
        }
        if (!cached && seen_cached)
            return fail(msg, cap, "free queue: uncached block %u after a cached one", id);
        seen_cached |= cached;
        cached_in_queue += cached;
        prev = node;
    }
    if (pool->free_q.prev != prev) return fail(msg, cap, "free queue: broken tail link");
    if (!boundary_ok)
        return fail(msg, cap, "free queue: cached-run marker points at no cached block");
    if (in_queue != pool->n_free)
        return fail(msg, cap, "free queue holds %u blocks, n_free says %u", in_queue, pool->n_free);
    if (cached_in_queue != pool->n_free_cached)
        return fail(msg, cap, "free queue holds %u cached blocks, counter says %u", cached_in_queue,
                    pool->n_free_cached);
    uint32_t n_zero = 0;
    for (uint32_t i = 0; i < n_blocks; i++) {
        const block_t *b = &pool->blocks[i];
        bool linked = kvc_list_linked(&b->link);
        if (b->refcount == 0 && !linked)
            return fail(msg, cap, "block %u has refcount 0 but is not in the free queue", i);
        if (b->refcount != 0 && linked)
            return fail(msg, cap, "block %u has refcount %u but is in the free queue", i,
                        b->refcount);
        n_zero += b->refcount == 0;
    }
    if (n_zero != pool->n_free)
        return fail(msg, cap, "%u blocks have refcount 0, n_free says %u", n_zero, pool->n_free);
    return 0;
}
