/* test_seq_model.c - randomized model-based test of the seq layer.
 *
 * Random interleavings of everything a request does: create and prefix
 * lookup, chunked prefill, decode, drafts with random acceptance and
 * rollback, forks, beam steps, destroys (also while a step is in flight),
 * stale calls, under pool pressure, with one full-attention group or a
 * hybrid of full and sliding-window groups.  The reference is simple: each
 * live request's token history in a flat array, and its expected counts.
 * After every operation: kvc_seqs_check (refcounts = table references,
 * copy-on-write, hashes, prefix and pool invariants), every live sequence
 * reads back exactly its own tokens through its tables (the harness's fake
 * KV: a slot holds the token written there), and its counts match.
 */
#include "seq_harness.h"

#include <stdio.h>

#define MAXS   12
#define MAXTOK 256

typedef struct {
    kvc_seq_t h;
    kvc_token_t tok[MAXTOK + 16];
    size_t n, n_prompt, n_computed;
} ref_t;

typedef struct {
    harness_t h;
    uint32_t window[KVC_MAX_GROUPS];
    ref_t r[MAXS];
    int n;
    kvc_seq_t dead[64]; /* handles destroyed, for stale calls */
    int n_dead;
    kvc_rng_t rng;
    uint64_t ops;
    kvc_token_t families[4][64];
} world_t;

static void verify(world_t *w)
{
    harness_check(&w->h);
    for (int i = 0; i < w->n; i++) {
        ref_t *r = &w->r[i];
        kvc_seq_info_t info;
        assert_ok(kvc_seq_info(w->h.seqs, r->h, &info));
        const kvc_token_t *tok;
        size_t nt;
        assert_ok(kvc_seq_tokens(w->h.seqs, r->h, &tok, &nt));
        assert_int_equal(nt, r->n);
        assert_memory_equal(tok, r->tok, nt * sizeof(kvc_token_t));
        assert_int_equal(info.n_computed, r->n_computed);
        assert_int_equal(info.n_reserved, r->n_computed); /* no step left half-done */
        assert_int_equal(info.n_draft, 0);
        harness_readback(&w->h, r->h, w->window);
    }
    for (int i = 0; i < w->n_dead; i++) assert_false(kvc_seq_valid(w->h.seqs, w->dead[i]));
}

static void forget(world_t *w, int i)
{
    if (w->n_dead < 64) w->dead[w->n_dead++] = w->r[i].h;
    w->r[i] = w->r[--w->n];
}

static void kill(world_t *w, int i)
{
    assert_ok(kvc_seq_destroy(w->h.seqs, w->r[i].h));
    forget(w, i);
}

/* Make room: destroy a random request (what a scheduler's preemption would do). */
static void preempt(world_t *w)
{
    if (w->n) kill(w, (int)kvc_rng_below(&w->rng, (uint64_t)w->n));
}

static void op_create(world_t *w)
{
    if (w->n == MAXS) return;
    ref_t *r = &w->r[w->n];
    size_t n = 1 + kvc_rng_below(&w->rng, 40);
    memcpy(r->tok, w->families[kvc_rng_below(&w->rng, 4)], n * sizeof(kvc_token_t));
    if (kvc_rng_below(&w->rng, 2))
        r->tok[kvc_rng_below(&w->rng, n)] = (kvc_token_t)kvc_rng_below(&w->rng, 5);
    kvc_seq_desc_t d = {.prompt = r->tok, .n_prompt = n};
    if (kvc_seq_create(w->h.seqs, &d, &r->h)) return;
    size_t hit;
    assert_ok(kvc_seq_lookup(w->h.seqs, r->h, &hit));
    assert_true(hit < n); /* the last token is always computed */
    r->n = r->n_prompt = n;
    r->n_computed = hit;
    w->n++;
}

/* Compute the next chunk of known tokens of request i (prefill chunk or one decode token). */
static void op_compute(world_t *w, int i)
{
    ref_t *r = &w->r[i];
    if (r->n_computed == r->n) return;
    uint32_t chunk = 1 + (uint32_t)kvc_rng_below(&w->rng, (uint64_t)(r->n - r->n_computed));
    int rc = harness_step(&w->h, r->h, chunk);
    if (rc == KVC_ENOSPC || rc == KVC_EBUSY) {
        preempt(w);
        return;
    }
    assert_ok(rc);
    r->n_computed += chunk;
}

