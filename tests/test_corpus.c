/*
 * tests/test_corpus.c — the broken-checkpoint corpus.
 *
 * Synthesizes one tiny checkpoint with the kl binary under test ($KL_BIN, the ASan/UBSan
 * build), then for each case copies it, breaks it in one way, runs `kl audit --json` on it and
 * checks the exit status (1 problems, 2 usage/I/O) and that the expected rule id is reported
 * (in the JSON findings, or on stderr for exit 2).  A sanitizer report makes kl exit with a
 * different status, so a crash fails the case.
 */
#include "tests/testutil.h"

#include <cJSON.h>
#include <stdint.h>
#include <sys/stat.h>

static char g_base[1024]; /* clean synthesized checkpoint */
static char g_root[512];  /* scratch root */
static const char *g_kl;

/* ---- file helpers -------------------------------------------------------------------------- */

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Splits a shard into header text and data bytes. */
typedef struct shard {
    char *header; /* NUL-terminated header JSON */
    size_t hlen;
    char *data;
    size_t dlen;
} shard;

static shard shard_read(const char *path)
{
    size_t n;
    char *all = t_slurp(path, &n);
    ck_assert(n >= 8);
    uint64_t h = le64((unsigned char *)all);
    ck_assert(8 + h <= n);
    shard s = {malloc(h + 1), h, malloc(n - 8 - h + 1), n - 8 - h};
    memcpy(s.header, all + 8, h);
    s.header[h] = 0;
    memcpy(s.data, all + 8 + h, n - 8 - h);
    free(all);
    return s;
}

/* Writes header (length prefix = strlen(header) unless forced) + data. */
static void shard_write(const char *path, const char *header, const char *data, size_t dlen,
                        int64_t forced_len)
{
    FILE *f = fopen(path, "wb");
    ck_assert(f != NULL);
    uint64_t h = forced_len >= 0 ? (uint64_t)forced_len : strlen(header);
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(h >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    fwrite(data, 1, dlen, f);
    fclose(f);
}

static void shard_free(shard *s)
{
    free(s->header);
    free(s->data);
}

static void first_shard(const char *dir, char *out, size_t n)
{
    snprintf(out, n, "%s/model-00001-of-", dir);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "ls %s/model-00001-of-*.safetensors", dir);
    FILE *p = popen(cmd, "r");
    ck_assert(p != NULL);
    ck_assert(fgets(out, (int)n, p) != NULL);
    pclose(p);
    out[strcspn(out, "\n")] = 0;
}

/* Replaces the first occurrence of `from` with `to` in s (malloc'd result). */
static char *replace(const char *s, const char *from, const char *to)
{
    const char *at = strstr(s, from);
    ck_assert_msg(at != NULL, "mutation anchor '%s' not found", from);
    size_t a = (size_t)(at - s), fl = strlen(from), tl = strlen(to), sl = strlen(s);
    char *r = malloc(sl - fl + tl + 1);
    memcpy(r, s, a);
    memcpy(r + a, to, tl);
    memcpy(r + a + tl, at + fl, sl - a - fl + 1);
    return r;
}

/* Rewrites a JSON file without whitespace so text edits have one spelling to match. */
static void compact_json(const char *dir, const char *file)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *t = t_slurp(path, NULL);
    cJSON *j = cJSON_Parse(t);
    ck_assert_msg(j != NULL, "%s is not JSON", path);
    char *out = cJSON_PrintUnformatted(j);
    t_write(path, out, strlen(out));
    free(out);
    free(t);
    cJSON_Delete(j);
}

/* Edits a shard's header text. */
static void edit_shard_header(const char *path, const char *from, const char *to)
{
    shard s = shard_read(path);
    char *h = replace(s.header, from, to);
    shard_write(path, h, s.data, s.dlen, -1);
    free(h);
    shard_free(&s);
}

/* Edits the first shard's header text. */
static void edit_header(const char *dir, const char *from, const char *to)
{
    char path[4096];
    first_shard(dir, path, sizeof path);
    edit_shard_header(path, from, to);
}

static void edit_text_file(const char *dir, const char *name, const char *from, const char *to)
{
    compact_json(dir, name);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *t = t_slurp(path, NULL);
    char *r = replace(t, from, to);
    t_write(path, r, strlen(r));
    free(t);
    free(r);
}

