/*
 * synth/synth_tokenizer.c — tokenizer files of a synthetic checkpoint (see synth.h).
 *
 * tiktoken.model: one "base64(bytes) rank" line per regular token, ranks 0..R-1 with
 * R = vocab_size - 256.  Ranks 0..255 are the single bytes 0x00..0xFF; every later token is the
 * concatenation of two lower-ranked tokens, so byte-pair merging can reach it.  The merges are
 * text-like so tokenizer tests see realistic splits: lowercase words, " word", capitalised
 * words, 1-3 digit numbers, punctuation/newline runs and UTF-8 CJK characters (first the
 * two-byte prefix, then the whole character).  Every token is distinct; no multi-byte token
 * contains a NUL byte.  The list depends only on vocab_size (a fixed internal RNG stream).
 *
 * tokenizer_config.json: added_tokens_decoder for ids R..R+255 with Kimi's names at Kimi's
 * offsets (tokenizer-and-api.md A1): [BOS]=R, [EOS]=R+1, <|im_end|>=R+2, <|im_user|>=R+3,
 * <|im_assistant|>=R+4, <|start_header_id|>=R+6, <|end_header_id|>=R+7, [EOT]=R+9,
 * <|im_system|>=R+10, tool-call markers R+11..R+15 (special: false), <|im_middle|>=R+17,
 * [UNK]=R+254, [PAD]=R+255, <|reserved_token_ID|> for every other id; bos [BOS], eos
 * <|im_end|>, pad [PAD], unk [UNK], and a chat_template in Kimi-Linear's format (no default
 * system prompt, no newlines between turns).
 */
#include "synth/synth.h"

#include "common/fs.h"
#include "common/grow.h"
#include "common/mem.h"
#include "common/rng.h"
#include "common/strmap.h"

#include <cJSON.h>
#include <stdio.h>
#include <string.h>

/* ---- constants ---- */

#define N_SPECIAL 256u
#define MAX_TOKEN_LEN 16u
#define TOKENIZER_STREAM 0x746f6b656e697a65ull /* "tokenize" */

static const struct {
    unsigned    offset;
    const char *name;
    int         special;
} kimi_special[] = {
    {0, "[BOS]", 1},
    {1, "[EOS]", 1},
    {2, "<|im_end|>", 1},
    {3, "<|im_user|>", 1},
    {4, "<|im_assistant|>", 1},
    {6, "<|start_header_id|>", 1},
    {7, "<|end_header_id|>", 1},
    {9, "[EOT]", 1},
    {10, "<|im_system|>", 1},
    {11, "<|tool_calls_section_begin|>", 0},
    {12, "<|tool_calls_section_end|>", 0},
    {13, "<|tool_call_begin|>", 0},
    {14, "<|tool_call_argument_begin|>", 0},
    {15, "<|tool_call_end|>", 0},
    {17, "<|im_middle|>", 1},
    {254, "[UNK]", 1},
    {255, "[PAD]", 1},
};

static const char chat_template[] =
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}<|im_user|>"
    "{%- elif message['role'] == 'assistant' -%}<|im_assistant|>"
    "{%- else -%}<|im_system|>{%- endif -%}"
    "{{ message['name'] if message['name'] is defined else message['role'] }}"
    "<|im_middle|>{{ message['content'] }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}";

/* ---- token table ---- */

enum { POOL_WORD, POOL_SPACE_WORD, POOL_CAP, POOL_DIGIT, POOL_PUNCT, POOL_COUNT };

typedef struct pool {
    uint32_t *ids;
    size_t    n, cap;
} pool;

typedef struct vocab {
    uint32_t   n, cap;          /* tokens so far / capacity (= regular token count) */
    char      *bytes;           /* [cap * (MAX_TOKEN_LEN + 1)] NUL-terminated token text */
    uint8_t   *len;             /* [cap] */
    kl_strmap  seen;            /* multi-byte tokens -> rank */
    pool       pools[POOL_COUNT];
    kl_rng     rng;
} vocab;

static const char *tok(const vocab *v, uint32_t id)
{
    return v->bytes + (size_t)id * (MAX_TOKEN_LEN + 1);
}

