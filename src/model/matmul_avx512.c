/* matmul_avx512.c - the AVX-512 matrix kernels (F, BW, VL, DQ only: no VNNI, which kvc_cpu
 * does not check).  The structure of matmul_avx2.c with 16 lanes: tiles of NR rows by NO
 * outputs, one accumulator per (row, output), the same instructions for every tile shape:
 *
 *   F32, F16, BF16  one 16-lane accumulator, element i into lane i % 16 by FMA, in order of i;
 *                   the last n_in % 16 elements by masked (zeroing) loads; then a fixed fold
 *   Q8_0, Q4_0      blocks in pairs: block 2p in lanes 0..7, block 2p + 1 in lanes 8..15, each
 *                   block's int8 products exact in int32, then acc = fma(lanes, d_w * d_x, acc);
 *                   an odd last block in lanes 0..7 (lanes 8..15 get exact zeros)
 *   Q4_K, Q6_K      per block of 256, 16 int32 lanes of the exact scaled sums, then as in
 *                   matmul_avx2.c (the 8-lane minima / offsets in lanes 0..7)
 *
 * AVX-512 has no vpsignb: |w| is vpabsb, and x takes w's sign by a masked subtraction. */
#include "model/matmul_int.h"

#include <immintrin.h>

#define INL static inline __attribute__((always_inline))

INL float hsum16(__m512 v)
{
    const __m256 lo = _mm512_castps512_ps256(v);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INL float f16(const uint8_t *p)
{
    return _cvtsh_ss(kvc__mm_u16(p));
}

/* A 256-bit value in the low half of a zmm, zeros above. */
INL __m512i zext_si(__m256i v)
{
    return _mm512_inserti64x4(_mm512_setzero_si512(), v, 0);
}
INL __m512 zext_ps(__m256 v)
{
    return _mm512_insertf32x8(_mm512_setzero_ps(), v, 0);
}

/* ---- F32, F16, BF16 ---------------------------------------------------------------- */
INL __m512 load_w16(uint32_t type, const uint8_t *p, __mmask16 k)
{
    if (type == KVC_GGML_F32) return _mm512_maskz_loadu_ps(k, (const float *)(const void *)p);
    const __m256i h = _mm256_maskz_loadu_epi16(k, (const void *)p);
    if (type == KVC_GGML_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

INL void float_tile(const kvc__mm_job_t *j, uint32_t type, uint32_t r0, uint32_t o0, int NR, int NO)
{
    const uint32_t n = j->w->n_in, n16 = n & ~15u, es = type == KVC_GGML_F32 ? 4 : 2;
    const uint8_t *wp[4];
    const float *xp[4];
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int o = 0; o < NO; o++) wp[o] = kvc__mm_wrow(j, o0 + (uint32_t)o);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        xp[r] = j->x + (size_t)(r0 + (uint32_t)r) * n;
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) acc[r][o] = _mm512_setzero_ps();
    }
    for (uint32_t i = 0; i < n16; i += 16) {
        __m512 wv[4];
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) wv[o] = load_w16(type, wp[o] + (size_t)i * es, 0xFFFF);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m512 xv = _mm512_loadu_ps(xp[r] + i);
#pragma GCC unroll 4
            for (int o = 0; o < NO; o++) acc[r][o] = _mm512_fmadd_ps(wv[o], xv, acc[r][o]);
        }
    }
    if (n16 < n) { /* the same lanes, the missing ones zero */
        const __mmask16 k = (__mmask16)((1u << (n - n16)) - 1);
        __m512 wv[4];
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) wv[o] = load_w16(type, wp[o] + (size_t)n16 * es, k);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m512 xv = _mm512_maskz_loadu_ps(k, xp[r] + n16);
#pragma GCC unroll 4
            for (int o = 0; o < NO; o++) acc[r][o] = _mm512_fmadd_ps(wv[o], xv, acc[r][o]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++)
            j->y[(size_t)(r0 + (uint32_t)r) * j->w->n_out + o0 + (uint32_t)o] = hsum16(acc[r][o]);
}

/* ---- Q8_0, Q4_0 -------------------------------------------------------------------- */
/* 16 int32 lanes of the products of 64 signed int8 w and x (x never -128), exact. */
INL __m512i dot64(__m512i w, __m512i x)
{
    const __m512i sx = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
    const __m512i p = _mm512_maddubs_epi16(_mm512_abs_epi8(w), sx);
    return _mm512_madd_epi16(p, _mm512_set1_epi16(1));
}

