/*
 * tests/test_config.c — config.json parsing: the real 48B config, transformers spellings,
 * 1-based layer lists, every error rule with the key it names, serialization round trips.
 */
#include "loader/config.h"

#include "cJSON.h"
#include "common/mem.h"
#include "testutil.h"

#include <math.h>

/* ---- fixtures ----------------------------------------------------------------------------- */

/* moonshotai/Kimi-Linear-48B-A3B-Instruct config.json, key for key (kimi-linear.md §1). */
static const char CONFIG_48B[] =
    "{\n"
    "  \"architectures\": [\"KimiLinearForCausalLM\"],\n"
    "  \"auto_map\": {\n"
    "    \"AutoConfig\": \"configuration_kimi.KimiLinearConfig\",\n"
    "    \"AutoModel\": \"modeling_kimi.KimiLinearModel\",\n"
    "    \"AutoModelForCausalLM\": \"modeling_kimi.KimiLinearForCausalLM\"\n"
    "  },\n"
    "  \"bos_token_id\": 163584,\n"
    "  \"dtype\": \"bfloat16\",\n"
    "  \"eos_token_id\": 163586,\n"
    "  \"first_k_dense_replace\": 1,\n"
    "  \"head_dim\": 72,\n"
    "  \"hidden_act\": \"silu\",\n"
    "  \"hidden_size\": 2304,\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"intermediate_size\": 9216,\n"
    "  \"kv_lora_rank\": 512,\n"
    "  \"linear_attn_config\": {\n"
    "    \"full_attn_layers\": [4, 8, 12, 16, 20, 24, 27],\n"
    "    \"head_dim\": 128,\n"
    "    \"kda_layers\": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25,"
    " 26],\n"
    "    \"num_heads\": 32,\n"
    "    \"short_conv_kernel_size\": 4\n"
    "  },\n"
    "  \"mla_use_nope\": true,\n"
    "  \"model_max_length\": 1048576,\n"
    "  \"model_type\": \"kimi_linear\",\n"
    "  \"moe_intermediate_size\": 1024,\n"
    "  \"moe_layer_freq\": 1,\n"
    "  \"moe_renormalize\": true,\n"
    "  \"moe_router_activation_func\": \"sigmoid\",\n"
    "  \"num_attention_heads\": 32,\n"
    "  \"num_expert_group\": 1,\n"
    "  \"num_experts\": 256,\n"
    "  \"num_experts_per_token\": 8,\n"
    "  \"num_hidden_layers\": 27,\n"
    "  \"num_key_value_heads\": 32,\n"
    "  \"num_nextn_predict_layers\": 0,\n"
    "  \"num_shared_experts\": 1,\n"
    "  \"pad_token_id\": 163839,\n"
    "  \"q_lora_rank\": null,\n"
    "  \"qk_nope_head_dim\": 128,\n"
    "  \"qk_rope_head_dim\": 64,\n"
    "  \"rms_norm_eps\": 1e-05,\n"
    "  \"rope_scaling\": null,\n"
    "  \"rope_theta\": 10000.0,\n"
    "  \"routed_scaling_factor\": 2.446,\n"
    "  \"tie_word_embeddings\": false,\n"
    "  \"topk_group\": 1,\n"
    "  \"transformers_version\": \"4.57.0\",\n"
    "  \"use_cache\": true,\n"
    "  \"use_grouped_topk\": true,\n"
    "  \"v_head_dim\": 128,\n"
    "  \"vocab_size\": 163840\n"
    "}\n";

/* kimi_ref.py's "tiny" preset as the release would spell it: 4 layers, MLA last (1-based 4). */
static const char CONFIG_TINY[] =
    "{\"architectures\": [\"KimiLinearForCausalLM\"], \"model_type\": \"kimi_linear\","
    " \"dtype\": \"bfloat16\", \"vocab_size\": 1024, \"hidden_size\": 64,"
    " \"intermediate_size\": 96, \"moe_intermediate_size\": 32, \"num_hidden_layers\": 4,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"q_lora_rank\": null,"
    " \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8,"
    " \"v_head_dim\": 16, \"mla_use_nope\": true, \"num_experts\": 8,"
    " \"num_experts_per_token\": 2, \"num_shared_experts\": 1, \"first_k_dense_replace\": 1,"
    " \"moe_layer_freq\": 1, \"routed_scaling_factor\": 2.446, \"bos_token_id\": 768,"
    " \"eos_token_id\": 770, \"pad_token_id\": 1023, \"tie_word_embeddings\": false,"
    " \"linear_attn_config\": {\"head_dim\": 16, \"num_heads\": 4,"
    " \"short_conv_kernel_size\": 4, \"kda_layers\": [1, 2, 3], \"full_attn_layers\": [4]}}";

/* The same model as transformers' KimiLinearConfig may write it: attribute_map aliases,
 * layer_types / mlp_layer_types instead of the 1-based lists and first_k_dense_replace,
 * the flat linear_* keys, an eos list and extra keys kl does not use. */
static const char CONFIG_TINY_HF[] =
    "{\"model_type\": \"kimi_linear\", \"torch_dtype\": \"float32\", \"vocab_size\": 1024,"
    " \"hidden_size\": 64, \"intermediate_size\": 96, \"moe_intermediate_size\": 32,"
    " \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": null,"
    " \"kv_lora_rank\": 16, \"q_lora_rank\": null, \"qk_nope_head_dim\": 16,"
    " \"qk_rope_head_dim\": 8, \"v_head_dim\": 16, \"head_dim\": 8, \"qk_head_dim\": 24,"
    " \"num_local_experts\": 8, \"num_experts\": 8, \"num_experts_per_tok\": 2,"
    " \"n_shared_experts\": 1, \"n_group\": 1, \"topk_group\": 1, \"norm_topk_prob\": true,"
    " \"max_position_embeddings\": 1048576, \"routed_scaling_factor\": 2.446,"
    " \"rms_norm_eps\": 1e-05, \"bos_token_id\": 768, \"eos_token_id\": [770, 771],"
    " \"pad_token_id\": 1023, \"tie_word_embeddings\": false, \"attention_bias\": false,"
    " \"output_router_logits\": false, \"pretraining_tp\": 1, \"dense_ffn_hidden\": 96,"
    " \"layer_types\": [\"linear_attention\", \"linear_attention\", \"linear_attention\","
    " \"full_attention\"], \"mlp_layer_types\": [\"dense\", \"sparse\", \"sparse\", \"sparse\"],"
    " \"linear_head_dim\": 16, \"linear_num_heads\": 4, \"linear_conv_kernel_dim\": 4,"
    " \"transformers_version\": \"5.17.0\"}";

