/*
 * engine/tp_cut.h — rank r's cut of a weight matrix under a tensor-parallel split
 * (loader/tp_split.h): OUT keeps rows (a view of the matrix's own payload), IN keeps columns
 * (a copy: a row's columns are not contiguous; MXFP4 on whole 32-value blocks), OWNER keeps a
 * routed expert whole on the rank that owns it (KL_W_NONE on the others), WHOLE keeps all of
 * it.  A matrix without payload (a model opened vectors_only) gives its cut's shape alone.  One home for the ranks' cut models (engine/tp_model.h), CPU and GPU (docs/TP-GPU.md).
 */
#ifndef KL_ENGINE_TP_CUT_H
#define KL_ENGINE_TP_CUT_H

#include "common/err.h"
#include "engine/matvec.h"
#include "loader/tp_split.h"

/* *out = rank r of tp's cut of w under split s (expert: w's routed expert id of n_experts,
 * for OWNER).  *copy: the payload of a column copy, the caller's to kl_free (NULL otherwise;
 * *out points into it).  KL_E_UNSUPPORTED: MXFP4 columns that do not cut into whole 32-value
 * blocks; KL_E_NOMEM. */
int kl_tp_cut(const kl_wmat *w, kl_tp_split s, unsigned tp, unsigned r, uint32_t expert,
              uint32_t n_experts, kl_wmat *out, void **copy, kl_err *err);

#endif
