/* test_sim.c - the simulator: the cost model against hand arithmetic, the
 * invariants after every simulated step under every policy, determinism
 * byte for byte, refusals, closed-loop conversations, data parallelism,
 * and the scenarios' effects in the direction they must have. */
#include "test_helpers.h"

#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static kvc_sim_config_t config(uint32_t num_blocks)
{
    kvc_sim_config_t c = kvc_sim_config_default();
    assert_ok(kvc_plan_model_preset("llama-3.1-8b", &c.model));
    assert_ok(kvc_plan_gpu_preset("h100-sxm", &c.gpu));
    c.num_blocks = num_blocks;
    return c;
}

/* Plan c's deployment once for the runs that follow (c->planned): a test that runs one
 * deployment many times pays for the planner once, not per run. */
static void plan_once(kvc_sim_config_t *c, kvc_plan_result_t **pr)
{
    *pr = malloc(sizeof **pr);
    assert_non_null(*pr);
    char msg[256];
    if (kvc_plan_compute(&c->model, &c->gpu, &c->plan, *pr, msg, sizeof msg))
        fail_msg("plan: %s", msg);
    c->planned = *pr;
}

static kvc_workload_t *load_scaled(const char *spec, size_t max_requests, double time_scale)
{
    kvc_workload_params_t wp = kvc_workload_params_default();
    wp.max_requests = max_requests;
    wp.time_scale = time_scale;
    kvc_workload_t *w = NULL;
    char err[256];
    if (kvc_workload_load(spec, &wp, &w, err, sizeof err)) fail_msg("workload %s: %s", spec, err);
    return w;
}

static kvc_workload_t *load(const char *spec, size_t max_requests)
{
    return load_scaled(spec, max_requests, 1.0);
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

static char *report_json(const kvc_report_t *r)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_ok(kvc_report_write_json(r, f));
    fclose(f);
    return buf;
}

/* Run and return the summary of a scope (tenant/class by name, or all). */
static kvc_report_summary_t run(kvc_sim_config_t *c, kvc_workload_t *w, const char *tenant,
                                const char *cls, kvc_sim_result_t *res)
{
    kvc_report_t *r = new_report(w);
    char err[256];
    int rc = kvc_sim_run(c, w, r, res, err, sizeof err);
    if (rc) fail_msg("kvc_sim_run: %s", err);
    kvc_report_summary_t s;
    kvc_report_scope_t scope = KVC_REPORT_ALL;
    uint32_t index = 0;
    const char *name = tenant ? tenant : cls;
    if (name) {
        bool is_tenant = tenant != NULL;
        uint32_t n = is_tenant ? kvc_workload_n_tenants(w) : kvc_workload_n_classes(w);
        for (index = 0; index < n; index++)
            if (!strcmp(is_tenant ? kvc_workload_tenant_name(w, index)
                                  : kvc_workload_class_name(w, index),
                        name))
                break;
        assert_true(index < n);
        scope = is_tenant ? KVC_REPORT_TENANT : KVC_REPORT_CLASS;
    }
    assert_ok(kvc_report_summary(r, scope, index, &s));
    kvc_report_destroy(r);
    return s;
}

