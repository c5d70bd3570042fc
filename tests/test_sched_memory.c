/* test_sched_memory.c - the scheduler's memory is bounded by the live requests,
 * not by the requests it has seen (DESIGN.md invariant 12): millions of short
 * requests through a small pool, with the scheduler's allocations and the
 * whole stack's counted by byte-counting allocators.  After a warm-up the
 * scheduler allocates nothing at all, and its live bytes stay under a
 * constant times the peak of live requests. */
#include "test_helpers.h"

#include <stdlib.h>
#include <string.h>

/* A byte-counting allocator: a 64-byte header holds the size. */
typedef struct {
    uint64_t n_allocs, n_live;
    size_t live_bytes, peak_bytes;
} counter_t;

static void *count_alloc(void *ctx, size_t bytes, size_t align)
{
    counter_t *c = ctx;
    if (align < 64) align = 64;
    void *raw = NULL;
    if (posix_memalign(&raw, align, align + bytes)) return NULL;
    *(size_t *)raw = bytes;
    c->n_allocs++;
    c->n_live++;
    c->live_bytes += bytes;
    if (c->live_bytes > c->peak_bytes) c->peak_bytes = c->live_bytes;
    /* the header sits `align` bytes before the block: remember it just below the block */
    char *p = (char *)raw + align;
    ((size_t *)p)[-1] = align;
    return p;
}

static void count_free(void *ctx, void *p)
{
    if (!p) return;
    counter_t *c = ctx;
    size_t align = ((size_t *)p)[-1];
    void *raw = (char *)p - align;
    c->n_live--;
    c->live_bytes -= *(size_t *)raw;
    free(raw);
}

static kvc_allocator_t counting(counter_t *c)
{
    return (kvc_allocator_t){.alloc = count_alloc, .free = count_free, .ctx = c};
}

