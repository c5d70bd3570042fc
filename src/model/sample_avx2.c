/* model/sample_avx2.c - the sampler's row kernels in AVX2 (sample_int.h): the same bits as
 * the scalar versions in sample.c, four doubles (eight floats) at a time. */
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include "model/sample_int.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>

float kvc__sample_sanitize_max_avx2(const float *in, float *w, uint32_t n)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY), fmax = _mm256_set1_ps(FLT_MAX);
    __m256 m = ninf;
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(in + i);
        __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
        x = _mm256_blendv_ps(_mm256_min_ps(x, fmax), ninf, nan);
        _mm256_storeu_ps(w + i, x);
        m = _mm256_max_ps(m, x);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    float best = -INFINITY;
    for (int j = 0; j < 8; j++) best = lanes[j] > best ? lanes[j] : best;
    for (; i < n; i++) {
        float x = in[i];
        x = x != x ? -INFINITY : (x > FLT_MAX ? FLT_MAX : x);
        w[i] = x;
        best = x > best ? x : best;
    }
    return best;
}

uint32_t kvc__sample_find_avx2(const float *w, uint32_t n, float v)
{
    const __m256 vv = _mm256_set1_ps(v);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(w + i), vv, _CMP_EQ_OQ));
        if (mask) return i + (uint32_t)__builtin_ctz((unsigned)mask);
    }
    for (; i < n; i++)
        if (w[i] == v) return i;
    return n;
}

static inline __m256d exp4(__m256d x)
{
    const __m256d lo = _mm256_set1_pd(KVC__EXP_LO);
    __m256d zero_mask = _mm256_cmp_pd(x, lo, _CMP_NGE_UQ); /* !(x >= lo), -inf included */
    x = _mm256_min_pd(x, _mm256_set1_pd(KVC__EXP_HI));
    x = _mm256_max_pd(x, lo);
    const __m256d shift = _mm256_set1_pd(KVC__EXP_SHIFT);
    __m256d t = _mm256_mul_pd(x, _mm256_set1_pd(KVC__EXP_LOG2E));
    t = _mm256_add_pd(t, shift);
    __m256d kd = _mm256_sub_pd(t, shift);
    __m256d hi = _mm256_mul_pd(kd, _mm256_set1_pd(KVC__EXP_LN2HI));
    __m256d lo2 = _mm256_mul_pd(kd, _mm256_set1_pd(KVC__EXP_LN2LO));
    __m256d r = _mm256_sub_pd(x, hi);
    r = _mm256_sub_pd(r, lo2);
    __m256d p;
    KVC__EXP_POLY(p, r, _mm256_mul_pd, _mm256_add_pd, _mm256_set1_pd);
    __m256i bits = _mm256_castpd_si256(t);
    bits = _mm256_slli_epi64(_mm256_add_epi64(bits, _mm256_set1_epi64x(1023)), 52);
    __m256d y = _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
    return _mm256_andnot_pd(zero_mask, y);
}

double kvc__sample_exp_sum_avx2(const float *w, uint32_t n, double ref, double scale, double *e)
{
    const __m256d vref = _mm256_set1_pd(ref), vscale = _mm256_set1_pd(scale);
    __m256d acc = _mm256_setzero_pd();
    uint32_t i = 0;
    if (e) {
        for (; i + 4 <= n; i += 4) {
            __m256d d = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(w + i)), vref);
            __m256d y = exp4(_mm256_mul_pd(d, vscale));
            _mm256_storeu_pd(e + i, y);
            acc = _mm256_add_pd(acc, y);
        }
    } else {
        for (; i + 4 <= n; i += 4) {
            __m256d d = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(w + i)), vref);
            acc = _mm256_add_pd(acc, exp4(_mm256_mul_pd(d, vscale)));
        }
    }
    double l[4];
    _mm256_storeu_pd(l, acc);
    if (i < n) {
        /* the tail through the same vector exp; lanes past the end add nothing */
        float pad[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        for (uint32_t j = 0; i + j < n; j++) pad[j] = w[i + j];
        __m256d d = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(pad)), vref);
        double y[4];
        _mm256_storeu_pd(y, exp4(_mm256_mul_pd(d, vscale)));
        for (uint32_t j = 0; i + j < n; j++) {
            if (e) e[i + j] = y[j];
            l[j] = l[j] + y[j];
        }
    }
    return (l[0] + l[1]) + (l[2] + l[3]);
}

