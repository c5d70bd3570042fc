/* test_engine_arch.c - every architecture and weight type the engine runs, against the tests'
 * own double-precision reference over a contiguous cache (tests/ref_llama.h).
 *
 * For each architecture (llama; llama with Mistral's sliding window; llama with each RoPE
 * scaling: linear, YaRN with and without an original context, llama3's rope_freqs; qwen2;
 * qwen3 with a head dim other than dim / heads; gemma2) and each weight type (f32, f16,
 * bf16, q8_0, q4_0, q4_K, q6_K), `kvc_model_synth` writes a small random model (dim 256,
 * head dim 64 so that the SIMD attention kernels run, widths multiples of 256 so that every
 * type applies to every matrix, norms 1 + U(-0.1, 0.1) so that they matter, the 32000-token
 * llama-spm vocabulary); the engine runs it greedily with the top-20 logprobs at every
 * position, the reference follows the engine's tokens, and at every generated position:
 *
 *  - each of the engine's 20 logprobs is within the type's tolerance TOL of the reference's
 *    log-softmax for that token;
 *  - the engine's greedy token is the reference's argmax wherever the reference's top-2
 *    margin is above TOL (closer than that, the position is skipped);
 *  - no token the reference puts 2 TOL above the engine's 20th is missing from the 20;
 *  - and at least a third of the positions are checked for greedy (the margins are the
 *    reference's, so this does not depend on the engine), so that the test cannot pass by
 *    skipping them all.
 *
 * gemma2 and Mistral run prompts several windows long in small prefill chunks: the
 * reference attends the window only on sliding layers, and the sliding group's blocks go
 * back to the pool as the window moves (n_window_released > 0, the pool's peak of used
 * blocks below what full attention holds). */
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

#define VOCAB KVC_DATA_DIR "/models/vocab/ggml-vocab-llama-spm.gguf"
#define TOP   KVC_MAX_LOGPROBS

/* ---- tolerances ---------------------------------------------------------------------------
 * The largest |engine - reference| allowed on a logprob, per weight type.  The reference
 * uses the file's weights exactly (dequantized), in double, so what remains is the engine's
 * own arithmetic:
 *
 *  - f32, f16, bf16 (2e-5): the kernels multiply the stored weights (exact in fp32 whatever
 *    their storage) by fp32 activations with fp32 sums; against double that is ~1e-7
 *    relative per output, and what reaches a logprob near -8.5 is about one fp32 ulp there
 *    (9.5e-7): measured 8e-7 .. 1.1e-6 over every architecture.  2e-5 is twenty ulps.
 *  - q8_0, q4_0 (4e-2): the fast path rounds each activation block of 32 to int8 (Q8_0,
 *    scale max|x| / 127), an error of up to scale / 2 per element, ~0.3% rms of an
 *    activation; over a 256-term dot product with weights of rms 0.036 that is ~4e-3 rms
 *    per logit of these models (rms ~0.6), and every matrix before the LM head adds its
 *    share: measured up to 2.6e-2 over the 240 logprobs of a case.  The weights' own
 *    quantisation costs nothing here: the reference uses the same quantised weights.
 *  - q4_K, q6_K (6e-2): activations rounded per block of 256 to int8 (Q8_K): one scale for
 *    256 values, so a larger max|x| per scale and a coarser step; measured up to 3.8e-2.
 * Greedy positions need a margin above TOL, which with an error of up to TOL on each side
 * could in principle still flip; the measured errors are below TOL / 1.5, so it cannot on
 * these models.  The measured maxima are printed for each case. */
static double type_tol(uint32_t type)
{
    switch (type) {
    case KVC_GGML_F32:
    case KVC_GGML_F16:
    case KVC_GGML_BF16:
        return 2e-5;
    case KVC_GGML_Q8_0:
    case KVC_GGML_Q4_0:
        return 4e-2;
    default:
        return 6e-2;
    }
}

static const uint32_t all_types[] = {KVC_GGML_F32,  KVC_GGML_F16,  KVC_GGML_BF16, KVC_GGML_Q8_0,
                                     KVC_GGML_Q4_0, KVC_GGML_Q4_K, KVC_GGML_Q6_K};
