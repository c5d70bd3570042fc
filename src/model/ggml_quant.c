/* ggml_quant.c - the reference (scalar) converters between f32 rows and GGUF's tensor
 * encodings: F32, F16, BF16, Q8_0, Q4_0, Q4_K and Q6_K, in ggml's block layouts.  They write the
 * weights `kvcache model synth` produces and read them back in the tests; the engine's
 * matrix kernels (issue 12) are checked against the dequantizers here.  Q4_K and Q6_K
 * (the k-quants of Q4_K_M files) are below with their layouts.  The encoders are simple
 * (min/max scales, no search for the best scale as ggml's are): valid files of lower
 * quality, which is all random test weights need.
 *
 *   Q8_0: blocks of 32: an f16 scale d = max|x| / 127, then 32 int8 q = round(x / d).
 *   Q4_0: blocks of 32: an f16 scale d = m / -8, where m is the value of largest magnitude,
 *         then 16 bytes: byte j holds q[j] (low nibble) and q[j + 16] (high nibble), with
 *         q = min(15, (int)(x / d + 8.5)); a value is d x (q - 8).
 */
#include <math.h>
#include <string.h>

#include "kvcache/model.h"
#include "kvcache/quant.h"

static void q8_0_block(const float *x, uint8_t *out)
{
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    const uint16_t dh = kvc_f16_from_f32(d);
    memcpy(out, &dh, 2);
    for (int i = 0; i < 32; i++) out[2 + i] = (uint8_t)(int8_t)lroundf(x[i] * id);
}

static void q4_0_block(const float *x, uint8_t *out)
{
    float amax = 0, max = 0;
    for (int i = 0; i < 32; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), max = x[i];
    const float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
    const uint16_t dh = kvc_f16_from_f32(d);
    memcpy(out, &dh, 2);
    for (int j = 0; j < 16; j++) {
        int q0 = (int)(x[j] * id + 8.5f), q1 = (int)(x[j + 16] * id + 8.5f);
        q0 = q0 < 0 ? 0 : q0 > 15 ? 15 : q0;
        q1 = q1 < 0 ? 0 : q1 > 15 ? 15 : q1;
        out[2 + j] = (uint8_t)(q0 | (q1 << 4));
    }
}

/* Q4_K: blocks of 256 in 8 sub-blocks of 32; value = d x sc[j] x q - dmin x m[j], q in 0..15,
 * with 6-bit sc and m packed into 12 bytes (the first four of each in the low 6 bits of bytes
 * 0..3 and 4..7, the last four split into nibbles of bytes 8..11 and the top 2 bits of 0..7). */
