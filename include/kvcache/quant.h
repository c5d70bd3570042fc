/* kvcache/quant.h - the KV number formats and their scales.
 *
 * Storage formats (kvc_dtype_t, declared in pool.h):
 *
 *   f32       IEEE binary32, stored as is
 *   f16       IEEE binary16: 5 exponent bits, 10 mantissa bits, max 65504
 *   bf16      the top half of binary32: 8 exponent bits, 7 mantissa bits
 *   fp8-e4m3  OCP "E4M3FN": bias 7, max 448, subnormals down to 2^-9, no
 *             infinities; S.1111.111 is NaN
 *   fp8-e5m2  OCP E5M2: bias 15, max 57344, subnormals down to 2^-16,
 *             IEEE-like infinities and NaNs
 *
 * Encoding rounds to nearest, ties to even, and saturates: a finite value
 * beyond the largest finite code, and +-infinity, encode to +-max (the
 * "satfinite" rule of CUDA's __nv_cvt_float_to_fp8); NaN encodes to NaN.
 * Decoding is exact: every code of every format is a binary32 value.
 *
 * Scales.  A stored code c with scale s means the value decode(c) * s; a
 * value x is stored as encode(fl32(x / s)), the binary32 quotient rounded
 * once more to the format (what `(x / s).to(torch.float8_e4m3fn)` does).
 * A quotient |x| / s that rounding would take past the format's max is
 * "clipped": it saturates, and quantisation counts it (values that merely
 * round down to max, like 450 in e4m3, are not counted).  Which scale applies to which value is the
 * scale layout (kvc_scale_layout_t below): scales live in each block's side data, so a block
 * carries the scales it was written with (copies, prefix hits and offloads stay correct without any
 * outside bookkeeping).
 *
 * Return values.  Five functions return an error code (0 or KVC_E*, named
 * at each): kvc_isa_parse, kvc_quantize, kvc_dequantize,
 * kvc_scale_layout_parse and kvc_scale_shape_check.  The others return
 * values: codes and floats (the conversions, kvc_dtype_max,
 * kvc_scale_from_amax), sizes and lengths that are 0 for an invalid shape
 * (kvc_scale_bytes, kvc_scale_floats_per_layer, kvc_kv_quant_len), a bool
 * (kvc_isa_supported), an ISA (kvc_isa_best), a pointer that is never NULL
 * (kvc_cpu) or a string that is never NULL (the _name functions).
 *
 * Thread-safety: every function here is reentrant.  kvc_kv_quant_t is owned
 * by its caller and is updated by writes: one writer per state at a time.
 */
#ifndef KVCACHE_QUANT_H
#define KVCACHE_QUANT_H

#include "kvcache/pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- instruction sets ----------------------------------------------------
 * Kernels come in a scalar version and SIMD versions chosen at run time.
 * KVC_ISA_AUTO picks the best one the CPU (and OS) supports; naming one
 * forces it (tests use this to cover every path), and a forced ISA the CPU
 * lacks makes the call fail with KVC_ENOTSUP. */
typedef enum {
    KVC_ISA_AUTO = 0,
    KVC_ISA_SCALAR, /* plain C, baseline x86-64 */
    KVC_ISA_AVX2,   /* AVX2 + FMA + F16C */
    KVC_ISA_AVX512, /* AVX-512 F/BW/VL/DQ; BF16 dot products when the CPU has AVX512-BF16 */
    KVC_ISA__COUNT
} kvc_isa_t;

/* What the CPU offers, as detected once (cpuid and xgetbv). */
typedef struct {
    bool avx2;        /* AVX2, FMA and F16C, with OS support for ymm state */
    bool avx512;      /* AVX-512 F, BW, VL, DQ, with OS support for zmm state */
    bool avx512_bf16; /* VDPBF16PS / VCVTNE2PS2BF16 */
    bool avx512_vbmi; /* VPERMI2B (the FP8 -> bf16 table lookup) */
    bool amx_bf16;    /* AMX tiles with BF16 (reported only: no kernel uses AMX) */
} kvc_cpu_t;

