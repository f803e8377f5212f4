/* loader/tp_split.c — the tensor-parallel cut of each role (see tp_split.h). */
#include "loader/tp_split.h"

#include <stdio.h>

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

void kl_tp_part(uint64_t n, unsigned tp, unsigned rank, uint64_t *start, uint64_t *len)
{
    const uint64_t q = n / tp, rem = n % tp;
    *start = rank * q + (rank < rem ? rank : rem);
    *len = q + (rank < rem);
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
    const uint64_t d = e->shape[s.dim];
    uint64_t start, part;
    kl_tp_part(d, tp, rank, &start, &part);
    return part * (e->numel / d);
}

static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

uint32_t kl_tp_expert_blocks(const kl_config *c)
{
    return c->quant_format[0] ? c->moe_intermediate_size / 32 : 0;
}

/* Greatest common divisor of the dimensions a TP size splits (absent ones, 0, are skipped);
 * 0 when the config names none of them (any size is then accepted). */
static uint64_t split_gcd(const kl_config *c, int ep)
{
    const uint32_t shared = c->moe_intermediate_size * c->num_shared_experts;
    const uint32_t dims[] = {c->num_attention_heads, c->num_key_value_heads, c->kda_num_heads,
                             c->num_experts, c->intermediate_size,
                             ep ? shared : c->moe_intermediate_size,
                             ep ? 0 : kl_tp_expert_blocks(c)};
    uint64_t g = 0;
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
        g = gcd_u64(g, dims[i]);
    return g;
}

size_t kl_tp_sizes(const kl_config *c, int ep, unsigned *sizes, size_t cap)
{
    uint64_t g = split_gcd(c, ep);
    size_t n = 0;
    for (unsigned tp = 1; tp <= KL_TP_MAX && n < cap; tp++)
        if (!g || g % tp == 0)
            sizes[n++] = tp;
    return n;
}

int kl_tp_size_ok(const kl_config *c, int ep, unsigned tp)
{
    const uint64_t g = split_gcd(c, ep);
    return tp && tp <= KL_TP_MAX && (!g || g % tp == 0);
}

void kl_tp_sizes_text(const kl_config *c, int ep, char *buf, size_t cap)
{
    unsigned sizes[64];
    const size_t n = kl_tp_sizes(c, ep, sizes, sizeof sizes / sizeof *sizes);
    size_t k = 0;
    if (cap)
        buf[0] = 0;
    for (size_t i = 0; i < n && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%u", i ? ", " : "", sizes[i]);
}
