/* attn_avx2.c - the AVX2 attention kernel (fp32 products, FMA).  The same
 * structure as attn_avx512.c's F32 path with 8 lanes: row tiles of 1, 2, 4
 * or 8 query rows, key groups of 8 tokens aligned to absolute positions,
 * each token's channels broadcast 8 / rt at a time against a matching query
 * tile, an even/odd fold per 8 tokens that leaves logits in [token][row]
 * order, online softmax with lazy rescaling, and P.V with one broadcast
 * weight per (token, row) against 16 channels of V.  As there, an item's
 * KV heads are worked through tile by tile with the next tile's rows
 * prefetched in address order. */
#include "attn/attn_int.h"

#include <immintrin.h>
#include <math.h>

#define GT          8 /* tokens per group (one per lane) */
#define RESCALE_GAP 8.0f

typedef struct {
    const uint8_t *k, *v;
    size_t kst, vst;
    int64_t t0;
    bool kscaled, vscaled;
} group_t;

static inline __m256i iota8(void)
{
    return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
}

/* e^x for x <= 88 (Cephes' polynomial); 0 below -87 and for -inf. */
static inline __m256 exp256(__m256 x)
{
    const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

static inline __m256 absps(__m256 x)
{
    return _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}

static inline __m256 softcap256(__m256 x, float cap)
{
    __m256 y = _mm256_mul_ps(x, _mm256_set1_ps(1.0f / cap));
    __m256 e = exp256(_mm256_min_ps(_mm256_add_ps(absps(y), absps(y)), _mm256_set1_ps(88.0f)));
    __m256 t =
        _mm256_sub_ps(_mm256_set1_ps(1.0f),
                      _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    __m256 sign = _mm256_and_ps(y, _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u)));
    t = _mm256_or_ps(t, sign);
    __m256 ninf = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
    return _mm256_blendv_ps(_mm256_mul_ps(t, _mm256_set1_ps(cap)), x, ninf);
}

static inline __m256 rot(__m256 v, int w)
{
    return _mm256_permutevar8x32_ps(
        v, _mm256_and_si256(_mm256_add_epi32(iota8(), _mm256_set1_epi32(w)), _mm256_set1_epi32(7)));
}
static inline __m256 allmax(__m256 v, int rt)
{
#pragma GCC unroll 16
    for (int w = 4; w >= rt; w >>= 1) v = _mm256_max_ps(v, rot(v, w));
    return v;
}
static inline __m256 allsum(__m256 v, int rt)
{
#pragma GCC unroll 16
    for (int w = 4; w >= rt; w >>= 1) v = _mm256_add_ps(v, rot(v, w));
    return v;
}

static inline __m256i tok_index(int j, int rt)
{
    int sh = __builtin_ctz((unsigned)rt);
    return _mm256_add_epi32(_mm256_srli_epi32(iota8(), sh), _mm256_set1_epi32(j * (GT / rt)));
}

/* [a's pair sums | b's pair sums] */
static inline __m256 fold(__m256 a, __m256 b)
{
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_hadd_ps(a, b)), 0xd8));
}

