/*
 * loader/config.c — config.json -> kl_config (see config.h for the contract and key list).
 *
 * Divisions, in order:
 *   1. includes and constants
 *   2. error helper and key lookup (aliases, duplicates)
 *   3. typed value readers (integer, bool, string, double, token id)
 *   4. sections: sizes/MLA/MoE table, linear_attn_config, layer kinds, MLP kinds,
 *      quantization_config, family
 *   5. consistency checks
 *   6. public API (header order)
 *   7. serialization (kl_config_to_json)
 * Keep new code in its division.
 */

/* ---- 1. includes and constants ------------------------------------------------------------ */

#include "loader/config.h"

#include "common/checked.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/mem.h"
#include "common/strmap.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MXFP4_FORMAT "mxfp4-pack-quantized"
#define CT_METHOD "compressed-tensors"
#define MXFP4_GROUP 32

/* Largest integer a JSON number (an IEEE double) holds exactly. */
#define JSON_INT_MAX 9007199254740992.0

/* ---- 2. error helper and key lookup ------------------------------------------------------- */

/* What every reader needs to report an error: the file, the key scope, the mode. */
typedef struct parser {
    const char *path;     /* config.json path, for kl_err.file */
    const char *scope;    /* key prefix: "", "text_config.", "linear_attn_config.", ... */
    bool        lenient;  /* Kimi K3: an absent key is not an error */
    kl_err     *err;
} parser;

/* Records rule + message and the context: the path, and the key with its scope (the message
 * may use the short key; the rendered error shows the scoped one).  Returns code. */
static int cfg_fail(const parser *p, int code, const char *rule, const char *key,
                    const char *fmt, ...) KL_PRINTF(5, 6);

static int cfg_fail(const parser *p, int code, const char *rule, const char *key,
                    const char *fmt, ...)
{
    char msg[256], full[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "%s%s", p->scope, key);
    kl_fail_rule(p->err, code, rule, "%s", msg);
    kl_err_context(p->err, p->path, full, KL_NO_OFFSET, NULL);
    return code;
}

#define FAIL_JSON(p, key, ...) cfg_fail((p), KL_E_FORMAT, "CFG-JSON", (key), __VA_ARGS__)
#define FAIL_MISSING(p, key, ...) cfg_fail((p), KL_E_FORMAT, "CFG-MISSING", (key), __VA_ARGS__)
#define FAIL_RANGE(p, key, ...) cfg_fail((p), KL_E_FORMAT, "CFG-RANGE", (key), __VA_ARGS__)

/* Python's json keeps the last of two equal keys, cJSON the first: refuse the ambiguity.
 * A hash map keeps this linear, since fuzzed objects can hold many keys. */
static int check_unique_keys(const parser *p, const cJSON *obj)
{
    size_t n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, obj) n++;
    kl_strmap seen;
    if (kl_strmap_init(&seen, n))
        return kl_fail(p->err, KL_E_NOMEM, "out of memory checking config keys");
    int rc = 0;
    cJSON_ArrayForEach(it, obj) {
        int put = kl_strmap_put(&seen, it->string ? it->string : "", 0, NULL);
        if (put < 0) {
            rc = kl_fail(p->err, KL_E_NOMEM, "out of memory checking config keys");
            break;
        }
        if (put == 1) {
            rc = FAIL_JSON(p, it->string ? it->string : "", "key \"%s\" appears twice",
                           it->string ? it->string : "");
            break;
        }
    }
    kl_strmap_free(&seen);
    return rc;
}

/* Finds the first non-null spelling of a key (names: official first, NULL-terminated).
 * *item is NULL when every spelling is absent or null.  Two spellings with different values
 * are CFG-RANGE, named by the official spelling. */
static int lookup(const parser *p, const cJSON *obj, const char *const *names,
                  const cJSON **item)
{
    *item = NULL;
    const char *first = NULL;
    for (size_t i = 0; names[i]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, names[i]);
        if (!v || cJSON_IsNull(v))
            continue;
        if (!*item) {
            *item = v;
            first = names[i];
        } else if (!cJSON_Compare(*item, v, true)) {
            return FAIL_RANGE(p, names[0], "%s and %s disagree", first, names[i]);
        }
    }
    return 0;
}

