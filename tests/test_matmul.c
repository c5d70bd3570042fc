/* test_matmul.c - the engine's matrix kernels and thread pool (kvcache/matmul.h).
 *
 * With --isa NAME (one ctest entry per variant: matmul.scalar, matmul.avx2, matmul.avx512),
 * every weight type on that ISA's kernel:
 *   - against a double-precision reference computed here from the blocks' own fields (and
 *     checked against kvc_ggml_dequantize_row, the layout truth), over the activations
 *     quantised per row as matmul_int.h specifies (quantised here independently, and compared
 *     with what kvc_matmul_prepare wrote byte for byte), and against the f32 activations with
 *     the bound the activation rounding allows;
 *   - batch invariance, bit for bit: each row's outputs the same for every n_rows, at every row
 *     position among random other rows, for 1, 2, 3 and 8 threads, and through prepare + tasks
 *     run in any order.
 * Without an argument: the ISA-independent tests (argument checks, workspace sizes, matrices
 * from tensors, the thread pool). */
#include "test_helpers.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "isa_variant.h"
#include "kvcache/matmul.h"
#include "kvcache/model.h"
#include "model/matmul_int.h"

static const kvc_test_variant_t *variant;
static kvc_isa_t ISA = KVC_ISA_SCALAR;
static bool PACK; /* make_mat packs the matrices that have a packed form */

static const uint32_t TYPES[] = {KVC_GGML_F32,  KVC_GGML_F16,  KVC_GGML_BF16, KVC_GGML_Q8_0,
                                 KVC_GGML_Q4_0, KVC_GGML_Q4_K, KVC_GGML_Q6_K};

/* ---- helpers --------------------------------------------------------------------- */
static float frand(kvc_rng_t *r)
{
    return (float)(kvc_rng_double(r) * 2.0 - 1.0);
}

static void fill(kvc_rng_t *r, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = frand(r);
        if (kvc_rng_below(r, 64) == 0) x[i] *= 8.0f; /* an outlier now and then */
    }
}

static uint32_t block_of(uint32_t type)
{
    uint32_t be = 0, bb = 0;
    assert_ok(kvc_ggml_type_size(type, &be, &bb));
    return be;
}

typedef struct {
    kvc_mat_t m;
    uint8_t *buf;
    void *packed; /* kvc_mat_pack's copy, when PACK */
    double *ref;  /* (n_out, n_in) the weights, from the blocks' fields in double */
    double *mag;  /* |each weight's terms| (for Q4_K: |d sc q| + |dmin m|), for the bounds */
} tmat_t;

static double h2d(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return (double)kvc_f16_to_f32(h);
}

/* The weights of one row, in double, from the block fields (ggml_quant.c's layouts). */
static void ref_row(uint32_t type, const uint8_t *p, uint32_t n, double *w, double *mag)
{
    for (uint32_t i = 0; i < n; i++) {
        switch (type) {
        case KVC_GGML_F32: {
            float f;
            memcpy(&f, p + 4 * i, 4);
            w[i] = f;
            break;
        }
        case KVC_GGML_F16:
            w[i] = h2d(p + 2 * i);
            break;
        case KVC_GGML_BF16: {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            w[i] = (double)kvc_bf16_to_f32(h);
            break;
        }
        case KVC_GGML_Q8_0: {
            const uint8_t *b = p + (i / 32) * 34;
            w[i] = h2d(b) * (int8_t)b[2 + i % 32];
            break;
        }
        case KVC_GGML_Q4_0: {
            const uint8_t *b = p + (i / 32) * 18;
            const uint32_t k = i % 32;
            const int q = k < 16 ? (b[2 + k] & 0xF) : (b[2 + k - 16] >> 4);
            w[i] = h2d(b) * (q - 8);
            break;
        }
        case KVC_GGML_Q4_K: {
            const uint8_t *b = p + (i / 256) * 144;
            const uint32_t k = i % 256, sub = k / 32;
            uint8_t sc, m;
            kvc__q4k_scale_min((int)sub, b + 4, &sc, &m);
            const uint8_t byte = b[16 + 32 * (sub / 2) + k % 32];
            const int q = sub % 2 ? byte >> 4 : byte & 0xF;
            const double a = h2d(b) * sc * q, c = h2d(b + 2) * m;
            w[i] = a - c;
            mag[i] = fabs(a) + fabs(c);
            continue;
        }
        default: { /* Q6_K */
            const uint8_t *b = p + (i / 256) * 210;
            const uint32_t k = i % 256, half = k / 128, l = k % 32, t = (k % 128) / 32;
            const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
            const int lo = t == 0   ? ql[l] & 0xF
                           : t == 1 ? ql[l + 32] & 0xF
                           : t == 2 ? ql[l] >> 4
                                    : ql[l + 32] >> 4;
            const int hi = (qh[l] >> (2 * t)) & 3;
            const int8_t sc = (int8_t)b[192 + k / 16];
            w[i] = h2d(b + 208) * sc * ((lo | (hi << 4)) - 32);
            break;
        }
        }
        mag[i] = fabs(w[i]);
    }
}

static tmat_t make_mat(uint32_t type, uint32_t n_in, uint32_t n_out, size_t pad, kvc_rng_t *r)
{
    uint32_t be = 0, bb = 0;
    assert_ok(kvc_ggml_type_size(type, &be, &bb));
    const size_t row = (size_t)n_in / be * bb + pad;
    tmat_t t = {.m = {.type = type, .n_in = n_in, .n_out = n_out, .row_bytes = row}};
    t.buf = malloc(row * n_out + 1);
    t.ref = malloc(sizeof(double) * n_in * n_out);
    t.mag = malloc(sizeof(double) * n_in * n_out);
    float *f = malloc(sizeof(float) * n_in), *back = malloc(sizeof(float) * n_in);
    assert_non_null(t.buf);
    memset(t.buf, 0xa5, row * n_out + 1);
    for (uint32_t o = 0; o < n_out; o++) {
        fill(r, f, n_in);
        uint8_t *p = t.buf + (size_t)o * row;
        assert_ok(kvc_ggml_quantize_row(type, f, p, n_in));
        ref_row(type, p, n_in, t.ref + (size_t)o * n_in, t.mag + (size_t)o * n_in);
        /* the reference reads the layout as ggml_quant.c's dequantiser does */
        assert_ok(kvc_ggml_dequantize_row(type, p, back, n_in));
        for (uint32_t i = 0; i < n_in; i++) {
            const double w = t.ref[(size_t)o * n_in + i];
            if (fabs(back[i] - w) > 1e-6 * t.mag[(size_t)o * n_in + i] + 1e-30)
                fail_msg("%s: reference weight %u of row %u is %g, dequantizer says %g",
                         kvc_ggml_type_name(type), i, o, w, (double)back[i]);
        }
    }
    t.m.data = t.buf;
    const size_t pb = kvc_mat_pack_bytes(&t.m);
    assert_int_equal(pb != 0,
                     type == KVC_GGML_Q8_0 || type == KVC_GGML_Q4_0 || type == KVC_GGML_Q4_K);
    if (PACK && pb) {
        t.packed = aligned_alloc(64, pb);
        assert_ok(kvc_mat_pack(&t.m, t.packed, pb));
        assert_ptr_equal(t.m.packed, t.packed);
    }
    free(f);
    free(back);
    return t;
}

static void free_mat(tmat_t *t)
{
    free(t->buf);
    free(t->packed);
    free(t->ref);
    free(t->mag);
}

