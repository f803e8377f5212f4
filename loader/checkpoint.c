/*
 * loader/checkpoint.c — open a checkpoint directory's metadata (see checkpoint.h).
 *
 * Sections: shard list, tensor table, public API.
 */
#include "loader/checkpoint.h"

#include "common/fs.h"
#include "common/mem.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CONFIG_NAME "config.json"
#define INDEX_NAME "model.safetensors.index.json"
#define MAX_META_BYTES (256u << 20)

/* ---- shard list ---------------------------------------------------------------------------- */

static int add_shard(kl_checkpoint *ck, const char *name, kl_err *err)
{
    kl_ckpt_shard *s = &ck->shards[ck->n_shards];
    memset(s, 0, sizeof *s);
    kl_err_clear(&s->err);
    char path[4096];
    if (kl_path_join(path, sizeof path, ck->dir, name, err))
        return KL_E_USAGE;
    s->name = kl_strdup(name);
    s->path = kl_strdup(path);
    if (!s->name || !s->path) {
        kl_free(s->name);
        kl_free(s->path);
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    }
    ck->n_shards++;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Without an index: every *.safetensors of the directory, in name order. */
static int list_dir_shards(kl_checkpoint *ck, kl_err *err)
{
    DIR *d = opendir(ck->dir);
    if (!d) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot open checkpoint directory");
        kl_err_context(err, ck->dir, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    size_t cap = 16, n = 0;
    char **names = kl_malloc(cap * sizeof *names);
    int rc = names ? 0 : kl_fail(err, KL_E_NOMEM, "out of memory");
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || len < 12 || strcmp(e->d_name + len - 12, ".safetensors"))
            continue;
        if (n == cap) {
            char **bigger = kl_realloc(names, 2 * cap * sizeof *names);
            if (!bigger) {
                rc = kl_fail(err, KL_E_NOMEM, "out of memory");
                break;
            }
            names = bigger;
            cap *= 2;
        }
        if (!(names[n] = kl_strdup(e->d_name)))
            rc = kl_fail(err, KL_E_NOMEM, "out of memory");
        else
            n++;
    }
    closedir(d);
    if (!rc) {
        qsort(names, n, sizeof *names, cmp_str);
        ck->shards = kl_calloc(n ? n : 1, sizeof *ck->shards);
        if (!ck->shards)
            rc = kl_fail(err, KL_E_NOMEM, "out of memory");
        for (size_t i = 0; !rc && i < n; i++)
            rc = add_shard(ck, names[i], err);
    }
    for (size_t i = 0; i < n; i++)
        kl_free(names[i]);
    kl_free(names);
    return rc;
}

static int list_index_shards(kl_checkpoint *ck, kl_err *err)
{
    ck->shards = kl_calloc(ck->index.n_shards ? ck->index.n_shards : 1, sizeof *ck->shards);
    if (!ck->shards)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    for (size_t i = 0; i < ck->index.n_shards; i++)
        if (add_shard(ck, ck->index.shards[i], err))
            return err ? err->code : KL_E_NOMEM;
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
            int put = kl_strmap_put(&ck->by_name, t->name, (uint32_t)ck->n_tensors, NULL);
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
    memset(ck, 0, sizeof *ck);
    kl_err_clear(&ck->config_err);
    kl_err_clear(&ck->index_err);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        kl_fail_sys(err, KL_E_IO, errno ? errno : ENOTDIR, "not a readable checkpoint directory");
        kl_err_context(err, dir, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    char path[4096];
    int rc = 0;
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
    if (exists)
        ck->index_ok = kl_index_open(&ck->index, path, &ck->index_err) == 0;

    rc = ck->index_ok ? list_index_shards(ck, err) : list_dir_shards(ck, err);
    if (rc)
        goto fail;
    for (size_t i = 0; i < ck->n_shards; i++) {
        kl_ckpt_shard *s = &ck->shards[i];
        s->ok = kl_st_open(&s->st, s->path, &s->err) == 0;
    }
    if ((rc = build_table(ck, err)))
        goto fail;
    return 0;
fail:
    kl_ckpt_close(ck);
    return rc;
}

void kl_ckpt_close(kl_checkpoint *ck)
{
    if (!ck)
        return;
    for (size_t i = 0; i < ck->n_shards; i++) {
        kl_st_close(&ck->shards[i].st);
        kl_free(ck->shards[i].name);
        kl_free(ck->shards[i].path);
    }
    kl_free(ck->shards);
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
