/* test_engine.c - the engine on the paged cache, end to end.
 *
 *  - stories260K (real weights, real vocabulary) greedy from BOS tells the story llama2.c
 *    documents, and greedy ids for text prompts equal the tests' own double-precision
 *    reference forward pass over a contiguous cache (tests/ref_llama.h);
 *  - batch invariance, bit for bit (DESIGN.md invariant 10): a request's output ids, the
 *    logprob of each chosen token and the top-20 logprobs at every position are identical
 *    alone, batched with others, with prompt chunks of 1 / 7 / 64 / whole, with its prefix
 *    from the cache, with speculative (n-gram) decoding, on 1 or 2 threads, under a pool so
 *    small that requests are preempted and recomputed, and without any KV cache at all;
 *  - the scheduler's and the seq table's invariant checkers after every step;
 *  - bad requests refused with a message, never a crash. */
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
#include "engine_harness.h"
#include "ref_llama.h"
#include "test_helpers.h"

#define STORIES KVC_DATA_DIR "/models/stories260K.gguf"
#define VOCAB   KVC_DATA_DIR "/models/vocab/ggml-vocab-llama-spm.gguf"

#define MAX_OUT HARNESS_MAX_OUT
#define TOP     HARNESS_TOP

static uint32_t encode(const kvc_llm_t *m, const char *text, kvc_token_t *ids, size_t cap)
{
    size_t n;
    assert_ok(kvc_tokenizer_encode(kvc_llm_tokenizer(m), text, strlen(text),
                                   KVC_TOK_ADD_BOS | KVC_TOK_PARSE_SPECIAL, ids, cap, &n));
    return (uint32_t)n;
}

/* ---- stories260K ------------------------------------------------------------------------ */
static void stories_tells_its_story(void **state)
{
    (void)state;
    kvc_llm_t *m = load(STORIES);
    kvc_engine_params_t ep = kvc_engine_params_default();
    ep.n_threads = 1;
    kvc_gen_params_t gp = kvc_gen_params_default();
    gp.max_tokens = MAX_OUT;
    const kvc_token_t bos = 1;
    prompt_t p = {&bos, 1};
    static out_t o;
    run_all(m, &ep, &p, 1, &gp, &o, NULL);
    /* llama2.c's README for this model (see tests/data/models/PROVENANCE.md) */
    const char *story = "Once upon a time, there was a little girl named Lily. She loved to play "
                        "outside in the park. One day, she saw a big, red ball.";
    if (strncmp(o.text, story, strlen(story))) fail_msg("the story is: %s", o.text);
    kvc_llm_free(m);
}

/* Greedy ids of text prompts against the double-precision reference, which also gives the
 * logprob of each chosen token (fp32 kernels against double: 2e-3 absolute). */
static void stories_matches_the_reference(void **state)
{
    (void)state;
    kvc_llm_t *m = load(STORIES);
    const char *texts[] = {"Once upon a time", "Lily and Tom went to the", "The big dog"};
    kvc_token_t ids[3][64];
    prompt_t pr[3];
    for (int i = 0; i < 3; i++) pr[i] = (prompt_t){ids[i], encode(m, texts[i], ids[i], 64)};
    kvc_engine_params_t ep = kvc_engine_params_default();
    ep.kv_dtype = KVC_DTYPE_F32;
    kvc_gen_params_t gp = kvc_gen_params_default();
    gp.max_tokens = 40;
    gp.ignore_eos = true;
    gp.logprobs = true;
    static out_t o[3];
    run_all(m, &ep, pr, 3, &gp, o, NULL);
    for (int i = 0; i < 3; i++) {
        ref_llama_t r;
        assert_int_equal(ref_llama_init(&r, kvc_llm_gguf(m), 128), 0);
        uint32_t pos = 0;
        for (; pos < pr[i].n; pos++) ref_llama_step(&r, (uint32_t)pr[i].ids[pos], pos);
        for (uint32_t t = 0; t < gp.max_tokens; t++) {
            uint32_t best = ref_argmax(r.logits, r.h.vocab);
            double mx = r.logits[best], sum = 0;
            for (uint32_t v = 0; v < r.h.vocab; v++) sum += exp(r.logits[v] - mx);
            const double lp = -log(sum);
            if ((uint32_t)o[i].ids[t] != best)
                fail_msg("prompt %d token %u: engine %d, reference %u", i, t, o[i].ids[t], best);
            if (fabs(o[i].lp[t] - lp) > 2e-3)
                fail_msg("prompt %d token %u: logprob %.6f vs %.6f", i, t, o[i].lp[t], lp);
            ref_llama_step(&r, best, pos++);
        }
        ref_llama_free(&r);
    }
    kvc_llm_free(m);
}

