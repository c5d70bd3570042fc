/* test_pool.c - the block pool: parameters, storage layout, refcounts, the
 * free queue's order, all-or-nothing allocation, release validation, the
 * evictor hook, and clean failure under allocation faults. */
#include "test_helpers.h"
#include "pool/pool_int.h"

#include <string.h>

static kvc_pool_t *make_pool(uint32_t n_blocks, uint32_t block_size)
{
    kvc_pool_params_t p = kvc_pool_params_default();
    p.n_blocks = n_blocks;
    p.block_size = block_size;
    kvc_pool_t *pool = NULL;
    assert_ok(kvc_pool_create(&p, &pool));
    assert_pool_ok(pool);
    return pool;
}

/* The free queue from head to tail, as an array; returns its length. */
static uint32_t queue(const kvc_pool_t *pool, uint32_t *out, uint32_t cap)
{
    uint32_t n = 0, b;
    assert_ok(kvc__pool_free_next(pool, KVC_NONE, &b));
    while (b != KVC_NONE) {
        assert_true(n < cap);
        out[n++] = b;
        assert_ok(kvc__pool_free_next(pool, b, &b));
    }
    return n;
}

static void create_rejects_bad_parameters(void **state)
{
    (void)state;
    kvc_pool_t *pool = (kvc_pool_t *)0x1;
    kvc_pool_params_t p = kvc_pool_params_default();
    assert_int_equal(kvc_pool_create(NULL, &pool), KVC_EINVAL);
    assert_int_equal(kvc_pool_create(&p, NULL), KVC_EINVAL);
    uint32_t bad_sizes[] = {0, 3, 12, 257, 512};
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad_sizes); i++) {
        p = kvc_pool_params_default();
        p.block_size = bad_sizes[i];
        assert_int_equal(kvc_pool_create(&p, &pool), KVC_EINVAL);
        assert_null(pool);
    }
    p = kvc_pool_params_default();
    p.n_blocks = 0;
    assert_int_equal(kvc_pool_create(&p, &pool), KVC_EINVAL);
    /* storage: half-filled descriptors, a bad dtype, n_kv > 2 */
    p = kvc_pool_params_default();
    p.storage = (kvc_storage_desc_t){.n_layers = 2, .n_kv_heads = 0, .head_dim = 64};
    assert_int_equal(kvc_pool_create(&p, &pool), KVC_EINVAL);
    p.storage = (kvc_storage_desc_t){.n_layers = 2, .n_kv_heads = 2, .head_dim = 64, .dtype = 99};
    assert_int_equal(kvc_pool_create(&p, &pool), KVC_EINVAL);
    p.storage = (kvc_storage_desc_t){.n_layers = 2, .n_kv_heads = 2, .head_dim = 64, .n_kv = 3};
    assert_int_equal(kvc_pool_create(&p, &pool), KVC_EINVAL);
    /* sizes that overflow are refused, not wrapped */
    p.storage = (kvc_storage_desc_t){
        .n_layers = UINT32_MAX, .n_kv_heads = UINT32_MAX, .head_dim = UINT32_MAX};
    assert_int_equal(kvc_pool_create(&p, &pool), KVC_EOVERFLOW);
    p.n_blocks = 1u << 31;
    p.storage = (kvc_storage_desc_t){.n_layers = 1024, .n_kv_heads = 1024, .head_dim = 1024};
    assert_int_equal(kvc_pool_create(&p, &pool), KVC_EOVERFLOW);
    kvc_pool_destroy(NULL);
    /* every legal block size works */
    for (uint32_t bs = 1; bs <= 256; bs *= 2) kvc_pool_destroy(make_pool(4, bs));
}

static void dtypes_have_sizes_names_and_parse(void **state)
{
    (void)state;
    size_t sizes[] = {4, 2, 2, 1, 1};
    for (int d = 0; d < KVC_DTYPE__COUNT; d++) {
        kvc_dtype_t back;
        assert_int_equal(kvc_dtype_bytes((kvc_dtype_t)d), sizes[d]);
        assert_ok(kvc_dtype_parse(kvc_dtype_name((kvc_dtype_t)d), &back));
        assert_int_equal(back, d);
    }
    kvc_dtype_t dt;
    assert_ok(kvc_dtype_parse("fp8", &dt));
    assert_int_equal(dt, KVC_DTYPE_FP8_E4M3);
    assert_ok(kvc_dtype_parse("fp16", &dt));
    assert_int_equal(dt, KVC_DTYPE_F16);
    assert_int_equal(kvc_dtype_parse("int3", &dt), KVC_EINVAL);
    assert_int_equal(kvc_dtype_parse(NULL, &dt), KVC_EINVAL);
    assert_int_equal(kvc_dtype_bytes(KVC_DTYPE__COUNT), 0);
    assert_string_equal(kvc_dtype_name(KVC_DTYPE__COUNT), "?");
}

