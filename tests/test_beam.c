/* test_beam.c - beam search on the paged cache (kvc_llm_beam_search) against a beam search
 * written here over plain, non-paged caches.
 *
 * The reference search runs the tests' double-precision forward pass (ref_llama.h) with one
 * contiguous K/V cache per beam, copied whole when a beam forks, and the same rules
 * (engine.h): the 2N best (beam, token) candidates by cumulative log-probability, ties to the
 * lower beam then the lower token; EOS among the first N finishes a hypothesis scored
 * sum / len^alpha; the best N finished kept; HF's stopping rule; at max_tokens the live
 * beams finish with "length".  The engine computes in fp32 (f32 KV here), so the two agree
 * only up to a tolerance: the reference records the smallest margin of every comparison it
 * decided on (adjacent candidates it walked, a hypothesis against the worst kept, the
 * stopping test, the final order).  Where that margin exceeds 2 TOL the engine must return
 * exactly the reference's hypotheses (ids, finish, scores within TOL); below it, every
 * hypothesis the engine returns must still score what the reference gives its ids.  Each
 * model must have cases with the margin above 2 TOL, so the comparison cannot pass vacuously.
 *
 * Also: beams 1 gives the engine's greedy output; the prompt's blocks are stored once (peak
 * blocks well under N x the prompt's blocks); a pool too small for N beams (or the prompt)
 * fails with a message and leaks nothing (the ASan build runs this); bad parameters are
 * refused with a message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvcache/kvcache.h"
#include "kvcache/engine.h"
#include "ref_llama.h"
#include "test_helpers.h"

#define STORIES KVC_DATA_DIR "/models/stories260K.gguf"
#define VOCAB   KVC_DATA_DIR "/models/vocab/ggml-vocab-llama-spm.gguf"

/* fp32 kernels (f32 weights, f32 KV) against double: a hypothesis's summed logprob is
 * measured within 3e-6 of the reference's on both models; TOL allows 30 times that.  A
 * decision is safe when its margin exceeds 2 TOL (each side may be off by TOL). */
#define TOL     1e-4
#define MAX_B   8
#define MAX_T   48
#define MAX_POS 256

static kvc_llm_t *load(const char *path)
{
    char msg[256];
    kvc_llm_t *m;
    if (kvc_llm_load(path, &m, msg, sizeof msg)) fail_msg("%s: %s", path, msg);
    return m;
}

static uint32_t encode(const kvc_llm_t *m, const char *text, kvc_token_t *ids, size_t cap)
{
    size_t n;
    assert_ok(kvc_tokenizer_encode(kvc_llm_tokenizer(m), text, strlen(text),
                                   KVC_TOK_ADD_BOS | KVC_TOK_PARSE_SPECIAL, ids, cap, &n));
    return (uint32_t)n;
}

/* ---- the reference: beam search over contiguous per-beam caches ------------------------ */
typedef struct {
    float *k, *v; /* (n_layers, MAX_POS, kv_dim) */
    double *lp;   /* (vocab) log-softmax of the next token */
    kvc_token_t ids[MAX_T];
    double cum;
} rbeam_t;

typedef struct {
    kvc_token_t ids[MAX_T];
    uint32_t n_ids;
    double sum, score;
    kvc_finish_t finish;
} rhyp_t;

typedef struct {
    uint32_t beam;
    kvc_token_t tok;
    double score;
} rcand_t;

static int rcand_cmp(const void *pa, const void *pb)
{
    const rcand_t *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->beam != b->beam) return a->beam < b->beam ? -1 : 1;
    return (a->tok > b->tok) - (a->tok < b->tok);
}

static size_t cache_floats(const ref_llama_t *r)
{
    return (size_t)r->h.n_layers * MAX_POS * r->kv_dim;
}

