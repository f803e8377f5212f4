/*
 * kernels/moe.cu — router top-k and the routed experts on the GPU (see moe.h).
 *
 * kl_gpu_route: one group of 32 lanes per token (kernels/route.cuh); past 256 experts each
 * lane's scores in shared memory, touched by no other lane, so no barrier (session 16's
 * trace: 6.0 us a decode step's router before the scores moved into registers, 4.3 after).
 * At decode it usually rides in the shared expert's down launch (kl_gpu_matmul_glu_route).
 *
 * kl_gpu_experts, three launches, each slot (token t, choice k) on its own:
 *   gate_up: a group per (slot, row of I): h[slot] = SiLU(w1_e x_t) ⊙ (w3_e x_t)
 *   down:    a group per (slot, row of H): part[slot] = wt · (w2_e h[slot])
 *   combine: a thread per (t, column): y_t (+)= Σ_k part[t, k] in k order (deterministic).
 * Only the chosen experts' rows are read; a token's expert chosen twice (impossible from the
 * router) or by two tokens is read once per slot.  Scratch: h [n·top_k, I] then part
 * [n·top_k, H].  An expert id outside [0, E) gives NaN outputs instead of a stray read.
 *
 * Decode, MXFP4 (version 3, the default; KL_GPU_MOE_DECODE=v2 the launches above, with
 * experts_mx2_kernel as gate_up and down).  Counting at Kimi-Linear's shapes, n = 1, top 8 of
 * 256, I = 1024, H = 2304, on an H200 (132 SMs, copy rate ~4.2 TB/s, a load ~1-1.5 us under
 * load): gate and up read 8 · 2 · 1024 rows of 1152 code bytes + 72 scale bytes = 20.1 MB,
 * down 8 · 2304 rows of 512 + 32 = 10.0 MB: 30.1 MB, 7.2 us at the copy rate.  Little's law:
 * 4.2 TB/s · ~1.5 us = ~6 MB in flight, ~48 KB per SM.  Version 2 has ~2 gate_up blocks an SM
 * (256 blocks) whose lanes keep 6 loads of 16 bytes in flight and wait for them 3 times in a
 * row (9 blocks of 32 codes per lane and row, 3 at a time), the down launch twice more, and
 * a third launch for the sum: 23.7 us (0.30 of the copy rate), mostly latency and the gaps of
 * three dependent launches.  Version 3:
 *   gate_up: the same blocks (32 rows of I, slot), each team lane issuing all 18 of its
 *     16-byte loads (GU_UNROLL 9 blocks of the gate and the up row; 128 registers, 2 blocks
 *     an SM: one wave of 256 blocks) before it fills x and waits once: ~147 KB requested per
 *     SM, 3x what the copy rate needs.  KL_GPU_MOE_DECODE=v3t (version 4) also lets the
 *     down launch start early (KL_GPU_LAUNCH_DEPENDENTS after its grid wait): its blocks
 *     then take the SMs that gate_up leaves first, up to 4 each, and may crowd there (main
 *     measured such triggers slower in every kernel), so it is only offered to measure.
 *     Version 5 (KL_GPU_MOE_DECODE=v3p, the default): each lane's row in rounds of GU_PIPE
 *     blocks, the next round's loads issued before a round is multiplied.  Version 3 takes
 *     turns: every load, then every product (~4.8 us of each an SM at H = 2304, counted:
 *     ~4 instructions a code, 2 blocks an SM, 295 K codes); overlapped, ~max of the two plus
 *     a round: predicted gate_up ~11 -> ~8 us a layer, the same sums in the same order.
 *     Measured (test_moe, both launches in a graph): 24.2 -> 22.7 us, a third of the
 *     prediction: the arithmetic, not the turns, bounds it (docs/PERFORMANCE.md, session 15).
 *     Tried and dropped there: the shared expert's down product inside down_sum (one launch
 *     fewer a layer) made the layer's tail 31.9 -> 34.9 us.
 *   down_sum: a block per (8 rows of H, token): 288 blocks of 16 teams (2-3 an SM: the SM
 *     with the most has 1.4x the mean, against 2x with 144 blocks of 16 rows; each block
 *     reads the token's 32 KB of h from L2, 9.4 MB in all), team j one slot's 4 rows (units
 *     of DS_ROWS, each x load used 4 times); each lane requests its 16 loads of 16 bytes
 *     BEFORE the grid wait, once gate_up's blocks have left (v3t: as they leave): the
 *     weights never change and idx was complete before gate_up ran (this kernel starts only
 *     after each gate_up block passed its own wait or exited, and that wait returns when
 *     every kernel before gate_up has finished).  After the wait: the token's h [8, 1024]
 *     into shared memory (cp.async, 32 KB), the products, and y (+)= Σ_k wt · part in k
 *     order, as combine adds: no part buffer, no third launch.
 *   Predicted: the bytes alone 7.2 us, but the decode (~4 integer and float operations a
 *   code, kl_mx2_word_dot) at the copy rate would take ~30 codes · 4 / 32 = 3.8 of the 4 warp
 *   instructions an SM issues a cycle; the v2 product on a large matrix reaches 0.66 of the
 *   copy rate with it.  So ~11 us of streaming at that rate + ~1.5 us to the first bytes:
 *   ~12 us, 2x version 2.  The next lever is the decode.  A candidate, not built: int8
 *   tensor cores, one mma m16n8k32 per MXFP4 block (16 rows x 32 codes): 2·E2M1 is an int8
 *   in {0, ±1, .., ±12}; byte permutes with a table of the 8 magnitudes give, from a word of 8
 *   codes, the positive codes' magnitudes (a selector nibble with bit 3 set, a negative code,
 *   yields 0x00) and, from the word XOR 0x88888888, the negative ones': P and Q, 7 operations
 *   for 8 codes; D = Q·(-B) + P·B with B = x in int8 digits under a per-32-block exponent
 *   (4 digits: ~2^-25 of the block's largest x), exact int32 sums, then the digits and the
 *   scale in fp32: ~2 operations a code.
 *
 * Version 6 (KL_GPU_MOE_DECODE=tc, opt-in until it measures faster): the two launches of
 * version 3 on the tensor cores; see its section below and kernels/mx_mma.cuh.
 *
 * Version 7 (KL_GPU_MOE_DECODE=i8, opt-in: measured slower): version 5 with gate/up's codes
 * multiplied by integer dot products, x staged as three int8 digits (kernels/mx_int8.cuh:
 * ~2.4 instructions a code where the fp32 form spends ~5); down as version 5.  Exact to fp32
 * (test_moe 2.7e-7 against double) but the layer took 24.1 us against version 5's 22.3
 * (docs/PERFORMANCE.md, session 21, run 10): fewer instructions did not move a kernel whose
 * warps mostly wait for their loads (long scoreboard); each block also stages the digits of
 * x itself.  Kept for when the loads are streamed (a copy-engine ring, as the BF16 products'
 * version 3), where the arithmetic would be what is left.
 *
 * Chunks (n >= kl_gpu_experts_grouped_min(), version 3): a one-block stable counting sort of
 * the slots by expert (seg, x_row, packed), the grouped products of kernels/gemm.h for gate,
 * up and down (each expert's weight tile read once per chunk for all its rows), SiLU · up,
 * and the same combine reading each slot's packed row.
 */