static void storage_layout_is_block_major_and_aligned(void **state)
{
    (void)state;
    kvc_pool_params_t p = kvc_pool_params_default();
    p.n_blocks = 3;
    p.block_size = 16;
    p.storage = (kvc_storage_desc_t){
        .n_layers = 2, .n_kv_heads = 4, .head_dim = 8, .dtype = KVC_DTYPE_BF16, .scale_bytes = 10};
    kvc_pool_t *pool;
    assert_ok(kvc_pool_create(&p, &pool));
    /* (layers 2, kv 2, heads 4, tokens 16, dim 8) * 2 bytes = 4096, + 10 scale bytes, padded to
     * 64 -> 4160; one (layer, kv) slab is 4 * 16 * 8 * 2 = 1024 bytes */
    assert_int_equal(kvc_pool_block_bytes(pool), 4160);
    assert_int_equal(kvc_pool_storage(pool)->n_kv, 2);
    uint8_t *b0 = kvc_pool_block_data(pool, 0), *b1 = kvc_pool_block_data(pool, 1);
    assert_non_null(b0);
    assert_int_equal((uintptr_t)b0 % 64, 0);
    assert_int_equal(b1 - b0, 4160);
    assert_ptr_equal(kvc_pool_kv_data(pool, 1, 0, 0), b1);
    assert_ptr_equal(kvc_pool_kv_data(pool, 1, 0, 1), b1 + 1024);
    assert_ptr_equal(kvc_pool_kv_data(pool, 1, 1, 0), b1 + 2048);
    assert_ptr_equal(kvc_pool_kv_data(pool, 1, 1, 1), b1 + 3072);
    assert_ptr_equal(kvc_pool_scale_data(pool, 1), b1 + 4096);
    assert_null(kvc_pool_kv_data(pool, 1, 2, 0)); /* bad layer */
    assert_null(kvc_pool_kv_data(pool, 1, 0, 2)); /* bad kv */
    assert_null(kvc_pool_kv_data(pool, 3, 0, 0)); /* bad block */
    assert_null(kvc_pool_block_data(pool, 3));
    /* storage starts zeroed; copy_block copies every byte */
    for (size_t i = 0; i < 4160; i++) assert_int_equal(b0[i], 0);
    for (size_t i = 0; i < 4160; i++) b1[i] = (uint8_t)(i * 7);
    assert_ok(kvc_pool_copy_block(pool, 2, 1));
    assert_memory_equal(kvc_pool_block_data(pool, 2), b1, 4160);
    assert_int_equal(kvc_pool_copy_block(pool, 3, 1), KVC_EINVAL);
    kvc_pool_destroy(pool);

    /* MLA: one latent per layer (n_kv = 1), fp8 */
    p.storage = (kvc_storage_desc_t){
        .n_layers = 3, .n_kv_heads = 1, .head_dim = 576, .n_kv = 1, .dtype = KVC_DTYPE_FP8_E4M3};
    assert_ok(kvc_pool_create(&p, &pool));
    assert_int_equal(kvc_pool_block_bytes(pool), 3 * 16 * 576);
    assert_null(kvc_pool_kv_data(pool, 0, 0, 1));
    assert_null(kvc_pool_scale_data(pool, 0));
    kvc_pool_destroy(pool);

    /* metadata only: no bytes anywhere */
    pool = make_pool(4, 16);
    assert_int_equal(kvc_pool_block_bytes(pool), 0);
    assert_null(kvc_pool_block_data(pool, 0));
    assert_null(kvc_pool_kv_data(pool, 0, 0, 0));
    assert_ok(kvc_pool_copy_block(pool, 1, 0));
    kvc_pool_destroy(pool);
}

