/*
 * kernels/gpu.h — the one file that includes a GPU runtime header.
 *
 * Kernels and launchers are written against HIP runtime names.  Under hipcc they are the real
 * thing; under nvcc this header maps each one used to its CUDA twin, so one source builds for
 * both (make GPU=cuda, make GPU=hip).  It also holds what differs between the two: warp
 * shuffles (CUDA takes a lane mask) and the error check that fills a kl_err.
 *
 * Reductions use groups of KL_GPU_GROUP = 32 lanes on every target: a 64-lane CDNA wavefront
 * is two groups, so the same shuffle offsets (16..1) and launch shapes work everywhere.
 */
#ifndef KL_KERNELS_GPU_H
#define KL_KERNELS_GPU_H

#if defined(__HIPCC__)
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define hipError_t              cudaError_t
#define hipSuccess              cudaSuccess
#define hipGetErrorString       cudaGetErrorString
#define hipGetLastError         cudaGetLastError
#define hipGetDeviceCount       cudaGetDeviceCount
#define hipDeviceSynchronize    cudaDeviceSynchronize
#define hipMalloc               cudaMalloc
#define hipFree                 cudaFree
#define hipMemcpy               cudaMemcpy
#define hipMemcpyAsync          cudaMemcpyAsync
#define hipMemcpy2DAsync        cudaMemcpy2DAsync
#define hipMemset               cudaMemset
#define hipMemcpyHostToDevice   cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost   cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipMemcpyKind           cudaMemcpyKind
#define hipStream_t             cudaStream_t
#define hipEvent_t              cudaEvent_t
#define hipEventCreate          cudaEventCreate
#define hipEventRecord          cudaEventRecord
#define hipEventSynchronize     cudaEventSynchronize
#define hipEventElapsedTime     cudaEventElapsedTime
#define hipEventDestroy         cudaEventDestroy
#define hipEventCreateWithFlags cudaEventCreateWithFlags
#define hipEventDisableTiming   cudaEventDisableTiming
#define hipStreamWaitEvent      cudaStreamWaitEvent
#define hipHostRegister         cudaHostRegister
#define hipHostUnregister       cudaHostUnregister
#define hipHostRegisterDefault  cudaHostRegisterDefault
#define hipHostRegisterReadOnly cudaHostRegisterReadOnly
#define hipSetDevice            cudaSetDevice
#define hipDeviceCanAccessPeer  cudaDeviceCanAccessPeer
#define hipDeviceEnablePeerAccess cudaDeviceEnablePeerAccess
#define hipMemcpyPeerAsync      cudaMemcpyPeerAsync
#define hipDeviceProp_t         cudaDeviceProp
#define hipGetDeviceProperties  cudaGetDeviceProperties
#define hipGetDevice            cudaGetDevice
#define hipDeviceGetAttribute   cudaDeviceGetAttribute
#define hipDeviceAttribute_t    cudaDeviceAttr
#define hipDeviceAttributeMultiprocessorCount cudaDevAttrMultiProcessorCount
#define hipDeviceAttributeSharedMemPerBlockOptin cudaDevAttrMaxSharedMemoryPerBlockOptin
#define hipMemGetInfo           cudaMemGetInfo
#define hipMemsetAsync          cudaMemsetAsync
#define hipHostMalloc           cudaHostAlloc
#define hipHostMallocDefault    cudaHostAllocDefault
#define hipHostMallocPortable   cudaHostAllocPortable
#define hipHostRegisterPortable cudaHostRegisterPortable
#define hipHostFree             cudaFreeHost
#define hipStreamCreateWithFlags cudaStreamCreateWithFlags
#define hipStreamNonBlocking    cudaStreamNonBlocking
#define hipStreamDestroy        cudaStreamDestroy
#define hipStreamSynchronize    cudaStreamSynchronize
#define hipStreamBeginCapture   cudaStreamBeginCapture
#define hipStreamCaptureModeThreadLocal cudaStreamCaptureModeThreadLocal
#define hipStreamEndCapture     cudaStreamEndCapture
#define hipGraph_t              cudaGraph_t
#define hipGraphExec_t          cudaGraphExec_t
#define hipGraphInstantiateWithFlags cudaGraphInstantiateWithFlags
#define hipGraphLaunch          cudaGraphLaunch
#define hipGraphDestroy         cudaGraphDestroy
#define hipGraphExecDestroy     cudaGraphExecDestroy
#define hipGraphGetNodes        cudaGraphGetNodes
#define hipMemset               cudaMemset
#define hipFuncSetAttribute     cudaFuncSetAttribute
#define hipFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#define hipOccupancyMaxActiveBlocksPerMultiprocessor cudaOccupancyMaxActiveBlocksPerMultiprocessor
#endif

