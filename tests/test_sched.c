/* test_sched.c - every scheduling decision on small hand-built cases, with
 * the expected step-by-step outcome written in the test, plus a randomized
 * run of every policy combination with the invariants checked after every
 * step (blocks balanced, the budget and the running cap never exceeded, no
 * request starved past a bound) and determinism. */
#include "test_helpers.h"

#include <math.h>
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
    uint32_t n_added; /* requests added: the next one's tag */
} world_t;

static void world_init_evicting(world_t *w, uint32_t n_blocks, uint32_t bs, kvc_sched_params_t p,
                                kvc_eviction_t eviction)
{
    memset(w, 0, sizeof *w);
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = n_blocks;
    pp.block_size = bs;
    assert_ok(kvc_pool_create(&pp, &w->pool));
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 1;
    cp.eviction = eviction;
    assert_ok(kvc_prefix_create(w->pool, &cp, &w->pc));
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    sp.max_seqs = 1024;
    assert_ok(kvc_seqs_create(w->pool, w->pc, &sp, &w->seqs));
    p.trace = true;
    w->p = p;
    assert_ok(kvc_sched_create(w->seqs, &p, &w->s));
}

static void world_init(world_t *w, uint32_t n_blocks, uint32_t bs, kvc_sched_params_t p)
{
    world_init_evicting(w, n_blocks, bs, p, KVC_EVICT_LRU);
}

static void world_free(world_t *w)
{
    kvc_sched_destroy(w->s);
    kvc_seqs_destroy(w->seqs);
    kvc_prefix_destroy(w->pc);
    kvc_pool_destroy(w->pool);
}

