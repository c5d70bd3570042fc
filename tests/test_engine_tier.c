/* test_engine_tier.c - the engine's KV tiers end to end, on stories260K (real weights).
 *
 * A multi-turn workload (conversations whose turns extend each other) on a pool a few blocks
 * over one context: with a host tier, and with a disk tier, later turns fetch what the pool
 * evicted instead of recomputing it, and every output id and logprob is identical to the run
 * with no tier (batch invariance makes the comparison exact).  A disk file reopened by a new
 * engine serves the first turns of a second run; flipped bytes in it, a file-size limit under
 * it (EFBIG), a Redis killed or stopped mid-run: each is a counted fault and a recompute, the
 * outputs unchanged.  A randomized run checks the prefix cache (fences included) and the
 * scheduler after every step against a reference with no tier.  `test_engine_tier --redis`
 * (ctest's engine_tier.redis) runs the Redis tests against a redis-server it starts, and exits
 * 77 (skipped) when none is installed. */
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine_harness.h"
#include "test_redis.h"

#define STORIES KVC_DATA_DIR "/models/stories260K.gguf"

static kvc_llm_t *model;

/* ---- the workload --------------------------------------------------------------------------- */
#define N_CONV  4
#define N_TURN  4
#define N_FIRST 40 /* the first turn's prompt */
#define N_USER  20 /* tokens each later turn adds after the previous output */
#define N_OUT   12 /* output tokens per turn */
#define CTX     256

typedef struct {
    kvc_token_t out[N_CONV][N_TURN][N_OUT];
    float lp[N_CONV][N_TURN][N_OUT];
    uint32_t cached[N_CONV][N_TURN], tier_tok[N_CONV][N_TURN][KVC_ENGINE_MAX_TIERS];
    kvc_engine_stats_t st;
    kvc_engine_tier_stats_t ts[KVC_ENGINE_MAX_TIERS];
    uint32_t n_tiers;
    uint64_t tier_tokens; /* sum of tier_cached_tokens over every request and tier */
} wl_t;

/* The namespace every request of the workload runs in (NULL: the default). */
static const kvc_namespace_t *wl_ns;

/* Called before each turn (the fault tests break a tier there). */
typedef void (*turn_fn)(uint32_t turn);

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static size_t block_bytes(void)
{
    const kvc_model_hparams_t *h = kvc_llm_hparams(model);
    return (size_t)h->n_layers * 2 * h->n_kv_heads * h->head_dim * 2 * 16; /* f16, 16 tokens */
}

/* A pool of n_blocks, 16-token blocks, one thread (the outputs do not depend on it). */
static kvc_engine_params_t params(uint32_t n_blocks)
{
    kvc_engine_params_t ep = kvc_engine_params_default();
    ep.n_threads = 1;
    ep.max_ctx = CTX;
    ep.max_num_seqs = 4;
    ep.kv_memory = (uint64_t)n_blocks * block_bytes();
    return ep;
}

static void check_engine(kvc_engine_t *e, const char *when)
{
    char msg[256];
    if (kvc_sched_check(kvc_engine_sched(e), msg, sizeof msg)) fail_msg("%s: %s", when, msg);
    kvc_prefix_t *pc = kvc_engine_prefix(e);
    if (kvc_prefix_check(pc, msg, sizeof msg)) fail_msg("%s: %s", when, msg);
    kvc_prefix_stats_t ps;
    kvc_prefix_stats(pc, &ps);
    /* fetches resolve within the step: no fenced block is left behind */
    if (ps.n_pending) fail_msg("%s: %u blocks still pending", when, ps.n_pending);
}

/* Run the conversations on one engine: turn by turn, each turn's prompt the previous turn's
 * prompt, its output and N_USER new tokens.  together: a turn's requests are submitted at once;
 * else one after another, each run to its end. */
