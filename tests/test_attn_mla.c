/* test_attn_mla.c - MLA decode in the absorbed form against the unabsorbed
 * computation: the test up-projects the stored latent cache to per-head
 * keys [W_UK_h c_t ; k_rope_t] and values W_UV_h c_t and runs ordinary
 * attention in double precision; kvc_attn_mla absorbs W_UK into the query,
 * attends over the latent once for all heads and up-projects the result.
 *
 * Error measure: per (token, head) output row, |out - ref|_2 divided by the
 * RMS norm of the reference rows.  Tolerances:
 *   fp32 products:  1e-5  (the same sums in another order; observed 2.3e-6);
 *   BF16 products:  3e-2  against the unabsorbed form - the absorbed query
 *     q~ (512 wide) is rounded to bf16 (u = 2^-8) before its dot products
 *     with the latent, which moves each logit by ~u |q~||c| / sqrt(512), and
 *     the weights are rounded too (observed up to 1.3e-2);
 *   and 1e-2 against the absorbed computation with the query's rounding
 *     emulated (reference on bf16(q~ sm)), which leaves the weights'
 *     rounding, each weight within u (observed up to 3.3e-3).
 * The storage's rounding is not an error here: both sides read the stored
 * latent. */
#include "test_helpers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn/attn_int.h"
#include "isa_variant.h"

/* The variant this run is about (--isa NAME; isa_variant.h), or NULL for the ISA-independent
 * checks, and how many cases ran each kernel. */
static const kvc_test_variant_t *variant;
static kvc_test_kernel_count_t kernels;

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

typedef struct {
    kvc_mla_dims_t m;
    kvc_dtype_t dtype;
    kvc_scale_layout_t layout;
    uint32_t block_size, n_seqs;
    const uint32_t *lens, *T;
} mcase_t;

/* Stored latent row of token t (decoded, scaled) into out[dk]. */
static void latent_row(const kvc_kv_view_t *kv, const uint32_t *blocks, int64_t t, double *out)
{
    uint32_t bs = kv->shape.block_size, d = kv->shape.head_dim;
    uint32_t blk = blocks[t / bs], off = (uint32_t)(t % bs);
    kvc__tok_scales_t ts = kvc__tok_scales(kv, kvc__scales(kv, blk), 0, off);
    float *row = malloc(sizeof(float) * d);
    assert_ok(kvc_dequantize(kv->shape.dtype, row, kvc__row(kv, blk, 0, off, 0), d, 1.0f, NULL));
    for (uint32_t c = 0; c < d; c++) out[c] = (double)row[c] * (ts.kc ? ts.kc[c] : ts.k);
    free(row);
}