static bool int_path(uint32_t type)
{
    return type == KVC_GGML_Q8_0 || type == KVC_GGML_Q4_0 || type == KVC_GGML_Q4_K ||
           type == KVC_GGML_Q6_K;
}
static uint32_t act_block(uint32_t type)
{
    return type == KVC_GGML_Q4_K || type == KVC_GGML_Q6_K ? 256 : 32;
}

/* The per-row activation quantisation of matmul_int.h, written again here: d = amax / 127,
 * q = round to nearest even of x * (1 / d), in [-127, 127]. */
static void ref_act(uint32_t type, const float *x, uint32_t n, int8_t *q, float *d)
{
    const uint32_t qb = act_block(type);
    for (uint32_t b = 0; b < n / qb; b++) {
        float amax = 0;
        for (uint32_t i = 0; i < qb; i++) amax = fmaxf(amax, fabsf(x[b * qb + i]));
        d[b] = amax / 127.0f;
        const float id = d[b] != 0 ? 1.0f / d[b] : 0.0f;
        for (uint32_t i = 0; i < qb; i++) {
            float v = nearbyintf(x[b * qb + i] * id);
            q[b * qb + i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
    }
}

static void *ws_for(const kvc_mat_t *m, uint32_t n_rows, size_t *bytes)
{
    *bytes = kvc_matmul_workspace_bytes(m, n_rows);
    return *bytes ? aligned_alloc(64, (*bytes + 63) & ~(size_t)63) : NULL;
}

/* y = x W^T on the variant's ISA through kvc_matmul. */
static void mm(const kvc_mat_t *m, const float *x, uint32_t n_rows, float *y, kvc_threadpool_t *tp)
{
    size_t wsb;
    void *ws = ws_for(m, n_rows, &wsb);
    assert_ok(kvc_matmul(m, x, n_rows, y, ISA, tp, ws, wsb));
    free(ws);
}

static void assert_rows_identical(const float *a, const float *b, uint32_t n, const char *what,
                                  uint32_t type, uint32_t row)
{
    if (memcmp(a, b, sizeof(float) * n) == 0) return;
    for (uint32_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)))
            fail_msg("%s %s: row %u output %u: %.9g vs %.9g", kvc_ggml_type_name(type), what, row,
                     i, (double)a[i], (double)b[i]);
}

/* ---- the reference ------------------------------------------------------------------ */
/* Tolerances.  The integer paths' block dot products are exact (int32), so what is left is
 * float rounding: the product of the two scales (one rounding), the int -> float conversion of
 * a lane (exact below 2^24), one FMA per block per lane, and the final fold.  The float paths
 * round once per FMA, n_in / lanes of them in a lane's chain, then the fold.  Every rounding
 * is at most 2^-24 of a partial sum, and every partial sum is at most S = sum |w_i x_i| (for
 * Q4_K, sum (|d sc q| + |dmin m|) |x_i|, its two terms being reduced separately); so
 * |y - ref| <= (n_in / 8 + n_in / 32 + 16) * 2^-23 * S bounds both with room (8 lanes:
 * n_in / 8 FMAs in a chain at most; the scalar kernel has 8 partial sums too). */
static void check_against_reference(uint32_t type, uint32_t n_in, uint32_t n_out, uint32_t n_rows,
                                    kvc_rng_t *rng)
{
    tmat_t t = make_mat(type, n_in, n_out, (n_out % 2) * 6, rng);
    float *x = malloc(sizeof(float) * n_in * n_rows), *y = malloc(sizeof(float) * n_out * n_rows);
    fill(rng, x, (size_t)n_in * n_rows);
    size_t wsb;
    void *ws = ws_for(&t.m, n_rows, &wsb);
    assert_int_equal(wsb != 0, int_path(type));
    assert_ok(kvc_matmul_prepare(&t.m, x, n_rows, ISA, ws, wsb));
    assert_ok(kvc_matmul(&t.m, x, n_rows, y, ISA, NULL, ws, wsb));
    int8_t *q = malloc(n_in);
    float *d = malloc(sizeof(float) * (n_in / 32));
    for (uint32_t r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)r * n_in;
        const uint32_t qb = act_block(type);
        if (int_path(type)) {
            ref_act(type, xr, n_in, q, d);
            kvc__mm_job_t j = {.w = &t.m, .ws = ws, .ws_row = wsb / n_rows};
            assert_memory_equal(kvc__mm_xq(&j, r), q, n_in);
            assert_memory_equal(kvc__mm_xd(&j, r), d, sizeof(float) * (n_in / qb));
            if (qb == 256)
                for (uint32_t g = 0; g < n_in / 16; g++) {
                    int s = 0;
                    for (int i = 0; i < 16; i++) s += q[16 * g + i];
                    assert_int_equal(kvc__mm_xbsums(&j, r)[g], s);
                }
        }
        for (uint32_t o = 0; o < n_out; o++) {
            const double *w = t.ref + (size_t)o * n_in, *mag = t.mag + (size_t)o * n_in;
            double ref = 0, s = 0, ref_f = 0, bound_f = 0;
            for (uint32_t i = 0; i < n_in; i++) {
                const double xa = int_path(type) ? (double)d[i / qb] * q[i] : xr[i];
                ref += w[i] * xa;
                s += mag[i] * fabs(xa);
                ref_f += w[i] * xr[i];
                /* rounding x to the grid of d moves it by d / 2 at most (and 1 / d by an ulp) */
                if (int_path(type))
                    bound_f += mag[i] * (0.5 * d[i / qb] * (1 + 1e-6) + 1e-6 * fabs(xr[i]));
            }
            const double tol = (n_in / 8.0 + n_in / 32.0 + 16) * 0x1p-23 * s + 1e-30;
            const double got = y[(size_t)r * n_out + o];
            if (!(fabs(got - ref) <= tol))
                fail_msg("%s %s n_in %u n_out %u row %u out %u: %.9g, reference %.9g (tol %.3g)",
                         kvc_ggml_type_name(type), variant->name, n_in, n_out, r, o, got, ref, tol);
            if (!(fabs(got - ref_f) <= tol + bound_f))
                fail_msg("%s: %.9g vs %.9g with f32 activations (bound %.3g)",
                         kvc_ggml_type_name(type), got, ref_f, tol + bound_f);
        }
    }
    free(q);
    free(d);
    free(ws);
    free(x);
    free(y);
    free_mat(&t);
}

static void every_type_matches_the_reference(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 12);
    static const uint32_t n_ins[] = {256, 512, 1024, 4096};
    static const uint32_t n_outs[] = {1, 7, 37, 67};
    for (size_t t = 0; t < KVC_ARRAY_LEN(TYPES); t++) {
        for (size_t a = 0; a < KVC_ARRAY_LEN(n_ins); a++)
            for (size_t b = 0; b < KVC_ARRAY_LEN(n_outs); b++) {
                if (n_ins[a] == 4096 && n_outs[b] > 7) continue; /* time */
                check_against_reference(TYPES[t], n_ins[a], n_outs[b], a % 2 ? 5 : 1, &rng);
            }
        /* the block-aligned but odd shapes: one block, and n_in not a multiple of the lanes */
        const uint32_t be = block_of(TYPES[t]);
        check_against_reference(TYPES[t], be == 1 ? 32 : be, 3, 2, &rng);
        check_against_reference(TYPES[t], be == 1 ? 13 : 3 * be, 5, 6, &rng);
        if (be == 1) check_against_reference(TYPES[t], 1, 9, 4, &rng);
        if (be == 1) check_against_reference(TYPES[t], 100, 33, 3, &rng);
    }
}