/* The first tensor (in index order) whose name ends in suffix, and the path of its shard. */
static void find_tensor(const char *dir, const char *suffix, char *name, size_t n, char *path,
                        size_t pn)
{
    char ipath[4096];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    char *t = t_slurp(ipath, NULL);
    cJSON *j = cJSON_Parse(t);
    ck_assert(j != NULL);
    name[0] = 0;
    for (cJSON *c = cJSON_GetObjectItem(j, "weight_map")->child; c; c = c->next) {
        size_t kl = strlen(c->string), sl = strlen(suffix);
        if (kl >= sl && !strcmp(c->string + kl - sl, suffix)) {
            snprintf(name, n, "%s", c->string);
            snprintf(path, pn, "%s/%s", dir, c->valuestring);
            break;
        }
    }
    cJSON_Delete(j);
    free(t);
    ck_assert_msg(name[0], "no tensor ending in %s", suffix);
}

/* ---- mutations ----------------------------------------------------------------------------- */

static void m_none(const char *d)
{
    (void)d;
}

static void m_file_tiny(const char *d)
{
    char p[4096];
    first_shard(d, p, sizeof p);
    ck_assert(truncate(p, 4) == 0);
}

static void set_header_len(const char *d, int64_t len)
{
    char p[4096];
    first_shard(d, p, sizeof p);
    shard s = shard_read(p);
    shard_write(p, s.header, s.data, s.dlen, len);
    shard_free(&s);
}

static void m_header_huge(const char *d)
{
    set_header_len(d, 200000000);
}
static void m_header_past_eof(const char *d)
{
    set_header_len(d, 50000000);
}

static void m_truncated(const char *d)
{
    char p[4096];
    struct stat st;
    first_shard(d, p, sizeof p);
    ck_assert(stat(p, &st) == 0);
    ck_assert(truncate(p, st.st_size - 100) == 0);
}

static void m_padded(const char *d)
{
    char p[4096];
    first_shard(d, p, sizeof p);
    FILE *f = fopen(p, "ab");
    fputs("trailing garbage", f);
    fclose(f);
}

static void m_not_utf8(const char *d)
{
    edit_header(d, "\"format\"", "\"form\xff\xfe\"");
}
static void m_bad_json(const char *d)
{
    edit_header(d, "{", "{{");
}
static void m_not_object(const char *d)
{
    edit_header(d, "{", "[{");
}
static void m_bad_dtype(const char *d)
{
    edit_header(d, "\"BF16\"", "\"BF17\"");
}
static void m_meta_number(const char *d)
{
    edit_header(d, "\"pt\"", "7");
}
static void m_negative_shape(const char *d)
{
    edit_header(d, "\"shape\":[", "\"shape\":[-1,");
}
static void m_fraction_offset(const char *d)
{
    edit_header(d, "\"data_offsets\":[0,", "\"data_offsets\":[0.5,");
}
static void m_unknown_field(const char *d)
{
    edit_header(d, "\"dtype\":", "\"stride\":1,\"dtype\":");
}
static void m_rank9(const char *d)
{
    edit_header(d, "\"shape\":[", "\"shape\":[1,1,1,1,1,1,1,1,");
}
static void m_offset_huge(const char *d)
{
    edit_header(d, "\"data_offsets\":[0,", "\"data_offsets\":[300000000000000,");
}
static void m_shape_overflow(const char *d)
{
    edit_header(d, "\"shape\":[", "\"shape\":[4294967296,4294967296,4294967296,");
}

static void m_meta_tensor(const char *d)
{
    edit_header(d, "\"__metadata__\":{\"format\":\"pt\"}",
                "\"__metadata__\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[0,0]}");
}

/* Rename a tensor entry to the name of another one in the same header: a duplicate key. */
static void m_duplicate(const char *d)
{
    /* layer 0's two norms share the first shard */
    char a[256], b[256], pa[4096], pb[4096], from[300], to[300];
    find_tensor(d, "0.input_layernorm.weight", a, sizeof a, pa, sizeof pa);
    find_tensor(d, "0.post_attention_layernorm.weight", b, sizeof b, pb, sizeof pb);
    ck_assert_str_eq(pa, pb);
    snprintf(from, sizeof from, "\"%s\"", b);
    snprintf(to, sizeof to, "\"%s\"", a);
    edit_shard_header(pa, from, to);
}

/* Shift one tensor's offsets to create a gap / overlap. */
static void shift_first_begin(const char *d, const char *to)
{
    edit_header(d, "\"data_offsets\":[0,", to);
}
static void m_gap(const char *d)
{
    shift_first_begin(d, "\"data_offsets\":[2,");
}

