/*
 * engine/tp_model.h — rank r's cut of a model under tensor parallelism (docs/TP-GPU.md): an
 * ordinary kl_model whose config counts the rank's heads, widths and vocabulary rows and whose
 * weights are the rank's cuts (engine/tp_cut.h), so that any backend runs it unchanged and its
 * block outputs are the rank's partial sums (engine/backend_tp.h adds them up).
 *
 * What the cut holds, by loader/tp_split.h: the rows of its KDA and MLA heads (q, k, v, the
 * gates' decoders f_b and g_b, beta, q_proj, kv_b) and of the MLPs' and experts' intermediate
 * width (gate, up); the matching columns of o_proj and of the down projections (copies); the
 * per-head vectors sliced to its heads (the convolutions' channels, A_log, dt_bias); the rows
 * of its vocabulary part of the embedding and lm_head (vocab0, vocab_part: an id outside the
 * part embeds as zeros and the ranks' embeddings are summed; cfg.vocab_size is the part: the
 * logits a rank's head writes).  Whole on every rank: the norms, the router, KDA's gate
 * encoders f_a and g_a and o_norm, MLA's kv_a and its norm (every rank keeps the same latent
 * cache).  The config's widths: num_attention_heads, num_key_value_heads, kda_num_heads,
 * intermediate_size and moe_intermediate_size divided by tp.
 *
 * The cut model borrows m's payloads for row cuts and whole tensors (m must outlive it) and
 * owns its column copies and its fp32 vector slices; its sources (m->src: what the GPU plan
 * places, engine/gpu_plan.h) are every matrix in host memory.  From m opened vectors_only the
 * cut has no payloads: its sources are in m's files, a row cut its rows' range (each rank
 * reads only its rows), a column cut its columns' bytes of every row (a source with a pitch:
 * the GPU fill copies those rows' parts); such a cut is for a GPU rank only (matrices_read
 * 0).  Its pool is m's (ranks run one at a time on the CPU).  tp 1 gives a
 * model with m's weights, unchanged.
 */
#ifndef KL_ENGINE_TP_MODEL_H
#define KL_ENGINE_TP_MODEL_H

#include "common/err.h"
#include "engine/model.h"

/* *out = rank `rank` of tp's cut of m, routed experts cut by their intermediate width, or with
 * ep (expert parallel) whole on their owner (kl_tp_expert_owner) and absent (KL_W_NONE) on the
 * other ranks, moe_intermediate_size then whole (each rank's experts one run of ids: the GPU
 * stacks them from the first, engine/gpu_plan.h).  KL_E_USAGE: tp not one of
 * kl_tp_sizes(&m->cfg, ep) (naming them), rank >= tp; KL_E_UNSUPPORTED: an MXFP4 column cut
 * off its 32-value blocks; KL_E_NOMEM.
 * Free with kl_model_tp_free. */
int  kl_model_tp_cut(kl_model **out, const kl_model *m, unsigned tp, unsigned rank, int ep,
                     kl_err *err);
/* Frees a cut model and the backend installed on it (m->be); NULL ok. */
void kl_model_tp_free(kl_model *cut);

#endif