/* An 8 x 8 transpose: v[i] lane j <- v[j] lane i. */
static inline __attribute__((always_inline)) void transpose8(__m256 v[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        v[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* A group's 8 probabilities summed as ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)), the
 * one order of the softmax denominator's terms within a group for every tile shape: across the
 * 8 lanes of one row's vector (1-row tiles), into every lane ... */
static inline __m256 tree8_lanes(__m256 p)
{
    p = _mm256_add_ps(p, _mm256_permute_ps(p, 0xb1)); /* (0+1) (0+1) (2+3) (2+3) ... */
    p = _mm256_add_ps(p, _mm256_permute_ps(p, 0x4e)); /* ((0+1)+(2+3)) x4, ((4+5)+(6+7)) x4 */
    return _mm256_add_ps(p, _mm256_permute2f128_ps(p, p, 0x01));
}
/* ... and across 8 token vectors whose lanes are rows (8-row tiles). */
static inline __m256 tree8_vecs(const __m256 p[8])
{
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(p[0], p[1]), _mm256_add_ps(p[2], p[3])),
                         _mm256_add_ps(_mm256_add_ps(p[4], p[5]), _mm256_add_ps(p[6], p[7])));
}

static inline __attribute__((always_inline)) __m256 bcast(const uint8_t *p, int P)
{
    switch (P) {
    case 1:
        return _mm256_broadcast_ss((const float *)(const void *)p);
    case 2:
        return _mm256_castpd_ps(_mm256_broadcast_sd((const double *)(const void *)p));
    case 4:
        return _mm256_broadcast_ps((const __m128 *)(const void *)p);
    default:
        return _mm256_loadu_ps((const float *)(const void *)p);
    }
}

static inline __m256 fp8_to_f32(const uint8_t *src, bool e5m2)
{
    __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)src));
    __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7f));
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x80)), 24);
    __m256 f;
    if (!e5m2) {
        f = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 20)),
                          _mm256_set1_ps(0x1p120f));
        f = _mm256_blendv_ps(f, _mm256_set1_ps(NAN),
                             _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f))));
    } else {
        f = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 21)),
                          _mm256_set1_ps(0x1p112f));
        f = _mm256_blendv_ps(f, _mm256_set1_ps(INFINITY),
                             _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7c))));
        f = _mm256_blendv_ps(f, _mm256_set1_ps(NAN),
                             _mm256_castsi256_ps(_mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7c))));
    }
    return _mm256_or_ps(f, _mm256_castsi256_ps(sign));
}

static inline __m256 load_f32(const uint8_t *src, kvc_dtype_t dt)
{
    switch (dt) {
    case KVC_DTYPE_F32:
        return _mm256_loadu_ps((const float *)(const void *)src);
    case KVC_DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)src));
    case KVC_DTYPE_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)src)), 16));
    case KVC_DTYPE_FP8_E4M3:
        return fp8_to_f32(src, false);
    default:
        return fp8_to_f32(src, true);
    }
}

static void row_to_f32(float *dst, const uint8_t *src, kvc_dtype_t dt, uint32_t n, const float *sc)
{
    size_t el = kvc_dtype_bytes(dt);
    for (uint32_t c = 0; c < n; c += 8) {
        __m256 x = load_f32(src + c * el, dt);
        if (sc) x = _mm256_mul_ps(x, _mm256_loadu_ps(sc + c));
        _mm256_storeu_ps(dst + c, x);
    }
}

typedef struct {
    float *qt, *o, *mv, *lv;
    int32_t *rlo, *rhi;
    float *s;
    uint8_t *kscr, *vscr;
    float *ks, *vs;
    group_t *grp;
} ws_t;

size_t kvc__attn_ws_avx2(uint32_t dk, uint32_t dv)
{
    size_t tt = kvc__tile_tokens(dk), r = KVC__ROWS_MAX, tiles = KVC__ROWS_MAX;
    return r * dk * 4 + r * dv * 4 + 4 * tiles * 32 + tt * 8 * 4 + tt * dk * 4 + tt * dv * 4 +
           2 * tt * 4 + tt / GT * sizeof(group_t) + 12 * 64;
}

static ws_t carve(void *mem, uint32_t dk, uint32_t dv, uint32_t tt)
{
    uint8_t *cur = mem;
    ws_t w;
    size_t tiles = KVC__ROWS_MAX; /* one-row tiles of up to 64 heads */
    w.qt = kvc__ws_take(&cur, (size_t)KVC__ROWS_MAX * dk * 4);
    w.o = kvc__ws_take(&cur, (size_t)KVC__ROWS_MAX * dv * 4);
    w.mv = kvc__ws_take(&cur, tiles * 32);
    w.lv = kvc__ws_take(&cur, tiles * 32);
    w.rlo = kvc__ws_take(&cur, tiles * 32);
    w.rhi = kvc__ws_take(&cur, tiles * 32);
    w.s = kvc__ws_take(&cur, (size_t)tt * 8 * 4);
    w.kscr = kvc__ws_take(&cur, (size_t)tt * dk * 4);
    w.vscr = kvc__ws_take(&cur, (size_t)tt * dv * 4);
    w.ks = kvc__ws_take(&cur, (size_t)tt * 4);
    w.vs = kvc__ws_take(&cur, (size_t)tt * 4);
    w.grp = kvc__ws_take(&cur, (size_t)tt / GT * sizeof(group_t));
    return w;
}

