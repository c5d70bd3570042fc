/* quant.c - the KV number formats: CPU feature detection and ISA choice,
 * exact scalar encode/decode of f16, bf16 and both FP8 formats, bulk
 * quantisation (dispatching to the SIMD versions), and the geometry of the
 * per-block scales.  See include/kvcache/quant.h for the rules. */
#include "attn/attn_int.h"

#include <cpuid.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

/* ---- CPU features ----------------------------------------------------------
 * The one piece of global state in the layer: written once, read-only after. */
static kvc_cpu_t cpu_features;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect_cpu(void)
{
    kvc_cpu_t c = {0};
    unsigned a, b, cx, d;
    if (!__get_cpuid(1, &a, &b, &cx, &d)) goto done;
    bool osxsave = cx & (1u << 27), avx = cx & (1u << 28);
    bool fma = cx & (1u << 12), f16c = cx & (1u << 29);
    if (!osxsave || !avx) goto done;
    uint64_t xcr0 = read_xcr0();
    bool ymm_os = (xcr0 & 0x6) == 0x6;
    bool zmm_os = ymm_os && (xcr0 & 0xe0) == 0xe0;
    bool amx_os = (xcr0 & (3u << 17)) == (3u << 17);
    if (__get_cpuid_max(0, NULL) < 7) goto done;
    __cpuid_count(7, 0, a, b, cx, d);
    bool avx2 = b & (1u << 5);
    bool f512 = b & (1u << 16), dq = b & (1u << 17), bw = b & (1u << 30), vl = b & (1u << 31);
    bool vbmi = cx & (1u << 1);
    bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24);
    unsigned sub1_eax = 0;
    if (a >= 1) {
        unsigned a1, b1, c1, d1;
        __cpuid_count(7, 1, a1, b1, c1, d1);
        sub1_eax = a1;
    }
    c.avx2 = ymm_os && avx2 && fma && f16c;
    c.avx512 = c.avx2 && zmm_os && f512 && dq && bw && vl;
    c.avx512_bf16 = c.avx512 && (sub1_eax & (1u << 5));
    c.avx512_vbmi = c.avx512 && vbmi;
    c.amx_bf16 = amx_os && amx_bf16 && amx_tile;
done:
    cpu_features = c;
}

const kvc_cpu_t *kvc_cpu(void)
{
    pthread_once(&cpu_once, detect_cpu);
    return &cpu_features;
}

bool kvc_isa_supported(kvc_isa_t isa)
{
    const kvc_cpu_t *c = kvc_cpu();
    switch (isa) {
    case KVC_ISA_AUTO:
    case KVC_ISA_SCALAR:
        return true;
    case KVC_ISA_AVX2:
        return c->avx2;
    case KVC_ISA_AVX512:
        return c->avx512;
    default:
        return false;
    }
}

kvc_isa_t kvc_isa_best(void)
{
    const kvc_cpu_t *c = kvc_cpu();
    return c->avx512 ? KVC_ISA_AVX512 : c->avx2 ? KVC_ISA_AVX2 : KVC_ISA_SCALAR;
}

int kvc__isa_resolve(kvc_isa_t isa, kvc_isa_t *out)
{
    if ((unsigned)isa >= KVC_ISA__COUNT) return KVC_EINVAL;
    if (isa == KVC_ISA_AUTO) isa = kvc_isa_best();
    if (!kvc_isa_supported(isa)) return KVC_ENOTSUP;
    *out = isa;
    return 0;
}

bool kvc__has_bf16_path(void)
{
    const kvc_cpu_t *c = kvc_cpu();
    return c->avx512 && c->avx512_bf16 && c->avx512_vbmi;
}

static const char *const isa_names[KVC_ISA__COUNT] = {"auto", "scalar", "avx2", "avx512"};

const char *kvc_isa_name(kvc_isa_t isa)
{
    return (unsigned)isa < KVC_ISA__COUNT ? isa_names[isa] : "?";
}

int kvc_isa_parse(const char *name, kvc_isa_t *out)
{
    if (!name || !out) return KVC_EINVAL;
    for (int i = 0; i < KVC_ISA__COUNT; i++)
        if (strcmp(name, isa_names[i]) == 0) return *out = (kvc_isa_t)i, 0;
    return KVC_EINVAL;
}

