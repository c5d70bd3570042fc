/* matmul.c - the engine's matrix kernels: argument checks, the per-row quantisation of the
 * activations for the integer paths, the split of the output rows into tasks, the choice of
 * the ISA's kernel (matmul_scalar.c, matmul_avx2.c, matmul_avx512.c), and the thread pool that
 * runs the tasks.  Batch invariance (matmul.h) rests on three things here: x is quantised row
 * by row with nothing shared between rows, tasks split the output rows only, and every kernel
 * computes each output element with the same instructions in the same order whatever tile it
 * falls in. */
#include "model/matmul_int.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "attn/attn_int.h" /* kvc__isa_resolve */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* ---- types ------------------------------------------------------------------ */
/* ACT_Q4_0: Q8_0 blocks and their offsets (matmul_int.h) */
typedef enum { ACT_NONE, ACT_Q8_0, ACT_Q4_0, ACT_Q8_K } act_t;

static const struct {
    uint32_t type, block, bytes;
    act_t act;
} types[] = {
    {KVC_GGML_F32, 1, 4, ACT_NONE},
    {KVC_GGML_F16, 1, 2, ACT_NONE},
    {KVC_GGML_BF16, 1, 2, ACT_NONE},
    {KVC_GGML_Q8_0, KVC__QK, KVC__Q8_0_B, ACT_Q8_0},
    {KVC_GGML_Q4_0, KVC__QK, KVC__Q4_0_B, ACT_Q4_0},
    {KVC_GGML_Q4_K, KVC__QK_K, KVC__Q4_K_B, ACT_Q8_K},
    {KVC_GGML_Q6_K, KVC__QK_K, KVC__Q6_K_B, ACT_Q8_K},
};

static int type_index(uint32_t type)
{
    for (size_t i = 0; i < KVC_ARRAY_LEN(types); i++)
        if (types[i].type == type) return (int)i;
    return -1;
}

bool kvc_matmul_type_supported(uint32_t type)
{
    return type_index(type) >= 0;
}

/* 0 for a usable matrix, KVC_ENOTSUP for a type the kernels do not take, else KVC_EINVAL. */
static int mat_check(const kvc_mat_t *w)
{
    if (!w) return KVC_EINVAL;
    int t = type_index(w->type);
    if (t < 0) return KVC_ENOTSUP;
    if (!w->data || w->n_in == 0 || w->n_out == 0 || w->n_in % types[t].block) return KVC_EINVAL;
    if (w->row_bytes < (size_t)(w->n_in / types[t].block) * types[t].bytes) return KVC_EINVAL;
    return 0;
}

int kvc_mat_from_tensor(const kvc_gguf_tensor_t *t, kvc_mat_t *out)
{
    if (!t || !out || t->n_dims != 2 || !t->data) return KVC_EINVAL;
    int ti = type_index(t->type);
    if (ti < 0) return KVC_ENOTSUP;
    if (t->ne[0] == 0 || t->ne[1] == 0 || t->ne[0] > UINT32_MAX || t->ne[1] > UINT32_MAX ||
        t->ne[0] % types[ti].block)
        return KVC_EINVAL;
    const size_t row = (size_t)(t->ne[0] / types[ti].block) * types[ti].bytes;
    if (t->bytes / t->ne[1] < row) return KVC_EINVAL;
    *out = (kvc_mat_t){.type = t->type,
                       .data = t->data,
                       .n_in = (uint32_t)t->ne[0],
                       .n_out = (uint32_t)t->ne[1],
                       .row_bytes = row};
    return 0;
}

