/*
 * kernels/row_dot.cuh — device code that kernels/dense.cu and kernels/moe.cu share: one weight
 * row (any kl_gpu_wkind) against up to NT fp32 vectors, summed by one group of KL_GPU_GROUP
 * lanes, and the (value, index) arg-max step of the reductions.  Included by .cu files only.
 *
 * Row dot, decode being bound by the weight bytes: the group reads its row in 16-byte pieces
 * (F32: 4 weights, BF16: 8) or, for MXFP4, 4-byte words of 8 codes (4 lanes per 32-block, so
 * the group's x loads are 1 KiB contiguous per step), lane l taking pieces l, l + 32, ...;
 * KL_ROW_UNROLL pieces are loaded before the first is used, so several loads are in flight
 * per lane.  x comes from global memory (L1-cached: every group of the block reads the same
 * x).  Each lane sums in fp32 (MXFP4: the 8 unscaled products, then times the block's 2^e,
 * exact), then the lanes' sums are added by kl_gpu_group_sum.  F32/BF16 rows that are not
 * 16-byte aligned (or x that is not) take a plain path: lane l reads elements l, l + 32, ...
 */
#ifndef KL_KERNELS_ROW_DOT_CUH
#define KL_KERNELS_ROW_DOT_CUH

#include "kernels/gpu.h"
#include "kernels/gpu_api.h"

#include "common/mxfp4_format.h"

#include <type_traits>

#define KL_ROW_UNROLL 8    /* pieces per lane loaded before the first is used */
#define KL_ROW_TARGET 8192 /* groups a product should have in all (the GPU full of loads) */
#define KL_ROW_WARPS  8 /* groups per block in the kernels that give a group one row */
#define KL_XREG_WARPS 4 /* groups per block of the MXFP4 kernels with x in registers */

/* The fp32 vectors a row meets: vector t at x + t * ld, t < nt (nt <= NT of the call). */
struct kl_row_x {
    const float *x;
    size_t       ld;
    uint32_t     nt;
};

__device__ static inline float kl_bf16_f32(uint32_t b)
{
    return __uint_as_float(b << 16);
}

/* The E2M1 code table of the block: kl_row_lut_init fills it (every kernel that decodes MXFP4
 * calls it first, then a barrier); a file-scope symbol, so a load from it takes the byte
 * offset of the code as its only register. */
static __shared__ float kl_row_lut[16];

__device__ static inline void kl_row_lut_init(void)
{
    if (threadIdx.x < 16)
        kl_row_lut[threadIdx.x] = kl_e2m1_value(threadIdx.x);
}

/* Σ_i E2M1(code i of q) · x[i] over the 8 codes of word q, in code order.  Each code's table
 * offset (code · 4) is a byte of a masked copy of q (even codes from q << 2, odd ones from
 * q >> 2), taken by one byte permute: three instructions per weight with the load and FMA. */
__device__ static inline float kl_mxfp4_word_dot(uint32_t q, const float *x)
{
    const uint32_t ev = (q << 2) & 0x3c3c3c3cu, od = (q >> 2) & 0x3c3c3c3cu;
    const char *t = (const char *)kl_row_lut;
    float part = 0.0f;
#pragma unroll
    for (int b = 0; b < 4; b++) {
        part = fmaf(*(const float *)(t + __byte_perm(ev, 0, 0x4440 + b)), x[2 * b], part);
        part = fmaf(*(const float *)(t + __byte_perm(od, 0, 0x4440 + b)), x[2 * b + 1], part);
    }
    return part;
}

/* acc[t] += Σ_j w[j] · x_t[col + j], j < V (V a multiple of 4; x_t + col 16-byte aligned). */
template <int NT, int V>
__device__ static inline void kl_row_dotv(const float *w, kl_row_x xs, size_t col, float *acc)
{
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if ((uint32_t)t < xs.nt) { /* no break: hipcc then cannot unroll */
            const float4 *x4 = (const float4 *)(xs.x + t * xs.ld + col);
#pragma unroll
            for (int q = 0; q < V / 4; q++) {
                const float4 a = x4[q];
                acc[t] = fmaf(w[4 * q + 0], a.x, acc[t]);
                acc[t] = fmaf(w[4 * q + 1], a.y, acc[t]);
                acc[t] = fmaf(w[4 * q + 2], a.z, acc[t]);
                acc[t] = fmaf(w[4 * q + 3], a.w, acc[t]);
            }
        }
    }
}