static void workload(const kvc_engine_params_t *ep, bool together, turn_fn on_turn, wl_t *w)
{
    char msg[256];
    kvc_engine_t *e;
    memset(w, 0, sizeof *w);
    if (kvc_engine_create(model, ep, &e, msg, sizeof msg)) fail_msg("engine: %s", msg);
    static kvc_token_t conv[N_CONV][CTX];
    uint32_t n[N_CONV];
    const uint32_t vocab = kvc_llm_hparams(model)->vocab;
    uint64_t seed = 12345;
    for (uint32_t c = 0; c < N_CONV; c++) {
        conv[c][0] = 1;
        for (n[c] = 1; n[c] < N_FIRST; n[c]++)
            conv[c][n[c]] = 3 + (kvc_token_t)(lcg(&seed) % (vocab - 3));
    }
    kvc_gen_params_t gp = kvc_gen_params_default();
    gp.max_tokens = N_OUT;
    gp.ignore_eos = true;
    gp.logprobs = true;
    if (wl_ns) gp.ns = *wl_ns;
    int step = 0;
    for (uint32_t t = 0; t < N_TURN; t++) {
        if (on_turn) on_turn(t);
        if (t)
            for (uint32_t c = 0; c < N_CONV; c++)
                for (uint32_t k = 0; k < N_USER; k++)
                    conv[c][n[c]++] = 3 + (kvc_token_t)(lcg(&seed) % (vocab - 3));
        for (uint32_t c0 = 0; c0 < N_CONV;) {
            const uint32_t c1 = together ? N_CONV : c0 + 1;
            for (uint32_t c = c0; c < c1; c++) {
                kvc_gen_params_t g = gp;
                g.tag = c;
                kvc_gen_id_t id;
                if (kvc_engine_submit(e, conv[c], n[c], &g, &id, msg, sizeof msg))
                    fail_msg("submit: %s", msg);
            }
            for (uint32_t left = c1 - c0; left; step++) {
                assert_true(step < 100000);
                bool idle;
                assert_ok(kvc_engine_step(e, step * 1e-3, NULL, NULL, &idle));
                check_engine(e, "workload");
                const kvc_gen_done_t *d;
                uint32_t nd;
                kvc_engine_finished(e, &d, &nd);
                for (uint32_t i = 0; i < nd; i++) {
                    const uint32_t c = (uint32_t)d[i].tag;
                    assert_int_equal(d[i].finish, KVC_FINISH_LENGTH);
                    assert_int_equal(d[i].completion_tokens, N_OUT);
                    memcpy(w->out[c][t], d[i].output, N_OUT * sizeof(kvc_token_t));
                    memcpy(w->lp[c][t], d[i].logprobs, N_OUT * sizeof(float));
                    w->cached[c][t] = d[i].cached_tokens;
                    uint32_t sum = 0;
                    for (uint32_t k = 0; k < KVC_ENGINE_MAX_TIERS; k++) {
                        w->tier_tok[c][t][k] = d[i].tier_cached_tokens[k];
                        sum += d[i].tier_cached_tokens[k];
                    }
                    assert_true(sum <= d[i].cached_tokens);
                    w->tier_tokens += sum;
                    left--;
                }
                assert_true(!idle || nd || left == 0);
            }
            c0 = c1;
        }
        for (uint32_t c = 0; c < N_CONV; c++) {
            memcpy(conv[c] + n[c], w->out[c][t], N_OUT * sizeof(kvc_token_t));
            n[c] += N_OUT;
        }
    }
    kvc_engine_stats(e, &w->st);
    w->n_tiers = kvc_engine_n_tiers(e);
    for (uint32_t i = 0; i < w->n_tiers; i++) assert_ok(kvc_engine_tier_stats(e, i, &w->ts[i]));
    kvc_engine_tier_stats_t x;
    assert_int_equal(kvc_engine_tier_stats(e, w->n_tiers, &x), KVC_EINVAL);
    kvc_engine_destroy(e);
}

/* Bit for bit: every output id and its logprob. */
static void assert_same_outputs(const wl_t *a, const wl_t *b, const char *what)
{
    for (uint32_t c = 0; c < N_CONV; c++)
        for (uint32_t t = 0; t < N_TURN; t++)
            for (uint32_t i = 0; i < N_OUT; i++) {
                if (a->out[c][t][i] != b->out[c][t][i])
                    fail_msg("%s: conversation %u turn %u token %u: %d vs %d", what, c, t, i,
                             a->out[c][t][i], b->out[c][t][i]);
                if (memcmp(&a->lp[c][t][i], &b->lp[c][t][i], sizeof(float)))
                    fail_msg("%s: conversation %u turn %u logprob %u differs", what, c, t, i);
            }
}

static void print_tiers(const char *what, const wl_t *w, const wl_t *ref)
{
    print_message("%s: prefill %llu tokens (no tier: %llu), %llu cached tokens from tiers\n", what,
                  (unsigned long long)w->st.prefill_tokens,
                  (unsigned long long)ref->st.prefill_tokens, (unsigned long long)w->tier_tokens);
    for (uint32_t i = 0; i < w->n_tiers; i++) {
        const kvc_engine_tier_stats_t *s = &w->ts[i];
        const uint64_t gets = s->store.n_hits + s->store.n_misses;
        print_message(
            "  tier %u %s: %llu fetched, %llu recompute, %llu failed, %llu offloaded, "
            "%llu written through, %llu faults, %llu corrupt, %.1f us per get, "
            "estimate %.1f us + %.2f GB/s\n",
            i, kvc_tier_kind_name(s->kind), (unsigned long long)s->fetched_blocks,
            (unsigned long long)s->recompute_blocks, (unsigned long long)s->fetch_failed_blocks,
            (unsigned long long)s->offloaded_blocks, (unsigned long long)s->written_through_blocks,
            (unsigned long long)s->store.n_faults, (unsigned long long)s->store.n_corrupt,
            gets ? (double)s->store.latency_sum_ns / (double)gets * 1e-3 : 0.0, s->latency_s * 1e6,
            s->bandwidth_Bps * 1e-9);
    }
}

