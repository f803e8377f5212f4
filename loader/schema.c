/*
 * loader/schema.c — the expected tensor table of a Kimi-Linear config (see schema.h).
 *
 * Divisions, in order:
 *   1. includes, symbolic dimensions and the tensor tables
 *   2. dimension resolution and size checks
 *   3. name composition and the emitter (one code path counts and fills)
 *   4. per-block emitters (global, attention, MLP, MoE)
 *   5. public API (header order)
 * Keep new code in its division.
 *
 * Build = two passes over the same emitters: the first only counts entries and name bytes, so
 * the entry array and the string arena are each allocated once and names never move (the
 * strmap borrows them).  Each layer's entries are then sorted by name, which yields the
 * lexicographic order of a sorted listing ("experts.10" before "experts.2").
 */

/* ---- 1. includes, symbolic dimensions and tables ------------------------------------------ */

#include "loader/schema.h"

#include "common/checked.h"
#include "common/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Dimensions a tensor shape is written in; resolved from the config once per build. */
enum dim {
    D_1,      /* 1 */
    D_H,      /* hidden_size */
    D_VOCAB,  /* vocab_size */
    D_I,      /* intermediate_size (dense MLP) */
    D_MI,     /* moe_intermediate_size (one routed expert) */
    D_SI,     /* moe_intermediate_size * num_shared_experts (the shared expert block) */
    D_E,      /* num_experts */
    D_KP,     /* KDA projection width: kda heads * kda head_dim */
    D_KD,     /* KDA head_dim (also the low-rank gate width) */
    D_KH,     /* KDA heads */
    D_KC,     /* short conv kernel */
    D_MQ,     /* MLA q rows: heads * (qk_nope + qk_rope) */
    D_MKVA,   /* kv_lora_rank + qk_rope */
    D_KVL,    /* kv_lora_rank */
    D_MKVB,   /* heads * (qk_nope + v_head_dim) */
    D_MO,     /* heads * v_head_dim */
    D_COUNT
};

/* One tensor of a block: name after the layer prefix, role, shape in symbolic dims. */
typedef struct tspec {
    const char *suffix;
    kl_role     role;
    int         rank;
    uint8_t     dims[4];
    bool        f32;      /* synth writes F32: small parameters HF keeps in float32 */
} tspec;

static const tspec NORMS[] = {
    {"input_layernorm.weight", KL_ROLE_INPUT_NORM, 1, {D_H}, false},
    {"post_attention_layernorm.weight", KL_ROLE_POST_ATTN_NORM, 1, {D_H}, false},
};

/* KDA: no biases; A_log is per head [1,1,H,1], dt_bias per channel [H*K] (kimi-linear.md §2.3) */
static const tspec KDA[] = {
    {"self_attn.q_proj.weight", KL_ROLE_KDA_Q, 2, {D_KP, D_H}, false},
    {"self_attn.k_proj.weight", KL_ROLE_KDA_K, 2, {D_KP, D_H}, false},
    {"self_attn.v_proj.weight", KL_ROLE_KDA_V, 2, {D_KP, D_H}, false},
    {"self_attn.q_conv1d.weight", KL_ROLE_KDA_Q_CONV, 3, {D_KP, D_1, D_KC}, false},
    {"self_attn.k_conv1d.weight", KL_ROLE_KDA_K_CONV, 3, {D_KP, D_1, D_KC}, false},
    {"self_attn.v_conv1d.weight", KL_ROLE_KDA_V_CONV, 3, {D_KP, D_1, D_KC}, false},
    {"self_attn.A_log", KL_ROLE_KDA_A_LOG, 4, {D_1, D_1, D_KH, D_1}, true},
    {"self_attn.f_a_proj.weight", KL_ROLE_KDA_F_A, 2, {D_KD, D_H}, false},
    {"self_attn.f_b_proj.weight", KL_ROLE_KDA_F_B, 2, {D_KP, D_KD}, false},
    {"self_attn.dt_bias", KL_ROLE_KDA_DT_BIAS, 1, {D_KP}, true},
    {"self_attn.b_proj.weight", KL_ROLE_KDA_B, 2, {D_KH, D_H}, false},
    {"self_attn.g_a_proj.weight", KL_ROLE_KDA_G_A, 2, {D_KD, D_H}, false},
    {"self_attn.g_b_proj.weight", KL_ROLE_KDA_G_B, 2, {D_KP, D_KD}, false},
    {"self_attn.o_norm.weight", KL_ROLE_KDA_O_NORM, 1, {D_KD}, false},
    {"self_attn.o_proj.weight", KL_ROLE_KDA_O, 2, {D_H, D_KP}, false},
};

