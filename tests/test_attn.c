/* test_attn.c - attention over the paged cache: every kernel (scalar, AVX2,
 * AVX-512 fp32 and AVX-512 BF16, forced through the dispatch, one per ctest
 * entry: attn.scalar, attn.avx2, attn.avx512, attn.avx512-bf16; see
 * isa_variant.h) against the double-precision reference, on random inputs
 * and on the edges: S = 1,
 * T = S, partial last blocks, block sizes 1 .. 256, head dims 64 / 128 / 256,
 * group sizes 1 .. 16, sliding windows starting inside blocks, soft-capping,
 * released (KVC_NONE) blocks outside the window, garbage after the end of a
 * sequence.  Also: invariant 8 (the bottom-right mask, and a proof that the
 * top-left one differs), paged == contiguous bit for bit, GQA packing ==
 * per-head, work split across calls and threads, the write path's scales
 * and clip counts, and argument checks.
 *
 * Tolerances, relative to the largest |V| of the cache (the outputs are
 * convex combinations of V rows):
 *   fp32 products (scalar, AVX2, AVX-512 F32):   2e-5
 *     fp32 dot products over <= 256 channels, a ~1-ulp exp, and sums of up
 *     to ~10^3 weights, each ~1e-7 relative;
 *   AVX-512 BF16 (bf16 / FP8 storage):           4e-3, against the
 *     reference run on what the kernel really multiplies (q * sm_scale
 *     rounded to bf16; with per-channel key scales, the scaled keys rounded
 *     to bf16): what is left is the rounding of each weight to bf16, unit
 *     roundoff u = 2^-8, so |sum (p~ - p) v| / sum p <= u max|v| = 3.9e-3
 *     (observed: up to 2.2e-3, mean 7e-4), plus fp32 noise.
 * The storage's own rounding is not an error here: the reference reads the
 * same stored codes (the accuracy study in bench/ measures that part). */
#include "test_helpers.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "attn/attn_int.h"
#include "isa_variant.h"

#define TOL_F32  2e-5
#define TOL_BF16 4e-3

/* The variant this run is about (--isa NAME), or NULL for the ISA-independent tests, and how
 * many cases ran each kernel. */
static const kvc_test_variant_t *variant;
static kvc_test_kernel_count_t kernels;

/* The ISA the tests force: the variant's (so that its write path runs too), else AUTO. */
static kvc_isa_t test_isa(void)
{
    return variant ? variant->isa : KVC_ISA_AUTO;
}

/* ---- a cache with sequences written through kvc_attn_write_kv ------------------------ */
typedef struct {
    kvc_scale_shape_t shape;
    uint32_t n_blocks;
    uint8_t *buf;
    kvc_kv_view_t view;
    uint32_t n_seqs;
    uint32_t *kv_indptr, *kv_indices, *kv_last_len, *qo_indptr;
    uint32_t *seq_len;
    kvc_attn_batch_t batch;
    float vmax;
} cache_t;

typedef struct {
    kvc_dtype_t dtype;
    kvc_scale_layout_t layout;
    uint32_t n_kv_heads, head_dim, block_size, n_kv;
    uint32_t n_seqs;
    const uint32_t *lens; /* keys per sequence */
    const uint32_t *T;    /* queries per sequence (NULL: decode) */
    bool paged;           /* random block order with unused blocks between */
    float k_spread;       /* K magnitude (logit sharpness) */
    bool outliers;        /* a few K channels 20x larger */
} cache_cfg_t;

static float randn(kvc_rng_t *r)
{
    double u1 = kvc_rng_double(r), u2 = kvc_rng_double(r);
    return (float)(sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2));
}

static void *xalloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    assert_non_null(p);
    return p;
}

/* Build the cache: blocks in order (contiguous) or shuffled among spare
 * ones (paged); every byte not written by a sequence holds 0xff, which is
 * NaN in every format, so a kernel that reads past a sequence's end or into
 * a block it does not own produces NaN. */