/* Bytes of one row of quantised activations (0: none), a multiple of 64. */
static size_t act_row_bytes(const kvc_mat_t *w)
{
    const act_t act = types[type_index(w->type)].act;
    if (act == ACT_NONE) return 0;
    size_t n = w->n_in;
    if (act == ACT_Q8_0)
        n += sizeof(float) * (w->n_in / KVC__QK);
    else if (act == ACT_Q4_0)
        n += sizeof(float) * (w->n_in / KVC__QK) + sizeof(int32_t) * (w->n_in / 4) +
             sizeof(int32_t) * (w->n_in / KVC__QK);
    else
        n += sizeof(float) * (w->n_in / KVC__QK_K) + sizeof(int16_t) * (w->n_in / 16) +
             sizeof(int16_t) * (w->n_in / 32);
    return (n + 63) & ~(size_t)63;
}

size_t kvc_matmul_workspace_bytes(const kvc_mat_t *w, uint32_t n_rows)
{
    if (mat_check(w)) return 0;
    const size_t row = act_row_bytes(w);
    if (row && n_rows > SIZE_MAX / row) return SIZE_MAX; /* cannot be allocated */
    return row * n_rows;
}

/* ---- activations -------------------------------------------------------------- */
/* Quantise n (32 or 256) values to int8 with d = amax / 127, round to nearest even; a block
 * with a NaN or an infinity gets q = 0 and d = NaN. */
static float quant_block(const float *x, int8_t *q, uint32_t n)
{
    float amax = 0;
    bool finite = true;
    for (uint32_t i = 0; i < n; i++) {
        finite &= isfinite(x[i]) != 0;
        amax = fmaxf(amax, fabsf(x[i]));
    }
    if (!finite) {
        memset(q, 0, n);
        return NAN;
    }
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        float v = nearbyintf(x[i] * id);
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        q[i] = isnan(v) ? 0 : (int8_t)v; /* NaN: 0 * id where 1 / d overflowed (amax subnormal) */
    }
    return d;
}

static void quantize_rows(const kvc_mat_t *w, const float *x, uint32_t n_rows, uint8_t *ws,
                          kvc_isa_t use)
{
    float (*quant)(const float *, int8_t *, uint32_t) =
        use == KVC_ISA_SCALAR ? quant_block : kvc__mm_quant_block_avx2;
    const act_t act = types[type_index(w->type)].act;
    const size_t stride = act_row_bytes(w);
    const uint32_t n = w->n_in, qb = act == ACT_Q8_K ? KVC__QK_K : KVC__QK;
    for (uint32_t r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)r * n;
        uint8_t *row = ws + (size_t)r * stride;
        int8_t *q = (int8_t *)row;
        float *d = (float *)(row + n);
        for (uint32_t b = 0; b < n / qb; b++) d[b] = quant(xr + b * qb, q + b * qb, qb);
        if (act == ACT_Q8_K) {
            int16_t *bs = (int16_t *)(row + n + sizeof(float) * (n / KVC__QK_K));
            for (uint32_t g = 0; g < n / 16; g++) {
                int s = 0;
                for (int i = 0; i < 16; i++) s += q[16 * g + i];
                bs[g] = (int16_t)s;
            }
            for (uint32_t g = 0; g < n / 32; g++)
                bs[n / 16 + g] = (int16_t)(bs[2 * g] + bs[2 * g + 1]);
        }
        if (act == ACT_Q4_0) {
            int32_t *off = (int32_t *)(row + n + sizeof(float) * (n / KVC__QK));
            for (uint32_t g = 0; g < n / 4; g++)
                off[g] = 8 * (q[4 * g] + q[4 * g + 1] + q[4 * g + 2] + q[4 * g + 3]);
            for (uint32_t b = 0; b < n / KVC__QK; b++) {
                int32_t s = 0;
                for (int g = 0; g < 8; g++) s += off[8 * b + (uint32_t)g];
                off[n / 4 + b] = s;
            }
        }
    }
}

/* ---- calls ---------------------------------------------------------------------- */
/* Output rows per task.  A packed matrix's decode call (one row of x) takes longer tasks:
 * its single-row tiles read the task's weights as two sequential streams, and one of them
 * starts cold in every task, which on 1280-element rows cost 10-16% of the GEMV's rate at
 * 48 rows a task (bench_matmul-like A/B, 1 thread); still at least 8 tasks, so that two
 * threads stay balanced.  Tiles never change an output's bits, so neither does this. */
