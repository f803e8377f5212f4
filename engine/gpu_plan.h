/*
 * engine/gpu_plan.h — where every weight of a model goes on the GPU, and the fill that puts
 * it there straight from the checkpoint (no GPU call in here: sizes, offsets and a copy
 * through a function table, so make test runs the whole fill on the CPU).
 *
 * Plan: one arena per layer plus a global one (index n_layers: embed, lm_head, final norm),
 * laid out by loader/arena.h (the layout the memory plan of `kl audit` sizes with); vectors
 * are copied from the host model's fp32 vec[] (engine/model.h).  An arena's base is what the
 * caller allocated (256-byte aligned at least).
 *
 * Pieces: each schema tensor's bytes (or a host vector) and where they go: file pieces come
 * first, ordered by (shard, file offset), then host pieces (vectors; every tensor when the host
 * model read its matrices: KL_GPU_LOAD=host).  Pieces never overlap in an arena.  A file piece
 * with a pitch (a tensor-parallel column cut: part of every row) spans its rows in the file,
 * and the fill packs its rows' parts together in the arena.
 *
 * Fill: host pieces are copied from host memory.  File pieces, mode MAPPED: each shard is
 * mapped a window at a time (read-only, MAP_SHARED, window_bytes), the window is pinned through
 * ops->pin when it accepts (else copies are plain), every piece part in it is copied, then
 * ops->mark(slot); before a window slot is reused (windows in flight) ops->wait(slot), then
 * unpin and unmap: host memory stays bounded by windows * window_bytes.  With threads, the
 * mapping, pin, wait and unpin run on those threads (pin, unpin and wait must then be safe to
 * call from another thread than copy and mark, concurrently with them); copies and marks stay
 * on the calling thread, in file order.  Mode RING: a ring of host buffers (ops->host_alloc,
 * allocated once per fill and freed with ops->host_free; plain aligned memory when host_alloc
 * is NULL) filled by load threads with pread (O_DIRECT when direct is ON) or, from_mapping,
 * out of the shards mapped read-only, each buffer holding one span of a shard (the windows as
 * above, buffer-sized, 4 KiB aligned); the calling thread copies every filled buffer's piece
 * parts (pinned when host_alloc is given; or stages the span whole: ops->places, ops->stage)
 * and marks the buffer's slot; a load thread waits for that slot (ops->wait, from its thread)
 * before it fills the buffer again.  Spans are read in file order and copied as they are filled.
 * RING with lanes (staged, ops->lanes and ops->stage_on): each load thread owns two buffers
 * and a lane, and stages each span it fills itself at once (no copying thread between), so
 * the device reads a buffer while its bytes may still be in the CPU's caches.
 * On an error every thread is joined and every marked buffer waited for.  Mode READ: the staged
 * reader (loader/reader.h, direct as given) delivers file order chunks copied plainly (the copy
 * must have consumed its source when it returns, as a pageable cudaMemcpyAsync has).
 * Errors: KL_E_IO / KL_E_FORMAT (opening or mapping a shard, the reader's), those of ops,
 * KL_E_NOMEM; KL_E_BUG when the model's tensors disagree with the plan.  On an error every
 * window has been waited for, unpinned and unmapped.
 */
#ifndef KL_ENGINE_GPU_PLAN_H
#define KL_ENGINE_GPU_PLAN_H

#include "common/err.h"
#include "engine/model.h"
#include "kernels/place.h" /* kl_gpu_place: where a piece part of a staged span goes */
#include "loader/arena.h" /* kl_plan_mat, kl_plan_layer, KL_PLAN_ALIGN, fusion groups */
#include "loader/reader.h"

#include <stddef.h>
#include <stdint.h>

#define KL_PLAN_HOST  UINT32_MAX        /* a piece's shard: its source is in host memory */

typedef struct kl_plan_piece {
    uint32_t    arena;
    uint64_t    dst;                    /* offset in the arena */
    uint32_t    shard;                  /* KL_PLAN_HOST: from host */
    uint64_t    src;                    /* file offset in the shard */
    const void *host;                   /* host source (shard KL_PLAN_HOST) */
    uint64_t    bytes;                  /* what the arena receives */
    uint64_t    pitch, width;           /* 0: contiguous; else a file piece of bytes / width
                                           rows of width bytes, pitch bytes apart from src */
} kl_plan_piece;

/* The end of a file piece's bytes in its file: src + bytes, or past its last row when it has a
 * pitch (what a fill reads of it). */
