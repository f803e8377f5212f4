/*
 * loader/safetensors.c — strict safetensors header parser (see safetensors.h).
 *
 * Divisions, in order: includes and constants; error helpers; JSON value helpers; metadata and
 * tensor entries; whole-header checks (sort, duplicates, contiguity, file length); header-level
 * steps; the plain header, read without a tree (the fast path); public API in header order.
 *
 * common/json parses the header strictly (UTF-8, one value, number grammar, integers as
 * written); cJSON keeps duplicate keys as siblings, so the entry walk finds those.
 */
#include "loader/safetensors.h"

#include "common/checked.h"
#include "common/fs.h"
#include "common/grow.h"
#include "common/json.h"
#include "common/mem.h"
#include "common/numfmt.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define META_KEY "__metadata__"

/* State of one kl_st_parse call. */
typedef struct st_parse {
    kl_st_file *f;
    char *str_next; /* next free byte of f->strings */
    kl_err *err;
} st_parse;

/* ------------------------------------------------------------------------------------------ */
/* Error helpers                                                                              */

/* The JSON type of v with its article, for messages ("an array"). */
static const char *json_type_name(const cJSON *v)
{
    if (cJSON_IsObject(v))
        return "an object";
    if (cJSON_IsArray(v))
        return "an array";
    if (cJSON_IsString(v))
        return "a string";
    if (cJSON_IsNumber(v))
        return "a number";
    if (cJSON_IsBool(v))
        return "a boolean";
    if (cJSON_IsNull(v))
        return "null";
    return "an unknown value";
}

/* ------------------------------------------------------------------------------------------ */
/* JSON value helpers                                                                         */

/* Reads an integer in 0..2^48-1 (JSON schema bound for shapes and offsets) as written: 64.0 and
 * 6.4e1 are not integers.  NULL on success, else why not. */
static const char *get_u48(const cJSON *v, uint64_t *out)
{
    kl_json_int r = kl_json_get_u64(v, KL_ST_MAX_DIM, out);
    if (r == KL_JSON_INT_TOO_LARGE)
        return "is larger than 2^48-1";
    return r == KL_JSON_INT_OK ? NULL : kl_json_int_why(r);
}

static size_t count_children(const cJSON *v)
{
    size_t n = 0;
    for (const cJSON *c = v->child; c; c = c->next)
        n++;
    return n;
}

static size_t str_size(const char *s)
{
    return s ? strlen(s) + 1 : 0;
}

/* Bytes of f->strings needed for every tensor name and metadata key/value (NULs included). */
static size_t strings_needed(const cJSON *root)
{
    size_t total = 0;
    for (const cJSON *c = root->child; c; c = c->next) {
        total += str_size(c->string);
        if (c->string && strcmp(c->string, META_KEY) == 0 && cJSON_IsObject(c))
            for (const cJSON *m = c->child; m; m = m->next)
                total += str_size(m->string) + (cJSON_IsString(m) ? str_size(m->valuestring) : 0);
    }
    return total;
}

/* Copies s into f->strings; strings_needed sized the buffer for every call. */
static const char *keep_str(st_parse *ps, const char *s)
{
    size_t n = strlen(s) + 1;
    char *dst = ps->str_next;
    memcpy(dst, s, n);
    ps->str_next += n;
    return dst;
}

/* ------------------------------------------------------------------------------------------ */
/* Metadata and tensor entries                                                                */

/* An object under __metadata__ with an array-valued shape or data_offsets is a tensor that a
 * writer let through under the reserved name (safetensors#849), not metadata. */
static int looks_like_tensor(const cJSON *v)
{
    return cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(v, "data_offsets")) ||
           cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(v, "shape"));
}

