/*
 * loader/config.h — config.json of a Kimi-Linear (or Kimi K3) checkpoint, typed.
 *
 * Accepts the official keys and the aliases transformers writes (num_local_experts,
 * num_experts_per_tok, n_shared_experts, torch_dtype, max_position_embeddings).  Layer kinds
 * come from linear_attn_config.{kda_layers,full_attn_layers}, which are 1-BASED in the file
 * (layer i, 0-based, is KDA iff i+1 is listed in kda_layers); they are stored 0-based here.
 * Family detection:
 *   KL_FAMILY_KIMI_LINEAR        model_type "kimi_linear", no quantization_config
 *   KL_FAMILY_KIMI_LINEAR_MXFP4  model_type "kimi_linear" with a compressed-tensors
 *                                quantization_config whose format is "mxfp4-pack-quantized"
 *   KL_FAMILY_KIMI_K3            model_type starting with "kimi_k3" (metadata-only audit)
 * Rule ids: CFG-JSON (not a JSON object / wrong value type), CFG-MISSING (required key absent),
 * CFG-RANGE (value out of range or inconsistent, e.g. a layer listed twice or in neither list,
 * kv_lora_rank 0, top-k > experts, hidden_size or moe_intermediate_size not divisible by the
 * MXFP4 group size), CFG-FAMILY (unknown
 * model_type), CFG-QUANT (quantization_config present but not a supported scheme).
 * Every failure names config.json (the path given) and the key in kl_err.tensor.
 * Error codes: CFG-JSON, CFG-MISSING and CFG-RANGE return KL_E_FORMAT; CFG-FAMILY and CFG-QUANT
 * return KL_E_UNSUPPORTED; an unreadable file KL_E_IO.
 *
 * Keys read (official spelling first, then the accepted aliases; "req" = required for
 * kimi_linear, otherwise the default in brackets).  Two spellings of one key that are both
 * present must agree (else CFG-RANGE).  JSON null counts as absent.  Unknown keys are ignored.
 *   model_type (req)                      vocab_size, hidden_size, num_hidden_layers (req)
 *   intermediate_size (req)               moe_intermediate_size (req)
 *   num_attention_heads (req)             num_key_value_heads [= num_attention_heads]
 *   q_lora_rank [null = 0]                kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
 *   v_head_dim (req)                      mla_use_nope [false]
 *   num_experts | num_local_experts | n_routed_experts (req)
 *   num_experts_per_token | num_experts_per_tok (req)
 *   num_shared_experts | n_shared_experts (req: the two reference code bases default it
 *                                         differently, so it is never guessed)
 *   first_k_dense_replace (req, or derived from mlp_layer_types ["dense"|"sparse", ...])
 *   moe_layer_freq [1]                    num_expert_group | n_group [1], topk_group [1]
 *   moe_renormalize | norm_topk_prob [true]  use_grouped_topk [true]
 *   routed_scaling_factor [1.0]           moe_router_activation_func ["sigmoid"]
 *   hidden_act ["silu"]                   rms_norm_eps [1e-5]   tie_word_embeddings [false]
 *   dtype | torch_dtype [""]              model_max_length | max_position_embeddings [0]
 *                                         (these two are informational: first present wins)
 *   bos_token_id, eos_token_id (int or list: the first is kept), pad_token_id [-1]
 *   num_nextn_predict_layers [0]          dense_ffn_hidden (overrides intermediate_size)
 *   linear_attn_config.head_dim | linear_head_dim (req)
 *   linear_attn_config.num_heads | linear_num_heads (req)
 *   linear_attn_config.short_conv_kernel_size | linear_conv_kernel_dim (req)
 *   linear_attn_config.kda_layers + .full_attn_layers (1-based; req, or layer_types
 *                                         ["linear_attention"|"full_attention", ...])
 *   quantization_config: quant_method, format, config_groups.*.{format, weights.{num_bits,
 *                                         type, strategy, group_size}}
 * Integers must be integral JSON numbers (2.5 -> CFG-JSON; negative or too large -> CFG-RANGE).
 * Size caps (CFG-RANGE beyond them) keep a hostile config from asking for terabytes later:
 * num_hidden_layers <= KL_MAX_LAYERS, num_experts <= KL_MAX_EXPERTS.
 * Kimi K3 (model_type "kimi_k3*"): keys are read from "text_config" when present, every key is
 * optional, and the quantization scheme is recorded but not enforced (metadata-only audit).
 * Thread safety: no shared state; parse distinct configs concurrently.
 */
#ifndef KL_LOADER_CONFIG_H
#define KL_LOADER_CONFIG_H

#include "common/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KL_MAX_LAYERS 256
#define KL_MAX_EXPERTS 4096                   /* routed experts per layer (K3 has 896) */
#define KL_CONFIG_MAX_BYTES (16u << 20)       /* larger config.json files are refused */