/* obj[key] unless obj is NULL or the value is absent or null. */
static const cJSON *present(const cJSON *obj, const char *key)
{
    const cJSON *v = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* "a (or b, c)" for CFG-MISSING messages. */
static void spellings(const char *const *names, char *buf, size_t n)
{
    size_t used = (size_t)snprintf(buf, n, "%s", names[0]);
    for (size_t i = 1; names[i] && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s", i == 1 ? " (or " : ", ",
                                 names[i]);
    if (names[1] && used < n)
        snprintf(buf + used, n - used, ")");
}

/* ---- 3. typed value readers --------------------------------------------------------------- */

/* A JSON integer in [lo, hi], written as one (64.0 and 6.4e1 are not); key names the value in
 * errors.  Not a number or not an integer is CFG-JSON, out of range CFG-RANGE. */
static int as_uint(const parser *p, const cJSON *v, const char *key, uint64_t lo, uint64_t hi,
                   uint64_t *out)
{
    uint64_t u = 0;
    kl_json_int r = kl_json_get_u64(v, hi, &u);
    if (r == KL_JSON_INT_NOT_NUMBER)
        return FAIL_JSON(p, key, "%s must be a number", key);
    if (r == KL_JSON_INT_NOT_INTEGER)
        return FAIL_JSON(p, key, "%s must be an integer, got %.32s", key,
                         kl_json_number_text(v) ? kl_json_number_text(v) : "a fraction");
    if (r != KL_JSON_INT_OK || u < lo)
        return FAIL_RANGE(p, key, "%s = %.32s outside [%llu, %llu]", key,
                          kl_json_number_text(v) ? kl_json_number_text(v) : "?",
                          (unsigned long long)lo, (unsigned long long)hi);
    *out = u;
    return 0;
}

/* Reads an optional or required unsigned key with aliases into *out. */
static int read_uint(const parser *p, const cJSON *obj, const char *const *names,
                     bool required, uint64_t def, uint64_t lo, uint64_t hi, uint64_t *out)
{
    const cJSON *v;
    int rc = lookup(p, obj, names, &v);
    if (rc)
        return rc;
    if (!v) {
        if (required && !p->lenient) {
            char all[160];
            spellings(names, all, sizeof all);
            return FAIL_MISSING(p, names[0], "missing required key %s", all);
        }
        *out = def;
        return 0;
    }
    return as_uint(p, v, names[0], lo, hi, out);
}

static int read_bool(const parser *p, const cJSON *obj, const char *const *names, bool def,
                     bool *out)
{
    const cJSON *v;
    int rc = lookup(p, obj, names, &v);
    if (rc)
        return rc;
    if (!v) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v))
        return FAIL_JSON(p, names[0], "%s must be true or false", names[0]);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* A string key copied into out (size n); too long is CFG-RANGE. */
static int read_str(const parser *p, const cJSON *obj, const char *const *names,
                    const char *def, char *out, size_t n)
{
    const cJSON *v;
    int rc = lookup(p, obj, names, &v);
    if (rc)
        return rc;
    if (!v) {
        snprintf(out, n, "%s", def);
        return 0;
    }
    if (!cJSON_IsString(v))
        return FAIL_JSON(p, names[0], "%s must be a string", names[0]);
    if (strlen(v->valuestring) >= n)
        return FAIL_RANGE(p, names[0], "%s is longer than %zu bytes", names[0], n - 1);
    snprintf(out, n, "%s", v->valuestring);
    return 0;
}

/* A finite double in (0, hi]. */
static int read_pos_double(const parser *p, const cJSON *obj, const char *const *names,
                           double def, double hi, double *out)
{
    const cJSON *v;
    int rc = lookup(p, obj, names, &v);
    if (rc)
        return rc;
    if (!v) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v))
        return FAIL_JSON(p, names[0], "%s must be a number", names[0]);
    if (!isfinite(v->valuedouble) || v->valuedouble <= 0 || v->valuedouble > hi)
        return FAIL_RANGE(p, names[0], "%s = %g outside (0, %g]", names[0], v->valuedouble, hi);
    *out = v->valuedouble;
    return 0;
}

/* A token id: absent/null -> -1; an integer; or a list of integers (transformers allows a list
 * of eos ids), of which the first is kept. */
static int read_token(const parser *p, const cJSON *obj, const char *key, int64_t *out)
{
    const char *const names[] = {key, NULL};
    const cJSON *v;
    int rc = lookup(p, obj, names, &v);
    if (rc)
        return rc;
    *out = -1;
    if (v && cJSON_IsArray(v)) {
        const cJSON *el;
        cJSON_ArrayForEach(el, v) {
            uint64_t id;
            if ((rc = as_uint(p, el, key, 0, INT32_MAX, &id)))
                return rc;
            if (*out < 0)
                *out = (int64_t)id;
        }
        return 0;
    }
    if (!v)
        return 0;
    uint64_t id;
    if ((rc = as_uint(p, v, key, 0, INT32_MAX, &id)))
        return rc;
    *out = (int64_t)id;
    return 0;
}

/* ---- 4. sections -------------------------------------------------------------------------- */

#define NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Unsigned keys of the top level, table-driven: official spelling first, then aliases. */
typedef struct uint_key {
    const char *const *names;
    size_t   off;       /* offsetof(kl_config, field), a uint32_t */
    bool     required;  /* absent -> CFG-MISSING (kimi_linear only) */
    uint32_t def;       /* value when absent and not required */
    uint32_t min;       /* smallest valid value; zero sizes are CFG-RANGE */
    uint32_t max;
} uint_key;

#define OFF(f) offsetof(kl_config, f)
static const uint_key UINT_KEYS[] = {
    {NAMES("vocab_size"), OFF(vocab_size), true, 0, 1, UINT32_MAX},
    {NAMES("hidden_size"), OFF(hidden_size), true, 0, 1, UINT32_MAX},
    {NAMES("num_hidden_layers"), OFF(num_hidden_layers), true, 0, 1, KL_MAX_LAYERS},
    {NAMES("intermediate_size"), OFF(intermediate_size), true, 0, 1, UINT32_MAX},
    {NAMES("moe_intermediate_size"), OFF(moe_intermediate_size), true, 0, 1, UINT32_MAX},
    {NAMES("num_attention_heads"), OFF(num_attention_heads), true, 0, 1, UINT32_MAX},
    {NAMES("kv_lora_rank"), OFF(kv_lora_rank), true, 0, 1, UINT32_MAX},
    {NAMES("qk_nope_head_dim"), OFF(qk_nope_head_dim), true, 0, 1, UINT32_MAX},
    /* a NoPE-only MLA may drop the rope slice entirely */
    {NAMES("qk_rope_head_dim"), OFF(qk_rope_head_dim), true, 0, 0, UINT32_MAX},
    {NAMES("v_head_dim"), OFF(v_head_dim), true, 0, 1, UINT32_MAX},
    {NAMES("q_lora_rank"), OFF(q_lora_rank), false, 0, 0, UINT32_MAX},
    {NAMES("num_experts", "num_local_experts", "n_routed_experts"), OFF(num_experts), true, 0,
     1, KL_MAX_EXPERTS},
    {NAMES("num_experts_per_token", "num_experts_per_tok"), OFF(num_experts_per_token), true,
     0, 1, KL_MAX_EXPERTS},
    {NAMES("num_shared_experts", "n_shared_experts"), OFF(num_shared_experts), true, 0, 0,
     KL_MAX_EXPERTS},
    {NAMES("moe_layer_freq"), OFF(moe_layer_freq), false, 1, 1, KL_MAX_LAYERS},
    {NAMES("num_expert_group", "n_group"), OFF(num_expert_group), false, 1, 1, KL_MAX_EXPERTS},
    {NAMES("topk_group"), OFF(topk_group), false, 1, 1, KL_MAX_EXPERTS},
    {NAMES("num_nextn_predict_layers"), OFF(num_nextn_predict_layers), false, 0, 0,
     KL_MAX_LAYERS},
};