/* ---- the cost model --------------------------------------------------------------------- */
static void the_cost_model_matches_hand_arithmetic(void **state)
{
    (void)state;
    kvc_sim_config_t c = config(0);
    kvc_plan_result_t *pr = malloc(sizeof *pr);
    char msg[256];
    assert_ok(kvc_plan_compute(&c.model, &c.gpu, &c.plan, pr, msg, sizeof msg));
    kvc_sim_cost_model_t cm;
    assert_ok(kvc_sim_cost_model(&c.model, &c.gpu, &c.plan, pr, 0.002, 8e-6, &cm));
    /* Llama-3.1-8B: per (query, key) pair, QK^T and PV over 128 dims for 32 heads in 32 layers,
     * 2 FLOPs a multiply-add: 2 x (128 + 128) x 32 x 32 = 524,288. */
    assert_true(cm.attn_flops_per_pair == 524288.0);
    /* KV per token: 2 x 32 layers x 8 heads x 128 x 2 B = 131,072 */
    assert_true(cm.kv_bytes_per_token == 131072.0);
    /* linear: 2 FLOPs per active parameter except the (untied) input embedding table */
    double linear = 2.0 * (double)(pr->counts.active - pr->counts.embedding);
    assert_true(fabs(cm.linear_flops_per_token - linear) < 1);
    assert_true(cm.n_allreduce == 0); /* TP 1 */
    /* weights read per step: 16,060,522,496 B less the input table a step only looks rows up
     * in, 128,256 x 4,096 x 2 B = 1,050,673,152: 15,009,849,344 B (15.01 GB, not 16.06) */
    assert_true(cm.dense_weight_bytes == 15009849344.0);
    /* One decode row at position 999 and one 4-token prefill chunk at 100..103:
     * pairs = 1 x 1000 + (4 x 100 + 4 x 5 / 2) = 1410; context read = 1000 + 104. */
    kvc_sched_entry_t e[2] = {{.first_pos = 999, .n_tokens = 1, .n_context = 1000},
                              {.first_pos = 100, .n_tokens = 4, .n_context = 104, .prefill = true}};
    kvc_sched_plan_t plan = {.entries = e, .n_entries = 2};
    kvc_sim_step_cost_t d;
    double t = kvc_sim_step_time(&cm, &plan, &d);
    double compute =
        5 * cm.linear_flops_per_token / cm.flops_per_s + 1410 * 524288.0 / cm.attn_flops_per_s;
    /* KV reads at the paged blocks' efficiency: 16 / (16 + 4.5) = 0.78049 at block 16 */
    assert_true(fabs(cm.kv_block_efficiency - 16 / 20.5) < 1e-15);
    double memory = (cm.dense_weight_bytes + 131072.0 * (1104 / (16 / 20.5) + 5)) / cm.bytes_per_s;
    assert_true(fabs(d.compute_s - compute) < 1e-12);
    assert_true(fabs(d.memory_s - memory) < 1e-12);
    assert_true(fabs(t - (KVC_MAX(compute, memory) + 0.002)) < 1e-12);
    assert_true(memory > compute); /* a small batch is bandwidth-bound */
    /* No KV cache: each row recomputes its whole context from position 0: the decode row 1,000
     * tokens (pairs 1000 x 1001 / 2 = 500,500), the chunk 104 (104 x 105 / 2 = 5,460): 1,104
     * tokens, 505,960 pairs, and their K/V written and read once */
    cm.no_kv_cache = true;
    kvc_sim_step_cost_t dn;
    (void)kvc_sim_step_time(&cm, &plan, &dn);
    assert_true(fabs(dn.linear_flops - 1104 * cm.linear_flops_per_token) < 1);
    assert_true(fabs(dn.attn_flops - 505960 * 524288.0) < 1);
    assert_true(fabs(dn.bytes_read - (cm.dense_weight_bytes +
                                      131072.0 * (1104 / cm.kv_block_efficiency + 1104))) < 1);
    assert_true(dn.compute_s > 100 * d.compute_s); /* the quadratic baseline */
    cm.no_kv_cache = false;
    /* swap traffic adds bytes / host link */
    plan.swap_out_bytes = 64000000000ULL;
    t = kvc_sim_step_time(&cm, &plan, &d);
    assert_true(fabs(d.swap_s - 64e9 / cm.host_link_bytes_per_s) < 1e-9);
    /* TP 2: two all-reduces per layer, ring: 2 (tp - 1) / tp x bytes / link + latency */
    c.plan.tp = 2;
    assert_ok(kvc_plan_compute(&c.model, &c.gpu, &c.plan, pr, msg, sizeof msg));
    assert_ok(kvc_sim_cost_model(&c.model, &c.gpu, &c.plan, pr, 0.002, 8e-6, &cm));
    assert_int_equal(cm.n_allreduce, 64);
    plan.swap_out_bytes = 0;
    (void)kvc_sim_step_time(&cm, &plan, &d);
    double comm = 64 * (8e-6 + 1.0 * 8192 * 5 / cm.link_bytes_per_s);
    assert_true(fabs(d.comm_s - comm) < 1e-12);
    /* MoE: the share of experts a step reads grows with its tokens */
    kvc_sim_config_t m = config(0);
    assert_ok(kvc_plan_model_preset("mixtral-8x7b", &m.model));
    m.plan.tp = 2;
    assert_ok(kvc_plan_compute(&m.model, &m.gpu, &m.plan, pr, msg, sizeof msg));
    assert_ok(kvc_sim_cost_model(&m.model, &m.gpu, &m.plan, pr, 0, 0, &cm));
    assert_true(cm.experts_per_token_share == 0.25); /* 2 of 8 */
    kvc_sched_entry_t one = {.first_pos = 0, .n_tokens = 1, .n_context = 1};
    kvc_sched_plan_t p1 = {.entries = &one, .n_entries = 1};
    (void)kvc_sim_step_time(&cm, &p1, &d);
    double b1 = d.bytes_read;
    one.n_tokens = 64;
    (void)kvc_sim_step_time(&cm, &p1, &d);
    assert_true(d.bytes_read > b1 + 0.9 * 0.75 * cm.expert_weight_bytes); /* nearly all read */
    assert_int_equal(kvc_sim_cost_model(NULL, &c.gpu, &c.plan, pr, 0, 0, &cm), KVC_EINVAL);
    /* A tied table is the LM head: multiplied every step (2 x 256,000 x 4,608 FLOP per token on
     * Gemma-2-27B) and read whole, so nothing is left out of the weights */
    kvc_sim_config_t tm = config(0);
    assert_ok(kvc_plan_model_preset("gemma-2-27b", &tm.model));
    tm.plan.tp = 2;
    assert_ok(kvc_plan_compute(&tm.model, &tm.gpu, &tm.plan, pr, msg, sizeof msg));
    assert_ok(kvc_sim_cost_model(&tm.model, &tm.gpu, &tm.plan, pr, 0, 0, &cm));
    assert_int_equal(pr->embedding_bytes_not_read, 0);
    assert_true(cm.dense_weight_bytes == (double)pr->weight_bytes_per_gpu);
    assert_true(fabs(cm.linear_flops_per_token - 2.0 * (double)pr->counts.active / 2) <
                1); /* the table counted once more */
    free(pr);
}

/* The pre-paging baseline: each request reserves max_model_len of KV.  max_model_len 1,024 at
 * block 16 is 64 blocks, so a pool of 640 blocks runs at most 10 requests; each uses at most
 * ceil((100 + 20) / 16) = 8 of its 64 blocks, so at least 1 - 8 / 64 = 87.5% of what is
 * reserved is fragmentation.  The paged pool of the same size runs far more. */
static void contiguous_allocation_reserves_max_model_len(void **state)
{
    (void)state;
    kvc_workload_t *w = load("poisson:rate=1000,n=60,prompt=100,output=20", 0);
    kvc_sim_config_t c = config(640);
    c.plan.max_model_len = 1024;
    c.plan.prompt_tokens = 100; /* the planner's typical request, within max_model_len */
    c.plan.output_tokens = 20;
    c.allocation = KVC_SIM_ALLOC_CONTIGUOUS;
    c.check_every_step = true;
    kvc_sim_result_t res;
    kvc_report_summary_t s = run(&c, w, NULL, NULL, &res);
    assert_int_equal(s.completed, 60);
    assert_int_equal(res.peak_running, 10);
    assert_int_equal(res.peak_reserved_blocks, 640);
    assert_true(res.fragmentation_peak >= 0.875 && res.fragmentation_peak < 1);
    assert_true(res.fragmentation_mean >= 0.875 && res.fragmentation_mean < 1);
    assert_true(res.hit_tokens == 0); /* no sharing between private regions */
    c.allocation = KVC_SIM_ALLOC_PAGED;
    kvc_sim_result_t paged;
    (void)run(&c, w, NULL, NULL, &paged);
    assert_true(paged.peak_running > 40);
    assert_true(paged.fragmentation_mean == 0);
    assert_true(paged.simulated_s < res.simulated_s);
    c.allocation = (kvc_sim_allocation_t)7;
    kvc_report_t *r = new_report(w);
    char err[256];
    assert_int_equal(kvc_sim_run(&c, w, r, &res, err, sizeof err), KVC_EINVAL);
    assert_non_null(strstr(err, "not paged or contiguous"));
    kvc_report_destroy(r);
    assert_string_equal(kvc_sim_allocation_name(KVC_SIM_ALLOC_CONTIGUOUS), "contiguous");
    assert_int_equal(kvc_sim_allocation_parse("paged"), KVC_SIM_ALLOC_PAGED);
    assert_int_equal(kvc_sim_allocation_parse("buddy"), -1);
    kvc_workload_destroy(w);
}

/* Without a KV cache every decode step recomputes the context: the same workload takes far
 * longer, and nothing hits. */
