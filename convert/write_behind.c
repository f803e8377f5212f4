/* convert/write_behind.c — bounded write-behind queue with writer lanes (see write_behind.h). */
#include "convert/write_behind.h"

#include "common/checked.h"
#include "common/clock.h"
#include "common/mem.h"

#include <pthread.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* An item: its header and bytes, carved from the arena (or, larger than the arena, a block of
 * its own). */
struct kl_wb_item {
    struct kl_wb_item *next;     /* in its lane's FIFO */
    struct kl_wb_item *younger;  /* in the arena's allocation order */
    kl_wb_target       t;        /* copied: the producer's target changes between shards */
    kl_wb_seg          seg[KL_WB_MAX_SEGS];
    unsigned           n_segs;
    unsigned           lane;
    size_t             n;        /* bytes of all segments */
    size_t             end;      /* arena offset one past the item */
    size_t             span;     /* arena bytes it holds, with the end skipped when it wrapped */
    int                own;      /* a block of its own, not in the arena */
    int                done;     /* written (or cancelled): its span can be reused */
    uint8_t            data[];
};

typedef struct lane {
    struct kl_wb  *q;
    kl_wb_item    *head, *tail;
    size_t         waiting;      /* bytes committed to this lane, not yet written */
    pthread_cond_t work_cv;      /* an item was queued, or stop */
    pthread_t      th;
} lane;

/* The buffers live in one arena of cap bytes used as a ring, in allocation order: malloc'ing
 * a block per item faulted in and zeroed pages afresh for about a quarter of the output (malloc
 * hands freed large blocks back to the kernel), on the producer's thread, inside the
 * quantizer's and the copies' stores.  A span is reused once it and every older one are done,
 * so a slow lane holds back the others' space for a while, never their writes. */
struct kl_wb {
    pthread_mutex_t mu;
    pthread_cond_t  space_cv;    /* an item was written (space freed, or nothing pending) */
    uint8_t        *arena;       /* [cap] */
    size_t          cap;
    size_t          head;        /* next free arena byte */
    size_t          used;        /* arena bytes held (spans), 0..cap */
    kl_wb_item     *oldest, *youngest;
    int             own_out;     /* an own-block item is reserved or waiting */
    size_t          pending;     /* committed items not yet written */
    int             stop;
    int             rc;          /* first error */
    kl_err          err;
    double          wait_s;
    unsigned        n_lanes;
    lane            lanes[KL_WB_MAX_LANES];
};

#define ITEM_ALIGN 64u
/* Nice value of the lanes.  They are the last stage: when CPUs are short, the producer (which
 * keeps the source reads in flight and feeds the quantizer) must run first, and the lanes take
 * what is left; a full queue stops the producer, so they cannot fall behind for long.  On 2
 * vCPUs, a conversion from the disk read its source in 2.2-2.4 s with nice lanes against
 * 4.3-4.9 s without. */
#define LANE_NICE 10

/* Hooks and writes every segment of it; 0 or the first error (in e). */
static int write_item(const kl_wb_item *it, kl_err *e)
{
    const uint8_t *p = it->data;
    for (unsigned k = 0; k < it->n_segs; k++) {
        const kl_wb_seg *s = &it->seg[k];
        int rc = it->t.hook ? it->t.hook(it->t.ctx, s->tensor, s->off, p, s->n, e) : 0;
        if (!rc && it->t.w) /* no writer: a hash-only item */
            rc = kl_st_writer_pwrite(it->t.w, s->tensor, s->off, p, s->n, e);
        if (rc)
            return rc;
        p += s->n;
    }
    return 0;
}

/* Under q->mu: size bytes (a multiple of ITEM_ALIGN, <= cap) from the arena, or NULL when they
 * do not fit now.  The free bytes are [head, cap) and [0, oldest's start) while head is past
 * the oldest span, else [head, oldest's start). */
static kl_wb_item *carve(kl_wb *q, size_t size)
{
    if (!q->used)
        q->head = 0;
    size_t tail = (q->head + q->cap - q->used) % q->cap; /* start of the oldest span */
    size_t at, span;
    if (!q->used || q->head > tail) {
        if (q->cap - q->head >= size)
            at = q->head, span = size;
        else if (tail >= size)
            at = 0, span = q->cap - q->head + size; /* the end is skipped */
        else
            return NULL;
    } else if (tail - q->head >= size) {
        at = q->head, span = size;
    } else {
        return NULL;
    }
    kl_wb_item *x = (kl_wb_item *)(q->arena + at);
    memset(x, 0, sizeof *x);
    x->span = span;
    x->end = (at + size) % q->cap;
    q->head = x->end;
    q->used += span;
    if (q->youngest)
        q->youngest->younger = x;
    else
        q->oldest = x;
    q->youngest = x;
    return x;
}

