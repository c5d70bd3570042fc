/* bench_sample.c - microseconds per kvc_sample for a 32K and a 152K vocabulary.
 *
 * Logits are synthetic: Gaussian with standard deviation 1 ("flat": a random-weight model,
 * where top_p 0.95 keeps most of the vocabulary) and 4 ("peaked": closer to a trained
 * model, where it keeps a few hundred tokens).  Settings: greedy; temperature 0.8 with
 * top_p 0.95 (the typical request); the same with top_k 40 and min_p 0.05 (llama.cpp's
 * defaults); temperature 1 over the full softmax; and the typical request with repetition,
 * presence and frequency penalties over a 256-token history.  Each row: the median of 7 runs
 * of N samples, in thread CPU time (a new row of logits is not generated per sample: the timing is
 * the sampler's alone).  usage: bench_sample [--quick]
 */
#include "bench_util.h"
#include "kvcache/sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CPU time of this thread: the machine is shared, and waiting for a core is not the
 * sampler's cost. */
static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define CHECK(expr)                                                              \
    do {                                                                         \
        int rc_ = (expr);                                                        \
        if (rc_) {                                                               \
            fprintf(stderr, "bench_sample: %s: %s\n", #expr, kvc_strerror(rc_)); \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

static void gaussian(float *l, uint32_t n, double sd, uint64_t seed)
{
    kvc_rng_t g;
    kvc_rng_seed(&g, seed);
    for (uint32_t i = 0; i < n; i += 2) {
        double u1 = kvc_rng_double(&g) + 1e-300, u2 = kvc_rng_double(&g);
        double r = sqrt(-2 * log(u1)) * sd;
        l[i] = (float)(r * cos(6.283185307179586 * u2));
        if (i + 1 < n) l[i + 1] = (float)(r * sin(6.283185307179586 * u2));
    }
}

int main(int argc, char **argv)
{
    bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    const uint32_t vocabs[] = {32000, 151936};
    const double sds[] = {1.0, 4.0};
    const char *sd_name[] = {"flat", "peaked"};
    kvc_token_t hist[256];
    kvc_rng_t hg;
    kvc_rng_seed(&hg, 5);

    printf("%-8s %-7s %-34s %8s %8s %8s\n", "vocab", "logits", "settings", "median", "min", "kept");
    for (int v = 0; v < 2; v++) {
        uint32_t n = vocabs[v];
        for (uint32_t i = 0; i < 256; i++) hist[i] = (kvc_token_t)kvc_rng_below(&hg, n);
        kvc_sampler_t *s = NULL;
        CHECK(kvc_sampler_create(n, NULL, &s));
        float *l = malloc(n * sizeof *l);
        kvc_token_t *ids = malloc(n * sizeof *ids);
        {
            /* what one plain pass over the row costs here: the yardstick for the rows below */
            gaussian(l, n, 1.0, 1);
            double us[7];
            volatile float sink = 0;
            for (int r = 0; r < 7; r++) {
                uint64_t t0 = cpu_ns();
                for (int i = 0; i < 200; i++) {
                    float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
                    for (uint32_t j = 0; j + 4 <= n; j += 4) {
                        a0 += l[j], a1 += l[j + 1], a2 += l[j + 2], a3 += l[j + 3];
                    }
                    sink = sink + a0 + a1 + a2 + a3;
                }
                us[r] = (double)(cpu_ns() - t0) / 1e3 / 200;
            }
            double lo = us[0];
            for (int r = 1; r < 7; r++) lo = us[r] < lo ? us[r] : lo;
            printf("%-8u %-7s %-34s %8.1f %8.1f %8s\n", n, "-", "(yardstick: sum the row, scalar)",
                   kvc_bench_median(us, 7), lo, "-");
        }
        for (int d = 0; d < 2; d++) {
            gaussian(l, n, sds[d], 1 + (uint64_t)d);
            for (int c = 0; c < 5; c++) {
                kvc_sampling_params_t p = kvc_sampling_params_default();
                const char *name = "";
                size_t nh = 0;
                switch (c) {
                case 0:
                    p.temperature = 0.0f, name = "greedy";
                    break;
                case 1:
                    p.temperature = 0.8f, p.top_p = 0.95f, name = "temp 0.8, top_p 0.95";
                    break;
                case 2:
                    p.temperature = 0.8f, p.top_p = 0.95f, p.top_k = 40, p.min_p = 0.05f;
                    name = "temp 0.8, top_k 40, top_p, min_p";
                    break;
                case 3:
                    name = "temp 1, full softmax";
                    break;
                case 4:
                    p.temperature = 0.8f, p.top_p = 0.95f, p.repetition_penalty = 1.1f;
                    p.presence_penalty = 0.5f, p.frequency_penalty = 0.5f, nh = 256;
                    name = "temp 0.8, top_p 0.95, penalties";
                    break;
                }
                p.n_logprobs = 0;
                uint32_t kept = 0;
                CHECK(kvc_sample_kept(s, &p, l, hist, nh, ids, &kept));
                int reps = quick ? 20 : 200;
                double us[7];
                kvc_rng_t rng;
                kvc_rng_seed(&rng, 1);
                for (int r = 0; r < 7; r++) {
                    uint64_t t0 = cpu_ns();
                    for (int i = 0; i < reps; i++) {
                        kvc_sample_result_t out;
                        CHECK(kvc_sample(s, &p, &rng, l, hist, nh, &out));
                    }
                    us[r] = (double)(cpu_ns() - t0) / 1e3 / reps;
                }
                double lo = us[0];
                for (int r = 1; r < 7; r++) lo = us[r] < lo ? us[r] : lo;
                printf("%-8u %-7s %-34s %8.1f %8.1f %8u\n", n, sd_name[d], name,
                       kvc_bench_median(us, 7), lo, kept);
            }
        }
        free(l);
        free(ids);
        kvc_sampler_destroy(s);
    }
    return 0;
}
