/*
 * loader/arena.h — where every weight of a model goes in the GPU engine's device arenas, from
 * the weights' kinds and shapes alone: the one layout engine/gpu_plan.c places a loaded model
 * by and the memory plan of `kl audit` (audit/memplan.c) sizes from a config and its
 * checkpoint's dtypes, so the two cannot disagree.
 *
 * Arenas: one per layer plus a global one (embed, lm_head, final norm).  In a layer's arena:
 * the members of each fusion group stacked one after another when all are present with one
 * kind and width and every member but the last has a multiple of 4 rows (so a one-token chunk
 * runs them as one product, outputs 16-byte aligned); every other matrix on its own; each
 * role's routed experts stacked [E, rows, ...] (MXFP4: the packed codes of the E experts, then
 * their scales); vector roles (kl_role_is_vector: norms, conv taps, A_log, dt_bias, router
 * bias) as fp32 whatever their stored dtype.  Every block (a stack, a matrix, a vector, a
 * stack's scale part) starts at a multiple of KL_PLAN_ALIGN bytes of its arena.  Offsets in
 * kl_plan_mat are bytes from the arena's start.
 *
 * Nothing here allocates except kl_arena_size_schema (a temporary, freed before it returns).
 */
#ifndef KL_LOADER_ARENA_H
#define KL_LOADER_ARENA_H

#include "common/err.h"
#include "loader/config.h"
#include "loader/dtype.h"
#include "loader/schema.h"

#include <stddef.h>
#include <stdint.h>

#define KL_PLAN_ALIGN 256u
#define KL_PLAN_NONE  UINT64_MAX        /* no vector of this role */

/* How an engine holds a weight matrix (engine/matvec.h multiplies them). */
typedef enum kl_wkind { KL_W_NONE = 0, KL_W_F32, KL_W_BF16, KL_W_MXFP4 } kl_wkind;

/* A weight's kind and shape as the engines bind it: [rows, cols] with rows the first
 * dimension of a tensor of rank 2 or more (else 1) and cols the rest; MXFP4: cols counts
 * values (twice the packed bytes per row). */
typedef struct kl_wshape {
    kl_wkind kind;
    uint64_t rows, cols;
} kl_wshape;

/* The shape of the matrix schema entry e belongs to, stored as dtype (its packed and scale
 * parts both give the MXFP4 matrix).  0, or -1 when the engines hold no weight of that dtype
 * (they take BF16 and F32 floats). */
int kl_wshape_of(const kl_schema_entry *e, kl_dtype dtype, kl_wshape *out);

/* Roles the engines read element-wise: kept (and placed on the GPU) as fp32 vectors. */
int kl_role_is_vector(kl_role r);

/* Fusion groups: matrices that multiply the same input, in output order. */
enum { KL_FUSE_KDA, KL_FUSE_MLA, KL_FUSE_MOE, KL_FUSE_MLP, KL_FUSE_GROUPS, KL_FUSE_MAX = 6 };
extern const kl_role kl_plan_fuse_roles[KL_FUSE_GROUPS][KL_FUSE_MAX + 1]; /* KL_ROLE_COUNT ends */

typedef struct kl_plan_mat {
    kl_wkind kind;                      /* KL_W_NONE: absent */
    uint32_t rows, cols;                /* cols: values per row (MXFP4 too) */
    uint64_t data;                      /* offset of the values (MXFP4: packed codes) */
    uint64_t scale;                     /* MXFP4: offset of the E8M0 scales */
} kl_plan_mat;

typedef struct kl_plan_layer {
    kl_plan_mat w[KL_ROLE_COUNT];       /* matrices by role (members of a stacked group too) */
    kl_plan_mat fused[KL_FUSE_GROUPS];  /* a stacked group as one matrix; NONE: not stacked */
    uint64_t    vec[KL_ROLE_COUNT];     /* fp32 vector offsets, KL_PLAN_NONE when none */
    kl_plan_mat ex[3];                  /* routed experts w1, w2, w3: expert 0 (rows: one's) */
    uint32_t    n_experts;              /* 0: no routed experts */
    uint32_t    expert0;                /* the first one's id (a rank of expert parallelism
                                           holds experts [expert0, expert0 + n_experts)) */
} kl_plan_layer;

/* Bytes of a plan matrix's values (MXFP4: packed codes) and of its scales. */
uint64_t kl_plan_data_bytes(const kl_plan_mat *w);
uint64_t kl_plan_scale_bytes(const kl_plan_mat *w);

/* One layer's weights as the layout sees them. */
typedef struct kl_arena_layer_in {
    kl_wshape w[KL_ROLE_COUNT];         /* non-expert weights by role (KL_W_NONE: absent) */
    kl_wshape ex[3];                    /* one routed expert of w1, w2, w3 (all alike) */
    uint32_t  n_experts;                /* routed experts (0: none) */
} kl_arena_layer_in;

/* Lays one layer's weights out in an arena whose end is *top (0 for an empty arena), which
 * grows past them. */
void kl_arena_layer(uint64_t *top, const kl_arena_layer_in *in, kl_plan_layer *out);
/* The global arena: embed, lm_head (NULL when tied: *lm_out = *embed_out) and the fp32 final
 * norm of hidden values. */
void kl_arena_global(uint64_t *top, const kl_wshape *embed, const kl_wshape *lm_head,
                     uint64_t hidden, kl_plan_mat *embed_out, kl_plan_mat *lm_out,
                     uint64_t *final_norm);

/* What the arenas of a whole model hold: total = matrix + vector + pad. */
typedef struct kl_arena_sizes {
    uint64_t total_bytes;               /* every arena, as the GPU engine allocates them */
    uint64_t matrix_bytes;              /* matrices in their stored kinds (MXFP4: + scales) */
    uint64_t vector_bytes;              /* vector roles as fp32 */
    uint64_t pad_bytes;                 /* alignment of the blocks */
} kl_arena_sizes;

/* The arenas of a model of config c whose schema is s, its entries stored as dtypes[i] (NULL:
 * the schema's synth_dtype): the layout of kl_arena_layer and kl_arena_global; with tp > 1
 * (a valid size, loader/tp_split.h) those of one GPU rank, its cut as engine/tp_model.h makes
 * it (as tp_split.h cuts each tensor; ep: expert parallel, rank 0's routed experts whole, the
 * valid sizes give every rank as many).
 * KL_E_UNSUPPORTED (a dtype the engines do not hold), KL_E_NOMEM. */
int kl_arena_size_schema(const kl_schema *s, const kl_config *c, const kl_dtype *dtypes,
                         unsigned tp, int ep, kl_arena_sizes *out, kl_err *err);

#endif