/* Weights of one 16-byte piece as fp32: F32 gives 4, BF16 8. */
__device__ static inline void kl_row_unpack(uint4 q, float *w, int bf16)
{
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (bf16) {
            w[2 * k] = kl_bf16_f32(u[k] & 0xffffu);
            w[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
        } else {
            w[k] = __uint_as_float(u[k]);
        }
    }
}

/* F32 (V = 4) or BF16 (V = 8) row in 16-byte pieces: cols % V == 0, row 16-byte aligned. */
template <int NT, int V>
__device__ static void kl_row_vec(const void *row, uint32_t cols, kl_row_x xs, unsigned lane,
                                  unsigned lanes, float *acc)
{
    const uint4 *p = (const uint4 *)row;
    const uint32_t np = cols / V;
    for (uint32_t c0 = lane; c0 < np; c0 += lanes * KL_ROW_UNROLL) {
        uint4 q[KL_ROW_UNROLL];
#pragma unroll
        for (int u = 0; u < KL_ROW_UNROLL; u++) {
            const uint32_t c = c0 + u * lanes;
            q[u] = c < np ? p[c] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < KL_ROW_UNROLL; u++) {
            const uint32_t c = c0 + u * lanes;
            if (c < np) {
                float w[8];
                kl_row_unpack(q[u], w, V == 8);
                kl_row_dotv<NT, V>(w, xs, (size_t)c * V, acc);
            }
        }
    }
}

/* MXFP4 row: words of 8 codes; word c lies in block c / 4 (cols % 32 == 0). */
template <int NT>
__device__ static void kl_row_mxfp4(const uint8_t *packed, const uint8_t *scale, uint32_t cols,
                                    kl_row_x xs, unsigned lane, unsigned lanes, float *acc)
{
    const uint32_t *p = (const uint32_t *)packed;
    const uint32_t nw = cols / 8;
    for (uint32_t c0 = lane; c0 < nw; c0 += lanes * KL_ROW_UNROLL) {
        uint32_t q[KL_ROW_UNROLL];
        uint8_t s[KL_ROW_UNROLL];
#pragma unroll
        for (int u = 0; u < KL_ROW_UNROLL; u++) {
            const uint32_t c = c0 + u * lanes;
            q[u] = c < nw ? p[c] : 0u;
            s[u] = c < nw ? scale[c / 4] : (uint8_t)KL_E8M0_BIAS;
        }
#pragma unroll
        for (int u = 0; u < KL_ROW_UNROLL; u++) {
            const uint32_t c = c0 + u * lanes;
            if (c >= nw)
                continue;
            float part[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                part[t] = 0.0f;
                if ((uint32_t)t < xs.nt) {
                    const float4 *x4 = (const float4 *)(xs.x + t * xs.ld + (size_t)c * 8);
                    const float4 a = x4[0], b = x4[1];
                    const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                    part[t] = kl_mxfp4_word_dot(q[u], xv);
                }
            }
            const float x = kl_e8m0_value(s[u]);
#pragma unroll
            for (int t = 0; t < NT; t++)
                acc[t] = fmaf(part[t], x, acc[t]);
        }
    }
}

/* F32/BF16 row, any alignment: lane l takes elements l, l + lanes, ... */
template <int NT>
__device__ static void kl_row_plain(const void *row, int bf16, uint32_t cols, kl_row_x xs,
                                    unsigned lane, unsigned lanes, float *acc)
{
    for (uint32_t c = lane; c < cols; c += lanes) {
        const float w = bf16 ? kl_bf16_f32(((const uint16_t *)row)[c]) : ((const float *)row)[c];
#pragma unroll
        for (int t = 0; t < NT; t++)
            if ((uint32_t)t < xs.nt)
                acc[t] = fmaf(w, xs.x[t * xs.ld + c], acc[t]);
    }
}