#define N_TYPES (sizeof all_types / sizeof all_types[0])

typedef struct {
    const char *name;
    kvc_model_synth_t p;
    uint32_t n_prompt, n_gen;
    uint32_t prefill_chunk, block_size; /* 0: the engine's defaults */
} arch_case_t;

static kvc_model_synth_t base_model(kvc_arch_t arch)
{
    kvc_model_synth_t p = kvc_model_synth_default();
    p.arch = arch;
    p.dim = 256, p.n_layers = 2, p.n_heads = 4, p.n_kv_heads = 2, p.ff = 512, p.ctx = 1024;
    p.norm_jitter = 0.1f;
    p.seed = 17;
    return p;
}

static char tmp_path[512];

static const char *model_path(const char *tag)
{
    snprintf(tmp_path, sizeof tmp_path, "%s/kvc_test_arch_%d_%s.gguf",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(), tag);
    return tmp_path;
}

static kvc_gguf_t *open_vocab(void)
{
    char msg[256];
    kvc_gguf_t *v;
    if (kvc_gguf_open(VOCAB, NULL, &v, msg, sizeof msg)) fail_msg("%s: %s", VOCAB, msg);
    return v;
}

/* ---- the engine's side ------------------------------------------------------------------ */
typedef struct {
    uint32_t n;
    kvc_token_t ids[64];
    float lp[64];
    kvc_token_t top[64 * TOP];
    float top_lp[64 * TOP];
    kvc_engine_stats_t st;
    kvc_seqs_stats_t ss;
} run_out_t;

static void run_engine(const kvc_llm_t *m, const arch_case_t *c, const kvc_token_t *prompt,
                       run_out_t *o)
{
    char msg[256];
    kvc_engine_params_t ep = kvc_engine_params_default();
    ep.kv_dtype = KVC_DTYPE_F32; /* the reference caches K/V exactly; so does the pool here */
    ep.n_threads = 2;
    ep.max_ctx = c->n_prompt + c->n_gen + 16;
    ep.max_num_seqs = 1;
    if (c->prefill_chunk) ep.max_prefill_chunk = c->prefill_chunk;
    if (c->block_size) ep.block_size = c->block_size;
    kvc_engine_t *e;
    if (kvc_engine_create(m, &ep, &e, msg, sizeof msg)) fail_msg("engine: %s", msg);
    kvc_gen_params_t gp = kvc_gen_params_default();
    gp.max_tokens = c->n_gen;
    gp.ignore_eos = true;
    gp.logprobs = true;
    gp.n_logprobs = TOP;
    kvc_gen_id_t id;
    if (kvc_engine_submit(e, prompt, c->n_prompt, &gp, &id, msg, sizeof msg))
        fail_msg("submit: %s", msg);
    memset(o, 0, sizeof *o);
    bool done = false;
    for (int step = 0; !done; step++) {
        assert_true(step < 10000);
        bool idle;
        assert_ok(kvc_engine_step(e, step * 1e-3, NULL, NULL, &idle));
        if (kvc_sched_check(kvc_engine_sched(e), msg, sizeof msg))
            fail_msg("step %d: %s", step, msg);
        const kvc_gen_done_t *d;
        uint32_t nd;
        kvc_engine_finished(e, &d, &nd);
        if (!nd) continue;
        assert_int_equal(nd, 1);
        assert_int_equal(d->completion_tokens, c->n_gen);
        assert_int_equal(d->n_logprobs, TOP);
        o->n = d->completion_tokens;
        memcpy(o->ids, d->output, o->n * sizeof *o->ids);
        memcpy(o->lp, d->logprobs, o->n * sizeof *o->lp);
        memcpy(o->top, d->top_ids, (size_t)o->n * TOP * sizeof *o->top);
        memcpy(o->top_lp, d->top_logprobs, (size_t)o->n * TOP * sizeof *o->top_lp);
        done = true;
    }
    kvc_engine_stats(e, &o->st);
    kvc_seqs_stats(kvc_engine_seqs(e), &o->ss);
    kvc_engine_destroy(e);
}

