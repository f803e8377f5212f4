/*
 * engine/gpu_load.c — the GPU backend's weights from the files to the device (gpu_load.h).
 */
#include "engine/gpu_load.h"

#ifdef KL_GPU

#include "common/clock.h"
#include "common/cpu.h"
#include "common/mem.h"
#include "kernels/place.h"

#include <stdlib.h>
#include <string.h>

/* A ring fill staged on the device (kl_fill_ops.places and .stage; $KL_GPU_LOAD_STAGE=0: off):
 * every place of the fill in device memory, room for STAGE_ROOMS spans; each span copied in on
 * a stream of the stage's own while the backend's stream places the earlier ones
 * (kernels/place.h).  Kernels stay on the backend's stream: a kernel run on another stream
 * leaves the decode graphs replayed later without their programmatic early starts on the H200
 * (3% of a step; docs/PERFORMANCE.md session 23). */
#define STAGE_ROOMS 4u
#define LANE_ROOMS  3u

/* A lane of a staged fill (kl_fill_ops.lanes): one load thread's spans copied on a stream of
 * its own into LANE_ROOMS rooms, placed from there on the backend's stream.  A copy into a room
 * waits for that room's last place, queued on the backend's stream behind the other lanes':
 * three rooms keep a lane copying while its two latest spans wait to be placed. */
typedef struct fill_lane {
    kl_gpu_stream st;
    uint8_t      *room;                    /* device: LANE_ROOMS x the stage's most bytes */
    kl_gpu_event  copied[LANE_ROOMS], placed[LANE_ROOMS];
    unsigned      spans;                   /* staged so far */
    int           current;                 /* the device made current on the lane's thread */
} fill_lane;

typedef struct fill_stage {
    kl_gpu_place *places;                  /* device */
    uint8_t      *room;                    /* device: STAGE_ROOMS x most bytes */
    size_t        most;                    /* the longest span, rounded up to 256 bytes */
    kl_gpu_stream st;                      /* the spans' copies */
    kl_gpu_event  copied[STAGE_ROOMS], placed[STAGE_ROOMS];
    unsigned      spans;                   /* staged so far */
    fill_lane    *lane;                    /* [n_lanes], NULL: no lanes */
    unsigned      n_lanes;
    pthread_mutex_t mu;                    /* lanes: a span's wait and place adjacent on the
                                              backend's stream (no place queued behind
                                              another lane's wait for its copy) */
} fill_stage;

/* The fill's function table on the GPU: copies on the backend's stream, mapped windows
 * page-locked read-only, ring buffers pinned, an event per window slot or ring buffer. */
typedef struct gpu_fill {
    kl_gpu_stream st;                      /* the backend's */
    int          dev;
    const char *const *shards;             /* the model's shard paths */
    kl_gpu_event ev[KL_FILL_MAX_SLOTS];
    fill_stage   stage;                    /* zero until places */
} gpu_fill;

static int fill_copy(void *ctx, void *dst, const void *src, size_t bytes, int pinned,
                     kl_err *err)
{
    gpu_fill *f = ctx;   /* pageable sources: the copy returns once it has them staged */
    return kl_gpu_h2d(dst, src, bytes, f->st, err);
}

static int fill_copy_rows(void *ctx, void *dst, const void *src, size_t width, size_t pitch,
                          size_t rows, int pinned, kl_err *err)
{
    gpu_fill *f = ctx;
    return kl_gpu_h2d_rows(dst, src, width, pitch, rows, f->st, err);
}

static int fill_pin(void *ctx, void *p, size_t bytes)
{
    kl_err ignored;   /* refused: the fill copies this window plainly */
    kl_err_clear(&ignored);
    return kl_gpu_host_register(p, bytes, 1, &ignored);
}

static void fill_unpin(void *ctx, void *p)
{
    kl_gpu_host_unregister(p);
}

static int fill_host_alloc(void *ctx, void **p, size_t bytes, kl_err *err)
{
    return kl_gpu_host_alloc(p, bytes, err);
}

