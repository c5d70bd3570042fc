/* test_sched.c - every scheduling decision on small hand-built cases, with
 * the expected step-by-step outcome written in the test, plus a randomized
 * run of every policy combination with the invariants checked after every
 * step (blocks balanced, the budget and the running cap never exceeded, no
 * request starved past a bound) and determinism. */
#include "test_helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXR 512

typedef struct {
    kvc_pool_t *pool;
    kvc_prefix_t *pc;
    kvc_seqs_t *seqs;
    kvc_sched_t *s;
    kvc_sched_params_t p;
    double now;
    uint32_t out_len[MAXR]; /* the output length each request will have (EOS after it) */
    uint32_t n_out[MAXR];
    kvc_token_t prompts[MAXR][64];
    uint32_t accept_drafts; /* drafts the "verifier" accepts per step */
    uint64_t steps;
} world_t;

static void world_init(world_t *w, uint32_t n_blocks, uint32_t bs, kvc_sched_params_t p)
{
    memset(w, 0, sizeof *w);
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = n_blocks;
    pp.block_size = bs;
    assert_ok(kvc_pool_create(&pp, &w->pool));
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 1;
    assert_ok(kvc_prefix_create(w->pool, &cp, &w->pc));
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    sp.max_seqs = 1024;
    assert_ok(kvc_seqs_create(w->pool, w->pc, &sp, &w->seqs));
    p.trace = true;
    w->p = p;
    assert_ok(kvc_sched_create(w->seqs, w->pool, &p, &w->s));
}

static void world_free(world_t *w)
{
    kvc_sched_destroy(w->s);
    kvc_seqs_destroy(w->seqs);
    kvc_prefix_destroy(w->pc);
    kvc_pool_destroy(w->pool);
}

static uint32_t add(world_t *w, uint32_t n_prompt, uint32_t out_len, uint32_t max_output,
                    uint32_t prio, uint32_t tenant, int base)
{
    assert_true(w->s != NULL);
    static uint32_t next_slot;
    uint32_t slot = next_slot++ % MAXR;
    for (uint32_t i = 0; i < n_prompt && i < 64; i++) w->prompts[slot][i] = base + (int)i;
    kvc_sched_req_t r = {.prompt = w->prompts[slot],
                         .n_prompt = n_prompt,
                         .max_output = max_output,
                         .priority = prio,
                         .tenant = tenant};
    uint32_t id;
    assert_ok(kvc_sched_add(w->s, &r, w->now, &id));
    assert_true(id < MAXR);
    w->out_len[id] = out_len;
    return id;
}

static void check(world_t *w)
{
    char msg[256];
    if (kvc_sched_check(w->s, msg, sizeof msg))
        fail_msg("sched check: %s\n%s", msg, kvc_sched_trace(w->s));
}

/* One step: plan, execute (1 time unit), complete.  Returns the plan (valid until next step). */
static const kvc_sched_plan_t *step(world_t *w)
{
    const kvc_sched_plan_t *plan;
    assert_ok(kvc_sched_step(w->s, w->now, &plan));
    if (getenv("KVC_SCHED_TRACE")) print_message("%s", kvc_sched_trace(w->s));
    check(w);
    uint32_t tokens = 0;
    kvc_sched_result_t res[MAXR];
    for (uint32_t i = 0; i < plan->n_entries; i++) {
        const kvc_sched_entry_t *e = &plan->entries[i];
        tokens += e->n_tokens;
        uint32_t acc = KVC_MIN(e->n_drafts, w->accept_drafts);
        /* EOS can come inside the drafts: accept only up to the request's end */
        if (e->samples && w->n_out[e->id] + 1 + acc > w->out_len[e->id])
            acc = w->out_len[e->id] > w->n_out[e->id] + 1 ? w->out_len[e->id] - w->n_out[e->id] - 1
                                                          : 0;
        res[i] = (kvc_sched_result_t){.id = e->id, .token = 7, .n_accepted = acc};
        if (e->samples) {
            w->n_out[e->id] += 1 + acc;
            res[i].finished = w->n_out[e->id] >= w->out_len[e->id];
        }
    }
    assert_true(tokens <= w->p.max_num_batched_tokens); /* the budget is never exceeded */
    kvc_sched_stats_t st;
    kvc_sched_stats(w->s, &st);
    assert_true(st.n_running <= w->p.max_num_seqs);
    w->now += 1.0;
    assert_ok(kvc_sched_complete(w->s, res, plan->n_entries, w->now));
    check(w);
    w->steps++;
    return plan;
}