typedef struct {
    const kvc__attn_cfg_t *cfg;
    const kvc__attn_item_t *it;
    ws_t w;
    uint32_t rt, n_tiles, nc;
    uint32_t tph; /* tiles per KV head (tile t belongs to head t / tph) */
    bool inv8;    /* batch-invariant 8-row tiles: each row's logits by qk1, as a 1-row tile's */
    kvc__pf_t pf; /* prefetches of the next key tile */
} job_t;

/* The item row in slot r of tile t (slots past a head's last row repeat it). */
static inline uint32_t tile_row(const job_t *j, uint32_t t, uint32_t r)
{
    const uint32_t head = t / j->tph, local = (t % j->tph) * j->rt + r, rph = j->it->rows_per_head;
    return head * rph + KVC_MIN(local, rph - 1);
}

/* One row (rt = 1): the 8 tokens' dot products in two passes of 4, fewer live pointers than
 * one pass of 8 (which spilled them); each token's lanes accumulate over c in order, then the
 * same fold as qk's, so the results are qk's for rt = 1. */
static inline __attribute__((always_inline)) __m256 qk1(const float *qt, uint32_t nc,
                                                        const uint8_t *k, size_t kst, kvc__pf_t *pf)
{
    __m256 acc[GT];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const uint8_t *k0 = k + (size_t)(4 * h) * kst, *k1 = k0 + kst, *k2 = k1 + kst,
                      *k3 = k2 + kst;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (uint32_t c = 0; c < nc; c++) {
            const __m256 qv = _mm256_load_ps(qt + 8 * (size_t)c);
            const size_t o = (size_t)c * 32;
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps((const float *)(const void *)(k0 + o)), qv, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps((const float *)(const void *)(k1 + o)), qv, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps((const float *)(const void *)(k2 + o)), qv, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps((const float *)(const void *)(k3 + o)), qv, a3);
            if (pf && h == 0) kvc__pf_step(pf);
        }
        acc[4 * h] = a0, acc[4 * h + 1] = a1, acc[4 * h + 2] = a2, acc[4 * h + 3] = a3;
    }
#pragma GCC unroll 16
    for (int n = GT; n > 1; n /= 2)
#pragma GCC unroll 16
        for (int i = 0; i < n / 2; i++) acc[i] = fold(acc[2 * i], acc[2 * i + 1]);
    return acc[0];
}

static inline __attribute__((always_inline)) void qk(const float *qt, uint32_t nc, const uint8_t *k,
                                                     size_t kst, int rt, kvc__pf_t *pf, __m256 *out)
{
    if (rt == 1) {
        out[0] = qk1(qt, nc, k, kst, pf);
        return;
    }
    const int P = GT / rt;
    __m256 acc[GT];
#pragma GCC unroll 16
    for (int i = 0; i < GT; i++) acc[i] = _mm256_setzero_ps();
    for (uint32_t c = 0; c < nc; c++) {
        const __m256 qv = _mm256_load_ps(qt + 8 * (size_t)c);
        const uint8_t *kc = k + (size_t)c * P * 4;
#pragma GCC unroll 16
        for (int i = 0; i < GT; i++)
            acc[i] = _mm256_fmadd_ps(bcast(kc + (size_t)i * kst, P), qv, acc[i]);
        if (pf) kvc__pf_step(pf);
    }
#pragma GCC unroll 16
    for (int n = GT; n > rt; n /= 2)
#pragma GCC unroll 16
        for (int i = 0; i < n / 2; i++) acc[i] = fold(acc[2 * i], acc[2 * i + 1]);
#pragma GCC unroll 16
    for (int j = 0; j < rt; j++) out[j] = acc[j];
}