static wl_t ref_seq, ref_tog;
#define POOL 24 /* blocks: a context is at most 10 of them, the four conversations 40 */

static int group_setup(void **state)
{
    (void)state;
    model = load(STORIES);
    kvc_engine_params_t ep = params(POOL);
    workload(&ep, false, NULL, &ref_seq);
    workload(&ep, true, NULL, &ref_tog);
    /* the workload is what it says: the pool is too small, so the reference recomputes */
    assert_true(ref_seq.st.prefill_tokens >
                N_CONV * (N_FIRST + (N_TURN - 1) * (N_OUT + N_USER)) / 2);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    kvc_llm_free(model);
    return 0;
}

static void scratch_path(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "engine-tier-scratch-%d-%s.bin", (int)getpid(), name);
    unlink(buf);
}

static kvc_tier_spec_t spec(const char *s)
{
    kvc_tier_spec_t t;
    char msg[256];
    if (kvc_tier_spec_parse(s, &t, msg, sizeof msg)) fail_msg("%s: %s", s, msg);
    return t;
}

/* ---- host and disk ------------------------------------------------------------------------- */
/* params(POOL) with one 8 MiB disk tier in a fresh scratch file named after `name` (its path
 * into path), fetching every run it finds. */
static kvc_engine_params_t disk_tier_params(const char *name, char *path, size_t cap,
                                            kvc_tier_spec_t *t)
{
    char s[300];
    scratch_path(path, cap, name);
    snprintf(s, sizeof s, "disk:%s:8MiB", path);
    *t = spec(s);
    kvc_engine_params_t ep = params(POOL);
    ep.tiers = t;
    ep.n_tiers = 1;
    ep.tier_fetch = KVC_TIER_FETCH_ALWAYS;
    return ep;
}

static void expect_fetches(const wl_t *w, const wl_t *ref, uint32_t tier, bool sequential)
{
    assert_true(w->ts[tier].fetched_blocks > 0);
    assert_true(w->st.prefill_tokens < ref->st.prefill_tokens);
    assert_true(w->tier_tokens > 0);
    if (sequential) /* every fetched block was hit by its request at once */
        assert_int_equal(w->tier_tokens, w->ts[tier].fetched_blocks * 16);
}

static void host_tier_turns_fetch_and_outputs_match(void **state)
{
    (void)state;
    kvc_tier_spec_t t = spec("host:64MiB");
    kvc_engine_params_t ep = params(POOL);
    ep.tiers = &t;
    ep.n_tiers = 1;
    wl_t w;
    workload(&ep, false, NULL, &w); /* the measured decision (fetch wins by far for host) */
    assert_same_outputs(&w, &ref_seq, "host, one at a time");
    print_tiers("host, one at a time", &w, &ref_seq);
    expect_fetches(&w, &ref_seq, 0, true);
    assert_true(w.ts[0].offloaded_blocks > 0);
    assert_int_equal(w.ts[0].fetch_failed_blocks, 0);
    workload(&ep, true, NULL, &w);
    assert_same_outputs(&w, &ref_tog, "host, together");
    print_tiers("host, together", &w, &ref_tog);
    expect_fetches(&w, &ref_tog, 0, false);
    /* never: every run found is counted and recomputed; the outputs still match */
    ep.tier_fetch = KVC_TIER_FETCH_NEVER;
    workload(&ep, false, NULL, &w);
    assert_same_outputs(&w, &ref_seq, "host, never fetch");
    assert_int_equal(w.ts[0].fetched_blocks, 0);
    assert_true(w.ts[0].recompute_blocks > 0);
    assert_int_equal(w.tier_tokens, 0);
}

