/*
 * loader/checkpoint.c — open a checkpoint directory's metadata (see checkpoint.h).
 *
 * Sections: shard list, tensor table, public API.
 */
#include "loader/checkpoint.h"

#include "common/cpu.h"
#include "common/fs.h"
#include "common/mem.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CONFIG_NAME "config.json"
#define INDEX_NAME "model.safetensors.index.json"
#define MAX_META_BYTES (256u << 20)
#define OPEN_THREADS 8u   /* index and shard headers parsed at once */

/* ---- shard list ---------------------------------------------------------------------------- */

/* The directory's *.safetensors files, parsed while the index is (kl_ckpt_open), then taken
 * into the shard list by name. */
typedef struct dir_files {
    size_t         n;
    char         **names;      /* [n] the listing, name order (owned) */
    kl_ckpt_shard *f;          /* [n] the file of each name; taken ones: path NULL */
} dir_files;

/* Fills s for dir/name (not yet parsed: !ok, err clear). */
static int shard_init(kl_ckpt_shard *s, const char *dir, const char *name, kl_err *err)
{
    memset(s, 0, sizeof *s);
    kl_err_clear(&s->err);
    char path[4096];
    if (kl_path_join(path, sizeof path, dir, name, err))
        return KL_E_USAGE;
    s->name = kl_strdup(name);
    s->path = kl_strdup(path);
    if (!s->name || !s->path) {
        kl_free(s->name);
        kl_free(s->path);
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    }
    return 0;
}

static void shard_free(kl_ckpt_shard *s)
{
    kl_st_close(&s->st);
    kl_free(s->name);
    kl_free(s->path);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Appends the shard name: the directory's parsed file of that name when there is one, else a
 * fresh entry that open_pending parses. */
static int add_shard(kl_checkpoint *ck, dir_files *df, const char *name, kl_err *err)
{
    kl_ckpt_shard *s = &ck->shards[ck->n_shards];
    char **at = df->n ? bsearch(&name, df->names, df->n, sizeof *df->names, cmp_str) : NULL;
    kl_ckpt_shard *f = at ? &df->f[at - df->names] : NULL;
    if (f && f->path) {
        *s = *f;
        memset(f, 0, sizeof *f);   /* taken: name, path and header now belong to s */
    } else {
        int rc = shard_init(s, ck->dir, name, err);
        if (rc)
            return rc;
    }
    ck->n_shards++;
    return 0;
}

static int grow_shards(kl_checkpoint *ck, size_t n, kl_err *err)
{
    kl_ckpt_shard *s = kl_realloc(ck->shards, (n ? n : 1) * sizeof *s);
    if (!s)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    ck->shards = s;
    return 0;
}

/* Every *.safetensors of the directory that is not already a shard, in name order.  Without an
 * index these are the shards (a single model.safetensors is the usual case); with one they are
 * strays the audit reports, and their tensors are checked like the others. */
static int add_dir_shards(kl_checkpoint *ck, dir_files *df, kl_err *err)
{
    int rc = grow_shards(ck, ck->n_shards + df->n, err);
    for (size_t i = 0; !rc && i < df->n; i++) {
        if (!df->f[i].path)
            continue;   /* named by the index, already a shard */
        if (!(rc = add_shard(ck, df, df->names[i], err)))
            ck->shards[ck->n_shards - 1].in_index = false;
    }
    return rc;
}

/* Shards named by the index, in name order (so reports list model-00001 first whatever the
 * weight_map order); index_shard maps the index's shard numbers to ours. */
static int add_index_shards(kl_checkpoint *ck, dir_files *df, kl_err *err)
{
    size_t n = ck->index.n_shards;
    const char **names = kl_malloc((n ? n : 1) * sizeof *names);
    ck->index_shard = kl_calloc(n ? n : 1, sizeof *ck->index_shard);
    if (!names || !ck->index_shard || grow_shards(ck, n, err)) {
        kl_free(names);
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    }
    memcpy(names, ck->index.shards, n * sizeof *names);
    qsort(names, n, sizeof *names, cmp_str);
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++)
        if (!(rc = add_shard(ck, df, names[i], err)))
            ck->shards[ck->n_shards - 1].in_index = true;
    for (size_t i = 0; !rc && i < n; i++) {
        const char **at = bsearch(&ck->index.shards[i], names, n, sizeof *names, cmp_str);
        ck->index_shard[i] = (uint32_t)(at - names);
    }
    kl_free(names);
    return rc;
}

/* The directory's shard files, listed (not yet parsed). */
static int list_dir_files(const kl_checkpoint *ck, dir_files *df, kl_err *err)
{
    memset(df, 0, sizeof *df);
    int rc = kl_list_files_with_suffix(ck->dir, ".safetensors", &df->names, &df->n, err);
    if (rc)
        return rc;
    if (!(df->f = kl_calloc(df->n ? df->n : 1, sizeof *df->f)))
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    for (size_t i = 0; !rc && i < df->n; i++)
        rc = shard_init(&df->f[i], ck->dir, df->names[i], err);
    return rc;
}

