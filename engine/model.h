/*
 * engine/model.h — a Kimi-Linear checkpoint bound into host memory for the CPU forward pass.
 *
 * kl_model_open opens the checkpoint directory (loader/checkpoint.h), runs the metadata check of
 * `kl audit` on it (loader/ckcheck.h: headers, index, exact schema match; kl_ckcheck_open_require
 * builds the schema while the headers are parsed) and refuses what that check reports as an
 * error, then reads every schema tensor the check bound through the staged reader
 * (loader/reader.h, one extent per tensor; vectors_only: one pread per vector) into its own
 * kl_malloc'd buffer: no mmap, extra memory beyond the weights bounded by the reader's ring.
 * Weights stay in their stored dtype (BF16 or F32; routed experts of an MXFP4 checkpoint as
 * packed codes + E8M0 scales). Small per-channel
 * vectors (norm weights, conv taps, A_log, dt_bias, router bias) are also copied to fp32.
 * opts->progress, when set, is called with the payload bytes read so far as they arrive (from the
 * reading thread, in order).  Tensors are bound by schema role / layer / expert; the dense MLP is
 * found under either spelling (the schema's alias).
 *
 * The weight matrices (kl_wmat) and the kernels that multiply them are in engine/matvec.h;
 * products split rows over the model's thread pool, each row's sum computed by one thread in a
 * fixed order, so results do not depend on the thread count or on how many tokens share a call.
 *
 * Errors: those of kl_ckpt_open and the reader; KL_E_FORMAT with the check's first error
 * finding (its rule, file, tensor; "`kl audit DIR` lists every problem"), KL_E_UNSUPPORTED (a
 * family without a forward pass, or a float tensor stored in a dtype other than BF16/F32),
 * KL_E_NOMEM.
 * Ownership: the model owns every buffer until kl_model_close.  Thread safety: a bound model is
 * read-only except for its pool: one kl_forward at a time per model.
 */
#ifndef KL_ENGINE_MODEL_H
#define KL_ENGINE_MODEL_H

#include "common/err.h"
#include "common/pool.h"
#include "engine/backend.h"
#include "engine/matvec.h"
#include "loader/config.h"
#include "loader/schema.h"

#include <stddef.h>
#include <stdint.h>

/* MoE routing weights: unbiased (vLLM, SGLang, llama.cpp, transformers-native) or biased
 * (HF remote code's in-place aliasing: weights read from sigmoid + correction bias). */
typedef enum kl_route_weights { KL_ROUTE_UNBIASED = 0, KL_ROUTE_BIASED = 1 } kl_route_weights;

typedef struct kl_layer {
    kl_attn_kind attn;
    int          moe;                     /* 1: MoE FFN, 0: dense MLP */
    kl_wmat      w[KL_ROLE_COUNT];        /* non-expert tensors by role (KL_W_NONE if absent) */
    float       *vec[KL_ROLE_COUNT];      /* fp32 copies of vector roles (norms, conv, A_log,
                                             dt_bias, router bias), NULL otherwise */
    kl_wmat     *experts[3];              /* [num_experts] w1 (gate), w2 (down), w3 (up) */
} kl_layer;

/* Where one schema tensor's bytes are (kl_model.src), for loaders that read them elsewhere
 * (engine/gpu_plan.h). */
typedef struct kl_model_src {
    kl_role        role;
    kl_tensor_part part;
    int32_t        layer, expert;         /* -1: global / not an expert */
    uint32_t       shard;                 /* index into kl_model.shard_paths */
    uint64_t       off, bytes;            /* the payload in that file */
    uint64_t       pitch, width;          /* 0: the payload is contiguous; else it is bytes /
                                             width rows of width bytes, pitch bytes apart
                                             from off (a tensor-parallel column cut) */
    const void    *host;                  /* the payload in memory; NULL when not read */
} kl_model_src;

/* Load progress: payload bytes read so far of total (called from the reading thread). */
typedef void (*kl_model_progress_fn)(void *user, uint64_t done, uint64_t total);

