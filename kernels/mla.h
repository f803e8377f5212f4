/*
 * kernels/mla.h — multi-head latent attention on the GPU, absorbed form without RoPE
 * (kimi-linear.md §3.3, the CPU reference: engine/forward.c).  Conventions: kernels/gpu_api.h.
 *
 * The projections q = W_q x [n, nh*(dn+dr)], kva = W_kva x [n, R+dr] and o_proj are
 * kl_gpu_matmul calls of the backend.  Between them:
 *
 * kl_gpu_mla_append — for each token t (slot s, position p): row p of slot s's cache =
 *   [RMSNorm(kva[t][0:R]) with kv_norm and eps 1e-6, kva[t][R:R+dr] unchanged].
 *   Every token of the chunk is appended before any attends (run the two in this order).
 *
 * kl_gpu_mla_attend — for each token t (slot s, position p) and head h:
 *   ql = W_kb,hᵀ q_nope,h  (W_kb,h: rows h*(dn+dv) .. +dn of kv_b [nh*(dn+dv), R])
 *   score_u = (ql · c_u + q_rope,h · kr_u) / sqrt(dn + dr) for u = 0..p of slot s's cache
 *   ctx = Σ_u softmax(score)_u c_u   (fp32 softmax)
 *   o[t][h*dv .. +dv] = W_vb,h ctx  (W_vb,h: rows h*(dn+dv)+dn .. +dv of kv_b)
 * Caches: cache[s] (a device array of device pointers, one per slot) points at slot s's rows
 * [cap, R+dr] fp32, row u = position u, 16-byte aligned (as the runtime's allocations are).
 * Limits (KL_E_USAGE otherwise): R a multiple of 8, dr of 4, nh * R <= 16384.
 */
#ifndef KL_KERNELS_MLA_H
#define KL_KERNELS_MLA_H

#include "kernels/gpu_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kl_gpu_mla_dims {
    uint32_t nh, dn, dr, dv, R;   /* heads, nope, rope, value dims, kv_lora_rank */
} kl_gpu_mla_dims;

typedef struct kl_gpu_mla_append_args {
    kl_gpu_mla_dims d;
    const float    *kva;          /* [n, R+dr] */
    const float    *kv_norm;      /* [R] */
    float *const   *cache;        /* [slots] device pointers to [cap, R+dr] */
} kl_gpu_mla_append_args;

int kl_gpu_mla_append(const kl_gpu_mla_append_args *a, const kl_gpu_tokens *t, kl_gpu_stream s,
                      kl_err *err);

typedef struct kl_gpu_mla_attend_args {
    kl_gpu_mla_dims   d;
    const float      *q;          /* [n, nh*(dn+dr)] */
    const kl_gpu_mat *kv_b;       /* host descriptor: [nh*(dn+dv), R], F32 or BF16 */
    const float *const *cache;    /* [slots] as for append */
    float            *scratch;    /* kl_gpu_mla_scratch(d, n, max_span) floats, 16-B aligned */
    float            *o;          /* [n, nh*dv] out */
} kl_gpu_mla_attend_args;

/* Floats of scratch kl_gpu_mla_attend needs for n tokens whose spans are at most max_span. */
size_t kl_gpu_mla_scratch(const kl_gpu_mla_dims *d, uint32_t n, uint32_t max_span);
int    kl_gpu_mla_attend(const kl_gpu_mla_attend_args *a, const kl_gpu_tokens *t,
                         kl_gpu_stream s, kl_err *err);

