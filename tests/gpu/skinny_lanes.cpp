/*
 * tests/gpu/skinny_lanes.cpp — kernels/skinny.cu's kernels and plan on the CPU at lane level
 * (see skinny_lanes.sh, which cuts their code out of skinny.cu and the split of x out of
 * gemm_split.cuh): a block is its 128 or 256 threads, __syncthreads a barrier over them, and
 * mma.m16n8k16 a barrier over the 32 lanes of a warp after which each lane sums its
 * accumulators from all lanes' fragments as the PTX ISA lays them out (products in double,
 * added to the fp32 accumulator).  Arguments: KIND (bf16, bf16v2: version 2's steps of 128
 * columns, mxfp4) ROWS COLS N [RES8 RES4 [PARTS]] (the blocks of 8 and 4 warps resident
 * at once that the plan fills, default 264 396, the H200's; the output in PARTS row ranges,
 * kl_gpu_skinny_parts, default 1).  Prints the plan and the worst relative L2 error over the
 * n tokens against double; exit 0 when it is at most 1e-6.
 */
#include "kernels/skinny.h"
#include "tests/gpu/lanes.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define __device__
#define __host__
#define __global__
#define __shared__ static /* one array for the block's threads (blocks run one at a time) */
#define __launch_bounds__(...)
#define KL_GPU_GRID_WAIT() ((void)0)
#define KL_GPU_GRID_WAIT_LATER() ((void)0)

struct float4 {
    float x, y, z, w;
};
struct uint2 {
    uint32_t x, y;
};
struct uint4 {
    uint32_t x, y, z, w;
};
static float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static uint2 make_uint2(uint32_t a, uint32_t b) { return {a, b}; }

#include "common/mxfp4_format.h"
#include "kernels/mx_bf16.h"
#include "kernels/skinny_map.h"
#include "skinny_lanes_split.inc"

/* ---- mma.m16n8k16 (bf16 in, fp32 accumulators) over the warp's lanes ---------------------- */

struct frag {
    uint32_t a[4], b[2];
};
static frag posted[8][32];

static double bf16_at(uint32_t pair, uint32_t half)
{
    const uint32_t u = (half ? pair >> 16 : pair & 0xffffu) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A[row][k] is half k % 2 of a[row / 8 + 2 (k / 8)] of lane 4 (row % 8) + (k % 8) / 2; B[k][col]
 * half k % 2 of b[k / 8] of lane 4 col + (k % 8) / 2; c[i] is C[g + 8 (i / 2)][2 t + i % 2]. */
static void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t = l % 4;
    posted[w][l] = {{a[0], a[1], a[2], a[3]}, {b0, b1}};
    pthread_barrier_wait(&group_bar[w]);
    for (unsigned i = 0; i < 4; i++) {
        const unsigned row = g + 8 * (i / 2), col = 2 * t + i % 2;
        double s = 0;
        for (unsigned k = 0; k < 16; k++) {
            const frag &fa = posted[w][4 * (row % 8) + (k % 8) / 2];
            const frag &fb = posted[w][4 * col + (k % 8) / 2];
            s += bf16_at(fa.a[row / 8 + 2 * (k / 8)], k % 2) * bf16_at(fb.b[k / 8], k % 2);
        }
        c[i] = (float)((double)c[i] + s);
    }
    pthread_barrier_wait(&group_bar[w]);
}

#include "skinny_lanes_kernel.inc"

/* ---- the grid -------------------------------------------------------------------------------- */

/* The sum kernel needs no barriers: its threads one after another on this one. */
static void run_sum(uint32_t count, uint32_t splits, uint32_t rows, const kl_gpu_skinny_out &y)
{
    gridDim = {(count + 255) / 256, 1, 1}, blockDim = {256, 1, 1};
    for (uint32_t b = 0; b < gridDim.x; b++)
        for (uint32_t i = 0; i < 256; i++) {
            blockIdx = {b, 0, 0}, threadIdx = {i, 0, 0};
            skinny_sum_kernel(count, splits, rows, y);
        }
}

template <int MX, int NT, int U>
static void run(const kl_gpu_mat &w, const float *x, uint32_t n, const kl_gpu_skinny_out &y,
                const sk_plan &p)
{
    lanes_grid({p.tiles, p.splits, 1}, 32 * p.warps,
               [&] { skinny_kernel<MX, NT, U>(w, x, n, y, p.span); }, [] {});
    if (p.splits > 1)
        run_sum(n * w.rows, p.splits, w.rows, y);
}

/* The kernel for n tokens: U units a step (BF16 version 1: 2; version 2 and MXFP4: 4). */
template <int MX, int U>
static void run_n(const kl_gpu_mat &w, const float *x, uint32_t n, const kl_gpu_skinny_out &y,
                  const sk_plan &p)
{
    if (n <= 8)
        run<MX, 1, U>(w, x, n, y, p);
    else if (n <= 16)
        run<MX, 2, U>(w, x, n, y, p);
    else
        run<MX, 4, U>(w, x, n, y, p);
}

static uint64_t rng = 88172645463325252ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

