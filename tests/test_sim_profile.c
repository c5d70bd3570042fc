/* test_sim_profile.c - the simulator's measured hardware profile (kvc_sim_profile_*): bad
 * files are refused with one line naming what is wrong; the interpolation matches hand
 * arithmetic inside the grid, on its points and beyond its edges; the cost model takes the
 * profile's time for a plan's tokens and mean context instead of the roofline's; the optional
 * fixed costs (per request, per step) load from new profiles, default to 0 in old ones, and
 * add exactly themselves in a simulated run. */
#include "test_helpers.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static kvc_sim_profile_t *parse_ok(const char *json)
{
    kvc_sim_profile_t *p = NULL;
    char err[256] = "";
    int rc = kvc_sim_profile_parse(json, strlen(json), "p.json", &p, err, sizeof err);
    if (rc) fail_msg("parse: %s", err);
    return p;
}

/* 2 x 3 grid: step_ms = 1 + 0.5 T + 0.01 T K at T in {1, 9}, K in {0, 100, 300}. */
static const char *GRID = "{\"kvcache_profile\": 1, \"machine\": \"test\", \"tokens\": [1, 9], "
                          "\"context\": [0, 100, 300], "
                          "\"step_ms\": [[1.5, 2.5, 4.5], [5.5, 14.5, 32.5]]}";

static double truth_ms(double t, double k)
{
    return 1 + 0.5 * t + 0.01 * t * k;
}

static void interpolation_matches_hand_arithmetic(void **state)
{
    (void)state;
    kvc_sim_profile_t *p = parse_ok(GRID);
    /* on the grid's points */
    assert_true(fabs(kvc_sim_profile_step_s(p, 1, 0) - 1.5e-3) < 1e-12);
    assert_true(fabs(kvc_sim_profile_step_s(p, 9, 300) - 32.5e-3) < 1e-12);
    /* inside: T = 5 is halfway, K = 200 halfway between 100 and 300:
     * rows at T=1: 2.5 + 0.5 * (4.5 - 2.5) = 3.5; at T=9: 14.5 + 0.5 * 18 = 23.5;
     * halfway: 13.5 ms, which is also 1 + 2.5 + 0.01 * 5 * 200 */
    assert_true(fabs(kvc_sim_profile_step_s(p, 5, 200) - 13.5e-3) < 1e-12);
    assert_true(fabs(truth_ms(5, 200) - 13.5) < 1e-12);
    /* a + bT + cTK is bilinear, so any point inside is exact */
    const double pts[][2] = {{2, 37}, {7.5, 250}, {3, 100}, {8.9, 1}};
    for (size_t i = 0; i < KVC_ARRAY_LEN(pts); i++)
        assert_true(fabs(kvc_sim_profile_step_s(p, pts[i][0], pts[i][1]) * 1e3 -
                         truth_ms(pts[i][0], pts[i][1])) < 1e-9);
    /* beyond the edges the edge segments extend: T = 17 (one more T step), K = 500 */
    assert_true(fabs(kvc_sim_profile_step_s(p, 17, 500) * 1e3 - truth_ms(17, 500)) < 1e-9);
    /* never negative */
    kvc_sim_profile_destroy(p);
    p = parse_ok("{\"kvcache_profile\": 1, \"tokens\": [10, 20], \"context\": [5],"
                 " \"step_ms\": [[1], [10]]}");
    assert_true(kvc_sim_profile_step_s(p, 1, 5) == 0);                      /* 1 - 0.9 * 9 < 0 */
    assert_true(fabs(kvc_sim_profile_step_s(p, 15, 999) - 5.5e-3) < 1e-12); /* one context */
    kvc_sim_profile_destroy(p);
    /* a single point: constant */
    p = parse_ok("{\"kvcache_profile\": 1, \"tokens\": [4], \"context\": [0],"
                 " \"step_ms\": [[2]]}");
    assert_true(fabs(kvc_sim_profile_step_s(p, 100, 1000) - 2e-3) < 1e-12);
    kvc_sim_profile_destroy(p);
}

