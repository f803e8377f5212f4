/*
 * common/membench.h — the host memory-read ceiling: how fast this machine's CPUs can read
 * a buffer much larger than the caches once, with several threads.
 *
 * Used as the denominator of page-cache read rates (`kl read --ceiling`): a buffered read of a
 * cached file cannot move bytes faster than the CPUs can read RAM.  Allocates `bytes` (counted,
 * released before returning), touches every page first, then times `passes` single passes of
 * `threads` threads summing 2 MiB pieces taken from a shared counter; returns the best pass.
 */
#ifndef KL_COMMON_MEMBENCH_H
#define KL_COMMON_MEMBENCH_H

#include "common/err.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kl_membench_result {
    size_t   bytes;
    unsigned threads;
    double   best_s;        /* fastest single pass */
    double   read_gbps;     /* bytes / best_s / 1e9: the ceiling */
    double   median_gbps;   /* bytes / median pass time: how a typical single pass runs */
    uint64_t huge_bytes;    /* of the buffer, backed by transparent huge pages (smaps) */
} kl_membench_result;

/* The sum of p[0..bytes) read as 64-bit words (tail bytes added one by one), with the same
 * loop the ceiling times: a way to make a CPU read every byte at memory speed.  p must be
 * 16-byte aligned. */
uint64_t kl_mem_sum(const void *p, size_t bytes);

int kl_membench_read(size_t bytes, unsigned threads, unsigned passes, kl_membench_result *res,
                     kl_err *err);

#endif
