/* test_sample.c - the sampling chain of kvcache/sample.h: greedy and its ties, penalty
 * arithmetic to the bit, every truncation's exact kept set on crafted logits and against a
 * full-sort reference on random rows, temperature sampling's distribution against the exact
 * softmax, one RNG draw per sample, raw logprobs against double, NaN / inf rows, parameter
 * checks, allocation failures, log-softmax top-k, and stop strings over streamed chunks. */
#include "test_helpers.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvcache/sample.h"
#include "model/sample_int.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static kvc_sampler_t *new_sampler(uint32_t n)
{
    kvc_sampler_t *s = NULL;
    assert_ok(kvc_sampler_create(n, NULL, &s));
    return s;
}

static kvc_token_t sample_one(kvc_sampler_t *s, const kvc_sampling_params_t *p, kvc_rng_t *rng,
                              const float *logits, const kvc_token_t *h, size_t nh)
{
    kvc_sample_result_t r;
    assert_ok(kvc_sample(s, p, rng, logits, h, nh, &r));
    return r.token;
}

/* The kept set as a bitmap over n (n <= 64). */
static uint64_t kept_mask(kvc_sampler_t *s, const kvc_sampling_params_t *p, const float *logits,
                          const kvc_token_t *h, size_t nh)
{
    kvc_token_t ids[64];
    uint32_t k = 0;
    assert_ok(kvc_sample_kept(s, p, logits, h, nh, ids, &k));
    uint64_t m = 0;
    for (uint32_t i = 0; i < k; i++) {
        assert_true(ids[i] >= 0 && ids[i] < 64);
        assert_false(m & (1ull << ids[i])); /* no duplicates */
        m |= 1ull << ids[i];
    }
    return m;
}

/* The set of tokens drawn over `draws` samples, as a bitmap (n <= 64). */
static uint64_t drawn_mask(kvc_sampler_t *s, const kvc_sampling_params_t *p, const float *logits,
                           int draws, uint64_t seed)
{
    kvc_rng_t rng;
    kvc_rng_seed(&rng, seed);
    uint64_t m = 0;
    for (int i = 0; i < draws; i++) m |= 1ull << sample_one(s, p, &rng, logits, NULL, 0);
    return m;
}

static uint64_t bits(const int *ids, int n)
{
    uint64_t m = 0;
    for (int i = 0; i < n; i++) m |= 1ull << ids[i];
    return m;
}

/* ---- parameters ---------------------------------------------------------------------- */

static void test_params_default_and_check(void **state)
{
    (void)state;
    kvc_sampling_params_t p = kvc_sampling_params_default();
    char msg[128];
    assert_ok(kvc_sampling_params_check(&p, msg, sizeof msg));
    assert_true(p.temperature == 1.0f && p.top_k == 0 && p.top_p == 1.0f && p.min_p == 0.0f);
    assert_true(p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f);
    assert_true(p.frequency_penalty == 0.0f && p.n_logprobs == 0);

    /* each refusal names its field */
#define REFUSE(field, stmt)                                                             \
    do {                                                                                \
        kvc_sampling_params_t q = kvc_sampling_params_default();                        \
        stmt;                                                                           \
        msg[0] = '\0';                                                                  \
        assert_int_equal(kvc_sampling_params_check(&q, msg, sizeof msg), KVC_EINVAL);   \
        if (!strstr(msg, field)) fail_msg("message '%s' does not name %s", msg, field); \
    } while (0)
    REFUSE("temperature", q.temperature = -0.1f);
    REFUSE("temperature", q.temperature = NAN);
    REFUSE("temperature", q.temperature = INFINITY);
    REFUSE("top_p", q.top_p = 0.0f);
    REFUSE("top_p", q.top_p = 1.0001f);
    REFUSE("top_p", q.top_p = NAN);
    REFUSE("min_p", q.min_p = -0.01f);
    REFUSE("min_p", q.min_p = 1.01f);
    REFUSE("min_p", q.min_p = NAN);
    REFUSE("repetition_penalty", q.repetition_penalty = 0.0f);
    REFUSE("repetition_penalty", q.repetition_penalty = -1.0f);
    REFUSE("repetition_penalty", q.repetition_penalty = INFINITY);
    REFUSE("presence_penalty", q.presence_penalty = 2.01f);
    REFUSE("presence_penalty", q.presence_penalty = -2.01f);
    REFUSE("presence_penalty", q.presence_penalty = NAN);
    REFUSE("frequency_penalty", q.frequency_penalty = 2.5f);
    REFUSE("frequency_penalty", q.frequency_penalty = NAN);
    REFUSE("n_logprobs", q.n_logprobs = 21);
#undef REFUSE
    /* the edges that are allowed */
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.presence_penalty = -2.0f;
    p.frequency_penalty = 2.0f;
    p.n_logprobs = 20;
    p.top_k = UINT32_MAX;
    assert_ok(kvc_sampling_params_check(&p, NULL, 0));
    assert_int_equal(kvc_sampling_params_check(NULL, msg, sizeof msg), KVC_EINVAL);

    /* kvc_sample refuses them too, drawing nothing */
    kvc_sampler_t *s = new_sampler(4);
    float l[4] = {0, 1, 2, 3};
    kvc_rng_t rng, before;
    kvc_rng_seed(&rng, 1);
    before = rng;
    kvc_sample_result_t r;
    p = kvc_sampling_params_default();
    p.top_p = 0.0f;
    assert_int_equal(kvc_sample(s, &p, &rng, l, NULL, 0, &r), KVC_EINVAL);
    assert_memory_equal(&rng, &before, sizeof rng);
    kvc_sampler_destroy(s);
}

/* ---- create / destroy ------------------------------------------------------------------ */

static void test_create_errors_and_alloc_failure(void **state)
{
    (void)state;
    kvc_sampler_t *s = (kvc_sampler_t *)0x1;
    assert_int_equal(kvc_sampler_create(0, NULL, &s), KVC_EINVAL);
    assert_int_equal(kvc_sampler_create((uint32_t)INT32_MAX + 1u, NULL, &s), KVC_EINVAL);
    assert_int_equal(kvc_sampler_create(8, NULL, NULL), KVC_EINVAL);
    assert_ptr_equal(s, (kvc_sampler_t *)0x1);
    kvc_sampler_destroy(NULL);

    int n_ok = 0;
    for (uint64_t at = 1; at < 32; at++) {
        kvc_failing_alloc_t fa = {.fail_at = at};
        kvc_allocator_t a = kvc_failing_allocator(&fa);
        s = NULL;
        int rc = kvc_sampler_create(1000, &a, &s);
        if (rc == 0) {
            assert_non_null(s);
            assert_int_equal(kvc_sampler_n_vocab(s), 1000);
            kvc_sampling_params_t p = kvc_sampling_params_default();
            float l[1000];
            for (int i = 0; i < 1000; i++) l[i] = (float)(i % 7);
            kvc_rng_t rng;
            kvc_rng_seed(&rng, 3);
            (void)sample_one(s, &p, &rng, l, NULL, 0);
            kvc_sampler_destroy(s);
            assert_int_equal(fa.n_live, 0);
            n_ok++;
            break;
        }
        assert_int_equal(rc, KVC_ENOMEM);
        assert_null(s);
        assert_int_equal(fa.n_failed, 1);
        assert_int_equal(fa.n_live, 0); /* nothing leaked */
    }
    assert_int_equal(n_ok, 1);

    /* stop strings */
    const char *stops[] = {"a", "bc"};
    for (uint64_t at = 1; at < 4; at++) {
        kvc_failing_alloc_t fa = {.fail_at = at};
        kvc_allocator_t a = kvc_failing_allocator(&fa);
        kvc_stop_t *st = NULL;
        int rc = kvc_stop_create(stops, 2, &a, &st);
        if (rc == 0) {
            kvc_stop_destroy(st);
            assert_int_equal(fa.n_live, 0);
            break;
        }
        assert_int_equal(rc, KVC_ENOMEM);
        assert_null(st);
        assert_int_equal(fa.n_live, 0);
    }
}

/* ---- greedy -------------------------------------------------------------------------- */