static void cache_make(cache_t *c, const cache_cfg_t *cf, kvc_rng_t *rng)
{
    memset(c, 0, sizeof *c);
    c->shape = (kvc_scale_shape_t){.n_layers = 2,
                                   .n_kv = cf->n_kv ? cf->n_kv : 2,
                                   .n_kv_heads = cf->n_kv_heads,
                                   .head_dim = cf->head_dim,
                                   .block_size = cf->block_size,
                                   .dtype = cf->dtype,
                                   .layout = cf->layout};
    c->n_seqs = cf->n_seqs;
    c->kv_indptr = calloc(cf->n_seqs + 1, sizeof(uint32_t));
    c->qo_indptr = calloc(cf->n_seqs + 1, sizeof(uint32_t));
    c->kv_last_len = calloc(cf->n_seqs, sizeof(uint32_t));
    c->seq_len = calloc(cf->n_seqs, sizeof(uint32_t));
    const uint32_t bs = cf->block_size;
    uint32_t used = 0;
    for (uint32_t s = 0; s < cf->n_seqs; s++) {
        uint32_t nb = (cf->lens[s] + bs - 1) / bs;
        c->kv_indptr[s + 1] = c->kv_indptr[s] + nb;
        c->kv_last_len[s] = cf->lens[s] - (nb - 1) * bs;
        c->qo_indptr[s + 1] = c->qo_indptr[s] + (cf->T ? cf->T[s] : 1);
        c->seq_len[s] = cf->lens[s];
        used += nb;
    }
    c->n_blocks = cf->paged ? used * 2 + 3 : used;
    c->kv_indices = calloc(used + 1, sizeof(uint32_t));
    uint32_t *perm = malloc(c->n_blocks * sizeof(uint32_t));
    for (uint32_t i = 0; i < c->n_blocks; i++) perm[i] = i;
    if (cf->paged)
        for (uint32_t i = c->n_blocks - 1; i > 0; i--) {
            uint32_t j = (uint32_t)kvc_rng_below(rng, i + 1), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
    for (uint32_t i = 0; i < used; i++) c->kv_indices[i] = perm[i];
    free(perm);
    size_t bb = kvc_kv_block_bytes(&c->shape);
    assert_true(bb > 0);
    c->buf = xalloc(bb * c->n_blocks);
    memset(c->buf, 0xff, bb * c->n_blocks);
    assert_ok(
        kvc_kv_view_contiguous(c->buf, bb * c->n_blocks, c->n_blocks, &c->shape, 1, &c->view));
    /* zero the side data of used blocks: "no scale yet" */
    for (uint32_t i = 0; i < used; i++)
        memset(c->buf + (size_t)c->kv_indices[i] * bb + c->view.scale_offset, 0,
               kvc_scale_bytes(&c->shape));
    /* write the tokens in a few chunks per sequence, as prefill + decode would */
    const uint32_t H = cf->n_kv_heads, d = cf->head_dim;
    float *kamax = calloc(kvc_kv_quant_len(&c->shape, false) + 1, sizeof(float));
    float *vamax = calloc(kvc_kv_quant_len(&c->shape, true) + 1, sizeof(float));
    kvc_kv_quant_t qs = {.k_amax = kamax, .v_amax = vamax, .headroom = 1.5f};
    float *outl = calloc(d, sizeof(float));
    for (uint32_t ch = 0; ch < d; ch++) outl[ch] = cf->outliers && ch % 37 == 5 ? 20.0f : 1.0f;
    c->vmax = 0;
    for (uint32_t s = 0; s < cf->n_seqs; s++) {
        uint32_t S = cf->lens[s];
        float *k = malloc(sizeof(float) * S * H * d), *v = malloc(sizeof(float) * S * H * d);
        int64_t *slots = malloc(sizeof(int64_t) * S);
        for (uint32_t t = 0; t < S; t++) {
            uint32_t blk = c->kv_indices[c->kv_indptr[s] + t / bs];
            slots[t] = blk * bs + t % bs;
            for (uint32_t i = 0; i < H * d; i++) {
                k[(size_t)t * H * d + i] = randn(rng) * cf->k_spread * outl[i % d];
                v[(size_t)t * H * d + i] = randn(rng);
                c->vmax = fmaxf(c->vmax, fabsf(v[(size_t)t * H * d + i]));
            }
        }
        if (c->shape.n_kv == 1) /* a latent's "V" is its K row */
            for (size_t i = 0; i < (size_t)S * H * d; i++) c->vmax = fmaxf(c->vmax, fabsf(k[i]));
        for (uint32_t t0 = 0; t0 < S;) {
            uint32_t chunk = 1 + (uint32_t)kvc_rng_below(rng, 40); /* KVC_MIN evaluates twice */
            uint32_t n = KVC_MIN(S - t0, chunk);
            int wrc = kvc_attn_write_kv(&c->view, slots + t0, n, k + (size_t)t0 * H * d,
                                        c->shape.n_kv == 2 ? v + (size_t)t0 * H * d : NULL, &qs,
                                        test_isa());
            if (wrc)
                fail_msg("write: %s, dtype %s layout %s bs %u", kvc_strerror(wrc),
                         kvc_dtype_name(c->shape.dtype), kvc_scale_layout_name(c->shape.layout),
                         bs);
            t0 += n;
        }
        free(k), free(v), free(slots);
    }
    c->vmax *= 1.25f; /* FP8 rounding can raise a value by up to 1/16; margin */
    free(kamax), free(vamax), free(outl);
    c->batch = (kvc_attn_batch_t){.n_seqs = c->n_seqs,
                                  .kv_indptr = c->kv_indptr,
                                  .kv_indices = c->kv_indices,
                                  .kv_last_len = c->kv_last_len,
                                  .qo_indptr = cf->T ? c->qo_indptr : NULL};
}

static void cache_free(cache_t *c)
{
    free(c->buf), free(c->kv_indptr), free(c->kv_indices), free(c->kv_last_len);
    free(c->qo_indptr), free(c->seq_len);
}

static uint32_t n_rows(const cache_t *c)
{
    return c->qo_indptr[c->n_seqs];
}

static float *make_q(uint32_t n, uint32_t hq, uint32_t d, kvc_rng_t *rng)
{
    float *q = malloc(sizeof(float) * n * hq * d);
    for (size_t i = 0; i < (size_t)n * hq * d; i++) q[i] = randn(rng);
    return q;
}

/* ---- running kernels -------------------------------------------------------------------- */
/* The kernel attn.h says the variant runs over this view: the scalar one for head dims that
 * are not a multiple of 32, fp32 products on AVX-512 for storage the BF16 path does not take.
 * (Called only for variants this CPU has.) */
static kvc_attn_kernel_t expected_kernel(const kvc_test_variant_t *v, const kvc_kv_view_t *kv,
                                         uint32_t dv)
{
    kvc_dtype_t dt = kv->shape.dtype;
    if (kv->shape.head_dim % 32 || dv % 32) return KVC_ATTN_KERNEL_SCALAR;
    if (v->kernel == KVC_ATTN_KERNEL_AVX512_BF16 &&
        !(dt == KVC_DTYPE_BF16 || dt == KVC_DTYPE_FP8_E4M3 || dt == KVC_DTYPE_FP8_E5M2))
        return KVC_ATTN_KERNEL_AVX512;
    return v->kernel;
}

/* The variant's parameters on p; returns the kernel that will run (checked against what
 * attn.h promises) and counts the case under it. */
static kvc_attn_kernel_t use_variant(kvc_attn_params_t *p, const kvc_kv_view_t *kv)
{
    p->isa = variant->isa;
    p->compute = variant->compute;
    kvc_attn_kernel_t k;
    assert_ok(kvc_attn_kernel(p, kv, NULL, &k));
    if (k != expected_kernel(variant, kv, kv->shape.head_dim))
        fail_msg("%s over %s d %u ran %s", variant->name, kvc_dtype_name(kv->shape.dtype),
                 kv->shape.head_dim, kvc_attn_kernel_name(k));
    kernels.ran[k]++;
    return k;
}

static int run(const kvc_attn_params_t *p, const cache_t *c, const float *q, float *out)
{
    size_t wb = kvc_attn_workspace_bytes(&c->view, NULL);
    void *ws = xalloc(wb);
    uint32_t n = kvc_attn_n_items(p, &c->view, &c->batch);
    int rc = kvc_attn_forward(p, &c->view, &c->batch, q, out, ws, wb, 0, n);
    free(ws);
    return rc;
}

/* With per-channel key scales the BF16 kernel multiplies keys already
 * scaled and rounded to bf16: an fp32 copy of the cache holding exactly
 * those keys (and the values, scaled) lets the reference see what it sees. */
static uint8_t *bf16_effective_cache(const cache_t *c, kvc_kv_view_t *out)
{
    kvc_scale_shape_t sh = c->shape;
    sh.dtype = KVC_DTYPE_F32;
    sh.layout = KVC_SCALE_NONE;
    size_t bb = kvc_kv_block_bytes(&sh);
    uint8_t *buf = xalloc(bb * c->n_blocks);
    assert_ok(kvc_kv_view_contiguous(buf, bb * c->n_blocks, c->n_blocks, &sh, c->view.layer, out));
    const uint32_t d = sh.head_dim;
    float *row = malloc(sizeof(float) * d);
    for (uint32_t b = 0; b < c->n_blocks; b++)
        for (uint32_t h = 0; h < sh.n_kv_heads; h++)
            for (uint32_t off = 0; off < sh.block_size; off++) {
                kvc__tok_scales_t ts = kvc__tok_scales(&c->view, kvc__scales(&c->view, b), h, off);
                assert_ok(kvc_dequantize(c->shape.dtype, row, kvc__row(&c->view, b, h, off, 0), d,
                                         1.0f, NULL));
                for (uint32_t i = 0; i < d; i++)
                    row[i] = kvc_bf16_to_f32(kvc_bf16_from_f32(row[i] * ts.kc[i]));
                memcpy(kvc__row(out, b, h, off, 0), row, sizeof(float) * d);
                if (sh.n_kv == 1) continue;
                assert_ok(kvc_dequantize(c->shape.dtype, row, kvc__row(&c->view, b, h, off, 1), d,
                                         ts.v, NULL));
                memcpy(kvc__row(out, b, h, off, 1), row, sizeof(float) * d);
            }
    free(row);
    return buf;
}

/* The reference on what the BF16 kernel really multiplies: the query
 * bf16(q * sm), and (per-channel layouts) the keys as above. */
static void reference_for(const kvc_attn_params_t *p, const cache_t *c, const float *q, bool bf16,
                          double *out)
{
    if (!bf16) {
        assert_ok(kvc_attn_reference(p, &c->view, &c->batch, q, out));
        return;
    }
    const uint32_t d = c->shape.head_dim;
    size_t n = (size_t)n_rows(c) * p->n_q_heads * d;
    float sm = p->sm_scale > 0 ? p->sm_scale : 1.0f / sqrtf((float)d);
    float *qr = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) qr[i] = kvc_bf16_to_f32(kvc_bf16_from_f32(q[i] * sm));
    kvc_attn_params_t p2 = *p;
    p2.sm_scale = 1.0f;
    if (c->shape.layout == KVC_SCALE_CHANNEL_TOKEN) {
        kvc_kv_view_t ev;
        uint8_t *eb = bf16_effective_cache(c, &ev);
        assert_ok(kvc_attn_reference(&p2, &ev, &c->batch, qr, out));
        free(eb);
    } else {
        assert_ok(kvc_attn_reference(&p2, &c->view, &c->batch, qr, out));
    }
    free(qr);
}

static double max_err(const float *a, const double *b, size_t n)
{
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d; /* NaN wins */
    }
    return e;
}