/* ---- batch invariance ------------------------------------------------------------- */
static void rows_do_not_depend_on_the_batch(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 1012);
    static const uint32_t counts[] = {1, 2, 3, 4, 5, 7, 17, 64, 512};
    const uint32_t n_max = KVC_TEST_SANITIZED || ISA == KVC_ISA_SCALAR ? 64 : 512;
    for (size_t t = 0; t < KVC_ARRAY_LEN(TYPES); t++) {
        const uint32_t type = TYPES[t];
        const uint32_t n_in = block_of(type) == 1 ? 200 : 512, n_out = 37;
        tmat_t m = make_mat(type, n_in, n_out, 2, &rng);
        float *x = malloc(sizeof(float) * n_in * n_max);
        float *full = malloc(sizeof(float) * n_out * n_max);
        float *y = malloc(sizeof(float) * n_out * n_max);
        fill(&rng, x, (size_t)n_in * n_max);
        mm(&m.m, x, n_max, full, NULL);
        /* every prefix of the batch */
        for (size_t c = 0; c < KVC_ARRAY_LEN(counts) && counts[c] <= n_max; c++) {
            mm(&m.m, x, counts[c], y, NULL);
            for (uint32_t r = 0; r < counts[c]; r++)
                assert_rows_identical(y + (size_t)r * n_out, full + (size_t)r * n_out, n_out,
                                      "n_rows", type, r);
        }
        /* one row at every position of a batch of random other rows */
        float *one = malloc(sizeof(float) * n_out);
        mm(&m.m, x, 1, one, NULL);
        float *xb = malloc(sizeof(float) * n_in * 17);
        for (uint32_t pos = 0; pos < 17; pos++) {
            fill(&rng, xb, (size_t)n_in * 17);
            memcpy(xb + (size_t)pos * n_in, x, sizeof(float) * n_in);
            mm(&m.m, xb, 17, y, NULL);
            assert_rows_identical(y + (size_t)pos * n_out, one, n_out, "position", type, pos);
            const uint32_t n = 1 + pos % 7; /* and in shorter batches */
            fill(&rng, xb, (size_t)n_in * n);
            memcpy(xb + (size_t)(pos % n) * n_in, x, sizeof(float) * n_in);
            mm(&m.m, xb, n, y, NULL);
            assert_rows_identical(y + (size_t)(pos % n) * n_out, one, n_out, "position", type,
                                  pos % n);
        }
        free(xb);
        free(one);
        /* thread counts */
        const uint32_t n_rows = KVC_MIN(n_max, 64);
        for (uint32_t nt = 1; nt <= 8; nt++) {
            if (nt != 1 && nt != 2 && nt != 3 && nt != 8) continue;
            kvc_threadpool_t *tp = NULL;
            assert_ok(kvc_threadpool_create(nt, NULL, &tp));
            for (int rep = 0; rep < 3; rep++) {
                memset(y, 0, sizeof(float) * n_out * n_rows);
                mm(&m.m, x, n_rows, y, tp);
                for (uint32_t r = 0; r < n_rows; r++)
                    assert_rows_identical(y + (size_t)r * n_out, full + (size_t)r * n_out, n_out,
                                          "threads", type, r);
            }
            kvc_threadpool_destroy(tp);
        }
        /* prepare + tasks in reverse and in a shuffled order */
        size_t wsb;
        void *ws = ws_for(&m.m, n_rows, &wsb);
        assert_ok(kvc_matmul_prepare(&m.m, x, n_rows, ISA, ws, wsb));
        const uint32_t nt = kvc_matmul_n_tasks(&m.m, n_rows);
        assert_true(nt >= 2);
        for (int order = 0; order < 2; order++) {
            memset(y, 0, sizeof(float) * n_out * n_rows);
            uint32_t perm[64];
            assert_true(nt <= 64);
            for (uint32_t i = 0; i < nt; i++) perm[i] = order ? nt - 1 - i : i;
            if (!order)
                for (uint32_t i = nt - 1; i > 0; i--) {
                    uint32_t k = (uint32_t)kvc_rng_below(&rng, i + 1), tmp = perm[i];
                    perm[i] = perm[k];
                    perm[k] = tmp;
                }
            for (uint32_t i = 0; i < nt; i++) kvc_matmul_task(&m.m, x, n_rows, y, ISA, ws, perm[i]);
            for (uint32_t r = 0; r < n_rows; r++)
                assert_rows_identical(y + (size_t)r * n_out, full + (size_t)r * n_out, n_out,
                                      "tasks", type, r);
        }
        free(ws);
        free(x);
        free(full);
        free(y);
        free_mat(&m);
    }
}

/* A row with a NaN gives NaN outputs; the other rows are untouched by it. */
static void a_nan_stays_in_its_row(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 7);
    for (size_t t = 0; t < KVC_ARRAY_LEN(TYPES); t++) {
        const uint32_t n_in = 256, n_out = 9;
        tmat_t m = make_mat(TYPES[t], n_in, n_out, 0, &rng);
        float x[5 * 256], y[5 * 9], ref[5 * 9];
        fill(&rng, x, 5 * 256);
        mm(&m.m, x, 5, ref, NULL);
        x[2 * 256 + 17] = NAN;
        mm(&m.m, x, 5, y, NULL);
        for (uint32_t r = 0; r < 5; r++)
            for (uint32_t o = 0; o < n_out; o++) {
                if (r == 2)
                    assert_true(isnan(y[r * n_out + o]));
                else
                    assert_memory_equal(&y[r * n_out + o], &ref[r * n_out + o], sizeof(float));
            }
        free_mat(&m);
    }
}

/* ---- packed matrices ---------------------------------------------------------------- */
/* The reference and batch-invariance tests again, on packed matrices. */
static void packed_matches_the_reference(void **state)
{
    PACK = true;
    every_type_matches_the_reference(state);
    PACK = false;
}
static void packed_rows_do_not_depend_on_the_batch(void **state)
{
    PACK = true;
    rows_do_not_depend_on_the_batch(state);
    PACK = false;
}
static void packed_nan_stays_in_its_row(void **state)
{
    PACK = true;
    a_nan_stays_in_its_row(state);
    PACK = false;
}

/* A packed matrix gives the scalar kernel's outputs bit for bit, for every output count
 * around the groups of 8, every row count around the tiles of 4, padded rows, and on pools
 * of threads; and the scalar kernel ignores the packed copy. */
