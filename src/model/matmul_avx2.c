/* matmul_avx2.c - the AVX2 matrix kernels (AVX2, FMA, F16C).  Every kernel works in tiles of
 * NR rows of x by NO outputs, with one accumulator per (row, output) that no other element
 * touches; a tile only shares the loads and the decoding of the weights between its rows.  The
 * per-element instructions are the same for every tile shape (4 x 2, 1 x 4, 1 x 1, ...), so an
 * output's bits do not depend on the tile it falls in, hence not on the batch:
 *
 *   F32, F16, BF16  one 8-lane accumulator, element i into lane i % 8 by FMA, in order of i; the
 *                   last n_in % 8 elements zero-padded; then the fixed fold of hsum8
 *   Q8_0, Q4_0      per block of 32, the int8 products summed exactly into 8 int32 lanes
 *                   (maddubs + madd; element i in lane i / 4), then
 *                   acc = fma(float(lanes), d_w * d_x, acc)
 *   Q4_K            per block of 256, 8 int32 lanes of sum sc_j * q * x (exact), acc =
 *                   fma(lanes, d * d_x, acc), then acc = fnma(mins lanes, dmin * d_x, acc)
 *   Q6_K            per block of 256, 8 int32 lanes of sum sc_j * (q - 32) * x (exact), then
 *                   acc = fma(lanes, d * d_x, acc) */
#include "model/matmul_int.h"

#include <immintrin.h>

#define INL static inline __attribute__((always_inline))

INL float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INL float f16(const uint8_t *p)
{
    return _cvtsh_ss(kvc__mm_u16(p));
}

/* ---- F32, F16, BF16 ---------------------------------------------------------------- */
INL __m256 load_w8(uint32_t type, const uint8_t *p)
{
    if (type == KVC_GGML_F32) return _mm256_loadu_ps((const float *)(const void *)p);
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    if (type == KVC_GGML_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

INL void float_tile(const kvc__mm_job_t *j, uint32_t type, uint32_t r0, uint32_t o0, uint32_t os,
                    int NR, int NO)
{
    const uint32_t n = j->w->n_in, n8 = n & ~7u, es = type == KVC_GGML_F32 ? 4 : 2;
    const uint8_t *wp[4];
    const float *xp[4];
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int o = 0; o < NO; o++) wp[o] = kvc__mm_wrow(j, o0 + (uint32_t)o * os);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        xp[r] = j->x + (size_t)(r0 + (uint32_t)r) * n;
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) acc[r][o] = _mm256_setzero_ps();
    }
    for (uint32_t i = 0; i < n8; i += 8) {
        __m256 wv[4];
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) wv[o] = load_w8(type, wp[o] + (size_t)i * es);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m256 xv = _mm256_loadu_ps(xp[r] + i);
#pragma GCC unroll 4
            for (int o = 0; o < NO; o++) acc[r][o] = _mm256_fmadd_ps(wv[o], xv, acc[r][o]);
        }
    }
    if (n8 < n) { /* the same lanes, zero-padded */
        __m256 wv[4];
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) {
            uint8_t buf[32] = {0};
            memcpy(buf, wp[o] + (size_t)n8 * es, (n - n8) * es);
            wv[o] = load_w8(type, buf);
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            float xb[8] = {0};
            memcpy(xb, xp[r] + n8, (n - n8) * sizeof(float));
            const __m256 xv = _mm256_loadu_ps(xb);
#pragma GCC unroll 4
            for (int o = 0; o < NO; o++) acc[r][o] = _mm256_fmadd_ps(wv[o], xv, acc[r][o]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++)
            j->y[(size_t)(r0 + (uint32_t)r) * j->w->n_out + o0 + (uint32_t)o * os] =
                hsum8(acc[r][o]);
}

