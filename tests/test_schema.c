/*
 * tests/test_schema.c — the expected tensor table: counts, order, aliases, shapes, dtypes,
 * MXFP4 parts, the tiny preset and the size caps.
 */
#include "loader/schema.h"

#include "common/mem.h"
#include "testutil.h"

#include <inttypes.h>

/* ---- fixtures ----------------------------------------------------------------------------- */

static char *fmt_err(const kl_err *err)
{
    static char buf[1024];
    return kl_err_format(err, buf, sizeof buf);
}

/* kimi_ref.py "tiny": vocab 1024, hidden 64, 4 layers (MLA at 1-based 4), 8 experts top-2,
 * moe_intermediate 32, KDA 4 heads x 16, MLA 4 heads kv_lora 16 rope 8 nope 16 v 16,
 * intermediate 96. */
static void tiny_config(kl_config *c)
{
    kl_config_default_48b(c);
    c->vocab_size = 1024;
    c->hidden_size = 64;
    c->num_hidden_layers = 4;
    c->intermediate_size = 96;
    c->moe_intermediate_size = 32;
    c->num_attention_heads = 4;
    c->num_key_value_heads = 4;
    c->kv_lora_rank = 16;
    c->qk_rope_head_dim = 8;
    c->qk_nope_head_dim = 16;
    c->v_head_dim = 16;
    c->num_experts = 8;
    c->num_experts_per_token = 2;
    c->kda_num_heads = 4;
    c->kda_head_dim = 16;
    c->bos_token_id = 768;
    c->eos_token_id = 770;
    c->pad_token_id = 1023;
    for (int i = 0; i < KL_MAX_LAYERS; i++)
        c->layer_attn[i] = i == 3 ? KL_ATTN_MLA : KL_ATTN_KDA;
}

static void mxfp4(kl_config *c)
{
    c->family = KL_FAMILY_KIMI_LINEAR_MXFP4;
    c->quantized = true;
    snprintf(c->quant_method, sizeof c->quant_method, "compressed-tensors");
    snprintf(c->quant_format, sizeof c->quant_format, "mxfp4-pack-quantized");
    c->quant_group_size = 32;
}

static void build_ok(kl_schema *s, const kl_config *c)
{
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_schema_build(s, c, &err);
    ck_assert_msg(rc == 0, "kl_schema_build: %s", fmt_err(&err));
}

static const kl_schema_entry *must_find(const kl_schema *s, const char *name)
{
    const kl_schema_entry *e = kl_schema_find(s, name);
    ck_assert_msg(e != NULL, "schema lacks %s", name);
    return e;
}

/* Asserts rank and shape of a named tensor. */
static void assert_shape(const kl_schema *s, const char *name, int rank, uint64_t d0,
                         uint64_t d1, uint64_t d2, uint64_t d3)
{
    const kl_schema_entry *e = must_find(s, name);
    const uint64_t want[4] = {d0, d1, d2, d3};
    ck_assert_msg(e->rank == rank, "%s: rank %d, expected %d", name, e->rank, rank);
    uint64_t numel = 1;
    for (int i = 0; i < rank; i++) {
        ck_assert_msg(e->shape[i] == want[i], "%s: dim %d is %" PRIu64 ", expected %" PRIu64,
                      name, i, e->shape[i], want[i]);
        numel *= want[i];
    }
    ck_assert_msg(e->numel == numel, "%s: numel %" PRIu64 ", expected %" PRIu64, name,
                  e->numel, numel);
}

/* ---- full geometry ------------------------------------------------------------------------ */

START_TEST(schema_48b_has_20493_entries)
{
    kl_config c;
    kl_config_default_48b(&c);
    kl_schema s;
    build_ok(&s, &c);
    ck_assert_msg(s.n == 20493, "expected 20,493 tensors (kimi-linear.md §2.7), got %zu", s.n);
    size_t n = 0;
    ck_assert_int_eq(kl_schema_count(&c, &n, NULL), 0);
    ck_assert_uint_eq(n, 20493);
    kl_schema_free(&s);
}
END_TEST