/* The variant's kernel against the reference. */
static void check_all(const kvc_attn_params_t *p0, const cache_t *c, const float *q,
                      const char *what)
{
    const uint32_t d = c->shape.head_dim;
    size_t n = (size_t)n_rows(c) * p0->n_q_heads * d;
    float *out = malloc(sizeof(float) * n);
    double *ref = malloc(sizeof(double) * n);
    kvc_attn_params_t p = *p0;
    const kvc_attn_kernel_t k = use_variant(&p, &c->view);
    const bool b16 = k == KVC_ATTN_KERNEL_AVX512_BF16;
    reference_for(p0, c, q, b16, ref);
    memset(out, 0xff, sizeof(float) * n);
    assert_ok(run(&p, c, q, out));
    double err = max_err(out, ref, n);
    double tol = (b16 ? TOL_BF16 : TOL_F32) * c->vmax;
    if (!(err <= tol))
        fail_msg("%s: %s dtype %s layout %s d %u bs %u hq %u: error %.3g > tol %.3g", what,
                 kvc_attn_kernel_name(k), kvc_dtype_name(c->shape.dtype),
                 kvc_scale_layout_name(c->shape.layout), d, c->shape.block_size, p.n_q_heads, err,
                 tol);
    if (getenv("KVC_TEST_VERBOSE"))
        print_message("%s %s %s %s d%u bs%u: err/vmax %.2e\n", what, kvc_attn_kernel_name(k),
                      kvc_dtype_name(c->shape.dtype), kvc_scale_layout_name(c->shape.layout), d,
                      c->shape.block_size, err / c->vmax);
    free(out), free(ref);
}

/* ---- tests ---------------------------------------------------------------------------- */
static const kvc_dtype_t DTYPES[] = {KVC_DTYPE_F32, KVC_DTYPE_F16, KVC_DTYPE_BF16,
                                     KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E5M2};

static kvc_scale_layout_t layout_for(kvc_dtype_t dt, uint32_t i)
{
    if (dt == KVC_DTYPE_F32 || dt == KVC_DTYPE_BF16) return KVC_SCALE_NONE;
    return (kvc_scale_layout_t)(i % KVC_SCALE__COUNT);
}

/* One decode case: a cache of `cf` with case number i's spread and
 * outliers, n_q_heads query heads (items of up to heads_per_item KV heads,
 * 0: the default), every variant against the reference. */
static void decode_case(cache_cfg_t cf, int i, uint32_t n_q_heads, uint32_t heads_per_item,
                        kvc_rng_t *rng, const char *what)
{
    cf.paged = i % 2;
    cf.k_spread = 1.0f + (float)(i % 3);
    cf.outliers = i % 4 == 1;
    cache_t c;
    cache_make(&c, &cf, rng);
    kvc_attn_params_t p = kvc_attn_params_default();
    p.n_q_heads = n_q_heads;
    p.kv_heads_per_item = heads_per_item;
    float *q = make_q(n_rows(&c), p.n_q_heads, cf.head_dim, rng);
    check_all(&p, &c, q, what);
    free(q);
    cache_free(&c);
}

/* Decode over several sequences: every dtype and scale layout, head dims
 * 64/128/256, block sizes 1..256, group sizes 1..16, lengths from 1 up. */
static void decode_matches_reference(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 1);
    const uint32_t dims[] = {64, 128, 256}, bss[] = {1, 2, 16, 64, 256},
                   groups[] = {1, 2, 3, 4, 8, 16};
    const int n_cases = KVC_TEST_SANITIZED ? 12 : 40;
    for (int i = 0; i < n_cases; i++) {
        kvc_dtype_t dt = DTYPES[i % 5];
        uint32_t d = dims[(i / 5) % 3], bs = bss[(i / 3) % 5], g = groups[i % 6];
        uint32_t hk = 1 + (uint32_t)(i % 2);
        uint32_t lens[3] = {1 + (uint32_t)kvc_rng_below(&rng, 40),
                            1 + (uint32_t)kvc_rng_below(&rng, 300),
                            i % 4 == 0 ? 1 : 1 + (uint32_t)kvc_rng_below(&rng, 150)};
        cache_cfg_t cf = {.dtype = dt,
                          .layout = layout_for(dt, (uint32_t)i / 5),
                          .n_kv_heads = hk,
                          .head_dim = d,
                          .block_size = bs,
                          .n_seqs = 3,
                          .lens = lens};
        decode_case(cf, i, hk * g, 0, &rng, "decode");
    }
}

/* Many KV heads in one item (20, where the tests above use up to 3, so that
 * the prefetch plan spans many heads' rows): every dtype, block sizes
 * that read K/V in place, gather them (4) or span groups (64), and lengths
 * that leave partial groups in the last block. */
static void decode_many_heads_in_one_item(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 23);
    const uint32_t bss[] = {4, 16, 64};
    const int n_cases = KVC_TEST_SANITIZED ? 5 : 10;
    for (int i = 0; i < n_cases; i++) {
        kvc_dtype_t dt = DTYPES[i % 5];
        uint32_t lens[2] = {1 + (uint32_t)kvc_rng_below(&rng, 90),
                            17 + (uint32_t)kvc_rng_below(&rng, 200)};
        cache_cfg_t cf = {.dtype = dt,
                          .layout = layout_for(dt, (uint32_t)i),
                          .n_kv_heads = 20,
                          .head_dim = 64,
                          .block_size = bss[i % 3],
                          .n_seqs = 2,
                          .lens = lens};
        decode_case(cf, i, 20 * (i % 2 ? 4 : 1), 20, &rng, "decode, 20 heads an item");
    }
}

/* Chunked prefill: T new queries at the end of S keys (invariant 8). */
static void prefill_uses_absolute_positions(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 2);
    for (int i = 0; i < (KVC_TEST_SANITIZED ? 4 : 10); i++) {
        kvc_dtype_t dt = DTYPES[i % 5];
        uint32_t lens[3] = {37 + (uint32_t)i * 5, 20, 64}, T[3] = {9, 20 /* T = S */, 1};
        if (i % 3 == 2) T[0] = 37;
        cache_cfg_t cf = {.dtype = dt,
                          .layout = layout_for(dt, (uint32_t)i),
                          .n_kv_heads = 2,
                          .head_dim = i % 2 ? 64 : 128,
                          .block_size = i % 3 == 0 ? 4 : 16,
                          .n_seqs = 3,
                          .lens = lens,
                          .T = T,
                          .paged = true,
                          .k_spread = 1.5f};
        cache_t c;
        cache_make(&c, &cf, &rng);
        kvc_attn_params_t p = kvc_attn_params_default();
        p.n_q_heads = i % 2 ? 8 : 6;
        float *q = make_q(n_rows(&c), p.n_q_heads, cf.head_dim, &rng);
        check_all(&p, &c, q, "prefill");
        free(q);
        cache_free(&c);
    }
}

/* The top-left-aligned triangle (query i sees keys 0..i) on the same input
 * is a different answer, except when T = S: computed here by asking the
 * reference for query i alone over the first i + 1 keys. */