/* ---- one case: synth, engine, reference, compare ----------------------------------------- */
typedef struct {
    double max_err;
    uint32_t checked, skipped;
    uint32_t peak_blocks, full_blocks; /* sliding cases: the pool's peak, full attention's */
    uint64_t released;
} case_result_t;

static case_result_t run_case(const arch_case_t *c, uint32_t type, kvc_gguf_t *vocab)
{
    char msg[256];
    kvc_model_synth_t p = c->p;
    p.type = type;
    const char *path = model_path(c->name);
    if (kvc_model_synth(&p, vocab, path, msg, sizeof msg))
        fail_msg("%s %s: synth: %s", c->name, kvc_ggml_type_name(type), msg);
    kvc_llm_t *m;
    if (kvc_llm_load(path, &m, msg, sizeof msg))
        fail_msg("%s %s: load: %s", c->name, kvc_ggml_type_name(type), msg);
    unlink(path); /* the mapping stays */

    kvc_token_t prompt[512];
    assert_true(c->n_prompt <= 512 && c->n_gen <= 64);
    kvc_rng_t r;
    kvc_rng_seed(&r, 5);
    prompt[0] = 1;
    for (uint32_t i = 1; i < c->n_prompt; i++)
        prompt[i] = (kvc_token_t)(3 + kvc_rng_below(&r, 31990));
    static run_out_t o;
    run_engine(m, c, prompt, &o);

    ref_llama_t ref;
    assert_int_equal(ref_llama_init(&ref, kvc_llm_gguf(m), c->n_prompt + c->n_gen), 0);
    const uint32_t V = ref.h.vocab;
    double *lsm = malloc(V * sizeof *lsm);
    assert_non_null(lsm);
    const double tol = type_tol(type);
    case_result_t res = {0};
    uint32_t pos = 0;
    for (; pos + 1 < c->n_prompt; pos++) ref_llama_forward(&ref, (uint32_t)prompt[pos], pos, false);
    uint32_t tok = (uint32_t)prompt[pos];
    for (uint32_t t = 0; t < c->n_gen; t++, pos++) {
        ref_llama_step(&ref, tok, pos);
        ref_log_softmax(ref.logits, V, lsm);
        const kvc_token_t *top = o.top + (size_t)t * TOP;
        const float *top_lp = o.top_lp + (size_t)t * TOP;
        /* the engine's top 20, each against the reference */
        for (uint32_t j = 0; j < TOP; j++) {
            assert_true(top[j] >= 0 && (uint32_t)top[j] < V);
            const double err = fabs(top_lp[j] - lsm[top[j]]);
            if (err > res.max_err) res.max_err = err;
            if (err > tol)
                fail_msg("%s %s: position %u, rank %u (token %d): logprob %.6f, reference %.6f "
                         "(tolerance %g)",
                         c->name, kvc_ggml_type_name(type), pos, j, top[j], top_lp[j], lsm[top[j]],
                         tol);
        }
        assert_int_equal(top[0], o.ids[t]);
        assert_true(o.lp[t] == top_lp[0]);
        /* greedy, where the reference's margin decides it */
        uint32_t best = ref_argmax(lsm, V), second = best ? 0 : 1;
        for (uint32_t v = 0; v < V; v++)
            if (v != best && lsm[v] > lsm[second]) second = v;
        if (lsm[best] - lsm[second] > tol) {
            res.checked++;
            if ((uint32_t)o.ids[t] != best)
                fail_msg("%s %s: position %u: engine %d, reference %u (margin %.5f)", c->name,
                         kvc_ggml_type_name(type), pos, o.ids[t], best, lsm[best] - lsm[second]);
        } else {
            res.skipped++;
        }
        /* nothing clearly above the engine's 20th is missing from its 20 */
        const double floor_lp = top_lp[TOP - 1] + 2 * tol;
        for (uint32_t v = 0; v < V; v++) {
            if (lsm[v] <= floor_lp) continue;
            bool in = false;
            for (uint32_t j = 0; j < TOP && !in; j++) in = (uint32_t)top[j] == v;
            if (!in)
                fail_msg("%s %s: position %u: token %u (reference %.5f) is not in the engine's "
                         "top %u (20th %.5f)",
                         c->name, kvc_ggml_type_name(type), pos, v, lsm[v], TOP, top_lp[TOP - 1]);
        }
        tok = (uint32_t)o.ids[t]; /* the reference follows the engine's tokens */
    }
    if (res.checked * 3 < c->n_gen)
        fail_msg("%s %s: only %u of %u positions had a margin above %g", c->name,
                 kvc_ggml_type_name(type), res.checked, c->n_gen, tol);

    /* sliding layers give their blocks back as the window moves */
    if (ref.h.sliding_window && ref.h.sliding_window + c->n_gen < c->n_prompt) {
        const uint32_t bs = o.st.block_size, total = c->n_prompt + c->n_gen;
        const uint32_t full = (total + bs - 1) / bs;
        const uint32_t n_groups = ref.h.arch == KVC_ARCH_GEMMA2 ? 2 : 1;
        /* a window, the chunk being written and a partial block at each end */
        const uint32_t window_blocks =
            (ref.h.sliding_window + (c->prefill_chunk ? c->prefill_chunk : total)) / bs + 2;
        res.peak_blocks = o.st.peak_blocks;
        res.full_blocks = full * n_groups;
        res.released = o.ss.n_window_released;
        if (o.ss.n_window_released == 0) fail_msg("%s: no block was released", c->name);
        if (o.st.peak_blocks >= full * n_groups ||
            o.st.peak_blocks > (n_groups - 1) * full + window_blocks)
            fail_msg("%s: %u blocks at the peak; full attention holds %u, the window %u + %u",
                     c->name, o.st.peak_blocks, full * n_groups, (n_groups - 1) * full,
                     window_blocks);
    }
    free(lsm);
    ref_llama_free(&ref);
    kvc_llm_free(m);
    return res;
}