/* Edits one tensor entry (the first whose name ends in suffix) of its shard's header as JSON:
 * a NULL dtype or rank 0 leaves that field alone; transpose swaps the two dims of a matrix. */
static void retag(const char *d, const char *suffix, const char *dtype, int rank, const int *shape,
                  int transpose)
{
    char name[256], path[4096];
    find_tensor(d, suffix, name, sizeof name, path, sizeof path);
    shard s = shard_read(path);
    cJSON *j = cJSON_Parse(s.header);
    cJSON *t = cJSON_GetObjectItem(j, name);
    if (dtype)
        cJSON_ReplaceItemInObject(t, "dtype", cJSON_CreateString(dtype));
    if (rank)
        cJSON_ReplaceItemInObject(t, "shape", cJSON_CreateIntArray(shape, rank));
    if (transpose) {
        cJSON *sh = cJSON_GetObjectItem(t, "shape");
        int a = cJSON_GetArrayItem(sh, 0)->valueint, b = cJSON_GetArrayItem(sh, 1)->valueint;
        ck_assert_msg(a != b, "transpose needs a non-square matrix");
        cJSON_ReplaceItemInObject(t, "shape", cJSON_CreateIntArray((int[]){b, a}, 2));
    }
    char *h = cJSON_PrintUnformatted(j);
    shard_write(path, h, s.data, s.dlen, -1);
    free(h);
    cJSON_Delete(j);
    shard_free(&s);
}
static void m_size_mismatch(const char *d)
{
    retag(d, "input_layernorm.weight", NULL, 1, (int[]){3}, 0);
}
static void m_misaligned_f4(const char *d)
{
    retag(d, "input_layernorm.weight", "F4", 1, (int[]){3}, 0);
}
static void m_int_dtype(const char *d)
{
    retag(d, "q_proj.weight", "I16", 0, NULL, 0);
}
static void m_wrong_shape(const char *d)
{
    retag(d, "mlp.down_proj.weight", NULL, 0, NULL, 1);
}

/* Rename a tensor in the header and the index: missing + unexpected. */
static void m_renamed(const char *d)
{
    char name[256], path[4096], from[300], to[300];
    find_tensor(d, "q_proj.weight", name, sizeof name, path, sizeof path);
    snprintf(from, sizeof from, "\"%s\"", name);
    snprintf(to, sizeof to, "\"%s_renamed\"", name);
    edit_shard_header(path, from, to);
    edit_text_file(d, "model.safetensors.index.json", from, to);
}

/* Rewrites the index after fn edited its JSON (weight_map and root). */
static void index_edit(const char *d, void (*fn)(cJSON *wm, cJSON *root, void *ctx), void *ctx)
{
    char ipath[4096];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", d);
    char *t = t_slurp(ipath, NULL);
    cJSON *idx = cJSON_Parse(t);
    fn(cJSON_GetObjectItem(idx, "weight_map"), idx, ctx);
    char *out = cJSON_Print(idx);
    t_write(ipath, out, strlen(out));
    free(out);
    free(t);
    cJSON_Delete(idx);
}

static void wm_drop(cJSON *wm, cJSON *root, void *name)
{
    (void)root;
    cJSON_DeleteItemFromObject(wm, name);
}

/* Remove the tensor with the highest offset from the first shard (header, data, index). */
static void m_missing(const char *d)
{
    char path[4096];
    first_shard(d, path, sizeof path);
    shard s = shard_read(path);
    cJSON *j = cJSON_Parse(s.header);
    cJSON *last = NULL;
    double best = -1;
    for (cJSON *c = j->child; c; c = c->next) {
        cJSON *off = cJSON_GetObjectItem(c, "data_offsets");
        if (off && cJSON_GetArrayItem(off, 0)->valuedouble > best) {
            best = cJSON_GetArrayItem(off, 0)->valuedouble;
            last = c;
        }
    }
    ck_assert(last != NULL);
    char name[256];
    snprintf(name, sizeof name, "%s", last->string);
    cJSON_DeleteItemFromObject(j, name);
    char *h = cJSON_PrintUnformatted(j);
    shard_write(path, h, s.data, (size_t)best, -1);
    free(h);
    cJSON_Delete(j);
    shard_free(&s);
    /* drop it from the index too, so only the schema notices */
    index_edit(d, wm_drop, name);
}