/* acc[t] = Σ_c W[r][c] · x_t[c] for t < xs.nt, summed over the group, on every lane of it.
 * lane of lanes (a multiple of KL_GPU_GROUP): the row's pieces are split among that many lanes,
 * the group taking its share (the caller adds the groups' sums when lanes > KL_GPU_GROUP).
 * vec: the 16-byte paths may be used (kl_row_vec_ok).  MXFP4: kl_row_lut_init first. */
template <int NT>
__device__ static void kl_row_dot(const kl_gpu_mat &m, size_t r, kl_row_x xs, int vec,
                                  unsigned lane, unsigned lanes, float *acc)
{
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    const uint32_t cols = m.cols;
    if (m.kind == KL_GPU_W_MXFP4) {
        kl_row_mxfp4<NT>(m.packed + r * (cols / 2), m.scale + r * (cols / KL_MXFP4_BLOCK), cols,
                         xs, lane, lanes, acc);
    } else {
        const int bf16 = m.kind == KL_GPU_W_BF16;
        const void *row = (const uint8_t *)m.data + r * cols * (bf16 ? 2 : 4);
        if (!vec)
            kl_row_plain<NT>(row, bf16, cols, xs, lane, lanes, acc);
        else if (bf16)
            kl_row_vec<NT, 8>(row, cols, xs, lane, lanes, acc);
        else
            kl_row_vec<NT, 4>(row, cols, xs, lane, lanes, acc);
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = kl_gpu_group_sum(acc[t]);
}

/* ---- MXFP4 against one vector held in registers ------------------------------------------ */

/* The vector of an MXFP4 product for one lane: its words c = lane + 32 j (j < S) of 8 codes,
 * 8 floats each (0 past cols), loaded once and kept for every row the group multiplies: the
 * only shared-memory reads left are the code table's, one per weight. */
template <int S> struct kl_xreg {
    float v[S][8];
};

/* The S a row of cols columns needs (1, 2, 4, 9 or 16), or 0: more than 4096 columns. */
static inline int kl_xreg_s(uint32_t cols)
{
    const uint32_t need = (cols / 8 + KL_GPU_GROUP - 1) / KL_GPU_GROUP;
    return need <= 1 ? 1 : need <= 2 ? 2 : need <= 4 ? 4 : need <= 9 ? 9 : need <= 16 ? 16 : 0;
}

template <int S>
__device__ static inline void kl_xreg_load(kl_xreg<S> &xr, const float *x, uint32_t cols,
                                           unsigned lane)
{
    const float4 *x4 = (const float4 *)x;
#pragma unroll
    for (int j = 0; j < S; j++) {
        const uint32_t c = lane + j * KL_GPU_GROUP;
        const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float4 a = c < cols / 8 ? x4[2 * c] : z, b = c < cols / 8 ? x4[2 * c + 1] : z;
        const float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 8; i++)
            xr.v[j][i] = f[i];
    }
}

/* The words and scale bytes of R MXFP4 rows that lane needs: loaded by kl_mxw_load, used by
 * kl_mxw_dot, so a group can load the next rows before it multiplies these (two sets in
 * flight).  Words past the row read as code 0 with scale byte 0, which adds exactly 0. */
template <int S, int R> struct kl_mxw {
    uint32_t q[R][S], e[R][S];
};

template <int S, int R>
__device__ static inline void kl_mxw_load(kl_mxw<S, R> &w, const uint8_t *const *rows,
                                          const uint8_t *const *scales, uint32_t cols,
                                          unsigned lane)
{
    const uint32_t nw = cols / 8;
#pragma unroll
    for (int k = 0; k < R; k++) {
#pragma unroll
        for (int j = 0; j < S; j++) {
            const uint32_t c = lane + j * KL_GPU_GROUP;
            w.q[k][j] = c < nw ? ((const uint32_t *)rows[k])[c] : 0u;
            w.e[k][j] = c < nw ? scales[k][c / 4] : 0u;
        }
    }
}

