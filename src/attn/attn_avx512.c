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
 * Work unit: the query rows of one item (up to 64, sharing one KV head) in
 * row tiles of RT = 1, 2, 4, 8 or 16 rows, over keys in groups of 16 tokens
 * aligned to absolute positions, several groups to a tile.  A group's K/V
 * rows are read in place when they sit in one block in the compute type, or
 * converted once into a scratch tile otherwise; every row tile of the item
 * then reuses them, so storage is read once per item (GQA packing).
 *
 * QK^T: a 512-bit lane holds (row r, unit p) with 16 / RT units per row, a
 * unit being one fp32 or one bf16 pair; the query tile is laid out to match
 * and each token's units are broadcast (m32bcst / 64 / 128 / 256-bit / full
 * loads), so one instruction multiplies RT rows at once and no horizontal
 * work is needed until a final even/odd-lane fold per 16 tokens, which
 * leaves logits in [token][row] order.
 *
 * Online softmax: per row tile a running max and sum kept as vectors with
 * period RT; the output is rescaled only when the max grows by more than
 * 2^(8/ln 2) (e^8), as in FlashAttention-4, which keeps rescales rare and
 * exact (weights stay below e^8, far from overflow).
 *
 * P.V: F32 broadcasts each weight (m32bcst) against 32 channels of V; BF16
 * interleaves the rows of token pairs (VPUNPCKLWD/HWD) and broadcasts the
 * pair of weights, so channels are permuted within 32-channel chunks in the
 * accumulator and put back when the output is written. */
#include "attn/attn_int.h"

#include <immintrin.h>
#include <math.h>

#define GT 16 /* tokens per group (one per lane) */
#define RESCALE_GAP 8.0f

typedef struct {
    const uint8_t *k, *v; /* row 0 of the group's K / V in the compute type */
    size_t kst, vst;      /* bytes between rows */
    int64_t t0;           /* position of row 0 */
    bool kscaled, vscaled;/* per-token scales differ from 1 */
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
    __m512 e = exp512(_mm512_min_ps(_mm512_add_ps(_mm512_abs_ps(y), _mm512_abs_ps(y)),
                                    _mm512_set1_ps(88.0f)));
    __m512 t = _mm512_sub_ps(_mm512_set1_ps(1.0f),
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
    for (int w = 8; w >= rt; w >>= 1)
        v = _mm512_max_ps(v, _mm512_permutexvar_ps(
                                 _mm512_and_si512(_mm512_add_epi32(iota16(), _mm512_set1_epi32(w)),
                                                  _mm512_set1_epi32(15)), v));
    return v;
}
static inline __m512 allsum(__m512 v, int rt)
{
    for (int w = 8; w >= rt; w >>= 1)
        v = _mm512_add_ps(v, _mm512_permutexvar_ps(
                                 _mm512_and_si512(_mm512_add_epi32(iota16(), _mm512_set1_epi32(w)),
                                                  _mm512_set1_epi32(15)), v));
    return v;
}

/* Lane L of the j-th logit vector of a group is token j * (16 / rt) + L / rt. */
static inline __m512i tok_index(int j, int rt)
{
    int sh = __builtin_ctz((unsigned)rt);
    return _mm512_add_epi32(_mm512_srli_epi32(iota16(), (unsigned)sh), _mm512_set1_epi32(j * (GT / rt)));
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
    case 1: return _mm512_set1_epi32((int)ld32(p));
    case 2: return _mm512_set1_epi64((long long)ld64(p));
    case 4: return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)p));
    case 8: return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)p));
    default: return _mm512_loadu_si512(p);
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
        f = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(mag, 20)), _mm512_set1_ps(0x1p120f));
        f = _mm512_mask_mov_ps(f, _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7f)),
                               _mm512_set1_ps(NAN));
    } else {
        f = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(mag, 21)), _mm512_set1_ps(0x1p112f));
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
    case KVC_DTYPE_F32: return _mm512_loadu_ps((const float *)(const void *)src);
    case KVC_DTYPE_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)src));
    case KVC_DTYPE_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)src)), 16));
    case KVC_DTYPE_FP8_E4M3: return fp8_to_f32(_mm_loadu_si128((const __m128i *)(const void *)src), false);
    default: return fp8_to_f32(_mm_loadu_si128((const __m128i *)(const void *)src), true);
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
    l.lo0 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(a)), _mm512_cvtepi16_epi8(b), 1);
    l.lo1 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(c)), _mm512_cvtepi16_epi8(d), 1);
    l.hi0 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(a, 8))),
                               _mm512_cvtepi16_epi8(_mm512_srli_epi16(b, 8)), 1);
    l.hi1 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(c, 8))),
                               _mm512_cvtepi16_epi8(_mm512_srli_epi16(d, 8)), 1);
    return l;
}

