/*
 * loader/ckcheck.c — the metadata check of an opened checkpoint (see ckcheck.h).
 *
 * Sections: findings (emit, per-rule tallies), files, index vs headers, duplicates, total
 * size, schema match, public API.
 */
#include "loader/ckcheck.h"

#include "common/mem.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- findings ------------------------------------------------------------------------------ */

#define MAX_TALLIES 48 /* distinct rules tallied; more rules than this are simply not capped */

/* Findings of one rule: how many were listed, how many only counted. */
typedef struct tally {
    char        rule[32];
    kl_severity sev;
    size_t      listed, hidden;
} tally;

/* A schema built ahead (kl_ckcheck_open_require): what kl_schema_build gave for the config. */
typedef struct schema_ahead {
    bool      done;      /* built (rc, err, s set) */
    int       rc;
    kl_err    err;
    kl_schema s;         /* valid when done and rc == 0; taken by build_schema */
} schema_ahead;

typedef struct chk {
    schema_ahead        *ahead;    /* NULL: build the schema in build_schema */
    const kl_checkpoint *ck;
    kl_ckcheck          *out;
    kl_finding_fn        fn;
    void                *ctx;
    int                  rc;       /* 1: stopped by the callback; < 0: failed */
    size_t               n_tallies;
    tally                tallies[MAX_TALLIES];
} chk;

static tally *tally_for(chk *k, const char *rule, kl_severity sev)
{
    for (size_t i = 0; i < k->n_tallies; i++)
        if (k->tallies[i].sev == sev && !strcmp(k->tallies[i].rule, rule))
            return &k->tallies[i];
    if (k->n_tallies == MAX_TALLIES)
        return NULL;
    tally *t = &k->tallies[k->n_tallies++];
    memset(t, 0, sizeof *t);
    kl_copy_text(t->rule, sizeof t->rule, rule);
    t->sev = sev;
    return t;
}

/* f->message from fmt, cut to fit. */
static void vset_msg(kl_finding *f, const char *fmt, va_list ap) KL_PRINTF(2, 0);
static void vset_msg(kl_finding *f, const char *fmt, va_list ap)
{
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    kl_copy_text(f->message, sizeof f->message, msg);
}

static void set_msg(kl_finding *f, const char *fmt, ...) KL_PRINTF(2, 3);
static void set_msg(kl_finding *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset_msg(f, fmt, ap);
    va_end(ap);
}

/* Hands f to the callback and counts it; nonzero when the check must end. */
static int deliver(chk *k, const kl_finding *f)
{
    if (k->rc)
        return k->rc;
    if (f->severity == KL_SEV_ERROR)
        k->out->n_errors++;
    else if (f->severity == KL_SEV_WARN)
        k->out->n_warnings++;
    else
        k->out->n_infos++;
    int r = k->fn ? k->fn(k->ctx, f) : 0;
    if (r > 0)
        k->out->stopped = true;
    k->rc = r > 0 ? 1 : r;
    return k->rc;
}

static void fill(kl_finding *f, kl_severity sev, const char *rule, const char *file,
                 const char *tensor, uint64_t offset)
{
    memset(f, 0, sizeof *f);
    f->severity = sev;
    f->offset = offset;
    kl_copy_text(f->rule, sizeof f->rule, rule ? rule : "");
    kl_copy_text(f->file, sizeof f->file, file ? file : "");
    kl_copy_text(f->tensor, sizeof f->tensor, tensor ? tensor : "");
}

/* Reports f (counted only, past KL_CKCHECK_LIST_MAX of its rule); nonzero when the check must
 * end. */
static int emit_finding(chk *k, const kl_finding *f)
{
    if (k->rc)
        return k->rc;
    tally *t = tally_for(k, f->rule, f->severity);
    if (t && t->listed >= KL_CKCHECK_LIST_MAX) {
        t->hidden++;
        return 0;
    }
    if (t)
        t->listed++;
    return deliver(k, f);
}

