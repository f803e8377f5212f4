/*
 * audit/audit.c — the checks behind `kl audit` (see audit.h).
 *
 * Sections: findings, file-level checks, index vs headers, schema, total size, expert regions,
 * hashing, public API.
 */
#include "audit/audit.h"

#include "audit/audit_int.h"
#include "common/clock.h"
#include "common/mem.h"
#include "loader/checkpoint.h"
#include "loader/schema.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- findings ------------------------------------------------------------------------------ */

int kl_audit_add(kl_audit_report *r, kl_severity sev, const char *rule, const char *file,
                 const char *tensor, uint64_t offset, const char *fmt, ...)
{
    if (r->n_findings == r->cap_findings) {
        size_t cap = r->cap_findings ? 2 * r->cap_findings : 32;
        kl_finding *f = kl_realloc(r->findings, cap * sizeof *f);
        if (!f)
            return KL_E_NOMEM;
        r->findings = f;
        r->cap_findings = cap;
    }
    kl_finding *f = &r->findings[r->n_findings++];
    memset(f, 0, sizeof *f);
    f->severity = sev;
    f->offset = offset;
    kl_copy_text(f->rule, sizeof f->rule, rule ? rule : "");
    kl_copy_text(f->file, sizeof f->file, file ? file : "");
    kl_copy_text(f->tensor, sizeof f->tensor, tensor ? tensor : "");
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kl_copy_text(f->message, sizeof f->message, msg);
    if (sev == KL_SEV_ERROR)
        r->n_errors++;
    else if (sev == KL_SEV_WARN)
        r->n_warnings++;
    return 0;
}

/* A parser's error becomes an error finding with the same context. */
static int add_from_err(kl_audit_report *r, const kl_err *e, const char *default_rule,
                        const char *default_file)
{
    return kl_audit_add(r, KL_SEV_ERROR, e->rule[0] ? e->rule : default_rule,
                        e->file[0] ? e->file : default_file, e->tensor, e->offset, "%s%s%s",
                        e->msg, e->sys_errno > 0 ? ": " : "",
                        e->sys_errno > 0 ? strerror(e->sys_errno) : "");
}

/* ---- file-level checks --------------------------------------------------------------------- */

static int check_files(kl_audit_report *r, const kl_checkpoint *ck)
{
    int rc = 0;
    if (!ck->config_ok)
        rc |= add_from_err(r, &ck->config_err, "FILE-OPEN", ck->config_path);
    if (ck->has_index && !ck->index_ok)
        rc |= add_from_err(r, &ck->index_err, "FILE-OPEN", ck->index_path);
    if (!ck->has_index && ck->n_shards > 1)
        rc |= kl_audit_add(r, KL_SEV_ERROR, "IDX-MISSING", ck->index_path, NULL, KL_NO_OFFSET,
                           "%zu shards but no index file", ck->n_shards);
    if (ck->n_shards == 0)
        rc |= kl_audit_add(r, KL_SEV_ERROR, "CK-NO-SHARDS", ck->dir, NULL, KL_NO_OFFSET,
                           "no .safetensors shard found");
    for (size_t i = 0; i < ck->n_shards; i++) {
        const kl_ckpt_shard *s = &ck->shards[i];
        if (ck->index_ok && !s->in_index)
            rc |= kl_audit_add(r, KL_SEV_WARN, "CK-EXTRA-SHARD", s->path, NULL, KL_NO_OFFSET,
                               "shard is not named by the index; its tensors are checked too");
        if (!s->ok) {
            rc |= add_from_err(r, &s->err, "FILE-OPEN", s->path);
            continue;
        }
        r->file_bytes += s->st.file_bytes;
        r->header_bytes += s->st.data_off;
        for (size_t j = 0; j < s->st.n_tensors; j++)
            r->tensor_bytes += s->st.tensors[j].n_bytes;
        if (s->st.warnings & KL_ST_WARN_LEADING_SPACE)
            rc |= kl_audit_add(r, KL_SEV_WARN, "ST-LEADING-SPACE", s->path, NULL, 8,
                               "header starts with whitespace; safetensors readers before 0.8 "
                               "reject it");
        if (s->st.warnings & KL_ST_WARN_HUB_LIMIT)
            rc |= kl_audit_add(r, KL_SEV_WARN, "ST-HUB-LIMIT", s->path, NULL, KL_NO_OFFSET,
                               "header of %" PRIu64 " bytes exceeds huggingface_hub's 25 MB "
                               "limit", s->st.header_bytes);
    }
    return rc ? KL_E_NOMEM : 0;
}

/* ---- index vs headers ---------------------------------------------------------------------- */