/* out[k] = row k of w dotted with xr, summed over the group (on every lane). */
template <int S, int R>
__device__ static inline void kl_mxw_dot(const kl_mxw<S, R> &w, const kl_xreg<S> &xr,
                                         float *out)
{
#pragma unroll
    for (int k = 0; k < R; k++) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < S; j++) {
            const float part = kl_mxfp4_word_dot(w.q[k][j], xr.v[j]);
            acc = fmaf(part, kl_e8m0_value((uint8_t)w.e[k][j]), acc);
        }
        out[k] = kl_gpu_group_sum(acc);
    }
}

/* Runs a group over units u0 .. u1 (a unit: R rows, their addresses set by at(u, rows,
 * scales)), the next unit's loads issued before this one's products; done(u, out) takes
 * each unit's R sums. */
template <int S, int R, class At, class Done>
__device__ static inline void kl_mxw_run(size_t u0, size_t u1, uint32_t cols,
                                         const kl_xreg<S> &xr, unsigned lane,
                                         At at, Done done)
{
    const uint8_t *rows[R], *scales[R];
    kl_mxw<S, R> a, b;
    float out[R];
    at(u0, rows, scales);
    kl_mxw_load<S, R>(a, rows, scales, cols, lane);
    for (size_t u = u0; u < u1; u += 2) {
        if (u + 1 < u1) {
            at(u + 1, rows, scales);
            kl_mxw_load<S, R>(b, rows, scales, cols, lane);
        }
        kl_mxw_dot<S, R>(a, xr, out);
        done(u, out);
        if (u + 1 >= u1)
            break;
        if (u + 2 < u1) {
            at(u + 2, rows, scales);
            kl_mxw_load<S, R>(a, rows, scales, cols, lane);
        }
        kl_mxw_dot<S, R>(b, xr, out);
        done(u + 1, out);
    }
}

/* Calls f(std::integral_constant<int, S>()) for S = 1, 2, 4, 9 or 16 (kl_xreg_s's values). */
template <class F> static inline void kl_xreg_dispatch(int s, F f)
{
    switch (s) {
    case 1: f(std::integral_constant<int, 1>()); break;
    case 2: f(std::integral_constant<int, 2>()); break;
    case 4: f(std::integral_constant<int, 4>()); break;
    case 9: f(std::integral_constant<int, 9>()); break;
    default: f(std::integral_constant<int, 16>()); break;
    }
}

/* ---- MXFP4 against one vector, version 2 (KL_GPU_MX unset; v1 above) ------------------- */

/* A team of KL_MX2_TEAM lanes computes R rows against x held in shared memory: lane tl of the
 * team takes the 32-blocks b = tl, tl + 8, ... of every row, each as one 16-byte load of its
 * 32 codes plus its scale byte, so R rows share each x load.  Codes are decoded with integer
 * ops (no table): kl_mx2_pair builds the fp16 bits of 2^-14 times two E2M1 values (codes
 * 0 and 1 fall on fp16 subnormals, which the fp16 -> fp32 conversion makes exact), and the
 * row's sum is multiplied by 2^14 at the end.  Registers stay few (no x in them), so an SM
 * holds many more warps than the v1 kernels' 8. */
#define KL_MX2_TEAM     8    /* lanes per team (must divide KL_GPU_GROUP) */
#define KL_MX2_THREADS  256  /* threads of a v2 block: 32 teams */
#define KL_MX2_TEAMS    (KL_MX2_THREADS / KL_MX2_TEAM)
#define KL_MX2_UNROLL   3    /* 16-byte loads per row and lane issued before the first is used */
#define KL_MX2_MAX_COLS 8192 /* x in shared memory: at most 32 KiB */
#define KL_MX2_MIN_BLOCKS 4  /* blocks an SM holds: registers capped at 64 a thread */

/* The fp16 bits of 2^-14 · E2M1 of codes k (low half) and k + 4 (high half) of the 8 codes of
 * word q (code i in bits 4i..4i+3): magnitude bits to 9..11 (and 25..27), sign to 15 (31). */
__device__ static inline uint32_t kl_mx2_pair(uint32_t q, int k)
{
    const uint32_t m = k < 3 ? q << (9 - 4 * k) : q >> 3;
    return (m & 0x0e000e00u) | ((q << (12 - 4 * k)) & 0x80008000u);
}

__device__ static inline float kl_mx2_half(uint32_t bits)
{
    return __half2float(__ushort_as_half((unsigned short)bits));
}