/* Add a request; its tag indexes the world's per-request arrays. */
static kvc_req_id_t add(world_t *w, uint32_t n_prompt, uint32_t out_len, uint32_t max_output,
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
                         .tenant = tenant,
                         .tag = w->n_added};
    kvc_req_id_t id;
    assert_ok(kvc_sched_add(w->s, &r, w->now, &id));
    assert_true(w->n_added < MAXR);
    w->out_len[w->n_added++] = out_len;
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
        uint64_t t = e->tag;
        if (e->samples && w->n_out[t] + 1 + acc > w->out_len[t])
            acc = w->out_len[t] > w->n_out[t] + 1 ? w->out_len[t] - w->n_out[t] - 1 : 0;
        res[i] = (kvc_sched_result_t){.id = e->id, .token = 7, .n_accepted = acc};
        if (e->samples) {
            w->n_out[t] += 1 + acc;
            res[i].finished = w->n_out[t] >= w->out_len[t];
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
static const kvc_sched_entry_t *entry_of(const kvc_sched_plan_t *p, kvc_req_id_t id)
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
    kvc_req_id_t a = add(&w, 10, 3, 10, 0, 0, 100); /* 10-token prompt, 3 outputs */
    const kvc_sched_plan_t *p = step(&w);           /* step 1: a's first chunk, the whole budget */
    assert_int_equal(p->n_entries, 1);
    assert_int_equal(p->entries[0].n_tokens, 8);
    assert_false(p->entries[0].samples);
    kvc_req_id_t b = add(&w, 3, 2, 10, 0, 0, 200);
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
    kvc_req_id_t b = add(&w, 13, 1, 4, 0, 0, 100); /* the same prompt */
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
    kvc_req_id_t a = add(&w, 11, 8, 8, 0, 0, 100);
    w.now = 0.5;
    kvc_req_id_t b = add(&w, 9, 3, 8, 0, 0, 300);
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

static void a_swapped_request_comes_back_only_within_its_caps(void **state)
{
    (void)state;
    /* Class 1 may hold 8 of 16 blocks.  When a grows past the cap, b (its class's latest) is
     * swapped out; a then grows to the cap, and b must stay out while the pool has room but
     * its class does not.  kvc_sched_check verifies the caps after every step. */
    for (int cap = 0; cap < 3; cap++) {
        kvc_sched_params_t p = params(64, 8);
        p.preemption = KVC_PREEMPT_SWAP;
        if (cap == 0) p.class_kv_cap[1] = 0.5;
        if (cap == 1) p.tenant_kv_share = 0.5;
        if (cap == 2) p.long_threshold = 20, p.long_kv_cap = 0.5;
        world_t w;
        world_init(&w, 16, 4, p);
        add(&w, 8, 24, 24, 1, 0, 100);
        w.now = 0.5;
        add(&w, 8, 24, 24, 1, 0, 300);
        assert_true(drain(&w, 200) < 200);
        kvc_sched_stats_t st;
        kvc_sched_stats(w.s, &st);
        assert_true(st.swapped_out_bytes > 0);
        world_free(&w);
    }
}

/* ---- priority classes ------------------------------------------------------------------------ */
static void interactive_requests_preempt_batch_requests(void **state)
{
    (void)state;
    world_t w;
    world_init(&w, 10, 4, params(64, 8));
    kvc_req_id_t batch = add(&w, 20, 20, 20, 1, 0, 100); /* class 1: batch */
    step(&w);
    w.now = 2;
    kvc_req_id_t inter = add(&w, 20, 2, 4, 0, 0, 500); /* class 0: interactive, needs 6 blocks */
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
        kvc_req_id_t small = add(&w, 8, 2, 2, 0, 1, 9000);
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
    kvc_req_id_t small = add(&w, 8, 2, 2, 0, 0, 5000);
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
    kvc_req_id_t a = add(&w, 6, 20, 20, 0, 0, 100), b = add(&w, 4, 20, 20, 0, 0, 900);
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
    kvc_req_id_t id;
    r.priority = KVC_MAX_CLASSES;
    assert_int_equal(kvc_sched_add(w.s, &r, 0, &id), KVC_EINVAL);
    r.priority = 0;
    r.n_prompt = 0;
    assert_int_equal(kvc_sched_add(w.s, &r, 0, &id), KVC_EINVAL);
    kvc_token_t big[100] = {0};
    r = (kvc_sched_req_t){.prompt = big, .n_prompt = 100, .max_output = 4};
    assert_int_equal(kvc_sched_add(w.s, &r, 0, &id), KVC_ERANGE); /* 26 blocks > 16: never fits */
    kvc_req_id_t a = add(&w, 4, 3, 4, 0, 0, 1);
    const kvc_sched_plan_t *p;
    assert_ok(kvc_sched_step(w.s, 0, &p));
    assert_int_equal(kvc_sched_step(w.s, 0, &p), KVC_EBUSY); /* complete the last plan first */
    kvc_sched_result_t bad = {.id = a + 1};
    assert_int_equal(kvc_sched_complete(w.s, &bad, 1, 1), KVC_ESTALE); /* names no request */
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
    assert_int_equal(kvc_sched_abort(w.s, 999), KVC_ESTALE); /* never issued */
    assert_int_equal(kvc_sched_abort(w.s, 0), KVC_ESTALE);
    assert_int_equal(kvc_sched_abort(NULL, a), KVC_EINVAL);
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

/* ---- ids, generations, accounts ---------------------------------------------------------- */
static void take(world_t *w, const kvc_sched_done_t **done, uint32_t *nd)
{
    assert_ok(kvc_sched_take_finished(w->s, done, nd));
    check(w);
}

static void ids_are_recycled_under_a_new_generation(void **state)
{
    (void)state;
    world_t w;
    world_init(&w, 16, 4, params(32, 8));
    kvc_req_id_t a = add(&w, 4, 1, 4, 0, 0, 1);
    assert_true(a != 0);
    drain(&w, 10);
    const kvc_sched_done_t *done;
    uint32_t nd;
    take(&w, &done, &nd);
    assert_int_equal(nd, 1);
    assert_true(done[0].id == a);
    kvc_req_id_t b = add(&w, 4, 3, 4, 0, 0, 1);
    assert_true((uint32_t)b == (uint32_t)a); /* the slot is reused ... */
    assert_true(b != a);                     /* ... under a new generation */
    kvc_sched_stats_t before, after;
    kvc_sched_stats(w.s, &before);
    assert_int_equal(kvc_sched_abort(w.s, a), KVC_ESTALE); /* the old id changes nothing */
    kvc_sched_stats(w.s, &after);
    assert_memory_equal(&before, &after, sizeof before);
    const kvc_sched_plan_t *p;
    assert_ok(kvc_sched_step(w.s, 0, &p));
    assert_int_equal(p->n_entries, 1);
    assert_true(p->entries[0].id == b);
    kvc_sched_result_t old = {.id = a, .token = 1};
    assert_int_equal(kvc_sched_complete(w.s, &old, 1, 1), KVC_ESTALE); /* nothing applied */
    check(&w);
    kvc_sched_result_t ok = {.id = b, .token = 1};
    assert_ok(kvc_sched_complete(w.s, &ok, 1, 1));
    w.n_out[1] = 1; /* b (tag 1) sampled its first token */
    check(&w);
    drain(&w, 10);
    take(&w, &done, &nd);
    assert_int_equal(nd, 1);
    assert_true(done[0].id == b && done[0].n_output == 3 && !done[0].aborted);
    world_free(&w);
}

static void tag_cb_draft(void *ctx, kvc_req_id_t id, uint64_t tag, uint32_t n, kvc_token_t *out)
{
    world_t *w = ctx;
    /* the id and the tag name the same request: its tag is its index in the world (the
     * callback must not call back into the scheduler) */
    assert_true(id != 0 && (uint32_t)id < 64 && tag < w->n_added);
    for (uint32_t i = 0; i < n; i++) out[i] = (kvc_token_t)(1000 + tag);
}

static void tags_are_echoed_in_entries_accounts_and_callbacks(void **state)
{
    (void)state;
    kvc_sched_params_t p = params(64, 8);
    p.spec_tokens = 2;
    world_t w;
    world_init(&w, 64, 4, p);
    /* world_init copied the params: set the drafter on a scheduler of our own */
    kvc_sched_destroy(w.s);
    p.draft = tag_cb_draft;
    p.draft_ctx = &w;
    assert_ok(kvc_sched_create(w.seqs, &p, &w.s));
    w.accept_drafts = 1;
    for (int i = 0; i < 5; i++) add(&w, 3 + (uint32_t)i, 4, 8, 0, 0, 100 * i);
    const kvc_sched_plan_t *pl = step(&w);
    for (uint32_t i = 0; i < pl->n_entries; i++) assert_true(pl->entries[i].tag < 5);
    drain(&w, 50);
    const kvc_sched_done_t *done;
    uint32_t nd;
    take(&w, &done, &nd);
    assert_int_equal(nd, 5);
    bool seen[5] = {false};
    for (uint32_t i = 0; i < nd; i++) {
        assert_true(done[i].tag < 5 && !seen[done[i].tag]);
        seen[done[i].tag] = true;
        assert_int_equal(done[i].n_prompt, 3 + done[i].tag);
    }
    world_free(&w);
}

static void an_account_stays_readable_until_the_next_take(void **state)
{
    (void)state;
    world_t w;
    world_init(&w, 64, 4, params(64, 8));
    add(&w, 4, 1, 4, 0, 0, 1);
    add(&w, 5, 3, 4, 0, 0, 50);
    step(&w); /* the first finishes */
    const kvc_sched_done_t *done;
    uint32_t nd;
    take(&w, &done, &nd);
    assert_int_equal(nd, 1);
    kvc_sched_done_t copy = done[0];
    add(&w, 6, 1, 4, 0, 0, 90); /* may reuse the slot just freed */
    drain(&w, 20);              /* two more finish before the next take */
    assert_memory_equal(&copy, &done[0], sizeof copy);
    const kvc_sched_done_t *done2;
    take(&w, &done2, &nd);
    assert_int_equal(nd, 2);
    assert_true(done2 != done);
    world_free(&w);
}

/* The same when the requests added after a take outgrow the account buffers: the array handed
 * out is replaced, not freed, until the next take (it was freed under the caller: the ASan
 * build caught the read). */
static void an_account_stays_readable_while_adds_grow_the_tables(void **state)
{
    (void)state;
    world_t w;
    world_init(&w, 400, 4, params(64, 8));
    add(&w, 4, 1, 4, 0, 0, 1);
    step(&w);
    const kvc_sched_done_t *done;
    uint32_t nd;
    take(&w, &done, &nd);
    assert_int_equal(nd, 1);
    kvc_sched_done_t copy = done[0];
    for (int i = 0; i < 100; i++) add(&w, 4, 1, 4, 0, 0, 10 * i); /* past 16, 32 and 64 */
    assert_memory_equal(&copy, &done[0], sizeof copy);
    drain(&w, 200);
    assert_memory_equal(&copy, &done[0], sizeof copy);
    take(&w, &done, &nd);
    assert_int_equal(nd, 100);
    world_free(&w);
}

/* The account of an abort: aborted, never finished before it arrived or before its first token. */
static void expect_aborted(world_t *w, kvc_req_id_t id)
{
    const kvc_sched_done_t *done;
    uint32_t nd;
    take(w, &done, &nd);
    assert_int_equal(nd, 1);
    assert_true(done[0].id == id);
    assert_true(done[0].aborted);
    assert_int_equal(done[0].error, 0);
    assert_true(done[0].finish_s >= done[0].arrival_s);
    assert_true(done[0].finish_s >= done[0].first_token_s);
    assert_int_equal(kvc_sched_abort(w->s, id), KVC_ESTALE); /* taken: stale */
}

static void an_abort_at_every_point_of_a_life_frees_everything(void **state)
{
    (void)state;
    for (int pre = KVC_PREEMPT_RECOMPUTE; pre <= KVC_PREEMPT_SWAP; pre++) {
        kvc_sched_params_t p = params(64, 8);
        p.preemption = (kvc_preemption_t)pre;
        world_t w;
        world_init(&w, 6, 4, p);
        /* waiting, never admitted; it arrives after the last step */
        w.now = 3;
        kvc_req_id_t x = add(&w, 5, 2, 4, 0, 0, 1);
        assert_ok(kvc_sched_abort(w.s, x));
        check(&w);
        expect_aborted(&w, x);
        /* running, between steps (its first token came at the end of the last step) */
        x = add(&w, 5, 9, 9, 0, 0, 1);
        step(&w);
        assert_ok(kvc_sched_abort(w.s, x));
        check(&w);
        assert_int_equal(kvc_pool_n_free(w.pool), 6);
        expect_aborted(&w, x);
        /* in the open plan: finished when it completes */
        x = add(&w, 5, 9, 9, 0, 0, 1);
        const kvc_sched_plan_t *pl;
        assert_ok(kvc_sched_step(w.s, w.now, &pl));
        assert_ok(kvc_sched_abort(w.s, x));
        assert_ok(kvc_sched_abort(w.s, x)); /* twice: still the same request, still live */
        check(&w);
        kvc_sched_result_t r = {.id = x, .token = 1, .finished = true};
        w.now += 1;
        assert_ok(kvc_sched_complete(w.s, &r, 1, w.now));
        check(&w);
        assert_int_equal(kvc_pool_n_free(w.pool), 6);
        expect_aborted(&w, x);
        /* preempted: requeued (recompute) or swapped out */
        kvc_req_id_t a = add(&w, 11, 8, 8, 0, 0, 100);
        w.now += 0.5;
        kvc_req_id_t b = add(&w, 9, 8, 8, 0, 0, 300);
        kvc_sched_stats_t st = {0};
        for (int i = 0; i < 20 && !st.preemptions; i++) {
            step(&w);
            kvc_sched_stats(w.s, &st);
        }
        assert_true(st.preemptions >= 1);
        assert_int_equal(pre == KVC_PREEMPT_SWAP ? st.n_swapped : st.n_waiting, 1);
        assert_ok(kvc_sched_abort(w.s, b)); /* the latest arrival was the victim */
        check(&w);
        kvc_sched_stats(w.s, &st);
        assert_int_equal(st.n_swapped + st.n_waiting, 0);
        expect_aborted(&w, b);
        /* finished, account not taken: stale */
        drain(&w, 50);
        assert_int_equal(kvc_sched_abort(w.s, a), KVC_ESTALE);
        const kvc_sched_done_t *done;
        uint32_t nd;
        take(&w, &done, &nd);
        assert_int_equal(nd, 1);
        assert_false(done[0].aborted);
        assert_int_equal(kvc_pool_n_free(w.pool), 6);
        world_free(&w);
    }
}

static void a_reused_slot_in_another_queue_keeps_both_queues_straight(void **state)
{
    (void)state;
    /* One request runs at a time.  x waits in class 1's queue and is aborted; its slot goes to
     * y, of class 0.  Nothing of x may remain in class 1's queue: y runs once, as class 0,
     * before z. */
    world_t w;
    world_init(&w, 16, 4, params(64, 1));
    kvc_req_id_t big = add(&w, 14, 30, 30, 1, 0, 1);
    step(&w);
    kvc_req_id_t x = add(&w, 5, 2, 4, 1, 0, 50);
    kvc_req_id_t z = add(&w, 5, 2, 4, 1, 0, 60);
    step(&w);
    assert_ok(kvc_sched_abort(w.s, x));
    const kvc_sched_done_t *done;
    uint32_t nd;
    take(&w, &done, &nd);
    assert_int_equal(nd, 1);
    kvc_req_id_t y = add(&w, 3, 2, 4, 0, 0, 70);
    assert_true((uint32_t)y == (uint32_t)x);
    assert_ok(kvc_sched_abort(w.s, big));
    const kvc_sched_plan_t *pl = step(&w);
    assert_int_equal(pl->n_entries, 1);
    assert_true(pl->entries[0].id == y);
    drain(&w, 20);
    take(&w, &done, &nd);
    assert_int_equal(nd, 3);
    assert_true(done[0].id == big && done[0].aborted);
    assert_true(done[1].id == y && done[1].priority == 0 && done[1].n_output == 2);
    assert_true(done[2].id == z && done[2].n_output == 2);
    world_free(&w);
}

static void a_completion_with_wrong_ids_changes_nothing(void **state)
{
    (void)state;
    world_t w;
    world_init(&w, 32, 4, params(64, 8));
    kvc_req_id_t a = add(&w, 5, 1, 4, 0, 0, 1);
    drain(&w, 5); /* a finished; its account is not taken */
    kvc_req_id_t b = add(&w, 5, 3, 4, 0, 0, 100), c = add(&w, 6, 3, 4, 0, 0, 200);
    const kvc_sched_plan_t *p;
    assert_ok(kvc_sched_step(w.s, w.now, &p));
    assert_int_equal(p->n_entries, 2);
    kvc_sched_stats_t before, after;
    kvc_sched_stats(w.s, &before);
    kvc_sched_result_t res[2] = {{.id = c, .token = 1}, {.id = b, .token = 1}}; /* permuted */
    assert_int_equal(kvc_sched_complete(w.s, res, 2, 1), KVC_EINVAL);
    res[0].id = a; /* finished: not a live request */
    assert_int_equal(kvc_sched_complete(w.s, res, 2, 1), KVC_ESTALE);
    res[0].id = (uint64_t)7 << 32 | 3; /* never issued */
    assert_int_equal(kvc_sched_complete(w.s, res, 2, 1), KVC_ESTALE);
    res[0].id = b;
    assert_int_equal(kvc_sched_complete(w.s, res, 2, 1), KVC_EINVAL); /* b twice */
    assert_int_equal(kvc_sched_complete(w.s, res, 1, 1), KVC_EINVAL); /* too few */
    kvc_sched_stats(w.s, &after);
    assert_memory_equal(&before, &after, sizeof before);
    check(&w);
    res[1].id = c;
    assert_ok(kvc_sched_complete(w.s, res, 2, 1));
    w.n_out[1] = w.n_out[2] = 1;
    w.now = 1;
    drain(&w, 10);
    const kvc_sched_done_t *done;
    uint32_t nd;
    take(&w, &done, &nd);
    assert_int_equal(nd, 3);
    for (uint32_t i = 0; i < nd; i++) assert_int_equal(done[i].n_output, w.out_len[done[i].tag]);
    world_free(&w);
}

static void tiny_budgets_and_chunks_still_finish_everything(void **state)
{
    (void)state;
    /* one token per step, one request at a time, one prompt token per chunk, 64 drafts */
    for (int k = 0; k < 4; k++) {
        kvc_sched_params_t p = params(k == 0 ? 1 : 3, k == 1 ? 1 : 4);
        p.max_prefill_chunk = k == 2 ? 1 : 0;
        p.spec_tokens = k == 3 ? 64 : 0;
        p.preemption = (kvc_preemption_t)(k % KVC_PREEMPT__COUNT);
        world_t w;
        world_init(&w, 12, 4, p);
        w.accept_drafts = 2;
        for (int i = 0; i < 6; i++)
            add(&w, 1 + 3 * (uint32_t)i, 1 + (uint32_t)i, 8, i % 2, 0, 7 * i);
        assert_true(drain(&w, 2000) < 2000);
        const kvc_sched_done_t *done;
        uint32_t nd;
        take(&w, &done, &nd);
        assert_int_equal(nd, 6);
        for (uint32_t i = 0; i < nd; i++)
            assert_int_equal(done[i].n_output, w.out_len[done[i].tag]);
        assert_int_equal(kvc_pool_n_free(w.pool), 12);
        world_free(&w);
    }
}

/* ---- odd parameters ----------------------------------------------------------------------- */
static void odd_parameters_are_refused(void **state)
{
    (void)state;
    world_t w;
    world_init(&w, 16, 4, params(32, 8));
    kvc_sched_t *s = (kvc_sched_t *)&w; /* must become NULL on failure */
    const double bad_share[] = {NAN, -0.1, 1.5, INFINITY};
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad_share); i++) {
        kvc_sched_params_t p = params(32, 8);
        p.class_kv_cap[2] = bad_share[i];
        assert_int_equal(kvc_sched_create(w.seqs, &p, &s), KVC_EINVAL);
        assert_null(s);
        p = params(32, 8);
        p.tenant_kv_share = bad_share[i];
        assert_int_equal(kvc_sched_create(w.seqs, &p, &s), KVC_EINVAL);
        p = params(32, 8);
        p.long_kv_cap = bad_share[i];
        assert_int_equal(kvc_sched_create(w.seqs, &p, &s), KVC_EINVAL);
    }
    const uint32_t bad_tenants[] = {0, KVC_SCHED_MAX_TENANTS + 1, UINT32_MAX};
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad_tenants); i++) {
        kvc_sched_params_t p = params(32, 8);
        p.n_tenants = bad_tenants[i];
        assert_int_equal(kvc_sched_create(w.seqs, &p, &s), KVC_EINVAL);
        assert_null(s);
    }
    const double bad_margin[] = {NAN, -1, INFINITY};
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad_margin); i++) {
        kvc_sched_params_t p = params(32, 8);
        p.admission = KVC_ADMIT_RESERVE_EXPECTED;
        p.expected_margin = bad_margin[i];
        assert_int_equal(kvc_sched_create(w.seqs, &p, &s), KVC_EINVAL);
    }
    kvc_sched_params_t p = params(32, 8);
    p.admission = KVC_ADMIT__COUNT;
    assert_int_equal(kvc_sched_create(w.seqs, &p, &s), KVC_EINVAL);
    p = params(32, 8);
    p.preemption = KVC_PREEMPT__COUNT;
    assert_int_equal(kvc_sched_create(w.seqs, &p, &s), KVC_EINVAL);
    p = params(32, 8);
    p.spec_tokens = 65;
    assert_int_equal(kvc_sched_create(w.seqs, &p, &s), KVC_EINVAL);
    p = params(32, 0);
    assert_int_equal(kvc_sched_create(w.seqs, &p, &s), KVC_EINVAL);
    p = params(32, 8);
    assert_int_equal(kvc_sched_create(NULL, &p, &s), KVC_EINVAL);
    assert_int_equal(kvc_sched_create(w.seqs, NULL, &s), KVC_EINVAL);
    assert_int_equal(kvc_sched_create(w.seqs, &p, NULL), KVC_EINVAL);
    /* times that are not numbers */
    kvc_token_t t[4] = {1, 2, 3, 4};
    kvc_sched_req_t r = {.prompt = t, .n_prompt = 4, .max_output = 4};
    kvc_req_id_t id;
    assert_int_equal(kvc_sched_add(w.s, &r, NAN, &id), KVC_EINVAL);
    assert_int_equal(kvc_sched_add(w.s, &r, INFINITY, &id), KVC_EINVAL);
    r.max_output = 0;
    assert_int_equal(kvc_sched_add(w.s, &r, 0, &id), KVC_EINVAL);
    r.max_output = 4;
    r.tenant = KVC_SCHED_DEFAULT_TENANTS; /* the default scheduler has 16: 0..15 */
    assert_int_equal(kvc_sched_add(w.s, &r, 0, &id), KVC_EINVAL);
    r.tenant = 0;
    assert_int_equal(kvc_sched_add(w.s, NULL, 0, &id), KVC_EINVAL);
    kvc_sched_stats_t st;
    kvc_sched_stats(w.s, &st);
    assert_int_equal(st.n_waiting, 0); /* nothing was queued */
    const kvc_sched_plan_t *pl;
    assert_int_equal(kvc_sched_step(w.s, NAN, &pl), KVC_EINVAL);
    assert_int_equal(kvc_sched_step(NULL, 0, &pl), KVC_EINVAL);
    id = add(&w, 4, 2, 4, 0, 0, 1);
    assert_ok(kvc_sched_step(w.s, 0, &pl));
    kvc_sched_result_t res = {.id = id, .token = 1};
    assert_int_equal(kvc_sched_complete(w.s, &res, 1, NAN), KVC_EINVAL);
    assert_int_equal(kvc_sched_complete(w.s, &res, 1, -INFINITY), KVC_EINVAL);
    res.n_accepted = 1; /* the entry has no drafts */
    assert_int_equal(kvc_sched_complete(w.s, &res, 1, 1), KVC_EINVAL);
    res.n_accepted = 0;
    assert_int_equal(kvc_sched_complete(w.s, &res, 2, 1), KVC_EINVAL);
    check(&w);
    assert_ok(kvc_sched_complete(w.s, &res, 1, 1));
    assert_ok(kvc_sched_complete(w.s, NULL, 0, 1)); /* no open plan: n == 0 is a no-op */
    assert_int_equal(kvc_sched_complete(w.s, &res, 1, 1), KVC_EINVAL);
    const kvc_sched_done_t *done;
    uint32_t nd;
    assert_int_equal(kvc_sched_take_finished(w.s, NULL, &nd), KVC_EINVAL);
    assert_int_equal(kvc_sched_take_finished(NULL, &done, &nd), KVC_EINVAL);
    assert_int_equal(kvc_sched_check(NULL, NULL, 0), KVC_EINVAL);
    kvc_sched_stats(NULL, &st);
    assert_int_equal(st.n_running, 0);
    assert_string_equal(kvc_sched_trace(NULL), "");
    world_free(&w);
}

