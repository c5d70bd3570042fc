/* test_prefix.c - block identity and the prefix cache: hashing and what it
 * covers, lookup and the last-token rule, insertion and its errors,
 * leaf-first eviction, events, stats, and the collision proof: with a
 * deliberately weak hash, no request ever receives a block whose tokens (or
 * prefix) differ from its own. */
#include "test_helpers.h"
#include "kvcache/testing.h"
#include "pool/pool_int.h"

#include <string.h>

#define BS 4

typedef struct {
    kvc_pool_t *pool;
    kvc_prefix_t *pc;
} cache_t;

static cache_t make_cache_with(uint32_t n_blocks, uint32_t block_size, kvc_prefix_params_t cp)
{
    cache_t c = {0};
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = n_blocks;
    pp.block_size = block_size;
    assert_ok(kvc_pool_create(&pp, &c.pool));
    assert_ok(kvc_prefix_create(c.pool, &cp, &c.pc));
    assert_prefix_ok(c.pc);
    return c;
}

/* The same with the index hashed by `fn` (testing.h), to force collisions. */
static cache_t make_cache_hashed(uint32_t n_blocks, uint32_t block_size, kvc_prefix_params_t cp,
                                 kvc_hash_fn fn)
{
    cache_t c = make_cache_with(n_blocks, block_size, cp);
    assert_ok(kvc_testing_prefix_set_hash(c.pc, fn));
    return c;
}

static cache_t make_cache(uint32_t n_blocks)
{
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 1234;
    return make_cache_with(n_blocks, BS, cp);
}

static void free_cache(cache_t *c)
{
    kvc_prefix_destroy(c->pc);
    kvc_pool_destroy(c->pool);
}

/* Run a request as a server would: look up (pin), allocate the rest, insert the full blocks
 * (sharing an already-cached copy when insert reports one), return the table in `table` and
 * its length.  The caller releases it. */
static size_t run_request(cache_t *c, const kvc_prefix_query_t *q, uint32_t *table,
                          kvc_prefix_hit_t *hit)
{
    uint32_t bs = kvc_pool_block_size(c->pool);
    size_t n_all = (q->n_tokens + bs - 1) / bs, n_full = q->n_tokens / bs;
    kvc_prefix_hit_t h;
    assert_ok(kvc_prefix_lookup(c->pc, q, table, n_all, &h));
    assert_ok(kvc_pool_alloc(c->pool, (uint32_t)(n_all - h.n_hit_blocks), table + h.n_hit_blocks));
    uint32_t parent = h.n_hit_blocks ? table[h.n_hit_blocks - 1] : KVC_NONE;
    for (size_t i = h.n_hit_blocks; i < n_full; i++) {
        uint32_t canon;
        assert_ok(kvc_prefix_insert(c->pc, q, i, parent, table[i], &canon));
        if (canon != table[i]) {
            assert_ok(kvc_pool_ref(c->pool, canon));
            assert_ok(kvc_pool_unref(c->pool, table[i]));
            table[i] = canon;
        }
        parent = table[i];
    }
    if (hit) *hit = h;
    assert_prefix_ok(c->pc);
    return n_all;
}

static kvc_prefix_query_t query(const kvc_token_t *t, size_t n)
{
    return (kvc_prefix_query_t){.tokens = t, .n_tokens = n};
}

/* ---- hashing ---------------------------------------------------------- */
static void hash_covers_every_part_of_identity(void **state)
{
    (void)state;
    cache_t c = make_cache(16);
    kvc_token_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kvc_hash128_t base[2], h[2];
    size_t n;
    kvc_prefix_query_t q = query(t, 8);
    assert_ok(kvc_prefix_hash(c.pc, &q, base, 2, &n));
    assert_int_equal(n, 2);
    /* same input, same hashes */
    assert_ok(kvc_prefix_hash(c.pc, &q, h, 2, &n));
    assert_true(kvc_hash128_eq(base[0], h[0]) && kvc_hash128_eq(base[1], h[1]));
    /* a token in block 0 changes both (chaining), a token in block 1 only block 1 */
    t[0] = 9;
    assert_ok(kvc_prefix_hash(c.pc, &q, h, 2, &n));
    assert_false(kvc_hash128_eq(base[0], h[0]));
    assert_false(kvc_hash128_eq(base[1], h[1]));
    t[0] = 1;
    t[7] = 9;
    assert_ok(kvc_prefix_hash(c.pc, &q, h, 2, &n));
    assert_true(kvc_hash128_eq(base[0], h[0]));
    assert_false(kvc_hash128_eq(base[1], h[1]));
    t[7] = 8;
    /* every namespace field changes every block */
    kvc_namespace_t variants[4] = {{.weight_epoch = 1}, {.lora_id = 3}, {.group = 1}, {0}};
    assert_ok(kvc_namespace_set_salt(&variants[3], "tenant-a"));
    for (int v = 0; v < 4; v++) {
        q.ns = &variants[v];
        assert_ok(kvc_prefix_hash(c.pc, &q, h, 2, &n));
        assert_false(kvc_hash128_eq(base[0], h[0]));
        assert_false(kvc_hash128_eq(base[1], h[1]));
    }
    /* the zero namespace is the default one; "" clears a salt */
    kvc_namespace_t zero = {0};
    assert_ok(kvc_namespace_set_salt(&zero, "x"));
    assert_ok(kvc_namespace_set_salt(&zero, ""));
    q.ns = &zero;
    assert_ok(kvc_prefix_hash(c.pc, &q, h, 2, &n));
    assert_true(kvc_hash128_eq(base[0], h[0]));
    /* another seed, other hashes: the seed is per process unless a deployment sets it */
    cache_t d = make_cache(16);
    free_cache(&d);
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 99;
    d = make_cache_with(16, BS, cp);
    q.ns = NULL;
    assert_ok(kvc_prefix_hash(d.pc, &q, h, 2, &n));
    assert_false(kvc_hash128_eq(base[0], h[0]));
    free_cache(&d);
    free_cache(&c);
}

static void random_seed_differs_between_caches(void **state)
{
    (void)state;
    kvc_prefix_params_t cp = kvc_prefix_params_default(); /* hash_seed 0: random */
    cache_t a = make_cache_with(4, BS, cp), b = make_cache_with(4, BS, cp);
    assert_int_not_equal(kvc_prefix_seed(a.pc), 0);
    assert_int_not_equal(kvc_prefix_seed(a.pc), kvc_prefix_seed(b.pc));
    free_cache(&a);
    free_cache(&b);
}

static void hash_handles_partial_blocks_and_capacity(void **state)
{
    (void)state;
    cache_t c = make_cache(4);
    kvc_token_t t[7] = {1, 2, 3, 4, 5, 6, 7};
    kvc_hash128_t h[2];
    size_t n = 99;
    kvc_prefix_query_t q = query(t, 7); /* 1 full block + 3 tokens */
    assert_ok(kvc_prefix_hash(c.pc, &q, h, 2, &n));
    assert_int_equal(n, 1);
    q.n_tokens = 3;
    assert_ok(kvc_prefix_hash(c.pc, &q, NULL, 0, &n));
    assert_int_equal(n, 0);
    q.n_tokens = 8;
    kvc_token_t t8[8] = {0};
    q.tokens = t8;
    assert_int_equal(kvc_prefix_hash(c.pc, &q, h, 1, &n), KVC_ERANGE); /* 2 blocks, room for 1 */
    assert_int_equal(n, 2);
    kvc_prefix_query_t bad = {.tokens = NULL, .n_tokens = 4};
    assert_int_equal(kvc_prefix_hash(c.pc, &bad, h, 2, &n), KVC_EINVAL);
    assert_int_equal(kvc_prefix_hash(c.pc, NULL, h, 2, &n), KVC_EINVAL);
    bad = (kvc_prefix_query_t){.tokens = t, .n_tokens = 4, .mm = NULL, .n_mm = 1};
    assert_int_equal(kvc_prefix_hash(c.pc, &bad, h, 2, &n), KVC_EINVAL);
    free_cache(&c);
}

static void multimodal_inputs_key_the_blocks_they_overlap(void **state)
{
    (void)state;
    cache_t c = make_cache(16);
    kvc_token_t t[12] = {0}; /* placeholder tokens look alike: only the extra keys differ */
    kvc_hash128_t none[3], img_a[3], img_b[3], h[3];
    size_t n;
    kvc_prefix_query_t q = query(t, 12);
    assert_ok(kvc_prefix_hash(c.pc, &q, none, 3, &n));
    /* image A covers positions 5..6: only block 1 and (chained) block 2 change */
    kvc_mm_input_t a = {.hash = {11, 12}, .start = 5, .length = 2};
    q.mm = &a;
    q.n_mm = 1;
    assert_ok(kvc_prefix_hash(c.pc, &q, img_a, 3, &n));
    assert_true(kvc_hash128_eq(none[0], img_a[0]));
    assert_false(kvc_hash128_eq(none[1], img_a[1]));
    assert_false(kvc_hash128_eq(none[2], img_a[2]));
    /* a different image at the same place: different identity */
    kvc_mm_input_t b = a;
    b.hash.lo = 13;
    q.mm = &b;
    assert_ok(kvc_prefix_hash(c.pc, &q, img_b, 3, &n));
    assert_false(kvc_hash128_eq(img_a[1], img_b[1]));
    /* the same image at another offset: different identity */
    b = a;
    b.start = 4;
    assert_ok(kvc_prefix_hash(c.pc, &q, h, 3, &n));
    assert_false(kvc_hash128_eq(img_a[1], h[1]));
    /* the order the inputs are given in does not matter */
    kvc_mm_input_t two[2] = {a, {.hash = {21, 22}, .start = 6, .length = 4}};
    kvc_mm_input_t rev[2] = {two[1], two[0]};
    q.mm = two;
    q.n_mm = 2;
    assert_ok(kvc_prefix_hash(c.pc, &q, img_a, 3, &n));
    q.mm = rev;
    assert_ok(kvc_prefix_hash(c.pc, &q, img_b, 3, &n));
    for (int i = 0; i < 3; i++) assert_true(kvc_hash128_eq(img_a[i], img_b[i]));
    /* too many inputs in one block: ERANGE (max_extra_keys = 4) */
    kvc_mm_input_t many[5];
    for (int i = 0; i < 5; i++)
        many[i] = (kvc_mm_input_t){.hash = {(uint64_t)i, 0}, .start = 0, .length = 1};
    q.mm = many;
    q.n_mm = 5;
    assert_int_equal(kvc_prefix_hash(c.pc, &q, h, 3, &n), KVC_ERANGE);
    /* zero-length inputs are ignored */
    kvc_mm_input_t empty = {.hash = {5, 5}, .start = 0, .length = 0};
    q.mm = &empty;
    q.n_mm = 1;
    assert_ok(kvc_prefix_hash(c.pc, &q, h, 3, &n));
    assert_true(kvc_hash128_eq(none[0], h[0]));
    free_cache(&c);
}