/* Under q->mu: an item is written or cancelled; frees the spans of the done items oldest
 * first. */
static void release(kl_wb *q, kl_wb_item *it)
{
    if (it->own) {
        q->own_out = 0;
        kl_free(it);
        return;
    }
    it->done = 1;
    while (q->oldest && q->oldest->done) {
        kl_wb_item *x = q->oldest;
        q->oldest = x->younger;
        if (!q->oldest)
            q->youngest = NULL;
        q->used -= x->span;
    }
}

static void *lane_main(void *arg)
{
    lane *l = arg;
    kl_wb *q = l->q;
    /* Linux keeps a nice value per thread; raising it needs no privilege */
    (void)setpriority(PRIO_PROCESS, (id_t)gettid(), LANE_NICE);
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!l->head && !q->stop)
            pthread_cond_wait(&l->work_cv, &q->mu);
        if (!l->head)
            break;
        kl_wb_item *it = l->head;
        l->head = it->next;
        if (!l->head)
            l->tail = NULL;
        int failed = q->rc != 0;
        pthread_mutex_unlock(&q->mu);

        kl_err e;
        kl_err_clear(&e);
        int rc = failed ? 0 : write_item(it, &e);

        pthread_mutex_lock(&q->mu);
        if (rc && !q->rc) {
            q->rc = rc;
            q->err = e;
        }
        l->waiting -= it->n;
        q->pending--;
        release(q, it);
        pthread_cond_broadcast(&q->space_cv);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* Stops and joins the first n lanes. */
static void stop_lanes(kl_wb *q, unsigned n)
{
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    for (unsigned i = 0; i < n; i++)
        pthread_cond_signal(&q->lanes[i].work_cv);
    pthread_mutex_unlock(&q->mu);
    for (unsigned i = 0; i < n; i++) {
        pthread_join(q->lanes[i].th, NULL);
        pthread_cond_destroy(&q->lanes[i].work_cv);
    }
}

static void free_queue(kl_wb *q)
{
    pthread_cond_destroy(&q->space_cv);
    pthread_mutex_destroy(&q->mu);
    kl_aligned_free(q->arena);
    kl_free(q);
}

int kl_wb_create(kl_wb **out, size_t cap_bytes, unsigned lanes, kl_err *err)
{
    *out = NULL;
    if (cap_bytes < ((size_t)1 << 20))
        return kl_fail(err, KL_E_USAGE, "write-behind queue of %zu bytes: at least 1 MiB",
                       cap_bytes);
    if (!lanes || lanes > KL_WB_MAX_LANES)
        return kl_fail(err, KL_E_USAGE, "write-behind queue with %u lanes: 1 to %u", lanes,
                       KL_WB_MAX_LANES);
    kl_wb *q = kl_calloc(1, sizeof *q);
    if (!q)
        return kl_fail(err, KL_E_NOMEM, "out of memory for the write-behind queue");
    q->cap = cap_bytes / ITEM_ALIGN * ITEM_ALIGN;
    kl_err_clear(&q->err);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->space_cv, NULL);
    /* not touched here: its pages are faulted in once, by the first pass over the ring */
    q->arena = kl_aligned_alloc(ITEM_ALIGN, q->cap);
    if (!q->arena) {
        free_queue(q);
        return kl_fail(err, KL_E_NOMEM, "out of memory for a %zu-byte write-behind queue",
                       cap_bytes);
    }
    for (unsigned i = 0; i < lanes; i++) {
        lane *l = &q->lanes[i];
        l->q = q;
        pthread_cond_init(&l->work_cv, NULL);
        if (pthread_create(&l->th, NULL, lane_main, l) != 0) {
            pthread_cond_destroy(&l->work_cv);
            stop_lanes(q, i);
            free_queue(q);
            return kl_fail(err, KL_E_NOMEM, "cannot start %u writer threads", lanes);
        }
    }
    q->n_lanes = lanes;
    *out = q;
    return 0;
}

void kl_wb_destroy(kl_wb *q)
{
    if (!q)
        return;
    stop_lanes(q, q->n_lanes);
    free_queue(q);
}

/* Copies q's first error into err; returns its code. */
static int report(kl_wb *q, kl_err *err)
{
    if (err)
        *err = q->err;
    return q->rc;
}

