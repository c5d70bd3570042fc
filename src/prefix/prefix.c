/* prefix.c - block identity and the prefix cache (see include/kvcache/prefix.h).
 *
 * Per physical block this layer keeps the identity of the cached content:
 * its hash, its parent block, its tokens, its namespace and extra keys.  The
 * index is a chained hash table whose chains run through the entries
 * themselves (no allocation after creation).  Identity is checked exactly on
 * every candidate, so the hash function only affects speed, never results.
 */
#include "kvcache/prefix.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAX_EXTRA_KEYS 16
#define NS_BYTES       36 /* epoch 8 | lora 8 | salt 16 | group 4 */

typedef struct {
    kvc_hash128_t hash;
    uint64_t offset; /* start of the input minus the block's first position (two's complement) */
    uint32_t length;
    uint32_t pad;
} extra_t;

typedef struct {
    kvc_hash128_t hash;
    uint32_t hnext;      /* next entry in the same bucket, KVC_NONE at the end */
    uint32_t parent;     /* KVC_NONE for a root */
    uint32_t n_children; /* cached blocks whose parent is this one */
    uint8_t cached;
    uint8_t n_extra;
    uint8_t pad[2];
} entry_t;

struct kvc_prefix {
    kvc_pool_t *pool;
    kvc_prefix_params_t params;
    uint64_t seed;
    uint32_t n_blocks;
    uint32_t block_size;
    uint32_t bucket_mask;
    uint32_t *buckets;      /* (bucket_mask + 1) chain heads */
    entry_t *entries;       /* (n_blocks) */
    kvc_token_t *tokens;    /* (n_blocks, block_size) */
    kvc_namespace_t *ns;    /* (n_blocks) */
    extra_t *extras;        /* (n_blocks, max_extra_keys) */
    uint32_t n_cached;
    kvc_prefix_stats_t stats;
};

static const kvc_namespace_t default_ns;

/* ---- small helpers ------------------------------------------------------- */
const char *kvc_block_status_name(kvc_block_status_t s)
{
    static const char *const names[] = {"hit",        "miss",       "collision",
                                        "after-miss", "last-token", "partial"};
    return (unsigned)s < KVC_ARRAY_LEN(names) ? names[s] : "?";
}

void kvc_namespace_set_salt(kvc_namespace_t *ns, const char *salt)
{
    memset(ns->salt, 0, sizeof ns->salt);
    if (!salt || !*salt) return;
    /* A fixed seed here: the same salt string must give the same namespace in every process. */
    kvc_hash128_t h = kvc_hash128(salt, strlen(salt), 0x6b7663616368652dULL /* "kvcache-" */);
    memcpy(ns->salt, &h.lo, 8);
    memcpy(ns->salt + 8, &h.hi, 8);
}

static bool ns_equal(const kvc_namespace_t *a, const kvc_namespace_t *b)
{
    return a->weight_epoch == b->weight_epoch && a->lora_id == b->lora_id &&
           a->group == b->group && memcmp(a->salt, b->salt, sizeof a->salt) == 0;
}

static inline kvc_hash128_t do_hash(const kvc_prefix_t *pc, const void *data, size_t len)
{
    return pc->params.hash_fn ? pc->params.hash_fn(data, len, pc->seed)
                              : kvc_hash128(data, len, pc->seed);
}

static kvc_hash128_t ns_digest(const kvc_prefix_t *pc, const kvc_namespace_t *ns)
{
    uint8_t buf[NS_BYTES];
    memcpy(buf, &ns->weight_epoch, 8);
    memcpy(buf + 8, &ns->lora_id, 8);
    memcpy(buf + 16, ns->salt, 16);
    memcpy(buf + 32, &ns->group, 4);
    return do_hash(pc, buf, sizeof buf);
}

static inline const kvc_namespace_t *query_ns(const kvc_prefix_query_t *q)
{
    return q->ns ? q->ns : &default_ns;
}

static bool query_ok(const kvc_prefix_query_t *q)
{
    return q && (q->tokens || q->n_tokens == 0) && (q->mm || q->n_mm == 0);
}

/* The extra keys of block `index`: every multimodal input overlapping it, sorted so that the
 * order of q->mm does not matter.  Returns the count, or -1 if more than `max` overlap. */
