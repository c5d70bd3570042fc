/* test_quant.c - the KV number formats, checked against definitions written
 * here independently of the library: every FP8 code decoded from its bit
 * fields with ldexp, every bf16/f16 code likewise, and encoding checked
 * against a brute-force "nearest representable value, ties to the even
 * code, saturate at the largest finite value" oracle over all the codes.
 * Then bulk quantisation: the scalar version against the definition, and
 * every SIMD version gives the scalar version's bits and clip counts (one
 * ctest entry per ISA: quant.avx2, quant.avx512; see isa_variant.h); and the
 * geometry of the scale layouts. */
#include "test_helpers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn/attn_int.h"
#include "isa_variant.h"

/* The ISA variant this run is about (--isa NAME), or NULL: the ISA-independent tests. */
static const kvc_test_variant_t *variant;

/* ---- the formats, from their definitions ---------------------------------------- */
typedef struct {
    const char *name;
    kvc_dtype_t dt;
    int ebits, mbits, bias;
    bool ieee; /* top exponent = inf / NaN (e5m2, f16, bf16); else only all-ones is NaN (e4m3) */
    int width;
} fdef_t;

static const fdef_t FMTS[] = {
    {"e4m3", KVC_DTYPE_FP8_E4M3, 4, 3, 7, false, 8},
    {"e5m2", KVC_DTYPE_FP8_E5M2, 5, 2, 15, true, 8},
    {"f16", KVC_DTYPE_F16, 5, 10, 15, true, 16},
    {"bf16", KVC_DTYPE_BF16, 8, 7, 127, true, 16},
};

/* The value of a code: (-1)^s 2^(e - bias) (1 + m / 2^mbits), subnormal
 * 2^(1 - bias) (m / 2^mbits), with the specials. */
static double def_decode(const fdef_t *f, uint32_t code)
{
    uint32_t s = code >> (f->width - 1) & 1;
    uint32_t e = code >> f->mbits & ((1u << f->ebits) - 1);
    uint32_t m = code & ((1u << f->mbits) - 1);
    uint32_t emax = (1u << f->ebits) - 1;
    double v;
    if (f->ieee && e == emax)
        v = m ? NAN : INFINITY;
    else if (!f->ieee && e == emax && m == (1u << f->mbits) - 1)
        v = NAN;
    else if (e == 0)
        v = ldexp((double)m, 1 - f->bias - f->mbits);
    else
        v = ldexp(1.0 + ldexp((double)m, -f->mbits), (int)e - f->bias);
    return s ? -v : v;
}

static uint32_t lib_encode(const fdef_t *f, float x)
{
    switch (f->dt) {
    case KVC_DTYPE_FP8_E4M3:
        return kvc_fp8_e4m3_from_f32(x);
    case KVC_DTYPE_FP8_E5M2:
        return kvc_fp8_e5m2_from_f32(x);
    case KVC_DTYPE_F16:
        return kvc_f16_from_f32(x);
    default:
        return kvc_bf16_from_f32(x);
    }
}

static float lib_decode(const fdef_t *f, uint32_t c)
{
    switch (f->dt) {
    case KVC_DTYPE_FP8_E4M3:
        return kvc_fp8_e4m3_to_f32((uint8_t)c);
    case KVC_DTYPE_FP8_E5M2:
        return kvc_fp8_e5m2_to_f32((uint8_t)c);
    case KVC_DTYPE_F16:
        return kvc_f16_to_f32((uint16_t)c);
    default:
        return kvc_bf16_to_f32((uint16_t)c);
    }
}

/* The finite non-negative codes in increasing order (codes of positive
 * values increase with the value), and the largest. */
typedef struct {
    uint32_t *codes;
    double *vals;
    uint32_t n;
} table_t;

static table_t make_table(const fdef_t *f)
{
    table_t t = {malloc(sizeof(uint32_t) << 15), malloc(sizeof(double) << 15), 0};
    for (uint32_t c = 0; c < (1u << (f->width - 1)); c++) {
        double v = def_decode(f, c);
        if (!isfinite(v)) continue;
        if (t.n) assert_true(v > t.vals[t.n - 1]);
        t.codes[t.n] = c;
        t.vals[t.n++] = v;
    }
    return t;
}