static void millions_of_requests_hold_flat_memory(void **state)
{
    (void)state;
    const uint64_t n_requests = KVC_TEST_SANITIZED ? 300000 : 3000000;
    const uint32_t live_target = 48;
    counter_t sc = {0}, stack = {0}; /* the scheduler's; the pool's, prefix cache's and seq's */
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = 64;
    pp.block_size = 4;
    pp.allocator = counting(&stack);
    kvc_pool_t *pool;
    assert_ok(kvc_pool_create(&pp, &pool));
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 1;
    cp.allocator = counting(&stack);
    kvc_prefix_t *pc;
    assert_ok(kvc_prefix_create(pool, &cp, &pc));
    kvc_seqs_params_t sqp = kvc_seqs_params_default();
    sqp.allocator = counting(&stack);
    kvc_seqs_t *seqs;
    assert_ok(kvc_seqs_create(pool, pc, &sqp, &seqs));
    kvc_sched_params_t p = kvc_sched_params_default();
    p.max_num_seqs = 32;
    p.max_num_batched_tokens = 128;
    p.allocator = counting(&sc);
    kvc_sched_t *s;
    assert_ok(kvc_sched_create(seqs, &p, &s));

    kvc_rng_t rng;
    kvc_rng_seed(&rng, 42);
    kvc_token_t prompts[4][8];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 8; j++)
            prompts[i][j] = (kvc_token_t)(i * 100 + j); /* shared prefixes */
    uint32_t out_len[1024] = {0}, n_out[1024] = {0};    /* by tag % 1024: at most 48 live */
    kvc_sched_result_t res[64];
    uint64_t added = 0, finished = 0, steps = 0;
    uint32_t peak_live = 0;
    uint64_t warm_allocs = 0, warm_stack_allocs = 0;
    size_t warm_peak = 0, warm_stack_peak = 0;
    double now = 0;
    char msg[256];
    while (finished < n_requests) {
        kvc_sched_stats_t st;
        kvc_sched_stats(s, &st);
        uint32_t live = st.n_waiting + st.n_running + st.n_swapped + st.n_finished;
        for (; live < live_target && added < n_requests; live++, added++) {
            uint32_t k = (uint32_t)kvc_rng_below(&rng, 4), n = 1 + (uint32_t)kvc_rng_below(&rng, 8);
            kvc_sched_req_t r = {.prompt = prompts[k],
                                 .n_prompt = n,
                                 .max_output = 4,
                                 .priority = (uint32_t)kvc_rng_below(&rng, 2),
                                 .tag = added};
            kvc_req_id_t id;
            assert_ok(kvc_sched_add(s, &r, now, &id));
            out_len[added % 1024] = 1 + (uint32_t)kvc_rng_below(&rng, 3);
            n_out[added % 1024] = 0;
        }
        peak_live = KVC_MAX(peak_live, live);
        const kvc_sched_plan_t *plan;
        assert_ok(kvc_sched_step(s, now, &plan));
        for (uint32_t i = 0; i < plan->n_entries; i++) {
            const kvc_sched_entry_t *e = &plan->entries[i];
            uint32_t t = (uint32_t)(e->tag % 1024);
            res[i] = (kvc_sched_result_t){.id = e->id, .token = 5};
            if (e->samples) res[i].finished = ++n_out[t] >= out_len[t];
        }
        now += 0.01;
        assert_ok(kvc_sched_complete(s, res, plan->n_entries, now));
        const kvc_sched_done_t *done;
        uint32_t nd;
        assert_ok(kvc_sched_take_finished(s, &done, &nd));
        for (uint32_t i = 0; i < nd; i++)
            assert_int_equal(done[i].n_output, out_len[done[i].tag % 1024]);
        finished += nd;
        steps++;
        if (!warm_allocs && finished >= 10000) { /* warmed up: from here on, nothing may grow */
            warm_allocs = sc.n_allocs;
            warm_peak = sc.peak_bytes;
            warm_stack_allocs = stack.n_allocs;
            warm_stack_peak = stack.peak_bytes;
            if (kvc_sched_check(s, msg, sizeof msg)) fail_msg("sched check: %s", msg);
        }
        if (steps % 65536 == 0) {
            /* bounded by the live requests: a constant per request plus the fixed part */
            if (sc.live_bytes > 16384 + 2048 * (size_t)peak_live)
                fail_msg("after %llu requests (peak %u live): %zu live bytes",
                         (unsigned long long)finished, peak_live, sc.live_bytes);
            if (kvc_sched_check(s, msg, sizeof msg)) fail_msg("sched check: %s", msg);
        }
    }
    print_message("%llu requests in %llu steps, at most %u live: scheduler %zu bytes live (peak "
                  "%zu, %llu allocations, %llu after warm-up); pool + prefix + seq %zu bytes "
                  "(peak %zu, %llu allocations in all, %llu after warm-up)\n",
                  (unsigned long long)finished, (unsigned long long)steps, peak_live, sc.live_bytes,
                  sc.peak_bytes, (unsigned long long)sc.n_allocs,
                  (unsigned long long)(sc.n_allocs - warm_allocs), stack.live_bytes,
                  stack.peak_bytes, (unsigned long long)stack.n_allocs,
                  (unsigned long long)(stack.n_allocs - warm_stack_allocs));
    assert_true(warm_allocs > 0);
    assert_true(sc.n_allocs == warm_allocs); /* the scheduler allocated nothing after warm-up */
    assert_true(sc.peak_bytes == warm_peak);
    assert_true(sc.peak_bytes <= 16384 + 2048 * (size_t)peak_live);
    /* the layers below hold flat memory too (they may allocate and free per request) */
    assert_true(stack.peak_bytes == warm_stack_peak);
    if (kvc_sched_check(s, msg, sizeof msg)) fail_msg("sched check: %s", msg);
    kvc_sched_destroy(s);
    kvc_seqs_destroy(seqs);
    kvc_prefix_destroy(pc);
    kvc_pool_destroy(pool);
    assert_int_equal(sc.n_live, 0);
    assert_int_equal(stack.n_live, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(millions_of_requests_hold_flat_memory),
    };
    return cmocka_run_group_tests_name("sched_memory", tests, NULL, NULL);
}