static int pool_push(pool *p, uint32_t id)
{
    if (kl_grow(&p->ids, &p->cap, p->n + 1, sizeof *p->ids))
        return KL_E_NOMEM;
    p->ids[p->n++] = id;
    return 0;
}

/* A pool member, biased toward low ranks (short, frequent tokens merge first in real BPE). */
static uint32_t pool_pick(vocab *v, const pool *p)
{
    double u = kl_rng_uniform(&v->rng);
    size_t i = (size_t)((double)p->n * u * u);
    return p->ids[i < p->n ? i : p->n - 1];
}

/* Appends a+b as the next rank if it is new and short enough: 1 added, 0 skipped, <0 error. */
static int add_concat(vocab *v, const char *a, size_t la, const char *b, size_t lb, int pool_id)
{
    if (la + lb > MAX_TOKEN_LEN || la + lb < 2 || v->n >= v->cap)
        return 0;
    char *dst = v->bytes + (size_t)v->n * (MAX_TOKEN_LEN + 1);
    memcpy(dst, a, la);
    memcpy(dst + la, b, lb);
    dst[la + lb] = 0;
    if (strlen(dst) != la + lb)
        return 0; /* a NUL byte inside: never produced, but keep the map's keys valid */
    int r = kl_strmap_put(&v->seen, dst, v->n, NULL);
    if (r < 0)
        return KL_E_NOMEM;
    if (r == 1)
        return 0;
    v->len[v->n] = (uint8_t)(la + lb);
    if (pool_id >= 0 && pool_push(&v->pools[pool_id], v->n))
        return KL_E_NOMEM;
    v->n++;
    return 1;
}

static int add_pair(vocab *v, uint32_t a, uint32_t b, int pool_id)
{
    return add_concat(v, tok(v, a), v->len[a], tok(v, b), v->len[b], pool_id);
}

/* One merge attempt of a randomly chosen kind: 1 added, 0 nothing new, <0 error. */
static int try_merge(vocab *v)
{
    pool *P = v->pools;
    unsigned kind = (unsigned)(kl_rng_next(&v->rng) % 100);
    if (kind < 40)        /* word + word */
        return add_pair(v, pool_pick(v, &P[POOL_WORD]), pool_pick(v, &P[POOL_WORD]), POOL_WORD);
    if (kind < 50)        /* " " + word */
        return add_pair(v, ' ', pool_pick(v, &P[POOL_WORD]), POOL_SPACE_WORD);
    if (kind < 60) {      /* " word" + word */
        if (!P[POOL_SPACE_WORD].n)
            return 0;
        return add_pair(v, pool_pick(v, &P[POOL_SPACE_WORD]), pool_pick(v, &P[POOL_WORD]),
                        POOL_SPACE_WORD);
    }
    if (kind < 65)        /* Upper + word */
        return add_pair(v, (uint32_t)('A' + kl_rng_next(&v->rng) % 26),
                        pool_pick(v, &P[POOL_WORD]), POOL_CAP);
    if (kind < 70) {      /* " " + Word */
        if (!P[POOL_CAP].n)
            return 0;
        return add_pair(v, ' ', pool_pick(v, &P[POOL_CAP]), -1);
    }
    if (kind < 78) {      /* numbers of 2-3 digits */
        uint32_t a = pool_pick(v, &P[POOL_DIGIT]), b = pool_pick(v, &P[POOL_DIGIT]);
        if (v->len[a] + v->len[b] > 3)
            return 0;
        return add_pair(v, a, b, POOL_DIGIT);
    }
    if (kind < 88) {      /* punctuation and whitespace runs */
        uint32_t a = pool_pick(v, &P[POOL_PUNCT]), b = pool_pick(v, &P[POOL_PUNCT]);
        if (v->len[a] + v->len[b] > 4)
            return 0;
        return add_pair(v, a, b, POOL_PUNCT);
    }
    /* a CJK character U+4E00..U+9FA5: its two-byte prefix first, then the whole character */
    uint32_t cp = 0x4e00 + (uint32_t)(kl_rng_next(&v->rng) % (0x9fa6 - 0x4e00));
    char c[3] = {(char)(0xe0 | (cp >> 12)), (char)(0x80 | ((cp >> 6) & 0x3f)),
                 (char)(0x80 | (cp & 0x3f))};
    char prefix[3] = {c[0], c[1], 0};
    uint32_t have;
    if (!kl_strmap_get(&v->seen, prefix, &have))
        return add_concat(v, &c[0], 1, &c[1], 1, -1);
    return add_concat(v, prefix, 2, &c[2], 1, -1);
}

