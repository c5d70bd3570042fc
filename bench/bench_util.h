/* bench_util.h - what every benchmark needs: the median of repeated runs
 * (this machine is shared and noisy; medians and ratios, never single runs). */
#ifndef KVC_BENCH_UTIL_H
#define KVC_BENCH_UTIL_H

#include <stdlib.h>

static int kvc_bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n); sorts v in place. */
static inline double kvc_bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, kvc_bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
