/* attn_int.h - internals shared by the attn layer's files: CPU dispatch,
 * the bit-level format helpers, addressing of rows and scales in a view,
 * and the work item every ISA's kernel runs.  Not installed. */
#ifndef KVCACHE_ATTN_INT_H
#define KVCACHE_ATTN_INT_H

#include "kvcache/attn.h"

#include <string.h>
#include <xmmintrin.h>

/* Query rows one work item handles: K/V are read once per item. */
#define KVC__ROWS_MAX 64
/* Most tokens in a key tile (kvc__tile_tokens). */
#define KVC__TT_MAX   64

/* ---- bit casts -------------------------------------------------------------- */
static inline uint32_t kvc__f2u(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float kvc__u2f(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* ---- formats -------------------------------------------------------------------
 * A binary floating-point format narrower than binary32, described by its
 * mantissa bits and exponent bias; the encoder below is shared by the scalar
 * code and mirrored lane by lane in the SIMD encoders. */
typedef struct {
    int mbits;          /* stored mantissa bits */
    int bias;           /* exponent bias */
    uint32_t max_bits;  /* binary32 bits of the largest finite value */
    uint32_t max_code;  /* its code (without sign) */
    uint32_t nan_code;  /* NaN code produced (without sign) */
    int width;          /* bits per code: 8 or 16 */
    uint32_t clip_bits; /* binary32 bits of the smallest magnitude that rounding without
                           saturation would take past max: clipped means >= this */
} kvc__fmt_t;

extern const kvc__fmt_t kvc__fmt_e4m3, kvc__fmt_e5m2, kvc__fmt_f16, kvc__fmt_bf16;

/* The format of a narrow dtype, NULL for f32 (or an invalid dtype). */
const kvc__fmt_t *kvc__fmt(kvc_dtype_t dt);

/* Round the magnitude `a` (binary32 bits, not NaN, below max_bits) to the
 * format, nearest even.  Normal results come from integer rounding of the
 * bits; results below the format's smallest normal count quanta of
 * 2^(1 - bias - mbits) with an integer round-half-even shift. */
static inline uint32_t kvc__enc_mag(uint32_t a, const kvc__fmt_t *f)
{
    const int sh = 23 - f->mbits;
    const uint32_t min_normal = (uint32_t)(127 + 1 - f->bias) << 23;
    if (a >= min_normal || f->bias == 127) {
        uint32_t r = a + (1u << (sh - 1)) - 1 + ((a >> sh) & 1);
        return (r >> sh) - ((uint32_t)(127 - f->bias) << f->mbits);
    }
    /* |x| = M * 2^(E - 150) with M the 24-bit significand; the quantum is
     * 2^(1 - bias - mbits), so n = M >> s with s = 150 + 1 - bias - mbits - E. */
    uint32_t e = a >> 23;
    if (e == 0) return 0; /* binary32 subnormals are far below every quantum here */
    uint32_t m = (a & 0x7fffff) | 0x800000;
    int s = 150 + 1 - f->bias - f->mbits - (int)e;
    if (s > 25) return 0;
    return (m + (1u << (s - 1)) - 1 + ((m >> s) & 1)) >> s;
}

/* Encode a binary32 value: RNE, saturating, NaN to NaN. */
static inline uint32_t kvc__encode(float x, const kvc__fmt_t *f)
{
    uint32_t u = kvc__f2u(x), a = u & 0x7fffffffu;
    uint32_t sign = (u >> 31) << (f->width - 1);
    if (a > 0x7f800000u) return sign | f->nan_code;
    if (a >= f->max_bits) return sign | f->max_code;
    return sign | kvc__enc_mag(a, f);
}

/* Binary32 bits from which |x| / scale counts as clipped (see kvc__fmt_t). */
uint32_t kvc__clip_bits(kvc_dtype_t dt);

/* Decode exactly (NaN codes give a quiet NaN with the code's sign). */
float kvc__decode(uint32_t code, kvc_dtype_t dt);

/* bf16 bits of every FP8 magnitude (code & 0x7f), for the table lookups of
 * the SIMD kernels: [0] e4m3, [1] e5m2.  Exact: FP8 values are bf16 values. */
extern const uint16_t kvc__fp8_bf16[2][128];

/* ---- CPU dispatch ------------------------------------------------------------ */
/* Resolve `isa` (AUTO: the best available) or fail with KVC_ENOTSUP. */
int kvc__isa_resolve(kvc_isa_t isa, kvc_isa_t *out);
/* True when the AVX-512 BF16 path can run: AVX-512 with BF16 and VBMI. */
bool kvc__has_bf16_path(void);

/* ---- bulk quantisation (quant.c, quant_avx2.c, quant_avx512.c) ----------------
 * Same contract as kvc_quantize, arguments already checked; every version
 * gives the same bits and counts. */
void kvc__quantize_scalar(kvc_dtype_t dt, void *dst, const float *src, size_t n, float scale,
                          const float *scales, kvc_quant_stats_t *st);
void kvc__quantize_avx2(kvc_dtype_t dt, void *dst, const float *src, size_t n, float scale,
                        const float *scales, kvc_quant_stats_t *st);
void kvc__quantize_avx512(kvc_dtype_t dt, void *dst, const float *src, size_t n, float scale,
                          const float *scales, kvc_quant_stats_t *st);

/* ---- views ------------------------------------------------------------------ */
static inline size_t kvc__el_bytes(const kvc_kv_view_t *kv)
{
    return kvc_dtype_bytes(kv->shape.dtype);
}

/* Bytes of one token row (head_dim elements). */
static inline size_t kvc__row_bytes(const kvc_kv_view_t *kv)
{
    return (size_t)kv->shape.head_dim * kvc__el_bytes(kv);
}

/* The row of token `off` of KV head `head` in `block`: kv 0 = K, 1 = V (a
 * latent view has only K; its "V" is the same row). */
static inline uint8_t *kvc__row(const kvc_kv_view_t *kv, uint32_t block, uint32_t head,
                                uint32_t off, int which)
{
    size_t slab = which && kv->shape.n_kv == 2 ? kv->v_offset : kv->k_offset;
    return (uint8_t *)kv->base + (size_t)block * kv->block_bytes + slab +
           ((size_t)head * kv->shape.block_size + off) * kvc__row_bytes(kv);
}

/* This layer's scales in a block (quant.h has the layout), or NULL. */
static inline float *kvc__scales(const kvc_kv_view_t *kv, uint32_t block)
{
    if (kv->shape.layout == KVC_SCALE_NONE) return NULL;
    return (float *)((uint8_t *)kv->base + (size_t)block * kv->block_bytes + kv->scale_offset) +
           (size_t)kv->layer * kvc_scale_floats_per_layer(&kv->shape);
}

/* Where one token's scales are, given its block's scales `s` (NULL: none). */
typedef struct {
    float k;         /* K scale (1 when per channel or none) */
    float v;         /* V scale */
    const float *kc; /* per-channel K scales (head_dim), or NULL */
} kvc__tok_scales_t;

static inline kvc__tok_scales_t kvc__tok_scales(const kvc_kv_view_t *kv, const float *s,
                                                uint32_t head, uint32_t off)
{
    kvc__tok_scales_t t = {1.0f, 1.0f, NULL};
    if (!s) return t;
    const kvc_scale_shape_t *sh = &kv->shape;
    switch (sh->layout) {
    case KVC_SCALE_TENSOR:
        t.k = s[0];
        t.v = sh->n_kv == 2 ? s[1] : s[0];
        break;
    case KVC_SCALE_HEAD:
        t.k = s[head];
        t.v = sh->n_kv == 2 ? s[sh->n_kv_heads + head] : s[head];
        break;
    case KVC_SCALE_CHANNEL_TOKEN:
        t.kc = s + (size_t)head * sh->head_dim;
        if (sh->n_kv == 2)
            t.v = s[(size_t)sh->n_kv_heads * sh->head_dim + (size_t)head * sh->block_size + off];
        break;
    default:
        break;
    }
    return t;
}

/* ---- the work of one item ------------------------------------------------------ */
typedef struct {
    const kvc_kv_view_t *kv;
    uint32_t dk, dv; /* key and value dims; dv <= dk (a latent's V is its first dv channels) */
    float sm_scale;
    float softcap; /* 0: off */
    bool bf16;     /* the AVX-512 BF16 dot-product path */
    bool invariant; /* one query row per tile (kvc_attn_params_t.batch_invariant) */
} kvc__attn_cfg_t;

/* Rows of one item: the query rows of n_heads consecutive KV heads (head
 * j's rows are j * rows_per_head .. + rows_per_head - 1), each with the range
 * of key positions it sees (inclusive).  Several heads per item let a kernel
 * stream a block's K and V slabs in address order instead of one head's few
 * KiB at a time. */
typedef struct {
    const uint32_t *blocks; /* the sequence's block table */
    uint32_t kv_head;       /* the first KV head */
    uint32_t n_heads;       /* >= 1 */
    uint32_t rows_per_head;
    uint32_t n_rows;        /* n_heads * rows_per_head, 1 .. KVC__ROWS_MAX */
    int64_t lo_min, hi_max; /* union of the rows' ranges */
    const float *q[KVC__ROWS_MAX];
    float *out[KVC__ROWS_MAX];
    int64_t lo[KVC__ROWS_MAX], hi[KVC__ROWS_MAX];
} kvc__attn_item_t;

/* Query-row slots one head of rows_per_head rows takes in a kernel's tiles:
 * the next power of two up to 16, then multiples of 16. */
static inline uint32_t kvc__padded_rows(uint32_t rows)
{
    uint32_t p = 1;
    if (rows > 16) return (rows + 15) & ~15u;
    while (p < rows) p *= 2;
    return p;
}

/* The single-head item for head j of `it`. */
static inline void kvc__item_head(const kvc__attn_item_t *it, uint32_t j, kvc__attn_item_t *sub)
{
    const uint32_t r0 = j * it->rows_per_head, n = it->rows_per_head;
    sub->blocks = it->blocks;
    sub->kv_head = it->kv_head + j;
    sub->n_heads = 1;
    sub->rows_per_head = sub->n_rows = n;
    sub->lo_min = INT64_MAX;
    sub->hi_max = -1;
    for (uint32_t r = 0; r < n; r++) {
        sub->q[r] = it->q[r0 + r];
        sub->out[r] = it->out[r0 + r];
        sub->lo[r] = it->lo[r0 + r];
        sub->hi[r] = it->hi[r0 + r];
        if (sub->lo[r] < sub->lo_min) sub->lo_min = sub->lo[r];
        if (sub->hi[r] > sub->hi_max) sub->hi_max = sub->hi[r];
    }
}

/* Run one item; ws holds kvc__attn_ws_bytes(dk, dv) bytes, 64-byte aligned. */
void kvc__attn_item_scalar(const kvc__attn_cfg_t *cfg, const kvc__attn_item_t *it, void *ws);
void kvc__attn_item_avx2(const kvc__attn_cfg_t *cfg, const kvc__attn_item_t *it, void *ws);
void kvc__attn_item_avx512(const kvc__attn_cfg_t *cfg, const kvc__attn_item_t *it, void *ws);

/* Workspace an item needs, per ISA, and the largest of them. */
size_t kvc__attn_ws_scalar(uint32_t dk, uint32_t dv);
size_t kvc__attn_ws_avx2(uint32_t dk, uint32_t dv);
size_t kvc__attn_ws_avx512(uint32_t dk, uint32_t dv);
size_t kvc__attn_ws_bytes(uint32_t dk, uint32_t dv);

/* Tokens per tile for a key dim (the unit in which K/V are converted). */
static inline uint32_t kvc__tile_tokens(uint32_t dk)
{
    return dk <= 256 ? 64 : 32;
}

/* Carve `bytes` (rounded up to 64) off a workspace cursor. */
static inline void *kvc__ws_take(uint8_t **cur, size_t bytes)
{
    void *p = *cur;
    *cur += (bytes + 63) & ~(size_t)63;
    return p;
}

/* ---- prefetching the next key tile -------------------------------------------------
 * The SIMD kernels prefetch the next key tile's K/V rows while they work on
 * the current one, a few lines per step of work: one KV head's rows in a
 * block of 16 tokens are only a few KiB, the next block is anywhere, and
 * hardware prefetchers stop at page boundaries, so without this a paged
 * cache streams at a fraction of the memory bandwidth; issued all at once,
 * the prefetches overflow the miss queues and help little.  Runs are laid
 * out in address order: for a whole block, the item's heads are one run in
 * each of the K and V slabs. */
#define KVC__PF_RUNS 64
/* Into L1: on the Zen 5, in alternating runs against L2 (T1), 0-35% faster
 * on the bf16 and f32 decode rows, FP8 within noise.  (Two distances, the
 * next tile into L2 and the next head into L1, measured 15% slower.) */
#define KVC__PF_HINT _MM_HINT_T0
typedef struct {
    const uint8_t *k[KVC__PF_RUNS], *v[KVC__PF_RUNS]; /* v NULL: K only (a latent) */
    uint32_t lines[KVC__PF_RUNS];
    uint32_t n, cur, line;
    uint32_t per; /* lines of K (and of V) per step */
} kvc__pf_t;

/* Issue the cursor's next `per` lines of K and of V. */
static inline void kvc__pf_step(kvc__pf_t *c)
{
    uint32_t n = c->per;
    while (n && c->cur < c->n) {
        const uint32_t left = c->lines[c->cur] - c->line, m = n < left ? n : left;
        const uint8_t *k = c->k[c->cur] + (size_t)c->line * 64;
        for (uint32_t i = 0; i < m; i++)
            _mm_prefetch((const char *)(k + (size_t)i * 64), KVC__PF_HINT);
        if (c->v[c->cur]) {
            const uint8_t *v = c->v[c->cur] + (size_t)c->line * 64;
            for (uint32_t i = 0; i < m; i++)
                _mm_prefetch((const char *)(v + (size_t)i * 64), KVC__PF_HINT);
        }
        c->line += m;
        n -= m;
        if (c->line == c->lines[c->cur]) c->cur++, c->line = 0;
    }
}

/* Plan the prefetches of key tile [tb, tb + tt) of an item, to be spread
 * over `steps` calls of kvc__pf_step.  Blocks smaller than `gt` tokens are
 * not prefetched (their rows are gathered one by one anyway). */
static inline void kvc__pf_plan(kvc__pf_t *c, const kvc__attn_item_t *it, const kvc_kv_view_t *kv,
                                int64_t tb, uint32_t tt, uint32_t gt, uint32_t steps)
{
    const uint32_t bs = kv->shape.block_size, nh = it->n_heads;
    const size_t row = kvc__row_bytes(kv);
    const bool latent = kv->shape.n_kv == 1;
    c->n = c->cur = c->line = c->per = 0;
    if (bs < gt || tb > it->hi_max) return;
    const int64_t a0 = KVC_MAX(tb, it->lo_min), b0 = KVC_MIN(tb + tt - 1, it->hi_max);
    uint32_t total = 0;
    for (int64_t a = a0; a <= b0 && c->n < KVC__PF_RUNS;) {
        const uint32_t blk = it->blocks[a / bs], off = (uint32_t)(a % bs);
        const int64_t b = KVC_MIN(b0, a - off + bs - 1);
        const size_t n = (size_t)(b - a + 1);
        const uint32_t runs = n == bs ? 1 : nh; /* a whole block: one run per slab */
        for (uint32_t h = 0; h < runs && c->n < KVC__PF_RUNS; h++) {
            const uint32_t head = it->kv_head + h, o = n == bs ? 0 : off;
            c->k[c->n] = kvc__row(kv, blk, head, o, 0);
            c->v[c->n] = latent ? NULL : kvc__row(kv, blk, head, o, 1);
            c->lines[c->n] = (uint32_t)(((n == bs ? nh : 1) * n * row + 63) / 64);
            total += c->lines[c->n++];
        }
        a = b + 1;
    }
    c->per = steps ? (total + steps - 1) / steps : total;
}

#endif /* KVCACHE_ATTN_INT_H */