static void vocab_free(vocab *v)
{
    kl_free(v->bytes);
    kl_free(v->len);
    kl_strmap_free(&v->seen);
    for (int i = 0; i < POOL_COUNT; i++)
        kl_free(v->pools[i].ids);
    memset(v, 0, sizeof *v);
}

static int vocab_build(vocab *v, uint32_t n_regular, kl_err *err)
{
    memset(v, 0, sizeof *v);
    v->cap = n_regular;
    v->bytes = kl_malloc((size_t)n_regular * (MAX_TOKEN_LEN + 1));
    v->len = kl_malloc(n_regular);
    if (!v->bytes || !v->len || kl_strmap_init(&v->seen, n_regular))
        goto nomem;
    kl_rng_seed(&v->rng, TOKENIZER_STREAM, n_regular);
    static const char punct[] = " \n.,!?:;()\"'-";
    for (uint32_t b = 0; b < 256; b++) {
        char *dst = v->bytes + (size_t)b * (MAX_TOKEN_LEN + 1);
        dst[0] = (char)b;
        dst[1] = 0;
        v->len[b] = 1;
        int p = -1;
        if (b >= 'a' && b <= 'z')
            p = POOL_WORD;
        else if (b >= '0' && b <= '9')
            p = POOL_DIGIT;
        else if (b && strchr(punct, (int)b))
            p = POOL_PUNCT;
        if (p >= 0 && pool_push(&v->pools[p], b))
            goto nomem;
    }
    v->n = 256;
    unsigned misses = 0;
    while (v->n < v->cap) {
        int r = try_merge(v);
        if (r < 0)
            goto nomem;
        misses = r ? 0 : misses + 1;
        if (misses > 1000000)
            return kl_fail(err, KL_E_BUG, "tokenizer generation stalled at %u tokens", v->n);
    }
    return 0;
nomem:
    return kl_fail(err, KL_E_NOMEM, "out of memory building a %u-token vocabulary", n_regular);
}

/* ---- files ---- */

static size_t base64_encode(const uint8_t *src, size_t n, char *dst)
{
    static const char tbl[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0, i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t x = (uint32_t)src[i] << 16 | (uint32_t)src[i + 1] << 8 | src[i + 2];
        dst[o++] = tbl[x >> 18];
        dst[o++] = tbl[(x >> 12) & 63];
        dst[o++] = tbl[(x >> 6) & 63];
        dst[o++] = tbl[x & 63];
    }
    if (i < n) {
        uint32_t x = (uint32_t)src[i] << 16 | (i + 1 < n ? (uint32_t)src[i + 1] << 8 : 0);
        dst[o++] = tbl[x >> 18];
        dst[o++] = tbl[(x >> 12) & 63];
        dst[o++] = i + 1 < n ? tbl[(x >> 6) & 63] : '=';
        dst[o++] = '=';
    }
    return o;
}

static int write_tiktoken(const char *dir, const vocab *v, kl_err *err)
{
    size_t cap = (size_t)v->n * (((MAX_TOKEN_LEN + 2) / 3) * 4 + 12);
    char *buf = kl_malloc(cap);
    if (!buf)
        return kl_fail(err, KL_E_NOMEM, "out of memory for tiktoken.model");
    size_t o = 0;
    for (uint32_t r = 0; r < v->n; r++) {
        o += base64_encode((const uint8_t *)tok(v, r), v->len[r], buf + o);
        o += (size_t)snprintf(buf + o, cap - o, " %u\n", r);
    }
    int rc = kl_write_file_atomic(dir, "tiktoken.model", buf, o, err);
    kl_free(buf);
    return rc;
}