static int block_extras(const kvc_prefix_query_t *q, size_t index, uint32_t block_size, uint32_t max,
                        extra_t *out)
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
            bool after = (int64_t)p->offset > (int64_t)e.offset ||
                         (p->offset == e.offset &&
                          (p->length > e.length ||
                           (p->length == e.length &&
                            (p->hash.hi > e.hash.hi ||
                             (p->hash.hi == e.hash.hi && p->hash.lo > e.hash.lo)))));
            if (!after) break;
            out[j] = out[j - 1];
            j--;
        }
        out[j] = e;
    }
    return n;
}

/* hash = H(parent hash | namespace digest | tokens | extra keys) */
static kvc_hash128_t block_hash(const kvc_prefix_t *pc, kvc_hash128_t parent, kvc_hash128_t nsd,
                                const kvc_token_t *tokens, const extra_t *extras, int n_extra)
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
    return do_hash(pc, buf, len);
}

static inline uint32_t bucket_of(const kvc_prefix_t *pc, kvc_hash128_t h)
{
    return (uint32_t)(h.lo ^ (h.lo >> 32)) & pc->bucket_mask;
}

static inline kvc_token_t *entry_tokens(const kvc_prefix_t *pc, uint32_t b)
{
    return pc->tokens + (size_t)b * pc->block_size;
}

static inline extra_t *entry_extras(const kvc_prefix_t *pc, uint32_t b)
{
    return pc->extras + (size_t)b * pc->params.max_extra_keys;
}