static void multimodal_hits_need_the_same_inputs(void **state)
{
    (void)state;
    cache_t c = make_cache(16);
    kvc_token_t t[10] = {0};
    kvc_mm_input_t img = {.hash = {7, 7}, .start = 1, .length = 6};
    kvc_prefix_query_t q = {.tokens = t, .n_tokens = 10, .mm = &img, .n_mm = 1};
    uint32_t table[3], t2[3];
    size_t n = run_request(&c, &q, table, NULL);
    assert_ok(kvc_pool_release(c.pool, table, (uint32_t)n));
    kvc_prefix_hit_t hit;
    assert_ok(kvc_prefix_lookup(c.pc, &q, t2, 3, &hit)); /* same image: hits */
    assert_int_equal(hit.n_hit_blocks, 2);
    assert_ok(kvc_pool_release(c.pool, t2, 2));
    kvc_mm_input_t other = img;
    other.hash.hi = 8;
    q.mm = &other;
    assert_ok(kvc_prefix_lookup(c.pc, &q, t2, 3, &hit)); /* another image, same tokens: misses */
    assert_int_equal(hit.n_hit_blocks, 0);
    q.n_mm = 0;
    q.mm = NULL;
    assert_ok(kvc_prefix_lookup(c.pc, &q, t2, 3, &hit)); /* no image: misses */
    assert_int_equal(hit.n_hit_blocks, 0);
    free_cache(&c);
}

/* ---- lookup -------------------------------------------------------------- */
static void lookup_never_covers_the_last_token(void **state)
{
    (void)state;
    cache_t c = make_cache(32);
    kvc_token_t t[16];
    for (int i = 0; i < 16; i++) t[i] = i + 1;
    kvc_prefix_query_t q = query(t, 16);
    uint32_t table[4], hits[4];
    size_t n = run_request(&c, &q, table, NULL);
    assert_ok(kvc_pool_release(c.pool, table, (uint32_t)n));
    /* n_tokens -> expected hit blocks: at most (n - 1) / BS, never the block holding the last */
    struct {
        size_t n_tokens, hit;
        bool cut;
    } cases[] = {{16, 3, true}, {15, 3, false}, {13, 3, false}, {12, 2, true},
                 {5, 1, false}, {4, 0, true},   {1, 0, false},  {0, 0, false}};
    for (size_t k = 0; k < KVC_ARRAY_LEN(cases); k++) {
        q.n_tokens = cases[k].n_tokens;
        kvc_prefix_hit_t hit;
        kvc_block_status_t st[4];
        assert_ok(kvc_prefix_match(c.pc, &q, NULL, 0, st, &hit));
        assert_int_equal(hit.n_hit_blocks, cases[k].hit);
        assert_int_equal(hit.cut_by_last_token, cases[k].cut);
        assert_true(hit.n_hit_tokens < q.n_tokens || q.n_tokens == 0);
        if (cases[k].cut) assert_int_equal(st[cases[k].hit], KVC_BLOCK_LAST_TOKEN);
        assert_ok(kvc_prefix_lookup(c.pc, &q, hits, 4, &hit));
        assert_int_equal(hit.n_hit_blocks, cases[k].hit);
        assert_int_equal(hit.n_hit_tokens, cases[k].hit * BS);
        for (size_t i = 0; i < hit.n_hit_blocks; i++) assert_int_equal(hits[i], table[i]);
        assert_ok(kvc_pool_release(c.pool, hits, (uint32_t)hit.n_hit_blocks));
    }
    free_cache(&c);
}

static void lookup_pins_hits_and_respects_cap(void **state)
{
    (void)state;
    cache_t c = make_cache(8);
    kvc_token_t t[13];
    for (int i = 0; i < 13; i++) t[i] = 100 + i;
    kvc_prefix_query_t q = query(t, 13);
    uint32_t table[4], hits[4];
    size_t n = run_request(&c, &q, table, NULL);
    assert_ok(kvc_pool_release(c.pool, table, (uint32_t)n));
    assert_int_equal(kvc_pool_n_free(c.pool), 8);
    kvc_prefix_hit_t hit;
    assert_ok(kvc_prefix_lookup(c.pc, &q, hits, 2, &hit)); /* 3 would hit, room for 2 */
    assert_int_equal(hit.n_hit_blocks, 2);
    assert_int_equal(kvc_pool_refcount(c.pool, hits[0]), 1);
    assert_int_equal(kvc_pool_refcount(c.pool, hits[1]), 1);
    assert_int_equal(kvc_pool_refcount(c.pool, table[2]), 0);
    assert_int_equal(kvc_pool_n_free(c.pool), 6); /* pinned blocks left the free queue */
    /* pinned blocks are never evicted: fill the rest of the pool */
    uint32_t more[6];
    assert_ok(kvc_pool_alloc(c.pool, 6, more));
    assert_int_equal(kvc_pool_alloc(c.pool, 1, more), KVC_ENOSPC);
    assert_non_null(kvc_prefix_block_tokens(c.pc, hits[0]));
    assert_ok(kvc_pool_release(c.pool, more, 6));
    assert_ok(kvc_pool_release(c.pool, hits, 2));
    assert_prefix_ok(c.pc);
    /* bad arguments */
    assert_int_equal(kvc_prefix_lookup(c.pc, &q, NULL, 2, &hit), KVC_EINVAL);
    assert_int_equal(kvc_prefix_lookup(c.pc, NULL, hits, 2, &hit), KVC_EINVAL);
    assert_int_equal(kvc_prefix_match(c.pc, &q, hits, 2, NULL, NULL), KVC_EINVAL);
    free_cache(&c);
}