/* o[r][c .. c + 8 NV) += sum over the groups' tokens, in order, of p[t][r] v[t][..] for rb rows
 * at a time: NV independent accumulators per row, so that the FMA chains of one row (a
 * dependent FMA per token) overlap; each element is accumulated in token order whatever NV. */
static inline __attribute__((always_inline)) void pv_cols(float *o, uint32_t dv, const group_t *g,
                                                          uint32_t ng, const float *s, int rt,
                                                          int rb, uint32_t c, int NV)
{
    for (int r0 = 0; r0 < rt; r0 += rb) {
        __m256 a[4][8];
#pragma GCC unroll 16
        for (int r = 0; r < rb; r++)
#pragma GCC unroll 8
            for (int k = 0; k < NV; k++)
                a[r][k] = _mm256_load_ps(o + (size_t)(r0 + r) * dv + c + 8 * k);
        for (uint32_t gi = 0; gi < ng; gi++) {
            const uint8_t *v = g[gi].v + (size_t)c * 4;
            const size_t vst = g[gi].vst;
            const float *p = s + (size_t)gi * GT * rt + r0;
#pragma GCC unroll 16
            for (int t = 0; t < GT; t++) {
                __m256 vk[8];
#pragma GCC unroll 8
                for (int k = 0; k < NV; k++)
                    vk[k] = _mm256_loadu_ps((const float *)(const void *)(v + t * vst + 32 * k));
#pragma GCC unroll 16
                for (int r = 0; r < rb; r++) {
                    const __m256 w = _mm256_broadcast_ss(p + t * rt + r);
#pragma GCC unroll 8
                    for (int k = 0; k < NV; k++) a[r][k] = _mm256_fmadd_ps(w, vk[k], a[r][k]);
                }
            }
        }
#pragma GCC unroll 16
        for (int r = 0; r < rb; r++)
#pragma GCC unroll 8
            for (int k = 0; k < NV; k++)
                _mm256_store_ps(o + (size_t)(r0 + r) * dv + c + 8 * k, a[r][k]);
    }
}

static inline __attribute__((always_inline)) void pv(float *o, uint32_t dv, const group_t *g,
                                                     uint32_t ng, const float *s, int rt, int rb)
{
    /* 8 accumulators per column pass: 64 columns for one row, 32 for two, 16 for four */
    const int NV = rb == 1 ? 8 : rb == 2 ? 4 : 2;
    uint32_t c = 0;
    for (; c + 8 * (uint32_t)NV <= dv; c += 8 * (uint32_t)NV)
        pv_cols(o, dv, g, ng, s, rt, rb, c, NV);
    for (; c < dv; c += 16) pv_cols(o, dv, g, ng, s, rt, rb, c, 2); /* dv is a multiple of 32 */
}

