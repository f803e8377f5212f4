/*
 * engine/backend.h — where the forward pass runs: the block-level operations a backend (CPU,
 * GPU) implements, the batch they run on, and the per-sequence slots they keep.
 *
 * One orchestration: kl_backend_forward (engine/forward.c) walks the layers of the model and
 * calls the backend's operations on one chunk of a batch at a time:
 *
 *     begin(chunk)                       ids and slots in, x = embedding rows
 *     norm(INPUT, 0)                     xn = RMSNorm_in,0(x)
 *     for each layer l:
 *         kda(l) or mla(l)               y = attention of xn (the slots' states advance)
 *         add_norm(POST, l)              x += y; xn = RMSNorm_post,l(x)
 *         moe(l) or mlp(l)               y = FFN of xn
 *         add_norm(INPUT, l+1 or FINAL)  x += y; xn = the next norm of x
 *     head(logits, argmax)               lm_head of xn for the tokens that want logits
 *                                        (skipped when the chunk has none or the caller
 *                                        asked for neither logits nor argmax)
 *     end()                              the slots' lengths advance by their tokens
 *
 * A backend may enqueue work asynchronously (a GPU stream) and capture the sequence as a graph;
 * only head() returns data to the host, and end() is where a backend may synchronise.
 *
 * Batch: tokens of one or more sequences.  Each token names its slot; the tokens of one slot
 * form one contiguous run in sequence order, and the first of them goes at the slot's current
 * length (positions are implied: the slot's length, +1 per token).  Continuous batching packs
 * the decode tokens of running sequences and prompt pieces of new ones into one batch.
 *
 * Slots: a backend keeps, per open slot, the sequence state of every layer (KDA conv windows
 * and fp32 delta-rule state, MLA latent cache).  slot_copy makes dst the same sequence as src
 * (a snapshot or its restore): feeding the same ids to both then gives identical logits.
 *
 * Ownership: a backend borrows the model (kl_model: config, layer kinds, route_weights, and on
 * the CPU the weights themselves); kl_backend_free releases everything the backend holds.
 * Thread safety: one forward at a time per backend.
 */
#ifndef KL_ENGINE_BACKEND_H
#define KL_ENGINE_BACKEND_H

#include "common/err.h"
#include "engine/token.h"

#include <stddef.h>
#include <stdint.h>

struct kl_model;
struct kl_config;

/* Tokens of one forward call (host memory, borrowed for the call). */
typedef struct kl_batch {
    size_t          n;       /* tokens */
    const kl_token *ids;     /* [n] */
    const uint32_t *slot;    /* [n] slot of each token (runs, see above) */
    const uint8_t  *want;    /* [n] 1: this token's logits are wanted; NULL: only the last */
} kl_batch;

typedef enum kl_norm_which {
    KL_NORM_INPUT = 0,       /* layer l's input_layernorm */
    KL_NORM_POST = 1,        /* layer l's post_attention_layernorm */
    KL_NORM_FINAL = 2,       /* the model's final norm (l ignored) */
} kl_norm_which;

typedef struct kl_backend kl_backend;

typedef enum kl_tp_sum { KL_TP_SUM_Y = 0, KL_TP_SUM_X = 1 } kl_tp_sum;  /* all_reduce's buffer */