/* Run until everything finished (or max_steps); returns steps taken. */
static uint64_t drain(world_t *w, uint64_t max_steps)
{
    uint64_t n = 0;
    for (; n < max_steps; n++) {
        kvc_sched_stats_t st;
        kvc_sched_stats(w->s, &st);
        if (!st.n_running && !st.n_waiting && !st.n_swapped) break;
        step(w);
    }
    return n;
}

/* Find the plan entry of request id, or NULL. */
static const kvc_sched_entry_t *entry_of(const kvc_sched_plan_t *p, uint32_t id)
{
    for (uint32_t i = 0; i < p->n_entries; i++)
        if (p->entries[i].id == id) return &p->entries[i];
    return NULL;
}

static kvc_sched_params_t params(uint32_t budget, uint32_t max_seqs)
{
    kvc_sched_params_t p = kvc_sched_params_default();
    p.max_num_batched_tokens = budget;
    p.max_num_seqs = max_seqs;
    p.block_bytes = 1024;
    return p;
}

/* ---- continuous batching, chunked prefill, prefix hits --------------------------------- */
static void chunked_prefill_mixes_with_decodes(void **state)
{
    (void)state;
    world_t w;
    world_init(&w, 64, 4, params(8, 8));
    uint32_t a = add(&w, 10, 3, 10, 0, 0, 100); /* 10-token prompt, 3 outputs */
    const kvc_sched_plan_t *p = step(&w);       /* step 1: a's first chunk, the whole budget */
    assert_int_equal(p->n_entries, 1);
    assert_int_equal(p->entries[0].n_tokens, 8);
    assert_false(p->entries[0].samples);
    uint32_t b = add(&w, 3, 2, 10, 0, 0, 200);
    p = step(&w); /* step 2: a finishes its prompt (2, samples) and b is admitted (3) */
    assert_int_equal(p->n_entries, 2);
    assert_int_equal(entry_of(p, a)->n_tokens, 2);
    assert_true(entry_of(p, a)->samples);
    assert_int_equal(entry_of(p, a)->n_context, 10);
    assert_int_equal(entry_of(p, b)->n_tokens, 3);
    assert_true(entry_of(p, b)->samples);
    p = step(&w); /* step 3: two decodes of one token */
    assert_int_equal(p->n_entries, 2);
    assert_int_equal(entry_of(p, a)->n_tokens, 1);
    assert_int_equal(entry_of(p, a)->n_context, 11);
    assert_false(entry_of(p, a)->prefill);
    p = step(&w); /* b has its 2 outputs after this step; a its 3rd */
    const kvc_sched_done_t *done;
    uint32_t nd;
    assert_ok(kvc_sched_take_finished(w.s, &done, &nd));
    assert_int_equal(nd, 2);
    assert_int_equal(done[0].id, b); /* b's second token came in step 3? no: step 2 sampled one */
    assert_true(done[0].first_token_s == 2.0);
    assert_int_equal(done[1].id, a);
    assert_int_equal(done[1].n_output, 3);
    assert_true(done[1].first_token_s == 2.0 && done[1].finish_s == 4.0);
    world_free(&w);
}

static void prefix_hits_are_credited_at_admission(void **state)
{
    (void)state;
    world_t w;
    world_init(&w, 64, 4, params(64, 8));
    add(&w, 13, 1, 4, 0, 0, 100);
    drain(&w, 10);
    uint32_t b = add(&w, 13, 1, 4, 0, 0, 100); /* the same prompt */
    const kvc_sched_plan_t *p = step(&w);
    assert_int_equal(entry_of(p, b)->first_pos, 12); /* 3 blocks hit, the last token computed */
    assert_int_equal(entry_of(p, b)->n_tokens, 1);
    drain(&w, 10);
    kvc_sched_stats_t st;
    kvc_sched_stats(w.s, &st);
    assert_int_equal(st.hit_tokens, 12);
    assert_int_equal(st.prompt_tokens_admitted, 26);
    world_free(&w);
}

