/*
 * audit/audit.c — the checks behind `kl audit` (see audit.h).
 *
 * The metadata checks are the loader's (loader/ckcheck.c), shared with the engine and the
 * converter; findings are collected by audit/report.c.  This file runs them, then the
 * audit-only passes: expert regions, the memory plan, hashing.
 */
#include "audit/audit.h"

#include "audit/audit_int.h"
#include "audit/report.h"
#include "common/clock.h"
#include "common/mem.h"
#include "loader/checkpoint.h"
#include "loader/ckcheck.h"

#include <string.h>

/* ---- public API ---------------------------------------------------------------------------- */

static void fill_counts(kl_audit_report *r, const kl_checkpoint *ck, const kl_ckcheck *c)
{
    r->n_shards = ck->n_shards;
    r->n_tensors = ck->n_tensors;
    r->n_bad_shards = c->n_bad_shards;
    r->file_bytes = c->file_bytes;
    r->header_bytes = c->header_bytes;
    r->tensor_bytes = c->tensor_bytes;
    if (ck->index_ok && ck->index.has_total_size) {
        r->has_total_size = true;
        r->total_size = ck->index.total_size;
    }
    r->config_ok = ck->config_ok;
    if (ck->config_ok) {
        r->config = ck->config;
        r->family = ck->config.family;
    }
    if (c->has_schema)
        r->n_expected_tensors = c->schema.n;
}

/* The stored dtype of every schema entry of c (the schema's synth dtype where the checkpoint
 * lacks the tensor, a finding already).  Owned: kl_free; NULL when out of memory. */
static kl_dtype *stored_dtypes(const kl_ckcheck *c)
{
    kl_dtype *dt = kl_calloc(c->schema.n ? c->schema.n : 1, sizeof *dt);
    for (size_t i = 0; dt && i < c->schema.n; i++)
        dt[i] = c->bound[i] ? c->bound[i]->t->dtype : c->schema.entries[i].synth_dtype;
    return dt;
}

/* The memory plan of the checked checkpoint: a finding when it overflows, the error when
 * --tp or --context are not valid for it. */
static int run_memplan(kl_audit_report *r, const kl_checkpoint *ck, const kl_audit_opts *o,
                       const kl_dtype *dtypes, kl_err *err)
{
    /* The plan assumes a bf16 MLA cache, as serving engines keep it (the CPU engine: fp32). */
    kl_memplan_opts mo = {.tp = o->tp, .expert_parallel = o->expert_parallel,
                          .context = o->context, .cache_elem_bytes = 2, .state_elem_bytes = 4,
                          .dtypes = dtypes};
    if (!mo.context)
        mo.context = kl_memplan_default_context(&ck->config);
    kl_err perr;
    kl_err_clear(&perr);
    int rc = kl_memplan_compute(&r->memplan, &ck->config, &mo, &perr);
    if (rc == KL_E_USAGE || rc == KL_E_NOMEM) { /* bad --tp or --context: cannot run as asked */
        if (err && !err->code)
            *err = perr;
        return rc;
    }
    if (rc == 0)
        r->has_memplan = true;
    else if (kl_audit_add_err(r, &perr, "MEM-PLAN", ck->config_path))
        return kl_fail(err, KL_E_NOMEM, "out of memory collecting findings");
    return 0;
}

/* The loader's metadata check, then the expert regions and the memory plan. */
static int run_checks(kl_audit_report *r, const kl_checkpoint *ck, const kl_audit_opts *o,
                      kl_err *err)
{
    kl_ckcheck c;
    kl_dtype *dtypes = NULL;
    int rc = kl_ckcheck_run(&c, ck, kl_audit_collect, r, err);
    if (!rc) {
        fill_counts(r, ck, &c);
        if (c.has_schema && kl_audit_regions(r, ck, &c.schema))
            rc = kl_fail(err, KL_E_NOMEM, "out of memory collecting findings");
        if (!rc && c.has_schema && !(dtypes = stored_dtypes(&c)))
            rc = kl_fail(err, KL_E_NOMEM, "out of memory");
    }
    bool planned = !rc && c.has_schema;
    kl_ckcheck_free(&c);
    if (planned)
        rc = run_memplan(r, ck, o, dtypes, err);
    kl_free(dtypes);
    return rc;
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
    rc = run_checks(r, &ck, &o, err);
    r->metadata_s = kl_now_s() - t0;
    if (!rc && o.hash)
        rc = kl_audit_hash(r, &ck, &o, err);
    kl_ckpt_close(&ck);
    if (rc)
        kl_audit_report_free(r);
    return rc;
}
