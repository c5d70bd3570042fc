/* matmul_scalar.c - the reference matrix kernels, in plain C.  Each output element is reduced
 * on its own, in one fixed order, so that it cannot depend on the batch:
 *
 *   F32, F16, BF16  eight partial sums, element i into sum i % 8, then
 *                   ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
 *   integer types   each block's integer dot product exactly (int32), then, block by block
 *                   in order, acc += (d_w * d_x) * dot (and - (dmin_w * d_x) * mins for Q4_K)
 *
 * The SIMD kernels use other (equally fixed) orders; they agree with these within rounding. */
#include "model/matmul_int.h"

static float fold8(const float s[8])
{
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static float bf16_to_f32(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float dot_float(uint32_t type, const uint8_t *w, const float *x, uint32_t n)
{
    float s[8] = {0};
    for (uint32_t i = 0; i < n; i++) {
        float wi;
        if (type == KVC_GGML_F32)
            memcpy(&wi, w + 4 * (size_t)i, 4);
        else if (type == KVC_GGML_F16)
            wi = kvc_f16_to_f32(kvc__mm_u16(w + 2 * (size_t)i));
        else
            wi = bf16_to_f32(kvc__mm_u16(w + 2 * (size_t)i));
        s[i % 8] += wi * x[i];
    }
    return fold8(s);
}

static float dot_q8_0(const uint8_t *w, const int8_t *xq, const float *xd, uint32_t nb)
{
    float acc = 0;
    for (uint32_t b = 0; b < nb; b++, w += KVC__Q8_0_B, xq += KVC__QK) {
        int32_t s = 0;
        for (int i = 0; i < KVC__QK; i++) s += (int8_t)w[2 + i] * xq[i];
        acc += (kvc_f16_to_f32(kvc__mm_u16(w)) * xd[b]) * (float)s;
    }
    return acc;
}

static float dot_q4_0(const uint8_t *w, const int8_t *xq, const float *xd, uint32_t nb)
{
    float acc = 0;
    for (uint32_t b = 0; b < nb; b++, w += KVC__Q4_0_B, xq += KVC__QK) {
        int32_t s = 0;
        for (int i = 0; i < 16; i++)
            s += ((w[2 + i] & 0xF) - 8) * xq[i] + ((w[2 + i] >> 4) - 8) * xq[i + 16];
        acc += (kvc_f16_to_f32(kvc__mm_u16(w)) * xd[b]) * (float)s;
    }
    return acc;
}

static float dot_q4_k(const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *bs,
                      uint32_t nb)
{
    float acc = 0;
    for (uint32_t b = 0; b < nb; b++, w += KVC__Q4_K_B, xq += KVC__QK_K, bs += 16) {
        const uint8_t *sc = w + 4, *qs = w + 16;
        int32_t s = 0, mins = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t a, m;
            kvc__q4k_scale_min(j, sc, &a, &m);
            const uint8_t *q = qs + 32 * (j / 2);
            const int sh = (j % 2) * 4;
            int32_t t = 0;
            for (int i = 0; i < 32; i++) t += ((q[i] >> sh) & 0xF) * xq[32 * j + i];
            s += a * t;
            mins += m * (bs[2 * j] + bs[2 * j + 1]);
        }
        const float d = kvc_f16_to_f32(kvc__mm_u16(w)) * xd[b];
        const float dm = kvc_f16_to_f32(kvc__mm_u16(w + 2)) * xd[b];
        acc += d * (float)s;
        acc -= dm * (float)mins;
    }
    return acc;
}

static float dot_q6_k(const uint8_t *w, const int8_t *xq, const float *xd, uint32_t nb)
{
    float acc = 0;
    for (uint32_t b = 0; b < nb; b++, w += KVC__Q6_K_B, xq += KVC__QK_K) {
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        int32_t sub[16] = {0};
        for (int n = 0; n < 256; n += 128, ql += 64, qh += 32)
            for (int l = 0; l < 32; l++) {
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                sub[(n + l) / 16] += q1 * xq[n + l];
                sub[(n + l + 32) / 16] += q2 * xq[n + l + 32];
                sub[(n + l + 64) / 16] += q3 * xq[n + l + 64];
                sub[(n + l + 96) / 16] += q4 * xq[n + l + 96];
            }
        int32_t s = 0;
        for (int j = 0; j < 16; j++) s += sc[j] * sub[j];
        acc += (kvc_f16_to_f32(kvc__mm_u16(w + 208)) * xd[b]) * (float)s;
    }
    return acc;
}

void kvc__mm_scalar(const kvc__mm_job_t *j)
{
    const kvc_mat_t *w = j->w;
    const uint32_t n = w->n_in;
    for (uint32_t r = 0; r < j->n_rows; r++) {
        float *y = j->y + (size_t)r * w->n_out;
        for (uint32_t o = j->o0; o < j->o1; o++) {
            const uint8_t *wr = kvc__mm_wrow(j, o);
            switch (w->type) {
            case KVC_GGML_Q8_0:
                y[o] = dot_q8_0(wr, kvc__mm_xq(j, r), kvc__mm_xd(j, r), n / KVC__QK);
                break;
            case KVC_GGML_Q4_0:
                y[o] = dot_q4_0(wr, kvc__mm_xq(j, r), kvc__mm_xd(j, r), n / KVC__QK);
                break;
            case KVC_GGML_Q4_K:
                y[o] = dot_q4_k(wr, kvc__mm_xq(j, r), kvc__mm_xd(j, r), kvc__mm_xbsums(j, r),
                                n / KVC__QK_K);
                break;
            case KVC_GGML_Q6_K:
                y[o] = dot_q6_k(wr, kvc__mm_xq(j, r), kvc__mm_xd(j, r), n / KVC__QK_K);
                break;
            default:
                y[o] = dot_float(w->type, wr, j->x + (size_t)r * n, n);
                break;
            }
        }
    }
}
