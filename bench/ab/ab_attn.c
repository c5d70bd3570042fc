/* ab_attn.c - A/B timing of two builds of the AVX-512 attention kernel in
 * one process (bench/ab/ab_attn.sh builds it; not part of the CMake build).
 *
 * This machine's memory bandwidth drifts by tens of percent from minute to
 * minute, more than most kernel changes are worth, so two binaries run one
 * after the other cannot be compared.  Here both versions of
 * attn_avx512.c are linked in under other names (kvc_ab_item_a/_b) and this
 * file provides the symbols the library calls, forwarding to one or the
 * other; each pair of timings runs A and B back to back on the same cache
 * (order alternating), and the median of the per-pair ratios is reported.
 *
 * usage: ab_attn DTYPE G CTX [KV_HEADS [BLOCK [PAGED]]]   (PAIRS=n in the
 * environment: pairs of timings, default 40) */
#include "kvcache/kvcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef void (*item_fn)(const void *cfg, const void *item, void *ws);
void kvc_ab_item_a(const void *cfg, const void *item, void *ws);
void kvc_ab_item_b(const void *cfg, const void *item, void *ws);
size_t kvc_ab_ws_a(uint32_t dk, uint32_t dv);
size_t kvc_ab_ws_b(uint32_t dk, uint32_t dv);

/* The two symbols of attn_avx512.c the library calls. */
void kvc__attn_item_avx512(const void *cfg, const void *item, void *ws);
size_t kvc__attn_ws_avx512(uint32_t dk, uint32_t dv);

static item_fn which = kvc_ab_item_a;

void kvc__attn_item_avx512(const void *cfg, const void *item, void *ws)
{
    which(cfg, item, ws);
}