/* Run token tok at pos in beam b's own cache; its next-token log-softmax into b->lp. */
static void rstep(ref_llama_t *r, rbeam_t *b, kvc_token_t tok, uint32_t pos)
{
    r->k_cache = b->k, r->v_cache = b->v;
    ref_llama_step(r, (uint32_t)tok, pos);
    const uint32_t V = r->h.vocab;
    double mx = -INFINITY, sum = 0;
    for (uint32_t i = 0; i < V; i++) mx = fmax(mx, r->logits[i]);
    for (uint32_t i = 0; i < V; i++) sum += exp(r->logits[i] - mx);
    const double lse = mx + log(sum);
    for (uint32_t i = 0; i < V; i++) b->lp[i] = r->logits[i] - lse;
}

static void rbeam_alloc(const ref_llama_t *r, rbeam_t *b)
{
    b->k = calloc(cache_floats(r), sizeof(float));
    b->v = calloc(cache_floats(r), sizeof(float));
    b->lp = calloc(r->h.vocab, sizeof(double));
    assert_non_null(b->k), assert_non_null(b->v), assert_non_null(b->lp);
}

static void rbeam_free(rbeam_t *b)
{
    free(b->k), free(b->v), free(b->lp);
}

static double rscore(double sum, uint32_t len, float alpha)
{
    return sum / pow((double)len, (double)alpha);
}

static void margin(double *mn, double a, double b)
{
    *mn = fmin(*mn, fabs(a - b));
}

/* ids[0..n) then last (if >= 0) finished with sum. */
static void roffer(rhyp_t *fin, uint32_t *n_fin, uint32_t N, const kvc_token_t *ids, uint32_t n,
                   kvc_token_t last, double sum, kvc_finish_t f, float alpha, double *mn)
{
    const uint32_t n_ids = n + (last >= 0);
    const double sc = rscore(sum, n_ids, alpha);
    if (*n_fin == N) {
        margin(mn, sc, fin[N - 1].score);
        if (!(sc > fin[N - 1].score)) return;
    }
    uint32_t at = *n_fin;
    while (at > 0 && fin[at - 1].score < sc) at--;
    memmove(&fin[at + 1], &fin[at], (*n_fin - at) * sizeof *fin);
    rhyp_t *h = &fin[at];
    memcpy(h->ids, ids, n * sizeof *ids);
    if (last >= 0) h->ids[n] = last;
    h->n_ids = n_ids, h->sum = sum, h->score = sc, h->finish = f;
    if (++*n_fin > N) --*n_fin;
}

static bool rends(const kvc_beam_params_t *p, kvc_token_t eos, kvc_token_t t)
{
    if (!p->ignore_eos && t == eos) return true;
    for (uint32_t i = 0; i < p->n_stop_ids; i++)
        if (t == p->stop_ids[i]) return true;
    return false;
}