static void alloc_is_all_or_nothing_and_says_why(void **state)
{
    (void)state;
    kvc_pool_t *pool = make_pool(8, 16);
    uint32_t a[8], b[8];
    assert_int_equal(kvc_pool_n_blocks(pool), 8);
    assert_int_equal(kvc_pool_block_size(pool), 16);
    assert_ok(kvc_pool_alloc(pool, 0, NULL));
    assert_ok(kvc_pool_alloc(pool, 5, a));
    for (int i = 0; i < 5; i++) assert_int_equal(kvc_pool_refcount(pool, a[i]), 1);
    assert_int_equal(kvc_pool_n_free(pool), 3);
    memset(b, 0xab, sizeof b);
    assert_int_equal(kvc_pool_alloc(pool, 4, b), KVC_ENOSPC);
    for (int i = 0; i < 8; i++) assert_int_equal(b[i], 0xabababab); /* untouched */
    assert_int_equal(kvc_pool_n_free(pool), 3);                     /* nothing taken */
    assert_int_equal(kvc_pool_alloc(pool, 9, b), KVC_ENOSPC);
    assert_int_equal(kvc_pool_alloc(pool, 1, NULL), KVC_EINVAL);
    kvc_pool_stats_t s;
    kvc_pool_stats(pool, &s);
    assert_int_equal(s.n_alloc_failed, 2);
    assert_int_equal(s.n_allocated, 5);
    assert_int_equal(s.n_used, 5);
    assert_pool_ok(pool);
    assert_ok(kvc_pool_release(pool, a, 5));
    assert_int_equal(kvc_pool_n_free(pool), 8);
    assert_pool_ok(pool);
    kvc_pool_destroy(pool);
}

static void ref_unref_and_underflow_change_nothing(void **state)
{
    (void)state;
    kvc_pool_t *pool = make_pool(4, 16);
    uint32_t a;
    assert_ok(kvc_pool_alloc(pool, 1, &a));
    assert_ok(kvc_pool_ref(pool, a));
    assert_int_equal(kvc_pool_refcount(pool, a), 2);
    assert_ok(kvc_pool_unref(pool, a));
    assert_ok(kvc_pool_unref(pool, a));
    assert_int_equal(kvc_pool_n_free(pool), 4);
    assert_int_equal(kvc_pool_unref(pool, a), KVC_EUNDERFLOW); /* no double free */
    assert_int_equal(kvc_pool_n_free(pool), 4);
    assert_int_equal(kvc_pool_ref(pool, 4), KVC_EINVAL);
    assert_int_equal(kvc_pool_unref(pool, 99), KVC_EINVAL);
    assert_int_equal(kvc_pool_refcount(pool, 99), 0);
    /* ref on a free block pins it: it leaves the free queue */
    assert_ok(kvc_pool_ref(pool, 2));
    assert_int_equal(kvc_pool_n_free(pool), 3);
    assert_pool_ok(pool);
    assert_ok(kvc_pool_unref(pool, 2));
    assert_pool_ok(pool);
    kvc_pool_destroy(pool);
}

static void release_validates_the_whole_table_first(void **state)
{
    (void)state;
    kvc_pool_t *pool = make_pool(8, 16);
    uint32_t t[4];
    assert_ok(kvc_pool_alloc(pool, 4, t));
    uint32_t bad[] = {t[0], t[1], 99};
    assert_int_equal(kvc_pool_release(pool, bad, 3), KVC_EINVAL);
    uint32_t twice[] = {t[0], t[1], t[1]}; /* t[1] listed twice, referenced once */
    assert_int_equal(kvc_pool_release(pool, twice, 3), KVC_EUNDERFLOW);
    for (int i = 0; i < 4; i++) assert_int_equal(kvc_pool_refcount(pool, t[i]), 1);
    assert_int_equal(kvc_pool_n_free(pool), 4);
    assert_int_equal(kvc_pool_release(pool, NULL, 2), KVC_EINVAL);
    assert_ok(kvc_pool_release(pool, NULL, 0));
    /* KVC_NONE entries (released sliding-window blocks) are skipped */
    uint32_t holes[] = {t[0], KVC_NONE, t[2]};
    assert_ok(kvc_pool_release(pool, holes, 3));
    assert_int_equal(kvc_pool_refcount(pool, t[0]), 0);
    assert_int_equal(kvc_pool_refcount(pool, t[1]), 1);
    assert_pool_ok(pool);
    /* a block referenced twice may be listed twice */
    assert_ok(kvc_pool_ref(pool, t[1]));
    assert_ok(kvc_pool_release(pool, twice + 1, 2));
    assert_int_equal(kvc_pool_refcount(pool, t[1]), 0);
    assert_pool_ok(pool);
    kvc_pool_destroy(pool);
}