static int emit(chk *k, kl_severity sev, const char *rule, const char *file, const char *tensor,
                uint64_t offset, const char *fmt, ...) KL_PRINTF(7, 8);
static int emit(chk *k, kl_severity sev, const char *rule, const char *file, const char *tensor,
                uint64_t offset, const char *fmt, ...)
{
    kl_finding f;
    va_list ap;
    va_start(ap, fmt);
    kl_finding_vset(&f, sev, rule, file, tensor, offset, fmt, ap);
    va_end(ap);
    return emit_finding(k, &f);
}

/* One finding per rule that had more than KL_CKCHECK_LIST_MAX, counting the rest. */
static int emit_tallies(chk *k)
{
    for (size_t i = 0; i < k->n_tallies && !k->rc; i++) {
        const tally *t = &k->tallies[i];
        if (!t->hidden)
            continue;
        kl_finding f;
        fill(&f, t->sev, t->rule, k->ck->dir, NULL, KL_NO_OFFSET);
        set_msg(&f, "%zu more finding(s) of this rule not listed (%zu in all)", t->hidden,
                t->hidden + t->listed);
        deliver(k, &f);
    }
    return k->rc;
}

/* A parser's error as an error finding with the same context; prefix goes before its message. */
static int emit_err(chk *k, const kl_err *e, const char *default_rule, const char *default_file,
                    const char *prefix)
{
    kl_finding f;
    kl_finding_from_err(&f, KL_SEV_ERROR, e, default_rule, default_file);
    if (prefix[0]) {
        char msg[sizeof f.message];
        memcpy(msg, f.message, sizeof msg);
        set_msg(&f, "%s%s", prefix, msg);
    }
    return emit_finding(k, &f);
}

/* ---- files --------------------------------------------------------------------------------- */

/* "shard 7 of 20: " for a shard of a multi-shard checkpoint (index order), else "". */
static void shard_prefix(const kl_checkpoint *ck, size_t i, char *buf, size_t n)
{
    size_t total = ck->index_ok ? ck->index.n_shards : ck->n_shards;
    buf[0] = 0;
    if (total > 1 && (ck->shards[i].in_index || !ck->index_ok))
        snprintf(buf, n, "shard %zu of %zu: ", i + 1, total);
}

static int check_shard(chk *k, size_t i)
{
    const kl_checkpoint *ck = k->ck;
    const kl_ckpt_shard *s = &ck->shards[i];
    if (ck->index_ok && !s->in_index &&
        emit(k, KL_SEV_WARN, "CK-EXTRA-SHARD", s->path, NULL, KL_NO_OFFSET,
             "shard is not named by the index; its tensors are checked too"))
        return k->rc;
    if (!s->ok) {
        char prefix[64];
        shard_prefix(ck, i, prefix, sizeof prefix);
        k->out->n_bad_shards++;
        return emit_err(k, &s->err, "FILE-OPEN", s->path, prefix);
    }
    k->out->file_bytes += s->st.file_bytes;
    k->out->header_bytes += s->st.data_off;
    for (size_t j = 0; j < s->st.n_tensors; j++)
        k->out->tensor_bytes += s->st.tensors[j].n_bytes;
    if ((s->st.warnings & KL_ST_WARN_LEADING_SPACE) &&
        emit(k, KL_SEV_WARN, "ST-LEADING-SPACE", s->path, NULL, 8,
             "header starts with whitespace; safetensors readers before 0.8 reject it"))
        return k->rc;
    if (s->st.warnings & KL_ST_WARN_HUB_LIMIT)
        return emit(k, KL_SEV_WARN, "ST-HUB-LIMIT", s->path, NULL, KL_NO_OFFSET,
                    "header of %" PRIu64 " bytes exceeds huggingface_hub's 25 MB limit",
                    s->st.header_bytes);
    return 0;
}

