/*
 * loader/schema.h — every tensor a checkpoint of a given config must hold.
 *
 * One table drives audit, synth, convert and the loader: name (+ an accepted alias), shape,
 * accepted dtypes and role.  Entries are ordered by layer, then in name order within the
 * global/layer groups as a sorted listing would show them (so synth writes a natural order).
 * For KL_FAMILY_KIMI_LINEAR_MXFP4 each routed expert's w1/w2/w3 appears as two entries:
 * ".weight_packed" U8 [out, in/2] and ".weight_scale" U8 or F8_E8M0 [out, in/32].
 *
 * Aliases: layer-0 dense MLP is "model.layers.L.mlp.{gate,up,down}_proj.weight"
 * (official) or "model.layers.L.block_sparse_moe.{gate,up,down}_proj.weight" (transformers).
 *
 * Ownership: the schema owns every string; entries are valid until kl_schema_free.
 *
 * Order, exactly: model.embed_tokens.weight; then layers 0..L-1, each layer's tensors sorted by
 * canonical name with strcmp (so "experts.10" precedes "experts.2", and the packed/scale pairs
 * of one expert are adjacent); then model.norm.weight and lm_head.weight (absent when
 * tie_word_embeddings).  Dense MLP layers are those where kl_config_is_moe_layer is false.
 * Dtypes: every float tensor accepts KL_DT_MASK_FLOAT; synth writes BF16, except A_log,
 * dt_bias and e_score_correction_bias (F32).  PACKED accepts U8, SCALE U8 or F8_E8M0.
 * Errors: KL_E_UNSUPPORTED (family K3/unknown, q_lora_rank > 0), KL_E_SCHEMA with rule
 * CFG-RANGE (a dimension product overflows, an MXFP4 in-dimension not a multiple of the group
 * size, more than KL_SCHEMA_MAX_ENTRIES entries or the caps of config.h exceeded),
 * KL_E_NOMEM.  kl_err.tensor names the config key at fault.
 * Thread safety: a built schema is read-only; concurrent readers are fine.
 */
#ifndef KL_LOADER_SCHEMA_H
#define KL_LOADER_SCHEMA_H

#include "common/err.h"
#include "common/strmap.h"
#include "loader/config.h"
#include "loader/dtype.h"

#include <stddef.h>
#include <stdint.h>

/* Entry cap of one schema: K3's 497,052 language tensors fit; a config that claims more
 * fails cleanly instead of allocating gigabytes (~200 bytes per entry with its name). */
#define KL_SCHEMA_MAX_ENTRIES ((size_t)1 << 21)

typedef enum kl_role {
    KL_ROLE_EMBED, KL_ROLE_FINAL_NORM, KL_ROLE_LM_HEAD,
    KL_ROLE_INPUT_NORM, KL_ROLE_POST_ATTN_NORM,
    /* KDA */
    KL_ROLE_KDA_Q, KL_ROLE_KDA_K, KL_ROLE_KDA_V,
    KL_ROLE_KDA_Q_CONV, KL_ROLE_KDA_K_CONV, KL_ROLE_KDA_V_CONV,
    KL_ROLE_KDA_A_LOG, KL_ROLE_KDA_F_A, KL_ROLE_KDA_F_B, KL_ROLE_KDA_DT_BIAS, KL_ROLE_KDA_B,
    KL_ROLE_KDA_G_A, KL_ROLE_KDA_G_B, KL_ROLE_KDA_O_NORM, KL_ROLE_KDA_O,
    /* MLA */
    KL_ROLE_MLA_Q, KL_ROLE_MLA_KV_A, KL_ROLE_MLA_KV_A_NORM, KL_ROLE_MLA_KV_B, KL_ROLE_MLA_O,
    /* dense MLP */
    KL_ROLE_MLP_GATE, KL_ROLE_MLP_UP, KL_ROLE_MLP_DOWN,
    /* MoE */
    KL_ROLE_ROUTER, KL_ROLE_ROUTER_BIAS,
    KL_ROLE_EXPERT_W1, KL_ROLE_EXPERT_W2, KL_ROLE_EXPERT_W3,
    KL_ROLE_SHARED_GATE, KL_ROLE_SHARED_UP, KL_ROLE_SHARED_DOWN,
    KL_ROLE_COUNT
} kl_role;

typedef enum kl_tensor_part {
    KL_PART_WEIGHT = 0,   /* plain tensor (BF16 / any float) */
    KL_PART_PACKED = 1,   /* MXFP4 codes, U8 [out, in/2] */
    KL_PART_SCALE = 2,    /* E8M0 scales, U8 [out, in/32] */
} kl_tensor_part;

typedef struct kl_schema_entry {
    const char    *name;          /* canonical (official) name */
    const char    *alias;         /* other accepted spelling, or NULL */
    kl_role        role;
    kl_tensor_part part;
    int32_t        layer;         /* -1 for global tensors */
    int32_t        expert;        /* routed expert index, -1 otherwise */
    int            rank;
    uint64_t       shape[4];
    uint32_t       dtype_mask;    /* KL_DT_BIT set of accepted dtypes */
    kl_dtype       synth_dtype;   /* dtype synth writes */
    uint64_t       numel;
} kl_schema_entry;

typedef struct kl_schema {
    size_t           n;
    kl_schema_entry *entries;     /* [n] */
    char            *strings;     /* owned storage for names */
    kl_strmap        by_name;     /* canonical names and aliases -> entry index */
} kl_schema;

/* Builds the schema for c (families KIMI_LINEAR and KIMI_LINEAR_MXFP4; KL_E_UNSUPPORTED for
 * K3 and unknown).  On failure s is zeroed. */
int kl_schema_build(kl_schema *s, const kl_config *c, kl_err *err);
void kl_schema_free(kl_schema *s);

/* Number of entries kl_schema_build would produce, computed in O(layers) without allocating;
 * same errors as kl_schema_build except KL_E_NOMEM.  Lets a caller refuse a large schema. */
int kl_schema_count(const kl_config *c, size_t *n, kl_err *err);

/* Entry matching a canonical name or an alias, NULL if none. */
const kl_schema_entry *kl_schema_find(const kl_schema *s, const char *name);

/* Role name such as "expert.w1" and a description like "layer 5 expert 17 w1". */
const char *kl_role_name(kl_role r);
void kl_schema_describe(const kl_schema_entry *e, char *buf, size_t n);

/* Whether a role is a routed-expert weight (w1/w2/w3). */
int kl_role_is_expert(kl_role r);

#endif