static void uncached_blocks_are_reused_before_cached_ones(void **state)
{
    (void)state;
    kvc_pool_t *pool = make_pool(6, 4);
    uint32_t t[6], q[6];
    assert_ok(kvc_pool_alloc(pool, 6, t));
    assert_int_equal(t[0], 0);
    assert_int_equal(t[5], 5);
    /* blocks 0..2 get cached, 3..5 do not */
    for (int i = 0; i < 3; i++) assert_ok(kvc__pool_set_cached(pool, t[i], true));
    assert_true(kvc_pool_is_cached(pool, 0));
    assert_false(kvc_pool_is_cached(pool, 3));
    assert_false(kvc_pool_is_cached(pool, 99));
    assert_ok(kvc_pool_release(pool, t, 6)); /* tail first: 5,4,3 then 2,1,0 */
    assert_int_equal(queue(pool, q, 6), 6);
    /* uncached run first (3,4,5 in any order), then the cached run tail-first: 2,1,0 */
    uint32_t cached_run[] = {2, 1, 0};
    assert_memory_equal(q + 3, cached_run, sizeof cached_run);
    for (int i = 0; i < 3; i++) assert_true(q[i] >= 3);
    assert_int_equal(kvc__pool_free_cached_first(pool), 2);
    kvc_pool_stats_t s;
    kvc_pool_stats(pool, &s);
    assert_int_equal(s.n_free_cached, 3);
    /* allocating 4 takes the three uncached blocks, then the oldest cached one (the tail, 2) */
    uint32_t a[4];
    assert_ok(kvc_pool_alloc(pool, 4, a));
    for (int i = 0; i < 3; i++) assert_true(a[i] >= 3);
    assert_int_equal(a[3], 2);
    assert_false(kvc_pool_is_cached(pool, 2)); /* its identity went with it */
    kvc_pool_stats(pool, &s);
    assert_int_equal(s.n_evicted, 1);
    assert_pool_ok(pool);
    kvc_pool_destroy(pool);
}

static void set_cached_moves_free_blocks_between_runs(void **state)
{
    (void)state;
    kvc_pool_t *pool = make_pool(4, 4);
    uint32_t q[4];
    assert_ok(kvc__pool_set_cached(pool, 1, true)); /* a free block becomes cached: to the tail */
    assert_int_equal(queue(pool, q, 4), 4);
    assert_int_equal(q[3], 1);
    assert_ok(kvc__pool_set_cached(pool, 1, true)); /* idempotent */
    assert_ok(kvc__pool_set_cached(pool, 0, true));
    assert_int_equal(kvc__pool_free_cached_first(pool), 1);
    assert_ok(
        kvc__pool_set_cached(pool, 1, false)); /* uncached again: back before the cached run */
    queue(pool, q, 4);
    assert_int_equal(q[3], 0);
    assert_int_equal(kvc__pool_free_cached_first(pool), 0);
    assert_pool_ok(pool);
    assert_ok(kvc__pool_set_cached(pool, 0, false));
    assert_int_equal(kvc__pool_free_cached_first(pool), KVC_NONE);
    assert_pool_ok(pool);
    kvc_pool_destroy(pool);
}

/* An evictor that refuses the blocks in `busy`, and records whom it was asked about. */
typedef struct {
    bool busy[16];
    uint32_t asked[64];
    int n_asked;
} evictor_t;

static int test_evict(void *ctx, uint32_t block)
{
    evictor_t *e = ctx;
    e->asked[e->n_asked++] = block;
    return e->busy[block] ? KVC_EBUSY : 0;
}

static void evictor_can_hold_blocks_back(void **state)
{
    (void)state;
    kvc_pool_t *pool = make_pool(4, 4);
    evictor_t ev = {0};
    kvc__pool_set_evictor(pool, test_evict, &ev);
    for (uint32_t b = 0; b < 4; b++) assert_ok(kvc__pool_set_cached(pool, b, true));
    ev.busy[0] = ev.busy[1] = true;
    uint32_t a[4];
    memset(a, 0xab, sizeof a);
    /* 4 free, but the evictor holds two back: EBUSY, nothing taken */
    assert_int_equal(kvc_pool_alloc(pool, 3, a), KVC_EBUSY);
    assert_int_equal(kvc_pool_n_free(pool), 4);
    assert_pool_ok(pool);
    /* the two it gave up lost their identity (they went back uncached, to the head) */
    assert_false(kvc_pool_is_cached(pool, 2));
    assert_false(kvc_pool_is_cached(pool, 3));
    assert_true(kvc_pool_is_cached(pool, 0));
    /* two can be had: the uncached ones, without asking the evictor */
    ev.n_asked = 0;
    assert_ok(kvc_pool_alloc(pool, 2, a));
    assert_int_equal(ev.n_asked, 0);
    assert_true(a[0] >= 2 && a[1] >= 2);
    /* release the busy marks: now the cached ones go, oldest first */
    ev.busy[0] = ev.busy[1] = false;
    uint32_t c[2];
    assert_ok(kvc_pool_alloc(pool, 2, c));
    assert_int_equal(c[0], 0);
    assert_int_equal(c[1], 1);
    assert_pool_ok(pool);
    kvc_pool_destroy(pool);
}

/* Block 0 is a parent whose cached child, block 1, sits behind it in the queue: 0 is busy
 * until 1 has been evicted. */