static int check_files(chk *k)
{
    const kl_checkpoint *ck = k->ck;
    if (!ck->config_ok && emit_err(k, &ck->config_err, "FILE-OPEN", ck->config_path, ""))
        return k->rc;
    if (ck->has_index && !ck->index_ok &&
        emit_err(k, &ck->index_err, "FILE-OPEN", ck->index_path, ""))
        return k->rc;
    if (!ck->has_index && ck->n_shards > 1 &&
        emit(k, KL_SEV_ERROR, "IDX-MISSING", ck->index_path, NULL, KL_NO_OFFSET,
             "%zu shards but no index file", ck->n_shards))
        return k->rc;
    if (ck->n_shards == 0 && emit(k, KL_SEV_ERROR, "CK-NO-SHARDS", ck->dir, NULL, KL_NO_OFFSET,
                                  "no .safetensors shard found"))
        return k->rc;
    for (size_t i = 0; i < ck->n_shards; i++)
        if (check_shard(k, i))
            return k->rc;
    return 0;
}

/* ---- index vs headers ---------------------------------------------------------------------- */

/* Whether the index and the headers pair one to one: as many entries as tensors, each tensor
 * listed under the shard that holds it.  Names are distinct on both sides (IDX-DUPLICATE,
 * ST-DUPLICATE, no name in two shards), so every entry then has its tensor where it says and
 * check_index would find nothing: one lookup per tensor instead of two.  The lookups use the
 * hashes the shard headers computed. */
static int index_one_to_one(const kl_checkpoint *ck)
{
    const kl_index *idx = &ck->index;
    if (ck->n_tensors != idx->n_entries || ck->n_dup_across_shards)
        return 0;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const kl_ckpt_tensor *t = &ck->tensors[i];
        uint32_t e;
        if (!kl_strmap_get_h(&idx->by_tensor, t->name, t->t->name_hash, &e) ||
            ck->index_shard[idx->entries[e].shard] != t->shard)
            return 0;
    }
    return 1;
}

static int check_index(chk *k)
{
    const kl_checkpoint *ck = k->ck;
    if (!ck->index_ok || index_one_to_one(ck))
        return 0;
    const kl_index *idx = &ck->index;
    /* Every weight_map entry must sit in exactly the shard it names. */
    for (size_t i = 0; i < idx->n_entries; i++) {
        const kl_index_entry *e = &idx->entries[i];
        const kl_ckpt_shard *named = &ck->shards[ck->index_shard[e->shard]];
        if (!named->ok || kl_st_find(&named->st, e->tensor))
            continue; /* an unreadable shard has its own finding */
        const kl_ckpt_tensor *t = kl_ckpt_find(ck, e->tensor);
        if (t && emit(k, KL_SEV_ERROR, "IDX-WRONG-SHARD", ck->index_path, e->tensor,
                      KL_NO_OFFSET, "index names shard %s but the tensor is in %s", named->name,
                      ck->shards[t->shard].name))
            return k->rc;
        if (!t && emit(k, KL_SEV_ERROR, "IDX-ABSENT", ck->index_path, e->tensor, KL_NO_OFFSET,
                       "index names shard %s but no shard holds the tensor", named->name))
            return k->rc;
    }
    /* Every header tensor must be listed. */
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const kl_ckpt_tensor *t = &ck->tensors[i];
        if (kl_index_shard_of(idx, t->name) < 0 &&
            emit(k, KL_SEV_ERROR, "IDX-UNLISTED", ck->shards[t->shard].path, t->name,
                 t->t->file_off, "tensor is not in the index's weight_map"))
            return k->rc;
    }
    return 0;
}

/* ---- duplicates ---------------------------------------------------------------------------- */

