/* test_workload.c - the simulator's workloads: Mooncake and kvcache JSONL
 * traces, synthetic specs (files and inline strings), the hand builder, the
 * JSONL writer, determinism, distributions, shared prefixes, multi-turn
 * structure, error messages and allocation faults. */
#include "test_helpers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <dirent.h>

#define MOONCAKE_SAMPLE KVC_DATA_DIR "/traces/mooncake_synthetic_trace.jsonl"

/* ---- helpers ------------------------------------------------------------------------- */
static kvc_workload_t *load_ok(const char *text, const kvc_workload_params_t *p)
{
    char err[512];
    kvc_workload_t *w = NULL;
    int rc = kvc_workload_load_buffer(text, strlen(text), "t.jsonl", p, &w, err, sizeof err);
    if (rc) fail_msg("load failed: %s (%s)", err, kvc_errname(rc));
    assert_non_null(w);
    return w;
}

static kvc_workload_t *spec_ok(const char *spec, const kvc_workload_params_t *p)
{
    char err[512];
    kvc_workload_t *w = NULL;
    int rc = kvc_workload_load(spec, p, &w, err, sizeof err);
    if (rc) fail_msg("load of %s failed: %s (%s)", spec, err, kvc_errname(rc));
    return w;
}

/* The load fails with `code` and a one-line message containing `want`. */
static void load_fails(const char *text, const kvc_workload_params_t *p, int code, const char *want)
{
    char err[512] = "untouched";
    kvc_workload_t *w = (kvc_workload_t *)&err; /* must be reset to NULL */
    int rc = kvc_workload_load_buffer(text, strlen(text), "t.jsonl", p, &w, err, sizeof err);
    if (rc != code)
        fail_msg("want %s, got %s (%s) for: %s", kvc_errname(code), kvc_errname(rc), err, text);
    assert_null(w);
    if (!strstr(err, want)) fail_msg("message '%s' lacks '%s'", err, want);
    assert_null(strchr(err, '\n'));
}

static void spec_fails(const char *spec, int code, const char *want)
{
    char err[512] = "untouched";
    kvc_workload_t *w = NULL;
    int rc = kvc_workload_load(spec, NULL, &w, err, sizeof err);
    if (rc != code) fail_msg("want %s, got %s (%s)", kvc_errname(code), kvc_errname(rc), err);
    assert_null(w);
    if (!strstr(err, want)) fail_msg("message '%s' lacks '%s'", err, want);
}

/* A digest of everything a workload holds: fields, tokens, names. */
static kvc_hash128_t digest(const kvc_workload_t *w)
{
    kvc_hash128_t h = {0, 0};
    for (size_t i = 0; i < kvc_workload_size(w); i++) {
        const kvc_sim_request_t *r = kvc_workload_request(w, i);
        kvc_sim_request_t c = *r;
        c.tokens = c.output_tokens = NULL;
        kvc_hash128_t a = kvc_hash128(&c, sizeof c, h.lo);
        kvc_hash128_t b = kvc_hash128(r->tokens, r->n_prompt * sizeof(kvc_token_t), a.hi);
        h = kvc_hash128(r->output_tokens, r->n_output * sizeof(kvc_token_t), b.lo ^ b.hi);
    }
    for (uint32_t t = 0; t < kvc_workload_n_tenants(w); t++) {
        const char *s = kvc_workload_tenant_name(w, t);
        h = kvc_hash128(s, strlen(s), h.lo);
    }
    for (uint32_t c = 0; c < kvc_workload_n_classes(w); c++) {
        const char *s = kvc_workload_class_name(w, c);
        h = kvc_hash128(s, strlen(s), h.hi);
    }
    return h;
}

static void assert_same_request(const kvc_sim_request_t *a, const kvc_sim_request_t *b)
{
    assert_true(a->arrival_s == b->arrival_s);
    assert_int_equal(a->n_prompt, b->n_prompt);
    assert_int_equal(a->n_output, b->n_output);
    assert_int_equal(a->tenant, b->tenant);
    assert_int_equal(a->priority, b->priority);
    assert_int_equal(a->conversation, b->conversation);
    assert_int_equal(a->turn, b->turn);
    assert_int_equal(a->max_output, b->max_output);
    assert_true(a->think_s == b->think_s);
    assert_memory_equal(a->tokens, b->tokens, a->n_prompt * sizeof(kvc_token_t));
    assert_memory_equal(a->output_tokens, b->output_tokens, a->n_output * sizeof(kvc_token_t));
}

static kvc_workload_params_t small_blocks(uint32_t bt)
{
    kvc_workload_params_t p = kvc_workload_params_default();
    p.block_tokens = bt;
    return p;
}

static double mean_of(const double *v, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += v[i];
    return s / (double)n;
}

static double sd_of(const double *v, size_t n)
{
    double m = mean_of(v, n), s = 0;
    for (size_t i = 0; i < n; i++) s += (v[i] - m) * (v[i] - m);
    return sqrt(s / (double)(n - 1));
}

/* ---- parameters ------------------------------------------------------------------------ */
static void params_are_validated(void **state)
{
    (void)state;
    kvc_workload_params_t p = kvc_workload_params_default();
    assert_int_equal(p.seed, 1);
    assert_int_equal(p.vocab, 32000);
    assert_int_equal(p.block_tokens, 512);
    assert_true(p.time_scale == 1.0);
    const char *line = "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 1, "
                       "\"hash_ids\": [1]}\n";
    p.time_scale = 0;
    load_fails(line, &p, KVC_EINVAL, "time_scale");
    p = kvc_workload_params_default();
    p.vocab = 1;
    load_fails(line, &p, KVC_EINVAL, "vocab");
    p = kvc_workload_params_default();
    p.block_tokens = 0;
    load_fails(line, &p, KVC_EINVAL, "block_tokens");
    p = kvc_workload_params_default();
    p.max_tokens = KVC_SIM_MAX_TOKENS + 1;
    load_fails(line, &p, KVC_EINVAL, "max_tokens");
}

/* ---- Mooncake ---------------------------------------------------------------------------- */
static void mooncake_ids_materialise_by_id_alone(void **state)
{
    (void)state;
    kvc_workload_params_t p = small_blocks(4);
    kvc_workload_t *w = load_ok(
        "{\"timestamp\": 0, \"input_length\": 8, \"output_length\": 2, \"hash_ids\": [1, 2]}\n"
        "{\"timestamp\": 1000, \"input_length\": 11, \"output_length\": 3, \"hash_ids\": [1, 2, "
        "3]}\n"
        "{\"timestamp\": 1500, \"input_length\": 6, \"output_length\": 1, \"hash_ids\": [7, 1]}\n"
        "{\"timestamp\": 2000, \"input_length\": 3, \"output_length\": 1, \"hash_ids\": [3]}\n",
        &p);
    assert_int_equal(kvc_workload_format(w), KVC_WORKLOAD_MOONCAKE);
    assert_int_equal(kvc_workload_size(w), 4);
    const kvc_sim_request_t *r0 = kvc_workload_request(w, 0), *r1 = kvc_workload_request(w, 1),
                            *r2 = kvc_workload_request(w, 2), *r3 = kvc_workload_request(w, 3);
    assert_true(r1->arrival_s == 1.0 && r2->arrival_s == 1.5 && r3->arrival_s == 2.0);
    assert_int_equal(r1->n_prompt, 11);
    assert_int_equal(r1->max_output, 3);
    /* ids 1, 2 equal wherever they appear; 3 cut to 3 tokens is a prefix of the full 3 */
    assert_memory_equal(r0->tokens, r1->tokens, 8 * sizeof(kvc_token_t));
    assert_memory_equal(r2->tokens + 4, r0->tokens, 2 * sizeof(kvc_token_t));
    assert_memory_equal(r3->tokens, r1->tokens + 8, 3 * sizeof(kvc_token_t));
    /* different ids, different blocks */
    assert_memory_not_equal(r0->tokens, r0->tokens + 4, 4 * sizeof(kvc_token_t));
    assert_memory_not_equal(r2->tokens, r0->tokens, 4 * sizeof(kvc_token_t));
    for (size_t i = 0; i < 4; i++) {
        const kvc_sim_request_t *r = kvc_workload_request(w, i);
        for (uint32_t k = 0; k < r->n_prompt; k++)
            assert_true(r->tokens[k] >= 0 && r->tokens[k] < 32000);
        assert_non_null(r->output_tokens);
    }
    kvc_workload_stats_t s;
    assert_ok(kvc_workload_stats(w, &s));
    assert_int_equal(s.unique_blocks, 4);
    /* r0 is a prefix of r1, so it shares r1's storage */
    assert_ptr_equal(r0->tokens, r1->tokens);
    assert_int_equal(s.prompt_tokens, 8 + 11 + 6 + 3);
    assert_int_equal(s.output_tokens, 7);

    /* the seed changes nothing in a trace */
    kvc_workload_params_t p2 = small_blocks(4);
    p2.seed = 12345;
    kvc_workload_t *w2 = load_ok(
        "{\"timestamp\": 0, \"input_length\": 8, \"output_length\": 2, \"hash_ids\": [1, 2]}\n"
        "{\"timestamp\": 1000, \"input_length\": 11, \"output_length\": 3, \"hash_ids\": [1, 2, "
        "3]}\n"
        "{\"timestamp\": 1500, \"input_length\": 6, \"output_length\": 1, \"hash_ids\": [7, 1]}\n"
        "{\"timestamp\": 2000, \"input_length\": 3, \"output_length\": 1, \"hash_ids\": [3]}\n",
        &p2);
    assert_true(kvc_hash128_eq(digest(w), digest(w2)));
    kvc_workload_destroy(w);
    kvc_workload_destroy(w2);
}

