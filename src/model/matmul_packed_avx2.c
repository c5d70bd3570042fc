/* matmul_packed_avx2.c - the kernels over packed matrices (kvc_mat_pack; layouts in
 * matmul_int.h), AVX2 + FMA + F16C.  A packed unit puts 4 weights of each of 8 output rows in
 * every 32-byte vector, so a maddubs against 4 activations broadcast to all lanes works on 8
 * rows at once, lane k holding row k's partial dot product: no horizontal sums, one
 * conversion of 8 f16 scales at a time, and one sequential stream of weights per 8 rows.
 *
 * Each lane's integer dot product of a block is exact (as every partial sum below fits its
 * lanes: a Q4 maddubs pair is at most 2 * 15 * 127 = 3810, so 8 of them add up in int16), and
 * the float arithmetic after it is the scalar kernel's, lane by lane, in its order and with
 * its roundings (a multiply, then an add: never fused, hence fp-contract off):
 *
 *   Q8_0, Q4_0  acc += (d_w * d_x) * (float)dot            block by block
 *   Q4_K        acc += (d * d_x) * (float)s;  acc -= (dmin * d_x) * (float)mins
 *
 * so that a packed matrix gives the scalar kernel's outputs bit for bit, on any tile, in any
 * batch (tests/test_matmul.c checks both). */
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif
#include "model/matmul_int.h"

#include <immintrin.h>
#include <math.h>

#define INL static inline __attribute__((always_inline))

INL __m256i bcast32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Software prefetch distance (bytes ahead in each stream of units) of the single-row (decode)
 * tiles, which are memory bound: the hardware prefetchers alone keep too few lines in flight
 * for their two streams (bench_bw: 8 streams 9.1 GB/s plain, 14.4 with a prefetch 1 KiB
 * ahead; the kernels gained 8-15%, 512 to 4096 bytes measuring alike).  The tiles of several
 * rows are compute bound and go without. */
#ifndef KVC_PK_PF
#define KVC_PK_PF 1024
#endif

/* Prefetch the lines of [p + KVC_PK_PF, p + KVC_PK_PF + n). */
INL void pf(const uint8_t *p, size_t n)
{
#pragma GCC unroll 20
    for (size_t o = 0; o < n; o += 64) _mm_prefetch((const char *)p + KVC_PK_PF + o, _MM_HINT_T0);
}

INL __m256i load256(const uint8_t *p)
{
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

/* The 8 outputs of group g for row r: those below o1 stored. */
INL void store8(const kvc__mm_job_t *j, uint32_t r, uint32_t g, __m256 v)
{
    float *y = j->y + (size_t)r * j->w->n_out + (size_t)g * KVC__PK_ROWS;
    const uint32_t o = g * KVC__PK_ROWS;
    if (o + KVC__PK_ROWS <= j->o1) {
        _mm256_storeu_ps(y, v);
        return;
    }
    float t[8];
    _mm256_storeu_ps(t, v);
    memcpy(y, t, sizeof(float) * (j->o1 - o));
}

/* ---- Q4_0 -------------------------------------------------------------------------------- */
INL void q4_0_tile(const kvc__mm_job_t *j, uint32_t r0, uint32_t g, uint32_t gs, int NR, int NG)
{
    const uint32_t nb = j->w->n_in / KVC__QK;
    const __m256i lo4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const int8_t *xq[4];
    const float *xd[4];
    const int32_t *xo[4];
    __m256 acc[4][2];
    const uint8_t *u[2];
#pragma GCC unroll 2
    for (int k = 0; k < NG; k++)
        u[k] = kvc__mm_unit(j, g + (uint32_t)k * gs, 0, KVC__PK_Q4_0_U, nb);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        xq[r] = kvc__mm_xq(j, r0 + (uint32_t)r);
        xd[r] = kvc__mm_xd(j, r0 + (uint32_t)r);
        xo[r] = kvc__mm_xboff(j, r0 + (uint32_t)r);
#pragma GCC unroll 2
        for (int k = 0; k < NG; k++) acc[r][k] = _mm256_setzero_ps();
    }
    for (uint32_t b = 0; b < nb; b++) {
        __m256i s16[4][2];
#pragma GCC unroll 2
        for (int k = 0; k < NG && NR == 1; k++) pf(u[k], KVC__PK_Q4_0_U);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
            for (int k = 0; k < NG; k++) s16[r][k] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256i lo[2], hi[2];
#pragma GCC unroll 2
            for (int k = 0; k < NG; k++) {
                const __m256i v = load256(u[k] + 16 + 32 * c);
                lo[k] = _mm256_and_si256(v, lo4);
                hi[k] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
            }
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const int8_t *x = xq[r] + (size_t)b * KVC__QK;
                const __m256i x0 = bcast32(x + 4 * c), x1 = bcast32(x + 16 + 4 * c);
#pragma GCC unroll 2
                for (int k = 0; k < NG; k++)
                    s16[r][k] = _mm256_add_epi16(s16[r][k],
                                                 _mm256_add_epi16(_mm256_maddubs_epi16(lo[k], x0),
                                                                  _mm256_maddubs_epi16(hi[k], x1)));
            }
        }
