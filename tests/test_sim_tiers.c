/* test_sim_tiers.c - KV tiers in the simulator: a host tier turns the recompute of a
 * multi-turn workload whose working set is several times the pool into fetches (fewer prompt
 * tokens computed, a lower TTFT), a tier whose round trip is enormous is found and never
 * fetched from and leaves the run exactly as without it, a redis tier is shared by the
 * replicas, a disk tier's admission and write budget refuse what they must, the break-even
 * figures follow the closed form and agree with kvc_tier_decide, invariants hold at every
 * step, the report carries the tiers section, and bad configurations are refused. */
#include "test_helpers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Multi-turn conversations resending their history: 120 conversations of 4 to 8 turns, 1,500
 * to 2,000 tokens of first prompt, 5 to 20 s of think time.  Live history is tens of
 * thousands of blocks; the pool holds 3,000. */
#define MULTITURN \
    "poisson:rate=2,n=%d,prompt=1500..2000,output=50..100,turns=4..8,think=5..20,user=100..300"

static kvc_sim_config_t config(uint32_t num_blocks)
{
    kvc_sim_config_t c = kvc_sim_config_default();
    char msg[256];
    if (kvc_plan_model_load(KVC_DATA_DIR "/configs/llama-3.1-8b.json", &c.model, msg, sizeof msg))
        fail_msg("model: %s", msg);
    assert_ok(kvc_plan_gpu_preset("h100-sxm", &c.gpu));
    c.num_blocks = num_blocks;
    c.closed_loop = true;
    return c;
}

static kvc_workload_t *multiturn(int n)
{
    char spec[256];
    snprintf(spec, sizeof spec, MULTITURN, n);
    kvc_workload_params_t wp = kvc_workload_params_default();
    kvc_workload_t *w = NULL;
    char err[256];
    if (kvc_workload_load(spec, &wp, &w, err, sizeof err)) fail_msg("workload: %s", err);
    return w;
}

static kvc_tier_spec_t spec(const char *s)
{
    kvc_tier_spec_t t;
    char msg[256];
    if (kvc_tier_spec_parse(s, &t, msg, sizeof msg)) fail_msg("spec %s: %s", s, msg);
    return t;
}

static kvc_report_t *new_report(const kvc_workload_t *w)
{
    kvc_report_params_t rp = kvc_report_params_default();
    rp.tenant_names = kvc_workload_tenant_names(w);
    rp.n_tenants = kvc_workload_n_tenants(w);
    rp.class_names = kvc_workload_class_names(w);
    rp.n_classes = kvc_workload_n_classes(w);
    kvc_report_t *r;
    assert_ok(kvc_report_create(&rp, &r));
    return r;
}

static char *write_report(const kvc_report_t *r, bool json)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_ok(json ? kvc_report_write_json(r, f) : kvc_report_write_text(r, f));
    fclose(f);
    return buf;
}

/* Run; the summary of everything; *text (if not NULL) the JSON report. */
static kvc_report_summary_t run(const kvc_sim_config_t *c, const kvc_workload_t *w,
                                kvc_sim_result_t *res, char **json)
{
    kvc_report_t *r = new_report(w);
    char err[256];
    int rc = kvc_sim_run(c, w, r, res, err, sizeof err);
    if (rc) fail_msg("kvc_sim_run: %s (%s)", err, kvc_strerror(rc));
    kvc_report_summary_t s;
    assert_ok(kvc_report_summary(r, KVC_REPORT_ALL, 0, &s));
    if (json) *json = write_report(r, true);
    kvc_report_destroy(r);
    return s;
}

static uint64_t computed(const kvc_report_summary_t *s)
{
    return s->prompt_tokens - s->hit_tokens;
}