typedef struct kl_backend_ops {
    /* -- slots ------------------------------------------------------------------------- */
    int  (*slot_open)(kl_backend *be, uint32_t *slot, kl_err *err);   /* an empty sequence */
    void (*slot_close)(kl_backend *be, uint32_t slot);
    void (*slot_reset)(kl_backend *be, uint32_t slot);                /* back to empty */
    int  (*slot_copy)(kl_backend *be, uint32_t dst, uint32_t src, kl_err *err);
    /* Benchmarks only: the slot (empty) then holds n positions of synthetic state (zero KDA
     * state, zero MLA cache rows), so a step can be timed at context n without a prefill of n
     * tokens: its cost depends on the length, not on the values.  KL_E_NOMEM before anything
     * changes. */
    int  (*slot_fill)(kl_backend *be, uint32_t slot, size_t n, kl_err *err);
    /* -- one chunk (at most be->max_tokens tokens) ------------------------------------- */
    /* Binds the chunk (validated by the caller: ids in the vocabulary, runs, open slots),
     * grows the slots' caches to hold it (KL_E_NOMEM before any state changes) and writes the
     * embedding rows of its ids into x. */
    int  (*begin)(kl_backend *be, const kl_batch *chunk, kl_err *err);
    int  (*norm)(kl_backend *be, kl_norm_which which, uint32_t layer, kl_err *err);
    int  (*add_norm)(kl_backend *be, kl_norm_which which, uint32_t layer, kl_err *err);
    int  (*kda)(kl_backend *be, uint32_t layer, kl_err *err);
    int  (*mla)(kl_backend *be, uint32_t layer, kl_err *err);
    int  (*moe)(kl_backend *be, uint32_t layer, kl_err *err);
    int  (*mlp)(kl_backend *be, uint32_t layer, kl_err *err);
    /* lm_head on xn for the chunk's wanted tokens, in chunk order: logits [n_wanted, vocab]
     * fp32 and/or argmax [n_wanted] (ties: lowest id) into host memory; either may be NULL. */
    int  (*head)(kl_backend *be, float *logits, kl_token *argmax, kl_err *err);
    /* The chunk is done: each slot's length grows by its tokens.  Waits for the device. */
    int  (*end)(kl_backend *be, kl_err *err);
    void (*destroy)(kl_backend *be);
    /* -- tensor parallel (engine/backend_tp.h; NULL: the backend cannot be a rank) ------- */
    /* Sums a buffer of the chunk over ranks[0 .. n) (backends of this kind) in rank order
     * ((b0 + b1) + b2 ...) for every rank: KL_TP_SUM_Y, after a block (kda, mla, moe, mlp) has
     * run on every rank, its partial outputs y [T, hidden], which each rank's next add_norm
     * adds (left in each rank's y, or — a GPU backend whose ranks share a device — added by
     * that add_norm straight from every rank's y); KL_TP_SUM_X, after begin, the embedding
     * rows x [T, hidden] of ranks holding parts of the vocabulary (kl_model.vocab_part). */
    int  (*all_reduce)(kl_backend *const *ranks, unsigned n, kl_tp_sum which, kl_err *err);
} kl_backend_ops;

struct kl_backend {
    const kl_backend_ops   *ops;
    const char             *name;        /* "cpu", "gpu" */
    struct kl_model        *m;           /* borrowed */
    size_t                  max_tokens;  /* tokens per chunk (begin .. end) */
    uint32_t                max_slots;   /* slots open at once */
    size_t                 *slot_len;    /* [max_slots] tokens each slot holds */
    uint8_t                *slot_used;   /* [max_slots] 1: the slot is open (slot_open sets it,
                                            slot_close clears it) */
    void                   *impl;        /* the backend's own state */
};

/* Runs the batch through the model in chunks of at most be->max_tokens (see above).  logits
 * [n_wanted, vocab] and argmax [n_wanted] receive the wanted tokens' results in batch order;
 * either may be NULL.  KL_E_USAGE: empty batch, an id outside the vocabulary, a slot not open
 * or whose tokens do not form one run: checked before anything changes.  After another error
 * the slots of the batch are unspecified: reset them. */
int  kl_backend_forward(kl_backend *be, const kl_batch *b, float *logits, kl_token *argmax,
                        kl_err *err);

/* The CPU backend over m's host weights (engine/backend_cpu.c): bit-identical to the golden
 * fixtures, any chunk split of a sequence giving the same logits. */
int  kl_backend_cpu_create(kl_backend **out, struct kl_model *m, kl_err *err);
/* The same as tp tensor-parallel ranks in this process (issue 12's CPU path): tp 0 or 1,
 * kl_backend_cpu_create; else tp CPU backends of the ranks' cut models driven as one
 * (engine/backend_tp.h, kl_backend_tp_create_on): rank r holds its cut of each block as
 * loader/tp_split.h cuts the weights (heads, intermediate widths, each routed expert's
 * intermediate width, vocabulary rows; IN cuts such as o_proj and the down projections copied,
 * about a third of the weights once more), the partial block outputs are summed in rank order
 * and lm_head's vocabulary parts concatenated; within fp32 rounding of tp 1.  Expert parallel
 * (ep): each routed expert whole on one rank (kl_tp_expert_owner), which runs it for the
 * tokens that chose it.  KL_E_USAGE naming the valid sizes unless tp is one of
 * kl_tp_sizes(cfg, ep). */
int  kl_backend_cpu_create_tp(kl_backend **out, struct kl_model *m, unsigned tp, int ep,
                              kl_err *err);