static const char *special_name(unsigned offset, int *special)
{
    for (size_t i = 0; i < sizeof kimi_special / sizeof kimi_special[0]; i++)
        if (kimi_special[i].offset == offset) {
            *special = kimi_special[i].special;
            return kimi_special[i].name;
        }
    *special = 1;
    return NULL;
}

static cJSON *tokenizer_config(uint32_t n_regular)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *dec = cJSON_AddObjectToObject(root, "added_tokens_decoder");
    if (!dec)
        goto fail;
    for (unsigned k = 0; k < N_SPECIAL; k++) {
        char id[16], reserved[48];
        int special;
        const char *name = special_name(k, &special);
        snprintf(id, sizeof id, "%u", n_regular + k);
        if (!name) {
            snprintf(reserved, sizeof reserved, "<|reserved_token_%u|>", n_regular + k);
            name = reserved;
        }
        cJSON *e = cJSON_AddObjectToObject(dec, id);
        if (!e || !cJSON_AddStringToObject(e, "content", name) ||
            !cJSON_AddFalseToObject(e, "lstrip") || !cJSON_AddFalseToObject(e, "normalized") ||
            !cJSON_AddFalseToObject(e, "rstrip") || !cJSON_AddFalseToObject(e, "single_word") ||
            !cJSON_AddBoolToObject(e, "special", special))
            goto fail;
    }
    static const char *const extra[] = {"<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                                        "<|start_header_id|>", "<|end_header_id|>", "[EOT]",
                                        "<|im_system|>", "<|im_middle|>"};
    cJSON *add = cJSON_CreateStringArray(extra, (int)(sizeof extra / sizeof extra[0]));
    if (!add)
        goto fail;
    cJSON_AddItemToObject(root, "additional_special_tokens", add);
    cJSON *amap = cJSON_AddObjectToObject(root, "auto_map");
    cJSON *auto_tok = cJSON_AddArrayToObject(amap, "AutoTokenizer");
    if (!auto_tok)
        goto fail;
    cJSON_AddItemToArray(auto_tok, cJSON_CreateString("tokenization_kimi.TikTokenTokenizer"));
    cJSON_AddItemToArray(auto_tok, cJSON_CreateNull());
    if (!cJSON_AddStringToObject(root, "bos_token", "[BOS]") ||
        !cJSON_AddStringToObject(root, "chat_template", chat_template) ||
        !cJSON_AddFalseToObject(root, "clean_up_tokenization_spaces") ||
        !cJSON_AddStringToObject(root, "eos_token", "<|im_end|>") ||
        !cJSON_AddNumberToObject(root, "model_max_length", 1048576) ||
        !cJSON_AddStringToObject(root, "pad_token", "[PAD]") ||
        !cJSON_AddStringToObject(root, "tokenizer_class", "TikTokenTokenizer") ||
        !cJSON_AddStringToObject(root, "unk_token", "[UNK]"))
        goto fail;
    return root;
fail:
    cJSON_Delete(root);
    return NULL;
}

/* ---- public API ---- */

int kl_synth_write_tokenizer(const char *dir, uint32_t vocab_size, kl_err *err)
{
    if (vocab_size < 2 * N_SPECIAL || vocab_size > (1u << 24))
        return kl_fail(err, KL_E_USAGE, "vocab_size %u outside 512..16777216", vocab_size);
    uint32_t n_regular = vocab_size - N_SPECIAL;
    vocab v;
    int rc = vocab_build(&v, n_regular, err);
    if (!rc)
        rc = write_tiktoken(dir, &v, err);
    vocab_free(&v);
    if (rc)
        return rc;
    cJSON *root = tokenizer_config(n_regular);
    char *json = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!json)
        return kl_fail(err, KL_E_NOMEM, "out of memory for tokenizer_config.json");
    size_t len = strlen(json);
    json[len] = '\n'; /* written with its length: the NUL becomes the final newline */
    rc = kl_write_file_atomic(dir, "tokenizer_config.json", json, len + 1, err);
    cJSON_free(json);
    return rc;
}