static int parse_metadata(st_parse *ps, const cJSON *v)
{
    kl_st_file *f = ps->f;
    if (f->has_metadata)
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-DUPLICATE", NULL, KL_NO_OFFSET,
                          "__metadata__ appears twice");
    if (!cJSON_IsObject(v))
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-NAME", META_KEY, KL_NO_OFFSET,
                          "__metadata__ is reserved for an object of strings, found %s",
                          json_type_name(v));
    if (looks_like_tensor(v))
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-NAME", META_KEY, KL_NO_OFFSET,
                          "a tensor may not be named __metadata__ (reserved key)");
    size_t n = count_children(v);
    kl_strmap seen;
    f->meta = kl_calloc(n ? n : 1, sizeof *f->meta);
    if (!f->meta || kl_strmap_init(&seen, n))
        return kl_fail(ps->err, KL_E_NOMEM, "out of memory for %zu metadata entries", n);
    int rc = 0;
    for (const cJSON *m = v->child; m && !rc; m = m->next) {
        if (!cJSON_IsString(m)) {
            rc = kl_fail_at(ps->err, KL_E_FORMAT, "ST-METADATA", NULL, KL_NO_OFFSET,
                            "__metadata__ value of \"%.64s\" is %s, not a string", m->string,
                            json_type_name(m));
            break;
        }
        kl_st_meta *e = &f->meta[f->n_meta];
        e->key = keep_str(ps, m->string);
        e->value = keep_str(ps, m->valuestring);
        int put = kl_strmap_put(&seen, e->key, (uint32_t)f->n_meta, NULL);
        if (put < 0)
            rc = kl_fail(ps->err, KL_E_NOMEM, "out of memory indexing metadata");
        else if (put == 1)
            rc = kl_fail_at(ps->err, KL_E_FORMAT, "ST-METADATA", NULL, KL_NO_OFFSET,
                            "__metadata__ key \"%.64s\" appears twice", e->key);
        f->n_meta++;
    }
    kl_strmap_free(&seen);
    f->has_metadata = 1;
    return rc;
}

/* The three fields of a tensor entry, each at most once; anything else is ST-FIELD. */
typedef struct tensor_fields {
    const cJSON *dtype, *shape, *offsets;
} tensor_fields;

static int collect_fields(st_parse *ps, const cJSON *ent, tensor_fields *tf)
{
    memset(tf, 0, sizeof *tf);
    for (const cJSON *c = ent->child; c; c = c->next) {
        const cJSON **slot = NULL;
        if (strcmp(c->string, "dtype") == 0)
            slot = &tf->dtype;
        else if (strcmp(c->string, "shape") == 0)
            slot = &tf->shape;
        else if (strcmp(c->string, "data_offsets") == 0)
            slot = &tf->offsets;
        if (!slot)
            return kl_fail_at(ps->err, KL_E_FORMAT, "ST-FIELD", ent->string, KL_NO_OFFSET,
                              "unknown field \"%.64s\" in tensor entry", c->string);
        if (*slot)
            return kl_fail_at(ps->err, KL_E_FORMAT, "ST-FIELD", ent->string, KL_NO_OFFSET,
                              "field \"%s\" appears twice", c->string);
        *slot = c;
    }
    return 0;
}

static int parse_offsets(st_parse *ps, const char *name, const cJSON *v, kl_st_tensor *t)
{
    const char *why = NULL;
    if (!v)
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-OFFSETS", name, KL_NO_OFFSET,
                          "data_offsets missing");
    if (!cJSON_IsArray(v) || count_children(v) != 2)
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-OFFSETS", name, KL_NO_OFFSET,
                          "data_offsets must be an array of two integers");
    if ((why = get_u48(v->child, &t->begin)) || (why = get_u48(v->child->next, &t->end)))
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-OFFSETS", name, KL_NO_OFFSET,
                          "data_offsets entry %s", why);
    /* data_off <= file_bytes and begin < 2^48: the sum cannot wrap. */
    t->file_off = ps->f->data_off + t->begin;
    if (t->end < t->begin)
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-OFFSETS", name, t->file_off,
                          "data_offsets end %" PRIu64 " is before begin %" PRIu64, t->end,
                          t->begin);
    t->n_bytes = t->end - t->begin;
    return 0;
}

static int parse_dtype(st_parse *ps, const char *name, const cJSON *v, kl_st_tensor *t)
{
    if (!v)
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-DTYPE", name, t->file_off, "dtype missing");
    if (!cJSON_IsString(v))
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-DTYPE", name, t->file_off,
                          "dtype is %s, not a string", json_type_name(v));
    t->dtype = kl_dtype_parse(v->valuestring, strlen(v->valuestring));
    if (t->dtype == KL_DT_INVALID)
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-DTYPE", name, t->file_off,
                          "unknown dtype \"%.32s\"", v->valuestring);
    return 0;
}

