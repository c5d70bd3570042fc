/* test_report.c - the simulator's report: nearest-rank percentiles, TPOT and
 * goodput under SLOs, per-tenant and per-class breakdowns, the JSON keys and
 * values, the time series (fixed and adaptive), CSV and SVG well-formedness,
 * determinism, the progress bar, and allocation faults. */
#include "test_helpers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

static const char *const tenants[] = {"alice", "bob"};
static const char *const classes[] = {"interactive", "batch"};

/* Four requests with binary-exact times (ms values in the comments):
 *        tenant  class  ttft    tpot   e2e    out  prompt hit  SLO (ttft 100, tpot 30)
 *   R1   alice   inter  62.5    25     312.5  11   100    50   good
 *   R2   bob     batch  250     50     500    6    200    0    ttft too slow
 *   R3   alice   batch  31.25   -      31.25  1    50     25   good (no TPOT)
 *   R4   tenant2 inter  125     62.5   250    3    10     0    ttft too slow */
static const kvc_sim_record_t recs[4] = {
    {.arrival_s = 0,
     .first_token_s = 0.0625,
     .finish_s = 0.3125,
     .n_prompt = 100,
     .n_output = 11,
     .n_hit_tokens = 50,
     .tenant = 0,
     .priority = 0},
    {.arrival_s = 0.5,
     .first_token_s = 0.75,
     .finish_s = 1.0,
     .n_prompt = 200,
     .n_output = 6,
     .tenant = 1,
     .priority = 1,
     .n_preemptions = 2,
     .recomputed_tokens = 64},
    {.arrival_s = 1.0,
     .first_token_s = 1.03125,
     .finish_s = 1.03125,
     .n_prompt = 50,
     .n_output = 1,
     .n_hit_tokens = 25,
     .tenant = 0,
     .priority = 1},
    {.arrival_s = 2.0,
     .first_token_s = 2.125,
     .finish_s = 2.25,
     .n_prompt = 10,
     .n_output = 3,
     .tenant = 2,
     .priority = 0},
};

static kvc_report_params_t params(void)
{
    kvc_report_params_t p = kvc_report_params_default();
    p.ttft_ms = 100;
    p.tpot_ms = 30;
    p.tenant_names = tenants;
    p.n_tenants = 2;
    p.class_names = classes;
    p.n_classes = 2;
    p.sample_interval_s = 1.0;
    return p;
}

static const kvc_report_totals_t totals = {.preemptions = 3,
                                           .recomputed_tokens = 80,
                                           .swapped_bytes = 4096,
                                           .prompt_tokens = 400,
                                           .hit_tokens = 100,
                                           .peak_kv_blocks = 35,
                                           .simulated_s = 4.0,
                                           .steps = 17,
                                           .peak_stranded_blocks = 6,
                                           .peak_stranded_bytes = 6 << 20,
                                           .end_stranded_blocks = 2,
                                           .end_stranded_bytes = 2 << 20,
                                           .strandings = 9,
                                           .errored = 1};

static const kvc_sim_sample_t samples[4] = {
    {.t_s = 0.0,
     .kv_blocks_used = 10,
     .kv_blocks_total = 100,
     .running = 2,
     .waiting = 5,
     .batch_tokens = 100},
    {.t_s = 0.5,
     .kv_blocks_used = 30,
     .kv_blocks_total = 100,
     .running = 3,
     .waiting = 1,
     .batch_tokens = 50},
    {.t_s = 1.5,
     .kv_blocks_used = 20,
     .kv_blocks_total = 100,
     .running = 1,
     .swapped = 4,
     .batch_tokens = 10},
    {.t_s = 3.0, .kv_blocks_total = 100},
};

/* The hand-made report, records added in the order given by `order`. */
static kvc_report_t *hand_report(const int order[4])
{
    kvc_report_params_t p = params();
    kvc_report_t *r;
    assert_ok(kvc_report_create(&p, &r));
    for (int i = 0; i < 4; i++) assert_ok(kvc_report_add(r, &recs[order[i]]));
    for (int i = 0; i < 4; i++) assert_ok(kvc_report_sample(r, &samples[i]));
    assert_ok(kvc_report_add_config(r, "policy", "recompute"));
    assert_ok(kvc_report_add_config_num(r, "gpu_flops", 9.89e14));
    assert_ok(kvc_report_finish(r, &totals));
    return r;
}

static const int in_order[4] = {0, 1, 2, 3};

static char *capture(int (*fn)(const kvc_report_t *, FILE *), const kvc_report_t *r, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    assert_ok(fn(r, f));
    fclose(f);
    if (len) *len = n;
    return buf;
}

#define assert_near(a, b) assert_true(fabs((a) - (b)) < 1e-9)