static void disk_tier_turns_fetch_and_a_reopened_file_serves_a_new_engine(void **state)
{
    (void)state;
    char path[256];
    kvc_tier_spec_t t;
    kvc_engine_params_t ep = disk_tier_params("disk", path, sizeof path, &t);
    wl_t w;
    workload(&ep, false, NULL, &w);
    assert_same_outputs(&w, &ref_seq, "disk");
    print_tiers("disk", &w, &ref_seq);
    expect_fetches(&w, &ref_seq, 0, true);
    /* the first turns found nothing: the file was empty */
    for (uint32_t c = 0; c < N_CONV; c++) assert_int_equal(w.tier_tok[c][0][0], 0);
    /* a new engine on the same file: the same hashes (the seed comes from the model), so even
     * the first turns fetch */
    wl_t w2;
    workload(&ep, false, NULL, &w2);
    assert_same_outputs(&w2, &ref_seq, "disk reopened");
    print_tiers("disk reopened", &w2, &ref_seq);
    uint32_t first = 0;
    for (uint32_t c = 0; c < N_CONV; c++) first += w2.tier_tok[c][0][0];
    assert_true(first > 0);
    assert_true(w2.st.prefill_tokens < w.st.prefill_tokens);
    unlink(path);
}

/* A tenant's salt is part of a block's identity in the tiers too: its blocks are stored and
 * fetched under its namespace (a root block's namespace is found from the request that
 * computed it), and a file written under one salt serves nothing to another (or to none). */
static void namespaces_are_kept_apart_in_the_tiers(void **state)
{
    (void)state;
    char path[256];
    kvc_tier_spec_t t;
    kvc_engine_params_t ep = disk_tier_params("ns", path, sizeof path, &t);
    kvc_namespace_t a = {0}, b = {0};
    assert_ok(kvc_namespace_set_salt(&a, "tenant-a"));
    assert_ok(kvc_namespace_set_salt(&b, "tenant-b"));
    wl_t w;
    wl_ns = &a;
    workload(&ep, false, NULL, &w);
    assert_same_outputs(&w, &ref_seq, "salted");
    expect_fetches(&w, &ref_seq, 0, true);
    /* another tenant, the same prompts: nothing from the first turns on */
    wl_ns = &b;
    workload(&ep, false, NULL, &w);
    assert_same_outputs(&w, &ref_seq, "another salt");
    for (uint32_t c = 0; c < N_CONV; c++) assert_int_equal(w.tier_tok[c][0][0], 0);
    /* and the shared namespace neither */
    wl_ns = NULL;
    workload(&ep, false, NULL, &w);
    for (uint32_t c = 0; c < N_CONV; c++) assert_int_equal(w.tier_tok[c][0][0], 0);
    /* the first tenant again: its blocks are there */
    wl_ns = &a;
    workload(&ep, false, NULL, &w);
    wl_ns = NULL;
    assert_same_outputs(&w, &ref_seq, "salted again");
    uint32_t first = 0;
    for (uint32_t c = 0; c < N_CONV; c++) first += w.tier_tok[c][0][0];
    assert_true(first > 0);
    unlink(path);
}

/* Flip one byte in the payload of every slot of a disk tier's file. */
static void flip_payloads(const char *path)
{
    const size_t rec = kvc_tier_record_bytes(block_bytes(), 16);
    const size_t slot = (rec + 63) / 64 * 64;
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    for (off_t off = 4096; off + (off_t)slot <= sb.st_size; off += (off_t)slot) {
        unsigned char b;
        const off_t at = off + (off_t)rec - 100; /* inside the payload */
        assert_int_equal(pread(fd, &b, 1, at), 1);
        b ^= 0x5a;
        assert_int_equal(pwrite(fd, &b, 1, at), 1);
    }
    close(fd);
}

static void disk_flipped_bytes_are_counted_and_recomputed(void **state)
{
    (void)state;
    char path[256];
    kvc_tier_spec_t t;
    kvc_engine_params_t ep = disk_tier_params("flip", path, sizeof path, &t);
    wl_t w;
    workload(&ep, false, NULL, &w);
    assert_same_outputs(&w, &ref_seq, "disk before the flips");
    flip_payloads(path);
    workload(&ep, false, NULL, &w);
    assert_same_outputs(&w, &ref_seq, "disk with flipped bytes");
    print_tiers("disk with flipped bytes", &w, &ref_seq);
    assert_true(w.ts[0].store.n_corrupt > 0);
    assert_true(w.ts[0].fetch_failed_blocks > 0);
    /* the first turns' blocks were all in the flipped file: none was fetched */
    for (uint32_t c = 0; c < N_CONV; c++) assert_int_equal(w.tier_tok[c][0][0], 0);
    unlink(path);
}

/* A file-size limit under the disk tier (in a child: RLIMIT_FSIZE, SIGXFSZ ignored): writes
 * past it fail with EFBIG, each a counted fault; the outputs are unchanged. */