/* ---- batch invariance on a random model whose heads take the SIMD attention kernels ----- */
static char synth_path[64];

static int synth_setup(void **state)
{
    (void)state;
    char msg[256];
    kvc_gguf_t *v;
    if (kvc_gguf_open(VOCAB, NULL, &v, msg, sizeof msg)) return -1;
    snprintf(synth_path, sizeof synth_path, "/tmp/kvc_test_engine_%d.gguf", (int)getpid());
    kvc_model_synth_t p = kvc_model_synth_default();
    p.dim = 256, p.n_layers = 2, p.n_heads = 4, p.n_kv_heads = 2, p.ff = 512, p.ctx = 512;
    p.type = 8; /* Q8_0 */
    p.seed = 7;
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

#define N_REQ 4
static kvc_token_t inv_ids[N_REQ][200];
static prompt_t inv_pr[N_REQ];

static void invariance_prompts(void)
{
    kvc_rng_t r;
    kvc_rng_seed(&r, 3);
    const uint32_t lens[N_REQ] = {150, 37, 90, 5};
    for (int i = 0; i < N_REQ; i++) {
        inv_ids[i][0] = 1;
        for (uint32_t j = 1; j < lens[i]; j++) {
            /* request 0 repeats itself so that n-gram drafts get accepted */
            inv_ids[i][j] = i == 0 && j >= 50 ? inv_ids[i][j - 40]
                                              : (kvc_token_t)(3 + kvc_rng_below(&r, 31990));
        }
        inv_pr[i] = (prompt_t){inv_ids[i], lens[i]};
    }
}

static kvc_gen_params_t inv_gen(bool sampled)
{
    kvc_gen_params_t gp = kvc_gen_params_default();
    gp.max_tokens = 24;
    gp.ignore_eos = true;
    gp.logprobs = true;
    gp.n_logprobs = TOP;
    if (sampled) gp.temperature = 0.9f, gp.top_p = 0.95f, gp.seed = 11;
    return gp;
}

static void batch_invariance_case(bool sampled)
{
    kvc_llm_t *m = load(synth_path);
    invariance_prompts();
    const kvc_gen_params_t gp = inv_gen(sampled);
    kvc_engine_params_t base = kvc_engine_params_default();
    base.n_threads = 1;
    base.max_num_seqs = 1;
    base.block_size = 16;

    /* each request alone, whole prompt in one chunk, one thread: the baseline */
    static out_t alone[N_REQ], got[N_REQ];
    for (int i = 0; i < N_REQ; i++) run_all(m, &base, &inv_pr[i], 1, &gp, &alone[i], NULL);

    struct {
        const char *what;
        uint32_t threads, chunk, max_seqs, spec;
        uint64_t kv_memory;
        bool no_cache;
    } cases[] = {
        {"batched, 2 threads", 2, 0, 8, 0, 0, false},
        {"batched, chunk 1", 1, 1, 8, 0, 0, false},
        {"batched, chunk 7", 2, 7, 8, 0, 0, false},
        {"batched, chunk 64", 1, 64, 8, 0, 0, false},
        {"speculative (n-gram, 4 drafts)", 2, 0, 8, 4, 0, false},
        {"a pool too small: preemption and recompute", 1, 0, 8, 0, 1, false},
        {"a pool too small: preemption and swap", 2, 0, 8, 0, 2, false},
        {"no KV cache", 2, 0, 8, 0, 0, true},
    };
    for (size_t c = 0; c < KVC_ARRAY_LEN(cases); c++) {
        kvc_engine_params_t ep = base;
        ep.n_threads = cases[c].threads;
        ep.max_prefill_chunk = cases[c].chunk;
        ep.max_num_seqs = cases[c].max_seqs;
        ep.spec_tokens = cases[c].spec;
        ep.no_kv_cache = cases[c].no_cache;
        if (cases[c].kv_memory == 2) {
            /* blocks of 32: the swapped requests' last blocks are partial, so their bytes
             * must come back from host memory (a full block could come back from the cache) */
            ep.preemption = KVC_PREEMPT_SWAP;
            ep.block_size = 32;
        }
        if (cases[c].kv_memory) {
            /* 14 blocks of 16 (9 of 32): the requests need 11 + 4 + 8 + 2 (6 + 2 + 4 + 1), so
             * some are preempted */
            kvc_storage_desc_t sd = {
                .n_layers = 2, .n_kv_heads = 2, .head_dim = 64, .dtype = ep.kv_dtype};
            size_t bb;
            assert_ok(kvc_storage_block_bytes(&sd, ep.block_size, &bb));
            ep.kv_memory = (ep.block_size == 32 ? 12 : 14) * bb;
        }
        kvc_engine_stats_t st;
        run_all(m, &ep, inv_pr, N_REQ, &gp, got, &st);
        for (int i = 0; i < N_REQ; i++) {
            char what[128];
            snprintf(what, sizeof what, "%s, request %d", cases[c].what, i);
            assert_same(&alone[i], &got[i], what);
        }
        if (cases[c].spec && !sampled) assert_true(st.accepted_tokens > 0);
        if (cases[c].kv_memory) assert_true(st.preemptions > 0);
        if (cases[c].kv_memory == 2) assert_true(st.swapped_in_bytes > 0);
    }

    /* four requests with one prompt, all submitted at once: the first computes it, the others
     * wait for its blocks and hit them (every block but the last partial one), same outputs */
    {
        kvc_engine_params_t ep = base;
        ep.max_num_seqs = 8;
        prompt_t four[4] = {inv_pr[0], inv_pr[0], inv_pr[0], inv_pr[0]};
        kvc_engine_stats_t st;
        run_all(m, &ep, four, 4, &gp, got, &st);
        uint32_t hits = 0;
        for (int i = 0; i < 4; i++) {
            assert_same(&alone[0], &got[i], "one prompt, four requests at once");
            hits += got[i].cached;
        }
        assert_int_equal(hits, 3 * 144); /* 150 tokens: 9 full blocks of 16 each, 3 times */
        assert_int_equal(st.prefill_tokens, 150 + 3 * 6);
    }

    /* the same prompt again in one engine: its prefix comes from the cache */
    {
        kvc_engine_params_t ep = base;
        ep.max_num_seqs = 8;
        prompt_t twice[2] = {inv_pr[0], inv_pr[0]};
        char msg[256];
        kvc_engine_t *e;
        assert_ok(kvc_engine_create(m, &ep, &e, msg, sizeof msg));
        for (int k = 0; k < 2; k++) {
            kvc_gen_params_t g = gp;
            kvc_gen_id_t id;
            assert_ok(kvc_engine_submit(e, twice[k].ids, twice[k].n, &g, &id, msg, sizeof msg));
            for (int step = 0;; step++) {
                assert_true(step < 10000);
                assert_ok(kvc_engine_step(e, step * 1e-3, NULL, NULL, NULL));
                const kvc_gen_done_t *d;
                uint32_t nd;
                kvc_engine_finished(e, &d, &nd);
                if (!nd) continue;
                out_t o;
                copy_done(&o, &d[0]);
                if (k == 1) assert_true(d[0].cached_tokens >= 128); /* 9 full blocks of 150 */
                assert_same(&alone[0], &o, k ? "prefix from the cache" : "first run");
                break;
            }
        }
        kvc_engine_destroy(e);
    }
    kvc_llm_free(m);
}

static void batch_invariance_greedy(void **state)
{
    (void)state;
    batch_invariance_case(false);
}

static void batch_invariance_sampled(void **state)
{
    (void)state;
    batch_invariance_case(true);
}

/* --n 4: the prompt is computed once, each sample forks its blocks copy-on-write (the prompt's
 * blocks stored once, one copied block per child at most), and sample k equals the same
 * request run alone with seed + k, bit for bit. */
static void parallel_samples_fork(void **state)
{
    (void)state;
    kvc_llm_t *m = load(synth_path);
    invariance_prompts();
    kvc_gen_params_t gp = inv_gen(true);
    kvc_engine_params_t ep = kvc_engine_params_default();
    ep.n_threads = 2;
    static out_t alone[4], got[4];
    for (int k = 0; k < 4; k++) {
        kvc_gen_params_t g = gp;
        g.seed = gp.seed + (uint64_t)k;
        run_all(m, &ep, &inv_pr[0], 1, &g, &alone[k], NULL);
    }
    char msg[256];
    kvc_engine_t *e;
    assert_ok(kvc_engine_create(m, &ep, &e, msg, sizeof msg));
    kvc_gen_params_t g = gp;
    g.n = 4;
    kvc_gen_id_t id;
    assert_ok(kvc_engine_submit(e, inv_pr[0].ids, inv_pr[0].n, &g, &id, msg, sizeof msg));
    uint32_t left = 4;
    for (int step = 0; left; step++) {
        assert_true(step < 10000);
        assert_ok(kvc_engine_step(e, step * 1e-3, NULL, NULL, NULL));
        if (kvc_sched_check(kvc_engine_sched(e), msg, sizeof msg)) fail_msg("%s", msg);
        const kvc_gen_done_t *d;
        uint32_t nd;
        kvc_engine_finished(e, &d, &nd);
        for (uint32_t i = 0; i < nd; i++) {
            copy_done(&got[d[i].sample_index], &d[i]);
            left--;
        }
    }
    for (int k = 0; k < 4; k++) assert_same(&alone[k], &got[k], "forked sample");
    kvc_engine_stats_t st;
    kvc_engine_stats(e, &st);
    kvc_seqs_stats_t ss;
    kvc_seqs_stats(kvc_engine_seqs(e), &ss);
    assert_int_equal(ss.n_forks, 3);
    assert_true(ss.n_cow_copies <= 3); /* the partial last prompt block, once per child */
    /* 150 + 24 tokens: 11 blocks alone, of which 9 are the prompt's full blocks: shared */
    assert_true(st.peak_blocks <= 9 + 4 * 2);
    assert_int_equal(st.prefill_tokens, 150);
    kvc_engine_destroy(e);
    kvc_llm_free(m);
}

/* ---- bad requests ----------------------------------------------------------------------- */
static void bad_requests_are_refused(void **state)
{
    (void)state;
    kvc_llm_t *m = load(STORIES);
    kvc_engine_params_t ep = kvc_engine_params_default();
    ep.max_ctx = 64;
    char msg[256];
    kvc_engine_t *e;
    assert_ok(kvc_engine_create(m, &ep, &e, msg, sizeof msg));
    kvc_token_t ids[80];
    for (int i = 0; i < 80; i++) ids[i] = 1 + i;
    kvc_gen_params_t gp = kvc_gen_params_default();
    kvc_gen_id_t id;
    assert_int_equal(kvc_engine_submit(e, ids, 80, &gp, &id, msg, sizeof msg), KVC_ERANGE);
    assert_non_null(strstr(msg, "context"));
    ids[3] = 512;
    assert_int_equal(kvc_engine_submit(e, ids, 10, &gp, &id, msg, sizeof msg), KVC_EINVAL);
    assert_non_null(strstr(msg, "vocabulary"));
    ids[3] = 4;
    assert_int_equal(kvc_engine_submit(e, ids, 0, &gp, &id, msg, sizeof msg), KVC_EINVAL);
    gp.temperature = -1;
    assert_int_equal(kvc_engine_submit(e, ids, 10, &gp, &id, msg, sizeof msg), KVC_EINVAL);
    gp = kvc_gen_params_default();
    gp.max_tokens = 0;
    assert_int_equal(kvc_engine_submit(e, ids, 10, &gp, &id, msg, sizeof msg), KVC_EINVAL);
    gp = kvc_gen_params_default();
    gp.n_stop = 1;
    gp.stop[0] = "";
    assert_int_equal(kvc_engine_submit(e, ids, 10, &gp, &id, msg, sizeof msg), KVC_EINVAL);
    /* an abort of a live request finishes it; a stale id is refused */
    gp = kvc_gen_params_default();
    gp.max_tokens = 30;
    assert_ok(kvc_engine_submit(e, ids, 10, &gp, &id, msg, sizeof msg));
    assert_ok(kvc_engine_step(e, 0, NULL, NULL, NULL));
    assert_ok(kvc_engine_abort(e, id));
    bool seen = false;
    for (int s = 1; s < 10 && !seen; s++) {
        assert_ok(kvc_engine_step(e, s * 1e-3, NULL, NULL, NULL));
        const kvc_gen_done_t *d;
        uint32_t nd;
        kvc_engine_finished(e, &d, &nd);
        if (nd) {
            assert_int_equal(d[0].finish, KVC_FINISH_ABORT);
            seen = true;
        }
    }
    assert_true(seen);
    assert_int_equal(kvc_engine_abort(e, id), KVC_ESTALE);
    kvc_engine_destroy(e);
    kvc_llm_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stories_tells_its_story),
        cmocka_unit_test(stories_matches_the_reference),
        cmocka_unit_test(bad_requests_are_refused),
        cmocka_unit_test_setup_teardown(batch_invariance_greedy, synth_setup, synth_teardown),
        cmocka_unit_test_setup_teardown(batch_invariance_sampled, synth_setup, synth_teardown),
        cmocka_unit_test_setup_teardown(parallel_samples_fork, synth_setup, synth_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