static int parse_uint_keys(const parser *p, const cJSON *root, kl_config *c)
{
    for (size_t i = 0; i < sizeof UINT_KEYS / sizeof UINT_KEYS[0]; i++) {
        const uint_key *k = &UINT_KEYS[i];
        uint64_t v;
        int rc = read_uint(p, root, k->names, k->required, k->def, k->min, k->max, &v);
        if (rc)
            return rc;
        *(uint32_t *)((char *)c + k->off) = (uint32_t)v;
    }
    /* num_key_value_heads defaults to the head count (MLA in expanded form is plain MHA);
     * dense_ffn_hidden, when set, is what transformers uses for the dense layers. */
    uint64_t v;
    int rc = read_uint(p, root, NAMES("num_key_value_heads"), false, c->num_attention_heads,
                       1, UINT32_MAX, &v);
    if (rc)
        return rc;
    c->num_key_value_heads = (uint32_t)v;
    if ((rc = read_uint(p, root, NAMES("dense_ffn_hidden"), false, c->intermediate_size, 1,
                        UINT32_MAX, &v)))
        return rc;
    c->intermediate_size = (uint32_t)v;
    /* informational only: the first spelling present wins, no agreement check */
    if ((rc = read_uint(p, root, NAMES("model_max_length"), false, 0, 0,
                        (uint64_t)JSON_INT_MAX, &v)))
        return rc;
    if (!v && (rc = read_uint(p, root, NAMES("max_position_embeddings"), false, 0, 0,
                              (uint64_t)JSON_INT_MAX, &v)))
        return rc;
    c->max_position = v;
    return 0;
}

static int parse_misc_keys(const parser *p, const cJSON *root, kl_config *c)
{
    int rc;
    if ((rc = read_bool(p, root, NAMES("mla_use_nope"), false, &c->mla_use_nope)) ||
        (rc = read_bool(p, root, NAMES("tie_word_embeddings"), false,
                        &c->tie_word_embeddings)) ||
        (rc = read_bool(p, root, NAMES("moe_renormalize", "norm_topk_prob"), true,
                        &c->moe_renormalize)) ||
        (rc = read_bool(p, root, NAMES("use_grouped_topk"), true, &c->use_grouped_topk)) ||
        (rc = read_pos_double(p, root, NAMES("rms_norm_eps"), 1e-5, 1.0, &c->rms_norm_eps)) ||
        (rc = read_pos_double(p, root, NAMES("routed_scaling_factor"), 1.0, 1e6,
                              &c->routed_scaling_factor)) ||
        (rc = read_str(p, root, NAMES("hidden_act"), "silu", c->hidden_act,
                       sizeof c->hidden_act)) ||
        (rc = read_str(p, root, NAMES("moe_router_activation_func"), "sigmoid",
                       c->moe_router_activation_func, sizeof c->moe_router_activation_func)) ||
        (rc = read_token(p, root, "bos_token_id", &c->bos_token_id)) ||
        (rc = read_token(p, root, "eos_token_id", &c->eos_token_id)) ||
        (rc = read_token(p, root, "pad_token_id", &c->pad_token_id)))
        return rc;
    return 0;
}

/* One 1-based layer list: every index in [1, L] and not seen before (in either list). */
static int mark_layers(const parser *p, const cJSON *list, const char *key, kl_attn_kind kind,
                       kl_config *c, uint8_t *seen)
{
    if (!cJSON_IsArray(list))
        return FAIL_JSON(p, key, "%s must be a list of 1-based layer numbers", key);
    const cJSON *el;
    cJSON_ArrayForEach(el, list) {
        uint64_t one_based;
        int rc = as_uint(p, el, key, 1, c->num_hidden_layers, &one_based);
        if (rc)
            return rc;
        if (seen[one_based - 1])
            return FAIL_RANGE(p, key, "layer %llu (1-based) is listed twice",
                              (unsigned long long)one_based);
        seen[one_based - 1] = 1;
        c->layer_attn[one_based - 1] = kind;
    }
    return 0;
}

/* transformers' spelling of the same information: layer_types[i] for 0-based layer i. */
static int layers_from_types(const parser *p, const cJSON *types, kl_config *c, uint8_t *seen)
{
    if (!cJSON_IsArray(types))
        return FAIL_JSON(p, "layer_types", "layer_types must be a list of strings");
    if ((uint32_t)cJSON_GetArraySize(types) != c->num_hidden_layers)
        return FAIL_RANGE(p, "layer_types", "layer_types has %d entries for %u layers",
                          cJSON_GetArraySize(types), c->num_hidden_layers);
    uint32_t i = 0;
    const cJSON *el;
    cJSON_ArrayForEach(el, types) {
        const char *s = cJSON_GetStringValue(el);
        if (!s)
            return FAIL_JSON(p, "layer_types", "layer_types[%u] must be a string", i);
        if (strcmp(s, "linear_attention") == 0)
            c->layer_attn[i] = KL_ATTN_KDA;
        else if (strcmp(s, "full_attention") == 0)
            c->layer_attn[i] = KL_ATTN_MLA;
        else
            return FAIL_RANGE(p, "layer_types", "layer_types[%u] = \"%s\" is neither "
                              "linear_attention nor full_attention", i, s);
        seen[i++] = 1;
    }
    return 0;
}

/* Layer kinds from linear_attn_config.{kda_layers,full_attn_layers} (1-based), or from
 * layer_types; every layer must be covered exactly once. */
static int parse_layer_kinds(const parser *p, const parser *lp, const cJSON *root,
                             const cJSON *lac, kl_config *c)
{
    uint8_t seen[KL_MAX_LAYERS] = {0};
    const cJSON *kda = present(lac, "kda_layers");
    const cJSON *full = present(lac, "full_attn_layers");
    const cJSON *types = present(root, "layer_types");
    int rc;
    if (p->lenient && c->num_hidden_layers == 0)
        return 0;  /* K3 without a layer count: nothing to check the lists against */
    if (kda && full) {
        if ((rc = mark_layers(lp, kda, "kda_layers", KL_ATTN_KDA, c, seen)) ||
            (rc = mark_layers(lp, full, "full_attn_layers", KL_ATTN_MLA, c, seen)))
            return rc;
    } else if (types) {
        if ((rc = layers_from_types(p, types, c, seen)))
            return rc;
    } else if (p->lenient) {
        return 0;
    } else {
        return FAIL_MISSING(lp, kda ? "full_attn_layers" : "kda_layers",
                            "missing %s (1-based layer list; or top-level layer_types)",
                            kda ? "full_attn_layers" : "kda_layers");
    }
    for (uint32_t i = 0; i < c->num_hidden_layers; i++)
        if (!seen[i])
            return FAIL_RANGE(lp, "kda_layers", "layer %u (1-based) is in neither kda_layers "
                              "nor full_attn_layers", i + 1);
    return 0;
}