static void wm_wrong_shard(cJSON *wm, cJSON *root, void *ctx)
{
    (void)ctx;
    (void)root;
    /* point the first entry at another shard, which does not hold it */
    cJSON *first = wm->child, *other = wm->child;
    while (other && !strcmp(other->valuestring, first->valuestring))
        other = other->next;
    ck_assert_msg(other != NULL, "need two shards");
    cJSON_SetValuestring(first, other->valuestring);
}
static void wm_absent(cJSON *wm, cJSON *root, void *ctx)
{
    (void)ctx;
    (void)root;
    cJSON_AddStringToObject(wm, "model.layers.0.self_attn.ghost.weight", wm->child->valuestring);
}
static void wm_unlisted(cJSON *wm, cJSON *root, void *ctx)
{
    (void)ctx;
    (void)root;
    cJSON_DeleteItemFromObject(wm, wm->child->string);
}
static void wm_bad_shard_name(cJSON *wm, cJSON *root, void *ctx)
{
    (void)ctx;
    (void)root;
    cJSON_SetValuestring(wm->child, "../outside.safetensors");
}
static void wm_total_size(cJSON *wm, cJSON *root, void *ctx)
{
    (void)ctx;
    (void)wm;
    cJSON *meta = cJSON_GetObjectItem(root, "metadata");
    cJSON_ReplaceItemInObject(meta, "total_size", cJSON_CreateNumber(12345));
}
static void m_index_wrong_shard(const char *d)
{
    index_edit(d, wm_wrong_shard, NULL);
}
static void m_index_absent(const char *d)
{
    index_edit(d, wm_absent, NULL);
}
static void m_index_unlisted(const char *d)
{
    index_edit(d, wm_unlisted, NULL);
}
static void m_index_shard_name(const char *d)
{
    index_edit(d, wm_bad_shard_name, NULL);
}
static void m_total_size(const char *d)
{
    index_edit(d, wm_total_size, NULL);
}

static void m_index_duplicate(const char *d)
{
    edit_text_file(d, "model.safetensors.index.json", "\"weight_map\":{",
                   "\"weight_map\":{\"lm_head.weight\":\"x.safetensors\",");
}
static void m_index_bad_json(const char *d)
{
    edit_text_file(d, "model.safetensors.index.json", "\"weight_map\"", "weight_map");
}

static void m_index_missing(const char *d)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    ck_assert(unlink(p) == 0);
}

static void m_missing_shard(const char *d)
{
    char p[4096];
    first_shard(d, p, sizeof p);
    ck_assert(unlink(p) == 0);
}

static void m_shard_is_dir(const char *d)
{
    char p[4096];
    first_shard(d, p, sizeof p);
    ck_assert(unlink(p) == 0);
    ck_assert(mkdir(p, 0755) == 0);
}

static void m_config_bad_json(const char *d)
{
    edit_text_file(d, "config.json", "{", "{,");
}
static void m_config_missing_key(const char *d)
{
    edit_text_file(d, "config.json", "\"hidden_size\":", "\"hidden_sizes\":");
}
static void m_config_type(const char *d)
{
    edit_text_file(d, "config.json", "\"vocab_size\":", "\"vocab_size\":\"x\",\"_was\":");
}
static void m_config_family(const char *d)
{
    edit_text_file(d, "config.json", "\"kimi_linear\"", "\"llama\"");
}
static void m_config_layers(const char *d)
{
    edit_text_file(d, "config.json", "\"full_attn_layers\":[", "\"full_attn_layers\":[1,");
}
static void m_config_missing(const char *d)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", d);
    ck_assert(unlink(p) == 0);
}
static void m_config_fifo(const char *d)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", d);
    ck_assert(unlink(p) == 0);
    ck_assert(mkfifo(p, 0644) == 0); /* opening it must not wait for a writer */
}
static void m_config_geometry(const char *d)
{
    edit_text_file(d, "config.json", "\"hidden_size\":64", "\"hidden_size\":96");
}

/* Appends n bytes (a NUL may be one of them) to a file of the checkpoint. */
static void append_bytes(const char *d, const char *name, const char *bytes, size_t n)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", d, name);
    FILE *f = fopen(p, "ab");
    ck_assert_msg(f != NULL && fwrite(bytes, 1, n, f) == n, "cannot append to %s", p);
    fclose(f);
}

/* Issue 9 defect 5: one JSON value plus whitespace, UTF-8 without BOM or NUL, integers as
 * integers, in every JSON file audit reads. */
