/*
 * engine/forward.h — the Kimi-Linear forward pass on the CPU (kimi-linear.md §3), fp32
 * activations, weights read in their stored dtype (engine/model.h).
 *
 * Per-sequence state (kl_state): for every KDA layer the last conv_kernel-1 pre-conv inputs of
 * q, k and v and the fp32 delta-rule state [heads, head_dim(k), head_dim(v)]; for every MLA
 * layer a latent cache of kv_lora_rank + qk_rope_head_dim values per token (kv_a_layernorm'd
 * latent, then the un-normalised shared rope key), grown as tokens arrive.  Scratch buffers
 * (sized for KL_FORWARD_CHUNK tokens) also live in the state, so a model can serve several
 * states one kl_forward at a time.
 *
 * kl_forward processes n tokens in chunks of up to KL_FORWARD_CHUNK.  Within a chunk every
 * projection is one matrix x chunk product (each weight row read once per chunk), routed experts
 * run once per chunk on the tokens that chose them, while the KDA conv and delta-rule recurrence
 * (the exact reference, kimi-linear.md §3.2) and MLA's causal attention still go token by token
 * (attention reads each block of the latent cache once for a group of the chunk's tokens, each
 * token's sums still in cache order).  Every value of a token is computed in an order that does not
 * depend on the chunk it travels in (engine/matvec.h), so any split of a prompt into calls gives
 * bit-identical logits.  MLA uses the absorbed form (exact without RoPE).
 *
 * Numerics: the reference fixtures come from transformers in fp32, where RMSNorm's "cast to the
 * input dtype" is a no-op; this engine keeps every activation in fp32 and does not round to
 * BF16 between steps.
 *
 * Errors: KL_E_USAGE (token id out of range, n == 0), KL_E_NOMEM (MLA cache growth).
 * Ownership: the state owns its buffers; kl_state_free releases them (idempotent, safe on a
 * zeroed struct).  Thread safety: one kl_forward at a time per model (shared thread pool).
 */
#ifndef KL_ENGINE_FORWARD_H
#define KL_ENGINE_FORWARD_H

#include "common/err.h"
#include "engine/model.h"
#include "engine/token.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kl_kda_state {
    float *conv[3];   /* q, k, v: [D, conv_kernel-1] fp32, column 0 = oldest input */
    float *S;         /* [heads, K, V] fp32 delta-rule state, S[h][i][j] (key i, value j) */
} kl_kda_state;

typedef struct kl_mla_cache {
    float  *c;        /* [cap, kv_lora_rank + qk_rope_head_dim] fp32 */
    size_t  n, cap;   /* tokens held, tokens allocated */
} kl_mla_cache;

/* Tokens per prefill chunk: bounds the scratch (about 32 MB per state at the 48B geometry). */
#define KL_FORWARD_CHUNK 64

typedef struct kl_state {
    const kl_model *m;
    size_t        pos;        /* tokens processed */
    kl_kda_state *kda;        /* [num_hidden_layers] (zero for MLA layers) */
    kl_mla_cache *mla;        /* [num_hidden_layers] (zero for KDA layers) */
    float        *scratch;    /* one block carved into the chunk buffers (forward.c) */
    size_t        scratch_floats;
    int32_t      *route;      /* MoE routing scratch [chunk * top_k * 3 + num_experts + 1] */
    float        *scores;     /* MLA attention weights [num_attention_heads, scores_rows,
                                 scores_cap]: one row per token of a group */
    size_t        scores_cap; /* tokens per row of scores (>= every MLA cache's cap) */
    size_t        scores_rows;/* tokens of a chunk that attend together (1..KL_FORWARD_CHUNK) */
} kl_state;

/* Allocates the state for m (bound until kl_state_free; m must outlive it). */
int  kl_state_init(kl_state *s, const kl_model *m, kl_err *err);
void kl_state_free(kl_state *s);
/* Back to an empty sequence: zero conv windows and recurrent states, empty MLA caches. */
void kl_state_reset(kl_state *s);
/* Makes dst the same sequence as src (conv windows, recurrent states, MLA caches, position):
 * a snapshot, or a restore of one.  Both must be initialised for the same model; dst's MLA
 * caches grow as needed and src is not modified.  Feeding the same ids to dst afterwards gives
 * bit-identical logits to feeding them to src (kl chat's prefix reuse, architecture.md).
 * KL_E_USAGE (different models), KL_E_NOMEM (MLA cache growth fails before anything is copied:
 * dst still holds its old sequence). */
int  kl_state_copy(kl_state *dst, const kl_state *src, kl_err *err);

/* Feeds ids[0..n) after the tokens already in s; writes the logits after the last one into
 * logits_last[vocab] (may be NULL).  On error the state is unspecified: reset it. */
int kl_forward(kl_model *m, kl_state *s, const kl_token *ids, size_t n, float *logits_last,
               kl_err *err);

#endif