START_TEST(schema_48b_role_counts)
{
    kl_config c;
    kl_config_default_48b(&c);
    kl_schema s;
    build_ok(&s, &c);
    size_t count[KL_ROLE_COUNT] = {0};
    for (size_t i = 0; i < s.n; i++)
        count[s.entries[i].role]++;
    static const struct { kl_role r; size_t n; } want[] = {
        {KL_ROLE_EMBED, 1}, {KL_ROLE_FINAL_NORM, 1}, {KL_ROLE_LM_HEAD, 1},
        {KL_ROLE_INPUT_NORM, 27}, {KL_ROLE_POST_ATTN_NORM, 27},
        {KL_ROLE_KDA_Q, 20}, {KL_ROLE_KDA_K, 20}, {KL_ROLE_KDA_V, 20},
        {KL_ROLE_KDA_Q_CONV, 20}, {KL_ROLE_KDA_K_CONV, 20}, {KL_ROLE_KDA_V_CONV, 20},
        {KL_ROLE_KDA_A_LOG, 20}, {KL_ROLE_KDA_F_A, 20}, {KL_ROLE_KDA_F_B, 20},
        {KL_ROLE_KDA_DT_BIAS, 20}, {KL_ROLE_KDA_B, 20}, {KL_ROLE_KDA_G_A, 20},
        {KL_ROLE_KDA_G_B, 20}, {KL_ROLE_KDA_O_NORM, 20}, {KL_ROLE_KDA_O, 20},
        {KL_ROLE_MLA_Q, 7}, {KL_ROLE_MLA_KV_A, 7}, {KL_ROLE_MLA_KV_A_NORM, 7},
        {KL_ROLE_MLA_KV_B, 7}, {KL_ROLE_MLA_O, 7},
        {KL_ROLE_MLP_GATE, 1}, {KL_ROLE_MLP_UP, 1}, {KL_ROLE_MLP_DOWN, 1},
        {KL_ROLE_ROUTER, 26}, {KL_ROLE_ROUTER_BIAS, 26},
        {KL_ROLE_EXPERT_W1, 6656}, {KL_ROLE_EXPERT_W2, 6656}, {KL_ROLE_EXPERT_W3, 6656},
        {KL_ROLE_SHARED_GATE, 26}, {KL_ROLE_SHARED_UP, 26}, {KL_ROLE_SHARED_DOWN, 26},
    };
    ck_assert_int_eq(sizeof want / sizeof want[0], KL_ROLE_COUNT);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(count[want[i].r] == want[i].n, "role %s: %zu entries, expected %zu",
                      kl_role_name(want[i].r), count[want[i].r], want[i].n);
    kl_schema_free(&s);
}
END_TEST

START_TEST(schema_48b_parameter_total_matches_the_reference)
{
    kl_config c;
    kl_config_default_48b(&c);
    kl_schema s;
    build_ok(&s, &c);
    uint64_t total = 0;
    for (size_t i = 0; i < s.n; i++)
        total += s.entries[i].numel;
    ck_assert_msg(total == 49122681728ull, "parameters %" PRIu64 ", expected 49,122,681,728",
                  total);
    kl_schema_free(&s);
}
END_TEST

START_TEST(schema_48b_order_is_embed_layers_sorted_then_norm_and_head)
{
    kl_config c;
    kl_config_default_48b(&c);
    kl_schema s;
    build_ok(&s, &c);
    ck_assert_str_eq(s.entries[0].name, "model.embed_tokens.weight");
    ck_assert_str_eq(s.entries[s.n - 2].name, "model.norm.weight");
    ck_assert_str_eq(s.entries[s.n - 1].name, "lm_head.weight");
    for (size_t i = 2; i < s.n - 2; i++) {
        const kl_schema_entry *a = &s.entries[i - 1], *b = &s.entries[i];
        ck_assert_msg(a->layer <= b->layer, "layer order broken at %s", b->name);
        if (a->layer == b->layer)
            ck_assert_msg(strcmp(a->name, b->name) < 0, "%s should follow %s", b->name,
                          a->name);
    }
    /* lexicographic, as a sorted listing: experts.10 before experts.2 */
    const kl_schema_entry *e10 = must_find(&s, "model.layers.1.block_sparse_moe.experts.10.w1.weight");
    const kl_schema_entry *e2 = must_find(&s, "model.layers.1.block_sparse_moe.experts.2.w1.weight");
    const kl_schema_entry *e1 = must_find(&s, "model.layers.1.block_sparse_moe.experts.1.w3.weight");
    ck_assert_msg(e1 < e10 && e10 < e2, "expected experts.1 < experts.10 < experts.2");
    /* layer 10 comes after layer 9 (layers are numeric, names within a layer are not) */
    ck_assert(must_find(&s, "model.layers.9.input_layernorm.weight") <
              must_find(&s, "model.layers.10.input_layernorm.weight"));
    kl_schema_free(&s);
}
END_TEST

