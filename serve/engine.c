/*
 * serve/engine.c — the engine thread (see engine.h).
 *
 * One mutex guards the engine and every job.  The thread loops: hand new jobs to the scheduler,
 * cancel released ones, free jobs that are both over and released, then run one step unlocked.
 * The scheduler's callbacks run on this thread: during a step they take the mutex; when the
 * thread calls the scheduler with the mutex held (submit, cancel, free) they must not, which
 * e->in_step tells them.
 */
#include "serve/engine.h"

#include "common/clock.h"
#include "common/grow.h"
#include "common/mem.h"
#include "serve/prefix.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

const double kl_engine_buckets[KL_ENGINE_N_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1,
                                                       0.25,  0.5,  1,     2.5,  10};

struct kl_job {
    kl_engine      *e;
    kl_job_spec     spec;          /* prompt and stop_ids point at the copies below */
    kl_token       *prompt, *stops, *heads;
    size_t         *head_off;
    kl_token       *ids;           /* generated so far */
    size_t          n_ids, cap_ids, n_read, cached;
    kl_job_lp      *lps;           /* spec.logprobs: [n_lps] (n_ids, or one ahead) */
    size_t          n_lps, cap_lps;
    int             submitted, over, released, cancel;
    uint64_t        handle;
    kl_job_end      end;
    double          t_submit, t_last;
    pthread_cond_t  cv;
    struct kl_job  *next;
};

struct kl_engine {
    pthread_mutex_t mu;
    pthread_cond_t  cv;            /* the engine thread waits here for work */
    pthread_t       th;
    int             quit, stopping, in_step;
    kl_sched       *s;
    kl_prefix      *cache;         /* engine thread only */
    uint32_t        max_seqs;
    size_t          max_queue, n_active;
    kl_job         *jobs;          /* every job not freed yet */
    kl_engine_stats st;
};

static void lock_cb(kl_engine *e)
{
    if (e->in_step)
        pthread_mutex_lock(&e->mu);
}

static void unlock_cb(kl_engine *e)
{
    if (e->in_step)
        pthread_mutex_unlock(&e->mu);
}

static void observe(uint64_t *h, double *sum, uint64_t *n, double v)
{
    size_t b = 0;
    while (b < KL_ENGINE_N_BUCKETS && v > kl_engine_buckets[b])
        b++;
    h[b]++;
    *sum += v;
    (*n)++;
}

/* Scheduler callback: a new id of j. */
static int on_token(void *user, kl_token id, kl_err *err)
{
    kl_job *j = user;
    kl_engine *e = j->e;
    lock_cb(e);
    int rc = 0;
    if (kl_grow(&j->ids, &j->cap_ids, j->n_ids + 1, sizeof *j->ids)) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory for a reply's ids");
    } else {
        double now = kl_now_s();
        if (!j->n_ids)
            observe(e->st.ttft, &e->st.ttft_sum, &e->st.ttft_n, now - j->t_submit);
        else
            observe(e->st.itl, &e->st.itl_sum, &e->st.itl_n, now - j->t_last);
        j->t_last = now;
        j->ids[j->n_ids++] = id;
        e->st.tokens_out++;
        pthread_cond_signal(&j->cv);
    }
    unlock_cb(e);
    return rc;
}