static void dir_files_free(dir_files *df)
{
    for (size_t i = 0; df->f && i < df->n; i++)
        shard_free(&df->f[i]);
    kl_free(df->f);
    kl_free_name_list(df->names, df->n);
    memset(df, 0, sizeof *df);
}

/* The index and shard headers, each parsed on its own: a 48B checkpoint's index and 7 headers
 * describe 40,461 tensors.  The calling thread takes jobs too; a thread that cannot start only
 * means fewer at once.  Each result goes into its own slot. */
typedef struct open_jobs {
    kl_checkpoint  *ck;         /* the index job parses ck->index_path into ck->index */
    size_t          n_index;    /* 1: that job comes first, 0: none */
    kl_ckpt_job_fn  extra;      /* the caller's job (NULL: none), after the index job */
    void           *extra_ctx;
    kl_ckpt_shard **shard;      /* [n_shard] headers to parse */
    size_t          n_shard;
    atomic_size_t   next;
} open_jobs;

static void *open_jobs_main(void *arg)
{
    open_jobs *j = arg;
    kl_checkpoint *ck = j->ck;
    size_t n_extra = j->extra != NULL;
    for (size_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n_index + n_extra + j->n_shard;) {
        if (i < j->n_index) {
            ck->index_ok = kl_index_open(&ck->index, ck->index_path, &ck->index_err) == 0;
            continue;
        }
        if (i < j->n_index + n_extra) {
            j->extra(j->extra_ctx, ck);
            continue;
        }
        kl_ckpt_shard *s = j->shard[i - j->n_index - n_extra];
        s->ok = kl_st_open(&s->st, s->path, &s->err) == 0;
    }
    return NULL;
}

static void run_jobs(open_jobs *j)
{
    atomic_init(&j->next, 0);
    pthread_t th[OPEN_THREADS - 1];
    unsigned started = 0, threads = kl_cpu_count(OPEN_THREADS);   /* no more than the CPUs */
    while (started + 1 < threads &&
           started + 1 < j->n_index + (j->extra != NULL) + j->n_shard &&
           pthread_create(&th[started], NULL, open_jobs_main, j) == 0)
        started++;
    open_jobs_main(j);
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
}

/* The index (parse_index), the caller's job and every file of df at once. */
static int open_index_and_files(kl_checkpoint *ck, int parse_index, dir_files *df,
                                kl_ckpt_job_fn job, void *job_ctx, kl_err *err)
{
    open_jobs j = {.ck = ck, .n_index = parse_index != 0, .extra = job, .extra_ctx = job_ctx,
                   .n_shard = df->n};
    j.shard = kl_malloc((df->n ? df->n : 1) * sizeof *j.shard);
    if (!j.shard)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    for (size_t i = 0; i < df->n; i++)
        j.shard[i] = &df->f[i];
    run_jobs(&j);
    kl_free(j.shard);
    return 0;
}

/* Shards the directory listing did not have (named by the index only): parsed now, which
 * reports why they cannot be read. */
static int open_pending(kl_checkpoint *ck, kl_err *err)
{
    open_jobs j = {.ck = ck};
    j.shard = kl_malloc((ck->n_shards ? ck->n_shards : 1) * sizeof *j.shard);
    if (!j.shard)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    for (size_t i = 0; i < ck->n_shards; i++)
        if (!ck->shards[i].ok && !ck->shards[i].err.code)
            j.shard[j.n_shard++] = &ck->shards[i];
    run_jobs(&j);
    kl_free(j.shard);
    return 0;
}

/* ---- tensor table -------------------------------------------------------------------------- */

static int build_table(kl_checkpoint *ck, kl_err *err)
{
    size_t total = 0;
    for (size_t i = 0; i < ck->n_shards; i++)
        if (ck->shards[i].ok)
            total += ck->shards[i].st.n_tensors;
    ck->tensors = kl_calloc(total ? total : 1, sizeof *ck->tensors);
    if (!ck->tensors || kl_strmap_init(&ck->by_name, total))
        return kl_fail(err, KL_E_NOMEM, "out of memory for %zu tensors", total);
    for (size_t i = 0; i < ck->n_shards; i++) {
        if (!ck->shards[i].ok)
            continue;
        const kl_st_file *st = &ck->shards[i].st;
        for (size_t j = 0; j < st->n_tensors; j++) {
            kl_ckpt_tensor *t = &ck->tensors[ck->n_tensors];
            t->name = st->tensors[j].name;
            t->shard = (uint32_t)i;
            t->t = &st->tensors[j];
            int put = kl_strmap_put_h(&ck->by_name, t->name, t->t->name_hash,
                                      (uint32_t)ck->n_tensors, NULL);
            if (put < 0)
                return kl_fail(err, KL_E_NOMEM, "out of memory");
            if (put == 1)
                ck->n_dup_across_shards++;
            ck->n_tensors++;
        }
    }
    return 0;
}

/* ---- public API ---------------------------------------------------------------------------- */