/* Every layer's entries in name order, and each layer's entries together, for configs whose
 * layers come in several kinds (KDA or MLA, MoE or dense; the order found for one layer of a
 * kind is reused for the others). */
START_TEST(schema_every_layer_is_sorted_whatever_its_kind)
{
    kl_config c;
    if (_i < 2) {
        kl_config_default_48b(&c);
        if (_i == 1)
            kl_config_set_mxfp4(&c);
    } else {
        tiny_config(&c);
        c.moe_layer_freq = 2;
    }
    kl_schema s;
    build_ok(&s, &c);
    size_t per_layer[64] = {0};
    for (size_t i = 1; i < s.n; i++) {
        const kl_schema_entry *a = &s.entries[i - 1], *b = &s.entries[i];
        if (b->layer >= 0 && b->layer < 64)
            per_layer[b->layer]++;
        if (a->layer == b->layer && a->layer >= 0)
            ck_assert_msg(strcmp(a->name, b->name) < 0, "config %d: %s should follow %s", _i,
                          b->name, a->name);
        else if (a->layer >= 0 && b->layer >= 0)
            ck_assert_msg(b->layer == a->layer + 1, "config %d: layer %d after %d", _i,
                          b->layer, a->layer);
    }
    for (uint32_t l = 0; l < c.num_hidden_layers && l < 64; l++)
        ck_assert_msg(per_layer[l] > 0, "config %d: layer %u has no entries", _i, l);
    kl_schema_free(&s);
}
END_TEST

START_TEST(schema_dense_layer_accepts_both_spellings)
{
    kl_config c;
    kl_config_default_48b(&c);
    kl_schema s;
    build_ok(&s, &c);
    static const char *const proj[] = {"gate_proj", "up_proj", "down_proj"};
    static const kl_role role[] = {KL_ROLE_MLP_GATE, KL_ROLE_MLP_UP, KL_ROLE_MLP_DOWN};
    for (int i = 0; i < 3; i++) {
        char official[96], hf[96];
        snprintf(official, sizeof official, "model.layers.0.mlp.%s.weight", proj[i]);
        snprintf(hf, sizeof hf, "model.layers.0.block_sparse_moe.%s.weight", proj[i]);
        const kl_schema_entry *a = must_find(&s, official), *b = must_find(&s, hf);
        ck_assert_msg(a == b, "%s and %s must be one entry", official, hf);
        ck_assert_str_eq(a->name, official);
        ck_assert_str_eq(a->alias, hf);
        ck_assert_int_eq(a->role, role[i]);
        ck_assert_int_eq(a->layer, 0);
        ck_assert_int_eq(a->expert, -1);
    }
    assert_shape(&s, "model.layers.0.mlp.gate_proj.weight", 2, 9216, 2304, 0, 0);
    assert_shape(&s, "model.layers.0.block_sparse_moe.down_proj.weight", 2, 2304, 9216, 0, 0);
    ck_assert_ptr_null(kl_schema_find(&s, "model.layers.1.mlp.gate_proj.weight"));
    ck_assert_ptr_null(kl_schema_find(&s, "model.layers.0.block_sparse_moe.gate.weight"));
    kl_schema_free(&s);
}
END_TEST