static void free_table(table_t *t)
{
    free(t->codes);
    free(t->vals);
}

/* Brute force: the nearest finite value (by binary search over the sorted
 * table, then the two neighbours), ties to the even code; at or beyond the
 * largest value (and +-inf), the largest; NaN to a NaN code. */
static uint32_t oracle(const fdef_t *f, const table_t *t, float x)
{
    uint32_t sign = signbit(x) ? 1u << (f->width - 1) : 0;
    if (isnan(x)) return UINT32_MAX; /* any NaN code */
    double a = fabs((double)x);
    if (a >= t->vals[t->n - 1]) return sign | t->codes[t->n - 1];
    uint32_t lo = 0, hi = t->n - 1; /* vals[lo] <= a < vals[hi] */
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (t->vals[mid] <= a)
            lo = mid;
        else
            hi = mid;
    }
    double dlo = a - t->vals[lo], dhi = t->vals[hi] - a;
    uint32_t c;
    if (dlo < dhi)
        c = t->codes[lo];
    else if (dhi < dlo)
        c = t->codes[hi];
    else
        c = (t->codes[lo] & 1) ? t->codes[hi] : t->codes[lo];
    return sign | c;
}

/* Clipped: rounding |y| to nearest even on the format's grid continued past
 * its largest value (the next point is max + one step of max's binade)
 * gives more than max.  f32: only infinities. */
static bool def_clipped(const fdef_t *f, const table_t *t, float y)
{
    double a = fabs((double)y), top = t->vals[t->n - 1];
    if (!f) return isinf(y);
    int e;
    frexp(top, &e);
    double next = top + ldexp(1.0, e - 1 - f->mbits), mid = (top + next) / 2;
    bool top_odd = t->codes[t->n - 1] & 1;
    return a > mid || (a == mid && top_odd);
}

static bool is_nan_code(const fdef_t *f, uint32_t c)
{
    return isnan(def_decode(f, c));
}

static void check_encode(const fdef_t *f, const table_t *t, float x)
{
    uint32_t got = lib_encode(f, x), want = oracle(f, t, x);
    if (want == UINT32_MAX) {
        if (!is_nan_code(f, got)) fail_msg("%s: NaN encoded to 0x%x", f->name, got);
        return;
    }
    if (got != want)
        fail_msg("%s: encode(%a) = 0x%x, want 0x%x (%.9g)", f->name, (double)x, got, want,
                 def_decode(f, want));
}

static void every_code_decodes_by_its_definition(void **state)
{
    (void)state;
    for (size_t i = 0; i < KVC_ARRAY_LEN(FMTS); i++) {
        const fdef_t *f = &FMTS[i];
        for (uint32_t c = 0; c < (1u << f->width); c++) {
            double want = def_decode(f, c);
            float got = lib_decode(f, c);
            if (isnan(want)) {
                assert_true(isnan(got));
                continue;
            }
            if ((double)got != want || !signbit(got) != !signbit(want))
                fail_msg("%s: decode(0x%x) = %a, want %a", f->name, c, (double)got, want);
            /* exact values round-trip to themselves (-0 included); infinities saturate */
            if (isinf(want))
                assert_true(fabs(def_decode(f, lib_encode(f, got))) == kvc_dtype_max(f->dt));
            else
                assert_int_equal(lib_encode(f, got), c);
            /* the library's internal decoder agrees */
            assert_true(kvc__decode(c, f->dt) == got ||
                        (isnan(got) && isnan(kvc__decode(c, f->dt))));
        }
    }
}

static void fp8_bf16_table_is_exact(void **state)
{
    (void)state;
    for (int which = 0; which < 2; which++) {
        const fdef_t *f = &FMTS[which];
        for (uint32_t c = 0; c < 128; c++) {
            double v = def_decode(f, c);
            float b = kvc_bf16_to_f32(kvc__fp8_bf16[which][c]);
            if (isnan(v))
                assert_true(isnan(b));
            else
                assert_true((double)b == v);
        }
    }
}

