/* test_prefix_tier.c - the pool and prefix primitives the KV tiers build on: fenced (pending)
 * blocks that are matchable only once committed (DESIGN.md invariant 11), pins for copy that
 * let a tier read a block without racing its eviction and without making it look used, and
 * the hashes a lookup continues with in a tier.  Focused tests for each function and each of
 * its errors, then a randomized model-based test: requests, a fake in-memory tier fed by
 * offloads and read by fetches that fail their checksum now and then, evictions under
 * pressure, with the invariant checkers and the test's own invariants after every operation. */
#include "test_helpers.h"
#include "kvcache/testing.h"
#include "pool/pool_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BS 4

typedef struct {
    kvc_pool_t *pool;
    kvc_prefix_t *pc;
} cache_t;

typedef struct {
    int n_stored, n_removed;
    uint32_t last_stored;
    kvc_prefix_t *pc; /* set: the STORED callback pins the block for copy */
    int pin_rc;
} events_t;

static void on_event(void *ctx, const kvc_prefix_event_t *ev)
{
    events_t *e = ctx;
    if (ev->type == KVC_EVENT_STORED) {
        e->n_stored++;
        e->last_stored = ev->block;
        if (e->pc) e->pin_rc = kvc_prefix_pin_for_copy(e->pc, ev->block);
    } else {
        e->n_removed++;
    }
}

static cache_t make_cache_ev(uint32_t n_blocks, kvc_eviction_t policy, events_t *ev)
{
    cache_t c = {0};
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = n_blocks;
    pp.block_size = BS;
    assert_ok(kvc_pool_create(&pp, &c.pool));
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 2026;
    cp.eviction = policy;
    if (ev) {
        cp.on_event = on_event;
        cp.event_ctx = ev;
    }
    assert_ok(kvc_prefix_create(c.pool, &cp, &c.pc));
    return c;
}

static cache_t make_cache(uint32_t n_blocks)
{
    return make_cache_ev(n_blocks, KVC_EVICT_LRU, NULL);
}

static void free_cache(cache_t *c)
{
    kvc_prefix_destroy(c->pc);
    kvc_pool_destroy(c->pool);
}

static kvc_prefix_query_t query(const kvc_token_t *t, size_t n)
{
    return (kvc_prefix_query_t){.tokens = t, .n_tokens = n};
}

static uint32_t alloc1(cache_t *c)
{
    uint32_t b;
    assert_ok(kvc_pool_alloc(c->pool, 1, &b));
    return b;
}

/* Hit length of a lookup that pins nothing. */
static size_t matched(cache_t *c, const kvc_prefix_query_t *q)
{
    kvc_prefix_hit_t h;
    assert_ok(kvc_prefix_match(c->pc, q, NULL, 0, NULL, &h));
    return h.n_matched_blocks;
}

static kvc_prefix_stats_t stats(cache_t *c)
{
    kvc_prefix_stats_t s;
    kvc_prefix_stats(c->pc, &s);
    return s;
}

/* ---- fenced blocks ------------------------------------------------------------- */
static void pending_block_is_a_miss_until_committed(void **state)
{
    (void)state;
    events_t ev = {0};
    cache_t c = make_cache_ev(16, KVC_EVICT_LRU, &ev);
    const kvc_token_t t[13] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    kvc_prefix_query_t q = query(t, 13);
    uint32_t a = alloc1(&c), b = alloc1(&c), canon;
    assert_ok(kvc_prefix_insert(c.pc, &q, 0, KVC_NONE, a, &canon));
    assert_int_equal(ev.n_stored, 1);
    assert_ok(kvc_prefix_insert_pending(c.pc, &q, 1, a, b, &canon));
    assert_int_equal(canon, b);
    assert_int_equal(ev.n_stored, 1); /* no event before the commit */
    assert_int_equal(kvc_prefix_block_flags(c.pc, b), KVC_PREFIX_BLOCK_PENDING);
    assert_int_equal(kvc_pool_refcount(c.pool, b), 2); /* the fetcher's and the fence's */
    assert_false(kvc_pool_is_cached(c.pool, b));
    assert_prefix_ok(c.pc);

    /* match, probe, lookup, introspection: a miss */
    assert_int_equal(matched(&c, &q), 1);
    kvc_block_status_t st[4];
    kvc_prefix_hit_t h;
    assert_ok(kvc_prefix_match(c.pc, &q, NULL, 0, st, &h));
    assert_int_equal(st[1], KVC_BLOCK_MISS);
    uint32_t present[3];
    size_t n_present;
    assert_ok(kvc_prefix_probe(c.pc, &q, 3, present, &n_present));
    assert_int_equal(n_present, 1);
    assert_int_equal(present[1], KVC_NONE);
    uint32_t got[4];
    assert_ok(kvc_prefix_lookup(c.pc, &q, got, 4, &h));
    assert_int_equal(h.n_hit_blocks, 1);
    assert_ok(kvc_pool_release(c.pool, got, 1));
    kvc_hash128_t hh;
    assert_int_equal(kvc_prefix_block_hash(c.pc, b, &hh), KVC_ENOENT);
    assert_null(kvc_prefix_block_tokens(c.pc, b));
    assert_int_equal(kvc_prefix_block_parent(c.pc, b), KVC_NONE);

    /* the fetcher may let go of it: the fence still holds it, so nothing can reuse it */
    assert_ok(kvc_pool_unref(c.pool, b));
    assert_int_equal(kvc_pool_refcount(c.pool, b), 1);
    assert_prefix_ok(c.pc);
    kvc_prefix_stats_t s = stats(&c);
    assert_int_equal(s.n_pending, 1);

    assert_ok(kvc_prefix_commit(c.pc, b, &canon));
    assert_int_equal(canon, b);
    assert_int_equal(ev.n_stored, 2);
    assert_int_equal(ev.last_stored, b);
    assert_int_equal(kvc_prefix_block_flags(c.pc, b), KVC_PREFIX_BLOCK_CACHED);
    assert_int_equal(kvc_pool_refcount(c.pool, b), 0); /* free, cached: hittable */
    assert_true(kvc_pool_is_cached(c.pool, b));
    assert_int_equal(matched(&c, &q), 2);
    assert_ok(kvc_prefix_block_hash(c.pc, b, &hh));
    assert_int_equal(kvc_prefix_block_parent(c.pc, b), a);
    s = stats(&c);
    assert_int_equal(s.n_pending, 0);
    assert_int_equal(s.n_commits, 1);
    assert_int_equal(s.n_inserts, 2);
    assert_prefix_ok(c.pc);
    assert_ok(kvc_pool_unref(c.pool, a));
    assert_int_equal(kvc_pool_n_free(c.pool), 16);
    free_cache(&c);
}

static void fetched_chain_commits_root_first(void **state)
{
    (void)state;
    cache_t c = make_cache(16);
    const kvc_token_t t[13] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    kvc_prefix_query_t q = query(t, 13);
    uint32_t blk[3], canon;
    assert_ok(kvc_pool_alloc(c.pool, 3, blk));
    assert_ok(kvc_prefix_insert_pending(c.pc, &q, 0, KVC_NONE, blk[0], &canon));
    assert_ok(kvc_prefix_insert_pending(c.pc, &q, 1, blk[0], blk[1], &canon));
    assert_ok(kvc_prefix_insert_pending(c.pc, &q, 2, blk[1], blk[2], &canon));
    assert_prefix_ok(c.pc);
    assert_int_equal(matched(&c, &q), 0);
    /* the order rule: a child waits for its parent */
    assert_int_equal(kvc_prefix_commit(c.pc, blk[2], &canon), KVC_EBUSY);
    assert_int_equal(kvc_prefix_commit(c.pc, blk[1], &canon), KVC_EBUSY);
    assert_int_equal(stats(&c).n_pending, 3);
    assert_ok(kvc_prefix_commit(c.pc, blk[0], &canon));
    assert_int_equal(matched(&c, &q), 1);
    assert_ok(kvc_prefix_commit(c.pc, blk[1], &canon));
    assert_int_equal(matched(&c, &q), 2);
    assert_ok(kvc_prefix_commit(c.pc, blk[2], &canon));
    assert_int_equal(matched(&c, &q), 3);
    assert_prefix_ok(c.pc);
    /* committed: ordinary cached blocks, evicted leaf first */
    assert_ok(kvc_pool_release(c.pool, blk, 3));
    uint32_t n_ev;
    assert_ok(kvc_prefix_evict(c.pc, 16, &n_ev));
    assert_int_equal(n_ev, 3);
    assert_prefix_ok(c.pc);
    free_cache(&c);
}