/* Every type; under the sanitizers (several times slower) two per architecture, in turn, so
 * that the cases together still cover every type. */
static void run_arch(const arch_case_t *c, uint32_t index)
{
    kvc_gguf_t *vocab = open_vocab();
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        if (KVC_TEST_SANITIZED && ti != (2 * index) % N_TYPES && ti != (2 * index + 1) % N_TYPES)
            continue;
        case_result_t r = run_case(c, all_types[ti], vocab);
        print_message("%-14s %-5s max |logprob error| %.2e (tolerance %.0e), greedy checked at "
                      "%2u of %u positions",
                      c->name, kvc_ggml_type_name(all_types[ti]), r.max_err,
                      type_tol(all_types[ti]), r.checked, r.checked + r.skipped);
        if (r.full_blocks)
            print_message(", %u blocks at the peak (full attention: %u), %llu released by the "
                          "window",
                          r.peak_blocks, r.full_blocks, (unsigned long long)r.released);
        print_message("\n");
    }
    kvc_gguf_close(vocab);
}

/* ---- the cases ---------------------------------------------------------------------------- */
static void llama_every_type(void **state)
{
    (void)state;
    arch_case_t c = {.name = "llama", .p = base_model(KVC_ARCH_LLAMA), .n_prompt = 20, .n_gen = 12};
    run_arch(&c, 0);
}

static void mistral_sliding_window_every_type(void **state)
{
    (void)state;
    arch_case_t c = {.name = "llama-swa",
                     .p = base_model(KVC_ARCH_LLAMA),
                     .n_prompt = 60,
                     .n_gen = 12,
                     .prefill_chunk = 8,
                     .block_size = 8};
    c.p.sliding_window = 20;
    run_arch(&c, 1);
}

static void llama_rope_linear_every_type(void **state)
{
    (void)state;
    arch_case_t c = {
        .name = "llama-linear", .p = base_model(KVC_ARCH_LLAMA), .n_prompt = 20, .n_gen = 12};
    c.p.rope_scaling = KVC_ROPE_SCALING_LINEAR;
    c.p.rope_factor = 4;
    run_arch(&c, 2);
}