static void no_kv_cache_recomputes_every_step(void **state)
{
    (void)state;
    kvc_workload_t *w = load("poisson:rate=50,n=20,prompt=200,output=30", 0);
    kvc_sim_config_t c = config(2000);
    kvc_sim_result_t with, without;
    (void)run(&c, w, NULL, NULL, &with);
    c.no_kv_cache = true;
    kvc_report_summary_t s = run(&c, w, NULL, NULL, &without);
    assert_int_equal(s.completed, 20);
    assert_true(without.cost.no_kv_cache);
    assert_int_equal(without.hit_tokens, 0);
    assert_true(without.simulated_s > 2 * with.simulated_s);
    kvc_workload_destroy(w);
}

/* ---- whole runs ------------------------------------------------------------------------------ */
/* Every admission, preemption and victim policy, with and without speculation, on a pool
 * tight enough that greedy admission preempts, swaps and, under backpressure, breaks
 * deadlocks: kvc_sched_check, the token budget and the running cap after every step.  Short
 * prompts in a small pool keep each check cheap (the prefix checker walks every cached
 * block's ancestry); varied outputs make reserve-expected under-reserve and grow. */
static void every_policy_keeps_the_invariants_at_every_step(void **state)
{
    (void)state;
    kvc_workload_t *w =
        load("poisson:rate=30,n=200,prompt=100..300,output=10..150,max_output=200", 0);
    kvc_sim_config_t base = config(100);
    kvc_plan_result_t *pr;
    plan_once(&base, &pr);
    for (int adm = 0; adm < KVC_ADMIT__COUNT; adm++)
        for (int pre = 0; pre < KVC_PREEMPT__COUNT; pre++)
            for (int vic = 0; vic < KVC_VICTIM__COUNT; vic++)
                for (int spec = 0; spec < 2; spec++) {
                    kvc_sim_config_t c = base;
                    c.sched.admission = (kvc_admission_t)adm;
                    c.sched.preemption = (kvc_preemption_t)pre;
                    c.sched.victim = kvc_victim_policy((kvc_victim_t)vic);
                    c.sched.expected_output = 60;
                    c.sched.spec_tokens = spec ? 3 : 0;
                    c.check_every_step = true; /* kvc_sched_check, the budget, the running cap */
                    kvc_sim_result_t res;
                    kvc_report_summary_t s = run(&c, w, NULL, NULL, &res); /* checks every step */
                    assert_int_equal(s.completed, 200);
                    assert_int_equal(res.completed + res.rejected + res.errored, 200);
                    if (adm == KVC_ADMIT_RESERVE_MAX) assert_int_equal(res.preemptions, 0);
                    /* the pool is tight: greedy admission has to take room back */
                    if (adm == KVC_ADMIT_GREEDY) assert_true(res.preemptions > 0);
                    if (pre == KVC_PREEMPT_SWAP) assert_int_equal(res.recomputed_tokens, 0);
                    if (pre == KVC_PREEMPT_SWAP && res.preemptions)
                        assert_true(res.swapped_out_bytes > 0);
                    if (pre != KVC_PREEMPT_SWAP) assert_int_equal(res.swapped_out_bytes, 0);
                }
    free(pr);
    kvc_workload_destroy(w);
}

/* Every eviction policy keeps the invariants at every step (the prefix checker counts what
 * naive-lru strands and fails any other policy that strands), and the stranding is measured:
 * the library releases a request's blocks tail first, so a parent always returns to the free
 * queue after its children and naive-lru never meets a parent with cached children at the
 * queue's head.  It strands nothing and evicts exactly as lru does: the same report, but for
 * the policy's name.  Shared prefixes in a small pool, so that cached prefixes are hit and
 * evicted all the time. */
static void every_eviction_policy_keeps_the_invariants_and_naive_lru_strands_nothing(void **state)
{
    (void)state;
    kvc_workload_t *w = load(
        "poisson:rate=20,n=150,prompt=80..300,output=5..40,groups=6,prefix=64,fraction=0.7", 0);
    kvc_sim_config_t c = config(120);
    kvc_plan_result_t *pr;
    plan_once(&c, &pr);
    c.check_every_step = true;
    char *json[KVC_EVICT__COUNT];
    for (int ev = 0; ev < KVC_EVICT__COUNT; ev++) {
        c.eviction = (kvc_eviction_t)ev;
        kvc_report_t *r = new_report(w);
        kvc_sim_result_t res;
        char err[256];
        if (kvc_sim_run(&c, w, r, &res, err, sizeof err))
            fail_msg("%s: %s", kvc_eviction_name(c.eviction), err);
        json[ev] = report_json(r);
        kvc_report_summary_t sum;
        assert_ok(kvc_report_summary(r, KVC_REPORT_ALL, 0, &sum));
        print_message("%-9s prefix hit rate %.3f, %llu strandings, %llu stranded at the peak\n",
                      kvc_eviction_name(c.eviction), sum.prefix_hit_rate,
                      (unsigned long long)res.strandings,
                      (unsigned long long)res.peak_stranded_blocks);
        assert_true(sum.prefix_hit_rate > 0.05); /* prefixes are hit, and evicted */
        assert_int_equal(res.strandings, 0);
        assert_int_equal(res.peak_stranded_blocks, 0);
        assert_int_equal(res.end_stranded_blocks, 0);
        assert_int_equal(res.completed, 150);
        char want[64];
        snprintf(want, sizeof want, "\"eviction\": \"%s\"", kvc_eviction_name(c.eviction));
        assert_non_null(strstr(json[ev], want));
        assert_non_null(strstr(json[ev], "\"strandings\": 0"));
        kvc_report_destroy(r);
    }
    /* naive-lru and lru: the same report up to the policy's name in the config */
    const char *a = strstr(json[KVC_EVICT_LRU], "\"eviction\""),
               *b = strstr(json[KVC_EVICT_NAIVE_LRU], "\"eviction\"");
    assert_int_equal(a - json[KVC_EVICT_LRU], b - json[KVC_EVICT_NAIVE_LRU]);
    assert_memory_equal(json[KVC_EVICT_LRU], json[KVC_EVICT_NAIVE_LRU],
                        (size_t)(a - json[KVC_EVICT_LRU]));
    assert_string_equal(strchr(a, '\n'), strchr(b, '\n'));
    /* lfu and priority rank blocks otherwise: another report */
    assert_string_not_equal(json[KVC_EVICT_LRU], json[KVC_EVICT_LFU]);
    for (int ev = 0; ev < KVC_EVICT__COUNT; ev++) free(json[ev]);
    /* a policy out of range is refused */
    c.eviction = KVC_EVICT__COUNT;
    kvc_report_t *r = new_report(w);
    kvc_sim_result_t res;
    char err[256];
    assert_int_equal(kvc_sim_run(&c, w, r, &res, err, sizeof err), KVC_EINVAL);
    assert_non_null(strstr(err, "eviction policy"));
    kvc_report_destroy(r);
    free(pr);
    kvc_workload_destroy(w);
}