static void disk_file_size_limit_faults_are_counted(void **state)
{
    (void)state;
    char path[256];
    kvc_tier_spec_t t;
    kvc_engine_params_t ep = disk_tier_params("fsize", path, sizeof path, &t);
    { /* create (and preallocate) the file */
        char msg[256];
        kvc_engine_t *e;
        if (kvc_engine_create(model, &ep, &e, msg, sizeof msg)) fail_msg("%s", msg);
        kvc_engine_destroy(e);
    }
    const size_t slot = (kvc_tier_record_bytes(block_bytes(), 16) + 63) / 64 * 64;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {4096 + 3 * slot, 4096 + 3 * slot};
        if (setrlimit(RLIMIT_FSIZE, &rl)) _exit(10);
        wl_t w;
        workload(&ep, false, NULL, &w);
        for (uint32_t c = 0; c < N_CONV; c++)
            if (memcmp(w.out[c], ref_seq.out[c], sizeof w.out[c])) _exit(11);
        if (w.ts[0].store.n_faults == 0) _exit(12);
        if (w.ts[0].store.n_puts == 0) _exit(13); /* the first slots are below the limit */
        print_tiers("disk under a file-size limit", &w, &ref_seq);
        _exit(0);
    }
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
    unlink(path);
}

/* A host tier too small for the workload and a disk behind it: the host evicts, the disk
 * (inclusive) still has the blocks, and the lookup continues there. */
static void host_then_disk_inclusive(void **state)
{
    (void)state;
    char path[256], s[300];
    scratch_path(path, sizeof path, "incl");
    snprintf(s, sizeof s, "disk:%s:8MiB", path);
    const size_t rec = kvc_tier_record_bytes(block_bytes(), 16);
    char h[64];
    snprintf(h, sizeof h, "host:%zu", rec * 6);
    kvc_tier_spec_t t[2] = {spec(h), spec(s)};
    kvc_engine_params_t ep = params(POOL);
    ep.tiers = t;
    ep.n_tiers = 2;
    ep.tier_fetch = KVC_TIER_FETCH_ALWAYS;
    wl_t w;
    workload(&ep, false, NULL, &w);
    assert_same_outputs(&w, &ref_seq, "host then disk");
    print_tiers("host (6 blocks) then disk", &w, &ref_seq);
    assert_true(w.ts[0].store.n_evictions > 0);
    assert_true(w.ts[1].fetched_blocks > 0);
    assert_true(w.ts[0].offloaded_blocks > 0 && w.ts[1].offloaded_blocks > 0);
    uint64_t tiers = 0;
    for (uint32_t c = 0; c < N_CONV; c++)
        for (uint32_t x = 0; x < N_TURN; x++) tiers += w.tier_tok[c][x][0] + w.tier_tok[c][x][1];
    assert_int_equal(tiers, (w.ts[0].fetched_blocks + w.ts[1].fetched_blocks) * 16);
    unlink(path);
}

/* ---- randomized ------------------------------------------------------------------------------ */
/* Random requests (prompts from a few shared stems plus random tails, random lengths), in random
 * batches on small pools with random small tiers; the prefix cache and the scheduler are checked
 * after every step, and every output must equal the request's output on an engine with no tier
 * (a request's output depends on its prompt alone). */