static int parent_child_evict(void *ctx, uint32_t block)
{
    bool *child_cached = ctx;
    if (block == 0) return *child_cached ? KVC_EBUSY : 0;
    if (block == 1) *child_cached = false;
    return 0;
}

static void skipped_blocks_are_retried_after_their_children_go(void **state)
{
    (void)state;
    kvc_pool_t *pool = make_pool(2, 4);
    bool child_cached = true;
    kvc__pool_set_evictor(pool, parent_child_evict, &child_cached);
    assert_ok(kvc__pool_set_cached(pool, 0, true));
    assert_ok(kvc__pool_set_cached(pool, 1, true));
    uint32_t a[2];
    assert_ok(kvc_pool_alloc(pool, 2, a));
    assert_int_equal(a[0], 1); /* the child first */
    assert_int_equal(a[1], 0); /* then, on the second pass, its parent */
    assert_false(kvc_pool_is_cached(pool, 0));
    assert_pool_ok(pool);
    kvc_pool_destroy(pool);
}

static void caller_errors_are_error_codes(void **state)
{
    (void)state;
    /* Each of these was a KVC_ASSERT (an abort in the release build) or a crash. */
    kvc_pool_t *pool = make_pool(4, 4);
    uint32_t a, next;
    assert_ok(kvc_pool_alloc(pool, 1, &a));
    assert_int_equal(kvc__pool_set_cached(pool, 4, true), KVC_EINVAL);
    assert_int_equal(kvc__pool_set_cached(pool, KVC_NONE, false), KVC_EINVAL);
    assert_int_equal(kvc__pool_set_cached(NULL, 0, true), KVC_EINVAL);
    assert_int_equal(kvc__pool_free_next(pool, a, &next), KVC_EBUSY); /* in use: in no queue */
    assert_int_equal(kvc__pool_free_next(pool, 4, &next), KVC_EINVAL);
    assert_int_equal(kvc__pool_free_next(pool, KVC_NONE, NULL), KVC_EINVAL);
    assert_int_equal(kvc__pool_set_level(pool, a, KVC__POOL_LEVELS), KVC_EINVAL);
    assert_int_equal(kvc__pool_set_level(pool, 4, 0), KVC_EINVAL);
    assert_int_equal(kvc_pool_alloc(NULL, 1, &a), KVC_EINVAL);
    assert_int_equal(kvc_pool_ref(NULL, 0), KVC_EINVAL);
    assert_int_equal(kvc_pool_unref(NULL, 0), KVC_EINVAL);
    assert_int_equal(kvc_pool_release(NULL, &a, 1), KVC_EINVAL);
    assert_int_equal(kvc_pool_copy_block(NULL, 0, 1), KVC_EINVAL);
    assert_int_equal(kvc_pool_check(NULL, NULL, 0), KVC_EINVAL);
    assert_false(kvc_pool_is_cached(NULL, 0));
    assert_int_equal(kvc_pool_refcount(NULL, 0), 0);
    /* a block never handed out is free: unref and release say so and change nothing */
    assert_int_equal(kvc_pool_unref(pool, 3), KVC_EUNDERFLOW);
    uint32_t t[] = {a, 3};
    assert_int_equal(kvc_pool_release(pool, t, 2), KVC_EUNDERFLOW);
    assert_int_equal(kvc_pool_refcount(pool, a), 1);
    assert_pool_ok(pool);
    assert_ok(kvc_pool_release(pool, &a, 1));
    assert_pool_ok(pool);
    kvc_pool_destroy(pool);
}