static uint32_t chunk_of(const kvc_mat_t *w, uint32_t n_rows)
{
    if (w->n_out < 8 * KVC__MM_CHUNK) return KVC__MM_CHUNK_SMALL;
    if (n_rows == 1 && w->packed)
        for (uint32_t c = 4 * KVC__MM_CHUNK; c > KVC__MM_CHUNK; c /= 2)
            if (w->n_out >= 8 * c) return c;
    return KVC__MM_CHUNK;
}

uint32_t kvc_matmul_n_tasks(const kvc_mat_t *w, uint32_t n_rows)
{
    if (mat_check(w) || n_rows == 0) return 0;
    const uint32_t c = chunk_of(w, n_rows);
    return (uint32_t)(((uint64_t)w->n_out + c - 1) / c);
}

static int check_call(const kvc_mat_t *w, const float *x, uint32_t n_rows, kvc_isa_t isa,
                      const void *ws, size_t ws_bytes, kvc_isa_t *use)
{
    int rc = mat_check(w);
    if (rc == KVC_ENOTSUP && (!x || n_rows == 0)) rc = KVC_EINVAL;
    if (rc) return rc;
    if (!x || n_rows == 0) return KVC_EINVAL;
    if ((rc = kvc__isa_resolve(isa, use))) return rc;
    const size_t need = kvc_matmul_workspace_bytes(w, n_rows);
    /* the scales and sums in it are read as float, int16 and int32 */
    if (need && (!ws || ws_bytes < need || (uintptr_t)ws % 4)) return KVC_EINVAL;
    return 0;
}

int kvc_matmul_prepare(const kvc_mat_t *w, const float *x, uint32_t n_rows, kvc_isa_t isa, void *ws,
                       size_t ws_bytes)
{
    kvc_isa_t use;
    int rc = check_call(w, x, n_rows, isa, ws, ws_bytes, &use);
    if (rc) return rc;
    if (act_row_bytes(w)) quantize_rows(w, x, n_rows, ws, use);
    return 0;
}

/* ---- packing ------------------------------------------------------------------------ */
/* The unit size of a packable type (matmul_int.h), 0 for the others. */
static size_t pack_unit(uint32_t type)
{
    return type == KVC_GGML_Q8_0   ? KVC__PK_Q8_0_U
           : type == KVC_GGML_Q4_0 ? KVC__PK_Q4_0_U
           : type == KVC_GGML_Q4_K ? KVC__PK_Q4_K_U
                                   : 0;
}

size_t kvc_mat_pack_bytes(const kvc_mat_t *w)
{
    if (mat_check(w) || !pack_unit(w->type)) return 0;
    const uint32_t qb = w->type == KVC_GGML_Q4_K ? KVC__QK_K : KVC__QK;
    const size_t groups = ((size_t)w->n_out + KVC__PK_ROWS - 1) / KVC__PK_ROWS;
    size_t units, bytes;
    if (__builtin_mul_overflow(groups, (size_t)(w->n_in / qb), &units) ||
        __builtin_mul_overflow(units, pack_unit(w->type), &bytes) || bytes > SIZE_MAX - 63)
        return 0; /* no such matrix fits in memory */
    return (bytes + 63) & ~(size_t)63;
}