static inline __attribute__((always_inline)) void row_tile(const job_t *j, uint32_t t,
                                                           const group_t *g, uint32_t ng, int rt)
{
    const kvc__attn_cfg_t *cfg = j->cfg;
    const ws_t *w = &j->w;
    const float *qt = w->qt + (size_t)t * j->nc * 8;
    const __m256i vlo = _mm256_load_si256((const __m256i *)(const void *)(w->rlo + 8 * t));
    const __m256i vhi = _mm256_load_si256((const __m256i *)(const void *)(w->rhi + 8 * t));
    int32_t lo_max = INT32_MIN, hi_min = INT32_MAX;
    for (int l = 0; l < 8; l++) {
        lo_max = KVC_MAX(lo_max, w->rlo[8 * t + (uint32_t)l]);
        hi_min = KVC_MIN(hi_min, w->rhi[8 * t + (uint32_t)l]);
    }
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (uint32_t gi = 0; gi < ng; gi++) {
        __m256 sv[GT];
        kvc__pf_t *pf = t % j->tph == 0 ? (kvc__pf_t *)&j->pf : NULL;
        if (rt == 8 && j->inv8) {
            /* each row's 8 logits exactly as a 1-row tile computes them, then turned into
             * token vectors whose lanes are the rows */
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                sv[r] = qk1(qt + (size_t)r * cfg->dk, cfg->dk / GT, g[gi].k, g[gi].kst,
                            r == 0 ? pf : NULL);
            transpose8(sv);
        } else {
            qk(qt, j->nc, g[gi].k, g[gi].kst, rt, pf, sv);
        }
        const bool need_mask = g[gi].t0 < lo_max || g[gi].t0 + GT - 1 > hi_min;
        const __m256 ksv = _mm256_loadu_ps(w->ks + gi * GT);
#pragma GCC unroll 16
        for (int v = 0; v < rt; v++) {
            __m256 x = sv[v];
            if (g[gi].kscaled)
                x = _mm256_mul_ps(x, _mm256_permutevar8x32_ps(ksv, tok_index(v, rt)));
            if (cfg->softcap > 0) x = softcap256(x, cfg->softcap);
            if (need_mask) {
                __m256i pos =
                    _mm256_add_epi32(tok_index(v, rt), _mm256_set1_epi32((int32_t)g[gi].t0));
                __m256i bad =
                    _mm256_or_si256(_mm256_cmpgt_epi32(vlo, pos), _mm256_cmpgt_epi32(pos, vhi));
                x = _mm256_blendv_ps(x, _mm256_set1_ps(-INFINITY), _mm256_castsi256_ps(bad));
            }
            mx = _mm256_max_ps(mx, x);
            _mm256_store_ps(w->s + ((size_t)gi * rt + v) * 8, x);
        }
    }
    mx = allmax(mx, rt);
    __m256 m = _mm256_load_ps(w->mv + 8 * t);
    __m256 grow = _mm256_cmp_ps(mx, _mm256_add_ps(m, _mm256_set1_ps(RESCALE_GAP)), _CMP_GT_OQ);
    if (_mm256_movemask_ps(grow)) {
        /* each row decides for itself (a row's steps must not depend on its tile-mates): the
         * rows that do not grow keep their max and scale by exactly 1 */
        __m256 mn = _mm256_blendv_ps(m, _mm256_max_ps(m, mx), grow);
        __m256 diff = _mm256_sub_ps(m, mn);
        diff = _mm256_andnot_ps(_mm256_cmp_ps(mn, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ), diff);
        __m256 alpha = _mm256_blendv_ps(_mm256_set1_ps(1.0f), exp256(diff), grow);
        _mm256_store_ps(w->lv + 8 * t, _mm256_mul_ps(_mm256_load_ps(w->lv + 8 * t), alpha));
        float al[8];
        _mm256_storeu_ps(al, alpha);
        float *o = w->o + (size_t)t * rt * cfg->dv;
        for (int r = 0; r < rt; r++) {
            __m256 a = _mm256_set1_ps(al[r]);
            for (uint32_t c = 0; c < cfg->dv; c += 8) {
                float *x = o + (size_t)r * cfg->dv + c;
                _mm256_store_ps(x, _mm256_mul_ps(_mm256_load_ps(x), a));
            }
        }
        m = mn;
        _mm256_store_ps(w->mv + 8 * t, m);
    }
    const __m256 mu = _mm256_andnot_ps(_mm256_cmp_ps(m, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ), m);
    /* the denominator: 1-row and 8-row tiles add each group's terms in one tree order (see
     * tree8_lanes), groups in order, so a row's sum is the same in either; 2- and 4-row
     * tiles (never batch-invariant) keep lane sums folded at the end */
    __m256 lv = _mm256_load_ps(w->lv + 8 * t), lsum = _mm256_setzero_ps();
    for (uint32_t gi = 0; gi < ng; gi++) {
        const __m256 vsv = _mm256_loadu_ps(w->vs + gi * GT);
        __m256 pg[GT];
#pragma GCC unroll 16
        for (int v = 0; v < rt; v++) {
            float *sp = w->s + ((size_t)gi * rt + v) * 8;
            __m256 p = exp256(_mm256_sub_ps(_mm256_load_ps(sp), mu));
            pg[v] = p;
            if (g[gi].vscaled)
                p = _mm256_mul_ps(p, _mm256_permutevar8x32_ps(vsv, tok_index(v, rt)));
            _mm256_store_ps(sp, p);
        }
        if (rt == 1)
            lv = _mm256_add_ps(lv, tree8_lanes(pg[0]));
        else if (rt == 8)
            lv = _mm256_add_ps(lv, tree8_vecs(pg));
        else
#pragma GCC unroll 16
            for (int v = 0; v < rt; v++) lsum = _mm256_add_ps(lsum, pg[v]);
    }
    _mm256_store_ps(w->lv + 8 * t, _mm256_add_ps(lv, lsum));
    pv(w->o + (size_t)t * rt * cfg->dv, cfg->dv, g, ng, w->s, rt, rt < 4 ? rt : 4);
}