static void a_host_tier_fetches_what_the_pool_evicted(void **state)
{
    (void)state;
    kvc_workload_t *w = multiturn(600);
    kvc_sim_config_t c = config(3000);
    kvc_sim_result_t none, host;
    kvc_report_summary_t a = run(&c, w, &none, NULL);
    kvc_tier_spec_t t = spec("host:64GiB");
    c.tiers = &t;
    c.n_tiers = 1;
    kvc_report_summary_t b = run(&c, w, &host, NULL);
    print_message("no tier: %llu prompt tokens computed, TTFT p50 %.1f ms; host: %llu, %.1f ms\n",
                  (unsigned long long)computed(&a), a.ttft_ms.p50, (unsigned long long)computed(&b),
                  b.ttft_ms.p50);
    assert_int_equal(a.completed, 600);
    assert_int_equal(b.completed, 600);
    assert_int_equal(a.prompt_tokens, b.prompt_tokens);
    /* the pool alone keeps little of the history; the tier most of it */
    assert_true(computed(&b) * 3 < computed(&a));
    assert_true(b.ttft_ms.p50 < a.ttft_ms.p50);
    assert_int_equal(none.n_tiers, 0);
    assert_int_equal(host.n_tiers, 1);
    const kvc_sim_tier_stats_t *s = &host.tiers[0];
    assert_int_equal(s->kind, KVC_TIER_HOST);
    assert_int_equal(s->mode, KVC_TIER_MODE_EVICT);
    assert_true(s->fetched_blocks > 0);
    assert_int_equal(s->fetched_tokens, s->fetched_blocks * 16);
    assert_int_equal(s->hits, s->fetched_blocks + s->recompute_chosen_blocks);
    assert_true(s->fetches > 0 && s->fetches <= s->fetched_blocks);
    const size_t rec = kvc_tier_record_bytes(host.kv_bytes_per_block, 16);
    assert_int_equal(s->bytes_read, s->fetched_blocks * rec);
    assert_int_equal(s->bytes_written, s->puts * rec);
    assert_int_equal(s->capacity_records, (64ull << 30) / rec);
    assert_true(s->link_busy_s > 0);
    /* every fetched token cached is a hit the run would otherwise have computed */
    assert_true(host.tier_saved_tokens > 0);
    assert_true(host.tier_saved_tokens <= s->fetched_tokens);
    assert_true(host.hit_tokens >= host.tier_saved_tokens);
    /* a host link is fast: no run long enough to be found is worth recomputing */
    assert_int_equal(s->recompute_chosen_blocks, 0);
    /* the default link: the GPU's host link and 10 us */
    assert_true(s->bandwidth_Bps == host.cost.host_link_bytes_per_s);
    assert_true(s->rtt_s == 10e-6);
    kvc_workload_destroy(w);
}

static void a_tier_too_far_away_is_never_fetched_from_and_changes_nothing(void **state)
{
    (void)state;
    kvc_workload_t *w = multiturn(300);
    kvc_sim_config_t c = config(3000);
    kvc_sim_result_t none, far;
    char *ja, *jb;
    kvc_report_summary_t a = run(&c, w, &none, &ja);
    kvc_tier_spec_t t = spec("host:64GiB,rtt=1000s");
    c.tiers = &t;
    c.n_tiers = 1;
    kvc_report_summary_t b = run(&c, w, &far, &jb);
    const kvc_sim_tier_stats_t *s = &far.tiers[0];
    assert_true(s->hits > 0);               /* found, */
    assert_int_equal(s->fetched_blocks, 0); /* never fetched */
    assert_int_equal(s->fetches, 0);
    assert_int_equal(s->recompute_chosen_blocks, s->hits);
    assert_int_equal(far.tier_saved_tokens, 0);
    /* and the run is the no-tier run's: every latency, every count */
    assert_int_equal(a.completed, b.completed);
    assert_int_equal(a.hit_tokens, b.hit_tokens);
    assert_int_equal(a.preemptions, b.preemptions);
    assert_int_equal(none.steps, far.steps);
    assert_true(none.simulated_s == far.simulated_s);
    assert_true(a.ttft_ms.p50 == b.ttft_ms.p50 && a.ttft_ms.p99 == b.ttft_ms.p99);
    assert_true(a.tpot_ms.p50 == b.tpot_ms.p50 && a.e2e_ms.max == b.e2e_ms.max);
    /* the JSON reports agree up to the tiers section */
    const char *cut = strstr(jb, ",\n  \"tiers\": [");
    assert_non_null(cut);
    const char *cfg_a = strstr(ja, ",\n  \"config\": {");
    assert_non_null(cfg_a);
    assert_int_equal(cut - jb, cfg_a - ja);
    assert_memory_equal(ja, jb, (size_t)(cfg_a - ja));
    free(ja);
    free(jb);
    kvc_workload_destroy(w);
}

