/* bench_seq.c - the seq layer's per-request operations.
 *
 *   fork + CoW      fork a sequence whose last block is partial, write one token into the
 *                   child (copy-on-write of one block), destroy the child     (per second)
 *   beam step       one kvc_seq_beam_step over a 1,000-token prompt with 4 and with 16 beams:
 *                   half the beams die, the rest fork; each beam appends a token  (us/step)
 *   draft + rollback  append 4 drafts, reserve their slots, complete, accept 0 (roll back
 *                   all), append the bonus token: a speculative decoder's worst case (per second)
 *
 * Metadata-only pool (the block bytes are the engine's), block size 16, prefix caching on.
 * Medians of repeated runs.  usage: bench_seq [--quick]
 */
#include "bench_util.h"
#include "kvcache/kvcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(expr)                                                           \
    do {                                                                      \
        int rc_ = (expr);                                                     \
        if (rc_) {                                                            \
            fprintf(stderr, "bench_seq: %s: %s\n", #expr, kvc_strerror(rc_)); \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

typedef struct {
    kvc_pool_t *pool;
    kvc_prefix_t *pc;
    kvc_seqs_t *seqs;
} env_t;

static env_t make_env(uint32_t n_blocks)
{
    env_t e;
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = n_blocks;
    pp.block_size = 16;
    CHECK(kvc_pool_create(&pp, &e.pool));
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    CHECK(kvc_prefix_create(e.pool, &cp, &e.pc));
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    sp.max_seqs = 64;
    CHECK(kvc_seqs_create(e.pool, e.pc, &sp, &e.seqs));
    return e;
}

static void free_env(env_t *e)
{
    kvc_seqs_destroy(e->seqs);
    kvc_prefix_destroy(e->pc);
    kvc_pool_destroy(e->pool);
}

static kvc_seq_t prefilled(env_t *e, const kvc_token_t *prompt, size_t n)
{
    kvc_seq_desc_t d = {.prompt = prompt, .n_prompt = n};
    kvc_seq_t s;
    CHECK(kvc_seq_create(e->seqs, &d, &s));
    CHECK(kvc_seq_reserve(e->seqs, s, (uint32_t)n, NULL));
    CHECK(kvc_seq_complete(e->seqs, s, (uint32_t)n));
    return s;
}

int main(int argc, char **argv)
{
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    const int reps = quick ? 3 : 9, iters = quick ? 20000 : 200000;
    kvc_token_t prompt[1000];
    kvc_rng_t r;
    kvc_rng_seed(&r, 7);
    for (int i = 0; i < 1000; i++) prompt[i] = (kvc_token_t)kvc_rng_below(&r, 128000);

    /* ---- fork + CoW ---- */
    env_t e = make_env(4096);
    kvc_seq_t parent = prefilled(&e, prompt, 1000); /* 1000 % 16 = 8: last block partial */
    double fork_rate[16];
    kvc_token_t tok = 1;
    for (int k = 0; k < reps; k++) {
        uint64_t t0 = kvc_now_ns();
        for (int i = 0; i < iters; i++) {
            kvc_seq_t c;
            CHECK(kvc_seq_fork(e.seqs, parent, &c));
            CHECK(kvc_seq_append(e.seqs, c, &tok, 1));
            CHECK(kvc_seq_reserve(e.seqs, c, 1, NULL)); /* copies the shared partial block */
            CHECK(kvc_seq_destroy(e.seqs, c));
        }
        fork_rate[k] = iters / ((double)(kvc_now_ns() - t0) * 1e-9);
    }
    kvc_seqs_stats_t st;
    kvc_seqs_stats(e.seqs, &st);
    if (st.n_cow_copies != (uint64_t)reps * iters) {
        fprintf(stderr, "bench_seq: expected one copy per fork\n");
        return 1;
    }
    free_env(&e);

    /* ---- beam steps ---- */
    double beam_us[2][16];
    const uint32_t widths[2] = {4, 16};
    for (int wi = 0; wi < 2; wi++) {
        uint32_t W = widths[wi];
        int steps = quick ? 200 : 2000;
        for (int k = 0; k < reps; k++) {
            e = make_env(8192);
            kvc_seq_t beams[16], next[16];
            beams[0] = prefilled(&e, prompt, 1000);
            uint32_t nb = 1;
            /* grow to W beams first */
            while (nb < W) {
                kvc_beam_choice_t ch[16];
                uint32_t n2 = KVC_MIN(2 * nb, W);
                for (uint32_t j = 0; j < n2; j++)
                    ch[j] = (kvc_beam_choice_t){.parent = j % nb, .token = (kvc_token_t)j};
                CHECK(kvc_seq_beam_step(e.seqs, beams, nb, ch, n2, next, NULL));
                nb = n2;
                memcpy(beams, next, nb * sizeof *beams);
                for (uint32_t j = 0; j < nb; j++) CHECK(kvc_seq_complete(e.seqs, beams[j], 1));
            }
            uint64_t total = 0;
            for (int s = 0; s < steps; s++) {
                /* the typical shape: the best half of the beams each spawn two */
                kvc_beam_choice_t ch[16];
                for (uint32_t j = 0; j < W; j++)
                    ch[j] = (kvc_beam_choice_t){.parent = j / 2,
                                                .token = (kvc_token_t)kvc_rng_below(&r, 128000)};
                uint64_t t0 = kvc_now_ns();
                CHECK(kvc_seq_beam_step(e.seqs, beams, W, ch, W, next, NULL));
                total += kvc_now_ns() - t0;
                memcpy(beams, next, W * sizeof *beams);
                for (uint32_t j = 0; j < W; j++) CHECK(kvc_seq_complete(e.seqs, beams[j], 1));
                if (s % 200 == 199) { /* keep the sequences short: restart from the prompt */
                    for (uint32_t j = 1; j < W; j++) CHECK(kvc_seq_destroy(e.seqs, beams[j]));
                    kvc_beam_choice_t grow_ch[16];
                    for (uint32_t j = 0; j < W; j++)
                        grow_ch[j] = (kvc_beam_choice_t){.parent = 0, .token = (kvc_token_t)j};
                    CHECK(kvc_seq_beam_step(e.seqs, beams, 1, grow_ch, W, next, NULL));
                    memcpy(beams, next, W * sizeof *beams);
                    for (uint32_t j = 0; j < W; j++) CHECK(kvc_seq_complete(e.seqs, beams[j], 1));
                }
            }
            beam_us[wi][k] = (double)total * 1e-3 / steps;
            free_env(&e);
        }
    }

    /* ---- draft + rollback ---- */
    e = make_env(4096);
    kvc_seq_t s = prefilled(&e, prompt, 1000);
    CHECK(kvc_seq_append(e.seqs, s, &tok, 1));
    double draft_rate[16];
    const kvc_token_t drafts[4] = {11, 12, 13, 14};
    for (int k = 0; k < reps; k++) {
        uint64_t t0 = kvc_now_ns();
        for (int i = 0; i < iters; i++) {
            CHECK(kvc_seq_draft(e.seqs, s, drafts, 4));
            CHECK(kvc_seq_reserve(e.seqs, s, 5, NULL));
            CHECK(kvc_seq_complete(e.seqs, s, 5));
            CHECK(kvc_seq_accept(e.seqs, s, 0));
            CHECK(kvc_seq_append(e.seqs, s, &tok, 1)); /* the bonus token */
            if (i % 2000 == 1999) { /* keep the sequence short (amortised: 1 in 2000) */
                CHECK(kvc_seq_destroy(e.seqs, s));
                s = prefilled(&e, prompt, 1000);
                CHECK(kvc_seq_append(e.seqs, s, &tok, 1));
            }
        }
        draft_rate[k] = iters / ((double)(kvc_now_ns() - t0) * 1e-9);
    }
    char msg[256];
    if (kvc_seqs_check(e.seqs, msg, sizeof msg)) {
        fprintf(stderr, "bench_seq: invariant broken: %s\n", msg);
        return 1;
    }
    free_env(&e);

    printf("kvcache bench_seq: block size 16, 1,000-token prompt, metadata-only pool, medians of "
           "%d runs\n\n",
           reps);
    printf("| operation | result |\n|---|---|\n");
    printf("| fork + write one token (one CoW copy) + destroy | %.2f M/s |\n",
           kvc_bench_median(fork_rate, reps) / 1e6);
    printf("| beam step, 4 beams (2 die, 2 fork, 4 appends) | %.2f us |\n",
           kvc_bench_median(beam_us[0], reps));
    printf("| beam step, 16 beams (8 die, 8 fork, 16 appends) | %.2f us |\n",
           kvc_bench_median(beam_us[1], reps));
    printf("| 4 drafts: append + reserve + complete + roll back all + bonus | %.2f M/s |\n",
           kvc_bench_median(draft_rate, reps) / 1e6);
    return 0;
}
