/* test_sched_faults.c - fault injection: the Nth allocation fails, for every N
 * over a scripted run (create, add, step, complete, abort, take_finished,
 * destroy).
 *
 * With the failing allocator under the scheduler alone, every failure is a
 * clean KVC_ENOMEM from the call that allocated (create or add: nothing after
 * kvc_sched_add allocates), which changed nothing: the run that retries the
 * call makes exactly the decisions of the run that never failed.  With one
 * failing allocator under the whole stack (pool, prefix cache, seq table and
 * scheduler), a failure inside the seq table makes a request wait or end with
 * error KVC_ENOMEM, never an abort of the process; every request still gets
 * exactly one account.  Every time: kvc_sched_check passes after each call,
 * and nothing leaks (the allocator's n_live is 0 after destroy). */
#include "test_helpers.h"

#include <string.h>

#define N_REQ 48

typedef struct {
    kvc_failing_alloc_t fa;
    bool whole_stack; /* the failing allocator under every layer, not just the scheduler */
    kvc_pool_t *pool;
    kvc_prefix_t *pc;
    kvc_seqs_t *seqs;
    kvc_sched_t *s;
    kvc_token_t prompts[N_REQ][40];
    kvc_req_id_t ids[N_REQ];
    bool added[N_REQ], accounted[N_REQ];
    uint32_t out_len[N_REQ], n_out[N_REQ];
    uint32_t n_enomem, n_errors, n_refused;
    bool give_up;          /* every allocation fails from some point on: do not retry an add */
    bool trace;            /* the scheduler keeps its trace (which allocates as it goes) */
    uint64_t setup_allocs; /* allocations made before the first add */
    uint64_t fp;           /* every decision and account, in order */
    double now;
} run_t;

static void check(run_t *r)
{
    char msg[256];
    if (kvc_sched_check(r->s, msg, sizeof msg)) fail_msg("sched check: %s", msg);
}

static kvc_allocator_t stack_allocator(run_t *r)
{
    return r->whole_stack ? kvc_failing_allocator(&r->fa) : (kvc_allocator_t){0};
}

/* Create the layers under the scheduler, retrying what failed for memory. */
static void world(run_t *r)
{
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = 24;
    pp.block_size = 4;
    pp.allocator = stack_allocator(r);
    int rc;
    while ((rc = kvc_pool_create(&pp, &r->pool)) == KVC_ENOMEM) r->n_enomem++;
    assert_ok(rc);
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 3;
    cp.allocator = stack_allocator(r);
    while ((rc = kvc_prefix_create(r->pool, &cp, &r->pc)) == KVC_ENOMEM) r->n_enomem++;
    assert_ok(rc);
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    sp.max_seqs = 16;
    sp.allocator = stack_allocator(r);
    while ((rc = kvc_seqs_create(r->pool, r->pc, &sp, &r->seqs)) == KVC_ENOMEM) r->n_enomem++;
    assert_ok(rc);
}

/* Call `op` until it does not fail for memory; after each failure the scheduler must be as it
 * was (its counters unchanged, its books checked). */
#define RETRY(r, op)                                                             \
    do {                                                                         \
        int rc__;                                                                \
        for (;;) {                                                               \
            kvc_sched_stats_t before_, after_;                                   \
            kvc_sched_stats((r)->s, &before_);                                   \
            rc__ = (op);                                                         \
            if (rc__ != KVC_ENOMEM) break;                                       \
            (r)->n_enomem++;                                                     \
            kvc_sched_stats((r)->s, &after_);                                    \
            assert_memory_equal(&before_, &after_, sizeof before_);              \
            check(r);                                                            \
            if ((r)->give_up) break;                                             \
        }                                                                        \
        if (rc__ == KVC_ENOMEM) return false; /* refused, and nothing changed */ \
        assert_ok(rc__);                                                         \
    } while (0)

static bool add(run_t *r, uint32_t i)
{
    uint32_t n = 1 + (i * 7) % 31;
    for (uint32_t j = 0; j < n; j++) r->prompts[i][j] = (kvc_token_t)((i % 5) * 1000 + j);
    kvc_sched_req_t q = {.prompt = r->prompts[i],
                         .n_prompt = n,
                         .max_output = 12,
                         .priority = i % 3 == 0,
                         .tenant = i % 2,
                         .tag = i};
    r->out_len[i] = 1 + (i * 5) % 9;
    RETRY(r, kvc_sched_add(r->s, &q, r->now, &r->ids[i]));
    r->added[i] = true;
    check(r);
    return true;
}