/* YaRN with no original context in the file: llama.cpp and HF take the context length. */
static void llama_rope_yarn_every_type(void **state)
{
    (void)state;
    arch_case_t c = {
        .name = "llama-yarn", .p = base_model(KVC_ARCH_LLAMA), .n_prompt = 20, .n_gen = 12};
    c.p.rope_scaling = KVC_ROPE_SCALING_YARN;
    c.p.rope_factor = 4;
    run_arch(&c, 3);
}

static void llama_rope_yarn_orig_ctx_every_type(void **state)
{
    (void)state;
    arch_case_t c = {
        .name = "llama-yarn-256", .p = base_model(KVC_ARCH_LLAMA), .n_prompt = 20, .n_gen = 12};
    c.p.rope_scaling = KVC_ROPE_SCALING_YARN;
    c.p.rope_factor = 8;
    c.p.rope_orig_ctx = 256;
    run_arch(&c, 4);
}

static void llama3_rope_freqs_every_type(void **state)
{
    (void)state;
    arch_case_t c = {
        .name = "llama3", .p = base_model(KVC_ARCH_LLAMA), .n_prompt = 20, .n_gen = 12};
    c.p.rope_scaling = KVC_ROPE_SCALING_LLAMA3;
    c.p.rope_orig_ctx = 256; /* so that most frequencies are scaled at these dims */
    c.p.rope_theta = 500000;
    run_arch(&c, 5);
}

static void qwen2_every_type(void **state)
{
    (void)state;
    arch_case_t c = {.name = "qwen2", .p = base_model(KVC_ARCH_QWEN2), .n_prompt = 20, .n_gen = 12};
    c.p.tied = true;
    run_arch(&c, 6);
}

static void qwen3_every_type(void **state)
{
    (void)state;
    arch_case_t c = {.name = "qwen3", .p = base_model(KVC_ARCH_QWEN3), .n_prompt = 20, .n_gen = 12};
    c.p.n_heads = 8, c.p.n_kv_heads = 2, c.p.head_dim = 64; /* Q is 512 wide, dim 256 */
    run_arch(&c, 7);
}

static void gemma2_every_type(void **state)
{
    (void)state;
    arch_case_t c = {.name = "gemma2",
                     .p = base_model(KVC_ARCH_GEMMA2),
                     .n_prompt = 60,
                     .n_gen = 12,
                     .prefill_chunk = 8,
                     .block_size = 8};
    c.p.tied = true;
    c.p.sliding_window = 16;
    /* soft-caps low enough that tanh bends these small random logits */
    c.p.attn_softcap = 1.0f;
    c.p.final_softcap = 3.0f;
    run_arch(&c, 8);
}

/* Gemma 2 27B scales attention logits by 1 / sqrt(dim / heads) (its query_pre_attn_scalar,
 * 144), not 1 / sqrt(head_dim) (128); GGUF has no key for it, and llama.cpp tells the 27B by
 * its 46 layers.  A narrow 46-layer gemma2 whose head dim differs from dim / heads. */
static void gemma2_27b_scales_by_dim_over_heads(void **state)
{
    (void)state;
    arch_case_t c = {
        .name = "gemma2-46", .p = base_model(KVC_ARCH_GEMMA2), .n_prompt = 12, .n_gen = 6};
    c.p.dim = 128, c.p.n_layers = 46, c.p.n_heads = 2, c.p.n_kv_heads = 1, c.p.ff = 128;
    c.p.head_dim = 128; /* dim / heads is 64 */
    c.p.tied = true;
    c.p.attn_softcap = 1.0f;
    c.p.final_softcap = 3.0f;
    kvc_gguf_t *vocab = open_vocab();
    case_result_t r = run_case(&c, KVC_GGML_F16, vocab);
    print_message("gemma2-46      f16   max |logprob error| %.2e (tolerance %.0e)\n", r.max_err,
                  type_tol(KVC_GGML_F16));
    kvc_gguf_close(vocab);
}

