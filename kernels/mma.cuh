/*
 * kernels/mma.cuh — the warp-level matrix primitives the tensor-core kernels share, one source
 * for CUDA and HIP: on CUDA (sm_80 and later) the PTX instructions, on HIP a SIMT stand-in per
 * group of KL_GPU_GROUP lanes that gives every lane the same registers (slower, same sums up
 * to rounding order).  Include after kernels/gpu.h.
 *
 * The fragments of mma.m16n8k16 (bf16 or fp16 in, fp32 accumulate; PTX ISA, "Matrix
 * Fragments for mma.m16n8k16 with floating point type"), lane = 4 g + t:
 *   A [16][16] (row-major)  a[i] low, high half: row g + 8 (i % 2), columns 2 t + 8 (i / 2), +1
 *   B [16][8]               b[i] low, high half: rows (k) 2 t + 8 i, +1, column g
 *   C [16][8]               c[i]: row g + 8 (i / 2), column 2 t + i % 2
 * ldmatrix .x4: lanes 8 m .. 8 m + 7 give the addresses of the 8 rows (16 bytes each) of
 * matrix m; lane 4 g + t receives, in r[m], the bf16 pair at columns 2 t, 2 t + 1 of row g.
 * With .trans (ldsm4_t) it receives the transposed pair: column g of rows 2 t, 2 t + 1 (low,
 * high half), i.e. B's fragment of a matrix stored [k][n] row by row.
 */
#ifndef KL_KERNELS_MMA_CUH
#define KL_KERNELS_MMA_CUH

#include <stdint.h>

#if !defined(__HIPCC__)
/* c += A B. */
__device__ static inline void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* c += A B with fp16 operands (the same fragments, fp16 pairs instead of bf16). */
__device__ static inline void mma16816_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                           uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8x8 bf16 matrices from shared memory; p: this lane's row address (16-byte aligned). */
__device__ static inline void ldsm4(uint32_t (&r)[4], const void *p)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}

/* ldsm4 transposed (.trans): r[m] = rows 2 t, 2 t + 1 of matrix m at column g. */
__device__ static inline void ldsm4_t(uint32_t (&r)[4], const void *p)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}

/* cp.async of 16 bytes from global src to shared dst; bytes 0: dst zero-filled instead */
__device__ static inline void copy16(void *dst, const void *src, uint32_t bytes)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(bytes)
                 : "memory");
}

/* cp.async of 4 bytes (4-byte aligned both sides) */
__device__ static inline void copy4(void *dst, const void *src)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(src) : "memory");
}

__device__ static inline void copy_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Waits until at most N of this thread's committed copy groups are still in flight. */
template <int N> __device__ static inline void copy_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#else
__device__ static inline uint32_t mma_shfl(uint32_t v, uint32_t src)
{
    return __shfl(v, (int)src, KL_GPU_GROUP);
}

/* The low (high = 0) or high half of a bf16 pair (F16: fp16 pair) as a float. */
template <int F16 = 0> __device__ static inline float mma_half(uint32_t v, uint32_t high)
{
    const uint32_t h = high ? v >> 16 : v & 0xffffu;
    if (F16)
        return __half2float(__ushort_as_half((unsigned short)h));
    return __uint_as_float(h << 16);
}

/* Each lane gathers its rows of A and columns of B by shuffles (F16: fp16 operands). */
template <int F16 = 0>
__device__ static inline void mma16816_any(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                           uint32_t b1)
{
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP, g = lane / 4, t = lane % 4;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (uint32_t k = 0; k < 16; k++) { /* held by lane 4 row + k % 8 / 2, half k % 2 */
        const uint32_t src = k % 8 / 2, hh = k % 2, up = k / 8;
        const float a0 = mma_half<F16>(mma_shfl(a[2 * up], 4 * g + src), hh);
        const float a1 = mma_half<F16>(mma_shfl(a[2 * up + 1], 4 * g + src), hh);
        const uint32_t b = up ? b1 : b0;
        const float x0 = mma_half<F16>(mma_shfl(b, 8 * t + src), hh);
        const float x1 = mma_half<F16>(mma_shfl(b, 8 * t + 4 + src), hh);
        acc[0] += a0 * x0, acc[1] += a0 * x1, acc[2] += a1 * x0, acc[3] += a1 * x1;
    }
    for (int i = 0; i < 4; i++)
        c[i] += acc[i];
}

__device__ static inline void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1)
{
    mma16816_any<0>(c, a, b0, b1);
}

__device__ static inline void mma16816_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                           uint32_t b1)
{
    mma16816_any<1>(c, a, b0, b1);
}

/* Lane 4 g + t reads word t of the row whose address lane 8 m + g holds, for each m. */
__device__ static inline void ldsm4(uint32_t (&r)[4], const void *p)
{
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP, g = lane / 4, t = lane % 4;
    const uint64_t mine = (uint64_t)(uintptr_t)p;
    for (uint32_t m = 0; m < 4; m++) {
        const uint64_t lo = mma_shfl((uint32_t)mine, 8 * m + g);
        const uint64_t hi = mma_shfl((uint32_t)(mine >> 32), 8 * m + g);
        r[m] = ((const uint32_t *)(uintptr_t)(hi << 32 | lo))[t];
    }
}

/* Lane 4 g + t reads half g of the rows whose addresses lanes 8 m + 2 t, 8 m + 2 t + 1 hold. */
__device__ static inline void ldsm4_t(uint32_t (&r)[4], const void *p)
{
    const uint32_t lane = threadIdx.x % KL_GPU_GROUP, g = lane / 4, t = lane % 4;
    const uint64_t mine = (uint64_t)(uintptr_t)p;
    for (uint32_t m = 0; m < 4; m++) {
        uint32_t half[2];
        for (uint32_t j = 0; j < 2; j++) {
            const uint64_t lo = mma_shfl((uint32_t)mine, 8 * m + 2 * t + j);
            const uint64_t hi = mma_shfl((uint32_t)(mine >> 32), 8 * m + 2 * t + j);
            half[j] = ((const uint16_t *)(uintptr_t)(hi << 32 | lo))[g];
        }
        r[m] = half[0] | half[1] << 16;
    }
}

#if !defined(KL_MMA_DEFERRED_COPIES) /* tests/gpu/mla_lanes.cpp: its own, landing at the wait */
__device__ static inline void copy16(void *dst, const void *src, uint32_t bytes)
{
    *(float4 *)dst = bytes ? *(const float4 *)src : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

__device__ static inline void copy4(void *dst, const void *src)
{
    *(uint32_t *)dst = *(const uint32_t *)src;
}

__device__ static inline void copy_commit() {}

template <int N> __device__ static inline void copy_wait() {}
#endif
#endif

#endif