/* MLA with a plain q_proj (q_lora_rank null) */
static const tspec MLA[] = {
    {"self_attn.q_proj.weight", KL_ROLE_MLA_Q, 2, {D_MQ, D_H}, false},
    {"self_attn.kv_a_proj_with_mqa.weight", KL_ROLE_MLA_KV_A, 2, {D_MKVA, D_H}, false},
    {"self_attn.kv_a_layernorm.weight", KL_ROLE_MLA_KV_A_NORM, 1, {D_KVL}, false},
    {"self_attn.kv_b_proj.weight", KL_ROLE_MLA_KV_B, 2, {D_MKVB, D_KVL}, false},
    {"self_attn.o_proj.weight", KL_ROLE_MLA_O, 2, {D_H, D_MO}, false},
};

/* Dense MLP: official under mlp., transformers writes block_sparse_moe. (the alias) */
static const tspec DENSE[] = {
    {"gate_proj.weight", KL_ROLE_MLP_GATE, 2, {D_I, D_H}, false},
    {"up_proj.weight", KL_ROLE_MLP_UP, 2, {D_I, D_H}, false},
    {"down_proj.weight", KL_ROLE_MLP_DOWN, 2, {D_H, D_I}, false},
};
#define DENSE_PREFIX "mlp."
#define DENSE_ALIAS_PREFIX "block_sparse_moe."

static const tspec ROUTER[] = {
    {"block_sparse_moe.gate.weight", KL_ROLE_ROUTER, 2, {D_E, D_H}, false},
    {"block_sparse_moe.gate.e_score_correction_bias", KL_ROLE_ROUTER_BIAS, 1, {D_E}, true},
};

static const tspec SHARED[] = {
    {"block_sparse_moe.shared_experts.gate_proj.weight", KL_ROLE_SHARED_GATE, 2, {D_SI, D_H},
     false},
    {"block_sparse_moe.shared_experts.up_proj.weight", KL_ROLE_SHARED_UP, 2, {D_SI, D_H}, false},
    {"block_sparse_moe.shared_experts.down_proj.weight", KL_ROLE_SHARED_DOWN, 2, {D_H, D_SI},
     false},
};

/* Routed expert E: "w1" gate [MI, H], "w2" down [H, MI], "w3" up [MI, H]. */
static const tspec EXPERT[] = {
    {"w1", KL_ROLE_EXPERT_W1, 2, {D_MI, D_H}, false},
    {"w2", KL_ROLE_EXPERT_W2, 2, {D_H, D_MI}, false},
    {"w3", KL_ROLE_EXPERT_W3, 2, {D_MI, D_H}, false},
};

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))
#define NAME_MAX_LEN 192  /* fits kl_err.tensor; the longest real name is ~70 bytes */

/* ---- 2. dimension resolution and size checks ---------------------------------------------- */

/* A CFG-RANGE problem of the config found while building; key names the config key. */
static int schema_fail(kl_err *err, const char *key, const char *msg)
{
    kl_fail_rule(err, KL_E_SCHEMA, "CFG-RANGE", "%s", msg);
    kl_err_context(err, NULL, key, KL_NO_OFFSET, NULL);
    return KL_E_SCHEMA;
}