#define MXFP4_QUANT                                                                          \
    "{\"quant_method\": \"compressed-tensors\", \"format\": \"mxfp4-pack-quantized\","        \
    " \"config_groups\": {\"group_0\": {\"format\": \"mxfp4-pack-quantized\","               \
    " \"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"float\","         \
    " \"strategy\": \"group\", \"group_size\": 32, \"symmetric\": true}}},"                   \
    " \"ignore\": [\"lm_head\"]}"

static int parse_text(kl_config *c, const char *text, kl_err *err)
{
    kl_err_clear(err);
    return kl_config_parse(c, "test/config.json", text, strlen(text), err);
}

static char *print_err(const kl_err *err)
{
    static char buf[1024];
    return kl_err_format(err, buf, sizeof buf);
}

/* Every field that matters, compared with the field named in the message. */
static void assert_config_eq(const kl_config *a, const kl_config *b, const char *what)
{
#define EQ(f) ck_assert_msg(a->f == b->f, "%s: field " #f " differs", what)
#define STREQ(f) ck_assert_msg(strcmp(a->f, b->f) == 0, "%s: " #f " \"%s\" vs \"%s\"", what, \
                               a->f, b->f)
    EQ(family); STREQ(model_type); STREQ(dtype);
    EQ(vocab_size); EQ(hidden_size); EQ(num_hidden_layers); EQ(intermediate_size);
    EQ(moe_intermediate_size); EQ(rms_norm_eps); EQ(tie_word_embeddings); EQ(max_position);
    EQ(bos_token_id); EQ(eos_token_id); EQ(pad_token_id);
    EQ(num_attention_heads); EQ(num_key_value_heads); EQ(q_lora_rank); EQ(kv_lora_rank);
    EQ(qk_nope_head_dim); EQ(qk_rope_head_dim); EQ(v_head_dim); EQ(mla_use_nope);
    EQ(kda_num_heads); EQ(kda_head_dim); EQ(kda_conv_kernel);
    EQ(num_experts); EQ(num_experts_per_token); EQ(num_shared_experts);
    EQ(first_k_dense_replace); EQ(moe_layer_freq); EQ(routed_scaling_factor);
    EQ(moe_renormalize); EQ(use_grouped_topk); EQ(num_expert_group); EQ(topk_group);
    STREQ(moe_router_activation_func); STREQ(hidden_act); EQ(num_nextn_predict_layers);
    EQ(quantized); STREQ(quant_method); STREQ(quant_format); EQ(quant_group_size);
    ck_assert_msg(memcmp(a->layer_attn, b->layer_attn, sizeof a->layer_attn) == 0,
                  "%s: layer kinds differ", what);
#undef EQ
#undef STREQ
}

/* ---- the real config ---------------------------------------------------------------------- */

START_TEST(config_48b_parses_to_the_builtin_default)
{
    kl_config c, d;
    kl_err err;
    int rc = parse_text(&c, CONFIG_48B, &err);
    ck_assert_msg(rc == 0, "parse: %s", print_err(&err));
    kl_config_default_48b(&d);
    assert_config_eq(&c, &d, "48B config.json vs kl_config_default_48b");
    ck_assert_int_eq(c.family, KL_FAMILY_KIMI_LINEAR);
    ck_assert_str_eq(kl_family_name(c.family), "kimi_linear");
}
END_TEST

START_TEST(config_48b_one_based_lists_map_to_zero_based_layers)
{
    kl_config c;
    kl_err err;
    ck_assert_msg(parse_text(&c, CONFIG_48B, &err) == 0, "%s", print_err(&err));
    static const uint32_t mla[] = {3, 7, 11, 15, 19, 23, 26};
    for (uint32_t i = 0, k = 0; i < 27; i++) {
        bool want_mla = k < 7 && mla[k] == i;
        k += want_mla;
        ck_assert_msg(c.layer_attn[i] == (want_mla ? KL_ATTN_MLA : KL_ATTN_KDA),
                      "layer %u (0-based): expected %s", i, want_mla ? "MLA" : "KDA");
    }
    ck_assert_uint_eq(kl_config_count_attn(&c, KL_ATTN_KDA), 20);
    ck_assert_uint_eq(kl_config_count_attn(&c, KL_ATTN_MLA), 7);
}
END_TEST

START_TEST(config_48b_layer0_is_dense_and_the_rest_moe)
{
    kl_config c;
    kl_config_default_48b(&c);
    ck_assert_msg(!kl_config_is_moe_layer(&c, 0), "layer 0 must be dense");
    for (uint32_t l = 1; l < 27; l++)
        ck_assert_msg(kl_config_is_moe_layer(&c, l), "layer %u must be MoE", l);
    ck_assert_msg(!kl_config_is_moe_layer(&c, 27), "layer 27 does not exist");
}
END_TEST

START_TEST(config_moe_layer_freq_two_alternates_dense_and_moe)
{
    kl_config c;
    kl_config_default_48b(&c);
    c.moe_layer_freq = 2;
    c.first_k_dense_replace = 1;
    for (uint32_t l = 0; l < 27; l++)
        ck_assert_msg(kl_config_is_moe_layer(&c, l) == (l >= 1 && l % 2 == 0),
                      "layer %u with first_k 1, freq 2", l);
}
END_TEST