static void m_config_trailing(const char *d)
{
    append_bytes(d, "config.json", "\n{}", 3);
}
static void m_config_nul(const char *d)
{
    append_bytes(d, "config.json", "\n\0", 2);
}
static void m_config_bom(const char *d)
{
    edit_text_file(d, "config.json", "{", "\xef\xbb\xbf{");
}
static void m_config_not_utf8(const char *d)
{
    edit_text_file(d, "config.json", "\"kimi_linear\"", "\"kimi_linear\",\"x\":\"\xc0\xaf\"");
}
static void m_config_int_fraction(const char *d)
{
    edit_text_file(d, "config.json", "\"hidden_size\":64", "\"hidden_size\":64.0");
}
static void m_config_int_exponent(const char *d)
{
    edit_text_file(d, "config.json", "\"hidden_size\":64", "\"hidden_size\":6.4e1");
}
static void m_shape_fraction(const char *d)
{
    edit_header(d, "\"shape\":[", "\"shape\":[1.0,");
}
static void m_offset_exponent(const char *d)
{
    edit_header(d, "\"data_offsets\":[0,", "\"data_offsets\":[0e0,");
}
static void m_index_trailing(const char *d)
{
    append_bytes(d, "model.safetensors.index.json", " x", 2);
}
static void m_index_total_fraction(const char *d)
{
    edit_text_file(d, "model.safetensors.index.json", "\"total_size\":",
                   "\"total_size\":1.5e3,\"x\":");
}

/* ---- the table ----------------------------------------------------------------------------- */

typedef struct corpus_case {
    const char *name;
    void (*mutate)(const char *dir);
    int exit_code;
    const char *rule; /* must appear in the output (JSON findings or stderr) */
} corpus_case;

static const corpus_case cases[] = {
    {"clean", m_none, 0, NULL},
    {"file shorter than 8 bytes", m_file_tiny, 1, "ST-HEADER-SMALL"},
    {"header length over 100 MB", m_header_huge, 1, "ST-HEADER-LARGE"},
    {"header length past end of file", m_header_past_eof, 1, "ST-HEADER-LENGTH"},
    {"truncated shard", m_truncated, 1, "ST-FILE-LENGTH"},
    {"padded shard", m_padded, 1, "ST-FILE-LENGTH"},
    {"header not UTF-8", m_not_utf8, 1, "ST-UTF8"},
    {"header not JSON", m_bad_json, 1, "ST-JSON"},
    {"header not an object", m_not_object, 1, "ST-JSON"},
    {"unknown dtype", m_bad_dtype, 1, "ST-DTYPE"},
    {"non-string metadata", m_meta_number, 1, "ST-METADATA"},
    {"tensor named __metadata__", m_meta_tensor, 1, "ST-"},
    {"negative shape", m_negative_shape, 1, "ST-SHAPE"},
    {"fractional offset", m_fraction_offset, 1, "ST-OFFSETS"},
    {"unknown tensor field", m_unknown_field, 1, "ST-FIELD"},
    {"rank above 8", m_rank9, 1, "ST-SHAPE"},
    {"offset beyond 2^48", m_offset_huge, 1, "ST-OFFSETS"},
    {"shape product overflows", m_shape_overflow, 1, "ST-OVERFLOW"},
    {"duplicate tensor name", m_duplicate, 1, "ST-DUPLICATE"},
    {"hole between tensors", m_gap, 1, "ST-"},
    {"size does not match shape", m_size_mismatch, 1, "ST-SIZE"},
    {"F4 with odd element count", m_misaligned_f4, 1, "ST-MISALIGNED"},
    {"integer dtype for a weight", m_int_dtype, 1, "SCHEMA-DTYPE"},
    {"transposed weight", m_wrong_shape, 1, "SCHEMA-SHAPE"},
    {"renamed tensor", m_renamed, 1, "SCHEMA-UNEXPECTED"},
    {"missing tensor", m_missing, 1, "SCHEMA-MISSING"},
    {"index names the wrong shard", m_index_wrong_shard, 1, "IDX-WRONG-SHARD"},
    {"index names an absent tensor", m_index_absent, 1, "IDX-ABSENT"},
    {"tensor not in the index", m_index_unlisted, 1, "IDX-UNLISTED"},
    {"index shard name escapes the directory", m_index_shard_name, 1, "IDX-SHARD-NAME"},
    {"index duplicate key", m_index_duplicate, 1, "IDX-DUPLICATE"},
    {"index not JSON", m_index_bad_json, 1, "IDX-JSON"},
    {"index missing for several shards", m_index_missing, 1, "IDX-MISSING"},
    {"total_size wrong (warning only)", m_total_size, 0, "IDX-TOTAL-SIZE"},
    {"missing shard", m_missing_shard, 1, "FILE-OPEN"},
    {"shard is a directory", m_shard_is_dir, 1, "FILE-NOT-REGULAR"},
    {"config not JSON", m_config_bad_json, 1, "CFG-JSON"},
    {"config missing key", m_config_missing_key, 1, "CFG-MISSING"},
    {"config wrong value type", m_config_type, 1, "CFG-JSON"},
    {"config unknown model_type", m_config_family, 1, "CFG-FAMILY"},
    {"config layer in both lists", m_config_layers, 1, "CFG-RANGE"},
    {"config.json missing", m_config_missing, 1, "config.json"},
    {"config.json is a FIFO", m_config_fifo, 1, "FILE-NOT-REGULAR"},
    {"config geometry does not match tensors", m_config_geometry, 1, "SCHEMA-SHAPE"},
    {"config with a second value after it", m_config_trailing, 1, "CFG-JSON"},
    {"config with a NUL after it", m_config_nul, 1, "CFG-JSON"},
    {"config with a byte-order mark", m_config_bom, 1, "CFG-JSON"},
    {"config not UTF-8", m_config_not_utf8, 1, "CFG-UTF8"},
    {"config integer written 64.0", m_config_int_fraction, 1, "CFG-JSON"},
    {"config integer written 6.4e1", m_config_int_exponent, 1, "CFG-JSON"},
    {"header dimension written 1.0", m_shape_fraction, 1, "ST-SHAPE"},
    {"header offset written 0e0", m_offset_exponent, 1, "ST-OFFSETS"},
    {"index with bytes after it", m_index_trailing, 1, "IDX-JSON"},
    {"index total_size not written as an integer", m_index_total_fraction, 1, "IDX-TOTAL-SIZE"},
};
#define N_CASES (sizeof cases / sizeof cases[0])