static int mul_dim(uint64_t a, uint64_t b, uint64_t *out, kl_err *err, const char *key)
{
    if (kl_mul_u64(a, b, out))
        return schema_fail(err, key, "a tensor dimension overflows 64 bits");
    return 0;
}

/* Fills dims[] from c; every product goes through the overflow check. */
static int resolve_dims(const kl_config *c, uint64_t *d, kl_err *err)
{
    d[D_1] = 1;
    d[D_H] = c->hidden_size;
    d[D_VOCAB] = c->vocab_size;
    d[D_I] = c->intermediate_size;
    d[D_MI] = c->moe_intermediate_size;
    d[D_E] = c->num_experts;
    d[D_KD] = c->kda_head_dim;
    d[D_KH] = c->kda_num_heads;
    d[D_KC] = c->kda_conv_kernel;
    d[D_KVL] = c->kv_lora_rank;
    d[D_MKVA] = (uint64_t)c->kv_lora_rank + c->qk_rope_head_dim;
    uint64_t qk = (uint64_t)c->qk_nope_head_dim + c->qk_rope_head_dim;
    uint64_t kv = (uint64_t)c->qk_nope_head_dim + c->v_head_dim;
    int rc;
    if ((rc = mul_dim(c->moe_intermediate_size, c->num_shared_experts, &d[D_SI], err,
                      "num_shared_experts")) ||
        (rc = mul_dim(c->kda_num_heads, c->kda_head_dim, &d[D_KP], err,
                      "linear_attn_config.num_heads")) ||
        (rc = mul_dim(c->num_attention_heads, qk, &d[D_MQ], err, "num_attention_heads")) ||
        (rc = mul_dim(c->num_attention_heads, kv, &d[D_MKVB], err, "num_attention_heads")) ||
        (rc = mul_dim(c->num_attention_heads, c->v_head_dim, &d[D_MO], err,
                      "num_attention_heads")))
        return rc;
    return 0;
}

/* Entries one layer contributes (kimi-linear.md §2.2–2.6). */
static size_t layer_count(const kl_config *c, uint32_t layer)
{
    size_t n = NELEM(NORMS);
    n += c->layer_attn[layer] == KL_ATTN_MLA ? NELEM(MLA) : NELEM(KDA);
    if (!kl_config_is_moe_layer(c, layer))
        return n + NELEM(DENSE);
    size_t per_expert = NELEM(EXPERT) * (c->family == KL_FAMILY_KIMI_LINEAR_MXFP4 ? 2 : 1);
    n += NELEM(ROUTER) + (size_t)c->num_experts * per_expert;
    return n + (c->num_shared_experts ? NELEM(SHARED) : 0);
}

/* Family, caps and the geometry rules the emitters rely on. */
static int check_config(const kl_config *c, kl_err *err)
{
    if (c->family != KL_FAMILY_KIMI_LINEAR && c->family != KL_FAMILY_KIMI_LINEAR_MXFP4)
        return kl_fail(err, KL_E_UNSUPPORTED, "no tensor schema for family %s",
                       kl_family_name(c->family));
    if (c->q_lora_rank) {
        kl_fail(err, KL_E_UNSUPPORTED, "q_lora_rank %u (a low-rank MLA query) is not "
                "supported; Kimi-Linear uses a plain q_proj", c->q_lora_rank);
        kl_err_context(err, NULL, "q_lora_rank", KL_NO_OFFSET, NULL);
        return KL_E_UNSUPPORTED;
    }
    if (c->num_hidden_layers == 0 || c->num_hidden_layers > KL_MAX_LAYERS)
        return schema_fail(err, "num_hidden_layers", "num_hidden_layers outside [1, 256]");
    if (c->num_experts > KL_MAX_EXPERTS)
        return schema_fail(err, "num_experts", "num_experts above KL_MAX_EXPERTS");
    if (c->family == KL_FAMILY_KIMI_LINEAR_MXFP4) {
        uint32_t g = c->quant_group_size ? c->quant_group_size : 32;
        if (c->hidden_size % g)
            return schema_fail(err, "hidden_size", "MXFP4 experts need hidden_size (w1/w3 "
                               "in-dimension) to be a multiple of the group size 32");
        if (c->moe_intermediate_size % g)
            return schema_fail(err, "moe_intermediate_size", "MXFP4 experts need "
                               "moe_intermediate_size (w2 in-dimension) to be a multiple of "
                               "the group size 32");
    }
    return 0;
}