uint64_t kl_plan_piece_end(const kl_plan_piece *pc);

typedef struct kl_gpu_plan {
    uint32_t       n_arenas;            /* layers + 1 */
    uint64_t      *arena_bytes;         /* [n_arenas] */
    kl_plan_layer *layer;               /* [n_arenas - 1] */
    kl_plan_mat    embed, lm_head;      /* global arena (lm_head = embed when tied) */
    uint64_t       final_norm;          /* global arena, fp32 [hidden] */
    size_t         n_pieces, n_file;    /* pieces; the first n_file are file pieces */
    kl_plan_piece *pieces;
    uint64_t       total_bytes;         /* sum of arena_bytes */
    uint64_t       file_bytes;          /* bytes of the file pieces */
} kl_gpu_plan;

/* The plan of m (opened either way, engine/model.h).  Free with kl_gpu_plan_free. */
int  kl_gpu_plan_build(kl_gpu_plan *p, const kl_model *m, kl_err *err);
void kl_gpu_plan_free(kl_gpu_plan *p);          /* zeroed; a zeroed plan ok */

/* One plan of n plans (tensor-parallel ranks' of one checkpoint) for one fill that reads the
 * files once: plan r's arenas become arenas [a_r, a_r + n_arenas) of out (a_r: the arenas of
 * the plans before it), their file pieces merged in file order (pieces of several ranks may
 * share file bytes: a whole tensor each rank holds, the rows of a column cut), then their host
 * pieces.  out has pieces and arena sizes only (no layer layout): for kl_gpu_fill (mapped
 * windows or the ring; the staged reader refuses pieces that share bytes).  Free with
 * kl_gpu_plan_free. */
int  kl_gpu_plan_merge(const kl_gpu_plan *plans, unsigned n, kl_gpu_plan *out, kl_err *err);

/* Two views of p for two fills that run at once (a ring and mapped windows): first takes
 * whole file pieces from the start while they total at most (1 - share) of p's file bytes
 * (share clamped to 0..1), second the other file pieces and every host piece.  The views
 * borrow p's arrays: never kl_gpu_plan_free them.  Together they fill what p fills. */
void kl_gpu_plan_split(const kl_gpu_plan *p, double share, kl_gpu_plan *first,
                       kl_gpu_plan *second);

/* What the fill does with bytes: see the header comment.  pin and unpin may be NULL (never
 * pinned); mark and wait may be NULL (copies complete when copy returns); host_alloc and
 * host_free may be NULL (RING buffers then plain memory, copied unpinned).  Slots passed to
 * mark and wait are below KL_FILL_MAX_SLOTS. */
typedef struct kl_fill_ops {
    void *ctx;
    int  (*copy)(void *ctx, void *dst, const void *src, size_t bytes, int pinned, kl_err *err);
    int  (*pin)(void *ctx, void *p, size_t bytes);    /* 0: pinned; else copy plainly */
    void (*unpin)(void *ctx, void *p);
    int  (*mark)(void *ctx, unsigned slot, kl_err *err);
    int  (*wait)(void *ctx, unsigned slot, kl_err *err);
    int  (*host_alloc)(void *ctx, void **p, size_t bytes, kl_err *err);  /* RING: pinned */
    void (*host_free)(void *ctx, void *p);
    /* rows of width bytes, pitch apart at src, packed at dst; NULL: a copy per row */
    int  (*copy_rows)(void *ctx, void *dst, const void *src, size_t width, size_t pitch,
                      size_t rows, int pinned, kl_err *err);
    /* RING with pinned buffers, both or neither (NULL: a copy per piece part): each span
     * staged whole on the device.  places(ctx, all, n, most) once before any read, with the
     * places of every span in span order (offsets within the span; the array is the fill's,
     * valid during the call) and the longest span's bytes (KL_E_NOMEM: no device memory for
     * the staging, the fill goes on a copy a piece part); then, instead of a filled buffer's
     * copies, stage(ctx, src, len, first, count): its len bytes copied to the device in one
     * copy, then places [first, first + count) filled from there.  The buffer's mark follows
     * (its wait then means the buffer may be refilled; the places may still be running:
     * the caller makes the fill's end wait for them). */
    int  (*places)(void *ctx, const kl_gpu_place *all, size_t n, size_t most, kl_err *err);
    int  (*stage)(void *ctx, const void *src, size_t len, size_t first, size_t count,
                  kl_err *err);
    /* RING staged with lanes, both or neither (NULL: no lanes): lanes(ctx, n) once after
     * places, for n load threads (KL_E_NOMEM: no room, the fill goes on without lanes); then
     * stage_on(ctx, lane, slot, ...) from lane's own thread (lane < n, one thread a lane,
     * lanes concurrently): as stage, on the lane's own copies, with slot's mark recorded
     * after the span's copy (no mark call follows). */
    int  (*lanes)(void *ctx, unsigned n, kl_err *err);
    int  (*stage_on)(void *ctx, unsigned lane, unsigned slot, const void *src, size_t len,
                     size_t first, size_t count, kl_err *err);
} kl_fill_ops;

