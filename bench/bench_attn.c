/* bench_attn.c - decode attention throughput against this machine's roofline.
 *
 * In one run it measures
 *   - read bandwidth: a STREAM-style read of a buffer much larger than the
 *     last-level cache, with 1 and with 2 threads;
 *   - peak arithmetic for the instructions the kernels use: FP32 FMA
 *     (VFMADD231PS zmm, or ymm without AVX-512) and, where the CPU has them,
 *     AVX512-BF16 dot products (VDPBF16PS zmm); AMX is detected and reported
 *     (no kernel uses it);
 *   - decode attention over the paged cache, in bytes of K/V read per second,
 *     for contexts of 4K, 32K and 128K tokens, head_dim 128, 8 KV heads,
 *     group sizes 1, 4 and 8, storage f32, bf16 and fp8-e4m3 (per-head
 *     scales), with 1 and 2 threads, paged (blocks of 16 in random order;
 *     --block N for another size) and contiguous (the same pool, blocks in
 *     order), and GQA packing against a loop over query heads;
 *   - what paging costs the memory system alone: reads of runs of 32 KiB to
 *     1 MiB at random places (a block of the main table is one such run),
 *     and paged vs contiguous decode for blocks of 16 to 256 tokens.
 * Each row prints its roofline bound, min(read bandwidth, peak rate /
 * arithmetic intensity), and the fraction of it reached; the bandwidth is
 * measured again before each block of rows (the machine is shared) and the
 * best measurement so far is the bound.  Arithmetic
 * intensity counts 4 FLOP per (query head, key, channel): 2 for q.k and 2
 * for p.v, over the K/V bytes read once.  Batches hold enough sequences
 * that the K/V read per step is at least --min-mib MiB (far beyond the
 * caches), so every step streams from memory.
 *
 *   bench_attn [--quick] [--reps N] [--min-mib M] [--csv FILE] [--isa NAME]
 *              [--ctx TOKENS] [--dtype NAME] [--block N] [--no-huge] [--blocks-only]
 * (--no-huge: no transparent huge pages for the pool; --blocks-only: only the
 * paged-vs-contiguous sweep over block sizes)
 */
#include "kvcache/kvcache.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define HEAD_DIM 128
#define KV_HEADS 8
static uint32_t BLOCK = 16; /* block size of the main table (--block) */

/* ---- a team of threads, the caller being thread 0 ------------------------------ */
typedef void (*work_fn)(void *ctx, int tid, int n_threads);

typedef struct {
    pthread_barrier_t start, done;
    work_fn fn;
    void *ctx;
    int n;
    bool quit;
    pthread_t th[8];
    double cpu[8]; /* each member's CPU seconds in the last run */
} team_t;

/* This thread's CPU time: the machine is shared, so wall time would count
 * the time other people's processes held our core. */
static double thread_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void run_member(team_t *t, int tid)
{
    double c0 = thread_cpu_s();
    t->fn(t->ctx, tid, t->n);
    t->cpu[tid] = thread_cpu_s() - c0;
}

typedef struct {
    team_t *t;
    int tid;
} member_t;

static member_t members[8];

static void *member_main(void *arg)
{
    member_t *m = arg;
    for (;;) {
        pthread_barrier_wait(&m->t->start);
        if (m->t->quit) return NULL;
        run_member(m->t, m->tid);
        pthread_barrier_wait(&m->t->done);
    }
}

static void team_init(team_t *t, int n)
{
    memset(t, 0, sizeof *t);
    t->n = n;
    pthread_barrier_init(&t->start, NULL, (unsigned)n);
    pthread_barrier_init(&t->done, NULL, (unsigned)n);
    for (int i = 1; i < n; i++) {
        members[i] = (member_t){t, i};
        pthread_create(&t->th[i], NULL, member_main, &members[i]);
    }
}

/* Run fn on every member; returns the seconds the slowest member was on a
 * CPU (the step's time on dedicated cores); *wall gets the wall time. */
static double team_run_wall(team_t *t, work_fn fn, void *ctx, double *wall)
{
    t->fn = fn, t->ctx = ctx;
    uint64_t t0 = kvc_now_ns();
    if (t->n > 1) pthread_barrier_wait(&t->start);
    run_member(t, 0);
    if (t->n > 1) pthread_barrier_wait(&t->done);
    if (wall) *wall = (double)(kvc_now_ns() - t0) * 1e-9;
    double m = 0;
    for (int i = 0; i < t->n; i++) m = fmax(m, t->cpu[i]);
    return m;
}

static double team_run(team_t *t, work_fn fn, void *ctx)
{
    return team_run_wall(t, fn, ctx, NULL);
}