static void bad_profiles_get_one_line(void **state)
{
    (void)state;
    const struct {
        const char *json, *want;
    } bad[] = {
        {"", "not a JSON object"},
        {"[1, 2]", "not a JSON object"},
        {"{\"tokens\": [1], \"context\": [0], \"step_ms\": [[1]]}", "not a kvcache profile"},
        {"{\"kvcache_profile\": 2, \"tokens\": [1], \"context\": [0], \"step_ms\": [[1]]}",
         "not a kvcache profile"},
        {"{\"kvcache_profile\": 1, \"context\": [0], \"step_ms\": [[1]]}", "\"tokens\" must be"},
        {"{\"kvcache_profile\": 1, \"tokens\": [], \"context\": [0], \"step_ms\": []}",
         "\"tokens\" has 0 values"},
        {"{\"kvcache_profile\": 1, \"tokens\": [0], \"context\": [0], \"step_ms\": [[1]]}",
         "\"tokens\"[0] must be a number >= 1"},
        {"{\"kvcache_profile\": 1, \"tokens\": [2, 2], \"context\": [0], \"step_ms\": [[1],[1]]}",
         "\"tokens\" must increase"},
        {"{\"kvcache_profile\": 1, \"tokens\": [1], \"context\": [-1], \"step_ms\": [[1]]}",
         "\"context\"[0] must be a number >= 0"},
        {"{\"kvcache_profile\": 1, \"tokens\": [1], \"context\": [\"x\"], \"step_ms\": [[1]]}",
         "\"context\"[0] must be a number"},
        {"{\"kvcache_profile\": 1, \"tokens\": [1, 2], \"context\": [0], \"step_ms\": [[1]]}",
         "\"step_ms\" must be an array of 2 rows"},
        {"{\"kvcache_profile\": 1, \"tokens\": [1], \"context\": [0, 5], \"step_ms\": [[1]]}",
         "\"step_ms\"[0] must be an array of 2 numbers"},
        {"{\"kvcache_profile\": 1, \"tokens\": [1], \"context\": [0], \"step_ms\": [[0]]}",
         "\"step_ms\"[0][0] must be a positive number"},
        {"{\"kvcache_profile\": 1, \"tokens\": [1], \"context\": [0], \"step_ms\": [[\"1\"]]}",
         "\"step_ms\"[0][0] must be a positive number"},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad); i++) {
        kvc_sim_profile_t *p = (kvc_sim_profile_t *)&p;
        char err[256] = "";
        int rc =
            kvc_sim_profile_parse(bad[i].json, strlen(bad[i].json), "p.json", &p, err, sizeof err);
        if (rc != KVC_EPARSE) fail_msg("'%s': %d", bad[i].json, rc);
        assert_null(p);
        if (!strstr(err, bad[i].want) || !strstr(err, "p.json") || strchr(err, '\n'))
            fail_msg("'%s': message '%s', want '%s'", bad[i].json, err, bad[i].want);
    }
    /* 257 tokens values: over the limit */
    char big[4096];
    int o = snprintf(big, sizeof big, "{\"kvcache_profile\": 1, \"tokens\": [");
    for (int i = 1; i <= KVC_SIM_PROFILE_MAX_POINTS + 1; i++)
        o += snprintf(big + o, sizeof big - (size_t)o, "%s%d", i > 1 ? "," : "", i);
    snprintf(big + o, sizeof big - (size_t)o, "], \"context\": [0], \"step_ms\": []}");
    kvc_sim_profile_t *p;
    char err[256];
    assert_int_equal(kvc_sim_profile_parse(big, strlen(big), "b", &p, err, sizeof err), KVC_EPARSE);
    assert_non_null(strstr(err, "has 257 values"));
    /* files */
    assert_int_equal(kvc_sim_profile_load("/nonexistent/p.json", &p, err, sizeof err), KVC_EIO);
    assert_null(p);
    assert_non_null(strstr(err, "cannot open"));
    assert_int_equal(
        kvc_sim_profile_load(KVC_SOURCE_DIR "/tests/test_sim_profile.c", &p, err, sizeof err),
        KVC_EPARSE);
    assert_int_equal(kvc_sim_profile_parse(NULL, 0, "x", &p, err, sizeof err), KVC_EINVAL);
    assert_int_equal(kvc_sim_profile_parse("{}", 2, "x", NULL, err, sizeof err), KVC_EINVAL);
    kvc_sim_profile_destroy(NULL);
}

/* The cost model with a profile: a plan of one 8-token prefill at position 0 (pairs 36, mean
 * context 4.5) and one decode at position 99 (100 keys): 9 tokens, mean (36 + 100) / 9, plus
 * the overhead; the roofline's own terms play no part. */
