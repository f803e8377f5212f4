/*
 * convert/write_behind.h — a bounded write-behind queue in front of shard writers, drained by
 * several writer lanes.
 *
 * The converter's thread reads, quantizes and produces output bytes; handing them to pwrite
 * itself would stall it whenever the kernel throttles dirty pages or sync_file_range waits for
 * a busy device queue, and the source reads it keeps in flight would dry up meanwhile.  With
 * this queue the producer fills a buffer reserved in the queue (kl_wb_reserve: the quantizer
 * writes its codes straight into it) or has bytes copied into one (kl_wb_write), and `lanes`
 * writer threads do the pwrites (kl_st_writer_pwrite, early writeback as configured on the
 * writer).  Before writing an item a lane passes its bytes to the target's hook (the converter
 * hashes them for its journal): hashing and the page-cache copy of one thread run at about
 * 1 GB/s together, less than a disk or tmpfs takes, hence several lanes.
 *
 * Order: the producer names the lane of every item, and a lane handles its items in commit
 * order; items of different lanes are written in any order.  So bytes whose hook needs them
 * in order (the converter: one digest leaf) must all go to one lane; kl_wb_pick_lane names
 * the least busy one for the producer's next run of such bytes.
 * Memory: one arena of `cap_bytes`, used as a ring, holds the items reserved, waiting and being
 * written; the producer blocks only when the next one does not fit, and one larger than the
 * arena waits for an empty queue and gets a block of its own (so the producer may hold at
 * most one reservation at a time).
 *
 * Errors: the first hook or write error is kept and returned by every later kl_wb_reserve /
 * kl_wb_write and by kl_wb_drain (with its kl_err: file, offset); no item is started after it
 * (one another lane is already writing finishes; the converter then removes the file).
 * Ownership: the queue owns its buffers; targets, writers and hook contexts are borrowed and
 * must outlive their items (kl_wb_drain before closing a writer).
 * Thread safety: one producer thread calls everything but the hook, which runs on the lanes
 * (concurrently for items of different lanes).
 */
#ifndef KL_CONVERT_WRITE_BEHIND_H
#define KL_CONVERT_WRITE_BEHIND_H

#include "common/err.h"
#include "convert/st_writer.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kl_wb kl_wb;
typedef struct kl_wb_item kl_wb_item;

/* Sees n bytes of tensor `tensor` at byte `off` just before they are written; non-zero (a
 * KL_E_* code, with err filled) fails the queue. */
typedef int (*kl_wb_hook)(void *ctx, size_t tensor, uint64_t off, const uint8_t *data,
                          size_t n, kl_err *err);

/* Where items go: a shard writer and an optional hook.  Without a writer an item only goes
 * through the hook (the converter hashes the source bytes it reads on the lanes so). */
typedef struct kl_wb_target {
    kl_st_writer *w;     /* may be NULL */
    kl_wb_hook    hook;  /* may be NULL */
    void         *ctx;
} kl_wb_target;

/* One write of an item: n bytes at byte `off` inside tensor `tensor`. */
typedef struct kl_wb_seg {
    size_t   tensor;
    uint64_t off;
    size_t   n;
} kl_wb_seg;

#define KL_WB_MAX_SEGS 2u
#define KL_WB_MAX_LANES 16u

/* cap_bytes: the queue's buffer memory (see Memory), at least 1 MiB; lanes: writer threads,
 * 1..KL_WB_MAX_LANES. */
int  kl_wb_create(kl_wb **out, size_t cap_bytes, unsigned lanes, kl_err *err);
/* Stops the lanes after they finished what is queued; NULL ok. */
void kl_wb_destroy(kl_wb *q);

/* The lane with the fewest bytes waiting. */
unsigned kl_wb_pick_lane(kl_wb *q);

/* Reserves one buffer on `lane` for segs[0..n_segs) (1..KL_WB_MAX_SEGS), their bytes back to
 * back, and sets *data to it; blocks while the queue is full.  0 or the queue's first error.
 * The reservation must end in kl_wb_commit or kl_wb_cancel before the next one. */
int  kl_wb_reserve(kl_wb *q, const kl_wb_target *t, unsigned lane, const kl_wb_seg *segs,
                   unsigned n_segs, kl_wb_item **it, uint8_t **data, kl_err *err);
/* Hands a filled reservation to its lane. */
void kl_wb_commit(kl_wb *q, kl_wb_item *it);
/* Releases a reservation unwritten. */
void kl_wb_cancel(kl_wb *q, kl_wb_item *it);

/* Queues a copy of buf as one segment (reserve, copy, commit).  0 or the first error. */
int  kl_wb_write(kl_wb *q, const kl_wb_target *t, unsigned lane, size_t tensor, uint64_t off,
                 const void *buf, size_t n, kl_err *err);
/* Waits until every committed item is done; 0 or the first error.  The queue stays usable
 * when it returns 0. */
int  kl_wb_drain(kl_wb *q, kl_err *err);
/* Seconds the producer spent blocked on a full queue, since creation. */
double kl_wb_wait_s(const kl_wb *q);

#endif
