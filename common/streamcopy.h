/*
 * common/streamcopy.h — a copy whose stores bypass the CPU caches.
 *
 * kl_copy_streaming(dst, src, n): copies n bytes like memcpy (the ranges must not overlap),
 * writing dst with non-temporal stores where the CPU has them (SSE2 on x86-64): the lines of
 * dst are written without first being read into the cache, so a large copy moves two bytes of
 * memory traffic a byte copied instead of three, and leaves the caches to others.  It is
 * meant for large one-way copies whose destination is read next by a device (the GPU ring
 * load's pinned buffers: tests/gpu/test_hostcopy.cu measured it at 0.82 of the pinned copy
 * rate with the GPU copying out, against 0.74 for pread and 0.75 for memcpy).  Elsewhere it is
 * memcpy.  The stores are fenced before it returns, so another thread that learns of the copy
 * through a lock or an atomic sees every byte.  Thread-safe.
 */
#ifndef KL_COMMON_STREAMCOPY_H
#define KL_COMMON_STREAMCOPY_H

#include <stddef.h>

void kl_copy_streaming(void *dst, const void *src, size_t n);

#endif