static void levels_rank_cached_blocks_oldest_first_within_a_level(void **state)
{
    (void)state;
    kvc_pool_t *pool = make_pool(8, 4);
    uint32_t t[8], q[8];
    assert_ok(kvc_pool_alloc(pool, 8, t));
    /* blocks 0..5 cached at levels 2, 0, 1, 0, 2, 1; 6 and 7 uncached */
    const uint32_t level[6] = {2, 0, 1, 0, 2, 1};
    for (uint32_t b = 0; b < 6; b++) {
        assert_ok(kvc__pool_set_cached(pool, b, true));
        assert_ok(kvc__pool_set_level(pool, b, level[b]));
        assert_int_equal(kvc__pool_level(pool, b), level[b]);
    }
    for (uint32_t b = 0; b < 8; b++) assert_ok(kvc_pool_unref(pool, b)); /* freed in id order */
    assert_int_equal(queue(pool, q, 8), 8);
    const uint32_t want[8] = {6, 7, 1, 3, 2, 5, 0, 4}; /* uncached; level 0, 1, 2 oldest first */
    assert_memory_equal(q, want, sizeof want);
    assert_int_equal(kvc__pool_free_cached_first(pool), 1);
    /* a free block whose level changes moves to the tail of its new level */
    assert_ok(kvc__pool_set_level(pool, 1, 1));
    assert_ok(kvc__pool_set_level(pool, 2, 1)); /* same level: stays put */
    queue(pool, q, 8);
    const uint32_t moved[8] = {6, 7, 3, 2, 5, 1, 0, 4};
    assert_memory_equal(q, moved, sizeof moved);
    assert_pool_ok(pool);
    /* allocation follows the queue; evicted blocks come back at level 0 */
    uint32_t a[5];
    assert_ok(kvc_pool_alloc(pool, 5, a));
    const uint32_t taken[5] = {6, 7, 3, 2, 5};
    assert_memory_equal(a, taken, sizeof taken);
    assert_int_equal(kvc__pool_level(pool, 2), 0);
    assert_false(kvc_pool_is_cached(pool, 2));
    /* uncaching a free block puts it at the end of the uncached run, at level 0 */
    assert_ok(kvc__pool_set_cached(pool, 0, false));
    assert_int_equal(kvc__pool_level(pool, 0), 0);
    queue(pool, q, 8);
    const uint32_t last[3] = {0, 1, 4};
    assert_memory_equal(q, last, sizeof last);
    assert_pool_ok(pool);
    kvc_pool_destroy(pool);
}

static void blocks_never_used_keep_their_place_and_cost_nothing(void **state)
{
    (void)state;
    kvc_pool_t *pool = make_pool(8, 4);
    kvc_pool_stats_t s;
    kvc_pool_stats(pool, &s);
    assert_int_equal(s.n_high_water, 0);
    uint32_t a[2], q[8];
    assert_ok(kvc_pool_alloc(pool, 2, a)); /* 0, 1 */
    assert_ok(kvc_pool_unref(pool, a[0])); /* to the end of the uncached run, after 2..7 */
    assert_int_equal(kvc__pool_high_water(pool), 2);
    /* pinning a never-used block by id initialises the ones before it, in place */
    assert_ok(kvc_pool_ref(pool, 5));
    assert_int_equal(kvc__pool_high_water(pool), 6);
    assert_int_equal(queue(pool, q, 8), 6);
    const uint32_t want[6] = {2, 3, 4, 6, 7, 0};
    assert_memory_equal(q, want, sizeof want);
    assert_ok(kvc__pool_set_cached(pool, 7, true)); /* a cached never-used block: to the tail */
    queue(pool, q, 8);
    const uint32_t cached[6] = {2, 3, 4, 6, 0, 7};
    assert_memory_equal(q, cached, sizeof cached);
    assert_pool_ok(pool);
    uint32_t b[5];
    assert_ok(kvc_pool_alloc(pool, 5, b));
    assert_memory_equal(b, cached, sizeof b);
    kvc_pool_stats(pool, &s);
    assert_int_equal(s.n_high_water, 8);
    assert_int_equal(s.n_free, 1);
    assert_pool_ok(pool);
    kvc_pool_destroy(pool);
}

/* Issue 11: `sim --num-blocks 100000000` took 18.6 GB, about 186 bytes of metadata per block
 * no request touches.  A pool's metadata is now written only for blocks handed out: a 2^24-block
 * pool (384 MiB of block metadata) with 2000 blocks ever used faults in well under 1 MiB.  (The
 * sanitizers write shadow memory for every allocation, an eighth of its size: allowed for.) */
static void a_huge_pool_costs_memory_only_for_the_blocks_used(void **state)
{
    (void)state;
    const long page = 4096;
    kvc_pool_params_t p = kvc_pool_params_default();
    p.n_blocks = 1u << 24;
    size_t reserved, per_block;
    assert_ok(kvc_pool_metadata_bytes(&p, &reserved, &per_block));
    assert_true(per_block >= 16 && per_block <= 64);
    assert_true(reserved >= per_block << 24 && reserved < (per_block << 24) + 4096);
    p.n_blocks = 0;
    assert_int_equal(kvc_pool_metadata_bytes(&p, &reserved, NULL), KVC_EINVAL);
    assert_int_equal(kvc_pool_metadata_bytes(NULL, &reserved, NULL), KVC_EINVAL);

    long before = kvc_test_minor_faults();
    uint64_t t0 = kvc_now_ns();
    kvc_pool_t *pool = make_pool(1u << 24, 16);
    uint32_t *t = test_malloc(1000 * sizeof *t);
    assert_ok(kvc_pool_alloc(pool, 1000, t));
    assert_ok(kvc_pool_release(pool, t, 1000));
    assert_ok(kvc_pool_alloc(pool, 1000, t)); /* fresh blocks first: 2000 used in all */
    kvc_pool_stats_t s;
    kvc_pool_stats(pool, &s);
    assert_pool_ok(pool);
    long faults = kvc_test_minor_faults() - before;
    double ms = (double)(kvc_now_ns() - t0) / 1e6;
    assert_ok(kvc_pool_release(pool, t, 1000));
    test_free(t);
    kvc_pool_destroy(pool);
    print_message("2^24-block pool (%.0f MiB of metadata reserved), 2000 blocks used: %ld pages "
                  "faulted (%.1f KiB), %.2f ms\n",
                  (double)reserved / (1 << 20), faults, (double)faults * page / 1024, ms);
    assert_int_equal(s.n_high_water, 2000);
    assert_int_equal(s.n_free, (1u << 24) - 1000);
    const long shadow = KVC_TEST_SANITIZED ? (long)(reserved / 8 / page) + 256 : 0;
    assert_true(faults * page < (1l << 20) + shadow * page);
}