/* rtt* = n / rate - n / block_tokens * block_bytes / bw, with the rate the cost model's step
 * time for one full chunk at the run's midpoint gives; and kvc_tier_decide, the policy the
 * runs use, flips from fetch to recompute across it. */
static void break_even_follows_the_closed_form(void **state)
{
    (void)state;
    kvc_sim_config_t c = config(0);
    kvc_tier_spec_t t[3] = {spec("redis://r:6379,bw=25GB/s,rtt=1ms"),
                            spec("redis://far:6379,bw=10Gbit/s,rtt=80ms"), spec("host:1TiB")};
    c.tiers = t;
    c.n_tiers = 3;
    kvc_sim_tier_table_t tab;
    char err[256];
    if (kvc_sim_tier_table(&c, &tab, err, sizeof err)) fail_msg("table: %s", err);
    kvc_plan_result_t pr;
    assert_ok(kvc_plan_compute(&c.model, &c.gpu, &c.plan, &pr, err, sizeof err));
    kvc_sim_cost_model_t cm;
    assert_ok(kvc_sim_cost_model(&c.model, &c.gpu, &c.plan, &pr, c.step_overhead_s,
                                 c.allreduce_latency_s, &cm));
    const double T = pr.params.max_num_batched_tokens;
    const double block_bytes = (double)pr.kv_bytes_per_token * 16;
    assert_true(block_bytes == 2.0 * 1024 * 1024); /* Llama-3.1-8B: 128 KiB a token, bf16 */
    assert_int_equal(tab.block_bytes, (uint64_t)block_bytes);
    assert_int_equal(tab.n_tiers, 3);
    assert_int_equal(tab.n_lengths, 4); /* 1K..64K all under its 128K context */
    const uint32_t want_len[] = {1024, 4096, 16384, 65536};
    for (uint32_t i = 0; i < 4; i++) {
        const double n = want_len[i];
        assert_int_equal(tab.lengths[i], want_len[i]);
        double pos = fmax(0, n / 2 - T / 2);
        kvc_sched_entry_t e = {0};
        e.first_pos = (uint32_t)pos;
        e.n_tokens = (uint32_t)T;
        kvc_sched_plan_t plan = {.entries = &e, .n_entries = 1};
        const double recompute = n * (kvc_sim_step_time(&cm, &plan, NULL) - cm.step_overhead_s) / T;
        for (uint32_t k = 0; k < 3; k++) {
            const kvc_sim_break_even_t *b = &tab.cells[k][i];
            const double bw = k == 0 ? 25e9 : k == 1 ? 1.25e9 : cm.host_link_bytes_per_s;
            const double want = recompute - n / 16 * block_bytes / bw;
            assert_int_equal(b->n_tokens, want_len[i]);
            assert_int_equal(b->n_blocks, want_len[i] / 16);
            assert_true(fabs(b->recompute_s - recompute) <= 1e-12 * recompute);
            assert_true(fabs(b->rtt_s - want) <= 1e-9 * recompute);
            assert_int_equal(b->never, !(want > 0));
            if (b->never) continue;
            /* the decision the engine makes agrees: fetch just below rtt*, recompute above */
            kvc_tier_run_t run = {.n_blocks = b->n_blocks,
                                  .block_bytes = (size_t)block_bytes,
                                  .block_tokens = 16,
                                  .bandwidth_Bps = bw,
                                  .latency_s = b->rtt_s * 0.999,
                                  .prefill_tokens_per_s = n / recompute};
            kvc_tier_decision_t d;
            assert_ok(kvc_tier_decide(&run, &d));
            assert_true(d.fetch);
            run.latency_s = b->rtt_s * 1.001;
            assert_ok(kvc_tier_decide(&run, &d));
            assert_false(d.fetch);
        }
    }
    /* 10 Gbit/s moves 2 MiB in 1.68 ms; the H100 recomputes 16 tokens in well under that */
    for (uint32_t i = 0; i < 4; i++) assert_true(tab.cells[1][i].never);
    assert_false(tab.cells[0][1].never);
    /* what the text and JSON say */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_ok(kvc_sim_tier_table_write_text(&tab, f));
    assert_ok(kvc_sim_tier_table_write_json(&tab, f, ""));
    fclose(f);
    assert_non_null(strstr(buf, "never"));
    assert_non_null(strstr(buf, "\"break_even_rtt_s\": null"));
    assert_non_null(strstr(buf, "\"fetch_wins\": true"));
    free(buf);
    /* argument errors */
    kvc_sim_break_even_t b;
    assert_int_equal(kvc_sim_break_even(&cm, 1, 0, 1, 1, 16, &b), KVC_EINVAL);
    assert_int_equal(kvc_sim_break_even(&cm, 1, 16, 1, 0, 16, &b), KVC_EINVAL);
    assert_int_equal(kvc_sim_break_even(&cm, 1, 16, 1, NAN, 16, &b), KVC_EINVAL);
    assert_int_equal(kvc_sim_break_even(NULL, 1, 16, 1, 1, 16, &b), KVC_EINVAL);
    c.n_tiers = 0;
    assert_int_equal(kvc_sim_tier_table(&c, &tab, err, sizeof err), KVC_EINVAL);
    assert_true(err[0] != 0);
}