/* part + 2^-14 · Σ_i E2M1(code i of q) · x_i over the word's 8 codes, x_0..3 = a, x_4..7 = b. */
__device__ static inline float kl_mx2_word_dot(uint32_t q, float4 a, float4 b, float part)
{
    const float xa[4] = {a.x, a.y, a.z, a.w}, xb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t h = kl_mx2_pair(q, k);
        part = fmaf(kl_mx2_half(h & 0xffffu), xa[k], part);
        part = fmaf(kl_mx2_half(h >> 16), xb[k], part);
    }
    return part;
}

/* x [cols] (16-byte aligned, cols % 32 == 0) into shared sh, float4 c (0..7) of 32-block b at
 * b * 8 + (c ^ (b % 8)) (kl_mx2_x_at of f = b * 8 + c): the 8 lanes of a team read the same c
 * of blocks b = 0..7 (mod 8), which then lie in 8 different quads of banks.  Every thread of
 * the block; a barrier after. */
__device__ static inline uint32_t kl_mx2_x_at(uint32_t f)
{
    return (f & ~7u) | ((f & 7u) ^ ((f >> 3) & 7u));
}

__device__ static inline void kl_mx2_x_fill(float4 *sh, const float *x, uint32_t cols)
{
    const float4 *x4 = (const float4 *)x;
    for (uint32_t f = threadIdx.x; f < cols / 4; f += blockDim.x)
        sh[kl_mx2_x_at(f)] = x4[f];
}

/* The team of this thread (0 .. KL_MX2_TEAMS - 1) and its place tl in it. */
__device__ static inline unsigned kl_mx2_team(unsigned *tl)
{
    *tl = threadIdx.x % KL_MX2_TEAM;
    return threadIdx.x / KL_MX2_TEAM;
}

/* One round of a team lane's loads for R rows: blocks b0 + u * KL_MX2_TEAM, u < U (the
 * unroll, KL_MX2_UNROLL unless a kernel asks for more in flight), of each row (row i: codes
 * rows[i], 16-byte aligned; scale bytes scales[i]); past nb: 0. */
template <int R, int U = KL_MX2_UNROLL> struct kl_mx2_buf {
    uint4    q[U][R];
    uint32_t s[U][R];
};

template <int R, int U = KL_MX2_UNROLL>
__device__ static inline void kl_mx2_load(kl_mx2_buf<R, U> &w, const uint8_t *const *rows,
                                          const uint8_t *const *scales, uint32_t nb,
                                          uint32_t b0)
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        const uint32_t b = b0 + u * KL_MX2_TEAM;
#pragma unroll
        for (int i = 0; i < R; i++) {
            w.q[u][i] = b < nb ? ((const uint4 *)rows[i])[b] : make_uint4(0, 0, 0, 0);
            w.s[u][i] = b < nb ? scales[i][b] : 0u;
        }
    }
}

/* acc[i] += the round's blocks of row i times x (from kl_mx2_x_fill), 2^-14 scaled. */
template <int R, int U = KL_MX2_UNROLL>
__device__ static inline void kl_mx2_dot(const kl_mx2_buf<R, U> &w, const float4 *xs,
                                         uint32_t nb, uint32_t b0, float *acc)
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        const uint32_t b = b0 + u * KL_MX2_TEAM;
        if (b >= nb)
            continue;
        const float4 *xb = xs + (size_t)b * 8;
        const unsigned sw = b % 8;
        float part[R];
#pragma unroll
        for (int i = 0; i < R; i++)
            part[i] = 0.0f;
#pragma unroll
        for (int v = 0; v < 4; v++) {
            const float4 lo = xb[(2 * v) ^ sw], hi = xb[(2 * v + 1) ^ sw];
#pragma unroll
            for (int i = 0; i < R; i++) {
                const uint4 &q = w.q[u][i];
                const uint32_t word = v == 0 ? q.x : v == 1 ? q.y : v == 2 ? q.z : q.w;
                part[i] = kl_mx2_word_dot(word, lo, hi, part[i]);
            }
        }