static int parse_shape(st_parse *ps, const char *name, const cJSON *v, kl_st_tensor *t)
{
    if (!v)
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-SHAPE", name, t->file_off, "shape missing");
    if (!cJSON_IsArray(v))
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-SHAPE", name, t->file_off,
                          "shape is %s, not an array", json_type_name(v));
    size_t rank = count_children(v);
    if (rank > KL_ST_MAX_RANK)
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-SHAPE", name, t->file_off,
                          "rank %zu is above the supported maximum of %d", rank, KL_ST_MAX_RANK);
    t->rank = (int)rank;
    int i = 0;
    for (const cJSON *d = v->child; d; d = d->next, i++) {
        const char *why = get_u48(d, &t->shape[i]);
        if (why)
            return kl_fail_at(ps->err, KL_E_FORMAT, "ST-SHAPE", name, t->file_off, "shape[%d] %s",
                              i, why);
    }
    return 0;
}

/* numel and bytes from shape and dtype, checked against data_offsets (crate order: overflow,
 * then misalignment, then size). */
static int check_tensor_size(st_parse *ps, kl_st_tensor *t)
{
    uint64_t numel = 1, bits;
    for (int i = 0; i < t->rank; i++)
        if (kl_mul_u64(numel, t->shape[i], &numel))
            return kl_fail_at(ps->err, KL_E_FORMAT, "ST-OVERFLOW", t->name, t->file_off,
                              "shape product overflows 64 bits");
    t->numel = numel;
    if (kl_mul_u64(numel, kl_dtype_bits(t->dtype), &bits))
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-OVERFLOW", t->name, t->file_off,
                          "size in bits of %" PRIu64 " %s elements overflows 64 bits", numel,
                          kl_dtype_name(t->dtype));
    if (bits % 8)
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-MISALIGNED", t->name, t->file_off,
                          "%" PRIu64 " %s elements are %" PRIu64 " bits, not whole bytes", numel,
                          kl_dtype_name(t->dtype), bits);
    if (bits / 8 != t->n_bytes)
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-SIZE", t->name, t->file_off,
                          "data_offsets span %" PRIu64 " bytes, shape and dtype %s need %" PRIu64,
                          t->n_bytes, kl_dtype_name(t->dtype), bits / 8);
    return 0;
}

static int parse_tensor(st_parse *ps, const cJSON *ent, kl_st_tensor *t)
{
    const char *name = ent->string;
    tensor_fields tf;
    int rc;
    memset(t, 0, sizeof *t);
    t->file_off = KL_NO_OFFSET;
    if (!name[0])
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-NAME", NULL, KL_NO_OFFSET, "empty tensor name");
    if (!cJSON_IsObject(ent))
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-JSON", name, KL_NO_OFFSET,
                          "tensor entry is %s, not an object", json_type_name(ent));
    /* Offsets first, so that every later message can point at the tensor's bytes. */
    if ((rc = collect_fields(ps, ent, &tf)) || (rc = parse_offsets(ps, name, tf.offsets, t)) ||
        (rc = parse_dtype(ps, name, tf.dtype, t)) || (rc = parse_shape(ps, name, tf.shape, t)))
        return rc;
    t->name = keep_str(ps, name);
    return check_tensor_size(ps, t);
}