static void fill_host_free(void *ctx, void *p)
{
    kl_gpu_host_free(p);
}

static int fill_mark(void *ctx, unsigned slot, kl_err *err)
{
    gpu_fill *f = ctx;
    return kl_gpu_event_record(f->ev[slot], f->st, err);
}

static int fill_wait(void *ctx, unsigned slot, kl_err *err)
{
    gpu_fill *f = ctx;
    return kl_gpu_event_sync(f->ev[slot], err);
}

static int fill_places(void *ctx, const kl_gpu_place *all, size_t n, size_t most, kl_err *err)
{
    gpu_fill *f = ctx;
    fill_stage *s = &f->stage;
    s->most = (most + 255) / 256 * 256;   /* rooms aligned: the placing's 16-byte path */
    int rc = kl_gpu_alloc((void **)&s->places, (n ? n : 1) * sizeof *all, err);
    if (!rc && n)   /* pageable: consumed when the call returns */
        rc = kl_gpu_h2d(s->places, all, n * sizeof *all, f->st, err);
    if (!rc)
        rc = kl_gpu_alloc((void **)&s->room, STAGE_ROOMS * (s->most ? s->most : 256), err);
    if (!rc)
        rc = kl_gpu_stream_create(&s->st, err);
    for (unsigned i = 0; !rc && i < STAGE_ROOMS; i++)
        if (!(rc = kl_gpu_event_create(&s->copied[i], err)))
            rc = kl_gpu_event_create(&s->placed[i], err);
    return rc;
}

/* A room's places [first, first + count) on the backend's stream once its copy (event
 * copied) is done; event placed after them. */
static int place_room(gpu_fill *f, const uint8_t *room, kl_gpu_event copied,
                      kl_gpu_event placed, size_t first, size_t count, kl_err *err)
{
    int rc = kl_gpu_stream_wait(f->st, copied, err);
    if (!rc)
        rc = kl_gpu_place_span(room, f->stage.places, (uint32_t)first, (uint32_t)count, f->st,
                               err);
    if (!rc)
        rc = kl_gpu_event_record(placed, f->st, err);
    return rc;
}

/* len bytes at src into room on stream st, after the room's last places (event placed) when
 * it was used before (reused); event copied after the copy. */
static int room_copy(kl_gpu_stream st, uint8_t *room, int reused, kl_gpu_event placed,
                     const void *src, size_t len, kl_gpu_event copied, kl_err *err)
{
    int rc = reused ? kl_gpu_stream_wait(st, placed, err) : 0;
    if (!rc)
        rc = kl_gpu_h2d(room, src, len, st, err);
    if (!rc)
        rc = kl_gpu_event_record(copied, st, err);
    return rc;
}

/* Span bytes at src into the next room (once its last places are done) on the stage's
 * stream, then placed from there on the backend's.  The ring's mark for the span's buffer,
 * recorded on the backend's stream after this, follows the copy. */
static int fill_stage_span(void *ctx, const void *src, size_t len, size_t first, size_t count,
                           kl_err *err)
{
    gpu_fill *f = ctx;
    fill_stage *s = &f->stage;
    const unsigned r = s->spans % STAGE_ROOMS;
    uint8_t *room = s->room + r * s->most;
    int rc = room_copy(s->st, room, s->spans++ >= STAGE_ROOMS, s->placed[r], src, len,
                       s->copied[r], err);
    return rc ? rc : place_room(f, room, s->copied[r], s->placed[r], first, count, err);
}

/* The lanes' rooms, events and streams freed (nothing of theirs pending). */
static void lanes_free(fill_stage *s)
{
    for (unsigned i = 0; i < s->n_lanes; i++) {
        fill_lane *l = &s->lane[i];
        for (unsigned j = 0; j < LANE_ROOMS; j++) {
            kl_gpu_event_destroy(l->copied[j]);
            kl_gpu_event_destroy(l->placed[j]);
        }
        kl_gpu_stream_destroy(l->st);
        kl_gpu_free(l->room);
    }
    if (s->lane)
        pthread_mutex_destroy(&s->mu);
    kl_free(s->lane);
    s->lane = NULL;
    s->n_lanes = 0;
}