static void a_redis_tier_is_shared_by_the_replicas(void **state)
{
    (void)state;
    kvc_workload_t *w = multiturn(400);
    kvc_sim_config_t c = config(3000);
    c.plan.dp = 2; /* request i goes to replica i mod 2: turns of a conversation move */
    kvc_sim_result_t none, redis, local;
    kvc_report_summary_t a = run(&c, w, &none, NULL);
    kvc_tier_spec_t t = spec("redis://kv:6379,bw=25GB/s,rtt=50us");
    c.tiers = &t;
    c.n_tiers = 1;
    kvc_report_summary_t b = run(&c, w, &redis, NULL);
    kvc_tier_spec_t h = spec("host:64GiB,mode=write-through");
    c.tiers = &h;
    kvc_report_summary_t l = run(&c, w, &local, NULL);
    print_message("dp=2: computed %llu without a tier, %llu with redis, %llu with a host tier "
                  "each\n",
                  (unsigned long long)computed(&a), (unsigned long long)computed(&b),
                  (unsigned long long)computed(&l));
    assert_int_equal(redis.tiers[0].mode, KVC_TIER_MODE_WRITE_THROUGH);
    assert_int_equal(redis.tiers[0].capacity_bytes, 0); /* unbounded */
    assert_true(redis.tiers[0].fetched_blocks > 0);
    assert_true(computed(&b) < computed(&a));
    /* a replica hits what the other computed: shared beats two private tiers of any size */
    assert_true(computed(&b) < computed(&l));
    kvc_workload_destroy(w);
}

/* Replicas are simulated one after another, so a shared tier must not show a replica what
 * another wrote later in simulated time: request 0 (replica 0) computes a prompt at t = 10 s;
 * the same prompt on replica 1 at t = 0 finds nothing in redis, at t = 20 s it fetches. */
static void a_shared_tier_shows_a_block_only_after_it_was_written(void **state)
{
    (void)state;
    for (int late = 0; late < 2; late++) {
        kvc_workload_t *w;
        assert_ok(kvc_workload_create(NULL, &w));
        static kvc_token_t prompt[4096];
        for (int i = 0; i < 4096; i++) prompt[i] = 1 + (i * 7919) % 30000;
        kvc_sim_request_t q = {.tokens = prompt, .n_prompt = 4096, .n_output = 4};
        q.arrival_s = 0;
        kvc_sim_request_t first = q;
        first.arrival_s = late ? 0 : 10; /* replica 0's */
        kvc_sim_request_t second = q;
        second.arrival_s = late ? 20 : 10; /* replica 1's, in arrival order with a filler */
        /* arrival order is required: replica 0 gets index 0 and 2, replica 1 index 1 and 3 */
        kvc_sim_request_t filler = {.tokens = prompt + 1, .n_prompt = 16, .n_output = 1};
        if (late) {
            assert_ok(kvc_workload_add(w, &first));  /* 0: replica 0 at 0 s */
            assert_ok(kvc_workload_add(w, &filler)); /* 1: replica 1 at 0 s */
            filler.arrival_s = 20;
            assert_ok(kvc_workload_add(w, &filler)); /* 2: replica 0 at 20 s */
            assert_ok(kvc_workload_add(w, &second)); /* 3: replica 1 at 20 s */
        } else {
            filler.arrival_s = 0;
            assert_ok(kvc_workload_add(w, &filler)); /* 0: replica 0 at 0 s */
            q.arrival_s = 0;
            assert_ok(kvc_workload_add(w, &q));     /* 1: replica 1 at 0 s */
            assert_ok(kvc_workload_add(w, &first)); /* 2: replica 0 at 10 s */
        }
        kvc_sim_config_t c = config(3000);
        c.closed_loop = false;
        c.plan.dp = 2;
        kvc_tier_spec_t t = spec("redis://kv:6379,bw=50GB/s,rtt=1ms");
        c.tiers = &t;
        c.n_tiers = 1;
        kvc_sim_result_t r;
        run(&c, w, &r, NULL);
        assert_true(r.tiers[0].puts > 0);
        if (late)
            assert_int_equal(r.tiers[0].fetched_blocks, 4095 / 16);
        else
            assert_int_equal(r.tiers[0].hits, 0);
        kvc_workload_destroy(w);
    }
}