static void take(run_t *r)
{
    const kvc_sched_done_t *d;
    uint32_t nd;
    assert_ok(kvc_sched_take_finished(r->s, &d, &nd)); /* never allocates */
    for (uint32_t i = 0; i < nd; i++) {
        uint64_t t = d[i].tag;
        assert_true(t < N_REQ && r->added[t] && !r->accounted[t] && d[i].id == r->ids[t]);
        r->accounted[t] = true;
        if (d[i].error) {
            assert_int_equal(d[i].error, KVC_ENOMEM);
            r->n_errors++;
        } else if (!d[i].aborted) {
            assert_int_equal(d[i].n_output, r->out_len[t]);
        }
        r->fp = r->fp * 1000003 + t * 131 + d[i].n_output * 7 + d[i].aborted;
    }
    check(r);
}

static void step(run_t *r)
{
    const kvc_sched_plan_t *p;
    assert_ok(kvc_sched_step(r->s, r->now, &p)); /* never fails for memory */
    check(r);
    kvc_sched_result_t res[16];
    assert_true(p->n_entries <= 16);
    for (uint32_t i = 0; i < p->n_entries; i++) {
        const kvc_sched_entry_t *e = &p->entries[i];
        uint64_t t = e->tag;
        uint32_t acc = KVC_MIN(e->n_drafts, 1u);
        if (e->samples && r->n_out[t] + 1 + acc > r->out_len[t]) acc = 0;
        res[i] = (kvc_sched_result_t){.id = e->id, .token = 9, .n_accepted = acc};
        if (e->samples) {
            r->n_out[t] += 1 + acc;
            res[i].finished = r->n_out[t] >= r->out_len[t];
        }
        r->fp = r->fp * 1000003 + t * 31 + e->n_tokens;
    }
    r->now += 1;
    assert_ok(kvc_sched_complete(r->s, res, p->n_entries, r->now)); /* never fails for memory */
    check(r);
}

static bool idle(const run_t *r)
{
    kvc_sched_stats_t st;
    kvc_sched_stats(r->s, &st);
    return !st.n_running && !st.n_waiting && !st.n_swapped;
}

/* The script.  Returns the number of allocations the scheduler's allocator saw. */
static uint64_t script(run_t *r)
{
    if (r->whole_stack) world(r);
    kvc_sched_params_t p = kvc_sched_params_default();
    p.max_num_seqs = 6;
    p.max_num_batched_tokens = 40;
    p.preemption = KVC_PREEMPT_SWAP;
    p.class_kv_cap[1] = 0.7;
    p.block_bytes = 64;
    p.spec_tokens = 2;
    p.trace = r->trace; /* best effort: a trace that cannot grow never fails a step */
    p.allocator = kvc_failing_allocator(&r->fa);
    int rc;
    while ((rc = kvc_sched_create(r->seqs, &p, &r->s)) == KVC_ENOMEM) {
        assert_null(r->s);
        r->n_enomem++;
    }
    assert_ok(rc);
    r->setup_allocs = r->fa.n_allocs;
    uint32_t next = 0;
    for (int round = 0; round < 8; round++) {
        for (int k = 0; k < 6 && next < N_REQ; k++, next++)
            if (!add(r, next)) r->n_refused++;
        for (int k = 0; k < 3; k++) step(r);
        /* a client goes away: a request in whatever state it is in now */
        if (r->added[next - 2]) {
            int arc = kvc_sched_abort(r->s, r->ids[next - 2]);
            assert_true(arc == 0 || arc == KVC_ESTALE);
            check(r);
        }
        if (round % 2) take(r); /* slots are reused from here on */
    }
    for (int k = 0; k < 400 && !idle(r); k++) step(r);
    for (uint32_t i = 0; i < N_REQ; i++) /* what cannot finish (the allocator is gone) aborts */
        if (r->added[i] && !r->accounted[i]) {
            int arc = kvc_sched_abort(r->s, r->ids[i]);
            assert_true(arc == 0 || arc == KVC_ESTALE);
        }
    if (!idle(r)) step(r); /* aborts inside an open plan are finished by its completion */
    assert_true(idle(r));
    take(r);
    for (uint32_t i = 0; i < N_REQ; i++) assert_int_equal(r->accounted[i], r->added[i]);
    uint64_t n = r->fa.n_allocs;
    kvc_sched_destroy(r->s);
    if (r->whole_stack) {
        kvc_seqs_destroy(r->seqs);
        kvc_prefix_destroy(r->pc);
        kvc_pool_destroy(r->pool);
    }
    assert_int_equal(r->fa.n_live, 0); /* nothing leaked */
    return n;
}

