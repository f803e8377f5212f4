/*
 * kernels/kda.cu — KDA between the projections: short conv + SiLU, and the delta-rule
 * recurrence with its gated RMSNorm (see kda.h; the CPU reference: engine/forward.c).
 *
 * Conv: one thread per (run, q/k/v, channel, segment of the run's tokens); it keeps the
 * channel's window in registers and walks its segment in order, exactly as short_conv does
 * (the inputs before the segment read before any thread writes).
 *
 * Recurrence: one block of RECUR_THREADS per (run, head); the head's state S [K][K] stays in
 * registers for the whole run (read once, written once).  Thread (group w, lane) owns rows
 * i = w + RECUR_GROUPS * r and columns j = lane + KL_GPU_GROUP * c.  Per token, with
 * d_i = exp(g_i), the one-pass form of the reference's steps (exact in real arithmetic):
 *   a_j = Σ_i k̂_i d_i S_ij,  b_j = Σ_i q̂_i d_i S_ij          (S after the decay, read once)
 *   u_j = β (v_j − a_j),    o_j = b_j + u_j (q̂·k̂),    S'_ij = d_i S_ij + k̂_i u_j.
 * The column sums over i are partial per group, then summed over the groups in shared memory
 * in a fixed order (deterministic).
 *
 * v2 (the default; KL_GPU_KDA=v1 or kl_gpu_kda_select(1) runs recur_kernel): value columns
 * are independent, so recur2_kernel gives each block 32 columns of one head (H x K/32 blocks:
 * 128 at the full shape instead of 32), each thread one column of R2_ROWS rows; the readout
 * goes to o before the norm and kda_norm_kernel (a group per (token, head)) applies the gated
 * RMSNorm in place.
 *
 * v3 (the default for runs of >= KL_GPU_KDA_CHUNK_MIN tokens when the caller passes scratch;
 * KL_GPU_KDA=v2 or v1 selects the others): the chunked form derived and checked in plain C in
 * tests/test_kda_chunk.c.  chunk_prep_kernel, a block per (run, head, chunk of 32 tokens), all
 * chunks at once: l2 norms, gate, G = the cumulative sum of g, A and M (exponents are
 * differences G_t − G_s <= 0), X and Y by forward substitution, written to a scratch record
 * per (token, head).  chunk_apply_kernel, a block per (run, head, 32 value columns), walks the
 * run's chunks in order with the state slice in shared memory: u = Y − X S, o = Qg S + M u,
 * S ← diag(e^{G_last}) S + Kgᵀ u.  fp32 throughout (SIMT); then kda_norm_kernel as in v2.
 * chunk_apply_kernel<2> (the default; KL_GPU_KDA_APPLY=v1 or kl_gpu_kda_apply_select(1) runs
 * <1>, round 1's) does the same arithmetic in the same order, bitwise the same results,
 * with the next chunk's records copied by cp.async (16 bytes a copy, no index division) into
 * a second buffer while the current one computes, two barriers a chunk instead of three.
 */
#include "kernels/gpu.h"
#include "kernels/kda.h"
#include "kernels/kda_conv.cuh"
#include "kernels/mma.cuh"
#include "kernels/tokens.h"

#include <stdlib.h>
#include <string.h>

#define CONV_SEGS     8                    /* token segments of a run, for runs of ... */
#define CONV_SEG_MIN  64u                  /* ... this many tokens at least */
#define RECUR_GROUPS  16                   /* groups of KL_GPU_GROUP lanes per block */
#define RECUR_THREADS (RECUR_GROUPS * KL_GPU_GROUP)
#define MAX_K         128                  /* head_dim at most */
#define ROWS_PER      (MAX_K / RECUR_GROUPS) /* state rows per thread */
#define COLS_PER      (MAX_K / KL_GPU_GROUP) /* state columns per thread */
/* v2 (the default; KL_GPU_KDA=v1 selects the kernel above): value columns over blocks */
#define R2_GROUPS     8                    /* groups of KL_GPU_GROUP lanes per block */
#define R2_THREADS    (R2_GROUPS * KL_GPU_GROUP)
#define R2_ROWS       (MAX_K / R2_GROUPS)  /* state rows per thread (one column per lane) */
#define NORM_GROUPS   8                    /* (token, head) pairs per norm block */
/* v3 (the default for runs of >= KL_GPU_KDA_CHUNK_MIN tokens): the chunked form */
#define KDA_C         32                   /* tokens per chunk */
#define C_GROUPS      8                    /* groups of KL_GPU_GROUP lanes per block */
#define C_THREADS     (C_GROUPS * KL_GPU_GROUP)
#define C_TOKENS      (KDA_C / C_GROUPS)   /* chunk tokens per group in the state products */
#define C_ROWS        (MAX_K / C_GROUPS)   /* state rows per thread in the update */

__device__ static inline float sigmoid(float z)
{
    return 1.0f / (1.0f + expf(-z));
}

/* softplus with fla's threshold, as the CPU engine */
__device__ static inline float softplus(float z)
{
    return z > 20.0f ? z : log1pf(expf(z));
}

/* ------------------------------------------------------------------------------------------ */
/* Short conv                                                                                 */

/* grid (channel blocks of 32, 3, runs), blockDim.x = 32 S: kda_conv_thread (kda_conv.cuh)
 * for channel c of qkv[blockIdx.y] over run blockIdx.z, segment threadIdx.x / 32 of S. */
__global__ static void conv_kernel(kl_gpu_kda_conv_args a, const uint32_t *run_start,
                                   const uint32_t *run_slot, int early)
{
    KL_GPU_GRID_WAIT();
    KL_GPU_EARLY_DEPENDENTS(early);
    const uint32_t c = blockIdx.x * KL_GPU_GROUP + threadIdx.x % KL_GPU_GROUP;
    kda_conv_thread(a, run_start, run_slot, c, blockIdx.y, blockIdx.z,
                    threadIdx.x / KL_GPU_GROUP, blockDim.x / KL_GPU_GROUP, true);
}