/* Two pools driven by the same calls end alike: every block's refcount, cached mark and level,
 * and the free queue's order. */
static void assert_twins(const kvc_pool_t *a, const kvc_pool_t *b)
{
    uint32_t qa[64], qb[64];
    uint32_t na = queue(a, qa, 64), nb = queue(b, qb, 64);
    assert_int_equal(na, nb);
    assert_memory_equal(qa, qb, na * sizeof *qa);
    for (uint32_t i = 0; i < kvc_pool_n_blocks(a); i++) {
        assert_int_equal(kvc_pool_refcount(a, i), kvc_pool_refcount(b, i));
        assert_int_equal(kvc_pool_is_cached(a, i), kvc_pool_is_cached(b, i));
        assert_int_equal(kvc__pool_level(a, i), kvc__pool_level(b, i));
    }
    assert_pool_ok(a);
    assert_pool_ok(b);
}

/* Twin pools with 24 blocks in use, some cached at various levels, the rest free. */
static void make_twins(kvc_rng_t *r, kvc_pool_t **a, kvc_pool_t **b, uint32_t *used)
{
    kvc_pool_t *p[2] = {make_pool(32, 16), make_pool(32, 16)};
    uint32_t seed = kvc_rng_below(r, 1u << 30);
    for (int k = 0; k < 2; k++) {
        kvc_rng_t rr;
        kvc_rng_seed(&rr, seed);
        assert_ok(kvc_pool_alloc(p[k], 24, used));
        for (uint32_t i = 0; i < 24; i++) {
            if (kvc_rng_below(&rr, 2)) assert_ok(kvc__pool_set_cached(p[k], used[i], true));
            assert_ok(kvc__pool_set_level(p[k], used[i], kvc_rng_below(&rr, 3)));
        }
        /* a few go back to the queue first, so that the queue has an order to keep */
        for (uint32_t i = 0; i < 6; i++) assert_ok(kvc_pool_unref(p[k], used[18 + i]));
    }
    *a = p[0];
    *b = p[1];
}

/* kvc_pool_release is kvc_pool_unref on each entry from the end of the table once the table is
 * valid, including tables that name a block more than once (it holds as many references) or
 * hold KVC_NONE: randomized twins end alike. */
static void release_queues_blocks_as_unrefs_from_the_end_would(void **state)
{
    (void)state;
    kvc_rng_t r;
    kvc_rng_seed(&r, 77);
    for (int round = 0; round < 200; round++) {
        kvc_pool_t *a, *b;
        uint32_t used[24], table[40];
        make_twins(&r, &a, &b, used);
        uint32_t n = 1 + kvc_rng_below(&r, 40);
        for (uint32_t j = 0; j < n; j++) {
            uint32_t pick = kvc_rng_below(&r, 19); /* used[0 .. 17] are in use; 18: a hole */
            table[j] = pick == 18 ? KVC_NONE : used[pick];
            if (table[j] != KVC_NONE && j > 0 && kvc_rng_below(&r, 3) == 0)
                table[j] = table[kvc_rng_below(&r, j)]; /* listed again */
        }
        /* one reference per listing */
        for (uint32_t j = 0; j < n; j++) {
            if (table[j] == KVC_NONE) continue;
            bool seen = false;
            for (uint32_t i = 0; i < j; i++) seen |= table[i] == table[j];
            if (seen) {
                assert_ok(kvc_pool_ref(a, table[j]));
                assert_ok(kvc_pool_ref(b, table[j]));
            }
        }
        assert_twins(a, b);
        assert_ok(kvc_pool_release(a, table, n));
        for (uint32_t j = n; j-- > 0;)
            if (table[j] != KVC_NONE) assert_ok(kvc_pool_unref(b, table[j]));
        assert_twins(a, b);
        kvc_pool_destroy(a);
        kvc_pool_destroy(b);
    }
}

