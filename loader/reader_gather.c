/* loader/reader_gather.c — scattered extents read as few long ones (see reader.h,
 * kl_reader_run_gathered). */
#include "loader/reader.h"
#include "loader/reader_int.h"

#include "common/mem.h"

#include <stdio.h>
#include <stdlib.h>

/* A sort key carrying its extent's index (qsort has no context argument). */
typedef struct gather_key {
    uint32_t file;
    uint64_t off;
    size_t   idx;
} gather_key;

typedef struct gather {
    const kl_extent *ext;      /* the caller's extents */
    gather_key      *order;    /* [n] non-empty extents by (file, offset) */
    size_t           n_order;
    kl_extent       *runs;     /* [n_runs] merged reads */
    size_t          *run_first;/* [n_runs] index into order of each run's first extent */
    size_t           n_runs;
    size_t           cursor;   /* index into order: the extent being delivered */
    size_t           cancelled_at; /* the caller's extent whose callback cancelled */
    kl_reader_cb     cb;
    void            *ctx;
} gather;

static int by_position(const void *a, const void *b)
{
    const gather_key *x = a, *y = b;
    if (x->file != y->file)
        return x->file < y->file ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Sorts the non-empty extents and cuts them into runs. */
static int plan(gather *g, size_t n, uint64_t max_gap, kl_err *err)
{
    for (size_t i = 0; i < n; i++)
        if (g->ext[i].len)
            g->order[g->n_order++] = (gather_key){g->ext[i].file, g->ext[i].off, i};
    qsort(g->order, g->n_order, sizeof *g->order, by_position);
    for (size_t k = 0; k < g->n_order; k++) {
        const kl_extent *e = &g->ext[g->order[k].idx];
        kl_extent *last = g->n_runs ? &g->runs[g->n_runs - 1] : NULL;
        uint64_t last_end = last ? last->off + last->len : 0;
        if (last && last->file == e->file && e->off < last_end)
            return kl_fail(err, KL_E_USAGE, "extents %zu and %zu overlap in file %u",
                           g->order[k - 1].idx, g->order[k].idx, (unsigned)e->file);
        if (last && last->file == e->file && e->off - last_end <= max_gap) {
            last->len = e->off + e->len - last->off;
            continue;
        }
        g->run_first[g->n_runs] = k;
        g->runs[g->n_runs++] = *e;
    }
    return 0;
}

/* A chunk of run `run` at run_off: each extent it covers gets its part; gaps are skipped. */
static int on_run_chunk(void *ctx, size_t run, uint64_t run_off, const uint8_t *data, size_t len)
{
    gather *g = ctx;
    if (run_off == 0)
        g->cursor = g->run_first[run];
    uint64_t pos = g->runs[run].off + run_off, end = pos + len;
    while (pos < end && g->cursor < g->n_order) {
        size_t idx = g->order[g->cursor].idx;
        const kl_extent *e = &g->ext[idx];
        if (pos >= e->off + e->len) { /* this extent is complete */
            g->cursor++;
            continue;
        }
        if (pos < e->off) { /* a gap before it */
            if (e->off >= end)
                break;
            data += e->off - pos;
            pos = e->off;
        }
        uint64_t stop = e->off + e->len < end ? e->off + e->len : end;
        size_t take = (size_t)(stop - pos);
        if (g->cb && g->cb(g->ctx, idx, pos - e->off, data, take)) {
            g->cancelled_at = idx;
            return 1;
        }
        data += take;
        pos += take;
    }
    return 0;
}

int kl_reader_run_gathered(kl_reader *r, const kl_extent *ext, size_t n_ext, uint64_t max_gap,
                           kl_reader_cb cb, void *ctx, kl_err *err)
{
    if (!r || (n_ext && !ext))
        return kl_fail(err, KL_E_USAGE, "kl_reader_run_gathered: reader or extents is NULL");
    size_t cap = n_ext ? n_ext : 1;
    gather g = {.ext = ext, .cb = cb, .ctx = ctx};
    g.order = kl_calloc(cap, sizeof *g.order);
    g.runs = kl_calloc(cap, sizeof *g.runs);
    g.run_first = kl_calloc(cap, sizeof *g.run_first);
    /* checked before merging: a merged run would hide an extent that overflows or runs past
     * its file */
    int rc = kl_rd_check_extents(r, ext, n_ext, err);
    if (!rc)
        rc = g.order && g.runs && g.run_first
                 ? plan(&g, n_ext, max_gap, err)
                 : kl_fail(err, KL_E_NOMEM, "out of memory planning %zu reads", n_ext);
    if (!rc)
        rc = kl_reader_run(r, g.runs, g.n_runs, on_run_chunk, &g, err);
    if (rc == KL_E_CANCELLED && err) /* name the caller's extent, not the merged run */
        snprintf(err->msg, sizeof err->msg, "cancelled by the callback at extent %zu",
                 g.cancelled_at);
    kl_free(g.order);
    kl_free(g.runs);
    kl_free(g.run_first);
    return rc;
}