static char *run_json(kvc_sim_config_t *c, kvc_workload_t *w)
{
    kvc_report_t *r = new_report(w);
    kvc_sim_result_t res;
    char err[256];
    assert_ok(kvc_sim_run(c, w, r, &res, err, sizeof err));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_ok(kvc_report_write_json(r, f));
    assert_ok(kvc_report_write_csv(r, f));
    fclose(f);
    kvc_report_destroy(r);
    return buf;
}

static void same_seed_same_report_byte_for_byte(void **state)
{
    (void)state;
    kvc_workload_t *w = load(KVC_SOURCE_DIR "/examples/workloads/chat_multiturn.json", 600);
    kvc_sim_config_t c = config(2000);
    c.sched.spec_tokens = 2;
    c.closed_loop = true;
    char *a = run_json(&c, w), *b = run_json(&c, w);
    assert_string_equal(a, b);
    c.seed = 2; /* another seed: other draft acceptances and hashes, another report */
    char *d = run_json(&c, w);
    assert_string_not_equal(a, d);
    for (const char *k =
             "\"completed\"\0\"ttft_ms\"\0\"tpot_ms\"\0\"e2e_ms\"\0\"p50\"\0\"p90\"\0\"p99\"\0"
             "\"throughput_tokens_per_s\"\0\"goodput_requests_per_s\"\0\"prefix_hit_rate\"\0"
             "\"preemptions\"\0\"recomputed_tokens\"\0\"swapped_bytes\"\0\"peak_kv_blocks\"\0"
             "\"simulated_seconds\"\0\"stranded_blocks\": {\"peak\": 0, \"end\": 0}\0"
             "\"stranded_bytes\": {\"peak\": 0, \"end\": 0}\0\"strandings\": 0\0"
             "\"errored_requests\": 0\0\"eviction\": \"lru\"\0\"victim\": \"latest\"\0"
             "\"kv_bytes_per_block\": 2097152\0";
         *k; k += strlen(k) + 1)
        if (!strstr(a, k)) fail_msg("the JSON report lacks %s", k);
    free(a);
    free(b);
    free(d);
    kvc_workload_destroy(w);
}

/* A caller that planned the deployment already hands the plan over and the run uses it: the
 * same report as planning again, and a plan's pool is the pool simulated. */
static void a_plan_given_is_used_instead_of_planning_again(void **state)
{
    (void)state;
    kvc_workload_t *w = load("poisson:rate=20,n=40,prompt=300,output=20", 0);
    kvc_sim_config_t c = config(0);
    char *planned_here = run_json(&c, w);
    kvc_plan_result_t *pr;
    plan_once(&c, &pr);
    char *given = run_json(&c, w);
    assert_string_equal(given, planned_here);
    pr->num_blocks = 777; /* the pool the (caller's) plan derives */
    kvc_sim_result_t res;
    run(&c, w, NULL, NULL, &res);
    assert_int_equal(res.num_blocks, 777);
    free(planned_here);
    free(given);
    free(pr);
    kvc_workload_destroy(w);
}

static void over_long_requests_are_refused_and_counted(void **state)
{
    (void)state;
    kvc_workload_t *w = load("poisson:rate=5,n=20,prompt=2000,output=10", 0);
    kvc_sim_config_t c = config(50); /* 800 tokens: every 2,000-token prompt can never fit */
    kvc_report_t *r = new_report(w);
    kvc_sim_result_t res;
    char err[256];
    assert_ok(kvc_sim_run(&c, w, r, &res, err, sizeof err));
    assert_int_equal(res.rejected, 20);
    assert_int_equal(res.completed, 0);
    kvc_report_destroy(r);
    /* over max_model_len */
    c = config(1000);
    c.plan.max_model_len = 1024;
    c.plan.prompt_tokens = 500; /* the planner's typical request must fit max_model_len too */
    c.plan.output_tokens = 100;
    r = new_report(w);
    assert_ok(kvc_sim_run(&c, w, r, &res, err, sizeof err));
    assert_int_equal(res.rejected, 20);
    kvc_report_destroy(r);
    /* a deployment that does not start, and no pool given: a clear error */
    c = config(0);
    assert_ok(kvc_plan_model_preset("llama-3.1-70b", &c.model));
    c.plan.tp = 2;
    r = new_report(w);
    assert_int_equal(kvc_sim_run(&c, w, r, &res, err, sizeof err), KVC_EINVAL);
    assert_non_null(strstr(err, "does not start"));
    kvc_report_destroy(r);
    kvc_workload_destroy(w);
}

static void closed_loop_turns_wait_for_the_previous_turn(void **state)
{
    (void)state;
    kvc_workload_t *w = load(KVC_SOURCE_DIR "/examples/workloads/chat_multiturn.json", 300);
    kvc_sim_config_t c = config(3000);
    c.closed_loop = true;
    kvc_sim_result_t open_res, closed_res;
    kvc_report_summary_t closed = run(&c, w, NULL, NULL, &closed_res);
    c.closed_loop = false;
    kvc_report_summary_t open = run(&c, w, NULL, NULL, &open_res);
    assert_int_equal(closed.completed, open.completed);
    /* a turn that waits for its predecessor starts later: the run lasts longer */
    assert_true(closed_res.simulated_s > open_res.simulated_s);
    kvc_workload_destroy(w);
}

static void data_parallel_replicas_split_the_work(void **state)
{
    (void)state;
    kvc_workload_t *w = load("poisson:rate=40,n=600,prompt=500,output=100", 0);
    kvc_sim_config_t c = config(2000);
    kvc_sim_result_t r1, r2;
    kvc_report_summary_t one = run(&c, w, NULL, NULL, &r1);
    c.plan.dp = 2;
    kvc_report_summary_t two = run(&c, w, NULL, NULL, &r2);
    assert_int_equal(one.completed, 600);
    assert_int_equal(two.completed, 600);
    assert_int_equal(r2.n_replicas, 2);
    assert_true(two.e2e_ms.p50 < one.e2e_ms.p50); /* half the load per replica */
    kvc_workload_destroy(w);
}