static void match_explains_every_block(void **state)
{
    (void)state;
    cache_t c = make_cache(16);
    kvc_token_t a[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    kvc_prefix_query_t q = query(a, 10);
    uint32_t table[3];
    size_t n = run_request(&c, &q, table, NULL);
    assert_ok(kvc_pool_release(c.pool, table, (uint32_t)n));
    kvc_token_t b[14] = {1, 2, 3, 4, 5, 6, 0, 8, 9, 10, 11, 12, 13, 14};
    q = query(b, 14);
    kvc_block_status_t st[4];
    uint32_t blocks[4];
    kvc_prefix_hit_t hit;
    assert_ok(kvc_prefix_match(c.pc, &q, blocks, 4, st, &hit));
    assert_int_equal(st[0], KVC_BLOCK_HIT);
    assert_int_equal(st[1], KVC_BLOCK_MISS);
    assert_int_equal(st[2], KVC_BLOCK_AFTER_MISS);
    assert_int_equal(st[3], KVC_BLOCK_PARTIAL);
    assert_int_equal(hit.n_full_blocks, 3);
    assert_int_equal(hit.n_matched_blocks, 1);
    assert_int_equal(blocks[0], table[0]);
    assert_int_equal(kvc_pool_refcount(c.pool, table[0]), 0); /* match does not pin */
    assert_string_equal(kvc_block_status_name(KVC_BLOCK_COLLISION), "collision");
    assert_string_equal(kvc_block_status_name(KVC_BLOCK_LAST_TOKEN), "last-token");
    assert_string_equal(kvc_block_status_name((kvc_block_status_t)42), "?");
    /* precomputed hashes give the same answer */
    kvc_hash128_t h[3];
    size_t nh;
    assert_ok(kvc_prefix_hash(c.pc, &q, h, 3, &nh));
    q.hashes = h;
    kvc_prefix_hit_t hit2;
    assert_ok(kvc_prefix_match(c.pc, &q, NULL, 0, NULL, &hit2));
    assert_int_equal(hit2.n_matched_blocks, 1);
    free_cache(&c);
}

static void namespaces_isolate_tenants_adapters_and_epochs(void **state)
{
    (void)state;
    cache_t c = make_cache(32);
    kvc_token_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    kvc_namespace_t tenant_a = {0}, tenant_b = {0}, lora = {.lora_id = 5},
                    epoch = {.weight_epoch = 2};
    assert_ok(kvc_namespace_set_salt(&tenant_a, "a"));
    assert_ok(kvc_namespace_set_salt(&tenant_b, "b"));
    kvc_prefix_query_t q = {.ns = &tenant_a, .tokens = t, .n_tokens = 9};
    uint32_t table[3], hits[3];
    size_t n = run_request(&c, &q, table, NULL);
    assert_ok(kvc_pool_release(c.pool, table, (uint32_t)n));
    kvc_prefix_hit_t hit;
    const kvc_namespace_t *others[] = {NULL, &tenant_b, &lora, &epoch};
    for (size_t i = 0; i < KVC_ARRAY_LEN(others); i++) {
        q.ns = others[i];
        assert_ok(kvc_prefix_lookup(c.pc, &q, hits, 3, &hit));
        assert_int_equal(hit.n_hit_blocks, 0);
    }
    q.ns = &tenant_a;
    assert_ok(kvc_prefix_lookup(c.pc, &q, hits, 3, &hit));
    assert_int_equal(hit.n_hit_blocks, 2);
    assert_ok(kvc_pool_release(c.pool, hits, 2));
    free_cache(&c);
}

/* ---- insertion ------------------------------------------------------------ */
static void insert_checks_its_arguments(void **state)
{
    (void)state;
    cache_t c = make_cache(8);
    kvc_token_t t[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    kvc_prefix_query_t q = query(t, 10);
    uint32_t b[3], canon;
    assert_ok(kvc_pool_alloc(c.pool, 3, b));
    assert_int_equal(kvc_prefix_insert(c.pc, &q, 2, b[1], b[2], &canon), KVC_EINVAL); /* partial */
    assert_int_equal(kvc_prefix_insert(c.pc, &q, 0, b[1], b[0], &canon),
                     KVC_EINVAL); /* root w/ parent */
    assert_int_equal(kvc_prefix_insert(c.pc, &q, 1, KVC_NONE, b[1], &canon),
                     KVC_EINVAL); /* no parent */
    assert_int_equal(kvc_prefix_insert(c.pc, &q, 1, b[0], b[1], &canon),
                     KVC_EINVAL); /* parent uncached */
    assert_int_equal(kvc_prefix_insert(c.pc, &q, 0, KVC_NONE, 99, &canon), KVC_EINVAL); /* bad id */
    assert_int_equal(kvc_prefix_insert(c.pc, &q, 0, KVC_NONE, 5, &canon),
                     KVC_EINVAL); /* free block */
    assert_int_equal(kvc_prefix_insert(c.pc, NULL, 0, KVC_NONE, b[0], &canon), KVC_EINVAL);
    assert_ok(kvc_prefix_insert(c.pc, &q, 0, KVC_NONE, b[0], &canon));
    assert_int_equal(canon, b[0]);
    /* the parent must hold the previous block's tokens */
    kvc_token_t other[8] = {9, 9, 9, 9, 5, 6, 7, 8};
    kvc_prefix_query_t q2 = query(other, 8);
    assert_int_equal(kvc_prefix_insert(c.pc, &q2, 1, b[0], b[1], &canon), KVC_EINVAL);
    /* ... and be in the same namespace */
    kvc_namespace_t ns = {.lora_id = 1};
    q2 = (kvc_prefix_query_t){.ns = &ns, .tokens = t, .n_tokens = 8};
    assert_int_equal(kvc_prefix_insert(c.pc, &q2, 1, b[0], b[1], &canon), KVC_EINVAL);
    /* ... and match the precomputed hash when one is given */
    kvc_hash128_t wrong[2] = {{1, 1}, {2, 2}};
    q2 = (kvc_prefix_query_t){.tokens = t, .n_tokens = 8, .hashes = wrong};
    assert_int_equal(kvc_prefix_insert(c.pc, &q2, 1, b[0], b[1], &canon), KVC_EINVAL);
    assert_ok(kvc_prefix_insert(c.pc, &q, 1, b[0], b[1], NULL));
    /* a block cached with one identity cannot take another */
    kvc_token_t t3[4] = {7, 7, 7, 7};
    kvc_prefix_query_t q3 = query(t3, 4);
    assert_int_equal(kvc_prefix_insert(c.pc, &q3, 0, KVC_NONE, b[1], &canon), KVC_EINVAL);
    /* re-inserting the same identity into the same block is a no-op */
    assert_ok(kvc_prefix_insert(c.pc, &q, 1, b[0], b[1], &canon));
    assert_int_equal(canon, b[1]);
    kvc_prefix_stats_t s;
    kvc_prefix_stats(c.pc, &s);
    assert_int_equal(s.n_inserts, 2);
    assert_int_equal(s.n_duplicates, 0);
    assert_int_equal(kvc_prefix_block_parent(c.pc, b[1]), b[0]);
    assert_int_equal(kvc_prefix_block_parent(c.pc, b[0]), KVC_NONE);
    assert_int_equal(kvc_prefix_block_parent(c.pc, 99), KVC_NONE);
    kvc_hash128_t h;
    assert_ok(kvc_prefix_block_hash(c.pc, b[0], &h));
    assert_int_equal(kvc_prefix_block_hash(c.pc, b[2], &h), KVC_ENOENT);
    assert_int_equal(kvc_prefix_block_hash(c.pc, 99, &h), KVC_ENOENT);
    assert_null(kvc_prefix_block_tokens(c.pc, b[2]));
    assert_ok(kvc_pool_release(c.pool, b, 3));
    assert_prefix_ok(c.pc);
    free_cache(&c);
}

static void duplicate_inserts_name_the_cached_copy(void **state)
{
    (void)state;
    cache_t c = make_cache(8);
    kvc_token_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kvc_prefix_query_t q = query(t, 8);
    uint32_t a[2], b[2], canon;
    /* two requests compute the same prompt at once */
    assert_ok(kvc_pool_alloc(c.pool, 2, a));
    assert_ok(kvc_pool_alloc(c.pool, 2, b));
    assert_ok(kvc_prefix_insert(c.pc, &q, 0, KVC_NONE, a[0], &canon));
    assert_ok(kvc_prefix_insert(c.pc, &q, 0, KVC_NONE, b[0], &canon));
    assert_int_equal(canon, a[0]); /* b[0] stays uncached */
    assert_false(kvc_pool_is_cached(c.pool, b[0]));
    /* the second request continues the chain from the canonical block */
    assert_ok(kvc_prefix_insert(c.pc, &q, 1, a[0], a[1], &canon));
    assert_ok(kvc_prefix_insert(c.pc, &q, 1, a[0], b[1], &canon));
    assert_int_equal(canon, a[1]);
    kvc_prefix_stats_t s;
    kvc_prefix_stats(c.pc, &s);
    assert_int_equal(s.n_duplicates, 2);
    assert_int_equal(s.n_cached_blocks, 2);
    assert_ok(kvc_pool_release(c.pool, b, 2));
    assert_ok(kvc_pool_release(c.pool, a, 2));
    /* the uncached copies are reused before the cached ones */
    uint32_t x[2];
    assert_ok(kvc_pool_alloc(c.pool, 2, x));
    assert_true(x[0] != a[0] && x[0] != a[1] && x[1] != a[0] && x[1] != a[1]);
    assert_ok(kvc_pool_release(c.pool, x, 2));
    assert_prefix_ok(c.pc);
    free_cache(&c);
}

/* ---- eviction -------------------------------------------------------------- */
static void eviction_takes_leaves_oldest_first(void **state)
{
    (void)state;
    cache_t c = make_cache(6);
    kvc_token_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    kvc_token_t b[12] = {20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
    kvc_prefix_query_t qa = query(a, 12), qb = query(b, 12);
    uint32_t ta[3], tb[3];
    run_request(&c, &qa, ta, NULL);
    assert_ok(kvc_pool_release(c.pool, ta, 3)); /* queue: a2 a1 a0 */
    run_request(&c, &qb, tb, NULL);
    assert_ok(kvc_pool_release(c.pool, tb, 3)); /* queue: a2 a1 a0 b2 b1 b0 */
    /* allocating 2 evicts a's tail first: a2, then a1 */
    uint32_t x[2];
    assert_ok(kvc_pool_alloc(c.pool, 2, x));
    assert_int_equal(x[0], ta[2]);
    assert_int_equal(x[1], ta[1]);
    assert_prefix_ok(c.pc);
    assert_int_equal(kvc_prefix_count_stranded(c.pc), 0);
    /* a's head is still there and hits */
    kvc_prefix_hit_t hit;
    uint32_t h[3];
    assert_ok(kvc_prefix_lookup(c.pc, &qa, h, 3, &hit));
    assert_int_equal(hit.n_hit_blocks, 1);
    assert_int_equal(h[0], ta[0]);
    assert_ok(kvc_pool_release(c.pool, h, 1));
    assert_ok(kvc_pool_release(c.pool, x, 2));
    kvc_prefix_stats_t s;
    kvc_prefix_stats(c.pc, &s);
    assert_int_equal(s.n_evictions, 2);
    free_cache(&c);
}

static void a_parent_is_never_evicted_before_its_children(void **state)
{
    (void)state;
    /* Release a table head-first (a misbehaving caller): the parent reaches the queue's head
     * before its child.  Eviction must still take the child first. */
    cache_t c = make_cache(3);
    kvc_token_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kvc_prefix_query_t q = query(a, 8);
    uint32_t t[2];
    run_request(&c, &q, t, NULL);
    assert_ok(kvc_pool_unref(c.pool, t[0]));
    assert_ok(kvc_pool_unref(c.pool, t[1]));
    assert_int_equal(kvc__pool_free_cached_first(c.pool), t[0]);
    uint32_t x[3];
    assert_ok(kvc_pool_alloc(c.pool, 1, x)); /* the uncached block */
    assert_ok(kvc_pool_alloc(c.pool, 1, x + 1));
    assert_int_equal(x[1], t[1]); /* the child, though the parent is older */
    assert_prefix_ok(c.pc);
    assert_int_equal(kvc_prefix_count_stranded(c.pc), 0);
    assert_ok(kvc_pool_alloc(c.pool, 1, x + 2));
    assert_int_equal(x[2], t[0]);
    assert_ok(kvc_pool_release(c.pool, x, 3));
    assert_prefix_ok(c.pc);
    free_cache(&c);
}

static void explicit_evict_takes_at_most_n_leaves(void **state)
{
    (void)state;
    cache_t c = make_cache(8);
    kvc_token_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    kvc_prefix_query_t q = query(a, 12);
    uint32_t t[3];
    run_request(&c, &q, t, NULL);
    uint32_t n = 99;
    assert_ok(kvc_prefix_evict(c.pc, 5, &n));
    assert_int_equal(n, 0); /* all pinned */
    assert_ok(kvc_pool_release(c.pool, t, 3));
    assert_ok(kvc_prefix_evict(c.pc, 2, &n));
    assert_int_equal(n, 2); /* at least and at most n */
    kvc_prefix_stats_t s;
    kvc_prefix_stats(c.pc, &s);
    assert_int_equal(s.n_cached_blocks, 1);
    assert_true(kvc_pool_is_cached(c.pool, t[0]));
    assert_prefix_ok(c.pc);
    assert_ok(kvc_prefix_evict(c.pc, 5, NULL));
    kvc_prefix_stats(c.pc, &s);
    assert_int_equal(s.n_cached_blocks, 0);
    assert_int_equal(kvc_prefix_evict(NULL, 1, &n), KVC_EINVAL);
    assert_prefix_ok(c.pc);
    free_cache(&c);
}

/* ---- events and stats --------------------------------------------------------- */
typedef struct {
    kvc_prefix_event_t ev[32];
    int n;
} event_log_t;

static void log_event(void *ctx, const kvc_prefix_event_t *ev)
{
    event_log_t *log = ctx;
    assert_true(log->n < 32);
    log->ev[log->n++] = *ev;
}

static void events_report_stored_and_removed_with_parents(void **state)
{
    (void)state;
    event_log_t log = {0};
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 5;
    cp.on_event = log_event;
    cp.event_ctx = &log;
    cache_t c = make_cache_with(2, BS, cp);
    kvc_token_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kvc_prefix_query_t q = query(a, 8);
    kvc_hash128_t h[2];
    size_t n;
    assert_ok(kvc_prefix_hash(c.pc, &q, h, 2, &n));
    uint32_t t[2];
    run_request(&c, &q, t, NULL);
    assert_int_equal(log.n, 2);
    assert_int_equal(log.ev[0].type, KVC_EVENT_STORED);
    assert_true(kvc_hash128_eq(log.ev[0].hash, h[0]));
    assert_int_equal(log.ev[0].parent_block, KVC_NONE);
    assert_true(log.ev[0].parent_hash.lo == 0 && log.ev[0].parent_hash.hi == 0);
    assert_true(kvc_hash128_eq(log.ev[1].hash, h[1]));
    assert_true(kvc_hash128_eq(log.ev[1].parent_hash, h[0]));
    assert_int_equal(log.ev[1].parent_block, t[0]);
    assert_int_equal(log.ev[1].n_tokens, BS);
    assert_int_equal(log.ev[1].tokens[0], 5);
    assert_ok(kvc_pool_release(c.pool, t, 2));
    uint32_t x[2];
    assert_ok(kvc_pool_alloc(c.pool, 2, x)); /* evicts the tail, then the head */
    assert_int_equal(log.n, 4);
    assert_int_equal(log.ev[2].type, KVC_EVENT_REMOVED);
    assert_true(kvc_hash128_eq(log.ev[2].hash, h[1]));
    assert_true(kvc_hash128_eq(log.ev[2].parent_hash, h[0]));
    assert_true(kvc_hash128_eq(log.ev[3].hash, h[0]));
    assert_ok(kvc_pool_release(c.pool, x, 2));
    free_cache(&c);
}

static void stats_count_lookups_hits_and_misses(void **state)
{
    (void)state;
    cache_t c = make_cache(16);
    kvc_token_t a[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    kvc_prefix_query_t q = query(a, 10);
    uint32_t t[3];
    size_t n = run_request(&c, &q, t, NULL); /* lookup 1: 2 full blocks, no hit */
    assert_ok(kvc_pool_release(c.pool, t, (uint32_t)n));
    n = run_request(&c, &q, t, NULL); /* lookup 2: 2 hit */
    assert_ok(kvc_pool_release(c.pool, t, (uint32_t)n));
    kvc_prefix_stats_t s;
    kvc_prefix_stats(c.pc, &s);
    assert_int_equal(s.n_lookups, 2);
    assert_int_equal(s.n_lookups_hit, 1);
    assert_int_equal(s.n_query_tokens, 20);
    assert_int_equal(s.n_query_blocks, 4);
    assert_int_equal(s.n_hit_blocks, 2);
    assert_int_equal(s.n_hit_tokens, 8);
    assert_int_equal(s.n_miss_blocks, 2);
    assert_int_equal(s.n_inserts, 2);
    assert_int_equal(s.n_cached_blocks, 2);
    assert_int_equal(s.n_cached_free, 2);
    free_cache(&c);
}

static void create_fails_cleanly_under_allocation_faults(void **state)
{
    (void)state;
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = 16;
    kvc_pool_t *pool;
    assert_ok(kvc_pool_create(&pp, &pool));
    kvc_prefix_t *pc = (kvc_prefix_t *)0x1;
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    assert_int_equal(kvc_prefix_create(NULL, &cp, &pc), KVC_EINVAL);
    assert_int_equal(kvc_prefix_create(pool, NULL, &pc), KVC_EINVAL);
    cp.max_extra_keys = 17;
    assert_int_equal(kvc_prefix_create(pool, &cp, &pc), KVC_EINVAL);
    assert_null(pc);
    for (uint64_t n = 1; n <= 7; n++) {
        kvc_failing_alloc_t st = {.fail_at = n};
        cp = kvc_prefix_params_default();
        cp.allocator = kvc_failing_allocator(&st);
        int rc = kvc_prefix_create(pool, &cp, &pc);
        if (st.n_failed) {
            assert_int_equal(rc, KVC_ENOMEM);
            assert_null(pc);
        } else {
            assert_ok(rc);
            kvc_prefix_destroy(pc);
        }
        assert_int_equal(st.n_live, 0);
        assert_pool_ok(pool);
    }
    /* destroy forgets identities: the pool keeps working without a cache */
    cp = kvc_prefix_params_default();
    assert_ok(kvc_prefix_create(pool, &cp, &pc));
    kvc_token_t t[16] = {1, 2, 3, 4};
    kvc_prefix_query_t q = query(t, 16);
    uint32_t b;
    assert_ok(kvc_pool_alloc(pool, 1, &b));
    assert_ok(kvc_prefix_insert(pc, &q, 0, KVC_NONE, b, NULL));
    assert_ok(kvc_pool_unref(pool, b));
    kvc_prefix_destroy(pc);
    assert_false(kvc_pool_is_cached(pool, b));
    assert_pool_ok(pool);
    uint32_t all[16];
    assert_ok(kvc_pool_alloc(pool, 16, all));
    kvc_prefix_destroy(NULL);
    kvc_pool_destroy(pool);
}

/* ---- the collision proof -------------------------------------------------------------- */
/* A deliberately terrible hash: 2 bits, taken from the input's length and one byte. */
static kvc_hash128_t weak_hash(const void *data, size_t len, uint64_t seed)
{
    (void)seed;
    const uint8_t *p = data;
    return (kvc_hash128_t){.lo = (p[len / 2] ^ len) & 3, .hi = 0};
}

/* Token generator that makes near-misses likely: small vocabulary, shared stems. */
static void gen_prompt(kvc_rng_t *r, kvc_token_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++) t[i] = (kvc_token_t)kvc_rng_below(r, 3);
}

/* Every hit block must hold exactly the request's tokens, and its ancestry must spell the
 * request's whole prefix. */
static void assert_hit_is_exact(const cache_t *c, const kvc_token_t *t, const uint32_t *blocks,
                                size_t n_hit, uint32_t bs)
{
    for (size_t i = 0; i < n_hit; i++) {
        const kvc_token_t *bt = kvc_prefix_block_tokens(c->pc, blocks[i]);
        assert_non_null(bt);
        assert_memory_equal(bt, t + i * bs, bs * sizeof(kvc_token_t));
        assert_int_equal(kvc_prefix_block_parent(c->pc, blocks[i]), i ? blocks[i - 1] : KVC_NONE);
    }
}

static void forced_collisions_never_hand_out_foreign_kv(void **state)
{
    (void)state;
    const uint32_t bs = 2, n_blocks = 48;
    kvc_prefix_params_t weak = kvc_prefix_params_default(), strong = kvc_prefix_params_default();
    strong.hash_seed = 77;
    cache_t w = make_cache_hashed(n_blocks, bs, weak, weak_hash),
            s = make_cache_with(n_blocks, bs, strong);
    kvc_rng_t r;
    kvc_rng_seed(&r, 2024);
    kvc_namespace_t ns[2] = {{0}, {0}};
    assert_ok(kvc_namespace_set_salt(&ns[1], "other"));
    uint64_t total_hits = 0;
    const int rounds = 6000 / KVC_TEST_SANITIZER_DIVISOR;
    for (int round = 0; round < rounds; round++) {
        kvc_token_t t[16];
        size_t n = 1 + kvc_rng_below(&r, 16);
        gen_prompt(&r, t, n);
        kvc_prefix_query_t q = {.ns = &ns[kvc_rng_below(&r, 2)], .tokens = t, .n_tokens = n};
        uint32_t tw[8], ts[8];
        kvc_prefix_hit_t hw, hs;
        /* The weak-hash cache and the strong-hash cache must give the same answers: identity,
         * not the hash, decides. */
        size_t nw = run_request(&w, &q, tw, &hw);
        size_t ns_ = run_request(&s, &q, ts, &hs);
        assert_int_equal(nw, ns_);
        assert_int_equal(hw.n_hit_blocks, hs.n_hit_blocks);
        assert_memory_equal(tw, ts, nw * sizeof(uint32_t));
        assert_hit_is_exact(&w, t, tw, hw.n_hit_blocks, bs);
        total_hits += hw.n_hit_blocks;
        assert_ok(kvc_pool_release(w.pool, tw, (uint32_t)nw));
        assert_ok(kvc_pool_release(s.pool, ts, (uint32_t)ns_));
        if (round % 64 == 0) {
            assert_prefix_ok(w.pc);
            assert_int_equal(kvc_prefix_count_stranded(w.pc), 0);
        }
    }
    kvc_prefix_stats_t sw, ss;
    kvc_prefix_stats(w.pc, &sw);
    kvc_prefix_stats(s.pc, &ss);
    print_message("weak hash: %llu collisions, %llu hit blocks\n",
                  (unsigned long long)sw.n_collisions, (unsigned long long)total_hits);
    /* The test is not vacuous: the weak hash collided all the time, and hits happened. */
    assert_true(sw.n_collisions > 4000 / KVC_TEST_SANITIZER_DIVISOR);
    assert_true(total_hits > 1000 / KVC_TEST_SANITIZER_DIVISOR);
    assert_int_equal(sw.n_hit_blocks, ss.n_hit_blocks);
    assert_int_equal(sw.n_evictions, ss.n_evictions);
    free_cache(&w);
    free_cache(&s);
}

static void same_block_tokens_under_another_parent_do_not_hit(void **state)
{
    (void)state;
    /* [A B] cached; [C B] must not hit B, even when every hash collides. */
    kvc_prefix_params_t weak = kvc_prefix_params_default();
    cache_t c = make_cache_hashed(8, BS, weak, weak_hash);
    kvc_token_t ab[9] = {1, 1, 1, 1, 2, 2, 2, 2, 0}, cb[9] = {3, 3, 3, 3, 2, 2, 2, 2, 0};
    kvc_prefix_query_t q = query(ab, 9);
    uint32_t t[3];
    run_request(&c, &q, t, NULL);
    assert_ok(kvc_pool_release(c.pool, t, 3));
    q = query(cb, 9);
    kvc_block_status_t st[3];
    kvc_prefix_hit_t hit;
    assert_ok(kvc_prefix_match(c.pc, &q, NULL, 0, st, &hit));
    assert_int_equal(hit.n_hit_blocks, 0);
    /* With the weak hash, C's root hash may equal A's: then it is reported as a collision. */
    assert_true(st[0] == KVC_BLOCK_MISS || st[0] == KVC_BLOCK_COLLISION);
    free_cache(&c);
}

static kvc_hash128_t zero_hash(const void *data, size_t len, uint64_t seed)
{
    (void)data;
    (void)len;
    (void)seed;
    return (kvc_hash128_t){0, 0};
}

static void a_constant_hash_still_gives_exact_hits(void **state)
{
    (void)state;
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cache_t c = make_cache_hashed(16, BS, cp, zero_hash);
    kvc_token_t ab[9] = {1, 1, 1, 1, 2, 2, 2, 2, 0}, cb[9] = {3, 3, 3, 3, 2, 2, 2, 2, 0};
    uint32_t t[3], u[3];
    kvc_prefix_query_t qa = query(ab, 9), qc = query(cb, 9);
    run_request(&c, &qa, t, NULL);
    assert_ok(kvc_pool_release(c.pool, t, 3));
    kvc_block_status_t st[3];
    kvc_prefix_hit_t hit;
    assert_ok(kvc_prefix_match(c.pc, &qc, NULL, 0, st, &hit));
    assert_int_equal(hit.n_hit_blocks, 0);
    assert_int_equal(st[0], KVC_BLOCK_COLLISION);
    run_request(&c, &qc, u, &hit);
    assert_int_equal(hit.n_hit_blocks, 0);
    assert_int_not_equal(u[1], t[1]); /* C's B is its own block, not A's */
    assert_ok(kvc_pool_release(c.pool, u, 3));
    run_request(&c, &qa, u, &hit);
    assert_int_equal(hit.n_hit_blocks, 2);
    assert_int_equal(u[0], t[0]);
    assert_int_equal(u[1], t[1]);
    assert_ok(kvc_pool_release(c.pool, u, 3));
    assert_prefix_ok(c.pc);
    free_cache(&c);
}

/* Two 64-byte salts built to collide under the digest kvc_namespace_set_salt used before issue
 * 11 (XXH3-128 under the fixed public seed "kvcache-"): bytes 16..31 are a lane pair (a, b) of
 * XXH3's 17..128-byte path, which adds fold64((a ^ k0) * (b ^ k1)) to one accumulator and a + b
 * to the other.  With d = k0 ^ k1, a covering d's bits and b none of them, the swapped pair
 * (b ^ d, a ^ d) has the same product and the same sum, so the whole hash is the same.  Tenant
 * B then hit tenant A's blocks.  With SHA-256 they are two namespaces. */
static const char colliding_salt_1[] =
    "tenant-one:salt:"
    "\xaf\x2f\x2b\xa9\x47\xb9\xa1\x53\x40\x80\x80\x40\x80\x40\x40\x80"
    "................................";
static const char colliding_salt_2[] =
    "tenant-one:salt:"
    "\xed\xab\xa9\xe8\xc6\xf8\xe0\xd1\x02\x04\x02\x01\x01\x01\x01\x02"
    "................................";

static void salts_that_collide_under_xxh3_stay_isolated(void **state)
{
    (void)state;
    assert_int_equal(strlen(colliding_salt_1), 64);
    assert_int_equal(strlen(colliding_salt_2), 64);
    assert_memory_not_equal(colliding_salt_1, colliding_salt_2, 64);
    /* the old digest could not tell them apart */
    const uint64_t old_seed = 0x6b7663616368652dULL;
    assert_true(kvc_hash128_eq(kvc_hash128(colliding_salt_1, 64, old_seed),
                               kvc_hash128(colliding_salt_2, 64, old_seed)));
    kvc_namespace_t a = {0}, b = {0};
    assert_ok(kvc_namespace_set_salt(&a, colliding_salt_1));
    assert_ok(kvc_namespace_set_salt(&b, colliding_salt_2));
    assert_memory_not_equal(a.salt, b.salt, KVC_SALT_BYTES);
    cache_t c = make_cache(16);
    kvc_token_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    kvc_prefix_query_t qa = {.ns = &a, .tokens = t, .n_tokens = 9}, qb = qa;
    qb.ns = &b;
    uint32_t table[3];
    size_t n = run_request(&c, &qa, table, NULL);
    assert_ok(kvc_pool_release(c.pool, table, (uint32_t)n));
    kvc_prefix_hit_t hit;
    assert_ok(kvc_prefix_match(c.pc, &qb, NULL, 0, NULL, &hit));
    assert_int_equal(hit.n_hit_blocks, 0); /* tenant B never sees tenant A's KV */
    assert_ok(kvc_prefix_match(c.pc, &qa, NULL, 0, NULL, &hit));
    assert_int_equal(hit.n_hit_blocks, 2);
    free_cache(&c);
}

static void salt_digest_is_sha256_and_compared_in_full(void **state)
{
    (void)state;
    /* FIPS 180-2's test vector: SHA-256("abc") */
    static const uint8_t abc[KVC_SALT_BYTES] = {0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea,
                                                0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22, 0x23,
                                                0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c,
                                                0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
    kvc_namespace_t ns = {0};
    assert_ok(kvc_namespace_set_salt(&ns, "abc"));
    assert_memory_equal(ns.salt, abc, KVC_SALT_BYTES);
    kvc_namespace_t bytes = {0};
    assert_ok(kvc_namespace_set_salt_bytes(&bytes, "abc", 3));
    assert_memory_equal(bytes.salt, abc, KVC_SALT_BYTES);
    /* a NUL inside a binary salt counts */
    assert_ok(kvc_namespace_set_salt_bytes(&bytes, "abc\0", 4));
    assert_memory_not_equal(bytes.salt, abc, KVC_SALT_BYTES);
    /* errors change nothing */
    assert_int_equal(kvc_namespace_set_salt(NULL, "abc"), KVC_EINVAL);
    assert_int_equal(kvc_namespace_set_salt_bytes(&ns, NULL, 3), KVC_EINVAL);
    assert_memory_equal(ns.salt, abc, KVC_SALT_BYTES);
    assert_ok(kvc_namespace_set_salt_bytes(&ns, NULL, 0)); /* clears */
    kvc_namespace_t zero = {0};
    assert_memory_equal(&ns, &zero, sizeof ns);
    /* Identity compares every byte of the digest, not only what the index hash sees: with a
     * constant hash, namespaces that differ in the digest's last byte alone stay apart. */
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cache_t c = make_cache_hashed(16, BS, cp, zero_hash);
    kvc_namespace_t a = {0}, b = {0};
    a.salt[KVC_SALT_BYTES - 1] = 1;
    b.salt[KVC_SALT_BYTES - 1] = 2;
    kvc_token_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    kvc_prefix_query_t qa = {.ns = &a, .tokens = t, .n_tokens = 9}, qb = qa;
    qb.ns = &b;
    uint32_t table[3];
    size_t n = run_request(&c, &qa, table, NULL);
    assert_ok(kvc_pool_release(c.pool, table, (uint32_t)n));
    kvc_block_status_t st[3];
    kvc_prefix_hit_t hit;
    assert_ok(kvc_prefix_match(c.pc, &qb, NULL, 0, st, &hit));
    assert_int_equal(hit.n_hit_blocks, 0);
    assert_int_equal(st[0], KVC_BLOCK_COLLISION);
    free_cache(&c);
}

/* ---- sliding-window groups ------------------------------------------------------- */
static kvc_prefix_params_t sliding_params(uint32_t window)
{
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 31;
    cp.group_window[1] = window; /* group 0 full attention, group 1 sliding */
    return cp;
}

/* Insert every full block of a sliding-group request, in order, and release it. */
static void run_sliding(cache_t *c, const kvc_prefix_query_t *q, uint32_t *table)
{
    uint32_t bs = kvc_pool_block_size(c->pool);
    size_t n_all = (q->n_tokens + bs - 1) / bs;
    assert_ok(kvc_pool_alloc(c->pool, (uint32_t)n_all, table));
    for (size_t i = 0; i < q->n_tokens / bs; i++) {
        uint32_t canon;
        assert_ok(kvc_prefix_insert(c->pc, q, i, KVC_NONE, table[i], &canon));
        assert_int_equal(canon, table[i]);
    }
    assert_prefix_ok(c->pc);
}

static void sliding_hits_need_only_the_last_window(void **state)
{
    (void)state;
    cache_t c = make_cache_with(32, BS, sliding_params(6));
    kvc_namespace_t ns = {.group = 1};
    kvc_token_t t[21];
    for (int i = 0; i < 21; i++) t[i] = 50 + i;
    kvc_prefix_query_t q = {.ns = &ns, .tokens = t, .n_tokens = 21}; /* 5 full blocks + 1 */
    uint32_t table[6];
    run_sliding(&c, &q, table);
    /* The request slid: blocks 0 and 1 fell out of its window and were released while it held
     * 2..5.  Block 1 is a sliding block with a cached successor: it can still be evicted. */
    assert_ok(kvc_pool_unref(c.pool, table[0]));
    assert_ok(kvc_pool_unref(c.pool, table[1]));
    uint32_t n;
    assert_ok(kvc_prefix_evict(c.pc, 2, &n));
    assert_int_equal(n, 2);
    assert_prefix_ok(c.pc);
    assert_ok(kvc_pool_release(c.pool, table + 2, 4));
    /* A hit of 5 blocks (20 tokens) needs keys 15..19 for position 20: blocks 3 and 4. */
    uint32_t hits[6];
    kvc_block_status_t st[6];
    kvc_prefix_hit_t hit;
    assert_ok(kvc_prefix_match(c.pc, &q, hits, 6, st, &hit));
    assert_int_equal(hit.n_hit_blocks, 5);
    assert_int_equal(hit.first_hit_block, 3);
    assert_int_equal(st[0], KVC_BLOCK_OUT_OF_WINDOW);
    assert_int_equal(st[2], KVC_BLOCK_OUT_OF_WINDOW);
    assert_int_equal(st[3], KVC_BLOCK_HIT);
    assert_int_equal(st[4], KVC_BLOCK_HIT);
    assert_int_equal(st[5], KVC_BLOCK_PARTIAL);
    assert_string_equal(kvc_block_status_name(st[0]), "out-of-window");
    assert_ok(kvc_prefix_lookup(c.pc, &q, hits, 6, &hit));
    assert_int_equal(hits[0], KVC_NONE);
    assert_int_equal(hits[2], KVC_NONE);
    assert_int_equal(hits[3], table[3]);
    assert_int_equal(kvc_pool_refcount(c.pool, table[3]), 1);
    assert_int_equal(kvc_pool_refcount(c.pool, table[2]), 0); /* outside the window: not pinned */
    assert_ok(kvc_pool_release(c.pool, hits, 5));
    /* The same prompt cut to 17 tokens: hit 4 blocks, which needs block 2 and 3 (keys 11..15). */
    q.n_tokens = 17;
    assert_ok(kvc_prefix_match(c.pc, &q, hits, 6, st, &hit));
    assert_int_equal(hit.n_hit_blocks, 4);
    assert_int_equal(hit.first_hit_block, 2);
    /* The cached run of the free queue is now 2, 4, 3 (block 5, the partial one, was never
     * cached).  Evicting one takes block 2.  The 21-token prompt still hits 5 blocks (it needs
     * 3 and 4); the 17-token one needed block 2 for a hit of 4, blocks 1..2 for 3, 0..1 for 2
     * and block 0 for 1: nothing is left for it. */
    assert_ok(kvc_prefix_evict(c.pc, 1, &n));
    assert_int_equal(n, 1);
    assert_false(kvc_pool_is_cached(c.pool, table[2]));
    assert_true(kvc_pool_is_cached(c.pool, table[4]));
    assert_ok(kvc_prefix_match(c.pc, &q, NULL, 0, st, &hit));
    assert_int_equal(hit.n_hit_blocks, 0);
    assert_int_equal(st[2], KVC_BLOCK_MISS);
    assert_int_equal(st[3], KVC_BLOCK_AFTER_MISS); /* cached, but its window is incomplete */
    q.n_tokens = 21;
    assert_ok(kvc_prefix_match(c.pc, &q, NULL, 0, NULL, &hit));
    assert_int_equal(hit.n_hit_blocks, 5);
    /* A 20-token prompt: a hit of 5 blocks would cover the last token; 4 needs block 2. */
    q.n_tokens = 20;
    assert_ok(kvc_prefix_match(c.pc, &q, NULL, 0, NULL, &hit));
    assert_int_equal(hit.n_hit_blocks, 0);
    assert_true(hit.cut_by_last_token);
    assert_prefix_ok(c.pc);
    free_cache(&c);
}

static void sliding_window_blocks_of_another_prefix_never_hit(void **state)
{
    (void)state;
    /* Two prompts that differ only in their first block: their later blocks have the same
     * tokens, and with a constant hash the same index hash.  Only the fingerprint of the whole
     * prefix tells them apart, and it must. */
    cache_t c = make_cache_hashed(32, BS, sliding_params(4), zero_hash);
    kvc_namespace_t ns = {.group = 1};
    kvc_token_t a[13] = {1, 1, 1, 1, 7, 7, 7, 7, 8, 8, 8, 8, 9};
    kvc_token_t b[13] = {2, 2, 2, 2, 7, 7, 7, 7, 8, 8, 8, 8, 9};
    kvc_prefix_query_t qa = {.ns = &ns, .tokens = a, .n_tokens = 13}, qb = qa;
    qb.tokens = b;
    uint32_t table[4];
    run_sliding(&c, &qa, table);
    assert_ok(kvc_pool_release(c.pool, table, 4));
    kvc_prefix_hit_t hit;
    kvc_block_status_t st[4];
    assert_ok(kvc_prefix_match(c.pc, &qb, NULL, 0, st, &hit));
    assert_int_equal(hit.n_hit_blocks, 0);
    assert_int_equal(st[1], KVC_BLOCK_COLLISION);
    assert_int_equal(st[2], KVC_BLOCK_COLLISION);
    assert_ok(kvc_prefix_match(c.pc, &qa, NULL, 0, st, &hit));
    assert_int_equal(hit.n_hit_blocks, 3);
    /* a full-attention query in the same cache (group 0) never sees group 1's blocks */
    kvc_prefix_query_t q0 = qa;
    q0.ns = NULL;
    assert_ok(kvc_prefix_match(c.pc, &q0, NULL, 0, NULL, &hit));
    assert_int_equal(hit.n_hit_blocks, 0);
    free_cache(&c);
}

/* issue 11, through the public API: window 4, block size 4, 4 extra keys per block.  A = [Y Z t]
 * is cached; B = [X Y Z t] where X carries 5 multimodal inputs, one more than a block holds, so
 * X cannot be hashed.  Nothing after X may hit: B's block at positions 8..11 must never receive
 * A's Z, computed at positions 4..7 after another prefix. */
static void an_unhashable_block_ends_a_sliding_match(void **state)
{
    (void)state;
    cache_t c = make_cache_with(16, BS, sliding_params(4));
    kvc_namespace_t ns = {.group = 1};
    kvc_token_t a[9] = {2, 2, 2, 2, 3, 3, 3, 3, 4};
    kvc_token_t b[13] = {1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4};
    kvc_prefix_query_t qa = {.ns = &ns, .tokens = a, .n_tokens = 9};
    uint32_t table[4];
    run_sliding(&c, &qa, table);
    assert_ok(kvc_pool_release(c.pool, table, 3));
    kvc_mm_input_t five[5];
    for (int i = 0; i < 5; i++)
        five[i] =
            (kvc_mm_input_t){.hash = {100 + (uint64_t)i, 7}, .start = (uint64_t)i % 4, .length = 1};
    kvc_prefix_query_t qb = {.ns = &ns, .tokens = b, .n_tokens = 13, .mm = five, .n_mm = 5};
    kvc_block_status_t st[4];
    uint32_t blocks[4];
    kvc_prefix_hit_t hit;
    assert_ok(kvc_prefix_match(c.pc, &qb, blocks, 4, st, &hit));
    assert_int_equal(hit.n_hit_blocks, 0);
    assert_int_equal(hit.n_matched_blocks, 0);
    assert_int_equal(st[0], KVC_BLOCK_MISS);
    assert_int_equal(st[1], KVC_BLOCK_AFTER_MISS);
    assert_int_equal(st[2], KVC_BLOCK_AFTER_MISS);
    assert_int_equal(st[3], KVC_BLOCK_PARTIAL);
    assert_ok(kvc_prefix_lookup(c.pc, &qb, blocks, 4, &hit));
    assert_int_equal(hit.n_hit_blocks, 0);
    assert_int_equal(kvc_pool_n_free(c.pool), 16); /* nothing pinned */
    uint32_t present[3];
    size_t found = 99;
    assert_ok(kvc_prefix_probe(c.pc, &qb, 3, present, &found));
    assert_int_equal(found, 0);
    for (int i = 0; i < 3; i++) assert_int_equal(present[i], KVC_NONE);
    /* nor can anything after X be inserted: its identity chains through X */
    uint32_t x[3];
    assert_ok(kvc_pool_alloc(c.pool, 3, x));
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(kvc_prefix_insert(c.pc, &qb, i, KVC_NONE, x[i], NULL), KVC_ERANGE);
    assert_ok(kvc_pool_release(c.pool, x, 3));
    /* A itself still hits */
    assert_ok(kvc_prefix_match(c.pc, &qa, NULL, 0, NULL, &hit));
    assert_int_equal(hit.n_hit_blocks, 2);
    assert_prefix_ok(c.pc);
    free_cache(&c);
}

static void probe_reports_each_block(void **state)
{
    (void)state;
    cache_t c = make_cache_with(32, BS, sliding_params(4));
    kvc_namespace_t ns = {.group = 1};
    kvc_token_t t[16];
    for (int i = 0; i < 16; i++) t[i] = i;
    kvc_prefix_query_t q = {.ns = &ns, .tokens = t, .n_tokens = 16};
    uint32_t table[4];
    run_sliding(&c, &q, table);
    assert_ok(kvc_pool_unref(c.pool, table[1]));
    uint32_t n;
    assert_ok(kvc_prefix_evict(c.pc, 1, &n));
    assert_int_equal(n, 1);
    uint32_t present[4];
    size_t found;
    assert_ok(kvc_prefix_probe(c.pc, &q, 4, present, &found));
    assert_int_equal(found, 3);
    assert_int_equal(present[0], table[0]);
    assert_int_equal(present[1], KVC_NONE);
    assert_int_equal(present[3], table[3]);
    /* a full-attention probe stops at the first miss */
    kvc_prefix_query_t q0 = {.tokens = t, .n_tokens = 16};
    uint32_t t0[4];
    size_t n0 = run_request(&c, &q0, t0, NULL);
    assert_ok(kvc_pool_release(c.pool, t0, (uint32_t)n0));
    assert_ok(kvc_prefix_probe(c.pc, &q0, 2, present, &found));
    assert_int_equal(found, 2);
    assert_int_equal(present[1], t0[1]);
    assert_int_equal(kvc_prefix_probe(c.pc, &q0, 2, NULL, &found), KVC_EINVAL);
    /* fingerprints: deterministic, independent of the index hash */
    kvc_hash128_t f1[4], f2[4], h[4];
    size_t nf;
    assert_ok(kvc_prefix_fingerprint(c.pc, &q, f1, 4, &nf));
    assert_ok(kvc_prefix_fingerprint(c.pc, &q, f2, 4, &nf));
    assert_ok(kvc_prefix_hash(c.pc, &q, h, 4, &nf));
    assert_true(kvc_hash128_eq(f1[3], f2[3]));
    assert_false(kvc_hash128_eq(f1[3], h[3]));
    table[1] = KVC_NONE; /* already released */
    assert_ok(kvc_pool_release(c.pool, table, 4));
    /* a group beyond KVC_MAX_GROUPS is a malformed query */
    kvc_namespace_t bad = {.group = KVC_MAX_GROUPS};
    q.ns = &bad;
    kvc_prefix_hit_t hit;
    assert_int_equal(kvc_prefix_match(c.pc, &q, NULL, 0, NULL, &hit), KVC_EINVAL);
    free_cache(&c);
}

/* ---- eviction policies -------------------------------------------------------- */
static cache_t make_cache_policy(uint32_t n_blocks, kvc_eviction_t policy)
{
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 4321;
    cp.eviction = policy;
    return make_cache_with(n_blocks, BS, cp);
}

/* Cache one full block of `t` (BS tokens) under `parent` at `index`, in a fresh block; the
 * caller keeps the reference. */
static uint32_t cache_block(cache_t *c, const kvc_token_t *t, size_t index, uint32_t parent,
                            uint32_t priority)
{
    kvc_prefix_query_t q = {.tokens = t, .n_tokens = (index + 1) * BS, .priority = priority};
    uint32_t b, canon;
    assert_ok(kvc_pool_alloc(c->pool, 1, &b));
    assert_ok(kvc_prefix_insert(c->pc, &q, index, parent, b, &canon));
    assert_int_equal(canon, b);
    return b;
}

/* Pin block 0 of a one-block prompt t (plus one token) and release it again. */
static void hit_once(cache_t *c, const kvc_token_t *t, uint32_t priority, uint32_t want)
{
    kvc_token_t q5[BS + 1];
    memcpy(q5, t, BS * sizeof *t);
    q5[BS] = 0;
    kvc_prefix_query_t q = {.tokens = q5, .n_tokens = BS + 1, .priority = priority};
    uint32_t b;
    kvc_prefix_hit_t hit;
    assert_ok(kvc_prefix_lookup(c->pc, &q, &b, 1, &hit));
    assert_int_equal(hit.n_hit_blocks, 1);
    assert_int_equal(b, want);
    assert_ok(kvc_pool_unref(c->pool, b));
}

/* The order a full pool gives up its blocks in, one allocation at a time. */
static void assert_eviction_order(cache_t *c, const uint32_t *want, uint32_t n)
{
    uint32_t got[8];
    for (uint32_t i = 0; i < n; i++) {
        assert_ok(kvc_pool_alloc(c->pool, 1, &got[i]));
        assert_prefix_ok(c->pc);
        assert_int_equal(kvc_prefix_count_stranded(c->pc), 0);
    }
    assert_memory_equal(got, want, n * sizeof *want);
    assert_ok(kvc_pool_release(c->pool, got, n));
}

static void eviction_policies_are_named_and_parsed(void **state)
{
    (void)state;
    const char *const *names = kvc_eviction_names();
    int n = 0;
    for (; names[n]; n++) {
        kvc_eviction_t p;
        assert_ok(kvc_eviction_parse(names[n], &p));
        assert_int_equal(p, n);
        assert_string_equal(kvc_eviction_name(p), names[n]);
        assert_string_not_equal(kvc_eviction_summary(p), "?");
    }
    assert_int_equal(n, KVC_EVICT__COUNT);
    assert_string_equal(kvc_eviction_name(KVC_EVICT_LRU), "lru");
    assert_string_equal(kvc_eviction_name(KVC_EVICT_LFU), "lfu");
    assert_string_equal(kvc_eviction_name(KVC_EVICT_PRIORITY), "priority");
    assert_string_equal(kvc_eviction_name(KVC_EVICT_NAIVE_LRU), "naive-lru");
    assert_string_equal(kvc_eviction_name(KVC_EVICT__COUNT), "?");
    kvc_eviction_t p = KVC_EVICT_LFU;
    assert_int_equal(kvc_eviction_parse("LRU", &p), KVC_EINVAL); /* exact names only */
    assert_int_equal(kvc_eviction_parse("", &p), KVC_EINVAL);
    assert_int_equal(kvc_eviction_parse(NULL, &p), KVC_EINVAL);
    assert_int_equal(kvc_eviction_parse("lru", NULL), KVC_EINVAL);
    assert_int_equal(p, KVC_EVICT_LFU); /* unchanged on error */
    assert_int_equal(kvc_prefix_params_default().eviction, KVC_EVICT_LRU);
    /* an unknown policy is refused at creation */
    kvc_pool_params_t pp = kvc_pool_params_default();
    kvc_pool_t *pool;
    assert_ok(kvc_pool_create(&pp, &pool));
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.eviction = KVC_EVICT__COUNT;
    kvc_prefix_t *pc = (kvc_prefix_t *)0x1;
    assert_int_equal(kvc_prefix_create(pool, &cp, &pc), KVC_EINVAL);
    assert_null(pc);
    cp.eviction = KVC_EVICT_PRIORITY;
    assert_ok(kvc_prefix_create(pool, &cp, &pc));
    assert_int_equal(kvc_prefix_eviction(pc), KVC_EVICT_PRIORITY);
    kvc_prefix_destroy(pc);
    kvc_pool_destroy(pool);
}

static const kvc_token_t blk_a[BS] = {1, 1, 1, 1}, blk_b[BS] = {2, 2, 2, 2},
                         blk_c[BS] = {3, 3, 3, 3};

static void lru_and_lfu_order_the_same_history_differently(void **state)
{
    (void)state;
    /* Three one-block prompts cached in the order A, B, C; then A is hit twice and C once. */
    for (int p = 0; p < 2; p++) {
        cache_t c = make_cache_policy(3, p ? KVC_EVICT_LFU : KVC_EVICT_LRU);
        uint32_t a = cache_block(&c, blk_a, 0, KVC_NONE, 0);
        uint32_t b = cache_block(&c, blk_b, 0, KVC_NONE, 0);
        uint32_t cc = cache_block(&c, blk_c, 0, KVC_NONE, 0);
        uint32_t all[3] = {a, b, cc};
        assert_ok(kvc_pool_release(c.pool, all, 3));
        hit_once(&c, blk_a, 0, a);
        hit_once(&c, blk_a, 0, a);
        hit_once(&c, blk_c, 0, cc);
        assert_prefix_ok(c.pc);
        /* LRU: the least recently released first: B, A, C.  LFU: the fewest uses first: B (1),
         * C (2), A (3). */
        const uint32_t lru[3] = {b, a, cc}, lfu[3] = {b, cc, a};
        assert_eviction_order(&c, p ? lfu : lru, 3);
        free_cache(&c);
    }
}

static void priority_evicts_the_lowest_priority_first_lru_within(void **state)
{
    (void)state;
    cache_t c = make_cache_policy(3, KVC_EVICT_PRIORITY);
    uint32_t a = cache_block(&c, blk_a, 0, KVC_NONE, 2); /* a class worth keeping */
    uint32_t b = cache_block(&c, blk_b, 0, KVC_NONE, 0);
    uint32_t cc = cache_block(&c, blk_c, 0, KVC_NONE, 0);
    uint32_t all[3] = {a, b, cc};
    assert_ok(kvc_pool_release(c.pool, all, 3)); /* released C, B, A: A is the oldest */
    /* A lookup at priority 5 raises B; one at priority 0 does not lower A. */
    hit_once(&c, blk_b, 5, b);
    hit_once(&c, blk_a, 0, a);
    assert_prefix_ok(c.pc);
    const uint32_t want[3] = {cc, a, b};
    assert_eviction_order(&c, want, 3);
    /* a priority beyond the classes is a malformed query */
    kvc_token_t t[5] = {1, 1, 1, 1, 0};
    kvc_prefix_query_t q = {.tokens = t, .n_tokens = 5, .priority = KVC_PREFIX_MAX_PRIORITY + 1};
    kvc_prefix_hit_t hit;
    uint32_t x;
    assert_int_equal(kvc_prefix_lookup(c.pc, &q, &x, 1, &hit), KVC_EINVAL);
    assert_int_equal(kvc_prefix_match(c.pc, &q, NULL, 0, NULL, &hit), KVC_EINVAL);
    free_cache(&c);
}

static void lfu_and_priority_still_evict_leaves_first(void **state)
{
    (void)state;
    /* A parent ranked below its child: the child must still go first, or it is stranded. */
    kvc_token_t t[8] = {4, 4, 4, 4, 5, 5, 5, 5};
    for (int p = 0; p < 2; p++) {
        cache_t c = make_cache_policy(3, p ? KVC_EVICT_LFU : KVC_EVICT_PRIORITY);
        uint32_t parent = cache_block(&c, t, 0, KVC_NONE, 0);
        uint32_t child = cache_block(&c, t, 1, parent, p ? 0 : 9);
        if (p) { /* LFU: the child is used three more times (recomputed, found cached) */
            kvc_prefix_query_t q = {.tokens = t, .n_tokens = 8};
            for (int i = 0; i < 3; i++) {
                uint32_t x, canon;
                assert_ok(kvc_pool_alloc(c.pool, 1, &x));
                assert_ok(kvc_prefix_insert(c.pc, &q, 1, parent, x, &canon));
                assert_int_equal(canon, child);
                assert_ok(kvc_pool_unref(c.pool, x));
            }
        }
        uint32_t table[2] = {parent, child};
        assert_ok(kvc_pool_release(c.pool, table, 2));
        assert_prefix_ok(c.pc);
        /* the parent heads the queue (level 0), the child ranks above it; the third block is
         * uncached and goes first */
        assert_int_equal(kvc__pool_free_cached_first(c.pool), parent);
        uint32_t x[3];
        assert_ok(kvc_pool_alloc(c.pool, 2, x));
        assert_int_equal(x[1], child);
        assert_prefix_ok(c.pc);
        assert_int_equal(kvc_prefix_count_stranded(c.pc), 0);
        assert_ok(kvc_pool_alloc(c.pool, 1, x + 2));
        assert_int_equal(x[2], parent);
        kvc_prefix_stats_t s;
        kvc_prefix_stats(c.pc, &s);
        assert_int_equal(s.n_strandings, 0);
        assert_ok(kvc_pool_release(c.pool, x, 3));
        free_cache(&c);
    }
}

static void naive_lru_strands_children_and_counts_them(void **state)
{
    (void)state;
    /* With storage, so that the stranded bytes are real: 4 tokens x 8 floats x K and V. */
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = 4;
    pp.block_size = BS;
    pp.storage = (kvc_storage_desc_t){.n_layers = 1, .n_kv_heads = 1, .head_dim = 8};
    for (int p = 0; p < 2; p++) {
        kvc_prefix_params_t cp = kvc_prefix_params_default();
        cp.eviction = p ? KVC_EVICT_NAIVE_LRU : KVC_EVICT_LRU;
        cache_t c = {0};
        assert_ok(kvc_pool_create(&pp, &c.pool));
        assert_ok(kvc_prefix_create(c.pool, &cp, &c.pc));
        kvc_token_t t[13] = {1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 9};
        kvc_prefix_query_t q = query(t, 13);
        uint32_t table[4];
        run_request(&c, &q, table, NULL);
        /* released head first: the root is the least recently used block */
        for (int i = 0; i < 4; i++) assert_ok(kvc_pool_unref(c.pool, table[i]));
        uint32_t x[2];
        assert_ok(kvc_pool_alloc(c.pool, 2, x)); /* the uncached partial block, then one more */
        assert_prefix_ok(c.pc);                  /* passes under both: naive counts its strays */
        kvc_prefix_stats_t s;
        kvc_prefix_stats(c.pc, &s);
        if (!p) { /* LRU: the leaf went, the prefix [0, 1] still hits */
            assert_int_equal(x[1], table[2]);
            assert_int_equal(s.n_stranded_blocks, 0);
            assert_int_equal(kvc_prefix_count_stranded(c.pc), 0);
        } else { /* naive: the root went; blocks 1 and 2 are resident, cached, unreachable */
            assert_int_equal(x[1], table[0]);
            assert_int_equal(s.n_stranded_blocks, 2);
            assert_int_equal(s.n_strandings, 2);
            assert_int_equal(s.n_stranded_bytes, 2 * kvc_pool_block_bytes(c.pool));
            assert_true(s.n_stranded_bytes > 0);
            assert_int_equal(s.n_cached_blocks, 2);
            assert_int_equal(kvc_prefix_count_stranded(c.pc), 2);
            assert_true(kvc_pool_is_cached(c.pool, table[1]));
            assert_int_equal(kvc_prefix_block_parent(c.pc, table[1]), KVC_NONE);
            assert_int_equal(kvc_prefix_block_parent(c.pc, table[2]), table[1]);
        }
        assert_ok(kvc_pool_release(c.pool, x, 2));
        /* The prompt again: under naive it recomputes everything from block 0 (the strays are
         * never hit, and their identities are cached a second time beside them). */
        kvc_prefix_hit_t hit;
        uint32_t again[4];
        assert_ok(kvc_prefix_match(c.pc, &q, NULL, 0, NULL, &hit));
        assert_int_equal(hit.n_hit_blocks, p ? 0 : 2);
        if (p) {
            run_request(&c, &q, again, &hit); /* needs 4 blocks: evicts the two strays */
            assert_int_equal(hit.n_hit_blocks, 0);
            kvc_prefix_stats(c.pc, &s);
            assert_int_equal(s.n_stranded_blocks, 0);
            assert_int_equal(s.n_strandings, 2);
            assert_ok(kvc_pool_release(c.pool, again, 4));
            assert_prefix_ok(c.pc);
            assert_ok(kvc_prefix_match(c.pc, &q, NULL, 0, NULL, &hit));
            assert_int_equal(hit.n_hit_blocks, 3);
        }
        free_cache(&c);
    }
}

/* ---- test hooks (testing.h) ------------------------------------------------------ */
static void a_weakened_hash_collides_and_never_hands_out_foreign_kv(void **state)
{
    (void)state;
    const uint32_t bs = 2, n_blocks = 48;
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 5;
    cache_t w = make_cache_with(n_blocks, bs, cp), s = make_cache_with(n_blocks, bs, cp);
    assert_int_equal(kvc_testing_prefix_set_hash_bits(w.pc, 0), KVC_EINVAL);
    assert_int_equal(kvc_testing_prefix_set_hash_bits(w.pc, 65), KVC_EINVAL);
    assert_int_equal(kvc_testing_prefix_set_hash_bits(w.pc, 127), KVC_EINVAL);
    assert_int_equal(kvc_testing_prefix_set_hash_bits(NULL, 8), KVC_EINVAL);
    assert_int_equal(kvc_testing_prefix_set_hash(NULL, NULL), KVC_EINVAL);
    /* the index hash keeps its low N bits */
    kvc_token_t t[16] = {7, 7, 7, 7};
    kvc_prefix_query_t q = query(t, 4);
    kvc_hash128_t h[2];
    size_t nh;
    const uint32_t bits[] = {1, 7, 64, 128};
    for (size_t i = 0; i < KVC_ARRAY_LEN(bits); i++) {
        assert_ok(kvc_testing_prefix_set_hash_bits(w.pc, bits[i]));
        assert_ok(kvc_prefix_hash(w.pc, &q, h, 2, &nh));
        if (bits[i] < 64) assert_true(h[0].lo >> bits[i] == 0);
        if (bits[i] <= 64)
            assert_int_equal(h[0].hi, 0);
        else
            assert_true(h[0].hi != 0 || h[0].lo >> 32 != 0);
    }
    assert_ok(kvc_testing_prefix_set_hash_bits(w.pc, 3));
    kvc_rng_t r;
    kvc_rng_seed(&r, 11);
    uint64_t total_hits = 0;
    const int rounds = 3000 / KVC_TEST_SANITIZER_DIVISOR;
    for (int round = 0; round < rounds; round++) {
        size_t n = 1 + kvc_rng_below(&r, 16);
        for (size_t i = 0; i < n; i++) t[i] = (kvc_token_t)kvc_rng_below(&r, 3);
        q = query(t, n);
        uint32_t tw[8], ts[8];
        kvc_prefix_hit_t hw, hs;
        size_t nw = run_request(&w, &q, tw, &hw), n_s = run_request(&s, &q, ts, &hs);
        assert_int_equal(hw.n_hit_blocks, hs.n_hit_blocks);
        assert_memory_equal(tw, ts, nw * sizeof(uint32_t));
        assert_hit_is_exact(&w, t, tw, hw.n_hit_blocks, bs);
        total_hits += hw.n_hit_blocks;
        assert_ok(kvc_pool_release(w.pool, tw, (uint32_t)nw));
        assert_ok(kvc_pool_release(s.pool, ts, (uint32_t)n_s));
        if (round == 0) /* a cached block's hash was made by the weak function */
            assert_int_equal(kvc_testing_prefix_set_hash_bits(w.pc, 128), KVC_EBUSY);
    }
    kvc_prefix_stats_t sw;
    kvc_prefix_stats(w.pc, &sw);
    print_message("3-bit hash: %llu collisions, %llu hit blocks\n",
                  (unsigned long long)sw.n_collisions, (unsigned long long)total_hits);
    assert_true(sw.n_collisions > 1000 / KVC_TEST_SANITIZER_DIVISOR);
    assert_true(total_hits > 500 / KVC_TEST_SANITIZER_DIVISOR);
    /* empty again, the hooks can change */
    assert_ok(kvc_prefix_evict(w.pc, n_blocks, NULL));
    assert_ok(kvc_testing_prefix_set_hash_bits(w.pc, 128));
    assert_ok(kvc_testing_prefix_set_hash(w.pc, NULL));
    assert_prefix_ok(w.pc);
    free_cache(&w);
    free_cache(&s);
}

/* ---- errors and memory ---------------------------------------------------------- */
static void prefix_caller_errors_are_error_codes(void **state)
{
    (void)state;
    cache_t c = make_cache(4);
    kvc_hash128_t h;
    assert_int_equal(kvc_prefix_block_hash(c.pc, 3, &h), KVC_ENOENT); /* never used */
    assert_int_equal(kvc_prefix_block_hash(c.pc, KVC_NONE, &h), KVC_ENOENT);
    assert_int_equal(kvc_prefix_block_hash(NULL, 0, &h), KVC_EINVAL);
    assert_int_equal(kvc_prefix_block_hash(c.pc, 0, NULL), KVC_EINVAL);
    assert_null(kvc_prefix_block_tokens(c.pc, KVC_NONE));
    assert_int_equal(kvc_prefix_block_parent(c.pc, 3), KVC_NONE);
    assert_int_equal(kvc_prefix_check(NULL, NULL, 0), KVC_EINVAL);
    kvc_token_t t[5] = {1, 2, 3, 4, 5};
    kvc_prefix_query_t q = {.tokens = t, .n_tokens = 5, .priority = 64};
    uint32_t b;
    assert_ok(kvc_pool_alloc(c.pool, 1, &b));
    assert_int_equal(kvc_prefix_insert(c.pc, &q, 0, KVC_NONE, b, NULL), KVC_EINVAL);
    size_t n;
    assert_int_equal(kvc_prefix_hash(c.pc, &q, &h, 1, &n), KVC_EINVAL);
    assert_int_equal(kvc_prefix_insert(c.pc, &q, 0, KVC_NONE, 7, NULL), KVC_EINVAL);
    q.priority = 0;
    assert_int_equal(kvc_prefix_insert(c.pc, &q, 0, KVC_NONE, 3, NULL), KVC_EINVAL); /* free */
    assert_int_equal(kvc_prefix_insert(c.pc, &q, 1, b, b, NULL), KVC_EINVAL); /* parent uncached */
    assert_ok(kvc_pool_unref(c.pool, b));
    assert_prefix_ok(c.pc);
    free_cache(&c);
}

/* Issue 11: per-block metadata was about 186 bytes for blocks no request touches (pool and
 * prefix together about 317 here: 3 GB for 10^7 blocks).  Now a 2^24-block cache that caches a
 * hundred blocks touches a few hundred pages: one bucket page per cached block at most.  (The
 * sanitizers write shadow memory for every allocation, an eighth of its size: allowed for.) */
static void a_huge_cache_costs_memory_only_for_the_blocks_used(void **state)
{
    (void)state;
    const long page = 4096;
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.group_window[1] = 64;
    size_t reserved, per_block, pool_reserved;
    assert_ok(kvc_prefix_metadata_bytes(&cp, 1u << 24, 16, &reserved, &per_block));
    assert_true(reserved > ((size_t)1 << 24) * (per_block - 4096));
    assert_true(per_block > 4096 && per_block < 8192);
    assert_int_equal(kvc_prefix_metadata_bytes(&cp, 0, 16, &reserved, NULL), KVC_EINVAL);
    assert_int_equal(kvc_prefix_metadata_bytes(&cp, 16, 300, &reserved, NULL), KVC_EINVAL);
    assert_int_equal(kvc_prefix_metadata_bytes(NULL, 16, 16, &reserved, NULL), KVC_EINVAL);
    assert_ok(kvc_prefix_metadata_bytes(&cp, 1u << 24, 16, &reserved, NULL));
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = 1u << 24;
    assert_ok(kvc_pool_metadata_bytes(&pp, &pool_reserved, NULL));

    long before = kvc_test_minor_faults();
    uint64_t t0 = kvc_now_ns();
    cache_t c = make_cache_with(1u << 24, 16, cp);
    kvc_rng_t r;
    kvc_rng_seed(&r, 3);
    for (int i = 0; i < 40; i++) { /* 40 prompts of 100 tokens, 10 system prompts, 2 groups */
        kvc_token_t t[100];
        for (int j = 0; j < 100; j++)
            t[j] = j < 64 ? j + 1000 * (i % 10) : (kvc_token_t)kvc_rng_below(&r, 32000);
        kvc_namespace_t ns = {.group = (uint32_t)i % 2};
        kvc_prefix_query_t q = {.ns = &ns, .tokens = t, .n_tokens = 100};
        uint32_t table[7];
        if (ns.group) { /* each block on its own; a duplicate leaves ours uncached */
            assert_ok(kvc_pool_alloc(c.pool, 7, table));
            for (size_t k = 0; k < 6; k++)
                assert_ok(kvc_prefix_insert(c.pc, &q, k, KVC_NONE, table[k], NULL));
        } else {
            kvc_prefix_hit_t hit;
            run_request(&c, &q, table, &hit);
        }
        assert_ok(kvc_pool_release(c.pool, table, 7));
    }
    kvc_prefix_stats_t s;
    kvc_prefix_stats(c.pc, &s);
    assert_prefix_ok(c.pc);
    long faults = kvc_test_minor_faults() - before;
    double ms = (double)(kvc_now_ns() - t0) / 1e6;
    free_cache(&c);
    print_message("2^24-block pool + cache (%.0f MiB reserved), %u blocks cached: %ld pages "
                  "faulted (%.1f KiB), %.1f ms; at most %zu bytes per block cached\n",
                  (double)(reserved + pool_reserved) / (1 << 20), s.n_cached_blocks, faults,
                  (double)faults * page / 1024, ms, per_block);
    assert_true(s.n_cached_blocks > 100);
    const long shadow =
        KVC_TEST_SANITIZED ? (long)((reserved + pool_reserved) / 8 / page) + 1024 : 0;
    assert_true(faults < 3 * (long)s.n_cached_blocks + 256 + shadow);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hash_covers_every_part_of_identity),
        cmocka_unit_test(random_seed_differs_between_caches),
        cmocka_unit_test(hash_handles_partial_blocks_and_capacity),
        cmocka_unit_test(multimodal_inputs_key_the_blocks_they_overlap),
        cmocka_unit_test(multimodal_hits_need_the_same_inputs),
        cmocka_unit_test(lookup_never_covers_the_last_token),
        cmocka_unit_test(lookup_pins_hits_and_respects_cap),
        cmocka_unit_test(match_explains_every_block),
        cmocka_unit_test(namespaces_isolate_tenants_adapters_and_epochs),
        cmocka_unit_test(salts_that_collide_under_xxh3_stay_isolated),
        cmocka_unit_test(salt_digest_is_sha256_and_compared_in_full),
        cmocka_unit_test(insert_checks_its_arguments),
        cmocka_unit_test(duplicate_inserts_name_the_cached_copy),
        cmocka_unit_test(eviction_takes_leaves_oldest_first),
        cmocka_unit_test(a_parent_is_never_evicted_before_its_children),
        cmocka_unit_test(explicit_evict_takes_at_most_n_leaves),
        cmocka_unit_test(events_report_stored_and_removed_with_parents),
        cmocka_unit_test(stats_count_lookups_hits_and_misses),
        cmocka_unit_test(create_fails_cleanly_under_allocation_faults),
        cmocka_unit_test(forced_collisions_never_hand_out_foreign_kv),
        cmocka_unit_test(same_block_tokens_under_another_parent_do_not_hit),
        cmocka_unit_test(a_constant_hash_still_gives_exact_hits),
        cmocka_unit_test(sliding_hits_need_only_the_last_window),
        cmocka_unit_test(sliding_window_blocks_of_another_prefix_never_hit),
        cmocka_unit_test(an_unhashable_block_ends_a_sliding_match),
        cmocka_unit_test(probe_reports_each_block),
        cmocka_unit_test(eviction_policies_are_named_and_parsed),
        cmocka_unit_test(lru_and_lfu_order_the_same_history_differently),
        cmocka_unit_test(priority_evicts_the_lowest_priority_first_lru_within),
        cmocka_unit_test(lfu_and_priority_still_evict_leaves_first),
        cmocka_unit_test(naive_lru_strands_children_and_counts_them),
        cmocka_unit_test(a_weakened_hash_collides_and_never_hands_out_foreign_kv),
        cmocka_unit_test(prefix_caller_errors_are_error_codes),
        cmocka_unit_test(a_huge_cache_costs_memory_only_for_the_blocks_used),
    };
    return cmocka_run_group_tests_name("prefix", tests, NULL, NULL);
}