static void top_left_mask_gives_a_different_wrong_answer(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 3);
    const uint32_t S = 50, T = 8, d = 64, hq = 2;
    uint32_t lens[1] = {S}, Ts[1] = {T};
    cache_cfg_t cf = {.dtype = KVC_DTYPE_F32,
                      .n_kv_heads = 1,
                      .head_dim = d,
                      .block_size = 16,
                      .n_seqs = 1,
                      .lens = lens,
                      .T = Ts,
                      .paged = true,
                      .k_spread = 1.0f};
    cache_t c;
    cache_make(&c, &cf, &rng);
    kvc_attn_params_t p = kvc_attn_params_default();
    p.n_q_heads = hq;
    float *q = make_q(T, hq, d, &rng);
    float *out = malloc(sizeof(float) * T * hq * d);
    double *ref = malloc(sizeof(double) * T * hq * d), *tl = malloc(sizeof(double) * hq * d);
    assert_ok(run(&p, &c, q, out));
    assert_ok(kvc_attn_reference(&p, &c.view, &c.batch, q, ref));
    assert_true(max_err(out, ref, (size_t)T * hq * d) <= TOL_F32 * c.vmax);
    for (uint32_t i = 0; i < T; i++) {
        /* top-left: query i over keys 0..i, i.e. a sequence of length i + 1 */
        uint32_t nb = i / 16 + 1, last = i % 16 + 1, indptr[2] = {0, nb};
        kvc_attn_batch_t b1 = {
            .n_seqs = 1, .kv_indptr = indptr, .kv_indices = c.kv_indices, .kv_last_len = &last};
        assert_ok(kvc_attn_reference(&p, &c.view, &b1, q + (size_t)i * hq * d, tl));
        double diff = max_err(out + (size_t)i * hq * d, tl, (size_t)hq * d);
        /* far outside the tolerance: the wrong mask is caught, not absorbed */
        if (!(diff > 100 * TOL_F32 * c.vmax))
            fail_msg("query %u: top-left differs by only %g", i, diff);
    }
    /* with T = S both masks are the same triangle */
    uint32_t Ts2[1] = {S};
    c.qo_indptr[1] = S;
    c.batch.qo_indptr = c.qo_indptr;
    (void)Ts2;
    float *q2 = make_q(S, hq, d, &rng), *out2 = malloc(sizeof(float) * S * hq * d);
    assert_ok(run(&p, &c, q2, out2));
    for (uint32_t i = 0; i < S; i += 7) {
        uint32_t nb = i / 16 + 1, last = i % 16 + 1, indptr[2] = {0, nb};
        kvc_attn_batch_t b1 = {
            .n_seqs = 1, .kv_indptr = indptr, .kv_indices = c.kv_indices, .kv_last_len = &last};
        assert_ok(kvc_attn_reference(&p, &c.view, &b1, q2 + (size_t)i * hq * d, tl));
        assert_true(max_err(out2 + (size_t)i * hq * d, tl, (size_t)hq * d) <= TOL_F32 * c.vmax);
    }
    free(q), free(out), free(ref), free(tl), free(q2), free(out2);
    cache_free(&c);
}

/* Windows that start inside a block, in decode and prefill, with the blocks
 * wholly before every window released (KVC_NONE), and soft-capping. */
static void sliding_window_and_softcap(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 4);
    const uint32_t windows[] = {1, 5, 16, 17, 33, 100};
    for (int i = 0; i < (KVC_TEST_SANITIZED ? 4 : 12); i++) {
        kvc_dtype_t dt = DTYPES[(i + 2) % 5];
        uint32_t lens[2] = {90 + (uint32_t)i, 41}, T[2] = {1 + (uint32_t)(i % 3) * 6, 1};
        cache_cfg_t cf = {.dtype = dt,
                          .layout = layout_for(dt, (uint32_t)i + 1),
                          .n_kv_heads = 1,
                          .head_dim = 128,
                          .block_size = i % 2 ? 16 : 8,
                          .n_seqs = 2,
                          .lens = lens,
                          .T = T,
                          .paged = true,
                          .k_spread = 2.0f};
        cache_t c;
        cache_make(&c, &cf, &rng);
        kvc_attn_params_t p = kvc_attn_params_default();
        p.n_q_heads = 4;
        p.window = windows[i % 6];
        p.softcap = i % 3 == 1 ? 5.0f : 0.0f;
        /* release blocks no query can see */
        for (uint32_t s = 0; s < 2; s++) {
            int64_t lo = (int64_t)lens[s] - T[s] - (int64_t)p.window + 1;
            for (int64_t b = 0; (b + 1) * cf.block_size <= lo; b++)
                c.kv_indices[c.kv_indptr[s] + b] = KVC_NONE;
        }
        float *q = make_q(n_rows(&c), p.n_q_heads, cf.head_dim, &rng);
        check_all(&p, &c, q, "window");
        free(q);
        cache_free(&c);
    }
    /* a KVC_NONE block that a query does see is refused */
    uint32_t lens[1] = {40};
    cache_cfg_t cf = {.dtype = KVC_DTYPE_F32,
                      .n_kv_heads = 1,
                      .head_dim = 64,
                      .block_size = 16,
                      .n_seqs = 1,
                      .lens = lens,
                      .k_spread = 1.0f};
    cache_t c;
    cache_make(&c, &cf, &rng);
    kvc_attn_params_t p = kvc_attn_params_default();
    p.window = 30; /* query 39 sees 10..39: block 0 is needed */
    c.kv_indices[0] = KVC_NONE;
    float q[64] = {0}, out[64];
    assert_int_equal(run(&p, &c, q, out), KVC_EINVAL);
    p.window = 24; /* sees 16..39: block 0 is not needed */
    assert_ok(run(&p, &c, q, out));
    cache_free(&c);
}

/* Logits over a huge range: the running max jumps by far more than the
 * lazy-rescale gap, and most weights underflow. */
static void online_softmax_handles_wide_logit_ranges(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 5);
    for (int i = 0; i < 4; i++) {
        uint32_t lens[2] = {700, 129};
        cache_cfg_t cf = {.dtype = DTYPES[i],
                          .layout = KVC_SCALE_NONE,
                          .n_kv_heads = 1,
                          .head_dim = 64,
                          .block_size = 16,
                          .n_seqs = 2,
                          .lens = lens,
                          .paged = true,
                          .k_spread = 4.0f + 4.0f * (float)i,
                          .outliers = true};
        cache_t c;
        cache_make(&c, &cf, &rng);
        kvc_attn_params_t p = kvc_attn_params_default();
        p.n_q_heads = 8;
        float *q = make_q(n_rows(&c), 8, 64, &rng);
        check_all(&p, &c, q, "wide logits");
        free(q);
        cache_free(&c);
    }
}

/* The same data in a contiguous and a paged layout: bit-identical outputs. */
static void paged_equals_contiguous_bitwise(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 6);
    for (int i = 0; i < 5; i++) {
        uint32_t lens[3] = {1 + 37 * (uint32_t)i, 200, 16}, T[3] = {1, 3, 16};
        cache_cfg_t cf = {.dtype = DTYPES[i],
                          .layout = layout_for(DTYPES[i], (uint32_t)i + 1),
                          .n_kv_heads = 2,
                          .head_dim = 128,
                          .block_size = 16,
                          .n_seqs = 3,
                          .lens = lens,
                          .T = i % 2 ? T : NULL,
                          .paged = false,
                          .k_spread = 1.0f};
        cache_t c;
        cache_make(&c, &cf, &rng);
        /* the paged copy: the same blocks scattered among others */
        const size_t bb = c.view.block_bytes;
        const uint32_t used = c.kv_indptr[3], nb = used * 3;
        uint8_t *pbuf = xalloc(bb * nb);
        memset(pbuf, 0xff, bb * nb);
        uint32_t *pidx = malloc(sizeof(uint32_t) * used);
        for (uint32_t b = 0; b < used; b++) {
            pidx[b] = (used - 1 - b) * 3 + 1 + (b % 2);
            memcpy(pbuf + (size_t)pidx[b] * bb, c.buf + (size_t)c.kv_indices[b] * bb, bb);
        }
        kvc_kv_view_t pv;
        assert_ok(kvc_kv_view_contiguous(pbuf, bb * nb, nb, &c.shape, 1, &pv));
        kvc_attn_batch_t pb = c.batch;
        pb.kv_indices = pidx;
        kvc_attn_params_t p = kvc_attn_params_default();
        p.n_q_heads = 8;
        float *q = make_q(n_rows(&c), 8, 128, &rng);
        size_t n = (size_t)n_rows(&c) * 8 * 128;
        float *o1 = malloc(sizeof(float) * n), *o2 = malloc(sizeof(float) * n);
        size_t wb = kvc_attn_workspace_bytes(&c.view, NULL);
        void *ws = xalloc(wb);
        (void)use_variant(&p, &c.view);
        assert_ok(kvc_attn_forward(&p, &c.view, &c.batch, q, o1, ws, wb, 0, UINT32_MAX));
        assert_ok(kvc_attn_forward(&p, &pv, &pb, q, o2, ws, wb, 0, UINT32_MAX));
        assert_memory_equal(o1, o2, sizeof(float) * n);
        free(ws), free(q), free(o1), free(o2), free(pidx), free(pbuf);
        cache_free(&c);
    }
}