static void row_tile_any(const job_t *j, uint32_t t, const group_t *g, uint32_t ng)
{
    switch (j->rt) {
    case 1:
        row_tile(j, t, g, ng, 1);
        break;
    case 2:
        row_tile(j, t, g, ng, 2);
        break;
    case 4:
        row_tile(j, t, g, ng, 4);
        break;
    default:
        row_tile(j, t, g, ng, 8);
        break;
    }
}

static void build_qt(const job_t *j, uint32_t t)
{
    const kvc__attn_cfg_t *cfg = j->cfg;
    const int rt = (int)j->rt, P = GT / rt;
    float *dst = j->w.qt + (size_t)t * j->nc * 8;
    for (int r = 0; r < rt; r++) {
        uint32_t row = tile_row(j, t, (uint32_t)r);
        const float *q = j->it->q[row];
        if (j->inv8) { /* row by row, as a 1-row tile has it (qk1) */
            for (uint32_t u = 0; u < cfg->dk; u++)
                dst[(size_t)r * cfg->dk + u] = q[u] * cfg->sm_scale;
            continue;
        }
        for (uint32_t u = 0; u < cfg->dk; u++)
            dst[(size_t)(u / (uint32_t)P) * 8 + (size_t)r * P + u % (uint32_t)P] =
                q[u] * cfg->sm_scale;
    }
    for (int l = 0; l < 8; l++) {
        uint32_t row = tile_row(j, t, (uint32_t)(l % rt));
        j->w.rlo[8 * t + (uint32_t)l] = (int32_t)j->it->lo[row];
        j->w.rhi[8 * t + (uint32_t)l] = (int32_t)j->it->hi[row];
    }
}

/* Rows [i0, i1] of a group whose tokens all sit in one block, from the
 * block's rows starting at src (the group's row 0), into the compute type;
 * the other rows of the scratch are zeroed.  Returns the rows and stride. */
static const uint8_t *group_rows(float *scr, const uint8_t *src, size_t row, int i0, int i1,
                                 uint32_t dim, kvc_dtype_t dt, bool conv, const float *kc,
                                 size_t *stride)
{
    if (i0 == 0 && i1 == GT - 1 && !conv) {
        *stride = row;
        return src;
    }
    if (i0 > 0) memset(scr, 0, (size_t)i0 * dim * sizeof(float));
    if (i1 < GT - 1)
        memset(scr + (size_t)(i1 + 1) * dim, 0, (size_t)(GT - 1 - i1) * dim * sizeof(float));
    const uint32_t n = (uint32_t)(i1 - i0 + 1);
    if (!kc) { /* rows are back to back on both sides: one flat run */
        row_to_f32(scr + (size_t)i0 * dim, src + (size_t)i0 * row, dt, n * dim, NULL);
    } else {
        for (uint32_t r = 0; r < n; r++)
            row_to_f32(scr + (size_t)(i0 + (int)r) * dim, src + (size_t)(i0 + (int)r) * row, dt,
                       dim, kc);
    }
    *stride = (size_t)dim * sizeof(float);
    return (const uint8_t *)scr;
}

/* The K/V rows of the groups of key tile [tb, tb + tt): whole groups of one
 * block in fp32 are read in place; the others are converted (or gathered,
 * for blocks smaller than a group) once into scratch. */