static void packed_equals_scalar_bit_for_bit(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 88);
    static const uint32_t packable[] = {KVC_GGML_Q8_0, KVC_GGML_Q4_0, KVC_GGML_Q4_K};
    static const uint32_t n_outs[] = {1, 7, 8, 9, 16, 37, 67, 100, 401};
    kvc_threadpool_t *tp = NULL;
    assert_ok(kvc_threadpool_create(2, NULL, &tp));
    for (size_t t = 0; t < KVC_ARRAY_LEN(packable); t++)
        for (size_t a = 0; a < KVC_ARRAY_LEN(n_outs); a++) {
            const uint32_t type = packable[t], n_out = n_outs[a];
            const uint32_t n_in =
                block_of(type) == 32 ? 32 * (1 + (uint32_t)a * 5) : 256 * (1 + (uint32_t)a % 3);
            const uint32_t n_rows = 1 + (uint32_t)kvc_rng_below(&rng, 9);
            PACK = true;
            tmat_t m = make_mat(type, n_in, n_out, a % 2 ? 6 : 0, &rng);
            PACK = false;
            kvc_mat_t plain = m.m;
            plain.packed = NULL;
            float *x = malloc(sizeof(float) * n_in * n_rows);
            float *ys = malloc(sizeof(float) * n_out * n_rows),
                  *yp = malloc(sizeof(float) * n_out * n_rows);
            fill(&rng, x, (size_t)n_in * n_rows);
            size_t wsb;
            void *ws = ws_for(&m.m, n_rows, &wsb);
            assert_ok(kvc_matmul(&plain, x, n_rows, ys, KVC_ISA_SCALAR, NULL, ws, wsb));
            assert_ok(kvc_matmul(&m.m, x, n_rows, yp, ISA, a % 2 ? tp : NULL, ws, wsb));
            for (uint32_t r = 0; r < n_rows; r++)
                assert_rows_identical(yp + (size_t)r * n_out, ys + (size_t)r * n_out, n_out,
                                      "packed vs scalar", type, r);
            /* the scalar kernel reads the rows, not the packed copy */
            memset(m.packed, 0x5a, kvc_mat_pack_bytes(&m.m));
            assert_ok(kvc_matmul(&m.m, x, n_rows, yp, KVC_ISA_SCALAR, NULL, ws, wsb));
            assert_memory_equal(yp, ys, sizeof(float) * n_out * n_rows);
            free(ws);
            free(x);
            free(ys);
            free(yp);
            free_mat(&m);
        }
    kvc_threadpool_destroy(tp);
}

/* ---- the packed kernels at the integer extremes -----------------------------------------
 * Blocks written byte by byte (not by the quantiser, which never writes them): Q8_0 weights
 * -128 and 127 against activations quantised to -127 and 127 (the largest maddubs pairs the
 * sign trick makes, 2 * 128 * 127), Q4_0 nibbles 0 and 15, Q4_K scales and minima 63 with
 * nibbles 15 (its 16-bit partial sums at their largest, 8 * 2 * 15 * 127), f16 scales from the
 * smallest subnormal to 65504 and negative; a pattern per row (all one extreme, alternating,
 * random extremes, random bytes) and per row of x. */
static uint16_t extreme_f16(kvc_rng_t *r)
{
    static const uint16_t h[] = {0x3C00, 0x0001, 0x7BFF, 0xBC00, 0x0400, 0x3555, 0xC7FF};
    return kvc_rng_below(r, 3) ? h[kvc_rng_below(r, KVC_ARRAY_LEN(h))]
                               : (uint16_t)(0x2000 + kvc_rng_below(r, 0x3000));
}

/* Byte i of a block's quantised part, pattern p: the extreme lo, the extreme hi, the two
 * alternating, either at random, or any byte. */
static uint8_t extreme_byte(kvc_rng_t *r, int p, size_t i, uint8_t lo, uint8_t hi)
{
    switch (p) {
    case 0:
        return lo;
    case 1:
        return hi;
    case 2:
        return i % 2 ? hi : lo;
    case 3:
        return kvc_rng_below(r, 2) ? hi : lo;
    default:
        return (uint8_t)kvc_rng_below(r, 256);
    }
}

static void extreme_row(uint32_t type, uint8_t *row, uint32_t n_in, int p, kvc_rng_t *r)
{
    const uint32_t bs = type == KVC_GGML_Q4_K ? 144 : type == KVC_GGML_Q8_0 ? 34 : 18;
    const uint32_t qk = type == KVC_GGML_Q4_K ? 256 : 32;
    for (uint32_t b = 0; b < n_in / qk; b++) {
        uint8_t *blk = row + (size_t)b * bs;
        const uint16_t d = extreme_f16(r), dmin = extreme_f16(r);
        memcpy(blk, &d, 2);
        if (type == KVC_GGML_Q8_0) {
            for (int i = 0; i < 32; i++) blk[2 + i] = extreme_byte(r, p, (size_t)i, 0x80, 0x7F);
        } else if (type == KVC_GGML_Q4_0) {
            for (int i = 0; i < 16; i++) blk[2 + i] = extreme_byte(r, p, (size_t)i, 0x00, 0xFF);
        } else {
            memcpy(blk + 2, &dmin, 2);
            for (int i = 0; i < 12; i++) /* 0xFF: every 6-bit scale and minimum 63 */
                blk[4 + i] = p == 4 ? (uint8_t)kvc_rng_below(r, 256) : 0xFF;
            for (int i = 0; i < 128; i++) blk[16 + i] = extreme_byte(r, p, (size_t)i, 0x00, 0xFF);
        }
    }
}

static void packed_extremes_equal_scalar(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 128);
    static const uint32_t packable[] = {KVC_GGML_Q8_0, KVC_GGML_Q4_0, KVC_GGML_Q4_K};
    static const uint32_t n_outs[] = {1, 5, 8, 13, 48, 57, 100, 389};
    static const uint32_t n_rows_of[] = {1, 2, 3, 4, 5, 9};
    kvc_threadpool_t *tp = NULL;
    assert_ok(kvc_threadpool_create(2, NULL, &tp));
    for (size_t t = 0; t < KVC_ARRAY_LEN(packable); t++)
        for (size_t a = 0; a < KVC_ARRAY_LEN(n_outs); a++) {
            const uint32_t type = packable[t], n_out = n_outs[a];
            const uint32_t qk = type == KVC_GGML_Q4_K ? 256 : 32;
            const uint32_t n_in = qk * (1 + (uint32_t)a % 5 + (a == 3 ? 13 : 0));
            const uint32_t n_rows = n_rows_of[a % KVC_ARRAY_LEN(n_rows_of)];
            uint32_t be = 0, bb = 0;
            assert_ok(kvc_ggml_type_size(type, &be, &bb));
            const size_t row = (size_t)n_in / be * bb + (a % 2 ? 2 : 0);
            uint8_t *buf = malloc(row * n_out);
            assert_non_null(buf);
            for (uint32_t o = 0; o < n_out; o++)
                extreme_row(type, buf + (size_t)o * row, n_in, (int)((o + a) % 5), &rng);
            kvc_mat_t m = {
                .type = type, .data = buf, .n_in = n_in, .n_out = n_out, .row_bytes = row};
            const kvc_mat_t plain = m;
            const size_t pb = kvc_mat_pack_bytes(&m);
            void *pk = aligned_alloc(64, pb);
            assert_ok(kvc_mat_pack(&m, pk, pb));
            /* x: +-1 (quantised to +-127: d = 1 / 127), the signs by pattern, or random */
            float *x = malloc(sizeof(float) * n_in * n_rows);
            for (uint32_t r = 0; r < n_rows; r++)
                for (uint32_t i = 0; i < n_in; i++) {
                    const int p = (int)((r + a) % 4);
                    x[(size_t)r * n_in + i] = p == 0   ? -1.0f
                                              : p == 1 ? 1.0f
                                              : p == 2 ? (i % 2 ? 1.0f : -1.0f)
                                                       : frand(&rng);
                }
            float *ys = malloc(sizeof(float) * n_out * n_rows),
                  *yp = malloc(sizeof(float) * n_out * n_rows);
            size_t wsb;
            void *ws = ws_for(&m, n_rows, &wsb);
            assert_ok(kvc_matmul(&plain, x, n_rows, ys, KVC_ISA_SCALAR, NULL, ws, wsb));
            assert_ok(kvc_matmul(&m, x, n_rows, yp, ISA, a % 2 ? tp : NULL, ws, wsb));
            for (uint32_t r = 0; r < n_rows; r++)
                assert_rows_identical(yp + (size_t)r * n_out, ys + (size_t)r * n_out, n_out,
                                      "packed vs scalar (extremes)", type, r);
            /* Q8_0, all weights -128 against x all -1: each block's dot is 32 * 128 * 127,
             * the scalar formula with it (an independent check that nothing saturated) */
            if (type == KVC_GGML_Q8_0 && (a % 5) == 0 && (a % 4) == 0) {
                float want = 0;
                for (uint32_t b = 0; b < n_in / 32; b++) {
                    uint16_t h;
                    memcpy(&h, buf + (size_t)b * 34, 2);
                    want += (kvc_f16_to_f32(h) * (1.0f / 127.0f)) * (float)(32 * 128 * 127);
                }
                assert_memory_equal(&yp[0], &want, sizeof want);
            }
            free(ws);
            free(x);
            free(ys);
            free(yp);
            free(pk);
            free(buf);
        }
    kvc_threadpool_destroy(tp);
}