/* Exact identity: same parent block, same namespace, same tokens, same extra keys. */
static bool identity_equal(const kvc_prefix_t *pc, uint32_t b, uint32_t parent,
                           const kvc_namespace_t *ns, const kvc_token_t *tokens,
                           const extra_t *extras, int n_extra)
{
    const entry_t *e = &pc->entries[b];
    if (e->parent != parent || e->n_extra != n_extra) return false;
    if (memcmp(entry_tokens(pc, b), tokens, (size_t)pc->block_size * sizeof(kvc_token_t)) != 0)
        return false;
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
static uint32_t find_exact(const kvc_prefix_t *pc, kvc_hash128_t h, uint32_t parent,
                           const kvc_namespace_t *ns, const kvc_token_t *tokens,
                           const extra_t *extras, int n_extra, bool *collided)
{
    for (uint32_t b = pc->buckets[bucket_of(pc, h)]; b != KVC_NONE; b = pc->entries[b].hnext) {
        if (!kvc_hash128_eq(pc->entries[b].hash, h)) continue;
        if (identity_equal(pc, b, parent, ns, tokens, extras, n_extra)) return b;
        *collided = true;
    }
    return KVC_NONE;
}

static void emit(kvc_prefix_t *pc, kvc_event_type_t type, uint32_t b)
{
    if (!pc->params.on_event) return;
    const entry_t *e = &pc->entries[b];
    kvc_prefix_event_t ev = {
        .type = type,
        .hash = e->hash,
        .parent_hash = e->parent == KVC_NONE ? (kvc_hash128_t){0, 0} : pc->entries[e->parent].hash,
        .block = b,
        .parent_block = e->parent,
        .group = pc->ns[b].group,
        .n_tokens = pc->block_size,
        .tokens = entry_tokens(pc, b),
    };
    pc->params.on_event(pc->params.event_ctx, &ev);
}

/* Drop a childless cached block's identity.  Does not touch the pool's mark: the caller does
 * (kvc_pool_alloc clears it itself after the evictor returns). */
static void drop(kvc_prefix_t *pc, uint32_t b)
{
    entry_t *e = &pc->entries[b];
    KVC_ASSERT(e->cached && e->n_children == 0);
    emit(pc, KVC_EVENT_REMOVED, b);
    uint32_t *link = &pc->buckets[bucket_of(pc, e->hash)];
    while (*link != b) {
        KVC_ASSERT(*link != KVC_NONE);
        link = &pc->entries[*link].hnext;
    }
    *link = e->hnext;
    if (e->parent != KVC_NONE) pc->entries[e->parent].n_children--;
    *e = (entry_t){.hnext = KVC_NONE, .parent = KVC_NONE};
    pc->n_cached--;
    pc->stats.n_evictions++;
}

static int evict_cb(void *ctx, uint32_t block)
{
    kvc_prefix_t *pc = ctx;
    if (!pc->entries[block].cached) return 0;
    if (pc->entries[block].n_children) return KVC_EBUSY;
    drop(pc, block);
    return 0;
}

/* ---- lifecycle ------------------------------------------------------------ */
kvc_prefix_params_t kvc_prefix_params_default(void)
{
    return (kvc_prefix_params_t){.max_extra_keys = 4};
}

int kvc_prefix_create(kvc_pool_t *pool, const kvc_prefix_params_t *params, kvc_prefix_t **out)
{
    if (!pool || !params || !out) return KVC_EINVAL;
    *out = NULL;
    if (params->max_extra_keys > MAX_EXTRA_KEYS) return KVC_EINVAL;
    const kvc_allocator_t *a = &params->allocator;
    kvc_prefix_t *pc = kvc_calloc(a, 1, sizeof *pc, 0);
    if (!pc) return KVC_ENOMEM;
    pc->pool = pool;
    pc->params = *params;
    pc->seed = params->hash_seed ? params->hash_seed : kvc_random_seed();
    pc->n_blocks = kvc_pool_n_blocks(pool);
    pc->block_size = kvc_pool_block_size(pool);
    uint64_t n_buckets = 16;
    while (n_buckets < 2ull * pc->n_blocks) n_buckets <<= 1;
    pc->bucket_mask = (uint32_t)(n_buckets - 1);
    pc->buckets = kvc_alloc(a, n_buckets * sizeof(uint32_t), 64);
    pc->entries = kvc_alloc(a, (size_t)pc->n_blocks * sizeof(entry_t), 64);
    pc->tokens = kvc_calloc(a, (size_t)pc->n_blocks * pc->block_size, sizeof(kvc_token_t), 64);
    pc->ns = kvc_calloc(a, pc->n_blocks, sizeof(kvc_namespace_t), 64);
    if (params->max_extra_keys)
        pc->extras = kvc_calloc(a, (size_t)pc->n_blocks * params->max_extra_keys, sizeof(extra_t), 64);
    if (!pc->buckets || !pc->entries || !pc->tokens || !pc->ns ||
        (params->max_extra_keys && !pc->extras)) {
        kvc_prefix_destroy(pc);
        return KVC_ENOMEM;
    }
    memset(pc->buckets, 0xff, n_buckets * sizeof(uint32_t));
    for (uint32_t i = 0; i < pc->n_blocks; i++)
        pc->entries[i] = (entry_t){.hnext = KVC_NONE, .parent = KVC_NONE};
    kvc_pool_set_evictor(pool, evict_cb, pc);
    *out = pc;
    return 0;
}

void kvc_prefix_destroy(kvc_prefix_t *pc)
{
    if (!pc) return;
    if (pc->entries) {
        kvc_pool_set_evictor(pc->pool, NULL, NULL);
        for (uint32_t b = 0; b < pc->n_blocks; b++)
            if (pc->entries[b].cached) kvc_pool_set_cached(pc->pool, b, false);
    }
    kvc_allocator_t a = pc->params.allocator;
    kvc_free(&a, pc->buckets);
    kvc_free(&a, pc->entries);
    kvc_free(&a, pc->tokens);
    kvc_free(&a, pc->ns);
    kvc_free(&a, pc->extras);
    kvc_free(&a, pc);
}

uint64_t kvc_prefix_seed(const kvc_prefix_t *pc)
{
    return pc->seed;
}

/* ---- hashing -------------------------------------------------------------- */
int kvc_prefix_hash(const kvc_prefix_t *pc, const kvc_prefix_query_t *q, kvc_hash128_t *out,
                    size_t cap, size_t *n_out)
{
    if (!pc || !query_ok(q) || !n_out) return KVC_EINVAL;
    size_t n_full = q->n_tokens / pc->block_size;
    *n_out = n_full;
    if (n_full > cap || (n_full && !out)) return KVC_ERANGE;
    kvc_hash128_t nsd = ns_digest(pc, query_ns(q)), parent = {0, 0};
    extra_t extras[MAX_EXTRA_KEYS];
    for (size_t i = 0; i < n_full; i++) {
        int n_extra = q->n_mm ? block_extras(q, i, pc->block_size, pc->params.max_extra_keys, extras)
                              : 0;
        if (n_extra < 0) return KVC_ERANGE;
        parent = out[i] = block_hash(pc, parent, nsd, q->tokens + i * pc->block_size, extras, n_extra);
    }
    return 0;
}

/* ---- lookup --------------------------------------------------------------- */
int kvc_prefix_match(kvc_prefix_t *pc, const kvc_prefix_query_t *q, uint32_t *blocks, size_t cap,
                     kvc_block_status_t *status, kvc_prefix_hit_t *hit)
{
    if (!pc || !query_ok(q) || !hit || (cap && !blocks)) return KVC_EINVAL;
    const uint32_t bs = pc->block_size;
    const kvc_namespace_t *ns = query_ns(q);
    size_t n_full = q->n_tokens / bs;
    size_t n_all = (q->n_tokens + bs - 1) / bs;
    *hit = (kvc_prefix_hit_t){.n_full_blocks = n_full};

    kvc_hash128_t nsd = {0, 0}, h = {0, 0};
    if (!q->hashes && n_full) nsd = ns_digest(pc, ns);
    extra_t extras[MAX_EXTRA_KEYS];
    uint32_t prev = KVC_NONE;
    size_t i = 0;
    kvc_block_status_t miss_status = KVC_BLOCK_MISS;
    for (; i < n_full; i++) {
        int n_extra = q->n_mm ? block_extras(q, i, bs, pc->params.max_extra_keys, extras) : 0;
        if (n_extra < 0) break; /* cannot have been inserted: a miss */
        const kvc_token_t *tok = q->tokens + i * bs;
        h = q->hashes ? q->hashes[i] : block_hash(pc, h, nsd, tok, extras, n_extra);
        bool collided = false;
        uint32_t b = find_exact(pc, h, prev, ns, tok, extras, n_extra, &collided);
        if (collided) pc->stats.n_collisions++;
        if (b == KVC_NONE) {
            miss_status = collided ? KVC_BLOCK_COLLISION : KVC_BLOCK_MISS;
            break;
        }
        if (blocks && i < cap) blocks[i] = b;
        prev = b;
    }
    hit->n_matched_blocks = i;
    /* The last-token rule: the hit may cover at most n_tokens - 1 tokens. */
    size_t max_hit = q->n_tokens ? (q->n_tokens - 1) / bs : 0;
    hit->n_hit_blocks = KVC_MIN(i, max_hit);
    hit->cut_by_last_token = hit->n_hit_blocks < i;
    hit->n_hit_tokens = hit->n_hit_blocks * bs;
    if (status) {
        for (size_t j = 0; j < n_all; j++) {
            if (j >= n_full)
                status[j] = KVC_BLOCK_PARTIAL;
            else if (j < hit->n_hit_blocks)
                status[j] = KVC_BLOCK_HIT;
            else if (j < i)
                status[j] = KVC_BLOCK_LAST_TOKEN;
            else if (j == i)
                status[j] = miss_status;
            else
                status[j] = KVC_BLOCK_AFTER_MISS;
        }
    }
    return 0;
}

int kvc_prefix_lookup(kvc_prefix_t *pc, const kvc_prefix_query_t *q, uint32_t *blocks, size_t cap,
                      kvc_prefix_hit_t *hit)
{
    int rc = kvc_prefix_match(pc, q, blocks, cap, NULL, hit);
    if (rc) return rc;
    if (hit->n_hit_blocks > cap) {
        hit->n_hit_blocks = cap;
        hit->n_hit_tokens = cap * pc->block_size;
    }
    for (size_t i = 0; i < hit->n_hit_blocks; i++) {
        rc = kvc_pool_ref(pc->pool, blocks[i]);
        if (rc) { /* refcount overflow: give back what we took */
            for (size_t j = i; j-- > 0;) (void)kvc_pool_unref(pc->pool, blocks[j]);
            hit->n_hit_blocks = hit->n_hit_tokens = 0;
            return rc;
        }
    }
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
int kvc_prefix_insert(kvc_prefix_t *pc, const kvc_prefix_query_t *q, size_t index, uint32_t parent,
                      uint32_t block, uint32_t *canonical)
{
    if (!pc || !query_ok(q)) return KVC_EINVAL;
    const uint32_t bs = pc->block_size;
    if (index >= q->n_tokens / bs || block >= pc->n_blocks) return KVC_EINVAL;
    if (kvc_pool_refcount(pc->pool, block) == 0) return KVC_EINVAL;
    const kvc_namespace_t *ns = query_ns(q);
    const kvc_token_t *tok = q->tokens + index * bs;
    if (index == 0) {
        if (parent != KVC_NONE) return KVC_EINVAL;
    } else {
        if (parent >= pc->n_blocks || !pc->entries[parent].cached) return KVC_EINVAL;
        if (kvc_pool_refcount(pc->pool, parent) == 0) return KVC_EINVAL;
        if (memcmp(entry_tokens(pc, parent), tok - bs, bs * sizeof(kvc_token_t)) != 0 ||
            !ns_equal(&pc->ns[parent], ns))
            return KVC_EINVAL;
        if (q->hashes && !kvc_hash128_eq(q->hashes[index - 1], pc->entries[parent].hash))
            return KVC_EINVAL;
    }
    extra_t extras[MAX_EXTRA_KEYS];
    int n_extra = q->n_mm ? block_extras(q, index, bs, pc->params.max_extra_keys, extras) : 0;
    if (n_extra < 0) return KVC_ERANGE;
    kvc_hash128_t h;
    if (q->hashes) {
        h = q->hashes[index];
    } else {
        kvc_hash128_t ph = parent == KVC_NONE ? (kvc_hash128_t){0, 0} : pc->entries[parent].hash;
        h = block_hash(pc, ph, ns_digest(pc, ns), tok, extras, n_extra);
    }
    bool collided = false;
    uint32_t found = find_exact(pc, h, parent, ns, tok, extras, n_extra, &collided);
    if (found != KVC_NONE) {
        if (found != block) pc->stats.n_duplicates++;
        if (canonical) *canonical = found;
        return 0;
    }
    entry_t *e = &pc->entries[block];
    if (e->cached) return KVC_EINVAL; /* cached with another identity */

    *e = (entry_t){.hash = h, .parent = parent, .cached = 1, .n_extra = (uint8_t)n_extra};
    memcpy(entry_tokens(pc, block), tok, bs * sizeof(kvc_token_t));
    pc->ns[block] = *ns;
    if (n_extra) memcpy(entry_extras(pc, block), extras, (size_t)n_extra * sizeof(extra_t));
    uint32_t *head = &pc->buckets[bucket_of(pc, h)];
    e->hnext = *head;
    *head = block;
    if (parent != KVC_NONE) pc->entries[parent].n_children++;
    pc->n_cached++;
    pc->stats.n_inserts++;
    kvc_pool_set_cached(pc->pool, block, true);
    emit(pc, KVC_EVENT_STORED, block);
    if (canonical) *canonical = block;
    return 0;
}

int kvc_prefix_evict(kvc_prefix_t *pc, uint32_t n, uint32_t *n_evicted)
{
    if (!pc) return KVC_EINVAL;
    uint32_t done = 0;
    uint32_t b = kvc_pool_free_cached_first(pc->pool);
    while (done < n && b != KVC_NONE) {
        uint32_t next = kvc_pool_free_next(pc->pool, b);
        if (pc->entries[b].n_children == 0) {
            drop(pc, b);
            kvc_pool_set_cached(pc->pool, b, false); /* moves it to the uncached run */
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
    if (block >= pc->n_blocks || !pc->entries[block].cached) return KVC_ENOENT;
    *hash = pc->entries[block].hash;
    return 0;
}

uint32_t kvc_prefix_block_parent(const kvc_prefix_t *pc, uint32_t block)
{
    return block < pc->n_blocks ? pc->entries[block].parent : KVC_NONE;
}

const kvc_token_t *kvc_prefix_block_tokens(const kvc_prefix_t *pc, uint32_t block)
{
    return block < pc->n_blocks && pc->entries[block].cached ? entry_tokens(pc, block) : NULL;
}

void kvc_prefix_stats(const kvc_prefix_t *pc, kvc_prefix_stats_t *out)
{
    *out = pc->stats;
    out->n_cached_blocks = pc->n_cached;
    kvc_pool_stats_t ps;
    kvc_pool_stats(pc->pool, &ps);
    out->n_cached_free = ps.n_free_cached;
}

/* ---- invariants ------------------------------------------------------------- */
__attribute__((format(printf, 3, 4))) static int fail(char *msg, size_t cap, const char *fmt, ...)
{
    if (msg && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, cap, fmt, ap);
        va_end(ap);
    }
    return KVC_ECORRUPT;
}

/* The hash block b's stored identity chains to, from its parent's stored hash. */
static kvc_hash128_t recompute(const kvc_prefix_t *pc, uint32_t b)
{
    const entry_t *e = &pc->entries[b];
    kvc_hash128_t ph = e->parent == KVC_NONE ? (kvc_hash128_t){0, 0} : pc->entries[e->parent].hash;
    return block_hash(pc, ph, ns_digest(pc, &pc->ns[b]), entry_tokens(pc, b), entry_extras(pc, b),
                      e->n_extra);
}

uint32_t kvc_prefix_count_stranded(const kvc_prefix_t *pc)
{
    /* A cached block is reachable iff its parent link is sound (parent cached, and the stored
     * hash chains from the parent's) and its parent is reachable.  Walk each block's ancestry;
     * depth is bounded by the number of cached blocks. */
    uint32_t stranded = 0;
    for (uint32_t b = 0; b < pc->n_blocks; b++) {
        if (!pc->entries[b].cached) continue;
        uint32_t x = b, steps = 0;
        bool ok = true;
        while (ok && x != KVC_NONE) {
            const entry_t *e = &pc->entries[x];
            if (!e->cached || !kvc_hash128_eq(recompute(pc, x), e->hash) || ++steps > pc->n_cached)
                ok = false;
            x = e->parent;
        }
        stranded += !ok;
    }
    return stranded;
}

int kvc_prefix_check(const kvc_prefix_t *pc, char *msg, size_t cap)
{
    int rc = kvc_pool_check(pc->pool, msg, cap);
    if (rc) return rc;
    uint32_t n_cached = 0;
    /* Chains: every entry in a chain is cached, in the right bucket, and appears once. */
    uint32_t in_chains = 0;
    for (uint32_t k = 0; k <= pc->bucket_mask; k++) {
        for (uint32_t b = pc->buckets[k]; b != KVC_NONE; b = pc->entries[b].hnext) {
            if (b >= pc->n_blocks) return fail(msg, cap, "bucket %u: bad block id %u", k, b);
            if (!pc->entries[b].cached) return fail(msg, cap, "uncached block %u in bucket %u", b, k);
            if (bucket_of(pc, pc->entries[b].hash) != k)
                return fail(msg, cap, "block %u is in bucket %u, its hash says another", b, k);
            if (++in_chains > pc->n_blocks) return fail(msg, cap, "hash chains: cycle");
        }
    }
    for (uint32_t b = 0; b < pc->n_blocks; b++) {
        const entry_t *e = &pc->entries[b];
        bool pool_cached = kvc_pool_is_cached(pc->pool, b);
        if (!!e->cached != pool_cached)
            return fail(msg, cap, "block %u: cache says %s, pool says %s", b,
                        e->cached ? "cached" : "uncached", pool_cached ? "cached" : "uncached");
        if (!e->cached) {
            if (e->n_children) return fail(msg, cap, "uncached block %u has %u children", b, e->n_children);
            continue;
        }
        n_cached++;
        if (e->parent != KVC_NONE) {
            if (e->parent >= pc->n_blocks || !pc->entries[e->parent].cached)
                return fail(msg, cap, "block %u: parent %u is not cached (stranded)", b, e->parent);
            if (!ns_equal(&pc->ns[e->parent], &pc->ns[b]))
                return fail(msg, cap, "block %u: namespace differs from its parent's", b);
        }
        if (!kvc_hash128_eq(recompute(pc, b), e->hash))
            return fail(msg, cap, "block %u: stored hash does not chain from its identity", b);
    }
    if (n_cached != in_chains || n_cached != pc->n_cached)
        return fail(msg, cap, "%u cached blocks, %u in chains, counter says %u", n_cached, in_chains,
                    pc->n_cached);
    /* Exactly one cached block per identity, and the index finds it. */
    for (uint32_t b = 0; b < pc->n_blocks; b++) {
        const entry_t *e = &pc->entries[b];
        if (!e->cached) continue;
        bool collided = false;
        uint32_t f = find_exact(pc, e->hash, e->parent, &pc->ns[b], entry_tokens(pc, b),
                                entry_extras(pc, b), e->n_extra, &collided);
        if (f != b) return fail(msg, cap, "block %u: the index finds %u for its identity", b, f);
    }
    /* Child counts, exactly: count again from the children's side. */
    uint32_t *counted = kvc_calloc(NULL, pc->n_blocks, sizeof(uint32_t), 0);
    if (!counted) return KVC_ENOMEM;
    for (uint32_t b = 0; b < pc->n_blocks; b++)
        if (pc->entries[b].cached && pc->entries[b].parent != KVC_NONE) counted[pc->entries[b].parent]++;
    for (uint32_t b = 0; b < pc->n_blocks; b++) {
        if (counted[b] != pc->entries[b].n_children) {
            uint32_t want = counted[b];
            kvc_free(NULL, counted);
            return fail(msg, cap, "block %u: %u cached children, counter says %u", b, want,
                        pc->entries[b].n_children);
        }
    }
    kvc_free(NULL, counted);
    return 0;
}