START_TEST(config_open_reads_a_file_and_names_a_missing_one)
{
    char dir[256], path[300];
    t_mkdtemp(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    t_write(path, CONFIG_48B, strlen(CONFIG_48B));
    kl_config c;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_config_open(&c, path, &err) == 0, "open: %s", print_err(&err));
    ck_assert_uint_eq(c.num_experts, 256);
    snprintf(path, sizeof path, "%s/absent.json", dir);
    kl_err_clear(&err);
    ck_assert_int_eq(kl_config_open(&c, path, &err), KL_E_IO);
    ck_assert_str_eq(err.file, path);
    ck_assert_uint_eq(c.num_experts, 0);
    t_rmrf(dir);
}
END_TEST

/* ---- other spellings ---------------------------------------------------------------------- */

START_TEST(config_tiny_full_attn_layer_4_is_zero_based_3)
{
    kl_config c;
    kl_err err;
    ck_assert_msg(parse_text(&c, CONFIG_TINY, &err) == 0, "%s", print_err(&err));
    for (uint32_t i = 0; i < 4; i++)
        ck_assert_msg(c.layer_attn[i] == (i == 3 ? KL_ATTN_MLA : KL_ATTN_KDA), "layer %u", i);
    ck_assert_uint_eq(c.num_experts, 8);
    ck_assert_uint_eq(c.kda_head_dim, 16);
    ck_assert_uint_eq(c.q_lora_rank, 0);
}
END_TEST

START_TEST(config_transformers_spellings_give_the_same_model)
{
    kl_config hf, tiny;
    kl_err err;
    ck_assert_msg(parse_text(&hf, CONFIG_TINY_HF, &err) == 0, "hf: %s", print_err(&err));
    ck_assert_msg(parse_text(&tiny, CONFIG_TINY, &err) == 0, "tiny: %s", print_err(&err));
    ck_assert_str_eq(hf.dtype, "float32");
    ck_assert_uint_eq(hf.max_position, 1048576);
    ck_assert_int_eq(hf.eos_token_id, 770);            /* first of the list */
    ck_assert_uint_eq(hf.num_key_value_heads, 4);      /* null -> num_attention_heads */
    ck_assert_uint_eq(hf.first_k_dense_replace, 1);    /* from mlp_layer_types */
    /* align the fields the two texts legitimately differ in, then compare everything */
    snprintf(hf.dtype, sizeof hf.dtype, "%s", tiny.dtype);
    hf.max_position = tiny.max_position;
    hf.mla_use_nope = tiny.mla_use_nope;
    assert_config_eq(&hf, &tiny, "transformers spelling vs release spelling");
}
END_TEST

START_TEST(config_dtype_wins_over_a_stale_torch_dtype)
{
    /* kimi_ref.py sets "dtype" on a config transformers may have written with torch_dtype */
    char text[4096];
    snprintf(text, sizeof text, "%.*s, \"torch_dtype\": \"float32\"}",
             (int)strlen(CONFIG_TINY) - 1, CONFIG_TINY);
    kl_config c;
    kl_err err;
    ck_assert_msg(parse_text(&c, text, &err) == 0, "%s", print_err(&err));
    ck_assert_str_eq(c.dtype, "bfloat16");
}
END_TEST

START_TEST(config_mxfp4_quantization_config_selects_the_mxfp4_family)
{
    char text[4096];
    snprintf(text, sizeof text, "%.*s, \"quantization_config\": " MXFP4_QUANT "}",
             (int)strlen(CONFIG_TINY) - 1, CONFIG_TINY);
    kl_config c;
    kl_err err;
    ck_assert_msg(parse_text(&c, text, &err) == 0, "%s", print_err(&err));
    ck_assert_int_eq(c.family, KL_FAMILY_KIMI_LINEAR_MXFP4);
    ck_assert_str_eq(kl_family_name(c.family), "kimi_linear_mxfp4");
    ck_assert(c.quantized);
    ck_assert_str_eq(c.quant_method, "compressed-tensors");
    ck_assert_str_eq(c.quant_format, "mxfp4-pack-quantized");
    ck_assert_uint_eq(c.quant_group_size, 32);
}
END_TEST

START_TEST(config_mixed_precision_format_resolves_through_its_groups)
{
    char text[4096];
    snprintf(text, sizeof text, "%.*s, \"quantization_config\": {\"quant_method\": "
             "\"compressed-tensors\", \"format\": \"mixed-precision\", \"config_groups\": "
             "{\"group_0\": {\"format\": \"mxfp4-pack-quantized\", \"weights\": "
             "{\"num_bits\": 4, \"type\": \"float\", \"group_size\": 32}}}}}",
             (int)strlen(CONFIG_TINY) - 1, CONFIG_TINY);
    kl_config c;
    kl_err err;
    ck_assert_msg(parse_text(&c, text, &err) == 0, "%s", print_err(&err));
    ck_assert_int_eq(c.family, KL_FAMILY_KIMI_LINEAR_MXFP4);
}
END_TEST