static void special_values_encode_as_specified(void **state)
{
    (void)state;
    /* saturation: max, just above, far above, infinity; both signs */
    assert_int_equal(kvc_fp8_e4m3_from_f32(448.0f), 0x7e);
    assert_int_equal(kvc_fp8_e4m3_from_f32(464.0f), 0x7e); /* the tie 448|480 */
    assert_int_equal(kvc_fp8_e4m3_from_f32(1e30f), 0x7e);
    assert_int_equal(kvc_fp8_e4m3_from_f32(INFINITY), 0x7e);
    assert_int_equal(kvc_fp8_e4m3_from_f32(-INFINITY), 0xfe);
    assert_int_equal(kvc_fp8_e5m2_from_f32(61440.0f), 0x7b); /* tie 57344|65536 rounds to max */
    assert_int_equal(kvc_fp8_e5m2_from_f32(INFINITY), 0x7b);
    assert_int_equal(kvc_fp8_e5m2_from_f32(-1e9f), 0xfb);
    assert_int_equal(kvc_f16_from_f32(65520.0f), 0x7bff);
    assert_int_equal(kvc_f16_from_f32(-INFINITY), 0xfbff);
    assert_int_equal(kvc_bf16_from_f32(INFINITY), 0x7f7f);
    assert_int_equal(kvc_bf16_from_f32(3.4028235e38f), 0x7f7f);
    /* NaN keeps its sign and stays NaN */
    assert_int_equal(kvc_fp8_e4m3_from_f32(NAN), 0x7f);
    assert_int_equal(kvc_fp8_e4m3_from_f32(-NAN), 0xff);
    assert_int_equal(kvc_fp8_e5m2_from_f32(NAN), 0x7e);
    assert_int_equal(kvc_f16_from_f32(NAN), 0x7e00);
    assert_int_equal(kvc_bf16_from_f32(-NAN), 0xffc0);
    assert_true(isnan(kvc_fp8_e4m3_to_f32(0x7f)) && isnan(kvc_fp8_e4m3_to_f32(0xff)));
    assert_true(isinf(kvc_fp8_e5m2_to_f32(0x7c)) && isnan(kvc_fp8_e5m2_to_f32(0x7d)));
    /* zeros and subnormals */
    assert_int_equal(kvc_fp8_e4m3_from_f32(-0.0f), 0x80);
    assert_int_equal(kvc_fp8_e4m3_from_f32(0x1p-9f), 0x01);   /* smallest subnormal */
    assert_int_equal(kvc_fp8_e4m3_from_f32(0x1p-10f), 0x00);  /* tie 0|2^-9: to even (0) */
    assert_int_equal(kvc_fp8_e4m3_from_f32(0x1.8p-9f), 0x02); /* tie 1|2 quanta: to even (2) */
    assert_int_equal(kvc_fp8_e4m3_from_f32(0x1.000002p-10f), 0x01);
    assert_int_equal(kvc_fp8_e4m3_from_f32(0x1.fp-7f), 0x08); /* rounds up into the normals */
    assert_int_equal(kvc_fp8_e5m2_from_f32(0x1p-16f), 0x01);
    assert_int_equal(kvc_fp8_e5m2_from_f32(0x1p-17f), 0x00);
    assert_int_equal(kvc_f16_from_f32(0x1p-24f), 0x0001);
    assert_int_equal(kvc_f16_from_f32(0x1p-25f), 0x0000);
    assert_int_equal(kvc_f16_from_f32(0x1.8p-24f), 0x0002);
    assert_int_equal(kvc_bf16_from_f32(0x1p-133f), 0x0001); /* bf16 subnormal */
    assert_int_equal(kvc_bf16_from_f32(1e-45f), 0x0000);    /* binary32 subnormal rounds to 0 */
    /* ties between normals go to the even mantissa */
    assert_int_equal(kvc_fp8_e4m3_from_f32(1.0625f), 0x38); /* 1 | 1.125 */
    assert_int_equal(kvc_fp8_e4m3_from_f32(1.1875f), 0x3a); /* 1.125 | 1.25 */
    assert_int_equal(kvc_bf16_from_f32(kvc__u2f(0x3f808000u)), 0x3f80);
    assert_int_equal(kvc_bf16_from_f32(kvc__u2f(0x3f818000u)), 0x3f82);
    assert_true(kvc_dtype_max(KVC_DTYPE_FP8_E4M3) == 448.0f);
    assert_true(kvc_dtype_max(KVC_DTYPE_FP8_E5M2) == 57344.0f);
    assert_true(kvc_dtype_max(KVC_DTYPE_F16) == 65504.0f);
}

