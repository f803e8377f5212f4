/* convert/layout.c — file order and shard cuts (see layout.h). */
#include "convert/layout.h"

#include "common/grow.h"
#include "common/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SHARDS 99999

static int cmp_name(const void *a, const void *b, void *ctx)
{
    const kl_schema *s = ctx;
    return strcmp(s->entries[*(const size_t *)a].name, s->entries[*(const size_t *)b].name);
}

static int is_mx_expert(const kl_schema_entry *e)
{
    return kl_role_is_expert(e->role) && e->part != KL_PART_WEIGHT;
}

/* Appends the next unit (one tensor, or one layer's MXFP4 experts) to l->order at *pos.
 * Returns 1 if entry i starts a unit, 0 if it was already placed with its layer's region. */
static int next_unit(kl_layout *l, const kl_schema *s, size_t i, uint8_t *region_done,
                     size_t *pos)
{
    const kl_schema_entry *e = &s->entries[i];
    if (!is_mx_expert(e)) {
        l->order[(*pos)++] = i;
        return 1;
    }
    if (region_done[e->layer])
        return 0;
    region_done[e->layer] = 1;
    size_t start = *pos;
    for (size_t j = i; j < s->n; j++)
        if (s->entries[j].layer == e->layer && is_mx_expert(&s->entries[j]))
            l->order[(*pos)++] = j;
    qsort_r(l->order + start, *pos - start, sizeof *l->order, cmp_name, (void *)s);
    return 1;
}

static kl_layout_shard *new_shard(kl_layout *l, size_t *cap, size_t first)
{
    if (kl_grow(&l->shards, cap, l->n_shards + 1, sizeof *l->shards))
        return NULL;
    kl_layout_shard *sh = &l->shards[l->n_shards++];
    memset(sh, 0, sizeof *sh);
    sh->first = first;
    return sh;
}

static int cut_shards(kl_layout *l, const kl_schema *s, const uint64_t *bytes,
                      uint64_t shard_bytes, uint8_t *region_done, kl_err *err)
{
    size_t pos = 0, cap = 0;
    kl_layout_shard *cur = NULL;
    for (size_t i = 0; i < s->n; i++) {
        size_t start = pos;
        if (!next_unit(l, s, i, region_done, &pos))
            continue;
        uint64_t unit = 0;
        for (size_t j = start; j < pos; j++)
            unit += bytes[l->order[j]];
        if (!cur || (cur->count && cur->tensor_bytes + unit > shard_bytes))
            if (!(cur = new_shard(l, &cap, start)))
                return kl_fail(err, KL_E_NOMEM, "out of memory planning shards");
        for (size_t j = start; j < pos; j++) {
            l->begin[j] = cur->tensor_bytes;
            cur->tensor_bytes += bytes[l->order[j]];
        }
        cur->count += pos - start;
    }
    if (pos != s->n)
        return kl_fail(err, KL_E_BUG, "shard plan lists %zu of %zu tensors", pos, s->n);
    return 0;
}

int kl_layout_plan(kl_layout *l, const kl_schema *s, const uint64_t *bytes, uint64_t shard_bytes,
                   kl_err *err)
{
    memset(l, 0, sizeof *l);
    for (size_t i = 0; i < s->n; i++)
        if (is_mx_expert(&s->entries[i]) &&
            (s->entries[i].layer < 0 || s->entries[i].layer >= KL_MAX_LAYERS))
            return kl_fail(err, KL_E_BUG, "expert tensor %s outside a layer",
                           s->entries[i].name);
    l->n = s->n;
    l->order = kl_calloc(s->n ? s->n : 1, sizeof *l->order);
    l->begin = kl_calloc(s->n ? s->n : 1, sizeof *l->begin);
    uint8_t *region_done = kl_calloc(KL_MAX_LAYERS, 1);
    int rc = 0;
    if (!l->order || !l->begin || !region_done)
        rc = kl_fail(err, KL_E_NOMEM, "out of memory planning %zu tensors", s->n);
    if (!rc)
        rc = cut_shards(l, s, bytes, shard_bytes, region_done, err);
    kl_free(region_done);
    if (!rc && l->n_shards > MAX_SHARDS)
        rc = kl_fail(err, KL_E_USAGE, "%zu shards: raise the shard size", l->n_shards);
    for (size_t k = 0; !rc && k < l->n_shards; k++)
        snprintf(l->shards[k].name, sizeof l->shards[k].name,
                 "model-%05zu-of-%05zu.safetensors", k + 1, l->n_shards);
    if (rc)
        kl_layout_free(l);
    return rc;
}

void kl_layout_free(kl_layout *l)
{
    if (!l)
        return;
    kl_free(l->order);
    kl_free(l->begin);
    kl_free(l->shards);
    memset(l, 0, sizeof *l);
}
