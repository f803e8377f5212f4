/*
 * engine/forward.h — the Kimi-Linear forward pass (kimi-linear.md §3) through the model's
 * backend (engine/backend.h), and the per-sequence handle the engine's callers use.
 *
 * The orchestration itself, kl_backend_forward (declared in backend.h, defined in forward.c),
 * walks the layers and calls the backend's block-level operations chunk by chunk.  The CPU
 * backend (engine/backend_cpu.c, the one kl_model_open installs) keeps fp32 activations and
 * reads weights in their stored dtype; the GPU backend is installed with kl_model_use_backend.
 *
 * Per-sequence state (kl_state): a handle on one slot of the model's backend, which holds for
 * every KDA layer the last conv_kernel-1 pre-conv inputs of q, k and v and the fp32 delta-rule
 * state [heads, head_dim(k), head_dim(v)], and for every MLA layer a latent cache of
 * kv_lora_rank + qk_rope_head_dim values per token (kv_a_layernorm'd latent, then the
 * un-normalised shared rope key), grown as tokens arrive.  Scratch belongs to the backend, so
 * a model serves several states, one kl_forward at a time.
 *
 * kl_forward feeds n tokens of one sequence as a one-slot batch, in chunks of up to the
 * backend's max_tokens (KL_FORWARD_CHUNK on the CPU).  On the CPU, within a chunk every
 * projection is one matrix x chunk product (each weight row read once per chunk), routed
 * experts run once per chunk on the tokens that chose them, while the KDA conv and delta-rule
 * recurrence (the exact reference, kimi-linear.md §3.2) and MLA's causal attention still go
 * token by token (attention reads each block of the latent cache once for a group of the
 * chunk's tokens, each token's sums still in cache order).  Every value of a token is computed
 * in an order that does not depend on the chunk it travels in nor on the other sequences in
 * it (engine/matvec.h), so any split of a prompt into calls, and any batch, gives
 * bit-identical logits.  MLA uses the absorbed form (exact without RoPE).
 *
 * Numerics: the reference fixtures come from transformers in fp32, where RMSNorm's "cast to the
 * input dtype" is a no-op; the CPU backend keeps every activation in fp32 and does not round to
 * BF16 between steps.
 *
 * Errors: KL_E_USAGE (token id out of range, n == 0, a state of another model, every slot of
 * the backend open), KL_E_NOMEM (slot state, MLA cache growth), and the backend's own.
 * Ownership: the slot belongs to the state until kl_state_free (idempotent, safe on a zeroed
 * struct), which must come before kl_model_close.  Thread safety: one kl_forward at a time per
 * model (one backend, shared scratch and thread pool).
 */
#ifndef KL_ENGINE_FORWARD_H
#define KL_ENGINE_FORWARD_H

#include "common/err.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/token.h"

#include <stddef.h>
#include <stdint.h>

/* Tokens per chunk of the CPU backend: bounds its scratch (about 32 MB at the 48B geometry). */
#define KL_FORWARD_CHUNK 64

typedef struct kl_state {
    const kl_model *m;        /* NULL: not initialised (or freed) */
    uint32_t        slot;     /* the slot on m->be */
    size_t          pos;      /* tokens processed: the slot's length, kept in step by this API */
} kl_state;

/* Opens a slot on m's backend: an empty sequence (bound until kl_state_free; m must outlive
 * it).  KL_E_USAGE when every slot of the backend is open, KL_E_NOMEM. */
int  kl_state_init(kl_state *s, const kl_model *m, kl_err *err);
/* Closes the slot. */
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
/* Benchmarks only: s (reset first) then holds n positions of synthetic state (the backend's
 * slot_fill), so a decode step can be timed at context n without feeding n tokens. */
int  kl_state_fill_synthetic(kl_state *s, size_t n, kl_err *err);

/* Feeds ids[0..n) after the tokens already in s (a one-slot batch through kl_backend_forward);
 * writes the logits after the last one into logits_last[vocab] (may be NULL: no lm_head).
 * A refused call (KL_E_USAGE) changes nothing; after another error the state is unspecified:
 * reset it. */
int kl_forward(kl_model *m, kl_state *s, const kl_token *ids, size_t n, float *logits_last,
               kl_err *err);
/* kl_forward that also writes the argmax of those logits into *argmax_last (may be NULL), as
 * kl_sample_argmax gives it, computed where the backend holds them (the GPU's on the device):
 * a greedy pick then needs no pass over the row on the host (kl_sampler_sample_best). */
int kl_forward_argmax(kl_model *m, kl_state *s, const kl_token *ids, size_t n,
                      float *logits_last, kl_token *argmax_last, kl_err *err);

#endif
