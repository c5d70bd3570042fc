/* accuracy_attn.c - how much KV storage formats and scale layouts change
 * attention outputs, as a function of context length.
 *
 * For contexts of 1K .. 128K tokens it builds one synthetic layer with the
 * statistics of real keys and values:
 *   keys:   a per-channel offset plus Student-t noise (8 degrees of freedom),
 *           4 of every 128 channels 16x larger (the "outlier channels" of
 *           KIVI / KVQuant), one token in 1000 4x larger, and magnitudes that
 *           drift up 40% over 128K tokens (so early calibration goes stale);
 *   values: Gaussian with a per-token scale (log-normal, sigma 0.5) and rare
 *           8x spikes;
 *   queries: a mix of a random direction and the direction of a few past
 *           keys, scaled so logits have a standard deviation near 3, so
 *           attention is peaked the way trained models' is.
 * It writes the tokens through kvc_attn_write_kv as a serving engine would
 * (a 1K-token prefill, then one token per step), so block scales are fixed
 * when blocks begin and later values can clip; then runs decode for a few
 * queries at the end and compares with the reference computed in double
 * precision from the unquantised fp32 K/V.
 *
 * Variants: each storage type (f32, f16, bf16, fp8-e4m3, fp8-e5m2) with the
 * scale layouts it takes, scales from the running maximum with headroom 1
 * or 4 ("hr4"); per-tensor scales calibrated on the prefill and frozen (a
 * static calibration); and compute AUTO ("auto": the BF16 dot-product
 * kernel where the CPU has AVX512-BF16) against fp32 products for bf16 /
 * FP8 storage.  Every row is labelled with the kernel that ran
 * (kvc_attn_kernel), not the one asked for: on a CPU without AVX512-BF16 an
 * "auto" row ran fp32 products and equals its fp32 twin.
 *
 * Output: a table (relative L2 error of the attention output, mean and max
 * over query rows, and the fraction of values clipped) and a CSV file with
 * the kernel in its own column.
 *
 *   accuracy_attn [--quick] [--csv FILE] [--max-ctx TOKENS]
 */
#include "kvcache/kvcache.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define D       128
#define KVH     2
#define G       4
#define HQ      (KVH * G)
#define BLOCK   16
#define NQ      4 /* decode queries per context */
#define PREFILL 1024

static double randn(kvc_rng_t *r)
{
    double u1 = kvc_rng_double(r), u2 = kvc_rng_double(r);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
}

/* Student t with 8 degrees of freedom, scaled to unit variance: a little
 * heavier-tailed than Gaussian, as activations are. */
static double student8(kvc_rng_t *r)
{
    double z = randn(r), c = 0;
    for (int i = 0; i < 8; i++) {
        double x = randn(r);
        c += x * x;
    }
    return z / sqrt(c / 8.0) / sqrt(8.0 / 6.0);
}

typedef struct {
    uint32_t S;
    float *k, *v; /* (S, KVH, D) */
    float *q;     /* (NQ, HQ, D) */
} data_t;