START_TEST(schema_48b_shapes_and_dtypes)
{
    kl_config c;
    kl_config_default_48b(&c);
    kl_schema s;
    build_ok(&s, &c);
    assert_shape(&s, "model.embed_tokens.weight", 2, 163840, 2304, 0, 0);
    assert_shape(&s, "lm_head.weight", 2, 163840, 2304, 0, 0);
    assert_shape(&s, "model.norm.weight", 1, 2304, 0, 0, 0);
    assert_shape(&s, "model.layers.0.self_attn.q_proj.weight", 2, 4096, 2304, 0, 0);
    assert_shape(&s, "model.layers.0.self_attn.q_conv1d.weight", 3, 4096, 1, 4, 0);
    assert_shape(&s, "model.layers.0.self_attn.A_log", 4, 1, 1, 32, 1);
    assert_shape(&s, "model.layers.0.self_attn.dt_bias", 1, 4096, 0, 0, 0);
    assert_shape(&s, "model.layers.0.self_attn.f_a_proj.weight", 2, 128, 2304, 0, 0);
    assert_shape(&s, "model.layers.0.self_attn.f_b_proj.weight", 2, 4096, 128, 0, 0);
    assert_shape(&s, "model.layers.0.self_attn.b_proj.weight", 2, 32, 2304, 0, 0);
    assert_shape(&s, "model.layers.0.self_attn.g_b_proj.weight", 2, 4096, 128, 0, 0);
    assert_shape(&s, "model.layers.0.self_attn.o_norm.weight", 1, 128, 0, 0, 0);
    assert_shape(&s, "model.layers.0.self_attn.o_proj.weight", 2, 2304, 4096, 0, 0);
    assert_shape(&s, "model.layers.3.self_attn.q_proj.weight", 2, 6144, 2304, 0, 0);
    assert_shape(&s, "model.layers.3.self_attn.kv_a_proj_with_mqa.weight", 2, 576, 2304, 0, 0);
    assert_shape(&s, "model.layers.3.self_attn.kv_a_layernorm.weight", 1, 512, 0, 0, 0);
    assert_shape(&s, "model.layers.26.self_attn.kv_b_proj.weight", 2, 8192, 512, 0, 0);
    assert_shape(&s, "model.layers.26.self_attn.o_proj.weight", 2, 2304, 4096, 0, 0);
    assert_shape(&s, "model.layers.5.block_sparse_moe.gate.weight", 2, 256, 2304, 0, 0);
    assert_shape(&s, "model.layers.5.block_sparse_moe.gate.e_score_correction_bias", 1, 256, 0,
                 0, 0);
    assert_shape(&s, "model.layers.5.block_sparse_moe.experts.255.w1.weight", 2, 1024, 2304, 0,
                 0);
    assert_shape(&s, "model.layers.5.block_sparse_moe.experts.255.w2.weight", 2, 2304, 1024, 0,
                 0);
    assert_shape(&s, "model.layers.26.block_sparse_moe.shared_experts.down_proj.weight", 2,
                 2304, 1024, 0, 0);
    ck_assert_ptr_null(kl_schema_find(&s, "model.layers.3.self_attn.A_log"));
    ck_assert_ptr_null(kl_schema_find(&s, "model.layers.5.block_sparse_moe.experts.256.w1.weight"));
    /* every tensor accepts any float dtype; synth writes F32 only for the small fp32 params */
    for (size_t i = 0; i < s.n; i++) {
        const kl_schema_entry *e = &s.entries[i];
        ck_assert_msg(e->dtype_mask == KL_DT_MASK_FLOAT && e->part == KL_PART_WEIGHT,
                      "%s: dtype mask %#x", e->name, e->dtype_mask);
        bool f32 = e->role == KL_ROLE_KDA_A_LOG || e->role == KL_ROLE_KDA_DT_BIAS ||
                   e->role == KL_ROLE_ROUTER_BIAS;
        ck_assert_msg(e->synth_dtype == (f32 ? KL_DT_F32 : KL_DT_BF16), "%s: synth dtype %d",
                      e->name, (int)e->synth_dtype);
    }
    const kl_schema_entry *e = must_find(&s, "model.layers.7.block_sparse_moe.experts.17.w3.weight");
    ck_assert_int_eq(e->layer, 7);
    ck_assert_int_eq(e->expert, 17);
    ck_assert_int_eq(e->role, KL_ROLE_EXPERT_W3);
    kl_schema_free(&s);
}
END_TEST

