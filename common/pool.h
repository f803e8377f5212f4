/*
 * common/pool.h — a fixed team of worker threads for data-parallel loops.
 *
 * kl_pool_run(p, n, fn, ctx) calls fn(ctx, i) once for every i in [0, n), spread over the
 * pool's threads and the calling thread, and returns when all calls have finished.  Items are
 * handed out one at a time from an atomic counter, so uneven items balance themselves; the
 * caller waits for the items only, not for every worker to wake (a worker descheduled by
 * other threads of the process, e.g. a server's connections, delays nothing it has not
 * claimed).
 * One kl_pool_run at a time per pool (the pool is not re-entrant); fn must be thread-safe.
 */
#ifndef KL_COMMON_POOL_H
#define KL_COMMON_POOL_H

#include "common/err.h"

#include <stddef.h>

typedef struct kl_pool kl_pool;

/* threads = total parallelism including the caller (1 = run everything in the caller). */
int  kl_pool_create(kl_pool **out, unsigned threads, kl_err *err);
void kl_pool_destroy(kl_pool *p); /* NULL ok */
void kl_pool_run(kl_pool *p, size_t n, void (*fn)(void *ctx, size_t i), void *ctx);
unsigned kl_pool_threads(const kl_pool *p);

#endif