static void op_sample(world_t *w, int i)
{
    ref_t *r = &w->r[i];
    if (r->n_computed != r->n || r->n >= MAXTOK) return;
    kvc_token_t t = (kvc_token_t)(1000 + kvc_rng_below(&w->rng, 1000));
    assert_ok(kvc_seq_append(w->h.seqs, r->h, &t, 1));
    r->tok[r->n++] = t;
}

static void op_speculate(world_t *w, int i)
{
    ref_t *r = &w->r[i];
    /* needs exactly one sampled, uncomputed token */
    if (r->n != r->n_computed + 1 || r->n + 8 >= MAXTOK) return;
    kvc_token_t d[8];
    uint32_t k = 1 + (uint32_t)kvc_rng_below(&w->rng, 7);
    for (uint32_t j = 0; j < k; j++) d[j] = (kvc_token_t)(2000 + kvc_rng_below(&w->rng, 50));
    assert_ok(kvc_seq_draft(w->h.seqs, r->h, d, k));
    int rc = harness_step(&w->h, r->h, k + 1);
    if (rc == KVC_ENOSPC || rc == KVC_EBUSY) { /* no room to verify: reject them all */
        assert_ok(kvc_seq_rollback(w->h.seqs, r->h, k));
        preempt(w);
        return;
    }
    assert_ok(rc);
    uint32_t a = (uint32_t)kvc_rng_below(&w->rng, k + 1);
    assert_ok(kvc_seq_accept(w->h.seqs, r->h, a));
    memcpy(r->tok + r->n, d, a * sizeof(kvc_token_t));
    r->n += a;
    r->n_computed = r->n;
    if (kvc_rng_below(&w->rng, 4)) { /* the bonus token, usually */
        kvc_token_t b = (kvc_token_t)(3000 + kvc_rng_below(&w->rng, 50));
        assert_ok(kvc_seq_append(w->h.seqs, r->h, &b, 1));
        r->tok[r->n++] = b;
    }
}

static void op_fork(world_t *w, int i)
{
    if (w->n == MAXS || w->r[i].n_computed != w->r[i].n) return;
    kvc_seq_t c;
    int rc = kvc_seq_fork(w->h.seqs, w->r[i].h, &c);
    if (rc == KVC_ENOSPC) return;
    assert_ok(rc);
    w->r[w->n] = w->r[i];
    w->r[w->n].h = c;
    w->n++;
}

static void op_beam(world_t *w)
{
    /* the beams: fully computed requests, up to 4 */
    int idx[4], nb = 0;
    for (int i = 0; i < w->n && nb < 4; i++)
        if (w->r[i].n_computed == w->r[i].n && w->r[i].n < MAXTOK) idx[nb++] = i;
    if (!nb) return;
    kvc_seq_t beams[4], next[6];
    for (int j = 0; j < nb; j++) beams[j] = w->r[idx[j]].h;
    uint32_t n_ch = 1 + (uint32_t)kvc_rng_below(&w->rng, 6);
    int free_slots = MAXS - w->n;
    kvc_beam_choice_t ch[6];
    for (uint32_t j = 0; j < n_ch; j++)
        ch[j] = (kvc_beam_choice_t){.parent = (uint32_t)kvc_rng_below(&w->rng, (uint64_t)nb),
                                    .token = (kvc_token_t)(4000 + kvc_rng_below(&w->rng, 100))};
    /* the reference must not exceed MAXS either */
    int children[4] = {0}, dead = 0, forks = 0;
    for (uint32_t j = 0; j < n_ch; j++) children[ch[j].parent]++;
    for (int j = 0; j < nb; j++) {
        dead += children[j] == 0;
        forks += children[j] > 1 ? children[j] - 1 : 0;
    }
    if (forks > free_slots + dead) return;
    int64_t slots[KVC_MAX_GROUPS * 6];
    int rc = kvc_seq_beam_step(w->h.seqs, beams, (uint32_t)nb, ch, n_ch, next, slots);
    if (rc == KVC_ENOSPC || rc == KVC_EBUSY) { /* all or nothing: every beam unchanged */
        verify(w);
        preempt(w);
        return;
    }
    assert_ok(rc);
    ref_t old[4];
    for (int j = 0; j < nb; j++) old[j] = w->r[idx[j]];
    for (int j = nb; j-- > 0;) /* the dead beams are gone */
        if (!children[j] && w->n_dead < 64) w->dead[w->n_dead++] = old[j].h;
    /* remove all old beams from the reference (indices descending keeps the rest valid) */
    for (int j = nb; j-- > 0;) w->r[idx[j]] = w->r[--w->n];
    for (uint32_t j = 0; j < n_ch; j++) {
        ref_t *r = &w->r[w->n++];
        *r = old[ch[j].parent];
        r->h = next[j];
        r->tok[r->n++] = ch[j].token;
        for (uint32_t g = 0; g < w->h.n_groups; g++)
            w->h.kv[slots[(size_t)g * n_ch + j]] = ch[j].token;
        assert_ok(kvc_seq_complete(w->h.seqs, next[j], 1));
        r->n_computed = r->n;
    }
}