static void make_data(data_t *d, uint32_t S, uint64_t seed)
{
    kvc_rng_t r;
    kvc_rng_seed(&r, seed);
    d->S = S;
    d->k = malloc(sizeof(float) * S * KVH * D);
    d->v = malloc(sizeof(float) * S * KVH * D);
    d->q = malloc(sizeof(float) * NQ * HQ * D);
    float ch_scale[KVH][D], ch_mean[KVH][D];
    for (int h = 0; h < KVH; h++)
        for (int c = 0; c < D; c++) {
            ch_scale[h][c] = (c % 32 == 7) ? 16.0f : 1.0f;
            ch_mean[h][c] = (float)(0.5 * randn(&r));
        }
    for (uint32_t t = 0; t < S; t++) {
        /* keys drift up by ~40% over 128K tokens; one token in 1000 is 4x
         * larger ("massive activations"); values vary per token */
        double drift =
            (1.0 + 0.4 * (double)t / 131072.0) * (kvc_rng_below(&r, 1000) == 0 ? 4.0 : 1.0);
        double vs = exp(0.5 * randn(&r)) * (kvc_rng_below(&r, 1000) == 0 ? 8.0 : 1.0);
        for (int h = 0; h < KVH; h++)
            for (int c = 0; c < D; c++) {
                size_t i = ((size_t)t * KVH + h) * D + c;
                d->k[i] = (float)(ch_scale[h][c] * (ch_mean[h][c] + student8(&r)) * drift);
                d->v[i] = (float)(vs * randn(&r));
            }
    }
    /* queries: half a random direction, half the direction of 3 past keys */
    for (int n = 0; n < NQ; n++)
        for (int hq = 0; hq < HQ; hq++) {
            int h = hq / G;
            double qv[D], norm = 0;
            for (int c = 0; c < D; c++) qv[c] = randn(&r) / ch_scale[h][c];
            for (int j = 0; j < 3; j++) {
                uint32_t t = (uint32_t)kvc_rng_below(&r, S);
                const float *kr = d->k + ((size_t)t * KVH + h) * D;
                for (int c = 0; c < D; c++)
                    qv[c] += kr[c] / (ch_scale[h][c] * ch_scale[h][c]) * 0.5;
            }
            /* logit std ~ 3: q.k / sqrt(D) with k of per-channel std ch_scale */
            for (int c = 0; c < D; c++) norm += qv[c] * qv[c] * ch_scale[h][c] * ch_scale[h][c];
            double g = 3.0 * sqrt((double)D) / sqrt(norm);
            for (int c = 0; c < D; c++) d->q[((size_t)n * HQ + hq) * D + c] = (float)(qv[c] * g);
        }
}

static void free_data(data_t *d)
{
    free(d->k), free(d->v), free(d->q);
}

typedef struct {
    const char *name;
    kvc_dtype_t dtype;
    kvc_scale_layout_t layout;
    bool calibrated; /* per-tensor scales from the prefill, then frozen */
    kvc_attn_compute_t compute;
    float headroom; /* running-max scales: amax * headroom / format max */
} variant_t;

typedef struct {
    double mean_rel, max_rel, clipped;
} result_t;

/* Write the data into a fresh cache with the variant's format; run decode
 * for NQ queries (sequences sharing the cache's blocks).  *kernel: the one
 * that ran. */
