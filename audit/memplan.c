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

#include "common/checked.h"
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
    /* Config values are 32-bit and context reaches 2^40: every product is checked. */
    uint64_t n_mla = kl_config_count_attn(c, KL_ATTN_MLA);
    uint64_t n_kda = kl_config_count_attn(c, KL_ATTN_KDA);
    uint64_t latent = (uint64_t)c->kv_lora_rank + c->qk_rope_head_dim;
    uint64_t heads = ((uint64_t)c->kda_num_heads + tp - 1) / tp;
    uint64_t window = c->kda_conv_kernel ? c->kda_conv_kernel - 1 : 0, hd = c->kda_head_dim;
    uint64_t mla, state, conv, per_layer, kda, sum;
    if (kl_mul_u64(n_mla, context, &mla) || kl_mul_u64(mla, latent, &mla) ||
        kl_mul_u64(mla, 2, &mla) || kl_mul_u64(heads, hd, &state) ||
        kl_mul_u64(state, hd, &state) || kl_mul_u64(state, 4, &state) ||
        kl_mul_u64(heads * 3, hd, &conv) || kl_mul_u64(conv, window * 4, &conv) ||
        kl_add_u64(state, conv, &per_layer) || kl_mul_u64(n_kda, per_layer, &kda) ||
        kl_add_u64(m->weights_bytes, mla, &sum) || kl_add_u64(sum, kda, &sum))
        return kl_fail_rule(err, KL_E_FORMAT, "MEM-PLAN",
                            "memory plan overflows 64 bits for this config and context");
    m->mla_cache_bytes = mla;
    m->kda_state_bytes = kda;
    m->total_bytes = sum;
    return 0;
}
