/*
 * engine/gpu_plan.c — device layout of a model's weights and the fill (see gpu_plan.h).
 *
 * Sections: layout; pieces; fill (host pieces, mapped windows, the ring of buffers, the staged
 * reader).
 */
#include "engine/gpu_plan.h"

#include "common/clock.h"

#include "common/grow.h"
#include "common/mem.h"
#include "common/streamcopy.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* Layout (loader/arena.h) of the model's kinds and shapes                                    */

static kl_wshape shape_of(const kl_wmat *w)
{
    return (kl_wshape){w->kind, w->rows, w->cols};
}

/* Layer hl as the layout sees it: its routed experts (those it holds: one run [*first, *first +
 * in->n_experts) of ids, the others absent on a rank of expert parallelism) all alike. */
static int layer_in(const kl_layer *hl, uint32_t E, kl_arena_layer_in *in, uint32_t *first,
                    kl_err *err)
{
    memset(in, 0, sizeof *in);
    *first = 0;
    for (int r = 0; r < KL_ROLE_COUNT; r++)
        in->w[r] = shape_of(&hl->w[r]);
    if (!hl->moe || !hl->experts[0])
        return 0;
    const kl_wmat *ex0 = hl->experts[0];
    uint32_t e0 = 0, n = 0;
    while (e0 < E && ex0[e0].kind == KL_W_NONE)
        e0++;
    while (e0 + n < E && ex0[e0 + n].kind != KL_W_NONE)
        n++;
    for (int k = 0; k < 3; k++) {
        const kl_wmat *ex = hl->experts[k];
        for (uint32_t e = 0; ex && e < E; e++) {
            const kl_wmat *a = &ex[e], *b = &ex[e0 < E ? e0 : 0];
            const int held = e >= e0 && e < e0 + n;
            if (held ? a->kind != b->kind || a->rows != b->rows || a->cols != b->cols
                     : a->kind != KL_W_NONE)
                return kl_fail(err, KL_E_UNSUPPORTED, "experts of one layer differ in shape or "
                               "kind, or those held are not one run of ids (expert %u)", e);
        }
        if (ex && n)
            in->ex[k] = shape_of(&ex[e0]);
    }
    in->n_experts = n;
    *first = n ? e0 : 0;
    return 0;
}