/* ---- percentiles ------------------------------------------------------------------------ */
static void percentiles_are_nearest_rank(void **state)
{
    (void)state;
    const double ten[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    assert_true(kvc_percentile_sorted(ten, 10, 50) == 5);
    assert_true(kvc_percentile_sorted(ten, 10, 90) == 9);
    assert_true(kvc_percentile_sorted(ten, 10, 91) == 10);
    assert_true(kvc_percentile_sorted(ten, 10, 99) == 10);
    assert_true(kvc_percentile_sorted(ten, 10, 100) == 10);
    assert_true(kvc_percentile_sorted(ten, 10, 0) == 1);
    assert_true(kvc_percentile_sorted(ten, 10, 10) == 1);
    assert_true(kvc_percentile_sorted(ten, 10, 10.01) == 2);
    /* the textbook example: 15, 20, 35, 40, 50 */
    const double five[] = {15, 20, 35, 40, 50};
    assert_true(kvc_percentile_sorted(five, 5, 5) == 15);
    assert_true(kvc_percentile_sorted(five, 5, 30) == 20);
    assert_true(kvc_percentile_sorted(five, 5, 40) == 20);
    assert_true(kvc_percentile_sorted(five, 5, 50) == 35);
    assert_true(kvc_percentile_sorted(five, 5, 100) == 50);
    const double one[] = {7};
    assert_true(kvc_percentile_sorted(one, 1, 99) == 7);
    assert_true(kvc_percentile_sorted(NULL, 0, 50) == 0);
    /* p99.9 of 1000 values is the 999th, not the 1000th (no float slop) */
    double *k = malloc(1000 * sizeof *k);
    for (int i = 0; i < 1000; i++) k[i] = i + 1;
    assert_true(kvc_percentile_sorted(k, 1000, 99.9) == 999);
    assert_true(kvc_percentile_sorted(k, 1000, 99) == 990);
    assert_true(kvc_percentile_sorted(k, 1000, 50) == 500);
    free(k);
}

/* ---- figures --------------------------------------------------------------------------- */
static void summary_matches_hand_computation(void **state)
{
    (void)state;
    kvc_report_t *r = hand_report(in_order);
    kvc_report_summary_t s;
    assert_ok(kvc_report_summary(r, KVC_REPORT_ALL, 0, &s));
    assert_int_equal(s.completed, 4);
    assert_int_equal(s.good, 2);
    assert_int_equal(s.ttft_ms.count, 4);
    assert_near(s.ttft_ms.p50, 62.5);
    assert_near(s.ttft_ms.p90, 250);
    assert_near(s.ttft_ms.p99, 250);
    assert_near(s.ttft_ms.mean, 117.1875);
    assert_near(s.ttft_ms.max, 250);
    assert_int_equal(s.tpot_ms.count, 3); /* R3 has one output token: no TPOT */
    assert_near(s.tpot_ms.p50, 50);
    assert_near(s.tpot_ms.p90, 62.5);
    assert_near(s.tpot_ms.mean, 137.5 / 3);
    assert_near(s.e2e_ms.p50, 250);
    assert_near(s.e2e_ms.p90, 500);
    assert_near(s.e2e_ms.mean, 273.4375);
    assert_near(s.throughput_tokens_per_s, 21.0 / 4);
    assert_near(s.goodput_requests_per_s, 0.5);
    assert_near(s.prefix_hit_rate, 0.25); /* from the totals: 100 / 400 */
    assert_int_equal(s.preemptions, 3);   /* the simulator's count */
    assert_int_equal(s.recomputed_tokens, 80);

    assert_ok(kvc_report_summary(r, KVC_REPORT_TENANT, 0, &s)); /* alice: R1, R3 */
    assert_int_equal(s.completed, 2);
    assert_int_equal(s.good, 2);
    assert_near(s.ttft_ms.p50, 31.25);
    assert_near(s.ttft_ms.p99, 62.5);
    assert_int_equal(s.tpot_ms.count, 1);
    assert_near(s.tpot_ms.p50, 25);
    assert_near(s.prefix_hit_rate, 0.5); /* 75 / 150 from its records */
    assert_near(s.throughput_tokens_per_s, 3);
    assert_ok(kvc_report_summary(r, KVC_REPORT_TENANT, 1, &s)); /* bob */
    assert_int_equal(s.good, 0);
    assert_int_equal(s.preemptions, 2);
    assert_int_equal(s.recomputed_tokens, 64);
    assert_ok(kvc_report_summary(r, KVC_REPORT_TENANT, 2, &s)); /* unnamed, seen */
    assert_int_equal(s.completed, 1);
    assert_int_equal(kvc_report_summary(r, KVC_REPORT_TENANT, 3, &s), KVC_ENOENT);
    assert_ok(kvc_report_summary(r, KVC_REPORT_CLASS, 1, &s)); /* batch: R2, R3 */
    assert_int_equal(s.completed, 2);
    assert_near(s.e2e_ms.p50, 31.25);
    assert_near(s.e2e_ms.max, 500);
    assert_int_equal(kvc_report_summary(r, KVC_REPORT_CLASS, 2, &s), KVC_ENOENT);
    kvc_report_destroy(r);

    /* no totals: prompt tokens, hits and the duration come from the records */
    kvc_report_t *r2;
    kvc_report_params_t p = params();
    assert_ok(kvc_report_create(&p, &r2));
    for (int i = 0; i < 4; i++) assert_ok(kvc_report_add(r2, &recs[i]));
    assert_ok(kvc_report_finish(r2, &(kvc_report_totals_t){0}));
    assert_ok(kvc_report_summary(r2, KVC_REPORT_ALL, 0, &s));
    assert_near(s.prefix_hit_rate, 75.0 / 360);
    assert_near(s.goodput_requests_per_s, 2 / 2.25);
    kvc_report_destroy(r2);

    /* no SLOs: every request is good */
    p = kvc_report_params_default();
    assert_ok(kvc_report_create(&p, &r2));
    for (int i = 0; i < 4; i++) assert_ok(kvc_report_add(r2, &recs[i]));
    assert_ok(kvc_report_finish(r2, &totals));
    assert_ok(kvc_report_summary(r2, KVC_REPORT_ALL, 0, &s));
    assert_int_equal(s.good, 4);
    /* an E2E SLO alone */
    kvc_report_destroy(r2);
    p.e2e_ms = 300;
    assert_ok(kvc_report_create(&p, &r2));
    for (int i = 0; i < 4; i++) assert_ok(kvc_report_add(r2, &recs[i]));
    assert_ok(kvc_report_finish(r2, &totals));
    assert_ok(kvc_report_summary(r2, KVC_REPORT_ALL, 0, &s));
    assert_int_equal(s.good, 2); /* R3 (31.25) and R4 (250) */
    kvc_report_destroy(r2);
    /* a TPOT SLO alone: 30 ms passes R1 (25) and R3 (no TPOT); 55 ms also R2 (50) */
    const double tpot_slo[2] = {30, 55};
    const uint64_t want_good[2] = {2, 3};
    for (int k = 0; k < 2; k++) {
        p = kvc_report_params_default();
        p.tpot_ms = tpot_slo[k];
        assert_ok(kvc_report_create(&p, &r2));
        for (int i = 0; i < 4; i++) assert_ok(kvc_report_add(r2, &recs[i]));
        assert_ok(kvc_report_finish(r2, &totals));
        assert_ok(kvc_report_summary(r2, KVC_REPORT_ALL, 0, &s));
        assert_int_equal(s.good, want_good[k]);
        kvc_report_destroy(r2);
    }
}

static void misuse_is_refused(void **state)
{
    (void)state;
    kvc_report_t *r;
    kvc_report_params_t p = kvc_report_params_default();
    p.ttft_ms = -1;
    assert_int_equal(kvc_report_create(&p, &r), KVC_EINVAL);
    assert_null(r);
    p = kvc_report_params_default();
    p.max_rows = 15;
    assert_int_equal(kvc_report_create(&p, &r), KVC_EINVAL);
    p = kvc_report_params_default();
    p.sample_interval_s = NAN;
    assert_int_equal(kvc_report_create(&p, &r), KVC_EINVAL);
    const char *const bad_names[] = {"a", ""};
    p = kvc_report_params_default();
    p.tenant_names = bad_names;
    p.n_tenants = 2;
    assert_int_equal(kvc_report_create(&p, &r), KVC_EINVAL);

    p = params();
    assert_ok(kvc_report_create(&p, &r));
    kvc_sim_record_t x = recs[0];
    x.first_token_s = -0.5;
    assert_int_equal(kvc_report_add(r, &x), KVC_EINVAL);
    x = recs[0];
    x.finish_s = 0.01;
    assert_int_equal(kvc_report_add(r, &x), KVC_EINVAL);
    x = recs[0];
    x.n_output = 0;
    assert_int_equal(kvc_report_add(r, &x), KVC_EINVAL);
    x = recs[0];
    x.n_hit_tokens = 101;
    assert_int_equal(kvc_report_add(r, &x), KVC_EINVAL);
    x = recs[0];
    x.finish_s = INFINITY;
    assert_int_equal(kvc_report_add(r, &x), KVC_EINVAL);
    x = recs[0];
    x.tenant = 65536;
    assert_int_equal(kvc_report_add(r, &x), KVC_EINVAL);
    assert_ok(kvc_report_sample(r, &samples[1]));
    assert_int_equal(kvc_report_sample(r, &samples[0]), KVC_EINVAL); /* back in time */
    assert_int_equal(kvc_report_add_config(r, "", "x"), KVC_EINVAL);
    assert_int_equal(kvc_report_add_config_num(r, "k", NAN), KVC_EINVAL);
    assert_ok(kvc_report_add_config(r, "k", "v"));
    assert_int_equal(kvc_report_add_config_num(r, "k", 1), KVC_EEXIST);
    kvc_report_summary_t s;
    assert_int_equal(kvc_report_summary(r, KVC_REPORT_ALL, 0, &s), KVC_EINVAL);
    assert_int_equal(kvc_report_write_json(r, stdout), KVC_EINVAL);
    assert_int_equal(kvc_report_write_text(r, stdout), KVC_EINVAL);
    assert_int_equal(kvc_report_write_csv(r, stdout), KVC_EINVAL);
    assert_int_equal(kvc_report_write_svg(r, "/tmp"), KVC_EINVAL);
    assert_int_equal(kvc_report_finish(r, &(kvc_report_totals_t){.simulated_s = -1}), KVC_EINVAL);
    assert_ok(kvc_report_finish(r, &totals));
    assert_int_equal(kvc_report_finish(r, &totals), KVC_EINVAL);
    assert_int_equal(kvc_report_add(r, &recs[0]), KVC_EINVAL);
    assert_int_equal(kvc_report_sample(r, &samples[3]), KVC_EINVAL);
    kvc_report_destroy(r);
    kvc_report_destroy(NULL);
}

/* ---- JSON ------------------------------------------------------------------------------ */
static double jnum(const cJSON *o, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *it = o;
    for (char *tok = strtok(buf, "."); tok; tok = strtok(NULL, ".")) {
        it = cJSON_GetObjectItemCaseSensitive(it, tok);
        if (!it) fail_msg("no key %s in %s", tok, path);
    }
    if (!cJSON_IsNumber(it)) fail_msg("%s is not a number", path);
    return it->valuedouble;
}

static void json_has_the_keys_and_values(void **state)
{
    (void)state;
    kvc_report_t *r = hand_report(in_order);
    size_t len;
    char *text = capture(kvc_report_write_json, r, &len);
    assert_true(len > 0 && text[len - 1] == '\n');
    cJSON *o = cJSON_Parse(text);
    if (!o) fail_msg("not JSON: %s", text);
    const char *required[] = {"completed",
                              "ttft_ms",
                              "tpot_ms",
                              "e2e_ms",
                              "throughput_tokens_per_s",
                              "goodput_requests_per_s",
                              "prefix_hit_rate",
                              "preemptions",
                              "recomputed_tokens",
                              "swapped_bytes",
                              "peak_kv_blocks",
                              "simulated_seconds",
                              "stranded_blocks",
                              "stranded_bytes",
                              "strandings",
                              "errored_requests",
                              "tenants",
                              "classes",
                              "config",
                              "slo"};
    for (size_t i = 0; i < KVC_ARRAY_LEN(required); i++)
        if (!cJSON_HasObjectItem(o, required[i])) fail_msg("missing key %s", required[i]);
    assert_near(jnum(o, "completed"), 4);
    assert_near(jnum(o, "ttft_ms.p50"), 62.5);
    assert_near(jnum(o, "ttft_ms.p90"), 250);
    assert_near(jnum(o, "ttft_ms.p99"), 250);
    assert_near(jnum(o, "tpot_ms.p50"), 50);
    assert_near(jnum(o, "tpot_ms.p99"), 62.5);
    assert_near(jnum(o, "e2e_ms.p50"), 250);
    assert_near(jnum(o, "e2e_ms.p99"), 500);
    assert_near(jnum(o, "throughput_tokens_per_s"), 5.25);
    assert_near(jnum(o, "goodput_requests_per_s"), 0.5);
    assert_near(jnum(o, "prefix_hit_rate"), 0.25);
    assert_near(jnum(o, "preemptions"), 3);
    assert_near(jnum(o, "recomputed_tokens"), 80);
    assert_near(jnum(o, "swapped_bytes"), 4096);
    assert_near(jnum(o, "peak_kv_blocks"), 35);
    assert_near(jnum(o, "simulated_seconds"), 4);
    assert_near(jnum(o, "steps"), 17);
    assert_near(jnum(o, "stranded_blocks.peak"), 6);
    assert_near(jnum(o, "stranded_blocks.end"), 2);
    assert_near(jnum(o, "stranded_bytes.peak"), 6 << 20);
    assert_near(jnum(o, "stranded_bytes.end"), 2 << 20);
    assert_near(jnum(o, "strandings"), 9);
    assert_near(jnum(o, "errored_requests"), 1);
    assert_near(jnum(o, "slo.ttft_ms"), 100);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "slo"), "e2e_ms")));
    assert_near(jnum(o, "mean_kv_blocks_used"), 16.25); /* (10*.5 + 30*1 + 20*1.5 + 0*1) / 4 */
    assert_near(jnum(o, "mean_running"), 1.375);
    assert_near(jnum(o, "peak_running"), 3);
    assert_near(jnum(o, "kv_blocks_total"), 100);
    assert_near(jnum(o, "tenants.alice.completed"), 2);
    assert_near(jnum(o, "tenants.alice.ttft_ms.p50"), 31.25);
    assert_near(jnum(o, "tenants.alice.prefix_hit_rate"), 0.5);
    assert_near(jnum(o, "tenants.bob.goodput_requests_per_s"), 0);
    assert_near(jnum(o, "tenants.tenant2.e2e_ms.p99"), 250);
    assert_near(jnum(o, "classes.batch.completed"), 2);
    assert_near(jnum(o, "classes.interactive.tpot_ms.p90"), 62.5);
    assert_near(jnum(o, "config.gpu_flops"), 9.89e14);
    assert_string_equal(
        cJSON_GetObjectItem(cJSON_GetObjectItem(o, "config"), "policy")->valuestring, "recompute");
    /* bob's TPOT exists, alice's p99 is hers alone; tenant order is index order */
    const cJSON *t = cJSON_GetObjectItem(o, "tenants");
    assert_string_equal(t->child->string, "alice");
    assert_string_equal(t->child->next->string, "bob");
    assert_string_equal(t->child->next->next->string, "tenant2");
    cJSON_Delete(o);

    /* byte for byte: the same report, and the records in another order */
    const int shuffled[4] = {3, 1, 0, 2};
    kvc_report_t *r2 = hand_report(shuffled);
    size_t len2;
    char *text2 = capture(kvc_report_write_json, r2, &len2);
    assert_int_equal(len, len2);
    assert_memory_equal(text, text2, len);
    free(text);
    free(text2);
    kvc_report_destroy(r2);

    /* a named group without requests has null percentiles */
    kvc_report_params_t p = params();
    assert_ok(kvc_report_create(&p, &r2));
    assert_ok(kvc_report_add(r2, &recs[0]));
    assert_ok(kvc_report_finish(r2, &totals));
    text = capture(kvc_report_write_json, r2, NULL);
    o = cJSON_Parse(text);
    assert_non_null(o);
    const cJSON *bob = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "tenants"), "bob");
    assert_near(cJSON_GetObjectItem(bob, "completed")->valuedouble, 0);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(bob, "ttft_ms"), "p50")));
    cJSON_Delete(o);
    free(text);
    kvc_report_destroy(r2);
    kvc_report_destroy(r);
}