/* Golden values: the token materialisation is part of what makes a replay
 * reproducible (the numbers in docs/ depend on it), so a change must be
 * deliberate.  Both paths use integer arithmetic only. */
static void token_materialisation_is_pinned(void **state)
{
    (void)state;
    kvc_workload_t *w = load_ok("{\"timestamp\": 0, \"input_length\": 520, \"output_length\": 3, "
                                "\"hash_ids\": [0, 1]}\n",
                                NULL);
    const kvc_sim_request_t *r = kvc_workload_request(w, 0);
    const kvc_token_t id0[] = {7258, 13512, 31886, 17276, 5185, 29960};
    const kvc_token_t id1[] = {21245, 17515, 7377, 844, 26048, 8470};
    const kvc_token_t out[] = {14402, 12887, 24511};
    assert_memory_equal(r->tokens, id0, sizeof id0);
    assert_memory_equal(r->tokens + 512, id1, sizeof id1);
    assert_memory_equal(r->output_tokens, out, sizeof out);
    kvc_workload_destroy(w);

    /* unstructured synthetic prompts are windows of the seed's tape */
    w = spec_ok("fixed:rate=1,n=3,prompt=4,output=2", NULL);
    const kvc_token_t tape[] = {9336, 27480, 16458, 16311, 20807, 20845, 28707, 18631};
    for (size_t i = 0; i < 3; i++) {
        r = kvc_workload_request(w, i);
        assert_true(r->arrival_s == (double)i);
        assert_memory_equal(r->tokens, tape + i, 4 * sizeof(kvc_token_t));
        assert_memory_equal(r->output_tokens, tape + i + 4, 2 * sizeof(kvc_token_t));
    }
    kvc_workload_destroy(w);
}

static void mooncake_errors_name_line_and_field(void **state)
{
    (void)state;
    kvc_workload_params_t p = small_blocks(4);
    const char *ok = "{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, "
                     "\"hash_ids\": [1]}\n";
    char buf[512];
#define BAD(line2, want)                                  \
    do {                                                  \
        snprintf(buf, sizeof buf, "%s\n%s\n", ok, line2); \
        load_fails(buf, &p, KVC_EPARSE, want);            \
    } while (0)
    /* the blank line between them still counts: the bad record is on line 3 */
    BAD("{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]",
        "t.jsonl:3: malformed JSON");
    BAD("{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1]}",
        "t.jsonl:3: field 'input_length': missing");
    BAD("{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 1, \"hash_ids\": [1]}",
        "t.jsonl:3: field 'input_length': expected an integer");
    BAD("{\"timestamp\": 0, \"input_length\": -4, \"output_length\": 1, \"hash_ids\": [1]}",
        "field 'input_length'");
    BAD("{\"timestamp\": 0, \"input_length\": 2.5, \"output_length\": 1, \"hash_ids\": [1]}",
        "field 'input_length'");
    BAD("{\"timestamp\": 0, \"input_length\": \"4\", \"output_length\": 1, \"hash_ids\": [1]}",
        "field 'input_length'");
    BAD("{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 0, \"hash_ids\": [1]}",
        "t.jsonl:3: field 'output_length'");
    BAD("{\"timestamp\": 0, \"input_length\": 4, \"hash_ids\": [1]}",
        "field 'output_length': missing");
    BAD("{\"timestamp\": -1, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]}",
        "t.jsonl:3: field 'timestamp'");
    BAD("{\"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]}",
        "field 'timestamp': missing");
    BAD("{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": []}",
        "field 'hash_ids'");
    BAD("{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": 7}",
        "field 'hash_ids'");
    BAD("{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1}",
        "field 'hash_ids': missing");
    BAD("{\"timestamp\": 0, \"input_length\": 8, \"output_length\": 1, \"hash_ids\": [1, -2]}",
        "t.jsonl:3: field 'hash_ids': element 1");
    /* input_length must fit the ids: 4 ids of 4 tokens hold 13..16 tokens */
    BAD("{\"timestamp\": 0, \"input_length\": 17, \"output_length\": 1, \"hash_ids\": [1,2,3,4]}",
        "t.jsonl:3: input_length 17 does not fit 4 hash_ids of 4 tokens (needs 13..16)");
    BAD("{\"timestamp\": 0, \"input_length\": 12, \"output_length\": 1, \"hash_ids\": [1,2,3,4]}",
        "input_length 12 does not fit 4 hash_ids");
    BAD("[1, 2, 3]", "t.jsonl:3: expected a JSON object");
    BAD("{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]} x",
        "t.jsonl:3: unexpected text after the JSON object");
#undef BAD
    /* a length past max_tokens */
    p.max_tokens = 3;
    load_fails(ok, &p, KVC_EPARSE,
               "t.jsonl:1: field 'input_length': expected an integer in [1, 3]");
}

static void trace_edge_cases(void **state)
{
    (void)state;
    kvc_workload_params_t p = small_blocks(4);
    load_fails("", &p, KVC_EPARSE, "t.jsonl: no requests");
    load_fails("  \n\n \t\n", &p, KVC_EPARSE, "no requests");
    load_fails("{\"foo\": 1}\n", &p, KVC_EPARSE, "t.jsonl:1: unknown record");
    load_fails("{\"timestamp\": 0\n", &p, KVC_EPARSE, "malformed JSON");

    /* unknown keys are ignored */
    kvc_workload_t *w = load_ok("{\"timestamp\": 5, \"input_length\": 4, \"output_length\": 1, "
                                "\"hash_ids\": [1], \"session\": \"abc\", \"extra\": [1, 2]}\n",
                                &p);
    assert_int_equal(kvc_workload_size(w), 1);
    kvc_workload_destroy(w);

    /* out-of-order timestamps: sorted stably, counted */
    w = load_ok(
        "{\"timestamp\": 300, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]}\n"
        "{\"timestamp\": 100, \"input_length\": 4, \"output_length\": 2, \"hash_ids\": [2]}\n"
        "{\"timestamp\": 300, \"input_length\": 4, \"output_length\": 3, \"hash_ids\": [3]}\n"
        "{\"timestamp\": 100, \"input_length\": 4, \"output_length\": 4, \"hash_ids\": [4]}\n"
        "{\"timestamp\": 200, \"input_length\": 4, \"output_length\": 5, \"hash_ids\": [5]}\n",
        &p);
    const uint32_t want_out[] = {2, 4, 5, 1, 3};
    for (size_t i = 0; i < 5; i++)
        assert_int_equal(kvc_workload_request(w, i)->n_output, want_out[i]);
    kvc_workload_stats_t s;
    assert_ok(kvc_workload_stats(w, &s));
    assert_int_equal(s.n_reordered, 3); /* 100, 100 and 200 came after 300 */
    assert_true(s.duration_s == 0.3);
    kvc_workload_destroy(w);

    /* max_requests keeps the first lines; time_scale compresses time */
    p.max_requests = 2;
    p.time_scale = 0.5;
    w = load_ok(
        "{\"timestamp\": 1000, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]}\n"
        "{\"timestamp\": 3000, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [2]}\n"
        "this line is never read\n",
        &p);
    assert_int_equal(kvc_workload_size(w), 2);
    assert_true(kvc_workload_request(w, 0)->arrival_s == 0.5);
    assert_true(kvc_workload_request(w, 1)->arrival_s == 1.5);
    kvc_workload_destroy(w);
}

