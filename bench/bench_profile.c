/* bench_profile.c - this machine's hardware profile for the simulator: the CPU engine's real
 * step time on a grid of (batch tokens T, mean keys per query K), written as the JSON that
 * `kvcache sim --profile FILE` reads (include/kvcache/sim.h, kvc_sim_profile_parse).
 *
 * Each cell is measured through the engine's API on the model, with the engine options the
 * server will run with (threads, block size, running cap, token budget), timing
 * kvc_engine_step itself (scheduling, the forward pass, sampling):
 *   - T <= --max-num-seqs (and 64): a decode step of T rows at context K: one request of
 *     T parallel samples (the prompt computed once, the samples forked copy-on-write), so
 *     that setting up a cell costs one prompt; the timed steps decode all T.
 *   - larger T: a prefill step of n requests computing m = T / n new tokens each after a
 *     cached prefix of f tokens, with m = min(T, 2K) and f chosen so that f + (m + 1) / 2 is
 *     K (f rounds to whole blocks; the actual K is written beside the grid).
 * The median of --reps steps per prefill cell, of 3 x --reps per decode cell.  Steps whose token
 * count is not the cell's (the scheduler split them) are left out.  usage: bench_profile --model
 * FILE [--threads N] [--block-size N] [--max-num-seqs N]
 *                 [--max-num-batched-tokens N] [--kv-memory MiB] [--ctx N]
 *                 [--tokens 1,2,4,...] [--context 16,64,...] [--reps N] [-o FILE]
 */