/* kvc__pool_ref_n is kvc_pool_ref on each block in order (free ones leave the queue), and on a
 * bad id gives back what it took, as kvc_pool_unref would, and returns the error. */
static void ref_n_takes_every_reference_or_none(void **state)
{
    (void)state;
    kvc_rng_t r;
    kvc_rng_seed(&r, 78);
    for (int round = 0; round < 200; round++) {
        kvc_pool_t *a, *b;
        uint32_t used[24], list[16];
        make_twins(&r, &a, &b, used);
        uint32_t n = kvc_rng_below(&r, 16), bad = kvc_rng_below(&r, 2) ? kvc_rng_below(&r, 16) : 16;
        for (uint32_t j = 0; j < n; j++)
            list[j] = j == bad ? 32 + kvc_rng_below(&r, 3) : kvc_rng_below(&r, 32);
        uint32_t before[32];
        for (uint32_t i = 0; i < 32; i++) before[i] = kvc_pool_refcount(a, i);
        int rc = kvc__pool_ref_n(a, n ? list : NULL, n);
        uint32_t j = 0;
        for (; j < n && list[j] < 32; j++) assert_ok(kvc_pool_ref(b, list[j]));
        if (j < n) { /* the bad id: give back */
            assert_int_equal(rc, KVC_EINVAL);
            while (j-- > 0) assert_ok(kvc_pool_unref(b, list[j]));
            for (uint32_t i = 0; i < 32; i++) assert_int_equal(kvc_pool_refcount(a, i), before[i]);
        } else {
            assert_ok(rc);
        }
        assert_twins(a, b);
        kvc_pool_destroy(a);
        kvc_pool_destroy(b);
    }
    kvc_pool_t *pool = make_pool(4, 16);
    uint32_t one = 0;
    assert_int_equal(kvc__pool_ref_n(NULL, &one, 1), KVC_EINVAL);
    assert_int_equal(kvc__pool_ref_n(pool, NULL, 1), KVC_EINVAL);
    assert_ok(kvc__pool_ref_n(pool, NULL, 0));
    assert_int_equal(kvc_pool_n_free(pool), 4);
    kvc_pool_destroy(pool);
}

static void create_fails_cleanly_under_allocation_faults(void **state)
{
    (void)state;
    for (uint64_t n = 1; n <= 4; n++) {
        kvc_failing_alloc_t st = {.fail_at = n};
        kvc_pool_params_t p = kvc_pool_params_default();
        p.allocator = kvc_failing_allocator(&st);
        p.storage = (kvc_storage_desc_t){.n_layers = 1, .n_kv_heads = 1, .head_dim = 8};
        kvc_pool_t *pool = NULL;
        int rc = kvc_pool_create(&p, &pool);
        if (st.n_failed) {
            assert_int_equal(rc, KVC_ENOMEM);
            assert_null(pool);
        } else {
            assert_ok(rc);
            kvc_pool_destroy(pool);
        }
        assert_int_equal(st.n_live, 0); /* nothing leaked */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(create_rejects_bad_parameters),
        cmocka_unit_test(dtypes_have_sizes_names_and_parse),
        cmocka_unit_test(storage_layout_is_block_major_and_aligned),
        cmocka_unit_test(alloc_is_all_or_nothing_and_says_why),
        cmocka_unit_test(ref_unref_and_underflow_change_nothing),
        cmocka_unit_test(release_validates_the_whole_table_first),
        cmocka_unit_test(release_queues_blocks_as_unrefs_from_the_end_would),
        cmocka_unit_test(ref_n_takes_every_reference_or_none),
        cmocka_unit_test(uncached_blocks_are_reused_before_cached_ones),
        cmocka_unit_test(set_cached_moves_free_blocks_between_runs),
        cmocka_unit_test(evictor_can_hold_blocks_back),
        cmocka_unit_test(skipped_blocks_are_retried_after_their_children_go),
        cmocka_unit_test(caller_errors_are_error_codes),
        cmocka_unit_test(levels_rank_cached_blocks_oldest_first_within_a_level),
        cmocka_unit_test(blocks_never_used_keep_their_place_and_cost_nothing),
        cmocka_unit_test(a_huge_pool_costs_memory_only_for_the_blocks_used),
        cmocka_unit_test(create_fails_cleanly_under_allocation_faults),
    };
    return cmocka_run_group_tests_name("pool", tests, NULL, NULL);
}