/* linear_attn_config: the KDA geometry and the layer kinds.  The top-level linear_* keys that
 * transformers writes are accepted when the nested object lacks a value. */
static int parse_linear_attn(const parser *p, const cJSON *root, kl_config *c)
{
    const cJSON *lac = present(root, "linear_attn_config");
    if (lac && !cJSON_IsObject(lac))
        return FAIL_JSON(p, "linear_attn_config", "linear_attn_config must be an object");
    parser lp = *p;
    lp.scope = p->scope[0] ? "text_config.linear_attn_config." : "linear_attn_config.";
    int rc;
    if (lac && (rc = check_unique_keys(&lp, lac)))
        return rc;
    static const struct { const char *nested, *top; size_t off; } keys[] = {
        {"head_dim", "linear_head_dim", OFF(kda_head_dim)},
        {"num_heads", "linear_num_heads", OFF(kda_num_heads)},
        {"short_conv_kernel_size", "linear_conv_kernel_dim", OFF(kda_conv_kernel)},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const char *const nested[] = {keys[i].nested, NULL};
        const char *const top[] = {keys[i].top, NULL};
        const cJSON *v = NULL;
        if (lac && (rc = lookup(&lp, lac, nested, &v)))
            return rc;
        uint64_t val = 0;
        if (v)
            rc = as_uint(&lp, v, keys[i].nested, 1, UINT32_MAX, &val);
        else
            rc = read_uint(&lp, root, top, false, 0, 1, UINT32_MAX, &val);
        if (rc)
            return rc;
        if (!v && val == 0 && !p->lenient)
            return FAIL_MISSING(&lp, keys[i].nested, "missing required key %s",
                                keys[i].nested);
        *(uint32_t *)((char *)c + keys[i].off) = (uint32_t)val;
    }
    return parse_layer_kinds(p, &lp, root, lac, c);
}

/* first_k_dense_replace, or the leading "dense" run of mlp_layer_types; when both exist,
 * mlp_layer_types must agree with first_k_dense_replace and moe_layer_freq. */
static int parse_mlp_kinds(const parser *p, const cJSON *root, kl_config *c)
{
    const cJSON *types = present(root, "mlp_layer_types");
    if (types && !cJSON_IsArray(types))
        return FAIL_JSON(p, "mlp_layer_types", "mlp_layer_types must be a list of strings");
    uint64_t first_k = 0;
    uint64_t max_k = c->num_hidden_layers ? c->num_hidden_layers : KL_MAX_LAYERS;
    int rc = read_uint(p, root, NAMES("first_k_dense_replace"), !types, 0, 0, max_k, &first_k);
    if (rc)
        return rc;
    if (!types) {
        c->first_k_dense_replace = (uint32_t)first_k;
        return 0;
    }
    if (!present(root, "first_k_dense_replace")) {
        const cJSON *el;
        first_k = 0;
        cJSON_ArrayForEach(el, types) {
            const char *s = cJSON_GetStringValue(el);
            if (!s || strcmp(s, "dense") != 0)
                break;
            first_k++;
        }
    }
    c->first_k_dense_replace = (uint32_t)first_k;
    if (p->lenient && c->num_hidden_layers == 0)
        return 0;
    if ((uint32_t)cJSON_GetArraySize(types) != c->num_hidden_layers)
        return FAIL_RANGE(p, "mlp_layer_types", "mlp_layer_types has %d entries for %u layers",
                          cJSON_GetArraySize(types), c->num_hidden_layers);
    uint32_t i = 0;
    const cJSON *el;
    cJSON_ArrayForEach(el, types) {
        const char *s = cJSON_GetStringValue(el);
        const char *want = kl_config_is_moe_layer(c, i) ? "sparse" : "dense";
        if (!s || strcmp(s, want) != 0)
            return FAIL_RANGE(p, "mlp_layer_types", "mlp_layer_types[%u] should be \"%s\" "
                              "(first_k_dense_replace %u, moe_layer_freq %u)", i, want,
                              c->first_k_dense_replace, c->moe_layer_freq);
        i++;
    }
    return 0;
}

/* The format every config group declares, or NULL if they differ / none declares one;
 * also checks each group's weight arguments against MXFP4 (4-bit float, group 32). */
static int quant_groups(const parser *p, const cJSON *groups, const char **format,
                        uint32_t *group_size)
{
    *format = NULL;
    bool mixed = false;
    const cJSON *g;
    cJSON_ArrayForEach(g, groups) {
        if (!cJSON_IsObject(g))
            return FAIL_JSON(p, "config_groups", "config_groups.%s must be an object",
                             g->string ? g->string : "?");
        const char *f = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(g, "format"));
        if (f && *format && strcmp(f, *format) != 0)
            mixed = true;
        if (f && !*format)
            *format = f;
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(g, "weights");
        if (!cJSON_IsObject(w))
            continue;
        const cJSON *bits = cJSON_GetObjectItemCaseSensitive(w, "num_bits");
        const cJSON *gs = cJSON_GetObjectItemCaseSensitive(w, "group_size");
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(w, "type"));
        uint64_t u = 0;
        if ((bits && (kl_json_get_u64(bits, 4, &u) || u != 4)) ||
            (type && strcmp(type, "float") != 0))
            return cfg_fail(p, KL_E_UNSUPPORTED, "CFG-QUANT", "config_groups",
                            "config group %s is not 4-bit float weights",
                            g->string ? g->string : "?");
        if (gs && !cJSON_IsNull(gs)) {
            if (kl_json_get_u64(gs, MXFP4_GROUP, &u) || u != MXFP4_GROUP)
                return cfg_fail(p, KL_E_UNSUPPORTED, "CFG-QUANT", "config_groups",
                                "config group %s: group_size must be %d for MXFP4",
                                g->string ? g->string : "?", MXFP4_GROUP);
            *group_size = MXFP4_GROUP;
        }
    }
    if (mixed)
        *format = NULL;
    return 0;
}

