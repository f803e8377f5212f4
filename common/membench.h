/*
 * common/membench.h — the host memory-read ceiling: how fast this machine's CPUs can read
 * a buffer much larger than the caches once, with several threads.
 *
 * Used as the denominator of page-cache read rates (`kl read --ceiling`) and of CPU decode
 * (`kl bench decode`): a read of cached files cannot move bytes faster than the CPUs can read
 * RAM.  A bench owns a buffer much larger than the caches (on transparent huge pages where
 * the kernel gives them, touched before any timing) and a team of threads that sum 2 MiB
 * pieces of it taken from a shared counter.
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

typedef struct kl_membench kl_membench;

/* Allocates `bytes` (rounded up to 2 MiB) and starts `threads` threads (1..256). */
int kl_membench_open(size_t bytes, unsigned threads, kl_membench **out, kl_err *err);

/* Seconds for the team to read `bytes` once, in 2 MiB pieces that wrap around the buffer when
 * `bytes` exceeds it (every piece still comes from DRAM: the buffer dwarfs the caches); the
 * bytes actually read (whole pieces) in *bytes_read.  Lets a ceiling pass last as long as the
 * read it is compared with, without a buffer that large. */
double kl_membench_pass(kl_membench *b, uint64_t bytes, uint64_t *bytes_read);

size_t   kl_membench_buffer_bytes(const kl_membench *b);
unsigned kl_membench_threads(const kl_membench *b);
uint64_t kl_membench_huge_bytes(const kl_membench *b);
void     kl_membench_close(kl_membench *b); /* NULL is fine */

/* Open, `passes` passes over the buffer, close: the best and median pass. */
int kl_membench_read(size_t bytes, unsigned threads, unsigned passes, kl_membench_result *res,
                     kl_err *err);

/* The same with each pass copying the buffer's pieces (memcpy) into a second buffer of its
 * size: the host copy ceiling of a loader that copies cached file bytes into its own buffers
 * (read_gbps is then the bytes copied per second, each read once and written once). */
int kl_membench_copy(size_t bytes, unsigned threads, unsigned passes, kl_membench_result *res,
                     kl_err *err);

#endif