extern "C" int kl_gpu_kda_conv(const kl_gpu_kda_conv_args *a, const kl_gpu_tokens *t,
                               kl_gpu_stream s, kl_err *err)
{
    if (kda_conv_check(a, t, err))
        return err->code;
    if (t->n_runs == 0)
        return 0;
    /* prompts: segments of each run in parallel (a thread walked all of a channel's tokens) */
    const unsigned segs = t->max_run >= CONV_SEG_MIN ? CONV_SEGS : 1;
    dim3 grid((a->D + KL_GPU_GROUP - 1) / KL_GPU_GROUP, 3, t->n_runs);
    const int early = kl_gpu_early_dependents(grid, segs * KL_GPU_GROUP);
    conv_kernel<<<grid, segs * KL_GPU_GROUP, 0, (hipStream_t)s>>>(*a, t->run_start, t->run_slot,
                                                                  early);
    return KL_GPU_CHECK(err, hipGetLastError());
}

/* ------------------------------------------------------------------------------------------ */
/* Recurrence                                                                                 */

/* Per-token vectors of one head, shared by the block. */
struct head_vecs {
    float kd[MAX_K], qd[MAX_K];  /* k̂ ⊙ d, q̂ ⊙ d */
    float d[MAX_K], kh[MAX_K];   /* d = exp(g), k̂ */
    float v[MAX_K], u[MAX_K];    /* v, then u = β (v − a) */
    float o[MAX_K], og[MAX_K];   /* readout before the norm; o_norm ⊙ sigmoid(gate) */
    float beta, qk;              /* β, q̂·k̂ */
};

#define PER_LANE (MAX_K / KL_GPU_GROUP) /* channels per lane of group 0 */

/* One token's inputs of head h for lane `lane` of group 0, in registers. */
struct token_in {
    float q[PER_LANE], k[PER_LANE], f[PER_LANE], v[PER_LANE], g[PER_LANE], on[PER_LANE];
    float beta_logit;
};

/* Group 0: issues the loads of token t's inputs (f with dt_bias added).  The block loads the
 * next token's while it works on the current one, so a run waits for memory once. */
__device__ static void token_load(const kl_gpu_kda_recur_args &a, size_t t, uint32_t h,
                                  unsigned lane, token_in *x)
{
    const uint32_t K = a.K;
    const size_t off = t * a.H * K + (size_t)h * K;
#pragma unroll
    for (int e = 0; e < PER_LANE; e++) {
        const uint32_t i = lane + KL_GPU_GROUP * e;
        const bool in = i < K;
        x->q[e] = in ? a.q[off + i] : 0.0f;
        x->k[e] = in ? a.k[off + i] : 0.0f;
        x->f[e] = in ? a.f[off + i] + a.dt_bias[(size_t)h * K + i] : 0.0f;
        x->v[e] = in ? a.v[off + i] : 0.0f;
        x->g[e] = in ? a.gate[off + i] : 0.0f;
        x->on[e] = in ? a.o_norm[i] : 0.0f;
    }
    x->beta_logit = a.beta_logit[t * a.H + h];
}

/* Group 0 (KL_GPU_GROUP lanes): from the token's inputs x, its q̂, k̂, d, β, q̂·k̂ and output
 * gate of head h into hv. */
__device__ static void token_prep(const kl_gpu_kda_recur_args &a, const token_in &x, uint32_t h,
                                  unsigned lane, head_vecs *hv)
{
    const uint32_t K = a.K;
    const float *q = x.q, *k = x.k, *f = x.f, *v = x.v, *g = x.g, *on = x.on;
    const float beta_logit = x.beta_logit, A = -expf(a.a_log[h]);
    float qq = 0.0f, kk = 0.0f;
#pragma unroll
    for (int e = 0; e < PER_LANE; e++) {
        qq += q[e] * q[e];
        kk += k[e] * k[e];
    }
    qq = kl_gpu_group_sum(qq);
    kk = kl_gpu_group_sum(kk);
    const float qn = (1.0f / sqrtf((float)K)) / sqrtf(qq + 1e-6f), kn = 1.0f / sqrtf(kk + 1e-6f);
    float qk = 0.0f;
#pragma unroll
    for (int e = 0; e < PER_LANE; e++) {
        const uint32_t i = lane + KL_GPU_GROUP * e;
        if (i >= K)
            continue;
        const float qh = q[e] * qn, khi = k[e] * kn, d = expf(A * softplus(f[e]));
        hv->kd[i] = khi * d;
        hv->qd[i] = qh * d;
        hv->d[i] = d;
        hv->kh[i] = khi;
        hv->v[i] = v[e];
        hv->og[i] = on[e] * sigmoid(g[e]);
        qk += qh * khi;
    }
    qk = kl_gpu_group_sum(qk);
    if (lane == 0) {
        hv->qk = qk;
        hv->beta = sigmoid(beta_logit);
    }
}

/* Group 0, token t of a run [t0, t1) of head h: its head vectors into hv from *next (loaded
 * here for the first token), then the next token's loads issued into *next, so the block
 * works on one token while the next one's inputs are on their way. */
__device__ static void token_next(const kl_gpu_kda_recur_args &a, uint32_t t, uint32_t t0,
                                  uint32_t t1, uint32_t h, unsigned lane, token_in *next,
                                  head_vecs *hv)
{
    if (t == t0)
        token_load(a, t0, h, lane, next);
    token_prep(a, *next, h, lane, hv);
    if (t + 1 < t1)
        token_load(a, t + 1, h, lane, next);
}