/* Midpoints between neighbours (ties), their float neighbours, and the
 * neighbours of every code itself, for every format, against the oracle. */
static void ties_and_neighbours_match_the_oracle(void **state)
{
    (void)state;
    for (size_t i = 0; i < KVC_ARRAY_LEN(FMTS); i++) {
        const fdef_t *f = &FMTS[i];
        table_t t = make_table(f);
        uint32_t step = t.n > 4096 && KVC_TEST_SANITIZED ? 7 : 1;
        for (uint32_t k = 0; k + 1 < t.n; k += step) {
            double mid = (t.vals[k] + t.vals[k + 1]) / 2;
            float m = (float)mid;
            float pts[] = {m,
                           nextafterf(m, 0),
                           nextafterf(m, INFINITY),
                           (float)t.vals[k],
                           nextafterf((float)t.vals[k], INFINITY),
                           nextafterf((float)t.vals[k], 0)};
            for (size_t j = 0; j < KVC_ARRAY_LEN(pts); j++) {
                check_encode(f, &t, pts[j]);
                check_encode(f, &t, -pts[j]);
            }
        }
        /* beyond the largest value */
        double top = t.vals[t.n - 1];
        float above[] = {(float)top,
                         nextafterf((float)top, INFINITY),
                         (float)(top * 1.0625),
                         (float)(top * 2),
                         3.4028235e38f,
                         INFINITY,
                         NAN};
        for (size_t j = 0; j < KVC_ARRAY_LEN(above); j++) {
            check_encode(f, &t, above[j]);
            check_encode(f, &t, -above[j]);
        }
        free_table(&t);
    }
}

/* A sweep over binary32 bit patterns (every 2^k-th, plus random ones). */
static void binary32_sweep_matches_the_oracle(void **state)
{
    (void)state;
    const uint32_t stride = KVC_TEST_SANITIZED ? 1u << 14 : 1u << 11;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 7);
    for (size_t i = 0; i < KVC_ARRAY_LEN(FMTS); i++) {
        const fdef_t *f = &FMTS[i];
        table_t t = make_table(f);
        for (uint64_t u = 0; u < (1ull << 32); u += stride) {
            check_encode(f, &t, kvc__u2f((uint32_t)u));
            check_encode(f, &t, kvc__u2f((uint32_t)(u + (kvc_rng_next(&rng) % stride))));
        }
        free_table(&t);
    }
}

/* ---- bulk quantisation ------------------------------------------------------------ */
static void fill_specials(float *x, size_t n, kvc_rng_t *rng)
{
    const float sp[] = {0.0f,   -0.0f,    INFINITY, -INFINITY, NAN,      448.0f,   464.0f,
                        1e-45f, 65520.0f, 0x1p-10f, 0x1.8p-9f, 57344.0f, 61440.0f, 3.4e38f};
    for (size_t i = 0; i < n; i++) {
        uint64_t r = kvc_rng_next(rng);
        if (r % 16 == 0)
            x[i] = sp[(r >> 8) % KVC_ARRAY_LEN(sp)];
        else if (r % 16 == 1)
            x[i] = kvc__u2f((uint32_t)(r >> 16)); /* any bit pattern */
        else
            x[i] = (float)((kvc_rng_double(rng) - 0.5) * ldexp(1.0, (int)((r >> 20) % 40) - 20));
    }
}

/* The scalar version against the definition; with a variant, that ISA's version against the
 * scalar one, bit for bit and count for count. */
