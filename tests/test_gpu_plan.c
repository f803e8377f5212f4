/*
 * tests/test_gpu_plan.c — engine/gpu_plan.h on the CPU: the device layout of a model's weights
 * and the fill, with host memory as the "device" and memcpy as the copy; and the vectors_only
 * mode of kl_model_open (engine/model.h) the fill reads from.
 *
 * Checkpoints: tiny BF16 (several 256 KiB shards), tiny MXFP4 and small MXFP4.  Checked: the
 * plan is the same whether the model read its matrices or not; every block starts at a
 * multiple of 256 bytes; no two pieces overlap and each lies inside its arena; after a fill
 * every matrix (fused members, experts per role and expert, packed codes and scales, embed,
 * lm_head) holds exactly the tensor's bytes and every vector the host model's fp32 copy, for
 * mapped windows (pinned and not, windows smaller than a tensor so pieces are split, one or
 * several in flight, serial and with 1-3 load threads), the ring of buffers (1, 3 and 8
 * load threads, 4 KiB to 64 MiB buffers, fewer buffers than threads, pinned and plain,
 * buffered and O_DIRECT), the staged reader (buffered and O_DIRECT where allowed) and a host
 * model (KL_GPU_LOAD=host: host pieces only).  Pinned copies complete only at a wait that
 * follows their mark (as on a stream), so a window or buffer reused, unpinned or freed too
 * early gives wrong bytes or fails; a pinned window is only copied from while pinned, none is
 * left pinned or marked.  Errors: a copy failing mid-fill returns its error with every window
 * and buffer released (mapped, read, ring); ring: a wait failing on a load thread, pinned
 * memory refused (at once: its error; after one buffer: the fill goes on), a shard truncated
 * (KL_E_IO naming it); a shard gone is KL_E_IO.  vectors_only: matrices unread (NULL payloads, no backend, kl_state_init
 * refused), vectors equal to the full model's, weight_bytes equal.
 */
#include "common/err.h"
#include "common/mem.h"
#include "engine/forward.h"
#include "engine/gpu_plan.h"
#include "engine/tp_model.h"
#include "loader/tp_split.h"
#include "engine/model.h"
#include "synth/synth.h"
#include "tests/testutil.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static char g_root[512], g_dir[3][600];
static const char *const g_name[3] = {"tiny-bf16", "tiny-mxfp4", "small-mxfp4"};

static void synth(const char *dir, const char *preset, kl_synth_format fmt)
{
    kl_err err;
    kl_err_clear(&err);
    kl_synth_opts o = {.out_dir = dir, .preset = preset, .format = fmt, .seed = 7,
                       .buffered = 1, .threads = 2};
    int rc = kl_synth_write(&o, &err);
    ck_assert_msg(rc == 0, "synth %s: %s", dir, t_fmt_err(&err));
}

static void setup(void)
{
    t_mkdtemp(g_root, sizeof g_root);
    for (int i = 0; i < 3; i++)
        snprintf(g_dir[i], sizeof g_dir[i], "%s/%s", g_root, g_name[i]);
    synth(g_dir[0], "tiny", KL_SYNTH_BF16);
    synth(g_dir[1], "tiny", KL_SYNTH_MXFP4);
    synth(g_dir[2], "small", KL_SYNTH_MXFP4);
}

static void teardown(void)
{
    if (g_root[0])
        t_rmrf(g_root);
}

static void build(kl_gpu_plan *p, const kl_model *m)
{
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_gpu_plan_build(p, m, &err);
    ck_assert_msg(rc == 0, "plan: %s", t_fmt_err(&err));
}

/* ------------------------------------------------------------------------------------------ */
/* The CPU "device"                                                                           */

/* A pinned copy as a stream holds it: done only when a wait reaches a mark after it. */
typedef struct cpu_copy {
    void       *dst;
    const void *src;
    size_t      bytes;
} cpu_copy;

#define CPU_QUEUE (1u << 20)
static cpu_copy g_queue[CPU_QUEUE];     /* the one cpu_dev in use at a time */

typedef struct cpu_dev {
    pthread_mutex_t mu;                 /* pin, unpin and wait may come from load threads */
    const uint8_t *pinned[KL_FILL_MAX_WINDOWS];
    size_t         pinned_len[KL_FILL_MAX_WINDOWS];
    const uint8_t *buf[KL_FILL_MAX_SLOTS];          /* from host_alloc */
    size_t         buf_len[KL_FILL_MAX_SLOTS];
    int            marked[KL_FILL_MAX_SLOTS];
    size_t         mark_at[KL_FILL_MAX_SLOTS];     /* queue length at the mark */
    size_t         n_queue, done;       /* pinned copies issued (g_queue), [done, n) pending */
    int            pin_ok;
    long           copies, fail_at;     /* fail_at > 0: that copy fails */
    long           waits_total, fail_wait;   /* fail_wait > 0: that wait fails */
    long           pins, unpins, waits, allocs, frees;
    long           alloc_max;           /* > 0: host_alloc refuses beyond that many */
    kl_gpu_place  *places;              /* staged (dev_places): a copy of the fill's */
    size_t         n_places, most;
    long           stages;
    unsigned       n_lanes;             /* dev_lanes: lanes made */
    long           stage_ons, fail_stage_on;   /* fail_stage_on > 0: that stage_on fails
                                                  after queueing its span's copies */
    pthread_t      lane_thread[KL_FILL_MAX_SLOTS];
    int            lane_used[KL_FILL_MAX_SLOTS];
    unsigned       slot_lane[KL_FILL_MAX_SLOTS];   /* lane + 1 a slot was staged on, 0: none */
} cpu_dev;

static int in_range(const uint8_t *const *base, const size_t *len, unsigned n, const uint8_t *p,
                    size_t bytes)
{
    for (unsigned i = 0; i < n; i++)
        if (base[i] && p >= base[i] && p + bytes <= base[i] + len[i])
            return 1;
    return 0;
}

/* A region [p, p + bytes) put in the first empty entry of base[n] / taken out of it: its
 * index, n when there is no room / it is not there. */
static unsigned region_add(const uint8_t **base, size_t *len, unsigned n, const void *p,
                           size_t bytes)
{
    unsigned i = 0;
    while (i < n && base[i])
        i++;
    if (i < n) {
        base[i] = p;
        len[i] = bytes;
    }
    return i;
}

/* region_add under d's lock, counting in *count when there was room. */
static unsigned track(cpu_dev *d, const uint8_t **base, size_t *len, unsigned n, const void *p,
                      size_t bytes, long *count)
{
    pthread_mutex_lock(&d->mu);
    unsigned i = region_add(base, len, n, p, bytes);
    *count += i < n;
    pthread_mutex_unlock(&d->mu);
    return i;
}

static unsigned region_del(const uint8_t **base, unsigned n, const void *p)
{
    unsigned i = 0;
    while (i < n && base[i] != p)
        i++;
    if (i < n)
        base[i] = NULL;
    return i;
}

static int in_pinned(const cpu_dev *d, const uint8_t *p, size_t n)
{
    return in_range(d->pinned, d->pinned_len, KL_FILL_MAX_WINDOWS, p, n) ||
           in_range(d->buf, d->buf_len, KL_FILL_MAX_SLOTS, p, n);
}

/* The pending copies up to queue position to, in issue order (d->mu held); an empty queue
 * starts again at 0 (every mark then at 0: done). */
static void run_queue(cpu_dev *d, size_t to)
{
    for (; d->done < to; d->done++)
        memcpy(g_queue[d->done].dst, g_queue[d->done].src, g_queue[d->done].bytes);
    if (d->done < d->n_queue)
        return;
    d->done = d->n_queue = 0;
    for (unsigned i = 0; i < KL_FILL_MAX_SLOTS; i++)
        d->mark_at[i] = 0;
}