/* ---- 3. name composition and the emitter -------------------------------------------------- */

/* The order by name of one kind of layer (attention kind x MoE or dense): perm[i] is the
 * position in emission order of the i-th name. */
typedef struct layer_order {
    int       kind;
    size_t    n;
    uint32_t *perm;               /* [n] owned */
} layer_order;

#define LAYER_KINDS 4             /* KDA or MLA, MoE or dense */

typedef struct builder {
    layer_order orders[LAYER_KINDS];
    size_t      n_orders;
    const kl_config *c;
    uint64_t         dims[D_COUNT];
    uint32_t         group;      /* MXFP4 group size */
    kl_schema_entry *e;          /* [cap] entries; NULL in the counting pass */
    char            *str;        /* name arena; NULL in the counting pass */
    size_t           n;          /* entries emitted */
    size_t           str_used;   /* arena bytes used (names + aliases, NUL included) */
    size_t           n_alias;
    kl_err          *err;
} builder;

/* Appends s to the name being composed; returns the new end. */
static char *put_s(char *p, const char *s)
{
    size_t n = strlen(s);
    memcpy(p, s, n);
    return p + n;
}

static char *put_u(char *p, uint32_t v)
{
    char tmp[12];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

/* "model.layers.L." + mid + [expert "E."] + suffix, NUL-terminated into buf; returns length.
 * Written by hand because snprintf dominated the build time for 20k names. */
static size_t compose(char *buf, int32_t layer, const char *mid, int32_t expert,
                      const char *suffix, const char *part)
{
    char *p = buf;
    if (layer >= 0) {
        p = put_s(p, "model.layers.");
        p = put_u(p, (uint32_t)layer);
        *p++ = '.';
    }
    p = put_s(p, mid);
    if (expert >= 0) {
        p = put_u(p, (uint32_t)expert);
        *p++ = '.';
    }
    p = put_s(p, suffix);
    p = put_s(p, part);
    *p = '\0';
    return (size_t)(p - buf);
}

/* Copies a composed name into the arena (fill pass) or only counts it. */
static const char *keep(builder *b, const char *name, size_t len)
{
    char *dst = b->str ? b->str + b->str_used : NULL;
    if (dst)
        memcpy(dst, name, len + 1);
    b->str_used += len + 1;
    return dst;
}

/* Where an entry comes from: table row, position, MXFP4 part and the spellings. */
typedef struct origin {
    const tspec   *t;
    int32_t        layer, expert;
    kl_tensor_part part;
    const char    *name, *alias;  /* composed, not yet kept */
    size_t         name_len, alias_len;
} origin;

/* Shape of t for the given part: PACKED [out, in/2], SCALE [out, in/group]. */
static int fill_shape(const builder *b, const origin *o, kl_schema_entry *e)
{
    e->rank = o->t->rank;
    e->numel = 1;
    for (int i = 0; i < o->t->rank; i++)
        e->shape[i] = b->dims[o->t->dims[i]];
    if (o->part == KL_PART_PACKED)
        e->shape[1] /= 2;
    else if (o->part == KL_PART_SCALE)
        e->shape[1] /= b->group;
    for (int i = 0; i < e->rank; i++)
        if (kl_mul_u64(e->numel, e->shape[i], &e->numel))
            return schema_fail(b->err, o->name, "the element count overflows 64 bits");
    return 0;
}

static int emit(builder *b, const origin *o)
{
    const char *name = keep(b, o->name, o->name_len);
    const char *alias = o->alias ? keep(b, o->alias, o->alias_len) : NULL;
    b->n_alias += o->alias != NULL;
    if (!b->e) {
        b->n++;
        return 0;
    }
    kl_schema_entry *e = &b->e[b->n++];
    e->name = name;
    e->alias = alias;
    e->role = o->t->role;
    e->part = o->part;
    e->layer = o->layer;
    e->expert = o->expert;
    if (o->part == KL_PART_WEIGHT) {
        e->dtype_mask = KL_DT_MASK_FLOAT;
        e->synth_dtype = o->t->f32 ? KL_DT_F32 : KL_DT_BF16;
    } else {
        e->dtype_mask = KL_DT_BIT(KL_DT_U8) |
                        (o->part == KL_PART_SCALE ? KL_DT_BIT(KL_DT_F8_E8M0) : 0);
        e->synth_dtype = KL_DT_U8;
    }
    return fill_shape(b, o, e);
}

/* ---- 4. per-block emitters ---------------------------------------------------------------- */

/* Every row of a table under "model.layers.L." (or at the top level for layer -1). */
static int emit_table(builder *b, const tspec *t, size_t n, int32_t layer)
{
    char name[NAME_MAX_LEN];
    for (size_t i = 0; i < n; i++) {
        origin o = {.t = &t[i], .layer = layer, .expert = -1, .part = KL_PART_WEIGHT,
                    .name = name};
        o.name_len = compose(name, layer, "", -1, t[i].suffix, "");
        int rc = emit(b, &o);
        if (rc)
            return rc;
    }
    return 0;
}

static int emit_dense(builder *b, int32_t layer)
{
    char name[NAME_MAX_LEN], alias[NAME_MAX_LEN];
    for (size_t i = 0; i < NELEM(DENSE); i++) {
        origin o = {.t = &DENSE[i], .layer = layer, .expert = -1, .part = KL_PART_WEIGHT,
                    .name = name, .alias = alias};
        o.name_len = compose(name, layer, DENSE_PREFIX, -1, DENSE[i].suffix, "");
        o.alias_len = compose(alias, layer, DENSE_ALIAS_PREFIX, -1, DENSE[i].suffix, "");
        int rc = emit(b, &o);
        if (rc)
            return rc;
    }
    return 0;
}

/* One routed expert: w1/w2/w3 ".weight", or ".weight_packed" + ".weight_scale" for MXFP4. */
static int emit_expert(builder *b, int32_t layer, int32_t expert)
{
    static const struct { kl_tensor_part part; const char *ext; } BF16[] = {
        {KL_PART_WEIGHT, ".weight"}};
    static const struct { kl_tensor_part part; const char *ext; } MX[] = {
        {KL_PART_PACKED, ".weight_packed"}, {KL_PART_SCALE, ".weight_scale"}};
    bool mx = b->c->family == KL_FAMILY_KIMI_LINEAR_MXFP4;
    size_t n_parts = mx ? NELEM(MX) : NELEM(BF16);
    char name[NAME_MAX_LEN];
    for (size_t i = 0; i < NELEM(EXPERT); i++) {
        for (size_t k = 0; k < n_parts; k++) {
            origin o = {.t = &EXPERT[i], .layer = layer, .expert = expert,
                        .part = mx ? MX[k].part : BF16[k].part, .name = name};
            o.name_len = compose(name, layer, "block_sparse_moe.experts.", expert,
                                 EXPERT[i].suffix, mx ? MX[k].ext : BF16[k].ext);
            int rc = emit(b, &o);
            if (rc)
                return rc;
        }
    }
    return 0;
}

static int emit_moe(builder *b, int32_t layer)
{
    int rc = emit_table(b, ROUTER, NELEM(ROUTER), layer);
    if (!rc && b->c->num_shared_experts)
        rc = emit_table(b, SHARED, NELEM(SHARED), layer);
    for (uint32_t e = 0; !rc && e < b->c->num_experts; e++)
        rc = emit_expert(b, layer, (int32_t)e);
    return rc;
}

/* Positions i, j of the entries ctx points at, by name. */
static int cmp_pos_name(const void *a, const void *b, void *ctx)
{
    const kl_schema_entry *e = ctx;
    return strcmp(e[*(const uint32_t *)a].name, e[*(const uint32_t *)b].name);
}

/* The order by name of the n entries at e for layers of this kind: found by sorting the first
 * time, then reused.  Every layer of one kind emits the same names after its own
 * "model.layers.L." prefix, in the same order, so their order by name is the same (n equal as a
 * check; a kind that differs anyway is sorted, not reused).  NULL: out of memory. */
static const uint32_t *layer_order_for(builder *b, int kind, const kl_schema_entry *e, size_t n)
{
    for (size_t i = 0; i < b->n_orders; i++)
        if (b->orders[i].kind == kind && b->orders[i].n == n)
            return b->orders[i].perm;
    uint32_t *perm = kl_malloc((n ? n : 1) * sizeof *perm);
    if (!perm)
        return NULL;
    for (size_t i = 0; i < n; i++)
        perm[i] = (uint32_t)i;
    qsort_r(perm, n, sizeof *perm, cmp_pos_name, (void *)e);
    if (b->n_orders == LAYER_KINDS)
        kl_free(b->orders[--b->n_orders].perm);
    b->orders[b->n_orders++] = (layer_order){kind, n, perm};
    return perm;
}

/* Sorts the entries [start, b->n) by name (the fill pass). */
static int sort_layer(builder *b, size_t start, int kind)
{
    size_t n = b->n - start;
    kl_schema_entry *e = b->e + start, *tmp = kl_malloc((n ? n : 1) * sizeof *tmp);
    const uint32_t *perm = tmp ? layer_order_for(b, kind, e, n) : NULL;
    if (!perm) {
        kl_free(tmp);
        return kl_fail(b->err, KL_E_NOMEM, "out of memory sorting the tensor schema");
    }
    for (size_t i = 0; i < n; i++)
        tmp[i] = e[perm[i]];
    memcpy(e, tmp, n * sizeof *e);
    kl_free(tmp);
    return 0;
}

static void free_orders(builder *b)
{
    for (size_t i = 0; i < b->n_orders; i++)
        kl_free(b->orders[i].perm);
    b->n_orders = 0;
}

/* Norms, attention and MLP of one layer, then (fill pass) sorted by name. */
static int emit_layer(builder *b, uint32_t layer)
{
    const kl_config *c = b->c;
    size_t start = b->n;
    int32_t l = (int32_t)layer;
    int mla = c->layer_attn[layer] == KL_ATTN_MLA, moe = kl_config_is_moe_layer(c, layer);
    int rc = emit_table(b, NORMS, NELEM(NORMS), l);
    if (!rc)
        rc = mla ? emit_table(b, MLA, NELEM(MLA), l) : emit_table(b, KDA, NELEM(KDA), l);
    if (!rc)
        rc = moe ? emit_moe(b, l) : emit_dense(b, l);
    if (!rc && b->e)
        rc = sort_layer(b, start, 2 * mla + moe);
    return rc;
}

static const tspec EMBED[] = {
    {"model.embed_tokens.weight", KL_ROLE_EMBED, 2, {D_VOCAB, D_H}, false},
};
static const tspec TAIL[] = {
    {"model.norm.weight", KL_ROLE_FINAL_NORM, 1, {D_H}, false},
    {"lm_head.weight", KL_ROLE_LM_HEAD, 2, {D_VOCAB, D_H}, false},
};

/* The whole model: embedding, layers 0..L-1, final norm, lm_head unless tied. */
static int emit_model(builder *b)
{
    int rc = emit_table(b, EMBED, NELEM(EMBED), -1);
    for (uint32_t l = 0; !rc && l < b->c->num_hidden_layers; l++)
        rc = emit_layer(b, l);
    if (!rc)
        rc = emit_table(b, TAIL, b->c->tie_word_embeddings ? 1 : 2, -1);
    return rc;
}

/* ---- 5. public API ------------------------------------------------------------------------ */

/* Both spellings of every entry into the lookup map. */
static int index_names(kl_schema *s, size_t n_alias, kl_err *err)
{
    if (kl_strmap_init(&s->by_name, s->n + n_alias))
        return kl_fail(err, KL_E_NOMEM, "out of memory indexing the tensor schema");
    for (size_t i = 0; i < s->n; i++) {
        const kl_schema_entry *e = &s->entries[i];
        const char *names[2] = {e->name, e->alias};
        for (int k = 0; k < 2 && names[k]; k++) {
            int rc = kl_strmap_put(&s->by_name, names[k], (uint32_t)i, NULL);
            if (rc < 0)
                return kl_fail(err, KL_E_NOMEM, "out of memory indexing the tensor schema");
            if (rc == 1)
                return kl_fail(err, KL_E_BUG, "schema lists %s twice", names[k]);
        }
    }
    return 0;
}

int kl_schema_build(kl_schema *s, const kl_config *c, kl_err *err)
{
    memset(s, 0, sizeof *s);
    size_t expected;
    int rc = kl_schema_count(c, &expected, err);
    if (rc)
        return rc;
    builder b = {.c = c, .err = err};
    b.group = c->quant_group_size ? c->quant_group_size : 32;
    if ((rc = resolve_dims(c, b.dims, err)) || (rc = emit_model(&b)))  /* counting pass */
        return rc;
    if (b.n != expected)
        return kl_fail(err, KL_E_BUG, "schema count %zu != emitted %zu", expected, b.n);
    kl_schema tmp = {0};
    tmp.entries = kl_calloc(b.n, sizeof *tmp.entries);
    tmp.strings = kl_malloc(b.str_used ? b.str_used : 1);
    if (!tmp.entries || !tmp.strings) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory for %zu schema entries", b.n);
        goto fail;
    }
    size_t n_alias = b.n_alias;
    b.e = tmp.entries;
    b.str = tmp.strings;
    b.n = b.str_used = b.n_alias = 0;
    rc = emit_model(&b);  /* filling pass */
    free_orders(&b);
    if (rc)
        goto fail;
    tmp.n = b.n;
    if ((rc = index_names(&tmp, n_alias, err)))
        goto fail;
    *s = tmp;
    return 0;
fail:
    kl_schema_free(&tmp);
    return rc;
}