static void team_free(team_t *t)
{
    t->quit = true;
    if (t->n > 1) pthread_barrier_wait(&t->start);
    for (int i = 1; i < t->n; i++) pthread_join(t->th[i], NULL);
    pthread_barrier_destroy(&t->start);
    pthread_barrier_destroy(&t->done);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- read bandwidth -------------------------------------------------------------- */
typedef struct {
    const uint8_t *buf;
    size_t bytes;
    volatile uint64_t sink[8];
} bw_ctx_t;

__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, size_t n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(const void *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(const void *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(const void *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(const void *)(p + i + 96)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t o[4];
    _mm256_storeu_si256((__m256i *)(void *)o, a0);
    return o[0] + o[1] + o[2] + o[3];
}

static void bw_work(void *ctx, int tid, int n)
{
    bw_ctx_t *c = ctx;
    size_t part = (c->bytes / (size_t)n) & ~(size_t)4095;
    c->sink[tid] = read_avx2(c->buf + part * (size_t)tid, part);
}

static double measure_bw(team_t *t, const uint8_t *buf, size_t bytes, int reps)
{
    bw_ctx_t c = {.buf = buf, .bytes = bytes};
    double v[32];
    team_run(t, bw_work, &c); /* warm up (page faults are long gone) */
    for (int i = 0; i < reps; i++) v[i] = (double)bytes / team_run(t, bw_work, &c);
    return median(v, reps);
}

/* xorshift64, and a Fisher-Yates shuffle of 0 .. n - 1 with it (the order a
 * pool hands out blocks after churn; the order random reads visit runs). */
static uint64_t xs(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static void shuffled_iota(uint32_t *a, size_t n, uint64_t *st)
{
    for (size_t i = 0; i < n; i++) a[i] = (uint32_t)i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(xs(st) % i);
        uint32_t x = a[i - 1];
        a[i - 1] = a[j], a[j] = x;
    }
}

/* Reads of the buffer in pieces of `unit` bytes visited in an order (a
 * permutation of the pieces, or address order), split among the threads:
 * what paging costs the memory system, with no arithmetic in the way. */
typedef struct {
    const uint8_t *buf;
    size_t unit;           /* bytes of one piece */
    size_t row;            /* pat_work: bytes of one token row of one head */
    const uint32_t *order; /* the pieces in visiting order */
    size_t n;              /* pieces */
    volatile uint64_t sink[8];
} order_ctx_t;

/* Each piece read straight through, no software prefetch: runs at random
 * places, as a reader that does not know the next block would see them. */
static void runs_work(void *ctx, int tid, int n)
{
    order_ctx_t *c = ctx;
    size_t b = c->n * (size_t)tid / (size_t)n, e = c->n * (size_t)(tid + 1) / (size_t)n;
    uint64_t acc = 0;
    for (size_t i = b; i < e; i++)
        acc += read_avx2(c->buf + (size_t)c->order[i] * c->unit, c->unit);
    c->sink[tid] = acc;
}

/* n bytes at p, prefetching the same bytes of `next` (NULL: none) as it goes. */
__attribute__((target("avx2"))) static __m256i pat_run(const uint8_t *p, const uint8_t *next,
                                                       size_t n, __m256i a)
{
    for (size_t i = 0; i < n; i += 64) {
        if (next) _mm_prefetch((const char *)(next + i), _MM_HINT_T0);
        a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(const void *)(p + i)));
        a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(const void *)(p + i + 32)));
    }
    return a;
}

/* Pieces are blocks of 16 tokens (a K slab and a V slab of KV_HEADS heads),
 * read in the decode kernel's order: each head's K rows then its V rows,
 * the next block's matching rows prefetched line by line as the kernel
 * does.  Paged against contiguous, this is the cost of paging when the
 * kernel's own prefetching is in place. */
__attribute__((target("avx2"))) static void pat_work(void *ctx, int tid, int n)
{
    order_ctx_t *c = ctx;
    const size_t chunk = 16 * c->row, slab = KV_HEADS * chunk;
    size_t b = c->n * (size_t)tid / (size_t)n, e = c->n * (size_t)(tid + 1) / (size_t)n;
    __m256i a = _mm256_setzero_si256();
    for (size_t i = b; i < e; i++) {
        const uint8_t *k = c->buf + (size_t)c->order[i] * c->unit;
        const uint8_t *kn = i + 1 < e ? c->buf + (size_t)c->order[i + 1] * c->unit : NULL;
        for (size_t h = 0; h < KV_HEADS; h++) {
            a = pat_run(k + h * chunk, kn ? kn + h * chunk : NULL, chunk, a);
            a = pat_run(k + slab + h * chunk, kn ? kn + slab + h * chunk : NULL, chunk, a);
        }
    }
    uint64_t o[4];
    _mm256_storeu_si256((__m256i *)(void *)o, a);
    c->sink[tid] = o[0] + o[1] + o[2] + o[3];
}

/* Median GB/s of fn over the buffer's pieces of `unit` bytes, visited in
 * a random order or in address order. */