/* quantization_config: only compressed-tensors with MXFP4 packing is supported; K3's scheme
 * is recorded without being enforced. */
static int parse_quant(const parser *p, const cJSON *q, bool enforce, kl_config *c)
{
    parser qp = *p;
    qp.scope = "quantization_config.";
    if (!cJSON_IsObject(q))
        return FAIL_JSON(p, "quantization_config", "quantization_config must be an object");
    int rc;
    if ((rc = read_str(&qp, q, NAMES("quant_method"), "", c->quant_method,
                       sizeof c->quant_method)) ||
        (rc = read_str(&qp, q, NAMES("format"), "", c->quant_format, sizeof c->quant_format)))
        return rc;
    c->quantized = true;
    c->quant_group_size = MXFP4_GROUP;
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(q, "config_groups");
    const char *gformat = NULL;
    if (groups && !cJSON_IsNull(groups)) {
        if (!cJSON_IsObject(groups))
            return FAIL_JSON(&qp, "config_groups", "config_groups must be an object");
        if (enforce && (rc = quant_groups(&qp, groups, &gformat, &c->quant_group_size)))
            return rc;
    }
    /* "mixed-precision" or no top-level format: the groups decide */
    if ((!c->quant_format[0] || strcmp(c->quant_format, "mixed-precision") == 0) && gformat)
        snprintf(c->quant_format, sizeof c->quant_format, "%s", gformat);
    if (!enforce)
        return 0;
    if (!c->quant_method[0])
        return FAIL_MISSING(&qp, "quant_method", "missing required key quant_method");
    if (strcmp(c->quant_method, CT_METHOD) != 0)
        return cfg_fail(&qp, KL_E_UNSUPPORTED, "CFG-QUANT", "quant_method",
                        "quant_method \"%s\" is not supported (only " CT_METHOD ")",
                        c->quant_method);
    if (strcmp(c->quant_format, MXFP4_FORMAT) != 0)
        return cfg_fail(&qp, KL_E_UNSUPPORTED, "CFG-QUANT", "format",
                        "format \"%s\" is not supported (only " MXFP4_FORMAT ")",
                        c->quant_format);
    return 0;
}

/* "dtype" (the newer name) wins over "torch_dtype": kimi_ref.py sets dtype on a config that
 * transformers may have written with a stale torch_dtype, so a disagreement is not an error. */
static int parse_dtype(const parser *p, const cJSON *root, kl_config *c)
{
    int rc = read_str(p, root, NAMES("dtype"), "", c->dtype, sizeof c->dtype);
    if (!rc && !c->dtype[0])
        rc = read_str(p, root, NAMES("torch_dtype"), "", c->dtype, sizeof c->dtype);
    return rc;
}

/* model_type -> family; K3 reads its text tower from text_config. */
static int parse_family(const parser *p, const cJSON *top, kl_config *c, const cJSON **root)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(top, "model_type");
    if (!mt || cJSON_IsNull(mt))
        return FAIL_MISSING(p, "model_type", "missing required key model_type");
    int rc = read_str(p, top, NAMES("model_type"), "", c->model_type, sizeof c->model_type);
    if (rc)
        return rc;
    *root = top;
    if (strcmp(c->model_type, "kimi_linear") == 0) {
        c->family = KL_FAMILY_KIMI_LINEAR;
        return 0;
    }
    if (strncmp(c->model_type, "kimi_k3", 7) == 0) {
        c->family = KL_FAMILY_KIMI_K3;
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(top, "text_config");
        if (tc && !cJSON_IsNull(tc) && !cJSON_IsObject(tc))
            return FAIL_JSON(p, "text_config", "text_config must be an object");
        if (tc && cJSON_IsObject(tc))
            *root = tc;
        return 0;
    }
    return cfg_fail(p, KL_E_UNSUPPORTED, "CFG-FAMILY", "model_type",
                    "model_type \"%s\" is not supported (kimi_linear, kimi_k3*)",
                    c->model_type);
}

/* ---- 5. consistency checks ---------------------------------------------------------------- */

static int check_token(const parser *p, const char *key, int64_t id, uint32_t vocab)
{
    if (id >= 0 && vocab && (uint64_t)id >= vocab)
        return FAIL_RANGE(p, key, "%s %lld is not below vocab_size %u", key, (long long)id,
                          vocab);
    return 0;
}

/* Cross-key rules; zero values are skipped so K3's optional keys can stay absent. */
static int check_consistency(const parser *p, const kl_config *c)
{
    if (c->num_experts && c->num_experts_per_token > c->num_experts)
        return FAIL_RANGE(p, "num_experts_per_token", "top-k %u exceeds num_experts %u",
                          c->num_experts_per_token, c->num_experts);
    if (c->num_key_value_heads > c->num_attention_heads ||
        (c->num_key_value_heads && c->num_attention_heads % c->num_key_value_heads))
        return FAIL_RANGE(p, "num_key_value_heads", "num_key_value_heads %u does not divide "
                          "num_attention_heads %u", c->num_key_value_heads,
                          c->num_attention_heads);
    /* hidden_size / num_attention_heads is deliberately not required to divide: MLA never uses
     * that head_dim, and K3 (7168 / 96) does not divide.  MXFP4 experts need in-dimensions in
     * whole groups of 32. */
    if (c->family == KL_FAMILY_KIMI_LINEAR_MXFP4 && c->hidden_size % c->quant_group_size)
        return FAIL_RANGE(p, "hidden_size", "hidden_size %u is not divisible by the MXFP4 group "
                          "size %u", c->hidden_size, c->quant_group_size);
    if (c->family == KL_FAMILY_KIMI_LINEAR_MXFP4 &&
        c->moe_intermediate_size % c->quant_group_size)
        return FAIL_RANGE(p, "moe_intermediate_size", "moe_intermediate_size %u is not divisible "
                          "by the MXFP4 group size %u", c->moe_intermediate_size,
                          c->quant_group_size);
    if (c->num_experts && c->num_experts % c->num_expert_group)
        return FAIL_RANGE(p, "num_expert_group", "num_expert_group %u does not divide "
                          "num_experts %u", c->num_expert_group, c->num_experts);
    if (c->topk_group > c->num_expert_group)
        return FAIL_RANGE(p, "topk_group", "topk_group %u exceeds num_expert_group %u",
                          c->topk_group, c->num_expert_group);
    int rc;
    if ((rc = check_token(p, "bos_token_id", c->bos_token_id, c->vocab_size)) ||
        (rc = check_token(p, "eos_token_id", c->eos_token_id, c->vocab_size)) ||
        (rc = check_token(p, "pad_token_id", c->pad_token_id, c->vocab_size)))
        return rc;
    return 0;
}