#include "kernels/moe.h"
#include "kernels/dense.h" /* kl_gpu_version, kl_gpu_silu_mul */
#include "kernels/gemm.h"
#include "kernels/mx_int8.cuh"
#include "kernels/mx_mma.cuh"
#include "kernels/route.cuh"
#include "kernels/row_dot.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define THREADS     256
#define ROUTE_WARPS 4    /* tokens per router block */
#define GU_UNROLL   9  /* v3 gate_up: 16-byte loads per row and lane in flight (H = 2304: all 9) */
#define GU_PIPE     3  /* v3p gate_up: 16-byte loads a row and lane a round, two rounds in flight */
#define DS_THREADS  128 /* v3 down: 16 teams a block, 4 blocks an SM (128 registers) */
#define DS_TEAMS    (DS_THREADS / KL_MX2_TEAM)
#define DS_ROWS     4  /* v3 down: rows a team multiplies together (each x load used 4 times) */
#define DS_UNROLL   4  /* v3 down: loads per row and lane in flight (I = 1024: all 4) */
#define DS_MAX_SHARED (46 * 1024) /* v3 down: h of a token's slots and the parts */

/* ---- router ------------------------------------------------------------------------------ */

__global__ static void __launch_bounds__(ROUTE_WARPS * KL_GPU_GROUP)
    route_kernel(kl_gpu_route_args a, int early)
{
    KL_GPU_GRID_WAIT();
    KL_GPU_EARLY_DEPENDENTS(early);
    extern __shared__ float route_sh[]; /* per group: s [E], then sel [E] */
    const uint32_t E = a.n_experts, lane = threadIdx.x % KL_GPU_GROUP;
    const uint32_t g = threadIdx.x / KL_GPU_GROUP, t = blockIdx.x * ROUTE_WARPS + g;
    if (t >= a.n)
        return;
    if (route_in_registers_ok(E)) {
        route_in_registers(a, t, lane);
        return;
    }
    float *s = route_sh + (size_t)g * 2 * E, *sel = s + E;
    for (uint32_t e0 = lane; e0 < E; e0 += ROUTE_BATCH * KL_GPU_GROUP) {
        float v[ROUTE_BATCH], q[ROUTE_BATCH];
        route_scores(a, a.logits + (size_t)t * E, e0, v, q);
#pragma unroll
        for (int u = 0; u < ROUTE_BATCH; u++) {
            const uint32_t e = e0 + u * KL_GPU_GROUP;
            if (e < E) {
                s[e] = v[u];
                sel[e] = q[u];
            }
        }
    }
    /* 2-3. top-k by repeated arg-max; weights s or s + bias (weight k kept by lane k % 32) */
    float wsum = 0.0f, w_lo = 0.0f, w_hi = 0.0f;
    for (uint32_t k = 0; k < a.top_k; k++) {
        kl_best b = {-INFINITY, UINT32_MAX, 0.0f};
        for (uint32_t e = lane; e < E; e += KL_GPU_GROUP) {
            const kl_best c = {sel[e], e, s[e]};
            if (kl_best_above(c, b))
                b = c;
        }
        b = kl_best_group(b);
        if (b.i % KL_GPU_GROUP == lane)
            sel[b.i] = -INFINITY;
        route_take(a, t, k, b, lane, &wsum, &w_lo, &w_hi);
    }
    route_weights(a, t, lane, wsum, w_lo, w_hi);
}