static void randomized_against_no_tier(void **state)
{
    (void)state;
    const uint32_t vocab = kvc_llm_hparams(model)->vocab;
    const size_t rec = kvc_tier_record_bytes(block_bytes(), 16);
    uint64_t seed = 99;
    enum { N_REQ = 40, STEMS = 5, STEM = 160 };
    static kvc_token_t stems[STEMS][STEM];
    for (uint32_t s = 0; s < STEMS; s++) {
        stems[s][0] = 1;
        for (uint32_t i = 1; i < STEM; i++)
            stems[s][i] = 3 + (kvc_token_t)(lcg(&seed) % (vocab - 3));
    }
    uint64_t fetched = 0;
    for (int round = 0; round < 4; round++) {
        static kvc_token_t prompts[N_REQ][STEM + 24];
        prompt_t pr[N_REQ];
        for (uint32_t r = 0; r < N_REQ; r++) {
            const uint32_t s = (uint32_t)(lcg(&seed) % STEMS);
            const uint32_t keep = 32 + (uint32_t)(lcg(&seed) % (STEM - 31));
            const uint32_t tail = (uint32_t)(lcg(&seed) % 24);
            memcpy(prompts[r], stems[s], keep * sizeof(kvc_token_t));
            for (uint32_t i = 0; i < tail; i++)
                prompts[r][keep + i] = 3 + (kvc_token_t)(lcg(&seed) % (vocab - 3));
            pr[r] = (prompt_t){prompts[r], keep + tail};
        }
        kvc_gen_params_t gp = kvc_gen_params_default();
        gp.max_tokens = 4 + (uint32_t)(lcg(&seed) % 8);
        gp.ignore_eos = true;
        static out_t ref[N_REQ], got[N_REQ];
        kvc_engine_params_t rp = params(64);
        run_all(model, &rp, pr, N_REQ, &gp, ref, NULL);

        char path[256], ds[300], hs[64];
        scratch_path(path, sizeof path, "rand");
        snprintf(ds, sizeof ds, "disk:%s:%zu", path, rec * (4 + lcg(&seed) % 60));
        snprintf(hs, sizeof hs, "host:%zu", rec * (1 + lcg(&seed) % 40));
        kvc_tier_spec_t t[2] = {spec(hs), spec(ds)};
        kvc_engine_params_t ep = params(14 + (uint32_t)(lcg(&seed) % 16));
        ep.tiers = lcg(&seed) % 2 ? t : t + 1;
        ep.n_tiers = ep.tiers == t ? 2 : 1;
        ep.tier_fetch = (kvc_tier_fetch_t)(lcg(&seed) % 2); /* decide or always */
        ep.max_num_seqs = 1 + (uint32_t)(lcg(&seed) % 4);
        char msg[256];
        kvc_engine_t *e;
        if (kvc_engine_create(model, &ep, &e, msg, sizeof msg)) fail_msg("engine: %s", msg);
        uint32_t next = 0, left = N_REQ;
        for (int step = 0; left; step++) {
            assert_true(step < 100000);
            /* a random batch arrives now and then */
            if (next < N_REQ && lcg(&seed) % 6 == 0)
                for (uint32_t k = 1 + (uint32_t)(lcg(&seed) % 3); k-- && next < N_REQ; next++) {
                    kvc_gen_params_t g = gp;
                    g.tag = next;
                    kvc_gen_id_t id;
                    if (kvc_engine_submit(e, pr[next].ids, pr[next].n, &g, &id, msg, sizeof msg))
                        fail_msg("submit: %s", msg);
                }
            bool idle;
            assert_ok(kvc_engine_step(e, step * 1e-3, NULL, NULL, &idle));
            check_engine(e, "randomized");
            const kvc_gen_done_t *d;
            uint32_t nd;
            kvc_engine_finished(e, &d, &nd);
            for (uint32_t i = 0; i < nd; i++, left--) copy_done(&got[d[i].tag], &d[i]);
        }
        uint64_t round_fetched = 0;
        for (uint32_t i = 0; i < kvc_engine_n_tiers(e); i++) {
            kvc_engine_tier_stats_t ts;
            assert_ok(kvc_engine_tier_stats(e, i, &ts));
            round_fetched += ts.fetched_blocks;
        }
        fetched += round_fetched;
        kvc_engine_destroy(e);
        for (uint32_t r = 0; r < N_REQ; r++) {
            char what[64];
            snprintf(what, sizeof what, "round %d request %u", round, r);
            assert_same(&got[r], &ref[r], what);
        }
        print_message("round %d: %s, %llu blocks fetched\n", round,
                      ep.n_tiers == 2 ? "host + disk" : "disk", (unsigned long long)round_fetched);
        unlink(path);
    }
    assert_true(fetched > 0); /* the rounds did exercise the fetch path */
}

/* ---- parameters ------------------------------------------------------------------------------ */
static void bad_tier_parameters_are_refused(void **state)
{
    (void)state;
    char msg[256];
    kvc_engine_t *e = NULL;
    kvc_tier_spec_t t[5];
    for (int i = 0; i < 5; i++) t[i] = spec("host:1MiB");
    kvc_engine_params_t ep = params(POOL);
    ep.tiers = t;
    ep.n_tiers = 5;
    assert_int_equal(kvc_engine_create(model, &ep, &e, msg, sizeof msg), KVC_EINVAL);
    assert_null(e);
    ep.n_tiers = 1;
    t[0] = spec("host:1KiB"); /* below one record */
    assert_int_equal(kvc_engine_create(model, &ep, &e, msg, sizeof msg), KVC_EINVAL);
    assert_non_null(strstr(msg, "hold no block"));
    t[0] = spec("host:1MiB");
    ep.no_prefix_cache = true;
    assert_int_equal(kvc_engine_create(model, &ep, &e, msg, sizeof msg), KVC_EINVAL);
    ep.no_prefix_cache = false;
    ep.tier_fetch = (kvc_tier_fetch_t)7;
    assert_int_equal(kvc_engine_create(model, &ep, &e, msg, sizeof msg), KVC_EINVAL);
    ep.tier_fetch = KVC_TIER_FETCH_DECIDE;
    ep.tier_model_id = "";
    assert_int_equal(kvc_engine_create(model, &ep, &e, msg, sizeof msg), KVC_EINVAL);
    ep.tier_model_id = NULL;
    /* a disk file made with other sizes is refused, never overwritten */
    char path[256], s[300];
    scratch_path(path, sizeof path, "other");
    snprintf(s, sizeof s, "disk:%s:1MiB", path);
    t[0] = spec(s);
    assert_ok(kvc_engine_create(model, &ep, &e, msg, sizeof msg));
    assert_int_equal(strlen(kvc_engine_tier_model_id(e)), 32);
    kvc_engine_destroy(e);
    snprintf(s, sizeof s, "disk:%s:2MiB", path);
    t[0] = spec(s);
    assert_int_equal(kvc_engine_create(model, &ep, &e, msg, sizeof msg), KVC_EEXIST);
    unlink(path);
    assert_int_equal(kvc_engine_n_tiers(NULL), 0);
    kvc_engine_tier_stats_t ts;
    assert_int_equal(kvc_engine_tier_stats(NULL, 0, &ts), KVC_EINVAL);
    /* no tiers: none to report */
    ep.n_tiers = 0;
    assert_ok(kvc_engine_create(model, &ep, &e, msg, sizeof msg));
    assert_int_equal(kvc_engine_n_tiers(e), 0);
    assert_int_equal(kvc_engine_tier_stats(e, 0, &ts), KVC_EINVAL);
    assert_int_equal(kvc_engine_tier_stats(e, 0, NULL), KVC_EINVAL);
    assert_string_equal(kvc_engine_tier_model_id(e), "");
    kvc_engine_destroy(e);
}