static int plan_layer(uint64_t *top, const kl_layer *hl, uint32_t E, kl_plan_layer *pl,
                      kl_err *err)
{
    kl_arena_layer_in in;
    uint32_t first;
    int rc = layer_in(hl, E, &in, &first, err);
    if (!rc)
        kl_arena_layer(top, &in, pl);
    pl->expert0 = first;
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Pieces                                                                                     */

/* Where source s goes: 0 with *arena, *dst and the bytes it must have; 1 when it is a vector
 * (its fp32 copy is a host piece); -1 when the plan has no place for it. */
static int dest_of(const kl_gpu_plan *p, const kl_model_src *s, uint32_t *arena, uint64_t *dst,
                   uint64_t *want)
{
    const kl_plan_mat *w;
    uint64_t e = 0;
    if (s->layer < 0) {
        *arena = p->n_arenas - 1;
        if (s->role == KL_ROLE_FINAL_NORM)
            return 1;
        w = s->role == KL_ROLE_EMBED ? &p->embed : s->role == KL_ROLE_LM_HEAD ? &p->lm_head
                                                                               : NULL;
    } else {
        if ((uint32_t)s->layer + 1 >= p->n_arenas)
            return -1;
        const kl_plan_layer *pl = &p->layer[s->layer];
        *arena = (uint32_t)s->layer;
        if (pl->vec[s->role] != KL_PLAN_NONE)
            return 1;
        if (kl_role_is_expert(s->role)) {
            if (s->expert < 0 || (uint32_t)s->expert - pl->expert0 >= pl->n_experts)
                return -1;
            w = &pl->ex[s->role - KL_ROLE_EXPERT_W1];
            e = (uint64_t)s->expert - pl->expert0;
        } else {
            w = &pl->w[s->role];
        }
    }
    if (!w || w->kind == KL_W_NONE)
        return -1;
    int scale = s->part == KL_PART_SCALE;
    *want = scale ? kl_plan_scale_bytes(w) : kl_plan_data_bytes(w);
    *dst = (scale ? w->scale : w->data) + e * *want;
    return 0;
}

static int cmp_piece(const void *a, const void *b)
{
    const kl_plan_piece *x = a, *y = b;
    if (x->shard != y->shard)
        return x->shard < y->shard ? -1 : 1;
    return x->src < y->src ? -1 : x->src > y->src;
}

static void add_vec(kl_gpu_plan *p, uint32_t arena, uint64_t dst, const float *v, uint64_t n)
{
    p->pieces[p->n_pieces++] = (kl_plan_piece){.arena = arena, .dst = dst, .shard = KL_PLAN_HOST,
                                               .host = v, .bytes = n * sizeof *v};
}

/* One piece per matrix tensor (file pieces first, by shard and offset), then the vectors. */
static int make_pieces(kl_gpu_plan *p, const kl_model *m, kl_err *err)
{
    p->pieces = kl_calloc(m->n_src + 1, sizeof *p->pieces);
    if (!p->pieces)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    for (int host = 0; host < 2; host++) {
        for (size_t i = 0; i < m->n_src; i++) {
            const kl_model_src *s = &m->src[i];
            uint32_t arena;
            uint64_t dst = 0, want = 0;
            if ((s->host != NULL) != host)
                continue;
            int d = dest_of(p, s, &arena, &dst, &want);
            if (d < 0 || (d == 0 && want != s->bytes))
                return kl_fail(err, KL_E_BUG, "tensor %zu (%s, layer %d, expert %d) has no "
                               "place of its size in the GPU plan", i, kl_role_name(s->role),
                               s->layer, s->expert);
            if (d)
                continue;
            if (s->pitch && (host || !s->width || s->bytes % s->width || s->pitch < s->width))
                return kl_fail(err, KL_E_BUG, "tensor %zu (%s, layer %d): rows of %llu bytes "
                               "%llu apart, %llu bytes%s", i, kl_role_name(s->role), s->layer,
                               (unsigned long long)s->width, (unsigned long long)s->pitch,
                               (unsigned long long)s->bytes, host ? " in host memory" : "");
            p->pieces[p->n_pieces++] = (kl_plan_piece){arena, dst, host ? KL_PLAN_HOST
                                                                        : s->shard, s->off,
                                                       s->host, s->bytes, s->pitch, s->width};
            if (!host)
                p->file_bytes += s->bytes;
        }
        if (!host) {
            p->n_file = p->n_pieces;
            qsort(p->pieces, p->n_file, sizeof *p->pieces, cmp_piece);
        }
    }
    return 0;
}

/* Host pieces of the vectors (the fp32 copies of engine/model.h). */
static int vec_pieces(kl_gpu_plan *p, const kl_model *m, kl_err *err)
{
    size_t n = p->n_pieces + 1;
    for (uint32_t l = 0; l + 1 < p->n_arenas; l++)
        for (int r = 0; r < KL_ROLE_COUNT; r++)
            n += p->layer[l].vec[r] != KL_PLAN_NONE;
    kl_plan_piece *np = kl_realloc(p->pieces, n * sizeof *np);
    if (!np)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    p->pieces = np;
    add_vec(p, p->n_arenas - 1, p->final_norm, m->final_norm, m->cfg.hidden_size);
    for (uint32_t l = 0; l + 1 < p->n_arenas; l++) {
        const kl_layer *hl = &m->layers[l];
        for (int r = 0; r < KL_ROLE_COUNT; r++)
            if (p->layer[l].vec[r] != KL_PLAN_NONE)
                add_vec(p, l, p->layer[l].vec[r], hl->vec[r], hl->w[r].rows * hl->w[r].cols);
    }
    return 0;
}

int kl_gpu_plan_build(kl_gpu_plan *p, const kl_model *m, kl_err *err)
{
    memset(p, 0, sizeof *p);
    uint32_t L = m->cfg.num_hidden_layers;
    p->n_arenas = L + 1;
    p->arena_bytes = kl_calloc(L + 1, sizeof *p->arena_bytes);
    p->layer = kl_calloc(L ? L : 1, sizeof *p->layer);
    int rc = !p->arena_bytes || !p->layer ? kl_fail(err, KL_E_NOMEM, "out of memory") : 0;
    for (uint32_t l = 0; !rc && l < L; l++)
        rc = plan_layer(&p->arena_bytes[l], &m->layers[l], m->cfg.num_experts, &p->layer[l],
                        err);
    if (!rc) {
        kl_wshape e = shape_of(&m->embed), h = shape_of(&m->lm_head);
        kl_arena_global(&p->arena_bytes[L], &e, m->cfg.tie_word_embeddings ? NULL : &h,
                        m->cfg.hidden_size, &p->embed, &p->lm_head, &p->final_norm);
        for (uint32_t a = 0; a <= L; a++)
            p->total_bytes += p->arena_bytes[a];
        rc = make_pieces(p, m, err);
    }
    if (!rc)
        rc = vec_pieces(p, m, err);
    if (rc)
        kl_gpu_plan_free(p);
    return rc;
}

void kl_gpu_plan_free(kl_gpu_plan *p)
{
    kl_free(p->arena_bytes);
    kl_free(p->layer);
    kl_free(p->pieces);
    memset(p, 0, sizeof *p);
}

/* The file pieces (host: the host pieces) of every plan appended to out's, their arenas
 * numbered after the plans' before them. */
static void merge_pieces(const kl_gpu_plan *plans, unsigned n, int host, kl_gpu_plan *out)
{
    uint32_t base = 0;
    for (unsigned r = 0; r < n; base += plans[r++].n_arenas) {
        const kl_gpu_plan *p = &plans[r];
        for (size_t i = host ? p->n_file : 0; i < (host ? p->n_pieces : p->n_file); i++) {
            kl_plan_piece pc = p->pieces[i];
            pc.arena += base;
            out->pieces[out->n_pieces++] = pc;
        }
    }
}

int kl_gpu_plan_merge(const kl_gpu_plan *plans, unsigned n, kl_gpu_plan *out, kl_err *err)
{
    memset(out, 0, sizeof *out);
    size_t np = 0;
    for (unsigned r = 0; r < n; r++) {
        np += plans[r].n_pieces;
        out->n_arenas += plans[r].n_arenas;
        out->file_bytes += plans[r].file_bytes;
        out->total_bytes += plans[r].total_bytes;
    }
    out->arena_bytes = kl_calloc(out->n_arenas ? out->n_arenas : 1, sizeof *out->arena_bytes);
    out->pieces = kl_calloc(np ? np : 1, sizeof *out->pieces);
    if (!out->arena_bytes || !out->pieces) {
        kl_gpu_plan_free(out);
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    }
    for (unsigned r = 0, a = 0; r < n; a += plans[r++].n_arenas)
        memcpy(out->arena_bytes + a, plans[r].arena_bytes,
               plans[r].n_arenas * sizeof *out->arena_bytes);
    merge_pieces(plans, n, 0, out);
    out->n_file = out->n_pieces;
    qsort(out->pieces, out->n_file, sizeof *out->pieces, cmp_piece);
    merge_pieces(plans, n, 1, out);
    return 0;
}

void kl_gpu_plan_split(const kl_gpu_plan *p, double share, kl_gpu_plan *first,
                       kl_gpu_plan *second)
{
    uint64_t keep = (uint64_t)((1.0 - (share < 0 ? 0 : share > 1 ? 1 : share)) *
                               (double)p->file_bytes);
    uint64_t done = 0;
    size_t j = 0;
    for (; j < p->n_file && done + p->pieces[j].bytes <= keep; j++)
        done += p->pieces[j].bytes;
    *first = *p;
    first->n_pieces = first->n_file = j;
    first->file_bytes = done;
    *second = *p;
    second->pieces = p->pieces + j;
    second->n_pieces = p->n_pieces - j;
    second->n_file = p->n_file - j;
    second->file_bytes = p->file_bytes - done;
}

/* ------------------------------------------------------------------------------------------ */
/* Fill                                                                                       */

typedef struct window {
    uint8_t *map;
    size_t   len;
    int      pinned;
} window;

/* One window of the walk: bytes [ws, we) of a shard, its first piece j. */
typedef struct wspan {
    uint32_t shard;
    uint64_t ws, we;
    size_t   j;
} wspan;

/* RING: a buffer as the load threads and the copying thread share it. */
enum { RB_NONE, RB_FREE, RB_READING, RB_FILLED };   /* RB_NONE: not allocated yet */
typedef struct ring_buf {
    uint8_t *mem;
    size_t   span;     /* RB_FILLED: the span it holds */
    int      state;
    int      marked;   /* its copies marked (slot = its index), not yet waited for */
} ring_buf;

#define RING_ALIGN 4096u   /* span starts and read lengths: O_DIRECT's unit */

/* A window slot as the prep threads and the copying thread share it. */
typedef struct slot_state {
    long win;          /* window it holds (-1: none yet) */
    int  ready;        /* mapped (and pinned if it could be), not yet copied */
} slot_state;

typedef struct filler {
    const kl_gpu_plan *p;
    uint8_t *const    *arena;
    const kl_fill_ops *ops;
    kl_fill_stats      st;
    window             win[KL_FILL_MAX_WINDOWS];
    unsigned           n_win;
    uint64_t           wbytes;
    kl_err            *cb_err;     /* READ: the copy's error, from the callback */
    int                cb_rc;
    /* MAPPED */
    int               *fd;         /* [n_fd] one per shard, -1 when unused */
    uint32_t           n_fd;
    int                oflags;     /* RING: O_DIRECT when asked */
    int                from_mapping;   /* RING: spans copied out of mapped shards */
    int                cached;     /* RING from_mapping: by memcpy, not streaming stores */
    int                lanes;      /* RING staged: each load thread stages its own spans */
    unsigned           lane_next;  /* lanes: handed to the load threads so far */
    /* RING staged on the device (ops->places, ops->stage) */
    kl_gpu_place      *pl;         /* every span's places, span after span */
    size_t             n_pl, cap_pl;
    size_t            *span_first; /* [n_spans + 1]: span k's places start; NULL: not staged */
    int                recording;  /* the walk records places instead of copying */
    uint8_t          **map;        /* RING from_mapping: [n_fd] each shard mapped whole, or
                                      NULL (not opened, empty, or refused: pread) */
    uint64_t          *map_len;
    const char *const *paths;
    /* RING */
    ring_buf          *rb;
    unsigned           n_rb, n_alloc;   /* buffers wanted, allocated so far */
    int                rb_pinned;  /* buffers from ops->host_alloc or the caller's */
    void *const       *rb_given;   /* the caller's buffers (opts->buffers), not freed here */
    wspan             *spans;
    size_t             n_spans;
    /* prep threads */
    pthread_mutex_t    mu;
    pthread_cond_t     cv;
    slot_state         slot[KL_FILL_MAX_WINDOWS];
    size_t             next;       /* next window a prep thread takes */
    int                stop;       /* an error (or the end): everyone stops */
    int                prep_rc;
    kl_err             prep_err;
} filler;

uint64_t kl_plan_piece_end(const kl_plan_piece *pc)
{
    return pc->pitch && pc->bytes ? pc->src + (pc->bytes / pc->width - 1) * pc->pitch + pc->width
                                  : pc->src + pc->bytes;
}

/* A piece part's place in the span being recorded (RING staged on the device). */
static int record(filler *f, uint64_t at, uint8_t *dst, uint64_t width, uint64_t pitch,
                  uint64_t rows, kl_err *err)
{
    if (kl_grow(&f->pl, &f->cap_pl, f->n_pl + 1, sizeof *f->pl))
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    f->pl[f->n_pl++] = (kl_gpu_place){at, dst, width, pitch, rows};
    return 0;
}

/* Bytes [from, from + len) of piece pc, whose source is base + at (recorded: at alone). */
static int copy_part(filler *f, const kl_plan_piece *pc, uint64_t from, const uint8_t *base,
                     uint64_t at, uint64_t len, int pinned, kl_err *err)
{
    uint8_t *dst = f->arena[pc->arena] + pc->dst + from;
    if (f->recording)
        return record(f, at, dst, len, 0, 1, err);
    f->st.bytes += len;
    return f->ops->copy(f->ops->ctx, dst, base + at, (size_t)len, pinned, err);
}

/* Rows [i, i + n) of piece pc (which has a pitch), whose source is base + at. */
static int copy_rows(filler *f, const kl_plan_piece *pc, uint64_t i, uint64_t n,
                     const uint8_t *base, uint64_t at, int pinned, kl_err *err)
{
    const uint64_t w = pc->width;
    if (f->recording)
        return record(f, at, f->arena[pc->arena] + pc->dst + i * w, w, pc->pitch, n, err);
    if (!f->ops->copy_rows) {
        int rc = 0;
        for (uint64_t k = 0; !rc && k < n; k++)
            rc = copy_part(f, pc, (i + k) * w, base, at + k * pc->pitch, w, pinned, err);
        return rc;
    }
    f->st.bytes += n * w;
    return f->ops->copy_rows(f->ops->ctx, f->arena[pc->arena] + pc->dst + i * w, base + at,
                             (size_t)w, (size_t)pc->pitch, (size_t)n, pinned, err);
}

/* Bytes [from, from + len) of piece pc's span in the file, at base + at: a contiguous piece's
 * bytes from `from`; of a piece with a pitch, the parts of its rows in that range (row i: its
 * bytes [i * pitch, i * pitch + width) go to i * width): whole rows together, cut ones alone. */
static int copy_range(filler *f, const kl_plan_piece *pc, uint64_t from, const uint8_t *base,
                      uint64_t at, uint64_t len, int pinned, kl_err *err)
{
    if (!pc->pitch)
        return copy_part(f, pc, from, base, at, len, pinned, err);
    const uint64_t P = pc->pitch, w = pc->width, rows = pc->bytes / w, end = from + len;
    int rc = 0;
    for (uint64_t i = from / P; !rc && i < rows && i * P < end;) {
        const uint64_t r0 = i * P, lo = r0 > from ? r0 : from, hi = r0 + w < end ? r0 + w : end;
        uint64_t whole = lo == r0 && end >= r0 + w ? (end - r0 - w) / P + 1 : 0;
        whole = whole < rows - i ? whole : rows - i;
        if (whole > 1) {
            rc = copy_rows(f, pc, i, whole, base, at + (r0 - from), pinned, err);
            i += whole;
            continue;
        }
        if (hi > lo)
            rc = copy_part(f, pc, i * w + (lo - r0), base, at + (lo - from), hi - lo, pinned,
                           err);
        i++;
    }
    return rc;
}

/* Waits for window slot's copies, then unpins and unmaps it (nothing when empty). */
static int release(filler *f, unsigned slot, kl_err *err)
{
    window *w = &f->win[slot];
    if (!w->map)
        return 0;
    int rc = f->ops->wait ? f->ops->wait(f->ops->ctx, slot, err) : 0;
    if (w->pinned && f->ops->unpin)
        f->ops->unpin(f->ops->ctx, w->map);
    munmap(w->map, w->len);
    memset(w, 0, sizeof *w);
    return rc;
}

/* Slot's previous window released, window k mapped into it and pinned if the ops accept. */
static int prep_window(filler *f, size_t k, unsigned slot, kl_err *err)
{
    int rc = release(f, slot, err);
    if (rc)
        return rc;
    const wspan *sp = &f->spans[k];
    size_t len = (size_t)(sp->we - sp->ws);
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, f->fd[sp->shard], (off_t)sp->ws);
    if (p == MAP_FAILED) {
        rc = kl_fail_sys(err, KL_E_IO, errno, "mapping %zu bytes of a checkpoint shard", len);
        kl_err_context(err, NULL, NULL, sp->ws, NULL);
        return rc;
    }
    (void)madvise(p, len, MADV_HUGEPAGE);
    f->win[slot] = (window){p, len, f->ops->pin && f->ops->pin(f->ops->ctx, p, len) == 0};
    return 0;
}

