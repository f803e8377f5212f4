/* convert/out_plan.c — planned output sizes and the free-space check (see out_plan.h). */
#include "convert/out_plan.h"

#include "common/fs.h"
#include "common/mem.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>

/* config.json and the tokenizer files are small; this covers them with room to spare. */
#define SMALL_FILES_MARGIN ((uint64_t)4 << 20)

void kl_out_plan_wtensors(const kl_schema *s, const kl_layout *l, const kl_dtype *dtypes,
                          size_t k, kl_st_wtensor *wt)
{
    const kl_layout_shard *ls = &l->shards[k];
    for (size_t i = 0; i < ls->count; i++) {
        size_t si = l->order[ls->first + i];
        const kl_schema_entry *e = &s->entries[si];
        wt[i].name = e->name;
        wt[i].dtype = dtypes[si];
        wt[i].rank = e->rank;
        memcpy(wt[i].shape, e->shape, sizeof e->shape);
    }
}

/* Header bytes of shard k as the writer lays it out (default alignment). */
static int header_bytes(const kl_schema *s, const kl_layout *l, const kl_dtype *dtypes, size_t k,
                        uint64_t *out, kl_err *err)
{
    size_t n = l->shards[k].count;
    kl_st_wtensor *wt = kl_calloc(n ? n : 1, sizeof *wt);
    if (!wt)
        return kl_fail(err, KL_E_NOMEM, "out of memory planning %s", l->shards[k].name);
    kl_out_plan_wtensors(s, l, dtypes, k, wt);
    uint8_t *hdr = NULL;
    int rc = kl_st_header_build(wt, n, 0, &hdr, out, NULL, NULL, err);
    kl_free(hdr);
    kl_free(wt);
    return rc;
}

int kl_out_plan_build(kl_out_plan *p, const kl_schema *s, const kl_layout *l,
                      const kl_dtype *dtypes, kl_err *err)
{
    memset(p, 0, sizeof *p);
    p->shards = kl_calloc(l->n_shards ? l->n_shards : 1, sizeof *p->shards);
    if (!p->shards)
        return kl_fail(err, KL_E_NOMEM, "out of memory planning %zu shards", l->n_shards);
    p->n_shards = l->n_shards;
    /* the index: one "name":"shard", row per tensor */
    uint64_t index_bytes = 256;
    for (size_t k = 0; k < l->n_shards; k++) {
        const kl_layout_shard *ls = &l->shards[k];
        kl_out_shard *o = &p->shards[k];
        uint64_t hdr;
        int rc = header_bytes(s, l, dtypes, k, &hdr, err);
        if (rc) {
            kl_out_plan_free(p);
            return rc;
        }
        snprintf(o->name, sizeof o->name, "%s", ls->name);
        o->n_tensors = ls->count;
        o->tensor_bytes = ls->tensor_bytes;
        o->file_bytes = hdr + ls->tensor_bytes;
        p->shard_bytes += o->file_bytes;
        for (size_t i = 0; i < ls->count; i++)
            index_bytes += strlen(s->entries[l->order[ls->first + i]].name) + strlen(ls->name) + 8;
    }
    p->other_bytes = index_bytes + SMALL_FILES_MARGIN;
    p->total_bytes = p->shard_bytes + p->other_bytes;
    p->needed_bytes = p->total_bytes;
    return 0;
}

int kl_out_plan_check_space(kl_out_plan *p, const char *dir, kl_err *err)
{
    struct statvfs v;
    char parent[4096];
    if (statvfs(dir, &v) != 0 &&
        (errno != ENOENT || kl_path_parent(parent, sizeof parent, dir, NULL) ||
         statvfs(parent, &v) != 0)) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot read the free space of the file system");
        kl_err_context(err, dir, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    p->free_bytes = (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
    if (p->needed_bytes <= p->free_bytes)
        return 0;
    kl_fail_at(err, KL_E_IO, "OUT-NO-SPACE", NULL, KL_NO_OFFSET,
               "not enough free space for the output: %llu bytes needed (%.2f GB), %llu "
               "available (%.2f GB)",
               (unsigned long long)p->needed_bytes, (double)p->needed_bytes / 1e9,
               (unsigned long long)p->free_bytes, (double)p->free_bytes / 1e9);
    kl_err_context(err, dir, NULL, KL_NO_OFFSET, NULL);
    return KL_E_IO;
}

void kl_out_plan_free(kl_out_plan *p)
{
    kl_free(p->shards);
    p->shards = NULL;
    p->n_shards = 0;
}
