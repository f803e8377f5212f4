/*
 * engine/backend_tp.h — tensor parallelism over any backend (docs/TP-GPU.md): N rank backends,
 * each over its rank's cut model (engine/tp_model.h), driven as one.
 *
 * Every block operation runs on each rank in turn (each rank's own x, xn and y: the residual
 * stream is replicated), and after each block (kda, mla, moe, mlp) the ranks' partial outputs
 * are summed in rank order by the ranks' all_reduce (engine/backend.h) before the next
 * add_norm reads them.  lm_head: each rank writes the logits of its vocabulary rows, placed
 * side by side in the caller's rows; the argmax is taken over the whole row (ties: lowest id,
 * as every backend).  Slots are opened on every rank together (the same slot index: the ranks
 * allocate alike).
 *
 * Ownership: the wrapper takes the cut models (each with its rank backend installed as its
 * be) and frees them with itself; m (the whole model, whose config the wrapper reports) is
 * borrowed as by any backend.
 */
#ifndef KL_ENGINE_BACKEND_TP_H
#define KL_ENGINE_BACKEND_TP_H

#include "common/err.h"
#include "engine/backend.h"
#include "engine/model.h"

/* *out drives ranks[0 .. n) (n >= 1: rank r's cut model, its backend installed as ranks[r]->be,
 * every backend of one kind with all_reduce) as one backend of m.  Takes the cut models
 * whatever happens (freed on an error).  KL_E_USAGE: n 0, a rank without a backend or whose
 * backend cannot be a rank; KL_E_NOMEM. */
int kl_backend_tp_create(kl_backend **out, kl_model *m, kl_model **ranks, unsigned n,
                         kl_err *err);

/* KL_E_USAGE naming the valid sizes unless tp (expert parallel: ep) is one of
 * kl_tp_sizes(cfg, ep) (loader/tp_split.h): the check kl_model_open makes before reading a
 * byte, and every cut. */
int kl_backend_tp_check(const struct kl_config *cfg, unsigned tp, int ep, kl_err *err);

/* Rank r's backend of a tensor-parallel backend made here (NULL: be is not one, or r is not
 * below its size), and that size (0: not one). */
kl_backend *kl_backend_tp_rank(const kl_backend *be, unsigned r);
unsigned    kl_backend_tp_size(const kl_backend *be);

/* tp cut models of m (kl_model_tp_cut; ep: expert parallel, CPU only), each with a CPU
 * backend (gpu 0) or a GPU backend (gpu 1: kl_backend_gpu_create_ranks, rank r on device
 * r % the visible devices, ranks on one device sharing a stream, their weights in one pass
 * over the files), wrapped.  CPU ranks need m's matrices read (KL_E_USAGE otherwise); GPU
 * ranks take m either way (vectors_only: the ranks' pieces come from the files, each byte read
 * once, engine/tp_model.h).  KL_E_UNSUPPORTED: ep on the GPU. */
int kl_backend_tp_create_on(kl_backend **out, kl_model *m, unsigned tp, int ep, int gpu,
                            kl_err *err);

#endif