static void text_report_reads_well(void **state)
{
    (void)state;
    kvc_report_t *r = hand_report(in_order);
    size_t len;
    char *text = capture(kvc_report_write_text, r, &len);
    const char *want[] = {
        "completed          4 requests in 4.000 simulated s (17 steps)",
        "goodput            0.500 requests/s (50.0% met TTFT <= 100 ms, TPOT <= 30 ms)",
        "prefix hit rate    25.00% (100 of 400 prompt tokens)",
        "preemptions        3 (80 tokens recomputed, 4096 bytes swapped)",
        "KV blocks          peak 35 of 100 (35.0%), mean 16.2",
        ("stranded KV        peak 6 blocks (6.0 MiB), at the end 2 (2.0 MiB); 9 blocks stranded "
         "in all"),
        "errored requests   1 (ended by an error; not in the latencies)",
        "latency (ms)       count        mean         p50         p90",
        "  TTFT                 4     117.188      62.500     250.000",
        "alice",
        "bob",
        "tenant2",
        "interactive",
        "batch",
        "policy                       recompute",
        "gpu_flops                    9.89e+14"};
    for (size_t i = 0; i < KVC_ARRAY_LEN(want); i++)
        if (!strstr(text, want[i])) fail_msg("text report lacks '%s':\n%s", want[i], text);
    char *again = capture(kvc_report_write_text, r, NULL);
    assert_string_equal(text, again);
    free(text);
    free(again);
    kvc_report_destroy(r);
}