void kl_schema_free(kl_schema *s)
{
    if (!s)
        return;
    kl_strmap_free(&s->by_name);
    kl_free(s->entries);
    kl_free(s->strings);
    memset(s, 0, sizeof *s);
}

int kl_schema_count(const kl_config *c, size_t *n, kl_err *err)
{
    int rc = check_config(c, err);
    if (rc)
        return rc;
    /* O(layers): caps keep every term small, so the sum cannot overflow size_t */
    size_t total = NELEM(EMBED) + (c->tie_word_embeddings ? 1 : 2);
    for (uint32_t l = 0; l < c->num_hidden_layers; l++)
        total += layer_count(c, l);
    if (total > KL_SCHEMA_MAX_ENTRIES) {
        kl_fail_rule(err, KL_E_SCHEMA, "CFG-RANGE", "the config implies %zu tensors, above "
                     "the cap of %zu (KL_SCHEMA_MAX_ENTRIES)", total, KL_SCHEMA_MAX_ENTRIES);
        kl_err_context(err, NULL, "num_experts", KL_NO_OFFSET, NULL);
        return KL_E_SCHEMA;
    }
    *n = total;
    return 0;
}

const kl_schema_entry *kl_schema_find(const kl_schema *s, const char *name)
{
    uint32_t i;
    if (!s->entries || !kl_strmap_get(&s->by_name, name, &i))
        return NULL;
    return &s->entries[i];
}