static int check_duplicates(chk *k)
{
    const kl_checkpoint *ck = k->ck;
    for (size_t i = 0; ck->n_dup_across_shards && i < ck->n_tensors; i++) {
        const kl_ckpt_tensor *t = &ck->tensors[i], *first = kl_ckpt_find(ck, t->name);
        if (first != t && emit(k, KL_SEV_ERROR, "CK-DUPLICATE", ck->shards[t->shard].path,
                               t->name, t->t->file_off, "tensor also stored in %s",
                               ck->shards[first->shard].name))
            return k->rc;
    }
    return 0;
}

/* ---- total size ---------------------------------------------------------------------------- */

static int check_total_size(chk *k)
{
    const kl_checkpoint *ck = k->ck;
    const kl_ckcheck *c = k->out;
    if (!ck->index_ok)
        return 0;
    if (!ck->index.has_total_size)
        return emit(k, KL_SEV_INFO, "IDX-NO-TOTAL-SIZE", ck->index_path, NULL, KL_NO_OFFSET,
                    "index has no metadata.total_size");
    uint64_t want = ck->index.total_size;
    if (c->n_bad_shards || want == c->tensor_bytes)
        return 0; /* sums are meaningless with unreadable shards */
    if (want == c->file_bytes)
        return emit(k, KL_SEV_WARN, "IDX-TOTAL-SIZE", ck->index_path, NULL, KL_NO_OFFSET,
                    "total_size %" PRIu64 " equals the sum of file sizes (headers included), "
                    "not the %" PRIu64 " bytes of tensor data", want, c->tensor_bytes);
    return emit(k, KL_SEV_WARN, "IDX-TOTAL-SIZE", ck->index_path, NULL, KL_NO_OFFSET,
                "total_size %" PRIu64 " differs from the %" PRIu64 " bytes of tensor data", want,
                c->tensor_bytes);
}

/* ---- schema match -------------------------------------------------------------------------- */

static void shape_str(char *buf, size_t n, int rank, const uint64_t *shape)
{
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < rank && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%" PRIu64, i ? ", " : "", shape[i]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
}

static void dtype_list(char *buf, size_t n, uint32_t mask)
{
    size_t used = 0;
    buf[0] = 0;
    for (int d = 0; d < KL_DT_COUNT && used < n; d++)
        if (mask & KL_DT_BIT(d))
            used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? "|" : "",
                                     kl_dtype_name((kl_dtype)d));
}

/* Where a missing entry went: the unreadable shard the index places it in, n_shards when no
 * usable index says where while some shard is unreadable, or -1: it is simply missing. */
static long unreadable_home(const chk *k, const kl_schema_entry *e)
{
    const kl_checkpoint *ck = k->ck;
    if (!k->out->n_bad_shards)
        return -1;
    if (!ck->index_ok)
        return (long)ck->n_shards;
    int s = kl_index_shard_of(&ck->index, e->name);
    if (s < 0 && e->alias)
        s = kl_index_shard_of(&ck->index, e->alias);
    if (s < 0)
        return -1;
    uint32_t ours = ck->index_shard[s];
    return ck->shards[ours].ok ? -1 : (long)ours;
}

/* Shape and dtype of the tensor bound to e. */
static int check_bound(chk *k, const kl_schema_entry *e, const kl_ckpt_tensor *t)
{
    char want[128], got[128], desc[96];
    const char *path = k->ck->shards[t->shard].path;
    bool shape_ok = t->t->rank == e->rank;
    for (int i = 0; shape_ok && i < e->rank; i++)
        shape_ok = t->t->shape[i] == e->shape[i];
    if (!shape_ok) {
        kl_schema_describe(e, desc, sizeof desc);
        shape_str(want, sizeof want, e->rank, e->shape);
        shape_str(got, sizeof got, t->t->rank, t->t->shape);
        if (emit(k, KL_SEV_ERROR, "SCHEMA-SHAPE", path, t->name, t->t->file_off,
                 "%s has shape %s, expected %s", desc, got, want))
            return k->rc;
    }
    if (e->dtype_mask & KL_DT_BIT(t->t->dtype))
        return 0;
    dtype_list(want, sizeof want, e->dtype_mask);
    kl_schema_describe(e, desc, sizeof desc);
    return emit(k, KL_SEV_ERROR, "SCHEMA-DTYPE", path, t->name, t->t->file_off,
                "%s has dtype %s, expected %s", desc, kl_dtype_name(t->t->dtype), want);
}

