/*
 * convert/write_behind.h — a bounded write-behind queue in front of a shard writer.
 *
 * The converter's thread reads, quantizes and produces output bytes; handing them to pwrite
 * itself would stall it whenever the kernel throttles dirty pages or sync_file_range waits for
 * a busy device queue, and the source reads it keeps in flight would dry up meanwhile.  With
 * this queue the bytes are copied into a bounded FIFO and one writer thread does the pwrites
 * (kl_st_writer_pwrite, early writeback as configured on the writer) in order.  The producer
 * blocks only when `cap_bytes` are already waiting.
 *
 * Errors: the first write error is kept and returned by every later kl_wb_write and by
 * kl_wb_drain (with its kl_err: file, offset); nothing is written after it.
 * Ownership: the queue owns its copies; the writer is borrowed and must outlive the queue's use.
 * Thread safety: one producer thread; kl_wb_drain and kl_wb_destroy from that thread.
 */
#ifndef KL_CONVERT_WRITE_BEHIND_H
#define KL_CONVERT_WRITE_BEHIND_H

#include "common/err.h"
#include "convert/st_writer.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kl_wb kl_wb;

/* cap_bytes: bytes that may wait (the counted memory of the queue), at least 1 MiB. */
int  kl_wb_create(kl_wb **out, size_t cap_bytes, kl_err *err);
/* Stops the writer thread after it finished what is queued; NULL ok. */
void kl_wb_destroy(kl_wb *q);

/* Queues a copy of buf for kl_st_writer_pwrite(w, tensor, off, buf, n).  0 or the first error
 * of the queue. */
int kl_wb_write(kl_wb *q, kl_st_writer *w, size_t tensor, uint64_t off, const void *buf,
                size_t n, kl_err *err);
/* Waits until every queued write is done; 0 or the first error.  The queue stays usable when
 * it returns 0. */
int kl_wb_drain(kl_wb *q, kl_err *err);
/* Seconds the producer spent blocked on a full queue, since creation. */
double kl_wb_wait_s(const kl_wb *q);

#endif