static int parse_entries(st_parse *ps, const cJSON *root)
{
    kl_st_file *f = ps->f;
    for (const cJSON *c = root->child; c; c = c->next) {
        int rc = strcmp(c->string, META_KEY) == 0
                     ? parse_metadata(ps, c)
                     : parse_tensor(ps, c, &f->tensors[f->n_tensors++]);
        if (rc)
            return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Whole-header checks                                                                        */

/* (begin, end), as the crate sorts; the name breaks ties between zero-size tensors so the
 * order does not depend on qsort. */
static int cmp_offsets(const void *a, const void *b)
{
    const kl_st_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Builds by_name over the sorted table; a name seen twice is ST-DUPLICATE (cJSON keeps both
 * members, serde would silently keep the last one). */
static int index_names(st_parse *ps)
{
    kl_st_file *f = ps->f;
    if (kl_strmap_init(&f->by_name, f->n_tensors))
        return kl_fail(ps->err, KL_E_NOMEM, "out of memory indexing %zu tensors", f->n_tensors);
    for (size_t i = 0; i < f->n_tensors; i++) {
        kl_st_tensor *t = &f->tensors[i];
        uint32_t first = 0;
        t->name_hash = kl_strmap_hash(t->name);
        int put = kl_strmap_put_h(&f->by_name, t->name, t->name_hash, (uint32_t)i, &first);
        if (put < 0)
            return kl_fail(ps->err, KL_E_NOMEM, "out of memory indexing tensors");
        if (put == 1)
            return kl_fail_at(ps->err, KL_E_FORMAT, "ST-DUPLICATE", t->name, t->file_off,
                              "tensor name appears twice (other entry at offset %" PRIu64 ")",
                              f->tensors[first].file_off);
    }
    return 0;
}

/* The data section must be covered exactly: sorted entries start at 0, each begins where the
 * previous one ended (no hole, no overlap). */
static int check_contiguous(st_parse *ps)
{
    const kl_st_file *f = ps->f;
    uint64_t expect = 0;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const kl_st_tensor *t = &f->tensors[i];
        if (t->begin > expect)
            return kl_fail_at(ps->err, KL_E_FORMAT, "ST-OFFSET-GAP", t->name, t->file_off,
                              "hole of %" PRIu64 " bytes before this tensor: data offsets %" PRIu64
                              "..%" PRIu64 " belong to no tensor",
                              t->begin - expect, expect, t->begin);
        if (t->begin < expect)
            return kl_fail_at(ps->err, KL_E_FORMAT, "ST-OFFSET-GAP", t->name, t->file_off,
                              "overlaps %s, which ends at data offset %" PRIu64
                              " (this one begins at %" PRIu64 ")",
                              f->tensors[i - 1].name, expect, t->begin);
        expect = t->end;
    }
    return 0;
}

static int check_file_length(st_parse *ps)
{
    const kl_st_file *f = ps->f;
    uint64_t data_bytes = f->n_tensors ? f->tensors[f->n_tensors - 1].end : 0, want;
    const char *last = f->n_tensors ? f->tensors[f->n_tensors - 1].name : NULL;
    if (kl_add_u64(f->data_off, data_bytes, &want))
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-FILE-LENGTH", last, KL_NO_OFFSET,
                          "data section end overflows 64 bits");
    if (want < f->file_bytes)
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-FILE-LENGTH", NULL, want,
                          "%" PRIu64 " trailing bytes after the data section (file is %" PRIu64
                          " bytes, tensors end at %" PRIu64 ")",
                          f->file_bytes - want, f->file_bytes, want);
    if (want > f->file_bytes)
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-FILE-LENGTH", last, f->file_bytes,
                          "file is %" PRIu64 " bytes shorter than its header says (truncated: "
                          "%" PRIu64 " bytes, tensors end at %" PRIu64 ")",
                          want - f->file_bytes, f->file_bytes, want);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Header-level steps of kl_st_parse                                                          */

/* The size rules, shared by kl_st_open (before reading the header) and kl_st_parse. */
static int check_lengths(uint64_t n, uint64_t file_bytes, kl_err *err)
{
    if (file_bytes < 8)
        return kl_fail_at(err, KL_E_FORMAT, "ST-HEADER-SMALL", NULL, 0,
                          "file is %" PRIu64 " bytes, too short for the 8-byte header length",
                          file_bytes);
    if (n > KL_ST_MAX_HEADER)
        return kl_fail_at(err, KL_E_FORMAT, "ST-HEADER-LARGE", NULL, 0,
                          "header length %" PRIu64 " is above the limit of %llu bytes", n,
                          KL_ST_MAX_HEADER);
    if (n > file_bytes - 8)
        return kl_fail_at(err, KL_E_FORMAT, "ST-HEADER-LENGTH", NULL, 0,
                          "header length %" PRIu64 " runs past the end of the file (%" PRIu64
                          " bytes)",
                          n, file_bytes);
    return 0;
}

/* One JSON object and only whitespace around it (common/json); offsets count from the file's
 * start.  Sets the leading-space warning: readers before safetensors 0.8 reject it, 0.8 accepts
 * it (page-aligned padding). */
