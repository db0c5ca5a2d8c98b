/*
 * bench_util.h — small helpers the benchmark programs share (header-only:
 * each benchmark is one executable).
 */
#ifndef GP_BENCH_UTIL_H
#define GP_BENCH_UTIL_H

#include <stdlib.h>

static inline int gp_bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of v[0..n) (sorts v). */
static inline double gp_bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, gp_bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