extern "C" int kl_gpu_route(const kl_gpu_route_args *a, kl_gpu_stream s, kl_err *err)
{
    int rc = route_check(a, "route", err);
    if (rc)
        return rc;
    const unsigned blocks = (a->n + ROUTE_WARPS - 1) / ROUTE_WARPS;
    const size_t shared = route_in_registers_ok(a->n_experts) ? 0 /* in registers */
                          : (size_t)ROUTE_WARPS * 2 * a->n_experts * sizeof(float);
    const int early = kl_gpu_early_dependents(blocks, ROUTE_WARPS * KL_GPU_GROUP);
    route_kernel<<<blocks, ROUTE_WARPS * KL_GPU_GROUP, shared, (hipStream_t)s>>>(*a, early);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* ---- experts ----------------------------------------------------------------------------- */

/* What the expert kernels share (by value). */
struct experts_k {
    kl_gpu_mat     w1, w2, w3;   /* expert 0's; expert e's rows start at e * rows */
    uint32_t       E, I, H, top_k, n_slots;
    int            vec1, vec2, vec3;
    const float   *x;
    const int32_t *idx;
    const float   *wt;
    float         *h, *part, *y;
    int            add_to_y;
    int            trigger;      /* v3 gate_up lets down_sum start early (decode version 4) */
};

/* A slot's expert for id: the id, ELSEWHERE (another rank's: the slot adds nothing) or -1
 * (out of range: its outputs NaN). */
#define ELSEWHERE KL_GPU_EXPERT_ELSEWHERE
__device__ static inline int64_t slot_expert(const experts_k &k, int32_t id)
{
    return id >= 0 && (uint32_t)id < k.E ? id : id == ELSEWHERE ? ELSEWHERE : -1;
}

/* What a slot without an expert writes: 0 for another rank's, else NaN. */
__device__ static inline float no_expert(int64_t e)
{
    return e == ELSEWHERE ? 0.0f : __uint_as_float(0x7fc00000u);
}

/* The group's (slot, row) among n_slots * rows, its expert (< 0: slot_expert), its lane. */
struct experts_job {
    size_t   slot, row;
    int64_t  e;
    unsigned lane;
};

__device__ static int experts_job_of(const experts_k &k, uint32_t rows, experts_job *j)
{
    const size_t g = (size_t)blockIdx.x * KL_ROW_WARPS + threadIdx.x / KL_GPU_GROUP;
    if (g >= (size_t)k.n_slots * rows)
        return 0;
    j->slot = g / rows;
    j->row = g % rows;
    j->lane = threadIdx.x % KL_GPU_GROUP;
    j->e = slot_expert(k, k.idx[j->slot]);
    return 1;
}

__global__ static void __launch_bounds__(THREADS) gate_up_kernel(experts_k k)
{
    KL_GPU_GRID_WAIT();
    kl_row_lut_init();
    __syncthreads();
    experts_job j;
    if (!experts_job_of(k, k.I, &j))
        return;
    float g = no_expert(j.e), u = g;
    if (j.e >= 0) {
        const kl_row_x xs = {k.x + j.slot / k.top_k * k.H, k.H, 1};
        const size_t r = (size_t)j.e * k.I + j.row;
        kl_row_dot<1>(k.w1, r, xs, k.vec1, j.lane, KL_GPU_GROUP, &g);
        kl_row_dot<1>(k.w3, r, xs, k.vec3, j.lane, KL_GPU_GROUP, &u);
    }
    if (j.lane == 0)
        k.h[j.slot * k.I + j.row] = g / (1.0f + expf(-g)) * u;
}

__global__ static void __launch_bounds__(THREADS) down_kernel(experts_k k)
{
    KL_GPU_GRID_WAIT();
    kl_row_lut_init();
    __syncthreads();
    experts_job j;
    if (!experts_job_of(k, k.H, &j))
        return;
    float d = no_expert(j.e);
    if (j.e >= 0) {
        const kl_row_x xs = {k.h + j.slot * k.I, k.I, 1};
        kl_row_dot<1>(k.w2, (size_t)j.e * k.H + j.row, xs, k.vec2, j.lane, KL_GPU_GROUP,
                      &d);
    }
    if (j.lane == 0)
        k.part[j.slot * k.H + j.row] = k.wt[j.slot] * d;
}

/* ---- MXFP4 with x in registers (kernels/row_dot.cuh): a group per (slot, rpw rows) ------- */

/* The group's slot, its rows [r0, r1) of rows (chunks of rpw), expert and lane; 0: no work. */
struct experts_chunk {
    size_t   slot, r0, r1;
    int64_t  e;
    unsigned lane;
};

__device__ static int experts_chunk_of(const experts_k &k, uint32_t rows, uint32_t rpw,
                                       experts_chunk *c)
{
    const size_t per_slot = (rows + rpw - 1) / rpw;
    const size_t g = (size_t)blockIdx.x * KL_XREG_WARPS + threadIdx.x / KL_GPU_GROUP;
    if (g >= (size_t)k.n_slots * per_slot)
        return 0;
    c->slot = g / per_slot;
    c->r0 = g % per_slot * rpw;
    c->r1 = c->r0 + rpw < rows ? c->r0 + rpw : rows;
    c->lane = threadIdx.x % KL_GPU_GROUP;
    c->e = slot_expert(k, k.idx[c->slot]);
    return 1;
}

/* Row r of stacked MXFP4 matrix m: its packed codes and scales. */
__device__ static inline const uint8_t *packed_row(const kl_gpu_mat &m, size_t r)
{
    return m.packed + r * (m.cols / 2);
}
__device__ static inline const uint8_t *scale_row(const kl_gpu_mat &m, size_t r)
{
    return m.scale + r * (m.cols / KL_MXFP4_BLOCK);
}

/* The start of both register kernels (every thread of the block calls it): the code table,
 * then the group's chunk; 1 when it has rows to multiply.  A slot without an expert sets the
 * chunk's rows of out (the slot's [rows] outputs) to no_expert instead. */
__device__ static int experts_chunk_begin(const experts_k &k, uint32_t rows, uint32_t rpw,
                                          float *out, experts_chunk *c)
{
    kl_row_lut_init();
    __syncthreads();
    if (!experts_chunk_of(k, rows, rpw, c))
        return 0;
    if (c->e >= 0)
        return 1;
    for (size_t r = c->r0 + c->lane; r < c->r1; r += KL_GPU_GROUP)
        out[c->slot * rows + r] = no_expert(c->e);
    return 0;
}

template <int S>
__global__ static void __launch_bounds__(KL_XREG_WARPS * KL_GPU_GROUP)
    gate_up_xreg_kernel(experts_k k, uint32_t rpw)
{
    KL_GPU_GRID_WAIT();
    experts_chunk c;
    if (!experts_chunk_begin(k, k.I, rpw, k.h, &c))
        return;
    float *h = k.h + c.slot * k.I;
    kl_xreg<S> xr;
    kl_xreg_load<S>(xr, k.x + c.slot / k.top_k * k.H, k.H, c.lane);
    const size_t e0 = (size_t)c.e * k.I;
    kl_mxw_run<S, 2>(
        c.r0, c.r1, k.H, xr, c.lane,
        [&](size_t r, const uint8_t **rows, const uint8_t **scales) {
            rows[0] = packed_row(k.w1, e0 + r);
            rows[1] = packed_row(k.w3, e0 + r);
            scales[0] = scale_row(k.w1, e0 + r);
            scales[1] = scale_row(k.w3, e0 + r);
        },
        [&](size_t r, const float *gu) {
            if (c.lane == 0)
                h[r] = gu[0] / (1.0f + expf(-gu[0])) * gu[1];
        });
}

template <int S>
__global__ static void __launch_bounds__(KL_XREG_WARPS * KL_GPU_GROUP)
    down_xreg_kernel(experts_k k, uint32_t rpw)
{
    KL_GPU_GRID_WAIT();
    experts_chunk c;
    if (!experts_chunk_begin(k, k.H, rpw, k.part, &c))
        return;
    float *part = k.part + c.slot * k.H;
    kl_xreg<S> xr;
    kl_xreg_load<S>(xr, k.h + c.slot * k.I, k.I, c.lane);
    const float wt = k.wt[c.slot];
    const size_t e0 = (size_t)c.e * k.H;
    kl_mxw_run<S, 1>(
        c.r0, c.r1, k.I, xr, c.lane,
        [&](size_t r, const uint8_t **rows, const uint8_t **scales) {
            rows[0] = packed_row(k.w2, e0 + r);
            scales[0] = scale_row(k.w2, e0 + r);
        },
        [&](size_t r, const float *d) {
            if (c.lane == 0)
                part[r] = wt * d[0];
        });
}

/* ---- MXFP4, version 2 (kernels/row_dot.cuh): a block per (slot, chunk of rows), x in shared
 * memory, a team of 8 lanes per row pair: gate and up row r, or down rows r and r + 1 ---- */

/* The expert of this block's slot (slot_expert: for an id out of range the outputs are NaN,
 * and expert 0's rows are read instead of stray ones; another rank's reads nothing). */
__device__ static int64_t experts_mx2_expert(const experts_k &k)
{
    return slot_expert(k, k.idx[blockIdx.y]);
}

/* DOWN 0: gate_up, a block per (32 rows of I, slot), team j: gate and up row j;
 * DOWN 1: down, a block per (64 rows of H, slot), team j: rows 2j and 2j + 1.
 * GU, gate_up's form: GU_V2 that of version 2; GU_WHOLE (version 3) GU_UNROLL blocks of each
 * row per lane in flight (the whole row at H = 2304), 2 blocks an SM, with k.trigger the down
 * kernel let in early (see the top); GU_PIPE_ROUNDS (version 5, v3p) rounds of GU_PIPE blocks,
 * the next round's loads in flight while a round is multiplied (kl_mx2_rows_pipe); GU_INT8
 * (version 7, KL_GPU_MOE_DECODE=i8) those rounds on integer dot products (mx_int8.cuh). */
enum { GU_V2, GU_WHOLE, GU_PIPE_ROUNDS, GU_INT8 };
template <int DOWN, int GU>
__global__ static void __launch_bounds__(KL_MX2_THREADS, GU != GU_V2 ? 2 : KL_MX2_MIN_BLOCKS)
    experts_mx2_kernel(experts_k k)
{
    KL_GPU_GRID_WAIT();
    if (GU == GU_WHOLE && k.trigger)
        KL_GPU_LAUNCH_DEPENDENTS();
    extern __shared__ float4 mx2_x[];
    const size_t slot = blockIdx.y;
    const int64_t e = experts_mx2_expert(k);
    const uint32_t n_rows = DOWN ? k.H : k.I;
    unsigned tl;
    const size_t r = ((size_t)blockIdx.x * KL_MX2_TEAMS + kl_mx2_team(&tl)) * (DOWN ? 2 : 1);
    if (e == ELSEWHERE) {   /* the whole block's slot: zeros, no weights read */
        for (int i = 0; tl == 0 && i < (DOWN ? 2 : 1); i++)
            if (r + i < n_rows)
                (DOWN ? k.part + slot * k.H : k.h + slot * k.I)[r + i] = 0.0f;
        return;
    }
    const uint8_t *rows[2], *scales[2];
    for (int i = 0; i < 2; i++) {
        const size_t ri = r + (DOWN ? i : 0);
        const size_t row = (size_t)(e < 0 ? 0 : e) * n_rows + (ri < n_rows ? ri : n_rows - 1);
        const kl_gpu_mat &m = DOWN ? k.w2 : i ? k.w3 : k.w1;
        rows[i] = packed_row(m, row);
        scales[i] = scale_row(m, row);
    }
    const float *x = DOWN ? k.h + slot * k.I : k.x + slot / k.top_k * k.H;
    float d[2];
    constexpr int U = GU == GU_WHOLE ? GU_UNROLL
                      : GU == GU_PIPE_ROUNDS || GU == GU_INT8 ? GU_PIPE
                                                              : KL_MX2_UNROLL;
    if (GU == GU_INT8)
        kl_mxi_block_dot<2, U>(rows, scales, x, DOWN ? k.I : k.H, (uint8_t *)mx2_x, tl, d);
    else
        kl_mx2_block_dot<2, U, GU == GU_PIPE_ROUNDS>(rows, scales, x, DOWN ? k.I : k.H, mx2_x,
                                                     tl, d);
    if (tl != 0)
        return;
    const float nan = no_expert(-1);
    if (!DOWN && r < k.I)
        k.h[slot * k.I + r] = e < 0 ? nan : d[0] / (1.0f + expf(-d[0])) * d[1];
    for (int i = 0; DOWN && i < 2; i++)
        if (r + i < k.H)
            k.part[slot * k.H + r + i] = (e < 0 ? nan : k.wt[slot]) * d[i];
}

/* The gate_up launch of versions 2 and 3: h [n_slots, I]. */
template <int GU> static int mx2_gate_up(const experts_k &k, hipStream_t st, kl_err *err)
{
    const dim3 g((k.I + KL_MX2_TEAMS - 1) / KL_MX2_TEAMS, k.n_slots);
    const size_t sh = GU == GU_INT8 ? kl_mxi_x_bytes(k.H) : k.H * sizeof(float);
    experts_mx2_kernel<0, GU><<<g, KL_MX2_THREADS, sh, st>>>(k);
    return KL_GPU_CHECK(err, hipGetLastError());
}

static int experts_mx2(const experts_k &k, hipStream_t st, kl_err *err)
{
    int rc = mx2_gate_up<GU_V2>(k, st, err);
    if (rc)
        return rc;
    const dim3 g2((k.H + 2 * KL_MX2_TEAMS - 1) / (2 * KL_MX2_TEAMS), k.n_slots);
    experts_mx2_kernel<1, GU_V2><<<g2, KL_MX2_THREADS, k.I * sizeof(float), st>>>(k);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* ---- MXFP4, version 3 (the default): gate_up as above (GU_WHOLE), then one launch for the
 * down product and the weighted sum, its weight loads issued before its grid wait ---------- */

/* Rows of H per down block: units of DS_ROWS rows of one slot, about one unit per team. */
static uint32_t ds_rows(uint32_t top_k)
{
    const uint32_t u = DS_TEAMS / top_k;
    return DS_ROWS * (u ? u : 1);
}

/* Shared memory of a down block: h of the token's slots [top_k, I], then part [top_k, rb]. */
static size_t ds_shared(const experts_k &k)
{
    return ((size_t)k.I + ds_rows(k.top_k)) * k.top_k * sizeof(float);
}

/* dst (shared) = src (global), 16 bytes: cp.async through L2 where the target has it (every
 * copy of a thread in flight together), then ds_copy_wait() before the barrier. */
__device__ static inline void ds_copy16(float4 *dst, const float4 *src)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(__HIP_PLATFORM_AMD__)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
#else
    *dst = *src;
#endif
}

__device__ static inline void ds_copy_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(__HIP_PLATFORM_AMD__)
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

/* h of a token's top_k slots [K, I] (16-byte aligned) into sh, each slot's I floats laid out
 * as kl_mx2_x_fill lays x. */
__device__ static void ds_fill(float4 *sh, const float *h, uint32_t K, uint32_t I)
{
    const uint32_t per = I / 4;
    for (uint32_t f = threadIdx.x; f < K * per; f += blockDim.x) {
        const uint32_t q = f / per;
        ds_copy16(sh + q * per + kl_mx2_x_at(f - q * per), (const float4 *)h + f);
    }
    ds_copy_wait();
}

/* Unit u of the down block at rows r0 of H, token t: slot q = u % top_k, rows r0 + (u /
 * top_k) * DS_ROWS + i (past H: the last row), codes and scales into rows[i], scales[i];
 * returns the expert (slot_expert; without one, expert 0's rows are read instead).  idx is read
 * through L2: the first unit is set up before the grid wait. */
__device__ static int64_t ds_unit(const experts_k &k, size_t t, size_t r0, uint32_t u,
                                  const uint8_t **rows, const uint8_t **scales)
{
    const int64_t e = slot_expert(k, KL_LOAD_L2(k.idx + t * k.top_k + u % k.top_k));
    const size_t r = r0 + (size_t)(u / k.top_k) * DS_ROWS, base = (size_t)(e < 0 ? 0 : e) * k.H;
#pragma unroll
    for (int i = 0; i < DS_ROWS; i++) {
        const size_t ri = base + (r + i < k.H ? r + i : k.H - 1);
        rows[i] = packed_row(k.w2, ri);
        scales[i] = scale_row(k.w2, ri);
    }
    return e;
}

/* A block per (rb rows of H, token t); team j takes units j, j + DS_TEAMS, ... (every
 * team the same number of rounds: the team sums are shuffles over whole groups).  The first
 * unit's weights are requested before the grid wait (see the top: the weights and idx are
 * complete by then), h of the token's top_k slots is read after it, and y[t, r] (+)=
 * Σ_k wt[t, k] · part[k][r] in k order, as combine_kernel adds. */
__global__ static void __launch_bounds__(DS_THREADS, 4)
    experts_down_sum_kernel(experts_k k, uint32_t rb)
{
    KL_GPU_GRID_WAIT_LATER();
    extern __shared__ float4 ds_sh[];
    const uint32_t K = k.top_k, nb = k.I / KL_MXFP4_BLOCK, units = rb / DS_ROWS * K;
    const size_t t = blockIdx.y, r0 = (size_t)blockIdx.x * rb;
    unsigned tl;
    const uint32_t team = kl_mx2_team(&tl);
    const uint8_t *rows[DS_ROWS], *scales[DS_ROWS];
    kl_mx2_buf<DS_ROWS, DS_UNROLL> w;
    int64_t e = ds_unit(k, t, r0, team < units ? team : units - 1, rows, scales);
    kl_mx2_load<DS_ROWS, DS_UNROLL>(w, rows, scales, nb, tl);
    KL_GPU_GRID_WAIT();
    float *part = (float *)ds_sh + (size_t)K * k.I;
    ds_fill(ds_sh, k.h + t * K * k.I, K, k.I);
    __syncthreads();
    for (uint32_t u0 = 0; u0 < units; u0 += DS_TEAMS) {
        const uint32_t u = u0 + team < units ? u0 + team : units - 1;
        if (u0) {
            e = ds_unit(k, t, r0, u, rows, scales);
            kl_mx2_load<DS_ROWS, DS_UNROLL>(w, rows, scales, nb, tl);
        }
        float d[DS_ROWS];
        kl_mx2_rows<DS_ROWS, DS_UNROLL>(w, rows, scales, nb, ds_sh + (size_t)(u % K) * k.I / 4,
                                        tl, d);
        for (int i = 0; tl == 0 && u0 + team < units && i < DS_ROWS; i++)
            part[(u % K) * rb + u / K * DS_ROWS + i] = e < 0 ? no_expert(e) : d[i];
    }
    __syncthreads();
    for (uint32_t c = threadIdx.x; c < rb && r0 + c < k.H; c += blockDim.x) {
        float s = 0.0f;
        for (uint32_t q = 0; q < K; q++)
            s += __fmul_rn(k.wt[t * K + q], part[q * rb + c]);
        float *y = k.y + t * k.H + r0 + c;
        *y = k.add_to_y ? *y + s : s;
    }
}

/* Whether version 3 takes these MXFP4 experts: x and the h of a token's slots fit in shared
 * memory, the slots in a grid column. */
static int experts_v3_ok(const experts_k &k)
{
    return kl_gpu_experts_decode_version() >= 3 && k.H <= KL_MX2_MAX_COLS &&
           k.n_slots <= 65535 && ds_shared(k) <= DS_MAX_SHARED;
}

static int experts_v3(const experts_k &k, uint32_t n, hipStream_t st, kl_err *err)
{
    const int v = kl_gpu_experts_decode_version();
    int rc = v == 5   ? mx2_gate_up<GU_PIPE_ROUNDS>(k, st, err)
             : v == 7 ? mx2_gate_up<GU_INT8>(k, st, err)
                      : mx2_gate_up<GU_WHOLE>(k, st, err);
    if (rc)
        return rc;
    const uint32_t rb = ds_rows(k.top_k);
    const dim3 g((k.H + rb - 1) / rb, n);
    experts_down_sum_kernel<<<g, DS_THREADS, ds_shared(k), st>>>(k, rb);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* ---- MXFP4, version 6 (KL_GPU_MOE_DECODE=tc): both launches on the
 * tensor cores (kernels/mx_mma.cuh), in version 3's two launches:
 *   gate_up: a block per (16 rows of I, slot), TC_SPLIT groups, each a contiguous share of the
 *     rows' 32-code blocks (whole quads) for the gate and the up rows together (x's share
 *     staged once for both); the groups' sums meet in shared memory and 16 lanes write
 *     SiLU(gate) · up.
 *   down_sum: a block per (16 rows of H, token), TC_DOWN_WARPS x TC_DOWN_SPLIT groups: group
 *     j the token's slot j % 8 (j % 8 + 8, ... past 8 slots), half j / 8 of its row of I;
 *     its first quad of weights requested before the grid wait (as version 3's: the weights
 *     and idx are complete by then), its h staged after it; then y (+)= Σ_k wt · part in k
 *     order, as combine adds.
 * Why so many groups: a group's quad is ~400 dependent-chained instructions (shuffles, the
 * decode, mmas), issued ~1 every 7 cycles; with 3 groups a gate_up block (11 a SM) the first
 * build ran at 1.2 TB/s, latency-bound (session 17, Nsight Compute: issue slots 33% busy,
 * DRAM 26%), so both launches split the rows' blocks further (~23 groups a SM): measured in
 * session 18 no faster (27.5 against version 5's 22.5 us a layer, docs/PERFORMANCE.md), so
 * more warps alone do not fix it; fewer instructions a code is what is left to try. */
#define TC_SPLIT       6 /* gate_up: groups a block (H = 2304: 3 quads of 4 blocks each) */
#define TC_DOWN_WARPS  8 /* down_sum: slots a block takes at once */
#define TC_DOWN_SPLIT  2 /* down_sum: groups a slot (I = 1024: 4 quads each) */
#define TC_DOWN_GROUPS (TC_DOWN_WARPS * TC_DOWN_SPLIT)
#define TC_MAX_SHARED  (46 * 1024)

/* 32-code blocks of one group's share of a row of cols codes split n ways: whole quads. */
__host__ __device__ static uint32_t tc_per(uint32_t cols, uint32_t n)
{
    return (cols / (4 * KL_MXFP4_BLOCK) + n - 1) / n * 4;
}

/* The share [*b0, *b1) of group j of n of a row of cols codes, in blocks. */
__device__ static void tc_share(uint32_t cols, uint32_t n, uint32_t j, uint32_t *b0,
                                uint32_t *b1)
{
    const uint32_t nb = cols / KL_MXFP4_BLOCK, per = tc_per(cols, n);
    *b0 = j * per < nb ? j * per : nb;
    *b1 = *b0 + per < nb ? *b0 + per : nb;
}

/* Shared memory of a gate_up block: each group's two planes of x (per · 8 entries), then the
 * sums [TC_SPLIT][gate, up][16]. */
static size_t tc_gu_shared(const experts_k &k)
{
    return (size_t)TC_SPLIT * tc_per(k.H, TC_SPLIT) * 8 * sizeof(uint4) +
           TC_SPLIT * 2 * KL_MXV_TILE * sizeof(float);
}

/* Shared memory of a down block: each group's two planes of its share of h, then the parts
 * [TC_DOWN_SPLIT][top_k][16]. */
static size_t tc_down_shared(const experts_k &k)
{
    return (size_t)TC_DOWN_GROUPS * tc_per(k.I, TC_DOWN_SPLIT) * 8 * sizeof(uint4) +
           (size_t)TC_DOWN_SPLIT * k.top_k * KL_MXV_TILE * sizeof(float);
}

/* The rows of expert e (< 0: expert 0's) that lane 4 g + c reads in the tile at r0 of m
 * (rows of an expert; past them, the last). */
__device__ static kl_mxv_rows tc_rows(const kl_gpu_mat &m, int64_t e, uint32_t rows, size_t r0,
                                      unsigned lane)
{
    const size_t base = (size_t)(e < 0 ? 0 : e) * rows, g = r0 + lane / 4;
    return kl_mxv_rows_at(m.packed, m.scale, m.cols, base + (g < rows ? g : rows - 1),
                          base + (g + 8 < rows ? g + 8 : rows - 1));
}

__global__ static void __launch_bounds__(TC_SPLIT * KL_GPU_GROUP, 4)
    experts_tc_gate_up_kernel(experts_k k)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ uint4 tc_sh[];
    const size_t slot = blockIdx.y, r0 = (size_t)blockIdx.x * KL_MXV_TILE;
    const unsigned lane = threadIdx.x % KL_GPU_GROUP, grp = threadIdx.x / KL_GPU_GROUP;
    const int64_t e = slot_expert(k, k.idx[slot]);
    if (e == ELSEWHERE) { /* the whole block's slot: zeros, no weights read */
        if (threadIdx.x < KL_MXV_TILE && r0 + threadIdx.x < k.I)
            k.h[slot * k.I + r0 + threadIdx.x] = 0.0f;
        return;
    }
    uint32_t b0, b1;
    tc_share(k.H, TC_SPLIT, grp, &b0, &b1);
    const kl_mxv_rows rows[2] = {tc_rows(k.w1, e, k.I, r0, lane), tc_rows(k.w3, e, k.I, r0, lane)};
    kl_mxv_buf<2, 1> w;
    kl_mxv_load<2, 1>(w, rows, b0, b1, lane % 4);
    const uint32_t per = tc_per(k.H, TC_SPLIT);
    uint4 *planes = tc_sh + (size_t)grp * per * 8;
    const float *x = k.x + slot / k.top_k * k.H + (size_t)b0 * KL_MXFP4_BLOCK;
    const float f = kl_mxv_stage(x, (b1 - b0) * KL_MXFP4_BLOCK, planes, lane);
    __syncthreads();
    float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    kl_mxv_run<2, 1>(w, rows, b0, b1, planes, (b1 - b0) * 4, lane, acc);
    float *sums = (float *)(tc_sh + (size_t)TC_SPLIT * per * 8);
    if (lane % 4 == 0) {
        for (int m = 0; m < 2; m++) {
            sums[(grp * 2 + m) * KL_MXV_TILE + lane / 4] = acc[m][0] * f;
            sums[(grp * 2 + m) * KL_MXV_TILE + lane / 4 + 8] = acc[m][1] * f;
        }
    }
    __syncthreads();
    const unsigned i = threadIdx.x;
    if (i < KL_MXV_TILE && r0 + i < k.I) {
        float gs = 0.0f, us = 0.0f;
        for (int q = 0; q < TC_SPLIT; q++) {
            gs += sums[2 * q * KL_MXV_TILE + i];
            us += sums[(2 * q + 1) * KL_MXV_TILE + i];
        }
        k.h[slot * k.I + r0 + i] = e < 0 ? no_expert(e) : gs / (1.0f + expf(-gs)) * us;
    }
}