static void a_prompt_whose_block_count_would_wrap_is_refused(void **state)
{
    (void)state;
    /* 2 groups of 1-token blocks: a 2^31-token prompt needs 2^32 + 2 blocks, which a 32-bit
     * count wraps to 2, and the 64-block pool seemed to hold it. */
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = 64;
    pp.block_size = 1;
    kvc_pool_t *pool;
    assert_ok(kvc_pool_create(&pp, &pool));
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    sp.n_groups = 2;
    kvc_seqs_t *seqs;
    assert_ok(kvc_seqs_create(pool, NULL, &sp, &seqs));
    kvc_sched_params_t p = params(64, 8);
    kvc_sched_t *s;
    assert_ok(kvc_sched_create(seqs, &p, &s));
    kvc_token_t t[1] = {1}; /* never read: the request is refused before anything copies it */
    kvc_sched_req_t r = {.prompt = t, .n_prompt = 1u << 31, .max_output = 1};
    kvc_req_id_t id;
    assert_int_equal(kvc_sched_add(s, &r, 0, &id), KVC_ERANGE);
    r.n_prompt = UINT32_MAX;
    assert_int_equal(kvc_sched_add(s, &r, 0, &id), KVC_ERANGE);
    r.n_prompt = 31; /* 32 positions in 2 groups: the whole pool */
    assert_ok(kvc_sched_add(s, &r, 0, &id));
    kvc_sched_destroy(s);
    kvc_seqs_destroy(seqs);
    kvc_pool_destroy(pool);
}