/* Two requests that miss the same evicted prefix at once fetch it once: the second waits for
 * the first's fetch (the engine's fence refuses a second fetch of an identity), and both hit. */
static void a_prefix_in_flight_is_fetched_once(void **state)
{
    (void)state;
    static kvc_token_t tok[8][2048];
    for (int p = 0; p < 8; p++)
        for (int i = 0; i < 2048; i++) tok[p][i] = 1 + (p * 2048 + i) % 30000;
    kvc_workload_t *w;
    assert_ok(kvc_workload_create(NULL, &w));
    kvc_sim_request_t q = {.tokens = tok[0], .n_prompt = 2048, .n_output = 2};
    assert_ok(kvc_workload_add(w, &q)); /* computes the prefix at t = 0 */
    for (int p = 1; p <= 6; p++) {      /* 6 x 128 blocks: the 600-block pool evicts it */
        kvc_sim_request_t f = {.tokens = tok[p], .n_prompt = 2048, .n_output = 2, .arrival_s = p};
        assert_ok(kvc_workload_add(w, &f));
    }
    q.arrival_s = 10;
    assert_ok(kvc_workload_add(w, &q)); /* both miss it in the pool at t = 10 */
    assert_ok(kvc_workload_add(w, &q));
    kvc_sim_config_t c = config(600);
    c.closed_loop = false;
    c.check_every_step = true;
    kvc_tier_spec_t t = spec("host:64GiB,bw=10GB/s");
    c.tiers = &t;
    c.n_tiers = 1;
    kvc_sim_result_t r;
    kvc_report_summary_t s = run(&c, w, &r, NULL);
    assert_int_equal(s.completed, 9);
    assert_int_equal(r.tiers[0].fetched_blocks, 2047 / 16); /* once */
    assert_int_equal(r.tiers[0].fetches, 1);
    assert_int_equal(r.tier_saved_tokens, 2047 / 16 * 16);
    assert_int_equal(s.hit_tokens, 2 * (2047 / 16 * 16)); /* and both hit it */
    kvc_workload_destroy(w);
}

static void disk_admission_and_write_budget_refuse_writes(void **state)
{
    (void)state;
    kvc_workload_t *w = multiturn(200);
    kvc_sim_config_t c = config(3000);
    kvc_tier_spec_t t = spec("disk:/nowhere:1TiB");
    c.tiers = &t;
    c.n_tiers = 1;
    kvc_sim_result_t all, hit2, budget;
    run(&c, w, &all, NULL);
    assert_int_equal(all.tiers[0].admission_refused, 0);
    assert_int_equal(all.tiers[0].budget_refused, 0);
    assert_ok(kvc_tier_admission_parse("second-hit", &c.tier_admission));
    run(&c, w, &hit2, NULL);
    assert_true(hit2.tiers[0].admission_refused > 0);
    assert_true(hit2.tiers[0].puts < all.tiers[0].puts);
    c.tier_admission = (kvc_tier_admission_t){0};
    assert_ok(kvc_tier_budget_parse("100GiB/day", &c.tier_disk_write_budget));
    run(&c, w, &budget, NULL);
    assert_true(budget.tiers[0].budget_refused > 0);
    assert_true(budget.tiers[0].bytes_written < all.tiers[0].bytes_written);
    assert_true(budget.tier_saved_tokens < all.tier_saved_tokens);
    kvc_workload_destroy(w);
}

