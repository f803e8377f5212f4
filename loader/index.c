/*
 * loader/index.c — model.safetensors.index.json parser (see index.h).
 *
 * Divisions: includes and helpers; metadata; weight_map; the plain index, read without a tree
 * (the fast path); public API in header order.
 * The text goes through the strict JSON reader of common/json, like shard headers; duplicate
 * keys, which cJSON keeps as sibling members, are found with kl_strmap.
 */
#include "loader/index.h"

#include "common/fs.h"
#include "common/grow.h"
#include "common/json.h"
#include "common/mem.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define SHARD_SUFFIX ".safetensors"

/* State of one kl_index_parse call. */
typedef struct idx_parse {
    kl_index *idx;
    char *str_next; /* next free byte of idx->strings */
    kl_err *err;
    const char *last_file;  /* the last shard file an entry named (checked), kept */
    uint32_t last_shard;    /* its shard index */
} idx_parse;

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                    */

static const char *keep_str(idx_parse *ps, const char *s)
{
    size_t n = strlen(s) + 1;
    char *dst = ps->str_next;
    memcpy(dst, s, n);
    ps->str_next += n;
    return dst;
}

/* Root members other than metadata and weight_map are ignored (writers may add their own), but
 * a repeated key is ambiguous: which one would another reader use? */