/* ---- the scenarios' effects, on smaller runs ----------------------------------------------------
 * Where a scenario's requests are tens of thousands of tokens long, the test runs its pool in
 * 256-token blocks (as many tokens, a sixteenth of the blocks): every run ends with the
 * checker, which walks each cached block's ancestry, so a 200K-token prompt in 16-token
 * blocks (12,500 deep) made that one check most of the test's time (34 of 41 s for the long
 * request cap).  The effects are the same at either size (the scheduler counts blocks of
 * whatever size; the shares and caps are fractions of the pool). */
static void reserve_for_max_output_admits_fewer_than_greedy(void **state)
{
    (void)state;
    kvc_workload_t *w = load(KVC_SOURCE_DIR "/examples/scenarios/reserve.workload.json", 600);
    kvc_sim_config_t c = config(2000);
    kvc_sim_result_t g, m;
    kvc_report_summary_t sg = run(&c, w, NULL, NULL, &g);
    c.sched.admission = KVC_ADMIT_RESERVE_MAX;
    kvc_report_summary_t sm = run(&c, w, NULL, NULL, &m);
    assert_true(m.peak_running < g.peak_running);
    assert_int_equal(m.preemptions, 0); /* a started request never waits */
    assert_true(sm.throughput_tokens_per_s < sg.throughput_tokens_per_s);
    kvc_workload_destroy(w);
}

static void swap_moves_bytes_where_recompute_redoes_work(void **state)
{
    (void)state;
    kvc_workload_t *w = load(KVC_SOURCE_DIR "/examples/scenarios/victim.workload.json", 300);
    kvc_sim_config_t c = config(1100);
    kvc_sim_result_t rec, swp;
    run(&c, w, NULL, NULL, &rec);
    c.sched.preemption = KVC_PREEMPT_SWAP;
    run(&c, w, NULL, NULL, &swp);
    assert_true(rec.preemptions > 0 && swp.preemptions > 0);
    assert_true(rec.recomputed_tokens > 0 && rec.swapped_out_bytes == 0);
    assert_true(swp.recomputed_tokens == 0 && swp.swapped_out_bytes > 0);
    kvc_workload_destroy(w);
}

static void a_batch_kv_cap_protects_interactive_tokens(void **state)
{
    (void)state;
    kvc_workload_t *w = load(KVC_SOURCE_DIR "/examples/workloads/interactive_and_batch.json", 1500);
    kvc_sim_config_t c = config(375); /* the scenario's 6,000 blocks of 16 tokens (see below) */
    c.plan.block_size = 256;
    kvc_sim_result_t a, b;
    kvc_report_summary_t free_ = run(&c, w, NULL, "interactive", &a);
    c.sched.class_kv_cap[1] = 0.3;
    kvc_report_summary_t capped = run(&c, w, NULL, "interactive", &b);
    assert_true(capped.tpot_ms.p50 < free_.tpot_ms.p50);
    kvc_workload_destroy(w);
}

static void kv_quotas_protect_a_tenant_where_count_limits_do_not(void **state)
{
    (void)state;
    kvc_workload_t *w = load(KVC_SOURCE_DIR "/examples/scenarios/tenant_quota.workload.json", 500);
    kvc_sim_config_t c = config(1000); /* the scenario's 16,000 blocks of 16 tokens (see below) */
    c.plan.block_size = 256;
    kvc_sim_result_t r;
    c.sched.tenant_max_running = 2;
    kvc_report_summary_t count = run(&c, w, "web", NULL, &r);
    c.sched.tenant_max_running = 0;
    c.sched.tenant_kv_share = 0.55;
    kvc_report_summary_t quota = run(&c, w, "web", NULL, &r);
    assert_true(quota.ttft_ms.p50 < count.ttft_ms.p50 / 10);
    kvc_workload_destroy(w);
}

static void a_long_request_cap_protects_regular_traffic(void **state)
{
    (void)state;
    kvc_workload_t *w = load(KVC_SOURCE_DIR "/examples/scenarios/long_cap.workload.json", 0);
    kvc_sim_config_t c = config(0);
    char msg[256];
    assert_ok(kvc_plan_model_load(KVC_SOURCE_DIR "/examples/scenarios/llama-3-8b-262k.config.json",
                                  &c.model, msg, sizeof msg));
    c.plan.block_size = 256; /* the pool the planner derives, in 256-token blocks (see below) */
    kvc_sim_result_t a, b;
    kvc_report_summary_t free_ = run(&c, w, "regular", NULL, &a);
    c.sched.long_threshold = 32768;
    c.sched.long_kv_cap = 0.5;
    kvc_report_summary_t capped = run(&c, w, "regular", NULL, &b);
    assert_true(capped.ttft_ms.p50 < free_.ttft_ms.p50 / 4);
    assert_int_equal(b.rejected, 0);
    kvc_workload_destroy(w);
}

static void prefix_caching_hits_the_conversation_history(void **state)
{
    (void)state;
    kvc_workload_t *w = load(KVC_SOURCE_DIR "/examples/workloads/chat_multiturn.json", 800);
    kvc_sim_config_t c = config(8000);
    c.closed_loop = true;
    kvc_sim_result_t a, b;
    kvc_report_summary_t on = run(&c, w, NULL, NULL, &a);
    c.prefix_caching = false;
    kvc_report_summary_t off = run(&c, w, NULL, NULL, &b);
    assert_true(on.prefix_hit_rate > 0.3);
    assert_true(off.prefix_hit_rate == 0);
    assert_true(on.ttft_ms.p50 < off.ttft_ms.p50);
    kvc_workload_destroy(w);
}

