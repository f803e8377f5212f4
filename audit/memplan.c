/*
 * audit/memplan.c — memory per GPU for a tensor-parallel size and a context length.
 *
 * Weights: every tensor's bytes in its stored dtype (BF16, or MXFP4 packed + scales) as
 * loader/tp_split.h cuts it for rank 0: divided by the TP size, except the tensors every rank
 * holds whole (norms, the router and its bias, MLA's kv_a projection and kv_a norm, KDA's
 * low-rank f_a / g_a projections and o_norm).  Embedding and lm_head are split by vocabulary.
 * MLA cache: per sequence, kl_config_mla_token_bytes per token per MLA layer at the asked
 * element size (bf16 in the audit), replicated on every rank.  KDA state: per sequence,
 * kl_config_kda_state_bytes for heads/TP heads per KDA layer (fp32).
 * Valid TP sizes: those dividing the MLA heads, the KDA heads, the routed experts, both MLP
 * widths and, for MXFP4 experts, their scale blocks along the intermediate width (every split
 * of the plan then gives whole heads, experts, rows and scale blocks per rank).  Expert
 * parallel: routed experts whole on their owner (rank 0 holds the first experts / TP), so
 * their width and blocks do not count, the shared experts' width does.
 * Weights split into matrices and the vectors the engines read element-wise (kept as fp32 by
 * both engines: vector_f32_bytes says how much that is).  The GPU engine's arenas as
 * loader/arena.h lays them out (the code engine/gpu_plan.c places the weights with): matrices
 * in their stored kinds, vectors fp32, every block 256-byte aligned; at TP > 1 those of one GPU
 * rank (engine/tp_model.h; not with expert parallel, which the GPU ranks do not run).
 */
#include "audit/audit.h"

#include "common/checked.h"
#include "loader/arena.h"
#include "loader/schema.h"
#include "loader/tp_split.h"

#include <inttypes.h>
#include <stdio.h>

#include <string.h>

uint64_t kl_memplan_default_context(const kl_config *c)
{
    return c->max_position && c->max_position < 131072 ? c->max_position : 131072;
}

static int check_opts(const kl_config *c, const kl_memplan_opts *o, kl_err *err)
{
    if (!kl_tp_size_ok(c, o->expert_parallel, o->tp)) {
        char list[512];
        kl_tp_sizes_text(c, o->expert_parallel, list, sizeof list);
        return kl_fail_rule(err, KL_E_USAGE, "MEM-TP",
                            "TP size %u does not split the model evenly (MLA heads %u, KDA heads "
                            "%u, experts %u, MLP widths %u/%u, MXFP4 expert blocks %u%s); valid "
                            "sizes%s: %s", o->tp, c->num_attention_heads, c->kda_num_heads,
                            c->num_experts, c->intermediate_size, c->moe_intermediate_size,
                            kl_tp_expert_blocks(c),
                            o->expert_parallel ? ", routed experts whole" : "",
                            o->expert_parallel ? " (expert parallel)" : "", list);
    }
    if (c->max_position && o->context > c->max_position)
        return kl_fail_rule(err, KL_E_USAGE, "MEM-CONTEXT",
                            "context %" PRIu64 " tokens exceeds the model's maximum of %" PRIu64
                            " (config model_max_length / max_position_embeddings)",
                            o->context, c->max_position);
    if (!o->cache_elem_bytes || !o->state_elem_bytes)
        return kl_fail(err, KL_E_USAGE, "memory plan without element sizes");
    return 0;
}

/* ---- plan ------------------------------------------------------------------------------------ */

/* Weights per GPU: rank 0's part of every tensor (loader/tp_split.h; the valid sizes give
 * every rank the same) in its stored dtype, the tensors every rank holds whole and the vectors
 * counted apart too; the GPU arenas of a rank's cut. */
static int plan_weights(kl_memplan *m, const kl_config *c, const kl_memplan_opts *o,
                        kl_err *err)
{
    kl_schema s;
    int rc = kl_schema_build(&s, c, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < s.n; i++) {
        const kl_schema_entry *e = &s.entries[i];
        const kl_tp_split sp = kl_tp_split_of(e->role, o->expert_parallel);
        const uint64_t bits = kl_dtype_bits(o->dtypes ? o->dtypes[i] : e->synth_dtype);
        const uint64_t numel = kl_tp_rank_numel(e, sp, o->tp, 0, c->num_experts);
        m->weights_bytes += numel * bits / 8;
        if (sp.kind == KL_TP_WHOLE)
            m->replicated_bytes += e->numel * bits / 8;
        if (kl_role_is_vector(e->role)) {
            m->vector_bytes += numel * bits / 8;
            m->vector_f32_bytes += numel * sizeof(float);
        }
    }
    m->matrix_bytes = m->weights_bytes - m->vector_bytes;
    kl_arena_sizes a;
    kl_err aerr;
    kl_err_clear(&aerr);
    rc = kl_arena_size_schema(&s, c, o->dtypes, o->tp, o->expert_parallel, &a, &aerr);
    kl_schema_free(&s);
    if (rc == KL_E_NOMEM)
        return kl_fail(err, KL_E_NOMEM, "out of memory planning the GPU arenas");
    m->has_gpu_arena = rc == 0;
    m->gpu_arena_bytes = rc ? 0 : a.total_bytes;
    m->gpu_arena_pad_bytes = rc ? 0 : a.pad_bytes;
    return 0;
}

int kl_memplan_compute(kl_memplan *m, const kl_config *c, const kl_memplan_opts *o,
                       kl_err *err)
{
    memset(m, 0, sizeof *m);
    int rc = check_opts(c, o, err);
    if (rc || (rc = plan_weights(m, c, o, err)))
        return rc;
    m->tp = o->tp;
    m->expert_parallel = o->expert_parallel;
    m->context = o->context;
    m->cache_elem_bytes = o->cache_elem_bytes;
    m->state_elem_bytes = o->state_elem_bytes;
    /* Config values are 32-bit and context reaches 2^40: every product is checked. */
    uint64_t n_mla = kl_config_count_attn(c, KL_ATTN_MLA);
    uint64_t n_kda = kl_config_count_attn(c, KL_ATTN_KDA);
    uint64_t heads = c->kda_num_heads / o->tp;
    uint64_t mla, per_layer, kda, sum;
    if (kl_mul_u64(n_mla, o->context, &mla) ||
        kl_mul_u64(mla, kl_config_mla_token_bytes(c, o->cache_elem_bytes), &mla) ||
        kl_config_kda_state_bytes(c, heads, o->state_elem_bytes, &per_layer) ||
        kl_mul_u64(n_kda, per_layer, &kda) || kl_add_u64(m->weights_bytes, mla, &sum) ||
        kl_add_u64(sum, kda, &sum))
        return kl_fail_rule(err, KL_E_FORMAT, "MEM-PLAN",
                            "memory plan overflows 64 bits for this config and context");
    m->mla_cache_bytes = mla;
    m->kda_state_bytes = kda;
    m->total_bytes = sum;
    return 0;
}