/* The 32 weights of a block as int8 in a ymm. */
INL __m256i q32_load(uint32_t type, const uint8_t *blk)
{
    if (type == KVC_GGML_Q8_0) return _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2));
    const __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(blk + 2));
    const __m256i v =
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
}

INL void q32_tile(const kvc__mm_job_t *j, uint32_t type, uint32_t r0, uint32_t o0, int NR, int NO)
{
    const uint32_t nb = j->w->n_in / KVC__QK;
    const uint32_t bb = type == KVC_GGML_Q8_0 ? KVC__Q8_0_B : KVC__Q4_0_B;
    const uint8_t *wp[4];
    const int8_t *xq[4];
    const float *xd[4];
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int o = 0; o < NO; o++) wp[o] = kvc__mm_wrow(j, o0 + (uint32_t)o);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        xq[r] = kvc__mm_xq(j, r0 + (uint32_t)r);
        xd[r] = kvc__mm_xd(j, r0 + (uint32_t)r);
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) acc[r][o] = _mm512_setzero_ps();
    }
    uint32_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m512i wq[4];
        float d0[4], d1[4];
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) {
            const uint8_t *blk = wp[o] + (size_t)b * bb;
            d0[o] = f16(blk);
            d1[o] = f16(blk + bb);
            wq[o] = _mm512_inserti64x4(_mm512_castsi256_si512(q32_load(type, blk)),
                                       q32_load(type, blk + bb), 1);
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m512i xv = _mm512_loadu_si512((const void *)(xq[r] + 32 * b));
            const float dx0 = xd[r][b], dx1 = xd[r][b + 1];
#pragma GCC unroll 4
            for (int o = 0; o < NO; o++) {
                const __m512 s =
                    _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d0[o] * dx0)),
                                       _mm256_set1_ps(d1[o] * dx1), 1);
                acc[r][o] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot64(wq[o], xv)), s, acc[r][o]);
            }
        }
    }
    if (b < nb) { /* an odd last block, lanes 0..7 */
        __m512i wq[4];
        float d0[4];
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) {
            const uint8_t *blk = wp[o] + (size_t)b * bb;
            d0[o] = f16(blk);
            wq[o] = zext_si(q32_load(type, blk));
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m512i xv =
                zext_si(_mm256_loadu_si256((const __m256i *)(const void *)(xq[r] + 32 * b)));
            const float dx0 = xd[r][b];
#pragma GCC unroll 4
            for (int o = 0; o < NO; o++) {
                const __m512 s = zext_ps(_mm256_set1_ps(d0[o] * dx0));
                acc[r][o] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot64(wq[o], xv)), s, acc[r][o]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++)
            j->y[(size_t)(r0 + (uint32_t)r) * j->w->n_out + o0 + (uint32_t)o] = hsum16(acc[r][o]);
}

/* ---- Q4_K ---------------------------------------------------------------------------- */
INL void q4_k_scales(const uint8_t *packed, uint8_t out[16])
{
    uint32_t u[4];
    memcpy(u, packed, 12);
    const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
    u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
    const uint32_t aux = u[1] & m1;
    u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
    u[2] = aux;
    u[0] &= m1;
    memcpy(out, u, 16);
}

INL void q4_k_tile(const kvc__mm_job_t *j, uint32_t r0, uint32_t o0, int NR, int NO)
{
    const uint32_t nb = j->w->n_in / KVC__QK_K;
    const uint8_t *wp[4];
    const int8_t *xq[4];
    const float *xd[4];
    const int16_t *xb[4];
    __m512 acc[4][4];
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int o = 0; o < NO; o++) wp[o] = kvc__mm_wrow(j, o0 + (uint32_t)o);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        xq[r] = kvc__mm_xq(j, r0 + (uint32_t)r);
        xd[r] = kvc__mm_xd(j, r0 + (uint32_t)r);
        xb[r] = kvc__mm_xbsums(j, r0 + (uint32_t)r);
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) acc[r][o] = _mm512_setzero_ps();
    }
    for (uint32_t b = 0; b < nb; b++) {
        uint8_t sm[4][16];
        __m512i isum[4][4];
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) q4_k_scales(wp[o] + (size_t)b * KVC__Q4_K_B + 4, sm[o]);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
            for (int o = 0; o < NO; o++) isum[r][o] = _mm512_setzero_si512();
        for (int k = 0; k < 4; k++) {
            __m512i q[4], sv[4];
#pragma GCC unroll 4
            for (int o = 0; o < NO; o++) {
                const __m256i raw = _mm256_loadu_si256(
                    (const __m256i *)(const void *)(wp[o] + (size_t)b * KVC__Q4_K_B + 16 + 32 * k));
                const __m256i lo = _mm256_and_si256(raw, lo4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4);
                q[o] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                sv[o] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(sm[o][2 * k])),
                                           _mm256_set1_epi16(sm[o][2 * k + 1]), 1);
            }
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const __m512i x =
                    _mm512_loadu_si512((const void *)(xq[r] + (size_t)b * KVC__QK_K + 64 * k));