/* The real sample: counts, and every block equal to the first block with its id. */
static void mooncake_sample_loads_with_its_sharing(void **state)
{
    (void)state;
    kvc_workload_t *w = spec_ok(MOONCAKE_SAMPLE, NULL);
    assert_int_equal(kvc_workload_size(w), 3993);
    kvc_workload_stats_t s;
    assert_ok(kvc_workload_stats(w, &s));
    assert_int_equal(s.prompt_tokens, 61194628);
    assert_int_equal(s.output_tokens, 595432);
    assert_int_equal(s.unique_blocks, 43924);
    assert_int_equal(s.n_reordered, 0);
    assert_true(fabs(s.duration_s - 1022.025) < 1e-9);
    /* prefix extension sharing: fewer tokens stored than the prompts hold */
    assert_true(s.stored_tokens < s.prompt_tokens);

    /* Read the ids independently and check each block against the first
     * occurrence of its id. */
    FILE *f = fopen(MOONCAKE_SAMPLE, "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0, i = 0;
    const size_t max_id = 1 << 20;
    const kvc_token_t **first = calloc(max_id, sizeof *first);
    assert_non_null(first);
    size_t shared_blocks = 0;
    while (getline(&line, &cap, f) > 0) {
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        const kvc_sim_request_t *r = kvc_workload_request(w, i);
        const cJSON *ids = cJSON_GetObjectItem(o, "hash_ids");
        size_t j = 0;
        for (const cJSON *it = ids->child; it; it = it->next, j++) {
            size_t id = (size_t)it->valuedouble;
            assert_true(id < max_id);
            size_t n = KVC_MIN(512, r->n_prompt - j * 512);
            if (first[id]) {
                assert_memory_equal(first[id], r->tokens + j * 512, n * sizeof(kvc_token_t));
                shared_blocks++;
            } else {
                first[id] = r->tokens + j * 512;
            }
        }
        assert_int_equal(j, (r->n_prompt + 511) / 512);
        cJSON_Delete(o);
        i++;
    }
    assert_int_equal(i, 3993);
    assert_true(shared_blocks > 70000); /* 121,877 ids, 43,924 distinct */
    free(line);
    fclose(f);

    /* the real hashing path sees the sharing: requests 42 and 49 (60 ids each)
     * share their first 57 hash ids, so their first 57 * 32 blocks of 16
     * tokens hash alike and the next ones do not */
    const kvc_sim_request_t *a = kvc_workload_request(w, 42), *b = kvc_workload_request(w, 49);
    kvc_pool_params_t pp = kvc_pool_params_default();
    kvc_pool_t *pool;
    assert_ok(kvc_pool_create(&pp, &pool));
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    kvc_prefix_t *pc;
    assert_ok(kvc_prefix_create(pool, &cp, &pc));
    size_t na, nb;
    kvc_hash128_t *ha = malloc((a->n_prompt / 16) * sizeof *ha),
                  *hb = malloc((b->n_prompt / 16) * sizeof *hb);
    assert_ok(kvc_prefix_hash(pc,
                              &(kvc_prefix_query_t){.tokens = a->tokens, .n_tokens = a->n_prompt},
                              ha, a->n_prompt / 16, &na));
    assert_ok(kvc_prefix_hash(pc,
                              &(kvc_prefix_query_t){.tokens = b->tokens, .n_tokens = b->n_prompt},
                              hb, b->n_prompt / 16, &nb));
    size_t common = 0;
    while (common < KVC_MIN(na, nb) && kvc_hash128_eq(ha[common], hb[common])) common++;
    assert_int_equal(common, 57 * 32);
    free(ha);
    free(hb);
    kvc_prefix_destroy(pc);
    kvc_pool_destroy(pool);
    free(first);
    kvc_workload_destroy(w);
}

static void mooncake_on_demand_matches_contiguous(void **state)
{
    (void)state;
    kvc_workload_params_t p = kvc_workload_params_default();
    p.max_requests = KVC_TEST_SANITIZED ? 400 : 0;
    kvc_workload_t *eager = spec_ok(MOONCAKE_SAMPLE, &p);
    p.tokens_on_demand = true;
    kvc_workload_t *lazy = spec_ok(MOONCAKE_SAMPLE, &p);
    assert_int_equal(kvc_workload_size(eager), kvc_workload_size(lazy));
    kvc_token_t *buf = malloc(200000 * sizeof *buf);
    for (size_t i = 0; i < kvc_workload_size(eager); i++) {
        const kvc_sim_request_t *e = kvc_workload_request(eager, i),
                                *l = kvc_workload_request(lazy, i);
        assert_null(l->tokens);
        assert_int_equal(e->n_prompt, l->n_prompt);
        assert_ok(kvc_workload_prompt(lazy, i, buf, 200000));
        assert_memory_equal(buf, e->tokens, e->n_prompt * sizeof *buf);
        assert_memory_equal(e->output_tokens, l->output_tokens, e->n_output * sizeof *buf);
    }
    assert_int_equal(kvc_workload_prompt(lazy, 0, buf, kvc_workload_request(lazy, 0)->n_prompt - 1),
                     KVC_ERANGE);
    assert_int_equal(kvc_workload_prompt(lazy, kvc_workload_size(lazy), buf, 200000), KVC_EINVAL);
    kvc_workload_stats_t se, sl;
    assert_ok(kvc_workload_stats(eager, &se));
    assert_ok(kvc_workload_stats(lazy, &sl));
    assert_true(sl.bytes < se.bytes);
    assert_true(sl.stored_tokens < se.stored_tokens);
    /* the writer assembles on-demand prompts */
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    FILE *fa = open_memstream(&a, &la), *fb = open_memstream(&b, &lb);
    kvc_workload_params_t small = kvc_workload_params_default();
    small.max_requests = 3;
    kvc_workload_t *e3 = spec_ok(MOONCAKE_SAMPLE, &small);
    small.tokens_on_demand = true;
    kvc_workload_t *l3 = spec_ok(MOONCAKE_SAMPLE, &small);
    assert_ok(kvc_workload_write_jsonl(e3, fa));
    assert_ok(kvc_workload_write_jsonl(l3, fb));
    fclose(fa);
    fclose(fb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
    free(buf);
    kvc_workload_destroy(e3);
    kvc_workload_destroy(l3);
    kvc_workload_destroy(eager);
    kvc_workload_destroy(lazy);
}

/* ---- kvcache JSONL ---------------------------------------------------------------------- */
static void jsonl_records_with_header_and_defaults(void **state)
{
    (void)state;
    kvc_workload_t *w = load_ok(
        "{\"kvcache_workload\": 1, \"tenants\": [\"alice\", \"bob\"], \"classes\": "
        "[\"interactive\", \"batch\"]}\n"
        "{\"arrival_s\": 0.5, \"tokens\": [1, 2, 3], \"output\": 2, \"tenant\": \"bob\", "
        "\"class\": \"batch\", "
        "\"conversation\": 9, \"turn\": 1, \"max_output\": 10, \"think_s\": 2.5}\n"
        "{\"arrival_s\": 0.25, \"tokens\": [7], \"output_tokens\": [4, 5, 6], \"ignored\": true}\n",
        NULL);
    assert_int_equal(kvc_workload_format(w), KVC_WORKLOAD_JSONL);
    assert_int_equal(kvc_workload_n_tenants(w), 2);
    assert_string_equal(kvc_workload_tenant_name(w, 1), "bob");
    assert_string_equal(kvc_workload_class_name(w, 0), "interactive");
    assert_null(kvc_workload_class_name(w, 2));
    const kvc_sim_request_t *r = kvc_workload_request(w, 0); /* sorted: 0.25 first */
    assert_true(r->arrival_s == 0.25);
    assert_int_equal(r->n_prompt, 1);
    assert_int_equal(r->n_output, 3);
    assert_int_equal(r->max_output, 3);
    assert_int_equal(r->tenant, 0); /* undeclared in the record: the first declared */
    assert_int_equal(r->output_tokens[2], 6);
    r = kvc_workload_request(w, 1);
    assert_int_equal(r->tokens[2], 3);
    assert_int_equal(r->tenant, 1);
    assert_int_equal(r->priority, 1);
    assert_int_equal(r->conversation, 9);
    assert_int_equal(r->turn, 1);
    assert_int_equal(r->max_output, 10);
    assert_true(r->think_s == 2.5);
    assert_int_equal(r->n_output, 2);
    kvc_workload_destroy(w);

    /* no header: names in order of first appearance, "default" when absent */
    w = load_ok(
        "{\"arrival_s\": 0, \"tokens\": [1], \"output\": 1, \"tenant\": \"x\"}\n"
        "{\"arrival_s\": 1, \"tokens\": [1], \"output\": 1}\n"
        "{\"arrival_s\": 2, \"tokens\": [1], \"output\": 1, \"tenant\": \"x\", \"class\": \"c\"}\n",
        NULL);
    assert_int_equal(kvc_workload_n_tenants(w), 2);
    assert_string_equal(kvc_workload_tenant_name(w, 0), "x");
    assert_string_equal(kvc_workload_tenant_name(w, 1), "default");
    assert_int_equal(kvc_workload_request(w, 1)->tenant, 1);
    assert_string_equal(kvc_workload_class_name(w, kvc_workload_request(w, 2)->priority), "c");
    /* generated output tokens are deterministic and within the vocabulary */
    kvc_workload_t *w2 = load_ok(
        "{\"arrival_s\": 0, \"tokens\": [1], \"output\": 1, \"tenant\": \"x\"}\n"
        "{\"arrival_s\": 1, \"tokens\": [1], \"output\": 1}\n"
        "{\"arrival_s\": 2, \"tokens\": [1], \"output\": 1, \"tenant\": \"x\", \"class\": \"c\"}\n",
        NULL);
    assert_true(kvc_hash128_eq(digest(w), digest(w2)));
    kvc_workload_destroy(w);
    kvc_workload_destroy(w2);
}

static void jsonl_errors_name_line_and_field(void **state)
{
    (void)state;
    load_fails("{\"arrival_s\": 0, \"output\": 1}\n", NULL, KVC_EPARSE,
               "unknown record"); /* neither tokens nor hash_ids on line 1 */
    const char *ok = "{\"arrival_s\": 0, \"tokens\": [1], \"output\": 1}\n";
    char buf[512];
#define BAD(line2, want)                                \
    do {                                                \
        snprintf(buf, sizeof buf, "%s%s\n", ok, line2); \
        load_fails(buf, NULL, KVC_EPARSE, want);        \
    } while (0)
    BAD("{\"arrival_s\": 0, \"output\": 1}", "t.jsonl:2: field 'tokens': missing");
    BAD("{\"arrival_s\": 0, \"tokens\": [], \"output\": 1}", "t.jsonl:2: field 'tokens'");
    BAD("{\"arrival_s\": 0, \"tokens\": [1, -1], \"output\": 1}",
        "t.jsonl:2: field 'tokens': element 1 is not a token id");
    BAD("{\"arrival_s\": 0, \"tokens\": [2147483648], \"output\": 1}", "element 0");
    BAD("{\"arrival_s\": 0, \"tokens\": [1]}", "t.jsonl:2: field 'output': missing");
    BAD("{\"arrival_s\": 0, \"tokens\": [1], \"output\": 0}", "field 'output'");
    BAD("{\"arrival_s\": 0, \"tokens\": [1], \"output\": 2, \"output_tokens\": [1]}",
        "field 'output' is 2 but 'output_tokens' holds 1");
    BAD("{\"arrival_s\": 0, \"tokens\": [1], \"output\": 2, \"max_output\": 1}",
        "t.jsonl:2: field 'max_output'");
    BAD("{\"tokens\": [1], \"output\": 1}", "t.jsonl:2: field 'arrival_s': missing");
    BAD("{\"arrival_s\": -2, \"tokens\": [1], \"output\": 1}", "field 'arrival_s'");
    BAD("{\"arrival_s\": 0, \"tokens\": [1], \"output\": 1, \"turn\": -1}", "field 'turn'");
    BAD("{\"arrival_s\": 0, \"tokens\": [1], \"output\": 1, \"tenant\": 3}", "field 'tenant'");
    BAD("{\"arrival_s\": 0, \"tokens\": [1], \"output\": 1, \"think_s\": -1}", "field 'think_s'");
    BAD("{\"kvcache_workload\": 1}",
        "t.jsonl:2: the kvcache_workload header must be the first line");
#undef BAD
    load_fails("{\"kvcache_workload\": 2}\n"
               "{\"arrival_s\": 0, \"tokens\": [1], \"output\": 1}\n",
               NULL, KVC_EPARSE, "t.jsonl:1: field 'kvcache_workload': unsupported version");
    load_fails("{\"kvcache_workload\": 1, \"tenants\": [\"a\"]}\n"
               "{\"arrival_s\": 0, \"tokens\": [1], \"output\": 1, \"tenant\": \"b\"}\n",
               NULL, KVC_EPARSE, "t.jsonl:2: field 'tenant': 'b' is not declared");
    load_fails("{\"kvcache_workload\": 1, \"classes\": []}\n", NULL, KVC_EPARSE, "field 'classes'");
    load_fails("{\"kvcache_workload\": 1}\n", NULL, KVC_EPARSE, "no requests");
}

/* ---- files and inline specs ------------------------------------------------------------- */
static void files_and_inline_specs(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvc_workload_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/trace.jsonl", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2]}\n",
          f);
    fclose(f);
    char err[512];
    kvc_workload_t *w = NULL;
    assert_ok(kvc_workload_load(path, NULL, &w, err, sizeof err));
    assert_int_equal(kvc_workload_request(w, 0)->n_prompt, 600);
    kvc_workload_destroy(w);

    /* a file that is not there, a directory */
    snprintf(path, sizeof path, "%s/missing.jsonl", dir);
    assert_int_equal(kvc_workload_load(path, NULL, &w, err, sizeof err), KVC_EIO);
    assert_null(w);
    assert_non_null(strstr(err, "missing.jsonl: cannot open"));
    assert_int_equal(kvc_workload_load(dir, NULL, &w, err, sizeof err), KVC_EIO);
    assert_non_null(strstr(err, "cannot read"));
    assert_int_equal(kvc_workload_load("", NULL, &w, err, sizeof err), KVC_EINVAL);

    /* a spec file (multi-line JSON) with an error reports line and column */
    snprintf(path, sizeof path, "%s/spec.json", dir);
    f = fopen(path, "w");
    fputs("{\n  \"streams\": [\n    {\"requests\": 3,, }\n  ]\n}\n", f);
    fclose(f);
    assert_int_equal(kvc_workload_load(path, NULL, &w, err, sizeof err), KVC_EPARSE);
    char want[300];
    snprintf(want, sizeof want, "%s:3:", path);
    if (!strstr(err, want)) fail_msg("'%s' lacks '%s'", err, want);
    assert_non_null(strstr(err, "malformed JSON"));
    unlink(path);
    snprintf(path, sizeof path, "%s/trace.jsonl", dir);
    unlink(path);
    rmdir(dir);

    /* inline specs */
    w = spec_ok("poisson:rate=4,n=50,prompt=100..200,output=7,tenant=t1,class=batch,max_output=64",
                NULL);
    assert_int_equal(kvc_workload_size(w), 50);
    assert_int_equal(kvc_workload_format(w), KVC_WORKLOAD_SPEC);
    assert_string_equal(kvc_workload_tenant_name(w, 0), "t1");
    assert_string_equal(kvc_workload_class_name(w, 0), "batch");
    for (size_t i = 0; i < 50; i++) {
        const kvc_sim_request_t *r = kvc_workload_request(w, i);
        assert_true(r->n_prompt >= 100 && r->n_prompt <= 200);
        assert_int_equal(r->n_output, 7);
        assert_int_equal(r->max_output, 64);
    }
    kvc_workload_destroy(w);
    w = spec_ok("burst:size=5,interval=2,duration=10,prompt=16,output=4", NULL);
    assert_int_equal(kvc_workload_size(w), 25);
    kvc_workload_destroy(w);
    spec_fails("poisson:rate=4,n=5,prompt=1,output=1,bogus=1", KVC_EPARSE, "unknown key 'bogus'");
    spec_fails("poisson:rate=x,n=5,prompt=1,output=1", KVC_EPARSE,
               "key 'rate': 'x' is not a number");
    spec_fails("poisson:rate=1..3,n=5,prompt=1,output=1", KVC_EPARSE, "key 'rate'");
    spec_fails("poisson:rate=4,n=5,prompt=1,output", KVC_EPARSE, "'output' is not key=value");
    spec_fails("poisson:rate=4,n=5,n=6,prompt=1,output=1", KVC_EPARSE, "given twice");
    spec_fails("poisson:n=5,prompt=1,output=1", KVC_EPARSE, "streams[0].arrival.rate: missing");
    spec_fails("poisson:rate=1,n=5,output=1", KVC_EPARSE, "streams[0].prompt: missing");
    /* an unknown process is said to be one, not "no such file" */
    spec_fails("gaussian:rate=1", KVC_EPARSE, "'gaussian' is not an arrival process");
    spec_fails("zipf:rate=5,n=20", KVC_EPARSE,
               "no such file, and 'zipf' is not an arrival process");
    spec_fails("no/such/dir/trace.jsonl", KVC_EIO, "cannot open");
}

static void inline_specs_longer_than_a_file_name_load(void **state)
{
    (void)state;
    char spec[600], tenant[400];
    memset(tenant, 't', 300);
    tenant[300] = '\0';
    snprintf(spec, sizeof spec, "poisson:rate=4,n=5,prompt=10,output=2,tenant=%s", tenant);
    assert_true(strlen(spec) > 255); /* too long for a file name: ENAMETOOLONG, not ENOENT */
    kvc_workload_t *w = spec_ok(spec, NULL);
    assert_int_equal(kvc_workload_size(w), 5);
    assert_string_equal(kvc_workload_tenant_name(w, 0), tenant);
    kvc_workload_destroy(w);
    /* its errors are the spec's, not the file system's */
    snprintf(spec, sizeof spec, "poisson:rate=4,n=5,prompt=10,tenant=%s", tenant);
    spec_fails(spec, KVC_EPARSE, "streams[0].output: missing");
}

/* ---- times past the horizon -------------------------------------------------------------------
 */
static void times_past_the_horizon_are_refused_with_line_and_field(void **state)
{
    (void)state;
    kvc_workload_params_t p = kvc_workload_params_default();
    /* Mooncake: 1e300 ms used to be taken, and every latency printed as 0.000 */
    load_fails("{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]}\n"
               "{\"timestamp\": 1e300, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": "
               "[1]}\n",
               NULL, KVC_EPARSE,
               "t.jsonl:2: field 'timestamp': 1e+300 ms is past the simulator's horizon");
    /* exactly at the horizon is kept; the time scale counts */
    const char *edge =
        "{\"timestamp\": 1e12, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]}\n";
    kvc_workload_t *w = load_ok(edge, NULL);
    assert_true(kvc_workload_request(w, 0)->arrival_s == KVC_SIM_MAX_TIME_S);
    kvc_workload_destroy(w);
    p.time_scale = 2;
    load_fails(edge, &p, KVC_EPARSE, "at time scale 2 is 2e+09 s, past the simulator's horizon");
    /* kvcache JSONL: arrival_s and think_s, scaled */
    p.time_scale = 1e9;
    load_fails("{\"arrival_s\": 1e300, \"tokens\": [1, 2], \"output\": 1}\n", &p, KVC_EPARSE,
               "t.jsonl:1: field 'arrival_s'");
    load_fails("{\"arrival_s\": 0, \"tokens\": [1], \"output\": 1, \"think_s\": 2}\n", &p,
               KVC_EPARSE, "t.jsonl:1: field 'think_s': 2 s at time scale 1e+09 is 2e+09 s");
    /* specs: the first request past it is named */
    p.time_scale = 1e9;
    char err[512];
    assert_int_equal(
        kvc_workload_load("poisson:rate=5,n=20,prompt=10,output=2", &p, &w, err, sizeof err),
        KVC_EPARSE);
    assert_null(w);
    if (!strstr(err, "streams[0]: request") || !strstr(err, "past the simulator's horizon"))
        fail_msg("'%s'", err);
    /* the builder */
    p = kvc_workload_params_default();
    assert_ok(kvc_workload_create(&p, &w));
    kvc_token_t t[2] = {1, 2};
    kvc_sim_request_t r = {.arrival_s = 2e9, .tokens = t, .n_prompt = 2, .n_output = 1};
    assert_int_equal(kvc_workload_add(w, &r), KVC_EINVAL);
    r.arrival_s = 1;
    r.think_s = INFINITY;
    assert_int_equal(kvc_workload_add(w, &r), KVC_EINVAL);
    r.think_s = 1e9;
    assert_ok(kvc_workload_add(w, &r));
    kvc_workload_destroy(w);
}

/* ---- messages quote input with its control bytes escaped ----------------------------------------
 */
static void messages_escape_control_bytes(void **state)
{
    (void)state;
    /* a tenant name with an escape sequence and a bell, undeclared in the header */
    const char *text = "{\"kvcache_workload\": 1, \"tenants\": [\"a\"]}\n"
                       "{\"arrival_s\": 0, \"tokens\": [1], \"output\": 1, \"tenant\": "
                       "\"x\\u001b[31m\\u0007y\"}\n";
    load_fails(text, NULL, KVC_EPARSE, "'x\\x1b[31m\\x07y' is not declared");
    /* a file name with a newline and a tab */
    char err[512];
    kvc_workload_t *w = NULL;
    assert_int_equal(kvc_workload_load_buffer("{", 1, "bad\nname\t", NULL, &w, err, sizeof err),
                     KVC_EPARSE);
    assert_non_null(strstr(err, "bad\\nname\\t"));
    for (const char *c = err; *c; c++) assert_true((unsigned char)*c >= 0x20 && *c != 0x7f);
    /* an inline spec */
    assert_int_equal(kvc_workload_load("poisson:rate=1,n=2,prompt=1,output=1,bogus\x7f=1", NULL, &w,
                                       err, sizeof err),
                     KVC_EPARSE);
    assert_non_null(strstr(err, "unknown key 'bogus\\x7f'"));
}

/* ---- synthetic specs --------------------------------------------------------------------- */
static const char *two_stream_spec =
    "{\"tenants\": [\"alice\", \"bob\"], \"classes\": [\"interactive\", \"batch\"],"
    " \"description\": \"two tenants\","
    " \"streams\": ["
    "  {\"name\": \"chat\", \"tenant\": \"alice\", \"class\": \"interactive\", \"requests\": 300,"
    "   \"arrival\": {\"process\": \"poisson\", \"rate\": 20},"
    "   \"prompt\": {\"dist\": \"uniform\", \"min\": 80, \"max\": 200},"
    "   \"output\": {\"dist\": \"lognormal\", \"mean\": 50, \"stddev\": 30, \"max\": 400},"
    "   \"shared_prefix\": {\"groups\": 3, \"tokens\": 64},"
    "   \"conversation\": {\"turns\": {\"dist\": \"uniform\", \"min\": 1, \"max\": 5},"
    "                      \"think_s\": {\"dist\": \"exponential\", \"mean\": 3},"
    "                      \"user_tokens\": {\"dist\": \"uniform\", \"min\": 5, \"max\": 40}}},"
    "  {\"name\": \"batch\", \"tenant\": \"bob\", \"class\": \"batch\", \"duration_s\": 20,"
    "   \"arrival\": {\"process\": \"burst\", \"size\": 8, \"interval_s\": 2.5},"
    "   \"prompt\": 300, \"output\": {\"dist\": \"normal\", \"mean\": 100, \"stddev\": 20},"
    "   \"max_output\": 110}"
    "]}";

static void specs_are_deterministic(void **state)
{
    (void)state;
    kvc_workload_params_t p = kvc_workload_params_default();
    p.seed = 7;
    kvc_workload_t *a = load_ok(two_stream_spec, &p);
    kvc_workload_t *b = load_ok(two_stream_spec, &p);
    assert_int_equal(kvc_workload_format(a), KVC_WORKLOAD_SPEC);
    assert_true(kvc_hash128_eq(digest(a), digest(b)));
    /* byte for byte through the writer too */
    char *ba = NULL, *bb = NULL;
    size_t la = 0, lb = 0;
    FILE *fa = open_memstream(&ba, &la), *fb = open_memstream(&bb, &lb);
    assert_ok(kvc_workload_write_jsonl(a, fa));
    assert_ok(kvc_workload_write_jsonl(b, fb));
    fclose(fa);
    fclose(fb);
    assert_int_equal(la, lb);
    assert_memory_equal(ba, bb, la);
    free(ba);
    free(bb);
    p.seed = 8;
    kvc_workload_t *c = load_ok(two_stream_spec, &p);
    assert_false(kvc_hash128_eq(digest(a), digest(c)));
    /* the second stream: 8 bursts of 8 in 20 s; outputs clamped to max_output */
    size_t n_batch = 0;
    for (size_t i = 0; i < kvc_workload_size(a); i++) {
        const kvc_sim_request_t *r = kvc_workload_request(a, i);
        if (i) assert_true(r->arrival_s >= kvc_workload_request(a, i - 1)->arrival_s);
        if (r->tenant != 1) continue;
        n_batch++;
        assert_int_equal(r->priority, 1);
        assert_int_equal(r->n_prompt, 300);
        assert_true(r->n_output <= 110);
        assert_int_equal(r->max_output, 110);
        double k = r->arrival_s / 2.5;
        assert_true(k == floor(k));
    }
    assert_int_equal(n_batch, 64);
    kvc_workload_destroy(a);
    kvc_workload_destroy(b);
    kvc_workload_destroy(c);
}

static void max_requests_keeps_the_first_requests(void **state)
{
    (void)state;
    kvc_workload_params_t p = kvc_workload_params_default();
    kvc_workload_t *all = load_ok(two_stream_spec, &p);
    p.max_requests = 100;
    kvc_workload_t *some = load_ok(two_stream_spec, &p);
    assert_int_equal(kvc_workload_size(some), 100);
    for (size_t i = 0; i < 100; i++)
        assert_same_request(kvc_workload_request(all, i), kvc_workload_request(some, i));
    kvc_workload_destroy(all);
    kvc_workload_destroy(some);
}

static int cmp_hash(const void *a, const void *b)
{
    const kvc_hash128_t *x = a, *y = b;
    if (x->hi != y->hi) return x->hi < y->hi ? -1 : 1;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Sorted hashes of every request's first n tokens. */
static kvc_hash128_t *first_hashes(const kvc_workload_t *w, size_t n_tokens)
{
    size_t n = kvc_workload_size(w);
    kvc_hash128_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = kvc_hash128(kvc_workload_request(w, i)->tokens, n_tokens * sizeof(kvc_token_t), 0);
    qsort(h, n, sizeof *h, cmp_hash);
    return h;
}

static void shared_prefix_groups_share_exactly_their_prefix(void **state)
{
    (void)state;
    kvc_workload_t *w = spec_ok(
        "poisson:rate=50,n=600,prompt=100..300,output=20,groups=3,prefix=64,fraction=0.5", NULL);
    size_t n = kvc_workload_size(w);
    /* the first 64 tokens: three values shared by about half the requests,
     * every other request unique */
    kvc_hash128_t *h = first_hashes(w, 64);
    size_t groups = 0, grouped = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && kvc_hash128_eq(h[i], h[j])) j++;
        if (j - i > 1) {
            groups++;
            grouped += j - i;
        }
        i = j;
    }
    assert_int_equal(groups, 3);
    assert_true(grouped > 240 && grouped < 360);
    free(h);
    /* and right after the prefix every request differs */
    h = first_hashes(w, 72);
    for (size_t i = 1; i < n; i++) assert_false(kvc_hash128_eq(h[i - 1], h[i]));
    free(h);
    kvc_workload_destroy(w);

    /* a prompt that cannot hold the prefix is refused */
    spec_fails("poisson:rate=5,n=10,prompt=64,output=5,groups=2,prefix=64", KVC_EPARSE,
               "streams[0].prompt: the shortest prompt (64) must exceed shared_prefix.tokens (64)");
}