static void quantize_matches(void **state)
{
    (void)state;
    const size_t n = 1003; /* not a multiple of any vector width */
    float *x = malloc(n * sizeof(float)), *sc = malloc(n * sizeof(float));
    uint8_t *want = malloc(n * 4), *got = malloc(n * 4);
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 11);
    const kvc_dtype_t dts[] = {KVC_DTYPE_F32, KVC_DTYPE_F16, KVC_DTYPE_BF16, KVC_DTYPE_FP8_E4M3,
                               KVC_DTYPE_FP8_E5M2};
    table_t tabs[4];
    for (int i = 0; i < 4; i++) tabs[i] = make_table(&FMTS[i]);
    for (int rep = 0; rep < 20; rep++) {
        fill_specials(x, n, &rng);
        for (size_t i = 0; i < n; i++)
            sc[i] = (float)ldexp(1.0 + kvc_rng_double(&rng), (int)kvc_rng_below(&rng, 20) - 10);
        float scale = rep % 3 == 0 ? 1.0f : (float)(0.01 + kvc_rng_double(&rng));
        for (size_t d = 0; d < KVC_ARRAY_LEN(dts); d++) {
            kvc_dtype_t dt = dts[d];
            size_t el = kvc_dtype_bytes(dt);
            const float *scales = rep % 2 ? sc : NULL;
            kvc_quant_stats_t sw = {0};
            assert_ok(kvc_quantize(dt, want, x, n, scale, scales, KVC_ISA_SCALAR, &sw));
            /* the scalar version against the definition */
            uint64_t clipped = 0, nonfinite = 0;
            const int fi = dt == KVC_DTYPE_F16        ? 2
                           : dt == KVC_DTYPE_BF16     ? 3
                           : dt == KVC_DTYPE_FP8_E4M3 ? 0
                                                      : 1;
            const fdef_t *f = dt == KVC_DTYPE_F32 ? NULL : &FMTS[fi];
            for (size_t i = 0; i < n; i++) {
                float y = x[i] / (scales ? scales[i] : scale);
                if (!isfinite(x[i]))
                    nonfinite++;
                else if (def_clipped(f, &tabs[fi], y))
                    clipped++;
                if (!f) continue;
                uint32_t c = 0;
                memcpy(&c, want + i * el, el);
                assert_int_equal(c, lib_encode(f, y));
            }
            assert_int_equal(sw.n_values, n);
            assert_int_equal(sw.n_clipped, clipped);
            assert_int_equal(sw.n_nonfinite, nonfinite);
            if (variant) {
                const kvc_isa_t isa = variant->isa;
                kvc_quant_stats_t sg = {0};
                memset(got, 0xa5, n * el);
                assert_ok(kvc_quantize(dt, got, x, n, scale, scales, isa, &sg));
                if (memcmp(got, want, n * el) != 0) {
                    for (size_t i = 0; i < n * el; i++)
                        if (got[i] != want[i])
                            fail_msg("%s %s: byte %zu differs (x=%a)", kvc_isa_name(isa),
                                     kvc_dtype_name(dt), i, (double)x[i / el]);
                }
                assert_int_equal(sg.n_values, sw.n_values);
                assert_int_equal(sg.n_clipped, sw.n_clipped);
                assert_int_equal(sg.n_nonfinite, sw.n_nonfinite);
            }
        }
    }
    if (variant) {
        /* values that merely round down to max are not clipped; past the tie they are */
        const float edge[] = {448.0f, 450.0f, 464.0f, 464.1f, 57344.0f, 61439.0f, 61440.0f};
        const kvc_dtype_t edt[] = {KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E4M3,
                                   KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E5M2, KVC_DTYPE_FP8_E5M2,
                                   KVC_DTYPE_FP8_E5M2};
        const uint64_t eclip[] = {0, 0, 0, 1, 0, 0, 1};
        for (size_t i = 0; i < KVC_ARRAY_LEN(edge); i++) {
            float v[32];
            for (int j = 0; j < 32; j++) v[j] = edge[i];
            kvc_quant_stats_t st = {0};
            assert_ok(kvc_quantize(edt[i], got, v, 32, 1.0f, NULL, variant->isa, &st));
            assert_int_equal(st.n_clipped, 32 * eclip[i]);
        }
        for (int i = 0; i < 4; i++) free_table(&tabs[i]);
        free(x), free(sc), free(want), free(got);
        return;
    }
    /* bad scales are refused and nothing is written */
    memset(got, 0x5a, 8);
    assert_int_equal(kvc_quantize(KVC_DTYPE_FP8_E4M3, got, x, 8, 0.0f, NULL, KVC_ISA_AUTO, NULL),
                     KVC_EINVAL);
    assert_int_equal(kvc_quantize(KVC_DTYPE_FP8_E4M3, got, x, 8, NAN, NULL, KVC_ISA_AUTO, NULL),
                     KVC_EINVAL);
    sc[3] = -1.0f;
    assert_int_equal(kvc_quantize(KVC_DTYPE_FP8_E4M3, got, x, 8, 1.0f, sc, KVC_ISA_AUTO, NULL),
                     KVC_EINVAL);
    assert_int_equal(got[0], 0x5a);
    assert_int_equal(kvc_quantize(KVC_DTYPE__COUNT, got, x, 8, 1.0f, NULL, KVC_ISA_AUTO, NULL),
                     KVC_EINVAL);
    /* dequantize inverts exact codes */
    float back[4];
    uint8_t codes[4] = {0x38, 0xb8, 0x01, 0x7e};
    assert_ok(kvc_dequantize(KVC_DTYPE_FP8_E4M3, back, codes, 4, 2.0f, NULL));
    assert_true(back[0] == 2.0f && back[1] == -2.0f && back[2] == 0x1p-8f && back[3] == 896.0f);
    /* values that merely round down to max are not clipped; past the tie they are */
    const float edge[] = {448.0f, 450.0f, 464.0f, 464.1f, 57344.0f, 61439.0f, 61440.0f};
    const kvc_dtype_t edt[] = {KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E4M3,
                               KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E5M2, KVC_DTYPE_FP8_E5M2,
                               KVC_DTYPE_FP8_E5M2};
    const uint64_t eclip[] = {0, 0, 0, 1, 0, 0, 1};
    for (size_t i = 0; i < KVC_ARRAY_LEN(edge); i++) {
        float v[32];
        for (int j = 0; j < 32; j++) v[j] = edge[i];
        kvc_quant_stats_t st = {0};
        assert_ok(kvc_quantize(edt[i], got, v, 32, 1.0f, NULL, KVC_ISA_SCALAR, &st));
        assert_int_equal(st.n_clipped, 32 * eclip[i]);
    }
    for (int i = 0; i < 4; i++) free_table(&tabs[i]);
    free(x), free(sc), free(want), free(got);
}

