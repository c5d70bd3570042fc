/* quant_avx512.c - bulk quantisation with AVX-512, 16 values per step.
 * Lane for lane the same integer rounding as kvc__encode (attn_int.h), so
 * the bits and the clip counts equal the scalar version's; the tail that
 * does not fill a vector goes through the scalar version. */
#include "attn/attn_int.h"

#include <immintrin.h>

/* Codes of 16 quotients y (RNE, saturating, NaN to NaN), as 32-bit lanes. */
static inline __m512i encode16(__m512 y, const kvc__fmt_t *f)
{
    const __m512i u = _mm512_castps_si512(y);
    const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __m512i sign = _mm512_slli_epi32(_mm512_srli_epi32(u, 31), f->width - 1);
    const int sh = 23 - f->mbits;
    /* normal results */
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, sh), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32((1 << (sh - 1)) - 1)), lsb);
    __m512i code =
        _mm512_sub_epi32(_mm512_srli_epi32(r, sh), _mm512_set1_epi32((127 - f->bias) << f->mbits));
    if (f->bias != 127) {
        /* results below the smallest normal: n = RNE(M >> s) */
        const __m512i min_normal = _mm512_set1_epi32((127 + 1 - f->bias) << 23);
        __mmask16 sub = _mm512_cmplt_epu32_mask(a, min_normal);
        if (sub) {
            __m512i e = _mm512_srli_epi32(a, 23);
            __m512i m = _mm512_or_si512(_mm512_and_si512(a, _mm512_set1_epi32(0x7fffff)),
                                        _mm512_set1_epi32(0x800000));
            __m512i s = _mm512_sub_epi32(_mm512_set1_epi32(150 + 1 - f->bias - f->mbits), e);
            __m512i half =
                _mm512_sllv_epi32(_mm512_set1_epi32(1), _mm512_sub_epi32(s, _mm512_set1_epi32(1)));
            __m512i sl = _mm512_and_si512(_mm512_srlv_epi32(m, s), _mm512_set1_epi32(1));
            __m512i n = _mm512_add_epi32(_mm512_add_epi32(m, half), sl);
            n = _mm512_srlv_epi32(_mm512_sub_epi32(n, _mm512_set1_epi32(1)), s);
            /* shifts of 26 and more give 0, as in the scalar version (e = 0 included) */
            __mmask16 far = _mm512_cmpgt_epi32_mask(s, _mm512_set1_epi32(25));
            n = _mm512_mask_mov_epi32(n, far, _mm512_setzero_si512());
            code = _mm512_mask_mov_epi32(code, sub, n);
        }
    }
    __mmask16 sat = _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32((int)f->max_bits));
    code = _mm512_mask_mov_epi32(code, sat, _mm512_set1_epi32((int)f->max_code));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000));
    code = _mm512_mask_mov_epi32(code, nan, _mm512_set1_epi32((int)f->nan_code));
    return _mm512_or_si512(code, sign);
}

void kvc__quantize_avx512(kvc_dtype_t dt, void *dst, const float *src, size_t n, float scale,
                          const float *scales, kvc_quant_stats_t *st)
{
    const kvc__fmt_t *f = kvc__fmt(dt);
    const __m512i clipb = _mm512_set1_epi32((int)kvc__clip_bits(dt));
    const __m512i expmask = _mm512_set1_epi32(0x7f800000);
    const __m512 vscale = _mm512_set1_ps(scale);
    uint64_t clipped = 0, nonfinite = 0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(src + i);
        __m512 y = _mm512_div_ps(x, scales ? _mm512_loadu_ps(scales + i) : vscale);
        __mmask16 nf =
            _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), expmask), expmask);
        __mmask16 big = _mm512_cmpge_epu32_mask(_mm512_castps_si512(_mm512_abs_ps(y)), clipb);
        nonfinite += (uint64_t)__builtin_popcount(nf);
        clipped += (uint64_t)__builtin_popcount(big & (__mmask16)~nf);
        if (!f) {
            _mm512_storeu_ps((float *)dst + i, y);
        } else if (f->width == 8) {
            _mm_storeu_si128((__m128i *)((uint8_t *)dst + i), _mm512_cvtepi32_epi8(encode16(y, f)));
        } else {
            _mm256_storeu_si256((__m256i *)((uint16_t *)dst + i),
                                _mm512_cvtepi32_epi16(encode16(y, f)));
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