/* gemma2's sliding layers make a second KV group: tiers are refused there, in one line. */
static void models_with_sliding_layers_refuse_tiers(void **state)
{
    (void)state;
    char msg[256], path[256];
    kvc_gguf_t *vocab = NULL;
    assert_ok(kvc_gguf_open(KVC_DATA_DIR "/models/vocab/ggml-vocab-llama-spm.gguf", NULL, &vocab,
                            msg, sizeof msg));
    kvc_model_synth_t p = kvc_model_synth_default();
    p.arch = KVC_ARCH_GEMMA2;
    p.dim = 64, p.n_layers = 2, p.n_heads = 2, p.n_kv_heads = 1, p.ff = 128, p.ctx = 256;
    p.type = KVC_GGML_F32;
    p.sliding_window = 16;
    scratch_path(path, sizeof path, "gemma2");
    if (kvc_model_synth(&p, vocab, path, msg, sizeof msg)) fail_msg("synth: %s", msg);
    kvc_gguf_close(vocab);
    kvc_llm_t *g = load(path);
    kvc_tier_spec_t t = spec("host:1MiB");
    kvc_engine_params_t ep = kvc_engine_params_default();
    ep.n_threads = 1;
    ep.tiers = &t;
    ep.n_tiers = 1;
    kvc_engine_t *e = NULL;
    assert_int_equal(kvc_engine_create(g, &ep, &e, msg, sizeof msg), KVC_ENOTSUP);
    assert_null(e);
    assert_non_null(strstr(msg, "sliding-window"));
    assert_null(strchr(msg, '\n'));
    ep.n_tiers = 0; /* without tiers it runs */
    assert_ok(kvc_engine_create(g, &ep, &e, msg, sizeof msg));
    kvc_engine_destroy(e);
    kvc_llm_free(g);
    unlink(path);
}

/* ---- redis ----------------------------------------------------------------------------------- */
static bool have_redis;

static void redis_flush(void)
{
    redisContext *c = redis_admin();
    assert_non_null(c);
    redisReply *r = redisCommand(c, "FLUSHALL");
    assert_non_null(r);
    freeReplyObject(r);
    redisFree(c);
}

static int redis_group_setup(void **state)
{
    group_setup(state);
    signal(SIGPIPE, SIG_DFL); /* the store must survive a dead server without help */
    redis_port = free_port();
    have_redis = redis_port > 0 && redis_start();
    return have_redis ? 0 : -1; /* present but not starting: a failure, never a pass */
}

static int redis_group_teardown(void **state)
{
    redis_stop();
    return group_teardown(state);
}

static kvc_tier_spec_t redis_spec(void)
{
    char s[128];
    snprintf(s, sizeof s, "redis://127.0.0.1:%d/et", redis_port);
    return spec(s);
}

/* Two engines, one Redis (two replicas): what the first computed, written through as it was
 * cached, the second fetches, first turns included; outputs identical. */