typedef enum kl_family {
    KL_FAMILY_UNKNOWN = 0,
    KL_FAMILY_KIMI_LINEAR,
    KL_FAMILY_KIMI_LINEAR_MXFP4,
    KL_FAMILY_KIMI_K3,
} kl_family;

typedef enum kl_attn_kind { KL_ATTN_KDA = 0, KL_ATTN_MLA = 1 } kl_attn_kind;

typedef struct kl_config {
    kl_family family;
    char      model_type[48];
    char      dtype[16];               /* "bfloat16" ... ("" if absent) */

    /* sizes */
    uint32_t  vocab_size;
    uint32_t  hidden_size;
    uint32_t  num_hidden_layers;
    uint32_t  intermediate_size;       /* dense MLP of the first_k_dense_replace layers */
    uint32_t  moe_intermediate_size;   /* each routed expert and each shared expert */
    double    rms_norm_eps;
    bool      tie_word_embeddings;
    uint64_t  max_position;            /* model_max_length or max_position_embeddings, 0: absent */
    int64_t   bos_token_id, eos_token_id, pad_token_id;  /* -1 if absent */

    /* MLA */
    uint32_t  num_attention_heads;
    uint32_t  num_key_value_heads;
    uint32_t  q_lora_rank;             /* 0 = plain q_proj (null in the file) */
    uint32_t  kv_lora_rank;
    uint32_t  qk_nope_head_dim;
    uint32_t  qk_rope_head_dim;
    uint32_t  v_head_dim;
    bool      mla_use_nope;

    /* KDA (linear_attn_config) */
    uint32_t  kda_num_heads;
    uint32_t  kda_head_dim;
    uint32_t  kda_conv_kernel;         /* short_conv_kernel_size */

    /* MoE */
    uint32_t  num_experts;
    uint32_t  num_experts_per_token;
    uint32_t  num_shared_experts;
    uint32_t  first_k_dense_replace;   /* layers [0, this) use the dense MLP */
    uint32_t  moe_layer_freq;
    double    routed_scaling_factor;
    bool      moe_renormalize;
    bool      use_grouped_topk;
    uint32_t  num_expert_group, topk_group;
    char      moe_router_activation_func[16];
    char      hidden_act[16];
    uint32_t  num_nextn_predict_layers; /* MTP layers (0 for Kimi-Linear); recorded only */

    /* per layer, 0-based */
    kl_attn_kind layer_attn[KL_MAX_LAYERS];

    /* quantization_config (compressed-tensors), if any */
    bool      quantized;
    char      quant_method[32];        /* "compressed-tensors" */
    char      quant_format[48];        /* "mxfp4-pack-quantized" */
    uint32_t  quant_group_size;        /* 32 */
} kl_config;

/* Reads and parses path (config.json).  On failure *c is zeroed. */
int kl_config_open(kl_config *c, const char *path, kl_err *err);
/* Parses JSON text; path only for messages. */
int kl_config_parse(kl_config *c, const char *path, const char *json, size_t len, kl_err *err);

/* Fills *c with the real Kimi-Linear-48B-A3B geometry (the `full` preset). */
void kl_config_default_48b(kl_config *c);

/* Serializes c as config.json text in the official layout (1-based layer lists, the official
 * key names, a quantization_config when c->quantized).  *out is kl_malloc'd; caller frees. */
int kl_config_to_json(const kl_config *c, char **out, kl_err *err);

/* Marks c as the MXFP4 family: compressed-tensors mxfp4-pack-quantized, group size 32. */
void kl_config_set_mxfp4(kl_config *c);

bool kl_config_is_moe_layer(const kl_config *c, uint32_t layer);
uint32_t kl_config_count_attn(const kl_config *c, kl_attn_kind kind);

/* Cache sizes, the one place that knows them (the engine sizes its caches with these, the audit's
 * memory plan reports them); elem_bytes is the element size the caller keeps them in (the CPU
 * engine: 4, fp32; the plan: 2, bf16).
 * Bytes one MLA layer's latent cache takes per token: kv_lora_rank + qk_rope_head_dim values
 * (the kv_a_layernorm'd latent and the shared RoPE key).  Cannot overflow: both are 32-bit. */
uint64_t kl_config_mla_token_bytes(const kl_config *c, size_t elem_bytes);
/* Bytes of one KDA layer's state per sequence on a rank holding `heads` of the KDA heads: the
 * delta-rule state heads x head_dim x head_dim plus the short-conv windows of q, k and v,
 * 3 x heads x head_dim x (short_conv_kernel_size - 1).  0, or KL_E_FORMAT if it overflows. */
int kl_config_kda_state_bytes(const kl_config *c, uint64_t heads, size_t elem_bytes,
                              uint64_t *out);
const char *kl_family_name(kl_family f);

#endif