static void abort_drops_the_block_and_its_pending_descendants(void **state)
{
    (void)state;
    cache_t c = make_cache(16);
    const kvc_token_t t[17] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
    kvc_prefix_query_t q = query(t, 17);
    uint32_t blk[4], canon, n;
    assert_ok(kvc_pool_alloc(c.pool, 4, blk));
    assert_ok(kvc_prefix_insert(c.pc, &q, 0, KVC_NONE, blk[0], &canon));
    for (size_t i = 1; i < 4; i++)
        assert_ok(kvc_prefix_insert_pending(c.pc, &q, i, blk[i - 1], blk[i], &canon));
    /* an unrelated pending root, listed after them: untouched by the cascade */
    const kvc_token_t u[5] = {9, 9, 9, 9, 9};
    kvc_prefix_query_t qu = query(u, 5);
    uint32_t other = alloc1(&c);
    assert_ok(kvc_prefix_insert_pending(c.pc, &qu, 0, KVC_NONE, other, &canon));
    assert_ok(kvc_prefix_abort(c.pc, blk[2], &n));
    assert_int_equal(n, 2); /* blk[2] and blk[3] */
    assert_prefix_ok(c.pc);
    assert_int_equal(kvc_prefix_block_flags(c.pc, blk[1]), KVC_PREFIX_BLOCK_PENDING);
    assert_int_equal(kvc_prefix_block_flags(c.pc, blk[2]), 0);
    assert_int_equal(kvc_prefix_block_flags(c.pc, blk[3]), 0);
    assert_int_equal(kvc_prefix_block_flags(c.pc, other), KVC_PREFIX_BLOCK_PENDING);
    assert_int_equal(kvc_pool_refcount(c.pool, blk[3]), 1); /* the fetcher's only */
    /* their fetchers learn it at commit */
    assert_int_equal(kvc_prefix_commit(c.pc, blk[3], &canon), KVC_ENOENT);
    assert_int_equal(kvc_prefix_abort(c.pc, blk[2], NULL), KVC_ENOENT);
    kvc_prefix_stats_t s = stats(&c);
    assert_int_equal(s.n_aborts, 2);
    assert_int_equal(s.n_pending, 2);
    /* an aborted block can be computed instead, into the same memory */
    assert_ok(kvc_prefix_commit(c.pc, blk[1], &canon));
    assert_ok(kvc_prefix_insert(c.pc, &q, 2, blk[1], blk[2], &canon));
    assert_int_equal(canon, blk[2]);
    assert_int_equal(matched(&c, &q), 3);
    /* abort of a root with no parent */
    assert_ok(kvc_prefix_abort(c.pc, other, &n));
    assert_int_equal(n, 1);
    assert_prefix_ok(c.pc);
    assert_ok(kvc_pool_release(c.pool, blk, 4));
    assert_ok(kvc_pool_unref(c.pool, other));
    assert_int_equal(kvc_pool_n_free(c.pool), 16);
    assert_prefix_ok(c.pc);
    free_cache(&c);
}

static void computed_block_wins_over_a_pending_copy(void **state)
{
    (void)state;
    events_t ev = {0};
    cache_t c = make_cache_ev(16, KVC_EVICT_LRU, &ev);
    const kvc_token_t t[13] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    kvc_prefix_query_t q = query(t, 13);
    /* a fetch of blocks 0 and 1 (pending), while a request computes block 0 */
    uint32_t f[2], r0 = alloc1(&c), canon;
    assert_ok(kvc_pool_alloc(c.pool, 2, f));
    assert_ok(kvc_prefix_insert_pending(c.pc, &q, 0, KVC_NONE, f[0], &canon));
    assert_ok(kvc_prefix_insert_pending(c.pc, &q, 1, f[0], f[1], &canon));
    assert_ok(kvc_prefix_insert(c.pc, &q, 0, KVC_NONE, r0, &canon));
    assert_int_equal(canon, r0); /* the computed one is cached at once */
    assert_int_equal(matched(&c, &q), 1);
    assert_int_equal(ev.n_stored, 1);
    assert_prefix_ok(c.pc);
    /* the fetch completes: block 0 resolves to the computed copy, block 1 moves under it */
    assert_ok(kvc_prefix_commit(c.pc, f[0], &canon));
    assert_int_equal(canon, r0);
    assert_int_equal(ev.n_stored, 1); /* nothing new was stored */
    assert_int_equal(kvc_prefix_block_flags(c.pc, f[0]), 0);
    assert_int_equal(kvc_pool_refcount(c.pool, f[0]), 1); /* the fetcher's, to swap out */
    assert_prefix_ok(c.pc);
    assert_ok(kvc_prefix_commit(c.pc, f[1], &canon));
    assert_int_equal(canon, f[1]);
    assert_int_equal(kvc_prefix_block_parent(c.pc, f[1]), r0);
    assert_int_equal(matched(&c, &q), 2);
    assert_int_equal(ev.n_stored, 2);
    kvc_prefix_stats_t s = stats(&c);
    assert_int_equal(s.n_duplicates, 1);
    assert_int_equal(s.n_commits, 2);
    assert_prefix_ok(c.pc);

    /* the same when the computed block arrives with its own child: both pending copies
     * resolve, in order */
    const kvc_token_t u[9] = {7, 7, 7, 7, 8, 8, 8, 8, 0};
    kvc_prefix_query_t qu = query(u, 9);
    uint32_t g[2], r[2];
    assert_ok(kvc_pool_alloc(c.pool, 2, g));
    assert_ok(kvc_pool_alloc(c.pool, 2, r));
    assert_ok(kvc_prefix_insert_pending(c.pc, &qu, 0, KVC_NONE, g[0], &canon));
    assert_ok(kvc_prefix_insert_pending(c.pc, &qu, 1, g[0], g[1], &canon));
    assert_ok(kvc_prefix_insert(c.pc, &qu, 0, KVC_NONE, r[0], &canon));
    assert_ok(kvc_prefix_insert(c.pc, &qu, 1, r[0], r[1], &canon));
    assert_ok(kvc_prefix_commit(c.pc, g[0], &canon));
    assert_int_equal(canon, r[0]);
    assert_ok(kvc_prefix_commit(c.pc, g[1], &canon));
    assert_int_equal(canon, r[1]);
    assert_int_equal(kvc_prefix_block_flags(c.pc, g[1]), 0);
    assert_int_equal(matched(&c, &qu), 2);
    assert_prefix_ok(c.pc);

    /* a fetch of an identity already committed needs no copy: insert_pending says so */
    uint32_t x = alloc1(&c);
    assert_ok(kvc_prefix_insert_pending(c.pc, &qu, 0, KVC_NONE, x, &canon));
    assert_int_equal(canon, r[0]);
    assert_int_equal(kvc_prefix_block_flags(c.pc, x), 0);
    assert_int_equal(kvc_pool_refcount(c.pool, x), 1);
    assert_prefix_ok(c.pc);

    assert_ok(kvc_pool_release(c.pool, f, 2));
    assert_ok(kvc_pool_release(c.pool, g, 2));
    assert_ok(kvc_pool_release(c.pool, r, 2));
    assert_ok(kvc_pool_unref(c.pool, r0));
    assert_ok(kvc_pool_unref(c.pool, x));
    assert_int_equal(kvc_pool_n_free(c.pool), 16);
    assert_prefix_ok(c.pc);
    free_cache(&c);
}