static void test_greedy_ties_lowest_id_and_draws_nothing(void **state)
{
    (void)state;
    kvc_sampler_t *s = new_sampler(6);
    kvc_sampling_params_t p = kvc_sampling_params_default();
    p.temperature = 0.0f;
    p.top_k = 2; /* truncation never removes the argmax: no effect on greedy */
    p.top_p = 0.1f;
    p.min_p = 0.9f;
    kvc_rng_t rng, before;
    kvc_rng_seed(&rng, 42);
    before = rng;
    float a[6] = {0.5f, 3.0f, -1.0f, 3.0f, 2.95f, 3.0f};
    assert_int_equal(sample_one(s, &p, &rng, a, NULL, 0), 1);
    float b[6] = {7.0f, 7.0f, 7.0f, 7.0f, 7.0f, 7.0f};
    assert_int_equal(sample_one(s, &p, &rng, b, NULL, 0), 0);
    float c[6] = {-5.0f, -4.0f, -3.0f, -2.0f, -1.0f, -0.5f};
    assert_int_equal(sample_one(s, &p, &rng, c, NULL, 0), 5);
    /* greedy needs no rng at all */
    kvc_sample_result_t r;
    assert_ok(kvc_sample(s, &p, NULL, c, NULL, 0, &r));
    assert_int_equal(r.token, 5);
    assert_memory_equal(&rng, &before, sizeof rng);

    /* penalties move the argmax: token 1 (3.0) seen twice with frequency 0.1 is 2.8, so
     * token 3 (3.0) wins; with 3 and 5 penalized too (2.9), token 4 (2.95) wins */
    p.frequency_penalty = 0.1f;
    kvc_token_t h1[] = {1, 1};
    assert_int_equal(sample_one(s, &p, &rng, a, h1, 2), 3);
    kvc_token_t h2[] = {1, 3, 5, 1};
    assert_int_equal(sample_one(s, &p, &rng, a, h2, 4), 4);
    p.penalty_last_n = 2; /* sees {5, 1}: token 3 is back at 3.0 */
    assert_int_equal(sample_one(s, &p, &rng, a, h2, 4), 3);
    assert_memory_equal(&rng, &before, sizeof rng);
    kvc_sampler_destroy(s);
}

/* ---- penalties, to the bit -------------------------------------------------------------
 * Token 1 is the probe (in the history c times), token 0 holds the expected penalized value.
 * With logits {expected, raw} greedy must pick 0 (a tie goes to the lower id, and a value
 * above expected would pick 1); with {nextbelow(expected), raw} it must pick 1.  Together:
 * the penalized value is exactly `expected`. */
static float expected_penalized(float l, int c, double rp, double pres, double freq)
{
    double x = l;
    if (c > 0) {
        x = x > 0 ? x / rp : x * rp;
        x -= freq * c + pres;
    }
    return (float)x;
}

static void probe_penalty(kvc_sampler_t *s, float raw, double rp, double pres, double freq,
                          const kvc_token_t *h, size_t nh, uint32_t last_n, int c_expected)
{
    kvc_sampling_params_t p = kvc_sampling_params_default();
    p.temperature = 0.0f;
    p.repetition_penalty = (float)rp;
    p.presence_penalty = (float)pres;
    p.frequency_penalty = (float)freq;
    p.penalty_last_n = last_n;
    float want = expected_penalized(raw, c_expected, (float)rp, (float)pres, (float)freq);
    float l[3] = {want, raw, -100.0f};
    if (sample_one(s, &p, NULL, l, h, nh) != 0)
        fail_msg("raw %g rp %g pres %g freq %g c %d: penalized above %.9g", (double)raw, rp, pres,
                 freq, c_expected, (double)want);
    l[0] = nextafterf(want, -INFINITY);
    if (sample_one(s, &p, NULL, l, h, nh) != 1)
        fail_msg("raw %g rp %g pres %g freq %g c %d: penalized below %.9g", (double)raw, rp, pres,
                 freq, c_expected, (double)want);
}

static void test_penalty_arithmetic_exact(void **state)
{
    (void)state;
    kvc_sampler_t *s = new_sampler(3);
    kvc_token_t once[] = {2, 1, 2};
    kvc_token_t thrice[] = {1, 2, 1, 2, 1};
    /* repetition: positive divided, negative multiplied */
    probe_penalty(s, 2.5f, 1.3, 0, 0, once, 3, 0, 1);
    probe_penalty(s, -1.5f, 1.3, 0, 0, once, 3, 0, 1);
    probe_penalty(s, 2.5f, 0.7, 0, 0, once, 3, 0, 1);   /* < 1 favours repeats */
    probe_penalty(s, 0.1f, 1.1, 0, 0, thrice, 5, 0, 3); /* count does not matter */
    /* presence once, frequency per occurrence */
    probe_penalty(s, 1.0f, 1.0, 0.5, 0, thrice, 5, 0, 3);
    probe_penalty(s, 1.0f, 1.0, 0, 0.25, thrice, 5, 0, 3);
    probe_penalty(s, 1.0f, 1.0, -0.75, -0.3, thrice, 5, 0, 3);
    /* all three at once: repetition first, then OpenAI's subtraction */
    probe_penalty(s, 3.7f, 1.2, 0.4, 0.15, thrice, 5, 0, 3);
    probe_penalty(s, -0.6f, 1.2, 0.4, 0.15, thrice, 5, 0, 3);
    /* penalty_last_n: {1, 2, 1, 2, 1} seen through its last 2 tokens {2, 1}: count 1 */
    probe_penalty(s, 3.7f, 1.2, 0.4, 0.15, thrice, 5, 2, 1);
    probe_penalty(s, 3.7f, 1.2, 0.4, 0.15, thrice, 5, 3, 2);
    probe_penalty(s, 3.7f, 1.2, 0.4, 0.15, thrice, 5, 100, 3);
    /* last 1 token is {1}; last 1 of `once` is {2}: token 1 untouched */
    probe_penalty(s, 3.7f, 1.2, 0.4, 0.15, once, 3, 1, 0);
    /* no history: nothing changes */
    probe_penalty(s, 3.7f, 1.2, 0.4, 0.15, NULL, 0, 0, 0);

    /* a history token outside the vocabulary: refused when a penalty reads it */
    kvc_sampling_params_t p = kvc_sampling_params_default();
    p.temperature = 0.0f;
    float l[3] = {0, 1, 2};
    kvc_token_t badh[] = {1, 3};
    kvc_token_t negh[] = {-1, 1};
    kvc_sample_result_t r;
    assert_ok(kvc_sample(s, &p, NULL, l, badh, 2, &r)); /* no penalty: not read */
    p.presence_penalty = 0.5f;
    assert_int_equal(kvc_sample(s, &p, NULL, l, badh, 2, &r), KVC_EINVAL);
    assert_int_equal(kvc_sample(s, &p, NULL, l, negh, 2, &r), KVC_EINVAL);
    p.penalty_last_n = 1; /* the bad token is outside the window */
    assert_ok(kvc_sample(s, &p, NULL, l, negh, 2, &r));
    assert_int_equal(kvc_sample(s, &p, NULL, l, NULL, 2, &r), KVC_EINVAL);

    /* the counts are scratch: a second call sees the same, not twice the penalty */
    p = kvc_sampling_params_default();
    p.temperature = 0.0f;
    for (int i = 0; i < 3; i++) probe_penalty(s, 1.0f, 1.0, 0, 0.25, thrice, 5, 0, 3);
    kvc_sampler_destroy(s);
}

/* ---- truncation: exact kept sets on crafted logits ------------------------------------
 * Eight tokens, probabilities (at temperature 1) by id:
 *   id:    0     1     2     3     4     5     6     7
 *   p:   0.10  0.30  0.02  0.15  0.10  0.20  0.05  0.08
 * rank:  ids 1, 5, 3, 0, 4 (tie with 0: lower id first), 7, 6, 2
 * cumulative: 0.30 0.50 0.65 0.75 0.85 0.93 0.98 1.00 */
static const double P8[8] = {0.10, 0.30, 0.02, 0.15, 0.10, 0.20, 0.05, 0.08};
static const int RANK8[8] = {1, 5, 3, 0, 4, 7, 6, 2};