/* A step in flight over some requests; some are destroyed meanwhile; then it completes. */
static void op_inflight_abort(world_t *w)
{
    if (!w->n) return;
    kvc_seq_t rows[MAXS];
    int n_rows = 1 + (int)kvc_rng_below(&w->rng, (uint64_t)w->n);
    for (int j = 0; j < n_rows; j++) rows[j] = w->r[j].h;
    kvc_step_id_t id;
    assert_ok(kvc_step_launch(w->h.seqs, rows, (uint32_t)n_rows, &id));
    uint32_t free_before = kvc_pool_n_free(w->h.pool);
    bool killed[MAXS] = {false};
    for (int j = n_rows; j-- > 0;)
        if (kvc_rng_below(&w->rng, 3) == 0) {
            killed[j] = true;
            kill(w, j);
        }
    assert_int_equal(kvc_pool_n_free(w->h.pool), free_before); /* nothing freed under the step */
    verify(w);
    if (kvc_rng_below(&w->rng, 2)) { /* a bad completion first: permuted or short */
        if (n_rows > 1) {
            kvc_seq_t tmp = rows[0];
            rows[0] = rows[1];
            rows[1] = tmp;
            assert_int_equal(kvc_step_complete(w->h.seqs, id, rows, (uint32_t)n_rows, NULL),
                             KVC_ESTALE);
            rows[1] = rows[0];
            rows[0] = tmp;
        }
        assert_int_equal(kvc_step_complete(w->h.seqs, id, rows, (uint32_t)n_rows - 1, NULL),
                         KVC_ESTALE);
    }
    bool live[MAXS];
    assert_ok(kvc_step_complete(w->h.seqs, id, rows, (uint32_t)n_rows, live));
    for (int j = 0; j < n_rows; j++) assert_int_equal(live[j], !killed[j]);
    assert_int_equal(kvc_step_complete(w->h.seqs, id, rows, (uint32_t)n_rows, live), KVC_ESTALE);
}

static void op_stale(world_t *w)
{
    if (!w->n_dead) return;
    kvc_seq_t d = w->dead[kvc_rng_below(&w->rng, (uint64_t)w->n_dead)];
    kvc_token_t t = 1;
    assert_int_equal(kvc_seq_append(w->h.seqs, d, &t, 1), KVC_ESTALE);
    assert_int_equal(kvc_seq_reserve(w->h.seqs, d, 1, NULL), KVC_ESTALE);
    assert_int_equal(kvc_seq_destroy(w->h.seqs, d), KVC_ESTALE);
}

static kvc_seqs_stats_t totals;