#pragma GCC unroll 2
        for (int k = 0; k < NG; k++) {
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)u[k]));
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const __m256i s = _mm256_sub_epi32(_mm256_madd_epi16(s16[r][k], ones),
                                                   _mm256_set1_epi32(xo[r][b]));
                const __m256 dd = _mm256_mul_ps(dw, _mm256_set1_ps(xd[r][b]));
                acc[r][k] = _mm256_add_ps(acc[r][k], _mm256_mul_ps(dd, _mm256_cvtepi32_ps(s)));
            }
            u[k] += KVC__PK_Q4_0_U;
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
        for (int k = 0; k < NG; k++) store8(j, r0 + (uint32_t)r, g + (uint32_t)k * gs, acc[r][k]);
}

/* ---- Q8_0 -------------------------------------------------------------------------------- */
INL void q8_0_tile(const kvc__mm_job_t *j, uint32_t r0, uint32_t g, uint32_t gs, int NR, int NG)
{
    const uint32_t nb = j->w->n_in / KVC__QK;
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t *xq[4];
    const float *xd[4];
    __m256 acc[4][2];
    const uint8_t *u[2];
#pragma GCC unroll 2
    for (int k = 0; k < NG; k++)
        u[k] = kvc__mm_unit(j, g + (uint32_t)k * gs, 0, KVC__PK_Q8_0_U, nb);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        xq[r] = kvc__mm_xq(j, r0 + (uint32_t)r);
        xd[r] = kvc__mm_xd(j, r0 + (uint32_t)r);
#pragma GCC unroll 2
        for (int k = 0; k < NG; k++) acc[r][k] = _mm256_setzero_ps();
    }
    for (uint32_t b = 0; b < nb; b++) {
        __m256i s32[4][2];
#pragma GCC unroll 2
        for (int k = 0; k < NG && NR == 1; k++) pf(u[k], KVC__PK_Q8_0_U);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
            for (int k = 0; k < NG; k++) s32[r][k] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
#pragma GCC unroll 2
            for (int k = 0; k < NG; k++) {
                const __m256i v = load256(u[k] + 16 + 32 * c);
                const __m256i a = _mm256_sign_epi8(v, v);
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) {
                    const __m256i x =
                        _mm256_sign_epi8(bcast32(xq[r] + (size_t)b * KVC__QK + 4 * c), v);
                    s32[r][k] = _mm256_add_epi32(
                        s32[r][k], _mm256_madd_epi16(_mm256_maddubs_epi16(a, x), ones));
                }
            }
        }
#pragma GCC unroll 2
        for (int k = 0; k < NG; k++) {
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)u[k]));
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const __m256 dd = _mm256_mul_ps(dw, _mm256_set1_ps(xd[r][b]));
                acc[r][k] =
                    _mm256_add_ps(acc[r][k], _mm256_mul_ps(dd, _mm256_cvtepi32_ps(s32[r][k])));
            }
            u[k] += KVC__PK_Q8_0_U;
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
        for (int k = 0; k < NG; k++) store8(j, r0 + (uint32_t)r, g + (uint32_t)k * gs, acc[r][k]);
}