/* Binds entry i to its tensor (name or alias) and checks it; a missing tensor of an unreadable
 * shard is counted in unchecked[] instead of reported. */
static int match_entry(chk *k, size_t i, size_t *unchecked)
{
    const kl_checkpoint *ck = k->ck;
    const kl_schema_entry *e = &k->out->schema.entries[i];
    const kl_ckpt_tensor *t = kl_ckpt_find(ck, e->name);
    const kl_ckpt_tensor *a = e->alias ? kl_ckpt_find(ck, e->alias) : NULL;
    char desc[96];
    if (t && a)
        kl_schema_describe(e, desc, sizeof desc);
    if (t && a && emit(k, KL_SEV_ERROR, "SCHEMA-ALIAS-TWICE", ck->shards[a->shard].path,
                       a->name, a->t->file_off, "%s is stored under both %s and %s", desc,
                       e->name, e->alias))
        return k->rc;
    k->out->bound[i] = t = t ? t : a;
    if (t)
        return check_bound(k, e, t);
    long home = unreadable_home(k, e);
    if (home >= 0) {
        unchecked[home]++;
        return 0;
    }
    kl_schema_describe(e, desc, sizeof desc);
    return emit(k, KL_SEV_ERROR, "SCHEMA-MISSING", ck->dir, e->name, KL_NO_OFFSET,
                "%s is missing", desc);
}

/* One warning per unreadable shard for the schema tensors it holds, unchecked. */
static int emit_unchecked(chk *k, const size_t *unchecked)
{
    const kl_checkpoint *ck = k->ck;
    for (size_t i = 0; i < ck->n_shards; i++)
        if (unchecked[i] && emit(k, KL_SEV_WARN, "CK-NOT-CHECKED", ck->shards[i].path, NULL,
                                 KL_NO_OFFSET, "%zu tensors in this shard not checked (the "
                                 "shard is unreadable)", unchecked[i]))
            return k->rc;
    if (unchecked[ck->n_shards])
        return emit(k, KL_SEV_WARN, "CK-NOT-CHECKED", ck->dir, NULL, KL_NO_OFFSET,
                    "%zu schema tensors not found and not checked: without a usable index they "
                    "may be in the unreadable shard(s)", unchecked[ck->n_shards]);
    return 0;
}

static int check_unexpected(chk *k)
{
    const kl_checkpoint *ck = k->ck;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const kl_ckpt_tensor *t = &ck->tensors[i];
        if (!kl_schema_find(&k->out->schema, t->name) &&
            emit(k, KL_SEV_ERROR, "SCHEMA-UNEXPECTED", ck->shards[t->shard].path, t->name,
                 t->t->file_off, "tensor is not part of a %s checkpoint with this config",
                 kl_family_name(ck->config.family)))
            return k->rc;
    }
    return 0;
}