/* GQA packing changes how often K/V are read, not the answer; splitting the
 * items across calls (or threads) changes nothing at all. */
typedef struct {
    const kvc_attn_params_t *p;
    const cache_t *c;
    const float *q;
    float *out;
    uint32_t b, e;
    int rc;
} thr_t;

static void *thr_main(void *arg)
{
    thr_t *t = arg;
    size_t wb = kvc_attn_workspace_bytes(&t->c->view, NULL);
    void *ws = xalloc(wb);
    t->rc = kvc_attn_forward(t->p, &t->c->view, &t->c->batch, t->q, t->out, ws, wb, t->b, t->e);
    free(ws);
    return NULL;
}

static void packing_and_work_split_do_not_change_results(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 7);
    uint32_t lens[4] = {300, 5, 77, 128}, T[4] = {70, 1, 3, 2};
    cache_cfg_t cf = {.dtype = KVC_DTYPE_FP8_E4M3,
                      .layout = KVC_SCALE_HEAD,
                      .n_kv_heads = 2,
                      .head_dim = 128,
                      .block_size = 16,
                      .n_seqs = 4,
                      .lens = lens,
                      .T = T,
                      .paged = true,
                      .k_spread = 1.0f};
    cache_t c;
    cache_make(&c, &cf, &rng);
    kvc_attn_params_t p = kvc_attn_params_default();
    p.n_q_heads = 16;
    float *q = make_q(n_rows(&c), 16, 128, &rng);
    size_t n = (size_t)n_rows(&c) * 16 * 128;
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    const kvc_attn_kernel_t k = use_variant(&p, &c.view);
    p.per_head = false;
    assert_ok(run(&p, &c, q, a));
    /* items split into two threads, then item by item */
    uint32_t ni = kvc_attn_n_items(&p, &c.view, &c.batch);
    assert_true(ni >= 2 * 4);
    memset(b, 0xff, sizeof(float) * n);
    thr_t t[2] = {{&p, &c, q, b, 0, ni / 3, -1}, {&p, &c, q, b, ni / 3, ni, -1}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, thr_main, &t[i]), 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_ok(t[i].rc);
    }
    assert_memory_equal(a, b, sizeof(float) * n);
    memset(b, 0xff, sizeof(float) * n);
    for (uint32_t i = 0; i < ni; i++) {
        thr_t one = {&p, &c, q, b, i, i + 1, -1};
        thr_main(&one);
        assert_ok(one.rc);
    }
    assert_memory_equal(a, b, sizeof(float) * n);
    /* one KV head per item instead of several: more items, the same bits */
    p.kv_heads_per_item = 1;
    assert_true(kvc_attn_n_items(&p, &c.view, &c.batch) > ni);
    memset(b, 0xff, sizeof(float) * n);
    assert_ok(run(&p, &c, q, b));
    assert_memory_equal(a, b, sizeof(float) * n);
    p.kv_heads_per_item = 0;
    /* per head: more items, K/V read per query head, the same answer */
    p.per_head = true;
    assert_true(kvc_attn_n_items(&p, &c.view, &c.batch) > ni);
    assert_ok(run(&p, &c, q, b));
    double err = 0;
    for (size_t i = 0; i < n; i++) err = fmax(err, fabs((double)a[i] - b[i]));
    const bool b16 = k == KVC_ATTN_KERNEL_AVX512_BF16;
    assert_true(err <= (b16 ? TOL_BF16 : TOL_F32) * c.vmax);
    free(q), free(a), free(b);
    cache_free(&c);
}

/* batch_invariant: a query row's output is the same bits whatever else the call holds.  One
 * sequence of S keys, its last T positions queried at once (heads of 8 rows and more: the
 * kernels' 8-row tiles), against the same rows split over two calls at shorter lengths, and the
 * last row alone as a decode step (a head of fewer than 8 rows: 1-row tiles), for several
 * dtypes, block sizes, head dims and GQA ratios; with a softcap, a window and wide logits too
 * (rows that rescale while their tile-mates do not). */
static void batch_invariant_rows_do_not_depend_on_the_batch(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 77);
    for (int i = 0; i < (KVC_TEST_SANITIZED ? 4 : 12); i++) {
        const uint32_t S = 150 + 37 * (uint32_t)i, T = 20 + 9 * (uint32_t)i % 50, cut = T / 3;
        kvc_dtype_t dt = DTYPES[i % 3];
        uint32_t lens[1] = {S}, Ts[1] = {T};
        cache_cfg_t cf = {.dtype = dt,
                          .layout = layout_for(dt, (uint32_t)i),
                          .n_kv_heads = 2,
                          .head_dim = i % 2 ? 64 : 128,
                          .block_size = i % 3 == 0 ? 4 : 16,
                          .n_seqs = 1,
                          .lens = lens,
                          .T = Ts,
                          .paged = true,
                          .k_spread = i % 4 == 3 ? 12.0f : 1.5f};
        cache_t c;
        cache_make(&c, &cf, &rng);
        kvc_attn_params_t p = kvc_attn_params_default();
        p.n_q_heads = i % 2 ? 6 : 4; /* 3 or 2 rows per KV head in a decode step */
        p.batch_invariant = true;
        if (i % 5 == 4) p.softcap = 30.0f;
        if (i % 6 == 5) p.window = 50;
        const kvc_attn_kernel_t k = use_variant(&p, &c.view);
        (void)k;
        const uint32_t d = cf.head_dim, hq = p.n_q_heads;
        const size_t rowf = (size_t)hq * d;
        float *q = make_q(T, hq, d, &rng);
        float *full = malloc(sizeof(float) * T * rowf), *part = malloc(sizeof(float) * T * rowf);
        assert_ok(run(&p, &c, q, full));
        /* the same rows in two calls: the first `cut` with the sequence cut short after them */
        const uint32_t bs = cf.block_size;
        for (int half = 0; half < 2; half++) {
            const uint32_t len = half ? S : S - (T - cut), nq = half ? T - cut : cut;
            const uint32_t nb = (len + bs - 1) / bs;
            uint32_t kv_indptr[2] = {0, nb}, last[1] = {len - (nb - 1) * bs}, qo[2] = {0, nq};
            kvc_attn_batch_t b = {.n_seqs = 1,
                                  .kv_indptr = kv_indptr,
                                  .kv_indices = c.kv_indices,
                                  .kv_last_len = last,
                                  .qo_indptr = qo};
            size_t wb = kvc_attn_workspace_bytes(&c.view, NULL);
            void *ws = xalloc(wb);
            const size_t r0 = half ? cut : 0;
            assert_ok(kvc_attn_forward(&p, &c.view, &b, q + r0 * rowf, part + r0 * rowf, ws, wb, 0,
                                       kvc_attn_n_items(&p, &c.view, &b)));
            /* the last row alone: a decode step */
            if (half) {
                float *one = malloc(sizeof(float) * rowf);
                b.qo_indptr = NULL;
                assert_ok(kvc_attn_forward(&p, &c.view, &b, q + (size_t)(T - 1) * rowf, one, ws, wb,
                                           0, kvc_attn_n_items(&p, &c.view, &b)));
                if (memcmp(one, full + (size_t)(T - 1) * rowf, sizeof(float) * rowf))
                    fail_msg("case %d (%s d %u bs %u): decode row differs from the prefill row", i,
                             kvc_dtype_name(dt), d, bs);
                free(one);
            }
            free(ws);
        }
        for (uint32_t r = 0; r < T; r++)
            if (memcmp(part + r * rowf, full + r * rowf, sizeof(float) * rowf))
                fail_msg("case %d (%s d %u bs %u): row %u differs when the batch is split", i,
                         kvc_dtype_name(dt), d, bs, r);
        free(q), free(full), free(part);
        cache_free(&c);
    }
}

