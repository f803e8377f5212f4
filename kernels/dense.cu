/*
 * kernels/dense.cu — products, embedding, residual + RMSNorm, SiLU gating and arg-max on the
 * GPU (see dense.h).
 *
 * kl_gpu_matmul: one group of 32 lanes per weight row (kernels/row_dot.cuh), KL_ROW_WARPS rows
 * per block; tokens go in groups of NT = 1, 2, 4 or 8 (the smallest that holds n, 8 above),
 * one group per grid row, so for n <= 8 each weight row is read once; per group every lane
 * keeps NT partial sums.  The bytes moved are the weights' (x and y are small and cached).
 */
#include "kernels/dense.h"
#include "kernels/row_dot.cuh"

#include <math.h>

#define THREADS      256
#define ARGMAX_THREADS 1024
#define MAX_GRID_Y   65535u

/* ---- matmul ------------------------------------------------------------------------------ */

template <int NT>
__global__ static void __launch_bounds__(THREADS)
    matmul_kernel(kl_gpu_mat w, const float *x, uint32_t n, float *y, int vec)
{
    __shared__ float lut[16];
    kl_row_lut_init(lut);
    __syncthreads();
    const size_t row = (size_t)blockIdx.x * KL_ROW_WARPS + threadIdx.x / KL_GPU_GROUP;
    const unsigned lane = threadIdx.x % KL_GPU_GROUP;
    if (row >= w.rows) /* the whole group leaves together */
        return;
    const uint32_t t0 = blockIdx.y * NT;
    const kl_row_x xs = {x + (size_t)t0 * w.cols, w.cols, n - t0 < NT ? n - t0 : NT};
    float acc[NT];
    kl_row_dot<NT>(w, row, xs, vec, lut, lane, acc);
    if (lane != 0)
        return;
#pragma unroll
    for (int t = 0; t < NT; t++)
        if ((uint32_t)t < xs.nt)
            y[(size_t)(t0 + t) * w.rows + row] = acc[t];
}

extern "C" int kl_gpu_matmul(const kl_gpu_mat *w, const float *x, uint32_t n, float *y,
                             kl_gpu_stream s, kl_err *err)
{
    int rc = kl_row_mat_check(w, "matmul", err);
    if (rc)
        return rc;
    if (!x || !y || n == 0)
        return kl_fail(err, KL_E_USAGE, "matmul: x or y is NULL, or n is 0");
    const int vec = kl_row_vec_ok(w, x, w->cols);
    if (w->kind == KL_GPU_W_MXFP4 && !vec)
        return kl_fail(err, KL_E_USAGE, "matmul: MXFP4 needs x 16-byte aligned");
    const uint32_t nt = n == 1 ? 1 : n == 2 ? 2 : n <= 4 ? 4 : 8;
    const dim3 grid((w->rows + KL_ROW_WARPS - 1) / KL_ROW_WARPS, (n + nt - 1) / nt);
    if (grid.y > MAX_GRID_Y)
        return kl_fail(err, KL_E_USAGE, "matmul: %u tokens is too many", n);
    hipStream_t st = (hipStream_t)s;
    if (nt == 1)
        matmul_kernel<1><<<grid, THREADS, 0, st>>>(*w, x, n, y, vec);
    else if (nt == 2)
        matmul_kernel<2><<<grid, THREADS, 0, st>>>(*w, x, n, y, vec);
    else if (nt == 4)
        matmul_kernel<4><<<grid, THREADS, 0, st>>>(*w, x, n, y, vec);
    else
        matmul_kernel<8><<<grid, THREADS, 0, st>>>(*w, x, n, y, vec);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* ---- embed ------------------------------------------------------------------------------- */

/* Block t: row ids[t] of the table as fp32 (an id past the table gives NaN: visible). */
__global__ static void embed_kernel(kl_gpu_mat tab, const uint32_t *ids, float *x)
{
    const uint32_t id = ids[blockIdx.x];
    float *out = x + (size_t)blockIdx.x * tab.cols;
    for (uint32_t c = threadIdx.x; c < tab.cols; c += blockDim.x) {
        float v = __uint_as_float(0x7fc00000u);
        if (id < tab.rows) {
            const size_t i = (size_t)id * tab.cols + c;
            v = tab.kind == KL_GPU_W_BF16 ? kl_bf16_f32(((const uint16_t *)tab.data)[i])
                                          : ((const float *)tab.data)[i];
        }
        out[c] = v;
    }
}

extern "C" int kl_gpu_embed(const kl_gpu_mat *table, const uint32_t *ids, uint32_t n, float *x,
                            kl_gpu_stream s, kl_err *err)
{
    int rc = kl_row_mat_check(table, "embed", err);
    if (rc)
        return rc;
    if (table->kind == KL_GPU_W_MXFP4)
        return kl_fail(err, KL_E_USAGE, "embed: the table must be F32 or BF16");
    if (!ids || !x || n == 0 || n > 0x7fffffffu)
        return kl_fail(err, KL_E_USAGE, "embed: ids or x is NULL, or n is 0 or too large");
    embed_kernel<<<n, THREADS, 0, (hipStream_t)s>>>(*table, ids, x);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* ---- residual + RMSNorm ------------------------------------------------------------------ */

/* Sum of v over the block (THREADS threads), on every thread; the groups' sums are added in
 * group order by thread 0, so the result does not depend on timing. */
__device__ static float block_sum(float v)
{
    __shared__ float part[THREADS / KL_GPU_GROUP];
    __shared__ float total;
    v = kl_gpu_group_sum(v);
    if (threadIdx.x % KL_GPU_GROUP == 0)
        part[threadIdx.x / KL_GPU_GROUP] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int g = 0; g < THREADS / KL_GPU_GROUP; g++)
            s += part[g];
        total = s;
    }
    __syncthreads();
    return total;
}