/* ---- formats --------------------------------------------------------------- */
/* clip_bits: e4m3's max 448 has an even mantissa, so the tie 464 still
 * rounds to it and clipping starts just above; e5m2 (57344 | 65536 at
 * 61440), f16 (65504 | 65536 at 65520) and bf16 round their ties away. */
const kvc__fmt_t kvc__fmt_e4m3 = {3, 7, 0x43e00000u /* 448 */, 0x7e, 0x7f, 8, 0x43e80001u};
const kvc__fmt_t kvc__fmt_e5m2 = {2, 15, 0x47600000u /* 57344 */, 0x7b, 0x7e, 8, 0x47700000u};
const kvc__fmt_t kvc__fmt_f16 = {10, 15, 0x477fe000u /* 65504 */, 0x7bff, 0x7e00, 16, 0x477ff000u};
const kvc__fmt_t kvc__fmt_bf16 = {
    7, 127, 0x7f7f0000u /* (2 - 2^-7) 2^127 */, 0x7f7f, 0x7fc0, 16, 0x7f7f8000u};

/* Binary32 bits from which a quotient counts as clipped (infinity for f32). */
static uint32_t clip_bits(kvc_dtype_t dt)
{
    const kvc__fmt_t *f = kvc__fmt(dt);
    return f ? f->clip_bits : 0x7f800000u;
}

uint32_t kvc__clip_bits(kvc_dtype_t dt)
{
    return clip_bits(dt);
}

const kvc__fmt_t *kvc__fmt(kvc_dtype_t dt)
{
    switch (dt) {
    case KVC_DTYPE_F16:
        return &kvc__fmt_f16;
    case KVC_DTYPE_BF16:
        return &kvc__fmt_bf16;
    case KVC_DTYPE_FP8_E4M3:
        return &kvc__fmt_e4m3;
    case KVC_DTYPE_FP8_E5M2:
        return &kvc__fmt_e5m2;
    default:
        return NULL;
    }
}

float kvc_dtype_max(kvc_dtype_t dt)
{
    if (dt == KVC_DTYPE_F32) return 3.40282347e38f;
    const kvc__fmt_t *f = kvc__fmt(dt);
    return f ? kvc__u2f(f->max_bits) : 0.0f;
}

/* Exact decoding: assemble the binary32 bits (normal codes) or scale the
 * mantissa by the quantum (subnormal codes). */
float kvc__decode(uint32_t code, kvc_dtype_t dt)
{
    uint32_t sign, e, m, bits;
    float mag;
    switch (dt) {
    case KVC_DTYPE_F32:
        return kvc__u2f(code);
    case KVC_DTYPE_BF16:
        return kvc__u2f(code << 16);
    case KVC_DTYPE_F16:
        sign = (code & 0x8000u) << 16, e = (code >> 10) & 31, m = code & 0x3ff;
        if (e == 31)
            bits = m ? 0x7fc00000u : 0x7f800000u;
        else if (e == 0)
            return kvc__u2f(sign | kvc__f2u((float)m * 0x1p-24f));
        else
            bits = ((e + 112) << 23) | (m << 13);
        return kvc__u2f(sign | bits);
    case KVC_DTYPE_FP8_E4M3:
        sign = (code & 0x80u) << 24, e = (code >> 3) & 15, m = code & 7;
        if (e == 15 && m == 7) return kvc__u2f(sign | 0x7fc00000u);
        mag = e ? kvc__u2f(((e + 120) << 23) | (m << 20)) : (float)m * 0x1p-9f;
        return kvc__u2f(sign | kvc__f2u(mag));
    case KVC_DTYPE_FP8_E5M2:
        sign = (code & 0x80u) << 24, e = (code >> 2) & 31, m = code & 3;
        if (e == 31) return kvc__u2f(sign | (m ? 0x7fc00000u : 0x7f800000u));
        mag = e ? kvc__u2f(((e + 112) << 23) | (m << 21)) : (float)m * 0x1p-16f;
        return kvc__u2f(sign | kvc__f2u(mag));
    default:
        return NAN;
    }
}

