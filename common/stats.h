/*
 * common/stats.h — small statistics over measured samples.
 */
#ifndef KL_COMMON_STATS_H
#define KL_COMMON_STATS_H

#include <stddef.h>

/* The median of v[0..n) (n >= 1; the mean of the middle two when n is even).  Sorts v in
 * place. */
double kl_median(double *v, size_t n);

#endif