/* Block r: row r of x (+= y), its mean square, then xn.  Each thread re-reads only the
 * elements it wrote. */
__global__ static void __launch_bounds__(THREADS)
    add_rmsnorm_kernel(float *x, const float *y, const float *w, uint32_t h, float eps,
                       float *xn)
{
    float *xr = x + (size_t)blockIdx.x * h;
    const float *yr = y ? y + (size_t)blockIdx.x * h : NULL;
    float ss = 0.0f;
    for (uint32_t i = threadIdx.x; i < h; i += THREADS) {
        float v = xr[i];
        if (yr) {
            v += yr[i];
            xr[i] = v;
        }
        ss = fmaf(v, v, ss);
    }
    const float inv = 1.0f / sqrtf(block_sum(ss) / (float)h + eps);
    float *out = xn + (size_t)blockIdx.x * h;
    for (uint32_t i = threadIdx.x; i < h; i += THREADS)
        out[i] = w[i] * (xr[i] * inv);
}

extern "C" int kl_gpu_add_rmsnorm(float *x, const float *y, const float *w, uint32_t n,
                                  uint32_t h, float eps, float *xn, kl_gpu_stream s, kl_err *err)
{
    if (!x || !w || !xn || n == 0 || h == 0 || n > 0x7fffffffu)
        return kl_fail(err, KL_E_USAGE, "add_rmsnorm: x, w or xn is NULL, or n or h is 0");
    if (xn == x)
        return kl_fail(err, KL_E_USAGE, "add_rmsnorm: xn may not alias x");
    add_rmsnorm_kernel<<<n, THREADS, 0, (hipStream_t)s>>>(x, y, w, h, eps, xn);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* ---- SiLU gating ------------------------------------------------------------------------- */

__global__ static void silu_mul_kernel(float *a, const float *b, size_t count)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += step) {
        const float z = a[i];
        a[i] = z / (1.0f + expf(-z)) * b[i];
    }
}

extern "C" int kl_gpu_silu_mul(float *a, const float *b, size_t count, kl_gpu_stream s,
                               kl_err *err)
{
    if (!a || !b || count == 0)
        return kl_fail(err, KL_E_USAGE, "silu_mul: a or b is NULL, or count is 0");
    size_t blocks = (count + THREADS - 1) / THREADS;
    blocks = blocks > 65536 ? 65536 : blocks;
    silu_mul_kernel<<<(unsigned)blocks, THREADS, 0, (hipStream_t)s>>>(a, b, count);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* ---- arg-max ----------------------------------------------------------------------------- */

/* Block t: the index of the largest of logits[t] (ties: lowest; NaN skipped; all NaN: 0), as
 * kl_sample_argmax.  Each thread scans a strided share, the groups reduce with shuffles, then
 * thread 0 takes the best of the groups' bests. */
__global__ static void __launch_bounds__(ARGMAX_THREADS)
    argmax_kernel(const float *logits, uint32_t vocab, uint32_t *out)
{
    __shared__ kl_best group_best[ARGMAX_THREADS / KL_GPU_GROUP];
    const float *l = logits + (size_t)blockIdx.x * vocab;
    kl_best b = {-INFINITY, UINT32_MAX, 0.0f};
    for (uint32_t i = threadIdx.x; i < vocab; i += ARGMAX_THREADS) {
        const kl_best c = {l[i], i, 0.0f};
        if (!isnan(c.v) && kl_best_above(c, b))
            b = c;
    }
    b = kl_best_group(b);
    if (threadIdx.x % KL_GPU_GROUP == 0)
        group_best[threadIdx.x / KL_GPU_GROUP] = b;
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    for (int g = 1; g < ARGMAX_THREADS / KL_GPU_GROUP; g++)
        if (kl_best_above(group_best[g], b))
            b = group_best[g];
    out[blockIdx.x] = b.i == UINT32_MAX ? 0 : b.i;
}

extern "C" int kl_gpu_argmax(const float *logits, uint32_t n, uint32_t vocab, uint32_t *out,
                             kl_gpu_stream s, kl_err *err)
{
    if (!logits || !out || n == 0 || vocab == 0 || n > 0x7fffffffu)
        return kl_fail(err, KL_E_USAGE, "argmax: logits or out is NULL, or n or vocab is 0");
    argmax_kernel<<<n, ARGMAX_THREADS, 0, (hipStream_t)s>>>(logits, vocab, out);
    return KL_GPU_CHECK(err, hipGetLastError());
}