/* S = 1, T = S = 1, a single partial block, odd head counts. */
static void tiny_sequences(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 8);
    for (int i = 0; i < 5; i++) {
        uint32_t lens[4] = {1, 1, 2, 3}, T[4] = {1, 1, 2, 1};
        cache_cfg_t cf = {.dtype = DTYPES[i],
                          .layout = layout_for(DTYPES[i], 3),
                          .n_kv_heads = 3,
                          .head_dim = 64,
                          .block_size = i % 2 ? 256 : 1,
                          .n_seqs = 4,
                          .lens = lens,
                          .T = T,
                          .paged = true,
                          .k_spread = 1.0f};
        cache_t c;
        cache_make(&c, &cf, &rng);
        kvc_attn_params_t p = kvc_attn_params_default();
        p.n_q_heads = 3 * 5;
        float *q = make_q(n_rows(&c), p.n_q_heads, 64, &rng);
        check_all(&p, &c, q, "tiny");
        /* one key: the output is that key's value exactly (up to V's rounding) */
        free(q);
        cache_free(&c);
    }
}

/* Head dims the SIMD kernels do not take (not a multiple of 32) run scalar. */
static void odd_head_dims_fall_back_to_scalar(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 9);
    uint32_t lens[2] = {33, 70};
    cache_cfg_t cf = {.dtype = KVC_DTYPE_FP8_E4M3,
                      .layout = KVC_SCALE_CHANNEL_TOKEN,
                      .n_kv_heads = 1,
                      .head_dim = 40,
                      .block_size = 16,
                      .n_seqs = 2,
                      .lens = lens,
                      .paged = true,
                      .k_spread = 1.0f};
    cache_t c;
    cache_make(&c, &cf, &rng);
    kvc_attn_params_t p = kvc_attn_params_default();
    p.n_q_heads = 2;
    float *q = make_q(2, 2, 40, &rng);
    check_all(&p, &c, q, "d=40");
    free(q);
    cache_free(&c);
}

/* ---- the write path ----------------------------------------------------------------------- */
static void write_sets_block_scales_and_counts_clipping(void **state)
{
    (void)state;
    enum { H = 2, d = 32, bs = 4 };
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = 8;
    pp.block_size = bs;
    kvc_scale_shape_t sh = {.n_layers = 2,
                            .n_kv = 2,
                            .n_kv_heads = H,
                            .head_dim = d,
                            .block_size = bs,
                            .dtype = KVC_DTYPE_FP8_E4M3,
                            .layout = KVC_SCALE_HEAD};
    pp.storage = (kvc_storage_desc_t){.n_layers = 2,
                                      .n_kv_heads = H,
                                      .head_dim = d,
                                      .n_kv = 2,
                                      .dtype = KVC_DTYPE_FP8_E4M3,
                                      .scale_bytes = (uint32_t)kvc_scale_bytes(&sh)};
    kvc_pool_t *pool = NULL;
    assert_ok(kvc_pool_create(&pp, &pool));
    kvc_kv_view_t kv;
    assert_ok(kvc_kv_view_from_pool(pool, 1, KVC_SCALE_HEAD, &kv));
    assert_int_equal(kvc_kv_view_from_pool(pool, 2, KVC_SCALE_HEAD, &kv), KVC_EINVAL);
    assert_int_equal(kvc_kv_view_from_pool(pool, 1, KVC_SCALE_CHANNEL_TOKEN, &kv),
                     KVC_EINVAL); /* too few scale bytes */
    assert_ok(kvc_kv_view_from_pool(pool, 1, KVC_SCALE_HEAD, &kv));
    float kam[4] = {0}, vam[4] = {0};
    kvc_kv_quant_t qs = {.k_amax = kam, .v_amax = vam, .headroom = 1.0f};
    float k[3 * H * d], v[3 * H * d];
    for (uint32_t i = 0; i < 3 * H * d; i++)
        k[i] = (float)(i % 7) - 3.0f, v[i] = 0.5f * (float)(i % 5);
    /* step 1: tokens 0..2 into block 5; head 0's K max is 3, V max is 2 */
    int64_t slots[3] = {5 * bs + 0, 5 * bs + 1, 5 * bs + 2};
    assert_ok(kvc_attn_write_kv(&kv, slots, 3, k, v, &qs, KVC_ISA_AUTO));
    const float *sc = (const float *)kvc_pool_scale_data(pool, 5) + kvc_scale_floats_per_layer(&sh);
    assert_true(kam[2] == 3.0f && kam[3] == 3.0f && vam[2] == 2.0f && kam[0] == 0.0f);
    assert_true(sc[0] == 3.0f / 448.0f && sc[1] == 3.0f / 448.0f && sc[2] == 2.0f / 448.0f);
    /* layer 0's scales untouched */
    assert_true(((const float *)kvc_pool_scale_data(pool, 5))[0] == 0.0f);
    /* the stored codes are encode(x / scale), where the pool says they are */
    const uint8_t *krow = (const uint8_t *)kvc_pool_kv_data(pool, 5, 1, 0) + (1 * bs + 2) * d;
    for (uint32_t c = 0; c < d; c++)
        assert_int_equal(krow[c], kvc_fp8_e4m3_from_f32(k[(2 * H + 1) * d + c] / sc[1]));
    assert_int_equal(qs.k_stats.n_clipped, 0);
    assert_int_equal(qs.k_stats.n_values, 3 * H * d);
    /* step 2: a larger value in the same block clips (the block's scale is
     * fixed) and is counted; the running max grows */
    float k2[H * d], v2[H * d];
    for (uint32_t i = 0; i < H * d; i++) k2[i] = i == 3 ? 30.0f : 1.0f, v2[i] = 1.0f;
    int64_t s3 = 5 * bs + 3;
    assert_ok(kvc_attn_write_kv(&kv, &s3, 1, k2, v2, &qs, KVC_ISA_AUTO));
    assert_int_equal(qs.k_stats.n_clipped, 1);
    assert_true(sc[0] == 3.0f / 448.0f);
    assert_true(kam[2] == 30.0f);
    const uint8_t *k3 = (const uint8_t *)kvc_pool_kv_data(pool, 5, 1, 0) + 3 * d;
    assert_int_equal(k3[3], 0x7e); /* saturated at 448 */
    /* step 3: a new block takes the grown maximum */
    int64_t s4 = 2 * bs;
    assert_ok(kvc_attn_write_kv(&kv, &s4, 1, k2, v2, &qs, KVC_ISA_AUTO));
    const float *sc2 =
        (const float *)kvc_pool_scale_data(pool, 2) + kvc_scale_floats_per_layer(&sh);
    assert_true(sc2[0] == 30.0f / 448.0f);
    assert_int_equal(qs.k_stats.n_clipped, 1);
    /* given scales win over the running maxima */
    float given_k[4] = {1, 1, 0.5f, 0.25f}, given_v[4] = {1, 1, 2, 2};
    qs.k_scale = given_k, qs.v_scale = given_v;
    int64_t s5 = 3 * bs;
    assert_ok(kvc_attn_write_kv(&kv, &s5, 1, k2, v2, &qs, KVC_ISA_AUTO));
    const float *sc3 =
        (const float *)kvc_pool_scale_data(pool, 3) + kvc_scale_floats_per_layer(&sh);
    assert_true(sc3[0] == 0.5f && sc3[1] == 0.25f && sc3[2] == 2.0f);
    given_k[2] = 0.0f; /* bad given scale: refused, nothing written */
    uint8_t before[64];
    memcpy(before, kvc_pool_kv_data(pool, 4, 1, 0), 64);
    int64_t s6 = 4 * bs;
    assert_int_equal(kvc_attn_write_kv(&kv, &s6, 1, k2, v2, &qs, KVC_ISA_AUTO), KVC_EINVAL);
    assert_memory_equal(before, kvc_pool_kv_data(pool, 4, 1, 0), 64);
    /* slots out of range, missing V */
    int64_t bad = 8 * bs;
    qs.k_scale = qs.v_scale = NULL;
    assert_int_equal(kvc_attn_write_kv(&kv, &bad, 1, k2, v2, &qs, KVC_ISA_AUTO), KVC_EINVAL);
    assert_int_equal(kvc_attn_write_kv(&kv, &s6, 1, k2, NULL, &qs, KVC_ISA_AUTO), KVC_EINVAL);
    assert_int_equal(kvc_attn_write_kv(&kv, &s6, 1, k2, v2, NULL, KVC_ISA_AUTO), KVC_EINVAL);
    /* NaN and inf inputs: counted, NaN kept, inf saturated, maxima unharmed */
    k2[0] = NAN, k2[1] = INFINITY;
    assert_ok(kvc_attn_write_kv(&kv, &s6, 1, k2, v2, &qs, KVC_ISA_AUTO));
    assert_int_equal(qs.k_stats.n_nonfinite, 2);
    assert_true(isfinite(kam[2]));
    const uint8_t *k6 = kvc_pool_kv_data(pool, 4, 1, 0);
    assert_int_equal(k6[0], 0x7f);
    assert_int_equal(k6[1], 0x7e);
    kvc_pool_destroy(pool);
}