uint8_t kvc_fp8_e4m3_from_f32(float x)
{
    return (uint8_t)kvc__encode(x, &kvc__fmt_e4m3);
}
float kvc_fp8_e4m3_to_f32(uint8_t code)
{
    return kvc__decode(code, KVC_DTYPE_FP8_E4M3);
}
uint8_t kvc_fp8_e5m2_from_f32(float x)
{
    return (uint8_t)kvc__encode(x, &kvc__fmt_e5m2);
}
float kvc_fp8_e5m2_to_f32(uint8_t code)
{
    return kvc__decode(code, KVC_DTYPE_FP8_E5M2);
}
uint16_t kvc_bf16_from_f32(float x)
{
    return (uint16_t)kvc__encode(x, &kvc__fmt_bf16);
}
float kvc_bf16_to_f32(uint16_t code)
{
    return kvc__decode(code, KVC_DTYPE_BF16);
}
uint16_t kvc_f16_from_f32(float x)
{
    return (uint16_t)kvc__encode(x, &kvc__fmt_f16);
}
float kvc_f16_to_f32(uint16_t code)
{
    return kvc__decode(code, KVC_DTYPE_F16);
}

/* bf16 bits of each FP8 magnitude (generated from the format definitions;
 * test_quant checks every entry against kvc__decode). */
const uint16_t kvc__fp8_bf16[2][128] = {
    {
        /* e4m3 */
        0x0000, 0x3b00, 0x3b80, 0x3bc0, 0x3c00, 0x3c20, 0x3c40, 0x3c60, 0x3c80, 0x3c90, 0x3ca0,
        0x3cb0, 0x3cc0, 0x3cd0, 0x3ce0, 0x3cf0, 0x3d00, 0x3d10, 0x3d20, 0x3d30, 0x3d40, 0x3d50,
        0x3d60, 0x3d70, 0x3d80, 0x3d90, 0x3da0, 0x3db0, 0x3dc0, 0x3dd0, 0x3de0, 0x3df0, 0x3e00,
        0x3e10, 0x3e20, 0x3e30, 0x3e40, 0x3e50, 0x3e60, 0x3e70, 0x3e80, 0x3e90, 0x3ea0, 0x3eb0,
        0x3ec0, 0x3ed0, 0x3ee0, 0x3ef0, 0x3f00, 0x3f10, 0x3f20, 0x3f30, 0x3f40, 0x3f50, 0x3f60,
        0x3f70, 0x3f80, 0x3f90, 0x3fa0, 0x3fb0, 0x3fc0, 0x3fd0, 0x3fe0, 0x3ff0, 0x4000, 0x4010,
        0x4020, 0x4030, 0x4040, 0x4050, 0x4060, 0x4070, 0x4080, 0x4090, 0x40a0, 0x40b0, 0x40c0,
        0x40d0, 0x40e0, 0x40f0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170,
        0x4180, 0x4190, 0x41a0, 0x41b0, 0x41c0, 0x41d0, 0x41e0, 0x41f0, 0x4200, 0x4210, 0x4220,
        0x4230, 0x4240, 0x4250, 0x4260, 0x4270, 0x4280, 0x4290, 0x42a0, 0x42b0, 0x42c0, 0x42d0,
        0x42e0, 0x42f0, 0x4300, 0x4310, 0x4320, 0x4330, 0x4340, 0x4350, 0x4360, 0x4370, 0x4380,
        0x4390, 0x43a0, 0x43b0, 0x43c0, 0x43d0, 0x43e0, 0x7fc0,
    },
    {
        /* e5m2 */
        0x0000, 0x3780, 0x3800, 0x3840, 0x3880, 0x38a0, 0x38c0, 0x38e0, 0x3900, 0x3920, 0x3940,
        0x3960, 0x3980, 0x39a0, 0x39c0, 0x39e0, 0x3a00, 0x3a20, 0x3a40, 0x3a60, 0x3a80, 0x3aa0,
        0x3ac0, 0x3ae0, 0x3b00, 0x3b20, 0x3b40, 0x3b60, 0x3b80, 0x3ba0, 0x3bc0, 0x3be0, 0x3c00,
        0x3c20, 0x3c40, 0x3c60, 0x3c80, 0x3ca0, 0x3cc0, 0x3ce0, 0x3d00, 0x3d20, 0x3d40, 0x3d60,
        0x3d80, 0x3da0, 0x3dc0, 0x3de0, 0x3e00, 0x3e20, 0x3e40, 0x3e60, 0x3e80, 0x3ea0, 0x3ec0,
        0x3ee0, 0x3f00, 0x3f20, 0x3f40, 0x3f60, 0x3f80, 0x3fa0, 0x3fc0, 0x3fe0, 0x4000, 0x4020,
        0x4040, 0x4060, 0x4080, 0x40a0, 0x40c0, 0x40e0, 0x4100, 0x4120, 0x4140, 0x4160, 0x4180,
        0x41a0, 0x41c0, 0x41e0, 0x4200, 0x4220, 0x4240, 0x4260, 0x4280, 0x42a0, 0x42c0, 0x42e0,
        0x4300, 0x4320, 0x4340, 0x4360, 0x4380, 0x43a0, 0x43c0, 0x43e0, 0x4400, 0x4420, 0x4440,
        0x4460, 0x4480, 0x44a0, 0x44c0, 0x44e0, 0x4500, 0x4520, 0x4540, 0x4560, 0x4580, 0x45a0,
        0x45c0, 0x45e0, 0x4600, 0x4620, 0x4640, 0x4660, 0x4680, 0x46a0, 0x46c0, 0x46e0, 0x4700,
        0x4720, 0x4740, 0x4760, 0x7f80, 0x7fc0, 0x7fc0, 0x7fc0,
    },
};