static void insert_pending_errors(void **state)
{
    (void)state;
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.max_extra_keys = 1;
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = 16;
    pp.block_size = BS;
    cache_t c = {0};
    assert_ok(kvc_pool_create(&pp, &c.pool));
    assert_ok(kvc_prefix_create(c.pool, &cp, &c.pc));
    const kvc_token_t t[13] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    const kvc_token_t w[13] = {1, 2, 3, 0, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    kvc_prefix_query_t q = query(t, 13), qw = query(w, 13);
    uint32_t a = alloc1(&c), b = alloc1(&c), d = alloc1(&c), canon = 77;
    assert_ok(kvc_prefix_insert(c.pc, &q, 0, KVC_NONE, a, &canon));
    canon = 77;
    kvc_prefix_query_t bad = q;
    bad.tokens = NULL;
    assert_int_equal(kvc_prefix_insert_pending(NULL, &q, 1, a, b, &canon), KVC_EINVAL);
    assert_int_equal(kvc_prefix_insert_pending(c.pc, &bad, 1, a, b, &canon), KVC_EINVAL);
    assert_int_equal(kvc_prefix_insert_pending(c.pc, &q, 3, a, b, &canon),
                     KVC_EINVAL); /* partial */
    assert_int_equal(kvc_prefix_insert_pending(c.pc, &q, 1, a, 99, &canon), KVC_EINVAL);
    assert_int_equal(kvc_prefix_insert_pending(c.pc, &q, 1, a, 15, &canon), KVC_EINVAL); /* free */
    assert_int_equal(kvc_prefix_insert_pending(c.pc, &q, 0, a, b, &canon), KVC_EINVAL);  /* root */
    assert_int_equal(kvc_prefix_insert_pending(c.pc, &q, 1, d, b, &canon),
                     KVC_EINVAL); /* uncached */
    assert_int_equal(kvc_prefix_insert_pending(c.pc, &qw, 1, a, b, &canon),
                     KVC_EINVAL);                                                       /* tokens */
    assert_int_equal(kvc_prefix_insert_pending(c.pc, &q, 1, a, a, &canon), KVC_EINVAL); /* cached */
    kvc_mm_input_t mm[2] = {{.hash = {1, 1}, .start = 4, .length = 1},
                            {.hash = {2, 2}, .start = 5, .length = 1}};
    kvc_prefix_query_t qm = q;
    qm.mm = mm;
    qm.n_mm = 2;
    assert_int_equal(kvc_prefix_insert_pending(c.pc, &qm, 1, a, b, &canon), KVC_ERANGE);
    assert_int_equal(canon, 77); /* nothing written on error */
    assert_int_equal(stats(&c).n_pending, 0);
    assert_int_equal(kvc_pool_refcount(c.pool, b), 1);
    /* the first fetch of an identity, then a second one: refused, naming the first */
    assert_ok(kvc_prefix_insert_pending(c.pc, &q, 1, a, b, &canon));
    assert_int_equal(kvc_prefix_insert_pending(c.pc, &q, 1, a, d, &canon), KVC_EBUSY);
    assert_int_equal(canon, b);
    assert_int_equal(kvc_pool_refcount(c.pool, d), 1);
    /* a pending block cannot be given another identity, pending or computed */
    assert_int_equal(kvc_prefix_insert_pending(c.pc, &qw, 0, KVC_NONE, b, &canon), KVC_EINVAL);
    assert_int_equal(kvc_prefix_insert(c.pc, &qw, 0, KVC_NONE, b, &canon), KVC_EINVAL);
    /* a computed block never chains from a pending one (its KV is not there yet) */
    assert_int_equal(kvc_prefix_insert(c.pc, &q, 2, b, d, &canon), KVC_EINVAL);
    /* a pending parent that does not hold block index - 1 */
    assert_int_equal(kvc_prefix_insert_pending(c.pc, &q, 1, b, d, &canon), KVC_EINVAL);
    assert_prefix_ok(c.pc);
    assert_int_equal(stats(&c).n_pending, 1);
    /* commit and abort errors */
    assert_int_equal(kvc_prefix_commit(NULL, b, &canon), KVC_EINVAL);
    assert_int_equal(kvc_prefix_commit(c.pc, 99, &canon), KVC_EINVAL);
    assert_int_equal(kvc_prefix_commit(c.pc, d, &canon), KVC_ENOENT); /* never pending */
    assert_int_equal(kvc_prefix_commit(c.pc, a, &canon), KVC_ENOENT); /* committed */
    assert_int_equal(kvc_prefix_abort(NULL, b, NULL), KVC_EINVAL);
    assert_int_equal(kvc_prefix_abort(c.pc, 99, NULL), KVC_EINVAL);
    assert_int_equal(kvc_prefix_abort(c.pc, a, NULL), KVC_ENOENT);
    assert_int_equal(kvc_prefix_abort(c.pc, d, NULL), KVC_ENOENT);
    assert_ok(kvc_prefix_commit(c.pc, b, NULL));
    assert_int_equal(kvc_prefix_commit(c.pc, b, NULL), KVC_ENOENT); /* twice */
    assert_prefix_ok(c.pc);
    assert_ok(kvc_pool_unref(c.pool, a));
    assert_ok(kvc_pool_unref(c.pool, b));
    assert_ok(kvc_pool_unref(c.pool, d));
    free_cache(&c);
}

static void pending_blocks_are_never_evicted_or_reused(void **state)
{
    (void)state;
    for (int pol = 0; pol < KVC_EVICT__COUNT; pol++) {
        cache_t c = make_cache_ev(8, (kvc_eviction_t)pol, NULL);
        const kvc_token_t t[13] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
        kvc_prefix_query_t q = query(t, 13);
        uint32_t blk[3], canon;
        assert_ok(kvc_pool_alloc(c.pool, 3, blk));
        assert_ok(kvc_prefix_insert(c.pc, &q, 0, KVC_NONE, blk[0], &canon));
        assert_ok(kvc_prefix_insert_pending(c.pc, &q, 1, blk[0], blk[1], &canon));
        assert_ok(kvc_prefix_insert_pending(c.pc, &q, 2, blk[1], blk[2], &canon));
        /* the fetcher gives up its references (still fetching): everything but the pending
         * blocks is free, and their parent, though free, is held back by them */
        assert_ok(kvc_pool_release(c.pool, blk, 3));
        assert_int_equal(kvc_pool_n_free(c.pool), 6);
        uint32_t n_ev;
        assert_ok(kvc_prefix_evict(c.pc, 8, &n_ev));
        assert_int_equal(n_ev, 0); /* not even naive-lru strands a pending child */
        uint32_t all[6];
        assert_int_equal(kvc_pool_alloc(c.pool, 6, all), KVC_EBUSY);
        assert_ok(kvc_pool_alloc(c.pool, 5, all));
        for (int i = 0; i < 5; i++) assert_true(all[i] != blk[1] && all[i] != blk[2]);
        assert_true(kvc_prefix_block_flags(c.pc, blk[0]) & KVC_PREFIX_BLOCK_CACHED);
        assert_prefix_ok(c.pc);
        assert_ok(kvc_prefix_commit(c.pc, blk[1], NULL));
        assert_ok(kvc_prefix_commit(c.pc, blk[2], NULL));
        assert_int_equal(matched(&c, &q), 3);
        assert_ok(kvc_pool_release(c.pool, all, 5));
        assert_int_equal(kvc_pool_n_free(c.pool), 8);
        assert_prefix_ok(c.pc);
        free_cache(&c);
    }
}

static void destroy_gives_back_the_fences_references(void **state)
{
    (void)state;
    cache_t c = make_cache(8);
    const kvc_token_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    kvc_prefix_query_t q = query(t, 9);
    uint32_t blk[2];
    assert_ok(kvc_pool_alloc(c.pool, 2, blk));
    assert_ok(kvc_prefix_insert_pending(c.pc, &q, 0, KVC_NONE, blk[0], NULL));
    assert_ok(kvc_prefix_insert_pending(c.pc, &q, 1, blk[0], blk[1], NULL));
    assert_ok(kvc_pool_release(c.pool, blk, 2));
    assert_int_equal(kvc_pool_n_free(c.pool), 6);
    kvc_prefix_destroy(c.pc);
    assert_int_equal(kvc_pool_n_free(c.pool), 8);
    assert_pool_ok(c.pool);
    kvc_pool_destroy(c.pool);
}

static void sliding_window_blocks_can_be_fenced(void **state)
{
    (void)state;
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = 16;
    pp.block_size = BS;
    cache_t c = {0};
    assert_ok(kvc_pool_create(&pp, &c.pool));
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.group_window[1] = 2 * BS;
    assert_ok(kvc_prefix_create(c.pool, &cp, &c.pc));
    kvc_namespace_t ns = {.group = 1};
    const kvc_token_t t[13] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    kvc_prefix_query_t q = query(t, 13);
    q.ns = &ns;
    uint32_t blk[3];
    assert_ok(kvc_pool_alloc(c.pool, 3, blk));
    /* no parent links: committed in any order, each a miss until then */
    for (size_t i = 0; i < 3; i++)
        assert_ok(kvc_prefix_insert_pending(c.pc, &q, i, KVC_NONE, blk[i], NULL));
    assert_prefix_ok(c.pc);
    kvc_prefix_hit_t h;
    assert_ok(kvc_prefix_match(c.pc, &q, NULL, 0, NULL, &h));
    assert_int_equal(h.n_matched_blocks, 0);
    assert_ok(kvc_prefix_commit(c.pc, blk[2], NULL));
    assert_ok(kvc_prefix_commit(c.pc, blk[1], NULL));
    assert_ok(kvc_prefix_match(c.pc, &q, NULL, 0, NULL, &h));
    assert_int_equal(h.n_hit_blocks, 3); /* the last window: blocks 1 and 2 */
    assert_ok(kvc_prefix_abort(c.pc, blk[0], NULL));
    assert_prefix_ok(c.pc);
    assert_ok(kvc_pool_release(c.pool, blk, 3));
    free_cache(&c);
}

/* ---- pins for copy ------------------------------------------------------------- */
/* n single-block prompts {k, k, k, k, k}, inserted and released in order: free cached roots,
 * least recently freed first. */
static void fill_roots(cache_t *c, uint32_t n, uint32_t *blocks)
{
    for (uint32_t k = 0; k < n; k++) {
        kvc_token_t t[5] = {(kvc_token_t)k, (kvc_token_t)k, (kvc_token_t)k, (kvc_token_t)k, 0};
        kvc_prefix_query_t q = query(t, 5);
        blocks[k] = alloc1(c);
        assert_ok(kvc_prefix_insert(c->pc, &q, 0, KVC_NONE, blocks[k], NULL));
        assert_ok(kvc_pool_unref(c->pool, blocks[k]));
    }
}

/* The free queue's cached blocks, head first. */
static uint32_t queue_cached(cache_t *c, uint32_t *out, uint32_t cap)
{
    uint32_t n = 0;
    for (uint32_t b = kvc__pool_free_cached_first(c->pool); b != KVC_NONE && n < cap;) {
        out[n++] = b;
        assert_ok(kvc__pool_free_next(c->pool, b, &b));
    }
    return n;
}

static void offload_takes_the_next_victims_without_moving_them(void **state)
{
    (void)state;
    cache_t c = make_cache(8);
    uint32_t roots[6], got[8], n, before[8], after[8];
    fill_roots(&c, 6, roots);
    uint32_t nb = queue_cached(&c, before, 8);
    assert_int_equal(nb, 6);
    assert_ok(kvc_prefix_offload_begin(c.pc, 2, got, &n));
    assert_int_equal(n, 2);
    assert_int_equal(got[0], roots[0]); /* the pool's eviction order */
    assert_int_equal(got[1], roots[1]);
    assert_int_equal(kvc_prefix_block_flags(c.pc, roots[0]),
                     KVC_PREFIX_BLOCK_CACHED | KVC_PREFIX_BLOCK_COPYING);
    assert_prefix_ok(c.pc);
    /* a second call offers the next ones */
    assert_ok(kvc_prefix_offload_begin(c.pc, 1, got + 2, &n));
    assert_int_equal(n, 1);
    assert_int_equal(got[2], roots[2]);
    assert_int_equal(stats(&c).n_copy_pinned, 3);
    /* pinned for copy: still free and in place, but not evictable */
    assert_int_equal(queue_cached(&c, after, 8), 6);
    assert_memory_equal(before, after, sizeof(uint32_t) * 6);
    uint32_t n_ev;
    assert_ok(kvc_prefix_evict(c.pc, 1, &n_ev));
    assert_int_equal(n_ev, 1);
    assert_false(kvc_pool_is_cached(c.pool, roots[3])); /* the first one not pinned */
    uint32_t x[3];
    assert_ok(kvc_pool_alloc(c.pool, 3, x)); /* 2 never used + roots[3], uncached now */
    uint32_t y;
    assert_ok(kvc_pool_alloc(c.pool, 1, &y));
    assert_int_equal(y, roots[4]); /* past the pinned ones */
    assert_prefix_ok(c.pc);
    /* a lookup hit on a pinned block works; the copy keeps reading the same bytes */
    kvc_token_t t0[5] = {0, 0, 0, 0, 0};
    kvc_prefix_query_t q0 = query(t0, 5);
    uint32_t hitb[2];
    kvc_prefix_hit_t h;
    assert_ok(kvc_prefix_lookup(c.pc, &q0, hitb, 2, &h));
    assert_int_equal(h.n_hit_blocks, 1);
    assert_int_equal(hitb[0], roots[0]);
    assert_true(kvc_prefix_block_flags(c.pc, roots[0]) & KVC_PREFIX_BLOCK_COPYING);
    assert_prefix_ok(c.pc);
    /* end the copies: nothing moved, so the free queue is as it was (roots[0] is in use) */
    assert_ok(kvc_prefix_offload_end(c.pc, roots[1], true));
    assert_ok(kvc_prefix_offload_end(c.pc, roots[2], false));
    assert_ok(kvc_prefix_offload_end(c.pc, roots[0], true));
    assert_int_equal(queue_cached(&c, after, 8), 3);
    assert_int_equal(after[0], roots[1]);
    assert_int_equal(after[1], roots[2]);
    assert_int_equal(after[2], roots[5]);
    assert_int_equal(kvc_prefix_block_flags(c.pc, roots[1]),
                     KVC_PREFIX_BLOCK_CACHED | KVC_PREFIX_BLOCK_OFFLOADED);
    assert_int_equal(kvc_prefix_block_flags(c.pc, roots[2]), KVC_PREFIX_BLOCK_CACHED);
    kvc_prefix_stats_t s = stats(&c);
    assert_int_equal(s.n_copy_pinned, 0);
    assert_int_equal(s.n_offloaded, 2);
    assert_int_equal(s.n_copies_begun, 3);
    assert_int_equal(s.n_copies_done, 2);
    assert_int_equal(s.n_copies_failed, 1);
    assert_prefix_ok(c.pc);
    /* offloaded blocks are not offered again; the failed copy is, then one never offered */
    assert_ok(kvc_prefix_offload_begin(c.pc, 8, got, &n));
    assert_int_equal(n, 2);
    assert_int_equal(got[0], roots[2]);
    assert_int_equal(got[1], roots[5]);
    assert_ok(kvc_prefix_offload_end(c.pc, roots[2], true));
    assert_ok(kvc_prefix_offload_end(c.pc, roots[5], true));
    assert_ok(kvc_prefix_offload_begin(c.pc, 8, got, &n));
    assert_int_equal(n, 0);
    /* a use while the copy ran leaves the mark (the copy is of the bytes the block still
     * holds); a use after it clears the mark, and the block is offered again */
    kvc_token_t t1[5] = {1, 1, 1, 1, 1};
    kvc_prefix_query_t q1 = query(t1, 5);
    assert_int_equal(kvc_prefix_block_flags(c.pc, roots[0]),
                     KVC_PREFIX_BLOCK_CACHED | KVC_PREFIX_BLOCK_OFFLOADED);
    assert_ok(kvc_prefix_lookup(c.pc, &q1, hitb + 1, 1, &h));
    assert_int_equal(hitb[1], roots[1]);
    assert_int_equal(kvc_prefix_block_flags(c.pc, roots[1]), KVC_PREFIX_BLOCK_CACHED);
    assert_int_equal(stats(&c).n_offloaded, 3); /* roots[0], [2], [5] */
    assert_ok(kvc_pool_release(c.pool, hitb, 2));
    assert_ok(kvc_prefix_offload_begin(c.pc, 8, got, &n));
    assert_int_equal(n, 1);
    assert_int_equal(got[0], roots[1]);
    for (uint32_t i = 0; i < n; i++) assert_ok(kvc_prefix_offload_end(c.pc, got[i], true));
    assert_prefix_ok(c.pc);
    assert_ok(kvc_pool_release(c.pool, x, 3));
    assert_ok(kvc_pool_unref(c.pool, y));
    free_cache(&c);
}

static void offload_offers_leaves_only(void **state)
{
    (void)state;
    cache_t c = make_cache(8);
    const kvc_token_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    kvc_prefix_query_t q = query(t, 9);
    uint32_t blk[2], got[4], n;
    assert_ok(kvc_pool_alloc(c.pool, 2, blk));
    assert_ok(kvc_prefix_insert(c.pc, &q, 0, KVC_NONE, blk[0], NULL));
    assert_ok(kvc_prefix_insert(c.pc, &q, 1, blk[0], blk[1], NULL));
    /* released head first: the parent is ahead in the queue, but held back by its child */
    assert_ok(kvc_pool_unref(c.pool, blk[0]));
    assert_ok(kvc_pool_unref(c.pool, blk[1]));
    assert_ok(kvc_prefix_offload_begin(c.pc, 4, got, &n));
    assert_int_equal(n, 1);
    assert_int_equal(got[0], blk[1]);
    /* the pinned child keeps its parent from eviction too */
    uint32_t n_ev;
    assert_ok(kvc_prefix_evict(c.pc, 4, &n_ev));
    assert_int_equal(n_ev, 0);
    assert_ok(kvc_prefix_offload_end(c.pc, blk[1], true));
    assert_ok(kvc_prefix_evict(c.pc, 1, &n_ev));
    assert_int_equal(n_ev, 1);
    assert_ok(kvc_prefix_offload_begin(c.pc, 4, got, &n));
    assert_int_equal(n, 1);
    assert_int_equal(got[0], blk[0]); /* a leaf now */
    assert_ok(kvc_prefix_offload_end(c.pc, blk[0], true));
    assert_prefix_ok(c.pc);
    free_cache(&c);
}

static void pin_for_copy_from_the_stored_event(void **state)
{
    (void)state;
    events_t ev = {0};
    cache_t c = make_cache_ev(8, KVC_EVICT_LRU, &ev);
    ev.pc = c.pc;
    const kvc_token_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    kvc_prefix_query_t q = query(t, 9);
    uint32_t a = alloc1(&c), b = alloc1(&c);
    assert_ok(kvc_prefix_insert(c.pc, &q, 0, KVC_NONE, a, NULL));
    assert_int_equal(ev.pin_rc, 0);
    assert_int_equal(kvc_prefix_block_flags(c.pc, a),
                     KVC_PREFIX_BLOCK_CACHED | KVC_PREFIX_BLOCK_COPYING);
    /* committed fetched blocks are stored too, and pinned the same way */
    assert_ok(kvc_prefix_insert_pending(c.pc, &q, 1, a, b, NULL));
    assert_int_equal(ev.n_stored, 1);
    assert_ok(kvc_prefix_commit(c.pc, b, NULL));
    assert_int_equal(ev.n_stored, 2);
    assert_int_equal(ev.pin_rc, 0);
    assert_true(kvc_prefix_block_flags(c.pc, b) & KVC_PREFIX_BLOCK_COPYING);
    assert_prefix_ok(c.pc);
    /* the request finishes while the copies run: the blocks stay (free, cached, pinned) */
    assert_ok(kvc_pool_unref(c.pool, b));
    assert_ok(kvc_pool_unref(c.pool, a));
    uint32_t n_ev, all[7];
    assert_ok(kvc_prefix_evict(c.pc, 8, &n_ev));
    assert_int_equal(n_ev, 0);
    assert_int_equal(kvc_pool_alloc(c.pool, 7, all), KVC_EBUSY);
    assert_ok(kvc_pool_alloc(c.pool, 6, all));
    assert_prefix_ok(c.pc);
    /* errors */
    assert_int_equal(kvc_prefix_pin_for_copy(NULL, a), KVC_EINVAL);
    assert_int_equal(kvc_prefix_pin_for_copy(c.pc, a), KVC_EBUSY);
    assert_int_equal(kvc_prefix_pin_for_copy(c.pc, all[0]), KVC_ENOENT); /* uncached */
    assert_int_equal(kvc_prefix_pin_for_copy(c.pc, 99), KVC_ENOENT);
    uint32_t p;
    assert_ok(kvc_pool_release(c.pool, all, 6));
    assert_ok(kvc_prefix_offload_end(c.pc, b, true));
    assert_ok(kvc_prefix_evict(c.pc, 1, &n_ev)); /* b: a leaf, and no longer pinned */
    assert_int_equal(n_ev, 1);
    p = alloc1(&c);
    kvc_prefix_query_t qp = query((const kvc_token_t[]){5, 5, 5, 5, 5}, 5);
    ev.pc = NULL;
    assert_ok(kvc_prefix_insert_pending(c.pc, &qp, 0, KVC_NONE, p, NULL));
    assert_int_equal(kvc_prefix_pin_for_copy(c.pc, p), KVC_ENOENT); /* pending */
    assert_int_equal(kvc_prefix_offload_end(NULL, a, true), KVC_EINVAL);
    assert_int_equal(kvc_prefix_offload_end(c.pc, p, true), KVC_ENOENT);
    assert_int_equal(kvc_prefix_offload_end(c.pc, 99, true), KVC_ENOENT);
    assert_int_equal(kvc_prefix_offload_end(c.pc, b, true), KVC_ENOENT); /* evicted */
    assert_ok(kvc_prefix_offload_end(c.pc, a, false));
    assert_int_equal(kvc_prefix_offload_end(c.pc, a, false), KVC_ENOENT); /* twice */
    assert_int_equal(kvc_prefix_offload_begin(NULL, 1, all, &n_ev), KVC_EINVAL);
    assert_int_equal(kvc_prefix_offload_begin(c.pc, 1, NULL, &n_ev), KVC_EINVAL);
    assert_int_equal(kvc_prefix_offload_begin(c.pc, 1, all, NULL), KVC_EINVAL);
    assert_ok(kvc_prefix_offload_begin(c.pc, 0, NULL, &n_ev));
    assert_int_equal(n_ev, 0);
    assert_ok(kvc_prefix_abort(c.pc, p, NULL));
    assert_ok(kvc_pool_unref(c.pool, p));
    assert_prefix_ok(c.pc);
    free_cache(&c);
}

/* ---- tier continuation --------------------------------------------------------- */
static void replicas_with_one_seed_agree_on_hashes_and_fingerprints(void **state)
{
    (void)state;
    cache_t a = make_cache(8), b = make_cache(8); /* both hash_seed 2026: two replicas */
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 2027;
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.block_size = BS;
    cache_t o = {0};
    assert_ok(kvc_pool_create(&pp, &o.pool));
    assert_ok(kvc_prefix_create(o.pool, &cp, &o.pc));
    kvc_token_t t[17];
    for (int i = 0; i < 17; i++) t[i] = (kvc_token_t)(i * 7 + 3);
    kvc_prefix_query_t q = query(t, 17);
    kvc_hash128_t ha[4], hb[4], ho[4], fa[4], fb[4], fo[4];
    size_t n;
    assert_ok(kvc_prefix_hash(a.pc, &q, ha, 4, &n));
    assert_ok(kvc_prefix_hash(b.pc, &q, hb, 4, &n));
    assert_ok(kvc_prefix_hash(o.pc, &q, ho, 4, &n));
    assert_ok(kvc_prefix_fingerprint(a.pc, &q, fa, 4, &n));
    assert_ok(kvc_prefix_fingerprint(b.pc, &q, fb, 4, &n));
    assert_ok(kvc_prefix_fingerprint(o.pc, &q, fo, 4, &n));
    for (int i = 0; i < 4; i++) {
        assert_true(kvc_hash128_eq(ha[i], hb[i]));
        assert_true(kvc_hash128_eq(fa[i], fb[i]));
        assert_false(kvc_hash128_eq(ha[i], ho[i])); /* another deployment */
        assert_false(kvc_hash128_eq(fa[i], fo[i]));
        assert_false(kvc_hash128_eq(ha[i], fa[i])); /* an independent chain */
    }
    assert_int_equal(kvc_prefix_seed(a.pc), 2026);
    /* continuing after a hit of h blocks: hash_next from the last hit block's stored hash
     * gives what kvc_prefix_hash gives for blocks h, h + 1, ... */
    uint32_t blk[2];
    assert_ok(kvc_pool_alloc(a.pool, 2, blk));
    assert_ok(kvc_prefix_insert(a.pc, &q, 0, KVC_NONE, blk[0], NULL));
    assert_ok(kvc_prefix_insert(a.pc, &q, 1, blk[0], blk[1], NULL));
    uint32_t got[4];
    kvc_prefix_hit_t h;
    assert_ok(kvc_prefix_lookup(a.pc, &q, got, 4, &h));
    assert_int_equal(h.n_hit_blocks, 2);
    kvc_hash128_t prev, prev_fp = fa[h.n_hit_blocks - 1], nh, nf;
    assert_ok(kvc_prefix_block_hash(a.pc, got[h.n_hit_blocks - 1], &prev));
    for (size_t i = h.n_hit_blocks; i < 4; i++) {
        assert_ok(kvc_prefix_hash_next(b.pc, &q, i, &prev, &prev_fp, &nh, &nf));
        assert_true(kvc_hash128_eq(nh, ha[i]));
        assert_true(kvc_hash128_eq(nf, fa[i]));
        prev = nh;
        prev_fp = nf;
    }
    assert_ok(kvc_pool_release(a.pool, got, 2));
    assert_ok(kvc_pool_release(a.pool, blk, 2));
    free_cache(&a);
    free_cache(&b);
    free_cache(&o);
}

/* ---- the randomized model-based test ------------------------------------------- */
#define MB      48 /* pool blocks */
#define MT      26 /* prompt tokens, at most: 6 full blocks and a partial one */
#define MFULL   (MT / BS)
#define MLIVE   6
#define TIERCAP 64 /* records in the fake tier (oldest dropped first) */

/* The fake tier: a record per block hash, with the identity a real tier stores (hash and
 * fingerprint) and the "bytes": here, the whole token prefix the KV was computed from, and a
 * checksum of them written with the record. */
typedef struct {
    bool used;
    kvc_hash128_t hash, fp;
    int plen;
    kvc_token_t prefix[MT];
    uint64_t checksum;
    uint64_t age;
} record_t;

/* What the test knows of each pool block: the prefix its bytes hold (plen 0: nothing
 * meaningful), and whether a copy out of it is in flight. */
typedef struct {
    int plen;
    kvc_token_t prefix[MT];
    bool copying; /* pinned for copy by the test */
    int copy_plen;
    kvc_token_t copy_prefix[MT]; /* what it held when the copy began */
} content_t;

enum { R_FREE = 0, R_FETCHING, R_DONE };

typedef struct {
    int state;
    kvc_token_t t[MT];
    size_t n;
    uint32_t table[MFULL + 1];
    size_t n_table;
    size_t hit;          /* blocks hit in the pool */
    size_t fetch_next;   /* next block of the fetched run to commit */
    size_t fetch_end;    /* the run is [hit, fetch_end) */
    bool pending[MFULL]; /* table[i] is pending (ours) */
} req_t;

typedef struct {
    cache_t c;
    kvc_rng_t r;
    record_t tier[TIERCAP];
    uint64_t clock;
    content_t content[MB];
    req_t req[MLIVE];
    kvc_token_t bases[4][MT];
    bool weak; /* index hash cut to a few bits: the tier continuation trusts the hash alone */
    uint64_t n_fetched, n_commits_seen, n_aborts_seen, n_resolved, n_offloads, n_corrupt,
        n_lookup_hits, n_pinned_hits, n_tier_hits, n_alloc_fail, n_ebusy_fetch, n_out_of_order;
} world_t;

static uint64_t checksum(const kvc_token_t *t, int n)
{
    return kvc_hash128(t, (size_t)n * sizeof(kvc_token_t), 0x636b73756d).lo;
}

static record_t *tier_find(world_t *w, kvc_hash128_t h)
{
    for (int i = 0; i < TIERCAP; i++)
        if (w->tier[i].used && kvc_hash128_eq(w->tier[i].hash, h)) return &w->tier[i];
    return NULL;
}

static void tier_put(world_t *w, kvc_hash128_t h, kvc_hash128_t fp, const kvc_token_t *p, int plen)
{
    record_t *r = tier_find(w, h);
    if (!r) {
        r = &w->tier[0];
        for (int i = 0; i < TIERCAP; i++) {
            if (!w->tier[i].used) {
                r = &w->tier[i];
                break;
            }
            if (w->tier[i].age < r->age) r = &w->tier[i];
        }
    }
    *r = (record_t){.used = true, .hash = h, .fp = fp, .plen = plen, .age = ++w->clock};
    memcpy(r->prefix, p, (size_t)plen * sizeof(kvc_token_t));
    r->checksum = checksum(p, plen);
    /* a bit flipped at rest, now and then: the fetch's checksum must catch it */
    if (kvc_rng_below(&w->r, 16) == 0) r->prefix[kvc_rng_below(&w->r, (uint64_t)plen)] ^= 1 << 8;
}

static bool prefix_eq(const kvc_token_t *a, int na, const kvc_token_t *b, int nb)
{
    return na == nb && memcmp(a, b, (size_t)na * sizeof(kvc_token_t)) == 0;
}

static void gen_prompt(world_t *w, req_t *q)
{
    q->n = 1 + kvc_rng_below(&w->r, MT);
    memcpy(q->t, w->bases[kvc_rng_below(&w->r, 4)], q->n * sizeof(kvc_token_t));
    if (kvc_rng_below(&w->r, 3) == 0)
        for (size_t i = kvc_rng_below(&w->r, q->n); i < q->n; i++)
            q->t[i] = (kvc_token_t)kvc_rng_below(&w->r, 3);
}

static kvc_prefix_query_t req_query(const req_t *q)
{
    return query(q->t, q->n);
}

/* The test's own invariants, after every operation. */
static void check_world(world_t *w)
{
    cache_t *c = &w->c;
    assert_prefix_ok(c->pc);
    uint32_t holders[MB] = {0};
    uint32_t n_pending = 0, n_copying = 0;
    for (int i = 0; i < MLIVE; i++) {
        const req_t *q = &w->req[i];
        if (q->state == R_FREE) continue;
        for (size_t j = 0; j < q->n_table; j++)
            if (q->table[j] != KVC_NONE) holders[q->table[j]]++;
        for (size_t j = 0; j < MFULL; j++) {
            if (!q->pending[j]) continue;
            n_pending++;
            /* pending: never matchable, never cached, held by the fence */
            assert_int_equal(kvc_prefix_block_flags(c->pc, q->table[j]), KVC_PREFIX_BLOCK_PENDING);
            holders[q->table[j]]++;
        }
        /* no lookup can reach a pending block: probe the request's own prompt */
        kvc_prefix_query_t pq = req_query(q);
        uint32_t present[MFULL];
        size_t nf = q->n / BS;
        assert_ok(kvc_prefix_probe(c->pc, &pq, nf, present, NULL));
        for (size_t j = 0; j < nf; j++)
            if (present[j] != KVC_NONE)
                assert_false(kvc_prefix_block_flags(c->pc, present[j]) & KVC_PREFIX_BLOCK_PENDING);
    }
    for (uint32_t b = 0; b < MB; b++) {
        /* refcounts balance: the tables that hold a block, plus a pending block's fence */
        assert_int_equal(kvc_pool_refcount(c->pool, b), holders[b]);
        const content_t *ct = &w->content[b];
        uint32_t fl = kvc_prefix_block_flags(c->pc, b);
        if (ct->copying) {
            /* an in-flight offload block is never evicted, and its bytes never change */
            n_copying++;
            assert_int_equal(fl & (KVC_PREFIX_BLOCK_CACHED | KVC_PREFIX_BLOCK_COPYING),
                             KVC_PREFIX_BLOCK_CACHED | KVC_PREFIX_BLOCK_COPYING);
            assert_true(prefix_eq(ct->prefix, ct->plen, ct->copy_prefix, ct->copy_plen));
        } else {
            assert_false(fl & KVC_PREFIX_BLOCK_COPYING);
        }
        /* a cached block's bytes are its identity: the tokens it holds are the ones it was
         * computed (or fetched and verified) from */
        if (fl & KVC_PREFIX_BLOCK_CACHED) {
            /* ... and so is every block up its chain: the KV was computed from exactly the
             * prefix the chain of identities spells */
            assert_true(ct->plen >= BS);
            int end = ct->plen;
            for (uint32_t x = b; x != KVC_NONE; x = kvc_prefix_block_parent(c->pc, x)) {
                const kvc_token_t *bt = kvc_prefix_block_tokens(c->pc, x);
                assert_non_null(bt);
                assert_true(end >= BS);
                assert_memory_equal(bt, ct->prefix + end - BS, BS * sizeof(kvc_token_t));
                end -= BS;
            }
            /* (naive-lru strands blocks: their chain ends early, at a parent gone) */
            if (kvc_prefix_eviction(c->pc) != KVC_EVICT_NAIVE_LRU) assert_int_equal(end, 0);
        }
    }
    kvc_prefix_stats_t s = stats(c);
    assert_int_equal(s.n_pending, n_pending);
    assert_int_equal(s.n_copy_pinned, n_copying);
}

/* Abort the request's pending block j: the cascade takes exactly the rest of its fetched run
 * (nobody else can chain below it: a lookup never returns a pending block). */
static void req_abort_from(world_t *w, req_t *q, size_t j)
{
    uint32_t n, mine = 0;
    assert_ok(kvc_prefix_abort(w->c.pc, q->table[j], &n));
    for (size_t k = j; k < MFULL; k++) {
        if (!q->pending[k]) continue;
        assert_int_equal(kvc_prefix_block_flags(w->c.pc, q->table[k]), 0);
        mine++;
        q->pending[k] = false;
    }
    assert_int_equal(n, mine);
    w->n_aborts_seen++;
}

/* Give the request's table back (aborting its fetches first). */
static void req_finish(world_t *w, req_t *q)
{
    for (size_t j = 0; j < MFULL; j++)
        if (q->pending[j]) {
            req_abort_from(w, q, j);
            break;
        }
    assert_ok(kvc_pool_release(w->c.pool, (const uint32_t *)q->table, (uint32_t)q->n_table));
    q->state = R_FREE;
}

/* Blocks [from, n_full) of the request: computed into its own blocks, inserted. */
static void req_compute(world_t *w, req_t *q, size_t from)
{
    kvc_prefix_query_t pq = req_query(q);
    size_t nf = q->n / BS;
    for (size_t i = from; i < nf; i++) {
        uint32_t b = q->table[i], canon;
        content_t *ct = &w->content[b];
        assert_false(ct->copying); /* a block in use by a request is never one being copied */
        ct->plen = (int)((i + 1) * BS);
        memcpy(ct->prefix, q->t, (size_t)ct->plen * sizeof(kvc_token_t));
        uint32_t parent = i ? q->table[i - 1] : KVC_NONE;
        assert_ok(kvc_prefix_insert(w->c.pc, &pq, i, parent, b, &canon));
        if (canon != b) { /* computed twice: share the cached copy */
            assert_true(
                prefix_eq(w->content[canon].prefix, w->content[canon].plen, ct->prefix, ct->plen));
            assert_ok(kvc_pool_ref(w->c.pool, canon));
            assert_ok(kvc_pool_unref(w->c.pool, b));
            q->table[i] = canon;
        }
    }
    q->state = R_DONE;
}

/* A new request: look up, continue in the tier, fence the fetched run, compute nothing yet. */
static void op_start(world_t *w, req_t *q)
{
    cache_t *c = &w->c;
    gen_prompt(w, q);
    memset(q->pending, 0, sizeof q->pending);
    kvc_prefix_query_t pq = req_query(q);
    size_t n_all = (q->n + BS - 1) / BS, nf = q->n / BS;
    kvc_prefix_hit_t h;
    assert_ok(kvc_prefix_lookup(c->pc, &pq, q->table, n_all, &h));
    q->hit = h.n_hit_blocks;
    for (size_t i = 0; i < q->hit; i++) {
        /* a match never hands out other tokens */
        const content_t *ct = &w->content[q->table[i]];
        assert_true(prefix_eq(ct->prefix, ct->plen, q->t, (int)((i + 1) * BS)));
        w->n_pinned_hits += ct->copying;
    }
    w->n_lookup_hits += q->hit;
    int rc = kvc_pool_alloc(c->pool, (uint32_t)(n_all - q->hit), q->table + q->hit);
    if (rc) {
        assert_true(rc == KVC_ENOSPC || rc == KVC_EBUSY);
        w->n_alloc_fail++;
        assert_ok(kvc_pool_release(c->pool, q->table, (uint32_t)q->hit));
        q->state = R_FREE;
        return;
    }
    q->n_table = n_all;
    for (size_t i = q->hit; i < n_all; i++) w->content[q->table[i]].plen = 0; /* fresh memory */
    /* the tier continuation: hashes of blocks hit, hit + 1, ... (never the last token) */
    kvc_hash128_t hs[MFULL], fps[MFULL];
    size_t n;
    assert_ok(kvc_prefix_hash(c->pc, &pq, hs, MFULL, &n));
    assert_ok(kvc_prefix_fingerprint(c->pc, &pq, fps, MFULL, &n));
    const size_t max_hit = q->n ? (q->n - 1) / BS : 0;
    size_t end = q->hit;
    while (end < max_hit && end < nf) {
        const record_t *r = tier_find(w, hs[end]);
        if (!r || (!w->weak && !kvc_hash128_eq(r->fp, fps[end]))) break;
        uint32_t parent = end ? q->table[end - 1] : KVC_NONE, canon;
        rc = kvc_prefix_insert_pending(c->pc, &pq, end, parent, q->table[end], &canon);
        if (rc == KVC_EBUSY) { /* another request is fetching it: recompute from here */
            assert_true(kvc_prefix_block_flags(c->pc, canon) & KVC_PREFIX_BLOCK_PENDING);
            w->n_ebusy_fetch++;
            break;
        }
        assert_ok(rc);
        if (canon != q->table[end]) { /* committed meanwhile (by an earlier block's resolution) */
            assert_ok(kvc_pool_ref(c->pool, canon));
            assert_ok(kvc_pool_unref(c->pool, q->table[end]));
            q->table[end] = canon;
        } else {
            q->pending[end] = true;
            w->n_tier_hits++;
        }
        end++;
    }
    q->fetch_next = q->hit;
    q->fetch_end = end;
    if (end == q->hit) {
        req_compute(w, q, q->hit);
        return;
    }
    q->state = R_FETCHING;
}

/* The next block of a fetch: copy from the tier, verify, commit or abort (and then compute
 * the rest). */
static void op_fetch_step(world_t *w, req_t *q)
{
    cache_t *c = &w->c;
    size_t i = q->fetch_next;
    if (!q->pending[i]) { /* resolved to a committed block at insert_pending */
        q->fetch_next++;
        if (q->fetch_next == q->fetch_end) req_compute(w, q, q->fetch_end);
        return;
    }
    uint32_t b = q->table[i], canon;
    kvc_prefix_query_t pq = req_query(q);
    kvc_hash128_t hs[MFULL];
    size_t n;
    assert_ok(kvc_prefix_hash(c->pc, &pq, hs, MFULL, &n));
    const record_t *r = tier_find(w, hs[i]);
    content_t *ct = &w->content[b];
    bool ok = r != NULL;
    if (ok) { /* the copy, then the checks a tier makes: checksum and identity */
        ct->plen = r->plen;
        memcpy(ct->prefix, r->prefix, (size_t)r->plen * sizeof(kvc_token_t));
        ok = checksum(ct->prefix, ct->plen) == r->checksum &&
             prefix_eq(ct->prefix, ct->plen, q->t, (int)((i + 1) * BS));
        if (!ok) w->n_corrupt++;
    }
    if (kvc_rng_below(&w->r, 12) == 0) ok = false; /* a timeout */
    if (!ok) {
        req_abort_from(w, q, i);
        req_compute(w, q, i); /* recompute from the failed block, into the same memory */
        return;
    }
    /* the order rule: a later block of the run waits for this one */
    for (size_t k = i + 1; k < q->fetch_end; k++)
        if (q->pending[k] && kvc_rng_below(&w->r, 2) == 0) {
            assert_int_equal(kvc_prefix_commit(c->pc, q->table[k], &canon), KVC_EBUSY);
            w->n_out_of_order++;
            break;
        }
    /* ours are committed in order, so the parent is committed now */
    int rc = kvc_prefix_commit(c->pc, b, &canon);
    assert_ok(rc);
    q->pending[i] = false;
    w->n_commits_seen++;
    if (canon != b) { /* computed meanwhile: share it */
        w->n_resolved++;
        assert_true(
            prefix_eq(w->content[canon].prefix, w->content[canon].plen, q->t, (int)((i + 1) * BS)));
        assert_ok(kvc_pool_ref(c->pool, canon));
        assert_ok(kvc_pool_unref(c->pool, b));
        q->table[i] = canon;
    }
    w->n_fetched++;
    q->fetch_next++;
    if (q->fetch_next == q->fetch_end) req_compute(w, q, q->fetch_end);
}

static void op_offload_begin(world_t *w)
{
    uint32_t got[8], n;
    assert_ok(kvc_prefix_offload_begin(w->c.pc, (uint32_t)kvc_rng_below(&w->r, 5), got, &n));
    for (uint32_t i = 0; i < n; i++) {
        content_t *ct = &w->content[got[i]];
        assert_false(ct->copying);
        assert_int_equal(kvc_pool_refcount(w->c.pool, got[i]), 0); /* a candidate: free */
        ct->copying = true;
        ct->copy_plen = ct->plen;
        memcpy(ct->copy_prefix, ct->prefix, sizeof ct->prefix);
    }
}

static void op_offload_end(world_t *w, uint32_t b)
{
    content_t *ct = &w->content[b];
    bool copied = kvc_rng_below(&w->r, 8) != 0;
    if (copied) { /* the copy reads the block's bytes now, at the end of the flight */
        kvc_hash128_t h;
        assert_ok(kvc_prefix_block_hash(w->c.pc, b, &h));
        /* its fingerprint, from the identity the tier would store with it */
        kvc_prefix_query_t pq = query(ct->prefix, (size_t)ct->plen);
        kvc_hash128_t fps[MFULL], hs[MFULL];
        size_t n;
        assert_ok(kvc_prefix_fingerprint(w->c.pc, &pq, fps, MFULL, &n));
        assert_ok(kvc_prefix_hash(w->c.pc, &pq, hs, MFULL, &n));
        assert_true(kvc_hash128_eq(hs[n - 1], h));
        tier_put(w, h, fps[n - 1], ct->prefix, ct->plen);
        w->n_offloads++;
    }
    assert_ok(kvc_prefix_offload_end(w->c.pc, b, copied));
    ct->copying = false;
}

static struct {
    uint64_t n_fetched, n_aborts, n_corrupt, n_offloads, n_resolved, n_pinned_hits, n_out_of_order;
} seen;

static void run_model(uint64_t seed, int n_ops, kvc_eviction_t policy, uint32_t hash_bits)
{
    world_t *w = calloc(1, sizeof *w);
    assert_non_null(w);
    w->c = make_cache_ev(MB, policy, NULL);
    if (hash_bits < 128) {
        assert_ok(kvc_testing_prefix_set_hash_bits(w->c.pc, hash_bits));
        w->weak = true;
    }
    kvc_rng_seed(&w->r, seed);
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < MT; i++) w->bases[k][i] = (kvc_token_t)kvc_rng_below(&w->r, 5);
    for (int op = 0; op < n_ops; op++) {
        uint64_t dice = kvc_rng_below(&w->r, 100);
        req_t *q = &w->req[kvc_rng_below(&w->r, MLIVE)];
        if (dice < 30) {
            if (q->state == R_FREE)
                op_start(w, q);
            else if (q->state == R_FETCHING)
                op_fetch_step(w, q);
            else
                req_finish(w, q);
        } else if (dice < 55) {
            if (q->state == R_FETCHING) op_fetch_step(w, q);
        } else if (dice < 70) {
            if (q->state != R_FREE && kvc_rng_below(&w->r, 3) == 0) req_finish(w, q);
        } else if (dice < 82) {
            op_offload_begin(w);
        } else if (dice < 94) {
            uint32_t b = (uint32_t)kvc_rng_below(&w->r, MB);
            for (uint32_t k = 0; k < MB; k++, b = (b + 1) % MB)
                if (w->content[b].copying) {
                    op_offload_end(w, b);
                    break;
                }
        } else if (dice < 97) {
            uint32_t n_ev;
            assert_ok(kvc_prefix_evict(w->c.pc, (uint32_t)kvc_rng_below(&w->r, 4), &n_ev));
        } else {
            /* pressure: a burst of allocations that evicts what it can, then gives it back */
            uint32_t tmp[MB];
            uint32_t n = (uint32_t)kvc_rng_below(&w->r, MB / 2);
            int rc = kvc_pool_alloc(w->c.pool, n, tmp);
            if (rc == 0) {
                for (uint32_t i = 0; i < n; i++) {
                    assert_false(w->content[tmp[i]].copying);
                    w->content[tmp[i]].plen = 0; /* scribbled on */
                }
                assert_ok(kvc_pool_release(w->c.pool, tmp, n));
            } else {
                assert_true(rc == KVC_ENOSPC || rc == KVC_EBUSY);
            }
        }
        check_world(w);
    }
    /* drain: every fetch resolved, every copy ended, every table released: all blocks free */
    for (int i = 0; i < MLIVE; i++) {
        while (w->req[i].state == R_FETCHING) op_fetch_step(w, &w->req[i]);
        if (w->req[i].state == R_DONE) req_finish(w, &w->req[i]);
        check_world(w);
    }
    for (uint32_t b = 0; b < MB; b++)
        if (w->content[b].copying) op_offload_end(w, b);
    check_world(w);
    kvc_prefix_stats_t s = stats(&w->c);
    assert_int_equal(s.n_pending, 0);
    assert_int_equal(s.n_copy_pinned, 0);
    assert_int_equal(kvc_pool_n_free(w->c.pool), MB);
    assert_int_equal(s.n_commits, w->n_commits_seen);
    free_cache(&w->c);
    if (getenv("KVC_TEST_VERBOSE"))
        printf("seed %llu %s: fetched %llu (tier hits %llu, resolved %llu), aborts %llu, corrupt "
               "%llu, offloads %llu, hits %llu (%llu while pinned for copy), alloc fails %llu, "
               "second fetches refused %llu\n",
               (unsigned long long)seed, kvc_eviction_name(policy),
               (unsigned long long)w->n_fetched, (unsigned long long)w->n_tier_hits,
               (unsigned long long)w->n_resolved, (unsigned long long)w->n_aborts_seen,
               (unsigned long long)w->n_corrupt, (unsigned long long)w->n_offloads,
               (unsigned long long)w->n_lookup_hits, (unsigned long long)w->n_pinned_hits,
               (unsigned long long)w->n_alloc_fail, (unsigned long long)w->n_ebusy_fetch);
    seen.n_fetched += w->n_fetched;
    seen.n_aborts += w->n_aborts_seen;
    seen.n_corrupt += w->n_corrupt;
    seen.n_offloads += w->n_offloads;
    seen.n_resolved += w->n_resolved;
    seen.n_pinned_hits += w->n_pinned_hits;
    seen.n_out_of_order += w->n_out_of_order;
    free(w);
}

