/* quant_avx2.c - bulk quantisation with AVX2, 8 values per vector.  Lane
 * for lane the same integer rounding as kvc__encode (attn_int.h), so the
 * bits and clip counts equal the scalar version's; tails go through it. */
#include "attn/attn_int.h"

#include <immintrin.h>

static inline __m256i set1(uint32_t v)
{
    return _mm256_set1_epi32((int)v);
}

/* a >= b, unsigned, as a lane mask */
static inline __m256i cmpge_u32(__m256i a, __m256i b)
{
    return _mm256_cmpeq_epi32(_mm256_max_epu32(a, b), a);
}

static inline __m256i encode8(__m256 y, const kvc__fmt_t *f)
{
    const __m256i u = _mm256_castps_si256(y);
    const __m256i a = _mm256_and_si256(u, set1(0x7fffffff));
    const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(u, 31), f->width - 1);
    const int sh = 23 - f->mbits;
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, sh), set1(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(a, set1((1u << (sh - 1)) - 1)), lsb);
    __m256i code =
        _mm256_sub_epi32(_mm256_srli_epi32(r, sh), set1((uint32_t)(127 - f->bias) << f->mbits));
    if (f->bias != 127) {
        const __m256i min_normal = set1((uint32_t)(127 + 1 - f->bias) << 23);
        __m256i sub = _mm256_xor_si256(cmpge_u32(a, min_normal), set1(0xffffffffu));
        if (!_mm256_testz_si256(sub, sub)) {
            __m256i e = _mm256_srli_epi32(a, 23);
            __m256i m = _mm256_or_si256(_mm256_and_si256(a, set1(0x7fffff)), set1(0x800000));
            __m256i s = _mm256_sub_epi32(set1((uint32_t)(150 + 1 - f->bias - f->mbits)), e);
            __m256i half = _mm256_sllv_epi32(set1(1), _mm256_sub_epi32(s, set1(1)));
            __m256i sl = _mm256_and_si256(_mm256_srlv_epi32(m, s), set1(1));
            __m256i n = _mm256_add_epi32(_mm256_add_epi32(m, half), sl);
            n = _mm256_srlv_epi32(_mm256_sub_epi32(n, set1(1)), s);
            __m256i far = _mm256_cmpgt_epi32(s, set1(25));
            n = _mm256_andnot_si256(far, n);
            code = _mm256_blendv_epi8(code, n, sub);
        }
    }
    __m256i sat = cmpge_u32(a, set1(f->max_bits));
    code = _mm256_blendv_epi8(code, set1(f->max_code), sat);
    __m256i nan = _mm256_xor_si256(cmpge_u32(set1(0x7f800000), a), set1(0xffffffffu));
    code = _mm256_blendv_epi8(code, set1(f->nan_code), nan);
    return _mm256_or_si256(code, sign);
}

/* Quotients of 8 values, with their clip and non-finite counts. */
static inline __m256 quotient8(const float *src, const float *scales, __m256 vscale, __m256i clipb,
                               uint64_t *clipped, uint64_t *nonfinite)
{
    const __m256i expmask = set1(0x7f800000);
    __m256 x = _mm256_loadu_ps(src);
    __m256 y = _mm256_div_ps(x, scales ? _mm256_loadu_ps(scales) : vscale);
    __m256 nf = _mm256_castsi256_ps(
        _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x), expmask), expmask));
    __m256i absy = _mm256_and_si256(_mm256_castps_si256(y), set1(0x7fffffff));
    __m256 big = _mm256_andnot_ps(nf, _mm256_castsi256_ps(cmpge_u32(absy, clipb)));
    *nonfinite += (uint64_t)__builtin_popcount((unsigned)_mm256_movemask_ps(nf));
    *clipped += (uint64_t)__builtin_popcount((unsigned)_mm256_movemask_ps(big));
    return y;
}

void kvc__quantize_avx2(kvc_dtype_t dt, void *dst, const float *src, size_t n, float scale,
                        const float *scales, kvc_quant_stats_t *st)
{
    const kvc__fmt_t *f = kvc__fmt(dt);
    const __m256i clipb = set1(kvc__clip_bits(dt));
    const __m256 vscale = _mm256_set1_ps(scale);
    uint64_t clipped = 0, nonfinite = 0;
    const size_t step = !f ? 8 : f->width == 8 ? 32 : 16;
    size_t i = 0;
    for (; i + step <= n; i += step) {
        const float *sc = scales ? scales + i : NULL;
        if (!f) {
            __m256 y = quotient8(src + i, sc, vscale, clipb, &clipped, &nonfinite);
            _mm256_storeu_ps((float *)dst + i, y);
        } else if (f->width == 16) {
            __m256i c0 = encode8(quotient8(src + i, sc, vscale, clipb, &clipped, &nonfinite), f);
            __m256i c1 = encode8(
                quotient8(src + i + 8, sc ? sc + 8 : NULL, vscale, clipb, &clipped, &nonfinite), f);
            __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(c0, c1), 0xd8);
            _mm256_storeu_si256((__m256i *)((uint16_t *)dst + i), w);
        } else {
            __m256i c[4];
            for (int j = 0; j < 4; j++)
                c[j] = encode8(quotient8(src + i + 8 * j, sc ? sc + 8 * j : NULL, vscale, clipb,
                                         &clipped, &nonfinite),
                               f);
            __m256i w01 = _mm256_packus_epi32(c[0], c[1]), w23 = _mm256_packus_epi32(c[2], c[3]);
            __m256i b = _mm256_packus_epi16(w01, w23);
            b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)((uint8_t *)dst + i), b);
        }
    }
    if (st) {
        st->n_values += i;
        st->n_clipped += clipped;
        st->n_nonfinite += nonfinite;
    }
    if (i < n) {
        size_t el = kvc_dtype_bytes(dt);
        kvc__quantize_scalar(dt, (uint8_t *)dst + i * el, src + i, n - i, scale,
                             scales ? scales + i : NULL, st);
    }
}