/* VPERMI2B needs AVX512-VBMI, which the build's AVX-512 flags leave out: only
 * these functions use it, and only the BF16 path (which requires VBMI) runs them. */
#define VBMI __attribute__((target("avx512vbmi")))

/* 64 FP8 codes (the low 32 only when n == 32) to bf16, exactly, in order. */
static inline VBMI void fp8_to_bf16(uint16_t *dst, const uint8_t *src, const lut_t *l, uint32_t n)
{
    __m512i c = n >= 64 ? _mm512_loadu_si512(src) : _mm512_maskz_loadu_epi8(0xffffffffull, src);
    __m512i hi = _mm512_permutex2var_epi8(l->hi0, c, l->hi1);
    __m512i lo = _mm512_permutex2var_epi8(l->lo0, c, l->lo1);
    hi = _mm512_ternarylogic_epi32(hi, c, _mm512_set1_epi8((char)0x80), 0xf8); /* hi | (c & 0x80) */
    __m512i w0 = _mm512_unpacklo_epi8(lo, hi), w1 = _mm512_unpackhi_epi8(lo, hi);
    __m512i o0 = _mm512_permutex2var_epi64(w0, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), w1);
    _mm512_storeu_si512(dst, o0);
    if (n >= 64) {
        __m512i o1 = _mm512_permutex2var_epi64(w0, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), w1);
        _mm512_storeu_si512(dst + 32, o1);
    }
}

/* A row to bf16: FP8 through the table (exact), or (per-channel scales)
 * through fp32 times the scales, rounded to nearest even. */
static VBMI void row_to_bf16(uint16_t *dst, const uint8_t *src, kvc_dtype_t dt, uint32_t n,
                        const float *sc, const lut_t *l)
{
    if (!sc) {
        for (uint32_t c = 0; c < n; c += 64) fp8_to_bf16(dst + c, src + c, l, n - c >= 64 ? 64 : 32);
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
    uint8_t *qt;     /* query tiles, (n_tiles, nc, 16) units */
    float *o;        /* (n_tiles * rt, dv) accumulators */
    float *mv, *lv;  /* (n_tiles, 16): running max and sum, period rt */
    int32_t *rlo, *rhi; /* (n_tiles, 16): each lane's row range */
    float *s;        /* (groups, rt, 16) logits / weights of one row tile */
    uint32_t *pp;    /* (groups, 8, rt) bf16 weight pairs */
    uint8_t *kscr, *vscr; /* converted K / V rows, (tt, dk) / (tt, dv) */
    float *ks, *vs;  /* (tt) per-token scales */
    group_t *grp;    /* (tt / 16) */
} ws_t;

size_t kvc__attn_ws_avx512(uint32_t dk, uint32_t dv)
{
    size_t tt = kvc__tile_tokens(dk), r = KVC__ROWS_MAX, tiles = KVC__ROWS_MAX / GT;
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
    size_t tiles = KVC__ROWS_MAX / GT;
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
typedef struct {
    const kvc__attn_cfg_t *cfg;
    const kvc__attn_item_t *it;
    ws_t w;
    uint32_t rt, n_tiles, nc; /* rows per tile, tiles, QK chunks per tile */
    size_t qt_bytes;          /* bytes of one query tile */
} job_t;

/* Logits of one group for one row tile into out[0 .. rt), [token][row] order. */
static inline __attribute__((always_inline)) void qk(const __m512i *qt, uint32_t nc,
                                                      const uint8_t *k, size_t kst, int rt,
                                                      bool bf16, __m512 *out)
{
    const int P = GT / rt;
    __m512 acc[GT];
    for (int i = 0; i < GT; i++) acc[i] = _mm512_setzero_ps();
    for (uint32_t c = 0; c < nc; c++) {
        const __m512i qv = _mm512_load_si512(qt + c);
        const uint8_t *kc = k + (size_t)c * P * 4;
        for (int i = 0; i < GT; i++) {
            __m512i kb = bcast(kc + (size_t)i * kst, P);
            if (bf16) acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)kb, (__m512bh)qv);
            else acc[i] = _mm512_fmadd_ps(_mm512_castsi512_ps(kb), _mm512_castsi512_ps(qv), acc[i]);
        }
    }
    for (int n = GT; n > rt; n /= 2)
        for (int i = 0; i < n / 2; i++) acc[i] = fold(acc[2 * i], acc[2 * i + 1]);
    for (int j = 0; j < rt; j++) out[j] = acc[j];
}