/* Group 0: o = o · rsqrt(mean(o²) + eps) ⊙ o_norm ⊙ sigmoid(gate) of head h, token t. */
__device__ static void token_norm(const kl_gpu_kda_recur_args &a, size_t t, uint32_t h,
                                  unsigned lane, const head_vecs *hv)
{
    const uint32_t K = a.K;
    const size_t off = t * a.H * K + (size_t)h * K;
    float ss = 0.0f;
    for (uint32_t j = lane; j < K; j += KL_GPU_GROUP)
        ss += hv->o[j] * hv->o[j];
    ss = kl_gpu_group_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)K + a.eps);
    for (uint32_t j = lane; j < K; j += KL_GPU_GROUP)
        a.o[off + j] = hv->o[j] * inv * hv->og[j];
}

/* grid (H, runs): head blockIdx.x of run blockIdx.y, its tokens in order */
__global__ static void __launch_bounds__(RECUR_THREADS)
recur_kernel(kl_gpu_kda_recur_args a, const uint32_t *run_start, const uint32_t *run_slot)
{
    KL_GPU_GRID_WAIT();
    __shared__ head_vecs hv;
    __shared__ float part[2][RECUR_GROUPS][MAX_K]; /* per-group partial a_j, b_j */
    const uint32_t h = blockIdx.x, r = blockIdx.y, K = a.K;
    const unsigned w = threadIdx.x / KL_GPU_GROUP, lane = threadIdx.x % KL_GPU_GROUP;
    float *S = a.state + run_slot[r] * a.state_stride + (size_t)h * K * K;
    float st[ROWS_PER][COLS_PER];
#pragma unroll
    for (int ri = 0; ri < ROWS_PER; ri++)
#pragma unroll
        for (int ci = 0; ci < COLS_PER; ci++) {
            const uint32_t i = w + RECUR_GROUPS * ri, j = lane + KL_GPU_GROUP * ci;
            st[ri][ci] = i < K && j < K ? S[i * K + j] : 0.0f;
        }
    const uint32_t t0 = run_start[r], t1 = run_start[r + 1];
    token_in next;
    for (uint32_t t = t0; t < t1; t++) {
        if (w == 0)
            token_next(a, t, t0, t1, h, lane, &next, &hv);
        __syncthreads();
        /* partial a_j, b_j over this group's rows */
#pragma unroll
        for (int ci = 0; ci < COLS_PER; ci++) {
            const uint32_t j = lane + KL_GPU_GROUP * ci;
            float pa = 0.0f, pb = 0.0f;
#pragma unroll
            for (int ri = 0; ri < ROWS_PER; ri++) {
                const uint32_t i = w + RECUR_GROUPS * ri;
                if (i < K) {
                    pa += hv.kd[i] * st[ri][ci];
                    pb += hv.qd[i] * st[ri][ci];
                }
            }
            if (j < K) {
                part[0][w][j] = pa;
                part[1][w][j] = pb;
            }
        }
        __syncthreads();
        /* column j: sum over the groups in order, then u_j and the readout o_j */
        for (uint32_t j = threadIdx.x; j < K; j += RECUR_THREADS) {
            float sa = 0.0f, sb = 0.0f;
            for (int g = 0; g < RECUR_GROUPS; g++) {
                sa += part[0][g][j];
                sb += part[1][g][j];
            }
            const float u = hv.beta * (hv.v[j] - sa);
            hv.u[j] = u;
            hv.o[j] = sb + u * hv.qk;
        }
        __syncthreads();
        /* S' = diag(d) S + k̂ uᵀ */
#pragma unroll
        for (int ri = 0; ri < ROWS_PER; ri++) {
            const uint32_t i = w + RECUR_GROUPS * ri;
            if (i >= K)
                continue;
#pragma unroll
            for (int ci = 0; ci < COLS_PER; ci++) {
                const uint32_t j = lane + KL_GPU_GROUP * ci;
                if (j < K)
                    st[ri][ci] = hv.d[i] * st[ri][ci] + hv.kh[i] * hv.u[j];
            }
        }
        if (w == 0)
            token_norm(a, t, h, lane, &hv);
        __syncthreads(); /* hv is rewritten by the next token */
    }
#pragma unroll
    for (int ri = 0; ri < ROWS_PER; ri++)
#pragma unroll
        for (int ci = 0; ci < COLS_PER; ci++) {
            const uint32_t i = w + RECUR_GROUPS * ri, j = lane + KL_GPU_GROUP * ci;
            if (i < K && j < K)
                S[i * K + j] = st[ri][ci];
        }
}

/* grid (H, ceil(K / 32), runs), v2: value columns j = 32 blockIdx.y + lane of head blockIdx.x
 * over run blockIdx.z, the same one-pass steps as recur_kernel with the state slice [K][32] in
 * registers (thread (group w, lane): rows w + R2_GROUPS r); every block prepares the token's
 * head vectors itself.  o gets the readout before the norm (kda_norm_kernel finishes it). */
