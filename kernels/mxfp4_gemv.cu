/*
 * kernels/mxfp4_gemv.cu — y = W x, W in MXFP4 (see mxfp4_gemv.h).
 *
 * Decode is bound by the bytes of W: 0.5 + 1/32 byte per weight, read once.  A group of 32
 * lanes owns a row; lane l reads blocks l, l + 32, ... of it, 16 packed bytes (one uint4) and
 * one scale each, so a group's loads of one step are 512 contiguous bytes.  Lane l then needs
 * x[32l .. 32l+32): read from global memory, one float4 load of the group touches 32 cache
 * lines (measured: 0.11 of the copy rate, the same for 1..8 blocks in flight per lane, so not
 * latency).  x is therefore staged in shared memory with one pad word per 32 (element i at
 * i + i/32), so lane l's element j sits in bank (l + j) mod 32: no conflicts.  Per block the
 * 32 products are summed unscaled, then multiplied by the block's 2^e (exact), and the lanes'
 * sums are reduced at the end.
 */
#include "kernels/gpu.h"
#include "kernels/mxfp4_gemv.h"

#include "common/mxfp4_format.h"

#define ROWS_PER_BLOCK 8   /* groups of KL_GPU_GROUP lanes in a block of 256 threads */
#define MAX_COLS       11264 /* x staged: (cols + cols/32) floats within 48 KiB of shared */

/* Sum over one 32-element block: 4 words of 8 E2M1 codes against xs[0..32).  The codes'
 * values come from a 16-entry table in shared memory (measured: decoding them with ALU
 * operations instead was 4% slower). */
__device__ static inline float block_dot(uint4 q, const float *xs, const float *lut)
{
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t v = w[k];
#pragma unroll
        for (int j = 0; j < 8; j++)
            acc += lut[(v >> (4 * j)) & 15] * xs[8 * k + j];
    }
    return acc;
}

__global__ static void mxfp4_gemv_kernel(kl_mxfp4_gemv_args a)
{
    extern __shared__ float xs[]; /* [cols + cols/32]: x, one pad word per 32 */
    __shared__ float lut[16];     /* E2M1 code -> value */
    if (threadIdx.x < 16)
        lut[threadIdx.x] = kl_e2m1_value(threadIdx.x);
    for (size_t i = threadIdx.x; i < a.cols; i += blockDim.x)
        xs[i + i / KL_MXFP4_BLOCK] = a.x[i];
    __syncthreads();
    const size_t row = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / KL_GPU_GROUP;
    const unsigned lane = threadIdx.x % KL_GPU_GROUP;
    if (row >= a.rows) /* the whole group leaves together */
        return;
    const size_t nb = a.cols / KL_MXFP4_BLOCK;
    const uint4 *p = (const uint4 *)(a.packed + row * (a.cols / 2));
    const uint8_t *s = a.scale + row * nb;
    float sum = 0.0f;
    for (size_t b = lane; b < nb; b += KL_GPU_GROUP)
        sum += block_dot(p[b], xs + b * (KL_MXFP4_BLOCK + 1), lut) * kl_e8m0_value(s[b]);
    sum = kl_gpu_group_sum(sum);
    if (lane == 0)
        a.y[row] = sum;
}

extern "C" int kl_gpu_mxfp4_gemv(const kl_mxfp4_gemv_args *a, kl_gpu_stream stream, kl_err *err)
{
    if (!a || !a->packed || !a->scale || !a->x || !a->y)
        return kl_fail(err, KL_E_USAGE, "mxfp4 gemv: a pointer is NULL");
    if (a->rows == 0 || a->cols == 0 || a->cols % KL_MXFP4_BLOCK || a->cols > MAX_COLS)
        return kl_fail(err, KL_E_USAGE,
                       "mxfp4 gemv: %zu x %zu (cols must be a multiple of 32, at most %d)",
                       a->rows, a->cols, MAX_COLS);
    if ((uintptr_t)a->packed % 16 || (uintptr_t)a->x % 16)
        return kl_fail(err, KL_E_USAGE, "mxfp4 gemv: packed and x must be 16-byte aligned");
    const size_t blocks = (a->rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    if (blocks > 0x7fffffffu)
        return kl_fail(err, KL_E_USAGE, "mxfp4 gemv: %zu rows is too many", a->rows);
    const size_t shared = (a->cols + a->cols / KL_MXFP4_BLOCK) * sizeof(float);
    mxfp4_gemv_kernel<<<(unsigned)blocks, ROWS_PER_BLOCK * KL_GPU_GROUP, shared,
                        (hipStream_t)stream>>>(*a);
    return KL_GPU_CHECK(err, hipGetLastError());
}
