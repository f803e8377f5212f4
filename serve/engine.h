/*
 * serve/engine.h — the server's engine thread: one thread owns the model's backend and drives
 * the continuous-batching scheduler (serve/sched.h); HTTP handler threads hand it jobs and read
 * each job's ids back through the job's own channel (a queue under the engine's mutex, with a
 * condition variable per job).
 *
 * A job is a prompt of ids with its sampling options, limit and stop ids.  kl_engine_submit
 * refuses it (KL_E_UNSUPPORTED, *busy = 2: the server answers 503) while the engine is
 * stopping, and (KL_E_UNSUPPORTED, *busy = 1: 429) when max_seqs + max_queue jobs are already
 * in.  The reader takes ids with kl_job_wait until the job is over; kl_job_release hands the
 * job back: a job still running is cancelled (a client that disconnects frees its slot at the
 * engine thread's next turn, between two steps).
 *
 * State reuse: the engine keeps a prefix cache (serve/prefix.h) of cache_bytes over the
 * backend's slots left after max_seqs; a job starts from its longest entry (kl_job_cached says
 * how many prompt ids it reused) and its prompt's state joins the cache before its first id.
 * Per-token logprobs: the scheduler's logits row when a job asks.
 *
 * Counters for /metrics: kl_engine_stats.  Thread safety: every function may be called from any
 * thread, except kl_engine_free (once, after the HTTP side is gone).
 */
#ifndef KL_SERVE_ENGINE_H
#define KL_SERVE_ENGINE_H

#include "common/err.h"
#include "engine/model.h"
#include "serve/sched.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kl_engine kl_engine;
typedef struct kl_job kl_job;

/* What a job asks for (everything copied at submit). */
typedef struct kl_job_spec {
    const kl_token  *prompt;
    size_t           n_prompt;
    size_t           max_tokens;   /* >= 1 */
    kl_sampler_opts  samp;
    const kl_token  *stop_ids;
    size_t           n_stop_ids;
    int              logprobs;     /* 1: a kl_job_lp per id */
    uint32_t         top_logprobs; /* 0..KL_JOB_MAX_TOP alternatives each */
    const kl_token  *head_ids;     /* a forced choice of the reply's first ids (serve/sched.h's
                                      kl_sched_req): n_heads sequences, head_off [n_heads + 1] */
    const size_t    *head_off;
    size_t           n_heads;
} kl_job_spec;

/* The log-probabilities of one generated id under the model's distribution (log-softmax of the
 * raw logits, before temperature and filters), with the most likely ids. */
#define KL_JOB_MAX_TOP 20
typedef struct kl_job_lp {
    float    logprob;
    uint32_t n_top;
    kl_token top[KL_JOB_MAX_TOP];      /* most likely first (ties: the lower id) */
    float    top_lp[KL_JOB_MAX_TOP];
} kl_job_lp;

/* A job's end, once it is over. */
typedef struct kl_job_end {
    kl_sched_end why;
    size_t       n_generated;
    kl_err       err;          /* set for KL_SCHED_ERROR */
} kl_job_end;

/* Histogram bucket upper bounds (seconds) of the latency histograms. */
#define KL_ENGINE_N_BUCKETS 10
extern const double kl_engine_buckets[KL_ENGINE_N_BUCKETS];

typedef struct kl_engine_stats {
    uint64_t requests, refused_busy, tokens_in, tokens_out, steps, batch_tokens;
    uint32_t queued, running;      /* now */
    uint64_t ttft[KL_ENGINE_N_BUCKETS + 1], itl[KL_ENGINE_N_BUCKETS + 1]; /* last: +Inf */
    double   ttft_sum, itl_sum;
    uint64_t ttft_n, itl_n;
    uint64_t tokens_cached, cache_hits;   /* prompt ids reused; jobs that reused some */
    size_t   cache_entries, cache_bytes;  /* held now (as of the last step) */
} kl_engine_stats;

/* Starts the engine thread over m (its backend: CPU or GPU): at most max_seqs sequences at once
 * and max_queue more waiting; a prefix cache of up to cache_bytes (0: none). */
int  kl_engine_start(kl_engine **out, kl_model *m, uint32_t max_seqs, size_t max_queue,
                     size_t cache_bytes, kl_err *err);
/* Queues a job; *job is the caller's until kl_job_release.  *busy (may be NULL) is set to 1
 * when refused because the queue is full, 2 when the engine is stopping. */
int  kl_engine_submit(kl_engine *e, const kl_job_spec *spec, kl_job **job, int *busy,
                      kl_err *err);
/* Waits up to timeout_ms (< 0: no limit) for ids: copies up to cap of the ids not read yet into
 * ids (and their kl_job_lp into lps when the job has them and lps is not NULL) and returns how
 * many; *end (may be NULL) is filled and *over set to 1 once the job is over and every id was
 * read. */
size_t kl_job_wait(kl_job *j, kl_token *ids, kl_job_lp *lps, size_t cap, int timeout_ms,
                   int *over, kl_job_end *end);
/* Prompt ids the job took from the prefix cache (0 until it is admitted, or without a hit). */
size_t kl_job_cached(kl_job *j);
/* Ends the job at the engine's next turn (kl_job_wait then reports KL_SCHED_CANCELLED). */
void kl_job_cancel(kl_job *j);
/* Hands the job back (cancelled if still running); j is gone after. NULL ok. */
void kl_job_release(kl_job *j);
/* Jobs queued or running. */
size_t kl_engine_active(kl_engine *e);
/* A copy of the counters. */
void kl_engine_get_stats(kl_engine *e, kl_engine_stats *out);
/* New jobs are refused from now on; cancel 1 also ends every job in (their readers see
 * KL_SCHED_CANCELLED). */
void kl_engine_stop_accepting(kl_engine *e, int cancel);
/* Stops the thread (cancelling what is left) and frees the engine; every job must have been
 * released.  NULL ok. */
void kl_engine_free(kl_engine *e);

#endif