/* ---- admission policies --------------------------------------------------------------------- */
static uint32_t peak_running(kvc_admission_t adm, uint64_t *preemptions)
{
    /* 20 blocks of 4 tokens; 8 requests of 8-token prompts that generate 24 tokens (max 24):
     * each needs 2 blocks to start and 8 at the end. */
    kvc_sched_params_t p = params(64, 16);
    p.admission = adm;
    p.expected_output = 8;
    world_t w;
    world_init(&w, 20, 4, p);
    for (int i = 0; i < 8; i++) add(&w, 8, 24, 24, 0, 0, 1000 * i);
    uint32_t peak = 0;
    for (int i = 0; i < 400; i++) {
        kvc_sched_stats_t st;
        kvc_sched_stats(w.s, &st);
        if (!st.n_running && !st.n_waiting) break;
        peak = KVC_MAX(peak, st.n_running);
        step(&w);
    }
    kvc_sched_stats_t st;
    kvc_sched_stats(w.s, &st);
    assert_int_equal(st.n_running + st.n_waiting, 0); /* everything finished */
    *preemptions = st.preemptions;
    world_free(&w);
    return peak;
}

static void reserve_for_max_output_admits_fewer_and_never_preempts(void **state)
{
    (void)state;
    uint64_t pre_greedy, pre_max, pre_exp;
    uint32_t greedy = peak_running(KVC_ADMIT_GREEDY, &pre_greedy);
    uint32_t max = peak_running(KVC_ADMIT_RESERVE_MAX, &pre_max);
    uint32_t expected = peak_running(KVC_ADMIT_RESERVE_EXPECTED, &pre_exp);
    /* reserve-max: 8 blocks each from the start, 20 blocks: 2 at once; greedy admits all 8
     * (2 blocks each) and then has to preempt as they grow */
    assert_int_equal(max, 2);
    assert_int_equal(pre_max, 0);
    assert_true(greedy >= 8);
    assert_true(pre_greedy > 0);
    /* reserve-expected (8 + 20% -> 10 tokens: 5 blocks): in between */
    assert_true(expected > max && expected < greedy);
}

/* ---- preemption ---------------------------------------------------------------------------- */
static void recompute_preempts_the_latest_and_its_prefix_hits_again(void **state)
{
    (void)state;
    /* 6 blocks of 4.  a (arrives first) and b each hold a 9-token prompt (3 blocks); when a
     * must grow to a 4th block, b (the latest) is preempted, requeued at the front, and later
     * re-hits its own cached blocks: a resume hit, not a prefix hit. */
    world_t w;
    world_init(&w, 6, 4, params(64, 8));
    uint32_t a = add(&w, 11, 8, 8, 0, 0, 100);
    w.now = 0.5;
    uint32_t b = add(&w, 9, 3, 8, 0, 0, 300);
    step(&w); /* both prefilled: a 3 blocks, b 3 blocks (9 + the first output slot later) */
    const kvc_sched_plan_t *p = step(&w); /* a needs block 4 for position 11? a: 11 tokens ->
                                              3 blocks, decode at 11 -> 12 tokens: fits; b: 10 */
    (void)p;
    uint64_t steps = drain(&w, 100);
    assert_true(steps < 100);
    kvc_sched_stats_t st;
    kvc_sched_stats(w.s, &st);
    assert_true(st.preemptions >= 1);
    const kvc_sched_done_t *done;
    uint32_t nd;
    assert_ok(kvc_sched_take_finished(w.s, &done, &nd));
    assert_int_equal(nd, 2);
    for (uint32_t i = 0; i < nd; i++) {
        if (done[i].id == b) {
            assert_true(done[i].n_preemptions >= 1); /* the latest arrival was the victim */
            assert_true(done[i].recomputed_tokens > 0);
        } else {
            assert_int_equal(done[i].id, a);
            assert_int_equal(done[i].n_preemptions, 0);
        }
    }
    assert_true(st.recomputed_tokens > 0);
    assert_int_equal(st.hit_tokens, 0); /* re-hits of its own blocks are resume hits */
    world_free(&w);
}