#include "bench_util.h"
#include "kvcache/kvcache.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXP 64

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_profile: %s: %s\n", what, msg);
    exit(1);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint32_t parse_list(const char *s, double *v)
{
    uint32_t n = 0;
    for (const char *p = s; *p && n < MAXP;) {
        char *end;
        v[n++] = strtod(p, &end);
        if (end == p) die("bad list", s);
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

typedef struct {
    kvc_engine_t *e;
    uint32_t vocab, bs;
    uint64_t rng;
    double t0;
    uint64_t live; /* requests submitted and not finished */
} ctx_t;

static kvc_token_t rnd(ctx_t *c)
{
    c->rng = c->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (kvc_token_t)(3 + (c->rng >> 33) % (c->vocab - 3));
}

static void submit(ctx_t *c, const kvc_token_t *p, uint32_t n, uint32_t max_tokens)
{
    kvc_gen_params_t gp = kvc_gen_params_default();
    gp.max_tokens = max_tokens;
    gp.ignore_eos = true;
    gp.temperature = 0;
    kvc_gen_id_t id;
    char msg[256];
    if (kvc_engine_submit(c->e, p, n, &gp, &id, msg, sizeof msg)) die("submit", msg);
    c->live++;
}

static void on_event(void *ctx, const kvc_gen_event_t *ev)
{
    (void)ctx, (void)ev;
}

/* One engine step; its wall time, and the tokens it computed (prefill, decode). */
static double step(ctx_t *c, uint64_t *prefill, uint64_t *decode)
{
    kvc_engine_stats_t a, b;
    kvc_engine_stats(c->e, &a);
    bool idle;
    double t = now_s();
    int rc = kvc_engine_step(c->e, t - c->t0, on_event, NULL, &idle);
    t = now_s() - t;
    if (rc) die("step", kvc_strerror(rc));
    const kvc_gen_done_t *done;
    uint32_t nd;
    kvc_engine_finished(c->e, &done, &nd);
    c->live -= nd;
    kvc_engine_stats(c->e, &b);
    *prefill = b.prefill_tokens - a.prefill_tokens;
    *decode = b.decode_tokens - a.decode_tokens;
    return t;
}

static void drain(ctx_t *c)
{
    for (int i = 0; i < 1000000; i++) {
        if (!c->live) return;
        uint64_t p, d;
        (void)step(c, &p, &d);
    }
    die("drain", "the engine does not finish");
}

/* A fresh prefix of n tokens (a whole number of blocks), computed and left in the cache. */
static void make_prefix(ctx_t *c, kvc_token_t *buf, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) buf[i] = rnd(c);
    if (n) {
        submit(c, buf, n, 1);
        drain(c);
    }
}

/* A decode step of T rows at context about K: one request with T parallel samples (its
 * prompt computed once, the samples forked copy-on-write, as the engine runs n), whose
 * prompt is the same for every T of this K (so that after the first cell it is a prefix
 * hit).  Returns the median, *k_out the mean context of the timed steps. */
static double cell_decode(ctx_t *c, uint32_t T, double K, int reps, double *k_out)
{
    const uint32_t P = (uint32_t)KVC_MAX(1.0, floor(K - 1 - (reps - 1) / 2.0 + 0.5));
    kvc_token_t *buf = malloc((size_t)P * sizeof *buf);
    if (!buf) die("decode", "out of memory");
    uint64_t saved = c->rng;
    c->rng = (uint64_t)K * 7919 + 1; /* the same prompt for every T of this K */
    for (uint32_t i = 0; i < P; i++) buf[i] = rnd(c);
    c->rng = saved;
    kvc_gen_params_t gp = kvc_gen_params_default();
    gp.max_tokens = (uint32_t)reps + 2;
    gp.ignore_eos = true;
    gp.temperature = 1;
    gp.n = T;
    kvc_gen_id_t id;
    char msg[256];
    if (kvc_engine_submit(c->e, buf, P, &gp, &id, msg, sizeof msg)) die("submit", msg);
    c->live += T;
    double v[256];
    int n = 0;
    for (int guard = 0; guard < 100000 && n < reps && c->live; guard++) {
        uint64_t p, d;
        double t = step(c, &p, &d);
        if (getenv("KVC_PROFILE_DEBUG"))
            fprintf(stderr, "  step: %llu prefill + %llu decode tokens, %.3f ms\n",
                    (unsigned long long)p, (unsigned long long)d, t * 1e3);
        if (p == 0 && d == T) v[n++] = t; /* decode j attends P + 1 + j keys */
    }
    drain(c);
    free(buf);
    if (n == 0) die("decode", "no step decoded the whole batch (raise --max-num-batched-tokens)");
    *k_out = P + 1 + (n - 1) / 2.0;
    return kvc_bench_median(v, n);
}

/* A prefill step of T tokens at mean context about K. */
static double cell_prefill(ctx_t *c, uint32_t T, double K, int reps, double *k_out)
{
    uint32_t m = (uint32_t)KVC_MIN((double)T, KVC_MAX(1.0, floor(2 * K)));
    while (T % m) m--; /* n requests of m tokens make T */
    const uint32_t n_req = T / m;
    double fd = K - (m + 1) / 2.0;
    uint32_t f = fd > 0 ? (uint32_t)(fd / c->bs + 0.5) * c->bs : 0;
    kvc_token_t *buf = malloc((size_t)(f + m) * sizeof *buf);
    if (!buf) die("prefill", "out of memory");
    make_prefix(c, buf, f);
    double v[256];
    int n = 0;
    for (int r = 0; r < reps; r++) {
        for (uint32_t q = 0; q < n_req; q++) {
            for (uint32_t i = 0; i < m; i++) buf[f + i] = rnd(c);
            submit(c, buf, f + m, 1);
        }
        uint64_t p, d;
        double t = step(c, &p, &d);
        if (p + d == T) v[n++] = t;
        drain(c);
    }
    free(buf);
    if (n == 0) die("prefill", "no step computed the whole cell (raise --max-num-batched-tokens)");
    *k_out = f + (m + 1) / 2.0;
    return kvc_bench_median(v, n);
}

int main(int argc, char **argv)
{
    const char *model = NULL, *out_path = NULL;
    kvc_engine_params_t ep = kvc_engine_params_default();
    ep.n_threads = 1;
    ep.max_ctx = 4096;
    ep.kv_memory = 64ull << 20;
    double tokens[MAXP] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    double context[MAXP] = {16, 64, 256, 1024};
    uint32_t nt = 10, nc = 4;
    int reps = 7;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) die(a, "needs a value");
        i++;
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "-o"))
            out_path = v;
        else if (!strcmp(a, "--threads"))
            ep.n_threads = (uint32_t)atoi(v);
        else if (!strcmp(a, "--block-size"))
            ep.block_size = (uint32_t)atoi(v);
        else if (!strcmp(a, "--max-num-seqs"))
            ep.max_num_seqs = (uint32_t)atoi(v);
        else if (!strcmp(a, "--max-num-batched-tokens"))
            ep.max_num_batched_tokens = (uint32_t)atoi(v);
        else if (!strcmp(a, "--kv-memory"))
            ep.kv_memory = (uint64_t)atoll(v) << 20;
        else if (!strcmp(a, "--ctx"))
            ep.max_ctx = (uint32_t)atoi(v);
        else if (!strcmp(a, "--tokens"))
            nt = parse_list(v, tokens);
        else if (!strcmp(a, "--context"))
            nc = parse_list(v, context);
        else if (!strcmp(a, "--reps"))
            reps = KVC_MAX(1, KVC_MIN(atoi(v), 255));
        else
            die(a, "unknown option");
    }
    if (!model) die("usage", "bench_profile --model FILE [options] (see the file's banner)");
    char msg[512];
    kvc_llm_t *m;
    if (kvc_llm_load(model, &m, msg, sizeof msg)) die(model, msg);
    ctx_t c = {.vocab = kvc_llm_hparams(m)->vocab, .rng = 12345, .t0 = now_s()};
    if (kvc_engine_create(m, &ep, &c.e, msg, sizeof msg)) die("engine", msg);
    kvc_engine_stats_t st;
    kvc_engine_stats(c.e, &st);
    c.bs = st.block_size;
    static double ms[MAXP][MAXP], kk[MAXP][MAXP];
    for (uint32_t i = 0; i < nt; i++)
        for (uint32_t k = 0; k < nc; k++) {
            uint32_t T = (uint32_t)tokens[i];
            const bool dec = T <= ep.max_num_seqs && T <= KVC_MAX_SAMPLES;
            /* decode steps are short and noisier: three times the samples */
            double t = dec ? cell_decode(&c, T, context[k], KVC_MIN(3 * reps, 255), &kk[i][k])
                           : cell_prefill(&c, T, context[k], reps, &kk[i][k]);
            ms[i][k] = t * 1e3;
            fprintf(stderr, "T %4u  K %7.1f  (actual %7.1f)  %8.3f ms  %s\n", T, context[k],
                    kk[i][k], ms[i][k], dec ? "decode" : "prefill");
        }
    FILE *f = out_path ? fopen(out_path, "w") : stdout;
    if (!f) die(out_path, "cannot write");
    fprintf(f,
            "{\"kvcache_profile\": 1,\n \"model\": \"%s\", \"threads\": %u, \"block_size\": %u,"
            " \"max_num_seqs\": %u, \"max_num_batched_tokens\": %u, \"reps\": %d,\n",
            model, ep.n_threads, c.bs, ep.max_num_seqs, ep.max_num_batched_tokens, reps);
    fprintf(f, " \"tokens\": [");
    for (uint32_t i = 0; i < nt; i++) fprintf(f, "%s%g", i ? ", " : "", tokens[i]);
    fprintf(f, "],\n \"context\": [");
    for (uint32_t k = 0; k < nc; k++) fprintf(f, "%s%g", k ? ", " : "", context[k]);
    fprintf(f, "],\n \"step_ms\": [");
    for (uint32_t i = 0; i < nt; i++) {
        fprintf(f, "%s[", i ? ",\n             " : "");
        for (uint32_t k = 0; k < nc; k++) fprintf(f, "%s%.4f", k ? ", " : "", ms[i][k]);
        fprintf(f, "]");
    }
    fprintf(f, "],\n \"actual_context\": [");
    for (uint32_t i = 0; i < nt; i++) {
        fprintf(f, "%s[", i ? ", " : "");
        for (uint32_t k = 0; k < nc; k++) fprintf(f, "%s%.1f", k ? ", " : "", kk[i][k]);
        fprintf(f, "]");
    }
    fprintf(f, "]}\n");
    if (f != stdout) fclose(f);
    kvc_engine_destroy(c.e);
    kvc_llm_free(m);
    return 0;
}