#pragma GCC unroll 4
                for (int o = 0; o < NO; o++)
                    isum[r][o] = _mm512_add_epi32(
                        isum[r][o], _mm512_madd_epi16(_mm512_maddubs_epi16(q[o], x), sv[o]));
            }
        }
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) {
            const uint8_t *blk = wp[o] + (size_t)b * KVC__Q4_K_B;
            const float dw = f16(blk), dmin = f16(blk + 2);
            const __m128i m8 = _mm_loadl_epi64((const __m128i *)(const void *)(sm[o] + 8));
            const __m256i mdup = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const __m256i bs =
                    _mm256_loadu_si256((const __m256i *)(const void *)(xb[r] + 16 * b));
                const __m512 mins = zext_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mdup)));
                const float dx = xd[r][b];
                acc[r][o] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][o]), _mm512_set1_ps(dw * dx),
                                            acc[r][o]);
                acc[r][o] = _mm512_fnmadd_ps(mins, _mm512_set1_ps(dmin * dx), acc[r][o]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++)
            j->y[(size_t)(r0 + (uint32_t)r) * j->w->n_out + o0 + (uint32_t)o] = hsum16(acc[r][o]);
}

/* ---- Q6_K ---------------------------------------------------------------------------- */
/* vpermw indices that spread 4 of the 16 int16 scales over the four 128-bit lanes of a zmm
 * (lane L gets scale g + L: the sub-block of 16 its 16 bytes of weights belong to). */
static const int16_t SC_IDX[4][32] __attribute__((aligned(64))) = {
#define KVC__I(g)                                                                               \
    {                                                                                           \
        g, g, g, g, g, g, g, g, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g + 2,  \
            g + 2, g + 2, g + 2, g + 2, g + 2, g + 2, g + 2, g + 3, g + 3, g + 3, g + 3, g + 3, \
            g + 3, g + 3, g + 3                                                                 \
    }
    KVC__I(0),
    KVC__I(4),
    KVC__I(8),
    KVC__I(12),
#undef KVC__I
};

INL void q6_k_tile(const kvc__mm_job_t *j, uint32_t r0, uint32_t o0, int NR, int NO)
{
    const uint32_t nb = j->w->n_in / KVC__QK_K;
    const uint8_t *wp[4];
    const int8_t *xq[4];
    const float *xd[4];
    const int16_t *xb[4];
    __m512 acc[4][4];
    const __m256i lo4 = _mm256_set1_epi8(0x0F), hi2 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 4
    for (int o = 0; o < NO; o++) wp[o] = kvc__mm_wrow(j, o0 + (uint32_t)o);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        xq[r] = kvc__mm_xq(j, r0 + (uint32_t)r);
        xd[r] = kvc__mm_xd(j, r0 + (uint32_t)r);
        xb[r] = kvc__mm_xbsums(j, r0 + (uint32_t)r);
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) acc[r][o] = _mm512_setzero_ps();
    }
    for (uint32_t b = 0; b < nb; b++) {
        __m512i isum[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
            for (int o = 0; o < NO; o++) isum[r][o] = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m512i q[4][2], sv[4][2];
#pragma GCC unroll 4
            for (int o = 0; o < NO; o++) {
                const uint8_t *blk = wp[o] + (size_t)b * KVC__Q6_K_B;
                const __m256i l0 =
                    _mm256_loadu_si256((const __m256i *)(const void *)(blk + 64 * h));
                const __m256i l1 =
                    _mm256_loadu_si256((const __m256i *)(const void *)(blk + 64 * h + 32));
                const __m256i qh =
                    _mm256_loadu_si256((const __m256i *)(const void *)(blk + 128 + 32 * h));
                const __m256i q1 = _mm256_or_si256(_mm256_and_si256(l0, lo4),
                                                   _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2));
                const __m256i q2 = _mm256_or_si256(_mm256_and_si256(l1, lo4),
                                                   _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2));
                const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4),
                                                   _mm256_and_si256(qh, hi2));
                const __m256i q4 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4),
                                                   _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2));
                q[o][0] = _mm512_inserti64x4(_mm512_castsi256_si512(q1), q2, 1);
                q[o][1] = _mm512_inserti64x4(_mm512_castsi256_si512(q3), q4, 1);
                const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(
                    _mm_loadu_si128((const __m128i *)(const void *)(blk + 192))));