static void swap_moves_kv_to_host_instead_of_recomputing(void **state)
{
    (void)state;
    kvc_sched_params_t p = params(64, 8);
    p.preemption = KVC_PREEMPT_SWAP;
    world_t w;
    world_init(&w, 6, 4, p);
    add(&w, 11, 8, 8, 0, 0, 100);
    w.now = 0.5;
    add(&w, 9, 3, 8, 0, 0, 300);
    drain(&w, 100);
    kvc_sched_stats_t st;
    kvc_sched_stats(w.s, &st);
    assert_true(st.preemptions >= 1);
    assert_true(st.swapped_out_bytes >= 3 * 1024);
    assert_true(st.swapped_in_bytes <= st.swapped_out_bytes);
    assert_int_equal(st.recomputed_tokens, 0); /* nothing was computed twice */
    world_free(&w);
}

static void backpressure_makes_new_requests_wait_instead(void **state)
{
    (void)state;
    kvc_sched_params_t p = params(64, 8);
    p.preemption = KVC_PREEMPT_BACKPRESSURE;
    world_t w;
    world_init(&w, 6, 4, p);
    add(&w, 11, 8, 8, 0, 0, 100);
    w.now = 0.5;
    add(&w, 9, 3, 8, 0, 0, 300);
    uint64_t steps = drain(&w, 200);
    assert_true(steps < 200);
    kvc_sched_stats_t st;
    kvc_sched_stats(w.s, &st);
    /* nobody is preempted except to break a deadlock */
    assert_int_equal(st.preemptions, st.forced_preemptions);
    world_free(&w);
}

static void a_request_longer_than_the_pool_stops_at_its_length(void **state)
{
    (void)state;
    /* 8 blocks of 4 = 32 tokens: a 20-token prompt can have 12 outputs, not the 40 it asks */
    world_t w;
    world_init(&w, 8, 4, params(64, 8));
    add(&w, 20, 40, 40, 0, 0, 1);
    assert_true(drain(&w, 200) < 200);
    const kvc_sched_done_t *done;
    uint32_t nd;
    assert_ok(kvc_sched_take_finished(w.s, &done, &nd));
    assert_int_equal(nd, 1);
    assert_int_equal(done[0].n_output, 12);
    assert_int_equal(done[0].n_preemptions, 0);
    world_free(&w);
}

/* ---- priority classes ------------------------------------------------------------------------ */
static void interactive_requests_preempt_batch_requests(void **state)
{
    (void)state;
    world_t w;
    world_init(&w, 10, 4, params(64, 8));
    uint32_t batch = add(&w, 20, 20, 20, 1, 0, 100); /* class 1: batch */
    step(&w);
    w.now = 2;
    uint32_t inter = add(&w, 20, 2, 4, 0, 0, 500); /* class 0: interactive, needs 6 blocks */
    drain(&w, 100);
    const kvc_sched_done_t *done;
    uint32_t nd;
    assert_ok(kvc_sched_take_finished(w.s, &done, &nd));
    assert_int_equal(nd, 2);
    assert_int_equal(done[0].id, inter); /* interactive finished first */
    assert_int_equal(done[0].n_preemptions, 0);
    assert_int_equal(done[1].id, batch);
    assert_true(done[1].n_preemptions >= 1);
    world_free(&w);
}

static void a_class_kv_cap_keeps_batch_from_taking_the_pool(void **state)
{
    (void)state;
    kvc_sched_params_t p = params(256, 32);
    p.class_kv_cap[1] = 0.5; /* batch may hold half the pool */
    world_t w;
    world_init(&w, 40, 4, p);
    for (int i = 0; i < 10; i++) add(&w, 12, 30, 30, 1, 0, 100 * i);
    for (int i = 0; i < 30; i++) {
        step(&w);
        kvc_sched_stats_t st;
        kvc_sched_stats(w.s, &st);
        assert_true(st.class_blocks[1] <= 20);
    }
    world_free(&w);
}

/* ---- tenants -----------------------------------------------------------------------------------
 */