static int run_variant(const variant_t *va, const data_t *d, float *out, double *clip_frac,
                       kvc_attn_kernel_t *kernel)
{
    const uint32_t S = d->S, nb = (S + BLOCK - 1) / BLOCK;
    kvc_scale_shape_t sh = {.n_layers = 1,
                            .n_kv = 2,
                            .n_kv_heads = KVH,
                            .head_dim = D,
                            .block_size = BLOCK,
                            .dtype = va->dtype,
                            .layout = va->layout};
    size_t bb = kvc_kv_block_bytes(&sh);
    uint8_t *buf = aligned_alloc(64, bb * nb);
    if (!buf) return KVC_ENOMEM;
    memset(buf, 0, bb * nb);
    kvc_kv_view_t kv;
    int rc = kvc_kv_view_contiguous(buf, bb * nb, nb, &sh, 0, &kv);
    if (rc) return free(buf), rc;
    size_t nk = kvc_kv_quant_len(&sh, false), nv = kvc_kv_quant_len(&sh, true);
    float *kam = calloc(nk + 1, sizeof(float)), *vam = calloc(nv + 1, sizeof(float));
    float *kgiven = calloc(nk + 1, sizeof(float)), *vgiven = calloc(nv + 1, sizeof(float));
    kvc_kv_quant_t qs = {.k_amax = kam, .v_amax = vam, .headroom = va->headroom};
    if (va->calibrated) {
        /* static calibration: the prefill's maxima, then never updated */
        float ka = 0, vmx = 0;
        for (size_t i = 0; i < (size_t)KVC_MIN(S, PREFILL) * KVH * D; i++)
            ka = fmaxf(ka, fabsf(d->k[i])), vmx = fmaxf(vmx, fabsf(d->v[i]));
        kgiven[0] = kvc_scale_from_amax(va->dtype, ka, 1.0f);
        vgiven[0] = kvc_scale_from_amax(va->dtype, vmx, 1.0f);
        qs.k_scale = kgiven, qs.v_scale = vgiven;
    }
    int64_t *slots = malloc(sizeof(int64_t) * S);
    for (uint32_t t = 0; t < S; t++) slots[t] = t;
    /* prefill, then token by token */
    uint32_t first = KVC_MIN(S, PREFILL);
    rc = kvc_attn_write_kv(&kv, slots, first, d->k, d->v, &qs, KVC_ISA_AUTO);
    for (uint32_t t = first; t < S && !rc; t++)
        rc = kvc_attn_write_kv(&kv, slots + t, 1, d->k + (size_t)t * KVH * D,
                               d->v + (size_t)t * KVH * D, &qs, KVC_ISA_AUTO);
    *clip_frac = (double)(qs.k_stats.n_clipped + qs.v_stats.n_clipped) /
                 (double)(qs.k_stats.n_values + qs.v_stats.n_values);
    uint32_t *idx = malloc(sizeof(uint32_t) * nb);
    for (uint32_t b = 0; b < nb; b++) idx[b] = b;
    uint32_t indptr[NQ + 1], last[NQ];
    for (int n = 0; n <= NQ; n++) indptr[n] = 0;
    /* NQ sequences over the same blocks: index arrays repeat */
    uint32_t *idx4 = malloc(sizeof(uint32_t) * nb * NQ);
    for (int n = 0; n < NQ; n++) {
        memcpy(idx4 + (size_t)n * nb, idx, sizeof(uint32_t) * nb);
        indptr[n + 1] = indptr[n] + nb;
        last[n] = S - (nb - 1) * BLOCK;
    }
    kvc_attn_batch_t batch = {
        .n_seqs = NQ, .kv_indptr = indptr, .kv_indices = idx4, .kv_last_len = last};
    kvc_attn_params_t p = kvc_attn_params_default();
    p.n_q_heads = HQ;
    p.compute = va->compute;
    size_t wb = kvc_attn_workspace_bytes(&kv, NULL);
    void *ws = aligned_alloc(64, wb);
    if (!rc) rc = kvc_attn_kernel(&p, &kv, NULL, kernel);
    if (!rc) rc = kvc_attn_forward(&p, &kv, &batch, d->q, out, ws, wb, 0, UINT32_MAX);
    free(ws), free(idx), free(idx4), free(slots), free(kam), free(vam), free(kgiven), free(vgiven),
        free(buf);
    return rc;
}

/* The reference: double-precision attention over the unquantised fp32 K/V. */
static int reference(const data_t *d, double *ref)
{
    const uint32_t S = d->S, nb = (S + BLOCK - 1) / BLOCK;
    kvc_scale_shape_t sh = {.n_layers = 1,
                            .n_kv = 2,
                            .n_kv_heads = KVH,
                            .head_dim = D,
                            .block_size = BLOCK,
                            .dtype = KVC_DTYPE_F32};
    size_t bb = kvc_kv_block_bytes(&sh);
    uint8_t *buf = aligned_alloc(64, bb * nb);
    kvc_kv_view_t kv;
    int rc = kvc_kv_view_contiguous(buf, bb * nb, nb, &sh, 0, &kv);
    int64_t *slots = malloc(sizeof(int64_t) * S);
    for (uint32_t t = 0; t < S; t++) slots[t] = t;
    if (!rc) rc = kvc_attn_write_kv(&kv, slots, S, d->k, d->v, NULL, KVC_ISA_AUTO);
    uint32_t *idx = malloc(sizeof(uint32_t) * nb * NQ), indptr[NQ + 1] = {0}, last[NQ];
    for (int n = 0; n < NQ; n++) {
        for (uint32_t b = 0; b < nb; b++) idx[(size_t)n * nb + b] = b;
        indptr[n + 1] = indptr[n] + nb;
        last[n] = S - (nb - 1) * BLOCK;
    }
    kvc_attn_batch_t batch = {
        .n_seqs = NQ, .kv_indptr = indptr, .kv_indices = idx, .kv_last_len = last};
    kvc_attn_params_t p = kvc_attn_params_default();
    p.n_q_heads = HQ;
    if (!rc) rc = kvc_attn_reference(&p, &kv, &batch, d->q, ref);
    free(idx), free(slots), free(buf);
    return rc;
}