/* O[rows] *= alpha[row] for the rt rows of tile `t`. */
static void rescale_rows(float *o, uint32_t dv, const float *alpha, int rt)
{
    for (int r = 0; r < rt; r++) {
        __m512 a = _mm512_set1_ps(alpha[r]);
        float *row = o + (size_t)r * dv;
        for (uint32_t c = 0; c < dv; c += 16) _mm512_store_ps(row + c, _mm512_mul_ps(_mm512_load_ps(row + c), a));
    }
}

/* P.V for fp32 weights (w.s, [token][row] per group) and fp32 V rows. */
static inline __attribute__((always_inline)) void pv_f32(float *o, uint32_t dv, const group_t *g,
                                                          uint32_t ng, const float *s, int rt, int rb)
{
    for (uint32_t c = 0; c < dv; c += 32) {
        for (int r0 = 0; r0 < rt; r0 += rb) {
            __m512 a0[8], a1[8];
            for (int r = 0; r < rb; r++) {
                a0[r] = _mm512_load_ps(o + (size_t)(r0 + r) * dv + c);
                a1[r] = _mm512_load_ps(o + (size_t)(r0 + r) * dv + c + 16);
            }
            for (uint32_t gi = 0; gi < ng; gi++) {
                const uint8_t *v = g[gi].v + (size_t)c * 4;
                const size_t vst = g[gi].vst;
                const float *p = s + (size_t)gi * GT * rt + r0;
                for (int t = 0; t < GT; t++) {
                    __m512 v0 = _mm512_loadu_ps((const float *)(const void *)(v + t * vst));
                    __m512 v1 = _mm512_loadu_ps((const float *)(const void *)(v + t * vst + 64));
                    for (int r = 0; r < rb; r++) {
                        __m512 w = _mm512_set1_ps(p[t * rt + r]);
                        a0[r] = _mm512_fmadd_ps(w, v0, a0[r]);
                        a1[r] = _mm512_fmadd_ps(w, v1, a1[r]);
                    }
                }
            }
            for (int r = 0; r < rb; r++) {
                _mm512_store_ps(o + (size_t)(r0 + r) * dv + c, a0[r]);
                _mm512_store_ps(o + (size_t)(r0 + r) * dv + c + 16, a1[r]);
            }
        }
    }
}

/* P.V for bf16 weight pairs (w.pp, (group, pair, row)) and bf16 V rows.  The
 * accumulator of a 32-channel chunk holds channels 8l+j (j < 4) in lanes
 * 4l+j of its first vector and 8l+4+j in lanes 4l+j of its second. */