#pragma unroll
        for (int i = 0; i < R; i++)
            acc[i] = fmaf(part[i], kl_e8m0_value((uint8_t)w.s[u][i]), acc[i]);
    }
}

/* out[i] = the team's sum of acc[i] times unit (2^14 for kl_mx2_dot's sums: the codes were
 * decoded as 2^-14 E2M1), on every lane of the team. */
template <int R>
__device__ static inline void kl_mx2_team_sums(float *acc, float *out, float unit = 16384.0f)
{
#pragma unroll
    for (int i = 0; i < R; i++) {
        for (int o = KL_MX2_TEAM / 2; o > 0; o /= 2)
            acc[i] += kl_gpu_shfl_xor(acc[i], o);
        out[i] = acc[i] * unit;
    }
}

/* out[i] = row i · x over nb 32-blocks, on every lane of the team; w holds the first round
 * (kl_mx2_load at b0 = tl, issued before the x fill so both are in flight together).  Every
 * lane of the group must call it (the team's sums are shuffles); a team with no row passes
 * any valid one. */
template <int R, int U = KL_MX2_UNROLL>
__device__ static inline void kl_mx2_rows(kl_mx2_buf<R, U> &w, const uint8_t *const *rows,
                                          const uint8_t *const *scales, uint32_t nb,
                                          const float4 *xs, unsigned tl, float *out)
{
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; i++)
        acc[i] = 0.0f;
    for (uint32_t b0 = tl; b0 < nb; b0 += KL_MX2_TEAM * U) {
        if (b0 != tl)
            kl_mx2_load<R, U>(w, rows, scales, nb, b0);
        kl_mx2_dot<R, U>(w, xs, nb, b0, acc);
    }
    kl_mx2_team_sums<R>(acc, out);
}

/* The rounds of a team's R rows with each round's loads issued before the round before it is
 * multiplied (two buffers), so a lane's loads and its arithmetic overlap instead of taking
 * turns: dot(buf, b0, acc) multiplies a round (kl_mx2_dot, or mx_int8.cuh's integer form),
 * out[i] = the team's sums times unit.  w holds the first round. */
template <int R, int U, typename Dot>
__device__ static inline void kl_mx2_rounds_pipe(kl_mx2_buf<R, U> &w, const uint8_t *const *rows,
                                                 const uint8_t *const *scales, uint32_t nb,
                                                 unsigned tl, float *out, Dot dot, float unit)
{
    constexpr uint32_t STEP = KL_MX2_TEAM * U;
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; i++)
        acc[i] = 0.0f;
    kl_mx2_buf<R, U> n;
    for (uint32_t b0 = tl; b0 < nb; b0 += 2 * STEP) {
        if (b0 + STEP < nb)
            kl_mx2_load<R, U>(n, rows, scales, nb, b0 + STEP);
        dot(w, b0, acc);
        if (b0 + STEP >= nb)
            break;
        if (b0 + 2 * STEP < nb)
            kl_mx2_load<R, U>(w, rows, scales, nb, b0 + 2 * STEP);
        dot(n, b0 + STEP, acc);
    }
    kl_mx2_team_sums<R>(acc, out, unit);
}

/* kl_mx2_rows with the rounds pipelined (kl_mx2_rounds_pipe): the same sums in the same
 * order, so bitwise the same out. */
template <int R, int U = KL_MX2_UNROLL>
__device__ static inline void kl_mx2_rows_pipe(kl_mx2_buf<R, U> &w, const uint8_t *const *rows,
                                               const uint8_t *const *scales, uint32_t nb,
                                               const float4 *xs, unsigned tl, float *out)
{
    kl_mx2_rounds_pipe<R, U>(
        w, rows, scales, nb, tl, out,
        [&](const kl_mx2_buf<R, U> &b, uint32_t b0, float *acc) {
            kl_mx2_dot<R, U>(b, xs, nb, b0, acc);
        },
        16384.0f);
}

/* A block's one-pass product: each team's first loads (into w), fill() staging x in shared
 * memory (every thread of the block: no thread may leave before), the barrier, then
 * multiply(w, nb): the team's R rows.  cols: x's length. */