static inline __m256 expf8(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(KVC__EXPF_LO);
    __m256 zero_mask = _mm256_cmp_ps(x, lo, _CMP_NGE_UQ);
    x = _mm256_min_ps(x, _mm256_set1_ps(KVC__EXPF_HI));
    x = _mm256_max_ps(x, lo);
    const __m256 shift = _mm256_set1_ps(KVC__EXPF_SHIFT);
    __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(KVC__EXPF_LOG2E));
    t = _mm256_add_ps(t, shift);
    __m256 kd = _mm256_sub_ps(t, shift);
    __m256 hi = _mm256_mul_ps(kd, _mm256_set1_ps(KVC__EXPF_LN2HI));
    __m256 lo2 = _mm256_mul_ps(kd, _mm256_set1_ps(KVC__EXPF_LN2LO));
    __m256 r = _mm256_sub_ps(x, hi);
    r = _mm256_sub_ps(r, lo2);
    __m256 p;
    KVC__EXPF_POLY(p, r, _mm256_mul_ps, _mm256_add_ps, _mm256_set1_ps);
    __m256i bits = _mm256_castps_si256(t);
    bits = _mm256_slli_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    return _mm256_andnot_ps(zero_mask, y);
}

double kvc__sample_expf_sum_avx2(const float *w, uint32_t n, float m, float scale, double *e)
{
    const __m256 vm = _mm256_set1_ps(m), vs = _mm256_set1_ps(scale);
    __m256d acc = _mm256_setzero_pd();
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 y = expf8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(w + i), vm), vs));
        __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(y));
        __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));
        _mm256_storeu_pd(e + i, a);
        _mm256_storeu_pd(e + i + 4, b);
        acc = _mm256_add_pd(acc, a);
        acc = _mm256_add_pd(acc, b);
    }
    double l[4];
    _mm256_storeu_pd(l, acc);
    if (i < n) {
        float pad[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                        -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        for (uint32_t j = 0; i + j < n; j++) pad[j] = w[i + j];
        float y[8];
        _mm256_storeu_ps(y, expf8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(pad), vm), vs)));
        for (uint32_t j = 0; i + j < n; j++) {
            e[i + j] = (double)y[j];
            l[j & 3] = l[j & 3] + (double)y[j];
        }
    }
    return (l[0] + l[1]) + (l[2] + l[3]);
}

void kvc__sample_hist_avx2(const float *w, const double *e, uint32_t n, float m, float scale,
                           double *mass, uint32_t n_bins)
{
    const __m256 vm = _mm256_set1_ps(m), vs = _mm256_set1_ps(scale);
    const __m256 vlast = _mm256_set1_ps((float)(n_bins - 1));
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 d = _mm256_mul_ps(_mm256_sub_ps(vm, _mm256_loadu_ps(w + i)), vs);
        uint32_t b[8];
        _mm256_storeu_si256((__m256i *)b, _mm256_cvttps_epi32(_mm256_min_ps(d, vlast)));
        for (int j = 0; j < 8; j++) mass[b[j]] += e[i + j];
    }
    for (; i < n; i++) {
        float d = (m - w[i]) * scale;
        uint32_t b = d < (float)(n_bins - 1) ? (uint32_t)d : n_bins - 1;
        mass[b] += e[i];
    }
}

void kvc__sample_split_avx2(const float *w, uint32_t n, float m, float scale, float lo, float hi,
                            uint32_t *cand, uint32_t *nc, uint32_t *tmp, uint32_t *nt)
{
    const __m256 vm = _mm256_set1_ps(m), vs = _mm256_set1_ps(scale);
    const __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
    uint32_t c = 0, t = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 d = _mm256_mul_ps(_mm256_sub_ps(vm, _mm256_loadu_ps(w + i)), vs);
        unsigned below = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(d, vlo, _CMP_LT_OQ));
        unsigned mid = (unsigned)_mm256_movemask_ps(
            _mm256_and_ps(_mm256_cmp_ps(d, vlo, _CMP_GE_OQ), _mm256_cmp_ps(d, vhi, _CMP_LT_OQ)));
        for (; below; below &= below - 1) cand[c++] = i + (uint32_t)__builtin_ctz(below);
        for (; mid; mid &= mid - 1) tmp[t++] = i + (uint32_t)__builtin_ctz(mid);
    }
    for (; i < n; i++) {
        float d = (m - w[i]) * scale;
        if (d < lo) cand[c++] = i;
        if (d >= lo && d < hi) tmp[t++] = i;
    }
    *nc = c;
    *nt = t;
}

uint32_t kvc__sample_above_avx2(const float *w, uint32_t from, uint32_t n, float v)
{
    const __m256 vv = _mm256_set1_ps(v);
    uint32_t i = from;
    for (; i + 8 <= n; i += 8) {
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(w + i), vv, _CMP_GT_OQ));
        if (mask) return i + (uint32_t)__builtin_ctz((unsigned)mask);
    }
    for (; i < n; i++)
        if (w[i] > v) return i;
    return n;
}
