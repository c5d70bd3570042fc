/* attn_avx512.c - the AVX-512 attention kernel, in two compute paths that
 * share one structure:
 *
 *   F32   fp32 products (VFMADD231PS) for f32/f16 storage, or any storage
 *         when fp32 compute is asked for;
 *   BF16  VDPBF16PS for bf16 and FP8 storage: K/V are exact in bf16 (FP8
 *         codes go through a 128-entry VPERMI2B table), the query times
 *         sm_scale and the softmax weights are rounded to bf16, products
 *         accumulate in fp32.
 *
 * Work unit: the query rows of one item (up to 64, of one or more KV heads)
 * in row tiles of RT = 1, 2, 4, 8 or 16 rows of one head, over keys in
 * groups of 16 tokens aligned to absolute positions, one group to a key
 * tile for decode-like items (up to 8 rows per head) and four otherwise.
 * A group's K/V rows are read in place when they sit in one block in
 * the compute type, or converted once into a scratch tile otherwise; every
 * row tile of the head then reuses them, so storage is read once per item
 * (GQA packing).  Key tiles are the outer loop and heads the inner one, and
 * the next key tile's rows of all the item's heads are prefetched in address
 * order, a few lines per step of the current tile's work: per-head runs of a
 * few KiB spread over blocks are otherwise fetched at half the bandwidth.
 *
 * QK^T: a 512-bit lane holds (row r, unit p) with 16 / RT units per row, a
 * unit being one fp32 or one bf16 pair; the query tile is laid out to match
 * and each token's units are broadcast (m32bcst / 64 / 128 / 256-bit / full
 * loads), so one instruction multiplies RT rows at once and no horizontal
 * work is needed until a final even/odd-lane fold per 16 tokens, which
 * leaves logits in [token][row] order.
 *
 * Online softmax: per row tile a running max and sum kept as vectors with
 * period RT; the output is rescaled only when the max grows by more than 8
 * (weights stay below e^8, far from overflow), as in FlashAttention-4, which
 * keeps rescales rare; the result is the same up to rounding.
 *
 * P.V: F32 broadcasts each weight (m32bcst) against 32 channels of V; BF16
 * interleaves the rows of token pairs (VPUNPCKLWD/HWD) and broadcasts the
 * pair of weights, so channels are permuted within 32-channel chunks in the
 * accumulator and put back when the output is written. */
#include "attn/attn_int.h"

#include <immintrin.h>
#include <math.h>

#define GT          16 /* tokens per group (one per lane) */
#define RESCALE_GAP 8.0f

typedef struct {
    const uint8_t *k, *v;     /* row 0 of the group's K / V in the compute type */
    size_t kst, vst;          /* bytes between rows */
    int64_t t0;               /* position of row 0 */
    float ks, vs;             /* the group's K / V scale, when not per token */
    const float *ktok, *vtok; /* per-token K / V scales (16), or NULL */
} group_t;

/* ---- vector helpers -------------------------------------------------------- */
static inline __m512i iota16(void)
{
    return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

/* e^x for x <= 88 (Cephes' polynomial, about 1 ulp); 0 below -87 and for -inf. */
static inline __m512 exp512(__m512 x)
{
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps((__mmask16)~tiny, _mm512_scalef_ps(p, n));
}

/* cap * tanh(x / cap), with tanh(y) = sign(y) (1 - 2 / (e^{2|y|} + 1)). */
static inline __m512 softcap512(__m512 x, float cap)
{
    __m512 y = _mm512_mul_ps(x, _mm512_set1_ps(1.0f / cap));
    __m512 e = exp512(
        _mm512_min_ps(_mm512_add_ps(_mm512_abs_ps(y), _mm512_abs_ps(y)), _mm512_set1_ps(88.0f)));
    __m512 t =
        _mm512_sub_ps(_mm512_set1_ps(1.0f),
                      _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
    __m512i sign = _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32((int)0x80000000u));
    t = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign));
    /* -inf logits (masked keys) stay -inf */
    __mmask16 ninf = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
    return _mm512_mask_mov_ps(_mm512_mul_ps(t, _mm512_set1_ps(cap)), ninf, x);
}

/* Reduce over the lanes of each row (period rt): every lane gets its row's result. */
static inline __m512 allmax(__m512 v, int rt)
{
#pragma GCC unroll 16
    for (int w = 8; w >= rt; w >>= 1)
        v = _mm512_max_ps(v, _mm512_permutexvar_ps(
                                 _mm512_and_si512(_mm512_add_epi32(iota16(), _mm512_set1_epi32(w)),
                                                  _mm512_set1_epi32(15)),
                                 v));
    return v;
}
static inline __m512 allsum(__m512 v, int rt)
{
#pragma GCC unroll 16
    for (int w = 8; w >= rt; w >>= 1)
        v = _mm512_add_ps(v, _mm512_permutexvar_ps(
                                 _mm512_and_si512(_mm512_add_epi32(iota16(), _mm512_set1_epi32(w)),
                                                  _mm512_set1_epi32(15)),
                                 v));
    return v;
}

/* Lane L of the j-th logit vector of a group is token j * (16 / rt) + L / rt. */
static inline __m512i tok_index(int j, int rt)
{
    int sh = __builtin_ctz((unsigned)rt);
    return _mm512_add_epi32(_mm512_srli_epi32(iota16(), (unsigned)sh),
                            _mm512_set1_epi32(j * (GT / rt)));
}

/* [a's even+odd pair sums | b's]: one level of the QK fold. */
static inline __m512 fold(__m512 a, __m512 b)
{
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    return _mm512_add_ps(_mm512_permutex2var_ps(a, ev, b), _mm512_permutex2var_ps(a, od, b));
}

static inline uint32_t ld32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t ld64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* P units (4 bytes each) from p, repeated across the 16 lanes. */
static inline __attribute__((always_inline)) __m512i bcast(const uint8_t *p, int P)
{
    switch (P) {
    case 1:
        return _mm512_set1_epi32((int)ld32(p));
    case 2:
        return _mm512_set1_epi64((long long)ld64(p));
    case 4:
        return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)p));
    case 8:
        return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)p));
    default:
        return _mm512_loadu_si512(p);
    }
}

/* ---- conversions into the compute type ------------------------------------------ */
/* 16 FP8 codes to fp32, exactly: the magnitude's bits shifted into binary32
 * position and scaled by 2^(127 - bias), which also gets subnormals right. */
static inline __m512 fp8_to_f32(__m128i codes, bool e5m2)
{
    __m512i x = _mm512_cvtepu8_epi32(codes);
    __m512i mag = _mm512_and_si512(x, _mm512_set1_epi32(0x7f));
    __m512i sign = _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x80)), 24);
    __m512 f;
    if (!e5m2) {
        f = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(mag, 20)),
                          _mm512_set1_ps(0x1p120f));
        f = _mm512_mask_mov_ps(f, _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7f)),
                               _mm512_set1_ps(NAN));
    } else {
        f = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(mag, 21)),
                          _mm512_set1_ps(0x1p112f));
        f = _mm512_mask_mov_ps(f, _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7c)),
                               _mm512_set1_ps(INFINITY));
        f = _mm512_mask_mov_ps(f, _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7c)),
                               _mm512_set1_ps(NAN));
    }
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(f), sign));
}

