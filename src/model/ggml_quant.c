/* ggml_quant.c - the reference (scalar) converters between f32 rows and GGUF's tensor
 * encodings: F32, F16, BF16, Q8_0 and Q4_0, in ggml's exact block layouts.  They write the
 * weights `kvcache model synth` produces and read them back in the tests; the engine's
 * matrix kernels (issue 12) are checked against the dequantizers here.
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

int kvc_ggml_quantize_row(uint32_t type, const float *x, void *dst, uint64_t n)
{
    if (!x || !dst) return KVC_EINVAL;
    uint8_t *o = dst;
    switch (type) {
    case KVC_GGML_F32:
        memcpy(o, x, n * 4);
        return 0;
    case KVC_GGML_F16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h = kvc_f16_from_f32(x[i]);
            memcpy(o + 2 * i, &h, 2);
        }
        return 0;
    case KVC_GGML_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h = kvc_bf16_from_f32(x[i]);
            memcpy(o + 2 * i, &h, 2);
        }
        return 0;
    case KVC_GGML_Q8_0:
    case KVC_GGML_Q4_0:
        if (n % 32) return KVC_EINVAL;
        for (uint64_t b = 0; b < n / 32; b++) {
            if (type == KVC_GGML_Q8_0)
                q8_0_block(x + 32 * b, o + 34 * b);
            else
                q4_0_block(x + 32 * b, o + 18 * b);
        }
        return 0;
    default:
        return KVC_ENOTSUP;
    }
}

int kvc_ggml_dequantize_row(uint32_t type, const void *src, float *y, uint64_t n)
{
    if (!src || !y) return KVC_EINVAL;
    const uint8_t *p = src;
    uint16_t h;
    switch (type) {
    case KVC_GGML_F32:
        memcpy(y, p, n * 4);
        return 0;
    case KVC_GGML_F16:
    case KVC_GGML_BF16:
        for (uint64_t i = 0; i < n; i++) {
            memcpy(&h, p + 2 * i, 2);
            y[i] = type == KVC_GGML_F16 ? kvc_f16_to_f32(h) : kvc_bf16_to_f32(h);
        }
        return 0;
    case KVC_GGML_Q8_0:
        if (n % 32) return KVC_EINVAL;
        for (uint64_t b = 0; b < n / 32; b++) {
            memcpy(&h, p + 34 * b, 2);
            const float d = kvc_f16_to_f32(h);
            for (int i = 0; i < 32; i++) y[32 * b + i] = d * (float)(int8_t)p[34 * b + 2 + i];
        }
        return 0;
    case KVC_GGML_Q4_0:
        if (n % 32) return KVC_EINVAL;
        for (uint64_t b = 0; b < n / 32; b++) {
            memcpy(&h, p + 18 * b, 2);
            const float d = kvc_f16_to_f32(h);
            for (int j = 0; j < 16; j++) {
                const uint8_t q = p[18 * b + 2 + j];
                y[32 * b + j] = d * (float)((q & 0xF) - 8);
                y[32 * b + j + 16] = d * (float)((q >> 4) - 8);
            }
        }
        return 0;
    default:
        return KVC_ENOTSUP;
    }
}