/* Plain requests are windows of one tape: no two share a first block. */
static void plain_requests_share_no_prefix(void **state)
{
    (void)state;
    size_t n = 20000 / KVC_TEST_SANITIZER_DIVISOR;
    char spec[128];
    snprintf(spec, sizeof spec, "poisson:rate=50,n=%zu,prompt=16..64,output=1..100", n);
    kvc_workload_t *w = spec_ok(spec, NULL);
    kvc_hash128_t *h = first_hashes(w, 16);
    for (size_t i = 1; i < n; i++) assert_false(kvc_hash128_eq(h[i - 1], h[i]));
    free(h);
    kvc_workload_stats_t s;
    assert_ok(kvc_workload_stats(w, &s));
    assert_true(s.stored_tokens < n + 200); /* one tape, not a copy per request */
    kvc_workload_destroy(w);
}

static void conversations_resend_their_whole_history(void **state)
{
    (void)state;
    kvc_workload_t *w = load_ok(two_stream_spec, NULL);
    size_t n = kvc_workload_size(w);
    uint64_t max_conv = 0;
    size_t later_turns = 0;
    for (size_t i = 0; i < n; i++) {
        const kvc_sim_request_t *r = kvc_workload_request(w, i);
        if (!r->conversation) {
            assert_int_equal(r->turn, 0);
            continue;
        }
        /* ids are numbered by first appearance */
        assert_true(r->conversation <= max_conv + 1);
        if (r->conversation == max_conv + 1) {
            assert_int_equal(r->turn, 0);
            assert_true(r->think_s == 0);
            max_conv = r->conversation;
            continue;
        }
        /* find the previous turn */
        const kvc_sim_request_t *prev = NULL;
        for (size_t j = i; j-- > 0;) {
            const kvc_sim_request_t *o = kvc_workload_request(w, j);
            if (o->conversation == r->conversation) {
                prev = o;
                break;
            }
        }
        assert_non_null(prev);
        assert_int_equal(r->turn, prev->turn + 1);
        assert_true(r->n_prompt > prev->n_prompt + prev->n_output);
        assert_true(r->n_prompt - prev->n_prompt - prev->n_output <= 40); /* user_tokens */
        assert_memory_equal(r->tokens, prev->tokens, prev->n_prompt * sizeof(kvc_token_t));
        assert_memory_equal(r->tokens + prev->n_prompt, prev->output_tokens,
                            prev->n_output * sizeof(kvc_token_t));
        assert_true(fabs(r->arrival_s - (prev->arrival_s + r->think_s)) < 1e-9);
        later_turns++;
    }
    assert_true(max_conv > 50);
    assert_true(later_turns > 50);
    kvc_workload_stats_t s;
    assert_ok(kvc_workload_stats(w, &s));
    assert_int_equal(s.n_conversations, max_conv);
    kvc_workload_destroy(w);

    /* a history that outgrows max_tokens ends the conversation */
    kvc_workload_params_t p = kvc_workload_params_default();
    p.max_tokens = 100;
    w = spec_ok("fixed:rate=1,n=30,prompt=30,output=20,turns=10,user=10", &p);
    for (size_t i = 0; i < kvc_workload_size(w); i++) {
        assert_true(kvc_workload_request(w, i)->n_prompt <= 100);
        /* prompts 30, 60, 90, then 120 > 100: three turns at most */
        assert_true(kvc_workload_request(w, i)->turn <= 2);
    }
    kvc_workload_destroy(w);
}