/* 16 stored elements at src (any dtype) to fp32. */
static inline __m512 load_f32(const uint8_t *src, kvc_dtype_t dt)
{
    switch (dt) {
    case KVC_DTYPE_F32:
        return _mm512_loadu_ps((const float *)(const void *)src);
    case KVC_DTYPE_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)src));
    case KVC_DTYPE_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)src)), 16));
    case KVC_DTYPE_FP8_E4M3:
        return fp8_to_f32(_mm_loadu_si128((const __m128i *)(const void *)src), false);
    default:
        return fp8_to_f32(_mm_loadu_si128((const __m128i *)(const void *)src), true);
    }
}

/* A row of n (a multiple of 16) elements to fp32, times per-channel scales (or not). */
static void row_to_f32(float *dst, const uint8_t *src, kvc_dtype_t dt, uint32_t n, const float *sc)
{
    size_t el = kvc_dtype_bytes(dt);
    for (uint32_t c = 0; c < n; c += 16) {
        __m512 x = load_f32(src + c * el, dt);
        if (sc) x = _mm512_mul_ps(x, _mm512_loadu_ps(sc + c));
        _mm512_storeu_ps(dst + c, x);
    }
}

typedef struct {
    __m512i hi0, hi1, lo0, lo1; /* bytes of the bf16 bits of magnitudes 0..63, 64..127 */
} lut_t;

static lut_t make_lut(kvc_dtype_t dt)
{
    const uint16_t *t = kvc__fp8_bf16[dt == KVC_DTYPE_FP8_E5M2];
    __m512i a = _mm512_loadu_si512(t), b = _mm512_loadu_si512(t + 32);
    __m512i c = _mm512_loadu_si512(t + 64), d = _mm512_loadu_si512(t + 96);
    lut_t l;
    l.lo0 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(a)),
                               _mm512_cvtepi16_epi8(b), 1);
    l.lo1 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(c)),
                               _mm512_cvtepi16_epi8(d), 1);
    l.hi0 =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(a, 8))),
                           _mm512_cvtepi16_epi8(_mm512_srli_epi16(b, 8)), 1);
    l.hi1 =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(c, 8))),
                           _mm512_cvtepi16_epi8(_mm512_srli_epi16(d, 8)), 1);
    return l;
}

/* VPERMI2B needs AVX512-VBMI, which the build's AVX-512 flags leave out: only
 * these functions use it, and only the BF16 path (which requires VBMI) runs them. */
#define VBMI __attribute__((target("avx512vbmi")))

/* 64 FP8 codes to bf16 bits, exactly and in order, as two vectors of 32:
 * two 128-entry byte lookups give each code's high and low byte, the sign is
 * or-ed in, and the bytes are interleaved back into words. */
static inline VBMI void fp8x64_to_bf16(__m512i c, __m512i hi0, __m512i hi1, __m512i lo0,
                                       __m512i lo1, __m512i *o0, __m512i *o1)
{
    __m512i hi = _mm512_permutex2var_epi8(hi0, c, hi1);
    __m512i lo = _mm512_permutex2var_epi8(lo0, c, lo1);
    hi = _mm512_ternarylogic_epi32(hi, c, _mm512_set1_epi8((char)0x80), 0xf8); /* hi | (c & 0x80) */
    __m512i w0 = _mm512_unpacklo_epi8(lo, hi), w1 = _mm512_unpackhi_epi8(lo, hi);
    *o0 = _mm512_permutex2var_epi64(w0, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), w1);
    *o1 = _mm512_permutex2var_epi64(w0, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), w1);
}

/* n (a multiple of 32) elements to bf16: FP8 through the table (exact), or
 * (per-channel scales, n = one row) through fp32 times the scales, rounded
 * to nearest even. */