static void logits8(float *l, double shift)
{
    for (int i = 0; i < 8; i++) l[i] = (float)(log(P8[i]) + shift);
    l[4] = l[0]; /* an exact tie */
}

static void test_top_k_exact_sets(void **state)
{
    (void)state;
    kvc_sampler_t *s = new_sampler(8);
    float l[8];
    logits8(l, 3.0);
    kvc_sampling_params_t p = kvc_sampling_params_default();
    for (uint32_t k = 1; k <= 10; k++) {
        p.top_k = k;
        uint64_t want = bits(RANK8, (int)KVC_MIN(k, 8u));
        assert_int_equal(kept_mask(s, &p, l, NULL, 0), want);
        /* the draws stay inside and (kept tokens have p >= 2 %) cover it */
        assert_int_equal(drawn_mask(s, &p, l, 3000, k), want);
    }
    p.top_k = 0;
    assert_int_equal(kept_mask(s, &p, l, NULL, 0), 0xff);
    kvc_sampler_destroy(s);
}

static void test_top_p_boundaries(void **state)
{
    (void)state;
    kvc_sampler_t *s = new_sampler(8);
    float l[8];
    logits8(l, -1.0);
    kvc_sampling_params_t p = kvc_sampling_params_default();
    const double cum[8] = {0.30, 0.50, 0.65, 0.75, 0.85, 0.93, 0.98, 1.00};
    for (int j = 0; j < 7; j++) {
        /* just below the cumulative mass of the first j+1: those j+1 suffice */
        p.top_p = (float)(cum[j] - 1e-4);
        assert_int_equal(kept_mask(s, &p, l, NULL, 0), bits(RANK8, j + 1));
        /* just above: one more is needed */
        p.top_p = (float)(cum[j] + 1e-4);
        assert_int_equal(kept_mask(s, &p, l, NULL, 0), bits(RANK8, j + 2));
        assert_int_equal(drawn_mask(s, &p, l, 3000, 7 + (uint64_t)j), bits(RANK8, j + 2));
    }
    p.top_p = 1e-6f; /* always at least the top token */
    assert_int_equal(kept_mask(s, &p, l, NULL, 0), bits(RANK8, 1));
    p.top_p = 1.0f;
    assert_int_equal(kept_mask(s, &p, l, NULL, 0), 0xff);
    kvc_sampler_destroy(s);
}

static void test_min_p_and_combinations(void **state)
{
    (void)state;
    kvc_sampler_t *s = new_sampler(8);
    float l[8];
    logits8(l, 0.0);
    kvc_sampling_params_t p = kvc_sampling_params_default();
    /* relative to the top (0.30): 0.20 -> 0.667, 0.15 -> 0.5, 0.10 -> 0.333, 0.08 -> 0.267 */
    p.min_p = 0.49f;
    assert_int_equal(kept_mask(s, &p, l, NULL, 0), bits(RANK8, 3));
    p.min_p = 0.51f;
    assert_int_equal(kept_mask(s, &p, l, NULL, 0), bits(RANK8, 2));
    p.min_p = 0.30f; /* both 0.10s (the tie) */
    assert_int_equal(kept_mask(s, &p, l, NULL, 0), bits(RANK8, 5));
    p.min_p = 1.0f;
    assert_int_equal(kept_mask(s, &p, l, NULL, 0), bits(RANK8, 1));
    p.min_p = 0.01f;
    assert_int_equal(kept_mask(s, &p, l, NULL, 0), 0xff);

    /* top_k then top_p: top_p renormalizes over the top 5 (mass 0.85); 0.7 * 0.85 = 0.595 is
     * reached by the first 3 (0.65); without top_k 0.7 needs 4 (0.75) */
    p = kvc_sampling_params_default();
    p.top_p = 0.7f;
    assert_int_equal(kept_mask(s, &p, l, NULL, 0), bits(RANK8, 4));
    p.top_k = 5;
    assert_int_equal(kept_mask(s, &p, l, NULL, 0), bits(RANK8, 3));
    p.top_k = 2;
    assert_int_equal(kept_mask(s, &p, l, NULL, 0), bits(RANK8, 2));
    /* then min_p */
    p.top_k = 5;
    p.top_p = 0.85f; /* 0.7225 of 0.85: 4 (0.90 would need 5: 0.75 < 0.765) */
    assert_int_equal(kept_mask(s, &p, l, NULL, 0), bits(RANK8, 4));
    p.min_p = 0.6f;
    assert_int_equal(kept_mask(s, &p, l, NULL, 0), bits(RANK8, 2));
    assert_int_equal(drawn_mask(s, &p, l, 2000, 5), bits(RANK8, 2));

    /* temperature comes last (llama.cpp): the kept set does not depend on it */
    p = kvc_sampling_params_default();
    p.top_p = 0.6f; /* 3 at temperature 1 */
    const float temps[] = {0.3f, 1.0f, 4.0f};
    for (int t = 0; t < 3; t++) {
        p.temperature = temps[t];
        assert_int_equal(kept_mask(s, &p, l, NULL, 0), bits(RANK8, 3));
        assert_int_equal(drawn_mask(s, &p, l, 4000, 11), bits(RANK8, 3));
    }

    /* penalties come first: penalizing token 1 (the top) out of the top 2 */
    p = kvc_sampling_params_default();
    p.top_k = 2;
    p.presence_penalty = 2.0f;
    kvc_token_t h[] = {1};
    int want[] = {5, 3};
    assert_int_equal(kept_mask(s, &p, l, h, 1), bits(want, 2));
    /* greedy's kept set is the argmax */
    p.temperature = 0.0f;
    assert_int_equal(kept_mask(s, &p, l, h, 1), 1ull << 5);
    kvc_sampler_destroy(s);
}

/* ---- truncation against a full-sort reference on random rows --------------------------- */

typedef struct {
    float v;
    int id;
} vid_t;