static int parse_json(st_parse *ps, const uint8_t *hdr, size_t n, cJSON **out)
{
    cJSON *root = NULL;
    int rc = kl_json_parse((const char *)hdr, n, "ST", &root, ps->err);
    if (rc) {
        if (ps->err && ps->err->offset != KL_NO_OFFSET)
            ps->err->offset += 8;
        return rc;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kl_fail_at(ps->err, KL_E_FORMAT, "ST-JSON", NULL, 8,
                          "header is not a JSON object");
    }
    if (hdr[0] != '{') /* valid JSON whose value is an object: whitespace comes first */
        ps->f->warnings |= KL_ST_WARN_LEADING_SPACE;
    *out = root;
    return 0;
}

static int alloc_tables(st_parse *ps, const cJSON *root)
{
    kl_st_file *f = ps->f;
    size_t n = count_children(root);
    f->tensors = kl_calloc(n ? n : 1, sizeof *f->tensors);
    f->strings = kl_malloc(strings_needed(root) + 1);
    if (!f->tensors || !f->strings)
        return kl_fail(ps->err, KL_E_NOMEM, "out of memory for %zu header entries", n);
    ps->str_next = f->strings;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The plain header, read without a tree                                                      */

/* Headers as writers make them (plain strings and integers: common/json's kl_json_scan) are
 * read straight into the tables, about ten times faster than through a cJSON tree: a 48B
 * checkpoint's seven headers hold 40,461 tensors.  Anything else, any error included, declines
 * (returns 0) and kl_st_parse parses the header the strict way, which accepts or reports it
 * exactly, so results and messages never depend on the path. */

#define PLAIN_MAX_META 64   /* metadata entries read on the plain path; more decline */

/* Copies at[0..len) into f->strings (sized for the whole header), NUL-terminated. */
static const char *keep_span(st_parse *ps, const char *at, size_t len)
{
    char *dst = ps->str_next;
    memcpy(dst, at, len);
    dst[len] = '\0';
    ps->str_next += len + 1;
    return dst;
}

/* One member of __metadata__: a plain key and string value, the key not seen before. */
static int meta_member(void *ctx, kl_json_scan *s)
{
    st_parse *ps = ctx;
    kl_st_file *f = ps->f;
    const char *k, *v;
    size_t kn, vn;
    if (f->n_meta == PLAIN_MAX_META || !kl_json_scan_str(s, &k, &kn) ||
        !kl_json_scan_char(s, ':') || !kl_json_scan_str(s, &v, &vn))
        return 0;
    kl_st_meta *e = &f->meta[f->n_meta++];
    e->key = keep_span(ps, k, kn);
    e->value = keep_span(ps, v, vn);
    for (size_t i = 0; i + 1 < f->n_meta; i++)
        if (!strcmp(f->meta[i].key, e->key))
            return 0;
    return 1;
}

/* __metadata__, once, an object of plain strings with distinct keys. */
static int plain_metadata(st_parse *ps, kl_json_scan *s)
{
    kl_st_file *f = ps->f;
    if (f->has_metadata || !(f->meta = kl_calloc(PLAIN_MAX_META, sizeof *f->meta)))
        return 0;
    f->has_metadata = 1;
    return kl_json_scan_list(s, '{', '}', meta_member, ps);
}

/* One dimension of a shape: an integer <= 2^48-1, at most KL_ST_MAX_RANK of them. */
static int shape_dim(void *ctx, kl_json_scan *s)
{
    kl_st_tensor *t = ctx;
    if (t->rank == KL_ST_MAX_RANK || !kl_json_scan_u64(s, KL_ST_MAX_DIM, &t->shape[t->rank]))
        return 0;
    t->rank++;
    return 1;
}

/* A tensor entry being read: the tensor, the fields seen (each at most once), the number of
 * data_offsets read. */
typedef struct plain_entry {
    kl_st_tensor *t;
    unsigned      have;      /* 1 dtype, 2 shape, 4 data_offsets */
    unsigned      n_offsets;
} plain_entry;

/* One of data_offsets' two integers <= 2^48-1. */
static int offset_item(void *ctx, kl_json_scan *s)
{
    plain_entry *e = ctx;
    uint64_t *at = e->n_offsets == 0 ? &e->t->begin : e->n_offsets == 1 ? &e->t->end : NULL;
    e->n_offsets++;
    return at && kl_json_scan_u64(s, KL_ST_MAX_DIM, at);
}

/* One field of a tensor entry into e->t. */
static int field_item(void *ctx, kl_json_scan *s)
{
    plain_entry *e = ctx;
    const char *k, *v;
    size_t kn, vn;
    if (!kl_json_scan_str(s, &k, &kn) || !kl_json_scan_char(s, ':'))
        return 0;
    unsigned bit = kn == 5 && !memcmp(k, "dtype", 5)           ? 1u
                   : kn == 5 && !memcmp(k, "shape", 5)         ? 2u
                   : kn == 12 && !memcmp(k, "data_offsets", 12) ? 4u
                                                                : 0u;
    if (!bit || (e->have & bit))
        return 0;
    e->have |= bit;
    if (bit == 2)
        return kl_json_scan_list(s, '[', ']', shape_dim, e->t);
    if (bit == 4)
        return kl_json_scan_list(s, '[', ']', offset_item, e) && e->n_offsets == 2 &&
               e->t->end >= e->t->begin;
    return kl_json_scan_str(s, &v, &vn) &&
           (e->t->dtype = kl_dtype_parse(v, vn)) != KL_DT_INVALID;
}

/* One tensor entry named name[0..len); 1 when plain and valid. */
static int plain_tensor(st_parse *ps, kl_json_scan *s, const char *name, size_t len,
                        kl_st_tensor *t)
{
    memset(t, 0, sizeof *t);
    plain_entry e = {t, 0, 0};
    if (!len || !kl_json_scan_list(s, '{', '}', field_item, &e) || e.have != 7u)
        return 0;
    t->file_off = ps->f->data_off + t->begin;
    t->n_bytes = t->end - t->begin;
    t->name = keep_span(ps, name, len);
    st_parse quiet = *ps;   /* a size error declines: the strict path reports it */
    quiet.err = NULL;
    return check_tensor_size(&quiet, t) == 0;
}

/* The whole header being read: the parse, the tensor table's capacity. */
typedef struct plain_root {
    st_parse *ps;
    size_t    cap;
} plain_root;

/* One member of the header: __metadata__ or a tensor entry. */
static int root_member(void *ctx, kl_json_scan *s)
{
    plain_root *r = ctx;
    kl_st_file *f = r->ps->f;
    const char *name;
    size_t len;
    if (!kl_json_scan_str(s, &name, &len) || !kl_json_scan_char(s, ':'))
        return 0;
    if (len == sizeof META_KEY - 1 && !memcmp(name, META_KEY, len))
        return plain_metadata(r->ps, s);
    if (kl_grow(&f->tensors, &r->cap, f->n_tensors + 1, sizeof *f->tensors) ||
        !plain_tensor(r->ps, s, name, len, &f->tensors[f->n_tensors]))
        return 0;
    f->n_tensors++;
    return 1;
}

/* The whole header on the plain path: 1 when read (f's tables filled as parse_entries fills
 * them), 0 when declined (the tables may be half-filled: drop_tables). */
static int parse_plain(st_parse *ps, const uint8_t *hdr, size_t n)
{
    kl_st_file *f = ps->f;
    kl_json_scan s = {(const char *)hdr, (const char *)hdr + n};
    plain_root r = {ps, 0};
    if (!n || hdr[0] != '{' || !(f->strings = kl_malloc(n + 1)) ||
        kl_grow(&f->tensors, &r.cap, 1, sizeof *f->tensors))
        return 0;   /* leading whitespace: the strict path sets its warning */
    ps->str_next = f->strings;
    return kl_json_scan_list(&s, '{', '}', root_member, &r) && kl_json_scan_at_end(&s);
}

/* Frees what parse_plain filled, for the strict path to start over. */
static void drop_tables(kl_st_file *f)
{
    kl_free(f->tensors);
    kl_free(f->meta);
    kl_free(f->strings);
    f->tensors = NULL;
    f->meta = NULL;
    f->strings = NULL;
    f->n_tensors = f->n_meta = 0;
    f->has_metadata = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Public API                                                                                 */

static const char *file_type_name(mode_t m)
{
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISSOCK(m))
        return "a socket";
    if (S_ISCHR(m) || S_ISBLK(m))
        return "a device";
    return "not a regular file";
}

/* Reads the length prefix and the header bytes of an open file into *hdr (kl_malloc'd). */
static int read_header(int fd, const char *path, uint8_t **hdr, uint64_t *n, uint64_t *size,
                       kl_err *err)
{
    struct stat st;
    uint8_t prefix[8];
    if (fstat(fd, &st) != 0)
        return kl_fail_sys(err, KL_E_IO, errno, "cannot stat");
    if (!S_ISREG(st.st_mode))
        return kl_fail_rule(err, KL_E_FORMAT, "FILE-NOT-REGULAR", "is %s, not a safetensors file",
                            file_type_name(st.st_mode));
    *size = (uint64_t)st.st_size;
    int rc = check_lengths(0, *size, err);
    if (!rc)
        rc = kl_pread_all(fd, prefix, 8, 0, path, err);
    if (!rc)
        rc = check_lengths(kl_load_le64(prefix), *size, err);
    if (rc)
        return rc;
    *n = kl_load_le64(prefix);
    *hdr = kl_malloc((size_t)*n + 1);
    if (!*hdr)
        return kl_fail(err, KL_E_NOMEM, "out of memory for a %" PRIu64 "-byte header", *n);
    rc = kl_pread_all(fd, *hdr, (size_t)*n, 8, path, err);
    if (rc) {
        kl_free(*hdr);
        *hdr = NULL;
    }
    return rc;
}

int kl_st_open(kl_st_file *f, const char *path, kl_err *err)
{
    memset(f, 0, sizeof *f);
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is rejected after fstat.
     * Read-only: the auditor never opens a checkpoint for writing. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot open");
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    uint8_t *hdr = NULL;
    uint64_t n = 0, size = 0;
    int rc = read_header(fd, path, &hdr, &n, &size, err);
    close(fd);
    if (!rc)
        rc = kl_st_parse(f, path, hdr, n, size, err);
    kl_free(hdr);
    if (rc)
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
    return rc;
}

int kl_st_parse(kl_st_file *f, const char *path, const uint8_t *hdr, uint64_t n,
                uint64_t file_bytes, kl_err *err)
{
    st_parse ps = {.f = f, .str_next = NULL, .err = err};
    cJSON *root = NULL;
    memset(f, 0, sizeof *f);
    path = path ? path : "";
    int rc = !hdr && n ? kl_fail(err, KL_E_USAGE, "NULL header buffer of %" PRIu64 " bytes", n)
                       : check_lengths(n, file_bytes, err);
    if (rc)
        goto done;
    f->path = kl_strdup(path);
    if (!f->path) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory");
        goto done;
    }
    f->file_bytes = file_bytes;
    f->header_bytes = n;
    f->data_off = 8 + n;
    if (!parse_plain(&ps, hdr, (size_t)n)) {
        drop_tables(f);
        if ((rc = parse_json(&ps, hdr, (size_t)n, &root)) || (rc = alloc_tables(&ps, root)) ||
            (rc = parse_entries(&ps, root)))
            goto done;
    }
    qsort(f->tensors, f->n_tensors, sizeof *f->tensors, cmp_offsets);
    if ((rc = index_names(&ps)) || (rc = check_contiguous(&ps)) || (rc = check_file_length(&ps)))
        goto done;
    if (n > KL_ST_HUB_MAX_HEADER)
        f->warnings |= KL_ST_WARN_HUB_LIMIT;
    if (!f->has_metadata)
        f->warnings |= KL_ST_WARN_NO_METADATA;
done:
    cJSON_Delete(root);
    if (rc) {
        kl_st_close(f);
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
    }
    return rc;
}

void kl_st_close(kl_st_file *f)
{
    if (!f)
        return;
    kl_free(f->path);
    kl_free(f->tensors);
    kl_free(f->meta);
    kl_free(f->strings);
    kl_strmap_free(&f->by_name);
    memset(f, 0, sizeof *f);
}

const kl_st_tensor *kl_st_find(const kl_st_file *f, const char *name)
{
    uint32_t i;
    if (!f || !name || !kl_strmap_get(&f->by_name, name, &i))
        return NULL;
    return &f->tensors[i];
}

const char *kl_st_meta_get(const kl_st_file *f, const char *key)
{
    /* Metadata has a handful of entries (usually {"format": "pt"}): a scan beats a map. */
    if (!f || !key)
        return NULL;
    for (size_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[i].key, key) == 0)
            return f->meta[i].value;
    return NULL;
}
