/* loader/tp_split.c — the tensor-parallel cut of each role (see tp_split.h). */
#include "loader/tp_split.h"

kl_tp_split kl_tp_split_of(kl_role role, int expert_parallel)
{
    kl_tp_split s = {KL_TP_OUT, 0};
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
    case KL_ROLE_KDA_O_NORM:
    case KL_ROLE_COUNT: s.kind = KL_TP_WHOLE; break;
    case KL_ROLE_KDA_A_LOG: s.dim = 2; break; /* [1, 1, H, 1] */
    case KL_ROLE_KDA_O:
    case KL_ROLE_MLA_O:
    case KL_ROLE_MLP_DOWN:
    case KL_ROLE_SHARED_DOWN: s = (kl_tp_split){KL_TP_IN, 1}; break;
    case KL_ROLE_EXPERT_W1:
    case KL_ROLE_EXPERT_W3: s.kind = expert_parallel ? KL_TP_OWNER : KL_TP_OUT; break;
    case KL_ROLE_EXPERT_W2:
        s = expert_parallel ? (kl_tp_split){KL_TP_OWNER, 0} : (kl_tp_split){KL_TP_IN, 1};
        break;
    default: break; /* embedding, lm_head, every projection into a block: rows */
    }
    return s;
}

unsigned kl_tp_expert_owner(uint32_t expert, uint32_t n_experts, unsigned tp)
{
    const uint32_t per = tp && n_experts >= tp ? n_experts / tp : 1;
    const uint32_t r = expert / per;
    return r < tp ? r : tp - 1;
}

uint64_t kl_tp_rank_numel(const kl_schema_entry *e, kl_tp_split s, unsigned tp, unsigned rank,
                          uint32_t n_experts)
{
    if (!tp || rank >= tp)
        return 0;
    if (s.kind == KL_TP_WHOLE || tp == 1)
        return e->numel;
    if (s.kind == KL_TP_OWNER)
        return e->expert < 0 || kl_tp_expert_owner((uint32_t)e->expert, n_experts, tp) == rank
                   ? e->numel : 0;
    if (s.dim >= e->rank || !e->shape[s.dim])
        return e->numel; /* nothing to cut (a vector the split does not reach) */
    const uint64_t d = e->shape[s.dim], rest = e->numel / d;
    const uint64_t part = d / tp + (rank < d % tp);
    return part * rest;
}