static void q4_k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void q4_k_block(const float *x, uint8_t *out)
{
    float scale[8], mn[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float lo = x[32 * j], hi = x[32 * j];
        for (int i = 1; i < 32; i++) lo = fminf(lo, x[32 * j + i]), hi = fmaxf(hi, x[32 * j + i]);
        mn[j] = lo < 0 ? -lo : 0; /* value = scale x q - min */
        scale[j] = (hi + mn[j]) / 15.0f;
        max_scale = fmaxf(max_scale, scale[j]);
        max_min = fmaxf(max_min, mn[j]);
    }
    const float d = max_scale / 63.0f, dmin = max_min / 63.0f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        long a = d ? lroundf(scale[j] / d) : 0, b = dmin ? lroundf(mn[j] / dmin) : 0;
        ls[j] = (uint8_t)(a > 63 ? 63 : a);
        lm[j] = (uint8_t)(b > 63 ? 63 : b);
    }
    const uint16_t dh = kvc_f16_from_f32(d), mh = kvc_f16_from_f32(dmin);
    memcpy(out, &dh, 2);
    memcpy(out + 2, &mh, 2);
    uint8_t *sc = out + 4, *qs = out + 16;
    memset(sc, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            sc[j] = ls[j];
            sc[j + 4] = lm[j];
        } else {
            sc[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            sc[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            sc[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
    /* the quants, against the scales as stored (f16 d and dmin, 6-bit sc and m) */
    const float df = kvc_f16_to_f32(dh), mf = kvc_f16_to_f32(mh);
    uint8_t L[256];
    for (int j = 0; j < 8; j++) {
        uint8_t a, b;
        q4_k_scale_min(j, sc, &a, &b);
        const float step = df * a, off = mf * b;
        for (int i = 0; i < 32; i++) {
            long q = step ? lroundf((x[32 * j + i] + off) / step) : 0;
            L[32 * j + i] = (uint8_t)(q < 0 ? 0 : q > 15 ? 15 : q);
        }
    }
    for (int j = 0; j < 256; j += 64)
        for (int l = 0; l < 32; l++) qs[j / 2 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

static void q4_k_dequant(const uint8_t *p, float *y)
{
    uint16_t dh, mh;
    memcpy(&dh, p, 2);
    memcpy(&mh, p + 2, 2);
    const float d = kvc_f16_to_f32(dh), dmin = kvc_f16_to_f32(mh);
    const uint8_t *sc = p + 4, *q = p + 16;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
        uint8_t s1, m1, s2, m2;
        q4_k_scale_min(is, sc, &s1, &m1);
        q4_k_scale_min(is + 1, sc, &s2, &m2);
        for (int l = 0; l < 32; l++) y[j + l] = d * s1 * (float)(q[l] & 0xF) - dmin * m1;
        for (int l = 0; l < 32; l++) y[j + 32 + l] = d * s2 * (float)(q[l] >> 4) - dmin * m2;
    }
}

/* Q6_K: blocks of 256 in 16 sub-blocks of 16; value = d x sc[j] x (q - 32), q in 0..63, the
 * low 4 bits in ql[128], the high 2 in qh[64], int8 sc[16], then the f16 d. */
static void q6_k_block(const float *x, uint8_t *out)
{
    float scale[16], max_scale = 0;
    for (int j = 0; j < 16; j++) {
        float amax = 0, m = 0;
        for (int i = 0; i < 16; i++)
            if (fabsf(x[16 * j + i]) > amax) amax = fabsf(x[16 * j + i]), m = x[16 * j + i];
        scale[j] = m / -32.0f; /* the extreme value maps to q - 32 = -32 */
        if (fabsf(scale[j]) > fabsf(max_scale)) max_scale = scale[j];
    }
    const float d = max_scale / -128.0f;
    int8_t *sc = (int8_t *)(out + 192);
    for (int j = 0; j < 16; j++) {
        long a = d ? lroundf(scale[j] / d) : 0;
        sc[j] = (int8_t)(a > 127 ? 127 : a < -128 ? -128 : a);
    }
    const uint16_t dh = kvc_f16_from_f32(d);
    memcpy(out + 208, &dh, 2);
    const float df = kvc_f16_to_f32(dh);
    uint8_t L[256];
    for (int j = 0; j < 16; j++) {
        const float step = df * sc[j];
        for (int i = 0; i < 16; i++) {
            long q = step ? lroundf(x[16 * j + i] / step) : 0;
            L[16 * j + i] = (uint8_t)((q < -32 ? -32 : q > 31 ? 31 : q) + 32);
        }
    }
    uint8_t *ql = out, *qh = out + 128;
    for (int n = 0; n < 256; n += 128, ql += 64, qh += 32)
        for (int l = 0; l < 32; l++) {
            const uint8_t q1 = L[n + l], q2 = L[n + l + 32], q3 = L[n + l + 64], q4 = L[n + l + 96];
            ql[l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
            ql[l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
            qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
        }
}

static void q6_k_dequant(const uint8_t *p, float *y)
{
    uint16_t dh;
    memcpy(&dh, p + 208, 2);
    const float d = kvc_f16_to_f32(dh);
    const uint8_t *ql = p, *qh = p + 128;
    const int8_t *sc = (const int8_t *)(p + 192);
    for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8)
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[n + l] = d * sc[is] * (float)q1;
            y[n + l + 32] = d * sc[is + 2] * (float)q2;
            y[n + l + 64] = d * sc[is + 4] * (float)q3;
            y[n + l + 96] = d * sc[is + 6] * (float)q4;
        }
}

static void q8_0_dequant(const uint8_t *p, float *y)
{
    uint16_t h;
    memcpy(&h, p, 2);
    const float d = kvc_f16_to_f32(h);
    for (int i = 0; i < 32; i++) y[i] = d * (float)(int8_t)p[2 + i];
}

static void q4_0_dequant(const uint8_t *p, float *y)
{
    uint16_t h;
    memcpy(&h, p, 2);
    const float d = kvc_f16_to_f32(h);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((p[2 + j] & 0xF) - 8);
        y[j + 16] = d * (float)((p[2 + j] >> 4) - 8);
    }
}

static void f32_block(const float *x, uint8_t *out)
{
    memcpy(out, x, 4);
}
static void f32_dequant(const uint8_t *p, float *y)
{
    memcpy(y, p, 4);
}
static void f16_block(const float *x, uint8_t *out)
{
    const uint16_t h = kvc_f16_from_f32(*x);
    memcpy(out, &h, 2);
}
static void f16_dequant(const uint8_t *p, float *y)
{
    uint16_t h;
    memcpy(&h, p, 2);
    *y = kvc_f16_to_f32(h);
}
static void bf16_block(const float *x, uint8_t *out)
{
    const uint16_t h = kvc_bf16_from_f32(*x);
    memcpy(out, &h, 2);
}
static void bf16_dequant(const uint8_t *p, float *y)
{
    uint16_t h;
    memcpy(&h, p, 2);
    *y = kvc_bf16_to_f32(h);
}

/* One entry per type: its block (elements, bytes, as kvc_ggml_type_size says) and codec. */
static const struct {
    uint32_t type, block, bytes;
    void (*encode)(const float *x, uint8_t *out);
    void (*decode)(const uint8_t *p, float *y);
} codecs[] = {
    {KVC_GGML_F32, 1, 4, f32_block, f32_dequant},
    {KVC_GGML_F16, 1, 2, f16_block, f16_dequant},
    {KVC_GGML_BF16, 1, 2, bf16_block, bf16_dequant},
    {KVC_GGML_Q8_0, 32, 34, q8_0_block, q8_0_dequant},
    {KVC_GGML_Q4_0, 32, 18, q4_0_block, q4_0_dequant},
    {KVC_GGML_Q4_K, 256, 144, q4_k_block, q4_k_dequant},
    {KVC_GGML_Q6_K, 256, 210, q6_k_block, q6_k_dequant},
};

static int codec_of(uint32_t type, uint64_t n, size_t *out)
{
    for (size_t c = 0; c < sizeof codecs / sizeof codecs[0]; c++)
        if (codecs[c].type == type) {
            *out = c;
            return n % codecs[c].block ? KVC_EINVAL : 0;
        }
    return KVC_ENOTSUP;
}

bool kvc_ggml_codec_supported(uint32_t type)
{
    size_t c;
    return codec_of(type, 0, &c) == 0;
}

int kvc_ggml_quantize_row(uint32_t type, const float *x, void *dst, uint64_t n)
{
    size_t c;
    int rc = x && dst ? codec_of(type, n, &c) : KVC_EINVAL;
    if (rc) return rc;
    for (uint64_t b = 0; b < n / codecs[c].block; b++)
        codecs[c].encode(x + b * codecs[c].block, (uint8_t *)dst + b * codecs[c].bytes);
    return 0;
}

int kvc_ggml_dequantize_row(uint32_t type, const void *src, float *y, uint64_t n)
{
    size_t c;
    int rc = src && y ? codec_of(type, n, &c) : KVC_EINVAL;
    if (rc) return rc;
    for (uint64_t b = 0; b < n / codecs[c].block; b++)
        codecs[c].decode((const uint8_t *)src + b * codecs[c].bytes, y + b * codecs[c].block);
    return 0;
}