/* g_root/caseNN[suffix]: a copy of the base checkpoint broken as case c says. */
static void make_case(const corpus_case *c, int idx, const char *suffix, char *dir, size_t n)
{
    char cmd[8192];
    snprintf(dir, n, "%s/case%02d%s", g_root, idx, suffix);
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", g_base, dir);
    ck_assert(system(cmd) == 0);
    c->mutate(dir);
}

static void run_case(const corpus_case *c, int idx)
{
    char dir[1100], cmd[8192], out[1200], errf[1200];
    make_case(c, idx, "", dir, sizeof dir);
    snprintf(out, sizeof out, "%s.out", dir);
    snprintf(errf, sizeof errf, "%s.err", dir);
    snprintf(cmd, sizeof cmd, "'%s' audit '%s' --json > '%s' 2> '%s'", g_kl, dir, out, errf);
    int st = system(cmd);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    char *o = t_slurp(out, NULL), *e = t_slurp(errf, NULL);
    ck_assert_msg(code == c->exit_code,
                  "case '%s': exit %d, expected %d\nstdout: %.600s\nstderr: %.600s", c->name, code,
                  c->exit_code, o, e);
    if (c->rule)
        ck_assert_msg(strstr(o, c->rule) || strstr(e, c->rule),
                      "case '%s': rule/message '%s' not reported\nstdout: %.900s\nstderr: %.600s",
                      c->name, c->rule, o, e);
    if (c->exit_code == 1) {
        cJSON *j = cJSON_Parse(o);
        ck_assert_msg(j != NULL, "case '%s': stdout is not JSON", c->name);
        ck_assert_msg(cJSON_IsFalse(cJSON_GetObjectItem(j, "ok")), "case '%s': ok not false",
                      c->name);
        cJSON_Delete(j);
    }
    free(o);
    free(e);
    t_rmrf(dir);
}