START_TEST(config_kimi_k3_is_read_from_text_config_without_linear_only_keys)
{
    static const char k3[] =
        "{\"model_type\": \"kimi_k3\", \"architectures\": [\"KimiK3ForConditionalGeneration\"],"
        " \"torch_dtype\": \"bfloat16\", \"quantization_config\": {\"quant_method\":"
        " \"compressed-tensors\", \"format\": \"mxfp4-pack-quantized\", \"config_groups\": {},"
        " \"ignore\": [\"re:.*vision_tower.*\"]}, \"vision_config\": {\"depth\": 27},"
        " \"text_config\": {\"model_type\": \"kimi_linear\", \"num_hidden_layers\": 93,"
        " \"hidden_size\": 7168, \"num_attention_heads\": 96, \"q_lora_rank\": 1536,"
        " \"kv_lora_rank\": 512, \"num_experts\": 896, \"num_experts_per_token\": 16,"
        " \"num_shared_experts\": 2, \"first_k_dense_replace\": 1, \"hidden_act\": \"situ\","
        " \"vocab_size\": 163840, \"intermediate_size\": 33792,"
        " \"linear_attn_config\": {\"kda_layers\": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15,"
        " 17, 18, 19, 21, 22, 23, 25, 26, 27, 29, 30, 31, 33, 34, 35, 37, 38, 39, 41, 42, 43,"
        " 45, 46, 47, 49, 50, 51, 53, 54, 55, 57, 58, 59, 61, 62, 63, 65, 66, 67, 69, 70, 71,"
        " 73, 74, 75, 77, 78, 79, 81, 82, 83, 85, 86, 87, 89, 90, 91], \"full_attn_layers\":"
        " [4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 68, 72, 76, 80, 84,"
        " 88, 92, 93], \"head_dim\": 128, \"num_heads\": 64, \"use_full_rank_gate\": true}}}";
    kl_config c;
    kl_err err;
    ck_assert_msg(parse_text(&c, k3, &err) == 0, "%s", print_err(&err));
    ck_assert_int_eq(c.family, KL_FAMILY_KIMI_K3);
    ck_assert_str_eq(c.model_type, "kimi_k3");
    ck_assert_str_eq(c.dtype, "bfloat16");
    ck_assert_uint_eq(c.num_hidden_layers, 93);
    ck_assert_uint_eq(c.num_experts, 896);
    ck_assert_uint_eq(c.q_lora_rank, 1536);
    ck_assert_uint_eq(kl_config_count_attn(&c, KL_ATTN_MLA), 24);
    ck_assert_msg(c.layer_attn[91] == KL_ATTN_MLA && c.layer_attn[92] == KL_ATTN_MLA &&
                  c.layer_attn[90] == KL_ATTN_KDA, "K3 MLA at 0-based 91 and 92");
    ck_assert(c.quantized);
}
END_TEST

START_TEST(config_kimi_k3_with_only_a_model_type_parses)
{
    kl_config c;
    kl_err err;
    ck_assert_msg(parse_text(&c, "{\"model_type\": \"kimi_k3_uvmax\"}", &err) == 0, "%s",
                  print_err(&err));
    ck_assert_int_eq(c.family, KL_FAMILY_KIMI_K3);
}
END_TEST

START_TEST(config_q_lora_rank_is_recorded)
{
    char text[4096];
    snprintf(text, sizeof text, "%.*s, \"q_lora_rank\": 32}", (int)strlen(CONFIG_TINY) - 1,
             CONFIG_TINY);
    /* the tiny text already has "q_lora_rank": null: a duplicate key is refused ... */
    kl_config c;
    kl_err err;
    ck_assert_int_eq(parse_text(&c, text, &err), KL_E_FORMAT);
    ck_assert_str_eq(err.rule, "CFG-JSON");
    ck_assert_str_eq(err.tensor, "q_lora_rank");
    /* ... so replace it instead */
    cJSON *j = cJSON_Parse(CONFIG_TINY);
    cJSON_ReplaceItemInObject(j, "q_lora_rank", cJSON_CreateNumber(32));
    char *s = cJSON_PrintUnformatted(j);
    ck_assert_msg(parse_text(&c, s, &err) == 0, "%s", print_err(&err));
    ck_assert_uint_eq(c.q_lora_rank, 32);
    cJSON_free(s);
    cJSON_Delete(j);
}
END_TEST

/* ---- error rules -------------------------------------------------------------------------- */

/* One mutation of the tiny config and the error it must cause.  path is "key" or
 * "linear_attn_config.key"; value NULL deletes the key, otherwise it is JSON to set. */
typedef struct err_case {
    const char *path;
    const char *value;
    int         code;
    const char *rule;
    const char *key;    /* expected kl_err.tensor */
} err_case;