__global__ static void __launch_bounds__(R2_THREADS)
recur2_kernel(kl_gpu_kda_recur_args a, const uint32_t *run_start, const uint32_t *run_slot)
{
    KL_GPU_GRID_WAIT();
    __shared__ head_vecs hv;
    __shared__ float part[2][R2_GROUPS][KL_GPU_GROUP]; /* per-group partial a_j, b_j */
    const uint32_t h = blockIdx.x, r = blockIdx.z, K = a.K;
    const unsigned w = threadIdx.x / KL_GPU_GROUP, lane = threadIdx.x % KL_GPU_GROUP;
    const uint32_t j = blockIdx.y * KL_GPU_GROUP + lane;
    float *S = a.state + run_slot[r] * a.state_stride + (size_t)h * K * K;
    float st[R2_ROWS];
#pragma unroll
    for (int ri = 0; ri < R2_ROWS; ri++) {
        const uint32_t i = w + R2_GROUPS * ri;
        st[ri] = i < K && j < K ? S[i * K + j] : 0.0f;
    }
    const uint32_t t0 = run_start[r], t1 = run_start[r + 1];
    token_in next;
    for (uint32_t t = t0; t < t1; t++) {
        if (w == 0)
            token_next(a, t, t0, t1, h, lane, &next, &hv);
        __syncthreads();
        float pa = 0.0f, pb = 0.0f; /* partial a_j, b_j over this group's rows */
#pragma unroll
        for (int ri = 0; ri < R2_ROWS; ri++) {
            const uint32_t i = w + R2_GROUPS * ri;
            if (i < K) {
                pa += hv.kd[i] * st[ri];
                pb += hv.qd[i] * st[ri];
            }
        }
        part[0][w][lane] = pa;
        part[1][w][lane] = pb;
        __syncthreads();
        if (w == 0 && j < K) { /* column j: the groups summed in order, u_j, o_j */
            float sa = 0.0f, sb = 0.0f;
            for (int g = 0; g < R2_GROUPS; g++) {
                sa += part[0][g][lane];
                sb += part[1][g][lane];
            }
            const float u = hv.beta * (hv.v[j] - sa);
            hv.u[j] = u;
            a.o[(size_t)t * a.H * K + (size_t)h * K + j] = sb + u * hv.qk;
        }
        __syncthreads();
#pragma unroll
        for (int ri = 0; ri < R2_ROWS; ri++) { /* S' = diag(d) S + k̂ uᵀ */
            const uint32_t i = w + R2_GROUPS * ri;
            if (i < K && j < K)
                st[ri] = hv.d[i] * st[ri] + hv.kh[i] * hv.u[j];
        }
        __syncthreads(); /* hv is rewritten by the next token */
    }
#pragma unroll
    for (int ri = 0; ri < R2_ROWS; ri++) {
        const uint32_t i = w + R2_GROUPS * ri;
        if (i < K && j < K)
            S[i * K + j] = st[ri];
    }
}

/* grid (ceil(n H / NORM_GROUPS)), v2: a group of 32 lanes per (token, head) pair p = (t, h):
 * o ← o · rsqrt(mean(o²) + eps) ⊙ o_norm ⊙ sigmoid(gate), in place. */
__global__ static void __launch_bounds__(NORM_GROUPS * KL_GPU_GROUP)
kda_norm_kernel(kl_gpu_kda_recur_args a, uint32_t n, int early)
{
    KL_GPU_GRID_WAIT();
    KL_GPU_EARLY_DEPENDENTS(early);
    const uint32_t p = blockIdx.x * NORM_GROUPS + threadIdx.x / KL_GPU_GROUP, K = a.K;
    const unsigned lane = threadIdx.x % KL_GPU_GROUP;
    if (p >= n * a.H) /* the whole group leaves together */
        return;
    const size_t off = (size_t)p * K; /* o[t][h*K ..] with p = t H + h */
    float o[PER_LANE], ss = 0.0f;
#pragma unroll
    for (int e = 0; e < PER_LANE; e++) {
        const uint32_t j = lane + KL_GPU_GROUP * e;
        o[e] = j < K ? a.o[off + j] : 0.0f;
        ss += o[e] * o[e];
    }
    ss = kl_gpu_group_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)K + a.eps);