static int cmp_vid(const void *a, const void *b)
{
    const vid_t *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static float ref_sanitize(float x)
{
    if (isnan(x)) return -INFINITY;
    return x > FLT_MAX ? FLT_MAX : x;
}

/* The kept set by the definition in sample.h: sort everything, take prefixes. */
static uint32_t ref_kept(const float *logits, uint32_t n, const kvc_sampling_params_t *p,
                         const kvc_token_t *h, size_t nh, uint8_t *keep)
{
    vid_t *a = malloc(n * sizeof *a);
    uint32_t *cnt = calloc(n, sizeof *cnt);
    assert_non_null(a);
    assert_non_null(cnt);
    size_t h0 = p->penalty_last_n && nh > p->penalty_last_n ? nh - p->penalty_last_n : 0;
    for (size_t j = h0; j < nh; j++) cnt[h[j]]++;
    for (uint32_t i = 0; i < n; i++) {
        float x = ref_sanitize(logits[i]);
        if (cnt[i]) {
            double d = x;
            d = d > 0 ? d / p->repetition_penalty : d * p->repetition_penalty;
            d -= (double)p->frequency_penalty * cnt[i] + (double)p->presence_penalty;
            x = (float)d;
            if (x > FLT_MAX) x = FLT_MAX;
        }
        a[i] = (vid_t){x, (int)i};
    }
    qsort(a, n, sizeof *a, cmp_vid);
    uint32_t len = n;
    if (p->top_k && p->top_k < n) len = p->top_k;
    double m = a[0].v;
    if (p->top_p < 1.0f) {
        double z = 0, cum = 0;
        for (uint32_t j = 0; j < len; j++) z += exp(a[j].v - m);
        for (uint32_t j = 0; j < len; j++) {
            cum += exp(a[j].v - m);
            if (cum >= (double)p->top_p * z) {
                len = j + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        uint32_t j = 0;
        while (j < len && exp(a[j].v - m) >= p->min_p) j++;
        len = j;
    }
    memset(keep, 0, n);
    uint32_t k = 0;
    for (uint32_t j = 0; j < len; j++) {
        if (a[j].v == -INFINITY) continue;
        keep[a[j].id] = 1;
        k++;
    }
    free(a);
    free(cnt);
    return k;
}

static void test_truncation_matches_full_sort(void **state)
{
    (void)state;
    const uint32_t n = 20000;
    kvc_sampler_t *s = new_sampler(n);
    float *l = malloc(n * sizeof *l);
    kvc_token_t *ids = malloc(n * sizeof *ids);
    uint8_t *keep = malloc(n), *got = malloc(n);
    kvc_token_t h[64];
    kvc_rng_t g;
    kvc_rng_seed(&g, 2024);
    int rounds = 120 / KVC_TEST_SANITIZER_DIVISOR + 4;
    for (int round = 0; round < rounds; round++) {
        /* spreads from flat (random-weight models) to peaked (trained ones), quantized
         * sometimes so that ties are common */
        double spread = 0.2 + 12.0 * kvc_rng_double(&g);
        bool quantize = round % 3 == 0;
        for (uint32_t i = 0; i < n; i++) {
            double u = kvc_rng_double(&g) + kvc_rng_double(&g) + kvc_rng_double(&g) - 1.5;
            double x = u * spread;
            if (quantize) x = floor(x * 4) / 4;
            l[i] = (float)x;
        }
        if (round % 5 == 1) {
            l[kvc_rng_below(&g, n)] = NAN;
            l[kvc_rng_below(&g, n)] = -INFINITY;
        }
        kvc_sampling_params_t p = kvc_sampling_params_default();
        p.temperature = 0.8f;
        switch (round % 4) {
        case 0:
            p.top_p = 0.95f;
            break;
        case 1:
            p.top_p = (float)(0.05 + 0.9 * kvc_rng_double(&g));
            break;
        case 2:
            p.top_k = 1 + (uint32_t)kvc_rng_below(&g, 200);
            p.top_p = (float)(0.5 + 0.5 * kvc_rng_double(&g));
            break;
        case 3:
            p.top_p = (float)(0.3 + 0.7 * kvc_rng_double(&g));
            p.min_p = (float)(0.3 * kvc_rng_double(&g));
            break;
        }
        size_t nh = 0;
        if (round % 2) {
            nh = 1 + kvc_rng_below(&g, 64);
            for (size_t j = 0; j < nh; j++) h[j] = (kvc_token_t)kvc_rng_below(&g, n);
            p.repetition_penalty = 1.3f;
            p.frequency_penalty = 0.2f;
            p.presence_penalty = 0.3f;
            p.penalty_last_n = (uint32_t)kvc_rng_below(&g, 64);
        }
        uint32_t want = ref_kept(l, n, &p, h, nh, keep);
        uint32_t k = 0;
        assert_ok(kvc_sample_kept(s, &p, l, h, nh, ids, &k));
        memset(got, 0, n);
        for (uint32_t j = 0; j < k; j++) {
            assert_true(ids[j] >= 0 && (uint32_t)ids[j] < n);
            assert_false(got[ids[j]]);
            got[ids[j]] = 1;
        }
        if (k != want || memcmp(got, keep, n) != 0)
            fail_msg("round %d (top_k %u top_p %g min_p %g spread %g): kept %u, reference %u",
                     round, p.top_k, (double)p.top_p, (double)p.min_p, spread, k, want);
        /* and a sample lands inside */
        kvc_rng_t rng;
        kvc_rng_seed(&rng, (uint64_t)round);
        kvc_token_t t = sample_one(s, &p, &rng, l, h, nh);
        assert_true(keep[t]);
    }
    free(l);
    free(ids);
    free(keep);
    free(got);
    kvc_sampler_destroy(s);
}

/* ---- the distribution ------------------------------------------------------------------ */

/* Draw `draws` times; every count within 5 standard deviations (+1) of draws * want[i]
 * (with a fixed seed the outcome is fixed; the bound is what a correct sampler meets with
 * overwhelming probability for any seed). */
static void check_distribution(kvc_sampler_t *s, const kvc_sampling_params_t *p, const float *l,
                               uint32_t n, const double *want, int draws, uint64_t seed)
{
    long cnt[64] = {0};
    kvc_rng_t rng;
    kvc_rng_seed(&rng, seed);
    for (int i = 0; i < draws; i++) cnt[sample_one(s, p, &rng, l, NULL, 0)]++;
    for (uint32_t i = 0; i < n; i++) {
        double mu = draws * want[i], sd = sqrt(draws * want[i] * (1 - want[i]));
        if (fabs((double)cnt[i] - mu) > 5 * sd + 1)
            fail_msg("token %u: %ld draws, expected %.1f +- %.1f", i, cnt[i], mu, sd);
    }
    for (uint32_t i = n; i < 64; i++) assert_int_equal(cnt[i], 0);
}

static void test_temperature_distribution(void **state)
{
    (void)state;
    const uint32_t n = 7;
    kvc_sampler_t *s = new_sampler(n);
    kvc_sampler_t *s64 = new_sampler(64);
    float l[7] = {1.0f, -0.5f, 2.0f, 0.3f, 2.0f, -3.0f, 1.5f};
    const int draws = 200000 / KVC_TEST_SANITIZER_DIVISOR;
    const float temps[] = {0.7f, 1.0f, 1.8f};
    for (int t = 0; t < 3; t++) {
        kvc_sampling_params_t p = kvc_sampling_params_default();
        p.temperature = temps[t];
        double want[7], z = 0;
        for (uint32_t i = 0; i < n; i++) z += want[i] = exp((l[i] - 2.0) / temps[t]);
        for (uint32_t i = 0; i < n; i++) want[i] /= z;
        check_distribution(s, &p, l, n, want, draws, 100 + (uint64_t)t);
        /* top_k 3 keeps {2, 4, 6}: the softmax over them at the temperature */
        p.top_k = 3;
        z = 0;
        for (uint32_t i = 0; i < n; i++) {
            want[i] = (i == 2 || i == 4 || i == 6) ? exp((l[i] - 2.0) / temps[t]) : 0;
            z += want[i];
        }
        for (uint32_t i = 0; i < n; i++) want[i] /= z;
        check_distribution(s, &p, l, n, want, draws, 200 + (uint64_t)t);
        /* the same three among 64 tokens: few candidates take the one-by-one path */
        float l64[64];
        for (uint32_t i = 0; i < 64; i++) l64[i] = i < n ? l[i] : -10.0f - (float)i;
        check_distribution(s64, &p, l64, n, want, draws, 300 + (uint64_t)t);
    }
    kvc_sampler_destroy(s64);
    kvc_sampler_destroy(s);
}

/* ---- the RNG: reproducible, one draw a sample ----------------------------------------- */

static void test_seed_reproducible_and_one_draw_per_sample(void **state)
{
    (void)state;
    const uint32_t n = 5000;
    kvc_sampler_t *s = new_sampler(n);
    float *l = malloc(n * sizeof *l);
    kvc_rng_t g;
    kvc_rng_seed(&g, 9);
    for (uint32_t i = 0; i < n; i++) l[i] = (float)(2.0 * kvc_rng_double(&g));

    kvc_sampling_params_t cfg[6];
    for (int c = 0; c < 6; c++) cfg[c] = kvc_sampling_params_default();
    cfg[1].temperature = 0.8f, cfg[1].top_p = 0.95f;
    cfg[2].top_k = 1; /* one survivor: still one draw */
    cfg[3].top_k = 40, cfg[3].top_p = 0.9f, cfg[3].min_p = 0.05f, cfg[3].temperature = 1.3f;
    cfg[4].min_p = 1.0f;
    cfg[5].temperature = 1e-6f, cfg[5].repetition_penalty = 1.5f;
    kvc_token_t h[3] = {5, 17, 5};
    for (int c = 0; c < 6; c++) {
        kvc_rng_t a, b, d;
        kvc_rng_seed(&a, 1234);
        kvc_rng_seed(&b, 1234);
        kvc_rng_seed(&d, 1235);
        int differ = 0;
        for (int i = 0; i < 64; i++) {
            kvc_rng_t step = a;
            (void)kvc_rng_next(&step);
            kvc_token_t ta = sample_one(s, &cfg[c], &a, l, h, 3);
            assert_memory_equal(&a, &step, sizeof a); /* exactly one step */
            assert_int_equal(sample_one(s, &cfg[c], &b, l, h, 3), ta);
            differ += sample_one(s, &cfg[c], &d, l, h, 3) != ta;
        }
        if (c == 0 || c == 1 || c == 3) assert_true(differ > 0);
        if (c == 2 || c == 4) assert_int_equal(differ, 0); /* one candidate */
    }
    free(l);
    kvc_sampler_destroy(s);
}

/* ---- logprobs -------------------------------------------------------------------------- */

static void test_logprobs_raw_log_softmax(void **state)
{
    (void)state;
    const uint32_t n = 3000;
    kvc_sampler_t *s = new_sampler(n);
    float *l = malloc(n * sizeof *l);
    kvc_rng_t g;
    kvc_rng_seed(&g, 77);
    for (uint32_t i = 0; i < n; i++) l[i] = (float)floor(8.0 * kvc_rng_double(&g)) * 0.5f;
    double m = -INFINITY, z = 0;
    for (uint32_t i = 0; i < n; i++) m = fmax(m, l[i]);
    for (uint32_t i = 0; i < n; i++) z += exp(l[i] - m);
    double lz = log(z) + m;

    kvc_sampling_params_t p = kvc_sampling_params_default();
    p.n_logprobs = 20;
    p.temperature = 0.5f;
    p.top_k = 10;
    p.repetition_penalty = 2.0f;
    kvc_token_t h[4];
    uint32_t nh = 0;
    /* penalize some of the top: logprobs must not see it */
    for (uint32_t i = 0; i < n && nh < 4; i++)
        if (l[i] == (float)m) h[nh++] = (kvc_token_t)i;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 5);
    for (int it = 0; it < 20; it++) {
        kvc_sample_result_t r;
        assert_ok(kvc_sample(s, &p, &rng, l, h, nh, &r));
        assert_int_equal(r.n_top, 20);
        assert_float_equal(r.logprob, l[r.token] - lz, 1e-6);
        /* the top 20: by raw logit, ties by lower id (values are quantized: many ties) */
        uint32_t j = 0;
        for (float v = (float)m; j < 20; v -= 0.5f)
            for (uint32_t i = 0; i < n && j < 20; i++)
                if (l[i] == v) {
                    assert_int_equal(r.top_ids[j], (kvc_token_t)i);
                    assert_float_equal(r.top_logprobs[j], l[i] - lz, 1e-6);
                    j++;
                }
    }
    /* fewer tokens than asked: n_top is the vocabulary */
    kvc_sampler_t *s3 = new_sampler(3);
    float l3[3] = {0.0f, 1.0f, 0.0f};
    kvc_sample_result_t r;
    assert_ok(kvc_sample(s3, &p, &rng, l3, NULL, 0, &r));
    assert_int_equal(r.n_top, 3);
    assert_int_equal(r.top_ids[0], 1);
    assert_int_equal(r.top_ids[1], 0);
    assert_int_equal(r.top_ids[2], 2);
    double z3 = 2 + exp(1.0);
    assert_float_equal(r.top_logprobs[0], 1.0 - log(z3), 1e-6);
    assert_float_equal(r.top_logprobs[2], -log(z3), 1e-6);
    p.n_logprobs = 0;
    assert_ok(kvc_sample(s3, &p, &rng, l3, NULL, 0, &r));
    assert_int_equal(r.n_top, 0);
    /* the entries past n_top are defined (zero), not left over: results compare by bytes */
    memset(&r, 0x5a, sizeof r);
    p.n_logprobs = 1;
    assert_ok(kvc_sample(s3, &p, &rng, l3, NULL, 0, &r));
    for (int j = 1; j < KVC_SAMPLE_MAX_LOGPROBS; j++) {
        assert_int_equal(r.top_ids[j], 0);
        assert_true(r.top_logprobs[j] == 0.0f);
    }
    kvc_sampler_destroy(s3);
    free(l);
    kvc_sampler_destroy(s);
}

static void test_log_softmax_topk(void **state)
{
    (void)state;
    float l[6] = {0.5f, 2.0f, NAN, 2.0f, -INFINITY, 1.0f};
    kvc_token_t ids[6];
    double lp[6];
    assert_ok(kvc_log_softmax_topk(l, 6, 6, ids, lp));
    double z = exp(0.5) + 2 * exp(2.0) + exp(1.0);
    const kvc_token_t want[6] = {1, 3, 5, 0, 2, 4}; /* NaN and -inf tie at -inf: lower id */
    for (int i = 0; i < 6; i++) assert_int_equal(ids[i], want[i]);
    assert_float_equal(lp[0], 2.0 - log(z), 1e-12);
    assert_float_equal(lp[1], 2.0 - log(z), 1e-12);
    assert_float_equal(lp[2], 1.0 - log(z), 1e-12);
    assert_float_equal(lp[3], 0.5 - log(z), 1e-12);
    assert_true(isinf(lp[4]) && lp[4] < 0);
    assert_true(isinf(lp[5]) && lp[5] < 0);
    assert_ok(kvc_log_softmax_topk(l, 6, 2, ids, lp));
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);

    /* random rows against sort + double */
    const uint32_t n = 4096;
    float *r = malloc(n * sizeof *r);
    vid_t *a = malloc(n * sizeof *a);
    kvc_token_t top[33];
    double tlp[33];
    kvc_rng_t g;
    kvc_rng_seed(&g, 3);
    for (int round = 0; round < 20; round++) {
        for (uint32_t i = 0; i < n; i++) {
            r[i] = (float)floor(40 * kvc_rng_double(&g)) / 4.0f;
            a[i] = (vid_t){r[i], (int)i};
        }
        qsort(a, n, sizeof *a, cmp_vid);
        double mm = a[0].v, zz = 0;
        for (uint32_t i = 0; i < n; i++) zz += exp(r[i] - mm);
        uint32_t k = 1 + (uint32_t)kvc_rng_below(&g, 33);
        assert_ok(kvc_log_softmax_topk(r, n, k, top, tlp));
        for (uint32_t j = 0; j < k; j++) {
            assert_int_equal(top[j], a[j].id);
            assert_float_equal(tlp[j], a[j].v - mm - log(zz), 1e-12);
        }
    }
    free(r);
    free(a);

    assert_int_equal(kvc_log_softmax_topk(l, 6, 0, ids, lp), KVC_EINVAL);
    assert_int_equal(kvc_log_softmax_topk(l, 6, 7, ids, lp), KVC_EINVAL);
    assert_int_equal(kvc_log_softmax_topk(l, 0, 1, ids, lp), KVC_EINVAL);
    assert_int_equal(kvc_log_softmax_topk(NULL, 6, 1, ids, lp), KVC_EINVAL);
    assert_int_equal(kvc_log_softmax_topk(l, 6, 1, NULL, lp), KVC_EINVAL);
    assert_int_equal(kvc_log_softmax_topk(l, 6, 1, ids, NULL), KVC_EINVAL);
    float bad[3] = {NAN, -INFINITY, NAN};
    assert_int_equal(kvc_log_softmax_topk(bad, 3, 1, ids, lp), KVC_EINVAL);
}

/* ---- NaN / inf ------------------------------------------------------------------------- */

static void test_nan_and_inf_logits(void **state)
{
    (void)state;
    kvc_sampler_t *s = new_sampler(5);
    kvc_sampling_params_t p = kvc_sampling_params_default();
    kvc_sample_result_t r;
    kvc_rng_t rng, before;
    kvc_rng_seed(&rng, 8);

    /* NaN is -inf: never greedy, never drawn, logprob -inf */
    float a[5] = {NAN, 1.0f, NAN, 0.5f, -INFINITY};
    p.temperature = 0.0f;
    p.n_logprobs = 5;
    assert_ok(kvc_sample(s, &p, NULL, a, NULL, 0, &r));
    assert_int_equal(r.token, 1);
    assert_int_equal(r.top_ids[0], 1);
    assert_int_equal(r.top_ids[1], 3);
    assert_int_equal(r.top_ids[2], 0); /* the -inf tie, by id */
    assert_int_equal(r.top_ids[3], 2);
    assert_int_equal(r.top_ids[4], 4);
    assert_true(isinf(r.top_logprobs[2]) && r.top_logprobs[2] < 0);
    p.temperature = 1.5f;
    p.n_logprobs = 0;
    uint64_t drawn = drawn_mask(s, &p, a, 2000, 1);
    assert_int_equal(drawn, (1u << 1) | (1u << 3));
    kvc_token_t ids[5];
    uint32_t k;
    assert_ok(kvc_sample_kept(s, &p, a, NULL, 0, ids, &k));
    assert_int_equal(k, 2);

    /* +inf: the +inf tokens share everything */
    float b[5] = {3.0f, INFINITY, 1e30f, INFINITY, -2.0f};
    p.temperature = 0.0f;
    assert_ok(kvc_sample(s, &p, NULL, b, NULL, 0, &r));
    assert_int_equal(r.token, 1);
    assert_float_equal(r.logprob, -log(2.0), 1e-6);
    p.temperature = 0.9f;
    p.top_p = 0.9f;
    long c1 = 0, c3 = 0;
    kvc_rng_seed(&rng, 99);
    for (int i = 0; i < 4000; i++) {
        kvc_token_t t = sample_one(s, &p, &rng, b, NULL, 0);
        assert_true(t == 1 || t == 3);
        c1 += t == 1;
        c3 += t == 3;
    }
    assert_true(c1 > 1700 && c3 > 1700);

    /* nothing finite: refused, nothing drawn, *out untouched */
    float nan5[5] = {NAN, NAN, NAN, NAN, NAN};
    float ninf5[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    p = kvc_sampling_params_default();
    before = rng;
    memset(&r, 0x5a, sizeof r);
    kvc_sample_result_t same = r;
    assert_int_equal(kvc_sample(s, &p, &rng, nan5, NULL, 0, &r), KVC_EINVAL);
    assert_int_equal(kvc_sample(s, &p, &rng, ninf5, NULL, 0, &r), KVC_EINVAL);
    p.temperature = 0.0f;
    assert_int_equal(kvc_sample(s, &p, &rng, ninf5, NULL, 0, &r), KVC_EINVAL);
    /* finite, but penalized down to -inf: refused too */
    float low[5] = {-FLT_MAX, -FLT_MAX, -FLT_MAX, -FLT_MAX, -FLT_MAX};
    kvc_token_t all[5] = {0, 1, 2, 3, 4};
    p.repetition_penalty = 2.0f;
    assert_int_equal(kvc_sample(s, &p, &rng, low, all, 5, &r), KVC_EINVAL);
    assert_memory_equal(&rng, &before, sizeof rng);
    assert_memory_equal(&r, &same, sizeof r);
    /* and the argument checks */
    p = kvc_sampling_params_default();
    assert_int_equal(kvc_sample(s, &p, NULL, a, NULL, 0, &r), KVC_EINVAL); /* rng needed */
    assert_int_equal(kvc_sample(NULL, &p, &rng, a, NULL, 0, &r), KVC_EINVAL);
    assert_int_equal(kvc_sample(s, NULL, &rng, a, NULL, 0, &r), KVC_EINVAL);
    assert_int_equal(kvc_sample(s, &p, &rng, NULL, NULL, 0, &r), KVC_EINVAL);
    assert_int_equal(kvc_sample(s, &p, &rng, a, NULL, 0, NULL), KVC_EINVAL);
    assert_memory_equal(&rng, &before, sizeof rng);
    kvc_sampler_destroy(s);
}

/* ---- stop strings ---------------------------------------------------------------------- */

typedef struct {
    char out[4096];
    size_t n;
    bool matched;
} stream_t;

static void feed(kvc_stop_t *st, stream_t *o, const char *text, size_t len)
{
    char buf[4096 + KVC_STOP_MAX_BYTES];
    size_t k = 0;
    bool m = false;
    assert_ok(kvc_stop_feed(st, text, len, buf, sizeof buf, &k, &m));
    assert_true(o->n + k <= sizeof o->out);
    memcpy(o->out + o->n, buf, k);
    o->n += k;
    if (o->matched) assert_true(m); /* stays matched */
    o->matched = m;
}

static void finish(kvc_stop_t *st, stream_t *o)
{
    char buf[KVC_STOP_MAX_BYTES];
    size_t k = 0;
    assert_ok(kvc_stop_flush(st, buf, sizeof buf, &k));
    if (o->matched) assert_int_equal(k, 0);
    memcpy(o->out + o->n, buf, k);
    o->n += k;
}

/* Feed `text` in chunks of `chunk` bytes (0: whole); returns what came out. */
static stream_t run_stops(const char *const *stops, size_t n_stops, const char *text, size_t chunk)
{
    kvc_stop_t *st = NULL;
    assert_ok(kvc_stop_create(stops, n_stops, NULL, &st));
    stream_t o = {.n = 0};
    size_t len = strlen(text);
    if (!chunk) chunk = len ? len : 1;
    for (size_t i = 0; i < len; i += chunk) feed(st, &o, text + i, KVC_MIN(chunk, len - i));
    finish(st, &o);
    kvc_stop_destroy(st);
    return o;
}

static void expect_stop(const char *const *stops, size_t n, const char *text, const char *want,
                        bool matched)
{
    size_t len = strlen(text);
    for (size_t chunk = 0; chunk <= len + 1; chunk++) {
        stream_t o = run_stops(stops, n, text, chunk);
        if (o.n != strlen(want) || memcmp(o.out, want, o.n) != 0 || o.matched != matched)
            fail_msg("text '%s' in chunks of %zu: got '%.*s' (matched %d), want '%s' (%d)", text,
                     chunk, (int)o.n, o.out, o.matched, want, matched);
    }
}

static void test_stop_strings_match_and_hold(void **state)
{
    (void)state;
    const char *s1[] = {"STOP"};
    expect_stop(s1, 1, "hello STOP world", "hello ", true); /* inside a chunk; byte by byte */
    expect_stop(s1, 1, "STOP now", "", true);               /* at the very start */
    expect_stop(s1, 1, "no stop here", "no stop here", false);
    expect_stop(s1, 1, "STO STOx ST", "STO STOx ST", false); /* prefixes that fail */
    expect_stop(s1, 1, "SSTOP", "S", true);
    expect_stop(s1, 1, "ends with STO", "ends with STO", false); /* flushed at the end */
    expect_stop(s1, 1, "", "", false);
    /* one stop a prefix of another: the shorter completes first */
    const char *s2[] = {"abcd", "ab"};
    expect_stop(s2, 2, "xxabcd", "xx", true);
    expect_stop(s2, 2, "xxa", "xxa", false);
    /* the one that ends first wins, even if another started earlier */
    const char *s3[] = {"abcd", "bc"};
    expect_stop(s3, 2, "zabcd", "za", true);
    const char *s4[] = {"cd", "abcd"}; /* same end: the longer (earlier start) */
    expect_stop(s4, 2, "zabcd", "z", true);
    const char *s5[] = {"\n\n", "###", "User:"};
    expect_stop(s5, 3, "a\nb##c Use User: x", "a\nb##c Use ", true);
    /* multibyte UTF-8: a stop sharing a lead character with the text */
    const char *s6[] = {"日本語", "。"};
    expect_stop(s6, 2, "今日は日曜日。明日", "今日は日曜日", true);
    expect_stop(s6, 2, "日本で日本語を", "日本で", true);
    /* no stops: everything passes through, nothing held */
    expect_stop(NULL, 0, "anything at all", "anything at all", false);

    /* what is held back, step by step */
    kvc_stop_t *st = NULL;
    assert_ok(kvc_stop_create(s1, 1, NULL, &st));
    char buf[64 + KVC_STOP_MAX_BYTES];
    size_t k;
    bool m;
    assert_ok(kvc_stop_feed(st, "abST", 4, buf, sizeof buf, &k, &m));
    assert_int_equal(k, 2); /* "ST" may start STOP */
    assert_memory_equal(buf, "ab", 2);
    assert_false(m);
    assert_ok(kvc_stop_feed(st, "O", 1, buf, sizeof buf, &k, &m));
    assert_int_equal(k, 0);
    assert_ok(kvc_stop_feed(st, "N", 1, buf, sizeof buf, &k, &m));
    assert_int_equal(k, 4); /* "STON": released, held text first */
    assert_memory_equal(buf, "STON", 4);
    assert_ok(kvc_stop_feed(st, "S", 1, buf, sizeof buf, &k, &m));
    assert_int_equal(k, 0);
    /* errors leave the state alone */
    assert_int_equal(kvc_stop_feed(st, "TOP", 3, buf, 3 + KVC_STOP_MAX_BYTES - 1, &k, &m),
                     KVC_ERANGE);
    assert_int_equal(kvc_stop_feed(st, NULL, 3, buf, sizeof buf, &k, &m), KVC_EINVAL);
    assert_int_equal(kvc_stop_feed(st, "TOP", 3, NULL, sizeof buf, &k, &m), KVC_EINVAL);
    assert_ok(kvc_stop_feed(st, "TOPxyz", 6, buf, sizeof buf, &k, &m));
    assert_true(m);
    assert_int_equal(k, 0);
    assert_ok(kvc_stop_feed(st, "more", 4, buf, sizeof buf, &k, &m));
    assert_true(m);
    assert_int_equal(k, 0);
    assert_ok(kvc_stop_flush(st, buf, sizeof buf, &k));
    assert_int_equal(k, 0);
    kvc_stop_reset(st);
    assert_ok(kvc_stop_feed(st, "xST", 3, buf, sizeof buf, &k, &m));
    assert_false(m);
    assert_int_equal(k, 1);
    assert_int_equal(kvc_stop_flush(st, buf, 1, &k), KVC_ERANGE);
    assert_ok(kvc_stop_flush(st, buf, 2, &k));
    assert_int_equal(k, 2);
    assert_memory_equal(buf, "ST", 2);
    kvc_stop_destroy(st);
    kvc_stop_destroy(NULL);

    /* creation limits */
    char longs[KVC_STOP_MAX_BYTES + 2];
    memset(longs, 'x', sizeof longs);
    longs[KVC_STOP_MAX_BYTES] = '\0';
    const char *ok_long[] = {longs};
    assert_ok(kvc_stop_create(ok_long, 1, NULL, &st));
    kvc_stop_destroy(st);
    longs[KVC_STOP_MAX_BYTES] = 'x';
    longs[KVC_STOP_MAX_BYTES + 1] = '\0';
    st = NULL;
    assert_int_equal(kvc_stop_create(ok_long, 1, NULL, &st), KVC_ERANGE);
    const char *many[KVC_STOP_MAX_STRINGS + 1];
    for (int i = 0; i <= KVC_STOP_MAX_STRINGS; i++) many[i] = "x";
    assert_int_equal(kvc_stop_create(many, KVC_STOP_MAX_STRINGS + 1, NULL, &st), KVC_ERANGE);
    assert_ok(kvc_stop_create(many, KVC_STOP_MAX_STRINGS, NULL, &st));
    kvc_stop_destroy(st);
    const char *empty[] = {""};
    const char *nul[] = {NULL};
    st = NULL;
    assert_int_equal(kvc_stop_create(empty, 1, NULL, &st), KVC_EINVAL);
    assert_int_equal(kvc_stop_create(nul, 1, NULL, &st), KVC_EINVAL);
    assert_int_equal(kvc_stop_create(NULL, 1, NULL, &st), KVC_EINVAL);
    assert_int_equal(kvc_stop_create(s1, 1, NULL, NULL), KVC_EINVAL);
    assert_null(st);
}

/* Valid UTF-8 (the decoder's chunks always are). */
static bool utf8_valid(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if (((unsigned char)s[i + j] >> 6) != 2) return false;
        i += k;
    }
    return true;
}

static void test_stop_strings_random_chunking(void **state)
{
    (void)state;
    /* random texts over a small alphabet (with a 2- and a 3-byte character), random stops,
     * random chunk cuts at character boundaries: the output is the reference's (the match
     * that ends first, the longest at that end), and every emitted piece is valid UTF-8 */
    static const char *alpha[] = {"a", "b", "c", " ", "é", "日"};
    kvc_rng_t g;
    kvc_rng_seed(&g, 4242);
    int rounds = 3000 / KVC_TEST_SANITIZER_DIVISOR;
    for (int round = 0; round < rounds; round++) {
        char text[256], stopbuf[4][32];
        size_t cut[128], ncut = 0, len = 0;
        size_t nchar = kvc_rng_below(&g, 40);
        for (size_t i = 0; i < nchar; i++) {
            const char *c = alpha[kvc_rng_below(&g, 6)];
            cut[ncut++] = len;
            memcpy(text + len, c, strlen(c));
            len += strlen(c);
        }
        text[len] = '\0';
        size_t n_stops = kvc_rng_below(&g, 4);
        const char *stops[4];
        for (size_t i = 0; i < n_stops; i++) {
            size_t sl = 1 + kvc_rng_below(&g, 4), b = 0;
            for (size_t j = 0; j < sl; j++) {
                const char *c = alpha[kvc_rng_below(&g, 6)];
                memcpy(stopbuf[i] + b, c, strlen(c));
                b += strlen(c);
            }
            stopbuf[i][b] = '\0';
            stops[i] = stopbuf[i];
        }
        /* reference */
        size_t best_end = SIZE_MAX, best_start = 0;
        for (size_t i = 0; i < n_stops; i++) {
            const char *hit = strstr(text, stops[i]);
            if (!hit) continue;
            size_t st = (size_t)(hit - text), en = st + strlen(stops[i]);
            if (en < best_end || (en == best_end && st < best_start)) {
                best_end = en;
                best_start = st;
            }
        }
        size_t want = best_end == SIZE_MAX ? len : best_start;

        kvc_stop_t *st = NULL;
        assert_ok(kvc_stop_create(stops, n_stops, NULL, &st));
        stream_t o = {.n = 0};
        size_t pos = 0;
        while (pos < len) {
            /* the next cut at a character boundary, 1..5 characters on */
            size_t ci = 0;
            while (ci < ncut && cut[ci] <= pos) ci++;
            ci += kvc_rng_below(&g, 5);
            size_t end = ci < ncut ? cut[ci] : len;
            size_t before = o.n;
            feed(st, &o, text + pos, end - pos);
            if (!utf8_valid(o.out + before, o.n - before))
                fail_msg("round %d: an emitted piece is not valid UTF-8", round);
            pos = end;
        }
        finish(st, &o);
        kvc_stop_destroy(st);
        if (o.n != want || memcmp(o.out, text, want) != 0 || o.matched != (best_end != SIZE_MAX))
            fail_msg("round %d: text '%s': got %zu bytes (matched %d), want %zu", round, text, o.n,
                     o.matched, want);
    }
}

/* ---- the row kernels: AVX2 against scalar, bit for bit; exp against libm ---------------- */

static void test_kernels_avx2_match_scalar_bits(void **state)
{
    (void)state;
    /* the polynomial exps against libm */
    for (double x = -708.0; x <= 709.0; x += 0.0137) {
        double want = exp(x), got = kvc__sample_exp(x);
        if (fabs(got - want) > 1e-13 * want)
            fail_msg("exp(%.17g): %.17g, libm %.17g", x, got, want);
    }
    assert_true(kvc__sample_exp(-INFINITY) == 0.0 && kvc__sample_exp(-709.0) == 0.0);
    assert_true(kvc__sample_exp(0.0) == 1.0);
    for (float x = -87.0f; x <= 88.0f; x += 0.0071f) {
        double want = exp((double)x), got = kvc__sample_expf(x);
        if (fabs(got - want) > 3e-7 * want)
            fail_msg("expf(%.9g): %.9g, libm %.9g", (double)x, got, want);
    }
    assert_true(kvc__sample_expf(-INFINITY) == 0.0f && kvc__sample_expf(0.0f) == 1.0f);

    if (!kvc_isa_supported(KVC_ISA_AVX2)) {
        printf("NOTE: this CPU lacks AVX2: the AVX2 kernels were not compared\n");
        return;
    }
    const uint32_t max_n = 1003;
    float *in = malloc(max_n * sizeof *in), *w1 = malloc(max_n * sizeof *w1);
    float *w2 = malloc(max_n * sizeof *w2);
    double *e1 = malloc(max_n * sizeof *e1), *e2 = malloc(max_n * sizeof *e2);
    kvc_rng_t g;
    kvc_rng_seed(&g, 31);
    for (int round = 0; round < 400; round++) {
        uint32_t n = round < 40 ? (uint32_t)round : 1 + (uint32_t)kvc_rng_below(&g, max_n);
        double spread = round % 7 == 0 ? 2000.0 : 1.0 + 30.0 * kvc_rng_double(&g);
        for (uint32_t i = 0; i < n; i++) {
            in[i] = (float)((kvc_rng_double(&g) - 0.5) * spread);
            uint64_t c = kvc_rng_below(&g, 50);
            if (c == 0) in[i] = NAN;
            if (c == 1) in[i] = INFINITY;
            if (c == 2) in[i] = -INFINITY;
            if (c == 3) in[i] = FLT_MAX;
        }
        float m1 = kvc__sample_sanitize_max_scalar(in, w1, n);
        float m2 = kvc__sample_sanitize_max_avx2(in, w2, n);
        assert_memory_equal(&m1, &m2, sizeof m1);
        assert_int_equal(kvc__sample_find_scalar(w1, n, m1), kvc__sample_find_avx2(w1, n, m1));
        if (n) {
            float v = w1[kvc_rng_below(&g, n)];
            assert_int_equal(kvc__sample_find_scalar(w1, n, v), kvc__sample_find_avx2(w1, n, v));
        }
        assert_int_equal(kvc__sample_find_avx2(w1, n, 12345.5f), n); /* absent (|in| < 1001) */
        for (int k = 0; k < 4 && n; k++) {
            uint32_t from = (uint32_t)kvc_rng_below(&g, n + 1);
            float v = k == 0 ? m1 : in[kvc_rng_below(&g, n)]; /* raw: NaN, +inf too */
            assert_int_equal(kvc__sample_above_scalar(in, from, n, v),
                             kvc__sample_above_avx2(in, from, n, v));
        }
        if (n) assert_memory_equal(w1, w2, n * sizeof *w1);
        double ref = n && m1 != -INFINITY ? m1 : 0.0;
        double scale = round % 3 == 0 ? 1.0 : 1.0 / (0.1 + 2.0 * kvc_rng_double(&g));
        double s1 = kvc__sample_exp_sum_scalar(w1, n, ref, scale, e1);
        double s2 = kvc__sample_exp_sum_avx2(w1, n, ref, scale, e2);
        assert_memory_equal(&s1, &s2, sizeof s1);
        if (n) assert_memory_equal(e1, e2, n * sizeof *e1);
        /* top_p's histogram and split, on the sanitized row below its maximum */
        if (n && m1 != -INFINITY) {
            static double h1[64], h2[64];
            uint32_t *c1 = malloc(n * sizeof *c1), *c2 = malloc(n * sizeof *c2);
            uint32_t *t1 = malloc(n * sizeof *t1), *t2 = malloc(n * sizeof *t2);
            (void)kvc__sample_exp_sum_scalar(w1, n, m1, 1.0, e1);
            float bscale = (float)(0.05 + 2.0 * kvc_rng_double(&g));
            memset(h1, 0, sizeof h1);
            memset(h2, 0, sizeof h2);
            kvc__sample_hist_scalar(w1, e1, n, m1, bscale, h1, 64);
            kvc__sample_hist_avx2(w1, e1, n, m1, bscale, h2, 64);
            assert_memory_equal(h1, h2, sizeof h1);
            float blo = (float)kvc_rng_below(&g, 64);
            float bhi = round % 2 ? blo + 1 : INFINITY;
            uint32_t nc1, nc2, nt1, nt2;
            kvc__sample_split_scalar(w1, n, m1, bscale, blo, bhi, c1, &nc1, t1, &nt1);
            kvc__sample_split_avx2(w1, n, m1, bscale, blo, bhi, c2, &nc2, t2, &nt2);
            assert_int_equal(nc1, nc2);
            assert_int_equal(nt1, nt2);
            if (nc1) assert_memory_equal(c1, c2, nc1 * sizeof *c1);
            if (nt1) assert_memory_equal(t1, t2, nt1 * sizeof *t1);
            free(c1);
            free(c2);
            free(t1);
            free(t2);
        }
        float fm = (float)ref, fs = (float)scale;
        s1 = kvc__sample_expf_sum_scalar(w1, n, fm, fs, e1);
        s2 = kvc__sample_expf_sum_avx2(w1, n, fm, fs, e2);
        assert_memory_equal(&s1, &s2, sizeof s1);
        if (n) assert_memory_equal(e1, e2, n * sizeof *e1);
    }

    /* end to end: a scalar sampler and an AVX2 one give the same tokens and logprobs */
    const uint32_t nv = 7001;
    kvc_sampler_t *a = new_sampler(nv), *b = new_sampler(nv);
    assert_ok(kvc_sampler_set_isa(a, KVC_ISA_SCALAR));
    assert_ok(kvc_sampler_set_isa(b, KVC_ISA_AVX2));
    float *l = malloc(nv * sizeof *l);
    kvc_token_t h[32];
    for (int round = 0; round < 60; round++) {
        double spread = 0.5 + 8.0 * kvc_rng_double(&g);
        for (uint32_t i = 0; i < nv; i++) l[i] = (float)((kvc_rng_double(&g) - 0.5) * spread);
        for (int j = 0; j < 32; j++) h[j] = (kvc_token_t)kvc_rng_below(&g, nv);
        kvc_sampling_params_t p = kvc_sampling_params_default();
        p.temperature = (float)(0.1 + 1.5 * kvc_rng_double(&g));
        p.top_p = round % 2 ? 0.9f : 1.0f;
        p.top_k = round % 3 == 0 ? 50 : 0;
        p.min_p = round % 5 == 0 ? 0.05f : 0.0f;
        p.repetition_penalty = round % 4 == 0 ? 1.2f : 1.0f;
        p.n_logprobs = 5;
        kvc_rng_t ra, rb;
        kvc_rng_seed(&ra, (uint64_t)round);
        rb = ra;
        for (int k = 0; k < 20; k++) {
            kvc_sample_result_t x, y;
            assert_ok(kvc_sample(a, &p, &ra, l, h, 32, &x));
            assert_ok(kvc_sample(b, &p, &rb, l, h, 32, &y));
            assert_memory_equal(&x, &y, sizeof x);
        }
    }
    assert_int_equal(kvc_sampler_set_isa(a, (kvc_isa_t)99), KVC_EINVAL);
    assert_int_equal(kvc_sampler_set_isa(NULL, KVC_ISA_AUTO), KVC_EINVAL);
    if (!kvc_isa_supported(KVC_ISA_AVX512))
        assert_int_equal(kvc_sampler_set_isa(a, KVC_ISA_AVX512), KVC_ENOTSUP);
    free(l);
    kvc_sampler_destroy(a);
    kvc_sampler_destroy(b);
    free(in);
    free(w1);
    free(w2);
    free(e1);
    free(e2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_default_and_check),
        cmocka_unit_test(test_create_errors_and_alloc_failure),
        cmocka_unit_test(test_greedy_ties_lowest_id_and_draws_nothing),
        cmocka_unit_test(test_penalty_arithmetic_exact),
        cmocka_unit_test(test_top_k_exact_sets),
        cmocka_unit_test(test_top_p_boundaries),
        cmocka_unit_test(test_min_p_and_combinations),
        cmocka_unit_test(test_truncation_matches_full_sort),
        cmocka_unit_test(test_temperature_distribution),
        cmocka_unit_test(test_seed_reproducible_and_one_draw_per_sample),
        cmocka_unit_test(test_logprobs_raw_log_softmax),
        cmocka_unit_test(test_log_softmax_topk),
        cmocka_unit_test(test_nan_and_inf_logits),
        cmocka_unit_test(test_stop_strings_match_and_hold),
        cmocka_unit_test(test_stop_strings_random_chunking),
        cmocka_unit_test(test_kernels_avx2_match_scalar_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