/* Which kernels kl_gpu_mla_attend runs: 1 round 1's, 2 the faster fp32 ones (nh <= 32,
 * R <= 512), 3 tensor cores exact to ~1e-5 (every operand split into bf16 hi + lo, three
 * products; also R a multiple of 16, R + dr <= 616), 4 "v3fast": tensor cores on bf16
 * queries, cache rows and weights (rel. error ~1e-2); fp32 softmax and sums in all; each
 * falling back to v2, then v1, where its limits are passed, and 3 and 4 to v2 for runs of one
 * token over spans < 512 (decode of short contexts; a launch sized for a larger max_span, as
 * a captured graph's, stays on 3 or 4); 5 v4: decode (every run one token) exact as v3 on
 * mma.sync, one wave of split blocks streaming the cache (also nh <= 32, R <= 512,
 * R + dr <= 640; else v3), chunks with longer runs on v3 (else v2), spans < 512 as v3; 6 v5:
 * v4, but decode where n x max_span <= 1,536 on the CUDA cores, a warp a cache row and
 * W5_HEADS heads a block (nh <= 32, R <= 512, R + dr <= 640, both multiples of 4); 0 the
 * default: KL_GPU_MLA=v1|v2|v3|v3fast|v4|v5 from the environment (read once), else 6.  For
 * the device tests and benchmarks that compare them. */
void   kl_gpu_mla_select(int version);

/* The max_span a captured one-token step's attention is sized for (kl_gpu_tokens), given the
 * token's span now and its cache's capacity: cap, or a shorter bound where that selects
 * faster kernels which serve every span up to it (v5: 1,536 while the span is within it).  A
 * graph captured with it holds while the value stays the same. */
uint32_t kl_gpu_mla_graph_span(const kl_gpu_mla_dims *d, uint32_t span, uint32_t cap);

/* The prefill of one prompt (a chunk of one run of 64 tokens or more) in MHA form, by default
 * where it applies (CUDA; kv_b BF16; span <= 16,384; dn + dr a multiple of 16 up to 192, dv of
 * 8 up to 128, R of 32), whatever the decode kernels' version unless KL_GPU_MLA picks one
 * other than v4: the keys and values expanded per head, k_nope[u,h] = W_kb,h c_u and v[u,h] =
 * W_vb,h c_u (kl_gpu_gemm_p, exact to ~5e-7), then a causal flash attention per head with
 * 192-wide scores and 128-wide values (exact as v3: hi + lo operands, three products):
 *   score_u = (q_nope[t,h] · k_nope[u,h] + q_rope[t,h] · kr_u) / sqrt(dn + dr),
 *   o[t][h*dv .. +dv] = Σ_u softmax(score)_u v[u,h]   (the absorbed form up to rounding).
 * Its scratch (counted by kl_gpu_mla_scratch for n >= 64 and max_span within the limit): the
 * rows [span, R], keys and values [span, nh*(dn+dv)] fp32, the rows' bf16 parts and the
 * keys' and values' bf16 hi + lo planes [nh, span, dn+dr+dv] x 2.
 * KL_GPU_MLA_PREFILL=latent (read once) keeps prompts on v3; kl_gpu_mla_prefill_set(1) MHA,
 * 2 latent, 0 the environment's choice. */
void   kl_gpu_mla_prefill_set(int mode);

/* The MHA form's attention kernel: 2 (the default) v2, the keys and values split into bf16
 * hi + lo planes once and 128 query tokens a block (needs dv a multiple of 16, else v1); 1 v1,
 * each key tile split as it is read; 0 the environment's choice (KL_GPU_MLA_MHA=v1|v2, read
 * once).  For the device tests that compare them. */
void   kl_gpu_mla_mha_set(int version);

/* The longest span (keys) a prompt chunk runs in MHA form over: 65,536 by default,
 * KL_GPU_MLA_MHA_SPAN in the environment (read once) or this setter (0: the environment's
 * choice), clamped to 64 .. 65,536.  Longer spans run the latent form (v3, 1.1e-4 of the
 * reference at a 64K span against the MHA form's 5e-6).  The scratch grows with it: ~5.2 GB
 * at 65,536 at the model's shape (16,384: ~5 GB less GPU memory, 64K prompts 3.9x slower). */
void   kl_gpu_mla_mha_span_set(uint32_t span);

#ifdef __cplusplus
}
#endif

#endif