/* The runs of one test exercised what they are for (summed over its seeds: the sanitizer
 * build runs fewer operations). */
static void assert_seen_everything(void)
{
    assert_true(seen.n_fetched > 0 && seen.n_aborts > 0 && seen.n_corrupt > 0 &&
                seen.n_offloads > 0 && seen.n_resolved > 0 && seen.n_pinned_hits > 0 &&
                seen.n_out_of_order > 0);
    memset(&seen, 0, sizeof seen);
}

static void model_with_a_fake_tier(void **state)
{
    (void)state;
    const int n_ops = 40000 / KVC_TEST_SANITIZER_DIVISOR;
    for (uint64_t seed = 1; seed <= 4; seed++) run_model(seed, n_ops, KVC_EVICT_LRU, 128);
    assert_seen_everything();
}

static void model_with_a_fake_tier_every_policy(void **state)
{
    (void)state;
    const int n_ops = 20000 / KVC_TEST_SANITIZER_DIVISOR;
    for (int pol = 1; pol < KVC_EVICT__COUNT; pol++)
        run_model(100 + (uint64_t)pol, n_ops, (kvc_eviction_t)pol, 128);
    assert_seen_everything();
}

/* With a 5-bit index hash, unrelated blocks share hashes all the time: a tier keyed by the
 * hash returns other prompts' records, which the fetch's identity check must refuse, and the
 * cache's exact identity must keep pending and committed blocks apart. */