/* The piece parts of span k, whose bytes are at base (a window or a ring buffer; recorded:
 * none): the pieces wholly inside and the parts of those that run over its ends. */
static int walk_span(filler *f, size_t k, const uint8_t *base, int pinned, kl_err *err)
{
    const kl_plan_piece *pc = f->p->pieces;
    const wspan *sp = &f->spans[k];
    int rc = 0;
    for (size_t j = sp->j; !rc && j < f->p->n_file && pc[j].shard == sp->shard &&
                           pc[j].src < sp->we; j++) {
        uint64_t lo = pc[j].src > sp->ws ? pc[j].src : sp->ws;
        uint64_t end = kl_plan_piece_end(&pc[j]), hi = end < sp->we ? end : sp->we;
        if (hi > lo)
            rc = copy_range(f, &pc[j], lo - pc[j].src, base, lo - sp->ws, hi - lo, pinned,
                            err);
    }
    return rc;
}

/* RING staged on the device: every span's places recorded (span k's are [span_first[k],
 * span_first[k + 1]) of f->pl) and handed to ops->places with the longest span.  When the
 * device has no memory for them (ops->places says KL_E_NOMEM) the fill goes on unstaged (a
 * copy a piece part: span_first NULL). */
static int record_places(filler *f, kl_err *err)
{
    f->span_first = kl_malloc((f->n_spans + 1) * sizeof *f->span_first);
    if (!f->span_first)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    uint64_t most = 0;
    int rc = 0;
    f->recording = 1;
    for (size_t k = 0; !rc && k < f->n_spans; k++) {
        f->span_first[k] = f->n_pl;
        rc = walk_span(f, k, NULL, 1, err);
        most = f->spans[k].we - f->spans[k].ws > most ? f->spans[k].we - f->spans[k].ws : most;
    }
    f->recording = 0;
    f->span_first[f->n_spans] = f->n_pl;
    if (rc)
        return rc;
    kl_err e;
    kl_err_clear(&e);
    rc = f->ops->places(f->ops->ctx, f->pl, f->n_pl, (size_t)most, &e);
    if (rc == KL_E_NOMEM) {
        kl_free(f->span_first);
        f->span_first = NULL;
        return 0;
    }
    if (rc)
        *err = e;
    return rc;
}