static VBMI void row_to_bf16(uint16_t *dst, const uint8_t *src, kvc_dtype_t dt, uint32_t n,
                             const float *sc, const lut_t *l)
{
    if (!sc) {
        const __m512i hi0 = l->hi0, hi1 = l->hi1, lo0 = l->lo0, lo1 = l->lo1;
        uint32_t c = 0;
        for (; c + 64 <= n; c += 64) {
            __m512i o0, o1;
            fp8x64_to_bf16(_mm512_loadu_si512(src + c), hi0, hi1, lo0, lo1, &o0, &o1);
            _mm512_storeu_si512(dst + c, o0);
            _mm512_storeu_si512(dst + c + 32, o1);
        }
        if (c < n) {
            __m512i o0, o1;
            fp8x64_to_bf16(_mm512_maskz_loadu_epi8(0xffffffffull, src + c), hi0, hi1, lo0, lo1, &o0,
                           &o1);
            _mm512_storeu_si512(dst + c, o0);
        }
        return;
    }
    for (uint32_t c = 0; c < n; c += 32) {
        __m512 a = _mm512_mul_ps(load_f32(src + c, dt), _mm512_loadu_ps(sc + c));
        __m512 b = _mm512_mul_ps(load_f32(src + c + 16, dt), _mm512_loadu_ps(sc + c + 16));
        _mm512_storeu_si512(dst + c, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
}

/* ---- workspace ------------------------------------------------------------------ */
typedef struct {
    uint8_t *qt;          /* query tiles, (n_tiles, nc, 16) units */
    float *o;             /* (n_tiles * rt, dv) accumulators */
    float *mv, *lv;       /* (n_tiles, 16): running max and sum, period rt */
    int32_t *rlo, *rhi;   /* (n_tiles, 16): each lane's row range */
    float *s;             /* (groups, rt, 16) logits / weights of one row tile */
    uint32_t *pp;         /* (groups, 8, rt) bf16 weight pairs */
    uint8_t *kscr, *vscr; /* converted K / V rows, (tt, dk) / (tt, dv) */
    float *ks, *vs;       /* (tt) per-token scales */
    group_t *grp;         /* (tt / 16) */
} ws_t;

size_t kvc__attn_ws_avx512(uint32_t dk, uint32_t dv)
{
    size_t tt = kvc__tile_tokens(dk), r = KVC__ROWS_MAX, tiles = KVC__ROWS_MAX;
    size_t b = 0;
    b += r * dk * 4 + 64;
    b += r * dv * 4 + 64;
    b += 4 * (tiles * 64 + 64);
    b += tt * 16 * 4 + 64;
    b += tt / 2 * 16 * 4 + 64;
    b += tt * dk * 4 + 64 + tt * dv * 4 + 64;
    b += 2 * (tt * 4 + 64);
    b += tt / GT * sizeof(group_t) + 64;
    return b;
}

static ws_t carve(void *mem, uint32_t dk, uint32_t dv, uint32_t tt)
{
    uint8_t *cur = mem;
    ws_t w;
    size_t tiles = KVC__ROWS_MAX; /* one-row tiles of up to 64 heads */
    w.qt = kvc__ws_take(&cur, (size_t)KVC__ROWS_MAX * dk * 4);
    w.o = kvc__ws_take(&cur, (size_t)KVC__ROWS_MAX * dv * 4);
    w.mv = kvc__ws_take(&cur, tiles * 64);
    w.lv = kvc__ws_take(&cur, tiles * 64);
    w.rlo = kvc__ws_take(&cur, tiles * 64);
    w.rhi = kvc__ws_take(&cur, tiles * 64);
    w.s = kvc__ws_take(&cur, (size_t)tt * 16 * 4);
    w.pp = kvc__ws_take(&cur, (size_t)tt / 2 * 16 * 4);
    w.kscr = kvc__ws_take(&cur, (size_t)tt * dk * 4);
    w.vscr = kvc__ws_take(&cur, (size_t)tt * dv * 4);
    w.ks = kvc__ws_take(&cur, (size_t)tt * 4);
    w.vs = kvc__ws_take(&cur, (size_t)tt * 4);
    w.grp = kvc__ws_take(&cur, (size_t)tt / GT * sizeof(group_t));
    return w;
}

/* ---- the pieces of a row tile, specialised by rt at compile time ------------------- */
typedef kvc__pf_t pf_t;
#define pf_step kvc__pf_step

typedef struct {
    const kvc__attn_cfg_t *cfg;
    const kvc__attn_item_t *it;
    ws_t w;
    uint32_t rt, n_tiles, nc; /* rows per tile, tiles, QK chunks per tile */
    uint32_t tph;             /* tiles per KV head (tile t belongs to head t / tph) */
    uint32_t pv_steps;        /* prefetch steps P.V takes per group of a head's first tile */
    size_t qt_bytes;          /* bytes of one query tile */
    /* the storage, resolved once per item */
    size_t row;          /* bytes of a stored row */
    size_t cel;          /* bytes of a compute-type element (2 or 4) */
    size_t side_floats;  /* scale floats per layer in a block */
    bool conv_k, conv_v; /* rows must be converted (not read in place) */
    bool fused_v;        /* FP8 V decoded inside P.V (codes read in place) */
    bool latent, scaled, per_channel;
    lut_t lut;
    pf_t pf; /* prefetches of the next key tile */
} job_t;

/* Logits of one group for one row tile into out[0 .. rt), [token][row] order.
 * Token i's units are at k + i * kst; the 16 addresses are formed from four
 * base pointers and the strides kst, 2 kst, 3 kst, so the loop needs no
 * address arithmetic of its own. */
static inline __attribute__((always_inline)) void qk(const __m512i *qt, uint32_t nc,
                                                     const uint8_t *k, size_t kst, int rt,
                                                     bool bf16, pf_t *pf, __m512 *out)
{
    const int P = GT / rt;
    const size_t s1 = kst, s3 = 3 * kst, step = (size_t)P * 4;
    const uint8_t *p0 = k, *p1 = k + 4 * kst, *p2 = k + 8 * kst, *p3 = k + 12 * kst;
    __m512 acc[GT];
#pragma GCC unroll 16
    for (int i = 0; i < GT; i++) acc[i] = _mm512_setzero_ps();
#define KVC_QK_STEP(i, ptr)                                                                     \
    do {                                                                                        \
        __m512i kb = bcast(ptr, P);                                                             \
        if (bf16)                                                                               \
            acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)kb, (__m512bh)qv);                      \
        else                                                                                    \
            acc[i] = _mm512_fmadd_ps(_mm512_castsi512_ps(kb), _mm512_castsi512_ps(qv), acc[i]); \
    } while (0)
    for (uint32_t c = 0; c < nc; c++) {
        const __m512i qv = _mm512_load_si512(qt + c);
        KVC_QK_STEP(0, p0);
        KVC_QK_STEP(1, p0 + s1);
        KVC_QK_STEP(2, p0 + 2 * s1);
        KVC_QK_STEP(3, p0 + s3);
        KVC_QK_STEP(4, p1);
        KVC_QK_STEP(5, p1 + s1);
        KVC_QK_STEP(6, p1 + 2 * s1);
        KVC_QK_STEP(7, p1 + s3);
        KVC_QK_STEP(8, p2);
        KVC_QK_STEP(9, p2 + s1);
        KVC_QK_STEP(10, p2 + 2 * s1);
        KVC_QK_STEP(11, p2 + s3);
        KVC_QK_STEP(12, p3);
        KVC_QK_STEP(13, p3 + s1);
        KVC_QK_STEP(14, p3 + 2 * s1);
        KVC_QK_STEP(15, p3 + s3);
        p0 += step, p1 += step, p2 += step, p3 += step;
        /* the next tile's rows, spread evenly over the chunks so that the
         * memory system sees a steady stream rather than a burst */
        if (pf) pf_step(pf);
    }
#undef KVC_QK_STEP
#pragma GCC unroll 16
    for (int n = GT; n > rt; n /= 2)
#pragma GCC unroll 16
        for (int i = 0; i < n / 2; i++) acc[i] = fold(acc[2 * i], acc[2 * i + 1]);
#pragma GCC unroll 16
    for (int j = 0; j < rt; j++) out[j] = acc[j];
}

/* O[rows] *= alpha[row] for the rt rows of tile `t`. */
static void rescale_rows(float *o, uint32_t dv, const float *alpha, int rt)
{
    for (int r = 0; r < rt; r++) {
        __m512 a = _mm512_set1_ps(alpha[r]);
        float *row = o + (size_t)r * dv;
        for (uint32_t c = 0; c < dv; c += 16)
            _mm512_store_ps(row + c, _mm512_mul_ps(_mm512_load_ps(row + c), a));
    }
}

/* The accumulators of a P.V pass, ACC(sp, r, cc, h): rows r0 .. + RB of
 * O, 32-channel chunks from c0, S token splits; split 0 starts from O,
 * the others from zero, and they are summed back into O at the end. */
#define ACC(sp, r, cc, h) acc[(((sp)*RB + (r)) * CB + (cc)) * 2 + (h)]
static inline __attribute__((always_inline)) void
acc_load(__m512 *acc, const float *o, uint32_t dv, uint32_t c0, int r0, int RB, int CB, int S)
{
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
        for (int cc = 0; cc < CB; cc++) {
            const float *row = o + (size_t)(r0 + r) * dv + (size_t)(c0 + (uint32_t)cc * 32);
            ACC(0, r, cc, 0) = _mm512_load_ps(row);
            ACC(0, r, cc, 1) = _mm512_load_ps(row + 16);
#pragma GCC unroll 16
            for (int sp = 1; sp < S; sp++)
                ACC(sp, r, cc, 0) = ACC(sp, r, cc, 1) = _mm512_setzero_ps();
        }
}