#pragma GCC unroll 2
                for (int u = 0; u < 2; u++)
                    sv[o][u] = _mm512_permutexvar_epi16(
                        _mm512_load_si512((const void *)SC_IDX[2 * h + u]), sc16);
            }
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const int8_t *x = xq[r] + (size_t)b * KVC__QK_K + 128 * h;
#pragma GCC unroll 2
                for (int u = 0; u < 2; u++) {
                    const __m512i xv = _mm512_loadu_si512((const void *)(x + 64 * u));
#pragma GCC unroll 4
                    for (int o = 0; o < NO; o++)
                        isum[r][o] = _mm512_add_epi32(
                            isum[r][o],
                            _mm512_madd_epi16(_mm512_maddubs_epi16(q[o][u], xv), sv[o][u]));
                }
            }
        }
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) {
            const uint8_t *blk = wp[o] + (size_t)b * KVC__Q6_K_B;
            const float dw = f16(blk + 208);
            const __m256i sc16 =
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk + 192)));
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const __m256i bs =
                    _mm256_loadu_si256((const __m256i *)(const void *)(xb[r] + 16 * b));
                const __m512i off = zext_si(_mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5));
                const __m512i s = _mm512_sub_epi32(isum[r][o], off);
                acc[r][o] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(dw * xd[r][b]),
                                            acc[r][o]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++)
            j->y[(size_t)(r0 + (uint32_t)r) * j->w->n_out + o0 + (uint32_t)o] = hsum16(acc[r][o]);
}

/* ---- drivers (as in matmul_avx2.c) ---------------------------------------------------- */
#define DRIVER(name, TILE, NR_G, NO_G, NO_1)                                         \
    static void name(const kvc__mm_job_t *j)                                         \
    {                                                                                \
        uint32_t r = 0, o;                                                           \
        for (; r + NR_G <= j->n_rows; r += NR_G) {                                   \
            for (o = j->o0; o + NO_G <= j->o1; o += NO_G) TILE(j, r, o, NR_G, NO_G); \
            for (; o < j->o1; o++) TILE(j, r, o, NR_G, 1);                           \
        }                                                                            \
        for (; r < j->n_rows; r++) {                                                 \
            for (o = j->o0; o + NO_1 <= j->o1; o += NO_1) TILE(j, r, o, 1, NO_1);    \
            for (; o < j->o1; o++) TILE(j, r, o, 1, 1);                              \
        }                                                                            \
    }

#define F32_TILE(j, r, o, a, b)  float_tile(j, KVC_GGML_F32, r, o, a, b)
#define F16_TILE(j, r, o, a, b)  float_tile(j, KVC_GGML_F16, r, o, a, b)
#define BF16_TILE(j, r, o, a, b) float_tile(j, KVC_GGML_BF16, r, o, a, b)
#define Q8_0_TILE(j, r, o, a, b) q32_tile(j, KVC_GGML_Q8_0, r, o, a, b)
#define Q4_0_TILE(j, r, o, a, b) q32_tile(j, KVC_GGML_Q4_0, r, o, a, b)

DRIVER(mm_f32, F32_TILE, 4, 4, 4)
DRIVER(mm_f16, F16_TILE, 4, 4, 4)
DRIVER(mm_bf16, BF16_TILE, 4, 4, 4)
DRIVER(mm_q8_0, Q8_0_TILE, 4, 2, 4)
DRIVER(mm_q4_0, Q4_0_TILE, 4, 2, 4)
DRIVER(mm_q4_k, q4_k_tile, 4, 2, 2)
DRIVER(mm_q6_k, q6_k_tile, 4, 1, 2)

void kvc__mm_avx512(const kvc__mm_job_t *j)
{
    switch (j->w->type) {
    case KVC_GGML_F32:
        mm_f32(j);
        break;
    case KVC_GGML_F16:
        mm_f16(j);
        break;
    case KVC_GGML_BF16:
        mm_bf16(j);
        break;
    case KVC_GGML_Q8_0:
        mm_q8_0(j);
        break;
    case KVC_GGML_Q4_0:
        mm_q4_0(j);
        break;
    case KVC_GGML_Q4_K:
        mm_q4_k(j);
        break;
    default:
        mm_q6_k(j);
        break;
    }
}