/* Error of each output row relative to the RMS norm of the reference rows
 * (a row's own norm can be near zero when its weights cancel). */
static result_t compare(const float *out, const double *ref)
{
    result_t r = {0, 0, 0};
    double rms = 0;
    for (int i = 0; i < NQ * HQ * D; i++) rms += ref[i] * ref[i];
    rms = sqrt(rms / (NQ * HQ));
    for (int i = 0; i < NQ * HQ; i++) {
        double e2 = 0;
        for (int c = 0; c < D; c++) {
            double x = (double)out[(size_t)i * D + c] - ref[(size_t)i * D + c];
            e2 += x * x;
        }
        double rel = sqrt(e2) / rms;
        r.mean_rel += rel / (NQ * HQ);
        if (!(rel <= r.max_rel)) r.max_rel = rel;
    }
    return r;
}

int main(int argc, char **argv)
{
    const char *csv_path = "accuracy_attn.csv";
    uint32_t max_ctx = 131072;
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
            csv_path = argv[++i];
        else if (!strcmp(argv[i], "--max-ctx") && i + 1 < argc)
            max_ctx = (uint32_t)atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: accuracy_attn [--quick] [--csv FILE] [--max-ctx TOKENS]\n");
            return 2;
        }
    }
    static const variant_t variants[] = {
        {"f32", KVC_DTYPE_F32, KVC_SCALE_NONE, false, KVC_ATTN_COMPUTE_AUTO, 1},
        {"f16", KVC_DTYPE_F16, KVC_SCALE_NONE, false, KVC_ATTN_COMPUTE_AUTO, 1},
        {"bf16", KVC_DTYPE_BF16, KVC_SCALE_NONE, false, KVC_ATTN_COMPUTE_F32, 1},
        {"bf16 auto", KVC_DTYPE_BF16, KVC_SCALE_NONE, false, KVC_ATTN_COMPUTE_AUTO, 1},
        {"e4m3 none", KVC_DTYPE_FP8_E4M3, KVC_SCALE_NONE, false, KVC_ATTN_COMPUTE_F32, 1},
        {"e4m3 tensor-calib", KVC_DTYPE_FP8_E4M3, KVC_SCALE_TENSOR, true, KVC_ATTN_COMPUTE_F32, 1},
        {"e4m3 tensor", KVC_DTYPE_FP8_E4M3, KVC_SCALE_TENSOR, false, KVC_ATTN_COMPUTE_F32, 1},
        {"e4m3 head", KVC_DTYPE_FP8_E4M3, KVC_SCALE_HEAD, false, KVC_ATTN_COMPUTE_F32, 1},
        {"e4m3 head hr4", KVC_DTYPE_FP8_E4M3, KVC_SCALE_HEAD, false, KVC_ATTN_COMPUTE_F32, 4},
        {"e4m3 chan-tok", KVC_DTYPE_FP8_E4M3, KVC_SCALE_CHANNEL_TOKEN, false, KVC_ATTN_COMPUTE_F32,
         1},
        {"e4m3 chan-tok hr4", KVC_DTYPE_FP8_E4M3, KVC_SCALE_CHANNEL_TOKEN, false,
         KVC_ATTN_COMPUTE_F32, 4},
        {"e4m3 head hr4 auto", KVC_DTYPE_FP8_E4M3, KVC_SCALE_HEAD, false, KVC_ATTN_COMPUTE_AUTO, 4},
        {"e5m2 none", KVC_DTYPE_FP8_E5M2, KVC_SCALE_NONE, false, KVC_ATTN_COMPUTE_F32, 1},
        {"e5m2 head hr4", KVC_DTYPE_FP8_E5M2, KVC_SCALE_HEAD, false, KVC_ATTN_COMPUTE_F32, 4},
        {"e5m2 chan-tok hr4", KVC_DTYPE_FP8_E5M2, KVC_SCALE_CHANNEL_TOKEN, false,
         KVC_ATTN_COMPUTE_F32, 4},
    };
    const size_t nvar = KVC_ARRAY_LEN(variants);
    FILE *csv = fopen(csv_path, "w");
    if (!csv) return fprintf(stderr, "accuracy_attn: cannot write %s\n", csv_path), 1;
    fprintf(csv, "ctx,variant,dtype,layout,headroom,compute,kernel,mean_rel_l2,max_rel_l2,"
                 "clipped_fraction\n");
    printf("attention output error vs the fp64 reference on unquantised fp32 K/V\n");
    printf(
        "(L2 error of each output row over the RMS norm of the reference rows: mean / max over\n"
        " %d rows; clipped = share of K+V values that rounded past their scale's range;\n"
        " %d KV heads x %d queries, head_dim %d, blocks of %d; [kernel] is the one that ran)\n\n",
        NQ * HQ, KVH, G, D, BLOCK);
    printf("%-34s", "variant [kernel] \\ ctx");
    uint32_t ctxs[8];
    int nctx = 0;
    for (uint32_t c = 1024; c <= max_ctx; c *= quick ? 4 : 2) ctxs[nctx++] = c;
    for (int i = 0; i < nctx; i++) printf(" %7uK", ctxs[i] / 1024);
    printf("   clipped@max\n");
    double(*mean)[8] = calloc(nvar, sizeof *mean), (*mx)[8] = calloc(nvar, sizeof *mx);
    double *clip = calloc(nvar * 8, sizeof(double));
    kvc_attn_kernel_t *kernel = calloc(nvar, sizeof *kernel);
    for (int ci = 0; ci < nctx; ci++) {
        data_t d;
        make_data(&d, ctxs[ci], 1234 + ctxs[ci]);
        double *ref = malloc(sizeof(double) * NQ * HQ * D);
        float *out = malloc(sizeof(float) * NQ * HQ * D);
        int rc = reference(&d, ref);
        if (rc) return fprintf(stderr, "accuracy_attn: reference: %s\n", kvc_strerror(rc)), 1;
        for (size_t v = 0; v < nvar; v++) {
            double cf = 0;
            rc = run_variant(&variants[v], &d, out, &cf, &kernel[v]);
            if (rc)
                return fprintf(stderr, "accuracy_attn: %s: %s\n", variants[v].name,
                               kvc_strerror(rc)),
                       1;
            result_t r = compare(out, ref);
            mean[v][ci] = r.mean_rel, mx[v][ci] = r.max_rel, clip[v * 8 + (size_t)ci] = cf;
            fprintf(csv, "%u,%s,%s,%s,%g,%s,%s,%.6e,%.6e,%.6e\n", ctxs[ci], variants[v].name,
                    kvc_dtype_name(variants[v].dtype),
                    variants[v].calibrated ? "tensor-calibrated"
                                           : kvc_scale_layout_name(variants[v].layout),
                    (double)variants[v].headroom,
                    variants[v].compute == KVC_ATTN_COMPUTE_AUTO ? "auto" : "f32",
                    kvc_attn_kernel_name(kernel[v]), r.mean_rel, r.max_rel, cf);
        }
        fflush(csv);
        free(ref), free(out);
        free_data(&d);
    }
    for (size_t v = 0; v < nvar; v++) {
        char label[64];
        snprintf(label, sizeof label, "%s [%s]", variants[v].name, kvc_attn_kernel_name(kernel[v]));
        printf("%-34s", label);
        for (int i = 0; i < nctx; i++) printf(" %8.2e", mean[v][i]);
        printf("   %.2e\n", clip[v * 8 + (size_t)(nctx - 1)]);
        printf("%-34s", "  (max)");
        for (int i = 0; i < nctx; i++) printf(" %8.2e", mx[v][i]);
        printf("\n");
    }
    printf("\nCSV: %s\n", csv_path);
    fclose(csv);
    free(mean), free(mx), free(clip), free(kernel);
    return 0;
}