static void a_bigger_pool_hits_more_of_the_mooncake_trace(void **state)
{
    (void)state;
    /* arrivals stretched 3x, so that one replica keeps up (as in examples/scenarios/mooncake.json)
     */
    kvc_workload_t *w =
        load_scaled(KVC_DATA_DIR "/traces/mooncake_synthetic_trace.jsonl", 1200, 3.0);
    kvc_sim_config_t c = config(0);
    char msg[256];
    assert_ok(kvc_plan_model_load(KVC_SOURCE_DIR "/examples/scenarios/llama-3-8b-262k.config.json",
                                  &c.model, msg, sizeof msg));
    /* 13,000 to 104,000 blocks of 16 tokens, in 256-token blocks (the trace's 512-token hash
     * blocks are whole blocks either way) */
    c.plan.block_size = 256;
    kvc_plan_result_t *pr;
    plan_once(&c, &pr);
    double prev = -1, first = -1;
    for (uint32_t nb = 13000 / 16; nb <= 104000 / 16; nb *= 2) {
        c.num_blocks = nb;
        kvc_sim_result_t r;
        kvc_report_summary_t s = run(&c, w, NULL, NULL, &r);
        print_message("mooncake, %u blocks: prefix hit rate %.3f\n", nb, s.prefix_hit_rate);
        assert_true(s.prefix_hit_rate >= prev);
        prev = s.prefix_hit_rate;
        if (first < 0) first = prev;
    }
    assert_true(prev > 2 * first && prev > 0.02);
    free(pr);
    kvc_workload_destroy(w);
}

/* ---- allocation: the caller's allocator, faults, the memory limit ------------------------------
 */
/* An allocator that refuses any allocation over `max_bytes` and remembers the largest it saw. */
typedef struct {
    size_t max_bytes, largest;
    uint64_t n_live;
} sized_alloc_t;

static void *sized_alloc(void *ctx, size_t bytes, size_t align)
{
    sized_alloc_t *a = ctx;
    a->largest = KVC_MAX(a->largest, bytes);
    if (bytes > a->max_bytes) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes ? bytes : 1))
        return NULL;
    a->n_live++;
    return p;
}

static void sized_free(void *ctx, void *p)
{
    sized_alloc_t *a = ctx;
    if (!p) return;
    a->n_live--;
    free(p);
}

static kvc_report_t *new_report_with(const kvc_workload_t *w, kvc_allocator_t a)
{
    kvc_report_params_t rp = kvc_report_params_default();
    rp.tenant_names = kvc_workload_tenant_names(w);
    rp.n_tenants = kvc_workload_n_tenants(w);
    rp.class_names = kvc_workload_class_names(w);
    rp.n_classes = kvc_workload_n_classes(w);
    rp.allocator = a;
    kvc_report_t *r = NULL;
    int rc = kvc_report_create(&rp, &r);
    return rc ? NULL : r;
}

/* Fail allocation 1, 2, 3, ... of a whole run (its report included).  Each run either fails
 * with KVC_ENOMEM and a one-line message, or goes on and accounts for every request: the
 * scheduler lets a request whose sequence cannot be made now wait and retry, and ends one
 * whose sequence cannot take a step's results with KVC_ENOMEM, which the run counts as an
 * errored request (sched.h, sim.h).  Either way it frees everything, and the scheduler's
 * state passes its checker where the failure left it (the engine checks it on every failed
 * allocation) and at the end of each replica.  The run that fails nothing gives the reference
 * report.  Returns the number of runs that went on with errored requests. */
static uint64_t fault_every_allocation_of_a_run(kvc_sim_config_t c, const kvc_workload_t *w)
{
    kvc_plan_result_t *pr;
    plan_once(&c, &pr); /* hundreds of runs of one deployment */
    kvc_report_t *ref = new_report(w);
    kvc_sim_result_t res;
    char err[512];
    if (kvc_sim_run(&c, w, ref, &res, err, sizeof err)) fail_msg("reference run: %s", err);
    char *want = report_json(ref);
    kvc_report_destroy(ref);
    uint64_t n_failed = 0, n_absorbed = 0, n_errored = 0;
    for (uint64_t n = 1;; n++) {
        kvc_failing_alloc_t st = {.fail_at = n};
        c.allocator = kvc_failing_allocator(&st);
        kvc_report_t *r = new_report_with(w, c.allocator);
        int rc = r ? kvc_sim_run(&c, w, r, &res, err, sizeof err) : KVC_ENOMEM;
        if (st.n_failed && rc == 0) { /* retried or errored: every request accounted for */
            if (res.completed + res.rejected + res.errored != kvc_workload_size(w))
                fail_msg("allocation %llu failed: %llu of %zu requests accounted for",
                         (unsigned long long)n,
                         (unsigned long long)(res.completed + res.rejected + res.errored),
                         kvc_workload_size(w));
            char *got = report_json(r), want_err[64];
            snprintf(want_err, sizeof want_err, "\"errored_requests\": %llu",
                     (unsigned long long)res.errored);
            if (!strstr(got, want_err)) fail_msg("the report does not say %s", want_err);
            free(got);
            n_absorbed++;
            n_errored += res.errored > 0;
        } else if (st.n_failed) {
            if (rc != KVC_ENOMEM)
                fail_msg("allocation %llu failed: %s (%s)", (unsigned long long)n, kvc_errname(rc),
                         r ? err : "report");
            if (r) assert_true(err[0] != '\0' && !strchr(err, '\n'));
            n_failed++;
        } else {
            assert_ok(rc);
            char *got = report_json(r);
            assert_string_equal(got, want); /* counting changed nothing */
            free(got);
        }
        kvc_report_destroy(r);
        assert_int_equal(st.n_live, 0); /* nothing leaked */
        if (!st.n_failed) break;
    }
    print_message("%llu allocations failed the run, %llu did not (%llu of them left errored "
                  "requests)\n",
                  (unsigned long long)n_failed, (unsigned long long)n_absorbed,
                  (unsigned long long)n_errored);
    assert_true(n_failed > 40); /* the pool, prefix cache, sequences, scheduler, tables */
    free(want);
    free(pr);
    return n_errored;
}

static void runs_fail_cleanly_under_allocation_faults(void **state)
{
    (void)state;
    /* preemptions (a tight pool), speculation, closed-loop conversations on two replicas */
    kvc_workload_t *w = load(KVC_SOURCE_DIR "/examples/workloads/chat_multiturn.json", 12);
    kvc_sim_config_t c = config(60);
    c.sched.spec_tokens = 2;
    c.closed_loop = true;
    c.plan.dp = 2;
    uint64_t n_errored = fault_every_allocation_of_a_run(c, w);
    kvc_workload_destroy(w);
    /* a Mooncake trace with tokens on demand (the engine assembles its prompts), shared
     * prefixes, and swapping in a tight pool */
    char trace[4096] = "";
    for (int i = 0; i < 12; i++) {
        char line[160];
        snprintf(line, sizeof line,
                 "{\"timestamp\": %d, \"input_length\": %d, \"output_length\": %d, "
                 "\"hash_ids\": [1, %d, %d]}\n",
                 40 * i, 34 + i, 3 + i % 5, 2 + i % 3, 10 + i);
        strcat(trace, line);
    }
    kvc_workload_params_t wp = kvc_workload_params_default();
    wp.tokens_on_demand = true;
    wp.block_tokens = 16;
    char msg[256];
    assert_ok(kvc_workload_load_buffer(trace, strlen(trace), "trace", &wp, &w, msg, sizeof msg));
    c = config(30);
    c.sched.preemption = KVC_PREEMPT_SWAP;
    n_errored += fault_every_allocation_of_a_run(c, w);
    kvc_workload_destroy(w);
    /* outputs that outgrow what a sequence holds for its tokens (20 of a prompt: room for 32),
     * so that appending a sampled token allocates: when that fails, the scheduler ends the
     * request with KVC_ENOMEM; the run counts it and goes on */
    w = load("poisson:rate=50,n=6,prompt=20,output=50", 0);
    c = config(40);
    n_errored += fault_every_allocation_of_a_run(c, w);
    kvc_workload_destroy(w);
    assert_true(n_errored > 0);
}

