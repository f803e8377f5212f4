/*
 * audit/hash.c — `kl audit --hash`: SHA-256 of every shard through the staged reader,
 * several shards at once (loader/hashpass.h), compared with expected values (expect.h).
 */
#include "audit/audit_int.h"

#include "audit/expect.h"
#include "audit/report.h"
#include "common/mem.h"
#include "loader/hashpass.h"

#include <stdio.h>
#include <string.h>

#define NOT_STARTED 1

static int record_results(kl_audit_report *r, const kl_checkpoint *ck,
                          const kl_hashpass_file *files, const kl_expect *ex)
{
    int rc = 0;
    for (size_t i = 0; i < ck->n_shards; i++) {
        kl_shard_hash *h = &r->hashes[i];
        const kl_hashpass_file *f = &files[i];
        if (!(h->file = kl_strdup(ck->shards[i].name)))
            return KL_E_NOMEM;
        r->n_hashes = i + 1; /* so kl_audit_report_free releases what is filled */
        h->size_bytes = f->size_bytes;
        h->hashed = f->rc == 0;
        if (h->hashed) {
            kl_sha256_hex(f->sha256, h->sha256);
            r->hashed_bytes += f->size_bytes;
        } else {
            rc |= kl_audit_add(r, KL_SEV_ERROR, "HASH-READ", ck->shards[i].path, NULL,
                               f->err.offset, "cannot hash%s%s%s: %s%s%s",
                               f->err.rule[0] ? " [" : "", f->err.rule,
                               f->err.rule[0] ? "]" : "", f->err.msg,
                               f->err.sys_errno > 0 ? ": " : "",
                               f->err.sys_errno > 0 ? strerror(f->err.sys_errno) : "");
        }
        h->has_expected = kl_expect_lookup(ex, ck->shards[i].name, h->expected) == 1;
        h->match = h->hashed && h->has_expected && !strcmp(h->sha256, h->expected);
        if (h->hashed && h->has_expected && !h->match)
            rc |= kl_audit_add(r, KL_SEV_ERROR, "HASH-MISMATCH", ck->shards[i].path, NULL,
                               KL_NO_OFFSET, "SHA-256 %s, expected %s", h->sha256, h->expected);
    }
    return rc ? KL_E_NOMEM : 0;
}

/* The pass reports bytes done; the audit's callback also wants the total. */
typedef struct progress_ctx {
    const kl_audit_opts *o;
    uint64_t             total;
} progress_ctx;

static void forward_progress(void *ctx, uint64_t bytes_done)
{
    const progress_ctx *pc = ctx;
    pc->o->progress(pc->o->progress_ctx, bytes_done, pc->total);
}

int kl_audit_hash(kl_audit_report *r, const kl_checkpoint *ck, const kl_audit_opts *o,
                  kl_err *err)
{
    kl_expect ex;
    int rc = kl_expect_open(&ex, o->expect, ck->dir, err);
    if (rc)
        return rc;
    kl_hashpass_file *files = kl_calloc(ck->n_shards ? ck->n_shards : 1, sizeof *files);
    r->hashes = kl_calloc(ck->n_shards ? ck->n_shards : 1, sizeof *r->hashes);
    if (!files || !r->hashes) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory");
        goto done;
    }
    /* A positive rc marks "not touched": the pass sets 0 or a KL_E_* code on every file it
     * starts, and touches none when it cannot start at all. */
    for (size_t i = 0; i < ck->n_shards; i++) {
        files[i].path = ck->shards[i].path;
        files[i].rc = NOT_STARTED;
    }
    progress_ctx pc = {.o = o};
    for (size_t i = 0; i < ck->n_shards; i++)
        pc.total += ck->shards[i].st.file_bytes;
    kl_hashpass_opts hopts = {.threads = o->threads};
    if (o->progress) {
        hopts.progress = forward_progress;
        hopts.progress_ctx = &pc;
    }
    kl_hashpass_stats st;
    kl_err herr;
    kl_err_clear(&herr);
    /* Per-file failures are findings; only a pass that cannot start is an error. */
    int hrc = kl_hashpass_run(files, ck->n_shards, &hopts, &st, &herr);
    if (hrc && ck->n_shards && files[0].rc == NOT_STARTED) {
        rc = hrc;
        if (err && !err->code)
            *err = herr;
        goto done;
    }
    r->hash_s = st.elapsed_s;
    if (record_results(r, ck, files, &ex) || kl_expect_report(&ex, r, ck))
        rc = kl_fail(err, KL_E_NOMEM, "out of memory");
done:
    kl_free(files);
    kl_expect_free(&ex);
    return rc;
}