/* Span k counted: a window (pinned or not) and its bytes read. */
static void count_span(filler *f, size_t k, int pinned)
{
    const wspan *sp = &f->spans[k];
    f->st.windows++;
    f->st.pinned += (uint64_t)pinned;
    f->st.read_bytes += sp->we - sp->ws;
}

/* Staged span k counted: its places' bytes and the stage. */
static void count_staged(filler *f, size_t k)
{
    for (size_t i = f->span_first[k]; i < f->span_first[k + 1]; i++)
        f->st.bytes += f->pl[i].width * f->pl[i].rows;
    f->st.staged++;
}

/* Span k's bytes at base to the device: one staged copy and its places (f->span_first), or a
 * copy per piece part; then the slot's mark. */
static int copy_span(filler *f, size_t k, const uint8_t *base, int pinned, unsigned slot,
                     kl_err *err)
{
    const wspan *sp = &f->spans[k];
    int rc;
    count_span(f, k, pinned);
    if (f->span_first) {
        const size_t a = f->span_first[k], n = f->span_first[k + 1] - a;
        rc = f->ops->stage(f->ops->ctx, base, (size_t)(sp->we - sp->ws), a, n, err);
        if (!rc)
            count_staged(f, k);
    } else {
        rc = walk_span(f, k, base, pinned, err);
    }
    if (!rc && f->ops->mark)
        rc = f->ops->mark(f->ops->ctx, slot, err);
    return rc;
}

static int copy_window(filler *f, size_t k, unsigned slot, kl_err *err)
{
    return copy_span(f, k, f->win[slot].map, f->win[slot].pinned, slot, err);
}

/* RING from_mapping: shard s mapped whole, read-only (2 MiB pages asked for: a file in the
 * page cache on large folios maps by PMDs); where the file system refuses the mapping, its
 * spans are read with pread instead. */
static void map_shard(filler *f, uint32_t s, uint64_t size)
{
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, f->fd[s], 0);
    if (m == MAP_FAILED)
        return;
    (void)madvise(m, (size_t)size, MADV_HUGEPAGE);
    f->map[s] = m;
    f->map_len[s] = size;
}

/* Opens shard s (once) and checks that pieces fit; its size in *size. */
static int open_shard(filler *f, const char *path, uint32_t s, uint64_t *size, kl_err *err)
{
    struct stat sb;
    if (f->fd[s] < 0)
        f->fd[s] = open(path, O_RDONLY | O_CLOEXEC | f->oflags);
    if (f->fd[s] < 0 && f->oflags && errno == EINVAL)   /* no O_DIRECT here: buffered */
        f->fd[s] = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd[s] < 0 || fstat(f->fd[s], &sb) != 0) {
        int rc = kl_fail_sys(err, KL_E_IO, errno, "opening a checkpoint shard");
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
        return rc;
    }
    *size = (uint64_t)sb.st_size;
    if (f->map && !f->map[s] && *size)
        map_shard(f, s, *size);
    return 0;
}