static void tiers_keep_the_invariants_at_every_step(void **state)
{
    (void)state;
    kvc_workload_t *w = multiturn(60);
    kvc_sim_config_t c = config(600);
    c.check_every_step = true;
    kvc_tier_spec_t t[3] = {spec("host:2GiB"), spec("disk:d:8GiB,rtt=1ms"),
                            spec("redis://r:1,rtt=2ms,bw=2GB/s")};
    c.tiers = t;
    c.n_tiers = 3;
    c.plan.dp = 2;
    kvc_sim_result_t r;
    kvc_report_summary_t s = run(&c, w, &r, NULL);
    assert_int_equal(s.completed, 60);
    uint64_t fetched = 0;
    for (int k = 0; k < 3; k++) fetched += r.tiers[k].fetched_blocks;
    assert_true(fetched > 0);
    assert_true(r.tiers[0].evictions > 0); /* 2 GiB holds 1,000 blocks */
    kvc_workload_destroy(w);
}

static void the_report_has_a_tiers_section_and_is_deterministic(void **state)
{
    (void)state;
    kvc_workload_t *w = multiturn(100);
    kvc_sim_config_t c = config(3000);
    kvc_tier_spec_t t[2] = {spec("host:8GiB"), spec("redis://r:1,rtt=80ms")};
    c.tiers = t;
    c.n_tiers = 2;
    kvc_sim_result_t r1, r2;
    char *j1, *j2;
    run(&c, w, &r1, &j1);
    run(&c, w, &r2, &j2);
    assert_string_equal(j1, j2);
    const char *keys[] = {"\"tiers\": [",
                          "\"kind\": \"host\"",
                          "\"kind\": \"redis\"",
                          "\"mode\": \"evict\"",
                          "\"fetched_blocks\"",
                          "\"fetched_tokens\"",
                          "\"recompute_chosen_blocks\"",
                          "\"bytes_read\"",
                          "\"bytes_written\"",
                          "\"evictions\"",
                          "\"tier_saved_tokens\"",
                          "\"break_even\"",
                          "\"break_even_rtt_s\""};
    for (size_t i = 0; i < KVC_ARRAY_LEN(keys); i++)
        if (!strstr(j1, keys[i])) fail_msg("JSON lacks %s", keys[i]);
    free(j1);
    free(j2);
    kvc_report_t *rep = new_report(w);
    char err[256];
    assert_ok(kvc_sim_run(&c, w, rep, &r1, err, sizeof err));
    char *text = write_report(rep, false);
    assert_non_null(strstr(text, "\ntiers (prompt tokens fetched instead of recomputed: "));
    assert_non_null(strstr(text, "break-even round trip"));
    free(text);
    assert_int_equal(kvc_report_set_tiers(rep, NULL, 0, 0, &r1.break_even), KVC_EINVAL);
    assert_int_equal(kvc_report_set_tiers(rep, r1.tiers, KVC_SIM_MAX_TIERS + 1, 0, &r1.break_even),
                     KVC_EINVAL);
    kvc_report_destroy(rep);
    kvc_workload_destroy(w);
}

/* Fail allocation 1, 2, 3, ... of a run with a host and a redis tier on two replicas: each run
 * either fails with KVC_ENOMEM and one line, or completes; nothing leaks; the run that fails
 * nothing gives the reference report. */
