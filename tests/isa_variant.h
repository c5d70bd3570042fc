/* isa_variant.h - one kernel variant per ctest entry, for the test binaries whose differential
 * tests run every SIMD version against the scalar one or the reference (test_attn,
 * test_attn_mla, test_quant).  A variant this CPU cannot run is reported as skipped, with the
 * reason, never as passed:
 *
 *     test_attn                  the tests that do not depend on the ISA (ctest: attn)
 *     test_attn --isa avx2       the differential tests on the AVX2 kernels only (attn.avx2)
 *
 * A variant the CPU lacks exits with KVC_TEST_SKIP (77, the entries' SKIP_RETURN_CODE) after
 * printing "SKIPPED: <test>.<variant>: CPU lacks <features>"; the caller first checks that
 * forcing it fails as documented.  A variant that runs counts the cases that ran each kernel
 * (kvc_attn_kernel: what ran, not what was asked for) and fails if none ran its own. */
#ifndef KVC_TEST_ISA_VARIANT_H
#define KVC_TEST_ISA_VARIANT_H

#include <stdio.h>
#include <string.h>

#include "kvcache/kvcache.h"

#define KVC_TEST_SKIP 77

typedef struct {
    const char *name;
    kvc_isa_t isa;              /* forced in the calls */
    kvc_attn_compute_t compute; /* attention's compute path */
    kvc_attn_kernel_t kernel;   /* the attention kernel it is about */
} kvc_test_variant_t;

static const kvc_test_variant_t KVC_TEST_VARIANTS[] = {
    {"scalar", KVC_ISA_SCALAR, KVC_ATTN_COMPUTE_AUTO, KVC_ATTN_KERNEL_SCALAR},
    {"avx2", KVC_ISA_AVX2, KVC_ATTN_COMPUTE_AUTO, KVC_ATTN_KERNEL_AVX2},
    {"avx512", KVC_ISA_AVX512, KVC_ATTN_COMPUTE_F32, KVC_ATTN_KERNEL_AVX512},
    {"avx512-bf16", KVC_ISA_AVX512, KVC_ATTN_COMPUTE_AUTO, KVC_ATTN_KERNEL_AVX512_BF16},
};

/* The CPU features a variant needs that this CPU (with its OS) lacks, as cpuid names, or ""
 * if it has them all. */
static inline const char *kvc_test_variant_missing(const kvc_test_variant_t *v, char *buf,
                                                   size_t cap)
{
    const kvc_cpu_t *c = kvc_cpu();
    buf[0] = '\0';
    if (v->isa == KVC_ISA_AVX2 && !c->avx2)
        snprintf(buf, cap, "avx2, fma or f16c (or OS support for ymm state)");
    if (v->isa == KVC_ISA_AVX512 && !c->avx512)
        snprintf(buf, cap,
                 "avx512f, avx512bw, avx512vl or avx512dq (or OS support for zmm "
                 "state)%s",
                 v->kernel == KVC_ATTN_KERNEL_AVX512_BF16 ? ", and avx512bf16 and avx512vbmi" : "");
    else if (v->kernel == KVC_ATTN_KERNEL_AVX512_BF16 && (!c->avx512_bf16 || !c->avx512_vbmi))
        snprintf(buf, cap, "%s%s%s", c->avx512_bf16 ? "" : "avx512bf16",
                 !c->avx512_bf16 && !c->avx512_vbmi ? " and " : "",
                 c->avx512_vbmi ? "" : "avx512vbmi");
    return buf;
}

/* Parse the command line: no argument (*out = NULL: the ISA-independent tests) or
 * "--isa NAME" with NAME one of `allowed` (a NULL-terminated list of variant names).
 * Returns 0, or 2 after printing a usage line. */
static inline int kvc_test_variant_parse(int argc, char **argv, const char *const *allowed,
                                         const kvc_test_variant_t **out)
{
    *out = NULL;
    if (argc == 1) return 0;
    if (argc == 3 && strcmp(argv[1], "--isa") == 0)
        for (const char *const *a = allowed; *a; a++)
            for (size_t i = 0; i < KVC_ARRAY_LEN(KVC_TEST_VARIANTS); i++)
                if (strcmp(argv[2], *a) == 0 && strcmp(argv[2], KVC_TEST_VARIANTS[i].name) == 0)
                    return *out = &KVC_TEST_VARIANTS[i], 0;
    fprintf(stderr, "usage: %s [--isa", argv[0]);
    for (const char *const *a = allowed; *a; a++)
        fprintf(stderr, "%s%s", a == allowed ? " " : "|", *a);
    fprintf(stderr, "]\n");
    return 2;
}

/* Report a variant this CPU cannot run and return the skip code. */
static inline int kvc_test_variant_skip(const char *test, const kvc_test_variant_t *v)
{
    char why[160];
    printf("SKIPPED: %s.%s: CPU lacks %s\n", test, v->name,
           kvc_test_variant_missing(v, why, sizeof why));
    fflush(stdout);
    return KVC_TEST_SKIP;
}

/* How many cases ran each attention kernel in this process. */
typedef struct {
    unsigned long ran[KVC_ATTN_KERNEL__COUNT];
} kvc_test_kernel_count_t;

/* Print the tally ("attn.avx2: 71 cases ran avx2, 3 scalar") and return nonzero (a failure)
 * if no case ran the variant's own kernel: a variant entry that never ran its kernel must not
 * pass. */
static inline int kvc_test_kernel_report(const char *test, const kvc_test_variant_t *v,
                                         const kvc_test_kernel_count_t *k)
{
    printf("%s.%s: cases by the kernel that ran:", test, v->name);
    for (int i = 0; i < KVC_ATTN_KERNEL__COUNT; i++)
        if (k->ran[i]) printf(" %s %lu", kvc_attn_kernel_name((kvc_attn_kernel_t)i), k->ran[i]);
    printf("\n");
    if (k->ran[v->kernel] == 0) {
        printf("FAILED: %s.%s: no case ran the %s kernel\n", test, v->name,
               kvc_attn_kernel_name(v->kernel));
        return 1;
    }
    return 0;
}

#endif