static void the_engine_allocates_through_the_callers_allocator(void **state)
{
    (void)state;
    kvc_workload_t *w = load("poisson:rate=20,n=20,prompt=100,output=5", 0);
    /* 200,000 blocks: the pool's table alone is megabytes, and so is the prefix cache's */
    for (int prefix = 0; prefix < 2; prefix++) {
        kvc_sim_config_t c = config(200000);
        c.prefix_caching = prefix;
        sized_alloc_t sa = {.max_bytes = 1 << 20};
        c.allocator = (kvc_allocator_t){.alloc = sized_alloc, .free = sized_free, .ctx = &sa};
        kvc_report_t *r = new_report(w);
        kvc_sim_result_t res;
        char err[512];
        assert_int_equal(kvc_sim_run(&c, w, r, &res, err, sizeof err), KVC_ENOMEM);
        assert_true(sa.largest > (1 << 20)); /* it asked the caller's allocator for them */
        assert_int_equal(sa.n_live, 0);
        kvc_report_destroy(r);
        sa = (sized_alloc_t){.max_bytes = SIZE_MAX};
        r = new_report(w);
        assert_ok(kvc_sim_run(&c, w, r, &res, err, sizeof err));
        assert_true(res.peak_bytes > 200000u * 16); /* at least 16 bytes of metadata per block */
        assert_int_equal(sa.n_live, 0);
        kvc_report_destroy(r);
    }
    kvc_workload_destroy(w);
}

/* An allocator outside the C library's heap (each block its own mapping), so that what the
 * heap holds during a run is what bypassed the caller's allocator. */
static void *map_alloc(void *ctx, size_t bytes, size_t align)
{
    (void)align; /* <= 4096: a page */
    size_t *live = ctx, total = bytes + 4096;
    unsigned char *p =
        mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    memcpy(p, &total, sizeof total);
    *live += total;
    return p + 4096;
}

static void map_free(void *ctx, void *q)
{
    if (!q) return;
    size_t *live = ctx, total;
    unsigned char *p = (unsigned char *)q - 4096;
    memcpy(&total, p, sizeof total);
    *live -= total;
    munmap(p, total);
}

typedef struct {
    size_t heap0, heap_max, mapped_max;
    const size_t *mapped;
} heap_watch_t;