static uint64_t run(uint64_t seed, uint64_t target)
{
    static world_t w;
    memset(&w, 0, sizeof w);
    kvc_rng_seed(&w.rng, seed);
    uint32_t bs = 1u << kvc_rng_below(&w.rng, 4);
    bool hybrid = kvc_rng_below(&w.rng, 2);
    harness_cfg_t cfg = {.n_blocks = 24 + (uint32_t)kvc_rng_below(&w.rng, 200),
                         .bs = bs,
                         .max_seqs = MAXS,
                         .n_groups = hybrid ? 2 : 1};
    if (hybrid) cfg.window[1] = 1 + (uint32_t)kvc_rng_below(&w.rng, 4 * bs + 8);
    memcpy(w.window, cfg.window, sizeof w.window);
    harness_init(&w.h, cfg);
    for (int f = 0; f < 4; f++)
        for (int i = 0; i < 64; i++) w.families[f][i] = (kvc_token_t)kvc_rng_below(&w.rng, 5);
    while (w.ops < target) {
        uint64_t dice = kvc_rng_below(&w.rng, 100);
        int i = w.n ? (int)kvc_rng_below(&w.rng, (uint64_t)w.n) : -1;
        if (dice < 15 || i < 0)
            op_create(&w);
        else if (dice < 45)
            op_compute(&w, i);
        else if (dice < 60)
            op_sample(&w, i);
        else if (dice < 72)
            op_speculate(&w, i);
        else if (dice < 78)
            op_fork(&w, i);
        else if (dice < 84)
            op_beam(&w);
        else if (dice < 92)
            kill(&w, i);
        else if (dice < 96)
            op_inflight_abort(&w);
        else
            op_stale(&w);
        w.ops++;
        verify(&w);
        if (w.n_dead > 48) w.n_dead = 0;
    }
    kvc_seqs_stats_t st;
    kvc_seqs_stats(w.h.seqs, &st);
    totals.n_forks += st.n_forks;
    totals.n_cow_copies += st.n_cow_copies;
    totals.n_drafted += st.n_drafted;
    totals.n_rolled_back += st.n_rolled_back;
    totals.n_window_released += st.n_window_released;
    totals.n_deferred += st.n_deferred;
    totals.n_hit_tokens += st.n_hit_tokens;
    totals.n_rejected_completions += st.n_rejected_completions;
    totals.n_duplicates_shared += st.n_duplicates_shared;
    while (w.n) kill(&w, 0);
    harness_check(&w.h);
    assert_int_equal(kvc_pool_n_free(w.h.pool), cfg.n_blocks); /* nothing leaked */
    harness_free(&w.h);
    return w.ops;
}

static void model_agrees_under_random_interleavings(void **state)
{
    (void)state;
    const int n_seeds = 60;
    const uint64_t per_seed = 2500 / KVC_TEST_SANITIZER_DIVISOR;
    uint64_t total = 0;
    for (int s = 0; s < n_seeds; s++) total += run(0xbeef0000u + (uint64_t)s, per_seed);
    print_message("seq model: %llu operations over %d seeds: %llu forks, %llu copies, %llu drafts "
                  "(%llu rolled back), %llu window releases, %llu deferred frees, %llu hit tokens, "
                  "%llu duplicates shared, %llu bad completions\n",
                  (unsigned long long)total, n_seeds, (unsigned long long)totals.n_forks,
                  (unsigned long long)totals.n_cow_copies, (unsigned long long)totals.n_drafted,
                  (unsigned long long)totals.n_rolled_back,
                  (unsigned long long)totals.n_window_released,
                  (unsigned long long)totals.n_deferred, (unsigned long long)totals.n_hit_tokens,
                  (unsigned long long)totals.n_duplicates_shared,
                  (unsigned long long)totals.n_rejected_completions);
    /* every feature was exercised, many times */
    assert_true(totals.n_forks > 1000 / KVC_TEST_SANITIZER_DIVISOR &&
                totals.n_cow_copies > 200 / KVC_TEST_SANITIZER_DIVISOR);
    assert_true(totals.n_rolled_back > 1000 / KVC_TEST_SANITIZER_DIVISOR &&
                totals.n_window_released > 100 / KVC_TEST_SANITIZER_DIVISOR);
    assert_true(totals.n_deferred > 100 / KVC_TEST_SANITIZER_DIVISOR &&
                totals.n_hit_tokens > 1000 / KVC_TEST_SANITIZER_DIVISOR);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(model_agrees_under_random_interleavings),
    };
    return cmocka_run_group_tests_name("seq_model", tests, NULL, NULL);
}