/* ---- Q8_0, Q4_0 -------------------------------------------------------------------- */
/* Q4_0's 32 nibbles as they are (0..15): byte p is element p. */
INL __m256i q4_0_unpack(const uint8_t *b)
{
    const __m128i q = _mm_loadu_si128((const __m128i *)(const void *)(b + 2));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

/* Q8_0 and Q4_0.  A Q4_0 block's lanes are those of maddubs(nibbles, x) less the row's
 * offsets 8 (x[4k] + ... + x[4k + 3]): the same integers as the products with q - 8. */
INL void q32_tile(const kvc__mm_job_t *j, uint32_t type, uint32_t r0, uint32_t o0, uint32_t os,
                  int NR, int NO)
{
    const uint32_t nb = j->w->n_in / KVC__QK,
                   bb = type == KVC_GGML_Q8_0 ? KVC__Q8_0_B : KVC__Q4_0_B;
    const uint8_t *wp[4];
    const int8_t *xq[4];
    const float *xd[4];
    const int32_t *xo[4];
    __m256 acc[4][4];
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int o = 0; o < NO; o++) wp[o] = kvc__mm_wrow(j, o0 + (uint32_t)o * os);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        xq[r] = kvc__mm_xq(j, r0 + (uint32_t)r);
        xd[r] = kvc__mm_xd(j, r0 + (uint32_t)r);
        xo[r] = type == KVC_GGML_Q4_0 ? kvc__mm_xoff(j, r0 + (uint32_t)r) : NULL;
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) acc[r][o] = _mm256_setzero_ps();
    }
    for (uint32_t b = 0; b < nb; b++) {
        __m256i wq[4], wa[4];
        __m256 dw[4];
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) {
            const uint8_t *blk = wp[o] + (size_t)b * bb;
            dw[o] = _mm256_set1_ps(f16(blk));
            if (type == KVC_GGML_Q8_0) {
                wq[o] = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2));
                wa[o] = _mm256_sign_epi8(wq[o], wq[o]);
            } else {
                wq[o] = wa[o] = q4_0_unpack(blk);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(xq[r] + 32 * b));
            const __m256 dx = _mm256_broadcast_ss(xd[r] + b);
            __m256i off = _mm256_setzero_si256();
            if (type == KVC_GGML_Q4_0)
                off = _mm256_loadu_si256((const __m256i *)(const void *)(xo[r] + 8 * b));
#pragma GCC unroll 4
            for (int o = 0; o < NO; o++) {
                __m256i p;
                if (type == KVC_GGML_Q8_0)
                    p = _mm256_madd_epi16(_mm256_maddubs_epi16(wa[o], _mm256_sign_epi8(xv, wq[o])),
                                          ones);
                else
                    p = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(wa[o], xv), ones),
                                         off);
                acc[r][o] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw[o], dx), acc[r][o]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++)
            j->y[(size_t)(r0 + (uint32_t)r) * j->w->n_out + o0 + (uint32_t)o * os] =
                hsum8(acc[r][o]);
}

/* ---- Q4_K ---------------------------------------------------------------------------- */
/* The 8 scales (bytes 0..7) and 8 mins (bytes 8..15) of a Q4_K block, as ggml unpacks them. */
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

INL void q4_k_tile(const kvc__mm_job_t *j, uint32_t r0, uint32_t o0, uint32_t os, int NR, int NO)
{
    const uint32_t nb = j->w->n_in / KVC__QK_K;
    const uint8_t *wp[4];
    const int8_t *xq[4];
    const float *xd[4];
    const int16_t *xb[4];
    __m256 acc[4][4];
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int o = 0; o < NO; o++) wp[o] = kvc__mm_wrow(j, o0 + (uint32_t)o * os);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        xq[r] = kvc__mm_xq(j, r0 + (uint32_t)r);
        xd[r] = kvc__mm_xd(j, r0 + (uint32_t)r);
        xb[r] = kvc__mm_xbsums(j, r0 + (uint32_t)r);
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) acc[r][o] = _mm256_setzero_ps();
    }
    for (uint32_t b = 0; b < nb; b++) {
        uint8_t sm[4][16];
        __m256i isum[4][4], sc[4];
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) {
            q4_k_scales(wp[o] + (size_t)b * KVC__Q4_K_B + 4, sm[o]);
            /* the 8 scales as int16, in both halves, for the byte shuffles below */
            sc[o] = _mm256_broadcastsi128_si256(
                _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)sm[o])));
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
            for (int o = 0; o < NO; o++) isum[r][o] = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            __m256i lo[4], hi[4], s0[4], s1[4];
            const __m256i i0 = _mm256_set1_epi16((short)(0x0100 * (4 * k + 1) + 4 * k));
            const __m256i i1 = _mm256_set1_epi16((short)(0x0100 * (4 * k + 3) + 4 * k + 2));