/* Builds the schema of the config; 1 when there is none to match (a finding says why). */
static int build_schema(chk *k, kl_err *err)
{
    const kl_checkpoint *ck = k->ck;
    if (ck->config.family == KL_FAMILY_KIMI_K3)
        return emit(k, KL_SEV_INFO, "CK-K3-METADATA-ONLY", ck->config_path, NULL, KL_NO_OFFSET,
                    "Kimi K3 checkpoint: headers and index audited, no tensor schema for this "
                    "family") ? k->rc : 1;
    kl_err serr;
    kl_err_clear(&serr);
    int rc;
    if (k->ahead && k->ahead->done) {   /* the same call, made earlier on the same config */
        rc = k->ahead->rc;
        serr = k->ahead->err;
        k->out->schema = k->ahead->s;
        memset(&k->ahead->s, 0, sizeof k->ahead->s);
        k->ahead->done = false;
    } else {
        rc = kl_schema_build(&k->out->schema, &ck->config, &serr);
    }
    if (rc == KL_E_NOMEM)
        return kl_fail(err, KL_E_NOMEM, "out of memory building the schema");
    if (rc)
        return emit_err(k, &serr, "SCHEMA-BUILD", ck->config_path, "") ? k->rc : 1;
    k->out->has_schema = true;
    k->out->bound = kl_calloc(k->out->schema.n ? k->out->schema.n : 1, sizeof *k->out->bound);
    return k->out->bound ? 0 : kl_fail(err, KL_E_NOMEM, "out of memory binding %zu tensors",
                                       k->out->schema.n);
}

/* Binds every entry when the tensors and the schema pair one to one: as many tensors as
 * entries, each tensor found under an entry's name or alias, no entry found twice.  Then the
 * full match would report no alias stored twice, nothing missing and nothing unexpected, and
 * bind the same tensors (names are distinct), so only shapes and dtypes are left to check.  0
 * (bound[] cleared) when the pairing does not hold: the full match reports exactly. */
static int bind_one_to_one(chk *k)
{
    const kl_checkpoint *ck = k->ck;
    kl_ckcheck *c = k->out;
    if (ck->n_tensors != c->schema.n)
        return 0;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const kl_ckpt_tensor *t = &ck->tensors[i];
        uint32_t e;
        if (!kl_strmap_get_h(&c->schema.by_name, t->name, t->t->name_hash, &e) || c->bound[e]) {
            memset(c->bound, 0, c->schema.n * sizeof *c->bound);
            return 0;
        }
        c->bound[e] = t;
    }
    return 1;
}

static int check_schema(chk *k, kl_err *err)
{
    const kl_checkpoint *ck = k->ck;
    if (!ck->config_ok)
        return 0;
    int rc = build_schema(k, err);
    if (rc)
        return rc < 0 ? rc : k->rc;
    if (bind_one_to_one(k)) {
        for (size_t i = 0; i < k->out->schema.n && !k->rc; i++)
            check_bound(k, &k->out->schema.entries[i], k->out->bound[i]);
        return k->rc;
    }
    size_t *unchecked = kl_calloc(ck->n_shards + 1, sizeof *unchecked);
    if (!unchecked)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    for (size_t i = 0; i < k->out->schema.n && !k->rc; i++)
        match_entry(k, i, unchecked);
    if (!k->rc)
        emit_unchecked(k, unchecked);
    kl_free(unchecked);
    return k->rc ? k->rc : check_unexpected(k);
}

/* ---- public API ---------------------------------------------------------------------------- */

/* kl_ckcheck_run with a schema possibly built ahead. */
static int run_check(kl_ckcheck *c, const kl_checkpoint *ck, kl_finding_fn fn, void *ctx,
                     schema_ahead *ahead, kl_err *err)
{
    memset(c, 0, sizeof *c);
    chk *k = kl_calloc(1, sizeof *k);
    if (!k)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    *k = (chk){.ahead = ahead, .ck = ck, .out = c, .fn = fn, .ctx = ctx};
    int rc = 0;
    if (!check_files(k) && !check_index(k) && !check_duplicates(k) && !check_total_size(k))
        rc = check_schema(k, err);
    if (!k->rc)
        emit_tallies(k);
    if (k->rc < 0)
        rc = kl_fail(err, k->rc, "the finding callback failed");
    kl_free(k);
    return rc < 0 ? rc : 0;
}

int kl_ckcheck_run(kl_ckcheck *c, const kl_checkpoint *ck, kl_finding_fn fn, void *ctx,
                   kl_err *err)
{
    return run_check(c, ck, fn, ctx, NULL, err);
}

typedef struct first_error {
    kl_err     *err;
    const char *dir;
} first_error;