/* One unit: block b of rows 8g.. (rows from n_out on are zero). */
static void pack_unit_at(const kvc_mat_t *w, uint32_t g, uint32_t b, uint8_t *u)
{
    const size_t unit = pack_unit(w->type);
    memset(u, 0, unit);
    for (uint32_t k = 0; k < KVC__PK_ROWS; k++) {
        const uint32_t o = g * KVC__PK_ROWS + k;
        if (o >= w->n_out) break;
        const uint8_t *row = (const uint8_t *)w->data + (size_t)o * w->row_bytes;
        if (w->type == KVC_GGML_Q8_0) {
            const uint8_t *blk = row + (size_t)b * KVC__Q8_0_B;
            memcpy(u + 2 * k, blk, 2);
            for (int c = 0; c < 8; c++) memcpy(u + 16 + 32 * c + 4 * k, blk + 2 + 4 * c, 4);
        } else if (w->type == KVC_GGML_Q4_0) {
            const uint8_t *blk = row + (size_t)b * KVC__Q4_0_B;
            memcpy(u + 2 * k, blk, 2);
            for (int c = 0; c < 4; c++) memcpy(u + 16 + 32 * c + 4 * k, blk + 2 + 4 * c, 4);
        } else {
            const uint8_t *blk = row + (size_t)b * KVC__Q4_K_B;
            memcpy(u + 2 * k, blk, 2);
            memcpy(u + 16 + 2 * k, blk + 2, 2);
            for (int p = 0; p < 4; p++) {
                uint8_t s0, m0, s1, m1;
                kvc__q4k_scale_min(2 * p, blk + 4, &s0, &m0);
                kvc__q4k_scale_min(2 * p + 1, blk + 4, &s1, &m1);
                u[32 + 16 * p + 2 * k] = s0;
                u[32 + 16 * p + 2 * k + 1] = s1;
                u[96 + 16 * p + 2 * k] = m0;
                u[96 + 16 * p + 2 * k + 1] = m1;
                for (int c = 0; c < 8; c++)
                    memcpy(u + 160 + 32 * (8 * p + c) + 4 * k, blk + 16 + 32 * p + 4 * c, 4);
            }
        }
    }
}

int kvc_mat_pack(kvc_mat_t *w, void *dst, size_t bytes)
{
    if (!w || !dst || mat_check(w)) return KVC_EINVAL;
    if (!pack_unit(w->type)) return KVC_ENOTSUP;
    const size_t need = kvc_mat_pack_bytes(w);
    if (bytes < need || (uintptr_t)dst % 64) return KVC_EINVAL;
    const uint32_t nb = w->n_in / (w->type == KVC_GGML_Q4_K ? KVC__QK_K : KVC__QK);
    const uint32_t groups = (w->n_out + KVC__PK_ROWS - 1) / KVC__PK_ROWS;
    uint8_t *out = dst;
    for (uint32_t g = 0; g < groups; g++)
        for (uint32_t b = 0; b < nb; b++)
            pack_unit_at(w, g, b, out + ((size_t)g * nb + b) * pack_unit(w->type));
    memset(out + (size_t)groups * nb * pack_unit(w->type), 0,
           need - (size_t)groups * nb * pack_unit(w->type));
    w->packed = dst;
    return 0;
}

static void run_job(kvc_isa_t use, const kvc__mm_job_t *j)
{
    if (use != KVC_ISA_SCALAR && j->w->packed && pack_unit(j->w->type))
        kvc__mm_avx2_packed(j);
    else if (use == KVC_ISA_AVX512)
        kvc__mm_avx512(j);
    else if (use == KVC_ISA_AVX2)
        kvc__mm_avx2(j);
    else
        kvc__mm_scalar(j);
}

void kvc_matmul_task(const kvc_mat_t *w, const float *x, uint32_t n_rows, float *y, kvc_isa_t isa,
                     const void *ws, uint32_t task)
{
    kvc_isa_t use;
    if (mat_check(w) || !x || !y || n_rows == 0 || kvc__isa_resolve(isa, &use)) return;
    const uint32_t c = chunk_of(w, n_rows);
    if (task >= kvc_matmul_n_tasks(w, n_rows)) return;
    const uint32_t o0 = task * c, o1 = KVC_MIN(w->n_out, o0 + c);
    const kvc__mm_job_t j = {.w = w,
                             .x = x,
                             .n_rows = n_rows,
                             .y = y,
                             .ws = ws,
                             .ws_row = act_row_bytes(w),
                             .o0 = o0,
                             .o1 = o1};
    run_job(use, &j);
}