/* gemma2's hybrid pool under reuse: the same prompt again, after its first run has finished
 * and its sliding blocks were released, hits the prefix cache (the full group from the
 * start, the sliding group's last window) and gives bit-identical logprobs; so does a prompt
 * that continues it.  Full attention alone could not tell a wrong sliding hit. */
static void gemma2_prefix_hit_is_bit_identical(void **state)
{
    (void)state;
    char msg[256];
    kvc_gguf_t *vocab = open_vocab();
    kvc_model_synth_t p = base_model(KVC_ARCH_GEMMA2);
    p.type = KVC_GGML_F32;
    p.tied = true;
    p.sliding_window = 16;
    p.attn_softcap = 1.0f;
    p.final_softcap = 3.0f;
    const char *path = model_path("gemma2-hit");
    assert_ok(kvc_model_synth(&p, vocab, path, msg, sizeof msg));
    kvc_gguf_close(vocab);
    kvc_llm_t *m;
    if (kvc_llm_load(path, &m, msg, sizeof msg)) fail_msg("load: %s", msg);
    unlink(path);
    kvc_engine_params_t ep = kvc_engine_params_default();
    ep.kv_dtype = KVC_DTYPE_F32;
    ep.n_threads = 2;
    ep.max_ctx = 128;
    ep.max_num_seqs = 2;
    ep.block_size = 8;
    ep.max_prefill_chunk = 8;
    kvc_engine_t *e;
    if (kvc_engine_create(m, &ep, &e, msg, sizeof msg)) fail_msg("engine: %s", msg);
    kvc_token_t prompt[80];
    kvc_rng_t r;
    kvc_rng_seed(&r, 9);
    prompt[0] = 1;
    for (int i = 1; i < 80; i++) prompt[i] = (kvc_token_t)(3 + kvc_rng_below(&r, 31990));
    const uint32_t lens[3] = {60, 60, 75}; /* the third continues the first */
    kvc_token_t ids[3][8];
    float top_lp[3][8 * TOP];
    uint32_t cached[3];
    for (int q = 0; q < 3; q++) {
        kvc_gen_params_t gp = kvc_gen_params_default();
        gp.max_tokens = 8;
        gp.ignore_eos = true;
        gp.logprobs = true;
        gp.n_logprobs = TOP;
        kvc_gen_id_t id;
        if (kvc_engine_submit(e, prompt, lens[q], &gp, &id, msg, sizeof msg))
            fail_msg("submit: %s", msg);
        bool done = false;
        for (int step = 0; !done; step++) {
            assert_true(step < 10000);
            bool idle;
            assert_ok(kvc_engine_step(e, step * 1e-3, NULL, NULL, &idle));
            if (kvc_sched_check(kvc_engine_sched(e), msg, sizeof msg)) fail_msg("%s", msg);
            const kvc_gen_done_t *d;
            uint32_t nd;
            kvc_engine_finished(e, &d, &nd);
            if (!nd) continue;
            assert_int_equal(d->completion_tokens, 8);
            memcpy(ids[q], d->output, sizeof ids[q]);
            memcpy(top_lp[q], d->top_logprobs, sizeof top_lp[q]);
            cached[q] = d->cached_tokens;
            done = true;
        }
    }
    kvc_seqs_stats_t ss;
    kvc_seqs_stats(kvc_engine_seqs(e), &ss);
    assert_true(ss.n_window_released > 0);
    assert_int_equal(cached[0], 0);
    if (cached[1] == 0 || cached[2] == 0)
        fail_msg("no prefix hit: %u and %u tokens cached", cached[1], cached[2]);
    assert_memory_equal(ids[0], ids[1], sizeof ids[0]);
    assert_memory_equal(top_lp[0], top_lp[1], sizeof top_lp[0]);
    kvc_engine_destroy(e);
    /* the third against a fresh engine that computes all of it */
    if (kvc_engine_create(m, &ep, &e, msg, sizeof msg)) fail_msg("engine: %s", msg);
    kvc_gen_params_t gp = kvc_gen_params_default();
    gp.max_tokens = 8;
    gp.ignore_eos = true;
    gp.logprobs = true;
    gp.n_logprobs = TOP;
    kvc_gen_id_t id;
    assert_ok(kvc_engine_submit(e, prompt, lens[2], &gp, &id, msg, sizeof msg));
    bool done = false;
    for (int step = 0; !done; step++) {
        assert_true(step < 10000);
        bool idle;
        assert_ok(kvc_engine_step(e, step * 1e-3, NULL, NULL, &idle));
        const kvc_gen_done_t *d;
        uint32_t nd;
        kvc_engine_finished(e, &d, &nd);
        if (!nd) continue;
        assert_int_equal(d->cached_tokens, 0);
        assert_memory_equal(d->output, ids[2], sizeof ids[2]);
        assert_memory_equal(d->top_logprobs, top_lp[2], sizeof top_lp[2]);
        done = true;
    }
    print_message("gemma2 prefix hits: %u and %u of 60 and 75 prompt tokens cached, outputs "
                  "bit-identical\n",
                  cached[1], cached[2]);
    kvc_engine_destroy(e);
    kvc_llm_free(m);
}