#pragma GCC unroll 4
            for (int o = 0; o < NO; o++) {
                const __m256i q = _mm256_loadu_si256(
                    (const __m256i *)(const void *)(wp[o] + (size_t)b * KVC__Q4_K_B + 16 + 32 * k));
                lo[o] = _mm256_and_si256(q, lo4);
                hi[o] = _mm256_and_si256(_mm256_srli_epi16(q, 4), lo4);
                s0[o] = _mm256_shuffle_epi8(sc[o], i0);
                s1[o] = _mm256_shuffle_epi8(sc[o], i1);
            }
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const int8_t *x = xq[r] + (size_t)b * KVC__QK_K + 64 * k;
                const __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)x);
                const __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(x + 32));
#pragma GCC unroll 4
                for (int o = 0; o < NO; o++) {
                    const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo[o], x0), s0[o]);
                    const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi[o], x1), s1[o]);
                    isum[r][o] = _mm256_add_epi32(isum[r][o], _mm256_add_epi32(p0, p1));
                }
            }
        }
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) {
            const uint8_t *blk = wp[o] + (size_t)b * KVC__Q4_K_B;
            const float dw = f16(blk), dmin = f16(blk + 2);
            __m128i m8 = _mm_loadl_epi64((const __m128i *)(const void *)(sm[o] + 8));
            const __m256i mdup = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const __m256i bs =
                    _mm256_loadu_si256((const __m256i *)(const void *)(xb[r] + 16 * b));
                const __m256i mins = _mm256_madd_epi16(bs, mdup);
                const float dx = xd[r][b];
                acc[r][o] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][o]), _mm256_set1_ps(dw * dx),
                                            acc[r][o]);
                acc[r][o] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_set1_ps(dmin * dx),
                                             acc[r][o]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++)
            j->y[(size_t)(r0 + (uint32_t)r) * j->w->n_out + o0 + (uint32_t)o * os] =
                hsum8(acc[r][o]);
}

/* ---- Q6_K ---------------------------------------------------------------------------- */
INL void q6_k_tile(const kvc__mm_job_t *j, uint32_t r0, uint32_t o0, uint32_t os, int NR, int NO)
{
    const uint32_t nb = j->w->n_in / KVC__QK_K;
    const uint8_t *wp[4];
    const int8_t *xq[4];
    const float *xd[4];
    const int16_t *xb[4];
    __m256 acc[4][4];
    const __m256i lo4 = _mm256_set1_epi8(0x0F), hi2 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 4
    for (int o = 0; o < NO; o++) wp[o] = kvc__mm_wrow(j, o0 + (uint32_t)o * os);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        xq[r] = kvc__mm_xq(j, r0 + (uint32_t)r);
        xd[r] = kvc__mm_xd(j, r0 + (uint32_t)r);
        xb[r] = kvc__mm_xbsums(j, r0 + (uint32_t)r);
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++) acc[r][o] = _mm256_setzero_ps();
    }
    for (uint32_t b = 0; b < nb; b++) {
        __m256i isum[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
            for (int o = 0; o < NO; o++) isum[r][o] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i q[4][4], sv[4][4];
#pragma GCC unroll 4
            for (int o = 0; o < NO; o++) {
                const uint8_t *blk = wp[o] + (size_t)b * KVC__Q6_K_B;
                const int8_t *sc = (const int8_t *)(blk + 192) + 8 * h;
                const __m256i l0 =
                    _mm256_loadu_si256((const __m256i *)(const void *)(blk + 64 * h));
                const __m256i l1 =
                    _mm256_loadu_si256((const __m256i *)(const void *)(blk + 64 * h + 32));
                const __m256i qh =
                    _mm256_loadu_si256((const __m256i *)(const void *)(blk + 128 + 32 * h));
                q[o][0] = _mm256_or_si256(_mm256_and_si256(l0, lo4),
                                          _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2));
                q[o][1] = _mm256_or_si256(_mm256_and_si256(l1, lo4),
                                          _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2));
                q[o][2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4),
                                          _mm256_and_si256(qh, hi2));
                q[o][3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4),
                                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2));