size_t kvc__attn_ws_avx512(uint32_t dk, uint32_t dv)
{
    size_t a = kvc_ab_ws_a(dk, dv), b = kvc_ab_ws_b(dk, dv);
    return a > b ? a : b;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t xs(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: ab_attn DTYPE G CTX [KV_HEADS [BLOCK [PAGED]]]\n");
        return 2;
    }
    kvc_dtype_t dt;
    if (kvc_dtype_parse(argv[1], &dt)) {
        fprintf(stderr, "ab_attn: unknown dtype '%s'\n", argv[1]);
        return 2;
    }
    const uint32_t g = (uint32_t)atoi(argv[2]), ctx = (uint32_t)atoi(argv[3]);
    const uint32_t H = argc > 4 ? (uint32_t)atoi(argv[4]) : 8;
    const uint32_t bs = argc > 5 ? (uint32_t)atoi(argv[5]) : 16;
    const int paged = argc > 6 ? atoi(argv[6]) : 0;
    const int pairs = getenv("PAIRS") ? atoi(getenv("PAIRS")) : 40;
    if (g < 1 || H < 1 || bs < 1 || ctx < bs || ctx % bs || pairs < 1 || pairs > 1000) {
        fprintf(stderr, "ab_attn: bad sizes\n");
        return 2;
    }
    const uint32_t D = 128, nb = ctx / bs;
    kvc_scale_shape_t sh = {.n_layers = 1,
                            .n_kv = 2,
                            .n_kv_heads = H,
                            .head_dim = D,
                            .block_size = bs,
                            .dtype = dt,
                            .layout = kvc_dtype_bytes(dt) == 1 ? KVC_SCALE_HEAD : KVC_SCALE_NONE};
    const size_t bb = kvc_kv_block_bytes(&sh), bytes = bb * nb;
    const size_t huge = (size_t)2 << 20, alloc = (bytes + huge - 1) / huge * huge;
    uint8_t *buf = aligned_alloc(huge, alloc);
    if (!buf) {
        fprintf(stderr, "ab_attn: out of memory\n");
        return 1;
    }
    madvise(buf, alloc, MADV_HUGEPAGE);
    kvc_kv_view_t v;
    int rc = kvc_kv_view_contiguous(buf, bytes, nb, &sh, 0, &v);
    if (rc) {
        fprintf(stderr, "ab_attn: view: %s\n", kvc_strerror(rc));
        return 1;
    }
    /* small finite values in every dtype: byte patterns that decode to
     * about 0.1-1 in f32/bf16, and FP8 codes with scale 1/64 */
    uint64_t st = 0x9e3779b97f4a7c15ull;
    const size_t el = kvc_dtype_bytes(dt);
    for (size_t i = 0; i < bytes; i++)
        buf[i] = (uint8_t)((i % el == el - 1 && el > 1) ? 0x3e : (xs(&st) & 0x3f));
    if (sh.layout == KVC_SCALE_HEAD)
        for (uint32_t b = 0; b < nb; b++) {
            float *s = (float *)(void *)(buf + (size_t)b * bb + v.scale_offset);
            for (uint32_t i = 0; i < 2 * H; i++) s[i] = 1.0f / 64;
        }
    uint32_t *idx = malloc(sizeof(uint32_t) * nb);
    for (uint32_t i = 0; i < nb; i++) idx[i] = i;
    if (paged)
        for (uint32_t i = nb - 1; i > 0; i--) {
            uint32_t j = (uint32_t)(xs(&st) % (i + 1)), t = idx[i];
            idx[i] = idx[j], idx[j] = t;
        }
    uint32_t indptr[2] = {0, nb}, last[1] = {bs};
    kvc_attn_batch_t batch = {
        .n_seqs = 1, .kv_indptr = indptr, .kv_indices = idx, .kv_last_len = last};
    kvc_attn_params_t pa = kvc_attn_params_default();
    pa.n_q_heads = H * g;
    float *q = malloc(sizeof(float) * D * H * g), *out = malloc(sizeof(float) * D * H * g);
    for (uint32_t i = 0; i < D * H * g; i++) q[i] = (float)(xs(&st) % 100) * 0.01f - 0.5f;
    const size_t wsb = kvc_attn_workspace_bytes(&v, NULL);
    void *ws = aligned_alloc(4096, (wsb + 4095) / 4096 * 4096);
    const uint32_t ni = kvc_attn_n_items(&pa, &v, &batch);
    const double kvb = (double)ctx * H * D * 2 * (double)el;
    const int inner = (int)(0.4e9 / kvb) + 1; /* ~20 ms a timing at 20 GB/s */
    for (int w = 0; w < 3; w++)
        for (int k = 0; k < 2; k++) {
            which = k ? kvc_ab_item_b : kvc_ab_item_a;
            if ((rc = kvc_attn_forward(&pa, &v, &batch, q, out, ws, wsb, 0, ni))) {
                fprintf(stderr, "ab_attn: forward: %s\n", kvc_strerror(rc));
                return 1;
            }
        }
    double *ratio = malloc(sizeof(double) * (size_t)pairs * 3), *ga = ratio + pairs,
           *gb = ratio + 2 * pairs;
    for (int r = 0; r < pairs; r++) {
        double t[2];
        for (int k = 0; k < 2; k++) {
            const int b = (r & 1) ? 1 - k : k;
            which = b ? kvc_ab_item_b : kvc_ab_item_a;
            double t0 = now();
            for (int i = 0; i < inner; i++)
                kvc_attn_forward(&pa, &v, &batch, q, out, ws, wsb, 0, ni);
            t[b] = (now() - t0) / inner;
        }
        ga[r] = kvb / t[0] * 1e-9, gb[r] = kvb / t[1] * 1e-9, ratio[r] = t[0] / t[1];
    }
    qsort(ratio, (size_t)pairs, sizeof(double), cmp_double);
    qsort(ga, (size_t)pairs, sizeof(double), cmp_double);
    qsort(gb, (size_t)pairs, sizeof(double), cmp_double);
    printf("%s %s g=%u ctx=%u kv_heads=%u block=%u: A %.1f GB/s, B %.1f GB/s, B/A %.3f "
           "(quartiles %.3f..%.3f, %d pairs)\n",
           paged ? "paged" : "contig", kvc_dtype_name(dt), g, ctx, H, bs, ga[pairs / 2],
           gb[pairs / 2], ratio[pairs / 2], ratio[pairs / 4], ratio[3 * pairs / 4], pairs);
    free(ratio), free(q), free(out), free(ws), free(idx), free(buf);
    return 0;
}
