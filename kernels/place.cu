/* kernels/place.cu — pieces placed from a staged span (see place.h). */
#include "kernels/place.h"

#include "kernels/gpu.h"
#include "kernels/runtime.h" /* kl_gpu_sm_count */

#define PLACE_THREADS 256u

/* Unit u (of U bytes) of place p: its source in the span and its destination. */
template <typename U>
__device__ static void place_unit(const uint8_t *span, const kl_gpu_place &p, uint64_t u)
{
    const uint64_t b = u * sizeof(U);
    const uint64_t from = p.rows == 1 ? p.off + b : p.off + b / p.width * p.pitch + b % p.width;
    *(U *)((uint8_t *)p.dst + b) = *(const U *)(span + from);
}

/* Every block takes its share of every place: 16 bytes a thread where the place's offsets,
 * widths and pitch allow, else a byte. */
__global__ static void __launch_bounds__(PLACE_THREADS)
    place_kernel(const uint8_t *span, const kl_gpu_place *places, uint32_t n)
{
    KL_GPU_GRID_WAIT();
    const uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint32_t i = 0; i < n; i++) {
        const kl_gpu_place p = places[i];
        const uint64_t bytes = p.width * p.rows;
        const uint64_t align = p.off | p.width | (p.rows > 1 ? p.pitch : 0) |
                               (uint64_t)(uintptr_t)p.dst | (uint64_t)(uintptr_t)span;
        if (align % 16 == 0)
            for (uint64_t u = t; u < bytes / 16; u += stride)
                place_unit<uint4>(span, p, u);
        else
            for (uint64_t u = t; u < bytes; u += stride)
                place_unit<uint8_t>(span, p, u);
    }
}

extern "C" int kl_gpu_place_span(const void *span, const kl_gpu_place *places,
                                 uint32_t first, uint32_t n, kl_gpu_stream s, kl_err *err)
{
    if (!n)
        return 0;
    const unsigned blocks = 2 * kl_gpu_sm_count();
    place_kernel<<<blocks, PLACE_THREADS, 0, (hipStream_t)s>>>((const uint8_t *)span,
                                                                places + first, n);
    return KL_GPU_CHECK(err, hipGetLastError());
}
