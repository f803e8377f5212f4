/*
 * kernels/tokens.h — the launchers' shared check of a chunk's token description
 * (kl_gpu_tokens, gpu_api.h).  Host code, included by the launchers (kernels/, .cu files) only.
 */
#ifndef KL_KERNELS_TOKENS_H
#define KL_KERNELS_TOKENS_H

#include "kernels/gpu_api.h"

#define KL_GPU_MAX_GRID_Y 65535u /* runs or tokens along a grid's y or z dimension */

/* 0, or KL_E_USAGE (message prefixed by who) when t cannot be launched over: NULL arrays for a
 * chunk with tokens (the per-token ones only when per_token), more runs than tokens, or more
 * runs or tokens than a grid dimension holds. */
static inline int kl_gpu_tokens_check(const char *who, const kl_gpu_tokens *t, int per_token,
                                      kl_err *err)
{
    if (!t)
        return kl_fail(err, KL_E_USAGE, "%s: tokens NULL", who);
    if (t->n && (!t->run_start || !t->run_slot || (per_token && (!t->tok_slot || !t->tok_pos))))
        return kl_fail(err, KL_E_USAGE, "%s: a token or run array is NULL", who);
    if (t->n_runs > t->n || t->n > KL_GPU_MAX_GRID_Y || (t->n && !t->n_runs))
        return kl_fail(err, KL_E_USAGE, "%s: %u runs for %u tokens (at most %u tokens)", who,
                       t->n_runs, t->n, KL_GPU_MAX_GRID_Y);
    return 0;
}

#endif