#pragma GCC unroll 4
                for (int t = 0; t < 4; t++)
                    sv[o][t] =
                        _mm256_set_m128i(_mm_set1_epi16(sc[2 * t + 1]), _mm_set1_epi16(sc[2 * t]));
            }
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const int8_t *x = xq[r] + (size_t)b * KVC__QK_K + 128 * h;
#pragma GCC unroll 4
                for (int t = 0; t < 4; t++) {
                    const __m256i xv =
                        _mm256_loadu_si256((const __m256i *)(const void *)(x + 32 * t));
#pragma GCC unroll 4
                    for (int o = 0; o < NO; o++)
                        isum[r][o] = _mm256_add_epi32(
                            isum[r][o],
                            _mm256_madd_epi16(_mm256_maddubs_epi16(q[o][t], xv), sv[o][t]));
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
                const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
                const __m256i s = _mm256_sub_epi32(isum[r][o], off);
                acc[r][o] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * xd[r][b]),
                                            acc[r][o]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int o = 0; o < NO; o++)
            j->y[(size_t)(r0 + (uint32_t)r) * j->w->n_out + o0 + (uint32_t)o * os] =
                hsum8(acc[r][o]);
}

/* ---- drivers ----------------------------------------------------------------------------
 * Row tiles of NR_G rows by NO_G consecutive outputs (then single outputs).  Single rows (the
 * decode step) take tiles of NO_1 outputs spaced a quarter of the job's range apart, so the
 * tile's NO_1 weight rows are NO_1 long sequential streams through the matrix that the
 * hardware prefetchers follow from tile to tile; with consecutive outputs every tile would
 * start NO_1 - 1 streams cold, which costs a third of the bandwidth on 1280-element rows.
 * Which outputs share a tile never changes an output's bits. */
#define DRIVER(name, TILE, NR_G, NO_G, NO_1)                                            \
    static void name(const kvc__mm_job_t *j)                                            \
    {                                                                                   \
        uint32_t r = 0, o;                                                              \
        for (; r + NR_G <= j->n_rows; r += NR_G) {                                      \
            for (o = j->o0; o + NO_G <= j->o1; o += NO_G) TILE(j, r, o, 1, NR_G, NO_G); \
            for (; o < j->o1; o++) TILE(j, r, o, 1, NR_G, 1);                           \
        }                                                                               \
        const uint32_t q = (j->o1 - j->o0) / NO_1;                                      \
        for (; r < j->n_rows; r++) {                                                    \
            for (o = j->o0; o < j->o0 + q; o++) TILE(j, r, o, q, 1, NO_1);              \
            for (o = j->o0 + q * NO_1; o < j->o1; o++) TILE(j, r, o, 1, 1, 1);          \
        }                                                                               \
    }

#define F32_TILE(j, r, o, s, a, b)  float_tile(j, KVC_GGML_F32, r, o, s, a, b)
#define F16_TILE(j, r, o, s, a, b)  float_tile(j, KVC_GGML_F16, r, o, s, a, b)
#define BF16_TILE(j, r, o, s, a, b) float_tile(j, KVC_GGML_BF16, r, o, s, a, b)
#define Q8_0_TILE(j, r, o, s, a, b) q32_tile(j, KVC_GGML_Q8_0, r, o, s, a, b)
#define Q4_0_TILE(j, r, o, s, a, b) q32_tile(j, KVC_GGML_Q4_0, r, o, s, a, b)

DRIVER(mm_f32, F32_TILE, 4, 3, 4)
DRIVER(mm_f16, F16_TILE, 4, 3, 4)
DRIVER(mm_bf16, BF16_TILE, 4, 3, 4)
DRIVER(mm_q8_0, Q8_0_TILE, 4, 2, 4)
DRIVER(mm_q4_0, Q4_0_TILE, 4, 2, 4)
DRIVER(mm_q4_k, q4_k_tile, 4, 1, 2)
DRIVER(mm_q6_k, q6_k_tile, 4, 1, 2)

void kvc__mm_avx2(const kvc__mm_job_t *j)
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