/* Length distributions and arrival processes, on large samples. */
static void check_prompt_dist(const char *dist, double want_mean, double want_sd, double lo,
                              double hi)
{
    size_t n = 100000 / KVC_TEST_SANITIZER_DIVISOR;
    char spec[512];
    snprintf(
        spec, sizeof spec,
        "{\"streams\": [{\"requests\": %zu, \"arrival\": {\"process\": \"poisson\", \"rate\": 10},"
        " \"prompt\": %s, \"output\": 1}]}",
        n, dist);
    kvc_workload_t *w = load_ok(spec, NULL);
    assert_int_equal(kvc_workload_size(w), n);
    double *v = malloc(n * sizeof *v), *gap = malloc(n * sizeof *gap);
    for (size_t i = 0; i < n; i++) {
        const kvc_sim_request_t *r = kvc_workload_request(w, i);
        v[i] = r->n_prompt;
        gap[i] = r->arrival_s - (i ? kvc_workload_request(w, i - 1)->arrival_s : 0);
        assert_true(v[i] >= lo && v[i] <= hi);
    }
    double m = mean_of(v, n), sd = sd_of(v, n);
    double tol = KVC_TEST_SANITIZED ? 0.05 : 0.02;
    if (fabs(m - want_mean) > tol * want_mean)
        fail_msg("%s: mean %.2f, want %.2f", dist, m, want_mean);
    if (want_sd > 0 && fabs(sd - want_sd) > 2 * tol * want_sd)
        fail_msg("%s: stddev %.2f, want %.2f", dist, sd, want_sd);
    if (want_sd == 0) assert_true(sd == 0);
    /* Poisson at rate 10: exponential gaps of mean and stddev 0.1 */
    assert_true(fabs(mean_of(gap, n) - 0.1) < tol * 0.1);
    assert_true(fabs(sd_of(gap, n) - 0.1) < 2 * tol * 0.1);
    free(v);
    free(gap);
    kvc_workload_destroy(w);
}