#include "common/err.h"

#define KL_GPU_GROUP 32 /* lanes that reduce together (see the header comment) */

/* The first statement of every kernel: waits until the kernels this one depends on have
 * finished and their writes are visible.  A no-op unless the launch is programmatic (the
 * decode graphs' kernel-to-kernel edges on CUDA sm_90: kernels/runtime.cu), where it is what
 * makes the early start safe; nothing on HIP.  Triggering the next launch right after the
 * wait (griddepcontrol.launch_dependents) was measured slower: decode 301-320 against 334-340
 * tok/s without it in the same run (docs/gpu-logs/2026-12-01-s7-decode-norm-route.log). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(__HIP_PLATFORM_AMD__)
#define KL_GPU_GRID_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define KL_GPU_GRID_WAIT() ((void)0)
#endif

/* Two exceptions, each for a kernel that says why (kernels/moe.cu, version 3 experts):
 * KL_GPU_LAUNCH_DEPENDENTS() after the wait lets the kernel's dependent be scheduled once
 * every block of this one has passed it (its blocks then start on SMs as this kernel's
 * leave, instead of after it ends); KL_GPU_GRID_WAIT_LATER() as the first statement marks a
 * kernel that, before its own KL_GPU_GRID_WAIT(), reads only memory written before its
 * predecessor ran (complete once every block of the predecessor passed its wait), never its
 * predecessor's output (tests/gpu_wait.sh accepts it).  KL_LOAD_L2 reads such memory from
 * L2, past the SM's L1. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(__HIP_PLATFORM_AMD__)
#define KL_GPU_LAUNCH_DEPENDENTS() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#define KL_LOAD_L2(p)              __ldcg(p)
#else
#define KL_GPU_LAUNCH_DEPENDENTS() ((void)0)
#define KL_LOAD_L2(p)              (*(p))
#endif
#define KL_GPU_GRID_WAIT_LATER() ((void)0)

/* A third use of the trigger, chosen per launch by the host (kl_gpu_early_dependents): a
 * kernel of few threads (a decode step's norm, conv, router and KDA norm) lets its
 * dependent start at once, right after its own wait.  Its blocks then find most SMs free, and
 * a one-token product issues its first weight loads there before its own grid wait
 * (dense.cu), so the weights stream while the small kernel runs.  For a grid that fills the
 * GPU the trigger would only crowd its SMs, which is why it is not unconditional. */
#define KL_GPU_EARLY_DEPENDENTS(early) \
    do {                               \
        if (early)                     \
            KL_GPU_LAUNCH_DEPENDENTS(); \
    } while (0)

/* Whether a launch of grid blocks of `block` threads may use KL_GPU_EARLY_DEPENDENTS: few
 * enough threads in all (KL_GPU_EARLY_MAX_THREADS) and not switched off by $KL_GPU_EARLY=0
 * (read once). */
#define KL_GPU_EARLY_MAX_THREADS 16384
int kl_gpu_early_dependents(dim3 grid, unsigned block);

/* v of the lane whose index within the group is this lane's XOR o (all lanes take part). */
template <class T> __device__ static inline T kl_gpu_shfl_xor(T v, int o)
{
#if defined(__HIPCC__)
    return __shfl_xor(v, o, KL_GPU_GROUP);
#else
    return __shfl_xor_sync(0xffffffffu, v, o, KL_GPU_GROUP);
#endif
}

/* Sum of v over the KL_GPU_GROUP lanes of a group, returned to every lane. */
__device__ static inline float kl_gpu_group_sum(float v)
{
    for (int o = KL_GPU_GROUP / 2; o > 0; o /= 2)
        v += kl_gpu_shfl_xor(v, o);
    return v;
}

/* 0, or KL_E_GPU with the statement, the runtime's message, file and line in err. */
static inline int kl_gpu_check(hipError_t e, const char *stmt, const char *file, int line,
                               kl_err *err)
{
    if (e == hipSuccess)
        return 0;
    return kl_fail(err, KL_E_GPU, "%s: %s (%s:%d)", stmt, hipGetErrorString(e), file, line);
}

#define KL_GPU_CHECK(err, call) kl_gpu_check((call), #call, __FILE__, __LINE__, (err))

#endif