static int find_root_members(idx_parse *ps, const cJSON *root, const cJSON **meta,
                             const cJSON **wmap)
{
    *meta = *wmap = NULL;
    for (const cJSON *c = root->child; c; c = c->next) {
        const cJSON **slot = strcmp(c->string, "metadata") == 0     ? meta
                             : strcmp(c->string, "weight_map") == 0 ? wmap
                                                                    : NULL;
        if (!slot)
            continue;
        if (*slot)
            return kl_fail_at(ps->err, KL_E_FORMAT, "IDX-JSON", NULL, KL_NO_OFFSET,
                              "\"%s\" appears twice", c->string);
        *slot = c;
    }
    if (!*wmap || !cJSON_IsObject(*wmap))
        return kl_fail_at(ps->err, KL_E_FORMAT, "IDX-JSON", NULL, KL_NO_OFFSET,
                          *wmap ? "weight_map is not an object" : "weight_map missing");
    if (*meta && !cJSON_IsObject(*meta))
        return kl_fail_at(ps->err, KL_E_FORMAT, "IDX-JSON", NULL, KL_NO_OFFSET,
                          "metadata is not an object");
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* metadata                                                                                   */

/* total_size is optional; when present it must be a non-negative integer, written as one. */
static int parse_total_size(idx_parse *ps, const cJSON *meta)
{
    const cJSON *ts = NULL;
    if (!meta)
        return 0;
    for (const cJSON *c = meta->child; c; c = c->next) {
        if (strcmp(c->string, "total_size") != 0)
            continue;
        if (ts)
            return kl_fail_at(ps->err, KL_E_FORMAT, "IDX-TOTAL-SIZE", NULL, KL_NO_OFFSET,
                              "metadata.total_size appears twice");
        ts = c;
    }
    if (!ts)
        return 0;
    kl_json_int r = kl_json_get_u64(ts, UINT64_MAX, &ps->idx->total_size);
    if (r)
        return kl_fail_at(ps->err, KL_E_FORMAT, "IDX-TOTAL-SIZE", NULL, KL_NO_OFFSET,
                          "metadata.total_size %s; it must be a non-negative integer",
                          kl_json_int_why(r));
    ps->idx->has_total_size = 1;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* weight_map                                                                                 */

static int ends_with(const char *s, size_t len, const char *suffix)
{
    size_t k = strlen(suffix);
    return len >= k && memcmp(s + len - k, suffix, k) == 0;
}

/* A shard name must stay inside the checkpoint directory: a plain file name, no path parts. */
static int check_shard_name(idx_parse *ps, const char *tensor, const char *file)
{
    size_t len = strlen(file);
    const char *why = NULL;
    if (file[0] == '/')
        why = "is an absolute path";
    else if (strchr(file, '/'))
        why = "contains '/'";
    else if (strstr(file, ".."))
        why = "contains \"..\"";
    else if (!ends_with(file, len, SHARD_SUFFIX) || len == strlen(SHARD_SUFFIX))
        why = "is not a NAME.safetensors file name";
    else if (len > 255)
        why = "is longer than a file name may be (255 bytes)";
    if (why)
        return kl_fail_at(ps->err, KL_E_FORMAT, "IDX-SHARD-NAME", tensor, KL_NO_OFFSET,
                          "shard \"%.128s\" %s", file, why);
    return 0;
}

/* Shard index of file, adding it on first sight. */
static int shard_id(idx_parse *ps, const char *file, uint32_t *id)
{
    kl_index *idx = ps->idx;
    if (kl_strmap_get(&idx->by_shard, file, id))
        return 0;
    const char *kept = keep_str(ps, file);
    *id = (uint32_t)idx->n_shards;
    if (kl_strmap_put(&idx->by_shard, kept, *id, NULL) < 0)
        return kl_fail(ps->err, KL_E_NOMEM, "out of memory indexing shards");
    idx->shards[idx->n_shards++] = kept;
    return 0;
}

/* One weight_map member: tensor -> file (NULL: the value is not a string). */
static int add_entry(idx_parse *ps, const char *tensor, const char *file)
{
    kl_index *idx = ps->idx;
    if (!tensor[0])
        return kl_fail_at(ps->err, KL_E_FORMAT, "IDX-ENTRY", NULL, KL_NO_OFFSET,
                          "empty tensor name");
    if (!file || !file[0])
        return kl_fail_at(ps->err, KL_E_FORMAT, "IDX-ENTRY", tensor, KL_NO_OFFSET,
                          "shard file must be a non-empty string");
    kl_index_entry *e = &idx->entries[idx->n_entries];
    int rc;
    if (ps->last_file && !strcmp(file, ps->last_file)) {   /* neighbours share a shard */
        e->shard = ps->last_shard;
    } else if ((rc = check_shard_name(ps, tensor, file)) || (rc = shard_id(ps, file, &e->shard))) {
        return rc;
    } else {
        ps->last_file = idx->shards[e->shard];
        ps->last_shard = e->shard;
    }
    e->tensor = keep_str(ps, tensor);
    int put = kl_strmap_put(&idx->by_tensor, e->tensor, (uint32_t)idx->n_entries, NULL);
    if (put < 0)
        return kl_fail(ps->err, KL_E_NOMEM, "out of memory indexing tensors");
    if (put == 1)
        return kl_fail_at(ps->err, KL_E_FORMAT, "IDX-DUPLICATE", tensor, KL_NO_OFFSET,
                          "tensor appears twice in weight_map");
    idx->n_entries++;
    return 0;
}

static int parse_weight_map(idx_parse *ps, const cJSON *wmap)
{
    kl_index *idx = ps->idx;
    size_t n = 0, bytes = 1;
    for (const cJSON *c = wmap->child; c; c = c->next) {
        n++;
        bytes += strlen(c->string) + 1 + (cJSON_IsString(c) ? strlen(c->valuestring) + 1 : 0);
    }
    idx->entries = kl_calloc(n ? n : 1, sizeof *idx->entries);
    idx->shards = kl_calloc(n ? n : 1, sizeof *idx->shards);
    idx->strings = kl_malloc(bytes);
    if (!idx->entries || !idx->shards || !idx->strings || kl_strmap_init(&idx->by_tensor, n) ||
        kl_strmap_init(&idx->by_shard, 16))
        return kl_fail(ps->err, KL_E_NOMEM, "out of memory for %zu weight_map entries", n);
    ps->str_next = idx->strings;
    for (const cJSON *c = wmap->child; c; c = c->next) {
        int rc = add_entry(ps, c->string, cJSON_IsString(c) ? c->valuestring : NULL);
        if (rc)
            return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The plain index, read without a tree                                                       */

/* An index as writers make it (plain strings and integers: common/json's kl_json_scan; root
 * members metadata and weight_map only) is read straight into the tables, several times faster
 * than through a cJSON tree (a 48B index names 40,461 tensors).  Anything else, any error
 * included, declines (returns 0) and kl_index_parse parses the text the strict way, which
 * accepts or reports it exactly. */

#define PLAIN_MAX_NAME 1024   /* longer tensor or file names decline */

/* A plain string into buf (NUL-terminated), at most PLAIN_MAX_NAME bytes. */
static int plain_name(kl_json_scan *s, char *buf)
{
    const char *at;
    size_t len;
    if (!kl_json_scan_str(s, &at, &len) || len >= PLAIN_MAX_NAME)
        return 0;
    memcpy(buf, at, len);
    buf[len] = '\0';
    return 1;
}

/* One member of metadata: total_size an integer at most once, any other a plain string or
 * integer. */
static int meta_member(void *ctx, kl_json_scan *s)
{
    kl_index *idx = ((idx_parse *)ctx)->idx;
    const char *k, *v;
    size_t kn, vn;
    uint64_t n;
    if (!kl_json_scan_str(s, &k, &kn) || !kl_json_scan_char(s, ':'))
        return 0;
    if (kn == 10 && !memcmp(k, "total_size", 10)) {
        if (idx->has_total_size || !kl_json_scan_u64(s, UINT64_MAX, &idx->total_size))
            return 0;
        idx->has_total_size = 1;
        return 1;
    }
    return kl_json_scan_str(s, &v, &vn) || kl_json_scan_u64(s, UINT64_MAX, &n);
}

/* The index being read: the parse, the text's length, the tables' capacities, the root
 * members seen. */
typedef struct plain_root {
    idx_parse *ps;
    size_t     text_len, cap_e, cap_s;
    int        seen_meta, seen_map;
} plain_root;

/* One weight_map member, through add_entry. */
static int map_member(void *ctx, kl_json_scan *s)
{
    plain_root *r = ctx;
    kl_index *idx = r->ps->idx;
    char tensor[PLAIN_MAX_NAME], file[PLAIN_MAX_NAME];
    size_t need = idx->n_entries + 1;
    return plain_name(s, tensor) && kl_json_scan_char(s, ':') && plain_name(s, file) &&
           !kl_grow(&idx->entries, &r->cap_e, need, sizeof *idx->entries) &&
           !kl_grow((void *)&idx->shards, &r->cap_s, need, sizeof *idx->shards) &&
           !add_entry(r->ps, tensor, file);
}

/* weight_map's tables (sized for the whole text: each kept name had two quotes in it) and
 * members. */
static int plain_weight_map(plain_root *r, kl_json_scan *s)
{
    kl_index *idx = r->ps->idx;
    if (!(idx->strings = kl_malloc(r->text_len + 1)) ||
        kl_strmap_init(&idx->by_tensor, r->text_len / 96) || kl_strmap_init(&idx->by_shard, 16))
        return 0;
    r->ps->str_next = idx->strings;
    return kl_json_scan_list(s, '{', '}', map_member, r);
}

/* One root member: metadata or weight_map, each once. */
static int root_member(void *ctx, kl_json_scan *s)
{
    plain_root *r = ctx;
    const char *k;
    size_t kn;
    if (!kl_json_scan_str(s, &k, &kn) || !kl_json_scan_char(s, ':'))
        return 0;
    if (kn == 8 && !memcmp(k, "metadata", 8) && !r->seen_meta++)
        return kl_json_scan_list(s, '{', '}', meta_member, r->ps);
    if (kn == 10 && !memcmp(k, "weight_map", 10) && !r->seen_map++)
        return plain_weight_map(r, s);
    return 0;
}

/* The whole text on the plain path: 1 when read, 0 when declined (idx half-filled:
 * kl_index_free).  ps->err is NULL here: the strict path reports. */
static int parse_plain(idx_parse *ps, const char *json, size_t len)
{
    kl_json_scan s = {json, json + len};
    plain_root r = {.ps = ps, .text_len = len};
    return kl_json_scan_list(&s, '{', '}', root_member, &r) && r.seen_map &&
           kl_json_scan_at_end(&s);
}

/* ------------------------------------------------------------------------------------------ */
/* Public API                                                                                 */

int kl_index_open(kl_index *idx, const char *path, kl_err *err)
{
    char *text = NULL;
    size_t len = 0;
    memset(idx, 0, sizeof *idx);
    int rc = kl_read_file(path, KL_INDEX_MAX_BYTES, &text, &len, err);
    if (!rc)
        rc = kl_index_parse(idx, path, text, len, err);
    kl_free(text);
    return rc;
}

/* Strict JSON (common/json) whose value is an object. */
static int parse_text(idx_parse *ps, const char *json, size_t len, cJSON **out)
{
    cJSON *root = NULL;
    int rc = kl_json_parse(json, len, "IDX", &root, ps->err);
    if (rc)
        return rc;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kl_fail_at(ps->err, KL_E_FORMAT, "IDX-JSON", NULL, 0, "not a JSON object");
    }
    *out = root;
    return 0;
}

int kl_index_parse(kl_index *idx, const char *path, const char *json, size_t len, kl_err *err)
{
    idx_parse ps = {.idx = idx, .str_next = NULL, .err = err};
    const cJSON *meta = NULL, *wmap = NULL;
    cJSON *root = NULL;
    memset(idx, 0, sizeof *idx);
    int rc = 0;
    if (!json && len)
        rc = kl_fail(err, KL_E_USAGE, "NULL index text");
    idx_parse quiet = {.idx = idx, .str_next = NULL, .err = NULL};
    if (!rc && json && parse_plain(&quiet, json, len))
        return 0;
    kl_index_free(idx);
    if (!rc)
        rc = parse_text(&ps, json ? json : "", len, &root);
    if (!rc)
        rc = find_root_members(&ps, root, &meta, &wmap);
    if (!rc)
        rc = parse_total_size(&ps, meta);
    if (!rc)
        rc = parse_weight_map(&ps, wmap);
    cJSON_Delete(root);
    if (rc) {
        kl_index_free(idx);
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
    }
    return rc;
}

void kl_index_free(kl_index *idx)
{
    if (!idx)
        return;
    kl_free(idx->entries);
    kl_free((void *)idx->shards);
    kl_free(idx->strings);
    kl_strmap_free(&idx->by_tensor);
    kl_strmap_free(&idx->by_shard);
    memset(idx, 0, sizeof *idx);
}

int kl_index_shard_of(const kl_index *idx, const char *tensor)
{
    uint32_t i;
    if (!idx || !tensor || !kl_strmap_get(&idx->by_tensor, tensor, &i))
        return -1;
    return (int)idx->entries[i].shard;
}