/* n lanes, each a stream, LANE_ROOMS rooms and their events (none left on an error). */
static int fill_lanes(void *ctx, unsigned n, kl_err *err)
{
    fill_stage *s = &((gpu_fill *)ctx)->stage;
    if (!(s->lane = kl_calloc(n, sizeof *s->lane)))
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    if (pthread_mutex_init(&s->mu, NULL)) {
        kl_free(s->lane);
        s->lane = NULL;
        return kl_fail(err, KL_E_NOMEM, "cannot create a mutex");
    }
    s->n_lanes = n;
    int rc = 0;
    for (unsigned i = 0; !rc && i < n; i++) {
        fill_lane *l = &s->lane[i];
        rc = kl_gpu_alloc((void **)&l->room, LANE_ROOMS * s->most, err);
        if (!rc)
            rc = kl_gpu_stream_create(&l->st, err);
        for (unsigned j = 0; !rc && j < LANE_ROOMS; j++)
            if (!(rc = kl_gpu_event_create(&l->copied[j], err)))
                rc = kl_gpu_event_create(&l->placed[j], err);
    }
    if (rc)
        lanes_free(s);
    return rc;
}

/* Lane's span bytes at src into its next room (once its last places are done) on the lane's
 * stream, slot's mark after that copy, then placed from there on the backend's stream. */