/* ---- bulk quantisation ---------------------------------------------------------- */
void kvc__quantize_scalar(kvc_dtype_t dt, void *dst, const float *src, size_t n, float scale,
                          const float *scales, kvc_quant_stats_t *st)
{
    const kvc__fmt_t *f = kvc__fmt(dt);
    const uint32_t cb = clip_bits(dt);
    uint64_t clipped = 0, nonfinite = 0;
    for (size_t i = 0; i < n; i++) {
        float x = src[i];
        float y = x / (scales ? scales[i] : scale);
        if (!isfinite(x))
            nonfinite++;
        else if ((kvc__f2u(y) & 0x7fffffffu) >= cb)
            clipped++;
        if (!f)
            ((float *)dst)[i] = y;
        else if (f->width == 8)
            ((uint8_t *)dst)[i] = (uint8_t)kvc__encode(y, f);
        else
            ((uint16_t *)dst)[i] = (uint16_t)kvc__encode(y, f);
    }
    if (st) {
        st->n_values += n;
        st->n_clipped += clipped;
        st->n_nonfinite += nonfinite;
    }
}

static bool scale_ok(float s)
{
    return s > 0.0f && isfinite(s);
}

int kvc_quantize(kvc_dtype_t dt, void *dst, const float *src, size_t n, float scale,
                 const float *scales, kvc_isa_t isa, kvc_quant_stats_t *stats)
{
    if ((unsigned)dt >= KVC_DTYPE__COUNT || (n && (!dst || !src))) return KVC_EINVAL;
    if (scales) {
        for (size_t i = 0; i < n; i++)
            if (!scale_ok(scales[i])) return KVC_EINVAL;
    } else if (!scale_ok(scale)) {
        return KVC_EINVAL;
    }
    kvc_isa_t use;
    int rc = kvc__isa_resolve(isa, &use);
    if (rc) return rc;
    switch (use) {
    case KVC_ISA_AVX512:
        kvc__quantize_avx512(dt, dst, src, n, scale, scales, stats);
        break;
    case KVC_ISA_AVX2:
        kvc__quantize_avx2(dt, dst, src, n, scale, scales, stats);
        break;
    default:
        kvc__quantize_scalar(dt, dst, src, n, scale, scales, stats);
        break;
    }
    return 0;
}

