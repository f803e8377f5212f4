/*
 * audit/memplan.c — memory per GPU for a tensor-parallel size and a context length.
 *
 * Weights: every tensor's bytes in its stored dtype (BF16, or MXFP4 packed + scales) divided
 * by the TP size, except the tensors every rank holds whole: norms, the router and its bias,
 * MLA's kv_a projection and kv_a norm (the latent is shared by all heads) and KDA's low-rank
 * f_a / g_a projections and o_norm.  Embedding and lm_head are split by vocabulary.
 * MLA cache: per sequence, (kv_lora_rank + qk_rope_head_dim) bf16 values per token per MLA
 * layer, replicated on every rank.  KDA state: per sequence, heads/TP × K × V fp32 recurrent
 * state plus (kernel − 1) past inputs of q, k and v (fp32) for the causal convolution.
 */
#include "audit/audit.h"

#include "loader/schema.h"

#include <string.h>

static int replicated_role(kl_role role)
{
    switch (role) {
    case KL_ROLE_FINAL_NORM:
    case KL_ROLE_INPUT_NORM:
    case KL_ROLE_POST_ATTN_NORM:
    case KL_ROLE_ROUTER:
    case KL_ROLE_ROUTER_BIAS:
    case KL_ROLE_MLA_KV_A:
    case KL_ROLE_MLA_KV_A_NORM:
    case KL_ROLE_KDA_F_A:
    case KL_ROLE_KDA_G_A:
    case KL_ROLE_KDA_O_NORM: return 1;
    default: return 0;
    }
}

int kl_memplan_compute(kl_memplan *m, const kl_config *c, unsigned tp, uint64_t context,
                       kl_err *err)
{
    memset(m, 0, sizeof *m);
    if (!tp)
        return kl_fail(err, KL_E_USAGE, "TP size must be at least 1");
    kl_schema s;
    int rc = kl_schema_build(&s, c, err);
    if (rc)
        return rc;
    m->tp = tp;
    m->context = context;
    for (size_t i = 0; i < s.n; i++) {
        const kl_schema_entry *e = &s.entries[i];
        uint64_t bytes = e->numel * kl_dtype_bits(e->synth_dtype) / 8;
        if (replicated_role(e->role)) {
            m->weights_bytes += bytes;
            m->replicated_bytes += bytes;
        } else {
            m->weights_bytes += (bytes + tp - 1) / tp;
        }
    }
    kl_schema_free(&s);
    uint64_t n_mla = kl_config_count_attn(c, KL_ATTN_MLA);
    uint64_t n_kda = kl_config_count_attn(c, KL_ATTN_KDA);
    m->mla_cache_bytes = n_mla * context * (c->kv_lora_rank + c->qk_rope_head_dim) * 2;
    uint64_t heads = (c->kda_num_heads + tp - 1) / tp;
    uint64_t state = heads * c->kda_head_dim * c->kda_head_dim * 4;
    uint64_t conv =
        3 * heads * c->kda_head_dim * (c->kda_conv_kernel ? c->kda_conv_kernel - 1 : 0) * 4;
    m->kda_state_bytes = n_kda * (state + conv);
    m->total_bytes = m->weights_bytes + m->mla_cache_bytes + m->kda_state_bytes;
    return 0;
}