/* Slot q of token t for a down group at r0 with blocks [b0, b1): its expert (slot_expert;
 * ELSEWHERE or < 0: no rows) and, with one, its rows for this lane and its first quad
 * requested. */
__device__ static int64_t tc_down_slot(const experts_k &k, size_t t, uint32_t q, size_t r0,
                                       uint32_t b0, uint32_t b1, unsigned lane,
                                       kl_mxv_rows *rows, kl_mxv_buf<1, 1> &w)
{
    const int64_t e = q < k.top_k ? slot_expert(k, KL_LOAD_L2(k.idx + t * k.top_k + q)) : -1;
    *rows = tc_rows(k.w2, e, k.H, r0, lane);
    kl_mxv_load<1, 1>(w, rows, b0, e >= 0 ? b1 : b0, lane % 4);
    return e;
}

__global__ static void __launch_bounds__(TC_DOWN_GROUPS * KL_GPU_GROUP, 2)
    experts_tc_down_sum_kernel(experts_k k)
{
    KL_GPU_GRID_WAIT_LATER();
    extern __shared__ uint4 tc_sh[];
    const size_t t = blockIdx.y, r0 = (size_t)blockIdx.x * KL_MXV_TILE;
    const unsigned lane = threadIdx.x % KL_GPU_GROUP, grp = threadIdx.x / KL_GPU_GROUP;
    const uint32_t K = k.top_k, half = grp / TC_DOWN_WARPS, per = tc_per(k.I, TC_DOWN_SPLIT);
    uint32_t b0, b1;
    tc_share(k.I, TC_DOWN_SPLIT, half, &b0, &b1);
    uint4 *planes = tc_sh + (size_t)grp * per * 8;
    float *part = (float *)(tc_sh + (size_t)TC_DOWN_GROUPS * per * 8);
    kl_mxv_rows rows;
    kl_mxv_buf<1, 1> w;
    int64_t e = tc_down_slot(k, t, grp % TC_DOWN_WARPS, r0, b0, b1, lane, &rows, w);
    KL_GPU_GRID_WAIT();
    for (uint32_t q0 = 0; q0 < K; q0 += TC_DOWN_WARPS) { /* the same rounds in every group */
        const uint32_t q = q0 + grp % TC_DOWN_WARPS;
        if (q0)
            e = tc_down_slot(k, t, q, r0, b0, b1, lane, &rows, w);
        float acc[1][2] = {{0.0f, 0.0f}}, f = 0.0f;
        if (e >= 0)
            f = kl_mxv_stage(k.h + (t * K + q) * k.I + (size_t)b0 * KL_MXFP4_BLOCK,
                             (b1 - b0) * KL_MXFP4_BLOCK, planes, lane);
        __syncthreads();
        if (e >= 0)
            kl_mxv_run<1, 1>(w, &rows, b0, b1, planes, (b1 - b0) * 4, lane, acc);
        if (q < K && lane % 4 == 0) {
            float *p = part + ((size_t)half * K + q) * KL_MXV_TILE + lane / 4;
            p[0] = e < 0 ? no_expert(e) : acc[0][0] * f;
            p[8] = e < 0 ? no_expert(e) : acc[0][1] * f;
        }
        __syncthreads();
    }
    const unsigned i = threadIdx.x;
    if (i < KL_MXV_TILE && r0 + i < k.H) {
        float s = 0.0f;
        for (uint32_t q = 0; q < K; q++) {
            float d = 0.0f;
            for (uint32_t j = 0; j < TC_DOWN_SPLIT; j++)
                d += part[((size_t)j * K + q) * KL_MXV_TILE + i];
            s += __fmul_rn(k.wt[t * K + q], d);
        }
        float *y = k.y + t * k.H + r0 + i;
        *y = k.add_to_y ? *y + s : s;
    }
}

