/* model/sample_int.h - internal to the sampler: its two row kernels (sample.c has the scalar
 * versions, sample_avx2.c the AVX2 ones) and the exp they share.
 *
 * Every version computes the same bits: the same operations in the same order, no fused
 * multiply-add (sample_avx2.c turns contraction off), sums over 4 interleaved lanes
 * combined as (l0 + l1) + (l2 + l3).  So which version runs never changes a sample. */
#ifndef KVC_MODEL_SAMPLE_INT_H
#define KVC_MODEL_SAMPLE_INT_H

#include <stdint.h>
#include <string.h>

/* exp(x) for the softmax: 0 below -708 (and for -inf), x clamped to 709 above; a degree-11
 * Taylor polynomial (Estrin) on r = x - k ln 2, |r| <= ln(2)/2 (truncation error 6e-15 relative),
 * times 2^k.  Within about 30 ulp of libm's exp: far below what a float logit carries. */
#define KVC__EXP_LOG2E 0x1.71547652b82fep0
#define KVC__EXP_SHIFT 0x1.8p52
#define KVC__EXP_LN2HI 6.93147180369123816490e-01
#define KVC__EXP_LN2LO 1.90821492927058770002e-10
#define KVC__EXP_LO    -708.0
#define KVC__EXP_HI    709.0
#define KVC__EXP_C11   (1.0 / 39916800.0)
#define KVC__EXP_C10   (1.0 / 3628800.0)
#define KVC__EXP_C9    (1.0 / 362880.0)
#define KVC__EXP_C8    (1.0 / 40320.0)
#define KVC__EXP_C7    (1.0 / 5040.0)
#define KVC__EXP_C6    (1.0 / 720.0)
#define KVC__EXP_C5    (1.0 / 120.0)
#define KVC__EXP_C4    (1.0 / 24.0)
#define KVC__EXP_C3    (1.0 / 6.0)
#define KVC__EXP_C2    0.5
#define KVC__EXP_C1    1.0
#define KVC__EXP_C0    1.0

/* The polynomial by Estrin's scheme (a short dependency chain, so a vector loop is not
 * bound by latency), written once for the scalar and the vector versions: MUL and ADD are
 * the two operations, C makes a constant. */
#define KVC__EXP_POLY(p, r, MUL, ADD, C)                                   \
    do {                                                                   \
        __typeof__(r) r2_ = MUL(r, r);                                     \
        __typeof__(r) r4_ = MUL(r2_, r2_);                                 \
        __typeof__(r) r8_ = MUL(r4_, r4_);                                 \
        __typeof__(r) q0_ = ADD(C(KVC__EXP_C0), MUL(C(KVC__EXP_C1), r));   \
        __typeof__(r) q1_ = ADD(C(KVC__EXP_C2), MUL(C(KVC__EXP_C3), r));   \
        __typeof__(r) q2_ = ADD(C(KVC__EXP_C4), MUL(C(KVC__EXP_C5), r));   \
        __typeof__(r) q3_ = ADD(C(KVC__EXP_C6), MUL(C(KVC__EXP_C7), r));   \
        __typeof__(r) q4_ = ADD(C(KVC__EXP_C8), MUL(C(KVC__EXP_C9), r));   \
        __typeof__(r) q5_ = ADD(C(KVC__EXP_C10), MUL(C(KVC__EXP_C11), r)); \
        __typeof__(r) s0_ = ADD(q0_, MUL(q1_, r2_));                       \
        __typeof__(r) s1_ = ADD(q2_, MUL(q3_, r2_));                       \
        __typeof__(r) s2_ = ADD(q4_, MUL(q5_, r2_));                       \
        p = ADD(ADD(s0_, MUL(s1_, r4_)), MUL(s2_, r8_));                   \
    } while (0)

static inline double kvc__smul(double a, double b)
{
    return a * b;
}
static inline double kvc__sadd(double a, double b)
{
    return a + b;
}
#define KVC__SCONST(c) (c)

static inline double kvc__sample_exp(double x)
{
    if (!(x >= KVC__EXP_LO)) return 0.0;
    if (x > KVC__EXP_HI) x = KVC__EXP_HI;
    double t = x * KVC__EXP_LOG2E;
    t = t + KVC__EXP_SHIFT;
    double kd = t - KVC__EXP_SHIFT;
    double hi = kd * KVC__EXP_LN2HI, lo = kd * KVC__EXP_LN2LO;
    double r = x - hi;
    r = r - lo;
    double p;
    KVC__EXP_POLY(p, r, kvc__smul, kvc__sadd, KVC__SCONST);
    uint64_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits + 1023) << 52;
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* expf for the draw's weights, in float: 0 below -87 (and for -inf), x clamped to 88 above;
 * a degree-7 Taylor polynomial on |r| <= ln(2)/2 (truncation error 5e-9 relative, under a
 * float ulp), times 2^k.  Only the weights the draw walks use it: the logprobs and the
 * truncations' masses stay in double. */