typedef struct {
    const kvc_mat_t *w;
    const float *x;
    uint32_t n_rows;
    float *y;
    kvc_isa_t isa;
    const void *ws;
} call_t;

static void call_task(void *ctx, uint32_t task, uint32_t thread)
{
    (void)thread;
    const call_t *c = ctx;
    kvc_matmul_task(c->w, c->x, c->n_rows, c->y, c->isa, c->ws, task);
}

int kvc_matmul(const kvc_mat_t *w, const float *x, uint32_t n_rows, float *y, kvc_isa_t isa,
               kvc_threadpool_t *tp, void *ws, size_t ws_bytes)
{
    if (!y) return KVC_EINVAL;
    kvc_isa_t use;
    int rc = kvc_matmul_prepare(w, x, n_rows, isa, ws, ws_bytes);
    if (rc) return rc;
    (void)kvc__isa_resolve(isa, &use);
    call_t c = {.w = w, .x = x, .n_rows = n_rows, .y = y, .isa = use, .ws = ws};
    kvc_threadpool_run(tp, call_task, &c, kvc_matmul_n_tasks(w, n_rows));
    return 0;
}

/* ---- several matrices over one x ------------------------------------------------------- */
/* For each matrix, the offset of its quantised activations in the workspace (matrices with the
 * same activation layout share them); the total through *total.  -1 for invalid arguments. */
static int multi_layout(const kvc_mat_t *const *w, uint32_t n, uint32_t n_rows, size_t off[],
                        size_t *total)
{
    if (!w || n == 0 || n > KVC_MATMUL_MULTI_MAX || n_rows == 0) return -1;
    size_t t = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!w[i] || mat_check(w[i]) || w[i]->n_in != w[0]->n_in) return -1;
        const act_t act = types[type_index(w[i]->type)].act;
        off[i] = SIZE_MAX;
        for (uint32_t k = 0; k < i; k++)
            if (types[type_index(w[k]->type)].act == act) off[i] = off[k];
        if (off[i] != SIZE_MAX) continue;
        const size_t b = kvc_matmul_workspace_bytes(w[i], n_rows);
        if (b == SIZE_MAX || t > SIZE_MAX - b) return -2;
        off[i] = t;
        t += b;
    }
    *total = t;
    return 0;
}

size_t kvc_matmul_multi_workspace_bytes(const kvc_mat_t *const *w, uint32_t n_mats, uint32_t n_rows)
{
    size_t off[KVC_MATMUL_MULTI_MAX], total;
    const int rc = multi_layout(w, n_mats, n_rows, off, &total);
    return rc == -2 ? SIZE_MAX : rc ? 0 : total;
}

typedef struct {
    const kvc_mat_t *const *w;
    float *const *y;
    const uint8_t *ws[KVC_MATMUL_MULTI_MAX];
    uint32_t first[KVC_MATMUL_MULTI_MAX + 1]; /* matrix i has tasks [first[i], first[i + 1]) */
    uint32_t n;
    const float *x;
    uint32_t n_rows;
    kvc_isa_t isa;
} multi_t;

static void multi_task(void *ctx, uint32_t task, uint32_t thread)
{
    (void)thread;
    const multi_t *c = ctx;
    uint32_t i = 0;
    while (task >= c->first[i + 1]) i++;
    kvc_matmul_task(c->w[i], c->x, c->n_rows, c->y[i], c->isa, c->ws[i], task - c->first[i]);
}