/* ---- 6. public API ------------------------------------------------------------------------ */

int kl_config_open(kl_config *c, const char *path, kl_err *err)
{
    char *buf = NULL;
    size_t len = 0;
    int rc = kl_read_file(path, KL_CONFIG_MAX_BYTES, &buf, &len, err);
    if (rc) {
        memset(c, 0, sizeof *c);
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
        return rc;
    }
    rc = kl_config_parse(c, path, buf, len, err);
    kl_free(buf);
    return rc;
}

/* Every section in dependency order: family picks the root, sizes come before the layer lists
 * that are checked against num_hidden_layers, MoE keys before the MLP kinds. */
static int parse_all(const parser *p0, const cJSON *top, kl_config *c)
{
    parser p = *p0;
    const cJSON *root = top;
    int rc;
    if ((rc = check_unique_keys(&p, top)) || (rc = parse_family(&p, top, c, &root)))
        return rc;
    p.lenient = c->family == KL_FAMILY_KIMI_K3;
    if (root != top) {
        p.scope = "text_config.";
        if ((rc = check_unique_keys(&p, root)))
            return rc;
    }
    if ((rc = parse_uint_keys(&p, root, c)) || (rc = parse_misc_keys(&p, root, c)) ||
        (rc = parse_dtype(&p, root, c)))
        return rc;
    if (!c->dtype[0] && root != top && (rc = parse_dtype(p0, top, c)))
        return rc;
    if ((rc = parse_linear_attn(&p, root, c)) || (rc = parse_mlp_kinds(&p, root, c)))
        return rc;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(top, "quantization_config");
    if ((!q || cJSON_IsNull(q)) && root != top)
        q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (q && !cJSON_IsNull(q)) {
        bool enforce = c->family != KL_FAMILY_KIMI_K3;
        if ((rc = parse_quant(p0, q, enforce, c)))
            return rc;
        if (c->family == KL_FAMILY_KIMI_LINEAR)
            c->family = KL_FAMILY_KIMI_LINEAR_MXFP4;
    }
    return check_consistency(&p, c);
}

int kl_config_parse(kl_config *c, const char *path, const char *json, size_t len, kl_err *err)
{
    parser p = {.path = path ? path : "config.json", .scope = "", .lenient = false, .err = err};
    kl_config tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.bos_token_id = tmp.eos_token_id = tmp.pad_token_id = -1;
    memset(c, 0, sizeof *c);
    cJSON *top = NULL;
    int rc = kl_json_parse(json, len, "CFG", &top, err);
    if (rc) {
        kl_err_context(err, p.path, NULL, KL_NO_OFFSET, NULL);
        return rc;
    }
    rc = cJSON_IsObject(top) ? parse_all(&p, top, &tmp)
                                 : FAIL_JSON(&p, "", "the top level is not a JSON object");
    cJSON_Delete(top);
    if (rc == 0)
        *c = tmp;
    return rc;
}

/* The real Kimi-Linear-48B-A3B-Instruct config.json (kimi-linear.md §1). */
void kl_config_default_48b(kl_config *c)
{
    memset(c, 0, sizeof *c);
    c->family = KL_FAMILY_KIMI_LINEAR;
    snprintf(c->model_type, sizeof c->model_type, "kimi_linear");
    snprintf(c->dtype, sizeof c->dtype, "bfloat16");
    c->vocab_size = 163840;
    c->hidden_size = 2304;
    c->num_hidden_layers = 27;
    c->intermediate_size = 9216;
    c->moe_intermediate_size = 1024;
    c->rms_norm_eps = 1e-5;
    c->tie_word_embeddings = false;
    c->max_position = 1048576;
    c->bos_token_id = 163584;
    c->eos_token_id = 163586;
    c->pad_token_id = 163839;
    c->num_attention_heads = 32;
    c->num_key_value_heads = 32;
    c->q_lora_rank = 0;
    c->kv_lora_rank = 512;
    c->qk_nope_head_dim = 128;
    c->qk_rope_head_dim = 64;
    c->v_head_dim = 128;
    c->mla_use_nope = true;
    c->kda_num_heads = 32;
    c->kda_head_dim = 128;
    c->kda_conv_kernel = 4;
    c->num_experts = 256;
    c->num_experts_per_token = 8;
    c->num_shared_experts = 1;
    c->first_k_dense_replace = 1;
    c->moe_layer_freq = 1;
    c->routed_scaling_factor = 2.446;
    c->moe_renormalize = true;
    c->use_grouped_topk = true;
    c->num_expert_group = 1;
    c->topk_group = 1;
    snprintf(c->moe_router_activation_func, sizeof c->moe_router_activation_func, "sigmoid");
    snprintf(c->hidden_act, sizeof c->hidden_act, "silu");
    c->num_nextn_predict_layers = 0;
    /* 1-based full_attn_layers 4, 8, ..., 24, 27: every fourth layer and the last */
    for (uint32_t i = 0; i < c->num_hidden_layers; i++)
        c->layer_attn[i] = ((i + 1) % 4 == 0 || i + 1 == c->num_hidden_layers) ? KL_ATTN_MLA
                                                                                : KL_ATTN_KDA;
}

/* ---- 7. serialization --------------------------------------------------------------------- */

/* cJSON's add functions return NULL on allocation failure; one flag collects them all. */
typedef struct jw {
    cJSON *obj;
    bool   failed;
} jw;