static uint32_t build_groups(const job_t *j, uint32_t kvh, int64_t tb, uint32_t tt)
{
    const kvc__attn_cfg_t *cfg = j->cfg;
    const kvc__attn_item_t *it = j->it;
    const kvc_kv_view_t *kv = cfg->kv;
    const ws_t *w = &j->w;
    const uint32_t bs = kv->shape.block_size, dk = cfg->dk, dv = cfg->dv;
    const uint32_t H = kv->shape.n_kv_heads;
    const kvc_dtype_t dt = kv->shape.dtype;
    const size_t row = kvc__row_bytes(kv);
    const bool latent = kv->shape.n_kv == 1, scaled = kv->shape.layout != KVC_SCALE_NONE;
    const bool per_channel = kv->shape.layout == KVC_SCALE_CHANNEL_TOKEN;
    const bool conv = dt != KVC_DTYPE_F32 || per_channel;
    uint32_t ng = 0;
    for (int64_t t0 = tb; t0 < tb + tt && t0 <= it->hi_max; t0 += GT, ng++) {
        group_t *g = &w->grp[ng];
        const int64_t a = KVC_MAX(t0, it->lo_min), b = KVC_MIN(t0 + GT - 1, it->hi_max);
        const int i0 = (int)(a - t0), i1 = (int)(b - t0);
        g->t0 = t0;
        g->kscaled = g->vscaled = false;
        float *ks = w->ks + ng * GT, *vs = w->vs + ng * GT;
        float *kd = (float *)(void *)w->kscr + (size_t)ng * GT * dk;
        float *vd = (float *)(void *)w->vscr + (size_t)ng * GT * dv;
        if (bs >= GT) {
            /* the whole group sits in one block: block-wide scales, rows back to back */
            const uint32_t blk = it->blocks[t0 / bs], off0 = (uint32_t)(t0 % bs);
            const float *sc = scaled ? kvc__scales(kv, blk) : NULL;
            kvc__tok_scales_t ts = kvc__tok_scales(kv, sc, kvh, off0);
            const float *vt =
                per_channel && !latent ? sc + (size_t)H * dk + (size_t)kvh * bs + off0 : NULL;
            for (int i = 0; i < GT; i++) {
                bool valid = i >= i0 && i <= i1;
                ks[i] = ts.k;
                vs[i] = vt ? (valid ? vt[i] : 1.0f) : ts.v;
                g->vscaled |= vs[i] != 1.0f;
            }
            g->kscaled = ts.k != 1.0f;
            g->k = group_rows(kd, kvc__row(kv, blk, kvh, off0, 0), row, i0, i1, dk, dt, conv, ts.kc,
                              &g->kst);
            if (latent) {
                g->v = g->k, g->vst = g->kst;
            } else {
                g->v = group_rows(vd, kvc__row(kv, blk, kvh, off0, 1), row, i0, i1, dv, dt,
                                  dt != KVC_DTYPE_F32, NULL, &g->vst);
            }
            continue;
        }
        /* blocks smaller than a group: token by token */
        for (int i = 0; i < GT; i++) {
            int64_t pos = t0 + i;
            bool valid = i >= i0 && i <= i1;
            uint32_t blk = valid ? it->blocks[pos / bs] : 0, off = (uint32_t)(pos % bs);
            kvc__tok_scales_t ts = {1.0f, 1.0f, NULL};
            if (valid && scaled) ts = kvc__tok_scales(kv, kvc__scales(kv, blk), kvh, off);
            ks[i] = ts.k;
            vs[i] = ts.v;
            g->kscaled |= ts.k != 1.0f;
            g->vscaled |= ts.v != 1.0f;
            float *kr = kd + (size_t)i * dk, *vr = vd + (size_t)i * dv;
            if (!valid) {
                memset(kr, 0, dk * sizeof(float));
                if (!latent) memset(vr, 0, dv * sizeof(float));
                continue;
            }
            row_to_f32(kr, kvc__row(kv, blk, kvh, off, 0), dt, dk, ts.kc);
            if (!latent) row_to_f32(vr, kvc__row(kv, blk, kvh, off, 1), dt, dv, NULL);
        }
        g->k = (const uint8_t *)kd;
        g->kst = (size_t)dk * 4;
        g->v = latent ? g->k : (const uint8_t *)vd;
        g->vst = latent ? g->kst : (size_t)dv * 4;
    }
    return ng;
}