static inline __attribute__((always_inline)) void
acc_store(const __m512 *acc, float *o, uint32_t dv, uint32_t c0, int r0, int RB, int CB, int S)
{
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
        for (int cc = 0; cc < CB; cc++) {
            __m512 x0 = ACC(0, r, cc, 0), x1 = ACC(0, r, cc, 1);
#pragma GCC unroll 16
            for (int sp = 1; sp < S; sp++)
                x0 = _mm512_add_ps(x0, ACC(sp, r, cc, 0)),
                x1 = _mm512_add_ps(x1, ACC(sp, r, cc, 1));
            float *row = o + (size_t)(r0 + r) * dv + (size_t)(c0 + (uint32_t)cc * 32);
            _mm512_store_ps(row, x0);
            _mm512_store_ps(row + 16, x1);
        }
}

/* P.V: O[rows] += P V over the key tile's groups.  A pass keeps RB rows x
 * CB 32-channel chunks x 2 vectors in registers, S times over (tokens split
 * S ways and summed at the end), so that 2 RB CB S = 16 accumulators hide
 * the latency of the multiply-adds whatever the number of rows.
 *
 * fp32 weights are w.s ([token][row] per group) against fp32 V rows; bf16
 * weight pairs are w.pp ((group, pair, row) dwords) against bf16 V rows of a
 * token pair interleaved by VPUNPCKLWD/HWD.  In the bf16 layout the first
 * vector of a chunk holds channels 8l+j (j < 4) in lanes 4l+j and the second
 * channels 8l+4+j. */
static inline __attribute__((always_inline)) void
pv_pass(float *o, uint32_t dv, uint32_t c0, int r0, const group_t *g, uint32_t ng, const float *s,
        const uint32_t *pp, int rt, bool bf16, int RB, int CB, int S, pf_t *pf)
{
    __m512 acc[16];
    acc_load(acc, o, dv, c0, r0, RB, CB, S);
    for (uint32_t gi = 0; gi < ng; gi++) {
        const size_t vst = g[gi].vst;
        if (bf16) {
            const uint8_t *v = g[gi].v + (size_t)c0 * 2;
            const uint32_t *p = pp + (size_t)gi * (GT / 2) * rt + r0;
#pragma GCC unroll 16
            for (int tp0 = 0; tp0 < GT / 2; tp0 += S) {
                if (pf) pf_step(pf);
#pragma GCC unroll 16
                for (int sp = 0; sp < S; sp++) {
                    const int tp = tp0 + sp;
#pragma GCC unroll 16
                    for (int cc = 0; cc < CB; cc++) {
                        __m512i x =
                            _mm512_loadu_si512(v + (size_t)(2 * tp) * vst + (size_t)cc * 64);
                        __m512i y =
                            _mm512_loadu_si512(v + (size_t)(2 * tp + 1) * vst + (size_t)cc * 64);
                        __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(x, y);
                        __m512bh hi = (__m512bh)_mm512_unpackhi_epi16(x, y);
#pragma GCC unroll 16
                        for (int r = 0; r < RB; r++) {
                            __m512bh w = (__m512bh)_mm512_set1_epi32((int)p[tp * rt + r]);
                            ACC(sp, r, cc, 0) = _mm512_dpbf16_ps(ACC(sp, r, cc, 0), lo, w);
                            ACC(sp, r, cc, 1) = _mm512_dpbf16_ps(ACC(sp, r, cc, 1), hi, w);
                        }
                    }
                }
            }
        } else {
            const uint8_t *v = g[gi].v + (size_t)c0 * 4;
            const float *p = s + (size_t)gi * GT * rt + r0;
#pragma GCC unroll 16
            for (int t0 = 0; t0 < GT; t0 += S) {
                if (pf) pf_step(pf);
#pragma GCC unroll 16
                for (int sp = 0; sp < S; sp++) {
                    const int t = t0 + sp;
#pragma GCC unroll 16
                    for (int cc = 0; cc < CB; cc++) {
                        const float *vr =
                            (const float *)(const void *)(v + (size_t)t * vst + (size_t)cc * 128);
                        __m512 v0 = _mm512_loadu_ps(vr), v1 = _mm512_loadu_ps(vr + 16);
#pragma GCC unroll 16
                        for (int r = 0; r < RB; r++) {
                            __m512 w = _mm512_set1_ps(p[t * rt + r]);
                            ACC(sp, r, cc, 0) = _mm512_fmadd_ps(w, v0, ACC(sp, r, cc, 0));
                            ACC(sp, r, cc, 1) = _mm512_fmadd_ps(w, v1, ACC(sp, r, cc, 1));
                        }
                    }
                }
            }
        }
    }
    acc_store(acc, o, dv, c0, r0, RB, CB, S);
}

/* All of P.V for a row tile: passes of RB = min(rt, 8) rows and the widest
 * CB (a power of two up to 8 / RB) that divides the chunks. */
static inline __attribute__((always_inline)) void pv(float *o, uint32_t dv, const group_t *g,
                                                     uint32_t ng, const float *s,
                                                     const uint32_t *pp, int rt, bool bf16,
                                                     pf_t *pf)
{
    const int RB = rt < 8 ? rt : 8;
    const uint32_t chunks = dv / 32;
    uint32_t cb = (uint32_t)(8 / RB);
    while (chunks % cb) cb /= 2;
/* CB and S stay valid constants in the cases a given RB never takes */
#define PV_CASE(CBV)                                                              \
    case CBV:                                                                     \
        pv_pass(o, dv, c, r0, g, ng, s, pp, rt, bf16, RB, CBV *RB <= 8 ? CBV : 1, \
                CBV * RB <= 8 ? 8 / (RB * CBV) : 1, pf);                          \
        break;
    for (int r0 = 0; r0 < rt; r0 += RB)
        for (uint32_t c = 0; c < dv; c += 32 * cb) {
            switch (cb) {
                PV_CASE(8)
                PV_CASE(4)
                PV_CASE(2)
                PV_CASE(1)
            default:
                break;
            }
        }
#undef PV_CASE
}

/* P.V straight from FP8 V codes (the BF16 path, V rows of dv % 64 == 0): a
 * token pair's 64-code chunks are byte-interleaved, looked up (the bf16
 * bits' high and low bytes) and word-interleaved, which gives the pair
 * operands of VDPBF16PS without a scratch copy.  32-channel chunk c = 2m + h
 * of the accumulators holds, for 128-bit lane l, channels 64m + 16l + 8h + j
 * in its first vector and 64m + 16l + 8h + 4 + j in its second (j < 4). */
