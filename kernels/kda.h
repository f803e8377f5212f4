/*
 * kernels/kda.h — Kimi Delta Attention on the GPU for the tokens of one chunk
 * (kimi-linear.md §3.2, the CPU reference: engine/forward.c).  Conventions: kernels/gpu_api.h.
 *
 * The projections (q, k, v, f_a→f_b, b, g_a→g_b, o) are kl_gpu_matmul calls of the backend;
 * these launchers do what lies between them, for every run of the chunk (kl_gpu_tokens), each
 * run's tokens in order against its slot's state:
 *
 * kl_gpu_kda_conv — causal depthwise conv + SiLU of q, k and v in place, [n, D] each (D =
 *   heads * head_dim), taps [D, W] fp32 each (tap W-1 multiplies the current token), windows
 *   win + slot * win_stride: [3][D][W-1] fp32 (q, k, v; column 0 the oldest input), updated.
 *
 * kl_gpu_kda_recur — per token, per head h (channels c of the head):
 *   g_c = -exp(a_log[h]) · softplus(f_c + dt_bias_c)   (softplus(z) = z for z > 20)
 *   β = sigmoid(beta_logit[h]);  q̂ = q/sqrt(Σq² + 1e-6) / sqrt(K);  k̂ = k/sqrt(Σk² + 1e-6)
 *   S ← diag(exp g) S;  u = β (v − Sᵀ k̂);  S ← S + k̂ uᵀ;  o = Sᵀ q̂
 *   o ← o · 1/sqrt(mean(o²) + eps) ⊙ o_norm ⊙ sigmoid(gate)
 *   with S = state + slot * state_stride: [H][K][K] fp32, S[h][i][j] (key i, value j).
 *   Runs of >= KL_GPU_KDA_CHUNK_MIN tokens go through the chunked form (v3) when the caller
 *   passes scratch and K is a multiple of 4: the same result within fp32 rounding, tokens in
 *   chunks of 32.
 */
#ifndef KL_KERNELS_KDA_H
#define KL_KERNELS_KDA_H

#include "kernels/gpu_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kl_gpu_kda_conv_args {
    float         *qkv[3];    /* [n, D] each, in place */
    const float   *taps[3];   /* [D, W] fp32 each */
    uint32_t       D, W;      /* 1 <= W <= 8 */
    float         *win;       /* window pool: slot s at win + s * win_stride */
    size_t         win_stride;   /* floats per slot, >= 3 * D * (W - 1) */
} kl_gpu_kda_conv_args;

int kl_gpu_kda_conv(const kl_gpu_kda_conv_args *a, const kl_gpu_tokens *t, kl_gpu_stream s,
                    kl_err *err);

typedef struct kl_gpu_kda_recur_args {
    const float *q, *k, *v;   /* [n, H*K] after the conv */
    const float *f;           /* [n, H*K] f_b output (before the gate function) */
    const float *beta_logit;  /* [n, H] b_proj output */
    const float *gate;        /* [n, H*K] g_b output */
    const float *a_log;       /* [H] */
    const float *dt_bias;     /* [H*K] */
    const float *o_norm;      /* [K] */
    float        eps;         /* rms_norm_eps */
    uint32_t     H, K;        /* heads, head_dim (K == V, K <= 128) */
    float       *state;       /* state pool: slot s at state + s * state_stride */
    size_t       state_stride;   /* floats per slot, >= H * K * K */
    float       *o;           /* [n, H*K] out */
    float       *scratch;     /* v3: kl_gpu_kda_scratch(n, H, K) floats, 16-byte aligned, or
                                 NULL (v2 runs) */
} kl_gpu_kda_recur_args;

int kl_gpu_kda_recur(const kl_gpu_kda_recur_args *a, const kl_gpu_tokens *t, kl_gpu_stream s,
                     kl_err *err);

/* v3, the chunked form (kda.cu's header), runs for chunks whose longest run has at least this
 * many tokens and that bring scratch; shorter ones (decode) run v2. */
#define KL_GPU_KDA_CHUNK_MIN 16u

/* Floats of v3's scratch for n tokens of H heads of dimension K (a record per token and
 * head: 5 K + 32 floats; 738 MB at n = 8192, H = 32, K = 128). */
size_t kl_gpu_kda_scratch(uint32_t n, uint32_t H, uint32_t K);

/* Which kernels kl_gpu_kda_recur runs: 1 round 1's (a block per head), 2 the value columns
 * spread over blocks plus a norm pass, 3 the chunked form where it applies (see
 * KL_GPU_KDA_CHUNK_MIN; else 2), 0 the default: KL_GPU_KDA=v1, v2 or v3 from the environment
 * (read once), else 3 (2 on AMD, where v3's shared memory does not fit).  For the device tests
 * and benchmarks that compare them. */
void kl_gpu_kda_select(int version);

/* Which chunk_apply kernel v3 runs: 1 round 1's (each chunk's records loaded, then computed),
 * 2 the next chunk's records copied (cp.async) while one computes, bitwise the same results;
 * 0 the default: KL_GPU_KDA_APPLY=v1 from the environment (read once), else 2. */
void kl_gpu_kda_apply_select(int version);

#ifdef __cplusplus
}
#endif

#endif
