/*
 * audit/regions.c — where each MoE layer's routed experts sit.
 *
 * The loader reads a layer's experts as one extent when they form one gap-free run in one
 * shard (the converted layout, and Kimi K3's); the official BF16 release interleaves them
 * across shards, which the loader handles with several extents.  This is information for the
 * user, never a problem.
 */
#include "audit/audit_int.h"

#include "common/mem.h"

#include <stdlib.h>
#include <string.h>

typedef struct span {
    uint32_t shard;
    uint64_t begin, end;     /* data_offsets within the shard */
    uint64_t file_off;
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->shard != y->shard)
        return x->shard < y->shard ? -1 : 1;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Region of one layer from its expert spans (sorted in place). */
static void summarize(kl_expert_region *g, span *sp, size_t n)
{
    qsort(sp, n, sizeof *sp, cmp_span);
    g->n_tensors = (uint32_t)n;
    g->n_shards = n ? 1 : 0;
    g->contiguous = n > 0;
    for (size_t i = 0; i < n; i++) {
        g->n_bytes += sp[i].end - sp[i].begin;
        if (i && sp[i].shard != sp[i - 1].shard) {
            g->n_shards++;
            g->contiguous = false;
        } else if (i && sp[i].begin != sp[i - 1].end) {
            g->contiguous = false;
        }
    }
    if (g->contiguous) {
        g->shard = sp[0].shard;
        g->file_off = sp[0].file_off;
    }
}

int kl_audit_regions(kl_audit_report *r, const kl_checkpoint *ck, const kl_schema *s)
{
    const kl_config *c = &ck->config;
    span *sp = kl_malloc((s->n ? s->n : 1) * sizeof *sp);
    r->regions = kl_calloc(c->num_hidden_layers ? c->num_hidden_layers : 1, sizeof *r->regions);
    if (!sp || !r->regions) {
        kl_free(sp);
        return KL_E_NOMEM;
    }
    size_t e = 0;
    for (uint32_t layer = 0; layer < c->num_hidden_layers; layer++) {
        if (!kl_config_is_moe_layer(c, layer))
            continue;
        size_t n = 0;
        /* Entries are grouped by layer; scan forward from where the last layer stopped. */
        for (; e < s->n && s->entries[e].layer <= (int32_t)layer; e++) {
            const kl_schema_entry *en = &s->entries[e];
            if (en->layer != (int32_t)layer || !kl_role_is_expert(en->role))
                continue;
            const kl_ckpt_tensor *t = kl_ckpt_find(ck, en->name);
            if (!t)
                continue;
            sp[n++] = (span){t->shard, t->t->begin, t->t->end, t->t->file_off};
        }
        kl_expert_region *g = &r->regions[r->n_regions++];
        memset(g, 0, sizeof *g);
        g->layer = layer;
        summarize(g, sp, n);
    }
    kl_free(sp);
    return 0;
}