static void redis_write_through_serves_a_second_engine(void **state)
{
    (void)state;
    if (redis_pid <= 0) assert_true(redis_start());
    redis_flush();
    kvc_tier_spec_t t = redis_spec();
    kvc_engine_params_t ep = params(POOL);
    ep.tiers = &t;
    ep.n_tiers = 1;
    ep.tier_fetch = KVC_TIER_FETCH_ALWAYS;
    ep.tier_timeout_ms = 1000;
    wl_t a, b;
    workload(&ep, false, NULL, &a);
    assert_same_outputs(&a, &ref_seq, "redis, first replica");
    print_tiers("redis, first replica", &a, &ref_seq);
    assert_true(a.ts[0].written_through_blocks > 0);
    assert_int_equal(a.ts[0].mode, KVC_TIER_MODE_WRITE_THROUGH);
    workload(&ep, false, NULL, &b);
    assert_same_outputs(&b, &ref_seq, "redis, second replica");
    print_tiers("redis, second replica", &b, &ref_seq);
    uint32_t first = 0;
    for (uint32_t c = 0; c < N_CONV; c++) first += b.tier_tok[c][0][0];
    assert_true(first > 0);
    assert_true(b.st.prefill_tokens < a.st.prefill_tokens);
    assert_int_equal(b.ts[0].store.n_faults, 0);
}

static void kill_redis_at_turn_3(uint32_t turn)
{
    if (turn == 3) redis_stop();
}

static void redis_killed_mid_run_is_recomputed(void **state)
{
    (void)state;
    if (redis_pid <= 0) assert_true(redis_start());
    redis_flush();
    kvc_tier_spec_t t = redis_spec();
    kvc_engine_params_t ep = params(POOL);
    ep.tiers = &t;
    ep.n_tiers = 1;
    ep.tier_fetch = KVC_TIER_FETCH_ALWAYS;
    wl_t w;
    workload(&ep, false, kill_redis_at_turn_3, &w);
    assert_same_outputs(&w, &ref_seq, "redis killed at turn 3");
    print_tiers("redis killed at turn 3", &w, &ref_seq);
    assert_true(w.ts[0].store.n_faults > 0);
    assert_true(w.ts[0].fetched_blocks > 0); /* turn 2 fetched (the pool held turns 0, 1) */
    assert_true(redis_start());
}

static void stop_redis_at_turn_3(uint32_t turn)
{
    if (turn == 3) kill(redis_pid, SIGSTOP);
}

static void redis_stopped_fetches_time_out_and_are_recomputed(void **state)
{
    (void)state;
    if (redis_pid <= 0) assert_true(redis_start());
    redis_flush();
    kvc_tier_spec_t t = redis_spec();
    kvc_engine_params_t ep = params(POOL);
    ep.tiers = &t;
    ep.n_tiers = 1;
    ep.tier_fetch = KVC_TIER_FETCH_ALWAYS;
    ep.tier_timeout_ms = 50;
    const uint64_t t0 = kvc_now_ns();
    wl_t w;
    workload(&ep, false, stop_redis_at_turn_3, &w);
    const double secs = (double)(kvc_now_ns() - t0) * 1e-9;
    kill(redis_pid, SIGCONT);
    assert_same_outputs(&w, &ref_seq, "redis stopped at turn 3");
    print_tiers("redis stopped at turn 3", &w, &ref_seq);
    print_message("  %.2f s with a stopped server (50 ms deadline)\n", secs);
    assert_true(w.ts[0].store.n_faults > 0);
    assert_true(w.ts[0].fetched_blocks > 0); /* turn 2, before the stop */
    assert_true(secs < 30); /* each call waits one deadline at most, then backs off */
}

int main(int argc, char **argv)
{
    const struct CMUnitTest local[] = {
        cmocka_unit_test(host_tier_turns_fetch_and_outputs_match),
        cmocka_unit_test(disk_tier_turns_fetch_and_a_reopened_file_serves_a_new_engine),
        cmocka_unit_test(disk_flipped_bytes_are_counted_and_recomputed),
        cmocka_unit_test(disk_file_size_limit_faults_are_counted),
        cmocka_unit_test(host_then_disk_inclusive),
        cmocka_unit_test(namespaces_are_kept_apart_in_the_tiers),
        cmocka_unit_test(randomized_against_no_tier),
        cmocka_unit_test(bad_tier_parameters_are_refused),
        cmocka_unit_test(models_with_sliding_layers_refuse_tiers),
    };
    const struct CMUnitTest remote[] = {
        cmocka_unit_test(redis_write_through_serves_a_second_engine),
        cmocka_unit_test(redis_killed_mid_run_is_recomputed),
        cmocka_unit_test(redis_stopped_fetches_time_out_and_are_recomputed),
    };
    if (argc > 1 && !strcmp(argv[1], "--redis")) {
        if (!redis_binary_present()) {
            printf("redis-server is not installed: the engine's redis tests are skipped "
                   "(apt-get install redis-server)\n");
            return 77;
        }
        return cmocka_run_group_tests_name("engine_tier.redis", remote, redis_group_setup,
                                           redis_group_teardown);
    }
    return cmocka_run_group_tests_name("engine_tier", local, group_setup, group_teardown);
}