static inline VBMI __attribute__((always_inline)) void
pv_fp8_pass(float *o, uint32_t dv, uint32_t c0, int r0, const group_t *g, uint32_t ng,
            const uint32_t *pp, int rt, int RB, int CB, int S, pf_t *pf, const lut_t *lut)
{
    const __m512i hi0 = lut->hi0, hi1 = lut->hi1, lo0 = lut->lo0, lo1 = lut->lo1;
    const __m512i sgn = _mm512_set1_epi8((char)0x80);
    __m512 acc[16];
    acc_load(acc, o, dv, c0, r0, RB, CB, S);
    for (uint32_t gi = 0; gi < ng; gi++) {
        const size_t vst = g[gi].vst;
        const uint8_t *v = g[gi].v;
        const uint32_t *p = pp + (size_t)gi * (GT / 2) * rt + r0;
#pragma GCC unroll 16
        for (int tp0 = 0; tp0 < GT / 2; tp0 += S) {
            if (pf) pf_step(pf);
#pragma GCC unroll 16
            for (int sp = 0; sp < S; sp++) {
                const int tp = tp0 + sp;
#pragma GCC unroll 16
                for (int cc = 0; cc < CB; cc++) {
                    const uint32_t c32 = c0 / 32 + (uint32_t)cc;
                    const uint8_t *vx = v + (size_t)(2 * tp) * vst + (size_t)(c32 / 2) * 64;
                    __m512i x = _mm512_loadu_si512(vx), y = _mm512_loadu_si512(vx + vst);
                    __m512i z = c32 & 1 ? _mm512_unpackhi_epi8(x, y) : _mm512_unpacklo_epi8(x, y);
                    __m512i hb = _mm512_permutex2var_epi8(hi0, z, hi1);
                    __m512i lb = _mm512_permutex2var_epi8(lo0, z, lo1);
                    hb = _mm512_ternarylogic_epi32(hb, z, sgn, 0xf8); /* hb | (z & 0x80) */
                    __m512bh lo = (__m512bh)_mm512_unpacklo_epi8(lb, hb);
                    __m512bh hi = (__m512bh)_mm512_unpackhi_epi8(lb, hb);
#pragma GCC unroll 16
                    for (int r = 0; r < RB; r++) {
                        __m512bh w = (__m512bh)_mm512_set1_epi32((int)p[tp * rt + r]);
                        ACC(sp, r, cc, 0) = _mm512_dpbf16_ps(ACC(sp, r, cc, 0), lo, w);
                        ACC(sp, r, cc, 1) = _mm512_dpbf16_ps(ACC(sp, r, cc, 1), hi, w);
                    }
                }
            }
        }
    }
    acc_store(acc, o, dv, c0, r0, RB, CB, S);
}
#undef ACC

/* All of the fused P.V for a row tile, split as pv() splits it (a function of
 * its own: only it may use VBMI). */
static VBMI __attribute__((noinline)) void pv_fp8(float *o, uint32_t dv, const group_t *g,
                                                  uint32_t ng, const uint32_t *pp, int rt, pf_t *pf,
                                                  const lut_t *lut)
{
    const int RB = rt < 8 ? rt : 8;
    const uint32_t chunks = dv / 32;
    uint32_t cb = (uint32_t)(8 / RB);
    while (chunks % cb) cb /= 2;
#define PV_FP8(RBV, CBV)                                                                      \
    if (RB == RBV && cb == CBV) {                                                             \
        for (int r0 = 0; r0 < rt; r0 += RBV)                                                  \
            for (uint32_t c = 0; c < dv; c += 32 * CBV)                                       \
                pv_fp8_pass(o, dv, c, r0, g, ng, pp, rt, RBV, CBV, 8 / (RBV * CBV), pf, lut); \
        return;                                                                               \
    }
    PV_FP8(1, 8)
    PV_FP8(1, 4)
    PV_FP8(1, 2)
    PV_FP8(1, 1)
    PV_FP8(2, 4)
    PV_FP8(2, 2)
    PV_FP8(2, 1)
    PV_FP8(4, 2)
    PV_FP8(4, 1)
    PV_FP8(8, 1)
#undef PV_FP8
}

/* For rt = 1, 2, 4, 8: word 2 (tpl * rt + r) + b of a weight vector in
 * pair order is word (2 tpl + b) * rt + r of the [token][row] vector. */
static const uint16_t pair_index[4][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15},
    {0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15},
    {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15},
};

/* Everything one row tile does with one key tile: logits, mask, softmax
 * update, weights, P.V. */