#pragma unroll
    for (int e = 0; e < PER_LANE; e++) {
        const uint32_t j = lane + KL_GPU_GROUP * e;
        if (j < K)
            a.o[off + j] = o[e] * inv * a.o_norm[j] * sigmoid(a.gate[off + j]);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* v3: the chunked form (tests/test_kda_chunk.c derives it and checks it in plain C)         */

/* Prep's shared memory: the chunk's q̂ (then β k̂ ⊙ e^G, then X), k̂, g (then G), v (then β v,
 * then Y), rows padded so a group reading a column of rows hits distinct banks; A; β. */
struct prep_smem {
    float q[KDA_C][MAX_K + 1], k[KDA_C][MAX_K + 1], G[KDA_C][MAX_K + 1], v[KDA_C][MAX_K + 1];
    float A[KDA_C][KDA_C + 1], beta[KDA_C];
};

/* One chunk's records in shared memory (rows of 16 bytes: X, Qg, Kg, M and Y are copied and
 * read four floats at a time): X, Qg, Kg [t][c], M [t][s], Y [t][value column of the block's
 * slice], the chunk's decay. */
struct chunk_buf {
    float X[KDA_C][MAX_K], Qg[KDA_C][MAX_K], Kg[KDA_C][MAX_K], M[KDA_C][KDA_C];
    float Y[KDA_C][KL_GPU_GROUP], dec[MAX_K];
};

/* Apply's shared memory: the state slice [K][32], u, the records of two chunks (apply v1 uses
 * b[0] only; v2 copies the next chunk's into one while it computes on the other). */
struct alignas(16) apply_smem {
    float S[MAX_K][KL_GPU_GROUP], U[KDA_C][KL_GPU_GROUP];
    chunk_buf b[2];
};

#define APPLY1_SMEM (sizeof(apply_smem) - sizeof(chunk_buf)) /* v1: b[0] only */

/* The scratch record of token t, head h: X [K], Y [K], Qg [K], Kg [K], M [KDA_C], and at the
 * first token of a chunk its decay e^{G_last} [K] (kda.h: kl_gpu_kda_scratch). */
__device__ static inline float *chunk_rec(const kl_gpu_kda_recur_args &a, size_t t, uint32_t h)
{
    return a.scratch + (t * a.H + h) * (5 * (size_t)a.K + KDA_C);
}

/* Prep, group w, lane: tokens t = w, w + C_GROUPS, .. < L of the chunk from t0 into shared
 * memory: q̂, k̂ (l2-normed), g (the gate), v; β. */
__device__ static void prep_load(const kl_gpu_kda_recur_args &a, uint32_t t0, uint32_t L,
                                 uint32_t h, unsigned w, unsigned lane, prep_smem *p)
{
    const uint32_t K = a.K;
    const float A = -expf(a.a_log[h]), scale = 1.0f / sqrtf((float)K);
    for (uint32_t t = w; t < L; t += C_GROUPS) {
        const size_t off = (size_t)(t0 + t) * a.H * K + (size_t)h * K;
        float q[PER_LANE], k[PER_LANE], qq = 0.0f, kk = 0.0f;
#pragma unroll
        for (int e = 0; e < PER_LANE; e++) {
            const uint32_t i = lane + KL_GPU_GROUP * e;
            q[e] = i < K ? a.q[off + i] : 0.0f;
            k[e] = i < K ? a.k[off + i] : 0.0f;
            qq += q[e] * q[e];
            kk += k[e] * k[e];
        }
        qq = kl_gpu_group_sum(qq);
        kk = kl_gpu_group_sum(kk);
        const float qn = scale / sqrtf(qq + 1e-6f), kn = 1.0f / sqrtf(kk + 1e-6f);
#pragma unroll
        for (int e = 0; e < PER_LANE; e++) {
            const uint32_t i = lane + KL_GPU_GROUP * e;
            if (i >= K)
                continue;
            p->q[t][i] = q[e] * qn;
            p->k[t][i] = k[e] * kn;
            p->G[t][i] = A * softplus(a.f[off + i] + a.dt_bias[(size_t)h * K + i]);
            p->v[t][i] = a.v[off + i];
        }
        if (lane == 0)
            p->beta[t] = sigmoid(a.beta_logit[(size_t)(t0 + t) * a.H + h]);
    }
}

/* Prep: A[t][s] = β_t Σ_c k̂_tc k̂_sc e^{G_tc − G_sc} (s < t) into shared memory, and
 * M[t][s] = Σ_c q̂_tc k̂_sc e^{G_tc − G_sc} (s <= t, else 0) into the records. */
__device__ static void prep_scores(const kl_gpu_kda_recur_args &a, uint32_t t0, uint32_t L,
                                   uint32_t h, prep_smem *p)
{
    for (uint32_t x = threadIdx.x; x < L * KDA_C; x += C_THREADS) {
        const uint32_t t = x / KDA_C, s = x % KDA_C;
        float sa = 0.0f, sm = 0.0f;
        for (uint32_t c = 0; s <= t && c < a.K; c++) {
            const float e = expf(p->G[t][c] - p->G[s][c]), ks = p->k[s][c];
            sa += p->k[t][c] * ks * e;
            sm += p->q[t][c] * ks * e;
        }
        p->A[t][s] = s < t ? p->beta[t] * sa : 0.0f;
        chunk_rec(a, t0 + t, h)[4 * a.K + s] = sm;
    }
}

/* Prep: the records' Qg = q̂ ⊙ e^G, Kg = k̂ ⊙ e^{G_last − G}, the chunk's decay e^{G_last};
 * q̂ replaced by β k̂ ⊙ e^G and v by β v in shared memory (the right-hand sides of X, Y). */
__device__ static void prep_vectors(const kl_gpu_kda_recur_args &a, uint32_t t0, uint32_t L,
                                    uint32_t h, prep_smem *p)
{
    const uint32_t K = a.K;
    for (uint32_t x = threadIdx.x; x < L * K; x += C_THREADS) {
        const uint32_t t = x / K, c = x % K;
        float *r = chunk_rec(a, t0 + t, h);
        const float eg = expf(p->G[t][c]), kh = p->k[t][c];
        r[2 * K + c] = p->q[t][c] * eg;
        r[3 * K + c] = kh * expf(p->G[L - 1][c] - p->G[t][c]);
        if (t == 0)
            r[4 * K + KDA_C + c] = expf(p->G[L - 1][c]);
        p->q[t][c] = p->beta[t] * kh * eg;
        p->v[t][c] *= p->beta[t];
    }
}

/* grid (chunks of the longest run, H, runs): the state-free part of chunk blockIdx.x of head
 * blockIdx.y of run blockIdx.z into the records; (I + A) X = β k̂ ⊙ e^G and (I + A) Y = β v
 * solved by forward substitution, a thread per column. */
__global__ static void __launch_bounds__(C_THREADS)
chunk_prep_kernel(kl_gpu_kda_recur_args a, const uint32_t *run_start)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ float4 chunk_sh[];
    prep_smem *p = (prep_smem *)chunk_sh;
    const uint32_t h = blockIdx.y, r = blockIdx.z, K = a.K;
    const uint32_t t0 = run_start[r] + blockIdx.x * KDA_C, t1 = run_start[r + 1];
    if (t0 >= t1)
        return;
    const uint32_t L = min(t1 - t0, (uint32_t)KDA_C);
    prep_load(a, t0, L, h, threadIdx.x / KL_GPU_GROUP, threadIdx.x % KL_GPU_GROUP, p);
    __syncthreads();
    for (uint32_t c = threadIdx.x; c < K; c += C_THREADS) { /* G: the cumulative sum */
        float acc = 0.0f;
        for (uint32_t t = 0; t < L; t++)
            p->G[t][c] = acc += p->G[t][c];
    }
    __syncthreads();
    prep_scores(a, t0, L, h, p);
    __syncthreads();
    prep_vectors(a, t0, L, h, p);
    __syncthreads();
    for (uint32_t col = threadIdx.x; col < 2 * K; col += C_THREADS) {
        float(*z)[MAX_K + 1] = col < K ? p->q : p->v;
        const uint32_t c = col < K ? col : col - K;
        for (uint32_t t = 0; t < L; t++) {
            float y = z[t][c];
            for (uint32_t s = 0; s < t; s++)
                y -= p->A[t][s] * z[s][c];
            z[t][c] = y;
            chunk_rec(a, t0 + t, h)[(col < K ? 0 : K) + c] = y;
        }
    }
}

