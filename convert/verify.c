/*
 * convert/verify.c — verify a conversion; compare scale rules (see verify.h).
 *
 * Sections: reading tensors, error statistics, verify, compare rules.
 */
#include "convert/verify.h"

#include "common/fs.h"
#include "common/mem.h"
#include "common/numfmt.h"
#include "common/pool.h"
#include "loader/checkpoint.h"
#include "loader/ckcheck.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define COPY_CHUNK (8u << 20)

/* ---- reading tensors ----------------------------------------------------------------------- */

/* Whole tensor into a kl_malloc'd buffer (routed-expert tensors are a few MiB). */
static int read_tensor(const kl_checkpoint *ck, const kl_ckpt_tensor *t, uint8_t **out, kl_err *err)
{
    const char *path = ck->shards[t->shard].path;
    uint8_t *buf = kl_malloc(t->t->n_bytes ? t->t->n_bytes : 1);
    if (!buf)
        return kl_fail(err, KL_E_NOMEM, "out of memory reading %s", t->name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int rc = fd < 0 ? kl_fail_sys(err, KL_E_IO, errno, "cannot open")
                    : kl_pread_all(fd, buf, t->t->n_bytes, t->t->file_off, path, err);
    if (fd >= 0)
        close(fd);
    if (rc) {
        kl_err_context(err, path, t->name, t->t->file_off, NULL);
        kl_free(buf);
        return rc;
    }
    *out = buf;
    return 0;
}

/* 1 if the two tensors hold the same bytes; compared in chunks so size does not matter. */
static int same_bytes(const kl_checkpoint *a, const kl_ckpt_tensor *x, const kl_checkpoint *b,
                      const kl_ckpt_tensor *y, int *same, kl_err *err)
{
    *same = x->t->n_bytes == y->t->n_bytes;
    if (!*same)
        return 0;
    uint8_t *p = kl_malloc(COPY_CHUNK), *q = kl_malloc(COPY_CHUNK);
    int fa = open(a->shards[x->shard].path, O_RDONLY | O_CLOEXEC);
    int fb = open(b->shards[y->shard].path, O_RDONLY | O_CLOEXEC);
    int rc = (!p || !q)           ? kl_fail(err, KL_E_NOMEM, "out of memory")
             : (fa < 0 || fb < 0) ? kl_fail_sys(err, KL_E_IO, errno, "cannot open a shard")
                                  : 0;
    for (uint64_t off = 0; !rc && *same && off < x->t->n_bytes; off += COPY_CHUNK) {
        size_t n = (size_t)(x->t->n_bytes - off < COPY_CHUNK ? x->t->n_bytes - off : COPY_CHUNK);
        rc = kl_pread_all(fa, p, n, x->t->file_off + off, a->shards[x->shard].path, err);
        if (!rc)
            rc = kl_pread_all(fb, q, n, y->t->file_off + off, b->shards[y->shard].path, err);
        if (!rc && memcmp(p, q, n))
            *same = 0;
    }
    if (fa >= 0)
        close(fa);
    if (fb >= 0)
        close(fb);
    kl_free(p);
    kl_free(q);
    return rc;
}

/* ---- error statistics ---------------------------------------------------------------------- */

static void accumulate(const float *deq, const uint16_t *src, size_t n, double *se, double *ss,
                       double *max_abs)
{
    for (size_t k = 0; k < n; k++) {
        double x = kl_bf16_to_f32(src[k]), d = deq[k] - x;
        *se += d * d;
        *ss += x * x;
        if (fabs(d) > *max_abs)
            *max_abs = fabs(d);
    }
}

int kl_quant_error_bf16(const uint16_t *rows, size_t n_rows, size_t n_in, kl_scale_rule rule,
                        double *rel_rmse, double *max_abs, kl_err *err)
{
    uint8_t *pk = kl_malloc(n_in / 2), *sc = kl_malloc(n_in / 32 + 1);
    float *deq = kl_malloc(n_in * sizeof *deq);
    double se = 0, ss = 0;
    *max_abs = 0;
    int rc = (!pk || !sc || !deq) ? kl_fail(err, KL_E_NOMEM, "out of memory") : 0;
    for (size_t r = 0; !rc && r < n_rows; r++) {
        rc = kl_mxfp4_quantize_row_bf16(rows + r * n_in, n_in, rule, pk, sc, NULL, err);
        if (!rc) {
            kl_mxfp4_dequantize_row(pk, sc, n_in, deq);
            accumulate(deq, rows + r * n_in, n_in, &se, &ss, max_abs);
        }
    }
    *rel_rmse = ss > 0 ? sqrt(se / ss) : 0;
    kl_free(pk);
    kl_free(sc);
    kl_free(deq);
    return rc;
}

static void add_stats(kl_quant_stats *s, const char *name, double rel, double max_abs)
{
    s->mean_rel_rmse += rel; /* a sum until finish_stats */
    if (rel >= s->max_rel_rmse) {
        s->max_rel_rmse = rel;
        kl_copy_text(s->worst, sizeof s->worst, name);
    }
    if (max_abs > s->max_abs_err)
        s->max_abs_err = max_abs;
    s->tensors++;
}

static void finish_stats(kl_quant_stats *s)
{
    if (s->tensors)
        s->mean_rel_rmse /= (double)s->tensors;
}

/* ---- verify -------------------------------------------------------------------------------- */

/* Error of one quantized expert: DST's packed + scale against SRC's BF16 weight. */
static int expert_error(const kl_checkpoint *src, const kl_checkpoint *dst,
                        const kl_ckpt_tensor *packed, double *rel, double *max_abs, kl_err *err)
{
    char base[256], name[300];
    size_t len = strlen(packed->name) - strlen(".weight_packed");
    snprintf(base, sizeof base, "%.*s", (int)len, packed->name);
    snprintf(name, sizeof name, "%s.weight", base);
    const kl_ckpt_tensor *w = kl_ckpt_find(src, name);
    snprintf(name, sizeof name, "%s.weight_scale", base);
    const kl_ckpt_tensor *sc = kl_ckpt_find(dst, name);
    if (!w || !sc || w->t->dtype != KL_DT_BF16 || w->t->rank != 2)
        return kl_fail_at(err, KL_E_SCHEMA, "VERIFY-PAIR", packed->name, KL_NO_OFFSET,
                          "no BF16 source weight or no weight_scale for this tensor");
    uint64_t rows = w->t->shape[0], n = w->t->shape[1];
    if (packed->t->n_bytes != rows * (n / 2) || sc->t->n_bytes != rows * (n / 32))
        return kl_fail_at(err, KL_E_SCHEMA, "VERIFY-PAIR", packed->name, KL_NO_OFFSET,
                          "weight_packed or weight_scale does not match the source's %llu x %llu",
                          (unsigned long long)rows, (unsigned long long)n);
    uint8_t *x = NULL, *p = NULL, *s = NULL;
    float *deq = kl_malloc(n * sizeof *deq);
    int rc = deq ? 0 : kl_fail(err, KL_E_NOMEM, "out of memory");
    if (!rc)
        rc = read_tensor(src, w, &x, err);
    if (!rc)
        rc = read_tensor(dst, packed, &p, err);
    if (!rc)
        rc = read_tensor(dst, sc, &s, err);
    double se = 0, ss = 0;
    *max_abs = 0;
    for (uint64_t r = 0; !rc && r < rows; r++) {
        kl_mxfp4_dequantize_row(p + r * n / 2, s + r * n / 32, n, deq);
        accumulate(deq, (const uint16_t *)(x + r * n * 2), n, &se, &ss, max_abs);
    }
    *rel = ss > 0 ? sqrt(se / ss) : 0;
    kl_free(deq);
    kl_free(x);
    kl_free(p);
    kl_free(s);
    return rc;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* SRC and DST must be two directories, neither inside the other: verifying a directory
 * against itself proves nothing. */
static int check_dirs(const char *src, const char *dst, kl_err *err)
{
    char a[PATH_MAX], b[PATH_MAX];
    if (!realpath(src, a) || !realpath(dst, b)) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot resolve the directory");
        kl_err_context(err, realpath(src, a) ? dst : src, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    size_t la = strlen(a), lb = strlen(b);
    if (!strcmp(a, b))
        return kl_fail(err, KL_E_USAGE, "SRC and DST are the same directory (%s)", a);
    if ((!strncmp(a, b, lb) && a[lb] == '/') || (!strncmp(b, a, la) && b[la] == '/'))
        return kl_fail(err, KL_E_USAGE, "one of SRC (%s) and DST (%s) is inside the other", a, b);
    return 0;
}

static void note_first(size_t *count, char *first, size_t n, const char *name)
{
    if (!(*count)++)
        kl_copy_text(first, n, name);
}

/* Error findings of DST's metadata check: counted, the first one kept. */
static int note_finding(void *ctx, const kl_finding *f)
{
    kl_verify_result *res = ctx;
    if (f->severity == KL_SEV_ERROR && !res->schema_errors++)
        snprintf(res->first_schema_error, sizeof res->first_schema_error, "[%s] %s%s%s",
                 f->rule, f->tensor, f->tensor[0] ? ": " : "", f->message);
    return 0;
}

/* DST against the schema of its config, both ways, by the check audit runs (loader/ckcheck.h:
 * names or aliases, shapes, dtypes); missing and extra tensors are also counted here. */
static int check_schema(const kl_checkpoint *dst, kl_verify_result *res, kl_err *err)
{
    kl_ckcheck chk;
    int rc = kl_ckcheck_run(&chk, dst, note_finding, res, err);
    uint8_t *bound = rc ? NULL : kl_calloc(dst->n_tensors ? dst->n_tensors : 1, 1);
    if (!rc && !bound)
        rc = kl_fail(err, KL_E_NOMEM, "out of memory");
    for (size_t i = 0; !rc && chk.has_schema && i < chk.schema.n; i++) {
        if (chk.bound[i])
            bound[chk.bound[i] - dst->tensors] = 1;
        else
            note_first(&res->tensors_missing, res->first_missing, sizeof res->first_missing,
                       chk.schema.entries[i].name);
    }
    for (size_t i = 0; !rc && chk.has_schema && i < dst->n_tensors; i++)
        if (!bound[i])
            note_first(&res->tensors_extra, res->first_extra, sizeof res->first_extra,
                       dst->tensors[i].name);
    kl_free(bound);
    kl_ckcheck_free(&chk);
    return rc;
}

/* Every copy byte for byte, every quantized expert's error. */
static int check_tensors(const kl_verify_opts *o, const kl_checkpoint *a, const kl_checkpoint *b,
                         kl_verify_result *res, kl_err *err)
{
    uint64_t total = 0, done = 0;
    for (size_t i = 0; i < b->n_tensors; i++)
        total += b->tensors[i].t->n_bytes;
    int rc = 0;
    for (size_t i = 0; !rc && i < b->n_tensors; i++) {
        const kl_ckpt_tensor *t = &b->tensors[i];
        done += t->t->n_bytes;
        if (o->progress && o->progress(o->progress_ctx, done, total))
            return kl_fail(err, KL_E_CANCELLED, "cancelled");
        if (ends_with(t->name, ".weight_scale"))
            continue;
        if (ends_with(t->name, ".weight_packed")) {
            double rel = 0, max_abs = 0;
            if (!(rc = expert_error(a, b, t, &rel, &max_abs, err)))
                add_stats(&res->experts, t->name, rel, max_abs);
            continue;
        }
        const kl_ckpt_tensor *s = kl_ckpt_find(a, t->name);
        int same = 0;
        if (s && (rc = same_bytes(a, s, b, t, &same, err)))
            break;
        res->copies_checked++;
        if (!same)
            note_first(&res->copies_differing, res->first_differing,
                       sizeof res->first_differing, t->name);
    }
    return rc;
}

int kl_convert_verify(const kl_verify_opts *o, kl_verify_result *res, kl_err *err)
{
    memset(res, 0, sizeof *res);
    int rc = check_dirs(o->src, o->dst, err);
    if (rc)
        return rc;
    kl_checkpoint a, b;
    if ((rc = kl_ckpt_open(&a, o->src, err)))
        return rc;
    if ((rc = kl_ckpt_open(&b, o->dst, err))) {
        kl_ckpt_close(&a);
        return rc;
    }
    if (!(rc = kl_ckpt_require_ok(&a, err)))
        rc = kl_ckpt_require_ok(&b, err);
    if (!rc)
        rc = check_schema(&b, res, err);
    if (!rc)
        rc = check_tensors(o, &a, &b, res, err);
    finish_stats(&res->experts);
    kl_ckpt_close(&a);
    kl_ckpt_close(&b);
    return rc;
}

/* ---- compare rules ------------------------------------------------------------------------- */

typedef struct rules_job {
    const kl_checkpoint *ck;
    const kl_ckpt_tensor **tensors;
    double (*rel)[KL_SCALE_RULE_COUNT], (*max_abs)[KL_SCALE_RULE_COUNT];
    atomic_int rc; /* first failure */
    kl_err err;    /* its details, written by the thread that set rc */
} rules_job;

static void rules_one(void *ctx, size_t i)
{
    rules_job *j = ctx;
    const kl_ckpt_tensor *t = j->tensors[i];
    uint8_t *x = NULL;
    kl_err e;
    kl_err_clear(&e);
    int rc = read_tensor(j->ck, t, &x, &e);
    for (int r = 0; !rc && r < KL_SCALE_RULE_COUNT; r++)
        rc = kl_quant_error_bf16((const uint16_t *)x, t->t->shape[0], t->t->shape[1],
                                 (kl_scale_rule)r, &j->rel[i][r], &j->max_abs[i][r], &e);
    kl_free(x);
    int none = 0;
    if (rc && atomic_compare_exchange_strong(&j->rc, &none, rc))
        j->err = e;
}

/* Up to `sample` experts' w1/w2/w3, spread over the routed-expert tensors in table order. */
static size_t pick_sample(const kl_checkpoint *ck, size_t sample, const kl_ckpt_tensor **out)
{
    size_t total = 0, n = 0;
    for (size_t i = 0; i < ck->n_tensors; i++)
        total += strstr(ck->tensors[i].name, ".experts.") &&
                 ends_with(ck->tensors[i].name, ".weight") && ck->tensors[i].t->dtype == KL_DT_BF16;
    size_t want = sample * 3, step = total > want ? total / want : 1, k = 0;
    for (size_t i = 0; i < ck->n_tensors && n < want; i++) {
        const kl_ckpt_tensor *t = &ck->tensors[i];
        if (!strstr(t->name, ".experts.") || !ends_with(t->name, ".weight") ||
            t->t->dtype != KL_DT_BF16 || t->t->rank != 2 || t->t->shape[1] % 32)
            continue;
        if (k++ % step == 0)
            out[n++] = t;
    }
    return n;
}

int kl_convert_compare_rules(const char *src, size_t sample, unsigned threads,
                             kl_quant_stats stats[KL_SCALE_RULE_COUNT], kl_err *err)
{
    memset(stats, 0, KL_SCALE_RULE_COUNT * sizeof *stats);
    kl_checkpoint ck;
    int rc = kl_ckpt_open(&ck, src, err);
    if (rc)
        return rc;
    if ((rc = kl_ckpt_require_ok(&ck, err))) {
        kl_ckpt_close(&ck);
        return rc;
    }
    size_t want = (sample ? sample : 16) * 3;
    rules_job j = {.ck = &ck};
    kl_err_clear(&j.err);
    j.tensors = kl_calloc(want, sizeof *j.tensors);
    j.rel = kl_calloc(want, sizeof *j.rel);
    j.max_abs = kl_calloc(want, sizeof *j.max_abs);
    kl_pool *pool = NULL;
    if (!j.tensors || !j.rel || !j.max_abs)
        rc = kl_fail(err, KL_E_NOMEM, "out of memory");
    if (!rc)
        rc = kl_pool_create(&pool, threads ? threads : 1, err);
    size_t n = rc ? 0 : pick_sample(&ck, want / 3, j.tensors);
    if (!rc && !n)
        rc = kl_fail(err, KL_E_SCHEMA, "no BF16 routed-expert weights to sample in %s", src);
    if (!rc) {
        kl_pool_run(pool, n, rules_one, &j);
        if (atomic_load(&j.rc)) {
            rc = atomic_load(&j.rc);
            if (err && !err->code)
                *err = j.err;
        }
    }
    for (size_t i = 0; !rc && i < n; i++)
        for (int r = 0; r < KL_SCALE_RULE_COUNT; r++)
            add_stats(&stats[r], j.tensors[i]->name, j.rel[i][r], j.max_abs[i][r]);
    for (int r = 0; r < KL_SCALE_RULE_COUNT; r++)
        finish_stats(&stats[r]);
    kl_pool_destroy(pool);
    kl_free(j.tensors);
    kl_free(j.rel);
    kl_free(j.max_abs);
    kl_ckpt_close(&ck);
    return rc;
}