template <int R, int U, typename Fill, typename Multiply>
__device__ static inline void kl_mx2_block_run(const uint8_t *const *rows,
                                               const uint8_t *const *scales, uint32_t cols,
                                               unsigned tl, Fill fill, Multiply multiply)
{
    const uint32_t nb = cols / KL_MXFP4_BLOCK;
    kl_mx2_buf<R, U> w;
    kl_mx2_load<R, U>(w, rows, scales, nb, tl);
    fill();
    __syncthreads();
    multiply(w, nb);
}

/* kl_mx2_block_run of the v2 product: x [cols] into shared sh (kl_mx2_x_fill), the rows by
 * kl_mx2_rows (PIPE: kl_mx2_rows_pipe). */
template <int R, int U = KL_MX2_UNROLL, bool PIPE = false>
__device__ static inline void kl_mx2_block_dot(const uint8_t *const *rows,
                                               const uint8_t *const *scales, const float *x,
                                               uint32_t cols, float4 *sh, unsigned tl,
                                               float *out)
{
    kl_mx2_block_run<R, U>(
        rows, scales, cols, tl, [&] { kl_mx2_x_fill(sh, x, cols); },
        [&](kl_mx2_buf<R, U> &w, uint32_t nb) {
            if (PIPE)
                kl_mx2_rows_pipe<R, U>(w, rows, scales, nb, sh, tl, out);
            else
                kl_mx2_rows<R, U>(w, rows, scales, nb, sh, tl, out);
        });
}

/* 0, or KL_E_USAGE naming what: a matrix a launcher can multiply (MXFP4: cols % 32 == 0,
 * 16-byte aligned packed payload). */
static inline int kl_row_mat_check(const kl_gpu_mat *m, const char *what, kl_err *err)
{
    if (!m || m->rows == 0 || m->cols == 0)
        return kl_fail(err, KL_E_USAGE, "%s: no matrix, or an empty one", what);
    if (m->kind == KL_GPU_W_MXFP4) {
        if (!m->packed || !m->scale || m->cols % KL_MXFP4_BLOCK || (uintptr_t)m->packed % 16)
            return kl_fail(err, KL_E_USAGE,
                           "%s: MXFP4 %u x %u needs packed (16-byte aligned) and scale, "
                           "cols a multiple of 32", what, m->rows, m->cols);
        return 0;
    }
    if (m->kind != KL_GPU_W_F32 && m->kind != KL_GPU_W_BF16)
        return kl_fail(err, KL_E_USAGE, "%s: weight kind %d is not F32, BF16 or MXFP4", what,
                       (int)m->kind);
    if (!m->data)
        return kl_fail(err, KL_E_USAGE, "%s: data is NULL", what);
    return 0;
}

/* Whether rows of m may take the 16-byte paths against vectors at x with leading dimension
 * ld (MXFP4 always does: the launchers refuse x that it cannot). */
static inline int kl_row_vec_ok(const kl_gpu_mat *m, const float *x, size_t ld)
{
    const uint32_t v = m->kind == KL_GPU_W_BF16 ? 8 : 4;
    const int x_ok = (uintptr_t)x % 16 == 0 && ld % 4 == 0;
    if (m->kind == KL_GPU_W_MXFP4)
        return x_ok;
    return x_ok && (uintptr_t)m->data % 16 == 0 && m->cols % v == 0;
}

/* ---- arg-max ------------------------------------------------------------------------------ */

/* A candidate: value v of index i (none: v = -inf, i = UINT32_MAX), p carried along. */
struct kl_best {
    float    v;
    uint32_t i;
    float    p;
};

/* a ranks above b: larger value, or equal value and lower index (a total order). */
__device__ static inline int kl_best_above(kl_best a, kl_best b)
{
    return a.v > b.v || (a.v == b.v && a.i < b.i);
}

/* The best candidate of the group, on every lane. */
__device__ static inline kl_best kl_best_group(kl_best b)
{
    for (int o = KL_GPU_GROUP / 2; o > 0; o /= 2) {
        kl_best c = {kl_gpu_shfl_xor(b.v, o), kl_gpu_shfl_xor(b.i, o), kl_gpu_shfl_xor(b.p, o)};
        if (kl_best_above(c, b))
            b = c;
    }
    return b;
}

#endif
