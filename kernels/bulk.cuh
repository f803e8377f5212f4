/*
 * kernels/bulk.cuh — copies of a contiguous span from global to shared memory, asked for by
 * one thread and waited for by the block: on CUDA sm_90 the copy engine (cp.async.bulk with
 * an mbarrier counting the bytes in), so a block keeps a whole ring of stages in flight
 * without holding them in registers; elsewhere the block's threads copy when the stage is
 * waited for (correct, not fast: callers size their rings from the device's shared memory, so
 * small-memory devices never take them).
 *
 * Use: bulk_init (thread 0, once, then a block barrier); bulk_load (thread 0) asks for a
 * stage; bulk_wait (every thread) returns when it is in shared memory; after a block barrier
 * that ends every read of a slot, bulk_load may fill it again.  Sizes and addresses are
 * multiples of 16 bytes.
 */
#ifndef KL_KERNELS_BULK_CUH
#define KL_KERNELS_BULK_CUH

#include "kernels/gpu.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(__HIP_PLATFORM_AMD__)
#define KL_BULK_ENGINE 1
#else
#define KL_BULK_ENGINE 0
#endif

__device__ static inline void bulk_init(uint64_t *bar, unsigned n)
{
#if KL_BULK_ENGINE
    for (unsigned i = 0; i < n; i++) {
        const uint32_t b = (uint32_t)__cvta_generic_to_shared(&bar[i]);
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
    }
    /* the copy engine sees the initialised barriers */
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
    (void)bar, (void)n;
#endif
}

/* Asks for bytes at src into dst, counted on bar (thread 0 only).  A slot read before by the
 * block's threads is ordered before the copy's writes by the caller's block barrier and the
 * proxy fence here. */
__device__ static inline void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
#if KL_BULK_ENGINE
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    const uint32_t b = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1], %2, [%3];" ::"r"(d),
                 "l"(src), "r"(bytes), "r"(b)
                 : "memory");
#else
    (void)dst, (void)src, (void)bytes, (void)bar;
#endif
}

/* Every thread: returns when the stage bulk_load asked for on bar (its use number `use`,
 * counted from 0 per barrier) is in dst.  Without the copy engine the block copies it here
 * (src and bytes as bulk_load had them) and meets at a barrier. */
__device__ static inline void bulk_wait(uint64_t *bar, uint32_t use, void *dst, const void *src,
                                        uint32_t bytes)
{
#if KL_BULK_ENGINE
    const uint32_t b = (uint32_t)__cvta_generic_to_shared(bar);
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n .reg .pred p;\n"
                     " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(b), "r"(use & 1u)
                     : "memory");
    (void)dst, (void)src, (void)bytes;
#else
    (void)bar, (void)use;
    for (uint32_t i = threadIdx.x; i < bytes / 16; i += blockDim.x)
        ((uint4 *)dst)[i] = ((const uint4 *)src)[i];
    __syncthreads();
#endif
}

#endif