/* The reference search; returns the smallest margin of its decisions. */
static double ref_beam_search(ref_llama_t *r, const kvc_beam_params_t *p, const kvc_token_t *prompt,
                              uint32_t n_prompt, kvc_token_t eos, rhyp_t *fin, uint32_t *n_fin)
{
    const uint32_t N = p->n_beams, T = p->max_tokens, V = r->h.vocab;
    assert_true(N <= MAX_B && T <= MAX_T && n_prompt + T <= MAX_POS);
    double mn = INFINITY;
    static rbeam_t cur[MAX_B], nxt[MAX_B];
    for (uint32_t i = 0; i < MAX_B; i++) rbeam_alloc(r, &cur[i]), rbeam_alloc(r, &nxt[i]);
    for (uint32_t i = 0; i < n_prompt; i++) rstep(r, &cur[0], prompt[i], i);
    cur[0].cum = 0;
    uint32_t n_live = 1;
    *n_fin = 0;
    rcand_t *c = malloc((size_t)MAX_B * V * sizeof *c);
    assert_non_null(c);
    for (uint32_t t = 0;; t++) {
        uint32_t nc = 0;
        for (uint32_t b = 0; b < n_live; b++)
            for (uint32_t v = 0; v < V; v++)
                c[nc++] = (rcand_t){b, (kvc_token_t)v, cur[b].cum + cur[b].lp[v]};
        qsort(c, nc, sizeof *c, rcand_cmp);
        uint32_t n_next = 0, r_last = 0;
        uint32_t parent[MAX_B];
        for (uint32_t k = 0; k < 2 * N && n_next < N; k++) {
            r_last = k;
            if (rends(p, eos, c[k].tok)) {
                if (k < N)
                    roffer(fin, n_fin, N, cur[c[k].beam].ids, t, c[k].tok, c[k].score,
                           KVC_FINISH_STOP, p->length_penalty, &mn);
                continue;
            }
            parent[n_next] = c[k].beam;
            memcpy(nxt[n_next].ids, cur[c[k].beam].ids, t * sizeof(kvc_token_t));
            nxt[n_next].ids[t] = c[k].tok;
            nxt[n_next].cum = c[k].score;
            n_next++;
        }
        /* what decided the step: the chosen set against the first candidate left out, and
         * an EOS's side of rank N (the order within the set changes no hypothesis) */
        margin(&mn, c[r_last].score, c[r_last + 1].score);
        if (!p->ignore_eos || p->n_stop_ids)
            for (uint32_t k = N - 1; k <= N && k < r_last + 1; k++)
                if (rends(p, eos, c[k].tok) || rends(p, eos, c[k + 1].tok))
                    margin(&mn, c[k].score, c[k + 1].score);
        assert_int_equal(n_next, N);
        if (*n_fin == N) {
            const double best = rscore(nxt[0].cum, t + 1, p->length_penalty);
            if (!p->early_stopping) margin(&mn, fin[N - 1].score, best);
            if (p->early_stopping || fin[N - 1].score >= best) break;
        }
        if (t + 1 == T) {
            for (uint32_t j = 0; j < N; j++)
                roffer(fin, n_fin, N, nxt[j].ids, T, -1, nxt[j].cum, KVC_FINISH_LENGTH,
                       p->length_penalty, &mn);
            break;
        }
        /* fork: copy the parent's contiguous cache, then run the new token */
        const size_t bytes = cache_floats(r) * sizeof(float);
        for (uint32_t j = 0; j < N; j++) {
            memcpy(nxt[j].k, cur[parent[j]].k, bytes);
            memcpy(nxt[j].v, cur[parent[j]].v, bytes);
            rstep(r, &nxt[j], nxt[j].ids[t], n_prompt + t);
        }
        for (uint32_t j = 0; j < N; j++) {
            rbeam_t tmp = cur[j];
            cur[j] = nxt[j], nxt[j] = tmp;
        }
        n_live = N;
    }
    for (uint32_t k = 0; k + 1 < *n_fin; k++) margin(&mn, fin[k].score, fin[k + 1].score);
    free(c);
    for (uint32_t i = 0; i < MAX_B; i++) rbeam_free(&cur[i]), rbeam_free(&nxt[i]);
    return mn;
}

/* The reference's sum of logprobs of prompt -> ids (teacher-forced). */
static double ref_rescore(ref_llama_t *r, const kvc_token_t *prompt, uint32_t n_prompt,
                          const kvc_beam_hyp_t *h)
{
    rbeam_t b;
    rbeam_alloc(r, &b);
    for (uint32_t i = 0; i < n_prompt; i++) rstep(r, &b, prompt[i], i);
    double sum = 0;
    for (uint32_t i = 0; i < h->n_ids; i++) {
        sum += b.lp[h->ids[i]];
        if (i + 1 < h->n_ids) rstep(r, &b, h->ids[i], n_prompt + i);
    }
    rbeam_free(&b);
    return sum;
}

static double max_err;
static uint32_t n_stopped; /* hypotheses ended by EOS or a stop id */