/* ---- scale layouts --------------------------------------------------------------- */
static void scale_layouts_have_documented_sizes(void **state)
{
    (void)state;
    kvc_scale_shape_t s = {.n_layers = 3,
                           .n_kv = 2,
                           .n_kv_heads = 4,
                           .head_dim = 64,
                           .block_size = 16,
                           .dtype = KVC_DTYPE_FP8_E4M3};
    s.layout = KVC_SCALE_NONE;
    assert_int_equal(kvc_scale_bytes(&s), 0);
    assert_int_equal(kvc_scale_bytes(NULL), 0); /* an invalid shape, not a crash */
    s.layout = KVC_SCALE_TENSOR;
    assert_int_equal(kvc_scale_bytes(&s), 3 * 2 * 4);
    assert_int_equal(kvc_kv_quant_len(&s, false), 3);
    s.layout = KVC_SCALE_HEAD;
    assert_int_equal(kvc_scale_bytes(&s), 3 * 2 * 4 * 4);
    assert_int_equal(kvc_kv_quant_len(&s, true), 12);
    s.layout = KVC_SCALE_CHANNEL_TOKEN;
    assert_int_equal(kvc_scale_floats_per_layer(&s), 4 * 64 + 4 * 16);
    assert_int_equal(kvc_kv_quant_len(&s, false), 3 * 4 * 64);
    assert_int_equal(kvc_kv_quant_len(&s, true), 0);
    /* a latent: per-channel only */
    kvc_scale_shape_t m = {.n_layers = 2,
                           .n_kv = 1,
                           .n_kv_heads = 1,
                           .head_dim = 576,
                           .block_size = 64,
                           .dtype = KVC_DTYPE_FP8_E4M3,
                           .layout = KVC_SCALE_CHANNEL_TOKEN};
    assert_int_equal(kvc_scale_bytes(&m), 2 * 576 * 4);
    m.n_kv_heads = 2;
    assert_int_equal(kvc_scale_shape_check(&m), KVC_EINVAL);
    /* scales only where they mean something */
    s.dtype = KVC_DTYPE_BF16;
    assert_int_equal(kvc_scale_shape_check(&s), KVC_EINVAL);
    s.dtype = KVC_DTYPE_F16;
    assert_ok(kvc_scale_shape_check(&s));
    /* scale from a maximum */
    assert_true(kvc_scale_from_amax(KVC_DTYPE_FP8_E4M3, 448.0f, 1.0f) == 1.0f);
    assert_true(kvc_scale_from_amax(KVC_DTYPE_FP8_E4M3, 896.0f, 2.0f) == 4.0f);
    assert_true(kvc_scale_from_amax(KVC_DTYPE_FP8_E4M3, 0.0f, 1.0f) == 1.0f);
    assert_true(kvc_scale_from_amax(KVC_DTYPE_FP8_E4M3, INFINITY, 1.0f) == 1.0f);
    assert_true(kvc_scale_from_amax(KVC_DTYPE_FP8_E4M3, 1e-40f, 1.0f) == 0x1p-126f);
    /* names */
    kvc_scale_layout_t l;
    assert_ok(kvc_scale_layout_parse("channel-token", &l));
    assert_int_equal(l, KVC_SCALE_CHANNEL_TOKEN);
    assert_string_equal(kvc_scale_layout_name(KVC_SCALE_HEAD), "head");
    assert_int_equal(kvc_scale_layout_parse("nope", &l), KVC_EINVAL);
    kvc_isa_t isa;
    assert_ok(kvc_isa_parse("avx2", &isa));
    assert_int_equal(isa, KVC_ISA_AVX2);
    assert_string_equal(kvc_isa_name(KVC_ISA_AVX512), "avx512");
    /* the best ISA is supported; AUTO and SCALAR always are */
    assert_true(kvc_isa_supported(kvc_isa_best()));
    assert_true(kvc_isa_supported(KVC_ISA_SCALAR) && kvc_isa_supported(KVC_ISA_AUTO));
    assert_false(kvc_isa_supported(KVC_ISA__COUNT));
}