static void a_kv_quota_stops_one_tenant_from_taking_the_pool(void **state)
{
    (void)state;
    /* tenant 0 sends long prompts, tenant 1 short ones; with a 50% KV quota tenant 1 always
     * finds room; with a request-count limit alone, tenant 0's few requests hog the pool. */
    for (int variant = 0; variant < 2; variant++) {
        kvc_sched_params_t p = params(512, 32);
        if (variant == 0)
            p.tenant_kv_share = 0.5;
        else
            p.tenant_max_running = 2;
        world_t w;
        world_init(&w, 32, 4, p);
        for (int i = 0; i < 4; i++) add(&w, 60, 10, 10, 0, 0, 1000 * i); /* 15+ blocks each */
        step(&w);
        w.now = 5;
        uint32_t small = add(&w, 8, 2, 2, 0, 1, 9000);
        drain(&w, 400);
        const kvc_sched_done_t *done;
        uint32_t nd;
        assert_ok(kvc_sched_take_finished(w.s, &done, &nd));
        double small_e2e = 0;
        for (uint32_t i = 0; i < nd; i++)
            if (done[i].id == small) small_e2e = done[i].finish_s - done[i].arrival_s;
        if (variant == 0)
            assert_true(small_e2e <= 4); /* admitted at once: room was kept for tenant 1 */
        else
            assert_true(small_e2e > 4); /* it waited behind tenant 0's long prompts */
        world_free(&w);
    }
}

static void fair_share_splits_the_prompt_budget_between_tenants(void **state)
{
    (void)state;
    kvc_sched_params_t p = params(32, 16);
    p.tenant_fair = true;
    world_t w;
    world_init(&w, 200, 4, p);
    add(&w, 60, 1, 1, 0, 0, 100); /* tenant 0: one big prompt */
    add(&w, 60, 1, 1, 0, 1, 500); /* tenant 1: another */
    const kvc_sched_plan_t *pl = step(&w);
    assert_int_equal(pl->n_entries, 2); /* both get 16 of the 32 tokens */
    assert_int_equal(pl->entries[0].n_tokens, 16);
    assert_int_equal(pl->entries[1].n_tokens, 16);
    world_free(&w);
    /* without fairness the first arrival takes the whole budget */
    p.tenant_fair = false;
    world_init(&w, 200, 4, p);
    add(&w, 60, 1, 1, 0, 0, 100);
    add(&w, 60, 1, 1, 0, 1, 500);
    pl = step(&w);
    assert_int_equal(pl->n_entries, 1);
    assert_int_equal(pl->entries[0].n_tokens, 32);
    world_free(&w);
}

static void a_long_request_cap_protects_short_traffic(void **state)
{
    (void)state;
    /* 40 blocks; three 60-token requests (16 blocks each at the end) are "long" and may hold
     * half the pool together: one runs at a time beside the short ones, and a short request
     * arriving later is admitted at once.  kvc_sched_check verifies the cap after every step. */
    kvc_sched_params_t p = params(1024, 32);
    p.long_threshold = 40;
    p.long_kv_cap = 0.5;
    world_t w;
    world_init(&w, 40, 4, p);
    for (int i = 0; i < 3; i++) add(&w, 60, 4, 4, 0, 0, 100 * i);
    step(&w);
    kvc_sched_stats_t st;
    kvc_sched_stats(w.s, &st);
    assert_int_equal(st.n_running, 1);
    w.now = 1.5;
    uint32_t small = add(&w, 8, 2, 2, 0, 0, 5000);
    const kvc_sched_plan_t *pl = step(&w);
    assert_non_null(entry_of(pl, small));
    assert_true(drain(&w, 200) < 200);
    world_free(&w);
    /* without the cap the long requests fill the pool and the short one waits */
    p.long_threshold = 0;
    world_init(&w, 40, 4, p);
    for (int i = 0; i < 3; i++) add(&w, 60, 4, 4, 0, 0, 100 * i);
    step(&w);
    w.now = 1.5;
    small = add(&w, 8, 2, 2, 0, 0, 5000);
    pl = step(&w);
    assert_null(entry_of(pl, small));
    world_free(&w);
}

/* ---- speculative decoding
 * ------------------------------------------------------------------------ */