/* Apply v1: the chunk's records of head h (tokens t0.., L of them; value columns j0..) into
 * shared memory, a float at a time. */
__device__ static void apply_load(const kl_gpu_kda_recur_args &a, uint32_t t0, uint32_t L,
                                  uint32_t h, uint32_t j0, chunk_buf *p)
{
    const uint32_t K = a.K;
    for (uint32_t x = threadIdx.x; x < L * K; x += C_THREADS) {
        const uint32_t t = x / K, c = x % K;
        const float *r = chunk_rec(a, t0 + t, h);
        p->X[t][c] = r[c];
        p->Qg[t][c] = r[2 * K + c];
        p->Kg[t][c] = r[3 * K + c];
    }
    for (uint32_t x = threadIdx.x; x < L * KDA_C; x += C_THREADS)
        p->M[x / KDA_C][x % KDA_C] = chunk_rec(a, t0 + x / KDA_C, h)[4 * K + x % KDA_C];
    for (uint32_t x = threadIdx.x; x < L * KL_GPU_GROUP; x += C_THREADS) {
        const uint32_t t = x / KL_GPU_GROUP, l = x % KL_GPU_GROUP;
        p->Y[t][l] = j0 + l < K ? chunk_rec(a, t0 + t, h)[K + j0 + l] : 0.0f;
    }
    for (uint32_t c = threadIdx.x; c < K; c += C_THREADS)
        p->dec[c] = chunk_rec(a, t0, h)[4 * K + KDA_C + c];
}

/* Apply v2, thread (group w, lane): the same records by cp.async, 16 bytes a copy, one
 * committed group; no division: group w copies the records of tokens w + C_GROUPS m, lane the
 * 16 bytes at 4 lane of each row of K (K / 4 <= 32 units: one a lane), lanes 0..7 M's row
 * and lanes 8..15 Y's (zeros past column K); the last group also the decay.  The records are
 * 16-byte aligned (scratch is, K % 4 == 0: every field starts at a multiple of 4 floats). */
__device__ static void apply_fetch(const kl_gpu_kda_recur_args &a, uint32_t t0, uint32_t L,
                                   uint32_t h, uint32_t j0, unsigned w, unsigned lane,
                                   chunk_buf *p)
{
    const uint32_t K = a.K, c = 4 * lane;
    for (uint32_t t = w; t < L; t += C_GROUPS) {
        const float *r = chunk_rec(a, t0 + t, h);
        if (c < K) {
            copy16(&p->X[t][c], r + c, 16);
            copy16(&p->Qg[t][c], r + 2 * K + c, 16);
            copy16(&p->Kg[t][c], r + 3 * K + c, 16);
        }
        if (c < KDA_C) {
            copy16(&p->M[t][c], r + 4 * K + c, 16);
        } else if (c < KDA_C + KL_GPU_GROUP) {
            const uint32_t l = c - KDA_C; /* the slice's columns l .. l + 3, all or none < K */
            const bool in = j0 + l < K;
            copy16(&p->Y[t][l], r + K + (in ? j0 + l : 0), in ? 16 : 0);
        }
    }
    if (w == C_GROUPS - 1 && c < K)
        copy16(&p->dec[c], chunk_rec(a, t0, h) + 4 * K + KDA_C + c, 16);
    copy_commit();
}

/* Apply, thread (group w, lane), after the chunk's records in b are in place: the state
 * products over tokens t = w + C_GROUPS m (< L) of column lane, u = Y − X S into U, and the
 * readout's first term oq[m] = (Qg S)[t]. */
__device__ static void apply_products(apply_smem *p, const chunk_buf *b, unsigned w,
                                      unsigned lane, uint32_t K, uint32_t L,
                                      float (&oq)[C_TOKENS])
{
    float ox[C_TOKENS];
#pragma unroll
    for (int m = 0; m < C_TOKENS; m++)
        ox[m] = oq[m] = 0.0f;
    for (uint32_t i = 0; i < K; i += 4) { /* K % 4 == 0 */
        const float s0 = p->S[i][lane], s1 = p->S[i + 1][lane], s2 = p->S[i + 2][lane],
                    s3 = p->S[i + 3][lane];
#pragma unroll
        for (int m = 0; m < C_TOKENS; m++)
            if (w + C_GROUPS * m < L) { /* the same for the whole group */
                const float4 x = *(const float4 *)&b->X[w + C_GROUPS * m][i];
                const float4 q = *(const float4 *)&b->Qg[w + C_GROUPS * m][i];
                ox[m] += x.x * s0 + x.y * s1 + x.z * s2 + x.w * s3;
                oq[m] += q.x * s0 + q.y * s1 + q.z * s2 + q.w * s3;
            }
    }
#pragma unroll
    for (int m = 0; m < C_TOKENS; m++)
        if (w + C_GROUPS * m < L)
            p->U[w + C_GROUPS * m][lane] = b->Y[w + C_GROUPS * m][lane] - ox[m];
}

/* Apply, after U is complete: o = oq + M u for tokens t = w + C_GROUPS m of column j (before
 * the norm), tokens from t0 of head h. */
__device__ static void apply_readout(const kl_gpu_kda_recur_args &a, const apply_smem *p,
                                     const chunk_buf *b, const float (&oq)[C_TOKENS],
                                     uint32_t t0, uint32_t L, uint32_t h, unsigned w,
                                     unsigned lane, uint32_t j)
{
    const uint32_t K = a.K;
#pragma unroll
    for (int m = 0; m < C_TOKENS; m++) {
        const uint32_t t = w + C_GROUPS * m;
        if (t >= L || j >= K)
            continue;
        float y = oq[m];
        for (uint32_t s = 0; s <= t; s++)
            y += b->M[t][s] * p->U[s][lane];
        a.o[(size_t)(t0 + t) * a.H * K + (size_t)h * K + j] = y;
    }
}