int main(int argc, char **argv)
{
    if (argc < 5 || argc == 6 || argc > 8) {
        fprintf(stderr, "usage: skinny_lanes bf16|bf16v2|mxfp4 ROWS COLS N [RES8 RES4 [PARTS]]\n");
        return 2;
    }
    const int mx = !strcmp(argv[1], "mxfp4");
    const uint32_t rows = (uint32_t)atoi(argv[2]), cols = (uint32_t)atoi(argv[3]);
    const uint32_t n = (uint32_t)atoi(argv[4]);
    const uint32_t res8 = argc >= 7 ? (uint32_t)atoi(argv[5]) : 264;
    const uint32_t res4 = argc >= 7 ? (uint32_t)atoi(argv[6]) : 396;
    const uint32_t parts = argc == 8 ? (uint32_t)atoi(argv[7]) : 1;
    if (n < 2 || n > 32 || rows == 0 || cols == 0 || cols % KL_SK_GRAN || parts < 1 ||
        parts > KL_GPU_SKINNY_MAX_PARTS || parts > rows) {
        fprintf(stderr, "skinny_lanes: 2 <= N <= 32, COLS a multiple of 128, 1 <= PARTS <= "
                        "min(ROWS, 8)\n");
        return 2;
    }
    /* W: bf16 in [-1, 1); MXFP4 random codes, scales 2^-8 .. 2^7 and every 13th block 2^-126
     * (the decode's float path) */
    std::vector<uint16_t> wb(mx ? 0 : (size_t)rows * cols);
    std::vector<uint8_t> packed(mx ? (size_t)rows * cols / 2 : 0);
    std::vector<uint8_t> scale(mx ? (size_t)rows * cols / KL_MXFP4_BLOCK : 0);
    for (auto &v : wb)
        v = (uint16_t)((next_u32() & 0x807fu) | (0x3f00u - (next_u32() % 8) * 0x80u));
    for (auto &v : packed)
        v = (uint8_t)next_u32();
    for (size_t i = 0; i < scale.size(); i++)
        scale[i] = i % 13 == 5 ? 1 : (uint8_t)(119 + next_u32() % 16);
    std::vector<float> x((size_t)n * cols), y((size_t)n * rows, NAN);
    for (auto &v : x)
        v = ldexpf((float)((int32_t)(next_u32() % (1u << 24)) - (1 << 23)), -23 - next_u32() % 6);
    kl_gpu_mat w;
    memset(&w, 0, sizeof w);
    w.kind = mx ? KL_GPU_W_MXFP4 : KL_GPU_W_BF16;
    w.rows = rows, w.cols = cols;
    w.data = wb.data(), w.packed = packed.data(), w.scale = scale.data();
    const uint32_t nt = n <= 8 ? 1 : n <= 16 ? 2 : 4;
    const sk_plan p = sk_plan_for(rows, cols, n, nt == 4, res8, res4);
    /* PARTS outputs of rows split unevenly (part i ends at rows (i + 1)^2 / PARTS^2) */
    kl_gpu_skinny_out out;
    memset(&out, 0, sizeof out);
    out.count = parts;
    std::vector<std::vector<float>> ys(parts);
    for (uint32_t i = 0; i < parts; i++) {
        const uint64_t e = (uint64_t)rows * (i + 1) * (i + 1) / ((uint64_t)parts * parts);
        out.end[i] = e > (i ? out.end[i - 1] : 0) ? (uint32_t)e : (i ? out.end[i - 1] : 0) + 1;
        if (i + 1 == parts)
            out.end[i] = rows;
        ys[i].assign((size_t)n * (out.end[i] - (i ? out.end[i - 1] : 0)), NAN);
        out.y[i] = ys[i].data();
    }
    if (mx)
        run_n<1, 4>(w, x.data(), n, out, p);
    else if (!strcmp(argv[1], "bf16v2"))
        run_n<0, 4>(w, x.data(), n, out, p);
    else
        run_n<0, 2>(w, x.data(), n, out, p);
    for (uint32_t i = 0, r0 = 0; i < parts; r0 = out.end[i++]) /* y [n, rows] from the parts */
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t r = r0; r < out.end[i]; r++)
                y[(size_t)t * rows + r] = ys[i][(size_t)t * (out.end[i] - r0) + r - r0];
    double worst = 0;
    std::vector<float> row(cols);
    std::vector<double> ref((size_t)n * rows);
    for (uint32_t r = 0; r < rows; r++) {
        for (uint32_t c = 0; c < cols; c++) {
            if (mx) {
                const uint8_t b = packed[((size_t)r * cols + c) / 2];
                row[c] = kl_e2m1_value(c % 2 ? b >> 4 : b & 15u) *
                         kl_e8m0_value(scale[((size_t)r * cols + c) / KL_MXFP4_BLOCK]);
            } else {
                row[c] = (float)bf16_at(wb[(size_t)r * cols + c], 0);
            }
        }
        for (uint32_t t = 0; t < n; t++) {
            double s = 0;
            for (uint32_t c = 0; c < cols; c++)
                s += (double)row[c] * x[(size_t)t * cols + c];
            ref[(size_t)t * rows + r] = s;
        }
    }
    for (uint32_t t = 0; t < n; t++) {
        double e = 0, m = 0;
        for (uint32_t r = 0; r < rows; r++) {
            const double d = y[(size_t)t * rows + r] - ref[(size_t)t * rows + r];
            e += d * d, m += ref[(size_t)t * rows + r] * ref[(size_t)t * rows + r];
        }
        const double rel = sqrt(e) / (m > 0 ? sqrt(m) : 1.0);
        worst = rel > worst || rel != rel ? rel : worst;
    }
    printf("skinny_lanes %s %ux%u n=%u: warps %u, tiles %u, splits %u of %u columns, %u output "
           "parts: rel L2 %.3g\n",
           argv[1], rows, cols, n, p.warps, p.tiles, p.splits, p.span, parts, worst);
    return worst <= 1e-6 ? 0 : 1;
}