static void every_scheduler_allocation_can_fail_cleanly(void **state)
{
    (void)state;
    /* the layers below allocate through the C library */
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = 24;
    pp.block_size = 4;
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 3;
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    sp.max_seqs = 16;
    run_t *base = test_calloc(1, sizeof *base), *r = test_calloc(1, sizeof *r);
    for (int trace = 0; trace < 2; trace++) {
        uint64_t total = 0;
        for (uint64_t n = 0; n <= total + 1; n++) { /* n = 0: the run that never fails */
            /* fresh layers below for each run: the prefix cache starts cold every time */
            kvc_pool_t *pool;
            kvc_prefix_t *pc;
            assert_ok(kvc_pool_create(&pp, &pool));
            assert_ok(kvc_prefix_create(pool, &cp, &pc));
            assert_ok(kvc_seqs_create(pool, pc, &sp, &r->seqs));
            kvc_seqs_t *seqs = r->seqs;
            memset(r, 0, sizeof *r);
            r->seqs = seqs;
            r->trace = trace;
            r->fa.fail_at = n;
            uint64_t allocs = script(r);
            if (n == 0) {
                *base = *r;
                total = allocs;
                assert_true(total >= 10);
            }
            /* without the trace, every allocation is create's or add's: each failure is seen
             * there, once; the trace's are best effort and never fail a call */
            if (!trace) assert_int_equal(r->n_enomem, n && n <= total ? 1 : 0);
            assert_true(r->n_enomem <= r->fa.n_failed);
            assert_int_equal(r->n_errors, 0);
            assert_true(r->fp == base->fp); /* the failed call changed nothing */
            kvc_seqs_destroy(seqs);
            kvc_prefix_destroy(pc);
            kvc_pool_destroy(pool);
        }
        print_message("%s: %llu scheduler allocations, each failed once\n",
                      trace ? "with the trace" : "no trace", (unsigned long long)total);
    }
    test_free(r);
    test_free(base);
}

static void every_allocation_of_the_stack_can_fail(void **state)
{
    (void)state;
    run_t *r = test_calloc(1, sizeof *r);
    r->whole_stack = true;
    script(r);
    const uint64_t total = r->fa.n_allocs, setup = r->setup_allocs;
    assert_int_equal(r->n_enomem + r->n_errors, 0);
    uint32_t ended = 0, refused = 0;
    /* the Nth allocation fails once */
    for (uint64_t n = 1; n <= total + 1; n++) {
        memset(r, 0, sizeof *r);
        r->whole_stack = true;
        r->fa.fail_at = n;
        script(r);
        ended += r->n_errors;
    }
    /* every allocation fails from the Nth on (once the layers and the scheduler exist): adds
     * are refused, requests wait or end with KVC_ENOMEM, and the aborts at the end clean up */
    for (uint64_t n = setup + 1; n <= total + 1; n++) {
        memset(r, 0, sizeof *r);
        r->whole_stack = true;
        r->fa.fail_at = n;
        r->fa.fail_after = true;
        r->give_up = true;
        script(r);
        ended += r->n_errors;
        refused += r->n_refused;
    }
    print_message("%llu allocations in the whole stack (%llu to set up): %u requests ended with "
                  "KVC_ENOMEM, %u adds refused\n",
                  (unsigned long long)total, (unsigned long long)setup, ended, refused);
    assert_true(ended > 0); /* the seq table's failures inside complete were met */
    assert_true(refused > 0);
    test_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_scheduler_allocation_can_fail_cleanly),
        cmocka_unit_test(every_allocation_of_the_stack_can_fail),
    };
    return cmocka_run_group_tests_name("sched_faults", tests, NULL, NULL);
}
