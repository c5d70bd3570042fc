/* bench_matmul.c - the engine's matrix kernels: decode (n_rows = 1, GEMV, memory bound) in
 * GB/s of weights read, against the machine's read bandwidth measured here with a plain
 * streaming read (8 streams per thread) of a buffer far larger than the caches; prompt processing
 * (n_rows = 512, GEMM, compute bound) in GFLOP/s (2 n_in n_out n_rows per call).  Every weight
 * type, two shapes (n_out x n_in = 3584 x 1280 and 1280 x 3584), 1 and 2 threads, medians of
 * several runs (the machine is shared and noisy).  The GEMV walks over enough copies of the matrix
 * that each call reads its weights from memory, as a model's decode step does.
 *
 * --hot runs the GEMV on one copy, from the caches: the kernels' compute ceiling, which must be
 * well above the memory's for decode to be memory bound; on one thread it is timed by CPU
 * time, as is the GEMM then.
 *
 *   bench_matmul [--isa NAME] [--threads N] [--type NAME] [--quick] [--hot]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "kvcache/kvcache.h"
#include "kvcache/matmul.h"
#include "kvcache/model.h"

#define BW_BYTES  ((size_t)512 << 20)
#define GEMV_SPAN ((size_t)384 << 20) /* bytes of weight copies a GEMV run walks through */

static uint64_t *bw_buf;
static bool hot;

/* Nanoseconds by the wall clock, or, for --hot on one thread (the pool runs the calls inline),
 * by this thread's CPU time, which other tenants' load does not inflate. */
static uint64_t now(const kvc_threadpool_t *tp)
{
    if (!hot || kvc_threadpool_size(tp) > 1) return kvc_now_ns();
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

typedef struct {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} bw_arg_t;

/* Reads its part as 8 sequential streams in lockstep, one 64-byte line of each in turn, as
 * bench_bw does (one stream alone reaches only about two thirds of the machine's bandwidth),
 * without bench_bw's prefetch variant: its figure is the lower.  The last 8 * 17 words of the
 * part are left unread but counted below, 0.03% of the bytes. */
static void *bw_read(void *arg)
{
    bw_arg_t *a = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    const size_t part = a->n / 8 / 8 * 8 - 17 * 8; /* not a power of two apart: see bench_bw */
    for (size_t j = 0; j < part; j += 8)
        for (size_t k = 0; k < 8; k++) {
            const uint64_t *q = a->p + k * part + j;
            s0 += q[0];
            s1 += q[1];
            s2 += q[2];
            s3 += q[3];
            s4 += q[4];
            s5 += q[5];
            s6 += q[6];
            s7 += q[7];
        }
    a->sum = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    return NULL;
}

/* Read bandwidth (GB/s) of n_threads threads each streaming its part of a 512 MiB buffer. */
static double bandwidth(int n_threads, int runs)
{
    const size_t n = BW_BYTES / 8;
    double v[16];
    for (int run = 0; run < runs; run++) {
        pthread_t th[8];
        bw_arg_t a[8];
        const uint64_t t0 = kvc_now_ns();
        for (int t = 0; t < n_threads; t++) {
            a[t] = (bw_arg_t){.p = bw_buf + n / n_threads * t, .n = n / n_threads};
            if (t) pthread_create(&th[t], NULL, bw_read, &a[t]);
        }
        bw_read(&a[0]);
        for (int t = 1; t < n_threads; t++) pthread_join(th[t], NULL);
        const uint64_t t1 = kvc_now_ns();
        v[run] = (double)BW_BYTES / (double)(t1 - t0);
        if (a[0].sum == 42) printf(" "); /* keep the reads */
    }
    return kvc_bench_median(v, runs);
}

static int bench_type(uint32_t type, uint32_t n_out, uint32_t n_in, kvc_isa_t isa,
                      kvc_threadpool_t *tp, bool quick, double bw, bool pack)
{
    uint32_t be, bb;
    if (kvc_ggml_type_size(type, &be, &bb)) return 1;
    const size_t row = (size_t)n_in / be * bb, bytes = row * n_out;
    size_t copies = GEMV_SPAN / bytes + 1;
    if (copies > 256) copies = 256;
    if (hot) copies = 1;
    uint8_t *w = aligned_alloc(64, ((bytes * copies) + 63) & ~(size_t)63);
    float *src = malloc(sizeof(float) * n_in);
    const uint32_t n_rows = 512;
    float *x = malloc(sizeof(float) * n_in * n_rows), *y = malloc(sizeof(float) * n_out * n_rows);
    if (!w || !src || !x || !y) return 1;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, type);
    for (uint32_t o = 0; o < n_out; o++) {
        for (uint32_t i = 0; i < n_in; i++) src[i] = (float)(kvc_rng_double(&rng) - 0.5);
        if (kvc_ggml_quantize_row(type, src, w + o * row, n_in)) return 1;
    }
    for (size_t c = 1; c < copies; c++) memcpy(w + c * bytes, w, bytes);
    /* packed: one packed copy per copy of the rows, the GEMV walking through those */
    const kvc_mat_t m0 = {.type = type, .data = w, .n_in = n_in, .n_out = n_out, .row_bytes = row};
    const size_t pbytes = pack ? kvc_mat_pack_bytes(&m0) : 0;
    uint8_t *pk = pbytes ? aligned_alloc(64, pbytes * copies) : NULL;
    if (pbytes) {
        kvc_mat_t t = m0;
        if (!pk || kvc_mat_pack(&t, pk, pbytes)) return 1;
        for (size_t c = 1; c < copies; c++) memcpy(pk + c * pbytes, pk, pbytes);
    }
    for (size_t i = 0; i < (size_t)n_in * n_rows; i++) x[i] = (float)(kvc_rng_double(&rng) - 0.5);
    const size_t wsb = kvc_matmul_workspace_bytes(
        &(kvc_mat_t){.type = type, .data = w, .n_in = n_in, .n_out = n_out, .row_bytes = row},
        n_rows);
    void *ws = wsb ? aligned_alloc(64, (wsb + 63) & ~(size_t)63) : NULL;

    /* the bandwidth again, right before: the machine's load drifts */
    bw = bandwidth((int)kvc_threadpool_size(tp), 3);
    /* GEMV: one call per copy, each from memory */
    double v[16];
    const int gemv_runs = quick ? 3 : 7;
    for (int run = 0; run < gemv_runs; run++) {
        const uint64_t t0 = now(tp);
        for (size_t c = 0; c < (hot ? 64 : copies); c++) {
            const kvc_mat_t m = {.type = type,
                                 .data = w + c % copies * bytes,
                                 .n_in = n_in,
                                 .n_out = n_out,
                                 .row_bytes = row,
                                 .packed = pk ? pk + c % copies * pbytes : NULL};
            if (kvc_matmul(&m, x, 1, y, isa, tp, ws, wsb)) return 1;
        }
        v[run] = (double)(bytes * (hot ? 64 : copies)) / (double)(now(tp) - t0);
    }
    const double gbs = kvc_bench_median(v, gemv_runs);
    /* GEMM: 512 rows */
    const kvc_mat_t m = {
        .type = type, .data = w, .n_in = n_in, .n_out = n_out, .row_bytes = row, .packed = pk};
    const int gemm_runs = quick ? 1 : 3;
    for (int run = 0; run < gemm_runs; run++) {
        const uint64_t t0 = now(tp);
        if (kvc_matmul(&m, x, n_rows, y, isa, tp, ws, wsb)) return 1;
        v[run] = 2.0 * n_rows * n_in * n_out / (double)(now(tp) - t0);
    }
    const double gflops = kvc_bench_median(v, gemm_runs);
    if (pack && !pbytes) return 0;
    printf("%-5s%s %4u x %-4u  threads %u  %-6s  gemv %6.2f GB/s (%3.0f%% of %5.2f)  gemm(512) "
           "%7.2f GFLOP/s\n",
           kvc_ggml_type_name(type), pack ? "+pk" : "", n_out, n_in, kvc_threadpool_size(tp),
           kvc_matmul_kernel_name(type, isa), gbs, 100 * gbs / bw, bw, gflops);
    fflush(stdout);
    free(ws);
    free(pk);
    free(w);
    free(src);
    free(x);
    free(y);
    return 0;
}