unsigned kl_wb_pick_lane(kl_wb *q)
{
    unsigned best = 0;
    pthread_mutex_lock(&q->mu);
    for (unsigned i = 1; i < q->n_lanes; i++)
        if (q->lanes[i].waiting < q->lanes[best].waiting)
            best = i;
    pthread_mutex_unlock(&q->mu);
    return best;
}

/* Under q->mu: an item of n bytes once it fits (blocking), or NULL after an error or when a
 * block of its own could not be allocated.  One larger than the arena waits for an empty
 * queue and gets a block of its own. */
static kl_wb_item *get_item(kl_wb *q, size_t n)
{
    size_t size = kl_round_up_u64(sizeof(kl_wb_item) + n, ITEM_ALIGN);
    int own = size > q->cap;
    kl_wb_item *x = NULL;
    double t0 = kl_now_s();
    int waited = 0;
    while (!q->rc && !x) {
        if (own && !q->used && !q->pending && !q->own_out)
            break;
        if (!own && (x = carve(q, size)))
            break;
        waited = 1;
        pthread_cond_wait(&q->space_cv, &q->mu);
    }
    if (waited)
        q->wait_s += kl_now_s() - t0;
    if (own && !q->rc && (x = kl_malloc(sizeof *x + n))) {
        memset(x, 0, sizeof *x);
        x->own = 1;
        q->own_out = 1;
    }
    return x;
}

int kl_wb_reserve(kl_wb *q, const kl_wb_target *t, unsigned lane, const kl_wb_seg *segs,
                  unsigned n_segs, kl_wb_item **it, uint8_t **data, kl_err *err)
{
    *it = NULL;
    if (!n_segs || n_segs > KL_WB_MAX_SEGS || lane >= q->n_lanes)
        return kl_fail(err, KL_E_BUG, "write-behind item with %u segments on lane %u", n_segs,
                       lane);
    size_t n = 0, limit = SIZE_MAX - sizeof(kl_wb_item) - ITEM_ALIGN;
    for (unsigned k = 0; k < n_segs; k++) {
        if (segs[k].n > limit - n)
            return kl_fail(err, KL_E_USAGE, "write-behind item too large");
        n += segs[k].n;
    }
    pthread_mutex_lock(&q->mu);
    kl_wb_item *x = get_item(q, n);
    int rc = q->rc ? report(q, err) : 0;
    pthread_mutex_unlock(&q->mu);
    if (rc)
        return rc;
    if (!x)
        return kl_fail(err, KL_E_NOMEM, "out of memory queueing a %zu-byte write", n);
    x->t = *t;
    memcpy(x->seg, segs, n_segs * sizeof *segs);
    x->n_segs = n_segs;
    x->n = n;
    x->lane = lane;
    *it = x;
    *data = x->data;
    return 0;
}

void kl_wb_commit(kl_wb *q, kl_wb_item *it)
{
    lane *l = &q->lanes[it->lane];
    pthread_mutex_lock(&q->mu);
    if (l->tail)
        l->tail->next = it;
    else
        l->head = it;
    l->tail = it;
    l->waiting += it->n;
    q->pending++;
    pthread_cond_signal(&l->work_cv);
    pthread_mutex_unlock(&q->mu);
}

void kl_wb_cancel(kl_wb *q, kl_wb_item *it)
{
    if (!it)
        return;
    pthread_mutex_lock(&q->mu);
    release(q, it);
    pthread_cond_broadcast(&q->space_cv);
    pthread_mutex_unlock(&q->mu);
}

int kl_wb_write(kl_wb *q, const kl_wb_target *t, unsigned lane, size_t tensor, uint64_t off,
                const void *buf, size_t n, kl_err *err)
{
    if (!n) { /* nothing to queue, but the queue's first error still stands */
        pthread_mutex_lock(&q->mu);
        int rc = q->rc ? report(q, err) : 0;
        pthread_mutex_unlock(&q->mu);
        return rc;
    }
    kl_wb_seg seg = {tensor, off, n};
    kl_wb_item *it;
    uint8_t *data;
    int rc = kl_wb_reserve(q, t, lane, &seg, 1, &it, &data, err);
    if (rc)
        return rc;
    memcpy(data, buf, n);
    kl_wb_commit(q, it);
    return 0;
}

int kl_wb_drain(kl_wb *q, kl_err *err)
{
    pthread_mutex_lock(&q->mu);
    while (q->pending)
        pthread_cond_wait(&q->space_cv, &q->mu);
    int rc = q->rc ? report(q, err) : 0;
    pthread_mutex_unlock(&q->mu);
    return rc;
}

double kl_wb_wait_s(const kl_wb *q)
{
    return q ? q->wait_s : 0.0;
}