static int refuse_at_first_error(void *ctx, const kl_finding *f)
{
    const first_error *fe = ctx;
    if (f->severity != KL_SEV_ERROR)
        return 0;
    kl_fail_at(fe->err, KL_E_FORMAT, f->rule, f->tensor[0] ? f->tensor : NULL, f->offset,
               "checkpoint refused: %s; `kl audit %s` lists every problem", f->message,
               fe->dir);
    kl_err_context(fe->err, f->file[0] ? f->file : NULL, NULL, KL_NO_OFFSET, NULL);
    return 1;
}

/* kl_ckcheck_require with a schema possibly built ahead. */
static int require(kl_ckcheck *c, const kl_checkpoint *ck, schema_ahead *ahead, kl_err *err)
{
    kl_err first;
    kl_err_clear(&first);
    first_error fe = {&first, ck->dir};
    int rc = run_check(c, ck, refuse_at_first_error, &fe, ahead, err);
    if (rc)
        return rc;
    if (!c->n_errors)
        return 0;
    if (err && !err->code)
        *err = first;
    return first.code;
}

int kl_ckcheck_require(kl_ckcheck *c, const kl_checkpoint *ck, kl_err *err)
{
    return require(c, ck, NULL, err);
}

/* The kl_ckpt_open_with job: the schema check_schema would build, built now (only where
 * build_schema would call kl_schema_build). */
static void build_ahead(void *ctx, const kl_checkpoint *ck)
{
    schema_ahead *a = ctx;
    if (!ck->config_ok || ck->config.family == KL_FAMILY_KIMI_K3)
        return;
    kl_err_clear(&a->err);
    a->rc = kl_schema_build(&a->s, &ck->config, &a->err);
    a->done = true;
}

int kl_ckcheck_open_require(kl_ckcheck *c, kl_checkpoint *ck, const char *dir, kl_err *err)
{
    schema_ahead a = {0};
    memset(c, 0, sizeof *c);
    int rc = kl_ckpt_open_with(ck, dir, build_ahead, &a, err);
    if (!rc)
        rc = require(c, ck, &a, err);
    if (a.done && !a.rc)
        kl_schema_free(&a.s);   /* not taken: the check ended before the schema */
    if (rc) {
        kl_ckcheck_free(c);
        kl_ckpt_close(ck);
    }
    return rc;
}

void kl_ckcheck_free(kl_ckcheck *c)
{
    if (!c)
        return;
    kl_free(c->bound);
    if (c->has_schema)
        kl_schema_free(&c->schema);
    memset(c, 0, sizeof *c);
}

const kl_ckpt_tensor *kl_ckcheck_tensor(const kl_ckcheck *c, const char *name)
{
    const kl_schema_entry *e = c->has_schema ? kl_schema_find(&c->schema, name) : NULL;
    return e ? c->bound[e - c->schema.entries] : NULL;
}

void kl_finding_vset(kl_finding *f, kl_severity sev, const char *rule, const char *file,
                     const char *tensor, uint64_t offset, const char *fmt, va_list ap)
{
    fill(f, sev, rule, file, tensor, offset);
    vset_msg(f, fmt, ap);
}

void kl_finding_from_err(kl_finding *f, kl_severity sev, const kl_err *e,
                         const char *default_rule, const char *default_file)
{
    fill(f, sev, e->rule[0] ? e->rule : default_rule, e->file[0] ? e->file : default_file,
         e->tensor, e->offset);
    set_msg(f, "%s%s%s", e->msg, e->sys_errno > 0 ? ": " : "",
            e->sys_errno > 0 ? strerror(e->sys_errno) : "");
}

const char *kl_severity_name(kl_severity s)
{
    switch (s) {
    case KL_SEV_INFO: return "info";
    case KL_SEV_WARN: return "warning";
    case KL_SEV_ERROR: return "error";
    }
    return "?";
}