/* The detected features.  Never NULL; the result is computed once. */
KVC_API const kvc_cpu_t *kvc_cpu(void);
/* True if `isa` can run here (KVC_ISA_AUTO and KVC_ISA_SCALAR always can). */
KVC_API bool kvc_isa_supported(kvc_isa_t isa);
/* The ISA that KVC_ISA_AUTO resolves to. */
KVC_API kvc_isa_t kvc_isa_best(void);
/* "auto", "scalar", "avx2", "avx512"; "?" for an invalid value. */
KVC_API const char *kvc_isa_name(kvc_isa_t isa);
/* Parse a name as printed by kvc_isa_name.  Returns 0, or KVC_EINVAL (name
 * or out NULL, or an unknown name: *out unchanged). */
KVC_API int kvc_isa_parse(const char *name, kvc_isa_t *out);

/* ---- scalar conversions ---------------------------------------------------
 * Encoders round to nearest even and saturate as described above.  The
 * NaN codes they produce keep the sign: 0x7f / 0xff (e4m3), 0x7e / 0xfe
 * (e5m2), 0x7e00 | sign (f16), 0x7fc0 | sign (bf16). */
KVC_API uint8_t kvc_fp8_e4m3_from_f32(float x);
KVC_API float kvc_fp8_e4m3_to_f32(uint8_t code);
KVC_API uint8_t kvc_fp8_e5m2_from_f32(float x);
KVC_API float kvc_fp8_e5m2_to_f32(uint8_t code);
KVC_API uint16_t kvc_bf16_from_f32(float x);
KVC_API float kvc_bf16_to_f32(uint16_t code);
KVC_API uint16_t kvc_f16_from_f32(float x);
KVC_API float kvc_f16_to_f32(uint16_t code);

/* Largest finite value of a format (448, 57344, 65504, ...); 0 if invalid. */
KVC_API float kvc_dtype_max(kvc_dtype_t dt);

/* Counts kept by quantisation so that clipping is visible, not silent. */
typedef struct {
    uint64_t n_values;    /* values encoded */
    uint64_t n_clipped;   /* finite values whose |x| / scale rounds past the format's max */
    uint64_t n_nonfinite; /* NaN or infinite inputs (NaN stays NaN; +-inf saturates) */
} kvc_quant_stats_t;

/* Encode n values: dst[i] = encode(fl32(src[i] / s_i)), where s_i is
 * scales[i] when `scales` is non-NULL and `scale` otherwise; dst holds n
 * elements of dt.  Counts go to *stats (added; NULL: not counted).  `isa`
 * picks the implementation; every one gives the same bits.  Fails without
 * writing anything: KVC_EINVAL (an invalid dtype; dst or src NULL with
 * n > 0; a scale that is not positive and finite; an invalid isa value),
 * KVC_ENOTSUP (a forced ISA this CPU lacks). */
KVC_API int kvc_quantize(kvc_dtype_t dt, void *dst, const float *src, size_t n, float scale,
                         const float *scales, kvc_isa_t isa, kvc_quant_stats_t *stats);
/* Decode n values: dst[i] = decode(src[i]) * (scales ? scales[i] : scale).
 * Exact when the scale is 1 (or a power of two that keeps the result in
 * range).  The scales are not checked (a 0 gives 0, a NaN gives NaN).
 * KVC_EINVAL (an invalid dtype, or dst or src NULL with n > 0); no other
 * error. */
KVC_API int kvc_dequantize(kvc_dtype_t dt, float *dst, const void *src, size_t n, float scale,
                           const float *scales);

/* ---- scale layouts ----------------------------------------------------- */
typedef enum {
    /* No scales: values are stored as they are (and saturate at the format's
     * max).  The only layout for f32 and bf16, whose 8 exponent bits make a
     * scale pointless. */
    KVC_SCALE_NONE = 0,
    /* One K scale and one V scale per layer, in each block. */
    KVC_SCALE_TENSOR,
    /* One K scale and one V scale per (layer, KV head), in each block. */
    KVC_SCALE_HEAD,
    /* Keys: one scale per (layer, KV head, channel), in each block, so that
     * outlier channels get their own range.  Values: one scale per (layer,
     * KV head, token), computed from the token's own absolute maximum when
     * it is written, so values never clip.  For a latent cache (n_kv = 1,
     * MLA) only the per-channel scales exist (V is part of the latent). */
    KVC_SCALE_CHANNEL_TOKEN,
    KVC_SCALE__COUNT
} kvc_scale_layout_t;