int kvc_matmul_multi(const kvc_mat_t *const *w, float *const *y, uint32_t n_mats, const float *x,
                     uint32_t n_rows, kvc_isa_t isa, kvc_threadpool_t *tp, void *ws,
                     size_t ws_bytes)
{
    size_t off[KVC_MATMUL_MULTI_MAX], total;
    const int lr = multi_layout(w, n_mats, n_rows, off, &total);
    if (lr || !y || !x) {
        /* a type the kernels do not take is KVC_ENOTSUP, as kvc_matmul has it */
        if (w && n_mats && n_mats <= KVC_MATMUL_MULTI_MAX && x && n_rows)
            for (uint32_t i = 0; i < n_mats; i++)
                if (w[i] && mat_check(w[i]) == KVC_ENOTSUP) return KVC_ENOTSUP;
        return KVC_EINVAL;
    }
    if (total && (!ws || ws_bytes < total || (uintptr_t)ws % 4)) return KVC_EINVAL;
    kvc_isa_t use;
    int rc = kvc__isa_resolve(isa, &use);
    if (rc) return rc;
    for (uint32_t i = 0; i < n_mats; i++)
        if (!y[i]) return KVC_EINVAL;
    multi_t c = {.w = w, .y = y, .n = n_mats, .x = x, .n_rows = n_rows, .isa = use};
    c.first[0] = 0;
    for (uint32_t i = 0; i < n_mats; i++) {
        uint8_t *wi = ws ? (uint8_t *)ws + off[i] : NULL; /* NULL: no type here needs one */
        c.ws[i] = wi;
        bool done = false; /* the same layout as an earlier matrix: quantised already */
        for (uint32_t k = 0; k < i; k++) done |= off[k] == off[i];
        if (!done && act_row_bytes(w[i])) quantize_rows(w[i], x, n_rows, wi, use);
        c.first[i + 1] = c.first[i] + kvc_matmul_n_tasks(w[i], n_rows);
    }
    kvc_threadpool_run(tp, multi_task, &c, c.first[n_mats]);
    return 0;
}

const char *kvc_matmul_kernel_name(uint32_t type, kvc_isa_t isa)
{
    (void)type; /* every type has a kernel on every ISA */
    kvc_isa_t use;
    if (kvc__isa_resolve(isa, &use)) return "?";
    return use == KVC_ISA_AVX512 ? "avx512" : use == KVC_ISA_AVX2 ? "avx2" : "scalar";
}

/* ---- the thread pool -------------------------------------------------------------
 * A job is published in three moves: `claim` is closed (the new generation's number with
 * no task claimable), the job's fields are written, `claim` opens at task 0, and `gen` is
 * bumped to wake the workers.  Tasks are taken by compare-and-swap on `claim`, which holds
 * the generation next to the task index, so a worker that slept through a job (or several)
 * can never take a task of a job it did not read the fields of: its swap fails as soon as
 * the generation moved.  The caller waits for the job's tasks to be done, never for the
 * workers to check in: a worker the OS has not scheduled costs the job nothing (the caller
 * and the others take its share), which matters on a machine with more threads than free
 * cores.  Workers spin a while on `gen` and then sleep on a condition variable; the
 * publisher only takes the mutex when someone sleeps (sleepers are counted under the mutex,
 * and both sides use sequentially consistent accesses, so that one of them always sees the
 * other; the same holds for `done` and `waiter`). */
#define SPIN_ITERS 20000 /* pause loops before sleeping: some 100 us */

/* One step of a spin-wait; now and then it yields, so that a pool with more threads than free
 * cores does not wait for the time slices of spinning threads. */
static inline void spin(int i)
{
    if (i % 256 == 255)
        sched_yield();
    else
        cpu_relax();
}

struct kvc_threadpool {
    kvc_allocator_t alloc;
    uint32_t n_threads;
    pthread_t *threads; /* n_threads - 1 */
    pthread_mutex_t mu;
    pthread_cond_t wake, done_cv;
    atomic_uint_fast64_t gen;
    _Atomic uint64_t claim; /* (generation << 32) | next task; task CLOSED: none to take */
    atomic_uint done;       /* tasks of the current job finished */
    atomic_uint sleepers;   /* workers waiting on `wake` */
    atomic_bool waiter;     /* the caller waits on `done_cv` */
    atomic_bool stop;
    _Atomic(kvc_task_fn) fn;
    _Atomic(void *) ctx;
    atomic_uint n_tasks;
    struct worker {
        kvc_threadpool_t *tp;
        uint32_t id;
    } * workers;
};