static void text_report_escapes_control_bytes_of_names_and_settings(void **state)
{
    (void)state;
    /* names and settings come from the input (a trace's tenants, a config's model name) */
    static const char *const odd[] = {"ev\x1b[2Jil", "tab\there"};
    kvc_report_params_t p = params();
    p.tenant_names = odd;
    kvc_report_t *r;
    assert_ok(kvc_report_create(&p, &r));
    for (int i = 0; i < 4; i++) assert_ok(kvc_report_add(r, &recs[i]));
    assert_ok(kvc_report_add_config(r, "model", "line\nbreak\x07"));
    assert_ok(kvc_report_finish(r, &totals));
    char *text = capture(kvc_report_write_text, r, NULL);
    for (const char *c = text; *c; c++)
        if ((unsigned char)*c < 0x20 && *c != '\n')
            fail_msg("raw control byte 0x%02x in the text report", (unsigned char)*c);
    const char *want[] = {"ev\\x1b[2Jil", "tab\\there", "line\\nbreak\\x07"};
    for (size_t i = 0; i < KVC_ARRAY_LEN(want); i++)
        if (!strstr(text, want[i])) fail_msg("text report lacks '%s':\n%s", want[i], text);
    free(text);
    kvc_report_destroy(r);
}

/* ---- the time series -------------------------------------------------------------------- */
static void fixed_interval_rows_fold_samples(void **state)
{
    (void)state;
    kvc_report_t *r = hand_report(in_order);
    char *csv = capture(kvc_report_write_csv, r, NULL);
    assert_string_equal(csv, "t_s,steps,kv_blocks_used,kv_blocks_total,kv_usage,running,waiting,"
                             "swapped,batch_tokens_mean,batch_tokens_max\n"
                             "0.000000,2,30,100,0.3000,3,5,0,75.00,100\n"
                             "1.000000,1,20,100,0.2000,1,0,4,10.00,10\n"
                             "3.000000,1,0,100,0.0000,0,0,0,0.00,0\n");
    free(csv);
    kvc_report_destroy(r);
}