static const err_case ERR_CASES[] = {
    {"vocab_size", NULL, KL_E_FORMAT, "CFG-MISSING", "vocab_size"},
    {"hidden_size", NULL, KL_E_FORMAT, "CFG-MISSING", "hidden_size"},
    {"num_hidden_layers", NULL, KL_E_FORMAT, "CFG-MISSING", "num_hidden_layers"},
    {"intermediate_size", NULL, KL_E_FORMAT, "CFG-MISSING", "intermediate_size"},
    {"moe_intermediate_size", NULL, KL_E_FORMAT, "CFG-MISSING", "moe_intermediate_size"},
    {"num_attention_heads", NULL, KL_E_FORMAT, "CFG-MISSING", "num_attention_heads"},
    {"kv_lora_rank", NULL, KL_E_FORMAT, "CFG-MISSING", "kv_lora_rank"},
    {"qk_nope_head_dim", NULL, KL_E_FORMAT, "CFG-MISSING", "qk_nope_head_dim"},
    {"qk_rope_head_dim", NULL, KL_E_FORMAT, "CFG-MISSING", "qk_rope_head_dim"},
    {"v_head_dim", NULL, KL_E_FORMAT, "CFG-MISSING", "v_head_dim"},
    {"num_experts", NULL, KL_E_FORMAT, "CFG-MISSING", "num_experts"},
    {"num_experts_per_token", NULL, KL_E_FORMAT, "CFG-MISSING", "num_experts_per_token"},
    {"num_shared_experts", NULL, KL_E_FORMAT, "CFG-MISSING", "num_shared_experts"},
    {"first_k_dense_replace", NULL, KL_E_FORMAT, "CFG-MISSING", "first_k_dense_replace"},
    {"model_type", NULL, KL_E_FORMAT, "CFG-MISSING", "model_type"},
    {"vocab_size", "null", KL_E_FORMAT, "CFG-MISSING", "vocab_size"},
    {"linear_attn_config", NULL, KL_E_FORMAT, "CFG-MISSING", "linear_attn_config.head_dim"},
    {"linear_attn_config.head_dim", NULL, KL_E_FORMAT, "CFG-MISSING",
     "linear_attn_config.head_dim"},
    {"linear_attn_config.num_heads", NULL, KL_E_FORMAT, "CFG-MISSING",
     "linear_attn_config.num_heads"},
    {"linear_attn_config.short_conv_kernel_size", NULL, KL_E_FORMAT, "CFG-MISSING",
     "linear_attn_config.short_conv_kernel_size"},
    {"linear_attn_config.kda_layers", NULL, KL_E_FORMAT, "CFG-MISSING",
     "linear_attn_config.kda_layers"},
    {"linear_attn_config.full_attn_layers", NULL, KL_E_FORMAT, "CFG-MISSING",
     "linear_attn_config.full_attn_layers"},
    /* wrong types */
    {"hidden_size", "\"64\"", KL_E_FORMAT, "CFG-JSON", "hidden_size"},
    {"hidden_size", "64.5", KL_E_FORMAT, "CFG-JSON", "hidden_size"},
    {"num_experts", "[8]", KL_E_FORMAT, "CFG-JSON", "num_experts"},
    {"mla_use_nope", "\"yes\"", KL_E_FORMAT, "CFG-JSON", "mla_use_nope"},
    {"tie_word_embeddings", "0", KL_E_FORMAT, "CFG-JSON", "tie_word_embeddings"},
    {"rms_norm_eps", "\"1e-5\"", KL_E_FORMAT, "CFG-JSON", "rms_norm_eps"},
    {"hidden_act", "7", KL_E_FORMAT, "CFG-JSON", "hidden_act"},
    {"model_type", "42", KL_E_FORMAT, "CFG-JSON", "model_type"},
    {"linear_attn_config", "\"kda\"", KL_E_FORMAT, "CFG-JSON", "linear_attn_config"},
    {"linear_attn_config.kda_layers", "3", KL_E_FORMAT, "CFG-JSON",
     "linear_attn_config.kda_layers"},
    {"linear_attn_config.kda_layers", "[1, 2.5, 3]", KL_E_FORMAT, "CFG-JSON",
     "linear_attn_config.kda_layers"},
    {"linear_attn_config.head_dim", "16.0001", KL_E_FORMAT, "CFG-JSON",
     "linear_attn_config.head_dim"},
    {"eos_token_id", "\"</s>\"", KL_E_FORMAT, "CFG-JSON", "eos_token_id"},
    {"quantization_config", "[]", KL_E_FORMAT, "CFG-JSON", "quantization_config"},
    /* out of range or inconsistent */
    {"hidden_size", "0", KL_E_FORMAT, "CFG-RANGE", "hidden_size"},
    {"hidden_size", "-64", KL_E_FORMAT, "CFG-RANGE", "hidden_size"},
    {"hidden_size", "4294967296", KL_E_FORMAT, "CFG-RANGE", "hidden_size"},
    {"num_hidden_layers", "257", KL_E_FORMAT, "CFG-RANGE", "num_hidden_layers"},
    {"num_experts", "1000000000", KL_E_FORMAT, "CFG-RANGE", "num_experts"},
    {"num_experts_per_token", "9", KL_E_FORMAT, "CFG-RANGE", "num_experts_per_token"},
    {"num_experts_per_token", "0", KL_E_FORMAT, "CFG-RANGE", "num_experts_per_token"},
    {"num_local_experts", "16", KL_E_FORMAT, "CFG-RANGE", "num_experts"},
    {"num_key_value_heads", "3", KL_E_FORMAT, "CFG-RANGE", "num_key_value_heads"},
    {"kv_lora_rank", "0", KL_E_FORMAT, "CFG-RANGE", "kv_lora_rank"},
    {"first_k_dense_replace", "5", KL_E_FORMAT, "CFG-RANGE", "first_k_dense_replace"},
    {"moe_layer_freq", "0", KL_E_FORMAT, "CFG-RANGE", "moe_layer_freq"},
    {"num_expert_group", "3", KL_E_FORMAT, "CFG-RANGE", "num_expert_group"},
    {"topk_group", "2", KL_E_FORMAT, "CFG-RANGE", "topk_group"},
    {"bos_token_id", "1024", KL_E_FORMAT, "CFG-RANGE", "bos_token_id"},
    {"rms_norm_eps", "0", KL_E_FORMAT, "CFG-RANGE", "rms_norm_eps"},
    {"linear_attn_config.short_conv_kernel_size", "0", KL_E_FORMAT, "CFG-RANGE",
     "linear_attn_config.short_conv_kernel_size"},
    {"linear_attn_config.kda_layers", "[1, 2, 3, 3]", KL_E_FORMAT, "CFG-RANGE",
     "linear_attn_config.kda_layers"},
    {"linear_attn_config.full_attn_layers", "[3, 4]", KL_E_FORMAT, "CFG-RANGE",
     "linear_attn_config.full_attn_layers"},
    {"linear_attn_config.full_attn_layers", "[5]", KL_E_FORMAT, "CFG-RANGE",
     "linear_attn_config.full_attn_layers"},
    {"linear_attn_config.full_attn_layers", "[0]", KL_E_FORMAT, "CFG-RANGE",
     "linear_attn_config.full_attn_layers"},
    {"linear_attn_config.full_attn_layers", "[]", KL_E_FORMAT, "CFG-RANGE",
     "linear_attn_config.kda_layers"},
    {"mlp_layer_types", "[\"dense\", \"dense\", \"sparse\", \"sparse\"]", KL_E_FORMAT,
     "CFG-RANGE", "mlp_layer_types"},
    {"model_type", "\"kimi_linear_with_a_model_type_far_too_long_for_the_buffer\"",
     KL_E_FORMAT, "CFG-RANGE", "model_type"},
    /* family and quantization */
    {"model_type", "\"llama\"", KL_E_UNSUPPORTED, "CFG-FAMILY", "model_type"},
    {"model_type", "\"kimi_k2\"", KL_E_UNSUPPORTED, "CFG-FAMILY", "model_type"},
    {"quantization_config", "{\"quant_method\": \"fp8\"}", KL_E_UNSUPPORTED, "CFG-QUANT",
     "quantization_config.quant_method"},
    {"quantization_config", "{\"format\": \"mxfp4-pack-quantized\"}", KL_E_FORMAT,
     "CFG-MISSING", "quantization_config.quant_method"},
    {"quantization_config", "{\"quant_method\": \"compressed-tensors\", \"format\":"
     " \"nvfp4-pack-quantized\"}", KL_E_UNSUPPORTED, "CFG-QUANT", "quantization_config.format"},
    {"quantization_config", "{\"quant_method\": \"compressed-tensors\", \"format\":"
     " \"mxfp4-pack-quantized\", \"config_groups\": {\"group_0\": {\"weights\":"
     " {\"num_bits\": 4, \"type\": \"float\", \"group_size\": 16}}}}", KL_E_UNSUPPORTED,
     "CFG-QUANT", "quantization_config.config_groups"},
    {"quantization_config", "{\"quant_method\": \"compressed-tensors\", \"format\":"
     " \"mxfp4-pack-quantized\", \"config_groups\": {\"group_0\": {\"weights\":"
     " {\"num_bits\": 8, \"type\": \"float\"}}}}", KL_E_UNSUPPORTED, "CFG-QUANT",
     "quantization_config.config_groups"},
};

