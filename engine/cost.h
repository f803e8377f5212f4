/*
 * engine/cost.h — what a model costs: host memory before loading it (from the checkpoint's
 * metadata alone), the memory the system has available, and the weight bytes one decoded token
 * reads from a bound model.
 *
 * kl_cost_plan_read opens the checkpoint for metadata only (loader/checkpoint.h: config, index and
 * shard headers, no tensor data), refuses it as kl_model_open would (loader/ckcheck.h), and sums
 * the payload bytes of the schema's tensors: the weights kl_model_open will hold.
 * kl_cost_mem_available reads MemAvailable from a meminfo file (normally /proc/meminfo).
 * kl_cost_check_memory compares the two.
 *
 * Errors: those of kl_ckpt_open / kl_ckcheck_require; KL_E_IO or KL_E_FORMAT (meminfo unreadable
 * or without MemAvailable); KL_E_NOMEM from kl_cost_check_memory when the model does not fit.
 * Library code: prints nothing.  Thread safety: no shared state.
 */
#ifndef KL_ENGINE_COST_H
#define KL_ENGINE_COST_H

#include "common/err.h"
#include "engine/model.h"

#include <stdint.h>

/* A checkpoint's needs, read before loading it. */
typedef struct kl_cost_plan {
    uint64_t weight_bytes;    /* tensor payload bytes: what the model holds in host memory */
    uint64_t max_position;    /* the model's context (0: not given by the config) */
    uint32_t vocab_size;
} kl_cost_plan;

/* Weight bytes one decoded token reads, by part (all from the bound tensors). */
typedef struct kl_token_bytes {
    double non_expert;        /* attention, norms, routers, dense MLP, the final norm */
    double shared_experts;
    double routed_experts;    /* top-k experts of every MoE layer (their mean size) */
    double lm_head;
    double embedding_row;
    double total;
} kl_token_bytes;

/* Fills *p from dir's metadata; 0 or an error naming the file. */
int kl_cost_plan_read(const char *dir, kl_cost_plan *p, kl_err *err);

/* MemAvailable of meminfo_path (NULL: /proc/meminfo) in bytes into *bytes. */
int kl_cost_mem_available(const char *meminfo_path, uint64_t *bytes, kl_err *err);

/* 0 if need_bytes fit in avail_bytes; else KL_E_NOMEM naming both figures. */
int kl_cost_check_memory(uint64_t need_bytes, uint64_t avail_bytes, kl_err *err);

/* The weight bytes a decoded token reads from m (non-expert weights, shared experts, the top-k
 * routed experts of each MoE layer, lm_head and one embedding row). */
void kl_cost_token_bytes(const kl_model *m, kl_token_bytes *tb);

#endif
