/* engine_harness.h - what the engine tests share: a request's outputs as a value, running a
 * batch of prompts to the end with the scheduler's checker after every step, and comparing two
 * runs bit for bit (ids, chosen logprobs, top logprobs, text). */
#ifndef KVC_TEST_ENGINE_HARNESS_H
#define KVC_TEST_ENGINE_HARNESS_H

#include <stdio.h>
#include <string.h>

#include "kvcache/kvcache.h"
#include "test_helpers.h"

#ifndef HARNESS_MAX_OUT
#define HARNESS_MAX_OUT 64
#endif
#define HARNESS_TOP KVC_MAX_LOGPROBS

typedef struct {
    kvc_token_t ids[HARNESS_MAX_OUT];
    float lp[HARNESS_MAX_OUT];
    kvc_token_t top[HARNESS_MAX_OUT * HARNESS_TOP];
    float top_lp[HARNESS_MAX_OUT * HARNESS_TOP];
    uint32_t n, cached, drafts, accepted;
    kvc_finish_t finish;
    char text[4096];
} out_t;

typedef struct {
    const kvc_token_t *ids;
    uint32_t n;
} prompt_t;

static inline kvc_llm_t *load(const char *path)
{
    char msg[256];
    kvc_llm_t *m;
    if (kvc_llm_load(path, &m, msg, sizeof msg)) fail_msg("%s: %s", path, msg);
    return m;
}

/* A finished request's account as an out_t (its arrays copied: they are borrowed). */
static inline void copy_done(out_t *o, const kvc_gen_done_t *d)
{
    memset(o, 0, sizeof *o);
    o->n = d->completion_tokens;
    assert_true(o->n <= HARNESS_MAX_OUT);
    o->cached = d->cached_tokens;
    o->drafts = d->draft_tokens;
    o->accepted = d->accepted_tokens;
    o->finish = d->finish;
    memcpy(o->ids, d->output, o->n * sizeof *o->ids);
    if (d->logprobs) memcpy(o->lp, d->logprobs, o->n * sizeof *o->lp);
    if (d->n_logprobs) {
        memcpy(o->top, d->top_ids, (size_t)o->n * d->n_logprobs * sizeof *o->top);
        memcpy(o->top_lp, d->top_logprobs, (size_t)o->n * d->n_logprobs * sizeof *o->top_lp);
    }
    snprintf(o->text, sizeof o->text, "%s", d->text);
}

/* Run the prompts together (all submitted at once) to the end, checking the scheduler's (and
 * so the seq table's and the pool's) invariants after every step. */
static inline void run_all(const kvc_llm_t *m, const kvc_engine_params_t *ep, const prompt_t *pr,
                           uint32_t n, const kvc_gen_params_t *gp, out_t *out,
                           kvc_engine_stats_t *st)
{
    char msg[256];
    kvc_engine_t *e;
    if (kvc_engine_create(m, ep, &e, msg, sizeof msg)) fail_msg("engine: %s", msg);
    for (uint32_t i = 0; i < n; i++) {
        kvc_gen_params_t g = *gp;
        g.tag = i;
        kvc_gen_id_t id;
        if (kvc_engine_submit(e, pr[i].ids, pr[i].n, &g, &id, msg, sizeof msg))
            fail_msg("submit: %s", msg);
    }
    uint32_t left = n;
    for (int step = 0; left; step++) {
        assert_true(step < 100000);
        bool idle;
        assert_ok(kvc_engine_step(e, step * 1e-3, NULL, NULL, &idle));
        if (!ep->no_kv_cache && kvc_sched_check(kvc_engine_sched(e), msg, sizeof msg))
            fail_msg("step %d: %s", step, msg);
        const kvc_gen_done_t *d;
        uint32_t nd;
        kvc_engine_finished(e, &d, &nd);
        for (uint32_t i = 0; i < nd; i++) {
            copy_done(&out[d[i].tag], &d[i]);
            left--;
        }
        assert_true(!idle || nd || left == 0);
    }
    if (st) kvc_engine_stats(e, st);
    kvc_engine_destroy(e);
}

static inline void assert_same(const out_t *a, const out_t *b, const char *what)
{
    if (a->n != b->n) fail_msg("%s: %u vs %u tokens", what, a->n, b->n);
    for (uint32_t i = 0; i < a->n; i++) {
        if (a->ids[i] != b->ids[i])
            fail_msg("%s: token %u: %d vs %d", what, i, a->ids[i], b->ids[i]);
        if (memcmp(&a->lp[i], &b->lp[i], sizeof(float)))
            fail_msg("%s: logprob %u: %.9g vs %.9g", what, i, a->lp[i], b->lp[i]);
    }
    if (memcmp(a->top, b->top, sizeof a->top) || memcmp(a->top_lp, b->top_lp, sizeof a->top_lp))
        fail_msg("%s: top logprobs differ", what);
    assert_string_equal(a->text, b->text);
}

#endif