#define CLOSED 0xFFFFFFFFu

/* Take and run tasks of generation g until none is left (or the pool moved on). */
static void run_tasks(kvc_threadpool_t *tp, uint32_t thread, uint64_t g)
{
    const uint64_t tag = (g & 0xFFFFFFFFu) << 32;
    uint64_t c = atomic_load(&tp->claim);
    for (;;) {
        if ((c & ~(uint64_t)0xFFFFFFFFu) != tag) return;
        const uint32_t t = (uint32_t)c,
                       n = atomic_load_explicit(&tp->n_tasks, memory_order_relaxed);
        if (t == CLOSED || t >= n) return;
        /* the fields are this generation's: `claim` opened after they were written, and the
         * next job closes it before writing its own, which makes the swap below fail */
        const kvc_task_fn fn = atomic_load_explicit(&tp->fn, memory_order_relaxed);
        void *const ctx = atomic_load_explicit(&tp->ctx, memory_order_relaxed);
        if (!atomic_compare_exchange_weak(&tp->claim, &c, c + 1)) continue;
        fn(ctx, t, thread);
        if (atomic_fetch_add(&tp->done, 1) + 1 == n && atomic_load(&tp->waiter)) {
            pthread_mutex_lock(&tp->mu);
            pthread_cond_signal(&tp->done_cv);
            pthread_mutex_unlock(&tp->mu);
        }
        c = atomic_load(&tp->claim);
    }
}

static void *worker_main(void *arg)
{
    struct worker *wk = arg;
    kvc_threadpool_t *tp = wk->tp;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = atomic_load(&tp->gen);
        for (int i = 0; g == seen && i < SPIN_ITERS; i++) {
            spin(i);
            g = atomic_load(&tp->gen);
        }
        if (g == seen) {
            pthread_mutex_lock(&tp->mu);
            atomic_fetch_add(&tp->sleepers, 1);
            while ((g = atomic_load(&tp->gen)) == seen) pthread_cond_wait(&tp->wake, &tp->mu);
            atomic_fetch_sub(&tp->sleepers, 1);
            pthread_mutex_unlock(&tp->mu);
        }
        seen = g;
        if (atomic_load(&tp->stop)) return NULL;
        run_tasks(tp, wk->id, g);
    }
}

/* Publish a new generation (a job, its fields written under a closed claim, or the stop) and
 * wake sleepers; returns the generation. */
static uint64_t publish(kvc_threadpool_t *tp)
{
    const uint64_t g = atomic_load(&tp->gen) + 1;
    atomic_store(&tp->claim, ((g & 0xFFFFFFFFu) << 32) | 0u);
    atomic_store(&tp->gen, g);
    if (atomic_load(&tp->sleepers)) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->wake);
        pthread_mutex_unlock(&tp->mu);
    }
    return g;
}

/* Close the claim for the next generation before its fields change. */
static void close_claim(kvc_threadpool_t *tp)
{
    const uint64_t g = atomic_load(&tp->gen) + 1;
    atomic_store(&tp->claim, ((g & 0xFFFFFFFFu) << 32) | CLOSED);
}

static void stop_workers(kvc_threadpool_t *tp, uint32_t n_started)
{
    atomic_store(&tp->stop, true);
    close_claim(tp);
    atomic_store(&tp->n_tasks, 0);
    (void)publish(tp);
    for (uint32_t i = 0; i < n_started; i++) pthread_join(tp->threads[i], NULL);
}