/* Pinned copies complete at a later wait (as on a stream: a source reused or released before
 * that wait gives wrong bytes); plain ones at once. */
static int dev_copy(void *ctx, void *dst, const void *src, size_t bytes, int pinned, kl_err *err)
{
    cpu_dev *d = ctx;
    pthread_mutex_lock(&d->mu);
    int fail = ++d->copies == d->fail_at, ok = !pinned || in_pinned(d, src, bytes);
    int room = d->n_queue < CPU_QUEUE;
    if (!fail && ok && pinned && room)
        g_queue[d->n_queue++] = (cpu_copy){dst, src, bytes};
    pthread_mutex_unlock(&d->mu);
    if (fail)
        return kl_fail(err, KL_E_GPU, "injected copy failure");
    ck_assert_msg(ok, "a pinned copy outside a pinned window");
    ck_assert_msg(room, "more pinned copies than the test queue holds");
    if (!pinned)
        memcpy(dst, src, bytes);
    return 0;
}

static int dev_host_alloc(void *ctx, void **p, size_t bytes, kl_err *err)
{
    cpu_dev *d = ctx;
    if (d->alloc_max && d->allocs >= d->alloc_max)
        return kl_fail(err, KL_E_NOMEM, "injected: no pinned memory left");
    *p = kl_aligned_alloc(4096, bytes);
    ck_assert_ptr_nonnull(*p);
    unsigned i = track(d, d->buf, d->buf_len, KL_FILL_MAX_SLOTS, *p, bytes, &d->allocs);
    ck_assert_msg(i < KL_FILL_MAX_SLOTS, "more load buffers than slots");
    return 0;
}

static void dev_host_free(void *ctx, void *p)
{
    cpu_dev *d = ctx;
    pthread_mutex_lock(&d->mu);
    unsigned i = region_del(d->buf, KL_FILL_MAX_SLOTS, p);   /* its length stays */
    const uint8_t *at = p;
    int pending = 0;
    for (size_t q = d->done; i < KL_FILL_MAX_SLOTS && q < d->n_queue; q++)
        pending |= in_range(&at, &d->buf_len[i], 1, g_queue[q].src, 1);
    d->frees += i < KL_FILL_MAX_SLOTS;
    pthread_mutex_unlock(&d->mu);
    ck_assert_msg(i < KL_FILL_MAX_SLOTS, "free of a load buffer not allocated");
    ck_assert_msg(!pending, "a load buffer freed before its copies were waited for");
    kl_aligned_free(p);
}

static int dev_pin(void *ctx, void *p, size_t bytes)
{
    cpu_dev *d = ctx;
    if (!d->pin_ok)
        return -1;
    unsigned i = track(d, d->pinned, d->pinned_len, KL_FILL_MAX_WINDOWS, p, bytes, &d->pins);
    ck_assert_msg(i < KL_FILL_MAX_WINDOWS, "more windows pinned than may be in flight");
    return 0;
}

static void dev_unpin(void *ctx, void *p)
{
    cpu_dev *d = ctx;
    pthread_mutex_lock(&d->mu);
    unsigned i = region_del(d->pinned, KL_FILL_MAX_WINDOWS, p);
    d->unpins += i < KL_FILL_MAX_WINDOWS;
    pthread_mutex_unlock(&d->mu);
    ck_assert_msg(i < KL_FILL_MAX_WINDOWS, "unpin of a window not pinned");
}