static inline __attribute__((always_inline)) void
row_tile(const job_t *j, uint32_t t, const group_t *g, uint32_t ng, int rt, bool bf16)
{
    const kvc__attn_cfg_t *cfg = j->cfg;
    const ws_t *w = &j->w;
    const __m512i *qt = (const __m512i *)(const void *)(w->qt + t * j->qt_bytes);
    const __m512i vlo = _mm512_load_si512(w->rlo + 16 * t),
                  vhi = _mm512_load_si512(w->rhi + 16 * t);
    /* the rows' common range: groups inside it need no mask */
    const int32_t lo_max = _mm512_reduce_max_epi32(vlo), hi_min = _mm512_reduce_min_epi32(vhi);
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (uint32_t gi = 0; gi < ng; gi++) {
        __m512 sv[GT];
        qk(qt, j->nc, g[gi].k, g[gi].kst, rt, bf16, t % j->tph == 0 ? (pf_t *)&j->pf : NULL, sv);
        const bool need_mask = g[gi].t0 < lo_max || g[gi].t0 + GT - 1 > hi_min;
        const __m512 ksv = g[gi].ktok ? _mm512_loadu_ps(g[gi].ktok) : _mm512_set1_ps(g[gi].ks);
        const bool kscaled = g[gi].ktok || g[gi].ks != 1.0f;
#pragma GCC unroll 16
        for (int v = 0; v < rt; v++) {
            __m512 x = sv[v];
            if (g[gi].ktok)
                x = _mm512_mul_ps(x, _mm512_permutexvar_ps(tok_index(v, rt), ksv));
            else if (kscaled)
                x = _mm512_mul_ps(x, ksv);
            if (cfg->softcap > 0) x = softcap512(x, cfg->softcap);
            if (need_mask) {
                __m512i pos =
                    _mm512_add_epi32(tok_index(v, rt), _mm512_set1_epi32((int32_t)g[gi].t0));
                __mmask16 ok =
                    _mm512_cmpge_epi32_mask(pos, vlo) & _mm512_cmple_epi32_mask(pos, vhi);
                x = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), ok, x);
            }
            mx = _mm512_max_ps(mx, x);
            _mm512_store_ps(w->s + ((size_t)gi * rt + v) * 16, x);
        }
    }
    /* online softmax: rescale only when a row's max grows by more than RESCALE_GAP */
    mx = allmax(mx, rt);
    __m512 m = _mm512_load_ps(w->mv + 16 * t);
    if (_mm512_cmp_ps_mask(mx, _mm512_add_ps(m, _mm512_set1_ps(RESCALE_GAP)), _CMP_GT_OQ)) {
        __m512 mn = _mm512_max_ps(m, mx);
        __m512 diff = _mm512_sub_ps(m, mn);
        diff =
            _mm512_mask_mov_ps(diff, _mm512_cmp_ps_mask(mn, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ),
                               _mm512_setzero_ps());
        __m512 alpha = exp512(diff);
        _mm512_store_ps(w->lv + 16 * t, _mm512_mul_ps(_mm512_load_ps(w->lv + 16 * t), alpha));
        float al[16];
        _mm512_storeu_ps(al, alpha);
        rescale_rows(w->o + (size_t)t * rt * cfg->dv, cfg->dv, al, rt);
        m = mn;
        _mm512_store_ps(w->mv + 16 * t, m);
    }
    const __m512 mu = _mm512_mask_mov_ps(
        m, _mm512_cmp_ps_mask(m, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), _mm512_setzero_ps());
    __m512 lsum = _mm512_setzero_ps();
    for (uint32_t gi = 0; gi < ng; gi++) {
        const __m512 vsv = g[gi].vtok ? _mm512_loadu_ps(g[gi].vtok) : _mm512_set1_ps(g[gi].vs);
        const bool vscaled = g[gi].vtok || g[gi].vs != 1.0f;
        __m512 pv[GT];
#pragma GCC unroll 16
        for (int v = 0; v < rt; v++) {
            __m512 p = exp512(_mm512_sub_ps(_mm512_load_ps(w->s + ((size_t)gi * rt + v) * 16), mu));
            lsum = _mm512_add_ps(lsum, p);
            if (g[gi].vtok)
                p = _mm512_mul_ps(p, _mm512_permutexvar_ps(tok_index(v, rt), vsv));
            else if (vscaled)
                p = _mm512_mul_ps(p, vsv);
            pv[v] = p;
        }
        if (!bf16) {
#pragma GCC unroll 16
            for (int v = 0; v < rt; v++) _mm512_store_ps(w->s + ((size_t)gi * rt + v) * 16, pv[v]);
        } else if (rt == 16) {
            /* two tokens per pair: interleave the 16 rows' weights of tokens 2tp, 2tp+1 */
            static const uint16_t ilw[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                             21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                             11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
            const __m512i il = _mm512_loadu_si512(ilw);
#pragma GCC unroll 16
            for (int tp = 0; tp < GT / 2; tp++) {
                __m512i b = (__m512i)_mm512_cvtne2ps_pbh(pv[2 * tp + 1], pv[2 * tp]);
                _mm512_store_si512(w->pp + ((size_t)gi * (GT / 2) + tp) * 16,
                                   _mm512_permutexvar_epi16(il, b));
            }
        } else {
            /* vector v holds tokens v * (16 / rt) + u, u < 16 / rt, rows in lanes: word
             * 2 (tpl * rt + r) + b of the result is weight (token 2 tpl + b, row r) */
            const __m256i il = _mm256_loadu_si256(
                (const __m256i *)(const void *)pair_index[__builtin_ctz((unsigned)rt)]);
#pragma GCC unroll 16
            for (int v = 0; v < rt; v++) {
                __m256i b = (__m256i)_mm512_cvtneps_pbh(pv[v]);
                _mm256_store_si256(
                    (__m256i *)(void *)(w->pp + (size_t)gi * (GT / 2) * rt + (size_t)v * 8),
                    _mm256_permutexvar_epi16(il, b));
            }
        }
    }
    _mm512_store_ps(w->lv + 16 * t, _mm512_add_ps(_mm512_load_ps(w->lv + 16 * t), lsum));
    pf_t *pf = t % j->tph == 0 ? (pf_t *)&j->pf : NULL;
    float *o = w->o + (size_t)t * rt * cfg->dv;
    if (bf16 && j->fused_v)
        pv_fp8(o, cfg->dv, g, ng, w->pp, rt, pf, &j->lut);
    else
        pv(o, cfg->dv, g, ng, w->s, w->pp, rt, bf16, pf);
}

static void row_tile_any(const job_t *j, uint32_t t, const group_t *g, uint32_t ng)
{
    const bool b = j->cfg->bf16;
    switch (j->rt) {
    case 1:
        b ? row_tile(j, t, g, ng, 1, true) : row_tile(j, t, g, ng, 1, false);
        break;
    case 2:
        b ? row_tile(j, t, g, ng, 2, true) : row_tile(j, t, g, ng, 2, false);
        break;
    case 4:
        b ? row_tile(j, t, g, ng, 4, true) : row_tile(j, t, g, ng, 4, false);
        break;
    case 8:
        b ? row_tile(j, t, g, ng, 8, true) : row_tile(j, t, g, ng, 8, false);
        break;
    default:
        b ? row_tile(j, t, g, ng, 16, true) : row_tile(j, t, g, ng, 16, false);
        break;
    }
}

/* ---- setting up an item ------------------------------------------------------------ */
/* The item row in slot r of tile t: tiles of a head cover its rows, and slots
 * past the head's last row repeat it (their results are not written). */
static inline uint32_t tile_row(const job_t *j, uint32_t t, uint32_t r)
{
    const uint32_t head = t / j->tph, local = (t % j->tph) * j->rt + r, rph = j->it->rows_per_head;
    return head * rph + KVC_MIN(local, rph - 1);
}

/* Query tile t: lane r*P + p of chunk c holds unit c*P + p of row t*rt + r
 * (rows past the item's end repeat its last row). */
static void build_qt(const job_t *j, uint32_t t)
{
    const kvc__attn_cfg_t *cfg = j->cfg;
    const int rt = (int)j->rt, P = GT / rt;
    uint8_t *dst = j->w.qt + t * j->qt_bytes;
    for (int r = 0; r < rt; r++) {
        uint32_t row = tile_row(j, t, (uint32_t)r);
        const float *q = j->it->q[row];
        uint32_t units = cfg->bf16 ? cfg->dk / 2 : cfg->dk;
        for (uint32_t u = 0; u < units; u++) {
            uint32_t c = u / (uint32_t)P, p = u % (uint32_t)P;
            uint32_t word;
            if (cfg->bf16)
                word = kvc_bf16_from_f32(q[2 * u] * cfg->sm_scale) |
                       (uint32_t)kvc_bf16_from_f32(q[2 * u + 1] * cfg->sm_scale) << 16;
            else
                word = kvc__f2u(q[u] * cfg->sm_scale);
            memcpy(dst + ((size_t)c * 16 + (size_t)r * P + p) * 4, &word, 4);
        }
    }
    int32_t lo[16], hi[16];
    for (int l = 0; l < 16; l++) {
        uint32_t row = tile_row(j, t, (uint32_t)(l % rt));
        lo[l] = (int32_t)j->it->lo[row];
        hi[l] = (int32_t)j->it->hi[row];
    }
    memcpy(j->w.rlo + 16 * t, lo, sizeof lo);
    memcpy(j->w.rhi + 16 * t, hi, sizeof hi);
}

/* Convert n rows (dim elements each, contiguous at src) into the compute
 * type at dst, times per-channel scales when kc is set. */