static int check_index(kl_audit_report *r, const kl_checkpoint *ck)
{
    int rc = 0;
    if (!ck->index_ok)
        return 0;
    const kl_index *idx = &ck->index;
    /* Every weight_map entry must sit in exactly the shard it names. */
    for (size_t i = 0; i < idx->n_entries; i++) {
        const kl_index_entry *e = &idx->entries[i];
        const kl_ckpt_shard *named = &ck->shards[ck->index_shard[e->shard]];
        if (!named->ok)
            continue; /* the shard's own finding says why */
        if (kl_st_find(&named->st, e->tensor))
            continue;
        const kl_ckpt_tensor *t = kl_ckpt_find(ck, e->tensor);
        if (t)
            rc |= kl_audit_add(r, KL_SEV_ERROR, "IDX-WRONG-SHARD", ck->index_path, e->tensor,
                               KL_NO_OFFSET, "index names shard %s but the tensor is in %s",
                               named->name, ck->shards[t->shard].name);
        else
            rc |= kl_audit_add(r, KL_SEV_ERROR, "IDX-ABSENT", ck->index_path, e->tensor,
                               KL_NO_OFFSET, "index names shard %s but no shard holds the "
                               "tensor", named->name);
    }
    /* Every header tensor must be listed. */
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const kl_ckpt_tensor *t = &ck->tensors[i];
        if (kl_index_shard_of(idx, t->name) < 0)
            rc |= kl_audit_add(r, KL_SEV_ERROR, "IDX-UNLISTED", ck->shards[t->shard].path,
                               t->name, t->t->file_off, "tensor is not in the index's "
                               "weight_map");
    }
    return rc ? KL_E_NOMEM : 0;
}

static int check_duplicates(kl_audit_report *r, const kl_checkpoint *ck)
{
    if (!ck->n_dup_across_shards)
        return 0;
    int rc = 0;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const kl_ckpt_tensor *t = &ck->tensors[i], *first = kl_ckpt_find(ck, t->name);
        if (first != t)
            rc |= kl_audit_add(r, KL_SEV_ERROR, "CK-DUPLICATE", ck->shards[t->shard].path,
                               t->name, t->t->file_off, "tensor also stored in %s",
                               ck->shards[first->shard].name);
    }
    return rc ? KL_E_NOMEM : 0;
}

/* ---- schema -------------------------------------------------------------------------------- */

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

static int check_entry(kl_audit_report *r, const kl_checkpoint *ck, const kl_schema_entry *e)
{
    const kl_ckpt_tensor *t = kl_ckpt_find(ck, e->name);
    const kl_ckpt_tensor *a = e->alias ? kl_ckpt_find(ck, e->alias) : NULL;
    char want[128], got[128], desc[96];
    kl_schema_describe(e, desc, sizeof desc);
    if (t && a)
        return kl_audit_add(r, KL_SEV_ERROR, "SCHEMA-ALIAS-TWICE", ck->shards[a->shard].path,
                            a->name, a->t->file_off, "%s is stored under both %s and %s", desc,
                            e->name, e->alias);
    if (!t)
        t = a;
    if (!t)
        return kl_audit_add(r, KL_SEV_ERROR, "SCHEMA-MISSING", ck->dir, e->name, KL_NO_OFFSET,
                            "%s is missing", desc);
    const char *path = ck->shards[t->shard].path;
    int rc = 0;
    bool shape_ok = t->t->rank == e->rank;
    for (int i = 0; shape_ok && i < e->rank; i++)
        shape_ok = t->t->shape[i] == e->shape[i];
    if (!shape_ok) {
        shape_str(want, sizeof want, e->rank, e->shape);
        shape_str(got, sizeof got, t->t->rank, t->t->shape);
        rc |= kl_audit_add(r, KL_SEV_ERROR, "SCHEMA-SHAPE", path, t->name, t->t->file_off,
                           "%s has shape %s, expected %s", desc, got, want);
    }
    if (!(e->dtype_mask & KL_DT_BIT(t->t->dtype))) {
        dtype_list(want, sizeof want, e->dtype_mask);
        rc |= kl_audit_add(r, KL_SEV_ERROR, "SCHEMA-DTYPE", path, t->name, t->t->file_off,
                           "%s has dtype %s, expected %s", desc, kl_dtype_name(t->t->dtype),
                           want);
    }
    return rc;
}

static int check_schema(kl_audit_report *r, const kl_checkpoint *ck, const kl_schema *s)
{
    int rc = 0;
    r->n_expected_tensors = s->n;
    for (size_t i = 0; i < s->n; i++)
        rc |= check_entry(r, ck, &s->entries[i]);
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const kl_ckpt_tensor *t = &ck->tensors[i];
        if (!kl_schema_find(s, t->name))
            rc |= kl_audit_add(r, KL_SEV_ERROR, "SCHEMA-UNEXPECTED", ck->shards[t->shard].path,
                               t->name, t->t->file_off, "tensor is not part of a %s checkpoint "
                               "with this config", kl_family_name(ck->config.family));
    }
    return rc ? KL_E_NOMEM : 0;
}

/* ---- total size ---------------------------------------------------------------------------- */