/* One case: engine vs reference.  Returns whether the margin allowed the exact check. */
static bool check_case(const kvc_llm_t *m, ref_llama_t *r, const kvc_beam_params_t *p,
                       const kvc_token_t *prompt, uint32_t n_prompt, const char *what)
{
    char msg[256];
    kvc_beam_result_t res;
    if (kvc_llm_beam_search(m, p, prompt, n_prompt, &res, msg, sizeof msg))
        fail_msg("%s: %s", what, msg);
    const kvc_token_t eos = kvc_tokenizer_eos(kvc_llm_tokenizer(m));
    static rhyp_t fin[MAX_B + 1];
    uint32_t n_fin;
    const double mn = ref_beam_search(r, p, prompt, n_prompt, eos, fin, &n_fin);
    assert_int_equal(res.n_hyps, p->n_beams);
    assert_int_equal(n_fin, p->n_beams);
    for (uint32_t i = 0; i < res.n_hyps; i++) {
        const kvc_beam_hyp_t *h = &res.hyps[i];
        assert_true(h->n_ids >= 1 && h->n_ids <= p->max_tokens);
        if (h->finish == KVC_FINISH_STOP) assert_true(rends(p, eos, h->ids[h->n_ids - 1]));
        for (uint32_t k = 0; k + 1 < h->n_ids; k++) assert_false(rends(p, eos, h->ids[k]));
        n_stopped += h->finish == KVC_FINISH_STOP;
        if (i) assert_true(h->score <= res.hyps[i - 1].score);
        const double want = ref_rescore(r, prompt, n_prompt, h);
        max_err = fmax(max_err, fabs(h->sum_logprob - want));
        if (fabs(h->sum_logprob - want) > TOL)
            fail_msg("%s: hypothesis %u: sum logprob %.6f, the reference gives its ids %.6f", what,
                     i, h->sum_logprob, want);
        assert_true(fabs(h->score - rscore(h->sum_logprob, h->n_ids, p->length_penalty)) < 1e-9);
    }
    const bool exact = mn > 2 * TOL;
    if (exact) {
        for (uint32_t i = 0; i < n_fin; i++) {
            const kvc_beam_hyp_t *h = &res.hyps[i];
            if (h->n_ids != fin[i].n_ids || h->finish != fin[i].finish ||
                memcmp(h->ids, fin[i].ids, h->n_ids * sizeof *h->ids))
                fail_msg("%s: hypothesis %u differs from the reference's (margin %.4g)", what, i,
                         mn);
            if (fabs(h->score - fin[i].score) > TOL)
                fail_msg("%s: hypothesis %u: score %.6f vs %.6f", what, i, h->score, fin[i].score);
        }
    }
    print_message(
        "%s: N %u, %u steps, max err %.3g, margin %.3g (%s), best score %.4f, peak %u blocks "
        "(prompt %u), %llu forks, %llu copies\n",
        what, p->n_beams, res.steps, max_err, mn, exact ? "checked exactly" : "rescored only",
        res.hyps[0].score, res.peak_blocks, res.prompt_blocks, (unsigned long long)res.forks,
        (unsigned long long)res.cow_copies);
    kvc_beam_result_free(&res);
    return exact;
}

static kvc_beam_params_t base_params(void)
{
    kvc_beam_params_t p = kvc_beam_params_default();
    p.kv_dtype = KVC_DTYPE_F32;
    p.n_threads = 1;
    return p;
}

/* The token whose text is exactly `text`: the highest such id, a piece rather than a byte
 * fallback token. */
static kvc_token_t token_of(const kvc_llm_t *m, const char *text)
{
    const kvc_tokenizer_t *t = kvc_llm_tokenizer(m);
    for (uint32_t id = kvc_llm_hparams(m)->vocab; id-- > 0;) {
        char buf[64];
        size_t nb;
        const kvc_token_t tok = (kvc_token_t)id;
        if (!kvc_tokenizer_decode(t, &tok, 1, 0, buf, sizeof buf, &nb) && !strcmp(buf, text))
            return tok;
    }
    fail_msg("no token \"%s\"", text);
    return -1;
}