int main(int argc, char **argv)
{
    kvc_isa_t isa = KVC_ISA_AUTO;
    int threads_only = 0;
    bool quick = false;
    const char *type_only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            if (kvc_isa_parse(argv[++i], &isa)) return 2;
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads_only = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--type") && i + 1 < argc) {
            type_only = argv[++i];
        } else if (!strcmp(argv[i], "--hot")) {
            hot = true;
        } else if (!strcmp(argv[i], "--quick")) {
            quick = true;
        } else {
            fprintf(stderr,
                    "usage: %s [--isa NAME] [--threads N] [--type NAME] [--quick] [--hot]\n",
                    argv[0]);
            return 2;
        }
    }
    bw_buf = aligned_alloc(64, BW_BYTES);
    if (!bw_buf) return 1;
    for (size_t i = 0; i < BW_BYTES / 8; i++) bw_buf[i] = i;
    static const uint32_t types[] = {KVC_GGML_F32,  KVC_GGML_F16,  KVC_GGML_BF16, KVC_GGML_Q8_0,
                                     KVC_GGML_Q4_0, KVC_GGML_Q4_K, KVC_GGML_Q6_K};
    static const uint32_t shapes[][2] = {{3584, 1280}, {1280, 3584}};
    for (uint32_t nt = 1; nt <= 2; nt++) {
        if (threads_only && (uint32_t)threads_only != nt) continue;
        const double bw = bandwidth((int)nt, quick ? 3 : 5);
        printf("read bandwidth, %u thread%s: %.2f GB/s\n", nt, nt > 1 ? "s" : "", bw);
        kvc_threadpool_t *tp = NULL;
        if (kvc_threadpool_create(nt, NULL, &tp)) return 1;
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            if (type_only && strcmp(type_only, kvc_ggml_type_name(types[t]))) continue;
            for (size_t s = 0; s < 2; s++)
                for (int pack = 0; pack < 2; pack++)
                    if (bench_type(types[t], shapes[s][0], shapes[s][1], isa, tp, quick, bw, pack))
                        return 1;
        }
        kvc_threadpool_destroy(tp);
    }
    free(bw_buf);
    return 0;
}