static int is_regular_or_missing(const char *path, bool *exists)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        *exists = false;
        return errno == ENOENT ? 0 : -1;
    }
    *exists = true;
    return 0;
}

int kl_ckpt_open(kl_checkpoint *ck, const char *dir, kl_err *err)
{
    return kl_ckpt_open_with(ck, dir, NULL, NULL, err);
}

int kl_ckpt_open_with(kl_checkpoint *ck, const char *dir, kl_ckpt_job_fn job, void *job_ctx,
                      kl_err *err)
{
    memset(ck, 0, sizeof *ck);
    kl_err_clear(&ck->config_err);
    kl_err_clear(&ck->index_err);
    struct stat st;
    int st_rc = stat(dir, &st);
    if (st_rc != 0 || !S_ISDIR(st.st_mode)) {
        kl_fail_sys(err, KL_E_IO, st_rc != 0 ? errno : ENOTDIR,
                    "not a readable checkpoint directory");
        kl_err_context(err, dir, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    char path[4096];
    int rc = 0;
    dir_files df = {0};
    if (!(ck->dir = kl_strdup(dir)))
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    if ((rc = kl_path_join(path, sizeof path, dir, CONFIG_NAME, err)))
        goto fail;
    ck->config_path = kl_strdup(path);
    ck->config_ok = kl_config_open(&ck->config, path, &ck->config_err) == 0;

    if ((rc = kl_path_join(path, sizeof path, dir, INDEX_NAME, err)))
        goto fail;
    ck->index_path = kl_strdup(path);
    if (!ck->config_path || !ck->index_path) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory");
        goto fail;
    }
    bool exists = false;
    if (is_regular_or_missing(path, &exists) != 0)
        exists = true; /* let the parser report the error */
    ck->has_index = exists;
    /* the directory's files are parsed while the index is; the index then orders them */
    if ((rc = list_dir_files(ck, &df, err)) ||
        (rc = open_index_and_files(ck, exists, &df, job, job_ctx, err)))
        goto fail;
    if (ck->index_ok && (rc = add_index_shards(ck, &df, err)))
        goto fail;
    if ((rc = add_dir_shards(ck, &df, err)) || (rc = open_pending(ck, err)) ||
        (rc = build_table(ck, err)))
        goto fail;
    dir_files_free(&df);
    return 0;
fail:
    dir_files_free(&df);
    kl_ckpt_close(ck);
    return rc;
}

void kl_ckpt_close(kl_checkpoint *ck)
{
    if (!ck)
        return;
    for (size_t i = 0; i < ck->n_shards; i++)
        shard_free(&ck->shards[i]);
    kl_free(ck->shards);
    kl_free(ck->index_shard);
    kl_free(ck->tensors);
    kl_strmap_free(&ck->by_name);
    if (ck->index_ok)
        kl_index_free(&ck->index);
    kl_free(ck->dir);
    kl_free(ck->config_path);
    kl_free(ck->index_path);
    memset(ck, 0, sizeof *ck);
}

static int copy_err(kl_err *err, const kl_err *src)
{
    if (err && !err->code)
        *err = *src;
    return src->code;
}

int kl_ckpt_require_ok(const kl_checkpoint *ck, kl_err *err)
{
    if (!ck->config_ok)
        return copy_err(err, &ck->config_err);
    if (ck->has_index && !ck->index_ok)
        return copy_err(err, &ck->index_err);
    if (ck->n_shards == 0)
        return kl_fail_rule(err, KL_E_FORMAT, "CK-NO-SHARDS", "no .safetensors files in %s",
                            ck->dir);
    for (size_t i = 0; i < ck->n_shards; i++)
        if (!ck->shards[i].ok)
            return copy_err(err, &ck->shards[i].err);
    return 0;
}

const kl_ckpt_tensor *kl_ckpt_find(const kl_checkpoint *ck, const char *name)
{
    uint32_t i;
    return kl_strmap_get(&ck->by_name, name, &i) ? &ck->tensors[i] : NULL;
}

int kl_ckpt_open_reader(const kl_checkpoint *ck, const kl_reader_opts *opts, kl_reader **out,
                        kl_err *err)
{
    *out = NULL;
    kl_reader_opts ro = opts ? *opts : (kl_reader_opts){0};
    const char **paths = kl_calloc(ck->n_shards ? ck->n_shards : 1, sizeof *paths);
    if (!paths)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    for (size_t i = 0; i < ck->n_shards; i++)
        paths[i] = ck->shards[i].path;
    kl_reader_opts_for_files(&ro, paths, ck->n_shards);
    kl_free(paths);
    kl_reader *r = NULL;
    int rc = kl_reader_create(&r, &ro, err);
    for (size_t i = 0; !rc && i < ck->n_shards; i++) {
        int idx = kl_reader_add_file(r, ck->shards[i].path, err);
        if (idx < 0)
            rc = idx;
        else if ((size_t)idx != i)
            rc = kl_fail(err, KL_E_BUG, "reader file %d for shard %zu", idx, i);
    }
    if (rc) {
        kl_reader_destroy(r);
        return rc;
    }
    *out = r;
    return 0;
}