static int check_total_size(kl_audit_report *r, const kl_checkpoint *ck)
{
    if (!ck->index_ok || !ck->index.has_total_size) {
        if (ck->index_ok)
            return kl_audit_add(r, KL_SEV_INFO, "IDX-NO-TOTAL-SIZE", ck->index_path, NULL,
                                KL_NO_OFFSET, "index has no metadata.total_size");
        return 0;
    }
    r->has_total_size = true;
    r->total_size = ck->index.total_size;
    for (size_t i = 0; i < ck->n_shards; i++)
        if (!ck->shards[i].ok)
            return 0; /* sums are meaningless with unreadable shards */
    if (ck->index.total_size == r->tensor_bytes)
        return 0;
    if (ck->index.total_size == r->file_bytes)
        return kl_audit_add(r, KL_SEV_WARN, "IDX-TOTAL-SIZE", ck->index_path, NULL,
                            KL_NO_OFFSET, "total_size %" PRIu64 " equals the sum of file sizes "
                            "(headers included), not the %" PRIu64 " bytes of tensor data",
                            ck->index.total_size, r->tensor_bytes);
    return kl_audit_add(r, KL_SEV_WARN, "IDX-TOTAL-SIZE", ck->index_path, NULL, KL_NO_OFFSET,
                        "total_size %" PRIu64 " differs from the %" PRIu64 " bytes of tensor "
                        "data", ck->index.total_size, r->tensor_bytes);
}

/* ---- public API ---------------------------------------------------------------------------- */

static void fill_counts(kl_audit_report *r, const kl_checkpoint *ck)
{
    r->n_shards = ck->n_shards;
    r->n_tensors = ck->n_tensors;
    r->config_ok = ck->config_ok;
    if (ck->config_ok) {
        r->config = ck->config;
        r->family = ck->config.family;
    }
}

static int run_checks(kl_audit_report *r, const kl_checkpoint *ck, const kl_audit_opts *o,
                      kl_err *err)
{
    if (check_files(r, ck) || check_index(r, ck) || check_duplicates(r, ck) ||
        check_total_size(r, ck))
        return kl_fail(err, KL_E_NOMEM, "out of memory collecting findings");
    if (!ck->config_ok)
        return 0;
    if (ck->config.family == KL_FAMILY_KIMI_K3)
        return kl_audit_add(r, KL_SEV_INFO, "CK-K3-METADATA-ONLY", ck->config_path, NULL,
                            KL_NO_OFFSET, "Kimi K3 checkpoint: headers and index audited, no "
                            "tensor schema for this family") ? KL_E_NOMEM : 0;
    kl_schema schema;
    kl_err serr;
    kl_err_clear(&serr);
    if (kl_schema_build(&schema, &ck->config, &serr))
        return add_from_err(r, &serr, "SCHEMA-BUILD", ck->config_path) ? KL_E_NOMEM : 0;
    int rc = check_schema(r, ck, &schema);
    if (!rc)
        rc = kl_audit_regions(r, ck, &schema);
    kl_schema_free(&schema);
    if (rc)
        return kl_fail(err, KL_E_NOMEM, "out of memory collecting findings");
    /* The plan assumes a bf16 MLA cache, as serving engines keep it (the CPU engine: fp32). */
    kl_memplan_opts mo = {.tp = o->tp, .context = o->context, .cache_elem_bytes = 2,
                          .state_elem_bytes = 4};
    if (!mo.context)
        mo.context = kl_memplan_default_context(&ck->config);
    rc = kl_memplan_compute(&r->memplan, &ck->config, &mo, &serr);
    if (rc == KL_E_USAGE) { /* bad --tp or --context: the audit cannot run as asked */
        if (err && !err->code)
            *err = serr;
        return rc;
    }
    if (rc == 0)
        r->has_memplan = true;
    else
        return add_from_err(r, &serr, "MEM-PLAN", ck->config_path) ? KL_E_NOMEM : 0;
    return 0;
}

int kl_audit_run(kl_audit_report *r, const char *dir, const kl_audit_opts *opts, kl_err *err)
{
    kl_audit_opts o = {.tp = 1};
    if (opts)
        o = *opts;
    if (!o.tp)
        o.tp = 1;
    memset(r, 0, sizeof *r);
    double t0 = kl_now_s();
    kl_checkpoint ck;
    int rc = kl_ckpt_open(&ck, dir, err);
    if (rc)
        return rc;
    if (!(r->dir = kl_strdup(dir))) {
        kl_ckpt_close(&ck);
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    }
    fill_counts(r, &ck);
    rc = run_checks(r, &ck, &o, err);
    r->metadata_s = kl_now_s() - t0;
    if (!rc && o.hash)
        rc = kl_audit_hash(r, &ck, &o, err);
    kl_ckpt_close(&ck);
    if (rc)
        kl_audit_report_free(r);
    return rc;
}

void kl_audit_report_free(kl_audit_report *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n_hashes; i++)
        kl_free(r->hashes[i].file);
    kl_free(r->hashes);
    kl_free(r->findings);
    kl_free(r->regions);
    kl_free(r->dir);
    memset(r, 0, sizeof *r);
}

int kl_audit_has_problems(const kl_audit_report *r)
{
    return r->n_errors > 0;
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