int kvc_dequantize(kvc_dtype_t dt, float *dst, const void *src, size_t n, float scale,
                   const float *scales)
{
    if ((unsigned)dt >= KVC_DTYPE__COUNT || (n && (!dst || !src))) return KVC_EINVAL;
    size_t el = kvc_dtype_bytes(dt);
    const uint8_t *s = src;
    for (size_t i = 0; i < n; i++) {
        uint32_t code = 0;
        if (el == 4)
            memcpy(&code, s + 4 * i, 4);
        else if (el == 2) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            code = h;
        } else {
            code = s[i];
        }
        dst[i] = kvc__decode(code, dt) * (scales ? scales[i] : scale);
    }
    return 0;
}

/* ---- scale layouts ------------------------------------------------------------- */
static const char *const layout_names[KVC_SCALE__COUNT] = {"none", "tensor", "head",
                                                           "channel-token"};

const char *kvc_scale_layout_name(kvc_scale_layout_t layout)
{
    return (unsigned)layout < KVC_SCALE__COUNT ? layout_names[layout] : "?";
}

int kvc_scale_layout_parse(const char *name, kvc_scale_layout_t *out)
{
    if (!name || !out) return KVC_EINVAL;
    for (int i = 0; i < KVC_SCALE__COUNT; i++)
        if (strcmp(name, layout_names[i]) == 0) return *out = (kvc_scale_layout_t)i, 0;
    return KVC_EINVAL;
}

int kvc_scale_shape_check(const kvc_scale_shape_t *s)
{
    if (!s || !s->n_layers || !s->n_kv_heads || !s->head_dim || !s->block_size) return KVC_EINVAL;
    if (s->n_kv != 1 && s->n_kv != 2) return KVC_EINVAL;
    if (s->n_kv == 1 && s->n_kv_heads != 1) return KVC_EINVAL;
    if ((unsigned)s->dtype >= KVC_DTYPE__COUNT || (unsigned)s->layout >= KVC_SCALE__COUNT)
        return KVC_EINVAL;
    if (s->layout != KVC_SCALE_NONE && (s->dtype == KVC_DTYPE_F32 || s->dtype == KVC_DTYPE_BF16))
        return KVC_EINVAL;
    /* keep every size well inside size_t */
    if (s->n_kv_heads > (1u << 16) || s->head_dim > (1u << 16) || s->block_size > (1u << 16) ||
        s->n_layers > (1u << 16))
        return KVC_EINVAL;
    return 0;
}

size_t kvc_scale_floats_per_layer(const kvc_scale_shape_t *s)
{
    if (kvc_scale_shape_check(s)) return 0;
    switch (s->layout) {
    case KVC_SCALE_TENSOR:
        return s->n_kv;
    case KVC_SCALE_HEAD:
        return (size_t)s->n_kv * s->n_kv_heads;
    case KVC_SCALE_CHANNEL_TOKEN:
        return (size_t)s->n_kv_heads * s->head_dim +
               (s->n_kv == 2 ? (size_t)s->n_kv_heads * s->block_size : 0);
    default:
        return 0;
    }
}

size_t kvc_scale_bytes(const kvc_scale_shape_t *s)
{
    if (kvc_scale_shape_check(s)) return 0; /* NULL included: an invalid shape */
    return kvc_scale_floats_per_layer(s) * s->n_layers * sizeof(float);
}

size_t kvc_kv_quant_len(const kvc_scale_shape_t *s, bool is_value)
{
    if (kvc_scale_shape_check(s)) return 0;
    if (is_value && s->n_kv == 1) return 0;
    switch (s->layout) {
    case KVC_SCALE_TENSOR:
        return s->n_layers;
    case KVC_SCALE_HEAD:
        return (size_t)s->n_layers * s->n_kv_heads;
    case KVC_SCALE_CHANNEL_TOKEN:
        return is_value ? 0 : (size_t)s->n_layers * s->n_kv_heads * s->head_dim;
    default:
        return 0;
    }
}

float kvc_scale_from_amax(kvc_dtype_t dt, float amax, float headroom)
{
    float maxv = kvc_dtype_max(dt);
    if (!(amax > 0.0f) || !isfinite(amax) || maxv == 0.0f) return 1.0f;
    if (!(headroom >= 1.0f)) headroom = 1.0f;
    float s = amax * headroom / maxv;
    if (!isfinite(s)) return 1.0f;
    return s < 0x1p-126f ? 0x1p-126f : s;
}