/* ---- victim selection ----------------------------------------------------------------------- */
typedef struct {
    uint32_t calls, null_calls;
    uint32_t answer; /* the index to return, or UINT32_MAX: none */
    kvc_sched_cand_t needy, cands[8];
    uint32_t need, n_cands;
} victim_log_t;

static uint32_t logging_victim(void *ctx, const kvc_sched_cand_t *needy, uint32_t need,
                               const kvc_sched_cand_t *c, uint32_t n)
{
    victim_log_t *v = ctx;
    if (!needy) {
        v->null_calls++;
        return kvc_victim_policy(KVC_VICTIM_LATEST)(NULL, needy, need, c, n);
    }
    if (getenv("KVC_VICTIM_LOG"))
        print_message("victim: needy tag %llu prio %u need %u, %u cands\n",
                      (unsigned long long)needy->tag, needy->priority, need, n);
    if (v->calls++ == 0) {
        v->needy = *needy;
        v->need = need;
        v->n_cands = KVC_MIN(n, 8u);
        memcpy(v->cands, c, v->n_cands * sizeof *c);
    }
    assert_true(n > 0);
    for (uint32_t i = 1; i < n; i++) /* in the scheduler's order */
        assert_true(c[i - 1].priority < c[i].priority ||
                    (c[i - 1].priority == c[i].priority && c[i - 1].arrival_s <= c[i].arrival_s));
    return v->answer == UINT32_MAX ? n : KVC_MIN(v->answer, n - 1);
}