/* Applies one case's mutation to the tiny config and returns the JSON text (cJSON_free). */
static char *mutate(const err_case *ec)
{
    cJSON *root = cJSON_Parse(CONFIG_TINY);
    ck_assert(root != NULL);
    cJSON *obj = root;
    const char *key = ec->path;
    const char *dot = strchr(key, '.');
    if (dot) {
        char head[64];
        snprintf(head, sizeof head, "%.*s", (int)(dot - key), key);
        obj = cJSON_GetObjectItemCaseSensitive(root, head);
        key = dot + 1;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    if (ec->value) {
        cJSON *v = cJSON_Parse(ec->value);
        ck_assert_msg(v != NULL, "bad test value %s", ec->value);
        cJSON_AddItemToObject(obj, key, v);
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

START_TEST(config_error_rule_names_the_key)
{
    const err_case *ec = &ERR_CASES[_i];
    char *text = mutate(ec);
    kl_config c;
    memset(&c, 0xAB, sizeof c);
    kl_err err;
    int rc = parse_text(&c, text, &err);
    ck_assert_msg(rc == ec->code && strcmp(err.rule, ec->rule) == 0 &&
                  strcmp(err.tensor, ec->key) == 0,
                  "%s = %s: expected %d [%s] key %s, got %d: %s", ec->path,
                  ec->value ? ec->value : "(deleted)", ec->code, ec->rule, ec->key, rc,
                  print_err(&err));
    ck_assert_str_eq(err.file, "test/config.json");
    ck_assert_msg(err.msg[0] != '\0', "%s: empty message", ec->path);
    ck_assert_msg(c.num_hidden_layers == 0 && c.family == KL_FAMILY_UNKNOWN,
                  "%s: config not zeroed on failure", ec->path);
    cJSON_free(text);
}
END_TEST

START_TEST(config_rejects_text_that_is_not_a_json_object)
{
    static const char *const bad[] = {"", "{", "[1, 2]", "\"kimi\"", "null", "{\"a\": }"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kl_config c;
        kl_err err;
        int rc = parse_text(&c, bad[i], &err);
        ck_assert_msg(rc == KL_E_FORMAT && strcmp(err.rule, "CFG-JSON") == 0,
                      "input '%s': expected CFG-JSON, got %d %s", bad[i], rc, print_err(&err));
    }
}
END_TEST

START_TEST(config_infinite_number_is_out_of_range)
{
    /* cJSON reads 1e400 as infinity (and would print it as null, so this is raw text) */
    static const t_json_case inf = {"infinite real", "\"routed_scaling_factor\": 2.446",
                                    "\"routed_scaling_factor\": 1e400", 0, "CFG-RANGE"};
    size_t len;
    char *text = t_json_splice(CONFIG_TINY, &inf, &len);
    kl_config c;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_config_parse(&c, "test/config.json", text, len, &err), KL_E_FORMAT);
    ck_assert_str_eq(err.rule, "CFG-RANGE");
    ck_assert_str_eq(err.tensor, "routed_scaling_factor");
    free(text);
}
END_TEST

/* Exactly one JSON value plus whitespace, UTF-8 without BOM or NUL, integers written as
 * integers (issue 9 defect 5).  The key named is "" for errors of the text as a whole. */
#define QUANT_BITS(bits)                                                                   \
    "[4]}, \"quantization_config\": {\"quant_method\": \"compressed-tensors\", "           \
    "\"format\": \"mxfp4-pack-quantized\", \"config_groups\": {\"group_0\": {\"weights\": " \
    "{\"num_bits\": " bits ", \"type\": \"float\", \"group_size\": 32}}}}}"
static const struct strict_case {
    t_json_case c;
    const char *key;
} STRICT_CASES[] = {
    {{"garbage after the object", "[4]}}", "[4]}} x", 0, "CFG-JSON"}, ""},
    {{"a second object", "[4]}}", "[4]}}{}", 0, "CFG-JSON"}, ""},
    {{"byte-order mark", "{\"architectures\"", "\xef\xbb\xbf{\"architectures\"", 0,
      "CFG-JSON"}, ""},
    {{"NUL after the object", "[4]}}", "[4]}}\0", 6, "CFG-JSON"}, ""},
    {{"NUL inside a string", "\"bfloat16\"", "\"bfloat\0""16\"", 11, "CFG-JSON"}, ""},
    {{"invalid UTF-8 in a string", "\"bfloat16\"", "\"bfloat16\xff\"", 0, "CFG-UTF8"}, ""},
    {{"integer written 64.0", "\"hidden_size\": 64", "\"hidden_size\": 64.0", 0, "CFG-JSON"},
     "hidden_size"},
    {{"integer written 6.4e1", "\"hidden_size\": 64", "\"hidden_size\": 6.4e1", 0, "CFG-JSON"},
     "hidden_size"},
    {{"layer number written 1.0", "[1, 2, 3]", "[1.0, 2, 3]", 0, "CFG-JSON"},
     "linear_attn_config.kda_layers"},
    {{"token id written 7.68e2", "\"bos_token_id\": 768", "\"bos_token_id\": 7.68e2", 0,
      "CFG-JSON"}, "bos_token_id"},
    {{"num_bits written 4.0", "[4]}}", QUANT_BITS("4.0"), 0, "CFG-QUANT"},
     "quantization_config.config_groups"},
    {{"whitespace after the object", "[4]}}", "[4]}} \n\t\r\n", 0, NULL}, ""},
    {{"num_bits written 4", "[4]}}", QUANT_BITS("4"), 0, NULL}, ""},
    {{"integer 0 and 2^53", "\"first_k_dense_replace\": 1", "\"first_k_dense_replace\": 1,"
      " \"num_nextn_predict_layers\": 0, \"model_max_length\": 9007199254740992", 0, NULL}, ""},
};

START_TEST(config_text_is_one_strict_json_value_with_integers_as_written)
{
    const struct strict_case *sc = &STRICT_CASES[_i];
    size_t len;
    char *text = t_json_splice(CONFIG_TINY, &sc->c, &len);
    kl_config c;
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_config_parse(&c, "test/config.json", text, len, &err);
    free(text);
    t_json_case_check(&sc->c, rc, &err, sc->key);
    if (rc)
        ck_assert_str_eq(err.file, "test/config.json");
}
END_TEST

/* MXFP4 packs in-dimensions in groups of 32: both expert in-dimensions must divide. */
START_TEST(config_mxfp4_sizes_must_divide_by_the_group)
{
    static const struct { const char *key; int value; } rows[] = {
        {"hidden_size", 80}, {"moe_intermediate_size", 48}};
    for (size_t i = 0; i < 2; i++) {
        cJSON *j = cJSON_Parse(CONFIG_TINY);
        cJSON_AddItemToObject(j, "quantization_config", cJSON_Parse(MXFP4_QUANT));
        cJSON_ReplaceItemInObject(j, rows[i].key, cJSON_CreateNumber(rows[i].value));
        char *text = cJSON_PrintUnformatted(j);
        kl_config c;
        kl_err err;
        int rc = parse_text(&c, text, &err);
        ck_assert_msg(rc == KL_E_FORMAT && strcmp(err.rule, "CFG-RANGE") == 0 &&
                      strcmp(err.tensor, rows[i].key) == 0, "%s = %d: got %s", rows[i].key,
                      rows[i].value, print_err(&err));
        cJSON_free(text);
        cJSON_Delete(j);
    }
}
END_TEST

START_TEST(config_hidden_size_need_not_divide_by_the_mla_heads)
{
    cJSON *j = cJSON_Parse(CONFIG_TINY);
    cJSON_ReplaceItemInObject(j, "hidden_size", cJSON_CreateNumber(66));
    char *text = cJSON_PrintUnformatted(j);
    kl_config c;
    kl_err err;
    ck_assert_msg(parse_text(&c, text, &err) == 0, "%s", print_err(&err));
    cJSON_free(text);
    cJSON_Delete(j);
}
END_TEST

START_TEST(config_duplicate_keys_are_refused)
{
    static const char dup[] = "{\"model_type\": \"kimi_linear\", \"vocab_size\": 1,"
                              " \"vocab_size\": 2}";
    kl_config c;
    kl_err err;
    ck_assert_int_eq(parse_text(&c, dup, &err), KL_E_FORMAT);
    ck_assert_str_eq(err.rule, "CFG-JSON");
    ck_assert_str_eq(err.tensor, "vocab_size");
}
END_TEST

START_TEST(config_text_without_a_terminating_nul_is_read_by_length)
{
    /* the parser must stop at len, not at a NUL beyond it */
    size_t n = strlen(CONFIG_TINY);
    char *buf = malloc(n);
    memcpy(buf, CONFIG_TINY, n);
    kl_config c;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_config_parse(&c, "x", buf, n, &err) == 0, "%s", print_err(&err));
    kl_err_clear(&err);
    ck_assert_int_eq(kl_config_parse(&c, "x", buf, n - 1, &err), KL_E_FORMAT);
    free(buf);
}
END_TEST

/* ---- serialization ------------------------------------------------------------------------ */

static void round_trip(const kl_config *in, const char *what)
{
    char *json = NULL;
    kl_err err;
    kl_err_clear(&err);
    size_t before = kl_mem_in_use();
    ck_assert_msg(kl_config_to_json(in, &json, &err) == 0, "%s: %s", what, print_err(&err));
    kl_config out;
    ck_assert_msg(parse_text(&out, json, &err) == 0, "%s: reparse: %s\n%s", what,
                  print_err(&err), json);
    assert_config_eq(in, &out, what);
    kl_free(json);
    ck_assert_uint_eq(kl_mem_in_use(), before);
}

START_TEST(config_48b_round_trips_through_to_json)
{
    kl_config c;
    kl_config_default_48b(&c);
    round_trip(&c, "48B");
}
END_TEST

START_TEST(config_to_json_writes_official_keys_and_one_based_lists)
{
    kl_config c;
    kl_config_default_48b(&c);
    char *json = NULL;
    ck_assert_int_eq(kl_config_to_json(&c, &json, NULL), 0);
    cJSON *j = cJSON_Parse(json);
    ck_assert(j != NULL);
    static const char *const keys[] = {
        "num_experts", "num_experts_per_token", "num_shared_experts", "model_max_length",
        "dtype", "first_k_dense_replace", "moe_layer_freq", "q_lora_rank", "linear_attn_config"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        ck_assert_msg(cJSON_HasObjectItem(j, keys[i]), "to_json lacks %s", keys[i]);
    static const char *const absent[] = {"num_local_experts", "num_experts_per_tok",
                                         "n_shared_experts", "torch_dtype",
                                         "max_position_embeddings", "quantization_config"};
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++)
        ck_assert_msg(!cJSON_HasObjectItem(j, absent[i]), "to_json writes %s", absent[i]);
    const cJSON *full = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "linear_attn_config"),
                                            "full_attn_layers");
    char *s = cJSON_PrintUnformatted(full);
    ck_assert_str_eq(s, "[4,8,12,16,20,24,27]");
    cJSON_free(s);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "q_lora_rank")));
    ck_assert_msg(json[strlen(json) - 1] == '\n', "config.json ends with a newline");
    /* the official file's layout: 4-space indents, "key": value, no tabs */
    ck_assert_msg(strstr(json, "\n    \"vocab_size\": 163840") != NULL, "layout:\n%s", json);
    ck_assert_msg(strstr(json, "\"full_attn_layers\": [") != NULL, "layout:\n%s", json);
    ck_assert_msg(strchr(json, '\t') == NULL, "no tabs:\n%s", json);
    cJSON_Delete(j);
    kl_free(json);
}
END_TEST