static void distributions_match_their_parameters(void **state)
{
    (void)state;
    check_prompt_dist("512", 512, 0, 512, 512);
    check_prompt_dist("{\"dist\": \"fixed\", \"value\": 77}", 77, 0, 77, 77);
    check_prompt_dist("{\"dist\": \"uniform\", \"min\": 100, \"max\": 200}", 150,
                      sqrt((101.0 * 101.0 - 1) / 12), 100, 200);
    check_prompt_dist("{\"dist\": \"normal\", \"mean\": 1000, \"stddev\": 200}", 1000, 200, 1,
                      KVC_SIM_MAX_TOKENS);
    check_prompt_dist("{\"dist\": \"lognormal\", \"mean\": 1000, \"stddev\": 500}", 1000, 500, 1,
                      KVC_SIM_MAX_TOKENS);
    check_prompt_dist("{\"dist\": \"exponential\", \"mean\": 300}", 300, 300, 1,
                      KVC_SIM_MAX_TOKENS);
    /* clamping holds the bounds */
    check_prompt_dist("{\"dist\": \"normal\", \"mean\": 1000, \"stddev\": 1, \"min\": 1000, "
                      "\"max\": 1000}",
                      1000, 0, 1000, 1000);

    /* fixed arrivals are evenly spaced; bursts arrive together */
    kvc_workload_t *w = spec_ok("fixed:rate=4,n=9,prompt=8,output=2,start=1", NULL);
    for (size_t i = 0; i < 9; i++)
        assert_true(kvc_workload_request(w, i)->arrival_s == 1 + (double)i / 4);
    kvc_workload_destroy(w);
    w = spec_ok("uniform:rate=2,duration=3,prompt=8,output=2", NULL);
    assert_int_equal(kvc_workload_size(w), 6); /* 0, 0.5, ... 2.5 */
    kvc_workload_destroy(w);
    w = spec_ok("burst:size=3,interval=10,n=7,prompt=8,output=2", NULL);
    const double want[] = {0, 0, 0, 10, 10, 10, 20};
    for (size_t i = 0; i < 7; i++) assert_true(kvc_workload_request(w, i)->arrival_s == want[i]);
    kvc_workload_destroy(w);
}