/* A packed matrix's decode call (one row) splits into longer tasks than a batch's; each row
 * alone, on 1 or 2 threads, and through prepare + tasks run backwards, gives the batch's bits
 * and the scalar kernel's, at the output counts around the task sizes. */
static void packed_decode_tasks_equal_batch(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 1536);
    static const uint32_t packable[] = {KVC_GGML_Q8_0, KVC_GGML_Q4_0, KVC_GGML_Q4_K};
    static const uint32_t n_outs[] = {767, 768, 1000, 1535, 1536, 1601};
    const uint32_t n_rows = 3;
    kvc_threadpool_t *tp = NULL;
    assert_ok(kvc_threadpool_create(2, NULL, &tp));
    for (size_t t = 0; t < KVC_ARRAY_LEN(packable); t++)
        for (size_t a = 0; a < KVC_ARRAY_LEN(n_outs); a++) {
            const uint32_t type = packable[t], n_out = n_outs[a];
            const uint32_t n_in = block_of(type) == 32 ? 32 * (3 + (uint32_t)a) : 256;
            PACK = true;
            tmat_t m = make_mat(type, n_in, n_out, a % 2 ? 6 : 0, &rng);
            PACK = false;
            kvc_mat_t plain = m.m;
            plain.packed = NULL;
            if (n_out >= 768)
                assert_true(kvc_matmul_n_tasks(&m.m, 1) < kvc_matmul_n_tasks(&m.m, n_rows));
            float *x = malloc(sizeof(float) * n_in * n_rows);
            float *yb = malloc(sizeof(float) * n_out * n_rows), *ys = malloc(sizeof(float) * n_out),
                  *y1 = malloc(sizeof(float) * n_out);
            fill(&rng, x, (size_t)n_in * n_rows);
            mm(&m.m, x, n_rows, yb, NULL);
            size_t wsb;
            void *ws = ws_for(&m.m, 1, &wsb);
            for (uint32_t r = 0; r < n_rows; r++) {
                const float *xr = x + (size_t)r * n_in;
                const float *want = yb + (size_t)r * n_out;
                assert_ok(kvc_matmul(&plain, xr, 1, ys, KVC_ISA_SCALAR, NULL, ws, wsb));
                assert_rows_identical(want, ys, n_out, "batch vs scalar", type, r);
                for (int threads = 1; threads <= 2; threads++) {
                    memset(y1, 0xff, sizeof(float) * n_out);
                    assert_ok(kvc_matmul(&m.m, xr, 1, y1, ISA, threads == 2 ? tp : NULL, ws, wsb));
                    assert_rows_identical(want, y1, n_out, "decode vs batch", type, r);
                }
                memset(y1, 0xff, sizeof(float) * n_out);
                assert_ok(kvc_matmul_prepare(&m.m, xr, 1, ISA, ws, wsb));
                for (uint32_t k = kvc_matmul_n_tasks(&m.m, 1); k-- > 0;)
                    kvc_matmul_task(&m.m, xr, 1, y1, ISA, ws, k);
                assert_rows_identical(want, y1, n_out, "decode tasks vs batch", type, r);
            }
            free(ws);
            free(x);
            free(yb);
            free(ys);
            free(y1);
            free_mat(&m);
        }
    kvc_threadpool_destroy(tp);
}

/* The activations this ISA quantises are the scalar quantiser's, byte for byte, on the edge
 * cases too: an all-zero block, a subnormal maximum (1 / d overflows to infinity), halfway
 * values (round to nearest even), the clamp at 127, and a NaN or an infinity in a block. */
static void quantised_activations_equal_scalar(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 5);
    static const uint32_t types[] = {KVC_GGML_Q8_0, KVC_GGML_Q4_0, KVC_GGML_Q4_K, KVC_GGML_Q6_K};
    const uint32_t n_in = 512, n_rows = 9;
    float x[9 * 512];
    for (size_t t = 0; t < KVC_ARRAY_LEN(types); t++) {
        fill(&rng, x, KVC_ARRAY_LEN(x));
        for (uint32_t i = 0; i < 32; i++) x[i] = 0.0f; /* row 0, block 0 */
        for (uint32_t i = 256; i < 512; i++)           /* subnormal, with zeros: 0 * inf */
            x[i] = i % 7 == 3 ? 0.0f : 1e-40f * (float)(i % 7) - 3e-40f;
        for (uint32_t i = 0; i < n_in; i++) x[n_in + i] = (float)((int)i % 255 - 127) + 0.5f;
        x[2 * n_in + 5] = NAN;
        x[3 * n_in + 300] = INFINITY;
        x[4 * n_in + 40] = -INFINITY;
        for (uint32_t i = 0; i < n_in; i++) x[5 * n_in + i] = i % 2 ? -0.0f : 0.0f;
        x[6 * n_in + 7] = 3e38f;
        const kvc_mat_t m = {.type = types[t], .data = x, .n_in = n_in, .n_out = 1, .row_bytes = 1};
        kvc_mat_t mm_ = m;
        mm_.row_bytes = n_in / block_of(types[t]) * 300;
        size_t wsb;
        uint8_t *a = ws_for(&mm_, n_rows, &wsb), *b = malloc(wsb);
        memset(a, 0x11, wsb);
        memset(b, 0x11, wsb);
        assert_ok(kvc_matmul_prepare(&mm_, x, n_rows, KVC_ISA_SCALAR, a, wsb));
        assert_ok(kvc_matmul_prepare(&mm_, x, n_rows, ISA, b, wsb));
        assert_memory_equal(a, b, wsb);
        free(a);
        free(b);
    }
}

/* kvc_matmul_multi: each output bit-identical to kvc_matmul's, for mixes of types that share an
 * activation layout (Q4_K, Q6_K) and that do not (Q8_0, Q4_0, F16), packed or not, on a pool;
 * and its argument checks. */