static size_t heap_bytes(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static void watch_heap(void *ctx, uint64_t done, uint64_t total)
{
    (void)done, (void)total;
    heap_watch_t *hw = ctx; /* called while the replica's engine is up */
    size_t h = heap_bytes();
    hw->heap_max = KVC_MAX(hw->heap_max, h > hw->heap0 ? h - hw->heap0 : 0);
    hw->mapped_max = KVC_MAX(hw->mapped_max, *hw->mapped);
}

static void nothing_bypasses_the_callers_allocator(void **state)
{
    (void)state;
    if (KVC_TEST_SANITIZED) skip(); /* the sanitizer's allocator keeps no mallinfo */
    /* every table is sizable: the engine's (100,000 blocks), the scheduler's (3,000 requests) */
    kvc_workload_t *w = load("poisson:rate=3000,n=3000,prompt=40,output=4", 0);
    size_t mapped = 0;
    heap_watch_t hw = {.mapped = &mapped};
    kvc_sim_config_t c = config(100000);
    c.allocator = (kvc_allocator_t){.alloc = map_alloc, .free = map_free, .ctx = &mapped};
    kvc_report_t *r = new_report_with(w, c.allocator);
    c.progress = watch_heap;
    c.progress_ctx = &hw;
    kvc_sim_result_t res;
    char err[512];
    hw.heap0 = heap_bytes();
    assert_ok(kvc_sim_run(&c, w, r, &res, err, sizeof err));
    print_message("through the allocator %zu bytes, around it %zu\n", hw.mapped_max, hw.heap_max);
    assert_true(hw.mapped_max > 100000u * 16);
    assert_true(hw.heap_max < 64u << 10); /* stdio's buffers, no more */
    kvc_report_destroy(r);
    assert_int_equal(mapped, 0);
    kvc_workload_destroy(w);
}

static void replicas_that_receive_no_request_cost_nothing(void **state)
{
    (void)state;
    kvc_workload_t *w = load(KVC_SOURCE_DIR "/examples/workloads/chat_multiturn.json", 50);
    uint64_t allocs[2];
    char *json[2];
    const uint32_t dp[2] = {50, 5000}; /* request i goes to replica i mod dp: 50 replicas run */
    for (int i = 0; i < 2; i++) {
        kvc_sim_config_t c = config(2000);
        c.plan.dp = dp[i];
        c.closed_loop = true;
        kvc_failing_alloc_t st = {0}; /* counts, never fails */
        c.allocator = kvc_failing_allocator(&st);
        kvc_report_t *r = new_report(w);
        kvc_sim_result_t res;
        char err[512];
        if (kvc_sim_run(&c, w, r, &res, err, sizeof err)) fail_msg("dp %u: %s", dp[i], err);
        assert_int_equal(res.n_replicas, dp[i]);
        assert_int_equal(res.completed + res.rejected, 50);
        allocs[i] = st.n_allocs;
        json[i] = report_json(r);
        kvc_report_destroy(r);
    }
    assert_int_equal(allocs[0], allocs[1]); /* the 4,950 idle replicas allocated nothing */
    /* the same report but for the replica count */
    char *a = strstr(json[0], "\"replicas\""), *b = strstr(json[1], "\"replicas\"");
    assert_non_null(a);
    assert_non_null(b);
    assert_memory_equal(json[0], json[1], (size_t)(a - json[0]));
    free(json[0]);
    free(json[1]);
    kvc_workload_destroy(w);
}

static void a_run_that_cannot_fit_is_refused_before_it_allocates(void **state)
{
    (void)state;
    /* 1e8 blocks: gigabytes of metadata; 500 requests could use some 17,000 of them */
    kvc_workload_t *w = load("poisson:rate=20,n=500,prompt=500,output=50", 0);
    kvc_sim_config_t c = config(100000000);
    c.max_memory_bytes = 64u << 20;
    sized_alloc_t sa = {.max_bytes = SIZE_MAX};
    c.allocator = (kvc_allocator_t){.alloc = sized_alloc, .free = sized_free, .ctx = &sa};
    kvc_report_t *r = new_report(w);
    kvc_sim_result_t res;
    char err[512];
    assert_int_equal(kvc_sim_run(&c, w, r, &res, err, sizeof err), KVC_ENOMEM);
    print_message("%s\n", err);
    assert_non_null(strstr(err, "would need about"));
    assert_non_null(strstr(err, "100000000 KV blocks"));
    assert_non_null(strstr(err, "more than the limit of 64.0 MiB"));
    assert_true(sa.largest < (4u << 20)); /* only the small probe was built */
    assert_int_equal(sa.n_live, 0);
    kvc_report_destroy(r);
    /* a limit passed while the run measures what it needs: the allocation fails, cleanly */
    kvc_workload_stats_t ws;
    assert_ok(kvc_workload_stats(w, &ws));
    c = config(2000);
    c.max_memory_bytes = ws.bytes + (64u << 10); /* 64 KiB besides the workload */
    kvc_failing_alloc_t st = {0};
    c.allocator = kvc_failing_allocator(&st);
    r = new_report(w);
    assert_int_equal(kvc_sim_run(&c, w, r, &res, err, sizeof err), KVC_ENOMEM);
    print_message("%s\n", err);
    assert_non_null(strstr(err, "needs more memory than the limit of"));
    assert_int_equal(st.n_live, 0);
    kvc_report_destroy(r);
    /* without a limit given, the machine's memory bounds it: 2^30 blocks are refused where their
     * metadata is written up front; tables written only as blocks are used may fit */
    if (!KVC_TEST_SANITIZED) { /* the sanitizer's allocator aborts where malloc returns NULL */
        c = config(1u << 30);
        r = new_report(w);
        int rc = kvc_sim_run(&c, w, r, &res, err, sizeof err);
        print_message("2^30 blocks: %s\n", rc ? err : "ran");
        if (rc) assert_int_equal(rc, KVC_ENOMEM);
        kvc_report_destroy(r);
    }
    kvc_workload_destroy(w);
}

static void a_model_with_no_kv_bytes_is_refused(void **state)
{
    (void)state;
    kvc_sim_config_t c = config(0);
    kvc_plan_result_t *pr = malloc(sizeof *pr);
    char msg[256];
    assert_ok(kvc_plan_compute(&c.model, &c.gpu, &c.plan, pr, msg, sizeof msg));
    kvc_sim_cost_model_t cm;
    assert_ok(kvc_sim_cost_model(&c.model, &c.gpu, &c.plan, pr, 0.002, 8e-6, &cm));
    /* what an overflowing config could hand over: KV bytes per token wrapped to 0, or NaN rates */
    kvc_plan_result_t bad = *pr;
    bad.kv_bytes_per_token_per_gpu = 0;
    assert_int_equal(kvc_sim_cost_model(&c.model, &c.gpu, &c.plan, &bad, 0.002, 8e-6, &cm),
                     KVC_EINVAL);
    bad = *pr;
    bad.peak_flops = NAN;
    assert_int_equal(kvc_sim_cost_model(&c.model, &c.gpu, &c.plan, &bad, 0.002, 8e-6, &cm),
                     KVC_EINVAL);
    bad = *pr;
    bad.layers_per_gpu = UINT32_MAX; /* 2 all-reduces per layer would wrap */
    c.plan.tp = 2;
    assert_int_equal(kvc_sim_cost_model(&c.model, &c.gpu, &c.plan, &bad, 0.002, 8e-6, &cm),
                     KVC_EINVAL);
    assert_int_equal(kvc_sim_cost_model(&c.model, &c.gpu, &c.plan, pr, NAN, 8e-6, &cm), KVC_EINVAL);
    free(pr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_cost_model_matches_hand_arithmetic),
        cmocka_unit_test(every_policy_keeps_the_invariants_at_every_step),
        cmocka_unit_test(contiguous_allocation_reserves_max_model_len),
        cmocka_unit_test(no_kv_cache_recomputes_every_step),
        cmocka_unit_test(every_eviction_policy_keeps_the_invariants_and_naive_lru_strands_nothing),
        cmocka_unit_test(same_seed_same_report_byte_for_byte),
        cmocka_unit_test(a_plan_given_is_used_instead_of_planning_again),
        cmocka_unit_test(over_long_requests_are_refused_and_counted),
        cmocka_unit_test(closed_loop_turns_wait_for_the_previous_turn),
        cmocka_unit_test(data_parallel_replicas_split_the_work),
        cmocka_unit_test(reserve_for_max_output_admits_fewer_than_greedy),
        cmocka_unit_test(swap_moves_bytes_where_recompute_redoes_work),
        cmocka_unit_test(a_batch_kv_cap_protects_interactive_tokens),
        cmocka_unit_test(kv_quotas_protect_a_tenant_where_count_limits_do_not),
        cmocka_unit_test(a_long_request_cap_protects_regular_traffic),
        cmocka_unit_test(prefix_caching_hits_the_conversation_history),
        cmocka_unit_test(a_bigger_pool_hits_more_of_the_mooncake_trace),
        cmocka_unit_test(runs_fail_cleanly_under_allocation_faults),
        cmocka_unit_test(the_engine_allocates_through_the_callers_allocator),
        cmocka_unit_test(nothing_bypasses_the_callers_allocator),
        cmocka_unit_test(replicas_that_receive_no_request_cost_nothing),
        cmocka_unit_test(a_run_that_cannot_fit_is_refused_before_it_allocates),
        cmocka_unit_test(a_model_with_no_kv_bytes_is_refused),
    };
    if (getenv("KVC_TEST_FILTER")) cmocka_set_test_filter(getenv("KVC_TEST_FILTER"));
    return cmocka_run_group_tests_name("sim", tests, NULL, NULL);
}