typedef enum kl_fill_mode { KL_FILL_MAPPED = 0, KL_FILL_READ, KL_FILL_RING } kl_fill_mode;

#define KL_FILL_MAX_WINDOWS 8u          /* MAPPED: windows in flight and load threads */
#define KL_FILL_MAX_SLOTS   32u         /* slots mark and wait see (RING: buffers, threads) */

typedef struct kl_fill_opts {
    kl_fill_mode   mode;
    size_t         window_bytes;        /* MAPPED: 0 = 256 MiB; rounded up to pages;
                                           RING: a buffer, 0 = 16 MiB; rounded up to 4 KiB */
    unsigned       windows;             /* MAPPED: in flight, 0 = 3, at most 8; RING:
                                           buffers, 0 = threads + 4, at most 32 */
    unsigned       threads;             /* MAPPED: 0: the calling thread maps and pins each
                                           window; N (<= 8): N threads map, pin, wait for
                                           and unpin windows ahead of the copies; RING:
                                           reader threads, 0 = 8, at most 32 */
    kl_direct_mode direct;              /* READ: O_DIRECT choice; RING: O_DIRECT only when
                                           ON (buffered where open refuses it, e.g. tmpfs),
                                           else through the page cache */
    void *const   *buffers;             /* RING: NULL, or the caller's windows buffers of
                                           window_bytes each (a multiple of 4 KiB, 4 KiB
                                           aligned), pinned: used instead of host_alloc and
                                           left to the caller, every copy from them waited
                                           for when the fill returns */
    int            from_mapping;        /* RING without O_DIRECT: each shard mapped read-only
                                           and each span copied out of the mapping by
                                           kl_copy_streaming (then its page-table entries
                                           dropped: the pages stay cached, host RSS grows only
                                           by the spans in flight), not read with pread (still where a file
                                           system refuses the mapping).  The shards must not
                                           shrink during the fill (a mapping read past a
                                           file's end faults) */
    int            lanes;               /* RING staged: each thread copies its own two
                                           buffers on a lane (ops->lanes; the buffers then
                                           2 a thread: threads lowered to fit windows) */
    int            cached_copy;         /* RING from_mapping: memcpy into the buffers (their
                                           lines stay in the CPU's caches: for buffers of a
                                           few MiB copied at once, lanes) instead of
                                           streaming stores */
} kl_fill_opts;

typedef struct kl_fill_stats {
    uint64_t bytes;                     /* copied, host pieces included */
    uint64_t read_bytes;                /* of the files: the windows' or ring spans' lengths
                                           (READ: the pieces' spans in the files) */
    uint64_t windows, pinned;           /* MAPPED: windows mapped, of them pinned; RING:
                                           buffers filled, of them copied pinned */
    uint64_t staged;                    /* RING: of the buffers, staged on the device whole
                                           (ops->stage or ops->stage_on) */
    unsigned lanes;                     /* RING: lanes the fill ran on (0: none) */
    /* RING, where the time went (seconds; the load threads' summed over them): reads
     * bound the fill when the copying thread idles, the copies when the threads wait */
    double   read_s;                    /* load threads reading spans */
    double   wait_s;                    /* load threads waiting for a buffer's copies */
    double   idle_s;                    /* the copying thread waiting for a filled buffer */
    double   issue_s;                   /* the copying thread issuing copies and marks */
} kl_fill_stats;

/* Fills arena[0 .. p->n_arenas) with p's pieces; shard_paths[i] is shard i (m->shard_paths).
 * opts and stats may be NULL. */
int kl_gpu_fill(const kl_gpu_plan *p, const char *const *shard_paths, uint8_t *const *arena,
                const kl_fill_ops *ops, const kl_fill_opts *opts, kl_fill_stats *stats,
                kl_err *err);

#endif