static int fill_stage_on(void *ctx, unsigned lane, unsigned slot, const void *src, size_t len,
                         size_t first, size_t count, kl_err *err)
{
    gpu_fill *f = ctx;
    fill_stage *s = &f->stage;
    fill_lane *l = &s->lane[lane];
    const unsigned r = l->spans % LANE_ROOMS;
    uint8_t *room = l->room + r * s->most;
    int rc = l->current ? 0 : kl_gpu_device_open(f->dev, NULL, 0, err);
    l->current = !rc;
    const int reused = l->spans++ >= LANE_ROOMS;
    if (!rc)
        rc = room_copy(l->st, room, reused, l->placed[r], src, len, l->copied[r], err);
    if (!rc)
        rc = kl_gpu_event_record(f->ev[slot], l->st, err);
    if (rc) {   /* the slot's mark may be missing: the buffer is free once the lane drains */
        kl_err ignored;
        (void)kl_gpu_stream_sync(l->st, &ignored);
        return rc;
    }
    pthread_mutex_lock(&s->mu);
    rc = place_room(f, room, l->copied[r], l->placed[r], first, count, err);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* The stage's places all done (unless rc already failed), then its memory and stream freed;
 * the first error. */
static int fill_stage_end(gpu_fill *f, int rc, kl_err *err)
{
    fill_stage *s = &f->stage;
    kl_err e;
    for (unsigned i = 0; i < s->n_lanes; i++) {   /* the copies, then the places */
        int r = kl_gpu_stream_sync(s->lane[i].st, rc ? &e : err);
        rc = rc ? rc : r;
    }
    if (s->st) {
        int r = kl_gpu_stream_sync(s->st, rc ? &e : err);
        rc = rc ? rc : r;
        r = kl_gpu_stream_sync(f->st, rc ? &e : err);
        rc = rc ? rc : r;
    }
    lanes_free(s);
    for (unsigned i = 0; i < STAGE_ROOMS; i++) {
        kl_gpu_event_destroy(s->copied[i]);
        kl_gpu_event_destroy(s->placed[i]);
    }
    kl_gpu_stream_destroy(s->st);
    kl_gpu_free(s->room);
    kl_gpu_free(s->places);
    memset(s, 0, sizeof *s);
    return rc;
}

/* A ring fill staged on the device unless $KL_GPU_LOAD_STAGE=0. */
int kl_gpu_load_staged(void)
{
    const char *v = getenv("KL_GPU_LOAD_STAGE");
    return !(v && !strcmp(v, "0"));
}

/* $name as a number in [1, most], else dflt. */
static unsigned env_count(const char *name, unsigned most, unsigned dflt)
{
    const char *v = getenv(name);
    return v && atoi(v) > 0 && atoi(v) <= (int)most ? (unsigned)atoi(v) : dflt;
}

/* How file bytes travel for how ($KL_GPU_LOAD but hybrid; $KL_GPU_LOAD_WINDOW_MB,
 * $KL_GPU_LOAD_THREADS, $KL_GPU_LOAD_BUFFERS, $KL_GPU_LOAD_LANES, $KL_GPU_LOAD_CACHED:
 * engine/backend.h).  The ring's buffers are sized and counted here (on lanes two of 4 MiB a
 * thread, else threads + 4 of 16 MiB) as they are allocated ahead. */
const char *kl_gpu_load_options(const char *how, int lanes_ok, kl_fill_opts *o)
{
    const char *win = getenv("KL_GPU_LOAD_WINDOW_MB");
    int ring = !how || !strcmp(how, "ring") || !strcmp(how, "ring-read") ||
               !strcmp(how, "ring-direct");
    *o = (kl_fill_opts){.mode = ring ? KL_FILL_RING : KL_FILL_MAPPED};
    if (win && atoi(win) > 0 && atoi(win) <= 1024)
        o->window_bytes = (size_t)atoi(win) << 20;
    if (ring) {
        /* three threads for four cores, 8 to 16: the host copy bounds the ring (test_hostcopy
         * on the H200 machine: 8 threads 0.75 of the pinned copy rate, 12 and 16 ~0.82); on
         * its 16 cores 12 threads filled as fast as 16 and started sooner (the device's start
         * shares the cores: docs/PERFORMANCE.md sessions 22 and 24) */
        unsigned cores = kl_cpu_count(64) * 3 / 4;
        cores = cores < 8 ? 8 : cores > 16 ? 16 : cores;
        o->threads = env_count("KL_GPU_LOAD_THREADS", KL_FILL_MAX_SLOTS, cores);
        /* lanes unless $KL_GPU_LOAD_LANES=0: each thread copies its own two buffers of 4 MiB
         * to the device as it fills them, by memcpy, so the device reads them from the CPU's
         * caches (session 24: 0.91-0.92 of the pinned copy rate after the device's start,
         * against 0.74-0.76 for the shared ring of 16 MiB buffers by streaming stores) */
        const char *lanes = getenv("KL_GPU_LOAD_LANES"), *cached = getenv("KL_GPU_LOAD_CACHED");
        o->lanes = lanes_ok && !(lanes && !strcmp(lanes, "0"));
        unsigned nb = o->lanes ? 2 * o->threads : o->threads + 4;
        nb = nb < KL_FILL_MAX_SLOTS ? nb : KL_FILL_MAX_SLOTS;
        o->windows = env_count("KL_GPU_LOAD_BUFFERS", KL_FILL_MAX_SLOTS, nb);
        o->window_bytes = o->window_bytes ? o->window_bytes : (size_t)(o->lanes ? 4 : 16) << 20;
        o->cached_copy = cached ? !strcmp(cached, "1")
                                : o->lanes && o->window_bytes <= (size_t)8 << 20;
        o->direct = how && !strcmp(how, "ring-direct") ? KL_DIRECT_ON : KL_DIRECT_OFF;
        o->from_mapping = !how || !strcmp(how, "ring");
        return o->direct == KL_DIRECT_ON ? "ring-direct" : o->from_mapping ? "ring" : "ring-read";
    }
    /* mapped: 4 threads page-lock windows ahead of the copies unless told (the fastest mapped
     * case of test_load on the H200 machine, docs/PERFORMANCE.md); windows: 2 per thread */
    o->threads = env_count("KL_GPU_LOAD_THREADS", KL_FILL_MAX_WINDOWS, 4);
    o->windows = 2 * o->threads < KL_FILL_MAX_WINDOWS ? 2 * o->threads : KL_FILL_MAX_WINDOWS;
    if (how && !strcmp(how, "read")) {
        o->mode = KL_FILL_READ;
        o->direct = KL_DIRECT_OFF;
        return "read";
    }
    if (how && !strcmp(how, "direct")) {
        o->mode = KL_FILL_READ;
        o->direct = KL_DIRECT_AUTO;
        return "direct";
    }
    return "mapped";
}

/* ------------------------------------------------------------------------------------------ */
/* Loading ahead (kl_backend_gpu_prepare): the device, its stream and events and the ring's    */
/* pinned buffers, made on a thread of their own while the caller opens the model              */

kl_gpu_prep *kl_gpu_prep_new(void)
{
    kl_gpu_prep *pr = kl_calloc(1, sizeof *pr);
    if (!pr)
        return NULL;
    const char *how = getenv("KL_GPU_LOAD");
    pr->hybrid = how && !strcmp(how, "hybrid");
    const int staged = kl_gpu_load_staged();   /* lanes stage their spans */
    pr->how = pr->hybrid ? "hybrid" : kl_gpu_load_options(how, staged, &pr->o);
    if (pr->hybrid) {   /* the ring's settings as set, the mapped part's own */
        kl_gpu_load_options("ring", staged, &pr->o);
        kl_gpu_load_options("mapped", 0, &pr->mo);
        pr->mo.threads = env_count("KL_GPU_LOAD_MAPPED_THREADS", KL_FILL_MAX_WINDOWS, 4);
        pr->mo.windows = 2 * pr->mo.threads < KL_FILL_MAX_WINDOWS ? 2 * pr->mo.threads
                                                                  : KL_FILL_MAX_WINDOWS;
        pr->mo.window_bytes = 0;
        pr->share = env_count("KL_GPU_LOAD_MAPPED_PERCENT", 100, 35) / 100.0;
    }
    const char *ov = getenv("KL_GPU_LOAD_OVERLAP"), *huge = getenv("KL_GPU_LOAD_HUGE");
    pr->overlap = !(ov && !strcmp(ov, "0"));
    pr->huge = !(huge && !strcmp(huge, "0"));
    pr->want_buffers = pr->o.mode == KL_FILL_RING;
    pr->buf_mem = "";
    kl_err_clear(&pr->err);
    return pr;
}

/* The ring's region mapped with its pages made, on 2 MiB pages (no device call: it runs while
 * the device starts); region NULL when refused or $KL_GPU_LOAD_HUGE=0. */
typedef struct region_map {
    kl_gpu_prep *pr;
    void        *region;
    int          hugetlb;
} region_map;

static void *region_map_main(void *arg)
{
    region_map *rm = arg;
    const kl_gpu_prep *pr = rm->pr;
    kl_err ignored;
    if (pr->huge && kl_gpu_host_map(&rm->region, pr->o.windows * pr->o.window_bytes,
                                    &rm->hugetlb, &ignored))
        rm->region = NULL;
    return NULL;
}

/* The ring's buffers: the mapped region of rm registered, else (none, or refused) one
 * kl_gpu_host_alloc each; fewer than asked when pinned memory runs out after one. */
static int prep_buffers(kl_gpu_prep *pr, region_map *rm, kl_err *err)
{
    size_t bytes = pr->o.window_bytes, n = pr->o.windows;
    kl_err e;
    kl_err_clear(&e);
    if (rm->region && !kl_gpu_host_register_mapped(rm->region, n * bytes, &e)) {
        pr->region = rm->region;
        pr->region_bytes = n * bytes;
        for (pr->n_buf = 0; pr->n_buf < n; pr->n_buf++)
            pr->buf[pr->n_buf] = (uint8_t *)pr->region + pr->n_buf * bytes;
        pr->buf_mem = rm->hugetlb ? "hugetlb" : "thp";
        return 0;
    }
    kl_gpu_host_unmap(rm->region, n * bytes);
    pr->buf_mem = "pinned";
    while (pr->n_buf < n && !kl_gpu_host_alloc(&pr->buf[pr->n_buf], bytes, &e))
        pr->n_buf++;
    if (pr->n_buf)
        return 0;
    *err = e;
    return e.code;
}

/* Device 0 current, its stream and events (the ring's region mapped meanwhile), then the
 * ring's buffers; each step timed. */
static void *prep_run(void *arg)
{
    kl_gpu_prep *pr = arg;
    double t0 = kl_now_s();
    region_map rm = {.pr = pr};
    pthread_t mapper;
    int mapping = pr->want_buffers && pthread_create(&mapper, NULL, region_map_main, &rm) == 0;
    int rc = kl_gpu_device_open(pr->dev, NULL, 0, &pr->err);
    if (!rc)
        rc = kl_gpu_stream_create(&pr->st, &pr->err);
    for (unsigned i = 0; !rc && i < 2 * KL_FILL_MAX_SLOTS; i++)
        rc = kl_gpu_event_create(&pr->ev[i], &pr->err);
    if (mapping)
        pthread_join(mapper, NULL);
    else if (pr->want_buffers)
        region_map_main(&rm);
    double t1 = kl_now_s();
    if (!rc && pr->want_buffers)
        rc = prep_buffers(pr, &rm, &pr->err);
    else
        kl_gpu_host_unmap(rm.region, pr->o.windows * pr->o.window_bytes);
    pr->device_s = t1 - t0;
    pr->buffers_s = kl_now_s() - t1;
    pr->rc = rc;
    return NULL;
}

/* What was prepared, ready on this thread (the thread joined, or the work done here now); its
 * times into li. */
int kl_gpu_prep_take(kl_gpu_prep *pr, kl_gpu_load_info *li, kl_err *err)
{
    double t0 = kl_now_s();
    if (pr->started)
        pthread_join(pr->th, NULL);
    else
        prep_run(pr);
    li->wait_s = pr->started ? kl_now_s() - t0 : 0;
    li->overlapped = pr->started;
    pr->started = 0;
    li->device_s = pr->device_s;
    li->buffers_s = pr->buffers_s;
    if (pr->rc) {
        if (err)
            *err = pr->err;
        return pr->rc;
    }
    return kl_gpu_device_open(pr->dev, NULL, 0, err);   /* current on this thread too */
}

/* One kl_gpu_fill of part of the plan with its own events, on the backend's stream (both
 * parts of a hybrid load copy there: a stream takes work from several threads). */
typedef struct fill_job {
    const kl_gpu_plan *p;
    uint8_t          **arena;
    kl_fill_opts       o;
    gpu_fill           f;
    kl_fill_stats      st;
    int                rc;
    kl_err             err;
} fill_job;

static void *fill_job_main(void *arg)
{
    fill_job *j = arg;
    const int staged = kl_gpu_load_staged();
    kl_fill_ops ops = {&j->f,          fill_copy,      fill_pin,
                       fill_unpin,     fill_mark,      fill_wait,
                       fill_host_alloc, fill_host_free, fill_copy_rows,
                       staged ? fill_places : NULL, staged ? fill_stage_span : NULL,
                       staged ? fill_lanes : NULL,  staged ? fill_stage_on : NULL};
    kl_err_clear(&j->err);
    j->rc = kl_gpu_device_open(j->f.dev, NULL, 0, &j->err);   /* current on this thread */
    if (!j->rc)
        j->rc = kl_gpu_fill(j->p, j->f.shards, j->arena, &ops, &j->o, &j->st, &j->err);
    j->rc = fill_stage_end(&j->f, j->rc, &j->err);
    return NULL;
}

/* The jobs of the fill: the whole plan as pr says, or (hybrid) its first part through the
 * ring and the rest through mapped windows, the second on a thread of its own. */
static int run_fill_jobs(fill_job *job, const kl_gpu_plan *p, const kl_gpu_prep *pr,
                         kl_err *err)
{
    int two = pr->hybrid && p->n_file;
    kl_gpu_plan part[2] = {*p};
    if (two)
        kl_gpu_plan_split(p, pr->share, &part[0], &part[1]);
    job[0].p = &part[0];
    job[1].p = &part[1];
    pthread_t th;
    int started = two && pthread_create(&th, NULL, fill_job_main, &job[1]) == 0;
    fill_job_main(&job[0]);
    if (two && !started)
        fill_job_main(&job[1]);
    if (started)
        pthread_join(th, NULL);
    for (int i = 0; i < 1 + two; i++)
        if (job[i].rc) {
            if (err)
                *err = job[i].err;
            return job[i].rc;
        }
    return 0;
}

/* A fill's figures into li: the fill a (the ring's threads' times), and b run beside it (a
 * hybrid load's mapped part; zeros when none) counted in the bytes and windows. */
void kl_gpu_load_note(kl_gpu_load_info *li, const kl_fill_stats *a, const kl_fill_stats *b,
                      const kl_fill_opts *o)
{
    li->bytes = a->bytes + b->bytes;
    li->read_bytes = a->read_bytes + b->read_bytes;
    li->windows = a->windows + b->windows;
    li->pinned = a->pinned + b->pinned;
    li->staged = a->staged + b->staged;
    li->lanes = a->lanes;
    li->threads = a->lanes ? a->lanes : o->threads;   /* lanes: as many as the buffers allow */
    li->buffers = o->mode == KL_FILL_RING ? o->windows : 0;
    li->buffer_bytes = o->window_bytes;
    li->fill_read_s = a->read_s;
    li->fill_wait_s = a->wait_s;
    li->fill_idle_s = a->idle_s;
    li->fill_issue_s = a->issue_s;
}

/* The fill with what was prepared (pr: the stream's events, the ring's buffers). */
int kl_gpu_load_fill(kl_gpu_stream st, int dev, const char *const *shards, const kl_gpu_plan *p,
                     uint8_t **arena, const kl_gpu_prep *pr, kl_gpu_load_info *li, kl_err *err)
{
    const gpu_fill f = {.st = st, .dev = dev, .shards = shards};
    fill_job job[2] = {{.arena = arena, .o = pr->o, .f = f},
                       {.arena = arena, .o = pr->mo, .f = f}};
    job[0].o.buffers = pr->n_buf ? pr->buf : NULL;
    job[0].o.windows = pr->n_buf ? pr->n_buf : job[0].o.windows;
    memcpy(job[0].f.ev, pr->ev, sizeof job[0].f.ev);
    memcpy(job[1].f.ev, pr->ev + KL_FILL_MAX_SLOTS, sizeof job[1].f.ev);
    int rc = run_fill_jobs(job, p, pr, err);
    if (!rc)
        rc = kl_gpu_stream_sync(st, err);
    kl_gpu_load_note(li, &job[0].st, &job[1].st, &job[0].o);
    li->how = p->n_file ? pr->how : "host";
    li->buffer_mem = pr->buf_mem;
    return rc;
}

void kl_gpu_load_host_ops(kl_fill_ops *ops)
{
    ops->pin = fill_pin;
    ops->unpin = fill_unpin;
    ops->host_alloc = fill_host_alloc;
    ops->host_free = fill_host_free;
}

void kl_gpu_prep_start(kl_gpu_prep *pr)
{
    pr->started = pr->overlap && pthread_create(&pr->th, NULL, prep_run, pr) == 0;
}

void kl_gpu_prep_free(kl_gpu_prep *pr)
{
    if (!pr)
        return;
    if (pr->started)
        pthread_join(pr->th, NULL);
    if (pr->region)
        kl_gpu_host_free_mapped(pr->region, pr->region_bytes);
    for (unsigned i = 0; !pr->region && i < pr->n_buf; i++)
        kl_gpu_host_free(pr->buf[i]);
    for (unsigned i = 0; i < 2 * KL_FILL_MAX_SLOTS; i++)
        kl_gpu_event_destroy(pr->ev[i]);
    kl_gpu_stream_destroy(pr->st);
    kl_free(pr);
}

#endif /* KL_GPU */