/* a holds 1 block, b 4, c 2 of 8; b's first decode past its 4th block finds the pool full while
 * a is already planned: the policy chooses among b and c.  Returns the tag preempted first. */
static int first_victim(kvc_sched_params_t p, victim_log_t *log)
{
    world_t w;
    world_init(&w, 8, 4, p);
    add(&w, 4, 10, 10, 0, 0, 100);
    w.now = 0.1;
    add(&w, 15, 10, 10, 0, 0, 200);
    w.now = 0.2;
    add(&w, 6, 10, 10, 0, 0, 300);
    int victim = -1;
    for (int i = 0; i < 10 && victim < 0; i++) {
        step(&w);
        const char *t = kvc_sched_trace(w.s), *at = strstr(t, "  preempt r");
        if (at) victim = atoi(at + strlen("  preempt r"));
    }
    if (log) {
        assert_true(log->calls >= 1);
        assert_int_equal(log->needy.tag, 1);
        assert_int_equal(log->need, 1);
        assert_int_equal(log->n_cands, 2); /* a is planned: only b and c can help */
        assert_int_equal(log->cands[0].tag, 1);
        assert_int_equal(log->cands[0].n_blocks, 4);
        assert_int_equal(log->cands[1].tag, 2);
        assert_int_equal(log->cands[1].n_blocks, 2);
        assert_true(log->cands[1].id != 0 && log->cands[1].arrival_s == 0.2);
    }
    world_free(&w);
    return victim;
}

static void the_victim_policy_is_a_hook(void **state)
{
    (void)state;
    kvc_sched_params_t p = params(64, 8);
    assert_int_equal(first_victim(p, NULL), 2); /* default: the latest */
    p.victim = kvc_victim_policy(KVC_VICTIM_LARGEST);
    assert_int_equal(first_victim(p, NULL), 1); /* b holds the most blocks */
    victim_log_t log = {.answer = 0};
    p.victim = logging_victim;
    p.victim_ctx = &log;
    assert_int_equal(first_victim(p, &log), 1); /* the first candidate: b itself */
    log = (victim_log_t){.answer = UINT32_MAX};
    assert_int_equal(first_victim(p, &log), 1); /* none: the request that cannot grow */
    log = (victim_log_t){.answer = 1};
    assert_int_equal(first_victim(p, &log), 2);
}

static void a_policy_may_spare_lower_classes_from_an_admission(void **state)
{
    (void)state;
    /* 10 blocks; a batch request holds 7, an interactive one needs 5 to start.  By default the
     * batch request is preempted for it; a policy that declines makes the interactive request
     * wait until the batch request is done. */
    for (int decline = 0; decline < 2; decline++) {
        victim_log_t log = {.answer = decline ? UINT32_MAX : 0};
        kvc_sched_params_t p = params(64, 8);
        p.victim = logging_victim;
        p.victim_ctx = &log;
        world_t w;
        world_init(&w, 10, 4, p);
        kvc_req_id_t batch = add(&w, 28, 12, 12, 1, 0, 100);
        step(&w);
        w.now = 2;
        kvc_req_id_t inter = add(&w, 20, 2, 4, 0, 0, 500);
        drain(&w, 100);
        assert_true(log.calls >= 1);
        assert_int_equal(log.needy.tag, 1); /* the waiting interactive request */
        assert_int_equal(log.needy.priority, 0);
        assert_int_equal(log.n_cands, 1);
        assert_int_equal(log.cands[0].tag, 0); /* only the lower class may give room */
        assert_int_equal(log.cands[0].n_blocks, 7);
        const kvc_sched_done_t *done;
        uint32_t nd;
        take(&w, &done, &nd);
        assert_int_equal(nd, 2);
        if (decline) {
            assert_true(done[0].id == batch && done[0].n_preemptions == 0);
            assert_true(done[1].id == inter);
        } else {
            assert_true(done[0].id == inter);
            assert_true(done[1].id == batch && done[1].n_preemptions == 1);
        }
        world_free(&w);
    }
}

/* The request's class reaches the prefix cache (KVC_CLASS_PREFIX_PRIORITY): under the priority
 * eviction policy a more urgent class's cached prefix survives a less urgent class's traffic
 * that evicts it under LRU.  12 blocks of 4 tokens: the urgent request (17 tokens) leaves its
 * 4 full blocks cached; two less urgent requests (32 tokens, 9 blocks each) then need the
 * memory; the urgent prompt comes back. */
static void a_more_urgent_class_keeps_its_prefix_under_the_priority_policy(void **state)
{
    (void)state;
    assert_int_equal(KVC_CLASS_PREFIX_PRIORITY(0), KVC_PREFIX_MAX_PRIORITY);
    assert_int_equal(KVC_CLASS_PREFIX_PRIORITY(KVC_MAX_CLASSES - 1), 0);
    for (uint32_t hi = 0; hi + 1 < KVC_MAX_CLASSES; hi++) {
        uint32_t hits[2];
        for (int priority = 0; priority < 2; priority++) {
            world_t w;
            world_init_evicting(&w, 12, 4, params(64, 8),
                                priority ? KVC_EVICT_PRIORITY : KVC_EVICT_LRU);
            add(&w, 17, 1, 1, hi, 0, 1000);
            drain(&w, 20);
            for (int i = 0; i < 2; i++) {
                add(&w, 32, 1, 1, hi + 1, 0, 2000 + 100 * i);
                drain(&w, 20);
            }
            add(&w, 17, 1, 1, hi, 0, 1000);
            drain(&w, 20);
            const kvc_sched_done_t *done;
            uint32_t nd;
            take(&w, &done, &nd);
            assert_int_equal(nd, 4);
            assert_int_equal(done[3].priority, hi);
            hits[priority] = done[3].n_hit_tokens;
            world_free(&w);
        }
        print_message("class %u after class %u traffic: %u prompt tokens hit under lru, %u under "
                      "priority\n",
                      hi, hi + 1, hits[0], hits[1]);
        assert_int_equal(hits[1], 16); /* all 4 full blocks (the last token is computed) */
        assert_true(hits[0] < 16);
    }
}