static void convert_rows(const job_t *j, uint8_t *dst, const uint8_t *src, uint32_t n, uint32_t dim,
                         const float *kc)
{
    const kvc_dtype_t dt = j->cfg->kv->shape.dtype;
    const size_t el = kvc_dtype_bytes(dt);
    if (!kc) {
        /* rows are back to back on both sides: one flat run */
        if (j->cfg->bf16)
            row_to_bf16((uint16_t *)(void *)dst, src, dt, n * dim, NULL, &j->lut);
        else
            row_to_f32((float *)(void *)dst, src, dt, n * dim, NULL);
        return;
    }
    for (uint32_t r = 0; r < n; r++) {
        if (j->cfg->bf16)
            row_to_bf16((uint16_t *)(void *)(dst + (size_t)r * dim * 2), src + (size_t)r * dim * el,
                        dt, dim, kc, &j->lut);
        else
            row_to_f32((float *)(void *)(dst + (size_t)r * dim * 4), src + (size_t)r * dim * el, dt,
                       dim, kc);
    }
}

static inline const float *side_of(const job_t *j, uint32_t blk)
{
    const kvc_kv_view_t *kv = j->cfg->kv;
    return (const float *)(const void *)((const uint8_t *)kv->base + (size_t)blk * kv->block_bytes +
                                         kv->scale_offset) +
           (size_t)kv->layer * j->side_floats;
}

/* Rows [i0, i1] of a group from one block's rows starting at src (row 0 of
 * the group); the other rows of the scratch are zeroed.  Returns where the
 * group's rows are and their stride. */
static const uint8_t *group_rows(const job_t *j, uint8_t *scr, const uint8_t *src, int i0, int i1,
                                 uint32_t dim, bool conv, const float *kc, size_t *stride)
{
    if (i0 == 0 && i1 == GT - 1 && !conv) {
        *stride = j->row;
        return src;
    }
    const size_t out_row = (size_t)dim * j->cel;
    if (i0 > 0) memset(scr, 0, (size_t)i0 * out_row);
    if (i1 < GT - 1) memset(scr + (size_t)(i1 + 1) * out_row, 0, (size_t)(GT - 1 - i1) * out_row);
    uint32_t n = (uint32_t)(i1 - i0 + 1);
    if (conv)
        convert_rows(j, scr + (size_t)i0 * out_row, src + (size_t)i0 * j->row, n, dim, kc);
    else
        memcpy(scr + (size_t)i0 * out_row, src + (size_t)i0 * j->row, n * j->row);
    *stride = out_row;
    return scr;
}

/* Plan the prefetches of key tile [tb, tb + tt): one step per QK chunk and
 * per P.V token step of each head's first row tile. */
static void plan_prefetch(job_t *j, int64_t tb, uint32_t tt)
{
    uint32_t ng = 0;
    for (int64_t t0 = tb; t0 < tb + tt && t0 <= j->it->hi_max; t0 += GT) ng++;
    kvc__pf_plan(&j->pf, j->it, j->cfg->kv, tb, tt, GT,
                 j->it->n_heads * ng * (j->nc + j->pv_steps));
}

/* Find the K/V rows of the groups of key tile [tb, tb + tt): read in place
 * when a group is whole, in one block and in the compute type, converted
 * (or gathered) once into scratch otherwise. */
static uint32_t build_groups(job_t *j, uint32_t kvh, int64_t tb, uint32_t tt)
{
    const kvc__attn_cfg_t *cfg = j->cfg;
    const kvc__attn_item_t *it = j->it;
    const kvc_kv_view_t *kv = cfg->kv;
    ws_t *w = &j->w;
    const uint32_t bs = kv->shape.block_size, dk = cfg->dk, dv = cfg->dv, H = kv->shape.n_kv_heads;
    uint32_t ng = 0;
    for (int64_t t0 = tb; t0 < tb + tt && t0 <= it->hi_max; t0 += GT, ng++) {
        group_t *g = &w->grp[ng];
        const int64_t a = KVC_MAX(t0, it->lo_min), b = KVC_MIN(t0 + GT - 1, it->hi_max);
        const int i0 = (int)(a - t0), i1 = (int)(b - t0);
        uint8_t *kd = w->kscr + (size_t)ng * GT * dk * j->cel,
                *vd = w->vscr + (size_t)ng * GT * dv * j->cel;
        g->t0 = t0;
        g->ks = g->vs = 1.0f;
        g->ktok = g->vtok = NULL;
        if (bs >= GT) {
            /* the whole group sits in one block (groups are aligned, blocks are powers of two) */
            const uint32_t blk = it->blocks[t0 / bs], off0 = (uint32_t)(t0 % bs);
            const float *sc = j->scaled ? side_of(j, blk) : NULL;
            kvc__tok_scales_t ts = kvc__tok_scales(kv, sc, kvh, off0);
            g->ks = ts.k;
            if (j->per_channel && !j->latent) {
                const float *vt = sc + (size_t)H * dk + (size_t)kvh * bs + off0;
                if (i0 == 0 && i1 == GT - 1) {
                    g->vtok = vt;
                } else {
                    float *vs = w->vs + ng * GT;
                    for (int i = 0; i < GT; i++) vs[i] = i >= i0 && i <= i1 ? vt[i] : 1.0f;
                    g->vtok = vs;
                }
            } else {
                g->vs = ts.v;
            }
            g->k = group_rows(j, kd, kvc__row(kv, blk, kvh, off0, 0), i0, i1, dk, j->conv_k, ts.kc,
                              &g->kst);
            if (j->latent) {
                g->v = g->k, g->vst = g->kst;
            } else {
                if (j->fused_v) {
                    /* codes in place, or copied with zeros (0.0) past the valid rows */
                    const uint8_t *src = kvc__row(kv, blk, kvh, off0, 1);
                    if (i0 == 0 && i1 == GT - 1) {
                        g->v = src, g->vst = j->row;
                    } else {
                        memset(vd, 0, (size_t)GT * dv);
                        memcpy(vd + (size_t)i0 * dv, src + (size_t)i0 * j->row,
                               (size_t)(i1 - i0 + 1) * dv);
                        g->v = vd, g->vst = dv;
                    }
                } else {
                    g->v = group_rows(j, vd, kvc__row(kv, blk, kvh, off0, 1), i0, i1, dv, j->conv_v,
                                      NULL, &g->vst);
                }
            }
            continue;
        }
        /* blocks smaller than a group: gather token by token */
        float *ks = w->ks + ng * GT, *vs = w->vs + ng * GT;
        const size_t ko = (size_t)dk * j->cel, vo = j->fused_v ? dv : (size_t)dv * j->cel;
        for (int i = 0; i < GT; i++) {
            ks[i] = vs[i] = 1.0f;
            uint8_t *kr = kd + (size_t)i * ko, *vr = vd + (size_t)i * vo;
            if (i < i0 || i > i1) {
                memset(kr, 0, ko);
                if (!j->latent) memset(vr, 0, vo);
                continue;
            }
            const int64_t pos = t0 + i;
            const uint32_t blk = it->blocks[pos / bs], off = (uint32_t)(pos % bs);
            kvc__tok_scales_t ts =
                kvc__tok_scales(kv, j->scaled ? side_of(j, blk) : NULL, kvh, off);
            ks[i] = ts.k;
            vs[i] = ts.v;
            const uint8_t *ksrc = kvc__row(kv, blk, kvh, off, 0);
            if (j->conv_k)
                convert_rows(j, kr, ksrc, 1, dk, ts.kc);
            else
                memcpy(kr, ksrc, ko);
            if (j->latent) continue;
            const uint8_t *vsrc = kvc__row(kv, blk, kvh, off, 1);
            if (j->conv_v && !j->fused_v)
                convert_rows(j, vr, vsrc, 1, dv, NULL);
            else
                memcpy(vr, vsrc, vo);
        }
        g->ktok = ks, g->vtok = vs;
        g->k = kd, g->kst = ko;
        g->v = j->latent ? kd : vd;
        g->vst = j->latent ? ko : vo;
    }
    return ng;
}