static void multi_equals_single(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 31);
    static const uint32_t mixes[][5] = {
        /* count, types */
        {3, KVC_GGML_Q4_K, KVC_GGML_Q6_K, KVC_GGML_Q4_K},
        {4, KVC_GGML_Q8_0, KVC_GGML_Q4_0, KVC_GGML_F16, KVC_GGML_Q8_0},
        {2, KVC_GGML_Q4_0, KVC_GGML_Q4_0},
        {2, KVC_GGML_F32, KVC_GGML_F32},
    };
    kvc_threadpool_t *tp = NULL;
    assert_ok(kvc_threadpool_create(3, NULL, &tp));
    const uint32_t n_in = 512, n_rows = 6;
    float *x = malloc(sizeof(float) * n_in * n_rows);
    fill(&rng, x, (size_t)n_in * n_rows);
    for (int pack = 0; pack < 2; pack++)
        for (size_t k = 0; k < KVC_ARRAY_LEN(mixes); k++) {
            PACK = pack;
            tmat_t t[4];
            const kvc_mat_t *w[4];
            float *y[4], *ref[4];
            uint32_t n = 0;
            for (; n < mixes[k][0]; n++) {
                t[n] = make_mat(mixes[k][n + 1], n_in, 9 + 31 * n, 0, &rng);
                w[n] = &t[n].m;
                y[n] = calloc((size_t)t[n].m.n_out * n_rows, sizeof(float));
                ref[n] = malloc(sizeof(float) * t[n].m.n_out * n_rows);
                mm(&t[n].m, x, n_rows, ref[n], NULL);
            }
            PACK = false;
            const size_t wsb = kvc_matmul_multi_workspace_bytes(w, n, n_rows);
            size_t sum = 0;
            for (uint32_t i = 0; i < n; i++) sum += kvc_matmul_workspace_bytes(w[i], n_rows);
            assert_true(wsb <= sum);
            if (k == 0) assert_int_equal(wsb, kvc_matmul_workspace_bytes(w[0], n_rows));
            void *ws = wsb ? aligned_alloc(64, wsb) : NULL;
            assert_ok(kvc_matmul_multi(w, y, n, x, n_rows, ISA, k % 2 ? tp : NULL, ws, wsb));
            for (uint32_t i = 0; i < n; i++) {
                for (uint32_t r = 0; r < n_rows; r++)
                    assert_rows_identical(y[i] + (size_t)r * w[i]->n_out,
                                          ref[i] + (size_t)r * w[i]->n_out, w[i]->n_out, "multi",
                                          w[i]->type, r);
                free(y[i]);
                free(ref[i]);
                free_mat(&t[i]);
            }
            free(ws);
        }
    /* arguments */
    tmat_t a = make_mat(KVC_GGML_Q8_0, 512, 8, 0, &rng),
           b = make_mat(KVC_GGML_Q8_0, 256, 8, 0, &rng);
    const kvc_mat_t *ab[] = {&a.m, &b.m, &a.m, &a.m, &a.m};
    float out[8 * 6], *ys[] = {out, out, out, out, out};
    uint8_t ws[8192] __attribute__((aligned(64)));
    assert_int_equal(kvc_matmul_multi(ab, ys, 2, x, n_rows, ISA, NULL, ws, sizeof ws), KVC_EINVAL);
    assert_int_equal(kvc_matmul_multi_workspace_bytes(ab, 2, n_rows), 0);
    assert_int_equal(kvc_matmul_multi(ab + 2, ys, 0, x, n_rows, ISA, NULL, ws, sizeof ws),
                     KVC_EINVAL);
    assert_int_equal(kvc_matmul_multi(ab + 2, ys, 3, x, n_rows, ISA, NULL, ws, sizeof ws), 0);
    assert_int_equal(kvc_matmul_multi(ab, ys, 5, x, n_rows, ISA, NULL, ws, sizeof ws), KVC_EINVAL);
    assert_int_equal(kvc_matmul_multi(ab + 2, ys, 1, x, n_rows, ISA, NULL, ws, 64), KVC_EINVAL);
    assert_int_equal(kvc_matmul_multi(ab + 2, ys, 1, NULL, n_rows, ISA, NULL, ws, sizeof ws),
                     KVC_EINVAL);
    assert_int_equal(kvc_matmul_multi(ab + 2, NULL, 1, x, n_rows, ISA, NULL, ws, sizeof ws),
                     KVC_EINVAL);
    kvc_mat_t bad = a.m;
    bad.type = KVC_GGML_Q5_0;
    const kvc_mat_t *bb[] = {&a.m, &bad};
    assert_int_equal(kvc_matmul_multi(bb, ys, 2, x, n_rows, ISA, NULL, ws, sizeof ws), KVC_ENOTSUP);
    free_mat(&a);
    free_mat(&b);
    free(x);
    kvc_threadpool_destroy(tp);
}

/* The kernel that runs is the variant's own. */
static void the_variant_kernel_runs(void **state)
{
    (void)state;
    for (size_t t = 0; t < KVC_ARRAY_LEN(TYPES); t++)
        assert_string_equal(kvc_matmul_kernel_name(TYPES[t], ISA), variant->name);
}

/* A variant this CPU lacks: forcing it fails with KVC_ENOTSUP and writes nothing. */
static void missing_isa_is_refused(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 3);
    tmat_t m = make_mat(KVC_GGML_Q8_0, 64, 4, 0, &rng);
    float x[64] = {0}, y[4] = {5, 5, 5, 5};
    uint8_t ws[512];
    memset(ws, 0x5a, sizeof ws);
    assert_int_equal(kvc_matmul(&m.m, x, 1, y, variant->isa, NULL, ws, sizeof ws), KVC_ENOTSUP);
    assert_int_equal(kvc_matmul_prepare(&m.m, x, 1, variant->isa, ws, sizeof ws), KVC_ENOTSUP);
    assert_true(y[0] == 5 && y[3] == 5 && ws[0] == 0x5a);
    assert_string_equal(kvc_matmul_kernel_name(KVC_GGML_Q8_0, variant->isa), "?");
    free_mat(&m);
}