/* ---- Q4_K -------------------------------------------------------------------------------- */
INL void q4_k_tile(const kvc__mm_job_t *j, uint32_t r0, uint32_t g, uint32_t gs, int NR, int NG)
{
    const uint32_t nb = j->w->n_in / KVC__QK_K;
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    /* from a scale-pair vector (row k's pair at bytes 2k, 2k + 1, both halves), row k's first
     * (second) scale in both int16 of lane k */
    const __m256i pick0 =
        _mm256_setr_epi8(0, -1, 0, -1, 2, -1, 2, -1, 4, -1, 4, -1, 6, -1, 6, -1, 8, -1, 8, -1, 10,
                         -1, 10, -1, 12, -1, 12, -1, 14, -1, 14, -1);
    const __m256i pick1 = _mm256_add_epi8(pick0, _mm256_set1_epi16(1));
    const int8_t *xq[4];
    const float *xd[4];
    const int16_t *xs[4];
    __m256 acc[4][2];
    const uint8_t *u[2];
#pragma GCC unroll 2
    for (int k = 0; k < NG; k++)
        u[k] = kvc__mm_unit(j, g + (uint32_t)k * gs, 0, KVC__PK_Q4_K_U, nb);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        xq[r] = kvc__mm_xq(j, r0 + (uint32_t)r);
        xd[r] = kvc__mm_xd(j, r0 + (uint32_t)r);
        xs[r] = kvc__mm_xbsums32(j, r0 + (uint32_t)r);
#pragma GCC unroll 2
        for (int k = 0; k < NG; k++) acc[r][k] = _mm256_setzero_ps();
    }
    for (uint32_t b = 0; b < nb; b++) {
#pragma GCC unroll 2
        for (int k = 0; k < NG; k++) {
            __m256i s32[4], m32[4];
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) s32[r] = m32[r] = _mm256_setzero_si256();
            for (int p = 0; p < 4; p++) {
                if (NR == 1) pf(u[k] + 296 * p, 296);
                const __m256i pairs = _mm256_broadcastsi128_si256(
                    _mm_loadu_si128((const __m128i *)(const void *)(u[k] + 32 + 16 * p)));
                const __m256i mins = _mm256_cvtepu8_epi16(
                    _mm_loadu_si128((const __m128i *)(const void *)(u[k] + 96 + 16 * p)));
                const uint8_t *vq = u[k] + 160 + 256 * p;
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) { /* sub-block 2p (low nibbles), then 2p + 1 (high) */
                    __m256i s16[4];
#pragma GCC unroll 4
                    for (int r = 0; r < NR; r++) s16[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
                    for (int c = 0; c < 8; c++) {
                        const __m256i v = load256(vq + 32 * c);
                        const __m256i q = h ? _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4)
                                            : _mm256_and_si256(v, lo4);
#pragma GCC unroll 4
                        for (int r = 0; r < NR; r++)
                            s16[r] = _mm256_add_epi16(
                                s16[r],
                                _mm256_maddubs_epi16(q, bcast32(xq[r] + (size_t)b * KVC__QK_K +
                                                                64 * p + 32 * h + 4 * c)));
                    }
                    const __m256i sc = _mm256_shuffle_epi8(pairs, h ? pick1 : pick0);
#pragma GCC unroll 4
                    for (int r = 0; r < NR; r++)
                        s32[r] = _mm256_add_epi32(s32[r], _mm256_madd_epi16(s16[r], sc));
                }
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) {
                    int32_t bs;
                    memcpy(&bs, xs[r] + 8 * (size_t)b + 2 * p, 4);
                    m32[r] =
                        _mm256_add_epi32(m32[r], _mm256_madd_epi16(mins, _mm256_set1_epi32(bs)));
                }
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)u[k]));
            const __m256 dmin =
                _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(u[k] + 16)));
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const __m256 dx = _mm256_set1_ps(xd[r][b]);
                const __m256 dd = _mm256_mul_ps(d, dx), dm = _mm256_mul_ps(dmin, dx);
                acc[r][k] = _mm256_add_ps(acc[r][k], _mm256_mul_ps(dd, _mm256_cvtepi32_ps(s32[r])));
                acc[r][k] = _mm256_sub_ps(acc[r][k], _mm256_mul_ps(dm, _mm256_cvtepi32_ps(m32[r])));
            }
            u[k] += KVC__PK_Q4_K_U;
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
        for (int k = 0; k < NG; k++) store8(j, r0 + (uint32_t)r, g + (uint32_t)k * gs, acc[r][k]);
}