/* ---- MXFP4 -------------------------------------------------------------------------------- */

START_TEST(schema_mxfp4_experts_are_packed_and_scale_pairs)
{
    kl_config c;
    kl_config_default_48b(&c);
    mxfp4(&c);
    kl_schema s;
    build_ok(&s, &c);
    ck_assert_uint_eq(s.n, 20493 + 26 * 256 * 3);
    assert_shape(&s, "model.layers.1.block_sparse_moe.experts.0.w1.weight_packed", 2, 1024, 1152,
                 0, 0);
    assert_shape(&s, "model.layers.1.block_sparse_moe.experts.0.w1.weight_scale", 2, 1024, 72,
                 0, 0);
    assert_shape(&s, "model.layers.1.block_sparse_moe.experts.0.w2.weight_packed", 2, 2304, 512,
                 0, 0);
    assert_shape(&s, "model.layers.1.block_sparse_moe.experts.0.w2.weight_scale", 2, 2304, 32,
                 0, 0);
    assert_shape(&s, "model.layers.1.block_sparse_moe.experts.0.w3.weight_scale", 2, 1024, 72,
                 0, 0);
    ck_assert_ptr_null(kl_schema_find(&s, "model.layers.1.block_sparse_moe.experts.0.w1.weight"));
    /* shared experts, router and attention stay BF16 */
    assert_shape(&s, "model.layers.1.block_sparse_moe.shared_experts.up_proj.weight", 2, 1024,
                 2304, 0, 0);
    const kl_schema_entry *p =
        must_find(&s, "model.layers.1.block_sparse_moe.experts.0.w1.weight_packed");
    const kl_schema_entry *q =
        must_find(&s, "model.layers.1.block_sparse_moe.experts.0.w1.weight_scale");
    ck_assert_int_eq(p->part, KL_PART_PACKED);
    ck_assert_int_eq(q->part, KL_PART_SCALE);
    ck_assert_uint_eq(p->dtype_mask, KL_DT_BIT(KL_DT_U8));
    ck_assert_uint_eq(q->dtype_mask, KL_DT_BIT(KL_DT_U8) | KL_DT_BIT(KL_DT_F8_E8M0));
    ck_assert_int_eq(p->synth_dtype, KL_DT_U8);
    ck_assert_int_eq(q->synth_dtype, KL_DT_U8);
    /* the six tensors of one expert are adjacent, packed before scale, w1 w2 w3 */
    static const char *const six[] = {"w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
                                      "w2.weight_scale", "w3.weight_packed", "w3.weight_scale"};
    for (int k = 0; k < 6; k++) {
        char want[128];
        snprintf(want, sizeof want, "model.layers.1.block_sparse_moe.experts.0.%s", six[k]);
        ck_assert_str_eq(p[k].name, want);
        ck_assert_int_eq(p[k].expert, 0);
    }
    kl_schema_free(&s);
}
END_TEST

START_TEST(schema_mxfp4_in_dimension_not_multiple_of_32_is_refused)
{
    kl_config c;
    tiny_config(&c);
    mxfp4(&c);
    c.moe_intermediate_size = 48;
    kl_schema s;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_schema_build(&s, &c, &err), KL_E_SCHEMA);
    ck_assert_str_eq(err.tensor, "moe_intermediate_size");
    ck_assert_ptr_null(s.entries);
    tiny_config(&c);
    mxfp4(&c);
    c.hidden_size = 80;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_schema_build(&s, &c, &err), KL_E_SCHEMA);
    ck_assert_str_eq(err.tensor, "hidden_size");
}
END_TEST

/* ---- tiny ---------------------------------------------------------------------------------- */