static void spec_errors_name_the_field(void **state)
{
    (void)state;
#define SPEC(body)                                                                                 \
    "{\"streams\": [{\"requests\": 5, \"arrival\": {\"process\": \"poisson\", \"rate\": 1}, " body \
    "}]}"
    load_fails(SPEC("\"prompt\": 10, \"output\": 5, \"rat\": 3"), NULL, KVC_EPARSE,
               "t.jsonl: streams[0]: unknown key 'rat'");
    load_fails(SPEC("\"output\": 5"), NULL, KVC_EPARSE, "streams[0].prompt: missing");
    load_fails(SPEC("\"prompt\": 0, \"output\": 5"), NULL, KVC_EPARSE,
               "streams[0].prompt: expected an integer in [1, 16777216]");
    load_fails(SPEC("\"prompt\": 10.5, \"output\": 5"), NULL, KVC_EPARSE, "streams[0].prompt");
    load_fails(SPEC("\"prompt\": {\"dist\": \"zipf\"}, \"output\": 5"), NULL, KVC_EPARSE,
               "streams[0].prompt.dist: unknown distribution 'zipf'");
    load_fails(SPEC("\"prompt\": {\"mean\": 3}, \"output\": 5"), NULL, KVC_EPARSE,
               "streams[0].prompt.dist: expected one of");
    load_fails(SPEC("\"prompt\": {\"dist\": \"uniform\", \"min\": 9, \"max\": 3}, \"output\": 5"),
               NULL, KVC_EPARSE, "streams[0].prompt: min is greater than max");
    load_fails(SPEC("\"prompt\": {\"dist\": \"uniform\", \"min\": 9}, \"output\": 5"), NULL,
               KVC_EPARSE, "streams[0].prompt.max: missing");
    load_fails(SPEC("\"prompt\": {\"dist\": \"normal\", \"mean\": 9}, \"output\": 5"), NULL,
               KVC_EPARSE, "streams[0].prompt.stddev: missing");
    load_fails(
        SPEC("\"prompt\": {\"dist\": \"normal\", \"mean\": 9, \"stddev\": -1}, \"output\": 5"),
        NULL, KVC_EPARSE, "streams[0].prompt.stddev");
    load_fails(
        SPEC("\"prompt\": {\"dist\": \"lognormal\", \"mean\": 0, \"stddev\": 1}, \"output\": 5"),
        NULL, KVC_EPARSE, "streams[0].prompt.mean");
    load_fails(SPEC("\"prompt\": {\"dist\": \"fixed\", \"value\": 3, \"mean\": 2}, \"output\": 5"),
               NULL, KVC_EPARSE, "streams[0].prompt: unknown key 'mean'");
    load_fails(SPEC("\"prompt\": 10, \"output\": 5, \"max_output\": 0"), NULL, KVC_EPARSE,
               "streams[0].max_output");
    load_fails(SPEC("\"prompt\": 10, \"output\": 5, \"shared_prefix\": {\"groups\": 2}"), NULL,
               KVC_EPARSE, "streams[0].shared_prefix.tokens: missing");
    load_fails(SPEC("\"prompt\": 10, \"output\": 5, \"conversation\": {\"think_s\": 1}"), NULL,
               KVC_EPARSE, "streams[0].conversation.turns: missing");
    load_fails(
        SPEC("\"prompt\": 10, \"output\": 5, \"conversation\": {\"turns\": 2, \"think_s\": -1}"),
        NULL, KVC_EPARSE, "streams[0].conversation.think_s");
    load_fails(SPEC("\"prompt\": 10, \"output\": 5, \"class\": \"\""), NULL, KVC_EPARSE,
               "streams[0].class: expected a non-empty string");
#undef SPEC
    load_fails("{\"streams\": []}", NULL, KVC_EPARSE, "streams: expected a non-empty array");
    load_fails("{\"streams\": [3]}", NULL, KVC_EPARSE, "streams[0]: expected an object");
    load_fails("{\"streams\": [{\"arrival\": {\"process\": \"poisson\", \"rate\": 1}, \"prompt\": "
               "1, \"output\": 1}]}",
               NULL, KVC_EPARSE, "streams[0]: give 'requests' or 'duration_s'");
    load_fails("{\"streams\": [{\"requests\": 1, \"arrival\": {\"process\": \"gamma\"}, "
               "\"prompt\": 1, \"output\": 1}]}",
               NULL, KVC_EPARSE, "streams[0].arrival.process: expected");
    load_fails("{\"streams\": [{\"requests\": 1, \"arrival\": {\"process\": \"poisson\", \"rate\": "
               "0}, \"prompt\": 1, \"output\": 1}]}",
               NULL, KVC_EPARSE, "streams[0].arrival.rate: expected a number > 0");
    load_fails("{\"streams\": [{\"requests\": 1, \"arrival\": {\"process\": \"burst\", \"size\": "
               "2}, \"prompt\": 1, \"output\": 1}]}",
               NULL, KVC_EPARSE, "streams[0].arrival.interval_s: missing");
    load_fails(
        "{\"classes\": [\"a\"], \"streams\": [{\"requests\": 1, \"class\": \"b\", \"arrival\": "
        "{\"process\": \"poisson\", \"rate\": 1}, \"prompt\": 1, \"output\": 1}]}",
        NULL, KVC_EPARSE, "streams[0].class: 'b' is not listed in 'classes'");
    load_fails("{\"streams\": [{\"requests\": 1}], \"seeds\": 3}", NULL, KVC_EPARSE,
               "spec: unknown key 'seeds'");
    load_fails("{\"streams\": [{\"requests\": 1, \"arrival\": {\"process\": \"poisson\", \"rate\": "
               "1}, \"prompt\": 1, \"output\": 1}]} {}",
               NULL, KVC_EPARSE, "unexpected text after the spec object");
    /* a duration too short for any arrival gives no requests */
    load_fails("{\"streams\": [{\"duration_s\": 1, \"arrival\": {\"process\": \"poisson\", "
               "\"rate\": 1e-9}, \"prompt\": 1, \"output\": 1}]}",
               NULL, KVC_EPARSE, "t.jsonl: no requests");
}

static void declared_classes_fix_the_priority_order(void **state)
{
    (void)state;
    kvc_workload_t *w =
        load_ok("{\"classes\": [\"interactive\", \"batch\"], \"streams\": ["
                " {\"class\": \"batch\", \"requests\": 2, \"arrival\": {\"process\": \"fixed\", "
                "\"rate\": 1}, \"prompt\": 4, \"output\": 1},"
                " {\"class\": \"interactive\", \"tenant\": \"t\", \"requests\": 2, \"arrival\": "
                "{\"process\": \"fixed\", \"rate\": 1}, \"prompt\": 4, \"output\": 1}]}",
                NULL);
    assert_int_equal(kvc_workload_n_classes(w), 2);
    assert_string_equal(kvc_workload_class_name(w, 0), "interactive");
    /* equal arrivals keep stream order: batch first */
    assert_int_equal(kvc_workload_request(w, 0)->priority, 1);
    assert_int_equal(kvc_workload_request(w, 1)->priority, 0);
    assert_string_equal(kvc_workload_tenant_name(w, 0), "default");
    assert_string_equal(kvc_workload_tenant_name(w, 1), "t");
    assert_string_equal(kvc_workload_class_names(w)[1], "batch");
    assert_string_equal(kvc_workload_tenant_names(w)[1], "t");
    kvc_workload_destroy(w);
}