int kvc_threadpool_create(uint32_t n_threads, const kvc_allocator_t *a, kvc_threadpool_t **out)
{
    if (!out) return KVC_EINVAL;
    *out = NULL;
    if (n_threads == 0 || n_threads > 1024) return KVC_EINVAL;
    kvc_threadpool_t *tp = kvc_calloc(a, 1, sizeof *tp, 64);
    if (!tp) return KVC_ENOMEM;
    if (a) tp->alloc = *a;
    tp->n_threads = n_threads;
    atomic_init(&tp->gen, 0);
    atomic_init(&tp->claim, CLOSED);
    atomic_init(&tp->done, 0);
    atomic_init(&tp->n_tasks, 0);
    atomic_init(&tp->fn, NULL);
    atomic_init(&tp->ctx, NULL);
    atomic_init(&tp->sleepers, 0);
    atomic_init(&tp->waiter, false);
    atomic_init(&tp->stop, false);
    if (n_threads == 1) {
        *out = tp;
        return 0;
    }
    tp->threads = kvc_calloc(a, n_threads - 1, sizeof *tp->threads, 8);
    tp->workers = kvc_calloc(a, n_threads - 1, sizeof *tp->workers, 8);
    if (!tp->threads || !tp->workers) {
        kvc_free(a, tp->threads);
        kvc_free(a, tp->workers);
        kvc_free(a, tp);
        return KVC_ENOMEM;
    }
    if (pthread_mutex_init(&tp->mu, NULL)) goto fail_mu;
    if (pthread_cond_init(&tp->wake, NULL)) goto fail_wake;
    if (pthread_cond_init(&tp->done_cv, NULL)) goto fail_done;
    for (uint32_t i = 0; i < n_threads - 1; i++) {
        tp->workers[i] = (struct worker){.tp = tp, .id = i + 1};
        if (pthread_create(&tp->threads[i], NULL, worker_main, &tp->workers[i])) {
            stop_workers(tp, i);
            pthread_cond_destroy(&tp->done_cv);
            goto fail_done;
        }
    }
    *out = tp;
    return 0;
fail_done:
    pthread_cond_destroy(&tp->wake);
fail_wake:
    pthread_mutex_destroy(&tp->mu);
fail_mu:
    kvc_free(a, tp->threads);
    kvc_free(a, tp->workers);
    kvc_free(a, tp);
    return KVC_EIO;
}

void kvc_threadpool_destroy(kvc_threadpool_t *tp)
{
    if (!tp) return;
    if (tp->n_threads > 1) {
        stop_workers(tp, tp->n_threads - 1);
        pthread_cond_destroy(&tp->done_cv);
        pthread_cond_destroy(&tp->wake);
        pthread_mutex_destroy(&tp->mu);
    }
    const kvc_allocator_t a = tp->alloc;
    kvc_free(&a, tp->threads);
    kvc_free(&a, tp->workers);
    kvc_free(&a, tp);
}

uint32_t kvc_threadpool_size(const kvc_threadpool_t *tp)
{
    return tp ? tp->n_threads : 1;
}

void kvc_threadpool_run(kvc_threadpool_t *tp, kvc_task_fn fn, void *ctx, uint32_t n_tasks)
{
    if (n_tasks == 0 || !fn) return;
    if (!tp || tp->n_threads == 1 || n_tasks == 1) {
        for (uint32_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    close_claim(tp);
    atomic_store_explicit(&tp->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&tp->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&tp->n_tasks, n_tasks, memory_order_relaxed);
    atomic_store(&tp->done, 0);
    const uint64_t g = publish(tp);
    run_tasks(tp, 0, g);
    for (int i = 0; atomic_load(&tp->done) < n_tasks && i < SPIN_ITERS; i++) spin(i);
    if (atomic_load(&tp->done) < n_tasks) {
        pthread_mutex_lock(&tp->mu);
        atomic_store(&tp->waiter, true);
        while (atomic_load(&tp->done) < n_tasks) pthread_cond_wait(&tp->done_cv, &tp->mu);
        atomic_store(&tp->waiter, false);
        pthread_mutex_unlock(&tp->mu);
    }
}