START_TEST(schema_tiny_preset_counts_and_shapes)
{
    kl_config c;
    tiny_config(&c);
    kl_schema s;
    build_ok(&s, &c);
    /* 3 global + 4x2 norms + 3 KDA x 15 + 1 MLA x 5 + 3 dense + 3 MoE x (2 + 8x3 + 3) */
    ck_assert_uint_eq(s.n, 3 + 8 + 45 + 5 + 3 + 3 * 29);
    assert_shape(&s, "model.embed_tokens.weight", 2, 1024, 64, 0, 0);
    assert_shape(&s, "model.layers.0.self_attn.q_proj.weight", 2, 64, 64, 0, 0);
    assert_shape(&s, "model.layers.0.self_attn.A_log", 4, 1, 1, 4, 1);
    assert_shape(&s, "model.layers.2.self_attn.dt_bias", 1, 64, 0, 0, 0);
    assert_shape(&s, "model.layers.2.self_attn.v_conv1d.weight", 3, 64, 1, 4, 0);
    assert_shape(&s, "model.layers.1.self_attn.f_a_proj.weight", 2, 16, 64, 0, 0);
    assert_shape(&s, "model.layers.3.self_attn.q_proj.weight", 2, 96, 64, 0, 0);
    assert_shape(&s, "model.layers.3.self_attn.kv_a_proj_with_mqa.weight", 2, 24, 64, 0, 0);
    assert_shape(&s, "model.layers.3.self_attn.kv_a_layernorm.weight", 1, 16, 0, 0, 0);
    assert_shape(&s, "model.layers.3.self_attn.kv_b_proj.weight", 2, 128, 16, 0, 0);
    assert_shape(&s, "model.layers.3.self_attn.o_proj.weight", 2, 64, 64, 0, 0);
    assert_shape(&s, "model.layers.0.mlp.gate_proj.weight", 2, 96, 64, 0, 0);
    assert_shape(&s, "model.layers.0.mlp.down_proj.weight", 2, 64, 96, 0, 0);
    assert_shape(&s, "model.layers.1.block_sparse_moe.gate.weight", 2, 8, 64, 0, 0);
    assert_shape(&s, "model.layers.1.block_sparse_moe.experts.7.w1.weight", 2, 32, 64, 0, 0);
    assert_shape(&s, "model.layers.3.block_sparse_moe.experts.7.w2.weight", 2, 64, 32, 0, 0);
    assert_shape(&s, "model.layers.2.block_sparse_moe.shared_experts.gate_proj.weight", 2, 32,
                 64, 0, 0);
    kl_schema_free(&s);
}
END_TEST

START_TEST(schema_tiny_parsed_from_config_json_matches)
{
    static const char text[] =
        "{\"model_type\": \"kimi_linear\", \"vocab_size\": 1024, \"hidden_size\": 64,"
        " \"intermediate_size\": 96, \"moe_intermediate_size\": 32, \"num_hidden_layers\": 4,"
        " \"num_attention_heads\": 4, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 16,"
        " \"qk_rope_head_dim\": 8, \"v_head_dim\": 16, \"num_experts\": 8,"
        " \"num_experts_per_token\": 2, \"num_shared_experts\": 1, \"first_k_dense_replace\": 1,"
        " \"linear_attn_config\": {\"head_dim\": 16, \"num_heads\": 4,"
        " \"short_conv_kernel_size\": 4, \"kda_layers\": [1, 2, 3], \"full_attn_layers\": [4]}}";
    kl_config c;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_config_parse(&c, "tiny/config.json", text, strlen(text), &err) == 0, "%s",
                  fmt_err(&err));
    kl_schema s;
    build_ok(&s, &c);
    ck_assert_uint_eq(s.n, 151);
    must_find(&s, "model.layers.3.self_attn.kv_b_proj.weight");
    must_find(&s, "model.layers.0.block_sparse_moe.up_proj.weight");
    kl_schema_free(&s);
}
END_TEST

START_TEST(schema_tied_embeddings_drop_lm_head)
{
    kl_config c;
    tiny_config(&c);
    c.tie_word_embeddings = true;
    kl_schema s;
    build_ok(&s, &c);
    ck_assert_uint_eq(s.n, 150);
    ck_assert_ptr_null(kl_schema_find(&s, "lm_head.weight"));
    ck_assert_str_eq(s.entries[s.n - 1].name, "model.norm.weight");
    kl_schema_free(&s);
}
END_TEST