static inline __attribute__((always_inline)) void pv_bf16(float *o, uint32_t dv, const group_t *g,
                                                           uint32_t ng, const uint32_t *pp, int rt,
                                                           int rb)
{
    for (uint32_t c = 0; c < dv; c += 32) {
        for (int r0 = 0; r0 < rt; r0 += rb) {
            __m512 a0[8], a1[8];
            for (int r = 0; r < rb; r++) {
                a0[r] = _mm512_load_ps(o + (size_t)(r0 + r) * dv + c);
                a1[r] = _mm512_load_ps(o + (size_t)(r0 + r) * dv + c + 16);
            }
            for (uint32_t gi = 0; gi < ng; gi++) {
                const uint8_t *v = g[gi].v + (size_t)c * 2;
                const size_t vst = g[gi].vst;
                const uint32_t *p = pp + (size_t)gi * (GT / 2) * rt + r0;
                for (int tp = 0; tp < GT / 2; tp++) {
                    __m512i x = _mm512_loadu_si512(v + (size_t)(2 * tp) * vst);
                    __m512i y = _mm512_loadu_si512(v + (size_t)(2 * tp + 1) * vst);
                    __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(x, y);
                    __m512bh hi = (__m512bh)_mm512_unpackhi_epi16(x, y);
                    for (int r = 0; r < rb; r++) {
                        __m512bh w = (__m512bh)_mm512_set1_epi32((int)p[tp * rt + r]);
                        a0[r] = _mm512_dpbf16_ps(a0[r], lo, w);
                        a1[r] = _mm512_dpbf16_ps(a1[r], hi, w);
                    }
                }
            }
            for (int r = 0; r < rb; r++) {
                _mm512_store_ps(o + (size_t)(r0 + r) * dv + c, a0[r]);
                _mm512_store_ps(o + (size_t)(r0 + r) * dv + c + 16, a1[r]);
            }
        }
    }
}

/* Everything one row tile does with one key tile: logits, mask, softmax
 * update, weights, P.V. */