/* What rank `rank` of a CPU backend (tp 1: rank 0, the backend itself) holds, for the memory
 * plan's check (audit/memplan.c), from its model (a rank's cut model, engine/tp_model.h):
 *   matrix_bytes   every weight matrix in its stored kind, by kl_wkind (MXFP4: codes and
 *                  scales), the vocabulary rows of embed and lm_head (tied: once);
 *                  copied_bytes of them are the cut's column copies (IN cuts);
 *   vector_bytes   the vectors (kl_role_is_vector) in their stored kinds (a rank: its heads'
 *                  slices) and vector_f32_bytes their fp32 copies;
 *   with slot an open slot (UINT32_MAX: none, the slot figures 0), that sequence's state:
 *   kda_state_bytes     the conv windows and delta-rule state of every KDA layer for the
 *                       rank's heads (fp32);
 *   mla_cache_bytes     the latent cache rows of the slot's length in every MLA layer (fp32,
 *                       every rank keeps them), and mla_cache_cap_bytes as allocated
 *                       (capacity grows by doubling).
 * KL_E_USAGE: be not a CPU backend (or a tensor-parallel one of CPU ranks), rank not below its
 * TP size, slot not open. */
typedef struct kl_cpu_rank_bytes {
    uint64_t matrix_bytes[4];           /* [kl_wkind] (KL_W_NONE: 0) */
    uint64_t matrix_total;              /* their sum */
    uint64_t copied_bytes;              /* IN cuts copied for this rank */
    uint64_t vector_bytes, vector_f32_bytes;
    uint64_t kda_state_bytes, mla_cache_bytes, mla_cache_cap_bytes;
} kl_cpu_rank_bytes;
int  kl_backend_cpu_rank_bytes(const kl_backend *be, unsigned rank, uint32_t slot,
                               kl_cpu_rank_bytes *out, kl_err *err);
/* The GPU backend (engine/backend_gpu.c): puts m's weights on device 0 as engine/gpu_plan.h
 * lays them out, straight from the checkpoint's files (m opened vectors_only, or not) or from
 * the host model's memory when it read them.  $KL_GPU_LOAD picks how file bytes travel:
 * ring (default: N load threads copy the files, mapped read-only, into pinned buffers, each
 * buffer copied to the GPU as it fills; lanes: each thread's own two buffers copied by memcpy
 * and sent on its own stream at once, read by the device from the CPU's caches;
 * $KL_GPU_LOAD_LANES=0: one ring of N + 4 buffers filled by non-temporal stores and sent by
 * one copying thread; $KL_GPU_LOAD_CACHED=0|1: streaming stores or memcpy, default memcpy for
 * lanes of buffers up to 8 MiB), ring-read (the same threads pread the files instead),
 * ring-direct (pread with O_DIRECT where allowed), mapped
 * (windows of the file mapped and page-locked), read (the staged reader, buffered), direct
 * (the staged reader, O_DIRECT where allowed); host is the CLI's (the whole model read into
 * memory first).
 * $KL_GPU_LOAD_WINDOW_MB: the ring buffer (default 4 on lanes, else 16) or mapped window
 * (default 256);
 * $KL_GPU_LOAD_THREADS=N: ring: N (1-32, default three for four cores, 8 to 16) load threads;
 * mapped (1-8, default 4):
 * N threads map and page-lock windows ahead of the copies (2N windows in flight);
 * $KL_GPU_LOAD_BUFFERS=N: ring buffers (1-32, default 2 a thread on lanes, else threads + 4;
 * lanes: threads lowered to half of them), a copy per tensor out of them with
 * $KL_GPU_LOAD_STAGE=0 (no lanes then), else each filled buffer to the device in one copy and a
 * kernel puts its tensors in place (kernels/place.h).  KL_GPU_LOAD=hybrid: the
 * ring on the first part of the files and mapped windows on the rest at once
 * ($KL_GPU_LOAD_MAPPED_PERCENT of the bytes, default 35; $KL_GPU_LOAD_MAPPED_THREADS, default
 * 4): the ring's copies through pinned buffers cost host memory bandwidth, the mapped windows'
 * page-locking costs driver time; both feed one stream.
 * $KL_GPU_CHUNK=N (16-8192, default 8192): tokens per forward chunk (max_tokens);
 * chunks of 16+ tokens run their products and routed experts on tensor cores (kernels/gemm.h,
 * ~5e-7 of fp32 a product); $KL_GPU_GEMM=0: on the fp32 kernels (half the prefill rate);
 * $KL_GPU_FUSE_SMALL=0: one-token steps launch SiLU gating and KDA's f_b / g_b separately.  In
 * a build without GPU support (make without GPU=cuda|hip) it fails with KL_E_UNSUPPORTED. */