START_TEST(schema_moe_layer_freq_two_gives_dense_layers_between)
{
    kl_config c;
    tiny_config(&c);
    c.moe_layer_freq = 2;
    kl_schema s;
    build_ok(&s, &c);
    must_find(&s, "model.layers.1.mlp.gate_proj.weight");
    must_find(&s, "model.layers.3.block_sparse_moe.gate_proj.weight");
    must_find(&s, "model.layers.2.block_sparse_moe.experts.0.w1.weight");
    ck_assert_ptr_null(kl_schema_find(&s, "model.layers.1.block_sparse_moe.gate.weight"));
    kl_schema_free(&s);
}
END_TEST

START_TEST(schema_no_shared_experts_means_no_shared_tensors)
{
    kl_config c;
    tiny_config(&c);
    c.num_shared_experts = 0;
    kl_schema s;
    build_ok(&s, &c);
    ck_assert_uint_eq(s.n, 151 - 3 * 3);
    ck_assert_ptr_null(
        kl_schema_find(&s, "model.layers.1.block_sparse_moe.shared_experts.up_proj.weight"));
    kl_schema_free(&s);
}
END_TEST

START_TEST(schema_shared_expert_width_scales_with_their_count)
{
    kl_config c;
    tiny_config(&c);
    c.num_shared_experts = 2;
    kl_schema s;
    build_ok(&s, &c);
    assert_shape(&s, "model.layers.1.block_sparse_moe.shared_experts.down_proj.weight", 2, 64,
                 64, 0, 0);
    kl_schema_free(&s);
}
END_TEST

/* ---- refusals and caps -------------------------------------------------------------------- */

START_TEST(schema_refuses_k3_unknown_and_q_lora)
{
    kl_config c;
    kl_schema s;
    kl_err err;
    tiny_config(&c);
    c.family = KL_FAMILY_KIMI_K3;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_schema_build(&s, &c, &err), KL_E_UNSUPPORTED);
    c.family = KL_FAMILY_UNKNOWN;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_schema_build(&s, &c, &err), KL_E_UNSUPPORTED);
    tiny_config(&c);
    c.q_lora_rank = 32;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_schema_build(&s, &c, &err), KL_E_UNSUPPORTED);
    ck_assert_str_eq(err.tensor, "q_lora_rank");
}
END_TEST

START_TEST(schema_too_many_entries_fail_cleanly_without_allocating)
{
    kl_config c;
    kl_config_default_48b(&c);
    mxfp4(&c);
    c.num_hidden_layers = KL_MAX_LAYERS;
    c.num_experts = KL_MAX_EXPERTS;  /* 256 x 4096 x 6 = 6.3 M entries */
    size_t before = kl_mem_in_use(), n = 0;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_schema_count(&c, &n, &err), KL_E_SCHEMA);
    ck_assert_str_eq(err.rule, "CFG-RANGE");
    kl_schema s;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_schema_build(&s, &c, &err), KL_E_SCHEMA);
    ck_assert_uint_eq(kl_mem_in_use(), before);
    c.num_experts = 1000000000;  /* a hand-built config past the caps */
    kl_err_clear(&err);
    ck_assert_int_eq(kl_schema_build(&s, &c, &err), KL_E_SCHEMA);
    ck_assert_str_eq(err.tensor, "num_experts");
}
END_TEST

START_TEST(schema_dimension_overflow_is_an_error)
{
    kl_config c;
    tiny_config(&c);
    c.num_attention_heads = UINT32_MAX;
    c.qk_nope_head_dim = UINT32_MAX;
    c.qk_rope_head_dim = UINT32_MAX;
    kl_schema s;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_schema_build(&s, &c, &err), KL_E_SCHEMA);
    tiny_config(&c);
    c.vocab_size = UINT32_MAX;
    c.hidden_size = UINT32_MAX;
    c.kda_num_heads = UINT32_MAX;
    c.kda_head_dim = UINT32_MAX;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_schema_build(&s, &c, &err), KL_E_SCHEMA);
    ck_assert_msg(strstr(err.tensor, "model.layers.0.") != NULL, "names the tensor: %s",
                  fmt_err(&err));
    ck_assert_ptr_null(s.entries);
}
END_TEST