static const char *const ROLE_NAMES[KL_ROLE_COUNT] = {
    [KL_ROLE_EMBED] = "embed",
    [KL_ROLE_FINAL_NORM] = "final_norm",
    [KL_ROLE_LM_HEAD] = "lm_head",
    [KL_ROLE_INPUT_NORM] = "input_norm",
    [KL_ROLE_POST_ATTN_NORM] = "post_attn_norm",
    [KL_ROLE_KDA_Q] = "kda.q",
    [KL_ROLE_KDA_K] = "kda.k",
    [KL_ROLE_KDA_V] = "kda.v",
    [KL_ROLE_KDA_Q_CONV] = "kda.q_conv",
    [KL_ROLE_KDA_K_CONV] = "kda.k_conv",
    [KL_ROLE_KDA_V_CONV] = "kda.v_conv",
    [KL_ROLE_KDA_A_LOG] = "kda.a_log",
    [KL_ROLE_KDA_F_A] = "kda.f_a",
    [KL_ROLE_KDA_F_B] = "kda.f_b",
    [KL_ROLE_KDA_DT_BIAS] = "kda.dt_bias",
    [KL_ROLE_KDA_B] = "kda.b",
    [KL_ROLE_KDA_G_A] = "kda.g_a",
    [KL_ROLE_KDA_G_B] = "kda.g_b",
    [KL_ROLE_KDA_O_NORM] = "kda.o_norm",
    [KL_ROLE_KDA_O] = "kda.o",
    [KL_ROLE_MLA_Q] = "mla.q",
    [KL_ROLE_MLA_KV_A] = "mla.kv_a",
    [KL_ROLE_MLA_KV_A_NORM] = "mla.kv_a_norm",
    [KL_ROLE_MLA_KV_B] = "mla.kv_b",
    [KL_ROLE_MLA_O] = "mla.o",
    [KL_ROLE_MLP_GATE] = "mlp.gate",
    [KL_ROLE_MLP_UP] = "mlp.up",
    [KL_ROLE_MLP_DOWN] = "mlp.down",
    [KL_ROLE_ROUTER] = "router",
    [KL_ROLE_ROUTER_BIAS] = "router.bias",
    [KL_ROLE_EXPERT_W1] = "expert.w1",
    [KL_ROLE_EXPERT_W2] = "expert.w2",
    [KL_ROLE_EXPERT_W3] = "expert.w3",
    [KL_ROLE_SHARED_GATE] = "shared.gate",
    [KL_ROLE_SHARED_UP] = "shared.up",
    [KL_ROLE_SHARED_DOWN] = "shared.down",
};

const char *kl_role_name(kl_role r)
{
    if ((unsigned)r >= KL_ROLE_COUNT || !ROLE_NAMES[r])
        return "?";
    return ROLE_NAMES[r];
}

/* "global embed", "layer 3 mla.kv_b", "layer 5 expert 17 w1 (packed)". */
void kl_schema_describe(const kl_schema_entry *e, char *buf, size_t n)
{
    static const char *const PART[] = {"", " (packed)", " (scale)"};
    const char *part = (unsigned)e->part < 3 ? PART[e->part] : "";
    if (e->layer < 0)
        snprintf(buf, n, "global %s%s", kl_role_name(e->role), part);
    else if (e->expert >= 0 && kl_role_is_expert(e->role))
        snprintf(buf, n, "layer %d expert %d %s%s", (int)e->layer, (int)e->expert,
                 kl_role_name(e->role) + strlen("expert."), part);
    else
        snprintf(buf, n, "layer %d %s%s", (int)e->layer, kl_role_name(e->role), part);
}

int kl_role_is_expert(kl_role r)
{
    return r == KL_ROLE_EXPERT_W1 || r == KL_ROLE_EXPERT_W2 || r == KL_ROLE_EXPERT_W3;
}
