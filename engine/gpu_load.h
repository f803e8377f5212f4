/*
 * engine/gpu_load.h — how the GPU backend's weights travel from the checkpoint's files to the
 * device (internal to engine/backend_gpu.c; GPU builds only): the device, its stream and the
 * ring's pinned buffers prepared on a thread of their own while the model opens (kl_gpu_prep),
 * then engine/gpu_plan.h's fill run with a function table on the backend's stream (copies,
 * page-locking, marks, each ring buffer staged on the device whole and placed there by
 * kernels/place.h), as one job or (KL_GPU_LOAD=hybrid) two.  The settings come from the
 * environment: engine/backend.h.
 */
#ifndef KL_ENGINE_GPU_LOAD_H
#define KL_ENGINE_GPU_LOAD_H

#include "engine/backend.h"
#include "engine/gpu_plan.h"
#include "kernels/runtime.h"

#include <pthread.h>

/* Loading ahead (kl_backend_gpu_prepare): the fill's settings, the device's stream and events
 * and the ring's pinned buffers. */
struct kl_gpu_prep {
    kl_fill_opts  o;                       /* how file bytes travel (kl_gpu_load_options) */
    kl_fill_opts  mo;                      /* hybrid: the mapped part's */
    double        share;                   /* hybrid: the mapped part's share of the bytes */
    int           hybrid;                  /* $KL_GPU_LOAD=hybrid: a ring and mapped windows
                                              at once, each on part of the files */
    const char   *how;
    int           overlap;                 /* $KL_GPU_LOAD_OVERLAP != 0: threads run ahead */
    int           huge;                    /* $KL_GPU_LOAD_HUGE != 0: one mapped 2 MiB region */
    int           want_buffers;            /* RING from the files: allocate the ring's buffers */
    int           defer_fill;              /* a rank: arenas allocated, not filled (the
                                              ranks' one fill does it) */
    kl_gpu_stream st;                      /* handed to the backend */
    kl_gpu_event  ev[2 * KL_FILL_MAX_SLOTS];   /* one per ring buffer or window slot; the
                                                  second half: hybrid's mapped part */
    void         *buf[KL_FILL_MAX_SLOTS];  /* RING: n_buf pinned buffers of o.window_bytes */
    unsigned      n_buf;
    void         *region;                  /* the mapped region holding them (NULL: each one
                                              from kl_gpu_host_alloc) */
    size_t        region_bytes;
    const char   *buf_mem;                 /* "hugetlb", "thp" (region) or "pinned" */
    pthread_t     th;
    int           dev;                     /* the device (0 unless a rank's) */
    int           started;                 /* th prepares */
    int           rc;
    kl_err        err;
    double        device_s, buffers_s;     /* the preparation's two steps */
};

/* A preparation with the environment's settings (NULL: out of memory), not started. */
kl_gpu_prep *kl_gpu_prep_new(void);
/* Starts its work on a thread of its own when overlap is on (else kl_gpu_prep_take does it). */
void kl_gpu_prep_start(kl_gpu_prep *pr);
/* What was prepared, ready on this thread (the thread joined, or the work done here now); the
 * times into li; the device current here too. */
int  kl_gpu_prep_take(kl_gpu_prep *pr, kl_gpu_load_info *li, kl_err *err);
/* Joins its thread and frees what it still holds (NULL ok). */
void kl_gpu_prep_free(kl_gpu_prep *pr);

/* How file bytes travel for how ($KL_GPU_LOAD but hybrid): the options, and the name the load
 * reports; lanes_ok: the fill's ops stage spans on lanes (kl_fill_ops.lanes). */
const char *kl_gpu_load_options(const char *how, int lanes_ok, kl_fill_opts *o);
/* Whether ring fills are staged on the device ($KL_GPU_LOAD_STAGE != 0). */
int  kl_gpu_load_staged(void);
/* Every piece of plan p into arena (one device allocation per arena) on stream st of device
 * dev from the files shards, with what pr prepared; the stream drained; the figures into li. */
int  kl_gpu_load_fill(kl_gpu_stream st, int dev, const char *const *shards, const kl_gpu_plan *p,
                      uint8_t **arena, const kl_gpu_prep *pr, kl_gpu_load_info *li, kl_err *err);
/* The host side of a fill's function table: page-locking windows, pinned ring buffers. */
void kl_gpu_load_host_ops(kl_fill_ops *ops);
/* A fill's figures into li: a (the ring's threads' times) and b run beside it (zeros: none). */
void kl_gpu_load_note(kl_gpu_load_info *li, const kl_fill_stats *a, const kl_fill_stats *b,
                      const kl_fill_opts *o);

#endif