#define KVC__EXPF_LOG2E 0x1.715476p0f
#define KVC__EXPF_SHIFT 0x1.8p23f
#define KVC__EXPF_LN2HI 0x1.62e400p-1f /* ln 2 with its low 12 bits cleared: k * HI is exact */
#define KVC__EXPF_LN2LO 0x1.7f7d1cp-20f
#define KVC__EXPF_LO    -87.0f
#define KVC__EXPF_HI    88.0f

#define KVC__EXPF_POLY(p, r, MUL, ADD, C)                                     \
    do {                                                                      \
        __typeof__(r) r2_ = MUL(r, r);                                        \
        __typeof__(r) r4_ = MUL(r2_, r2_);                                    \
        __typeof__(r) q0_ = ADD(C(1.0f), MUL(C(1.0f), r));                    \
        __typeof__(r) q1_ = ADD(C(0.5f), MUL(C(1.0f / 6.0f), r));             \
        __typeof__(r) q2_ = ADD(C(1.0f / 24.0f), MUL(C(1.0f / 120.0f), r));   \
        __typeof__(r) q3_ = ADD(C(1.0f / 720.0f), MUL(C(1.0f / 5040.0f), r)); \
        p = ADD(ADD(q0_, MUL(q1_, r2_)), MUL(ADD(q2_, MUL(q3_, r2_)), r4_));  \
    } while (0)

static inline float kvc__smulf(float a, float b)
{
    return a * b;
}
static inline float kvc__saddf(float a, float b)
{
    return a + b;
}

static inline float kvc__sample_expf(float x)
{
    if (!(x >= KVC__EXPF_LO)) return 0.0f;
    if (x > KVC__EXPF_HI) x = KVC__EXPF_HI;
    float t = x * KVC__EXPF_LOG2E;
    t = t + KVC__EXPF_SHIFT;
    float kd = t - KVC__EXPF_SHIFT;
    float hi = kd * KVC__EXPF_LN2HI, lo = kd * KVC__EXPF_LN2LO;
    float r = x - hi;
    r = r - lo;
    float p;
    KVC__EXPF_POLY(p, r, kvc__smulf, kvc__saddf, KVC__SCONST);
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* w[i] = the sanitized in[i] (NaN -> -inf, +inf -> FLT_MAX); returns the largest. */
float kvc__sample_sanitize_max_scalar(const float *in, float *w, uint32_t n);
float kvc__sample_sanitize_max_avx2(const float *in, float *w, uint32_t n);

/* The first i >= from with w[i] > v, or n (NaN is never above). */
uint32_t kvc__sample_above_scalar(const float *w, uint32_t from, uint32_t n, float v);
uint32_t kvc__sample_above_avx2(const float *w, uint32_t from, uint32_t n, float v);

/* The first i with w[i] == v, or n. */
uint32_t kvc__sample_find_scalar(const float *w, uint32_t n, float v);
uint32_t kvc__sample_find_avx2(const float *w, uint32_t n, float v);

/* e[i] = exp(((double)w[i] - ref) * scale) (e may be NULL: the sum alone); returns the
 * sum (4 lanes, see above). */
double kvc__sample_exp_sum_scalar(const float *w, uint32_t n, double ref, double scale, double *e);
double kvc__sample_exp_sum_avx2(const float *w, uint32_t n, double ref, double scale, double *e);

/* top_p's histogram: with d = (m - w[i]) * scale in float, mass[min(floor(d), n_bins - 1)]
 * += e[i], in the order of i. */
void kvc__sample_hist_scalar(const float *w, const double *e, uint32_t n, float m, float scale,
                             double *mass, uint32_t n_bins);
void kvc__sample_hist_avx2(const float *w, const double *e, uint32_t n, float m, float scale,
                           double *mass, uint32_t n_bins);

/* top_p's split: with d as above, the i with d < lo to cand, those with lo <= d < hi to tmp,
 * in the order of i; returns the counts in *nc and *nt. */
void kvc__sample_split_scalar(const float *w, uint32_t n, float m, float scale, float lo, float hi,
                              uint32_t *cand, uint32_t *nc, uint32_t *tmp, uint32_t *nt);
void kvc__sample_split_avx2(const float *w, uint32_t n, float m, float scale, float lo, float hi,
                            uint32_t *cand, uint32_t *nc, uint32_t *tmp, uint32_t *nt);

/* e[i] = expf((w[i] - m) * scale) computed in float as kvc__sample_expf, stored as double;
 * returns their sum in double (4 lanes, element i in lane i % 4, in order). */
double kvc__sample_expf_sum_scalar(const float *w, uint32_t n, float m, float scale, double *e);
double kvc__sample_expf_sum_avx2(const float *w, uint32_t n, float m, float scale, double *e);

#endif