static int dev_mark(void *ctx, unsigned slot, kl_err *err)
{
    cpu_dev *d = ctx;
    ck_assert_uint_lt(slot, KL_FILL_MAX_SLOTS);
    pthread_mutex_lock(&d->mu);
    d->marked[slot] = 1;
    d->mark_at[slot] = d->n_queue;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

static int dev_wait(void *ctx, unsigned slot, kl_err *err)
{
    cpu_dev *d = ctx;
    ck_assert_uint_lt(slot, KL_FILL_MAX_SLOTS);
    pthread_mutex_lock(&d->mu);
    int fail = ++d->waits_total == d->fail_wait;
    if (!fail && d->marked[slot])
        run_queue(d, d->mark_at[slot]);
    if (!fail) {
        d->marked[slot] = 0;
        d->waits++;
    }
    pthread_mutex_unlock(&d->mu);
    return fail ? kl_fail(err, KL_E_GPU, "injected wait failure") : 0;
}

/* Rows packed together: a copy per row, each as dev_copy takes it (a 2D copy on a stream). */
static int dev_copy_rows(void *ctx, void *dst, const void *src, size_t width, size_t pitch,
                         size_t rows, int pinned, kl_err *err)
{
    ck_assert_uint_ge(pitch, width);
    ck_assert_uint_gt(rows, 1);   /* single rows and cut ones go through copy */
    int rc = 0;
    for (size_t i = 0; !rc && i < rows; i++)
        rc = dev_copy(ctx, (uint8_t *)dst + i * width, (const uint8_t *)src + i * pitch, width,
                      pinned, err);
    return rc;
}

static int g_places_refused;  /* 1: dev_places refuses as a device without room (KL_E_NOMEM) */

/* Staged spans: the places kept; called once, before any span. */
static int dev_places(void *ctx, const kl_gpu_place *all, size_t n, size_t most, kl_err *err)
{
    cpu_dev *d = ctx;
    if (g_places_refused)
        return kl_fail(err, KL_E_NOMEM, "no device memory for the staging (test)");
    ck_assert_ptr_null(d->places);
    ck_assert_int_eq(d->stages, 0);
    d->places = kl_memdup(all, n * sizeof *all);
    ck_assert_ptr_nonnull(d->places);
    d->n_places = n;
    d->most = most;
    return 0;
}

/* A staged span: each place's rows as pinned copies out of the buffer (done at the slot's
 * wait, as the device's one copy of the span would be: the buffer must stay until then). */
static int dev_stage(void *ctx, const void *src, size_t len, size_t first, size_t count,
                     kl_err *err)
{
    cpu_dev *d = ctx;
    ck_assert_ptr_nonnull(d->places);
    ck_assert_uint_le(first + count, d->n_places);
    ck_assert_uint_le(len, d->most);
    pthread_mutex_lock(&d->mu);   /* lanes stage from several threads */
    d->stages++;
    pthread_mutex_unlock(&d->mu);
    int rc = 0;
    for (size_t i = first; !rc && i < first + count; i++) {
        const kl_gpu_place *pl = &d->places[i];
        ck_assert_uint_ge(pl->rows, 1);
        ck_assert_uint_le(pl->off + (pl->rows - 1) * pl->pitch + pl->width, len);
        for (uint64_t r = 0; !rc && r < pl->rows; r++)
            rc = dev_copy(ctx, (uint8_t *)pl->dst + r * pl->width,
                          (const uint8_t *)src + pl->off + r * pl->pitch, pl->width, 1, err);
    }
    return rc;
}

static int g_lanes_refused;   /* 1: dev_lanes refuses as a device without room (KL_E_NOMEM) */

/* Lanes: n of them, after the places; each then staged from one thread only. */
static int dev_lanes(void *ctx, unsigned n, kl_err *err)
{
    cpu_dev *d = ctx;
    if (g_lanes_refused)
        return kl_fail(err, KL_E_NOMEM, "no device memory for the lanes (test)");
    ck_assert_ptr_nonnull(d->places);
    ck_assert_int_eq(d->n_lanes, 0);
    ck_assert_uint_ge(n, 1);
    ck_assert_uint_le(n, KL_FILL_MAX_SLOTS / 2);
    d->n_lanes = n;
    return 0;
}

/* A span staged on a lane: as dev_stage, then the slot's mark (its copies done at its wait;
 * marked even when a copy failed partway, as the GPU's lanes leave no copy of a failed span
 * pending); a lane always from the same thread, a slot always on the same lane. */
static int dev_stage_on(void *ctx, unsigned lane, unsigned slot, const void *src, size_t len,
                        size_t first, size_t count, kl_err *err)
{
    cpu_dev *d = ctx;
    ck_assert_uint_lt(lane, d->n_lanes);
    ck_assert_uint_lt(slot, KL_FILL_MAX_SLOTS);
    pthread_mutex_lock(&d->mu);
    pthread_t self = pthread_self();
    int same = !d->lane_used[lane] || pthread_equal(d->lane_thread[lane], self);
    d->lane_thread[lane] = self;
    d->lane_used[lane] = 1;
    int slot_ok = d->slot_lane[slot] == 0 || d->slot_lane[slot] == lane + 1;
    d->slot_lane[slot] = lane + 1;
    pthread_mutex_unlock(&d->mu);
    ck_assert_msg(same, "lane %u staged from two threads", lane);
    ck_assert_msg(slot_ok, "slot %u staged on two lanes", slot);
    pthread_mutex_lock(&d->mu);
    int fail = ++d->stage_ons == d->fail_stage_on;
    pthread_mutex_unlock(&d->mu);
    int rc = dev_stage(ctx, src, len, first, count, err);
    dev_mark(ctx, slot, NULL);
    if (!rc && fail)   /* as an event that failed to record after the copy was issued */
        rc = kl_fail(err, KL_E_GPU, "injected failure after a span's copies");
    return rc;
}

static const kl_fill_ops g_ops = {NULL, dev_copy, dev_pin, dev_unpin, dev_mark, dev_wait,
                                  dev_host_alloc, dev_host_free, dev_copy_rows, NULL, NULL,
                                  NULL, NULL};
static int g_no_copy_rows;   /* 1: the fills get no copy_rows (a copy per row) */
static int g_staged;         /* 1: ring fills staged (dev_places, dev_stage) */
static int g_lanes;          /* 1: staged fills offered lanes (dev_lanes, dev_stage_on) */

/* Arenas for p, filled with a byte no tensor is made of throughout. */
static uint8_t **alloc_arenas(const kl_gpu_plan *p)
{
    uint8_t **a = kl_calloc(p->n_arenas, sizeof *a);
    ck_assert_ptr_nonnull(a);
    for (uint32_t i = 0; i < p->n_arenas; i++) {
        a[i] = kl_malloc(p->arena_bytes[i] ? p->arena_bytes[i] : 1);
        ck_assert_ptr_nonnull(a[i]);
        memset(a[i], 0xA5, p->arena_bytes[i]);
    }
    return a;
}

static void free_arenas(const kl_gpu_plan *p, uint8_t **a)
{
    for (uint32_t i = 0; i < p->n_arenas; i++)
        kl_free(a[i]);
    kl_free(a);
}

/* ------------------------------------------------------------------------------------------ */
/* Checks                                                                                     */

/* A matrix's bytes at its place equal the host model's. */
static void check_mat(const uint8_t *base, const kl_plan_mat *pm, const kl_wmat *w, uint64_t e,
                      const char *what)
{
    ck_assert_int_eq(pm->kind, w->kind);
    ck_assert_uint_eq(pm->rows, w->rows);
    ck_assert_uint_eq(pm->cols, w->cols);
    uint64_t db = kl_plan_data_bytes(pm), sb = kl_plan_scale_bytes(pm);
    const void *src = w->kind == KL_W_MXFP4 ? (const void *)w->packed : w->data;
    ck_assert_msg(!memcmp(base + pm->data + e * db, src, db), "%s: values differ", what);
    if (sb)
        ck_assert_msg(!memcmp(base + pm->scale + e * sb, w->scale, sb), "%s: scales differ",
                      what);
}

static void check_filled(const kl_gpu_plan *p, uint8_t *const *a, const kl_model *m)
{
    char what[96];
    uint32_t G = p->n_arenas - 1;
    check_mat(a[G], &p->embed, &m->embed, 0, "embed");
    check_mat(a[G], &p->lm_head, &m->lm_head, 0, "lm_head");
    ck_assert(!memcmp(a[G] + p->final_norm, m->final_norm, m->cfg.hidden_size * sizeof(float)));
    for (uint32_t l = 0; l < G; l++) {
        const kl_plan_layer *pl = &p->layer[l];
        const kl_layer *hl = &m->layers[l];
        for (int r = 0; r < KL_ROLE_COUNT; r++) {
            snprintf(what, sizeof what, "layer %u %s", l, kl_role_name((kl_role)r));
            if (pl->vec[r] != KL_PLAN_NONE)
                ck_assert_msg(!memcmp(a[l] + pl->vec[r], hl->vec[r],
                                      hl->w[r].rows * hl->w[r].cols * sizeof(float)), "%s", what);
            else if (hl->w[r].kind != KL_W_NONE)
                check_mat(a[l], &pl->w[r], &hl->w[r], 0, what);
        }
        for (int k = 0; k < 3 && pl->n_experts; k++) {
            for (uint32_t e = 0; e < pl->n_experts; e++) {   /* the held run from expert0 */
                snprintf(what, sizeof what, "layer %u expert %u w%d", l, pl->expert0 + e, k + 1);
                check_mat(a[l], &pl->ex[k], &hl->experts[k][pl->expert0 + e], e, what);
            }
        }
    }
}

static int aligned(uint64_t off)
{
    return off % KL_PLAN_ALIGN == 0;
}

static void check_mat_aligned(const kl_plan_mat *w)
{
    ck_assert(w->kind == KL_W_NONE || aligned(w->data));
    ck_assert(kl_plan_scale_bytes(w) == 0 || aligned(w->scale));
}

/* Every block aligned; fused members one after another from the group's start. */
static void check_layout(const kl_gpu_plan *p)
{
    check_mat_aligned(&p->embed);
    ck_assert(aligned(p->final_norm));
    for (uint32_t l = 0; l + 1 < p->n_arenas; l++) {
        const kl_plan_layer *pl = &p->layer[l];
        for (int r = 0; r < KL_ROLE_COUNT; r++)
            ck_assert(pl->vec[r] == KL_PLAN_NONE || aligned(pl->vec[r]));
        for (int k = 0; k < 3; k++)
            check_mat_aligned(&pl->ex[k]);
        for (int g = 0; g < KL_FUSE_GROUPS; g++) {
            const kl_role *rr = kl_plan_fuse_roles[g];
            if (pl->fused[g].kind == KL_W_NONE) {
                for (; *rr != KL_ROLE_COUNT; rr++)
                    check_mat_aligned(&pl->w[*rr]);
                continue;
            }
            check_mat_aligned(&pl->fused[g]);
            uint64_t at = pl->fused[g].data, rows = 0;
            for (; *rr != KL_ROLE_COUNT; rr++) {
                ck_assert_uint_eq(pl->w[*rr].data, at);
                at += kl_plan_data_bytes(&pl->w[*rr]);
                rows += pl->w[*rr].rows;
            }
            ck_assert_uint_eq(rows, pl->fused[g].rows);
        }
    }
}

static int cmp_dst(const void *a, const void *b)
{
    const kl_plan_piece *x = a, *y = b;
    if (x->arena != y->arena)
        return x->arena < y->arena ? -1 : 1;
    return x->dst < y->dst ? -1 : x->dst > y->dst;
}

static void check_pieces(const kl_gpu_plan *p)
{
    kl_plan_piece *s = kl_calloc(p->n_pieces, sizeof *s);
    ck_assert_ptr_nonnull(s);
    memcpy(s, p->pieces, p->n_pieces * sizeof *s);
    qsort(s, p->n_pieces, sizeof *s, cmp_dst);
    for (size_t i = 0; i < p->n_pieces; i++) {
        ck_assert_uint_lt(s[i].arena, p->n_arenas);
        ck_assert_uint_le(s[i].dst + s[i].bytes, p->arena_bytes[s[i].arena]);
        if (i + 1 < p->n_pieces && s[i + 1].arena == s[i].arena)
            ck_assert_uint_le(s[i].dst + s[i].bytes, s[i + 1].dst);
    }
    for (size_t i = 1; i < p->n_file; i++) {   /* file order, spans apart */
        const kl_plan_piece *a = &p->pieces[i - 1];
        ck_assert(a->shard < p->pieces[i].shard ||
                  (a->shard == p->pieces[i].shard && kl_plan_piece_end(a) <= p->pieces[i].src));
    }
    kl_free(s);
}

/* Fills from m (vectors_only or not) with o, pinning when pin_ok (RING: buffers from
 * host_alloc, else plain memory; give: o->windows pinned buffers of o->window_bytes given
 * by the caller, allocated before and freed after the fill, which must not free them);
 * checks against full. */
static void fill_check(const kl_model *m, const kl_model *full, const kl_fill_opts *o,
                       int pin_ok, int give)
{
    kl_gpu_plan p;
    build(&p, m);
    uint8_t **a = alloc_arenas(&p);
    cpu_dev d = {.mu = PTHREAD_MUTEX_INITIALIZER, .pin_ok = pin_ok};
    kl_fill_ops ops = g_ops;
    ops.ctx = &d;
    ops.copy_rows = g_no_copy_rows ? NULL : ops.copy_rows;
    ops.places = g_staged ? dev_places : NULL;
    ops.stage = g_staged ? dev_stage : NULL;
    ops.lanes = g_staged && g_lanes ? dev_lanes : NULL;
    ops.stage_on = g_staged && g_lanes ? dev_stage_on : NULL;
    if (!pin_ok) {
        ops.host_alloc = NULL;
        ops.host_free = NULL;
    }
    kl_fill_opts og = o ? *o : (kl_fill_opts){0};
    void *given[KL_FILL_MAX_SLOTS] = {0};
    for (unsigned b = 0; give && b < og.windows; b++)
        ck_assert_int_eq(dev_host_alloc(&d, &given[b], og.window_bytes, NULL), 0);
    og.buffers = give ? given : og.buffers;
    kl_fill_stats st;
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_gpu_fill(&p, (const char *const *)m->shard_paths, a, &ops, o ? &og : NULL, &st,
                         &err);
    ck_assert_msg(rc == 0, "fill: %s", t_fmt_err(&err));
    int ring = o && o->mode == KL_FILL_RING;
    check_filled(&p, a, full);
    ck_assert_uint_eq(d.pins, d.unpins);
    ck_assert(!give || d.frees == 0);   /* given buffers stay the caller's */
    for (unsigned b = 0; give && b < og.windows; b++)
        dev_host_free(&d, given[b]);   /* checks that no copy from it is pending */
    ck_assert_uint_eq(d.allocs, d.frees);
    ck_assert_uint_eq(d.done, d.n_queue);   /* every pinned copy waited for */
    for (unsigned i = 0; i < KL_FILL_MAX_SLOTS; i++)
        ck_assert_msg(!d.marked[i], "slot %u never waited for", i);
    uint64_t piece_bytes = 0;
    for (size_t i = 0; i < p.n_pieces; i++)
        piece_bytes += p.pieces[i].bytes;
    ck_assert_uint_eq(st.bytes, piece_bytes);
    ck_assert_uint_eq(st.pinned, ring ? (pin_ok || give ? st.windows : 0) : (uint64_t)d.pins);
    if (o && o->mode == KL_FILL_MAPPED && p.n_file) {
        ck_assert_uint_gt(st.windows, 0);
        ck_assert_uint_eq((uint64_t)d.waits, st.windows);   /* each window waited for once */
        if (pin_ok)
            ck_assert_uint_eq(st.pinned, st.windows);
    }
    if (ring && p.n_file) {
        ck_assert_uint_gt(st.windows, 0);
        ck_assert_uint_eq(d.pins, 0);
        ck_assert(pin_ok || give ? d.allocs > 0 : d.allocs == 0);
        /* staged when asked, pinned and given room: a stage a span */
        int staged = g_staged && !g_places_refused && (pin_ok || give);
        ck_assert_uint_eq((uint64_t)d.stages, staged ? st.windows : 0);
        ck_assert_uint_eq(st.staged, (uint64_t)d.stages);
        /* lanes when asked, offered and given room: at most a lane a thread, half the
         * buffers */
        int lanes = staged && og.lanes && g_lanes && !g_lanes_refused;
        unsigned nb = og.windows ? og.windows : (og.threads ? og.threads : 8) + 4;
        ck_assert_uint_eq(d.n_lanes > 0, lanes);
        ck_assert_uint_eq(st.lanes > 0, lanes);
        ck_assert_uint_le(st.lanes, d.n_lanes);
        ck_assert_uint_le(d.n_lanes, nb / 2);
        ck_assert_uint_le(d.n_lanes, og.threads ? og.threads : 8);
    }
    kl_free(d.places);
    free_arenas(&p, a);
    kl_gpu_plan_free(&p);
}

static void fill_and_check(const kl_model *m, const kl_model *full, const kl_fill_opts *o,
                           int pin_ok)
{
    fill_check(m, full, o, pin_ok, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* Tests                                                                                      */

START_TEST(test_vectors_only)
{
    kl_model *full = t_open_model(g_dir[_i], 0), *m = t_open_model(g_dir[_i], 1);
    ck_assert_ptr_null(m->be);
    ck_assert_ptr_nonnull(full->be);
    ck_assert_int_eq(m->matrices_read, 0);
    ck_assert_int_eq(full->matrices_read, 1);
    ck_assert_uint_eq(m->weight_bytes, full->weight_bytes);
    ck_assert_ptr_null(m->embed.data);
    ck_assert_int_eq(m->embed.kind, full->embed.kind);
    ck_assert_uint_eq(m->n_src, full->n_src);
    uint64_t sum = 0;
    for (size_t i = 0; i < m->n_src; i++)
        sum += m->src[i].bytes;
    ck_assert_uint_eq(sum, m->weight_bytes);
    ck_assert(!memcmp(m->final_norm, full->final_norm, m->cfg.hidden_size * sizeof(float)));
    for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++) {
        for (int r = 0; r < KL_ROLE_COUNT; r++) {
            const kl_wmat *w = &full->layers[l].w[r];
            ck_assert_int_eq(m->layers[l].w[r].kind, w->kind);
            ck_assert_uint_eq(m->layers[l].w[r].rows, w->rows);
            if (full->layers[l].vec[r])
                ck_assert(!memcmp(m->layers[l].vec[r], full->layers[l].vec[r],
                                  w->rows * w->cols * sizeof(float)));
            else
                ck_assert_ptr_null(m->layers[l].w[r].data);
        }
    }
    kl_state s;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_state_init(&s, m, &err), KL_E_USAGE);
    kl_model_close(m);
    kl_model_close(full);
}
END_TEST

static void check_same_mat(const kl_plan_mat *x, const kl_plan_mat *y)
{
    ck_assert_int_eq(x->kind, y->kind);
    ck_assert_uint_eq(x->rows, y->rows);
    ck_assert_uint_eq(x->cols, y->cols);
    ck_assert_uint_eq(x->data, y->data);
    ck_assert_uint_eq(x->scale, y->scale);
}

static void check_same_layer(const kl_plan_layer *x, const kl_plan_layer *y)
{
    for (int r = 0; r < KL_ROLE_COUNT; r++) {
        check_same_mat(&x->w[r], &y->w[r]);
        ck_assert_uint_eq(x->vec[r], y->vec[r]);
    }
    for (int g = 0; g < KL_FUSE_GROUPS; g++)
        check_same_mat(&x->fused[g], &y->fused[g]);
    for (int k = 0; k < 3; k++)
        check_same_mat(&x->ex[k], &y->ex[k]);
    ck_assert_uint_eq(x->n_experts, y->n_experts);
}

START_TEST(test_layout)
{
    kl_model *full = t_open_model(g_dir[_i], 0), *m = t_open_model(g_dir[_i], 1);
    kl_gpu_plan a, b;
    build(&a, m);
    build(&b, full);
    ck_assert_uint_eq(a.n_arenas, m->cfg.num_hidden_layers + 1);
    ck_assert(!memcmp(a.arena_bytes, b.arena_bytes, a.n_arenas * sizeof *a.arena_bytes));
    for (uint32_t l = 0; l + 1 < a.n_arenas; l++)
        check_same_layer(&a.layer[l], &b.layer[l]);
    ck_assert_uint_eq(a.n_pieces, b.n_pieces);
    ck_assert_uint_eq(b.n_file, 0);                 /* a host model: host pieces only */
    uint64_t vec_bytes = 0;   /* tensors the host copies as fp32 vectors */
    for (size_t i = 0; i < m->n_src; i++) {
        const kl_model_src *s = &m->src[i];
        if (s->layer < 0 ? s->role == KL_ROLE_FINAL_NORM
                         : a.layer[s->layer].vec[s->role] != KL_PLAN_NONE)
            vec_bytes += s->bytes;
    }
    ck_assert_uint_gt(vec_bytes, 0);
    ck_assert_uint_eq(a.file_bytes + vec_bytes, m->weight_bytes);
    ck_assert_uint_gt(a.n_file, 0);
    check_layout(&a);
    check_pieces(&a);
    check_pieces(&b);
    int stacked = 0;
    for (uint32_t l = 0; l + 1 < a.n_arenas; l++)
        for (int g = 0; g < KL_FUSE_GROUPS; g++)
            stacked += a.layer[l].fused[g].kind != KL_W_NONE;
    ck_assert_int_gt(stacked, 0);
    kl_gpu_plan_free(&a);
    kl_gpu_plan_free(&b);
    kl_model_close(m);
    kl_model_close(full);
}
END_TEST

START_TEST(test_fill_mapped)
{
    kl_model *full = t_open_model(g_dir[_i], 0), *m = t_open_model(g_dir[_i], 1);
    static const size_t wins[] = {4096, 65536, 12288, 0};
    for (size_t i = _i == 2; i < sizeof wins / sizeof *wins; i++) {   /* small: no 4 KiB */
        for (unsigned k = 1; k <= 3; k++) {
            for (unsigned t = 0; t <= 3; t += 1 + (k < 3)) {   /* serial and load threads */
                kl_fill_opts o = {.mode = KL_FILL_MAPPED, .window_bytes = wins[i], .windows = k,
                                  .threads = t};
                fill_and_check(m, full, &o, 1);
                fill_and_check(m, full, &o, 0);
            }
        }
    }
    kl_model_close(m);
    kl_model_close(full);
}
END_TEST

START_TEST(test_fill_read_and_host)
{
    kl_model *full = t_open_model(g_dir[_i], 0), *m = t_open_model(g_dir[_i], 1);
    kl_fill_opts o = {.mode = KL_FILL_READ, .direct = KL_DIRECT_OFF};
    fill_and_check(m, full, &o, 1);
    o.direct = KL_DIRECT_AUTO;
    fill_and_check(m, full, &o, 1);
    fill_and_check(full, full, NULL, 1);             /* KL_GPU_LOAD=host: from host memory */
    kl_model_close(m);
    kl_model_close(full);
}
END_TEST

/* The ring of buffers: byte-identical to the staged reader's fill (which check_filled also
 * holds it to), with 1, 3 and 8 threads, buffers from 4 KiB (pieces split) to the default,
 * fewer buffers than threads, pinned (host_alloc) and plain, read buffered, copied out of the
 * mapped shards, and O_DIRECT (which the mapping gives way to); staged on the device a span at
 * a time (pinned and the caller's buffers; plain ones copy as before). */
START_TEST(test_fill_ring)
{
    kl_model *full = t_open_model(g_dir[_i], 0), *m = t_open_model(g_dir[_i], 1);
    static const size_t bufs[] = {4096, 65536, 12288, 0};
    static const unsigned threads[] = {1, 3, 8};
    kl_fill_opts rd = {.mode = KL_FILL_READ, .direct = KL_DIRECT_OFF};
    fill_and_check(m, full, &rd, 1);
    for (size_t i = _i == 2; i < sizeof bufs / sizeof *bufs; i++) {   /* small: no 4 KiB */
        for (unsigned t = 0; t < 3; t++) {
            for (unsigned nb = 0; nb <= 2; nb += 2) {   /* default (threads + 4) and 2 */
                kl_fill_opts o = {.mode = KL_FILL_RING, .window_bytes = bufs[i], .windows = nb,
                                  .threads = threads[t], .direct = KL_DIRECT_OFF,
                                  .from_mapping = nb == 2};   /* copied out of mapped shards */
                fill_and_check(m, full, &o, 1);
                fill_and_check(m, full, &o, 0);
            }
        }
    }
    kl_fill_opts dio = {.mode = KL_FILL_RING, .window_bytes = 65536, .threads = 3,
                        .direct = KL_DIRECT_ON};
    fill_and_check(m, full, &dio, 1);
    dio.from_mapping = 1;   /* O_DIRECT asked: pread, not the mapping */
    fill_and_check(m, full, &dio, 1);
    for (unsigned t = 0; t < 3; t++) {   /* the caller's buffers (the GPU's prepared ring) */
        kl_fill_opts g = {.mode = KL_FILL_RING, .window_bytes = _i == 2 ? 65536 : 8192,
                          .windows = t + 2, .threads = threads[t], .direct = KL_DIRECT_OFF};
        fill_check(m, full, &g, 0, 1);
    }
    /* staged: each pinned buffer's span one stage, its places from the buffer (plain
     * buffers: copies) */
    g_staged = 1;
    for (size_t i = _i == 2; i < sizeof bufs / sizeof *bufs; i++) {
        for (unsigned t = 0; t < 3; t++) {
            kl_fill_opts o = {.mode = KL_FILL_RING, .window_bytes = bufs[i],
                              .threads = threads[t], .direct = KL_DIRECT_OFF,
                              .from_mapping = t == 1};
            fill_and_check(m, full, &o, 1);
            fill_and_check(m, full, &o, 0);
            o.windows = t + 2;   /* the caller's buffers (of a size given) */
            if (bufs[i])
                fill_check(m, full, &o, 0, 1);
        }
    }
    g_places_refused = 1;   /* no device room for the staging: unstaged, the same bytes */
    kl_fill_opts o = {.mode = KL_FILL_RING, .window_bytes = bufs[0], .threads = threads[1],
                      .direct = KL_DIRECT_OFF, .from_mapping = 1};
    fill_and_check(m, full, &o, 1);
    g_places_refused = 0;
    /* lanes: each thread stages its own two buffers (memcpy or streaming stores; pinned,
     * the caller's, fewer buffers than two a thread, plain buffers: not staged, no lanes) */
    g_lanes = 1;
    for (size_t i = _i == 2; i < sizeof bufs / sizeof *bufs; i++) {
        for (unsigned t = 0; t < 3; t++) {
            kl_fill_opts ol = {.mode = KL_FILL_RING, .window_bytes = bufs[i],
                               .threads = threads[t], .direct = KL_DIRECT_OFF,
                               .from_mapping = t != 1, .lanes = 1, .cached_copy = t == 2,
                               .windows = 2 * threads[t]};
            fill_and_check(m, full, &ol, 1);
            fill_and_check(m, full, &ol, 0);
            ol.windows = t + 2;   /* the caller's buffers: fewer lanes than threads */
            if (bufs[i])
                fill_check(m, full, &ol, 0, 1);
        }
    }
    g_lanes_refused = 1;   /* no device room for the lanes: the plain ring, the same bytes */
    kl_fill_opts ol = {.mode = KL_FILL_RING, .window_bytes = bufs[0], .threads = threads[2],
                       .direct = KL_DIRECT_OFF, .from_mapping = 1, .lanes = 1};
    fill_and_check(m, full, &ol, 1);
    g_lanes_refused = 0;
    g_lanes = 0;
    g_staged = 0;
    kl_model_close(m);
    kl_model_close(full);
}
END_TEST

/* A tensor-parallel rank's cut model (engine/tp_model.h) made from the checkpoint's files (the
 * whole model opened vectors_only: every piece a file piece, column cuts with a pitch) fills
 * exactly the arenas the same cut of the host-read model does, ranks of every valid size up to
 * 4, mapped windows, the ring (buffers smaller than a tensor: rows cut at their ends; staged
 * too: places of several rows) and the staged reader, with copy_rows and without it (a copy
 * per row). */
START_TEST(test_fill_tp_cut_from_files)
{
    kl_model *full = t_open_model(g_dir[_i], 0), *m = t_open_model(g_dir[_i], 1);
    kl_err err;
    kl_err_clear(&err);
    size_t checked = 0;
    for (unsigned tp = 2; tp <= 4; tp *= 2) {
        if (!kl_tp_size_ok(&m->cfg, 0, tp))
            continue;
        for (unsigned r = 0; r < tp; r++, checked++) {
            kl_model *cf = NULL, *ch = NULL;
            ck_assert_msg(kl_model_tp_cut(&cf, m, tp, r, 0, &err) == 0, "%s", t_fmt_err(&err));
            ck_assert_msg(kl_model_tp_cut(&ch, full, tp, r, 0, &err) == 0, "%s",
                          t_fmt_err(&err));
            ck_assert(!cf->matrices_read && cf->n_shards == m->n_shards);
            ck_assert_uint_eq(cf->weight_bytes, ch->weight_bytes);
            ck_assert_uint_eq(cf->cut_copied_bytes, 0);
            ck_assert(tp == 1 || ch->cut_copied_bytes > 0);
            for (g_no_copy_rows = 0; g_no_copy_rows < 2; g_no_copy_rows++) {
                if (!g_no_copy_rows)   /* one window: too many row copies for the queue */
                    fill_and_check(cf, ch, NULL, 1);
                kl_fill_opts o = {.mode = KL_FILL_RING, .window_bytes = 12288, .threads = 3,
                                  .direct = KL_DIRECT_OFF};
                fill_and_check(cf, ch, &o, 1);
                g_staged = !g_no_copy_rows;   /* staged: rows placed from the span */
                fill_and_check(cf, ch, &o, 1);
                g_staged = 0;
                kl_fill_opts rd = {.mode = KL_FILL_READ, .direct = KL_DIRECT_OFF};
                fill_and_check(cf, ch, &rd, 1);
            }
            g_no_copy_rows = 0;
            kl_model_tp_free(cf);
            kl_model_tp_free(ch);
        }
    }
    ck_assert_msg(checked > 0 || _i == 1, "%s: no TP size checked", g_name[_i]);
    kl_model_close(m);
    kl_model_close(full);
}
END_TEST

/* Every rank of tp's cut from the files in one fill (kl_gpu_plan_merge), routed experts cut by
 * width or (ep) whole on their owners: each rank's arenas hold what its own cut of the
 * host-read model says, and the files are read once (the spans' bytes at most the shards'
 * sizes), where filling the ranks one by one reads shared bytes once per rank.  The host-read
 * cuts merged (host pieces only: KL_GPU_LOAD=host) fill the same. */
static void fill_merged(const kl_model *m, const kl_model *full, unsigned tp, int ep,
                        const kl_fill_opts *o)
{
    kl_err err;
    kl_err_clear(&err);
    kl_model *cf[4] = {0}, *ch[4] = {0};
    kl_gpu_plan plan[4], all;
    uint64_t alone = 0;   /* bytes read filling the ranks one by one */
    for (unsigned r = 0; r < tp; r++) {
        ck_assert_msg(kl_model_tp_cut(&cf[r], m, tp, r, ep, &err) == 0, "%s", t_fmt_err(&err));
        ck_assert_msg(kl_model_tp_cut(&ch[r], full, tp, r, ep, &err) == 0, "%s",
                      t_fmt_err(&err));
        build(&plan[r], cf[r]);
        uint8_t **a = alloc_arenas(&plan[r]);
        cpu_dev d = {.mu = PTHREAD_MUTEX_INITIALIZER, .pin_ok = 1};
        kl_fill_ops ops = g_ops;
        ops.ctx = &d;
        kl_fill_stats st;
        ck_assert_int_eq(kl_gpu_fill(&plan[r], (const char *const *)m->shard_paths, a, &ops, o,
                                     &st, &err), 0);
        alone += st.read_bytes;
        free_arenas(&plan[r], a);
    }
    ck_assert_msg(kl_gpu_plan_merge(plan, tp, &all, &err) == 0, "%s", t_fmt_err(&err));
    uint8_t **a = alloc_arenas(&all);
    cpu_dev d = {.mu = PTHREAD_MUTEX_INITIALIZER, .pin_ok = 1};
    kl_fill_ops ops = g_ops;
    ops.ctx = &d;
    kl_fill_stats st;
    int rc = kl_gpu_fill(&all, (const char *const *)m->shard_paths, a, &ops, o, &st, &err);
    ck_assert_msg(rc == 0, "merged fill: %s", t_fmt_err(&err));
    uint64_t files = 0, copied = 0;
    for (uint32_t s = 0; s < m->n_shards; s++) {
        struct stat sb;
        ck_assert_int_eq(stat(m->shard_paths[s], &sb), 0);
        files += (uint64_t)sb.st_size;
    }
    for (unsigned r = 0, base = 0; r < tp; base += plan[r++].n_arenas) {
        check_filled(&plan[r], a + base, ch[r]);
        copied += plan[r].file_bytes;
    }
    ck_assert_uint_le(st.read_bytes, files);
    ck_assert_msg(st.read_bytes < alone, "TP %u: one fill read %llu bytes, one per rank %llu",
                  tp, (unsigned long long)st.read_bytes, (unsigned long long)alone);
    ck_assert_uint_ge(st.bytes, copied);
    ck_assert_uint_eq(d.done, d.n_queue);
    free_arenas(&all, a);
    kl_gpu_plan_free(&all);
    for (unsigned r = 0; r < tp; r++) {   /* the host-read cuts merged: host pieces only */
        kl_gpu_plan_free(&plan[r]);
        build(&plan[r], ch[r]);
    }
    ck_assert_msg(kl_gpu_plan_merge(plan, tp, &all, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(all.n_file, 0);
    a = alloc_arenas(&all);
    ck_assert_msg(kl_gpu_fill(&all, NULL, a, &ops, NULL, NULL, &err) == 0, "%s",
                  t_fmt_err(&err));
    for (unsigned r = 0, base = 0; r < tp; base += plan[r++].n_arenas)
        check_filled(&plan[r], a + base, ch[r]);
    free_arenas(&all, a);
    kl_gpu_plan_free(&all);
    for (unsigned r = 0; r < tp; r++) {
        kl_gpu_plan_free(&plan[r]);
        kl_model_tp_free(cf[r]);
        kl_model_tp_free(ch[r]);
    }
}

START_TEST(test_fill_tp_merged)
{
    kl_model *full = t_open_model(g_dir[_i], 0), *m = t_open_model(g_dir[_i], 1);
    kl_fill_opts ring = {.mode = KL_FILL_RING, .window_bytes = 12288, .threads = 3,
                         .direct = KL_DIRECT_OFF};
    kl_fill_opts map = {.mode = KL_FILL_MAPPED, .window_bytes = 16384, .windows = 3,
                        .threads = 2};
    for (int ep = 0; ep < 2; ep++)
        for (unsigned tp = 2; tp <= 4; tp *= 2)
            if (kl_tp_size_ok(&m->cfg, ep, tp)) {
                fill_merged(m, full, tp, ep, &ring);
                ring.from_mapping = 1;   /* the ranks' shared bytes copied out of the mapping */
                fill_merged(m, full, tp, ep, &ring);
                ring.from_mapping = 0;
                fill_merged(m, full, tp, ep, &map);
            }
    kl_model_close(m);
    kl_model_close(full);
}
END_TEST

/* kl_gpu_plan_split: the two views cover the file pieces once, in order, the host pieces in
 * the second; a ring fill of the first then a mapped fill of the second (as the backend's
 * KL_GPU_LOAD=hybrid runs them at once) put every byte where the plan says. */
START_TEST(test_fill_split)
{
    kl_model *full = t_open_model(g_dir[_i], 0), *m = t_open_model(g_dir[_i], 1);
    kl_gpu_plan p;
    build(&p, m);
    static const double shares[] = {0, 0.3, 0.5, 1, 2};
    for (size_t k = 0; k < sizeof shares / sizeof *shares; k++) {
        kl_gpu_plan a, b;
        kl_gpu_plan_split(&p, shares[k], &a, &b);
        ck_assert_uint_eq(a.n_file + b.n_file, p.n_file);
        ck_assert_uint_eq(a.n_pieces, a.n_file);
        ck_assert_uint_eq(b.n_pieces - b.n_file, p.n_pieces - p.n_file);
        ck_assert_uint_eq(a.file_bytes + b.file_bytes, p.file_bytes);
        ck_assert_ptr_eq(b.pieces, p.pieces + a.n_file);
        double want = shares[k] > 1 ? 1 : shares[k];
        ck_assert_msg((double)a.file_bytes <= (1 - want) * (double)p.file_bytes + 0.5,
                      "share %g: first holds %llu of %llu bytes", shares[k],
                      (unsigned long long)a.file_bytes, (unsigned long long)p.file_bytes);
        uint8_t **ar = alloc_arenas(&p);
        kl_fill_opts ring = {.mode = KL_FILL_RING, .window_bytes = 8192, .threads = 3,
                             .direct = KL_DIRECT_OFF};
        kl_fill_opts map = {.mode = KL_FILL_MAPPED, .window_bytes = 16384, .windows = 3,
                            .threads = 2};
        const kl_gpu_plan *half[2] = {&a, &b};
        const kl_fill_opts *how[2] = {&ring, &map};
        for (int h = 0; h < 2; h++) {
            cpu_dev d = {.mu = PTHREAD_MUTEX_INITIALIZER, .pin_ok = 1};
            kl_fill_ops ops = g_ops;
            ops.ctx = &d;
            kl_err err;
            kl_err_clear(&err);
            int rc = kl_gpu_fill(half[h], (const char *const *)m->shard_paths, ar, &ops, how[h],
                                 NULL, &err);
            ck_assert_msg(rc == 0, "share %g part %d: %s", shares[k], h, t_fmt_err(&err));
            ck_assert_uint_eq(d.allocs, d.frees);
            ck_assert_uint_eq(d.pins, d.unpins);
        }
        check_filled(&p, ar, full);
        free_arenas(&p, ar);
    }
    kl_gpu_plan_free(&p);
    kl_model_close(m);
    kl_model_close(full);
}
END_TEST

/* A copy that fails mid-fill: its error, every window released. */
START_TEST(test_fill_copy_fails)
{
    kl_model *m = t_open_model(g_dir[0], 1);
    kl_gpu_plan p;
    build(&p, m);
    uint8_t **a = alloc_arenas(&p);
    static const kl_fill_mode how[] = {KL_FILL_MAPPED, KL_FILL_MAPPED, KL_FILL_READ,
                                       KL_FILL_RING, KL_FILL_RING};
    for (int mode = 0; mode < 5; mode++) {   /* mapped, with load threads, read, ring 1 and 8 */
        cpu_dev d = {.mu = PTHREAD_MUTEX_INITIALIZER, .pin_ok = 1,
                     .fail_at = (long)(p.n_pieces - p.n_file) + 5};
        kl_fill_ops ops = g_ops;
        ops.ctx = &d;
        kl_fill_opts o = {.mode = how[mode], .window_bytes = 8192, .windows = 2,
                          .threads = mode == 1 ? 2u : mode == 3 ? 1u : mode == 4 ? 8u : 0u};
        kl_err err;
        kl_err_clear(&err);
        int rc = kl_gpu_fill(&p, (const char *const *)m->shard_paths, a, &ops, &o, NULL, &err);
        ck_assert_int_eq(rc, KL_E_GPU);
        ck_assert_msg(strstr(err.msg, "injected") != NULL, "%s", t_fmt_err(&err));
        ck_assert_uint_eq(d.pins, d.unpins);
        ck_assert_uint_eq(d.allocs, d.frees);
    }
    free_arenas(&p, a);
    kl_gpu_plan_free(&p);
    kl_model_close(m);
}
END_TEST

/* A tiny BF16 model of its own in dir = g_root/name (vectors only), its plan and arenas. */
static kl_model *own_model(const char *name, char dir[700], kl_gpu_plan *p, uint8_t ***a)
{
    snprintf(dir, 700, "%s/%s", g_root, name);
    synth(dir, "tiny", KL_SYNTH_BF16);
    kl_model *m = t_open_model(dir, 1);
    build(p, m);
    *a = alloc_arenas(p);
    return m;
}

static int g_ring_lanes;   /* 1: ring_fill staged on lanes */

/* A RING fill of 8 KiB buffers through d (spans copied out of the mapped shards when
 * mapping; staged on lanes with g_ring_lanes); its result, err holding its error. */
static int ring_fill(const kl_gpu_plan *p, const kl_model *m, uint8_t **a, cpu_dev *d,
                     unsigned threads, unsigned buffers, int mapping, kl_err *err)
{
    kl_fill_ops ops = g_ops;
    ops.ctx = d;
    if (g_ring_lanes) {
        ops.places = dev_places;
        ops.stage = dev_stage;
        ops.lanes = dev_lanes;
        ops.stage_on = dev_stage_on;
    }
    kl_fill_opts o = {.mode = KL_FILL_RING, .window_bytes = 8192, .windows = buffers,
                      .threads = threads, .direct = KL_DIRECT_OFF, .from_mapping = mapping,
                      .lanes = g_ring_lanes};
    kl_err_clear(err);
    int rc = kl_gpu_fill(p, (const char *const *)m->shard_paths, a, &ops, &o, NULL, err);
    ck_assert_uint_eq(d->allocs, d->frees);
    ck_assert_uint_eq(d->done, d->n_queue);   /* every pinned copy waited for */
    kl_free(d->places);
    d->places = NULL;
    return rc;
}

/* RING: pinned memory refused after 1 buffer (the fill goes on with it) or at once (its
 * error); a wait failing on a load thread (its error, threads joined, buffers freed); a shard
 * truncated after the model was opened (KL_E_IO naming the file, before any mapping is read);
 * each with spans read and copied out of the mapped shards; each on lanes too (_i = 1: one
 * buffer is too few for a lane, the plain ring then; a copy failing on a lane's thread). */
START_TEST(test_fill_ring_fails)
{
    kl_gpu_plan p;
    uint8_t **a;
    char dir[700];
    kl_model *m = own_model(_i ? "short-lanes" : "short", dir, &p, &a),
             *full = t_open_model(dir, 0);
    kl_err err;
    g_ring_lanes = _i;
    for (long most = 0; most <= 1; most++) {
        cpu_dev d = {.mu = PTHREAD_MUTEX_INITIALIZER, .pin_ok = 1, .alloc_max = most ? 1 : -1};
        int rc = ring_fill(&p, m, a, &d, 3, 0, (int)most, &err);
        ck_assert_msg(rc == (most ? 0 : KL_E_NOMEM), "%d %s", rc, t_fmt_err(&err));
        if (!rc)
            check_filled(&p, a, full);
        ck_assert_uint_eq(d.allocs, (unsigned long)most);
    }
    if (_i) {   /* pinned memory for 3 buffers of 6: one lane of two, the same bytes */
        cpu_dev d = {.mu = PTHREAD_MUTEX_INITIALIZER, .pin_ok = 1, .alloc_max = 3};
        free_arenas(&p, a);   /* fresh: the fill above wrote the same bytes */
        a = alloc_arenas(&p);
        int rc = ring_fill(&p, m, a, &d, 3, 0, 1, &err);
        ck_assert_msg(rc == 0, "%d %s", rc, t_fmt_err(&err));
        check_filled(&p, a, full);
        ck_assert_uint_eq(d.n_lanes, 1);
        ck_assert_uint_eq(d.allocs, 3);
    }
    /* the caller's buffers: without their count, of a size that is no multiple of 4 KiB, or
     * misaligned: KL_E_USAGE before anything is read */
    static uint8_t raw[3 * 8192] __attribute__((aligned(4096)));
    void *given[2] = {raw, raw + 8192}, *odd[2] = {raw, raw + 1};
    kl_fill_opts bad[3] = {
        {.mode = KL_FILL_RING, .window_bytes = 8192, .buffers = given},
        {.mode = KL_FILL_RING, .window_bytes = 6000, .windows = 2, .buffers = given},
        {.mode = KL_FILL_RING, .window_bytes = 8192, .windows = 2, .buffers = odd}};
    for (int i = 0; i < 3; i++) {
        cpu_dev d = {.mu = PTHREAD_MUTEX_INITIALIZER, .pin_ok = 1};
        kl_fill_ops ops = g_ops;
        ops.ctx = &d;
        kl_err_clear(&err);
        int rc = kl_gpu_fill(&p, (const char *const *)m->shard_paths, a, &ops, &bad[i], NULL,
                             &err);
        ck_assert_msg(rc == KL_E_USAGE, "case %d: %d %s", i, rc, t_fmt_err(&err));
        ck_assert_int_eq(d.copies, 0);
    }
    const char *last = m->shard_paths[m->n_shards - 1];
    for (int trunc = 0; trunc < 2; trunc++) {
        if (trunc)
            ck_assert_int_eq(truncate(last, 4096), 0);
        for (unsigned t = 1; t <= 8; t += 7) {
            cpu_dev d = {.mu = PTHREAD_MUTEX_INITIALIZER, .pin_ok = 1, .fail_wait = 3 - trunc};
            int rc = ring_fill(&p, m, a, &d, t, _i ? 2 * t : 2, t == 8, &err);   /* t lanes */
            ck_assert_msg(rc == (trunc ? KL_E_IO : KL_E_GPU), "%d %s", rc, t_fmt_err(&err));
            if (trunc)
                ck_assert_msg(strstr(t_fmt_err(&err), last) != NULL, "%s", t_fmt_err(&err));
        }
    }
    if (_i) {   /* a lane's copy fails: its error, every thread joined, every copy waited for */
        ck_assert_int_eq(truncate(last, 0), 0);
        kl_model_close(m);
        free_arenas(&p, a);
        kl_gpu_plan_free(&p);
        m = own_model("short-lanes", dir, &p, &a);
        for (unsigned t = 1; t <= 8; t += 7) {
            for (int after = 0; after < 2; after++) {   /* a copy fails; a span's copies are
                                                           issued, then its stage_on fails */
                cpu_dev d = {.mu = PTHREAD_MUTEX_INITIALIZER, .pin_ok = 1,
                             /* past the host pieces' copies, made first */
                             .fail_at = after ? 0 : (long)(p.n_pieces - p.n_file) + 3,
                             .fail_stage_on = after ? 3 : 0};
                int rc = ring_fill(&p, m, a, &d, t, 2 * t, 1, &err);
                ck_assert_msg(rc == KL_E_GPU, "%d %s", rc, t_fmt_err(&err));
                ck_assert_uint_eq(d.n_lanes, t);
            }
        }
    }
    g_ring_lanes = 0;
    free_arenas(&p, a);
    kl_gpu_plan_free(&p);
    kl_model_close(m);
    kl_model_close(full);
}
END_TEST

/* A shard removed after the model was opened: KL_E_IO naming it. */
START_TEST(test_fill_shard_gone)
{
    kl_gpu_plan p;
    uint8_t **a;
    char dir[700];
    kl_model *m = own_model("gone", dir, &p, &a);
    ck_assert_int_eq(unlink(m->shard_paths[m->n_shards - 1]), 0);
    cpu_dev d = {.mu = PTHREAD_MUTEX_INITIALIZER, .pin_ok = 1};
    kl_fill_ops ops = g_ops;
    ops.ctx = &d;
    kl_err err;
    kl_err_clear(&err);
    for (unsigned t = 0; t < 2; t++) {
        kl_fill_opts o = {.threads = t};
        kl_err_clear(&err);
        int rc = kl_gpu_fill(&p, (const char *const *)m->shard_paths, a, &ops, &o, NULL, &err);
        ck_assert_int_eq(rc, KL_E_IO);
    }
    ck_assert_uint_eq(d.pins, d.unpins);
    free_arenas(&p, a);
    kl_gpu_plan_free(&p);
    kl_model_close(m);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("gpu_plan");
    TCase *tc = tcase_create("plan");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_vectors_only, 0, 3);
    tcase_add_loop_test(tc, test_layout, 0, 3);
    tcase_add_loop_test(tc, test_fill_mapped, 0, 3);
    tcase_add_loop_test(tc, test_fill_read_and_host, 0, 3);
    tcase_add_loop_test(tc, test_fill_ring, 0, 3);
    tcase_add_test(tc, test_fill_copy_fails);
    tcase_add_loop_test(tc, test_fill_ring_fails, 0, 2);
    tcase_add_loop_test(tc, test_fill_split, 0, 3);
    tcase_add_loop_test(tc, test_fill_tp_cut_from_files, 0, 3);
    tcase_add_loop_test(tc, test_fill_tp_merged, 0, 3);
    tcase_add_test(tc, test_fill_shard_gone);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(suite());
}