START_TEST(config_mxfp4_round_trips_with_a_compressed_tensors_block)
{
    kl_config c;
    kl_err err;
    ck_assert_msg(parse_text(&c, CONFIG_TINY, &err) == 0, "%s", print_err(&err));
    c.family = KL_FAMILY_KIMI_LINEAR_MXFP4;
    c.quantized = true;
    snprintf(c.quant_method, sizeof c.quant_method, "compressed-tensors");
    snprintf(c.quant_format, sizeof c.quant_format, "mxfp4-pack-quantized");
    c.quant_group_size = 32;
    round_trip(&c, "tiny MXFP4");
    char *json = NULL;
    ck_assert_int_eq(kl_config_to_json(&c, &json, NULL), 0);
    cJSON *j = cJSON_Parse(json);
    const cJSON *q = cJSON_GetObjectItem(j, "quantization_config");
    ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(q, "quant_method")),
                     "compressed-tensors");
    ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(q, "format")),
                     "mxfp4-pack-quantized");
    const cJSON *w = cJSON_GetObjectItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(q, "config_groups"), "group_0"), "weights");
    ck_assert_int_eq(cJSON_GetObjectItem(w, "group_size")->valueint, 32);
    ck_assert_int_eq(cJSON_GetObjectItem(w, "num_bits")->valueint, 4);
    const cJSON *ignore = cJSON_GetObjectItem(q, "ignore");
    ck_assert_msg(cJSON_IsArray(ignore) && cJSON_GetArraySize(ignore) > 0,
                  "ignore lists the BF16 modules");
    ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetArrayItem(ignore, 0)), "lm_head");
    cJSON_Delete(j);
    kl_free(json);
}
END_TEST

