/*
 * kernels/collective.h — sums across GPUs for tensor parallelism (docs/TP-GPU.md), through
 * NCCL (RCCL on AMD: the same API), loaded when first asked for (dlopen of libnccl.so.2 /
 * librccl.so.1, or $KL_NCCL_LIB): a build runs without the library; only ranks on several
 * GPUs need it.  Conventions: kernels/gpu_api.h.
 */
#ifndef KL_KERNELS_COLLECTIVE_H
#define KL_KERNELS_COLLECTIVE_H

#include "kernels/gpu_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One communicator per rank, rank r on device devs[r], all driven by this process. */
typedef struct kl_gpu_comm kl_gpu_comm;

/* Communicators over n (1 to 8) distinct devices, NVLink multicast off (NCCL_NVLS_ENABLE=0 set
 * in this process's environment).  KL_E_UNSUPPORTED when the library cannot be
 * loaded (naming what was tried) or lacks a function; KL_E_GPU when it refuses (its message);
 * KL_E_USAGE for n out of range. */
int  kl_gpu_comm_create(kl_gpu_comm **out, const int *devs, unsigned n, kl_err *err);
void kl_gpu_comm_free(kl_gpu_comm *c);   /* NULL ok */

/* In place: bufs[r] (count floats on rank r's device) = the sum over the ranks of bufs[],
 * each rank's part enqueued on st[r] (one group call: nothing waits here).  The order of the
 * adds is the library's (not rank order). */
int kl_gpu_comm_sum(kl_gpu_comm *c, float *const *bufs, size_t count, const kl_gpu_stream *st,
                    kl_err *err);

/* The library loaded ("" before one is). */
const char *kl_gpu_comm_library(void);

#ifdef __cplusplus
}
#endif

#endif