/* Whether version 6 takes these MXFP4 experts: rows of whole quads of blocks (H and I
 * multiples of 128), a tile's shared memory fits, the slots in a grid column. */
static int experts_tc_ok(const experts_k &k)
{
    return kl_gpu_experts_decode_version() == 6 && k.H % (4 * KL_MXFP4_BLOCK) == 0 &&
           k.I % (4 * KL_MXFP4_BLOCK) == 0 && k.n_slots <= 65535 &&
           tc_gu_shared(k) <= TC_MAX_SHARED && tc_down_shared(k) <= TC_MAX_SHARED;
}

static int experts_tc(const experts_k &k, uint32_t n, hipStream_t st, kl_err *err)
{
    const dim3 g1((k.I + KL_MXV_TILE - 1) / KL_MXV_TILE, k.n_slots);
    experts_tc_gate_up_kernel<<<g1, TC_SPLIT * KL_GPU_GROUP, tc_gu_shared(k), st>>>(k);
    int rc = KL_GPU_CHECK(err, hipGetLastError());
    if (rc)
        return rc;
    const dim3 g2((k.H + KL_MXV_TILE - 1) / KL_MXV_TILE, n);
    experts_tc_down_sum_kernel<<<g2, TC_DOWN_GROUPS * KL_GPU_GROUP, tc_down_shared(k), st>>>(k);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* Rows per group: about 2048 groups in all (fewer than the products' KL_ROW_TARGET: each
 * group reloads x, measured best at n = 1), 1 to 16 rows each. */
static uint32_t experts_rpw(size_t jobs)
{
    const size_t r = jobs / 2048;
    return (uint32_t)(r < 1 ? 1 : r > 16 ? 16 : r);
}

static unsigned chunk_blocks(size_t slots, uint32_t rows, uint32_t rpw)
{
    const size_t groups = slots * ((rows + rpw - 1) / rpw);
    return (unsigned)((groups + KL_XREG_WARPS - 1) / KL_XREG_WARPS);
}

/* gate_up and down of the register path: all three stacks MXFP4, I and H at most 4096. */
static int experts_xreg(const experts_k &k, hipStream_t st, kl_err *err)
{
    const uint32_t rpw1 = experts_rpw((size_t)k.n_slots * k.I);
    const uint32_t rpw2 = experts_rpw((size_t)k.n_slots * k.H);
    kl_xreg_dispatch(kl_xreg_s(k.H), [&](auto sc) {
        gate_up_xreg_kernel<decltype(sc)::value>
            <<<chunk_blocks(k.n_slots, k.I, rpw1), KL_XREG_WARPS * KL_GPU_GROUP, 0, st>>>(k, rpw1);
    });
    int rc = KL_GPU_CHECK(err, hipGetLastError());
    if (rc)
        return rc;
    kl_xreg_dispatch(kl_xreg_s(k.I), [&](auto sc) {
        down_xreg_kernel<decltype(sc)::value>
            <<<chunk_blocks(k.n_slots, k.H, rpw2), KL_XREG_WARPS * KL_GPU_GROUP, 0, st>>>(k, rpw2);
    });
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* y_t (+)= Σ_k of slot (t, k)'s row in k order: part[slot] (weighted already) when packed is
 * NULL, else wt[slot] · part[packed[slot]] (UINT32_MAX: an expert id out of range, NaN;
 * UINT32_MAX - 1: another rank's, nothing). */
__global__ static void combine_kernel(experts_k k, const uint32_t *packed)
{
    KL_GPU_GRID_WAIT();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t n = k.n_slots / k.top_k;
    if (i >= n * k.H)
        return;
    const size_t t = i / k.H, c = i % k.H;
    float s = 0.0f;
    for (uint32_t q = 0; q < k.top_k; q++) {
        const size_t slot = t * k.top_k + q;
        if (!packed) {
            s += k.part[slot * k.H + c];
            continue;
        }
        const uint32_t r = packed[slot];
        s += r >= UINT32_MAX - 1 ? no_expert(r == UINT32_MAX ? -1 : ELSEWHERE)
                                 : k.wt[slot] * k.part[(size_t)r * k.H + c];
    }
    k.y[i] = k.add_to_y ? k.y[i] + s : s;
}

/* ---- chunks (n >= kl_gpu_experts_grouped_min()): slots sorted by expert, grouped products - */

#define SORT_THREADS  1024
#define GROUPED_MAX_E 1024 /* seg [E + 1] has this bound in the scratch (moe.h's size) */

static int experts_ver, decode_ver; /* 0: KL_GPU_MOE, KL_GPU_MOE_DECODE not read yet */

/* *ver, read from $name the first time: 2 when it says v2; else for decode (its later
 * versions) 3 for v3, 4 for v3t, 6 for tc, 7 for i8, otherwise 5; else 3. */
static int env_version(int *ver, const char *name, int decode)
{
    if (!*ver) {
        const char *v = getenv(name);
        if (v && !strcmp(v, "v2"))
            *ver = 2;
        else if (decode && v && !strcmp(v, "v3"))
            *ver = 3;
        else if (decode && v && !strcmp(v, "v3t"))
            *ver = 4;
        else if (decode && v && !strcmp(v, "tc"))
            *ver = 6;
        else if (decode && v && !strcmp(v, "i8"))
            *ver = 7;
        else
            *ver = decode ? 5 : 3;
    }
    return *ver;
}

extern "C" int kl_gpu_experts_version(void)
{
    return env_version(&experts_ver, "KL_GPU_MOE", 0);
}

extern "C" void kl_gpu_experts_version_set(int version)
{
    experts_ver = version == 2 ? 2 : 3;
}

static uint32_t grouped_min; /* 0 until read from the environment */

extern "C" uint32_t kl_gpu_experts_grouped_min(void)
{
    if (!grouped_min) {
        const char *v = getenv("KL_GPU_MOE_GROUPED_MIN");
        grouped_min = v && atoi(v) >= 1 ? (uint32_t)atoi(v) : KL_GPU_EXPERTS_GROUPED_MIN_N;
    }
    return grouped_min;
}

extern "C" void kl_gpu_experts_grouped_min_set(uint32_t n)
{
    grouped_min = n;
}

extern "C" int kl_gpu_experts_decode_version(void)
{
    return env_version(&decode_ver, "KL_GPU_MOE_DECODE", 1);
}

extern "C" void kl_gpu_experts_decode_version_set(int version)
{
    decode_ver = version == 2 || (version >= 4 && version <= 7) ? version : 3;
}

/* Where the grouped path keeps its arrays in the scratch: gate, up [P, I], down [P, H],
 * then seg [GROUPED_MAX_E + 1], cnt [GROUPED_MAX_E], x_row [P], packed [P] as uint32 (P =
 * n · top_k slots). */
struct grouped_mem {
    float    *gate, *up, *down;
    uint32_t *seg, *cnt, *x_row, *packed;
    uint16_t *parts; /* the products' inputs split into bf16 parts (gemm.h), 16-byte aligned */
};

static grouped_mem grouped_layout(float *s, size_t P, size_t I, size_t H)
{
    grouped_mem g;
    g.gate = s;
    g.up = s + P * I;
    g.down = g.up + P * I;
    g.seg = (uint32_t *)(g.down + P * H);
    g.cnt = g.seg + GROUPED_MAX_E + 1;
    g.x_row = g.cnt + GROUPED_MAX_E;
    g.packed = g.x_row + P;
    g.parts = (uint16_t *)(((uintptr_t)(g.packed + P) + 15) & ~(uintptr_t)15);
    return g;
}

/* Stable counting sort of the P slots by expert, in two launches of a block per expert e, each
 * thread of it taking one segment of consecutive slots (segments in slot order):
 * sort_count_kernel counts e's slots into cnt[e] (and marks the slots whose id lies outside
 * [0, E): packed = UINT32_MAX, no row); sort_place_kernel takes e's offset (the counts of the
 * experts before it: seg[e]), the threads' exclusive prefix of their segments' counts, and
 * places its slots in order: x_row[pos] = token, packed[slot] = pos.  Every expert's rows come
 * out in slot order, as one block scanning them all would place them. */
__device__ static inline void sort_segment(uint32_t P, uint32_t *p0, uint32_t *p1)
{
    const uint32_t per = (P + SORT_THREADS - 1) / SORT_THREADS;
    *p0 = min(threadIdx.x * per, P);
    *p1 = min(*p0 + per, P);
}

/* grid (E), SORT_THREADS */
__global__ static void __launch_bounds__(SORT_THREADS)
    sort_count_kernel(const int32_t *idx, uint32_t P, uint32_t E, grouped_mem g)
{
    KL_GPU_GRID_WAIT();
    __shared__ uint32_t total;
    const uint32_t e = blockIdx.x;
    if (threadIdx.x == 0)
        total = 0;
    for (uint32_t p = e * SORT_THREADS + threadIdx.x; p < P; p += E * SORT_THREADS)
        if (idx[p] < 0 || (uint32_t)idx[p] >= E)
            g.packed[p] = idx[p] == ELSEWHERE ? UINT32_MAX - 1 : UINT32_MAX;
    __syncthreads();
    uint32_t p0, p1, c = 0;
    sort_segment(P, &p0, &p1);
    for (uint32_t p = p0; p < p1; p++)
        c += idx[p] == (int32_t)e;
    if (c)
        atomicAdd(&total, c);
    __syncthreads();
    if (threadIdx.x == 0)
        g.cnt[e] = total;
}

/* grid (E), SORT_THREADS, after sort_count_kernel */
__global__ static void __launch_bounds__(SORT_THREADS)
    sort_place_kernel(const int32_t *idx, uint32_t P, uint32_t top_k, uint32_t E, grouped_mem g)
{
    KL_GPU_GRID_WAIT();
    __shared__ uint32_t scan[SORT_THREADS], base;
    const uint32_t e = blockIdx.x, tid = threadIdx.x;
    if (tid == 0)
        base = 0;
    __syncthreads();
    uint32_t before = 0; /* the experts before e */
    for (uint32_t j = tid; j < e; j += SORT_THREADS)
        before += g.cnt[j];
    if (before)
        atomicAdd(&base, before);
    uint32_t p0, p1, c = 0;
    sort_segment(P, &p0, &p1);
    for (uint32_t p = p0; p < p1; p++)
        c += idx[p] == (int32_t)e;
    scan[tid] = c;
    __syncthreads();
    for (uint32_t off = 1; off < SORT_THREADS; off *= 2) { /* inclusive scan (Hillis-Steele) */
        const uint32_t v = tid >= off ? scan[tid - off] : 0;
        __syncthreads();
        scan[tid] += v;
        __syncthreads();
    }
    if (tid == 0) {
        g.seg[e] = base;
        if (e == E - 1)
            g.seg[E] = base + scan[SORT_THREADS - 1];
    }
    uint32_t pos = base + scan[tid] - c;
    for (uint32_t p = p0; c && p < p1; p++) {
        if (idx[p] == (int32_t)e) {
            g.x_row[pos] = p / top_k;
            g.packed[p] = pos++;
        }
    }
}

/* Whether kl_gpu_gemm_grouped takes m: MXFP4 (experts_check saw it aligned) or aligned BF16. */
static int grouped_kind_ok(const kl_gpu_mat &m)
{
    return m.kind == KL_GPU_W_MXFP4 || (m.kind == KL_GPU_W_BF16 && (uintptr_t)m.data % 16 == 0);
}

/* Whether kl_gpu_experts may take the grouped path for these arguments. */
static int grouped_ok(const kl_gpu_experts_args *a, const experts_k &k)
{
    const int kinds = grouped_kind_ok(k.w1) && grouped_kind_ok(k.w2) && grouped_kind_ok(k.w3);
    return kl_gpu_experts_version() == 3 && a->n >= kl_gpu_experts_grouped_min() && kinds &&
           k.E <= GROUPED_MAX_E && k.I % 32 == 0 && k.H % 32 == 0 &&
           (uintptr_t)a->x % 16 == 0 && (uintptr_t)a->scratch % 16 == 0;
}

/* sort, gate = grouped(w1), up = grouped(w3), h = SiLU(gate) · up (in gate), down = grouped(w2)
 * of h, then the weighted sum of each token's rows. */
static int experts_grouped(const kl_gpu_experts_args *a, experts_k k, hipStream_t st,
                           kl_err *err)
{
    const size_t P = k.n_slots;
    const grouped_mem g = grouped_layout(a->scratch, P, k.I, k.H);
    sort_count_kernel<<<k.E, SORT_THREADS, 0, st>>>(k.idx, (uint32_t)P, k.E, g);
    sort_place_kernel<<<k.E, SORT_THREADS, 0, st>>>(k.idx, (uint32_t)P, k.top_k, k.E, g);
    int rc = KL_GPU_CHECK(err, hipGetLastError());
    const kl_gpu_stream s = (kl_gpu_stream)st;
    kl_gpu_gemm_grouped_args ga = {a->w1, k.x, g.x_row, g.seg, (uint32_t)P, g.gate, g.parts, 0};
    rc = rc ? rc : kl_gpu_gemm_grouped(&ga, s, err);
    const int gate_split = kl_gpu_gemm_grouped_uses_parts(&ga);
    ga.w = a->w3;
    ga.y = g.up;
    ga.parts_ready = gate_split && kl_gpu_gemm_grouped_uses_parts(&ga); /* the same x split */
    rc = rc ? rc : kl_gpu_gemm_grouped(&ga, s, err);
    rc = rc ? rc : kl_gpu_silu_mul(g.gate, g.up, P * k.I, s, err);
    const kl_gpu_gemm_grouped_args gd = {a->w2,  g.gate,          NULL, g.seg,
                                         (uint32_t)P, g.down, g.parts, 0};
    rc = rc ? rc : kl_gpu_gemm_grouped(&gd, s, err);
    if (rc)
        return rc;
    k.part = g.down;
    const size_t outs = (size_t)a->n * k.H;
    combine_kernel<<<(unsigned)((outs + THREADS - 1) / THREADS), THREADS, 0, st>>>(k, g.packed);
    return KL_GPU_CHECK(err, hipGetLastError());
}

extern "C" size_t kl_gpu_experts_scratch(uint32_t n, uint32_t top_k, uint32_t inter,
                                         uint32_t hidden)
{
    const size_t P = (size_t)n * top_k;
    if (n < kl_gpu_experts_grouped_min())
        return P * ((size_t)inter + hidden);
    const size_t cols = inter > hidden ? inter : hidden; /* the widest product input */
    return P * (2 * (size_t)inter + hidden) + 2 * GROUPED_MAX_E + 1 + 2 * P +
           (kl_gpu_gemm_parts_bytes((uint32_t)P, (uint32_t)cols) + 15) / sizeof(float) + 4;
}

/* 0, or KL_E_USAGE: the stacks exist, agree on E, I and H, and each can be multiplied. */
static int experts_check(const kl_gpu_experts_args *a, kl_err *err)
{
    if (!a || !a->w1 || !a->w2 || !a->w3 || !a->x || !a->idx || !a->wt || !a->scratch ||
        !a->y || a->n == 0 || a->top_k == 0)
        return kl_fail(err, KL_E_USAGE, "experts: a pointer is NULL, or n or top_k is 0");
    int rc = kl_row_mat_check(&a->w1->m, "experts w1", err);
    if (!rc)
        rc = kl_row_mat_check(&a->w2->m, "experts w2", err);
    if (!rc)
        rc = kl_row_mat_check(&a->w3->m, "experts w3", err);
    if (rc)
        return rc;
    const kl_gpu_mat *g = &a->w1->m, *d = &a->w2->m, *u = &a->w3->m;
    if (a->w1->n == 0 || a->w2->n != a->w1->n || a->w3->n != a->w1->n || u->rows != g->rows ||
        u->cols != g->cols || d->rows != g->cols || d->cols != g->rows)
        return kl_fail(err, KL_E_USAGE,
                       "experts: stacks disagree (w1 %u x [%u, %u], w2 %u x [%u, %u], "
                       "w3 %u x [%u, %u])", a->w1->n, g->rows, g->cols, a->w2->n, d->rows,
                       d->cols, a->w3->n, u->rows, u->cols);
    const size_t slots = (size_t)a->n * a->top_k;
    if (slots * (g->rows > d->rows ? g->rows : d->rows) / KL_ROW_WARPS >= 0x7fffffffu)
        return kl_fail(err, KL_E_USAGE, "experts: %u tokens x top %u is too many", a->n,
                       a->top_k);
    return 0;
}

static unsigned blocks_of(size_t groups)
{
    return (unsigned)((groups + KL_ROW_WARPS - 1) / KL_ROW_WARPS);
}

extern "C" int kl_gpu_experts(const kl_gpu_experts_args *a, kl_gpu_stream s, kl_err *err)
{
    int rc = experts_check(a, err);
    if (rc)
        return rc;
    experts_k k;
    k.w1 = a->w1->m;
    k.w2 = a->w2->m;
    k.w3 = a->w3->m;
    k.E = a->w1->n;
    k.I = k.w1.rows;
    k.H = k.w1.cols;
    k.top_k = a->top_k;
    k.n_slots = a->n * a->top_k;
    k.x = a->x;
    k.idx = a->idx;
    k.wt = a->wt;
    k.h = a->scratch;
    k.part = a->scratch + (size_t)k.n_slots * k.I;
    k.y = a->y;
    k.add_to_y = a->add_to_y;
    k.trigger = kl_gpu_experts_decode_version() == 4;
    k.vec1 = kl_row_vec_ok(&k.w1, k.x, k.H);
    k.vec3 = kl_row_vec_ok(&k.w3, k.x, k.H);
    k.vec2 = kl_row_vec_ok(&k.w2, k.h, k.I);
    if ((k.w1.kind == KL_GPU_W_MXFP4 && !k.vec1) || (k.w3.kind == KL_GPU_W_MXFP4 && !k.vec3) ||
        (k.w2.kind == KL_GPU_W_MXFP4 && !k.vec2))
        return kl_fail(err, KL_E_USAGE, "experts: MXFP4 needs x and scratch 16-byte aligned");
    hipStream_t st = (hipStream_t)s;
    if (grouped_ok(a, k))
        return experts_grouped(a, k, st, err);
    const int mx = k.w1.kind == KL_GPU_W_MXFP4 && k.w2.kind == KL_GPU_W_MXFP4 &&
                   k.w3.kind == KL_GPU_W_MXFP4;
    if (mx && experts_tc_ok(k))
        return experts_tc(k, a->n, st, err);
    if (mx && experts_v3_ok(k))
        return experts_v3(k, a->n, st, err);
    if (mx && kl_gpu_version(KL_GPU_K_MX) == 2 && k.H <= KL_MX2_MAX_COLS &&
        k.I <= KL_MX2_MAX_COLS && k.n_slots <= 65535) {
        rc = experts_mx2(k, st, err);
    } else if (mx && kl_xreg_s(k.H) && kl_xreg_s(k.I)) {
        rc = experts_xreg(k, st, err);
    } else {
        gate_up_kernel<<<blocks_of((size_t)k.n_slots * k.I), THREADS, 0, st>>>(k);
        if (!(rc = KL_GPU_CHECK(err, hipGetLastError())))
            down_kernel<<<blocks_of((size_t)k.n_slots * k.H), THREADS, 0, st>>>(k);
        rc = rc ? rc : KL_GPU_CHECK(err, hipGetLastError());
    }
    if (rc)
        return rc;
    const size_t outs = (size_t)a->n * k.H;
    combine_kernel<<<(unsigned)((outs + THREADS - 1) / THREADS), THREADS, 0, st>>>(k, NULL);
    return KL_GPU_CHECK(err, hipGetLastError());
}