/* "none", "tensor", "head", "channel-token"; "?" if invalid.  The parser
 * returns 0 or KVC_EINVAL (name or out NULL, or an unknown name). */
KVC_API const char *kvc_scale_layout_name(kvc_scale_layout_t layout);
KVC_API int kvc_scale_layout_parse(const char *name, kvc_scale_layout_t *out);

/* Shape of the storage a scale layout applies to. */
typedef struct {
    uint32_t n_layers;
    uint32_t n_kv;       /* 2: K and V; 1: one latent (MLA) */
    uint32_t n_kv_heads; /* 1 for a latent */
    uint32_t head_dim;
    uint32_t block_size;
    kvc_dtype_t dtype;
    kvc_scale_layout_t layout;
} kvc_scale_shape_t;

/* Bytes of side data one block needs (the pool's storage.scale_bytes).
 * Per block, per layer, as float32, K first:
 *
 *   NONE           nothing
 *   TENSOR         k, v                                  (n_kv floats)
 *   HEAD           k[n_kv_heads], v[n_kv_heads]
 *   CHANNEL_TOKEN  k[n_kv_heads][head_dim], v[n_kv_heads][block_size]
 *                  (latent: k[head_dim] only)
 *
 * layer l's floats start at l * (floats per layer).  A scale of 0 means "not
 * set yet" (the pool zeroes new storage).  0 for an invalid shape (NULL
 * included); check with kvc_scale_shape_check first. */
KVC_API size_t kvc_scale_bytes(const kvc_scale_shape_t *shape);
/* Floats of side data per layer in one block; 0 for an invalid shape. */
KVC_API size_t kvc_scale_floats_per_layer(const kvc_scale_shape_t *shape);
/* 0 if the shape is usable, else KVC_EINVAL (and no other error): shape
 * NULL, a size 0 or above 2^16, n_kv not 1 or 2 (1 only with one head), an
 * unknown dtype or layout, or a layout other than NONE for f32 or bf16 (only
 * f16 and the FP8 formats take scales). */
KVC_API int kvc_scale_shape_check(const kvc_scale_shape_t *shape);

/* ---- where new blocks get their scales -----------------------------------
 * A block's scales are fixed once tokens are in it: re-scaling would change
 * the meaning of codes already stored.  The rule (kvc_attn_write_kv):
 * writing a block's first slot (offset 0) sets the block's K and V scales
 * for that layer; later slots reuse them, and values beyond them clip (and
 * are counted).  A scale still 0 when a later slot is written (a block
 * whose first slot was never written) is set then, the same way.
 *
 * The scales a new block gets come from this state:
 *   - given scales (k_scale / v_scale non-NULL): copied as they are;
 *   - otherwise the running absolute maxima, which every write first raises
 *     with all of its own values: scale = amax * headroom / format max
 *     (1 while amax is 0).  So a block begun in a step covers that whole
 *     step; a later step with larger values clips in the blocks already
 *     begun and gets larger scales in the blocks it begins.
 * Per-token value scales (CHANNEL_TOKEN) need no state: each token's scale
 * is its own absolute maximum over the format's max.
 *
 * The arrays are caller-owned, kvc_kv_quant_len() floats each, shaped
 *   TENSOR: (n_layers)   HEAD: (n_layers, n_kv_heads)
 *   CHANNEL_TOKEN: K (n_layers, n_kv_heads, head_dim); V none.
 * Zero the maxima before the first write. */
typedef struct {
    float *k_amax, *v_amax;             /* running maxima (ignored where given scales are set) */
    const float *k_scale, *v_scale;     /* given scales, or NULL */
    float headroom;                     /* >= 1; 0 means 1 */
    kvc_quant_stats_t k_stats, v_stats; /* added to by every write */
} kvc_kv_quant_t;

/* Floats in the K (is_value = false) or V state array of a layout; 0 when
 * the layout keeps no such state, or for an invalid shape. */
KVC_API size_t kvc_kv_quant_len(const kvc_scale_shape_t *shape, bool is_value);
/* The scale that maps amax to the format's max with `headroom` to spare:
 * amax * headroom / kvc_dtype_max(dt); 1 when amax is 0 or not finite;
 * never below the smallest normal float. */
KVC_API float kvc_scale_from_amax(kvc_dtype_t dt, float amax, float headroom);

#ifdef __cplusplus
}
#endif
#endif /* KVCACHE_QUANT_H */