static void runs_with_tiers_fail_cleanly_under_allocation_faults(void **state)
{
    (void)state;
    kvc_workload_t *w = multiturn(16);
    kvc_sim_config_t c = config(400);
    c.plan.dp = 2;
    kvc_tier_spec_t t[2] = {spec("host:1GiB"), spec("redis://r:1,bw=50GB/s")};
    c.tiers = t;
    c.n_tiers = 2;
    kvc_plan_result_t pr;
    char err[512];
    assert_ok(kvc_plan_compute(&c.model, &c.gpu, &c.plan, &pr, err, sizeof err));
    c.planned = &pr;
    kvc_sim_result_t res;
    char *want;
    run(&c, w, &res, &want);
    assert_true(res.tiers[0].fetched_blocks + res.tiers[1].fetched_blocks > 0);
    uint64_t n_failed = 0;
    for (uint64_t n = 1;; n++) {
        kvc_failing_alloc_t st = {.fail_at = n};
        c.allocator = kvc_failing_allocator(&st);
        kvc_report_params_t rp = kvc_report_params_default();
        rp.tenant_names = kvc_workload_tenant_names(w);
        rp.n_tenants = kvc_workload_n_tenants(w);
        rp.class_names = kvc_workload_class_names(w);
        rp.n_classes = kvc_workload_n_classes(w);
        rp.allocator = c.allocator;
        kvc_report_t *r = NULL;
        int rc = kvc_report_create(&rp, &r);
        if (!rc) rc = kvc_sim_run(&c, w, r, &res, err, sizeof err);
        if (st.n_failed && rc) {
            if (rc != KVC_ENOMEM) fail_msg("allocation %llu: %s", (unsigned long long)n, err);
            if (r) assert_true(err[0] != '\0' && !strchr(err, '\n'));
            n_failed++;
        } else if (!st.n_failed) {
            assert_ok(rc);
            char *got = write_report(r, true);
            assert_string_equal(got, want);
            free(got);
        }
        kvc_report_destroy(r);
        assert_int_equal(st.n_live, 0); /* nothing leaked */
        if (!st.n_failed) break;
    }
    print_message("%llu allocations failed the run\n", (unsigned long long)n_failed);
    assert_true(n_failed > 40);
    free(want);
    kvc_workload_destroy(w);
}

static void bad_tier_configurations_are_refused(void **state)
{
    (void)state;
    kvc_workload_t *w = multiturn(10);
    kvc_tier_spec_t t[KVC_SIM_MAX_TIERS + 1];
    for (int i = 0; i <= KVC_SIM_MAX_TIERS; i++) t[i] = spec("host:1GiB");
    struct {
        const char *what, *msg;
        int tiers;
        bool no_prefix;
        const char *one;
    } cases[] = {
        {"too many", "at most", KVC_SIM_MAX_TIERS + 1, false, NULL},
        {"no prefix cache", "prefix cache", 1, true, NULL},
        {"smaller than a block", "not one block fits", 1, false, "host:1MiB"},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(cases); i++) {
        kvc_sim_config_t c = config(3000);
        if (cases[i].one) t[0] = spec(cases[i].one);
        c.tiers = t;
        c.n_tiers = (uint32_t)cases[i].tiers;
        c.prefix_caching = !cases[i].no_prefix;
        kvc_report_t *r = new_report(w);
        kvc_sim_result_t res;
        char err[256] = "";
        assert_int_equal(kvc_sim_run(&c, w, r, &res, err, sizeof err), KVC_EINVAL);
        if (!strstr(err, cases[i].msg)) fail_msg("%s: '%s'", cases[i].what, err);
        assert_null(strchr(err, '\n'));
        kvc_report_destroy(r);
        t[0] = spec("host:1GiB");
    }
    kvc_workload_destroy(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_host_tier_fetches_what_the_pool_evicted),
        cmocka_unit_test(a_tier_too_far_away_is_never_fetched_from_and_changes_nothing),
        cmocka_unit_test(break_even_follows_the_closed_form),
        cmocka_unit_test(a_redis_tier_is_shared_by_the_replicas),
        cmocka_unit_test(a_shared_tier_shows_a_block_only_after_it_was_written),
        cmocka_unit_test(a_prefix_in_flight_is_fetched_once),
        cmocka_unit_test(disk_admission_and_write_budget_refuse_writes),
        cmocka_unit_test(tiers_keep_the_invariants_at_every_step),
        cmocka_unit_test(the_report_has_a_tiers_section_and_is_deterministic),
        cmocka_unit_test(runs_with_tiers_fail_cleanly_under_allocation_faults),
        cmocka_unit_test(bad_tier_configurations_are_refused),
    };
    if (getenv("KVC_TEST_FILTER")) cmocka_set_test_filter(getenv("KVC_TEST_FILTER"));
    return cmocka_run_group_tests_name("sim_tiers", tests, NULL, NULL);
}