static void drafts_count_against_the_budget_and_roll_back(void **state)
{
    (void)state;
    kvc_sched_params_t p = params(10, 8);
    p.spec_tokens = 4;
    world_t w;
    world_init(&w, 64, 4, p);
    w.accept_drafts = 2;
    uint32_t a = add(&w, 6, 20, 20, 0, 0, 100), b = add(&w, 4, 20, 20, 0, 0, 900);
    step(&w); /* prefill both: 6 + 4 = 10 */
    const kvc_sched_plan_t *pl = step(&w);
    /* decodes with drafts: a takes 1 + 4, b 1 + 4 = 10, the whole budget */
    assert_int_equal(entry_of(pl, a)->n_tokens, 5);
    assert_int_equal(entry_of(pl, a)->n_drafts, 4);
    assert_int_equal(entry_of(pl, b)->n_tokens, 5);
    assert_int_equal(pl->n_decode_tokens, 10);
    drain(&w, 100);
    const kvc_sched_done_t *done;
    uint32_t nd;
    assert_ok(kvc_sched_take_finished(w.s, &done, &nd));
    assert_int_equal(nd, 2);
    for (uint32_t i = 0; i < nd; i++) {
        assert_int_equal(done[i].n_output, 20); /* never past the cap, even inside drafts */
        assert_true(done[i].n_accepted > 0);
    }
    kvc_seqs_stats_t ss;
    kvc_seqs_stats(w.seqs, &ss);
    assert_true(ss.n_rolled_back > 0);
    world_free(&w);
}

/* ---- API contract
 * ----------------------------------------------------------------------------------- */
static void the_api_refuses_misuse(void **state)
{
    (void)state;
    world_t w;
    world_init(&w, 16, 4, params(32, 8));
    kvc_token_t t[4] = {1, 2, 3, 4};
    kvc_sched_req_t r = {.prompt = t, .n_prompt = 4, .max_output = 4};
    uint32_t id;
    r.priority = KVC_MAX_CLASSES;
    assert_int_equal(kvc_sched_add(w.s, &r, 0, &id), KVC_EINVAL);
    r.priority = 0;
    r.n_prompt = 0;
    assert_int_equal(kvc_sched_add(w.s, &r, 0, &id), KVC_EINVAL);
    kvc_token_t big[100] = {0};
    r = (kvc_sched_req_t){.prompt = big, .n_prompt = 100, .max_output = 4};
    assert_int_equal(kvc_sched_add(w.s, &r, 0, &id), KVC_ERANGE); /* 26 blocks > 16: never fits */
    uint32_t a = add(&w, 4, 3, 4, 0, 0, 1);
    const kvc_sched_plan_t *p;
    assert_ok(kvc_sched_step(w.s, 0, &p));
    assert_int_equal(kvc_sched_step(w.s, 0, &p), KVC_EBUSY); /* complete the last plan first */
    kvc_sched_result_t bad = {.id = a + 1};
    assert_int_equal(kvc_sched_complete(w.s, &bad, 1, 1), KVC_EINVAL);
    assert_int_equal(kvc_sched_complete(w.s, NULL, 0, 1), KVC_EINVAL);
    assert_ok(kvc_sched_abort(w.s, a)); /* aborted mid-step: finished at completion */
    kvc_sched_result_t ok = {.id = a, .token = 1};
    assert_ok(kvc_sched_complete(w.s, &ok, 1, 1));
    const kvc_sched_done_t *done;
    uint32_t nd;
    assert_ok(kvc_sched_take_finished(w.s, &done, &nd));
    assert_int_equal(nd, 1);
    assert_true(done[0].aborted);
    assert_int_equal(kvc_sched_abort(w.s, a), KVC_ESTALE);
    assert_int_equal(kvc_sched_abort(w.s, 999), KVC_EINVAL);
    assert_int_equal(kvc_pool_n_free(w.pool), 16);
    kvc_admission_t ad;
    kvc_preemption_t pr;
    assert_ok(kvc_admission_parse("reserve-max", &ad));
    assert_int_equal(ad, KVC_ADMIT_RESERVE_MAX);
    assert_ok(kvc_preemption_parse("swap", &pr));
    assert_int_equal(kvc_admission_parse("yolo", &ad), KVC_EINVAL);
    assert_string_equal(kvc_preemption_name(KVC_PREEMPT_BACKPRESSURE), "backpressure");
    assert_true(strstr(kvc_sched_trace(w.s), "step") != NULL);
    world_free(&w);
}

/* ---- randomized: every policy, invariants every step, no starvation, determinism
 * ---------------------- */