static void model_with_a_fake_tier_and_colliding_hashes(void **state)
{
    (void)state;
    const int n_ops = 20000 / KVC_TEST_SANITIZER_DIVISOR;
    for (uint64_t seed = 200; seed < 204; seed++) run_model(seed, n_ops, KVC_EVICT_LRU, 5);
    assert_seen_everything();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pending_block_is_a_miss_until_committed),
        cmocka_unit_test(fetched_chain_commits_root_first),
        cmocka_unit_test(abort_drops_the_block_and_its_pending_descendants),
        cmocka_unit_test(computed_block_wins_over_a_pending_copy),
        cmocka_unit_test(insert_pending_errors),
        cmocka_unit_test(pending_blocks_are_never_evicted_or_reused),
        cmocka_unit_test(destroy_gives_back_the_fences_references),
        cmocka_unit_test(sliding_window_blocks_can_be_fenced),
        cmocka_unit_test(offload_takes_the_next_victims_without_moving_them),
        cmocka_unit_test(offload_offers_leaves_only),
        cmocka_unit_test(pin_for_copy_from_the_stored_event),
        cmocka_unit_test(replicas_with_one_seed_agree_on_hashes_and_fingerprints),
        cmocka_unit_test(model_with_a_fake_tier),
        cmocka_unit_test(model_with_a_fake_tier_every_policy),
        cmocka_unit_test(model_with_a_fake_tier_and_colliding_hashes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
