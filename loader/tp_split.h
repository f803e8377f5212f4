/*
 * loader/tp_split.h — how tensor parallelism cuts each tensor of the schema: the one table the
 * memory plan (audit/memplan.c) uses today and the sharded engines and loaders (issue 12) will.
 *
 * Megatron's column/row split per block: the projections into a block (q, k, v, gate, up,
 * the low-rank decoders f_b and g_b, the KDA convs and per-head vectors) split their output
 * rows by head or channel (OUT); the projections out of a block (o_proj, down) split their
 * input columns (IN), so each rank's product is a partial sum and the block ends with one
 * all-reduce.  The vocabulary splits the embedding and lm_head (OUT).  Norms, the router, MLA's
 * shared latent (kv_a and its norm) and KDA's low-rank encoders (f_a, g_a) and o_norm stay
 * whole on every rank.  Routed experts either split like the dense MLP (w1, w3 OUT by the
 * intermediate width, w2 IN) or, expert parallel, stay whole on the rank that owns them.
 */
#ifndef KL_LOADER_TP_SPLIT_H
#define KL_LOADER_TP_SPLIT_H

#include "loader/config.h"
#include "loader/schema.h"

#include <stddef.h>
#include <stdint.h>

#define KL_TP_MAX 4096 /* the largest TP size considered */

/* The TP sizes that split c into whole heads, experts, rows and (MXFP4) expert scale blocks:
 * those dividing the MLA and KDA heads, the routed experts, both MLP widths and the experts'
 * 32-value blocks along their intermediate width; expert parallel (ep), the routed experts
 * stay whole, so their width and blocks do not count but the shared experts' width does.
 * kl_tp_sizes writes them ascending, at most cap, and returns how many; kl_tp_sizes_text as
 * "1, 2, 4" (truncated to cap). */
size_t kl_tp_sizes(const kl_config *c, int ep, unsigned *sizes, size_t cap);
int    kl_tp_size_ok(const kl_config *c, int ep, unsigned tp);
void   kl_tp_sizes_text(const kl_config *c, int ep, char *buf, size_t cap);

/* MXFP4 experts: their 32-value scale blocks along the intermediate width, which w2's IN cut
 * must keep whole on a rank; 0 (no constraint) for BF16 checkpoints. */
uint32_t kl_tp_expert_blocks(const kl_config *c);

typedef enum kl_tp_kind {
    KL_TP_WHOLE = 0, /* every rank holds all of it */
    KL_TP_OUT,       /* dimension dim cut in tp equal parts: rank r holds part r */
    KL_TP_IN,        /* the same, the product's input features: partial sums to all-reduce */
    KL_TP_OWNER,     /* a routed expert, expert parallel: whole on its owner, absent elsewhere */
} kl_tp_kind;

typedef struct kl_tp_split {
    kl_tp_kind kind;
    int        dim;      /* OUT, IN: the dimension cut (A_log [1, 1, H, 1]: 2) */
} kl_tp_split;

/* The split of a tensor of this role; expert_parallel picks how routed experts go. */
kl_tp_split kl_tp_split_of(kl_role role, int expert_parallel);

/* The rank owning routed expert `expert` of n_experts under expert parallelism over tp
 * ranks: contiguous blocks of n_experts / tp. */
unsigned kl_tp_expert_owner(uint32_t expert, uint32_t n_experts, unsigned tp);

/* Part `rank` of n units cut in tp: [*start, *start + *len), the first n % tp parts one
 * larger (tp > 0, rank < tp). */
void kl_tp_part(uint64_t n, unsigned tp, unsigned rank, uint64_t *start, uint64_t *len);

/* Elements of schema entry e that rank `rank` of tp holds under split s (n_experts: the
 * config's routed experts, for KL_TP_OWNER).  The cut dimension must divide by tp (the
 * memory plan's valid sizes guarantee it for Kimi-Linear; else the first ranks hold one
 * more). */
uint64_t kl_tp_rank_numel(const kl_schema_entry *e, kl_tp_split s, unsigned tp, unsigned rank,
                          uint32_t n_experts);

#endif
