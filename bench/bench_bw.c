/* bench_bw.c - the machine's read bandwidth: the denominator of every weight-streaming bound in
 * bench/engine (a generation step has to read every weight once, so tokens/s <= bandwidth /
 * weight bytes per token).
 *
 * A plain streaming read: a buffer much larger than the last-level cache (1 GiB by default),
 * written once so that every page is backed, then read start to end by T threads, each its own
 * contiguous slice, summing 16-byte words into independent accumulators (no stores, no
 * dependence between loads).  Each thread reads its slice as S sequential streams in lockstep
 * (S parts, one 64-byte line of each in turn), for S = 1, 4 and 8 (--streams S: one of
 * them), each without and with a software prefetch 1 KiB ahead, and the figure is the best
 * of the six: the matrix kernels read 2 to 8 weight rows at
 * once, and on this machine one stream alone reaches only about two thirds of what several do,
 * so a single stream would understate the limit the kernels are held to.  One run is
 * the wall time from starting the threads to the last join; the figure is the median of the runs,
 * after one untimed warm-up run, for each thread count.  GB/s are 10^9 bytes per second.  The
 * machine is shared: compare medians, never single runs.
 *
 * usage: bench_bw [--mib N] [--runs N] [--threads 1,2,...] [--streams S] [--quick]
 * Prints one JSON object:
 *   {"bench": "bw", "buffer_bytes": B, "runs": R,
 *    "results": [{"threads": T, "gb_s": BEST MEDIAN, "streams": S OF IT, "prefetch": BOOL,
 *                 "by_variant": {"1": MEDIAN, "1+prefetch": MEDIAN, ...},
 *                 "runs_gb_s": [RUNS OF IT]}, ...]}
 */
#include "bench_util.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define MAX_RUNS    64
#define MAX_THREADS 64
#define MAX_STREAMS 16

static int g_streams;   /* sequential streams per thread, in the run going on */
static bool g_prefetch; /* and whether each also prefetches 1 KiB ahead */

typedef struct {
    const unsigned char *p;
    size_t n; /* bytes, a multiple of 64 */
    uint64_t sum;
} slice_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *read_slice(void *arg)
{
    slice_t *s = arg;
#if defined(__SSE2__)
    __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
    /* Parts 17 lines short of an equal split: streams a power of two apart land in the same
     * DRAM banks and channels and measured 40% slower here than the same streams a few lines
     * off (the kernels' rows lie at no such distance); the tail loop reads the rest. */
    size_t part = s->n / (size_t)g_streams / 64 * 64;
    if (g_streams > 1 && part > 64 * 64) part -= 17 * 64;
    for (size_t i = 0; i < part; i += 64)
        for (int k = 0; k < g_streams; k++) {
            const __m128i *q = (const __m128i *)(s->p + (size_t)k * part + i);
            if (g_prefetch) _mm_prefetch((const char *)q + 1024, _MM_HINT_T0);
            a0 = _mm_add_epi64(a0, _mm_load_si128(q));
            a1 = _mm_add_epi64(a1, _mm_load_si128(q + 1));
            a2 = _mm_add_epi64(a2, _mm_load_si128(q + 2));
            a3 = _mm_add_epi64(a3, _mm_load_si128(q + 3));
        }
    for (size_t i = part * (size_t)g_streams; i < s->n; i += 64) { /* the tail */
        const __m128i *q = (const __m128i *)(s->p + i);
        a0 = _mm_add_epi64(a0, _mm_load_si128(q));
        a1 = _mm_add_epi64(a1, _mm_load_si128(q + 1));
        a2 = _mm_add_epi64(a2, _mm_load_si128(q + 2));
        a3 = _mm_add_epi64(a3, _mm_load_si128(q + 3));
    }
    __m128i a = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
    uint64_t lanes[2];
    _mm_storeu_si128((__m128i *)lanes, a);
    s->sum = lanes[0] + lanes[1];
#else
    uint64_t a[8] = {0};
    for (size_t i = 0; i < s->n; i += 64) {
        const uint64_t *q = (const uint64_t *)(s->p + i);
        for (int k = 0; k < 8; k++) a[k] += q[k];
    }
    s->sum = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
#endif
    return NULL;
}

static volatile uint64_t g_sink; /* keeps the sums, so the reads are not optimised away */

/* One timed read of buf[0..n) by t threads; seconds, or a negative value if a thread could not
 * be started. */