START_TEST(schema_free_is_safe_on_zeroed_and_twice)
{
    kl_schema s;
    memset(&s, 0, sizeof s);
    kl_schema_free(&s);
    kl_schema_free(NULL);
    ck_assert_ptr_null(kl_schema_find(&s, "lm_head.weight"));
    kl_config c;
    tiny_config(&c);
    size_t before = kl_mem_in_use();
    build_ok(&s, &c);
    kl_schema_free(&s);
    kl_schema_free(&s);
    ck_assert_uint_eq(kl_mem_in_use(), before);
}
END_TEST

START_TEST(schema_describe_and_role_names)
{
    kl_config c;
    tiny_config(&c);
    mxfp4(&c);
    kl_schema s;
    build_ok(&s, &c);
    char buf[128];
    kl_schema_describe(must_find(&s, "model.layers.2.block_sparse_moe.experts.5.w1.weight_packed"),
                       buf, sizeof buf);
    ck_assert_str_eq(buf, "layer 2 expert 5 w1 (packed)");
    kl_schema_describe(must_find(&s, "model.layers.3.self_attn.kv_b_proj.weight"), buf,
                       sizeof buf);
    ck_assert_str_eq(buf, "layer 3 mla.kv_b");
    kl_schema_describe(must_find(&s, "lm_head.weight"), buf, sizeof buf);
    ck_assert_str_eq(buf, "global lm_head");
    for (int r = 0; r < KL_ROLE_COUNT; r++)
        ck_assert_msg(strcmp(kl_role_name((kl_role)r), "?") != 0, "role %d has no name", r);
    ck_assert_str_eq(kl_role_name(KL_ROLE_EXPERT_W1), "expert.w1");
    ck_assert_str_eq(kl_role_name((kl_role)KL_ROLE_COUNT), "?");
    ck_assert(kl_role_is_expert(KL_ROLE_EXPERT_W2));
    ck_assert(!kl_role_is_expert(KL_ROLE_SHARED_GATE));
    kl_schema_free(&s);
}
END_TEST

static Suite *schema_suite(void)
{
    Suite *s = suite_create("schema");
    TCase *tc = tcase_create("full");
    tcase_add_test(tc, schema_48b_has_20493_entries);
    tcase_add_test(tc, schema_48b_role_counts);
    tcase_add_test(tc, schema_48b_parameter_total_matches_the_reference);
    tcase_add_test(tc, schema_48b_order_is_embed_layers_sorted_then_norm_and_head);
    tcase_add_loop_test(tc, schema_every_layer_is_sorted_whatever_its_kind, 0, 3);
    tcase_add_test(tc, schema_dense_layer_accepts_both_spellings);
    tcase_add_test(tc, schema_48b_shapes_and_dtypes);
    suite_add_tcase(s, tc);

    tc = tcase_create("mxfp4");
    tcase_add_test(tc, schema_mxfp4_experts_are_packed_and_scale_pairs);
    tcase_add_test(tc, schema_mxfp4_in_dimension_not_multiple_of_32_is_refused);
    suite_add_tcase(s, tc);

    tc = tcase_create("tiny");
    tcase_add_test(tc, schema_tiny_preset_counts_and_shapes);
    tcase_add_test(tc, schema_tiny_parsed_from_config_json_matches);
    tcase_add_test(tc, schema_tied_embeddings_drop_lm_head);
    tcase_add_test(tc, schema_moe_layer_freq_two_gives_dense_layers_between);
    tcase_add_test(tc, schema_no_shared_experts_means_no_shared_tensors);
    tcase_add_test(tc, schema_shared_expert_width_scales_with_their_count);
    suite_add_tcase(s, tc);

    tc = tcase_create("limits");
    tcase_add_test(tc, schema_refuses_k3_unknown_and_q_lora);
    tcase_add_test(tc, schema_too_many_entries_fail_cleanly_without_allocating);
    tcase_add_test(tc, schema_dimension_overflow_is_an_error);
    tcase_add_test(tc, schema_free_is_safe_on_zeroed_and_twice);
    tcase_add_test(tc, schema_describe_and_role_names);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(schema_suite());
}