static inline __attribute__((always_inline)) void row_tile(const job_t *j, uint32_t t,
                                                            const group_t *g, uint32_t ng,
                                                            int rt, bool bf16)
{
    const kvc__attn_cfg_t *cfg = j->cfg;
    const ws_t *w = &j->w;
    const __m512i *qt = (const __m512i *)(const void *)(w->qt + t * j->qt_bytes);
    const __m512i vlo = _mm512_load_si512(w->rlo + 16 * t), vhi = _mm512_load_si512(w->rhi + 16 * t);
    /* the rows' common range: groups inside it need no mask */
    const int32_t lo_max = _mm512_reduce_max_epi32(vlo), hi_min = _mm512_reduce_min_epi32(vhi);
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (uint32_t gi = 0; gi < ng; gi++) {
        __m512 sv[GT];
        qk(qt, j->nc, g[gi].k, g[gi].kst, rt, bf16, sv);
        const bool need_mask = g[gi].t0 < lo_max || g[gi].t0 + GT - 1 > hi_min;
        const __m512 ksv = _mm512_loadu_ps(w->ks + gi * GT);
        for (int v = 0; v < rt; v++) {
            __m512 x = sv[v];
            if (g[gi].kscaled) x = _mm512_mul_ps(x, _mm512_permutexvar_ps(tok_index(v, rt), ksv));
            if (cfg->softcap > 0) x = softcap512(x, cfg->softcap);
            if (need_mask) {
                __m512i pos = _mm512_add_epi32(tok_index(v, rt), _mm512_set1_epi32((int32_t)g[gi].t0));
                __mmask16 ok = _mm512_cmpge_epi32_mask(pos, vlo) & _mm512_cmple_epi32_mask(pos, vhi);
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
        diff = _mm512_mask_mov_ps(diff, _mm512_cmp_ps_mask(mn, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ),
                                  _mm512_setzero_ps());
        __m512 alpha = exp512(diff);
        _mm512_store_ps(w->lv + 16 * t, _mm512_mul_ps(_mm512_load_ps(w->lv + 16 * t), alpha));
        float al[16];
        _mm512_storeu_ps(al, alpha);
        rescale_rows(w->o + (size_t)t * rt * cfg->dv, cfg->dv, al, rt);
        m = mn;
        _mm512_store_ps(w->mv + 16 * t, m);
    }
    const __m512 mu = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(m, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ),
                                         _mm512_setzero_ps());
    __m512 lsum = _mm512_setzero_ps();
    for (uint32_t gi = 0; gi < ng; gi++) {
        const __m512 vsv = _mm512_loadu_ps(w->vs + gi * GT);
        __m512 pv[GT];
        for (int v = 0; v < rt; v++) {
            __m512 p = exp512(_mm512_sub_ps(_mm512_load_ps(w->s + ((size_t)gi * rt + v) * 16), mu));
            lsum = _mm512_add_ps(lsum, p);
            if (g[gi].vscaled) p = _mm512_mul_ps(p, _mm512_permutexvar_ps(tok_index(v, rt), vsv));
            pv[v] = p;
        }
        if (!bf16) {
            for (int v = 0; v < rt; v++) _mm512_store_ps(w->s + ((size_t)gi * rt + v) * 16, pv[v]);
        } else if (rt == 16) {
            /* two tokens per pair: interleave the 16 rows' weights of tokens 2tp, 2tp+1 */
            static const uint16_t ilw[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                             21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                             11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
            const __m512i il = _mm512_loadu_si512(ilw);
            for (int tp = 0; tp < GT / 2; tp++) {
                __m512i b = (__m512i)_mm512_cvtne2ps_pbh(pv[2 * tp + 1], pv[2 * tp]);
                _mm512_store_si512(w->pp + ((size_t)gi * (GT / 2) + tp) * 16, _mm512_permutexvar_epi16(il, b));
            }
        } else {
            /* vector v holds tokens v * (16 / rt) + u, u < 16 / rt, rows in lanes: word
             * 2 (tpl * rt + r) + b of the result is weight (token 2 tpl + b, row r) */
            uint16_t idx[16];
            for (int wd = 0; wd < 16; wd++) {
                int d = wd / 2, b = wd & 1, tpl = d / rt, r = d % rt;
                idx[wd] = (uint16_t)((2 * tpl + b) * rt + r);
            }
            const __m256i il = _mm256_loadu_si256((const __m256i *)(const void *)idx);
            for (int v = 0; v < rt; v++) {
                __m256i b = (__m256i)_mm512_cvtneps_pbh(pv[v]);
                _mm256_store_si256((__m256i *)(void *)(w->pp + (size_t)gi * (GT / 2) * rt + (size_t)v * 8),
                                   _mm256_permutexvar_epi16(il, b));
            }
        }
    }
    _mm512_store_ps(w->lv + 16 * t, _mm512_add_ps(_mm512_load_ps(w->lv + 16 * t), lsum));
    float *o = w->o + (size_t)t * rt * cfg->dv;
    const int rb = rt < 8 ? rt : 8;
    if (bf16) pv_bf16(o, cfg->dv, g, ng, w->pp, rt, rb);
    else pv_f32(o, cfg->dv, g, ng, w->s, rt, rb);
}

static void row_tile_any(const job_t *j, uint32_t t, const group_t *g, uint32_t ng)
{
    const bool b = j->cfg->bf16;
    switch (j->rt) {
    case 1: b ? row_tile(j, t, g, ng, 1, true) : row_tile(j, t, g, ng, 1, false); break;
    case 2: b ? row_tile(j, t, g, ng, 2, true) : row_tile(j, t, g, ng, 2, false); break;
    case 4: b ? row_tile(j, t, g, ng, 4, true) : row_tile(j, t, g, ng, 4, false); break;
    case 8: b ? row_tile(j, t, g, ng, 8, true) : row_tile(j, t, g, ng, 8, false); break;
    default: b ? row_tile(j, t, g, ng, 16, true) : row_tile(j, t, g, ng, 16, false); break;
    }
}

/* ---- setting up an item ------------------------------------------------------------ */
/* Query tile t: lane r*P + p of chunk c holds unit c*P + p of row t*rt + r
 * (rows past the item's end repeat its last row). */
static void build_qt(const job_t *j, uint32_t t)
{
    const kvc__attn_cfg_t *cfg = j->cfg;
    const int rt = (int)j->rt, P = GT / rt;
    uint8_t *dst = j->w.qt + t * j->qt_bytes;
    for (int r = 0; r < rt; r++) {
        uint32_t row = KVC_MIN(t * j->rt + (uint32_t)r, j->it->n_rows - 1);
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
        uint32_t row = KVC_MIN(t * j->rt + (uint32_t)(l % rt), j->it->n_rows - 1);
        lo[l] = (int32_t)j->it->lo[row];
        hi[l] = (int32_t)j->it->hi[row];
    }
    memcpy(j->w.rlo + 16 * t, lo, sizeof lo);
    memcpy(j->w.rhi + 16 * t, hi, sizeof hi);
}

/* Find the K/V rows of the groups of key tile [tb, tb + tt), converting or
 * gathering into scratch where they cannot be read in place. */
static uint32_t build_groups(const job_t *j, int64_t tb, uint32_t tt, const lut_t *lut)
{
    const kvc__attn_cfg_t *cfg = j->cfg;
    const kvc__attn_item_t *it = j->it;
    const kvc_kv_view_t *kv = cfg->kv;
    const ws_t *w = &j->w;
    const uint32_t bs = kv->shape.block_size, dk = cfg->dk, dv = cfg->dv;
    const kvc_dtype_t dt = kv->shape.dtype;
    const kvc_dtype_t ct = cfg->bf16 ? KVC_DTYPE_BF16 : KVC_DTYPE_F32; /* compute type */
    const size_t cel = kvc_dtype_bytes(ct), row = kvc__row_bytes(kv);
    const bool latent = kv->shape.n_kv == 1, scaled = kv->shape.layout != KVC_SCALE_NONE;
    const bool per_channel = kv->shape.layout == KVC_SCALE_CHANNEL_TOKEN;
    const bool conv_k = dt != ct || per_channel, conv_v = dt != ct;
    uint32_t ng = 0;
    for (int64_t t0 = tb; t0 < tb + tt && t0 <= it->hi_max; t0 += GT, ng++) {
        group_t *g = &w->grp[ng];
        const int64_t a = KVC_MAX(t0, it->lo_min), b = KVC_MIN(t0 + GT - 1, it->hi_max);
        const bool full = a == t0 && b == t0 + GT - 1 && bs >= GT;
        g->t0 = t0;
        g->kscaled = g->vscaled = false;
        float *ks = w->ks + ng * GT, *vs = w->vs + ng * GT;
        uint8_t *kd = w->kscr + (size_t)ng * GT * dk * cel, *vd = w->vscr + (size_t)ng * GT * dv * cel;
        for (int i = 0; i < GT; i++) {
            int64_t pos = t0 + i;
            ks[i] = vs[i] = 1.0f;
            bool valid = pos >= a && pos <= b;
            uint32_t blk = valid ? it->blocks[pos / bs] : 0, off = (uint32_t)(pos % bs);
            kvc__tok_scales_t ts = {1.0f, 1.0f, NULL};
            if (valid && scaled) ts = kvc__tok_scales(kv, kvc__scales(kv, blk), it->kv_head, off);
            ks[i] = ts.k;
            vs[i] = ts.v;
            g->kscaled |= ts.k != 1.0f;
            g->vscaled |= ts.v != 1.0f;
            if (full && !conv_k && (latent || !conv_v)) continue;
            uint8_t *kr = kd + (size_t)i * dk * cel, *vr = vd + (size_t)i * dv * cel;
            if (!valid) {
                memset(kr, 0, dk * cel);
                if (!latent) memset(vr, 0, dv * cel);
                continue;
            }
            const uint8_t *ksrc = kvc__row(kv, blk, it->kv_head, off, 0);
            if (!full || conv_k) {
                if (!conv_k) memcpy(kr, ksrc, dk * cel);
                else if (cfg->bf16) row_to_bf16((uint16_t *)(void *)kr, ksrc, dt, dk, ts.kc, lut);
                else row_to_f32((float *)(void *)kr, ksrc, dt, dk, ts.kc);
            }
            if (latent) continue;
            const uint8_t *vsrc = kvc__row(kv, blk, it->kv_head, off, 1);
            if (!full || conv_v) {
                if (!conv_v) memcpy(vr, vsrc, dv * cel);
                else if (cfg->bf16) row_to_bf16((uint16_t *)(void *)vr, vsrc, dt, dv, NULL, lut);
                else row_to_f32((float *)(void *)vr, vsrc, dt, dv, NULL);
            }
        }
        const bool k_direct = full && !conv_k, v_direct = full && !conv_v;
        if (k_direct) {
            g->k = kvc__row(kv, it->blocks[t0 / bs], it->kv_head, (uint32_t)(t0 % bs), 0);
            g->kst = row;
        } else {
            g->k = kd;
            g->kst = (size_t)dk * cel;
        }
        if (latent) {
            g->v = g->k; /* a latent's V is the start of its K row */
            g->vst = g->kst;
        } else if (v_direct) {
            g->v = kvc__row(kv, it->blocks[t0 / bs], it->kv_head, (uint32_t)(t0 % bs), 1);
            g->vst = row;
        } else {
            g->v = vd;
            g->vst = (size_t)dv * cel;
        }
    }
    return ng;
}

void kvc__attn_item_avx512(const kvc__attn_cfg_t *cfg, const kvc__attn_item_t *it, void *ws)
{
    const uint32_t tt = kvc__tile_tokens(cfg->dk);
    job_t j = {.cfg = cfg, .it = it, .w = carve(ws, cfg->dk, cfg->dv, tt)};
    j.rt = 1;
    while (j.rt < it->n_rows && j.rt < GT) j.rt *= 2;
    j.n_tiles = (it->n_rows + j.rt - 1) / j.rt;
    j.nc = (cfg->bf16 ? cfg->dk / 2 : cfg->dk) * j.rt / GT;
    j.qt_bytes = (size_t)j.nc * 64;
    lut_t lut = {0};
    if (cfg->bf16 && cfg->kv->shape.dtype != KVC_DTYPE_BF16) lut = make_lut(cfg->kv->shape.dtype);
    for (uint32_t t = 0; t < j.n_tiles; t++) {
        build_qt(&j, t);
        _mm512_store_ps(j.w.mv + 16 * t, _mm512_set1_ps(-INFINITY));
        _mm512_store_ps(j.w.lv + 16 * t, _mm512_setzero_ps());
    }
    memset(j.w.o, 0, sizeof(float) * j.n_tiles * j.rt * cfg->dv);
    for (int64_t tb = it->lo_min & ~(int64_t)(GT - 1); tb <= it->hi_max; tb += tt) {
        uint32_t ng = build_groups(&j, tb, tt, &lut);
        for (uint32_t t = 0; t < j.n_tiles; t++) row_tile_any(&j, t, j.w.grp, ng);
    }
    /* out = O / l, undoing the bf16 path's channel order */
    const __m512i u0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i u1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (uint32_t t = 0; t < j.n_tiles; t++) {
        float l[16];
        _mm512_storeu_ps(l, allsum(_mm512_load_ps(j.w.lv + 16 * t), (int)j.rt));
        for (uint32_t r = 0; r < j.rt && t * j.rt + r < it->n_rows; r++) {
            const float *o = j.w.o + (size_t)(t * j.rt + r) * cfg->dv;
            float *out = it->out[t * j.rt + r];
            __m512 inv = _mm512_set1_ps(l[r] > 0 ? 1.0f / l[r] : 0.0f);
            for (uint32_t c = 0; c < cfg->dv; c += 32) {
                __m512 a = _mm512_load_ps(o + c), b = _mm512_load_ps(o + c + 16);
                if (cfg->bf16) {
                    __m512 x = _mm512_permutex2var_ps(a, u0, b), y = _mm512_permutex2var_ps(a, u1, b);
                    a = x, b = y;
                }
                _mm512_storeu_ps(out + c, _mm512_mul_ps(a, inv));
                _mm512_storeu_ps(out + c + 16, _mm512_mul_ps(b, inv));
            }
        }
    }
}