/* ---- stories260K ----------------------------------------------------------------------- */
static void stories_equals_the_reference(void **state)
{
    (void)state;
    kvc_llm_t *m = load(STORIES);
    ref_llama_t r;
    assert_int_equal(ref_llama_init(&r, kvc_llm_gguf(m), MAX_POS), 0);
    free(r.k_cache), free(r.v_cache); /* each beam brings its own */
    const char *texts[] = {"Once upon a time", "Lily and Tom went to the", "The big dog"};
    uint32_t exact = 0, n = 0;
    for (int i = 0; i < 3; i++) {
        kvc_token_t ids[64];
        const uint32_t np = encode(m, texts[i], ids, 64);
        const uint32_t beams[] = {2, 4, 5};
        for (int j = 0; j < 3; j++) {
            kvc_beam_params_t p = base_params();
            p.n_beams = beams[j];
            p.max_tokens = 24;
            p.length_penalty = j == 2 ? 0.5f : 1.0f;
            p.block_size = j == 1 ? 4 : 16;
            p.prefix_cache = j == 1;
            p.early_stopping = i == 2;
            char what[96];
            snprintf(what, sizeof what, "stories \"%s\"", texts[i]);
            exact += check_case(m, &r, &p, ids, np, what);
            n++;
        }
    }
    /* Hypotheses that end: stories260K never says EOS within a few dozen tokens, so the end
     * of a sentence ("." as a stop id) ends them, which takes the finishing, keeping and
     * stopping rules through every branch. */
    const kvc_token_t dot = token_of(m, ".");
    n_stopped = 0;
    for (int i = 0; i < 3; i++) {
        kvc_token_t ids[64];
        const uint32_t np = encode(m, texts[i], ids, 64);
        for (int j = 0; j < 4; j++) {
            kvc_beam_params_t p = base_params();
            p.n_beams = 3 + (uint32_t)j;
            p.max_tokens = 40;
            p.stop_ids[0] = dot;
            p.n_stop_ids = 1;
            p.length_penalty = j == 1 ? 0.0f : j == 3 ? 2.0f : 1.0f;
            p.early_stopping = j == 2;
            char what[96];
            snprintf(what, sizeof what, "stories \"%s\" stop \".\"", texts[i]);
            exact += check_case(m, &r, &p, ids, np, what);
            n++;
        }
    }
    print_message("stories: %u of %u cases checked exactly, %u hypotheses stopped\n", exact, n,
                  n_stopped);
    assert_true(exact >= 10);
    assert_true(n_stopped >= 10);
    r.k_cache = r.v_cache = NULL;
    ref_llama_free(&r);
    kvc_llm_free(m);
}

/* ---- a random model with head_dim 64 (the SIMD attention kernels) ----------------------- */
static char synth_path[64];

static int synth_setup(void **state)
{
    (void)state;
    char msg[256];
    kvc_gguf_t *v;
    if (kvc_gguf_open(VOCAB, NULL, &v, msg, sizeof msg)) return -1;
    snprintf(synth_path, sizeof synth_path, "/tmp/kvc_test_beam_%d.gguf", (int)getpid());
    kvc_model_synth_t p = kvc_model_synth_default();
    p.dim = 256, p.n_layers = 2, p.n_heads = 4, p.n_kv_heads = 2, p.ff = 512, p.ctx = 512;
    p.type = 0; /* F32: the reference reads the same weights exactly */
    p.seed = 11;
    int rc = kvc_model_synth(&p, v, synth_path, msg, sizeof msg);
    kvc_gguf_close(v);
    return rc ? -1 : 0;
}

static int synth_teardown(void **state)
{
    (void)state;
    unlink(synth_path);
    return 0;
}