int  kl_backend_gpu_create(kl_backend **out, struct kl_model *m, kl_err *err);
/* out[r] = a GPU backend of cut model cuts[r] (engine/tp_model.h) as rank r of n (1 to 8) of
 * engine/backend_tp.h, on device r % visible devices: every operation makes its device
 * current first (ranks on several devices are driven from one thread); decode graphs off,
 * since the ranks' block outputs are summed between blocks (through the host for now); ranks
 * on one device share the first one's stream, so that their kernels never overlap (some keep
 * scratch in device globals).  Their weights come in one pass over the files
 * (kl_gpu_plan_merge: each byte read once, copied to every rank that holds it; the load info
 * of rank 0 has that fill's figures).  On an error none is left (out[] NULL). */
int  kl_backend_gpu_create_ranks(kl_backend **out, struct kl_model *const *cuts, unsigned n,
                                 kl_err *err);
/* Where the sums of a tensor-parallel wrapper of GPU ranks run: "device (...)" (ranks sharing
 * one GPU), "nccl (library)" (each on its own), "host (why)"; "" for any other backend. */
const char *kl_backend_gpu_tp_sums(const kl_backend *be);
/* Visible devices (0 in a build without GPU support). */
int  kl_backend_gpu_devices(void);

/* The GPU load's first steps, started before the model is open so that they overlap opening
 * it: on a thread of its own, device 0's context, a stream and events, and the ring's pinned
 * buffers ($KL_GPU_LOAD ring: threads + 4 buffers of 16 MiB unless $KL_GPU_LOAD_BUFFERS /
 * $KL_GPU_LOAD_WINDOW_MB say otherwise; one region on 2 MiB pages registered once, or with
 * $KL_GPU_LOAD_HUGE=0 one kl_gpu_host_alloc each).  kl_backend_gpu_create_prepared then takes
 * them (waiting for the thread) and, meanwhile the fill, allocates the pools and scratch on
 * another thread.  $KL_GPU_LOAD_OVERLAP=0: no threads, every step in turn at creation (as
 * kl_backend_gpu_create).  *out is owned: pass it to kl_backend_gpu_create_prepared, which
 * frees it whatever happens, or free it with kl_backend_gpu_prepare_free.  Errors of the
 * thread (no device, no pinned memory) come from create_prepared.  KL_E_NOMEM, or
 * KL_E_UNSUPPORTED in a build without GPU support. */
typedef struct kl_gpu_prep kl_gpu_prep;
int  kl_backend_gpu_prepare(kl_gpu_prep **out, kl_err *err);
void kl_backend_gpu_prepare_free(kl_gpu_prep *pr);     /* NULL ok; joins the thread */
/* kl_backend_gpu_create with what pr prepared (NULL: prepared here, in turn); pr is freed. */
int  kl_backend_gpu_create_prepared(kl_backend **out, struct kl_model *m, kl_gpu_prep *pr,
                                    kl_err *err);
void kl_backend_free(kl_backend *be);   /* NULL ok; every slot must be closed */

/* 1 when this build has GPU support and a device is visible, else 0. */
int  kl_backend_gpu_available(void);
/* 0 when the GPU backend can be created, else KL_E_UNSUPPORTED saying why (no GPU support in
 * this build, or no device): checked before a model is loaded for it. */
int  kl_backend_gpu_check(kl_err *err);

/* The GPU ceilings kl bench reports figures against, measured now on device 0: copy rates
 * device-to-device (bytes read plus written per second: the HBM bandwidth) and pinned
 * host-to-device.  KL_E_UNSUPPORTED in a build without GPU support. */
typedef struct kl_gpu_ceilings {
    char   device[96];
    double hbm_gbps, h2d_gbps;
    size_t mem_total;          /* device memory, bytes */
    size_t mem_used;           /* in use when measured (the model, its state and scratch) */
} kl_gpu_ceilings;
int  kl_backend_gpu_ceilings(kl_gpu_ceilings *c, kl_err *err);