/* ---- the builder and the writer --------------------------------------------------------- */
static void built_workloads_round_trip_through_jsonl(void **state)
{
    (void)state;
    kvc_workload_t *w;
    assert_ok(kvc_workload_create(NULL, &w));
    uint32_t alice, bob, hi;
    assert_ok(kvc_workload_add_tenant(w, "alice", &alice));
    assert_ok(kvc_workload_add_tenant(w, "b\"o\\b\n", &bob));
    assert_ok(kvc_workload_add_tenant(w, "alice", &hi));
    assert_int_equal(hi, alice);
    assert_ok(kvc_workload_add_class(w, "hi", &hi));
    assert_int_equal(kvc_workload_add_class(w, "", &hi), KVC_EINVAL);
    kvc_token_t toks[5] = {5, 6, 7, 8, 9}, outs[2] = {1, 2};
    kvc_sim_request_t r = {.arrival_s = 1.0 / 3,
                           .tokens = toks,
                           .n_prompt = 5,
                           .n_output = 2,
                           .tenant = bob,
                           .output_tokens = outs,
                           .conversation = 3,
                           .turn = 2,
                           .think_s = 0.7};
    assert_ok(kvc_workload_add(w, &r));
    r.output_tokens = NULL;
    r.max_output = 9;
    r.arrival_s = 2;
    assert_ok(kvc_workload_add(w, &r));
    /* refused: earlier arrival, empty prompt, max_output < n_output, unknown tenant */
    kvc_sim_request_t bad = r;
    bad.arrival_s = 1;
    assert_int_equal(kvc_workload_add(w, &bad), KVC_EINVAL);
    bad = r;
    bad.n_prompt = 0;
    assert_int_equal(kvc_workload_add(w, &bad), KVC_EINVAL);
    bad = r;
    bad.max_output = 1;
    assert_int_equal(kvc_workload_add(w, &bad), KVC_EINVAL);
    bad = r;
    bad.tenant = 2;
    assert_int_equal(kvc_workload_add(w, &bad), KVC_EINVAL);
    bad = r;
    bad.arrival_s = NAN;
    assert_int_equal(kvc_workload_add(w, &bad), KVC_EINVAL);
    assert_int_equal(kvc_workload_size(w), 2);
    const kvc_sim_request_t *q = kvc_workload_request(w, 1);
    assert_int_equal(q->max_output, 9);
    assert_int_equal(q->tokens[4], 9);
    assert_ptr_not_equal(q->tokens, toks); /* copied */
    for (int i = 0; i < 2; i++)
        assert_true(q->output_tokens[i] >= 0 && q->output_tokens[i] < 32000);
    assert_int_equal(kvc_workload_format(w), KVC_WORKLOAD_BUILT);

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_ok(kvc_workload_write_jsonl(w, f));
    fclose(f);
    kvc_workload_t *back = load_ok(buf, NULL);
    assert_int_equal(kvc_workload_size(back), 2);
    for (size_t i = 0; i < 2; i++)
        assert_same_request(kvc_workload_request(w, i), kvc_workload_request(back, i));
    assert_string_equal(kvc_workload_tenant_name(back, 1), "b\"o\\b\n");
    assert_string_equal(kvc_workload_class_name(back, 0), "hi");
    free(buf);
    kvc_workload_destroy(back);
    kvc_workload_destroy(w);

    /* a spec with every feature round-trips too */
    w = load_ok(two_stream_spec, NULL);
    buf = NULL;
    f = open_memstream(&buf, &len);
    assert_ok(kvc_workload_write_jsonl(w, f));
    fclose(f);
    back = load_ok(buf, NULL);
    assert_true(kvc_hash128_eq(digest(w), digest(back)));
    free(buf);
    kvc_workload_destroy(back);
    kvc_workload_destroy(w);
    kvc_workload_destroy(NULL);
}

/* The shipped example specs load (bounded: one of them has a million requests). */
static void example_specs_load(void **state)
{
    (void)state;
    DIR *d = opendir(KVC_SOURCE_DIR "/examples/workloads");
    assert_non_null(d);
    size_t n_specs = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".json")) continue;
        char path[512];
        snprintf(path, sizeof path, "%s/examples/workloads/%s", KVC_SOURCE_DIR, e->d_name);
        kvc_workload_params_t p = kvc_workload_params_default();
        p.max_requests = 2000;
        kvc_workload_t *w = spec_ok(path, &p);
        assert_int_equal(kvc_workload_format(w), KVC_WORKLOAD_SPEC);
        assert_true(kvc_workload_size(w) > 100);
        kvc_workload_destroy(w);
        n_specs++;
    }
    closedir(d);
    assert_true(n_specs >= 4);
}

/* ---- allocation faults ------------------------------------------------------------------- */
static void fault_each_allocation(const char *text, bool on_demand, size_t max_requests)
{
    size_t n_ok = 0;
    for (uint64_t n = 1;; n++) {
        kvc_failing_alloc_t st = {.fail_at = n};
        kvc_workload_params_t p = kvc_workload_params_default();
        p.block_tokens = 4;
        p.allocator = kvc_failing_allocator(&st);
        p.tokens_on_demand = on_demand;
        p.max_requests = max_requests;
        kvc_workload_t *w = NULL;
        char err[256] = "";
        int rc = kvc_workload_load_buffer(text, strlen(text), "f", &p, &w, err, sizeof err);
        kvc_workload_stats_t s;
        if (!rc && (rc = kvc_workload_stats(w, &s))) {
            kvc_workload_destroy(w); /* stats' own scratch allocation failed */
            w = NULL;
            snprintf(err, sizeof err, "stats");
        }
        if (st.n_failed) {
            if (rc != KVC_ENOMEM)
                fail_msg("allocation %llu: %s (%s)", (unsigned long long)n, kvc_errname(rc), err);
            assert_null(w);
            assert_true(err[0] != '\0');
        } else {
            assert_ok(rc);
            kvc_workload_destroy(w);
            n_ok++;
        }
        assert_int_equal(st.n_live, 0); /* nothing leaked */
        if (!st.n_failed) break;
    }
    assert_int_equal(n_ok, 1);
}

static void loaders_leak_nothing_under_allocation_faults(void **state)
{
    (void)state;
    const char *mooncake =
        "{\"timestamp\": 3, \"input_length\": 8, \"output_length\": 2, \"hash_ids\": [1, 2]}\n"
        "{\"timestamp\": 1, \"input_length\": 11, \"output_length\": 3, \"hash_ids\": [1, 2, 3]}\n"
        "{\"timestamp\": 2, \"input_length\": 6, \"output_length\": 1, \"hash_ids\": [7, 1]}\n";
    fault_each_allocation(mooncake, false, 0);
    fault_each_allocation(mooncake, true, 0);
    fault_each_allocation(
        "{\"kvcache_workload\": 1, \"tenants\": [\"a\", \"b\"]}\n"
        "{\"arrival_s\": 2, \"tokens\": [1, 2], \"output\": 2, \"tenant\": \"b\"}\n"
        "{\"arrival_s\": 1, \"tokens\": [3], \"output_tokens\": [4], \"class\": \"x\"}\n",
        false, 0);
    fault_each_allocation(two_stream_spec, false, 40);

    /* an inline spec, through kvc_workload_load */
    for (uint64_t n = 1;; n++) {
        kvc_failing_alloc_t st = {.fail_at = n};
        kvc_workload_params_t p = kvc_workload_params_default();
        p.allocator = kvc_failing_allocator(&st);
        kvc_workload_t *w = NULL;
        char err[256] = "";
        int rc = kvc_workload_load("poisson:rate=4,n=30,prompt=10..20,output=3,tenant=x", &p, &w,
                                   err, sizeof err);
        if (st.n_failed) {
            if (rc != KVC_ENOMEM) fail_msg("allocation %llu: %s", (unsigned long long)n, err);
            assert_null(w);
        } else {
            assert_ok(rc);
            kvc_workload_destroy(w);
        }
        assert_int_equal(st.n_live, 0);
        if (!st.n_failed) break;
    }

    /* the builder */
    for (uint64_t n = 1;; n++) {
        kvc_failing_alloc_t st = {.fail_at = n};
        kvc_workload_params_t p = kvc_workload_params_default();
        p.allocator = kvc_failing_allocator(&st);
        kvc_workload_t *w = NULL;
        kvc_token_t t[3] = {1, 2, 3};
        int rc = kvc_workload_create(&p, &w);
        uint32_t idx;
        if (!rc) rc = kvc_workload_add_tenant(w, "x", &idx);
        for (int i = 0; i < 3 && !rc; i++)
            rc = kvc_workload_add(
                w, &(kvc_sim_request_t){.arrival_s = i, .tokens = t, .n_prompt = 3, .n_output = 2});
        if (st.n_failed)
            assert_int_equal(rc, KVC_ENOMEM);
        else
            assert_ok(rc);
        kvc_workload_destroy(w);
        assert_int_equal(st.n_live, 0);
        if (!st.n_failed) break;
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(params_are_validated),
        cmocka_unit_test(mooncake_ids_materialise_by_id_alone),
        cmocka_unit_test(token_materialisation_is_pinned),
        cmocka_unit_test(mooncake_errors_name_line_and_field),
        cmocka_unit_test(trace_edge_cases),
        cmocka_unit_test(mooncake_sample_loads_with_its_sharing),
        cmocka_unit_test(mooncake_on_demand_matches_contiguous),
        cmocka_unit_test(jsonl_records_with_header_and_defaults),
        cmocka_unit_test(jsonl_errors_name_line_and_field),
        cmocka_unit_test(files_and_inline_specs),
        cmocka_unit_test(inline_specs_longer_than_a_file_name_load),
        cmocka_unit_test(times_past_the_horizon_are_refused_with_line_and_field),
        cmocka_unit_test(messages_escape_control_bytes),
        cmocka_unit_test(specs_are_deterministic),
        cmocka_unit_test(max_requests_keeps_the_first_requests),
        cmocka_unit_test(shared_prefix_groups_share_exactly_their_prefix),
        cmocka_unit_test(plain_requests_share_no_prefix),
        cmocka_unit_test(conversations_resend_their_whole_history),
        cmocka_unit_test(distributions_match_their_parameters),
        cmocka_unit_test(spec_errors_name_the_field),
        cmocka_unit_test(declared_classes_fix_the_priority_order),
        cmocka_unit_test(built_workloads_round_trip_through_jsonl),
        cmocka_unit_test(example_specs_load),
        cmocka_unit_test(loaders_leak_nothing_under_allocation_faults),
    };
    return cmocka_run_group_tests_name("workload", tests, NULL, NULL);
}