/* The rule of the first error finding of `kl audit DIR --json` ("" if none). */
static void audit_first_rule(const char *dir, char *rule, size_t n)
{
    char cmd[8192], out[1200];
    snprintf(out, sizeof out, "%s.audit", dir);
    snprintf(cmd, sizeof cmd, "'%s' audit '%s' --json > '%s' 2> /dev/null", g_kl, dir, out);
    ck_assert(system(cmd) != -1);
    char *o = t_slurp(out, NULL);
    cJSON *j = cJSON_Parse(o);
    ck_assert_msg(j != NULL, "audit of %s: not JSON: %.300s", dir, o);
    rule[0] = 0;
    for (cJSON *f = cJSON_GetObjectItem(j, "findings")->child; f && !rule[0]; f = f->next)
        if (!strcmp(cJSON_GetObjectItem(f, "severity")->valuestring, "error"))
            snprintf(rule, n, "[%s]", cJSON_GetObjectItem(f, "rule")->valuestring);
    cJSON_Delete(j);
    free(o);
}

/* `kl run` loads what audit passes and refuses what it refuses: exit 1, one stderr line with
 * audit's first error rule and a pointer to kl audit. */
static void run_engine_case(const corpus_case *c, int idx)
{
    char dir[1100], cmd[8192], errf[1200], rule[64];
    make_case(c, idx, "-run", dir, sizeof dir);
    audit_first_rule(dir, rule, sizeof rule);
    snprintf(errf, sizeof errf, "%s.err", dir);
    snprintf(cmd, sizeof cmd, "'%s' run '%s' --ids 1,2 -n 1 > /dev/null 2> '%s'", g_kl, dir, errf);
    int st = system(cmd);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    char *e = t_slurp(errf, NULL);
    ck_assert_msg(code == c->exit_code, "case '%s': kl run exit %d, audit's is %d\nstderr: %.600s",
                  c->name, code, c->exit_code, e);
    if (c->exit_code == 1)
        ck_assert_msg(strstr(e, rule) && strstr(e, "kl audit") &&
                      strchr(e, '\n') == e + strlen(e) - 1,
                      "case '%s': kl run should name audit's first error %s and kl audit in one "
                      "line: %.600s", c->name, rule, e);
    free(e);
    t_rmrf(dir);
}

START_TEST(corpus_case_is_reported)
{
    run_case(&cases[_i], _i);
}
END_TEST

START_TEST(engine_refuses_what_audit_refuses)
{
    run_engine_case(&cases[_i], _i);
}
END_TEST

START_TEST(corpus_has_thirty_broken_checkpoints)
{
    size_t broken = 0;
    for (size_t i = 0; i < N_CASES; i++)
        broken += cases[i].exit_code != 0;
    ck_assert_msg(broken >= 30, "only %zu broken cases", broken);
}
END_TEST

/* Runs kl with args (a shell fragment) and returns the exit status; output in *out. */
static int run_kl(const char *args, char **out)
{
    char cmd[8192], outf[1100];
    snprintf(outf, sizeof outf, "%s/run.out", g_root);
    snprintf(cmd, sizeof cmd, "'%s' %s > '%s' 2>&1", g_kl, args, outf);
    int st = system(cmd);
    *out = t_slurp(outf, NULL);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(transformers_written_checkpoint_audits_clean)
{
    /* tests/fixtures/ref_tiny was written by transformers (kimi_ref.py make --preset tiny). */
    char *o;
    int code = run_kl("audit tests/fixtures/ref_tiny --json", &o);
    ck_assert_msg(code == 0, "exit %d: %.2000s", code, o);
    cJSON *j = cJSON_Parse(o);
    ck_assert_msg(j != NULL, "not JSON: %.500s", o);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(j, "ok")));
    ck_assert_int_eq(cJSON_GetObjectItem(j, "tensors")->valueint, 151);
    ck_assert_int_eq(cJSON_GetObjectItem(j, "expected_tensors")->valueint, 151);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "findings")), 0);
    cJSON_Delete(j);
    free(o);
}
END_TEST

/* Runs `kl ARGS` expecting exit 0 and every shard's hash to match its expected value. */
static void expect_all_hashes_match(const char *args)
{
    char *o;
    int code = run_kl(args, &o);
    ck_assert_msg(code == 0, "exit %d: %.2000s", code, o);
    cJSON *j = cJSON_Parse(o);
    ck_assert_msg(j != NULL, "not JSON: %.500s", o);
    cJSON *hashes = cJSON_GetObjectItem(j, "hashes");
    ck_assert_int_ge(cJSON_GetArraySize(hashes), 2);
    for (cJSON *h = hashes->child; h; h = h->next)
        ck_assert_msg(cJSON_IsTrue(cJSON_GetObjectItem(h, "match")), "%s does not match",
                      cJSON_GetObjectItem(h, "file")->valuestring);
    cJSON_Delete(j);
    free(o);
}