static void a_backpressure_deadlock_asks_the_policy_with_no_needy(void **state)
{
    (void)state;
    /* 6 blocks: a (11 tokens, 3 blocks) and b (4 tokens, 1 block) both grow until neither can */
    victim_log_t log = {.answer = 0};
    kvc_sched_params_t p = params(64, 8);
    p.preemption = KVC_PREEMPT_BACKPRESSURE;
    p.victim = logging_victim;
    p.victim_ctx = &log;
    world_t w;
    world_init(&w, 6, 4, p);
    add(&w, 11, 13, 20, 0, 0, 100);
    add(&w, 4, 20, 20, 0, 0, 300);
    assert_true(drain(&w, 200) < 200);
    kvc_sched_stats_t st;
    kvc_sched_stats(w.s, &st);
    assert_true(st.forced_preemptions >= 1);
    assert_int_equal(log.null_calls, st.forced_preemptions);
    assert_int_equal(log.calls, 0); /* backpressure never preempts otherwise */
    world_free(&w);
}

static void every_policy_has_a_name_that_parses_back(void **state)
{
    (void)state;
    for (int a = 0; a < KVC_ADMIT__COUNT; a++) {
        kvc_admission_t x = KVC_ADMIT__COUNT;
        assert_ok(kvc_admission_parse(kvc_admission_name((kvc_admission_t)a), &x));
        assert_int_equal(x, a);
    }
    for (int a = 0; a < KVC_PREEMPT__COUNT; a++) {
        kvc_preemption_t x = KVC_PREEMPT__COUNT;
        assert_ok(kvc_preemption_parse(kvc_preemption_name((kvc_preemption_t)a), &x));
        assert_int_equal(x, a);
    }
    for (int a = 0; a < KVC_VICTIM__COUNT; a++) {
        kvc_victim_t x = KVC_VICTIM__COUNT;
        assert_ok(kvc_victim_parse(kvc_victim_name((kvc_victim_t)a), &x));
        assert_int_equal(x, a);
        assert_non_null(kvc_victim_policy((kvc_victim_t)a));
    }
    assert_string_equal(kvc_admission_name(KVC_ADMIT__COUNT), "?");
    assert_string_equal(kvc_preemption_name(KVC_PREEMPT__COUNT), "?");
    assert_string_equal(kvc_victim_name(KVC_VICTIM__COUNT), "?");
    assert_null(kvc_victim_policy(KVC_VICTIM__COUNT));
    kvc_victim_t v = KVC_VICTIM_LARGEST;
    assert_int_equal(kvc_victim_parse("oldest", &v), KVC_EINVAL);
    assert_int_equal(kvc_victim_parse(NULL, &v), KVC_EINVAL);
    assert_int_equal(v, KVC_VICTIM_LARGEST);
    assert_string_equal(kvc_victim_name(KVC_VICTIM_LATEST), "latest");
}

/* ---- randomized: every policy, aborts, invariants every step, no starvation, determinism
 * ---------------------- */
/* tenant_stride: request tenants are 0, 1, 2 times it, in a scheduler of 3 * stride tenants
 * (at least the default): decisions depend on the tenants' order, never on their numbers. */
static uint64_t random_run_tenants(uint64_t seed, kvc_admission_t adm, kvc_preemption_t pre,
                                   bool fair, kvc_victim_t vic, uint32_t tenant_stride,
                                   uint64_t *fingerprint)
{
    kvc_rng_t r;
    kvc_rng_seed(&r, seed);
    kvc_sched_params_t p =
        params(16 + (uint32_t)kvc_rng_below(&r, 64), 4 + (uint32_t)kvc_rng_below(&r, 12));
    p.admission = adm;
    p.preemption = pre;
    p.tenant_fair = fair;
    p.victim = kvc_victim_policy(vic);
    p.expected_output = 6;
    p.spec_tokens = (uint32_t)kvc_rng_below(&r, 3);
    if (kvc_rng_below(&r, 2)) p.class_kv_cap[1] = 0.6;
    if (kvc_rng_below(&r, 2)) p.tenant_kv_share = 0.7;
    p.n_tenants = KVC_MAX(p.n_tenants, 3 * tenant_stride);
    world_t w;
    world_init(&w, 48, 4, p);
    w.accept_drafts = (uint32_t)kvc_rng_below(&r, 3);
    uint32_t n_req = 0, n_done = 0, max_wait_steps = 0;
    kvc_req_id_t ids[128];
    bool aborted[128] = {false}, taken[128] = {false};
    uint64_t fp = 0;
    const kvc_sched_done_t *done;
    uint32_t nd;
    for (int t = 0;; t++) {
        if (t < 300 && n_req < 120 && kvc_rng_below(&r, 3) == 0) {
            uint32_t len = 1 + (uint32_t)kvc_rng_below(&r, 40);
            ids[n_req] = add(
                &w, len, 1 + (uint32_t)kvc_rng_below(&r, 12), 12, (uint32_t)kvc_rng_below(&r, 2),
                (uint32_t)kvc_rng_below(&r, 3) * tenant_stride, (int)(kvc_rng_below(&r, 4) * 50));
            n_req++;
        }
        if (t < 300 && n_req && kvc_rng_below(&r, 25) == 0) { /* a client goes away */
            uint32_t j = (uint32_t)kvc_rng_below(&r, n_req);
            int rc = kvc_sched_abort(w.s, ids[j]);
            if (taken[j]) assert_int_equal(rc, KVC_ESTALE);
            if (!rc) aborted[j] = true;
            check(&w);
        }
        kvc_sched_stats_t st;
        kvc_sched_stats(w.s, &st);
        if (t >= 300 && !st.n_running && !st.n_waiting && !st.n_swapped) break;
        assert_true(t < 5300); /* everything finishes */
        const kvc_sched_plan_t *pl = step(&w);
        for (uint32_t i = 0; i < pl->n_entries; i++)
            fp = fp * 1000003 + pl->entries[i].tag * 31 + pl->entries[i].n_tokens;
        if (kvc_rng_below(&r, 4) && t < 5299) continue;
        take(&w, &done, &nd); /* slots are reused from here on */
        for (uint32_t i = 0; i < nd; i++) {
            uint64_t tag = done[i].tag;
            assert_true(tag < n_req && !taken[tag] && done[i].id == ids[tag]);
            taken[tag] = true;
            n_done++;
            uint32_t waited = (uint32_t)(done[i].finish_s - done[i].arrival_s);
            max_wait_steps = KVC_MAX(max_wait_steps, waited);
            assert_int_equal(done[i].aborted, aborted[tag]);
            if (aborted[tag])
                assert_true(done[i].n_output <= w.out_len[tag]);
            else
                assert_int_equal(done[i].n_output, w.out_len[tag]);
            fp = fp * 31 + tag;
        }
    }
    take(&w, &done, &nd);
    n_done += nd;
    assert_int_equal(n_done, n_req);
    assert_true(max_wait_steps < 1500); /* no request starved past a bound */
    assert_int_equal(kvc_pool_n_free(w.pool), 48);
    *fingerprint = fp;
    uint64_t steps = w.steps;
    world_free(&w);
    return steps;
}