static void synth_equals_the_reference(void **state)
{
    (void)state;
    kvc_llm_t *m = load(synth_path);
    assert_int_equal(kvc_llm_hparams(m)->head_dim, 64);
    ref_llama_t r;
    assert_int_equal(ref_llama_init(&r, kvc_llm_gguf(m), MAX_POS), 0);
    free(r.k_cache), free(r.v_cache);
    kvc_rng_t g;
    kvc_rng_seed(&g, 5);
    uint32_t exact = 0, n = 0;
    for (int i = 0; i < 4; i++) {
        kvc_token_t ids[40];
        const uint32_t np = 5 + 11 * (uint32_t)i;
        ids[0] = 1;
        for (uint32_t j = 1; j < np; j++) ids[j] = (kvc_token_t)(3 + kvc_rng_below(&g, 31990));
        kvc_beam_params_t p = base_params();
        p.n_beams = i == 3 ? 8 : 3;
        p.max_tokens = 10;
        p.length_penalty = i == 1 ? 2.0f : 1.0f;
        p.block_size = i == 2 ? 8 : 16;
        p.n_threads = i == 1 ? 2 : 1;
        char what[64];
        snprintf(what, sizeof what, "synth prompt %d", i);
        exact += check_case(m, &r, &p, ids, np, what);
        n++;
    }
    print_message("synth: %u of %u cases checked exactly\n", exact, n);
    assert_true(exact >= 2);
    r.k_cache = r.v_cache = NULL;
    ref_llama_free(&r);
    kvc_llm_free(m);
}

/* ---- beams 1 is greedy ------------------------------------------------------------------ */
static void one_beam_is_greedy(void **state)
{
    (void)state;
    kvc_llm_t *m = load(STORIES);
    char msg[256];
    const char *texts[] = {"Once upon a time", "The big dog"};
    const kvc_token_t dot = token_of(m, ".");
    for (int i = 0; i < 2; i++)
        for (int stop = 0; stop < 3; stop++) {
            kvc_token_t ids[64];
            const uint32_t np = encode(m, texts[i], ids, 64);
            kvc_engine_params_t ep = kvc_engine_params_default();
            ep.n_threads = 1;
            ep.kv_dtype = KVC_DTYPE_F32;
            kvc_engine_t *e;
            if (kvc_engine_create(m, &ep, &e, msg, sizeof msg)) fail_msg("engine: %s", msg);
            kvc_gen_params_t gp = kvc_gen_params_default();
            gp.max_tokens = 40;
            gp.ignore_eos = !stop;
            if (stop == 2) gp.stop_ids[0] = dot, gp.n_stop_ids = 1;
            kvc_gen_id_t id;
            if (kvc_engine_submit(e, ids, np, &gp, &id, msg, sizeof msg)) fail_msg("%s", msg);
            kvc_token_t want[64];
            uint32_t n_want = 0;
            kvc_finish_t fw = KVC_FINISH_NONE;
            for (int s = 0; !fw && s < 1000; s++) {
                bool idle;
                assert_ok(kvc_engine_step(e, s * 1e-3, NULL, NULL, &idle));
                const kvc_gen_done_t *d;
                uint32_t nd;
                kvc_engine_finished(e, &d, &nd);
                if (nd) {
                    n_want = d[0].completion_tokens;
                    memcpy(want, d[0].output, n_want * sizeof *want);
                    fw = d[0].finish;
                }
            }
            kvc_engine_destroy(e);
            kvc_beam_params_t p = base_params();
            p.n_beams = 1;
            p.max_tokens = 40;
            p.ignore_eos = !stop;
            if (stop == 2) p.stop_ids[0] = dot, p.n_stop_ids = 1;
            p.early_stopping = true; /* with EOS, one beam stops where greedy does */
            kvc_beam_result_t res;
            if (kvc_llm_beam_search(m, &p, ids, np, &res, msg, sizeof msg)) fail_msg("%s", msg);
            assert_int_equal(res.n_hyps, 1);
            const kvc_beam_hyp_t *h = &res.hyps[0];
            assert_int_equal(h->finish, fw);
            assert_int_equal(h->n_ids, n_want);
            assert_memory_equal(h->ids, want, n_want * sizeof *want);
            print_message("greedy \"%s\"%s: %u tokens, %s\n", texts[i],
                          stop == 2 ? " stop \".\""
                          : stop    ? ""
                                    : " ignore_eos",
                          n_want, kvc_finish_name(fw));
            kvc_beam_result_free(&res);
        }
    kvc_llm_free(m);
}