static void put_num(jw *w, const char *key, double v)
{
    if (!cJSON_AddNumberToObject(w->obj, key, v))
        w->failed = true;
}

static void put_str(jw *w, const char *key, const char *v)
{
    if (!cJSON_AddStringToObject(w->obj, key, v))
        w->failed = true;
}

static void put_bool(jw *w, const char *key, bool v)
{
    if (!cJSON_AddBoolToObject(w->obj, key, v))
        w->failed = true;
}

static void put_null(jw *w, const char *key)
{
    if (!cJSON_AddNullToObject(w->obj, key))
        w->failed = true;
}

static void put_item(jw *w, const char *key, cJSON *item)
{
    if (!item || !cJSON_AddItemToObject(w->obj, key, item)) {
        cJSON_Delete(item);
        w->failed = true;
    }
}

static void put_token(jw *w, const char *key, int64_t id)
{
    if (id < 0)
        put_null(w, key);
    else
        put_num(w, key, (double)id);
}

static cJSON *string_list(const char *const *items)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && items[i]; i++) {
        cJSON *s = cJSON_CreateString(items[i]);
        if (!s || !cJSON_AddItemToArray(a, s)) {
            cJSON_Delete(s);
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

/* 1-based list of the layers of one kind. */
static cJSON *layer_list(const kl_config *c, kl_attn_kind kind)
{
    cJSON *a = cJSON_CreateArray();
    for (uint32_t i = 0; a && i < c->num_hidden_layers && i < KL_MAX_LAYERS; i++) {
        if (c->layer_attn[i] != kind)
            continue;
        cJSON *n = cJSON_CreateNumber((double)i + 1);
        if (!n || !cJSON_AddItemToArray(a, n)) {
            cJSON_Delete(n);
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

static cJSON *linear_attn_json(const kl_config *c)
{
    jw w = {cJSON_CreateObject(), false};
    if (!w.obj)
        return NULL;
    put_item(&w, "full_attn_layers", layer_list(c, KL_ATTN_MLA));
    put_num(&w, "head_dim", c->kda_head_dim);
    put_item(&w, "kda_layers", layer_list(c, KL_ATTN_KDA));
    put_num(&w, "num_heads", c->kda_num_heads);
    put_num(&w, "short_conv_kernel_size", c->kda_conv_kernel);
    if (w.failed) {
        cJSON_Delete(w.obj);
        return NULL;
    }
    return w.obj;
}

/* compressed-tensors config for MXFP4 routed experts, the shape llm-compressor and vLLM use:
 * one config group targeting Linear modules with 4-bit float weights in groups of 32 and E8M0
 * (uint8) scales, activations left in BF16 (W4A16); "ignore" lists every Linear that stays
 * BF16 (compressed-tensors matches entries either as module names or, with "re:", as
 * regular expressions): attention, the dense MLP, the router and the shared experts. */
static cJSON *quant_json(const kl_config *c)
{
    jw q = {cJSON_CreateObject(), false};
    jw g = {cJSON_CreateObject(), false};
    jw wt = {cJSON_CreateObject(), false};
    cJSON *groups = cJSON_CreateObject();
    if (!q.obj || !g.obj || !wt.obj || !groups)
        goto fail;
    put_num(&wt, "num_bits", 4);
    put_str(&wt, "type", "float");
    put_bool(&wt, "symmetric", true);
    put_str(&wt, "strategy", "group");
    put_num(&wt, "group_size", c->quant_group_size ? c->quant_group_size : MXFP4_GROUP);
    put_bool(&wt, "dynamic", false);
    put_str(&wt, "scale_dtype", "torch.uint8");
    put_str(&g, "format", MXFP4_FORMAT);
    put_item(&g, "targets", string_list(NAMES("Linear")));
    put_item(&g, "weights", wt.obj);
    wt.obj = NULL;
    put_null(&g, "input_activations");
    put_null(&g, "output_activations");
    if (!cJSON_AddItemToObject(groups, "group_0", g.obj))
        goto fail;
    g.obj = NULL;
    put_item(&q, "config_groups", groups);
    groups = NULL;
    put_str(&q, "format", MXFP4_FORMAT);
    put_item(&q, "ignore", string_list(NAMES("lm_head", "re:.*self_attn\\..*",
                                             "re:.*\\.mlp\\..*", "re:.*block_sparse_moe\\.gate$",
                                             "re:.*shared_experts\\..*",
                                             "re:.*block_sparse_moe\\.(gate|up|down)_proj$")));
    put_null(&q, "kv_cache_scheme");
    put_str(&q, "quant_method", CT_METHOD);
    put_str(&q, "quantization_status", "compressed");
    if (q.failed || g.failed || wt.failed)
        goto fail;
    return q.obj;
fail:
    cJSON_Delete(q.obj);
    cJSON_Delete(g.obj);
    cJSON_Delete(wt.obj);
    cJSON_Delete(groups);
    return NULL;
}

/* Keys in sorted order, as the official file (written with sort_keys) has them. */
static void config_keys_a_to_m(jw *w, const kl_config *c)
{
    put_item(w, "architectures", string_list(NAMES("KimiLinearForCausalLM")));
    put_token(w, "bos_token_id", c->bos_token_id);
    if (c->dtype[0])
        put_str(w, "dtype", c->dtype);
    put_token(w, "eos_token_id", c->eos_token_id);
    put_num(w, "first_k_dense_replace", c->first_k_dense_replace);
    if (c->num_attention_heads && c->hidden_size % c->num_attention_heads == 0)
        put_num(w, "head_dim", c->hidden_size / c->num_attention_heads);
    put_str(w, "hidden_act", c->hidden_act);
    put_num(w, "hidden_size", c->hidden_size);
    put_num(w, "initializer_range", 0.02);
    put_num(w, "intermediate_size", c->intermediate_size);
    put_num(w, "kv_lora_rank", c->kv_lora_rank);
    put_item(w, "linear_attn_config", linear_attn_json(c));
    put_bool(w, "mla_use_nope", c->mla_use_nope);
    if (c->max_position)
        put_num(w, "model_max_length", (double)c->max_position);
    put_str(w, "model_type", c->model_type[0] ? c->model_type : "kimi_linear");
    put_num(w, "moe_intermediate_size", c->moe_intermediate_size);
    put_num(w, "moe_layer_freq", c->moe_layer_freq);
    put_bool(w, "moe_renormalize", c->moe_renormalize);
    put_str(w, "moe_router_activation_func", c->moe_router_activation_func);
}

static void config_keys_n_to_z(jw *w, const kl_config *c)
{
    put_num(w, "num_attention_heads", c->num_attention_heads);
    put_num(w, "num_expert_group", c->num_expert_group);
    put_num(w, "num_experts", c->num_experts);
    put_num(w, "num_experts_per_token", c->num_experts_per_token);
    put_num(w, "num_hidden_layers", c->num_hidden_layers);
    put_num(w, "num_key_value_heads", c->num_key_value_heads);
    put_num(w, "num_nextn_predict_layers", c->num_nextn_predict_layers);
    put_num(w, "num_shared_experts", c->num_shared_experts);
    put_token(w, "pad_token_id", c->pad_token_id);
    if (c->q_lora_rank)
        put_num(w, "q_lora_rank", c->q_lora_rank);
    else
        put_null(w, "q_lora_rank");
    put_num(w, "qk_nope_head_dim", c->qk_nope_head_dim);
    put_num(w, "qk_rope_head_dim", c->qk_rope_head_dim);
    if (c->quantized)
        put_item(w, "quantization_config", quant_json(c));
    put_num(w, "rms_norm_eps", c->rms_norm_eps);
    put_null(w, "rope_scaling");
    put_num(w, "rope_theta", 10000.0);
    put_num(w, "routed_scaling_factor", c->routed_scaling_factor);
    put_bool(w, "tie_word_embeddings", c->tie_word_embeddings);
    put_num(w, "topk_group", c->topk_group);
    put_bool(w, "use_cache", true);
    put_bool(w, "use_grouped_topk", c->use_grouped_topk);
    put_num(w, "v_head_dim", c->v_head_dim);
    put_num(w, "vocab_size", c->vocab_size);
}

/* cJSON_Print indents with tabs and writes "key":<tab>value; the official file (Python's
 * json.dumps(indent=4)) has 4-space indents and "key": value.  cJSON escapes a tab inside a
 * string as \t, so every raw tab is layout: after ':' it becomes one space, elsewhere four.
 * Returns a kl_malloc'd copy ending in a newline, or NULL. */
static char *official_layout(const char *text)
{
    size_t n = strlen(text);
    char *out = kl_malloc(4 * n + 2);
    if (!out)
        return NULL;
    char *p = out;
    for (const char *s = text; *s; s++) {
        if (*s != '\t') {
            *p++ = *s;
        } else if (s > text && s[-1] == ':') {
            *p++ = ' ';
        } else {
            memcpy(p, "    ", 4);
            p += 4;
        }
    }
    *p++ = '\n';  /* a text file ends with a newline */
    *p = '\0';
    return out;
}

/* auto_map is left out on purpose: it points at remote-code files (configuration_kimi.py)
 * that a converted checkpoint does not carry; transformers loads kimi_linear natively. */
int kl_config_to_json(const kl_config *c, char **out, kl_err *err)
{
    jw w = {cJSON_CreateObject(), false};
    if (!w.obj)
        return kl_fail(err, KL_E_NOMEM, "out of memory building config.json");
    config_keys_a_to_m(&w, c);
    config_keys_n_to_z(&w, c);
    char *text = w.failed ? NULL : cJSON_Print(w.obj);
    cJSON_Delete(w.obj);
    char *copy = text ? official_layout(text) : NULL;
    cJSON_free(text);
    if (!copy)
        return kl_fail(err, KL_E_NOMEM, "out of memory building config.json");
    *out = copy;
    return 0;
}

void kl_config_set_mxfp4(kl_config *c)
{
    c->family = KL_FAMILY_KIMI_LINEAR_MXFP4;
    c->quantized = true;
    snprintf(c->quant_method, sizeof c->quant_method, "compressed-tensors");
    snprintf(c->quant_format, sizeof c->quant_format, "mxfp4-pack-quantized");
    c->quant_group_size = 32;
}

bool kl_config_is_moe_layer(const kl_config *c, uint32_t layer)
{
    /* HF remote code: experts exist and layer_idx >= first_k_dense_replace and
     * layer_idx % moe_layer_freq == 0; every other layer has the dense MLP. */
    if (!c->num_experts || !c->moe_layer_freq || layer >= c->num_hidden_layers)
        return false;
    return layer >= c->first_k_dense_replace && layer % c->moe_layer_freq == 0;
}

uint32_t kl_config_count_attn(const kl_config *c, kl_attn_kind kind)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->num_hidden_layers && i < KL_MAX_LAYERS; i++)
        n += c->layer_attn[i] == kind;
    return n;
}

uint64_t kl_config_mla_token_bytes(const kl_config *c, size_t elem_bytes)
{
    return ((uint64_t)c->kv_lora_rank + c->qk_rope_head_dim) * elem_bytes;
}

int kl_config_kda_state_bytes(const kl_config *c, uint64_t heads, size_t elem_bytes,
                              uint64_t *out)
{
    uint64_t hd = c->kda_head_dim, window = c->kda_conv_kernel ? c->kda_conv_kernel - 1 : 0;
    uint64_t state, conv, sum;
    if (kl_mul_u64(heads, hd, &state) || kl_mul_u64(state, hd, &state) ||
        kl_mul_u64(heads, 3 * hd, &conv) || kl_mul_u64(conv, window, &conv) ||
        kl_add_u64(state, conv, &sum) || kl_mul_u64(sum, elem_bytes, &sum))
        return KL_E_FORMAT;
    *out = sum;
    return 0;
}

const char *kl_family_name(kl_family f)
{
    switch (f) {
    case KL_FAMILY_KIMI_LINEAR: return "kimi_linear";
    case KL_FAMILY_KIMI_LINEAR_MXFP4: return "kimi_linear_mxfp4";
    case KL_FAMILY_KIMI_K3: return "kimi_k3";
    case KL_FAMILY_UNKNOWN: break;
    }
    return "unknown";
}