static uint64_t random_run(uint64_t seed, kvc_admission_t adm, kvc_preemption_t pre, bool fair,
                           kvc_victim_t vic, uint64_t *fingerprint)
{
    return random_run_tenants(seed, adm, pre, fair, vic, 1, fingerprint);
}

/* The same random runs with 1500 tenants (three of them busy, far apart): the same decisions,
 * step for step, as with three adjacent ones among 16, under every policy. */
static void tenant_numbers_do_not_change_decisions(void **state)
{
    (void)state;
    const int seeds = KVC_TEST_SANITIZED ? 1 : 3;
    for (int adm = 0; adm < KVC_ADMIT__COUNT; adm++)
        for (int pre = 0; pre < KVC_PREEMPT__COUNT; pre++)
            for (int fair = 0; fair < 2; fair++)
                for (int sd = 0; sd < seeds; sd++) {
                    uint64_t f1, f2;
                    uint64_t n1 =
                        random_run_tenants(2000 + (uint64_t)sd, (kvc_admission_t)adm,
                                           (kvc_preemption_t)pre, fair, KVC_VICTIM_LATEST, 1, &f1);
                    uint64_t n2 = random_run_tenants(2000 + (uint64_t)sd, (kvc_admission_t)adm,
                                                     (kvc_preemption_t)pre, fair, KVC_VICTIM_LATEST,
                                                     500, &f2);
                    assert_true(f1 == f2);
                    assert_true(n1 == n2);
                }
}

/* Parallel sampling: one request forks 40 children as its prompt completes.  The first
 * tables were sized for one live request, so the forks grow them inside kvc_sched_complete;
 * the entry being completed and the plan the caller holds must stay valid (they pointed into
 * the old array: a use after free that the ASan build caught), and the children decode. */
static void forks_that_grow_the_tables_keep_the_plan_readable(void **state)
{
    (void)state;
    world_t w;
    world_init(&w, 400, 4, params(512, 64));
    kvc_req_id_t parent = add(&w, 10, 6, 6, 0, 0, 100);
    const kvc_sched_plan_t *pl;
    assert_ok(kvc_sched_step(w.s, w.now, &pl));
    assert_int_equal(pl->n_entries, 1);
    assert_true(pl->entries[0].samples);
    enum { N = 40 };
    kvc_token_t toks[N];
    uint64_t tags[N];
    kvc_req_id_t ids[N];
    for (uint32_t k = 0; k < N; k++) toks[k] = 7, tags[k] = 1000 + k;
    kvc_sched_result_t res = {.id = parent,
                              .token = 7,
                              .n_forks = N,
                              .fork_tokens = toks,
                              .fork_tags = tags,
                              .fork_ids = ids};
    w.now += 1;
    assert_ok(kvc_sched_complete(w.s, &res, 1, w.now));
    check(&w);
    /* the plan stays readable until the next step */
    assert_int_equal(pl->n_entries, 1);
    assert_true(pl->entries[0].id == parent && pl->entries[0].n_tokens == 10);
    for (uint32_t k = 0; k < N; k++) assert_true(ids[k] != 0);
    kvc_sched_stats_t st;
    kvc_sched_stats(w.s, &st);
    assert_int_equal(st.n_running, N + 1);
    assert_ok(kvc_sched_step(w.s, w.now, &pl));
    assert_int_equal(pl->n_entries, N + 1); /* the parent and every child decode */
    check(&w);
    world_free(&w);
}

/* ---- many tenants ---------------------------------------------------------------------------- */
/* 1000 tenants, 100 of them (spread over the range) with a prompt each: under fairness the
 * step's prompt budget is split among exactly those 100; the checker (per-tenant books, the
 * active-tenant lists) holds after every step, and every tenant is served. */
static void a_thousand_tenants_share_the_prompt_budget_fairly(void **state)
{
    (void)state;
    kvc_sched_params_t p = params(1000, 128);
    p.n_tenants = 1000;
    p.tenant_fair = true;
    world_t w;
    world_init(&w, 4000, 4, p);
    kvc_req_id_t ids[100];
    for (uint32_t i = 0; i < 100; i++) ids[i] = add(&w, 40, 2, 2, 0, 999 - i * 10, (int)i * 64);
    const kvc_sched_plan_t *pl = step(&w);
    assert_int_equal(pl->n_entries, 100); /* every tenant with work got its share */
    for (uint32_t i = 0; i < pl->n_entries; i++) assert_int_equal(pl->entries[i].n_tokens, 10);
    for (uint32_t i = 0; i < 100; i++) assert_non_null(entry_of(pl, ids[i]));
    kvc_sched_tenant_stats_t ts;
    assert_ok(kvc_sched_tenant_stats(w.s, 999, &ts));
    assert_int_equal(ts.n_running, 1);
    assert_int_equal(ts.computed, 10);
    assert_int_equal(ts.blocks, 3);                   /* 10 tokens reserved in blocks of 4 */
    assert_ok(kvc_sched_tenant_stats(w.s, 998, &ts)); /* an idle tenant */
    assert_int_equal(ts.n_running + ts.n_waiting + ts.blocks + ts.computed, 0);
    assert_true(drain(&w, 100) < 100);
    const kvc_sched_done_t *done;
    uint32_t nd;
    take(&w, &done, &nd);
    assert_int_equal(nd, 100);
    for (uint32_t i = 0; i < nd; i++) assert_int_equal(done[i].n_output, 2);
    for (uint32_t t = 0; t < 1000; t++) {
        assert_ok(kvc_sched_tenant_stats(w.s, t, &ts));
        assert_int_equal(ts.computed, t % 10 == 9 ? 41 : 0); /* prompt + one decode */
        assert_int_equal(ts.blocks + ts.n_running + ts.n_waiting, 0);
    }
    assert_int_equal(kvc_sched_tenant_stats(w.s, 1000, &ts), KVC_EINVAL);
    assert_int_equal(kvc_sched_tenant_stats(NULL, 0, &ts), KVC_EINVAL);
    assert_int_equal(kvc_sched_tenant_stats(w.s, 0, NULL), KVC_EINVAL);
    assert_int_equal(kvc_sched_n_tenants(w.s), 1000);
    assert_int_equal(kvc_sched_n_tenants(NULL), 0);
    world_free(&w);
}