/* ---- argument checks (ISA-independent) ------------------------------------------------ */
static void bad_arguments_are_refused(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 5);
    tmat_t t = make_mat(KVC_GGML_Q4_K, 256, 3, 0, &rng);
    float x[2 * 256] = {0}, y[6];
    for (int i = 0; i < 6; i++) y[i] = 42;
    size_t need = kvc_matmul_workspace_bytes(&t.m, 2);
    assert_true(need >= 2 * (256 + 4 + 32));
    assert_int_equal(need % 64, 0);
    assert_int_equal(kvc_matmul_workspace_bytes(&t.m, 0), 0);
    void *ws = aligned_alloc(64, need);
    const kvc_mat_t good = t.m;
    assert_int_equal(kvc_matmul(NULL, x, 2, y, KVC_ISA_AUTO, NULL, ws, need), KVC_EINVAL);
    assert_int_equal(kvc_matmul(&good, NULL, 2, y, KVC_ISA_AUTO, NULL, ws, need), KVC_EINVAL);
    assert_int_equal(kvc_matmul(&good, x, 2, NULL, KVC_ISA_AUTO, NULL, ws, need), KVC_EINVAL);
    assert_int_equal(kvc_matmul(&good, x, 0, y, KVC_ISA_AUTO, NULL, ws, need), KVC_EINVAL);
    assert_int_equal(kvc_matmul(&good, x, 2, y, KVC_ISA_AUTO, NULL, NULL, need), KVC_EINVAL);
    assert_int_equal(kvc_matmul(&good, x, 2, y, KVC_ISA_AUTO, NULL, ws, need - 1), KVC_EINVAL);
    uint8_t *big = aligned_alloc(64, need + 64);
    assert_int_equal(kvc_matmul(&good, x, 2, y, KVC_ISA_AUTO, NULL, big + 2, need), KVC_EINVAL);
    assert_ok(kvc_matmul(&good, x, 2, y, KVC_ISA_AUTO, NULL, big + 4, need)); /* 4 is enough */
    for (int i = 0; i < 6; i++) y[i] = 42;
    free(big);
    assert_int_equal(kvc_matmul(&good, x, 2, y, (kvc_isa_t)99, NULL, ws, need), KVC_EINVAL);
    assert_int_equal(kvc_matmul_prepare(&good, x, 2, KVC_ISA_AUTO, ws, need - 1), KVC_EINVAL);
    assert_int_equal(kvc_matmul_prepare(&good, x, 2, (kvc_isa_t)99, ws, need), KVC_EINVAL);
    assert_int_equal(kvc_matmul_prepare(NULL, x, 2, KVC_ISA_AUTO, ws, need), KVC_EINVAL);
    assert_int_equal(kvc_matmul_prepare(&good, NULL, 2, KVC_ISA_AUTO, ws, need), KVC_EINVAL);
    assert_int_equal(kvc_matmul_prepare(&good, x, 0, KVC_ISA_AUTO, ws, need), KVC_EINVAL);
    kvc_mat_t bad[6];
    for (int i = 0; i < 6; i++) bad[i] = good;
    bad[0].data = NULL;
    bad[1].n_in = 0;
    bad[2].n_in = 128; /* not a multiple of Q4_K's 256 */
    bad[3].n_out = 0;
    bad[4].row_bytes = 143;
    bad[5].n_in = 512; /* rows of 288 bytes, 144 apart */
    for (int i = 0; i < 6; i++) {
        assert_int_equal(kvc_matmul(&bad[i], x, 1, y, KVC_ISA_AUTO, NULL, ws, need), KVC_EINVAL);
        assert_int_equal(kvc_matmul_prepare(&bad[i], x, 1, KVC_ISA_AUTO, ws, need), KVC_EINVAL);
        assert_int_equal(kvc_matmul_n_tasks(&bad[i], 1), 0);
        assert_int_equal(kvc_matmul_workspace_bytes(&bad[i], 1), 0);
    }
    kvc_mat_t q41 = good;
    q41.type = KVC_GGML_Q4_1;
    assert_false(kvc_matmul_type_supported(KVC_GGML_Q4_1));
    assert_int_equal(kvc_matmul(&q41, x, 1, y, KVC_ISA_AUTO, NULL, ws, need), KVC_ENOTSUP);
    assert_int_equal(kvc_matmul_prepare(&q41, x, 1, KVC_ISA_AUTO, ws, need), KVC_ENOTSUP);
    assert_int_equal(kvc_matmul_n_tasks(&q41, 1), 0);
    q41.type = 1000;
    assert_int_equal(kvc_matmul(&q41, x, 1, y, KVC_ISA_AUTO, NULL, ws, need), KVC_ENOTSUP);
    for (int i = 0; i < 6; i++) assert_true(y[i] == 42); /* nothing written */
    assert_int_equal(kvc_matmul_n_tasks(NULL, 1), 0);
    assert_int_equal(kvc_matmul_n_tasks(&good, 0), 0);
    assert_int_equal(kvc_matmul_workspace_bytes(NULL, 1), 0);
    for (size_t i = 0; i < KVC_ARRAY_LEN(TYPES); i++)
        assert_true(kvc_matmul_type_supported(TYPES[i]));
    /* the float types need no workspace: ws may be NULL */
    tmat_t f = make_mat(KVC_GGML_F16, 256, 3, 0, &rng);
    assert_int_equal(kvc_matmul_workspace_bytes(&f.m, 100), 0);
    assert_ok(kvc_matmul(&f.m, x, 2, y, KVC_ISA_AUTO, NULL, NULL, 0));
    assert_ok(kvc_matmul(&good, x, 2, y, KVC_ISA_AUTO, NULL, ws, need));
    assert_string_equal(kvc_matmul_kernel_name(KVC_GGML_F16, (kvc_isa_t)99), "?");
    assert_string_equal(kvc_matmul_kernel_name(KVC_GGML_F16, KVC_ISA_SCALAR), "scalar");
    free(ws);
    free_mat(&t);
    free_mat(&f);
}

/* kvc_mat_pack: what has a packed form, and every refusal leaving the matrix unchanged. */
static void pack_arguments_are_refused(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 6);
    for (size_t t = 0; t < KVC_ARRAY_LEN(TYPES); t++) {
        tmat_t m = make_mat(TYPES[t], 256, 9, 0, &rng);
        const size_t b = kvc_mat_pack_bytes(&m.m);
        const bool packable =
            TYPES[t] == KVC_GGML_Q8_0 || TYPES[t] == KVC_GGML_Q4_0 || TYPES[t] == KVC_GGML_Q4_K;
        assert_int_equal(b != 0, packable);
        uint8_t *buf = aligned_alloc(64, b + 128);
        if (!packable) {
            assert_int_equal(kvc_mat_pack(&m.m, buf, 4096), KVC_ENOTSUP);
        } else {
            /* 2 groups of 8 rows (the second padded), 64-byte multiple */
            assert_int_equal(b % 64, 0);
            assert_true(b >= 2 * (TYPES[t] == KVC_GGML_Q4_K   ? 1184
                                  : TYPES[t] == KVC_GGML_Q8_0 ? 8 * 272
                                                              : 8 * 144));
            assert_int_equal(kvc_mat_pack(&m.m, buf, b - 1), KVC_EINVAL);
            assert_int_equal(kvc_mat_pack(&m.m, buf + 32, b), KVC_EINVAL);
            assert_int_equal(kvc_mat_pack(&m.m, NULL, b), KVC_EINVAL);
            assert_int_equal(kvc_mat_pack(NULL, buf, b), KVC_EINVAL);
            kvc_mat_t bad = m.m;
            bad.row_bytes = 1;
            assert_int_equal(kvc_mat_pack(&bad, buf, b), KVC_EINVAL);
            assert_int_equal(kvc_mat_pack_bytes(&bad), 0);
            assert_null(m.m.packed);
            assert_ok(kvc_mat_pack(&m.m, buf, b));
            assert_ptr_equal(m.m.packed, buf);
        }
        free(buf);
        free_mat(&m);
    }
    assert_int_equal(kvc_mat_pack_bytes(NULL), 0);
}