/* Per-channel keys and per-token values: keys use their channel's scale,
 * values never clip. */
static void channel_token_scales(void **state)
{
    (void)state;
    const uint32_t H = 1, d = 64, bs = 8;
    kvc_scale_shape_t sh = {.n_layers = 1,
                            .n_kv = 2,
                            .n_kv_heads = H,
                            .head_dim = d,
                            .block_size = bs,
                            .dtype = KVC_DTYPE_FP8_E5M2,
                            .layout = KVC_SCALE_CHANNEL_TOKEN};
    size_t bb = kvc_kv_block_bytes(&sh);
    uint8_t *buf = xalloc(bb * 2);
    memset(buf, 0, bb * 2);
    kvc_kv_view_t kv;
    assert_ok(kvc_kv_view_contiguous(buf, bb * 2, 2, &sh, 0, &kv));
    assert_int_equal(kvc_kv_view_contiguous(buf, bb, 2, &sh, 0, &kv), KVC_ERANGE);
    assert_ok(kvc_kv_view_contiguous(buf, bb * 2, 2, &sh, 0, &kv));
    float kam[64] = {0};
    kvc_kv_quant_t qs = {.k_amax = kam};
    float k[2 * 64], v[2 * 64];
    for (uint32_t i = 0; i < 2 * d; i++)
        k[i] = (float)((i % d) + 1), v[i] = i < d ? 1000.0f : 1e-3f * (float)i;
    int64_t slots[2] = {bs, bs + 1};
    assert_ok(kvc_attn_write_kv(&kv, slots, 2, k, v, &qs, KVC_ISA_AUTO));
    const float *sc = (const float *)(buf + bb + kv.scale_offset);
    for (uint32_t c = 0; c < d; c++) assert_true(sc[c] == (float)(c + 1) / 57344.0f);
    assert_true(sc[d + 0] == 1000.0f / 57344.0f);          /* token 0's V scale */
    assert_true(sc[d + 1] == (1e-3f * 127.0f) / 57344.0f); /* token 1's: its own max */
    assert_int_equal(qs.v_stats.n_clipped, 0);
    /* each key element is its channel's max: the format's max exactly */
    const uint8_t *kr = buf + bb + kv.k_offset;
    for (uint32_t c = 0; c < d; c++) assert_int_equal(kr[c], 0x7b);
    free(buf);
}

/* ---- argument checks ------------------------------------------------------------------------ */
static void bad_arguments_are_refused(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 10);
    uint32_t lens[2] = {20, 10}, T[2] = {3, 1};
    cache_cfg_t cf = {.dtype = KVC_DTYPE_BF16,
                      .n_kv_heads = 2,
                      .head_dim = 64,
                      .block_size = 16,
                      .n_seqs = 2,
                      .lens = lens,
                      .T = T,
                      .k_spread = 1.0f};
    cache_t c;
    cache_make(&c, &cf, &rng);
    kvc_attn_params_t p = kvc_attn_params_default();
    p.n_q_heads = 4;
    float q[4 * 4 * 64] = {0}, out[4 * 4 * 64];
    size_t wb = kvc_attn_workspace_bytes(&c.view, NULL);
    void *ws = xalloc(wb);
    assert_ok(kvc_attn_forward(&p, &c.view, &c.batch, q, out, ws, wb, 0, 100));
    assert_int_equal(kvc_attn_forward(&p, &c.view, &c.batch, q, out, ws, wb / 2, 0, 100),
                     KVC_EINVAL);
    assert_int_equal(kvc_attn_forward(&p, &c.view, &c.batch, NULL, out, ws, wb, 0, 100),
                     KVC_EINVAL);
    p.n_q_heads = 3; /* not a multiple of the KV heads */
    assert_int_equal(kvc_attn_forward(&p, &c.view, &c.batch, q, out, ws, wb, 0, 100), KVC_EINVAL);
    assert_int_equal(kvc_attn_n_items(&p, &c.view, &c.batch), 0);
    p.n_q_heads = 4;
    p.isa = (kvc_isa_t)99;
    assert_int_equal(kvc_attn_forward(&p, &c.view, &c.batch, q, out, ws, wb, 0, 100), KVC_EINVAL);
    p.isa = KVC_ISA_AUTO;
    c.kv_last_len[1] = 17; /* more than a block */
    assert_int_equal(kvc_attn_forward(&p, &c.view, &c.batch, q, out, ws, wb, 0, 100), KVC_EINVAL);
    c.kv_last_len[1] = 10;
    c.qo_indptr[1] = 21; /* T > S */
    c.qo_indptr[2] = 22;
    assert_int_equal(kvc_attn_forward(&p, &c.view, &c.batch, q, out, ws, wb, 0, 100), KVC_EINVAL);
    c.qo_indptr[1] = 3, c.qo_indptr[2] = 4;
    c.kv_indices[1] = c.n_blocks; /* out of range */
    assert_int_equal(kvc_attn_forward(&p, &c.view, &c.batch, q, out, ws, wb, 0, 100), KVC_EINVAL);
    c.kv_indices[1] = 1;
    /* nothing was written by the refused calls: a zero-item range writes nothing either */
    memset(out, 0x5a, sizeof out);
    assert_ok(kvc_attn_forward(&p, &c.view, &c.batch, q, out, ws, wb, 5, 5));
    assert_int_equal(((uint8_t *)out)[0], 0x5a);
    /* bad views */
    kvc_kv_view_t bad = c.view;
    bad.layer = 2;
    assert_int_equal(kvc_attn_forward(&p, &bad, &c.batch, q, out, ws, wb, 0, 100), KVC_EINVAL);
    kvc_scale_shape_t sh = c.shape;
    sh.layout = KVC_SCALE_HEAD; /* bf16 has no scales */
    assert_int_equal(kvc_kv_view_contiguous(c.buf, 1 << 20, 1, &sh, 0, &bad), KVC_EINVAL);
    /* the reference refuses what the kernels refuse, instead of reading through it */
    double ref[4 * 4 * 64];
    assert_ok(kvc_attn_reference(&p, &c.view, &c.batch, q, ref));
    bad = c.view;
    bad.base = NULL;
    assert_int_equal(kvc_attn_reference(&p, &bad, &c.batch, q, ref), KVC_EINVAL);
    bad = c.view;
    bad.layer = 2;
    assert_int_equal(kvc_attn_reference(&p, &bad, &c.batch, q, ref), KVC_EINVAL);
    kvc_attn_batch_t nb = c.batch;
    nb.kv_indptr = NULL;
    assert_int_equal(kvc_attn_reference(&p, &c.view, &nb, q, ref), KVC_EINVAL);
    nb = c.batch;
    nb.kv_last_len = NULL;
    assert_int_equal(kvc_attn_reference(&p, &c.view, &nb, q, ref), KVC_EINVAL);
    nb = c.batch;
    nb.kv_indices = NULL;
    assert_int_equal(kvc_attn_reference(&p, &c.view, &nb, q, ref), KVC_EINVAL);
    free(ws);
    cache_free(&c);
}