static double measure_order(team_t *t, work_fn fn, const uint8_t *buf, size_t bytes, size_t unit,
                            size_t row, bool shuffled, int reps)
{
    order_ctx_t c = {.buf = buf, .unit = unit, .row = row, .n = bytes / unit};
    uint32_t *order = malloc(sizeof(uint32_t) * c.n);
    uint64_t st = 0x2545f4914f6cdd1dull;
    if (shuffled)
        shuffled_iota(order, c.n, &st);
    else
        for (size_t i = 0; i < c.n; i++) order[i] = (uint32_t)i;
    c.order = order;
    double v[32];
    team_run(t, fn, &c);
    for (int i = 0; i < reps; i++) v[i] = (double)(c.n * unit) / team_run(t, fn, &c);
    free(order);
    return median(v, reps);
}

/* ---- peak arithmetic ---------------------------------------------------------------- */
#define PEAK_ITERS 20000000L

typedef struct {
    int kind; /* 0 FMA zmm, 1 FMA ymm, 2 VDPBF16PS zmm */
    volatile float sink[8];
} peak_ctx_t;

/* 12 independent chains: enough to cover the latency of 2 pipes. */
__attribute__((target("avx512f,fma"))) static float fma512(void)
{
    __m512 a0 = _mm512_set1_ps(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
           a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-9f);
    for (long r = 0; r < PEAK_ITERS; r++) {
#define F(x) x = _mm512_fmadd_ps(x, b, c)
        F(a0);
        F(a1);
        F(a2);
        F(a3);
        F(a4);
        F(a5);
        F(a6);
        F(a7);
        F(a8);
        F(a9);
        F(a10);
        F(a11);
#undef F
        __asm__ volatile(""
                         : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6),
                           "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float fma256(void)
{
    __m256 a0 = _mm256_set1_ps(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
           a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-9f);
    for (long r = 0; r < PEAK_ITERS; r++) {
#define F(x) x = _mm256_fmadd_ps(x, b, c)
        F(a0);
        F(a1);
        F(a2);
        F(a3);
        F(a4);
        F(a5);
        F(a6);
        F(a7);
        F(a8);
        F(a9);
        F(a10);
        F(a11);
#undef F
        __asm__ volatile(""
                         : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6),
                           "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float o[8];
    _mm256_storeu_ps(o, s);
    return o[0];
}

__attribute__((target("avx512f,avx512bf16"))) static float dpbf16(void)
{
    __m512 a0 = _mm512_set1_ps(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
           a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80), c = (__m512bh)_mm512_set1_epi16(0x3000);
    for (long r = 0; r < PEAK_ITERS; r++) {
#define D(x) x = _mm512_dpbf16_ps(x, b, c)
        D(a0);
        D(a1);
        D(a2);
        D(a3);
        D(a4);
        D(a5);
        D(a6);
        D(a7);
        D(a8);
        D(a9);
        D(a10);
        D(a11);
#undef D
        __asm__ volatile(""
                         : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6),
                           "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    return _mm512_reduce_add_ps(s);
}

static void peak_work(void *ctx, int tid, int n)
{
    (void)n;
    peak_ctx_t *c = ctx;
    c->sink[tid] = c->kind == 0 ? fma512() : c->kind == 1 ? fma256() : dpbf16();
}

/* FLOP per second: FMA = 2 per lane, VDPBF16PS = 4 per 32-bit lane. */
static double measure_peak(team_t *t, int kind, int reps)
{
    peak_ctx_t c = {.kind = kind};
    const double flop_per_iter = 12.0 * (kind == 0 ? 32 : kind == 1 ? 16 : 64);
    double v[32];
    for (int i = 0; i < reps; i++)
        v[i] = flop_per_iter * PEAK_ITERS * t->n / team_run(t, peak_work, &c);
    return median(v, reps);
}

/* ---- huge pages for the pool ------------------------------------------------------------
 * With 4 KiB pages every few KiB of one KV head's rows sit on a page of
 * their own, and a TLB miss (a two-level walk in a VM) per chunk costs as
 * much as the chunk's arithmetic.  The pool takes an allocator: this one
 * backs large allocations with transparent huge pages (madvise), as a
 * deployment would; --no-huge measures without. */
typedef struct {
    void *p[64];
    size_t n[64];
} huge_ctx_t;

static void *huge_alloc(void *ctx, size_t bytes, size_t align)
{
    huge_ctx_t *h = ctx;
    (void)align; /* mmap gives page alignment */
    size_t len = (bytes + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    madvise(p, len, MADV_HUGEPAGE);
    for (int i = 0; i < 64; i++)
        if (!h->p[i]) {
            h->p[i] = p, h->n[i] = len;
            return p;
        }
    munmap(p, len);
    return NULL;
}

static void huge_free(void *ctx, void *p)
{
    huge_ctx_t *h = ctx;
    for (int i = 0; i < 64; i++)
        if (h->p[i] == p) {
            munmap(p, h->n[i]);
            h->p[i] = NULL;
            return;
        }
}

static huge_ctx_t huge_ctx;
static bool use_huge = true;

/* ---- decode rows ---------------------------------------------------------------------- */
typedef struct {
    kvc_dtype_t dtype;
    kvc_scale_layout_t layout;
    uint32_t block; /* tokens per block */
    uint32_t ctx, n_seqs, blocks_per_seq;
    kvc_pool_t *pool;
    kvc_kv_view_t view;
    uint32_t *paged_idx, *contig_idx, *indptr, *last;
    float *q, *out;
    void *ws[8];
    size_t ws_bytes;
    double kv_bytes; /* K and V bytes one step reads */
} setup_t;

/* Fill a block's K/V with values of a plausible spread (the speed does not
 * depend on them, but NaNs would make the softmax meaningless). */
static void fill_block(uint8_t *p, size_t n_el, kvc_dtype_t dt, uint64_t *st)
{
    for (size_t i = 0; i < n_el; i++) {
        uint64_t r = xs(st);
        float x = ((float)(r >> 40) * 0x1p-24f - 0.5f) * 4.0f;
        switch (dt) {
        case KVC_DTYPE_F32:
            memcpy(p + 4 * i, &x, 4);
            break;
        case KVC_DTYPE_BF16: {
            uint16_t h = kvc_bf16_from_f32(x);
            memcpy(p + 2 * i, &h, 2);
            break;
        }
        default:
            p[i] = kvc_fp8_e4m3_from_f32(x * 64.0f);
            break;
        }
    }
}

static int setup_make(setup_t *s, kvc_dtype_t dt, uint32_t ctx, double min_bytes, int n_threads,
                      uint32_t block)
{
    memset(s, 0, sizeof *s);
    s->block = block;
    s->dtype = dt;
    s->layout = dt == KVC_DTYPE_FP8_E4M3 ? KVC_SCALE_HEAD : KVC_SCALE_NONE;
    s->ctx = ctx;
    double per_seq = (double)ctx * KV_HEADS * HEAD_DIM * 2 * (double)kvc_dtype_bytes(dt);
    s->n_seqs = (uint32_t)ceil(min_bytes / per_seq);
    if (s->n_seqs < 1) s->n_seqs = 1;
    s->kv_bytes = per_seq * s->n_seqs;
    s->blocks_per_seq = ctx / block;
    uint32_t nb = s->n_seqs * s->blocks_per_seq;
    kvc_scale_shape_t sh = {.n_layers = 1,
                            .n_kv = 2,
                            .n_kv_heads = KV_HEADS,
                            .head_dim = HEAD_DIM,
                            .block_size = block,
                            .dtype = dt,
                            .layout = s->layout};
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = nb;
    pp.block_size = block;
    pp.storage = (kvc_storage_desc_t){.n_layers = 1,
                                      .n_kv_heads = KV_HEADS,
                                      .head_dim = HEAD_DIM,
                                      .n_kv = 2,
                                      .dtype = dt,
                                      .scale_bytes = (uint32_t)kvc_scale_bytes(&sh)};
    if (use_huge)
        pp.allocator = (kvc_allocator_t){.alloc = huge_alloc, .free = huge_free, .ctx = &huge_ctx};
    int rc = kvc_pool_create(&pp, &s->pool);
    if (rc) return rc;
    if ((rc = kvc_kv_view_from_pool(s->pool, 0, s->layout, &s->view))) return rc;
    uint64_t st = 0x9e3779b97f4a7c15ull;
    size_t slab_el = (size_t)KV_HEADS * block * HEAD_DIM;
    for (uint32_t b = 0; b < nb; b++) {
        fill_block(kvc_pool_kv_data(s->pool, b, 0, 0), slab_el, dt, &st);
        fill_block(kvc_pool_kv_data(s->pool, b, 0, 1), slab_el, dt, &st);
        float *sc = kvc_pool_scale_data(s->pool, b);
        if (sc)
            for (uint32_t i = 0; i < 2 * KV_HEADS; i++) sc[i] = 1.0f / 64.0f;
    }
    /* paged: blocks handed out in a random order (a pool after churn);
     * contiguous: each sequence's blocks in order, one after another */
    s->paged_idx = malloc(sizeof(uint32_t) * nb);
    s->contig_idx = malloc(sizeof(uint32_t) * nb);
    for (uint32_t i = 0; i < nb; i++) s->contig_idx[i] = i;
    shuffled_iota(s->paged_idx, nb, &st);
    s->indptr = malloc(sizeof(uint32_t) * (s->n_seqs + 1));
    s->last = malloc(sizeof(uint32_t) * s->n_seqs);
    for (uint32_t i = 0; i <= s->n_seqs; i++) s->indptr[i] = i * s->blocks_per_seq;
    for (uint32_t i = 0; i < s->n_seqs; i++) s->last[i] = block;
    size_t nq = (size_t)s->n_seqs * KV_HEADS * 8 * HEAD_DIM;
    s->q = malloc(sizeof(float) * nq);
    s->out = malloc(sizeof(float) * nq);
    for (size_t i = 0; i < nq; i++) s->q[i] = ((float)(xs(&st) >> 40) * 0x1p-24f - 0.5f) * 0.5f;
    s->ws_bytes = kvc_attn_workspace_bytes(&s->view, NULL);
    for (int t = 0; t < n_threads; t++) s->ws[t] = aligned_alloc(64, s->ws_bytes);
    return 0;
}

static void setup_free(setup_t *s, int n_threads)
{
    kvc_pool_destroy(s->pool);
    free(s->paged_idx), free(s->contig_idx), free(s->indptr), free(s->last), free(s->q),
        free(s->out);
    for (int t = 0; t < n_threads; t++) free(s->ws[t]);
}

typedef struct {
    const setup_t *s;
    kvc_attn_params_t p;
    kvc_attn_batch_t batch;
    uint32_t n_items;
    int iters; /* steps per timed run, >= 1 */
    int rc[8];
} dec_ctx_t;

static void dec_work(void *ctx, int tid, int n)
{
    dec_ctx_t *c = ctx;
    uint32_t b = (uint32_t)((uint64_t)c->n_items * (uint64_t)tid / (uint64_t)n);
    uint32_t e = (uint32_t)((uint64_t)c->n_items * (uint64_t)(tid + 1) / (uint64_t)n);
    for (int i = 0; i < c->iters; i++)
        c->rc[tid] = kvc_attn_forward(&c->p, &c->s->view, &c->batch, c->s->q, c->s->out,
                                      c->s->ws[tid], c->s->ws_bytes, b, e);
}

/* Median seconds per decode step. */
static double time_decode_n(team_t *t, const setup_t *s, uint32_t g, bool paged, bool per_head,
                            kvc_isa_t isa, int reps, int iters)
{
    dec_ctx_t c = {.s = s, .iters = iters};
    c.p = kvc_attn_params_default();
    c.p.n_q_heads = KV_HEADS * g;
    c.p.per_head = per_head;
    c.p.isa = isa;
    /* fewer sequences than threads: split each sequence's KV heads instead */
    if (s->n_seqs < (uint32_t)t->n) c.p.kv_heads_per_item = KV_HEADS / (uint32_t)t->n;
    c.batch = (kvc_attn_batch_t){.n_seqs = s->n_seqs,
                                 .kv_indptr = s->indptr,
                                 .kv_indices = paged ? s->paged_idx : s->contig_idx,
                                 .kv_last_len = s->last};
    c.n_items = kvc_attn_n_items(&c.p, &s->view, &c.batch);
    double v[64];
    team_run(t, dec_work, &c); /* warm-up */
    for (int i = 0; i < t->n; i++)
        if (c.rc[i]) {
            fprintf(stderr, "bench_attn: kvc_attn_forward: %s\n", kvc_strerror(c.rc[i]));
            exit(1);
        }
    for (int i = 0; i < reps; i++) v[i] = team_run(t, dec_work, &c) / iters;
    return median(v, reps);
}

/* Median seconds per decode step (each step streams from memory). */
static double time_decode(team_t *t, const setup_t *s, uint32_t g, bool paged, bool per_head,
                          kvc_isa_t isa, int reps)
{
    return time_decode_n(t, s, g, paged, per_head, isa, reps, 1);
}

/* ---- main ------------------------------------------------------------------------------- */
int main(int argc, char **argv)
{
    bool quick = false;
    int reps = 5;
    double min_mib = 512;
    const char *csv_path = NULL;
    kvc_isa_t isa = KVC_ISA_AUTO;
    uint32_t only_ctx = 0;
    int only_dt = -1;
    bool blocks_only = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-mib") && i + 1 < argc)
            min_mib = atof(argv[++i]);
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
            csv_path = argv[++i];
        else if (!strcmp(argv[i], "--no-huge"))
            use_huge = false;
        else if (!strcmp(argv[i], "--block") && i + 1 < argc) {
            BLOCK = (uint32_t)atoi(argv[++i]);
            if (BLOCK < 1 || BLOCK > 4096 || (BLOCK & (BLOCK - 1)))
                return fprintf(stderr, "bench_attn: --block must be a power of two, 1-4096\n"), 2;
        } else if (!strcmp(argv[i], "--blocks-only"))
            blocks_only = true;
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc)
            only_ctx = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            kvc_dtype_t d;
            if (kvc_dtype_parse(argv[++i], &d)) return fprintf(stderr, "bad --dtype\n"), 2;
            only_dt = (int)d;
        } else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            if (kvc_isa_parse(argv[++i], &isa)) return fprintf(stderr, "bad --isa\n"), 2;
        } else {
            fprintf(
                stderr,
                "usage: bench_attn [--quick] [--reps N] [--min-mib M] [--csv FILE] [--isa NAME]\n"
                "                  [--ctx TOKENS] [--dtype f32|bf16|fp8-e4m3] [--block N]\n"
                "                  [--no-huge] [--blocks-only]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    if (reps > 31) reps = 31;
    const kvc_cpu_t *cpu = kvc_cpu();
    if (!cpu->avx2) {
        fprintf(stderr, "bench_attn: needs AVX2 for its bandwidth and peak probes\n");
        return 1;
    }
    kvc_isa_t eff;
    if (!kvc_isa_supported(isa))
        return fprintf(stderr, "ISA %s not available\n", kvc_isa_name(isa)), 1;
    eff = isa == KVC_ISA_AUTO ? kvc_isa_best() : isa;
    const bool bf16_path = eff == KVC_ISA_AVX512 && cpu->avx512_bf16 && cpu->avx512_vbmi;

    team_t team[2];
    team_init(&team[0], 1);
    team_init(&team[1], 2);
    printf("kvcache bench_attn: decode attention vs roofline (head_dim %d, %d KV heads, blocks of "
           "%d)\n",
           HEAD_DIM, KV_HEADS, BLOCK);
    printf("CPU: avx2 %d, avx512 %d, avx512-bf16 %d, avx512-vbmi %d, AMX-BF16 %s; kernels: %s%s\n",
           cpu->avx2, cpu->avx512, cpu->avx512_bf16, cpu->avx512_vbmi,
           cpu->amx_bf16 ? "present (unused)" : "not present", kvc_isa_name(eff),
           bf16_path ? " (bf16/fp8 via VDPBF16PS)" : "");

    /* the machine */
    size_t bw_bytes = (size_t)1 << 30;
    uint8_t *bw_buf = aligned_alloc((size_t)2 << 20, bw_bytes);
    if (use_huge) madvise(bw_buf, bw_bytes, MADV_HUGEPAGE); /* as the pool's storage */
    memset(bw_buf, 1, bw_bytes);
    double bw[2], fma[2], dp[2] = {0, 0};
    for (int t = 0; t < 2; t++) {
        bw[t] = measure_bw(&team[t], bw_buf, bw_bytes, reps);
        fma[t] = measure_peak(&team[t], cpu->avx512 ? 0 : 1, 3);
        if (cpu->avx512_bf16) dp[t] = measure_peak(&team[t], 2, 3);
    }
    printf("\nmachine (median of runs)        1 thread     2 threads\n");
    printf("read bandwidth (1 GiB buffer)  %7.1f GB/s  %7.1f GB/s\n", bw[0] * 1e-9, bw[1] * 1e-9);
    printf("FP32 FMA (%s)                %7.1f GF/s  %7.1f GF/s\n", cpu->avx512 ? "zmm" : "ymm",
           fma[0] * 1e-9, fma[1] * 1e-9);
    if (cpu->avx512_bf16)
        printf("BF16 dot (VDPBF16PS zmm)       %7.1f GF/s  %7.1f GF/s\n", dp[0] * 1e-9,
               dp[1] * 1e-9);
    else
        printf("BF16 dot: not available\n");
    printf("AMX-BF16 tiles: %s\n", cpu->amx_bf16 ? "present, not measured (no kernel uses AMX)"
                                                 : "not present on this CPU");
    /* one block of the main table holds K and V of all heads: 16 tokens are
     * 32 KiB (fp8), 64 KiB (bf16), 128 KiB (f32) */
    printf("read of runs at random places (the pages of a paged cache):\n");
    for (size_t run = 32 << 10; run <= (size_t)1 << 20; run *= 2) {
        double r1 = measure_order(&team[0], runs_work, bw_buf, bw_bytes, run, 0, true, reps);
        double r2 = measure_order(&team[1], runs_work, bw_buf, bw_bytes, run, 0, true, reps);
        printf("  runs of %4zu KiB               %7.1f GB/s  %7.1f GB/s   (%3.0f%% / %3.0f%% of "
               "one stream)\n",
               run >> 10, r1 * 1e-9, r2 * 1e-9, 100 * r1 / bw[0], 100 * r2 / bw[1]);
    }
    printf("read in the decode kernel's order (16-token blocks, each head's K then V, the next\n"
           "block prefetched as the kernel does; no arithmetic; 1 thread):\n");
    {
        const size_t rows[] = {HEAD_DIM * 4, HEAD_DIM * 2, HEAD_DIM};
        const char *names[] = {"f32", "bf16", "fp8"};
        for (int i = 0; i < 3; i++) {
            const size_t block = 2 * KV_HEADS * 16 * rows[i];
            double c =
                measure_order(&team[0], pat_work, bw_buf, bw_bytes, block, rows[i], false, reps);
            double pg =
                measure_order(&team[0], pat_work, bw_buf, bw_bytes, block, rows[i], true, reps);
            printf(
                "  %-4s contiguous %5.1f GB/s (%3.0f%%)  paged %5.1f GB/s (%3.0f%%)  paged/contig "
                "%3.0f%%\n",
                names[i], c * 1e-9, 100 * c / bw[0], pg * 1e-9, 100 * pg / bw[0], 100 * pg / c);
        }
    }
    printf("ridge point (peak / bandwidth): FMA %.1f FLOP/B per thread%s\n", fma[0] / bw[0],
           cpu->avx512_bf16 ? "" : "");
    if (cpu->avx512_bf16)
        printf("                                BF16 %.1f FLOP/B per thread\n", dp[0] / bw[0]);

    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv)
        fprintf(csv,
                "ctx,group,dtype,threads,layout,variant,n_seqs,ms_per_step,kv_gbps,flop_per_byte,"
                "bound_gbps,bound_kind,fraction\n");
    printf("\n%-5s %2s %-8s %3s %-6s %-8s %5s %9s %9s %6s %9s %4s %6s\n", "ctx", "g", "storage",
           "thr", "layout", "variant", "seqs", "ms/step", "KV GB/s", "FLOP/B", "bound", "by",
           "frac");
    const uint32_t ctxs[] = {4096, 32768, 131072};
    const kvc_dtype_t dts[] = {KVC_DTYPE_F32, KVC_DTYPE_BF16, KVC_DTYPE_FP8_E4M3};
    const uint32_t groups[] = {1, 4, 8};
    for (size_t ci = 0; ci < 3 && !blocks_only; ci++) {
        if ((quick && ci == 2) || (only_ctx && ctxs[ci] != only_ctx)) continue;
        for (size_t di = 0; di < 3; di++) {
            if (only_dt >= 0 && (int)dts[di] != only_dt) continue;
            setup_t s;
            int rc = setup_make(&s, dts[di], ctxs[ci], min_mib * 1048576.0, 2, BLOCK);
            if (rc) {
                fprintf(stderr, "bench_attn: setup: %s\n", kvc_strerror(rc));
                return 1;
            }
            const bool b16 = bf16_path && dts[di] != KVC_DTYPE_F32;
            /* the machine is shared: measure the bandwidth again next to the
             * rows it bounds, and bound by the best seen (interference only
             * ever lowers a measurement) */
            for (int t = 0; t < 2; t++) {
                double now = measure_bw(&team[t], bw_buf, bw_bytes, 3);
                printf("# read bandwidth now (%d thread%s): %.1f GB/s, bound uses %.1f GB/s\n",
                       t + 1, t ? "s" : "", now * 1e-9, fmax(bw[t], now) * 1e-9);
                bw[t] = fmax(bw[t], now);
            }
            for (size_t gi = 0; gi < 3; gi++) {
                const uint32_t g = groups[gi];
                const double flop = 4.0 * g * KV_HEADS * HEAD_DIM * (double)ctxs[ci] * s.n_seqs;
                const double ai = flop / s.kv_bytes;
                for (int thr = 1; thr <= 2; thr++) {
                    const double peak = b16 ? dp[thr - 1] : fma[thr - 1];
                    const double cb = peak / ai, bound = fmin(bw[thr - 1], cb);
                    for (int var = 0; var < 3; var++) {
                        /* paged packed, contiguous packed, paged per-head (1 thread) */
                        if (var == 2 && (g == 1 || thr == 2 || (quick && ci != 1))) continue;
                        double sec =
                            time_decode(&team[thr - 1], &s, g, var != 1, var == 2, isa, reps);
                        double gbps = s.kv_bytes / sec;
                        const char *lay = var == 1 ? "contig" : "paged";
                        const char *vn = var == 2 ? "per-head" : "packed";
                        printf(
                            "%4uK %2u %-8s %3d %-6s %-8s %5u %9.2f %9.1f %6.1f %9.1f %4s %5.0f%%\n",
                            ctxs[ci] / 1024, g, kvc_dtype_name(dts[di]), thr, lay, vn, s.n_seqs,
                            sec * 1e3, gbps * 1e-9, ai, bound * 1e-9,
                            cb < bw[thr - 1] ? "cmp" : "mem", 100.0 * gbps / bound);
                        if (csv)
                            fprintf(csv, "%u,%u,%s,%d,%s,%s,%u,%.4f,%.3f,%.2f,%.3f,%s,%.4f\n",
                                    ctxs[ci], g, kvc_dtype_name(dts[di]), thr, lay, vn, s.n_seqs,
                                    sec * 1e3, gbps * 1e-9, ai, bound * 1e-9,
                                    cb < bw[thr - 1] ? "compute" : "memory", gbps / bound);
                        fflush(stdout);
                    }
                }
            }
            setup_free(&s, 2);
        }
    }
    /* the kernels' compute ceiling: the same decode with K/V resident in the
     * caches (one sequence of 1K tokens, 2-8 MiB), so memory is no limit;
     * a row can only overlap its memory time fully if this is well above
     * the read bandwidth */
    if ((!only_ctx || only_ctx == 1024) && !blocks_only) {
        printf("\ncompute ceiling: K/V in cache (1 sequence of 1K tokens, contiguous, 1 thread)\n"
               "%-8s %2s %9s %10s %8s %7s\n",
               "storage", "g", "KV GB/s", "GFLOP/s", "of peak", "x read");
        for (size_t di = 0; di < 3; di++) {
            if (only_dt >= 0 && (int)dts[di] != only_dt) continue;
            setup_t s;
            int rc = setup_make(&s, dts[di], 1024, 0, 2, BLOCK);
            if (rc) return fprintf(stderr, "bench_attn: setup: %s\n", kvc_strerror(rc)), 1;
            const bool b16 = bf16_path && dts[di] != KVC_DTYPE_F32;
            const int iters = (int)fmax(1.0, 0.02 * 30e9 / s.kv_bytes);
            for (size_t gi = 0; gi < 3; gi++) {
                const uint32_t g = groups[gi];
                const double sec = time_decode_n(&team[0], &s, g, false, false, isa, reps, iters);
                const double flop = 4.0 * g * KV_HEADS * HEAD_DIM * 1024.0;
                const double pk = b16 ? dp[0] : fma[0];
                printf("%-8s %2u %9.1f %10.1f %7.0f%% %6.2fx\n", kvc_dtype_name(dts[di]), g,
                       s.kv_bytes / sec * 1e-9, flop / sec * 1e-9, 100.0 * flop / sec / pk,
                       s.kv_bytes / sec / bw[0]);
                if (csv)
                    fprintf(csv, "1024,%u,%s,1,in-cache,packed,1,%.4f,%.3f,%.2f,,compute,%.4f\n", g,
                            kvc_dtype_name(dts[di]), sec * 1e3, s.kv_bytes / sec * 1e-9,
                            flop / s.kv_bytes, flop / sec / pk);
            }
            setup_free(&s, 2);
        }
    }
    /* paged vs contiguous as blocks grow: a paged block is a random jump, so
     * the gap is what each jump costs against the bytes read between jumps */
    if (!only_ctx && only_dt < 0) {
        printf("\npaged vs contiguous by block size (32K, bf16, 1 thread; frac: of the roofline "
               "bound %.1f GB/s)\n%-6s %2s %9s %9s %7s %6s\n",
               bw[0] * 1e-9, "block", "g", "paged", "contig", "ratio", "frac");
        const uint32_t bss[] = {16, 32, 64, 128, 256};
        for (int bi = 0; bi < 5; bi++) {
            setup_t s;
            int rc = setup_make(&s, KVC_DTYPE_BF16, 32768, min_mib * 1048576.0, 2, bss[bi]);
            if (rc) return fprintf(stderr, "bench_attn: setup: %s\n", kvc_strerror(rc)), 1;
            for (size_t gi = 0; gi < 3; gi++) {
                const uint32_t g = groups[gi];
                double tp = time_decode(&team[0], &s, g, true, false, isa, reps);
                double tc = time_decode(&team[0], &s, g, false, false, isa, reps);
                double bound = bw[0];
                /* 4 FLOP per (query head, key, channel) over 2 bytes of K and V each */
                const double fpb = 4.0 * g / 4.0, pk = bf16_path ? dp[0] : fma[0];
                if (pk / fpb < bound) bound = pk / fpb;
                printf("%-6u %2u %6.1f GB/s %6.1f GB/s %6.0f%% %5.0f%%\n", bss[bi], g,
                       s.kv_bytes / tp * 1e-9, s.kv_bytes / tc * 1e-9, 100.0 * tc / tp,
                       100.0 * s.kv_bytes / tp / bound);
                if (csv)
                    fprintf(csv,
                            "32768,%u,bf16,1,paged-vs-contig-block%u,packed,%u,%.4f,%.3f,,,,%.4f\n",
                            g, bss[bi], s.n_seqs, tp * 1e3, s.kv_bytes / tp * 1e-9, tc / tp);
            }
            setup_free(&s, 2);
        }
    }
    if (csv) fclose(csv);
    free(bw_buf);
    team_free(&team[0]);
    team_free(&team[1]);
    return 0;
}