static void run_case(const mcase_t *mc, kvc_rng_t *rng)
{
    const kvc_mla_dims_t *m = &mc->m;
    const uint32_t H = m->n_heads, r = m->kv_lora_rank, R = m->rope_dim, N = m->nope_dim,
                   V = m->v_head_dim, dk = r + R, bs = mc->block_size;
    kvc_scale_shape_t sh = {.n_layers = 1,
                            .n_kv = 1,
                            .n_kv_heads = 1,
                            .head_dim = dk,
                            .block_size = bs,
                            .dtype = mc->dtype,
                            .layout = mc->layout};
    uint32_t *indptr = calloc(mc->n_seqs + 1, 4), *qo = calloc(mc->n_seqs + 1, 4);
    uint32_t *last = calloc(mc->n_seqs, 4);
    for (uint32_t s = 0; s < mc->n_seqs; s++) {
        uint32_t nb = (mc->lens[s] + bs - 1) / bs;
        indptr[s + 1] = indptr[s] + nb;
        last[s] = mc->lens[s] - (nb - 1) * bs;
        qo[s + 1] = qo[s] + (mc->T ? mc->T[s] : 1);
    }
    const uint32_t nblk = indptr[mc->n_seqs] + 2, rows = qo[mc->n_seqs];
    uint32_t *idx = malloc(sizeof(uint32_t) * nblk);
    for (uint32_t b = 0; b < indptr[mc->n_seqs]; b++) idx[b] = nblk - 1 - b; /* reversed: paged */
    size_t bb = kvc_kv_block_bytes(&sh);
    uint8_t *buf = xalloc(bb * nblk);
    memset(buf, 0, bb * nblk);
    kvc_kv_view_t kv;
    assert_ok(kvc_kv_view_contiguous(buf, bb * nblk, nblk, &sh, 0, &kv));
    /* latent rows: c with a few larger channels, rope part */
    float *kamax = calloc(kvc_kv_quant_len(&sh, false) + 1, sizeof(float));
    kvc_kv_quant_t qs = {.k_amax = kamax};
    for (uint32_t s = 0; s < mc->n_seqs; s++) {
        uint32_t S = mc->lens[s];
        float *lat = malloc(sizeof(float) * S * dk);
        int64_t *slots = malloc(sizeof(int64_t) * S);
        for (uint32_t t = 0; t < S; t++) {
            slots[t] = idx[indptr[s] + t / bs] * bs + t % bs;
            for (uint32_t c = 0; c < dk; c++)
                lat[(size_t)t * dk + c] = randn(rng) * (c % 61 == 3 ? 8.0f : 1.0f);
        }
        assert_ok(kvc_attn_write_kv(&kv, slots, S, lat, NULL, &qs,
                                    variant ? variant->isa : KVC_ISA_AUTO));
        free(lat), free(slots);
    }
    kvc_attn_batch_t batch = {.n_seqs = mc->n_seqs,
                              .kv_indptr = indptr,
                              .kv_indices = idx,
                              .kv_last_len = last,
                              .qo_indptr = mc->T ? qo : NULL};
    /* weights and queries, scaled so that logits are O(1..3) */
    float *wuk = malloc(sizeof(float) * H * N * r), *wuv = malloc(sizeof(float) * H * V * r);
    float *qn = malloc(sizeof(float) * rows * H * N), *qr = malloc(sizeof(float) * rows * H * R);
    for (size_t i = 0; i < (size_t)H * N * r; i++) wuk[i] = randn(rng) / sqrtf((float)r);
    for (size_t i = 0; i < (size_t)H * V * r; i++) wuv[i] = randn(rng) / sqrtf((float)r);
    for (size_t i = 0; i < (size_t)rows * H * N; i++) qn[i] = 1.5f * randn(rng);
    for (size_t i = 0; i < (size_t)rows * H * R; i++) qr[i] = 1.5f * randn(rng);
    const double sm = 1.0 / sqrt((double)(N + R));
    size_t wb = kvc_attn_workspace_bytes(&kv, m);
    void *ws = xalloc(wb);
    float *out = malloc(sizeof(float) * rows * H * V);
    if (variant) { /* the variant's kernel against the unabsorbed computation */

        /* the kernel this variant runs here, as attn.h describes the choice: the BF16 path for
         * bf16 and FP8 latents, the scalar kernel for dims that are not multiples of 32 */
        kvc_attn_params_t p = kvc_attn_params_default();
        p.isa = variant->isa;
        p.compute = variant->compute;
        kvc_attn_kernel_t kern, want = variant->kernel;
        assert_ok(kvc_attn_kernel(&p, &kv, m, &kern));
        if (dk % 32 || r % 32)
            want = KVC_ATTN_KERNEL_SCALAR;
        else if (want == KVC_ATTN_KERNEL_AVX512_BF16 && mc->dtype != KVC_DTYPE_BF16 &&
                 mc->dtype != KVC_DTYPE_FP8_E4M3 && mc->dtype != KVC_DTYPE_FP8_E5M2)
            want = KVC_ATTN_KERNEL_AVX512;
        if (kern != want)
            fail_msg("%s over %s: %s ran, want %s", variant->name, kvc_dtype_name(mc->dtype),
                     kvc_attn_kernel_name(kern), kvc_attn_kernel_name(want));
        kernels.ran[kern]++;
        const bool b16 = kern == KVC_ATTN_KERNEL_AVX512_BF16;

        /* the unabsorbed computation, in double */
        double *ref = malloc(sizeof(double) * rows * H * V);
        double *cr = malloc(sizeof(double) * dk);
        for (uint32_t s = 0; s < mc->n_seqs; s++) {
            uint32_t S = mc->lens[s], T = mc->T ? mc->T[s] : 1;
            const uint32_t *blocks = idx + indptr[s];
            double *K = malloc(sizeof(double) * S * H * (N + R)),
                   *Vv = malloc(sizeof(double) * S * H * V);
            for (uint32_t t = 0; t < S; t++) {
                latent_row(&kv, blocks, t, cr);
                for (uint32_t h = 0; h < H; h++) {
                    double *k = K + ((size_t)t * H + h) * (N + R),
                           *v = Vv + ((size_t)t * H + h) * V;
                    for (uint32_t a = 0; a < N; a++) {
                        double acc = 0;
                        for (uint32_t j = 0; j < r; j++)
                            acc += (double)wuk[((size_t)h * N + a) * r + j] * cr[j];
                        k[a] = acc;
                    }
                    for (uint32_t a = 0; a < R; a++) k[N + a] = cr[r + a];
                    for (uint32_t e = 0; e < V; e++) {
                        double acc = 0;
                        for (uint32_t j = 0; j < r; j++)
                            acc += (double)wuv[((size_t)h * V + e) * r + j] * cr[j];
                        v[e] = acc;
                    }
                }
            }
            for (uint32_t i = 0; i < T; i++) {
                uint32_t row = qo[s] + i;
                int64_t pos = (int64_t)S - T + i;
                for (uint32_t h = 0; h < H; h++) {
                    double *z = malloc(sizeof(double) * (size_t)(pos + 1)), mx = -INFINITY, sum = 0;
                    for (int64_t t = 0; t <= pos; t++) {
                        const double *k = K + ((size_t)t * H + h) * (N + R);
                        double acc = 0;
                        for (uint32_t a = 0; a < N; a++)
                            acc += (double)qn[((size_t)row * H + h) * N + a] * k[a];
                        for (uint32_t a = 0; a < R; a++)
                            acc += (double)qr[((size_t)row * H + h) * R + a] * k[N + a];
                        z[t] = acc * sm;
                        mx = fmax(mx, z[t]);
                    }
                    double *o = ref + ((size_t)row * H + h) * V;
                    for (uint32_t e = 0; e < V; e++) o[e] = 0;
                    for (int64_t t = 0; t <= pos; t++) {
                        double w = exp(z[t] - mx);
                        sum += w;
                        for (uint32_t e = 0; e < V; e++)
                            o[e] += w * Vv[((size_t)t * H + h) * V + e];
                    }
                    for (uint32_t e = 0; e < V; e++) o[e] /= sum;
                    free(z);
                }
            }
            free(K), free(Vv);
        }
        double rms = 0;
        for (size_t i = 0; i < (size_t)rows * H * V; i++) rms += ref[i] * ref[i];
        rms = sqrt(rms / ((double)rows * H));

        /* the absorbed computation with the BF16 kernel's roundings emulated:
         * q~ as the library computes it, times sm, to bf16; the reference over
         * the latent view (its "V" is the whole latent row) then W_UV */
        double *emu = NULL;
        if (b16 && mc->layout != KVC_SCALE_CHANNEL_TOKEN) {
            float *qa = malloc(sizeof(float) * rows * H * dk);
            for (uint32_t row = 0; row < rows; row++)
                for (uint32_t h = 0; h < H; h++) {
                    float *x = qa + ((size_t)row * H + h) * dk;
                    for (uint32_t j = 0; j < r; j++) x[j] = 0.0f;
                    for (uint32_t a = 0; a < N; a++) {
                        const float qv = qn[((size_t)row * H + h) * N + a],
                                    *w = wuk + ((size_t)h * N + a) * r;
                        for (uint32_t j = 0; j < r; j++) x[j] += qv * w[j];
                    }
                    memcpy(x + r, qr + ((size_t)row * H + h) * R, sizeof(float) * R);
                    const float smf = 1.0f / sqrtf((float)(N + R));
                    for (uint32_t j = 0; j < dk; j++)
                        x[j] = kvc_bf16_to_f32(kvc_bf16_from_f32(x[j] * smf));
                }
            double *lat = malloc(sizeof(double) * rows * H * dk);
            kvc_attn_params_t rp = kvc_attn_params_default();
            rp.n_q_heads = H;
            rp.sm_scale = 1.0f;
            assert_ok(kvc_attn_reference(&rp, &kv, &batch, qa, lat));
            emu = malloc(sizeof(double) * rows * H * V);
            for (uint32_t row = 0; row < rows; row++)
                for (uint32_t h = 0; h < H; h++)
                    for (uint32_t e = 0; e < V; e++) {
                        double acc = 0;
                        for (uint32_t j = 0; j < r; j++)
                            acc += (double)wuv[((size_t)h * V + e) * r + j] *
                                   lat[((size_t)row * H + h) * dk + j];
                        emu[((size_t)row * H + h) * V + e] = acc;
                    }
            free(qa), free(lat);
        }

        /* the variant's kernel; two halves of the items, as two threads would run them */
        uint32_t ni = kvc_attn_mla_n_items(&p, m, &kv, &batch);
        assert_true(ni > 0);
        memset(out, 0xff, sizeof(float) * rows * H * V);
        assert_ok(kvc_attn_mla(&p, m, &kv, &batch, qn, qr, wuk, wuv, out, ws, wb, 0, ni / 2));
        assert_ok(kvc_attn_mla(&p, m, &kv, &batch, qn, qr, wuk, wuv, out, ws, wb, ni / 2, ni));
        double worst = 0, worst_emu = 0;
        for (uint32_t i = 0; i < rows * H; i++) {
            double e2 = 0, f2 = 0;
            for (uint32_t e = 0; e < V; e++) {
                double d = (double)out[(size_t)i * V + e] - ref[(size_t)i * V + e];
                e2 += d * d;
                if (emu) d = (double)out[(size_t)i * V + e] - emu[(size_t)i * V + e], f2 += d * d;
            }
            if (!(sqrt(e2) / rms <= worst)) worst = sqrt(e2) / rms;
            if (!(sqrt(f2) / rms <= worst_emu)) worst_emu = sqrt(f2) / rms;
        }
        double tol = b16 ? 3e-2 : 1e-5;
        if (getenv("KVC_TEST_VERBOSE"))
            print_message("mla H%u r%u %s %s %s: %.2e (emulated %.2e)\n", H, r,
                          kvc_dtype_name(mc->dtype), kvc_scale_layout_name(mc->layout),
                          kvc_attn_kernel_name(kern), worst, worst_emu);
        if (!(worst <= tol))
            fail_msg("mla H=%u r=%u %s %s: %s error %.3g > %.3g", H, r, kvc_dtype_name(mc->dtype),
                     kvc_scale_layout_name(mc->layout), kvc_attn_kernel_name(kern), worst, tol);
        if (b16 && emu && !(worst_emu <= 1e-2)) fail_msg("mla bf16 vs emulated: %.3g", worst_emu);
        free(ref), free(emu), free(cr);
    }
    /* argument checks */
    kvc_attn_params_t pa = kvc_attn_params_default();
    assert_int_equal(kvc_attn_mla(&pa, m, &kv, &batch, qn, qr, wuk, wuv, out, ws, wb / 3, 0, 1),
                     KVC_EINVAL);
    kvc_mla_dims_t bad = *m;
    bad.rope_dim += 1;
    assert_int_equal(kvc_attn_mla(&pa, &bad, &kv, &batch, qn, qr, wuk, wuv, out, ws, wb, 0, 1),
                     KVC_EINVAL);
    kvc_attn_kernel_t kk;
    assert_int_equal(kvc_attn_kernel(&pa, &kv, &bad, &kk), KVC_EINVAL);
    for (kvc_isa_t isa = KVC_ISA_SCALAR; isa < KVC_ISA__COUNT; isa++)
        if (!kvc_isa_supported(isa)) {
            pa.isa = isa;
            assert_int_equal(kvc_attn_kernel(&pa, &kv, m, &kk), KVC_ENOTSUP);
            assert_int_equal(kvc_attn_mla(&pa, m, &kv, &batch, qn, qr, wuk, wuv, out, ws, wb, 0, 1),
                             KVC_ENOTSUP);
        }
    free(ws), free(out), free(wuk), free(wuv), free(qn), free(qr);
    free(kamax), free(buf), free(idx), free(indptr), free(qo), free(last);
}