static void matrices_come_from_2d_tensors(void **state)
{
    (void)state;
    uint8_t data[2 * 288] = {0};
    kvc_gguf_tensor_t t = {.type = KVC_GGML_Q4_K,
                           .n_dims = 2,
                           .ne = {512, 2, 1, 1},
                           .n_elems = 1024,
                           .bytes = sizeof data,
                           .data = data};
    kvc_mat_t m;
    assert_ok(kvc_mat_from_tensor(&t, &m));
    assert_int_equal(m.type, KVC_GGML_Q4_K);
    assert_ptr_equal(m.data, data);
    assert_int_equal(m.n_in, 512);
    assert_int_equal(m.n_out, 2);
    assert_int_equal(m.row_bytes, 288);
    assert_int_equal(kvc_mat_from_tensor(NULL, &m), KVC_EINVAL);
    assert_int_equal(kvc_mat_from_tensor(&t, NULL), KVC_EINVAL);
    kvc_gguf_tensor_t u = t;
    u.n_dims = 1;
    u.ne[1] = 1;
    assert_int_equal(kvc_mat_from_tensor(&u, &m), KVC_EINVAL);
    u = t;
    u.n_dims = 3;
    u.ne[1] = 1;
    u.ne[2] = 2;
    assert_int_equal(kvc_mat_from_tensor(&u, &m), KVC_EINVAL);
    u = t;
    u.ne[0] = 300; /* not a multiple of the block */
    assert_int_equal(kvc_mat_from_tensor(&u, &m), KVC_EINVAL);
    u = t;
    u.bytes = sizeof data - 1;
    assert_int_equal(kvc_mat_from_tensor(&u, &m), KVC_EINVAL);
    u = t;
    u.type = KVC_GGML_Q5_K;
    assert_int_equal(kvc_mat_from_tensor(&u, &m), KVC_ENOTSUP);
    u = t;
    u.data = NULL;
    assert_int_equal(kvc_mat_from_tensor(&u, &m), KVC_EINVAL);
    u = t;
    u.type = KVC_GGML_F32;
    u.ne[0] = 3;
    u.ne[1] = 5;
    assert_ok(kvc_mat_from_tensor(&u, &m));
    assert_int_equal(m.row_bytes, 12);
}

/* ---- the thread pool ------------------------------------------------------------------- */
typedef struct {
    atomic_uint *count;
    uint32_t size;
    atomic_uint bad_thread;
    pthread_t caller;
    atomic_uint off_caller;
} pool_ctx_t;

static void count_task(void *ctx, uint32_t task, uint32_t thread)
{
    pool_ctx_t *c = ctx;
    atomic_fetch_add(&c->count[task], 1);
    if (thread >= c->size) atomic_fetch_add(&c->bad_thread, 1);
    if (!pthread_equal(pthread_self(), c->caller)) atomic_fetch_add(&c->off_caller, 1);
}

static void run_and_check(kvc_threadpool_t *tp, uint32_t n_tasks)
{
    atomic_uint *count = calloc(n_tasks + 1, sizeof *count);
    pool_ctx_t c = {.count = count, .size = kvc_threadpool_size(tp), .caller = pthread_self()};
    atomic_init(&c.bad_thread, 0);
    atomic_init(&c.off_caller, 0);
    kvc_threadpool_run(tp, count_task, &c, n_tasks);
    for (uint32_t i = 0; i < n_tasks; i++)
        if (atomic_load(&count[i]) != 1)
            fail_msg("task %u ran %u times", i, atomic_load(&count[i]));
    assert_int_equal(atomic_load(&c.bad_thread), 0);
    if (kvc_threadpool_size(tp) == 1) assert_int_equal(atomic_load(&c.off_caller), 0);
    free(count);
}

static void pool_runs_every_task_once(void **state)
{
    (void)state;
    static const uint32_t sizes[] = {1, 2, 3, 8};
    for (size_t s = 0; s < KVC_ARRAY_LEN(sizes); s++) {
        kvc_threadpool_t *tp = NULL;
        assert_ok(kvc_threadpool_create(sizes[s], NULL, &tp));
        assert_int_equal(kvc_threadpool_size(tp), sizes[s]);
        run_and_check(tp, 1000);
        for (int job = 0; job < 400 / KVC_TEST_SANITIZER_DIVISOR; job++)
            run_and_check(tp, 1 + (uint32_t)job % 13);
        run_and_check(tp, 0);
        /* let the workers fall asleep, then wake them */
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
        run_and_check(tp, 64);
        nanosleep(&ts, NULL);
        kvc_threadpool_destroy(tp); /* idle */
    }
    run_and_check(NULL, 17); /* no pool: inline */
    assert_int_equal(kvc_threadpool_size(NULL), 1);
    kvc_threadpool_destroy(NULL);
}

static void no_task_returns_at_once(void **state)
{
    (void)state;
    kvc_threadpool_t *tp = NULL;
    assert_ok(kvc_threadpool_create(2, NULL, &tp));
    atomic_uint never;
    atomic_init(&never, 0);
    pool_ctx_t c = {.count = &never, .size = 2, .caller = pthread_self()};
    kvc_threadpool_run(tp, count_task, &c, 0);
    kvc_threadpool_run(NULL, count_task, &c, 0);
    assert_int_equal(atomic_load(&never), 0);
    kvc_threadpool_destroy(tp);
}

static void pool_arguments_and_allocation_failures(void **state)
{
    (void)state;
    kvc_threadpool_t *tp = (kvc_threadpool_t *)1;
    assert_int_equal(kvc_threadpool_create(2, NULL, NULL), KVC_EINVAL);
    assert_int_equal(kvc_threadpool_create(0, NULL, &tp), KVC_EINVAL);
    assert_null(tp);
    tp = (kvc_threadpool_t *)1;
    assert_int_equal(kvc_threadpool_create(1025, NULL, &tp), KVC_EINVAL);
    assert_null(tp);
    for (uint64_t k = 1; k <= 3; k++) {
        kvc_failing_alloc_t st = {.fail_at = k};
        kvc_allocator_t a = kvc_failing_allocator(&st);
        tp = NULL;
        assert_int_equal(kvc_threadpool_create(3, &a, &tp), KVC_ENOMEM);
        assert_null(tp);
        assert_int_equal(st.n_live, 0);
    }
    kvc_failing_alloc_t st = {0};
    kvc_allocator_t a = kvc_failing_allocator(&st);
    assert_ok(kvc_threadpool_create(4, &a, &tp));
    run_and_check(tp, 100);
    kvc_threadpool_destroy(tp);
    assert_int_equal(st.n_live, 0);
}

int main(int argc, char **argv)
{
    static const char *const names[] = {"scalar", "avx2", "avx512", NULL};
    int rc = kvc_test_variant_parse(argc, argv, names, &variant);
    if (rc) return rc;
    if (!variant) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(bad_arguments_are_refused),
            cmocka_unit_test(matrices_come_from_2d_tensors),
            cmocka_unit_test(pack_arguments_are_refused),
            cmocka_unit_test(pool_runs_every_task_once),
            cmocka_unit_test(no_task_returns_at_once),
            cmocka_unit_test(pool_arguments_and_allocation_failures),
        };
        return cmocka_run_group_tests_name("matmul", tests, NULL, NULL);
    }
    char group[64];
    snprintf(group, sizeof group, "matmul.%s", variant->name);
    if (!kvc_isa_supported(variant->isa)) {
        const struct CMUnitTest refused[] = {cmocka_unit_test(missing_isa_is_refused)};
        if ((rc = cmocka_run_group_tests_name(group, refused, NULL, NULL))) return rc;
        return kvc_test_variant_skip("matmul", variant);
    }
    ISA = variant->isa;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_variant_kernel_runs),
        cmocka_unit_test(every_type_matches_the_reference),
        cmocka_unit_test(rows_do_not_depend_on_the_batch),
        cmocka_unit_test(a_nan_stays_in_its_row),
        cmocka_unit_test(packed_equals_scalar_bit_for_bit),
        cmocka_unit_test(packed_extremes_equal_scalar),
        cmocka_unit_test(packed_decode_tasks_equal_batch),
        cmocka_unit_test(quantised_activations_equal_scalar),
        cmocka_unit_test(multi_equals_single),
        cmocka_unit_test(packed_matches_the_reference),
        cmocka_unit_test(packed_rows_do_not_depend_on_the_batch),
        cmocka_unit_test(packed_nan_stays_in_its_row),
    };
    return cmocka_run_group_tests_name(group, tests, NULL, NULL);
}