static void adaptive_rows_stay_bounded_and_keep_peaks(void **state)
{
    (void)state;
    kvc_report_params_t p = kvc_report_params_default();
    p.max_rows = 64;
    kvc_report_t *r;
    assert_ok(kvc_report_create(&p, &r));
    const int n = 100000 / KVC_TEST_SANITIZER_DIVISOR;
    uint64_t batch = 0;
    for (int i = 0; i < n; i++) {
        kvc_sim_sample_t s = {.t_s = i * 0.01,
                              .kv_blocks_used = (uint32_t)(i % 50),
                              .kv_blocks_total = 1000,
                              .running = 4,
                              .batch_tokens = (uint32_t)(i % 7)};
        if (i == n / 3) s.kv_blocks_used = 999;
        batch += s.batch_tokens;
        assert_ok(kvc_report_sample(r, &s));
    }
    assert_ok(kvc_report_finish(r, &(kvc_report_totals_t){.simulated_s = n * 0.01}));
    char *csv = capture(kvc_report_write_csv, r, NULL);
    size_t rows = 0, steps = 0;
    double batch_sum = 0, last_t = -1, slack = 1e-6;
    unsigned peak = 0;
    char *save = NULL;
    for (char *line = strtok_r(csv, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (rows++ == 0) continue; /* header */
        double t, usage, mean;
        unsigned st, used, total, run, wait, swp, bmax;
        assert_int_equal(sscanf(line, "%lf,%u,%u,%u,%lf,%u,%u,%u,%lf,%u", &t, &st, &used, &total,
                                &usage, &run, &wait, &swp, &mean, &bmax),
                         10);
        assert_true(t > last_t);
        last_t = t;
        steps += st;
        batch_sum += mean * st;
        slack += 0.005 * st; /* the mean is printed with two decimals */
        peak = KVC_MAX(peak, used);
        assert_int_equal(total, 1000);
        assert_int_equal(run, 4);
    }
    assert_true(rows - 1 <= 64 && rows - 1 >= 32);
    assert_int_equal(steps, (size_t)n);
    assert_true(fabs(batch_sum - (double)batch) <= slack);
    assert_int_equal(peak, 999);
    free(csv);
    kvc_report_destroy(r);
}

/* ---- SVG ---------------------------------------------------------------------------------- */
static char *read_all(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Well-formed enough: a declaration, every element closed in order, one svg
 * root.  Returns the number of polylines; *max_points the longest. */
static int check_svg(const char *s, const char *title, size_t *max_points)
{
    assert_true(!strncmp(s, "<?xml", 5));
    assert_null(strstr(s, "nan"));
    assert_null(strstr(s, "inf"));
    if (!strstr(s, title)) fail_msg("no title '%s'", title);
    char stack[32][32];
    int depth = 0, polylines = 0, roots = 0;
    *max_points = 0;
    for (const char *p = strchr(s, '<'); p; p = strchr(p + 1, '<')) {
        const char *end = strchr(p, '>');
        assert_non_null(end);
        if (p[1] == '?') continue;
        if (p[1] == '/') {
            assert_true(depth > 0);
            depth--;
            size_t n = strlen(stack[depth]);
            if (strncmp(p + 2, stack[depth], n) || p[2 + n] != '>')
                fail_msg("</%.10s> closes <%s>", p + 2, stack[depth]);
            continue;
        }
        char name[32];
        assert_int_equal(sscanf(p + 1, "%31[a-z]", name), 1);
        if (!strcmp(name, "svg")) roots++;
        if (!strcmp(name, "polyline")) {
            polylines++;
            const char *pts = strstr(p, "points=\"");
            assert_true(pts && pts < end);
            size_t n = 1;
            for (const char *q = pts + 8; *q != '"'; q++) n += *q == ' ';
            *max_points = KVC_MAX(*max_points, n);
        }
        if (end[-1] == '/') continue; /* self-closing */
        assert_true(depth < 32);
        snprintf(stack[depth++], sizeof stack[0], "%s", name);
    }
    assert_int_equal(depth, 0);
    assert_int_equal(roots, 1);
    return polylines;
}

static void svg_charts_are_well_formed(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvc_report_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char sub[300], path[400];
    snprintf(sub, sizeof sub, "%s/charts", dir); /* created by the writer */

    kvc_report_params_t p = params();
    p.sample_interval_s = 0;
    kvc_report_t *r;
    assert_ok(kvc_report_create(&p, &r));
    const int n = 50000 / KVC_TEST_SANITIZER_DIVISOR;
    for (int i = 0; i < n; i++) {
        kvc_sim_record_t x = recs[i % 4];
        double shift = i * 0.01;
        x.arrival_s += shift;
        x.first_token_s += shift + (i % 13) * 0.01;
        x.finish_s += shift + (i % 13) * 0.01 + (i % 5) * 0.1;
        assert_ok(kvc_report_add(r, &x));
        kvc_sim_sample_t s = {.t_s = shift,
                              .kv_blocks_used = (uint32_t)(i % 300),
                              .kv_blocks_total = 512,
                              .running = (uint32_t)(i % 40),
                              .waiting = (uint32_t)(i % 9),
                              .batch_tokens = (uint32_t)(i % 2048)};
        assert_ok(kvc_report_sample(r, &s));
    }
    assert_ok(kvc_report_finish(r, &(kvc_report_totals_t){.simulated_s = n * 0.01 + 1}));
    assert_ok(kvc_report_write_svg(r, sub));
    size_t pts;
    snprintf(path, sizeof path, "%s/kv_usage.svg", sub);
    char *s = read_all(path);
    assert_int_equal(check_svg(s, "KV cache usage", &pts), 2);
    assert_true(pts > 100 && pts <= 2000);
    assert_non_null(strstr(s, "simulated time (s)"));
    assert_non_null(strstr(s, ">KV blocks<"));
    assert_non_null(strstr(s, ">512<") ? s : strstr(s, ">500<")); /* a y tick near the total */
    free(s);
    snprintf(path, sizeof path, "%s/batch.svg", sub);
    s = read_all(path);
    assert_int_equal(check_svg(s, "Running batch", &pts), 4);
    assert_true(pts <= 2000);
    free(s);
    snprintf(path, sizeof path, "%s/latency_cdf.svg", sub);
    s = read_all(path);
    assert_int_equal(check_svg(s, "Latency CDF", &pts), 3);
    assert_true(pts > 100 && pts <= 1000);
    assert_non_null(strstr(s, ">TTFT<"));
    assert_non_null(strstr(s, ">100<")); /* a decade of the log axis, 25 ms .. 1.8 s */
    free(s);
    /* same report, same bytes */
    assert_ok(kvc_report_write_svg(r, dir));
    snprintf(path, sizeof path, "%s/latency_cdf.svg", dir);
    s = read_all(path);
    snprintf(path, sizeof path, "%s/latency_cdf.svg", sub);
    char *s2 = read_all(path);
    assert_string_equal(s, s2);
    free(s);
    free(s2);
    kvc_report_destroy(r);

    /* an empty report still draws axes, saying there is no data */
    assert_ok(kvc_report_create(&p, &r));
    assert_ok(kvc_report_finish(r, &(kvc_report_totals_t){0}));
    assert_ok(kvc_report_write_svg(r, sub));
    snprintf(path, sizeof path, "%s/latency_cdf.svg", sub);
    s = read_all(path);
    assert_int_equal(check_svg(s, "Latency CDF", &pts), 0);
    assert_non_null(strstr(s, "no data"));
    free(s);
    /* a path that cannot be a directory */
    snprintf(path, sizeof path, "%s/kv_usage.svg/x", sub);
    assert_int_equal(kvc_report_write_svg(r, path), KVC_EIO);
    kvc_report_destroy(r);

    const char *files[] = {"kv_usage.svg", "batch.svg", "latency_cdf.svg"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", sub, files[i]);
        unlink(path);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(sub);
    rmdir(dir);
}

/* ---- progress bar -------------------------------------------------------------------------- */
static uint64_t fake_now(void *ctx)
{
    return *(uint64_t *)ctx;
}

static void progress_draws_only_when_due(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    uint64_t now = 0;
    kvc_progress_t p;
    /* not a terminal and not forced: never draws */
    kvc_progress_start(&p, f, "sim", false);
    assert_false(p.enabled);
    p.now_ns = fake_now;
    p.now_ctx = &now;
    p.start_ns = 0;
    now = 5000000000ULL;
    kvc_progress_update(&p, 1, 2);
    kvc_progress_finish(&p, 2, 2);
    fflush(f);
    assert_int_equal(len, 0);

    kvc_progress_start(&p, f, "sim", true);
    p.now_ns = fake_now;
    p.now_ctx = &now;
    p.start_ns = now = 0;
    now = 500000000ULL; /* 0.5 s: too early */
    kvc_progress_update(&p, 10, 100);
    fflush(f);
    assert_int_equal(len, 0);
    now = 1200000000ULL;
    kvc_progress_update(&p, 50, 100);
    fflush(f);
    assert_true(len > 0);
    assert_non_null(
        strstr(buf, "\rsim [###############...............]  50.0% 50/100 1.2s eta 1.2s"));
    size_t before = len;
    now = 1250000000ULL; /* 50 ms later: no redraw */
    kvc_progress_update(&p, 51, 100);
    fflush(f);
    assert_int_equal(len, before);
    now = 1400000000ULL;
    kvc_progress_update(&p, 70, 100);
    fflush(f);
    assert_true(len > before);
    kvc_progress_finish(&p, 100, 100);
    fflush(f);
    assert_non_null(strstr(buf, "100.0% 100/100"));
    assert_int_equal(buf[len - 1], '\n');
    fclose(f);
    free(buf);

    /* a run that ended within the second prints nothing at all */
    buf = NULL;
    f = open_memstream(&buf, &len);
    kvc_progress_start(&p, f, "quick", true);
    kvc_progress_update(&p, 1, 1);
    kvc_progress_finish(&p, 1, 1);
    fflush(f);
    assert_int_equal(len, 0);
    fclose(f);
    free(buf);
}

/* ---- allocation faults ----------------------------------------------------------------------- */
static void reports_leak_nothing_under_allocation_faults(void **state)
{
    (void)state;
    kvc_report_t *ref = hand_report(in_order);
    char *want = capture(kvc_report_write_json, ref, NULL);
    kvc_report_destroy(ref);
    char dir[] = "/tmp/kvc_report_fault_XXXXXX";
    assert_non_null(mkdtemp(dir));
    for (uint64_t n = 1;; n++) {
        kvc_failing_alloc_t st = {.fail_at = n};
        kvc_report_params_t p = params();
        p.allocator = kvc_failing_allocator(&st);
        kvc_report_t *r = NULL;
        int rc = kvc_report_create(&p, &r);
        for (int i = 0; i < 4 && !rc; i++) rc = kvc_report_add(r, &recs[i]);
        for (int i = 0; i < 4 && !rc; i++) rc = kvc_report_sample(r, &samples[i]);
        if (!rc) rc = kvc_report_add_config(r, "policy", "recompute");
        if (!rc) rc = kvc_report_add_config_num(r, "gpu_flops", 9.89e14);
        if (!rc) {
            rc = kvc_report_finish(r, &totals);
            if (rc == KVC_ENOMEM) {
                /* the report stays unfinished and a retry completes it */
                assert_ok(kvc_report_finish(r, &totals));
                char *got = capture(kvc_report_write_json, r, NULL);
                assert_string_equal(got, want);
                free(got);
            }
        }
        if (!rc) rc = kvc_report_write_svg(r, dir);
        if (st.n_failed)
            assert_int_equal(rc, KVC_ENOMEM);
        else
            assert_ok(rc);
        kvc_report_destroy(r);
        assert_int_equal(st.n_live, 0);
        if (!st.n_failed) break;
    }
    const char *files[] = {"kv_usage.svg", "batch.svg", "latency_cdf.svg"};
    char path[300];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
    free(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(percentiles_are_nearest_rank),
        cmocka_unit_test(summary_matches_hand_computation),
        cmocka_unit_test(misuse_is_refused),
        cmocka_unit_test(json_has_the_keys_and_values),
        cmocka_unit_test(text_report_reads_well),
        cmocka_unit_test(text_report_escapes_control_bytes_of_names_and_settings),
        cmocka_unit_test(fixed_interval_rows_fold_samples),
        cmocka_unit_test(adaptive_rows_stay_bounded_and_keep_peaks),
        cmocka_unit_test(svg_charts_are_well_formed),
        cmocka_unit_test(progress_draws_only_when_due),
        cmocka_unit_test(reports_leak_nothing_under_allocation_faults),
    };
    return cmocka_run_group_tests_name("report", tests, NULL, NULL);
}