static void absorbed_equals_unabsorbed_deepseek_dims(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 21);
    /* DeepSeek-V2/V3: latent 512 + RoPE 64, nope 128, v 128 */
    uint32_t lens[2] = {KVC_TEST_SANITIZED ? 20 : 75, 33};
    const kvc_dtype_t dts[] = {KVC_DTYPE_F32, KVC_DTYPE_BF16, KVC_DTYPE_FP8_E4M3,
                               KVC_DTYPE_FP8_E4M3};
    const kvc_scale_layout_t lays[] = {KVC_SCALE_NONE, KVC_SCALE_NONE, KVC_SCALE_TENSOR,
                                       KVC_SCALE_CHANNEL_TOKEN};
    for (int i = 0; i < 4; i++) {
        mcase_t mc = {.m = {.n_heads = 16,
                            .kv_lora_rank = 512,
                            .rope_dim = 64,
                            .nope_dim = 128,
                            .v_head_dim = 128},
                      .dtype = dts[i],
                      .layout = lays[i],
                      .block_size = 16,
                      .n_seqs = 2,
                      .lens = lens};
        run_case(&mc, &rng);
    }
}

static void absorbed_equals_unabsorbed_many_heads_and_chunks(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 22);
    /* 80 heads: more than one item's rows per query; chunked queries */
    uint32_t lens[3] = {40, 9, 70}, T[3] = {2, 9, 1};
    mcase_t mc = {
        .m = {.n_heads = 80, .kv_lora_rank = 64, .rope_dim = 32, .nope_dim = 32, .v_head_dim = 32},
        .dtype = KVC_DTYPE_FP8_E5M2,
        .layout = KVC_SCALE_HEAD,
        .block_size = 8,
        .n_seqs = 3,
        .lens = lens,
        .T = T};
    run_case(&mc, &rng);
    /* no RoPE part, f16 latent with per-channel scales, one-token blocks */
    uint32_t lens2[2] = {KVC_TEST_SANITIZED ? 30 : 120, 1};
    mcase_t mc2 = {
        .m = {.n_heads = 4, .kv_lora_rank = 128, .rope_dim = 0, .nope_dim = 64, .v_head_dim = 48},
        .dtype = KVC_DTYPE_F16,
        .layout = KVC_SCALE_CHANNEL_TOKEN,
        .block_size = 1,
        .n_seqs = 2,
        .lens = lens2};
    run_case(&mc2, &rng);
}

int main(int argc, char **argv)
{
    static const char *const names[] = {"scalar", "avx2", "avx512", "avx512-bf16", NULL};
    int rc = kvc_test_variant_parse(argc, argv, names, &variant);
    if (rc) return rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(absorbed_equals_unabsorbed_deepseek_dims),
        cmocka_unit_test(absorbed_equals_unabsorbed_many_heads_and_chunks),
    };
    /* without a variant: the same cases, their argument checks only */
    if (!variant) return cmocka_run_group_tests_name("attn_mla", tests, NULL, NULL);
    char group[64], why[160];
    snprintf(group, sizeof group, "attn_mla.%s", variant->name);
    if (kvc_test_variant_missing(variant, why, sizeof why)[0]) {
        /* the argument checks (KVC_ENOTSUP for an ISA this CPU lacks) still run */
        const kvc_test_variant_t *v = variant;
        variant = NULL;
        if ((rc = cmocka_run_group_tests_name(group, tests, NULL, NULL))) return rc;
        return kvc_test_variant_skip("attn_mla", v);
    }
    if ((rc = cmocka_run_group_tests_name(group, tests, NULL, NULL))) return rc;
    return kvc_test_kernel_report("attn_mla", variant, &kernels);
}