/* A KV quota with 1000 tenants: tenant 777 may hold 1% of 1000 blocks (10); its five prompts of
 * 30 tokens (8 blocks each at the end) run one at a time, while tenant 3's three (3 blocks
 * each) are admitted beside it.  The checker verifies the quota after every step; tenant 1000 is
 * refused. */
static void a_kv_quota_holds_among_a_thousand_tenants(void **state)
{
    (void)state;
    kvc_sched_params_t p = params(256, 64);
    p.n_tenants = 1000;
    p.tenant_kv_share = 0.01;
    world_t w;
    world_init(&w, 1000, 4, p);
    for (int i = 0; i < 5; i++) add(&w, 30, 2, 2, 0, 777, 100 * i);
    for (int i = 0; i < 3; i++) add(&w, 8, 2, 2, 0, 3, 1000 + 100 * i); /* 3 blocks each */
    uint32_t most = 0;
    for (int k = 0; k < 40; k++) {
        kvc_sched_tenant_stats_t ts;
        assert_ok(kvc_sched_tenant_stats(w.s, 777, &ts));
        most = KVC_MAX(most, ts.blocks);
        assert_true(ts.n_running <= 1);
        kvc_sched_stats_t st;
        kvc_sched_stats(w.s, &st);
        if (!st.n_running && !st.n_waiting) break;
        if (k == 1) {
            assert_ok(kvc_sched_tenant_stats(w.s, 3, &ts));
            assert_int_equal(ts.n_running, 3); /* not held behind tenant 777 */
        }
        step(&w);
    }
    assert_true(most <= 10 && most >= 8);
    kvc_token_t t[4] = {1, 2, 3, 4};
    kvc_sched_req_t r = {.prompt = t, .n_prompt = 4, .max_output = 4, .tenant = 1000};
    kvc_req_id_t id;
    assert_int_equal(kvc_sched_add(w.s, &r, w.now, &id), KVC_EINVAL);
    r.tenant = 999;
    assert_ok(kvc_sched_add(w.s, &r, w.now, &id));
    world_free(&w);
}

/* KV token-seconds, charged lazily, against hand arithmetic: tenant 4000 of 5000 holds 2 blocks
 * of 4 tokens from the first step (t = 0) to the second (t = 1), then 3 blocks until the
 * third (t = 3): 2 * 4 * 1 + 3 * 4 * 2 = 32 token-seconds, and tenant 0 holds nothing. */
static void kv_token_seconds_are_charged_per_tenant(void **state)
{
    (void)state;
    kvc_sched_params_t p = params(64, 8);
    p.n_tenants = 5000;
    world_t w;
    world_init(&w, 100, 4, p);
    add(&w, 8, 10, 10, 0, 4000, 0);
    step(&w); /* t = 0: the prompt, 2 blocks */
    kvc_sched_tenant_stats_t ts;
    assert_ok(kvc_sched_tenant_stats(w.s, 4000, &ts));
    assert_int_equal(ts.blocks, 2);
    assert_true(ts.kv_token_s == 0);
    step(&w); /* t = 1: charged 2 blocks for 1 s; the 9th token takes a third block */
    assert_ok(kvc_sched_tenant_stats(w.s, 4000, &ts));
    assert_true(fabs(ts.kv_token_s - 8) < 1e-9);
    assert_int_equal(ts.blocks, 3);
    w.now = 3;
    step(&w); /* t = 3: 3 blocks for 2 s */
    assert_ok(kvc_sched_tenant_stats(w.s, 4000, &ts));
    assert_true(fabs(ts.kv_token_s - 32) < 1e-9);
    assert_int_equal(ts.computed, 10);
    assert_ok(kvc_sched_tenant_stats(w.s, 0, &ts));
    assert_true(ts.kv_token_s == 0);
    world_free(&w);
}

static void every_policy_keeps_the_books_and_finishes_everything(void **state)
{
    (void)state;
    const int seeds = KVC_TEST_SANITIZED ? 2 : 6;
    for (int adm = 0; adm < KVC_ADMIT__COUNT; adm++)
        for (int pre = 0; pre < KVC_PREEMPT__COUNT; pre++)
            for (int vic = 0; vic < KVC_VICTIM__COUNT; vic++)
                for (int fair = 0; fair < 2; fair++)
                    for (int sd = 0; sd < seeds; sd++) {
                        uint64_t f1, f2;
                        random_run(1000 + (uint64_t)sd, (kvc_admission_t)adm, (kvc_preemption_t)pre,
                                   fair, (kvc_victim_t)vic, &f1);
                        random_run(1000 + (uint64_t)sd, (kvc_admission_t)adm, (kvc_preemption_t)pre,
                                   fair, (kvc_victim_t)vic, &f2);
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
        cmocka_unit_test(a_swapped_request_comes_back_only_within_its_caps),
        cmocka_unit_test(interactive_requests_preempt_batch_requests),
        cmocka_unit_test(a_class_kv_cap_keeps_batch_from_taking_the_pool),
        cmocka_unit_test(a_kv_quota_stops_one_tenant_from_taking_the_pool),
        cmocka_unit_test(fair_share_splits_the_prompt_budget_between_tenants),
        cmocka_unit_test(forks_that_grow_the_tables_keep_the_plan_readable),
        cmocka_unit_test(an_account_stays_readable_while_adds_grow_the_tables),
        cmocka_unit_test(a_thousand_tenants_share_the_prompt_budget_fairly),
        cmocka_unit_test(a_kv_quota_holds_among_a_thousand_tenants),
        cmocka_unit_test(kv_token_seconds_are_charged_per_tenant),
        cmocka_unit_test(tenant_numbers_do_not_change_decisions),
        cmocka_unit_test(a_long_request_cap_protects_short_traffic),
        cmocka_unit_test(drafts_count_against_the_budget_and_roll_back),
        cmocka_unit_test(the_api_refuses_misuse),
        cmocka_unit_test(ids_are_recycled_under_a_new_generation),
        cmocka_unit_test(tags_are_echoed_in_entries_accounts_and_callbacks),
        cmocka_unit_test(an_account_stays_readable_until_the_next_take),
        cmocka_unit_test(an_abort_at_every_point_of_a_life_frees_everything),
        cmocka_unit_test(a_reused_slot_in_another_queue_keeps_both_queues_straight),
        cmocka_unit_test(a_completion_with_wrong_ids_changes_nothing),
        cmocka_unit_test(tiny_budgets_and_chunks_still_finish_everything),
        cmocka_unit_test(odd_parameters_are_refused),
        cmocka_unit_test(a_prompt_whose_block_count_would_wrap_is_refused),
        cmocka_unit_test(the_victim_policy_is_a_hook),
        cmocka_unit_test(a_policy_may_spare_lower_classes_from_an_admission),
        cmocka_unit_test(a_backpressure_deadlock_asks_the_policy_with_no_needy),
        cmocka_unit_test(a_more_urgent_class_keeps_its_prefix_under_the_priority_policy),
        cmocka_unit_test(every_policy_has_a_name_that_parses_back),
        cmocka_unit_test(every_policy_keeps_the_books_and_finishes_everything),
    };
    return cmocka_run_group_tests_name("sched", tests, NULL, NULL);
}