/* ---- activations ------------------------------------------------------------------------ */
/* matmul.c's quant_block, 8 lanes at a time, with the same bytes out: amax of |x| (exact in any
 * order), d = amax / 127 and 1 / d as there, q = round-to-nearest-even(x * (1 / d)) clamped to
 * +-127, a NaN product (0 * an infinite 1 / d) giving 0, and a block with a NaN or an infinity
 * q = 0 and d = NaN. */
float kvc__mm_quant_block_avx2(const float *x, int8_t *q, uint32_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
    __m256 amax = _mm256_setzero_ps();
    int finite = -1;
    for (uint32_t i = 0; i < n; i += 8) {
        const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i));
        finite &= _mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_LT_OQ)) == 0xFF ? -1 : 0;
        amax = _mm256_max_ps(amax, a);
    }
    if (!finite) {
        memset(q, 0, n);
        return NAN;
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id), hi = _mm256_set1_ps(127.0f),
                 lo = _mm256_set1_ps(-127.0f);
    for (uint32_t i = 0; i < n; i += 32) {
        __m256i w[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), vid),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q)); /* NaN -> 0 */
            w[k] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(v, hi), lo));
        }
        const __m256i p16 = _mm256_packs_epi32(w[0], w[1]), q16 = _mm256_packs_epi32(w[2], w[3]);
        const __m256i p8 = _mm256_packs_epi16(p16, q16); /* lanes 0 4 1 5 2 6 3 7 (by 4 bytes) */
        _mm256_storeu_si256(
            (__m256i *)(void *)(q + i),
            _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    return d;
}

/* ---- driver -------------------------------------------------------------------------------
 * Tiles of NR rows by one group of 8 outputs (Q4_0: two adjacent groups), then single rows
 * (the decode step) by two groups half the job's range apart: two long sequential streams of
 * units, which the memory system serves faster than one.  Which groups share a tile never
 * changes an output's bits. */
#define DRIVER(name, TILE, NR, NG)                                        \
    static void name(const kvc__mm_job_t *j)                              \
    {                                                                     \
        const uint32_t g0 = j->o0 / KVC__PK_ROWS;                         \
        const uint32_t g1 = (j->o1 + KVC__PK_ROWS - 1) / KVC__PK_ROWS;    \
        uint32_t r = 0, g;                                                \
        for (; r + NR <= j->n_rows; r += NR) {                            \
            for (g = g0; g + NG <= g1; g += NG) TILE(j, r, g, 1, NR, NG); \
            for (; g < g1; g++) TILE(j, r, g, 1, NR, 1);                  \
        }                                                                 \
        const uint32_t h = (g1 - g0) / 2;                                 \
        for (; r < j->n_rows; r++) {                                      \
            for (g = g0; g < g0 + h; g++) TILE(j, r, g, h, 1, 2);         \
            for (g = g0 + 2 * h; g < g1; g++) TILE(j, r, g, 1, 1, 1);     \
        }                                                                 \
    }

DRIVER(pk_q4_0, q4_0_tile, 4, 2)
DRIVER(pk_q8_0, q8_0_tile, 4, 1)
DRIVER(pk_q4_k, q4_k_tile, 4, 1)

void kvc__mm_avx2_packed(const kvc__mm_job_t *j)
{
    if (j->w->type == KVC_GGML_Q4_0)
        pk_q4_0(j);
    else if (j->w->type == KVC_GGML_Q8_0)
        pk_q8_0(j);
    else
        pk_q4_k(j);
}