static void the_cost_model_takes_the_profiles_time(void **state)
{
    (void)state;
    kvc_sim_profile_t *p = parse_ok(GRID);
    kvc_sim_cost_model_t cm = {.flops_per_s = 1,
                               .attn_flops_per_s = 1,
                               .bytes_per_s = 1,
                               .dense_weight_bytes = 1e12,
                               .host_link_bytes_per_s = 1e9,
                               .kv_bytes_per_token = 1,
                               .kv_block_efficiency = 1,
                               .tp = 1,
                               .pp = 1,
                               .step_overhead_s = 1e-3,
                               .profile = p};
    kvc_sched_entry_t e[2] = {{.first_pos = 0, .n_tokens = 8, .n_context = 8, .prefill = true},
                              {.first_pos = 99, .n_tokens = 1, .n_context = 100}};
    kvc_sched_plan_t plan = {.entries = e, .n_entries = 2};
    double want = truth_ms(9, 136.0 / 9) * 1e-3 + 1e-3;
    kvc_sim_step_cost_t d;
    assert_true(fabs(kvc_sim_step_time(&cm, &plan, &d) - want) < 1e-12);
    assert_true(fabs(d.total_s - want) < 1e-12);
    /* swap traffic still costs its bytes over the host link */
    plan.swap_out_bytes = 1000000;
    assert_true(fabs(kvc_sim_step_time(&cm, &plan, NULL) - (want + 1e-3)) < 1e-12);
    /* an empty plan costs the overhead */
    plan = (kvc_sched_plan_t){0};
    assert_true(fabs(kvc_sim_step_time(&cm, &plan, NULL) - 1e-3) < 1e-15);
    kvc_sim_profile_destroy(p);
}

/* The optional fixed costs: a profile without them (every profile written before them) loads
 * with both 0; with them, in ms; a wrong one is refused naming it. */
static void fixed_costs_parse_old_and_new(void **state)
{
    (void)state;
    kvc_sim_profile_t *p = parse_ok(GRID);
    kvc_sim_profile_fixed_t f = kvc_sim_profile_fixed(p);
    assert_true(f.request_s == 0 && f.step_s == 0);
    kvc_sim_profile_destroy(p);
    p = parse_ok("{\"kvcache_profile\": 1, \"tokens\": [1], \"context\": [0], \"step_ms\": [[1]],"
                 " \"request_ms\": 2.5, \"step_overhead_ms\": 0.125}");
    f = kvc_sim_profile_fixed(p);
    assert_true(fabs(f.request_s - 2.5e-3) < 1e-15 && fabs(f.step_s - 0.125e-3) < 1e-15);
    kvc_sim_profile_destroy(p);
    f = kvc_sim_profile_fixed(NULL);
    assert_true(f.request_s == 0 && f.step_s == 0);
    const char *bad[] = {"\"request_ms\": -1",         "\"request_ms\": \"2\"",
                         "\"step_overhead_ms\": -0.5", "\"step_overhead_ms\": null",
                         "\"request_ms\": 1e999",      "\"request_ms\": 60000.5"};
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad); i++) {
        char json[256], err[256] = "";
        snprintf(json, sizeof json,
                 "{\"kvcache_profile\": 1, \"tokens\": [1], \"context\": [0], \"step_ms\": [[1]],"
                 " %s}",
                 bad[i]);
        kvc_sim_profile_t *q = (kvc_sim_profile_t *)&q;
        assert_int_equal(kvc_sim_profile_parse(json, strlen(json), "p.json", &q, err, sizeof err),
                         KVC_EPARSE);
        assert_null(q);
        const char *key = strstr(bad[i], "request") ? "\"request_ms\"" : "\"step_overhead_ms\"";
        if (!strstr(err, key) || !strstr(err, "must be a number of ms from 0 to 60000") ||
            !strstr(err, "p.json"))
            fail_msg("'%s': message '%s'", bad[i], err);
    }
}

/* The profile's per-step cost is added to every step, beside the caller's overhead. */
static void the_profiles_step_cost_is_added_to_each_step(void **state)
{
    (void)state;
    kvc_sim_profile_t *p =
        parse_ok("{\"kvcache_profile\": 1, \"tokens\": [1, 9], \"context\": [0, 100, 300],"
                 " \"step_ms\": [[1.5, 2.5, 4.5], [5.5, 14.5, 32.5]],"
                 " \"step_overhead_ms\": 0.25}");
    kvc_sim_cost_model_t cm = {.host_link_bytes_per_s = 1e9, .step_overhead_s = 1e-3, .profile = p};
    kvc_sched_entry_t e = {.first_pos = 99, .n_tokens = 1, .n_context = 100};
    kvc_sched_plan_t plan = {.entries = &e, .n_entries = 1};
    assert_true(fabs(kvc_sim_step_time(&cm, &plan, NULL) - (2.5e-3 + 0.25e-3 + 1e-3)) < 1e-15);
    kvc_sim_profile_destroy(p);
}