/* What synth writes is what the metadata reader reads back, architecture by architecture. */
static void synth_writes_each_architecture(void **state)
{
    (void)state;
    char msg[256];
    kvc_gguf_t *vocab = open_vocab();
    struct {
        kvc_arch_t arch;
        uint32_t window, head_dim;
        kvc_rope_scaling_t scaling;
    } cases[] = {{KVC_ARCH_LLAMA, 0, 0, KVC_ROPE_SCALING_NONE},
                 {KVC_ARCH_LLAMA, 32, 0, KVC_ROPE_SCALING_YARN},
                 {KVC_ARCH_LLAMA, 0, 0, KVC_ROPE_SCALING_LLAMA3},
                 {KVC_ARCH_QWEN2, 0, 0, KVC_ROPE_SCALING_LINEAR},
                 {KVC_ARCH_QWEN3, 0, 128, KVC_ROPE_SCALING_NONE},
                 {KVC_ARCH_GEMMA2, 0, 0, KVC_ROPE_SCALING_NONE}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvc_model_synth_t p = base_model(cases[i].arch);
        p.n_layers = 3;
        p.type = KVC_GGML_F16;
        p.sliding_window = cases[i].window;
        p.head_dim = cases[i].head_dim;
        p.rope_scaling = cases[i].scaling;
        p.norm_jitter = -1; /* the architecture's own */
        const char *path = model_path("meta");
        assert_ok(kvc_model_synth(&p, vocab, path, msg, sizeof msg));
        kvc_gguf_t *g;
        assert_ok(kvc_gguf_open(path, NULL, &g, msg, sizeof msg));
        kvc_model_hparams_t h;
        if (kvc_model_hparams_from_gguf(g, &h, msg, sizeof msg)) fail_msg("%s", msg);
        assert_int_equal(h.arch, cases[i].arch);
        assert_int_equal(h.head_dim, cases[i].head_dim ? cases[i].head_dim : 64);
        assert_int_equal(h.rope_dim, h.head_dim);
        assert_int_equal(h.rope_scaling, cases[i].scaling);
        assert_int_equal(h.qkv_bias, cases[i].arch == KVC_ARCH_QWEN2);
        assert_int_equal(h.qk_norm, cases[i].arch == KVC_ARCH_QWEN3);
        const bool gemma = cases[i].arch == KVC_ARCH_GEMMA2;
        assert_int_equal(h.sliding_window, gemma ? 4096 : cases[i].window);
        assert_int_equal(h.n_sliding_layers, gemma ? 2 : cases[i].window ? 3 : 0);
        assert_true(h.attn_softcap == (gemma ? 50 : 0) && h.final_softcap == (gemma ? 30 : 0));
        assert_true(fabs(h.embed_scale - (gemma ? 16 : 1)) < 1e-12);
        assert_true(fabs(h.rms_eps - (cases[i].arch == KVC_ARCH_LLAMA ? 1e-5 : 1e-6)) < 1e-9);
        if (cases[i].scaling == KVC_ROPE_SCALING_YARN ||
            cases[i].scaling == KVC_ROPE_SCALING_LINEAR)
            assert_true(h.rope_factor == 4);
        if (cases[i].scaling == KVC_ROPE_SCALING_YARN) assert_int_equal(h.rope_orig_ctx, 0);
        /* norms: exactly 1 for llama, 1 + U(-0.1, 0.1) for the others, and not all 1 */
        const char *norms[] = {"output_norm.weight", "blk.1.ffn_norm.weight",
                               gemma ? "blk.2.post_ffw_norm.weight" : "blk.0.attn_norm.weight",
                               cases[i].arch == KVC_ARCH_QWEN3 ? "blk.0.attn_k_norm.weight"
                                                               : "blk.2.attn_norm.weight"};
        for (size_t k = 0; k < 4; k++) {
            const kvc_gguf_tensor_t *t = kvc_gguf_find_tensor(g, norms[k]);
            if (!t) fail_msg("%s: no %s", kvc_arch_name(cases[i].arch), norms[k]);
            assert_int_equal(t->type, KVC_GGML_F32);
            const float *w = t->data;
            bool all_one = true;
            for (uint64_t e = 0; e < t->n_elems; e++) {
                assert_true(w[e] >= 0.9f && w[e] <= 1.1f);
                all_one = all_one && w[e] == 1.0f;
            }
            assert_int_equal(all_one, cases[i].arch == KVC_ARCH_LLAMA);
        }
        if (cases[i].arch == KVC_ARCH_QWEN2) {
            const kvc_gguf_tensor_t *t = kvc_gguf_find_tensor(g, "blk.2.attn_v.bias");
            assert_non_null(t);
            assert_int_equal(t->n_elems, 128);
            const float *b = t->data;
            double sum_abs = 0;
            for (uint64_t e = 0; e < t->n_elems; e++) {
                assert_true(fabsf(b[e]) <= 0.2f);
                sum_abs += fabsf(b[e]);
            }
            assert_true(sum_abs / 128 > 0.05); /* uniform in +-0.2: mean |b| 0.1 */
        }
        if (cases[i].scaling == KVC_ROPE_SCALING_LLAMA3) {
            /* Llama 3.1's factors: 1 for the short wavelengths, 8 for the long ones */
            const kvc_gguf_tensor_t *t = kvc_gguf_find_tensor(g, "rope_freqs.weight");
            assert_non_null(t);
            assert_int_equal(t->n_elems, 32);
            const float *f = t->data;
            assert_true(f[0] == 1.0f && f[31] == 8.0f);
            for (int k = 1; k < 32; k++) assert_true(f[k] >= f[k - 1]);
        }
        if (cases[i].arch == KVC_ARCH_QWEN3)
            assert_int_equal(kvc_gguf_find_tensor(g, "blk.0.attn_q.weight")->ne[1], 4 * 128);
        kvc_gguf_close(g);
        /* and the engine loads it */
        kvc_llm_t *m;
        if (kvc_llm_load(path, &m, msg, sizeof msg)) fail_msg("load: %s", msg);
        kvc_llm_free(m);
        unlink(path);
    }
    kvc_gguf_close(vocab);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(synth_writes_each_architecture),
        cmocka_unit_test(llama_every_type),
        cmocka_unit_test(mistral_sliding_window_every_type),
        cmocka_unit_test(llama_rope_linear_every_type),
        cmocka_unit_test(llama_rope_yarn_every_type),
        cmocka_unit_test(llama_rope_yarn_orig_ctx_every_type),
        cmocka_unit_test(llama3_rope_freqs_every_type),
        cmocka_unit_test(qwen2_every_type),
        cmocka_unit_test(qwen3_every_type),
        cmocka_unit_test(gemma2_every_type),
        cmocka_unit_test(gemma2_27b_scales_by_dim_over_heads),
        cmocka_unit_test(gemma2_prefix_hit_is_bit_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