/* The end of a span from ws at most we (below the shard's size): the last piece byte it
 * covers, rounded up to RING_ALIGN, at most we. */
static uint64_t span_end(const kl_plan_piece *pc, size_t n, size_t j, uint64_t we)
{
    uint64_t end = 0;
    for (size_t i = j; i < n && pc[i].shard == pc[j].shard && pc[i].src < we; i++)
        end = kl_plan_piece_end(&pc[i]) > end ? kl_plan_piece_end(&pc[i]) : end;
    end = (end + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
    return end < we ? end : we;
}

/* The windows of every shard in file order: [ws, we) with ws aligned to align (the window
 * size when mapped), each starting at the first piece byte not yet covered, at most wbytes
 * long and ending where its last piece does. */
static int walk_windows(filler *f, const char *const *paths, uint64_t align, kl_err *err)
{
    const kl_plan_piece *pc = f->p->pieces;
    size_t n = f->p->n_file, cap = 16;
    f->spans = kl_malloc(cap * sizeof *f->spans);
    if (!f->spans)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    uint64_t size = 0, pos = 0;
    uint32_t cur = KL_PLAN_HOST;   /* the shard open */
    for (size_t j = 0; j < n;) {
        int rc = 0;
        if (pc[j].shard != cur) {
            cur = pc[j].shard;
            pos = 0;
            if ((rc = open_shard(f, paths[cur], cur, &size, err)))
                return rc;
        }
        if (!pc[j].bytes) {
            j++;
            continue;
        }
        if (kl_plan_piece_end(&pc[j]) > size) {
            rc = kl_fail(err, KL_E_IO, "the file is shorter than its header says");
            kl_err_context(err, paths[pc[j].shard], NULL, pc[j].src, NULL);
            return rc;
        }
        uint64_t at = pos > pc[j].src ? pos : pc[j].src, ws = at / align * align;
        uint64_t we = span_end(pc, n, j, ws + f->wbytes < size ? ws + f->wbytes : size);
        if (f->n_spans == cap) {
            wspan *ns = kl_realloc(f->spans, 2 * cap * sizeof *ns);
            if (!ns)
                return kl_fail(err, KL_E_NOMEM, "out of memory");
            f->spans = ns;
            cap *= 2;
        }
        f->spans[f->n_spans++] = (wspan){pc[j].shard, ws, we, j};
        while (j < n && pc[j].shard == f->spans[f->n_spans - 1].shard &&
               kl_plan_piece_end(&pc[j]) <= we)
            j++;
        pos = we;
    }
    return 0;
}

/* Serial: each window prepared, then copied, by the calling thread. */
static int fill_serial(filler *f, kl_err *err)
{
    int rc = 0;
    for (size_t k = 0; !rc && k < f->n_spans; k++) {
        unsigned slot = (unsigned)(k % f->n_win);
        rc = prep_window(f, k, slot, err);
        if (!rc)
            rc = copy_window(f, k, slot, err);
    }
    return rc;
}

/* Whether slot may take window k: its previous window (k - n_win) copied and marked. */
static int slot_free(const filler *f, size_t k, unsigned slot)
{
    const slot_state *s = &f->slot[slot];
    return k < f->n_win ? s->win < 0 : s->win == (long)(k - f->n_win) && !s->ready;
}

/* A prep thread: takes windows in order, releases the slot's previous one (waiting for its
 * copies) and maps and pins the new one, ahead of the copying thread. */
static void *prep_main(void *arg)
{
    filler *f = arg;
    kl_err e;
    kl_err_clear(&e);
    pthread_mutex_lock(&f->mu);
    while (!f->stop && f->next < f->n_spans) {
        size_t k = f->next++;
        unsigned slot = (unsigned)(k % f->n_win);
        while (!f->stop && !slot_free(f, k, slot))
            pthread_cond_wait(&f->cv, &f->mu);
        if (f->stop)
            break;
        pthread_mutex_unlock(&f->mu);
        int rc = prep_window(f, k, slot, &e);
        pthread_mutex_lock(&f->mu);
        if (rc && !f->stop) {
            f->stop = 1;
            f->prep_rc = rc;
            f->prep_err = e;
        }
        f->slot[slot] = (slot_state){(long)k, !rc};
        pthread_cond_broadcast(&f->cv);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

/* The copying side with prep threads: window k's copies once its slot holds it. */
static int copy_in_order(filler *f, kl_err *err)
{
    int rc = 0;
    for (size_t k = 0; !rc && k < f->n_spans; k++) {
        unsigned slot = (unsigned)(k % f->n_win);
        pthread_mutex_lock(&f->mu);
        while (!f->stop && !(f->slot[slot].win == (long)k && f->slot[slot].ready))
            pthread_cond_wait(&f->cv, &f->mu);
        int stopped = f->stop;
        pthread_mutex_unlock(&f->mu);
        if (stopped)
            break;
        rc = copy_window(f, k, slot, err);
        pthread_mutex_lock(&f->mu);
        f->slot[slot].ready = 0;
        f->stop |= rc != 0;
        pthread_cond_broadcast(&f->cv);
        pthread_mutex_unlock(&f->mu);
    }
    return rc;
}

/* threads threads running body while the calling thread runs copier; then everyone stopped
 * and joined, the first error (the copier's, else a thread's in f->prep_err) returned. */
static int with_threads(filler *f, unsigned threads, void *(*body)(void *),
                        int (*copier)(filler *, kl_err *), kl_err *err)
{
    pthread_t th[KL_FILL_MAX_SLOTS];
    unsigned started = 0;
    int rc = 0;
    if (pthread_mutex_init(&f->mu, NULL))
        return kl_fail(err, KL_E_NOMEM, "cannot create a mutex");
    if (pthread_cond_init(&f->cv, NULL)) {
        pthread_mutex_destroy(&f->mu);
        return kl_fail(err, KL_E_NOMEM, "cannot create a condition variable");
    }
    kl_err_clear(&f->prep_err);
    for (; started < threads; started++)
        if (pthread_create(&th[started], NULL, body, f))
            break;
    if (!started)
        rc = kl_fail(err, KL_E_NOMEM, "cannot start a load thread");
    if (!rc)
        rc = copier(f, err);
    pthread_mutex_lock(&f->mu);
    f->stop = 1;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    if (!rc && f->prep_rc) {
        *err = f->prep_err;
        rc = f->prep_rc;
    }
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    return rc;
}

static int fill_threaded(filler *f, unsigned threads, kl_err *err)
{
    for (unsigned i = 0; i < KL_FILL_MAX_WINDOWS; i++)
        f->slot[i] = (slot_state){-1, 0};
    return with_threads(f, threads, prep_main, copy_in_order, err);
}

/* The shards' descriptors (none open yet) and the spans of every shard (aligned to align). */
static int spans_begin(filler *f, const char *const *paths, uint64_t align, kl_err *err)
{
    uint32_t n_fd = 0;
    for (size_t i = 0; i < f->p->n_file; i++)
        n_fd = f->p->pieces[i].shard + 1 > n_fd ? f->p->pieces[i].shard + 1 : n_fd;
    f->paths = paths;
    f->fd = kl_malloc(n_fd * sizeof *f->fd);
    int rc = f->fd ? 0 : kl_fail(err, KL_E_NOMEM, "out of memory");
    for (uint32_t i = 0; !rc && i < n_fd; i++)
        f->fd[i] = -1;
    if (!rc && f->from_mapping &&
        (!(f->map = kl_calloc(n_fd, sizeof *f->map)) ||
         !(f->map_len = kl_calloc(n_fd, sizeof *f->map_len))))
        rc = kl_fail(err, KL_E_NOMEM, "out of memory");
    f->n_fd = rc ? 0 : n_fd;
    return rc ? rc : walk_windows(f, paths, align, err);
}

static void spans_end(filler *f)
{
    for (uint32_t i = 0; i < f->n_fd; i++) {
        if (f->fd[i] >= 0)
            close(f->fd[i]);
        if (f->map && f->map[i])
            munmap(f->map[i], (size_t)f->map_len[i]);
    }
    kl_free(f->map);
    kl_free(f->map_len);
    f->map = NULL;
    f->map_len = NULL;
    kl_free(f->fd);
    kl_free(f->spans);
}

static int fill_mapped(filler *f, const char *const *paths, unsigned threads, kl_err *err)
{
    int rc = spans_begin(f, paths, f->wbytes, err);
    if (!rc)
        rc = threads ? fill_threaded(f, threads, err) : fill_serial(f, err);
    for (unsigned s = 0; s < f->n_win; s++) {
        kl_err ignored;
        int r = release(f, s, rc ? &ignored : err);
        rc = rc ? rc : r;
    }
    spans_end(f);
    return rc;
}

/* RING from_mapping: span sp copied out of its shard's mapping, whose page-table entries for
 * it are then dropped (host RSS bounded by the spans in flight; the pages stay cached). */
static void copy_span_mapped(filler *f, const wspan *sp, uint8_t *mem)
{
    const uint8_t *src = f->map[sp->shard] + sp->ws;   /* ws: a multiple of RING_ALIGN */
    size_t len = (size_t)(sp->we - sp->ws);
    if (f->cached)
        memcpy(mem, src, len);
    else
        kl_copy_streaming(mem, src, len);
    (void)madvise((void *)src, (len + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN, MADV_DONTNEED);
}

/* RING: span k read into mem (its length rounded up to RING_ALIGN: O_DIRECT's reads). */
static int read_span(filler *f, size_t k, uint8_t *mem, kl_err *err)
{
    const wspan *sp = &f->spans[k];
    if (f->map && f->map[sp->shard]) {
        copy_span_mapped(f, sp, mem);
        return 0;
    }
    size_t want = (size_t)(sp->we - sp->ws), got = 0;
    size_t len = (want + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
    while (got < want) {
        ssize_t n = pread(f->fd[sp->shard], mem + got, len - got, (off_t)(sp->ws + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int rc = n < 0 ? kl_fail_sys(err, KL_E_IO, errno, "reading a checkpoint shard")
                           : kl_fail(err, KL_E_IO, "the file is shorter than its header says");
            kl_err_context(err, f->paths[sp->shard], NULL, sp->ws + got, NULL);
            return rc;
        }
        got += (size_t)n;
    }
    return 0;
}

/* The ring buffer in state st (RB_FILLED: the one with the earliest span), n_rb when none. */
static unsigned ring_find(const filler *f, int st)
{
    unsigned best = f->n_rb;
    for (unsigned b = 0; b < f->n_rb; b++)
        if (f->rb[b].state == st && (best == f->n_rb || f->rb[b].span < f->rb[best].span))
            best = b;
    return best;
}

/* A load thread's span done (f->mu held): its seconds waiting for a buffer's copies and
 * reading counted, its error (rc) the fill's if it is the first, everyone woken. */
static void span_done(filler *f, double wait_s, double read_s, int rc, const kl_err *e)
{
    f->st.wait_s += wait_s;
    f->st.read_s += read_s;
    if (rc && !f->stop) {
        f->prep_rc = rc;
        f->prep_err = *e;
    }
    f->stop |= rc != 0;
    pthread_cond_broadcast(&f->cv);
}

/* A load thread: takes the next span and a free buffer, waits for the buffer's copies, reads
 * the span into it. */
static void *ring_main(void *arg)
{
    filler *f = arg;
    kl_err e;
    kl_err_clear(&e);
    pthread_mutex_lock(&f->mu);
    for (;;) {
        unsigned b = f->n_rb;
        while (!f->stop && f->next < f->n_spans && (b = ring_find(f, RB_FREE)) == f->n_rb)
            pthread_cond_wait(&f->cv, &f->mu);
        if (f->stop || f->next >= f->n_spans)
            break;
        ring_buf *r = &f->rb[b];
        size_t k = f->next++;
        int marked = r->marked;
        r->state = RB_READING;
        pthread_mutex_unlock(&f->mu);
        double t0 = kl_now_s();
        int rc = marked && f->ops->wait ? f->ops->wait(f->ops->ctx, b, &e) : 0;
        int waited = !rc;
        double t1 = kl_now_s();
        if (!rc)
            rc = read_span(f, k, r->mem, &e);
        double t2 = kl_now_s();
        pthread_mutex_lock(&f->mu);
        r->marked &= !waited;
        r->state = rc ? RB_FREE : RB_FILLED;
        r->span = k;
        span_done(f, t1 - t0, t2 - t1, rc, &e);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

/* A ring buffer from ops->host_alloc (pinned) or plain aligned memory. */
static int ring_alloc(filler *f, void **m, kl_err *err)
{
    *m = NULL;
    if (f->rb_pinned)
        return f->ops->host_alloc(f->ops->ctx, m, (size_t)f->wbytes, err);
    if (!(*m = kl_aligned_alloc(RING_ALIGN, (size_t)f->wbytes)))
        return kl_fail(err, KL_E_NOMEM, "out of memory: a load buffer of %llu bytes",
                       (unsigned long long)f->wbytes);
    return 0;
}

/* One more buffer of the ring (ring_alloc) handed to the load threads.  When one is allocated
 * already, a refusal only ends the ring there. */
static int ring_add(filler *f, kl_err *err)
{
    kl_err e;
    kl_err_clear(&e);
    void *m = NULL;
    int rc = ring_alloc(f, &m, &e);
    if (rc && !f->n_alloc) {
        *err = e;
        return rc;
    }
    pthread_mutex_lock(&f->mu);
    if (rc)
        f->n_rb = f->n_alloc;   /* fewer buffers than asked */
    else
        f->rb[f->n_alloc++] = (ring_buf){m, 0, RB_FREE, 0};
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    return 0;
}

/* The copying side of the ring: allocates the buffers one at a time while the load threads
 * read into the first ones, and issues every filled buffer's copies and mark as they come. */
static int ring_copy_all(filler *f, kl_err *err)
{
    int rc = 0;
    for (size_t done = 0; !rc && done < f->n_spans;) {
        int more = f->n_alloc < f->n_rb;   /* buffers to allocate: don't wait for a fill */
        if (more && (rc = ring_add(f, err)))
            break;
        unsigned b = f->n_rb;
        double t0 = kl_now_s();
        pthread_mutex_lock(&f->mu);
        while (!f->stop && (b = ring_find(f, RB_FILLED)) == f->n_rb && !more)
            pthread_cond_wait(&f->cv, &f->mu);
        int stopped = f->stop;
        pthread_mutex_unlock(&f->mu);
        if (stopped)
            break;
        if (b == f->n_rb)
            continue;
        double t1 = kl_now_s();
        rc = copy_span(f, f->rb[b].span, f->rb[b].mem, f->rb_pinned, b, err);
        double t2 = kl_now_s();
        pthread_mutex_lock(&f->mu);
        f->st.idle_s += t1 - t0;
        f->st.issue_s += t2 - t1;
        f->rb[b].state = RB_FREE;
        f->rb[b].marked = !rc && f->ops->mark;
        f->stop |= rc != 0;
        pthread_cond_broadcast(&f->cv);
        pthread_mutex_unlock(&f->mu);
        done++;
    }
    return rc;
}

/* Every buffer's copies waited for, the buffers freed. */
static int ring_free(filler *f, int rc, kl_err *err)
{
    for (unsigned b = 0; f->rb && b < f->n_alloc; b++) {
        kl_err ignored;
        if (f->rb[b].marked && f->ops->wait) {
            int r = f->ops->wait(f->ops->ctx, b, rc ? &ignored : err);
            rc = rc ? rc : r;
        }
        if (f->rb_given)
            continue;
        if (f->rb[b].mem && f->rb_pinned && f->ops->host_free)
            f->ops->host_free(f->ops->ctx, f->rb[b].mem);
        else if (f->rb[b].mem && !f->rb_pinned)
            kl_aligned_free(f->rb[b].mem);
    }
    kl_free(f->rb);
    f->rb = NULL;
    return rc;
}

/* Lanes: a load thread with a lane of its own takes the next span, waits for the older of its
 * two buffers' copy, reads the span into it and stages it from there at once. */
static void *lane_main(void *arg)
{
    filler *f = arg;
    kl_err e;
    kl_err_clear(&e);
    pthread_mutex_lock(&f->mu);
    const unsigned lane = f->lane_next++;
    for (unsigned i = 0; !f->stop && f->next < f->n_spans; i++) {
        const size_t k = f->next++;
        const unsigned b = 2 * lane + i % 2;
        ring_buf *r = &f->rb[b];   /* this thread's alone */
        const wspan *sp = &f->spans[k];
        const size_t a = f->span_first[k], n = f->span_first[k + 1] - a;
        pthread_mutex_unlock(&f->mu);
        double t0 = kl_now_s();
        int rc = r->marked ? f->ops->wait(f->ops->ctx, b, &e) : 0;
        r->marked &= rc != 0;
        double t1 = kl_now_s();
        if (!rc)
            rc = read_span(f, k, r->mem, &e);
        double t2 = kl_now_s();
        if (!rc) {
            rc = f->ops->stage_on(f->ops->ctx, lane, b, r->mem, (size_t)(sp->we - sp->ws), a,
                                  n, &e);
            r->marked = 1;   /* its copy may be under way even when the mark failed */
        }
        double t3 = kl_now_s();
        pthread_mutex_lock(&f->mu);
        f->st.issue_s += t3 - t2;
        if (!rc) {
            count_span(f, k, 1);
            count_staged(f, k);
        }
        span_done(f, t1 - t0, t2 - t1, rc, &e);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

/* Lanes: the calling thread waits until every span is staged or a load thread stops. */
static int lanes_wait(filler *f, kl_err *err)
{
    pthread_mutex_lock(&f->mu);
    while (!f->stop && f->st.staged < f->n_spans)
        pthread_cond_wait(&f->cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
    return 0;
}

/* Lanes for a staged ring when asked and the ops have them: two buffers a thread (threads
 * lowered to fit the buffers there, every one allocated now), then ops->lanes.  f->lanes
 * stays 1 when the fill runs on lanes; no room for them (KL_E_NOMEM) is not an error. */
static int lanes_begin(filler *f, unsigned *threads, kl_err *err)
{
    f->lanes = f->lanes && f->span_first && f->ops->lanes && f->ops->stage_on &&
               f->ops->wait && f->n_rb >= 2;
    if (!f->lanes)
        return 0;
    unsigned t = *threads < f->n_rb / 2 ? *threads : f->n_rb / 2;
    kl_err e;
    kl_err_clear(&e);
    int rc = 0;
    while (!rc && f->n_alloc < 2 * t) {
        void *m = NULL;
        if (!(rc = ring_alloc(f, &m, &e)))
            f->rb[f->n_alloc++] = (ring_buf){m, 0, RB_FREE, 0};
    }
    t = t < f->n_alloc / 2 ? t : f->n_alloc / 2;
    rc = t ? f->ops->lanes(f->ops->ctx, t, &e) : KL_E_NOMEM;
    f->lanes = !rc;
    if (!rc)
        *threads = t;
    if (rc == KL_E_NOMEM)   /* the plain ring, with the buffers there */
        return 0;
    if (rc)
        *err = e;
    return rc;
}

static int fill_ring(filler *f, const char *const *paths, unsigned threads, kl_err *err)
{
    int rc = spans_begin(f, paths, RING_ALIGN, err);
    f->rb = rc ? NULL : kl_calloc(f->n_rb, sizeof *f->rb);
    f->rb_pinned = f->ops->host_alloc != NULL || f->rb_given;
    if (!rc && !f->rb)
        rc = kl_fail(err, KL_E_NOMEM, "out of memory");
    for (unsigned b = 0; !rc && f->rb_given && b < f->n_rb; b++)   /* all there at once */
        f->rb[f->n_alloc++] = (ring_buf){f->rb_given[b], 0, RB_FREE, 0};
    if (!rc && f->rb_pinned && f->ops->places && f->ops->stage)
        rc = record_places(f, err);
    if (!rc)
        rc = lanes_begin(f, &threads, err);
    if (!rc)
        rc = f->lanes ? with_threads(f, threads, lane_main, lanes_wait, err)
                      : with_threads(f, threads, ring_main, ring_copy_all, err);
    f->st.lanes = f->lanes ? f->lane_next : 0;   /* the threads that started */
    rc = ring_free(f, rc, err);
    spans_end(f);
    kl_free(f->pl);
    kl_free(f->span_first);
    return rc;
}

static int read_cb(void *ctx, size_t ext_idx, uint64_t ext_off, const uint8_t *data, size_t len)
{
    filler *f = ctx;
    f->cb_rc = copy_range(f, &f->p->pieces[ext_idx], ext_off, data, 0, len, 0, f->cb_err);
    return f->cb_rc;
}

static int fill_read(filler *f, const char *const *paths, kl_direct_mode direct, kl_err *err)
{
    kl_reader_opts ro = {.direct = direct};
    kl_reader *rd = NULL;
    kl_extent *ext = kl_calloc(f->p->n_file + 1, sizeof *ext);
    uint32_t n_files = 0;
    int rc = ext ? kl_reader_create(&rd, &ro, err) : kl_fail(err, KL_E_NOMEM, "out of memory");
    for (size_t i = 0; !rc && i < f->p->n_file; i++) {
        const kl_plan_piece *x = &f->p->pieces[i];
        for (; !rc && n_files <= x->shard; n_files++) {   /* reader file k is shard k */
            int idx = kl_reader_add_file(rd, paths[n_files], err);
            rc = idx < 0 ? idx : 0;
        }
        ext[i] = (kl_extent){x->shard, x->src, kl_plan_piece_end(x) - x->src};
        f->st.read_bytes += ext[i].len;
    }
    kl_err cb_err;
    kl_err_clear(&cb_err);
    f->cb_err = &cb_err;
    if (!rc)
        rc = kl_reader_run_gathered(rd, ext, f->p->n_file, KL_GATHER_GAP, read_cb, f, err);
    if (rc && f->cb_rc) {   /* the copy failed: its error, not the reader's "cancelled" */
        *err = cb_err;
        rc = f->cb_rc;
    }
    kl_reader_destroy(rd);
    kl_free(ext);
    return rc;
}

/* RING with the caller's buffers: their count and size given, each whole reads' worth. */
static int check_given(const kl_fill_opts *o, kl_err *err)
{
    if (!o->windows || o->window_bytes % RING_ALIGN)
        return kl_fail(err, KL_E_USAGE, "load buffers given without their count, or of %zu "
                       "bytes (not a multiple of %u)", o->window_bytes, RING_ALIGN);
    for (unsigned b = 0; b < o->windows; b++)
        if (!o->buffers[b] || (uintptr_t)o->buffers[b] % RING_ALIGN)
            return kl_fail(err, KL_E_USAGE, "load buffer %u is not %u-byte aligned", b,
                           RING_ALIGN);
    return 0;
}

int kl_gpu_fill(const kl_gpu_plan *p, const char *const *shard_paths, uint8_t *const *arena,
                const kl_fill_ops *ops, const kl_fill_opts *opts, kl_fill_stats *stats,
                kl_err *err)
{
    kl_fill_opts o = opts ? *opts : (kl_fill_opts){0};
    filler f = {.p = p, .arena = arena, .ops = ops};
    int ring = o.mode == KL_FILL_RING;
    long page = sysconf(_SC_PAGESIZE);
    uint64_t pg = ring ? RING_ALIGN : page > 0 ? (uint64_t)page : 4096;
    f.wbytes = o.window_bytes ? o.window_bytes : (size_t)(ring ? 16 : 256) << 20;
    f.wbytes = (f.wbytes + pg - 1) / pg * pg;
    unsigned threads = ring && !o.threads ? 8 : o.threads;
    unsigned most = ring ? KL_FILL_MAX_SLOTS : KL_FILL_MAX_WINDOWS;
    f.n_win = o.windows ? o.windows : ring ? threads + 4 : 3;
    f.n_win = ring && !o.windows && f.n_win > most ? most : f.n_win;
    f.n_rb = ring ? f.n_win : 0;
    f.oflags = ring && o.direct == KL_DIRECT_ON ? O_DIRECT : 0;
    f.from_mapping = ring && o.from_mapping && !f.oflags;
    f.cached = o.cached_copy;
    f.lanes = ring && o.lanes;
    if (f.n_win > most || threads > most)
        return kl_fail(err, KL_E_USAGE, "at most %u %s and load threads", most,
                       ring ? "load buffers" : "windows in flight");
    int rc = ring && o.buffers ? check_given(&o, err) : 0;
    if (rc)
        return rc;
    f.rb_given = ring ? o.buffers : NULL;
    for (size_t i = p->n_file; !rc && i < p->n_pieces; i++)
        rc = copy_part(&f, &p->pieces[i], 0, p->pieces[i].host, 0, p->pieces[i].bytes, 0, err);
    if (!rc && p->n_file)
        rc = o.mode == KL_FILL_READ ? fill_read(&f, shard_paths, o.direct, err)
             : ring                 ? fill_ring(&f, shard_paths, threads, err)
                                    : fill_mapped(&f, shard_paths, o.threads, err);
    if (stats)
        *stats = f.st;
    return rc;
}