/* One request alone in the simulator, under a profile with and without a per-request cost: the
 * cost adds exactly itself to TTFT and to end-to-end latency, and nothing to TPOT; the
 * per-step cost adds itself to every step (TPOT), and to TTFT once (the prefill step). */
static kvc_report_summary_t run_alone(const kvc_sim_profile_t *p)
{
    kvc_sim_config_t c = kvc_sim_config_default();
    assert_ok(kvc_plan_model_preset("llama-3.1-8b", &c.model));
    assert_ok(kvc_plan_gpu_preset("h100-sxm", &c.gpu));
    c.num_blocks = 64;
    c.profile = p;
    c.step_overhead_s = 0;
    char trace[512];
    snprintf(trace, sizeof trace,
             "{\"kvcache_workload\": 1}\n"
             "{\"arrival_s\": 0.5, \"tokens\": [1, 5, 9, 13, 17, 21, 25, 29], \"output\": 5}\n");
    kvc_workload_params_t wp = kvc_workload_params_default();
    kvc_workload_t *w = NULL;
    char err[256];
    if (kvc_workload_load_buffer(trace, strlen(trace), "t", &wp, &w, err, sizeof err))
        fail_msg("workload: %s", err);
    kvc_report_params_t rp = kvc_report_params_default();
    kvc_report_t *r;
    assert_ok(kvc_report_create(&rp, &r));
    kvc_sim_result_t res;
    if (kvc_sim_run(&c, w, r, &res, err, sizeof err)) fail_msg("kvc_sim_run: %s", err);
    assert_int_equal(res.completed, 1);
    assert_int_equal(res.steps, 5); /* the prefill (and first token), then 4 decodes */
    kvc_report_summary_t s;
    assert_ok(kvc_report_summary(r, KVC_REPORT_ALL, 0, &s));
    kvc_report_destroy(r);
    kvc_workload_destroy(w);
    return s;
}

static void a_per_request_cost_adds_exactly_itself_to_ttft(void **state)
{
    (void)state;
    const char *grid = "{\"kvcache_profile\": 1, \"tokens\": [1, 9], \"context\": [0, 100, 300],"
                       " \"step_ms\": [[1.5, 2.5, 4.5], [5.5, 14.5, 32.5]]";
    char json[512];
    snprintf(json, sizeof json, "%s}", grid);
    kvc_sim_profile_t *p0 = parse_ok(json);
    snprintf(json, sizeof json, "%s, \"request_ms\": 3.25}", grid);
    kvc_sim_profile_t *p1 = parse_ok(json);
    snprintf(json, sizeof json, "%s, \"step_overhead_ms\": 0.5}", grid);
    kvc_sim_profile_t *p2 = parse_ok(json);
    kvc_report_summary_t a = run_alone(p0), b = run_alone(p1), c = run_alone(p2);
    /* the prefill: 8 tokens from position 0, mean context 4.5 (36 pairs / 8) */
    const double prefill_ms = truth_ms(8, 4.5);
    assert_true(fabs(a.ttft_ms.p50 - prefill_ms) < 1e-6);
    assert_true(fabs(b.ttft_ms.p50 - a.ttft_ms.p50 - 3.25) < 1e-6);
    assert_true(fabs(b.e2e_ms.p50 - a.e2e_ms.p50 - 3.25) < 1e-6);
    assert_true(fabs(b.tpot_ms.p50 - a.tpot_ms.p50) < 1e-6);
    assert_true(fabs(c.ttft_ms.p50 - a.ttft_ms.p50 - 0.5) < 1e-6);
    assert_true(fabs(c.tpot_ms.p50 - a.tpot_ms.p50 - 0.5) < 1e-6);
    assert_true(fabs(c.e2e_ms.p50 - a.e2e_ms.p50 - 5 * 0.5) < 1e-6);
    kvc_sim_profile_destroy(p0);
    kvc_sim_profile_destroy(p1);
    kvc_sim_profile_destroy(p2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(interpolation_matches_hand_arithmetic),
        cmocka_unit_test(bad_profiles_get_one_line),
        cmocka_unit_test(the_cost_model_takes_the_profiles_time),
        cmocka_unit_test(fixed_costs_parse_old_and_new),
        cmocka_unit_test(the_profiles_step_cost_is_added_to_each_step),
        cmocka_unit_test(a_per_request_cost_adds_exactly_itself_to_ttft),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