/* lp of id in the log-softmax of logits[0..V), with the top k ids. */
static void logprobs_of(const float *logits, size_t V, kl_token id, uint32_t k, kl_job_lp *lp)
{
    float mx = logits[0];
    for (size_t i = 1; i < V; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (size_t i = 0; i < V; i++)
        sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    lp->logprob = (float)(logits[id] - lse);
    lp->n_top = 0;
    for (size_t i = 0; i < V && k; i++) {      /* insertion into the sorted top k */
        uint32_t at = lp->n_top;
        while (at && logits[i] > logits[lp->top[at - 1]])
            at--;
        if (at >= k)
            continue;
        uint32_t last = lp->n_top < k ? lp->n_top : k - 1;
        memmove(lp->top + at + 1, lp->top + at, (last - at) * sizeof *lp->top);
        lp->top[at] = (kl_token)i;
        lp->n_top = last + 1;
    }
    for (uint32_t t = 0; t < lp->n_top; t++)
        lp->top_lp[t] = (float)(logits[lp->top[t]] - lse);
}

/* Scheduler callback: the logits row of j's next id (jobs that asked for logprobs). */
static int on_logits(void *user, const float *logits, size_t V, kl_token id, kl_err *err)
{
    kl_job *j = user;
    kl_job_lp lp;
    logprobs_of(logits, V, id, j->spec.top_logprobs, &lp);
    lock_cb(j->e);
    int rc = kl_grow(&j->lps, &j->cap_lps, j->n_lps + 1, sizeof *j->lps)
                 ? kl_fail(err, KL_E_NOMEM, "out of memory for a reply's logprobs") : 0;
    if (!rc)
        j->lps[j->n_lps++] = lp;
    unlock_cb(j->e);
    return rc;
}

/* Marks j over (mutex held or in a callback that takes it). */
static void job_over(kl_job *j, kl_sched_end why, size_t n, const kl_err *err)
{
    j->over = 1;
    j->end.why = why;
    j->end.n_generated = n;
    if (err)
        j->end.err = *err;
    j->e->n_active--;
    pthread_cond_signal(&j->cv);
}

static void on_cached(void *user, size_t n)
{
    kl_job *j = user;
    lock_cb(j->e);
    j->cached = n;
    j->e->st.tokens_cached += n;
    j->e->st.cache_hits++;
    unlock_cb(j->e);
}

static void on_done(void *user, kl_sched_end why, size_t n, const kl_err *err)
{
    kl_job *j = user;
    lock_cb(j->e);
    job_over(j, why, n, err);
    unlock_cb(j->e);
}

static void job_free(kl_job *j)
{
    pthread_cond_destroy(&j->cv);
    kl_free(j->prompt);
    kl_free(j->stops);
    kl_free(j->heads);
    kl_free(j->head_off);
    kl_free(j->ids);
    kl_free(j->lps);
    kl_free(j);
}

/* Hands j to the scheduler (mutex held). */
static void job_submit(kl_engine *e, kl_job *j)
{
    kl_sched_req r = {.prompt = j->spec.prompt, .n_prompt = j->spec.n_prompt,
                      .max_tokens = j->spec.max_tokens, .samp = j->spec.samp,
                      .stop_ids = j->spec.stop_ids, .n_stop_ids = j->spec.n_stop_ids,
                      .on_token = on_token, .on_done = on_done, .on_cached = on_cached,
                      .user = j,
                      .on_logits = j->spec.logprobs ? on_logits : NULL,
                      .head_ids = j->spec.head_ids, .head_off = j->spec.head_off,
                      .n_heads = j->spec.n_heads};
    kl_err err;
    kl_err_clear(&err);
    j->submitted = 1;
    if (kl_sched_submit(e->s, &r, &j->handle, &err))
        job_over(j, KL_SCHED_ERROR, 0, &err);
}

/* One pass over the jobs (mutex held): submit, cancel, free. */
static void tend(kl_engine *e)
{
    kl_job **pp = &e->jobs;
    while (*pp) {
        kl_job *j = *pp;
        if (!j->over && (j->released || j->cancel || e->quit)) {
            if (j->submitted)
                kl_sched_cancel(e->s, j->handle);
            else
                job_over(j, KL_SCHED_CANCELLED, 0, NULL);
        } else if (!j->submitted && !j->over) {
            job_submit(e, j);
        }
        if (j->over && j->released) {
            *pp = j->next;
            job_free(j);
        } else {
            pp = &j->next;
        }
    }
}

/* The cache's gauges into the counters (mutex held). */
static void cache_stats(kl_engine *e)
{
    kl_prefix_stats ps = {0};
    if (e->cache)
        kl_prefix_get_stats(e->cache, &ps);
    e->st.cache_entries = ps.entries;
    e->st.cache_bytes = ps.bytes;
}

static void *engine_main(void *arg)
{
    kl_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        tend(e);
        if (e->quit && !e->jobs)
            break;
        if (!kl_sched_pending(e->s)) {
            pthread_cond_wait(&e->cv, &e->mu);
            continue;
        }
        e->in_step = 1;
        pthread_mutex_unlock(&e->mu);
        size_t n = 0;
        kl_err err;
        kl_err_clear(&err);
        kl_sched_step(e->s, &n, &err);   /* a failed step ended its requests with the error */
        pthread_mutex_lock(&e->mu);
        e->in_step = 0;
        e->st.steps += n > 0;
        e->st.batch_tokens += n;
        cache_stats(e);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

int kl_engine_start(kl_engine **out, kl_model *m, uint32_t max_seqs, size_t max_queue,
                    size_t cache_bytes, kl_err *err)
{
    *out = NULL;
    kl_engine *e = kl_calloc(1, sizeof *e);
    if (!e)
        return kl_fail(err, KL_E_NOMEM, "out of memory for the engine");
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->max_seqs = max_seqs;
    e->max_queue = max_queue;
    size_t step = max_seqs > 256 ? max_seqs : 256;
    int rc = kl_sched_create(&e->s, m, max_seqs, step, err);
    if (!rc && cache_bytes && m->be->max_slots > max_seqs &&
        !(rc = kl_prefix_create(&e->cache, m, cache_bytes, m->be->max_slots - max_seqs, err)))
        kl_sched_set_prefix(e->s, e->cache);
    if (!rc && pthread_create(&e->th, NULL, engine_main, e))
        rc = kl_fail(err, KL_E_NOMEM, "cannot start the engine thread");
    if (rc) {
        kl_sched_free(e->s);
        kl_prefix_free(e->cache);
        pthread_cond_destroy(&e->cv);
        pthread_mutex_destroy(&e->mu);
        kl_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

/* A job holding copies of spec's arrays, or NULL. */
static kl_job *job_new(kl_engine *e, const kl_job_spec *spec)
{
    kl_job *j = kl_calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->e = e;
    j->spec = *spec;
    pthread_cond_init(&j->cv, NULL);
    size_t nh = spec->n_heads, n_head_ids = nh ? spec->head_off[nh] : 0;
    j->prompt = kl_memdup(spec->prompt, spec->n_prompt * sizeof *j->prompt);
    j->stops = kl_memdup(spec->stop_ids, spec->n_stop_ids * sizeof *j->stops);
    j->heads = kl_memdup(spec->head_ids, n_head_ids * sizeof *j->heads);
    j->head_off = kl_memdup(spec->head_off, (nh ? nh + 1 : 0) * sizeof *j->head_off);
    if (!j->prompt || !j->stops || !j->heads || !j->head_off) {
        job_free(j);
        return NULL;
    }
    j->spec.prompt = j->prompt;
    j->spec.stop_ids = j->stops;
    j->spec.head_ids = j->heads;
    j->spec.head_off = j->head_off;
    if (j->spec.top_logprobs > KL_JOB_MAX_TOP)
        j->spec.top_logprobs = KL_JOB_MAX_TOP;
    return j;
}

int kl_engine_submit(kl_engine *e, const kl_job_spec *spec, kl_job **job, int *busy,
                     kl_err *err)
{
    *job = NULL;
    if (busy)
        *busy = 0;
    kl_job *j = job_new(e, spec);
    if (!j)
        return kl_fail(err, KL_E_NOMEM, "out of memory for a request");
    pthread_mutex_lock(&e->mu);
    int why = e->stopping ? 2 : e->n_active >= e->max_seqs + e->max_queue ? 1 : 0;
    if (why) {
        e->st.refused_busy += why == 1;
        pthread_mutex_unlock(&e->mu);
        job_free(j);
        if (busy)
            *busy = why;
        return kl_fail(err, KL_E_UNSUPPORTED, why == 2 ? "the server is shutting down"
                       : "the queue is full (%zu requests); try again later",
                       e->max_seqs + e->max_queue);
    }
    j->t_submit = kl_now_s();
    j->next = e->jobs;
    e->jobs = j;
    e->n_active++;
    e->st.requests++;
    e->st.tokens_in += spec->n_prompt;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    *job = j;
    return 0;
}

/* Waits on j->cv up to the absolute deadline (timeout_ms < 0: none); 0 on a timeout. */
static int wait_until(kl_job *j, const struct timespec *dl, int timeout_ms)
{
    if (timeout_ms < 0)
        return pthread_cond_wait(&j->cv, &j->e->mu), 1;
    return pthread_cond_timedwait(&j->cv, &j->e->mu, dl) != ETIMEDOUT;
}

size_t kl_job_wait(kl_job *j, kl_token *ids, kl_job_lp *lps, size_t cap, int timeout_ms,
                   int *over, kl_job_end *end)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&j->e->mu);
    while (j->n_read == j->n_ids && !j->over)
        if (!wait_until(j, &dl, timeout_ms))
            break;
    size_t n = j->n_ids - j->n_read;
    if (n > cap)
        n = cap;
    if (n) /* none yet: j->ids may still be NULL, and memcpy from NULL is undefined */
        memcpy(ids, j->ids + j->n_read, n * sizeof *ids);
    if (n && lps && j->spec.logprobs)
        memcpy(lps, j->lps + j->n_read, n * sizeof *lps);
    j->n_read += n;
    *over = j->over && j->n_read == j->n_ids;
    if (*over && end)
        *end = j->end;
    pthread_mutex_unlock(&j->e->mu);
    return n;
}

size_t kl_job_cached(kl_job *j)
{
    pthread_mutex_lock(&j->e->mu);
    size_t n = j->cached;
    pthread_mutex_unlock(&j->e->mu);
    return n;
}

void kl_job_cancel(kl_job *j)
{
    pthread_mutex_lock(&j->e->mu);
    j->cancel = 1;
    pthread_cond_signal(&j->e->cv);
    pthread_mutex_unlock(&j->e->mu);
}

void kl_job_release(kl_job *j)
{
    if (!j)
        return;
    kl_engine *e = j->e;
    pthread_mutex_lock(&e->mu);
    j->released = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

size_t kl_engine_active(kl_engine *e)
{
    pthread_mutex_lock(&e->mu);
    size_t n = e->n_active;
    pthread_mutex_unlock(&e->mu);
    return n;
}

void kl_engine_get_stats(kl_engine *e, kl_engine_stats *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    out->running = (uint32_t)(e->n_active < e->max_seqs ? e->n_active : e->max_seqs);
    out->queued = (uint32_t)(e->n_active - out->running);
    pthread_mutex_unlock(&e->mu);
}

void kl_engine_stop_accepting(kl_engine *e, int cancel)
{
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    e->quit |= cancel;         /* tend() cancels every job; readers still hold theirs */
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void kl_engine_free(kl_engine *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->stopping = e->quit = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->th, NULL);
    kl_sched_free(e->s);
    kl_prefix_free(e->cache);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    kl_free(e);
}