void kvc__attn_item_avx512(const kvc__attn_cfg_t *cfg, const kvc__attn_item_t *it, void *ws)
{
    /* Key tiles of one group for decode-like items (a few rows per head):
     * all heads of 16 tokens, then the next 16, which keeps the prefetch
     * lead short and the miss queues steady; measured 1.1-1.4x over
     * 64-token tiles at g = 4 and 8 with blocks of 64.  Longer row sets
     * (prefill chunks, MLA) keep long tiles, which spread the softmax
     * bookkeeping over more keys. */
    const uint32_t tt = it->rows_per_head <= 8 ? GT : kvc__tile_tokens(cfg->dk);
    job_t j = {.cfg = cfg, .it = it, .w = carve(ws, cfg->dk, cfg->dv, tt)};
    j.rt = 1;
    while (!cfg->invariant && j.rt < it->rows_per_head && j.rt < GT) j.rt *= 2;
    j.tph = (it->rows_per_head + j.rt - 1) / j.rt;
    j.n_tiles = it->n_heads * j.tph;
    j.nc = (cfg->bf16 ? cfg->dk / 2 : cfg->dk) * j.rt / GT;
    j.qt_bytes = (size_t)j.nc * 64;
    {
        /* as pv() splits its work: passes of RB rows x CB chunks, S-way token split */
        const uint32_t RB = j.rt < 8 ? j.rt : 8, chunks = cfg->dv / 32;
        uint32_t cb = 8 / RB;
        while (chunks % cb) cb /= 2;
        const uint32_t S = 8 / (RB * cb);
        j.pv_steps = (j.rt / RB) * (chunks / cb) * ((cfg->bf16 ? GT / 2 : GT) / S);
    }
    const kvc_kv_view_t *kv = cfg->kv;
    const kvc_dtype_t dt = kv->shape.dtype, ct = cfg->bf16 ? KVC_DTYPE_BF16 : KVC_DTYPE_F32;
    j.row = kvc__row_bytes(kv);
    j.cel = kvc_dtype_bytes(ct);
    j.side_floats = kvc_scale_floats_per_layer(&kv->shape);
    j.latent = kv->shape.n_kv == 1;
    j.scaled = kv->shape.layout != KVC_SCALE_NONE;
    j.per_channel = kv->shape.layout == KVC_SCALE_CHANNEL_TOKEN;
    j.conv_k = dt != ct || j.per_channel;
    j.conv_v = dt != ct;
    j.fused_v = cfg->bf16 && j.conv_v && !j.latent && cfg->dv % 64 == 0;
    if (cfg->bf16 && dt != KVC_DTYPE_BF16) j.lut = make_lut(dt);
    for (uint32_t t = 0; t < j.n_tiles; t++) {
        build_qt(&j, t);
        _mm512_store_ps(j.w.mv + 16 * t, _mm512_set1_ps(-INFINITY));
        _mm512_store_ps(j.w.lv + 16 * t, _mm512_setzero_ps());
    }
    memset(j.w.o, 0, sizeof(float) * j.n_tiles * j.rt * cfg->dv);
    /* key tiles outside, heads inside: each tile's blocks are read head after
     * head, and the next tile's are prefetched in address order meanwhile */
    /* (tiles end at multiples of tt, absolute positions: see attn_avx2.c) */
    for (int64_t tb = it->lo_min & ~(int64_t)(GT - 1), te; tb <= it->hi_max; tb = te) {
        te = (tb / tt + 1) * tt;
        plan_prefetch(&j, te, tt);
        for (uint32_t h = 0; h < it->n_heads; h++) {
            uint32_t ng = build_groups(&j, it->kv_head + h, tb, (uint32_t)(te - tb));
            for (uint32_t t = h * j.tph; t < (h + 1) * j.tph; t++) row_tile_any(&j, t, j.w.grp, ng);
        }
    }
    /* out = O / l, undoing the bf16 path's channel order */
    const __m512i u0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i u1 =
        _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (uint32_t t = 0; t < j.n_tiles; t++) {
        float l[16];
        _mm512_storeu_ps(l, allsum(_mm512_load_ps(j.w.lv + 16 * t), (int)j.rt));
        const uint32_t head = t / j.tph, local0 = (t % j.tph) * j.rt;
        for (uint32_t r = 0; r < j.rt && local0 + r < it->rows_per_head; r++) {
            const float *o = j.w.o + (size_t)(t * j.rt + r) * cfg->dv;
            float *out = it->out[head * it->rows_per_head + local0 + r];
            __m512 inv = _mm512_set1_ps(l[r] > 0 ? 1.0f / l[r] : 0.0f);
            for (uint32_t c = 0; c < cfg->dv; c += 32) {
                __m512 a = _mm512_load_ps(o + c), b = _mm512_load_ps(o + c + 16);
                if (j.fused_v) {
                    /* chunk c = 2m + h: lane 4l + j of vector v is channel
                     * 64m + 16l + 8h + 4v + j: gather this 32-channel run from
                     * the chunk pair */
                    const uint32_t m64 = c / 64, half = (c / 32) & 1;
                    float tmp[32];
                    for (uint32_t q = 0; q < 32; q++) {
                        const uint32_t ch = half * 32 + q; /* channel within the 64 */
                        const uint32_t ln = ch / 16, h = (ch / 8) & 1, v = (ch / 4) & 1,
                                       jj = ch & 3;
                        tmp[q] = o[m64 * 64 + h * 32 + v * 16 + ln * 4 + jj];
                    }
                    a = _mm512_loadu_ps(tmp), b = _mm512_loadu_ps(tmp + 16);
                } else if (cfg->bf16) {
                    __m512 x = _mm512_permutex2var_ps(a, u0, b),
                           y = _mm512_permutex2var_ps(a, u1, b);
                    a = x, b = y;
                }
                _mm512_storeu_ps(out + c, _mm512_mul_ps(a, inv));
                _mm512_storeu_ps(out + c + 16, _mm512_mul_ps(b, inv));
            }
        }
    }
}