static uint64_t random_run(uint64_t seed, kvc_admission_t adm, kvc_preemption_t pre, bool fair,
                           uint64_t *fingerprint)
{
    kvc_rng_t r;
    kvc_rng_seed(&r, seed);
    kvc_sched_params_t p =
        params(16 + (uint32_t)kvc_rng_below(&r, 64), 4 + (uint32_t)kvc_rng_below(&r, 12));
    p.admission = adm;
    p.preemption = pre;
    p.tenant_fair = fair;
    p.expected_output = 6;
    p.spec_tokens = (uint32_t)kvc_rng_below(&r, 3);
    if (kvc_rng_below(&r, 2)) p.class_kv_cap[1] = 0.6;
    if (kvc_rng_below(&r, 2)) p.tenant_kv_share = 0.7;
    world_t w;
    world_init(&w, 48, 4, p);
    w.accept_drafts = (uint32_t)kvc_rng_below(&r, 3);
    uint32_t n_req = 0, max_wait_steps = 0;
    uint64_t fp = 0;
    for (int t = 0; t < 300; t++) {
        if (n_req < 120 && kvc_rng_below(&r, 3) == 0) {
            uint32_t len = 1 + (uint32_t)kvc_rng_below(&r, 40);
            add(&w, len, 1 + (uint32_t)kvc_rng_below(&r, 12), 12, (uint32_t)kvc_rng_below(&r, 2),
                (uint32_t)kvc_rng_below(&r, 3), (int)(kvc_rng_below(&r, 4) * 50));
            n_req++;
        }
        const kvc_sched_plan_t *pl = step(&w);
        for (uint32_t i = 0; i < pl->n_entries; i++)
            fp = fp * 1000003 + pl->entries[i].id * 31 + pl->entries[i].n_tokens;
    }
    uint64_t steps = drain(&w, 5000);
    assert_true(steps < 5000); /* everything finishes */
    const kvc_sched_done_t *done;
    uint32_t nd;
    assert_ok(kvc_sched_take_finished(w.s, &done, &nd));
    assert_int_equal(nd, n_req);
    for (uint32_t i = 0; i < nd; i++) {
        uint32_t waited = (uint32_t)(done[i].finish_s - done[i].arrival_s);
        max_wait_steps = KVC_MAX(max_wait_steps, waited);
        assert_int_equal(done[i].n_output, w.out_len[done[i].id]);
    }
    assert_true(max_wait_steps < 1500); /* no request starved past a bound */
    assert_int_equal(kvc_pool_n_free(w.pool), 48);
    *fingerprint = fp;
    world_free(&w);
    return steps;
}

static void every_policy_keeps_the_books_and_finishes_everything(void **state)
{
    (void)state;
    const int seeds = KVC_TEST_SANITIZED ? 2 : 6;
    for (int adm = 0; adm < 3; adm++)
        for (int pre = 0; pre < 3; pre++)
            for (int fair = 0; fair < 2; fair++)
                for (int sd = 0; sd < seeds; sd++) {
                    uint64_t f1, f2;
                    random_run(1000 + (uint64_t)sd, (kvc_admission_t)adm, (kvc_preemption_t)pre,
                               fair, &f1);
                    random_run(1000 + (uint64_t)sd, (kvc_admission_t)adm, (kvc_preemption_t)pre,
                               fair, &f2);
                    assert_true(f1 == f2); /* same seed, same decisions */
                }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chunked_prefill_mixes_with_decodes),
        cmocka_unit_test(prefix_hits_are_credited_at_admission),
        cmocka_unit_test(reserve_for_max_output_admits_fewer_and_never_preempts),
        cmocka_unit_test(recompute_preempts_the_latest_and_its_prefix_hits_again),
        cmocka_unit_test(swap_moves_kv_to_host_instead_of_recomputing),
        cmocka_unit_test(backpressure_makes_new_requests_wait_instead),
        cmocka_unit_test(a_request_longer_than_the_pool_stops_at_its_length),
        cmocka_unit_test(interactive_requests_preempt_batch_requests),
        cmocka_unit_test(a_class_kv_cap_keeps_batch_from_taking_the_pool),
        cmocka_unit_test(a_kv_quota_stops_one_tenant_from_taking_the_pool),
        cmocka_unit_test(fair_share_splits_the_prompt_budget_between_tenants),
        cmocka_unit_test(a_long_request_cap_protects_short_traffic),
        cmocka_unit_test(drafts_count_against_the_budget_and_roll_back),
        cmocka_unit_test(the_api_refuses_misuse),
        cmocka_unit_test(every_policy_keeps_the_books_and_finishes_everything),
    };
    return cmocka_run_group_tests_name("sched", tests, NULL, NULL);
}