/* ---- memory: the prompt once; a pool too small fails cleanly ---------------------------- */
static size_t block_bytes(const kvc_llm_t *m, kvc_dtype_t dt, uint32_t bs)
{
    const kvc_model_hparams_t *h = kvc_llm_hparams(m);
    kvc_storage_desc_t sd = {
        .n_layers = h->n_layers, .n_kv_heads = h->n_kv_heads, .head_dim = h->head_dim, .dtype = dt};
    size_t b = 0;
    assert_ok(kvc_storage_block_bytes(&sd, bs, &b));
    return b;
}

static void prompt_blocks_are_stored_once(void **state)
{
    (void)state;
    kvc_llm_t *m = load(STORIES);
    char msg[256];
    kvc_token_t ids[200];
    kvc_rng_t g;
    kvc_rng_seed(&g, 9);
    const uint32_t np = 150;
    ids[0] = 1;
    for (uint32_t j = 1; j < np; j++) ids[j] = (kvc_token_t)(3 + kvc_rng_below(&g, 500));
    const uint32_t beams[] = {2, 4, 8, 16};
    for (int i = 0; i < 4; i++) {
        kvc_beam_params_t p = base_params();
        p.n_beams = beams[i];
        p.max_tokens = 32;
        p.ignore_eos = true;
        kvc_beam_result_t res;
        if (kvc_llm_beam_search(m, &p, ids, np, &res, msg, sizeof msg)) fail_msg("%s", msg);
        const uint32_t bs = p.block_size;
        const uint32_t separate = p.n_beams * ((np + p.max_tokens + bs - 1) / bs);
        print_message("N %2u: prompt %u blocks, peak %u blocks (N separate sequences: %u), "
                      "%llu forks, %llu copies\n",
                      p.n_beams, res.prompt_blocks, res.peak_blocks, separate,
                      (unsigned long long)res.forks, (unsigned long long)res.cow_copies);
        assert_int_equal(res.prompt_blocks, (np + bs - 1) / bs);
        assert_true(res.peak_blocks < p.n_beams * res.prompt_blocks);
        /* the prompt's full blocks once, plus per beam its tail: at most the copied last
         * prompt block and the blocks of its 32 outputs */
        const uint32_t tail = (np + p.max_tokens + bs - 1) / bs - np / bs;
        assert_true(res.peak_blocks <= np / bs + p.n_beams * tail);
        assert_true(res.cow_copies >= 1);
        kvc_beam_result_free(&res);
    }
    kvc_llm_free(m);
}

static void a_pool_too_small_fails_cleanly(void **state)
{
    (void)state;
    kvc_llm_t *m = load(STORIES);
    char msg[256];
    kvc_token_t ids[64];
    const uint32_t np = encode(m, "Once upon a time there was a big dog named Max", ids, 64);
    kvc_beam_params_t p = base_params();
    p.n_beams = 8;
    p.max_tokens = 40;
    p.ignore_eos = true;
    p.block_size = 4;
    const size_t bb = block_bytes(m, p.kv_dtype, p.block_size);
    /* the prompt and a little: fine for the prompt, not for 8 beams */
    p.kv_memory = bb * ((np + 3) / 4 + 3);
    kvc_beam_result_t res;
    memset(&res, 0x5a, sizeof res);
    int rc = kvc_llm_beam_search(m, &p, ids, np, &res, msg, sizeof msg);
    assert_true(rc == KVC_ENOSPC || rc == KVC_EBUSY);
    print_message("%s\n", msg);
    assert_non_null(strstr(msg, "too small for 8 beams"));
    assert_null(res.hyps);
    assert_int_equal(res.n_hyps, 0);
    /* too small for the prompt itself */
    p.kv_memory = bb * 2;
    rc = kvc_llm_beam_search(m, &p, ids, np, &res, msg, sizeof msg);
    assert_true(rc == KVC_ENOSPC || rc == KVC_EBUSY);
    assert_non_null(strstr(msg, "too small for the prompt"));
    /* every size in between: the search fails at some later step, or succeeds, and either
     * way leaves nothing behind (the ASan build checks) */
    uint32_t failed = 0, passed = 0, later = 0;
    for (uint32_t extra = 0; extra < 40; extra += 3) {
        p.kv_memory = bb * ((np + 3) / 4 + extra);
        rc = kvc_llm_beam_search(m, &p, ids, np, &res, msg, sizeof msg);
        if (rc) {
            assert_true(rc == KVC_ENOSPC || rc == KVC_EBUSY);
            assert_non_null(strstr(msg, "too small for 8 beams"));
            assert_null(res.hyps);
            failed++;
            later += strstr(msg, "step 1:") == NULL;
        } else {
            assert_int_equal(res.n_hyps, 8);
            kvc_beam_result_free(&res);
            passed++;
        }
    }
    print_message("%u sizes failed (%u after step 1), %u succeeded\n", failed, later, passed);
    assert_true(failed >= 3 && later >= 1 && passed >= 1);
    /* and the same request with room succeeds */
    p.kv_memory = 0;
    assert_ok(kvc_llm_beam_search(m, &p, ids, np, &res, msg, sizeof msg));
    assert_int_equal(res.n_hyps, 8);
    kvc_beam_result_free(&res);
    kvc_beam_result_free(NULL);
    kvc_llm_free(m);
}