/* Apply, thread (group w, lane): rows i0 .. i0 + C_ROWS - 1 of the state slice's column lane,
 * S ← diag(dec) S + Kgᵀ u (rows >= K stay 0). */
__device__ static void state_update(apply_smem *p, const chunk_buf *b, uint32_t i0,
                                    unsigned lane, uint32_t K, uint32_t L)
{
    float y[C_ROWS];
#pragma unroll
    for (int e = 0; e < C_ROWS; e++)
        y[e] = b->dec[i0 + e] * p->S[i0 + e][lane];
    for (uint32_t t = 0; t < L; t++) {
        const float u = p->U[t][lane];
#pragma unroll
        for (int e = 0; e < C_ROWS; e += 4) {
            const float4 k = *(const float4 *)&b->Kg[t][i0 + e];
            y[e] += k.x * u;
            y[e + 1] += k.y * u;
            y[e + 2] += k.z * u;
            y[e + 3] += k.w * u;
        }
    }
#pragma unroll
    for (int e = 0; e < C_ROWS; e++)
        if (i0 + e < K)
            p->S[i0 + e][lane] = y[e];
}

/* The block's state slice (column j = j0 + lane of the head's S) into shared memory, thread
 * (group w, lane): rows w, w + C_GROUPS, ..; rows or columns >= K as 0. */
__device__ static void slice_in(const float *S, apply_smem *p, uint32_t K, uint32_t j,
                                unsigned w, unsigned lane)
{
    for (uint32_t i = w; i < MAX_K; i += C_GROUPS)
        p->S[i][lane] = i < K && j < K ? S[(size_t)i * K + j] : 0.0f;
}

/* The slice back, the same rows of each thread. */
__device__ static void slice_out(float *S, const apply_smem *p, uint32_t K, uint32_t j,
                                 unsigned w, unsigned lane)
{
    for (uint32_t i = w; i < K; i += C_GROUPS)
        if (j < K)
            S[(size_t)i * K + j] = p->S[i][lane];
}

/* grid (H, ceil(K / 32), runs): value columns j = 32 blockIdx.y + lane of head blockIdx.x over
 * run blockIdx.z, chunk after chunk: u = Y − X S, o = Qg S + M u (before the norm),
 * S ← diag(dec) S + Kgᵀ u, with the state slice [K][32] in shared memory (group w, lane:
 * tokens w + C_GROUPS m of the products, rows C_ROWS w .. of the update); K % 4 == 0.
 * V 1 (KL_GPU_KDA_APPLY=v1): each chunk's records loaded into b[0], then computed, three
 * barriers a chunk.  V 2, the default, the same arithmetic (bitwise the same results): chunk
 * k's records sit in b[k % 2]; their copies were issued at chunk k - 1 (the first chunk's
 * before the loop) and are waited for at the top of chunk k, then one barrier (every thread's
 * copies landed; every thread is done with chunk k - 1, the reader of b[(k + 1) % 2] and
 * writer of S), then chunk k + 1's copies into b[(k + 1) % 2] go out while chunk k computes;
 * the second barrier between the products (U written, S read) and the readout and update
 * (U read, S written). */
template <int V>
__global__ static void __launch_bounds__(C_THREADS)
chunk_apply_kernel(kl_gpu_kda_recur_args a, const uint32_t *run_start, const uint32_t *run_slot)
{
    KL_GPU_GRID_WAIT();
    extern __shared__ float4 chunk_sh[];
    apply_smem *p = (apply_smem *)chunk_sh;
    const uint32_t h = blockIdx.x, r = blockIdx.z, K = a.K, j0 = blockIdx.y * KL_GPU_GROUP;
    const unsigned w = threadIdx.x / KL_GPU_GROUP, lane = threadIdx.x % KL_GPU_GROUP;
    float *S = a.state + run_slot[r] * a.state_stride + (size_t)h * K * K;
    const uint32_t t1 = run_start[r + 1];
    if (V == 2 && run_start[r] < t1)
        apply_fetch(a, run_start[r], min(t1 - run_start[r], (uint32_t)KDA_C), h, j0, w, lane,
                    &p->b[0]);
    slice_in(S, p, K, j0 + lane, w, lane);
    unsigned cur = 0; /* the buffer of chunk t0 (V 1: always 0) */
    for (uint32_t t0 = run_start[r]; t0 < t1; t0 += KDA_C, cur ^= V - 1) {
        const uint32_t L = min(t1 - t0, (uint32_t)KDA_C);
        const chunk_buf *b = &p->b[cur];
        if (V == 1)
            apply_load(a, t0, L, h, j0, &p->b[0]);
        else
            copy_wait<0>();
        __syncthreads();
        if (V == 2 && t1 - t0 > KDA_C)
            apply_fetch(a, t0 + KDA_C, min(t1 - t0 - KDA_C, (uint32_t)KDA_C), h, j0, w, lane,
                        &p->b[cur ^ 1]);
        float oq[C_TOKENS];
        apply_products(p, b, w, lane, K, L, oq);
        __syncthreads();
        apply_readout(a, p, b, oq, t0, L, h, w, lane, j0 + lane);
        state_update(p, b, C_ROWS * w, lane, K, L);
        if (V == 1)
            __syncthreads(); /* the next chunk's loads overwrite b[0] */
    }
    if (V == 2)
        __syncthreads(); /* the write-back reads rows the other groups updated */
    slice_out(S, p, K, j0 + lane, w, lane);
}

extern "C" size_t kl_gpu_kda_scratch(uint32_t n, uint32_t H, uint32_t K)
{
    return (size_t)n * H * (5 * (size_t)K + KDA_C);
}

/* N (1 <= N <= max) when the environment variable `name` is "vN", else 0. */
static int env_version(const char *name, int max)
{
    const char *e = getenv(name);
    return e && e[0] == 'v' && e[1] >= '1' && e[1] <= '0' + max && !e[2] ? e[1] - '0' : 0;
}