typedef struct kl_model_opts {
    unsigned         threads;             /* 0 = usable CPUs, at most 64 */
    kl_route_weights route_weights;       /* default unbiased */
    kl_model_progress_fn progress;        /* NULL: none */
    void            *progress_user;       /* passed to progress */
    int              vectors_only;        /* read only the fp32 vectors: see kl_model_open */
    unsigned         tp;                  /* CPU backend: tensor-parallel ranks (0, 1: none;
                                             kl_backend_cpu_create_tp); an invalid size is
                                             refused before anything is read */
    int              expert_parallel;     /* with tp > 1: each routed expert whole on one
                                             rank (loader/tp_split.h) */
} kl_model_opts;

typedef struct kl_model {
    kl_config        cfg;
    kl_route_weights route_weights;       /* may be changed between kl_forward calls */
    kl_wmat          embed;               /* [vocab, hidden] */
    kl_wmat          lm_head;             /* [vocab, hidden] (= embed when tied) */
    uint64_t         vocab0;              /* their first vocabulary row: 0, or a tensor-
                                             parallel rank's part (engine/tp_model.h) */
    int              vocab_part;          /* 1: they hold a part of the vocabulary, an id
                                             outside it embeds as zeros (the ranks' rows are
                                             summed after begin: backend.h all_reduce) */
    uint64_t         cut_copied_bytes;    /* a tensor-parallel cut: its column copies' bytes */
    float           *final_norm;          /* [hidden] fp32 */
    kl_layer        *layers;              /* [num_hidden_layers] */
    kl_pool         *pool;
    size_t           n_bufs;
    void           **bufs;                /* [n_bufs] owned tensor payloads */
    uint64_t         weight_bytes;        /* sum of every schema tensor's payload bytes */
    int              matrices_read;       /* 0: opened vectors_only (payloads NULL) */
    size_t           n_src;
    kl_model_src    *src;                 /* [n_src] every schema tensor, schema order */
    uint32_t         n_shards;
    char           **shard_paths;         /* [n_shards] the checkpoint's files (owned) */
    kl_backend      *be;                  /* where kl_forward runs: the CPU backend from
                                             kl_model_open, or one kl_model_use_backend
                                             installed (owned, freed by kl_model_close) */
} kl_model;

/* Buffer widths the backends size their scratch by, from the config and the bound tensors (the
 * low-rank gates have no config key). */
typedef struct kl_model_widths {
    uint64_t wide;     /* widest attention projection or gate output per token */
    uint64_t low;      /* widest low-rank output (KDA gate ranks, MLA kv_a) */
    uint64_t mlp;      /* widest dense-MLP intermediate */
    uint64_t shared;   /* widest shared-experts intermediate (0: none) */
    uint64_t routed;   /* widest routed-expert intermediate (0: no MoE layer) */
} kl_model_widths;
void kl_model_widths_get(const kl_model *m, kl_model_widths *w);

/* Opens dir, binds every tensor and creates the CPU backend over them (m->be); opts may be
 * NULL.  *out is owned: kl_model_close.  With opts->vectors_only only the config, shapes,
 * kinds and the small vectors (vec[], final_norm) are read: every kl_wmat keeps its kind and
 * shape with NULL payload pointers, m->src says where each tensor's bytes are, and no backend
 * is created (m->be NULL until kl_model_use_backend installs one, e.g. the GPU's, which reads
 * the matrices itself). */
int  kl_model_open(kl_model **out, const char *dir, const kl_model_opts *opts, kl_err *err);
/* Makes be (created for m, e.g. by kl_backend_gpu_create) the backend kl_forward runs on:
 * the model takes it over and frees the one it had.  KL_E_USAGE, be still the caller's: be
 * NULL or created for another model, or a slot (a kl_state) still open on the current one. */
int  kl_model_use_backend(kl_model *m, kl_backend *be, kl_err *err);
/* Frees the backend, then the weights; every kl_state of m must be freed before.  NULL ok. */
void kl_model_close(kl_model *m);

#endif