static void bad_params_are_refused(void **state)
{
    (void)state;
    kvc_llm_t *m = load(STORIES);
    char msg[256];
    const kvc_token_t ids[3] = {1, 400, 30};
    const kvc_token_t bad_ids[2] = {1, 512};
    kvc_beam_result_t res;
    kvc_beam_params_t p;
#define REFUSED(code, field, value, prompt, n)                                                \
    do {                                                                                      \
        p = base_params();                                                                    \
        p.field = value;                                                                      \
        msg[0] = 0;                                                                           \
        assert_int_equal(kvc_llm_beam_search(m, &p, prompt, n, &res, msg, sizeof msg), code); \
        assert_true(msg[0] != 0);                                                             \
        assert_null(res.hyps);                                                                \
    } while (0)
    REFUSED(KVC_EINVAL, n_beams, 0, ids, 3);
    REFUSED(KVC_EINVAL, n_beams, 65, ids, 3);
    REFUSED(KVC_EINVAL, max_tokens, 0, ids, 3);
    REFUSED(KVC_EINVAL, length_penalty, NAN, ids, 3);
    REFUSED(KVC_EINVAL, length_penalty, INFINITY, ids, 3);
    REFUSED(KVC_EINVAL, block_size, 3, ids, 3);
    REFUSED(KVC_EINVAL, block_size, 512, ids, 3);
    REFUSED(KVC_EINVAL, n_threads, 1000, ids, 3);
    REFUSED(KVC_EINVAL, kv_dtype, (kvc_dtype_t)99, ids, 3);
    REFUSED(KVC_EINVAL, n_beams, 4, bad_ids, 2);
    REFUSED(KVC_EINVAL, n_beams, 4, ids, 0);
    REFUSED(KVC_ERANGE, max_tokens, 100000, ids, 3);
    REFUSED(KVC_EINVAL, kv_memory, 1, ids, 3);
#undef REFUSED
    p = base_params();
    assert_int_equal(kvc_llm_beam_search(m, &p, NULL, 3, &res, msg, sizeof msg), KVC_EINVAL);
    assert_int_equal(kvc_llm_beam_search(m, NULL, ids, 3, &res, msg, sizeof msg), KVC_EINVAL);
    assert_int_equal(kvc_llm_beam_search(NULL, &p, ids, 3, &res, msg, sizeof msg), KVC_EINVAL);
    assert_int_equal(kvc_llm_beam_search(m, &p, ids, 3, NULL, msg, sizeof msg), KVC_EINVAL);
    kvc_llm_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stories_equals_the_reference),
        cmocka_unit_test_setup_teardown(synth_equals_the_reference, synth_setup, synth_teardown),
        cmocka_unit_test(one_beam_is_greedy),
        cmocka_unit_test(prompt_blocks_are_stored_once),
        cmocka_unit_test(a_pool_too_small_fails_cleanly),
        cmocka_unit_test(bad_params_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