/* ---- which kernel runs ---------------------------------------------------------------- */
/* kvc_attn_kernel says what the dispatch does, on this CPU, for every forced ISA. */
static void kernel_choice_is_reported(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 12);
    uint32_t lens[1] = {20};
    cache_cfg_t cf = {.dtype = KVC_DTYPE_BF16,
                      .n_kv_heads = 1,
                      .head_dim = 64,
                      .block_size = 16,
                      .n_seqs = 1,
                      .lens = lens,
                      .k_spread = 1.0f};
    cache_t c;
    cache_make(&c, &cf, &rng);
    kvc_attn_params_t p = kvc_attn_params_default();
    kvc_attn_kernel_t k;
    p.isa = KVC_ISA_SCALAR;
    assert_ok(kvc_attn_kernel(&p, &c.view, NULL, &k));
    assert_int_equal(k, KVC_ATTN_KERNEL_SCALAR);
    /* AUTO: the best ISA, with BF16 dot products for bf16 storage only where the CPU has them */
    p.isa = KVC_ISA_AUTO;
    assert_ok(kvc_attn_kernel(&p, &c.view, NULL, &k));
    kvc_attn_kernel_t best = kvc_isa_best() == KVC_ISA_AVX512 ? KVC_ATTN_KERNEL_AVX512
                             : kvc_isa_best() == KVC_ISA_AVX2 ? KVC_ATTN_KERNEL_AVX2
                                                              : KVC_ATTN_KERNEL_SCALAR;
    const kvc_cpu_t *cpu = kvc_cpu();
    bool bf16_path = cpu->avx512 && cpu->avx512_bf16 && cpu->avx512_vbmi;
    assert_int_equal(k, best == KVC_ATTN_KERNEL_AVX512 && bf16_path ? KVC_ATTN_KERNEL_AVX512_BF16
                                                                    : best);
    p.compute = KVC_ATTN_COMPUTE_F32;
    assert_ok(kvc_attn_kernel(&p, &c.view, NULL, &k));
    assert_int_equal(k, best);
    /* a forced ISA this CPU lacks: what kvc_attn_forward says too */
    for (kvc_isa_t isa = KVC_ISA_SCALAR; isa < KVC_ISA__COUNT; isa++) {
        p.isa = isa;
        int rc = kvc_attn_kernel(&p, &c.view, NULL, &k);
        assert_int_equal(rc, kvc_isa_supported(isa) ? 0 : KVC_ENOTSUP);
        float q[64] = {0}, out[64];
        if (!kvc_isa_supported(isa)) assert_int_equal(run(&p, &c, q, out), KVC_ENOTSUP);
    }
    /* head dims the SIMD kernels do not take run scalar, whatever was asked */
    kvc_scale_shape_t sh = c.shape;
    sh.head_dim = 40;
    kvc_kv_view_t v40;
    size_t bb = kvc_kv_block_bytes(&sh);
    void *buf = xalloc(bb);
    assert_ok(kvc_kv_view_contiguous(buf, bb, 1, &sh, 0, &v40));
    p.isa = KVC_ISA_AUTO;
    assert_ok(kvc_attn_kernel(&p, &v40, NULL, &k));
    assert_int_equal(k, KVC_ATTN_KERNEL_SCALAR);
    free(buf);
    /* MLA dims must match the view; bad values are refused */
    kvc_mla_dims_t m = {
        .n_heads = 2, .kv_lora_rank = 32, .rope_dim = 32, .nope_dim = 16, .v_head_dim = 16};
    assert_int_equal(kvc_attn_kernel(&p, &c.view, &m, &k), KVC_EINVAL); /* n_kv = 2 */
    p.isa = (kvc_isa_t)99;
    assert_int_equal(kvc_attn_kernel(&p, &c.view, NULL, &k), KVC_EINVAL);
    p.isa = KVC_ISA_AUTO;
    p.compute = (kvc_attn_compute_t)7;
    assert_int_equal(kvc_attn_kernel(&p, &c.view, NULL, &k), KVC_EINVAL);
    assert_int_equal(kvc_attn_kernel(NULL, &c.view, NULL, &k), KVC_EINVAL);
    assert_int_equal(kvc_attn_kernel(&p, &c.view, NULL, NULL), KVC_EINVAL);
    assert_string_equal(kvc_attn_kernel_name(KVC_ATTN_KERNEL_AVX512_BF16), "avx512-bf16");
    assert_string_equal(kvc_attn_kernel_name(KVC_ATTN_KERNEL__COUNT), "?");
    cache_free(&c);
}

/* A variant this CPU lacks: forcing its ISA fails with KVC_ENOTSUP everywhere (and the BF16
 * path, on an AVX-512 CPU without it, is reported as the fp32 kernel it falls back to). */
static void missing_variant_is_refused(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 13);
    uint32_t lens[1] = {9};
    cache_cfg_t cf = {.dtype = KVC_DTYPE_BF16,
                      .n_kv_heads = 1,
                      .head_dim = 64,
                      .block_size = 16,
                      .n_seqs = 1,
                      .lens = lens,
                      .k_spread = 1.0f};
    cache_t c;
    const kvc_test_variant_t *v = variant;
    variant = NULL; /* write the cache with AUTO */
    cache_make(&c, &cf, &rng);
    variant = v;
    kvc_attn_params_t p = kvc_attn_params_default();
    p.isa = v->isa;
    p.compute = v->compute;
    kvc_attn_kernel_t k;
    float q[64] = {0}, out[64], kv[64] = {0};
    int64_t slot = 12;
    if (!kvc_isa_supported(v->isa)) {
        assert_int_equal(kvc_attn_kernel(&p, &c.view, NULL, &k), KVC_ENOTSUP);
        assert_int_equal(run(&p, &c, q, out), KVC_ENOTSUP);
        assert_int_equal(kvc_attn_write_kv(&c.view, &slot, 1, kv, kv, NULL, v->isa), KVC_ENOTSUP);
    } else {
        assert_ok(kvc_attn_kernel(&p, &c.view, NULL, &k));
        assert_int_equal(k, KVC_ATTN_KERNEL_AVX512);
    }
    cache_free(&c);
}

int main(int argc, char **argv)
{
    static const char *const names[] = {"scalar", "avx2", "avx512", "avx512-bf16", NULL};
    int rc = kvc_test_variant_parse(argc, argv, names, &variant);
    if (rc) return rc;
    if (!variant) {
        const struct CMUnitTest common[] = {
            cmocka_unit_test(top_left_mask_gives_a_different_wrong_answer),
            cmocka_unit_test(write_sets_block_scales_and_counts_clipping),
            cmocka_unit_test(channel_token_scales),
            cmocka_unit_test(bad_arguments_are_refused),
            cmocka_unit_test(kernel_choice_is_reported),
        };
        return cmocka_run_group_tests_name("attn", common, NULL, NULL);
    }
    char group[64], why[160];
    snprintf(group, sizeof group, "attn.%s", variant->name);
    if (kvc_test_variant_missing(variant, why, sizeof why)[0]) {
        const struct CMUnitTest refused[] = {cmocka_unit_test(missing_variant_is_refused)};
        if ((rc = cmocka_run_group_tests_name(group, refused, NULL, NULL))) return rc;
        return kvc_test_variant_skip("attn", variant);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(decode_matches_reference),
        cmocka_unit_test(decode_many_heads_in_one_item),
        cmocka_unit_test(prefill_uses_absolute_positions),
        cmocka_unit_test(sliding_window_and_softcap),
        cmocka_unit_test(online_softmax_handles_wide_logit_ranges),
        cmocka_unit_test(paged_equals_contiguous_bitwise),
        cmocka_unit_test(packing_and_work_split_do_not_change_results),
        cmocka_unit_test(batch_invariant_rows_do_not_depend_on_the_batch),
        cmocka_unit_test(tiny_sequences),
        cmocka_unit_test(odd_head_dims_fall_back_to_scalar),
    };
    if ((rc = cmocka_run_group_tests_name(group, tests, NULL, NULL))) return rc;
    return kvc_test_kernel_report("attn", variant, &kernels);
}