START_TEST(config_transformers_spelling_round_trips_to_the_official_one)
{
    kl_config c;
    kl_err err;
    ck_assert_msg(parse_text(&c, CONFIG_TINY_HF, &err) == 0, "%s", print_err(&err));
    round_trip(&c, "tiny, transformers spelling");
}
END_TEST

START_TEST(config_family_names_are_stable)
{
    ck_assert_str_eq(kl_family_name(KL_FAMILY_UNKNOWN), "unknown");
    ck_assert_str_eq(kl_family_name(KL_FAMILY_KIMI_LINEAR), "kimi_linear");
    ck_assert_str_eq(kl_family_name(KL_FAMILY_KIMI_LINEAR_MXFP4), "kimi_linear_mxfp4");
    ck_assert_str_eq(kl_family_name(KL_FAMILY_KIMI_K3), "kimi_k3");
    ck_assert_str_eq(kl_family_name((kl_family)99), "unknown");
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("real");
    tcase_add_test(tc, config_48b_parses_to_the_builtin_default);
    tcase_add_test(tc, config_48b_one_based_lists_map_to_zero_based_layers);
    tcase_add_test(tc, config_48b_layer0_is_dense_and_the_rest_moe);
    tcase_add_test(tc, config_moe_layer_freq_two_alternates_dense_and_moe);
    tcase_add_test(tc, config_open_reads_a_file_and_names_a_missing_one);
    suite_add_tcase(s, tc);

    tc = tcase_create("spellings");
    tcase_add_test(tc, config_tiny_full_attn_layer_4_is_zero_based_3);
    tcase_add_test(tc, config_transformers_spellings_give_the_same_model);
    tcase_add_test(tc, config_dtype_wins_over_a_stale_torch_dtype);
    tcase_add_test(tc, config_mxfp4_quantization_config_selects_the_mxfp4_family);
    tcase_add_test(tc, config_mixed_precision_format_resolves_through_its_groups);
    tcase_add_test(tc, config_kimi_k3_is_read_from_text_config_without_linear_only_keys);
    tcase_add_test(tc, config_kimi_k3_with_only_a_model_type_parses);
    tcase_add_test(tc, config_q_lora_rank_is_recorded);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_add_loop_test(tc, config_error_rule_names_the_key, 0,
                        (int)(sizeof ERR_CASES / sizeof ERR_CASES[0]));
    tcase_add_test(tc, config_rejects_text_that_is_not_a_json_object);
    tcase_add_test(tc, config_duplicate_keys_are_refused);
    tcase_add_test(tc, config_infinite_number_is_out_of_range);
    tcase_add_loop_test(tc, config_text_is_one_strict_json_value_with_integers_as_written, 0,
                        (int)(sizeof STRICT_CASES / sizeof STRICT_CASES[0]));
    tcase_add_test(tc, config_mxfp4_sizes_must_divide_by_the_group);
    tcase_add_test(tc, config_hidden_size_need_not_divide_by_the_mla_heads);
    tcase_add_test(tc, config_text_without_a_terminating_nul_is_read_by_length);
    suite_add_tcase(s, tc);

    tc = tcase_create("serialize");
    tcase_add_test(tc, config_48b_round_trips_through_to_json);
    tcase_add_test(tc, config_to_json_writes_official_keys_and_one_based_lists);
    tcase_add_test(tc, config_mxfp4_round_trips_with_a_compressed_tensors_block);
    tcase_add_test(tc, config_transformers_spelling_round_trips_to_the_official_one);
    tcase_add_test(tc, config_family_names_are_stable);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(config_suite());
}
