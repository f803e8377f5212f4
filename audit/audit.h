/*
 * audit/audit.h — check a checkpoint directory and collect findings.
 *
 * kl_audit_run opens the checkpoint's metadata (config, index, every shard header; never the
 * tensor bytes unless hashing), and reports what the loader's metadata check finds
 * (loader/ckcheck.h: header rules, the index against the headers, total_size, the tensor set
 * against the schema of the config: the same check the engine and the converter refuse on),
 * then the routed-expert region layout of every MoE layer, a memory plan per GPU for a TP size
 * and context length, and with hashing the SHA-256 of every shard (in parallel), compared with
 * expected values.
 *
 * A finding is data (severity + rule + file/tensor/offset + message), not an error: the run
 * returns 0 when it could audit, whatever it found; it returns a KL_E_* code only when it could
 * not run (directory unreadable, --expect file unreadable, out of memory).
 * Never opens a checkpoint file for writing.
 *
 * Ownership: the report owns everything; free with kl_audit_report_free.
 */
#ifndef KL_AUDIT_AUDIT_H
#define KL_AUDIT_AUDIT_H

#include "common/err.h"
#include "loader/ckcheck.h" /* kl_severity, kl_finding */
#include "loader/config.h"
#include "loader/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kl_audit_opts {
    bool        hash;         /* SHA-256 every shard */
    const char *expect;       /* sha256sum-format file or HF snapshot dir, or NULL */
    unsigned    tp;           /* tensor-parallel size for the memory plan (default 1) */
    bool        expert_parallel; /* the plan's routed experts whole, on one rank each */
    uint64_t    context;      /* tokens of context for the memory plan (0: default, see
                               * kl_memplan_default_context) */
    unsigned    threads;      /* hashing threads (default: usable CPUs) */
    /* Called from hashing threads (never concurrently) with the bytes hashed so far and the
     * bytes to hash in all; NULL for none. */
    void      (*progress)(void *ctx, uint64_t bytes_done, uint64_t bytes_total);
    void       *progress_ctx;
} kl_audit_opts;

/* Routed-expert region of one MoE layer. */
typedef struct kl_expert_region {
    uint32_t layer;
    uint32_t n_tensors;       /* routed-expert tensors found for the layer */
    uint32_t n_shards;        /* shards they are spread over */
    bool     contiguous;      /* one shard, one gap-free run holding only these tensors */
    uint32_t shard;           /* when contiguous */
    uint64_t file_off;        /* when contiguous: absolute start of the region */
    uint64_t n_bytes;         /* bytes of the layer's expert tensors */
} kl_expert_region;

typedef struct kl_memplan_opts {
    unsigned tp;                     /* tensor-parallel size: must divide every split dimension */
    bool     expert_parallel;        /* routed experts whole on their owner (tp_split.h) */
    uint64_t context;                /* tokens; at most the config's max_position when known */
    size_t   cache_elem_bytes;       /* MLA latent cache element (the audit: 2, bf16) */
    size_t   state_elem_bytes;       /* KDA recurrent and conv state element (4, fp32) */
    const kl_dtype *dtypes;          /* stored dtype of each entry of the config's schema
                                        (kl_schema_build order; borrowed for the call), or
                                        NULL: the dtypes synth writes */
} kl_memplan_opts;

typedef struct kl_memplan {
    unsigned tp;
    bool     expert_parallel;
    uint64_t context;
    size_t   cache_elem_bytes;       /* as asked: element size the MLA cache figure assumes */
    size_t   state_elem_bytes;       /* as asked: element size of the KDA state figure */
    uint64_t weights_bytes;          /* per GPU, stored dtypes: matrix + vector bytes */
    uint64_t replicated_bytes;       /* part of weights_bytes that every GPU holds whole */
    uint64_t matrix_bytes;           /* part of weights_bytes in matrices (not vectors) */
    uint64_t vector_bytes;           /* part in the vectors the engines read element-wise
                                        (loader/arena.h kl_role_is_vector: norms, conv taps,
                                        A_log, dt_bias, router bias) */
    uint64_t vector_f32_bytes;       /* those vectors as the engines keep them, fp32: the GPU
                                        arena instead of vector_bytes, the CPU engine besides
                                        them (one shared copy whatever the TP size) */
    bool     has_gpu_arena;          /* every dtype one the engines hold */
    uint64_t gpu_arena_bytes;        /* the GPU engine's weight arenas (engine/gpu_plan.h,
                                        laid out by loader/arena.h) of one rank (its cut
                                        model at TP > 1, engine/tp_model.h): matrix_bytes +
                                        vector_f32_bytes + gpu_arena_pad_bytes */
    uint64_t gpu_arena_pad_bytes;    /* alignment of its blocks (KL_PLAN_ALIGN) */
    uint64_t mla_cache_bytes;        /* per GPU, per sequence: latent cache at `context` */
    uint64_t kda_state_bytes;        /* per GPU, per sequence: recurrent + conv state */
    uint64_t total_bytes;            /* sum of the three */
} kl_memplan;

typedef struct kl_shard_hash {
    char    *file;                   /* shard file name */
    uint64_t size_bytes;
    bool     hashed;                 /* false if reading failed (a finding says why) */
    char     sha256[65];
    bool     has_expected;
    char     expected[65];
    bool     match;
} kl_shard_hash;

typedef struct kl_audit_report {
    char             *dir;
    kl_family         family;
    bool              config_ok;
    kl_config         config;
    size_t            n_findings, cap_findings;
    kl_finding       *findings;
    size_t            n_errors, n_warnings;
    size_t            n_shards, n_tensors, n_expected_tensors;
    size_t            n_bad_shards;  /* shards whose header could not be used */
    uint64_t          tensor_bytes, file_bytes, header_bytes;
    bool              has_total_size;
    uint64_t          total_size;
    size_t            n_regions;
    kl_expert_region *regions;
    bool              has_memplan;
    kl_memplan        memplan;
    size_t            n_hashes;
    kl_shard_hash    *hashes;
    double            metadata_s;    /* time to open and check the metadata */
    double            hash_s;        /* time spent hashing */
    uint64_t          hashed_bytes;
} kl_audit_report;

int  kl_audit_run(kl_audit_report *r, const char *dir, const kl_audit_opts *opts, kl_err *err);
void kl_audit_report_free(kl_audit_report *r);

/* 1 if the report holds any error-severity finding. */
int kl_audit_has_problems(const kl_audit_report *r);

/* Memory plan from a config (and, in o->dtypes, its checkpoint's stored dtypes).  KL_E_USAGE
 * (rule MEM-TP) when o->tp does not divide the MLA heads, KDA heads, routed experts, MLP
 * widths or MXFP4 experts' scale blocks along the intermediate width (expert parallel: the
 * shared experts' width instead of the last two; the message lists the valid sizes), or
 * (rule MEM-CONTEXT) when o->context exceeds the config's max_position; KL_E_FORMAT (MEM-PLAN)
 * when a figure overflows 64 bits; KL_E_NOMEM.  The GPU arena too (has_gpu_arena),
 * unless a dtype is one the engines do not hold. */
int kl_memplan_compute(kl_memplan *m, const kl_config *c, const kl_memplan_opts *o,
                       kl_err *err);
/* The TP sizes kl_memplan_compute accepts: loader/tp_split.h's kl_tp_sizes. */
/* The context the plan uses when none is asked for: 131072 tokens, or the model's maximum
 * when that is smaller. */
uint64_t kl_memplan_default_context(const kl_config *c);

#endif