static double one_run(const unsigned char *buf, size_t n, int t)
{
    pthread_t th[MAX_THREADS];
    slice_t sl[MAX_THREADS];
    size_t per = n / (size_t)t / 64 * 64;
    double t0 = now_s();
    int started = 0;
    for (int i = 0; i < t; i++) {
        sl[i] = (slice_t){buf + (size_t)i * per, i == t - 1 ? n - (size_t)i * per : per, 0};
        if (i == 0) continue; /* the calling thread reads the first slice */
        if (pthread_create(&th[i], NULL, read_slice, &sl[i])) break;
        started = i;
    }
    read_slice(&sl[0]);
    for (int i = 1; i <= started; i++) pthread_join(th[i], NULL);
    double s = now_s() - t0;
    for (int i = 0; i <= started; i++) g_sink += sl[i].sum;
    return started == t - 1 ? s : -1.0;
}

static int usage(void)
{
    fprintf(stderr,
            "usage: bench_bw [--mib N] [--runs N] [--threads 1,2,...] [--streams S] [--quick]\n");
    return 2;
}

int main(int argc, char **argv)
{
    size_t mib = 1024;
    int runs = 9;
    int threads[MAX_THREADS] = {1, 2};
    int n_threads = 2;
    int only_streams = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--quick")) {
            mib = 256;
            runs = 3;
        } else if (!strcmp(a, "--mib") && i + 1 < argc) {
            char *end;
            unsigned long v = strtoul(argv[++i], &end, 10);
            if (*end || v < 64 || v > (1ul << 20)) {
                fprintf(stderr, "bench_bw: --mib %s: a whole number of MiB from 64\n", argv[i]);
                return 2;
            }
            mib = v;
        } else if (!strcmp(a, "--runs") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > MAX_RUNS) {
                fprintf(stderr, "bench_bw: --runs %s: 1 to %d\n", argv[i], MAX_RUNS);
                return 2;
            }
            runs = (int)v;
        } else if (!strcmp(a, "--streams") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > MAX_STREAMS) {
                fprintf(stderr, "bench_bw: --streams %s: 1 to %d\n", argv[i], MAX_STREAMS);
                return 2;
            }
            only_streams = (int)v;
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            char *s = argv[++i], *end;
            n_threads = 0;
            for (;;) {
                long v = strtol(s, &end, 10);
                if (end == s || v < 1 || v > MAX_THREADS || n_threads == MAX_THREADS ||
                    (*end && *end != ',')) {
                    fprintf(stderr, "bench_bw: --threads: a list such as 1,2 (1 to %d)\n",
                            MAX_THREADS);
                    return 2;
                }
                threads[n_threads++] = (int)v;
                if (!*end) break;
                s = end + 1;
            }
        } else {
            return usage();
        }
    }

    size_t n = mib << 20;
    unsigned char *buf = NULL;
    if (posix_memalign((void **)&buf, 4096, n)) {
        fprintf(stderr, "bench_bw: cannot allocate %zu MiB\n", mib);
        return 1;
    }
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(i * 131u + 7u); /* back every page */

    static const int all_streams[] = {1, 4, 8};
    const int *streams = only_streams ? &only_streams : all_streams;
    const int n_variants = 2 * (only_streams ? 1 : 3); /* (streams, prefetch) pairs */
    printf("{\"bench\": \"bw\", \"buffer_bytes\": %zu, \"runs\": %d, \"results\": [", n, runs);
    for (int k = 0; k < n_threads; k++) {
        double best[MAX_RUNS], med[6];
        int best_v = 0;
        for (int v = 0; v < n_variants; v++) {
            double gbs[MAX_RUNS], sorted[MAX_RUNS];
            g_streams = streams[v / 2];
            g_prefetch = v % 2;
            if (one_run(buf, n, threads[k]) < 0) { /* warm-up */
                fprintf(stderr, "bench_bw: cannot start %d threads\n", threads[k]);
                free(buf);
                return 1;
            }
            for (int r = 0; r < runs; r++) {
                double s = one_run(buf, n, threads[k]);
                if (s <= 0) {
                    fprintf(stderr, "bench_bw: cannot start %d threads\n", threads[k]);
                    free(buf);
                    return 1;
                }
                gbs[r] = sorted[r] = (double)n / s / 1e9;
            }
            med[v] = kvc_bench_median(sorted, runs);
            if (v == 0 || med[v] > med[best_v]) {
                best_v = v;
                memcpy(best, gbs, sizeof(double) * (size_t)runs);
            }
        }
        printf("%s{\"threads\": %d, \"gb_s\": %.3f, \"streams\": %d, \"prefetch\": %s, "
               "\"by_variant\": {",
               k ? ", " : "", threads[k], med[best_v], streams[best_v / 2],
               best_v % 2 ? "true" : "false");
        for (int v = 0; v < n_variants; v++)
            printf("%s\"%d%s\": %.3f", v ? ", " : "", streams[v / 2], v % 2 ? "+prefetch" : "",
                   med[v]);
        printf("}, \"runs_gb_s\": [");
        for (int r = 0; r < runs; r++) printf("%s%.3f", r ? ", " : "", best[r]);
        printf("]}");
    }
    printf("]}\n");
    free(buf);
    return 0;
}