static int apply_version; /* 0: not chosen yet; else 1 or 2 */

extern "C" void kl_gpu_kda_apply_select(int version)
{
    apply_version = version == 1 || version == 2 ? version : 0;
}

/* 2 unless KL_GPU_KDA_APPLY=v1 (read at the first call) or kl_gpu_kda_apply_select said
 * otherwise. */
static int apply_chosen(void)
{
    if (!apply_version)
        apply_version = env_version("KL_GPU_KDA_APPLY", 2) == 1 ? 1 : 2;
    return apply_version;
}

/* v3's two launches and the norm; the shared-memory opt-in made once (a setting of the
 * kernels, not a stream operation). */
static int recur_v3(const kl_gpu_kda_recur_args *a, const kl_gpu_tokens *t, hipStream_t st,
                    kl_err *err)
{
    static int opted;
    if (!opted) {
        if (KL_GPU_CHECK(err, hipFuncSetAttribute((const void *)chunk_prep_kernel,
                                                  hipFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)sizeof(prep_smem))) ||
            KL_GPU_CHECK(err, hipFuncSetAttribute((const void *)chunk_apply_kernel<1>,
                                                  hipFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)APPLY1_SMEM)) ||
            KL_GPU_CHECK(err, hipFuncSetAttribute((const void *)chunk_apply_kernel<2>,
                                                  hipFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)sizeof(apply_smem))))
            return err->code;
        opted = 1;
    }
    const dim3 prep((t->max_run + KDA_C - 1) / KDA_C, a->H, t->n_runs);
    chunk_prep_kernel<<<prep, C_THREADS, sizeof(prep_smem), st>>>(*a, t->run_start);
    const dim3 apply(a->H, (a->K + KL_GPU_GROUP - 1) / KL_GPU_GROUP, t->n_runs);
    if (apply_chosen() == 1)
        chunk_apply_kernel<1><<<apply, C_THREADS, APPLY1_SMEM, st>>>(*a, t->run_start,
                                                                     t->run_slot);
    else
        chunk_apply_kernel<2><<<apply, C_THREADS, sizeof(apply_smem), st>>>(*a, t->run_start,
                                                                            t->run_slot);
    return KL_GPU_CHECK(err, hipGetLastError());
}

static int kda_version; /* 0: not chosen yet; else 1, 2 or 3 */

extern "C" void kl_gpu_kda_select(int version)
{
    kda_version = version >= 1 && version <= 3 ? version : 0;
}

/* v3's shared memory (70 and 133 KiB a block) is more than AMD CDNA's 64 KiB: v2 there unless
 * asked for. */
#if defined(__HIP_PLATFORM_AMD__)
#define KDA_DEFAULT 2
#else
#define KDA_DEFAULT 3
#endif

/* KDA_DEFAULT unless KL_GPU_KDA=v1, v2 or v3 in the environment (read at the first call) or
 * kl_gpu_kda_select said otherwise. */
static int kda_chosen(void)
{
    if (!kda_version) {
        const int e = env_version("KL_GPU_KDA", 3);
        kda_version = e ? e : KDA_DEFAULT;
    }
    return kda_version;
}

extern "C" int kl_gpu_kda_recur(const kl_gpu_kda_recur_args *a, const kl_gpu_tokens *t,
                                kl_gpu_stream s, kl_err *err)
{
    if (!a || !a->q || !a->k || !a->v || !a->f || !a->beta_logit || !a->gate || !a->a_log ||
        !a->dt_bias || !a->o_norm || !a->state || !a->o)
        return kl_fail(err, KL_E_USAGE, "kda recur: a pointer is NULL");
    if (a->H == 0 || a->H > 65535 || a->K == 0 || a->K > MAX_K)
        return kl_fail(err, KL_E_USAGE, "kda recur: H %u, K %u (need 1 <= H <= 65535, "
                       "1 <= K <= %d)", a->H, a->K, MAX_K);
    if (a->state_stride < (size_t)a->H * a->K * a->K)
        return kl_fail(err, KL_E_USAGE, "kda recur: state stride %zu < H * K * K",
                       a->state_stride);
    if ((uintptr_t)a->scratch % 16)
        return kl_fail(err, KL_E_USAGE, "kda recur: scratch not 16-byte aligned");
    if (kl_gpu_tokens_check("kda recur", t, 0, err))
        return err->code;
    if (t->n_runs == 0)
        return 0;
    const hipStream_t st = (hipStream_t)s;
    const int v = kda_chosen();
    if (v == 3 && a->scratch && t->max_run >= KL_GPU_KDA_CHUNK_MIN && a->K % 4 == 0) {
        if (recur_v3(a, t, st, err))
            return err->code;
    } else if (v == 1) {
        recur_kernel<<<dim3(a->H, t->n_runs), RECUR_THREADS, 0, st>>>(*a, t->run_start,
                                                                       t->run_slot);
        return KL_GPU_CHECK(err, hipGetLastError());
    } else {
        dim3 grid(a->H, (a->K + KL_GPU_GROUP - 1) / KL_GPU_GROUP, t->n_runs);
        recur2_kernel<<<grid, R2_THREADS, 0, st>>>(*a, t->run_start, t->run_slot);
    }
    const uint32_t pairs = t->n * a->H; /* n <= 65535, H <= 65535 */
    const unsigned blocks = (pairs + NORM_GROUPS - 1) / NORM_GROUPS;
    const int early = kl_gpu_early_dependents(blocks, NORM_GROUPS * KL_GPU_GROUP);
    kda_norm_kernel<<<blocks, NORM_GROUPS * KL_GPU_GROUP, 0, st>>>(*a, t->n, early);
    return KL_GPU_CHECK(err, hipGetLastError());
}