/* A variant this CPU lacks: forcing its ISA fails with KVC_ENOTSUP and writes nothing. */
static void missing_isa_is_refused(void **state)
{
    (void)state;
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint8_t got[8];
    memset(got, 0x5a, sizeof got);
    assert_int_equal(kvc_quantize(KVC_DTYPE_FP8_E4M3, got, x, 8, 1.0f, NULL, variant->isa, NULL),
                     KVC_ENOTSUP);
    assert_int_equal(got[0], 0x5a);
}

int main(int argc, char **argv)
{
    static const char *const names[] = {"avx2", "avx512", NULL};
    int rc = kvc_test_variant_parse(argc, argv, names, &variant);
    if (rc) return rc;
    if (!variant) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(every_code_decodes_by_its_definition),
            cmocka_unit_test(fp8_bf16_table_is_exact),
            cmocka_unit_test(special_values_encode_as_specified),
            cmocka_unit_test(ties_and_neighbours_match_the_oracle),
            cmocka_unit_test(binary32_sweep_matches_the_oracle),
            cmocka_unit_test(quantize_matches),
            cmocka_unit_test(scale_layouts_have_documented_sizes),
        };
        return cmocka_run_group_tests_name("quant", tests, NULL, NULL);
    }
    char group[64];
    snprintf(group, sizeof group, "quant.%s", variant->name);
    if (!kvc_isa_supported(variant->isa)) {
        const struct CMUnitTest refused[] = {cmocka_unit_test(missing_isa_is_refused)};
        if ((rc = cmocka_run_group_tests_name(group, refused, NULL, NULL))) return rc;
        return kvc_test_variant_skip("quant", variant);
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(quantize_matches)};
    return cmocka_run_group_tests_name(group, tests, NULL, NULL);
}