void kvc__attn_item_avx2(const kvc__attn_cfg_t *cfg, const kvc__attn_item_t *it, void *ws)
{
    /* half the AVX-512 kernel's tile: converted fp32 rows of K and V for it
     * must stay in L1 between conversion and use */
    const uint32_t tt = kvc__tile_tokens(cfg->dk) / 2;
    job_t j = {.cfg = cfg, .it = it, .w = carve(ws, cfg->dk, cfg->dv, tt)};
    j.rt = 1;
    while (!cfg->invariant && j.rt < it->rows_per_head && j.rt < GT) j.rt *= 2;
    /* batch-invariant: 8-row tiles whose rows each compute what a 1-row tile would (the
     * logits by qk1, per-row rescaling, one order of the denominator), for heads of 8 rows
     * and more (prefill); 1-row tiles for fewer (decode) */
    if (cfg->invariant && it->rows_per_head >= GT) j.rt = GT, j.inv8 = true;
    j.tph = (it->rows_per_head + j.rt - 1) / j.rt;
    j.n_tiles = it->n_heads * j.tph;
    j.nc = cfg->dk * j.rt / GT;
    for (uint32_t t = 0; t < j.n_tiles; t++) {
        build_qt(&j, t);
        _mm256_store_ps(j.w.mv + 8 * t, _mm256_set1_ps(-INFINITY));
        _mm256_store_ps(j.w.lv + 8 * t, _mm256_setzero_ps());
    }
    memset(j.w.o, 0, sizeof(float) * j.n_tiles * j.rt * cfg->dv);
    /* key tiles outside, heads inside, the next tile prefetched meanwhile; tiles end at
     * multiples of tt (absolute positions: a row's softmax steps never depend on the other
     * rows), the first one starting at the group of the earliest key */
    for (int64_t tb = it->lo_min & ~(int64_t)(GT - 1), te; tb <= it->hi_max; tb = te) {
        te = (tb / tt + 1) * tt;
        uint32_t ngn = 0;
        for (int64_t t0 = te; t0 < te + tt && t0 <= it->hi_max; t0 += GT) ngn++;
        kvc__pf_plan(&j.pf, it, cfg->kv, te, tt, GT,
                     it->n_heads * (ngn ? ngn : 1) * (j.inv8 ? cfg->dk / GT : j.nc));
        for (uint32_t h = 0; h < it->n_heads; h++) {
            uint32_t ng = build_groups(&j, it->kv_head + h, tb, (uint32_t)(te - tb));
            for (uint32_t t = h * j.tph; t < (h + 1) * j.tph; t++) row_tile_any(&j, t, j.w.grp, ng);
        }
    }
    for (uint32_t t = 0; t < j.n_tiles; t++) {
        float l[8];
        /* 1- and 8-row tiles hold each row's sum in its lanes already (tree order) */
        const __m256 lt = _mm256_load_ps(j.w.lv + 8 * t);
        _mm256_storeu_ps(l, j.rt == 1 || j.rt == 8 ? lt : allsum(lt, (int)j.rt));
        const uint32_t head = t / j.tph, local0 = (t % j.tph) * j.rt;
        for (uint32_t r = 0; r < j.rt && local0 + r < it->rows_per_head; r++) {
            const float *o = j.w.o + (size_t)(t * j.rt + r) * cfg->dv;
            float *out = it->out[head * it->rows_per_head + local0 + r];
            __m256 inv = _mm256_set1_ps(l[r] > 0 ? 1.0f / l[r] : 0.0f);
            for (uint32_t c = 0; c < cfg->dv; c += 8)
                _mm256_storeu_ps(out + c, _mm256_mul_ps(_mm256_load_ps(o + c), inv));
        }
    }
}