START_TEST(audit_hash_equals_sha256sum_and_catches_a_flipped_byte)
{
    char dir[1100], cmd[8192], args[4096];
    snprintf(dir, sizeof dir, "%s/hashcase", g_root);
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s' && cd '%s' && sha256sum *.safetensors > ../SUMS",
             g_base, dir, dir);
    ck_assert(system(cmd) == 0);
    snprintf(args, sizeof args, "audit '%s' --expect '%s/SUMS' --json", dir, g_root);
    expect_all_hashes_match(args);
    /* flip one payload byte of the first shard: same size, valid header, wrong hash */
    char path[4096];
    first_shard(dir, path, sizeof path);
    FILE *f = fopen(path, "r+b");
    fseek(f, -1, SEEK_END);
    int c = fgetc(f);
    fseek(f, -1, SEEK_END);
    fputc(c ^ 0x5a, f);
    fclose(f);
    char *o;
    int code = run_kl(args, &o);
    ck_assert_msg(code == 1, "exit %d after a flipped byte: %.2000s", code, o);
    ck_assert_msg(strstr(o, "HASH-MISMATCH") != NULL, "no HASH-MISMATCH: %.2000s", o);
    free(o);
    t_rmrf(dir);
}
END_TEST

START_TEST(audit_reads_expected_hashes_from_a_hub_cache_snapshot)
{
    /* models--x--y/blobs/<sha256> and snapshots/<rev>/<shard> -> ../../blobs/<sha256>, as the
     * Hugging Face cache lays them out; the blob names are the expected hashes. */
    char root[1100], cmd[8192], args[4096];
    snprintf(root, sizeof root, "%s/models--t--tiny", g_root);
    snprintf(cmd, sizeof cmd,
             "set -e; mkdir -p '%s/blobs' '%s/snapshots/rev1'; cd '%s'; "
             "for f in *; do h=$(sha256sum \"$f\" | cut -c1-64); cp \"$f\" '%s/blobs/'$h; "
             "ln -s ../../blobs/$h '%s/snapshots/rev1/'\"$f\"; done",
             root, root, g_base, root, root);
    ck_assert_msg(system(cmd) == 0, "cannot build the snapshot");
    snprintf(args, sizeof args, "audit '%s/snapshots/rev1' --hash --json", root);
    expect_all_hashes_match(args);
    /* a blob overwritten through its link keeps its name but not its hash */
    snprintf(cmd, sizeof cmd,
             "f=$(ls '%s/snapshots/rev1/'*.safetensors | head -1); "
             "printf 'x' | dd of=\"$f\" bs=1 seek=$(($(stat -c %%s \"$f\") - 1)) conv=notrunc "
             "status=none",
             root);
    ck_assert(system(cmd) == 0);
    char *o;
    int code = run_kl(args, &o);
    ck_assert_msg(code == 1 && strstr(o, "HASH-MISMATCH"), "exit %d: %.2000s", code, o);
    free(o);
    t_rmrf(root);
}
END_TEST

static void setup(void)
{
    g_kl = getenv("KL_BIN");
    ck_assert_msg(g_kl && *g_kl, "KL_BIN must name the kl binary under test");
    t_mkdtemp(g_root, sizeof g_root);
    snprintf(g_base, sizeof g_base, "%s/base", g_root);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' synth '%s' --preset tiny --seed 5 -q > /dev/null", g_kl,
             g_base);
    ck_assert_msg(system(cmd) == 0, "kl synth failed: %s", cmd);
}

static void teardown(void)
{
    t_rmrf(g_root);
}

int main(void)
{
    Suite *s = suite_create("corpus");
    TCase *tc = tcase_create("broken checkpoints");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, corpus_case_is_reported, 0, (int)N_CASES);
    tcase_add_loop_test(tc, engine_refuses_what_audit_refuses, 0, (int)N_CASES);
    tcase_add_test(tc, corpus_has_thirty_broken_checkpoints);
    tcase_add_test(tc, transformers_written_checkpoint_audits_clean);
    tcase_add_test(tc, audit_hash_equals_sha256sum_and_catches_a_flipped_byte);
    tcase_add_test(tc, audit_reads_expected_hashes_from_a_hub_cache_snapshot);
    suite_add_tcase(s, tc);
    return t_run_suite(s);
}