/* How a GPU backend's weights came: how ("ring", "ring-direct", "mapped", "read", "direct",
 * "host": every byte from the host model), bytes copied, mapped windows or ring buffers filled
 * and how many of them were page-locked (the others were copied at the pageable rate); the
 * ring's threads and buffers; and where the creation's time went, in seconds: device (context,
 * stream, events) and buffers (the ring's pinned memory) on the preparing thread, wait (the
 * creating thread waiting for it; 0 when not overlapped), plan, alloc (the weights' device
 * memory), fill (the copies, pools and scratch allocated meanwhile: pools_s), finish (the
 * pools waited for if they took longer, the stream drained, the prepared buffers freed).
 * A tensor-parallel wrapper of GPU ranks: rank 0's settings, the ranks' bytes, windows and
 * times summed (one fill loads them all: a rank's own info has the bytes sent to it, rank 0's
 * the fill's figures).  Zeroes (how "") for any other backend. */
typedef struct kl_gpu_load_info {
    const char *how;
    uint64_t    bytes, windows, pinned;
    uint64_t    read_bytes;             /* of the files: windows or ring spans read */
    unsigned    threads, buffers;       /* RING: load threads, buffers (mapped: threads) */
    size_t      buffer_bytes;           /* RING buffer or mapped window (0: the default) */
    const char *buffer_mem;             /* RING: "hugetlb", "thp" (one registered region) or
                                           "pinned" (kl_gpu_host_alloc each); else "" */
    int         overlapped;             /* prepared on a thread while the model opened */
    double      device_s, buffers_s, wait_s, plan_s, alloc_s, fill_s, pools_s, finish_s;
    double      fill_read_s, fill_wait_s;    /* RING: load threads reading, waiting for a
                                                buffer's copies (summed over threads) */
    double      fill_idle_s, fill_issue_s;   /* RING: the copying thread waiting for a filled
                                                buffer, issuing copies */
    uint64_t    staged;                 /* RING: buffers staged on the device whole (0: a copy
                                           a tensor; KL_GPU_LOAD_STAGE=0, or no device room) */
    unsigned    lanes;                  /* RING staged: load threads that each copied their
                                           own buffers (0: one copying thread for the ring) */
} kl_gpu_load_info;
void kl_backend_gpu_load_info(const kl_backend *be, kl_gpu_load_info *out);

/* Where a GPU backend's time goes.  graph_nodes: kernels and copies of the last decode step
 * captured as a graph (the launches one decode step costs).  With $KL_GPU_PROFILE=1 (graphs
 * then off) every operation is timed on the host after the stream drains, per kind, since
 * the last reset: the figures add a sync per operation, so they tell shares, not speed.
 * Zeroes for any other backend. */
typedef enum kl_gpu_op {
    KL_GPU_OP_EMBED, KL_GPU_OP_NORM, KL_GPU_OP_KDA, KL_GPU_OP_MLA, KL_GPU_OP_MOE,
    KL_GPU_OP_MLP, KL_GPU_OP_HEAD, KL_GPU_OPS
} kl_gpu_op;
extern const char *const kl_gpu_op_names[KL_GPU_OPS];   /* "embed", "norm", "kda", ... */

/* The steps inside the operations, timed the same way (the stream drained after each) */
typedef enum kl_gpu_part {
    KL_GPU_PART_KDA_PROJ, KL_GPU_PART_KDA_CONV, KL_GPU_PART_KDA_GATES, KL_GPU_PART_KDA_RECUR,
    KL_GPU_PART_KDA_OUT, KL_GPU_PART_MLA_PROJ, KL_GPU_PART_MLA_APPEND, KL_GPU_PART_MLA_ATTEND,
    KL_GPU_PART_MLA_OUT, KL_GPU_PART_MOE_PROJ, KL_GPU_PART_MOE_ROUTE, KL_GPU_PART_MOE_SHARED,
    KL_GPU_PART_MOE_EXPERTS, KL_GPU_PARTS
} kl_gpu_part;
extern const char *const kl_gpu_part_names[KL_GPU_PARTS];   /* "kda_proj", ... */

typedef struct kl_gpu_profile {
    int      on;                  /* $KL_GPU_PROFILE=1 */
    uint64_t graph_nodes;
    double   op_s[KL_GPU_OPS];    /* seconds per kind */
    uint64_t op_n[KL_GPU_OPS];    /* calls per kind */
    double   part_s[KL_GPU_PARTS];   /* seconds per step of kda, mla and moe */
} kl_gpu_profile;
/* Copies the profile out (out may be NULL) and, when reset, zeroes the timings. */
void kl_backend_gpu_profile(kl_backend *be, kl_gpu_profile *out, int reset);

#endif
