/* loader/mapped.c — zero-copy, in-order reads of cached files (see mapped.h). */
#include "loader/mapped.h"

#include "common/clock.h"
#include "common/cpu.h"
#include "common/fs.h"
#include "common/membench.h"
#include "common/mem.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

#define DEFAULT_CHUNK ((size_t)2 << 20)
#define MAX_THREADS 64u
/* Populating runs at most this far ahead of delivery (at least 2 chunks per thread): bounds
 * the page tables and the resident, not yet delivered bytes when the consumer is slower. */
#ifndef KL_MAPPED_LOOKAHEAD_BYTES
#define KL_MAPPED_LOOKAHEAD_BYTES ((uint64_t)256 << 20)
#endif
#define LOOKAHEAD_BYTES KL_MAPPED_LOOKAHEAD_BYTES

enum { CHUNK_PENDING = 0, CHUNK_READY, CHUNK_FAILED };

typedef struct mapped_file {
    const char *path;     /* borrowed */
    uint8_t    *map;      /* NULL when empty or unmapped */
    uint64_t    size;
    size_t      first;    /* index of its first chunk */
    size_t      n_chunks;
} mapped_file;

typedef struct mapped_chunk {
    uint32_t   file;
    uint64_t   off;
    size_t     len;
    atomic_int state;     /* CHUNK_* */
    int        sys_errno; /* CHUNK_FAILED */
} mapped_chunk;

typedef struct mapped_run {
    mapped_file    *files;
    size_t          n_files;
    mapped_chunk   *chunks;
    size_t          n_chunks;
    int             touch;
    atomic_size_t   next;      /* next chunk a worker populates */
    atomic_size_t   delivered; /* chunks the callback is done with */
    atomic_size_t   released;  /* chunks whose page-table entries were dropped */
    size_t          window;    /* chunks populated ahead of delivery, at most */
    atomic_int      stop;
    atomic_int      n_waiting; /* threads waiting for delivery to move the window */
    atomic_uint_fast64_t checksum;
    pthread_mutex_t mu;
    pthread_cond_t  ready_cv;  /* a chunk became ready or failed */
    pthread_cond_t  progress_cv; /* a chunk was delivered, or stop */
} mapped_run;

/* ---- workers -------------------------------------------------------------------------------- */

static void finish_chunk(mapped_run *run, mapped_chunk *c, int state)
{
    pthread_mutex_lock(&run->mu);
    atomic_store(&c->state, state);
    pthread_cond_broadcast(&run->ready_cv);
    pthread_mutex_unlock(&run->mu);
}

/* Delivered chunks are released in batches of about this many bytes (one file at a time). */
#ifndef KL_MAPPED_RELEASE_BYTES
#define KL_MAPPED_RELEASE_BYTES ((uint64_t)64 << 20)
#endif
#define RELEASE_BYTES KL_MAPPED_RELEASE_BYTES

/* Drops the page-table entries of a batch of delivered chunks, if one is due; 1 when it did.
 * MADV_DONTNEED runs under the mmap lock held for reading, so it proceeds in parallel with
 * populating; a munmap of a whole file would take the lock for writing and stall every
 * populating thread while it tears down a million entries.  Batches (not single chunks) keep
 * the TLB shootdowns, which interrupt every CPU running the process, to a few hundred. */
static int release_batch(mapped_run *run)
{
    size_t r = atomic_load(&run->released), d = atomic_load(&run->delivered);
    if (r >= d)
        return 0;
    uint32_t file = run->chunks[r].file;
    uint64_t bytes = 0;
    size_t e = r;
    for (; e < d && run->chunks[e].file == file && bytes < RELEASE_BYTES; e++)
        bytes += run->chunks[e].len;
    int file_done = e == run->n_chunks || run->chunks[e].file != file;
    if ((bytes < RELEASE_BYTES && !file_done) ||
        !atomic_compare_exchange_strong(&run->released, &r, e))
        return 0;
    const mapped_chunk *first = &run->chunks[r];
    (void)madvise(run->files[file].map + first->off, (size_t)bytes, MADV_DONTNEED);
    return 1;
}

/* Makes chunk i resident (and reads it with touch), then publishes its state. */
static void populate_chunk(mapped_run *run, size_t i, uint64_t *sum)
{
    mapped_chunk *c = &run->chunks[i];
    uint8_t *p = run->files[c->file].map + c->off;
    if (madvise(p, c->len, MADV_POPULATE_READ) != 0) {
        c->sys_errno = errno;
        finish_chunk(run, c, CHUNK_FAILED);
        return;
    }
    if (run->touch)
        *sum += kl_mem_sum(p, c->len);
    finish_chunk(run, c, CHUNK_READY);
}

enum { WORK_DONE = 1, WORK_NONE_LEFT = 0, WORK_WINDOW_FULL = -1 };

/* One unit of work: a due release, else the next chunk to populate if it is inside the
 * look-ahead window. */
static int work_one(mapped_run *run, uint64_t *sum)
{
    if (release_batch(run))
        return WORK_DONE;
    for (;;) {
        size_t i = atomic_load(&run->next);
        if (atomic_load(&run->stop) || i >= run->n_chunks)
            return WORK_NONE_LEFT;
        if (i >= atomic_load(&run->delivered) + run->window)
            return WORK_WINDOW_FULL;
        if (atomic_compare_exchange_weak(&run->next, &i, i + 1)) {
            populate_chunk(run, i, sum);
            return WORK_DONE;
        }
    }
}

/* Sleeps until delivery moves the window (or the run stops). */
static void wait_for_delivery(mapped_run *run)
{
    pthread_mutex_lock(&run->mu);
    atomic_fetch_add(&run->n_waiting, 1);
    while (!atomic_load(&run->stop) &&
           atomic_load(&run->next) >= atomic_load(&run->delivered) + run->window)
        pthread_cond_wait(&run->progress_cv, &run->mu);
    atomic_fetch_sub(&run->n_waiting, 1);
    pthread_mutex_unlock(&run->mu);
}

/* Wakes threads waiting for the window; the common case (nobody waits) costs one load.  A
 * waiter counts itself before it checks `delivered`, and the deliverer stores `delivered`
 * before it checks the count, so one of them always sees the other. */
static void notify_delivery(mapped_run *run)
{
    if (!atomic_load(&run->n_waiting))
        return;
    pthread_mutex_lock(&run->mu);
    pthread_cond_broadcast(&run->progress_cv);
    pthread_mutex_unlock(&run->mu);
}

static void *worker_main(void *arg)
{
    mapped_run *run = arg;
    uint64_t sum = 0;
    for (int w; (w = work_one(run, &sum)) != WORK_NONE_LEFT;)
        if (w == WORK_WINDOW_FULL)
            wait_for_delivery(run);
    atomic_fetch_add(&run->checksum, sum);
    return NULL;
}

/* ---- set-up --------------------------------------------------------------------------------- */

static int map_file(mapped_file *f, kl_err *err)
{
    int fd = kl_open_regular(f->path, &f->size, err);
    if (fd < 0)
        return fd;
    int rc = 0;
    if (f->size > 0) {
        void *m = mmap(NULL, (size_t)f->size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            rc = kl_fail_sys(err, errno == ENOMEM ? KL_E_NOMEM : KL_E_IO, errno,
                             "cannot map %llu bytes", (unsigned long long)f->size);
            kl_err_context(err, f->path, NULL, KL_NO_OFFSET, NULL);
        } else {
            /* Pages this read faults in come as 2 MiB folios (PMD readahead), which later
             * mapped reads map with one entry per 2 MiB instead of 512; without it a cold
             * file's folios are as small as the device's read-ahead window. */
            (void)madvise(m, (size_t)f->size, MADV_HUGEPAGE);
            f->map = m;
        }
    }
    close(fd);
    return rc;
}

static void unmap_file(mapped_file *f)
{
    if (f->map)
        munmap(f->map, (size_t)f->size);
    f->map = NULL;
}

/* Maps every file and cuts them into chunks. */
static int plan(mapped_run *run, const char *const *paths, size_t chunk, kl_err *err)
{
    for (size_t i = 0; i < run->n_files; i++) {
        mapped_file *f = &run->files[i];
        f->path = paths[i];
        int rc = map_file(f, err);
        if (rc)
            return rc;
        f->first = run->n_chunks;
        f->n_chunks = (size_t)((f->size + chunk - 1) / chunk);
        run->n_chunks += f->n_chunks;
    }
    run->chunks = kl_calloc(run->n_chunks ? run->n_chunks : 1, sizeof *run->chunks);
    if (!run->chunks)
        return kl_fail(err, KL_E_NOMEM, "out of memory for %zu chunks", run->n_chunks);
    for (size_t i = 0; i < run->n_files; i++) {
        const mapped_file *f = &run->files[i];
        for (size_t k = 0; k < f->n_chunks; k++) {
            mapped_chunk *c = &run->chunks[f->first + k];
            c->file = (uint32_t)i;
            c->off = (uint64_t)k * chunk;
            c->len = (size_t)(f->size - c->off < chunk ? f->size - c->off : chunk);
        }
    }
    return 0;
}

/* ---- delivery ------------------------------------------------------------------------------- */

static int chunk_error(const mapped_run *run, const mapped_chunk *c, kl_err *err)
{
    const mapped_file *f = &run->files[c->file];
    int code = c->sys_errno == EINVAL ? KL_E_UNSUPPORTED : KL_E_IO;
    if (code == KL_E_UNSUPPORTED)
        kl_fail(err, code, "mapped reads need MADV_POPULATE_READ (Linux 5.14 or later)");
    else
        kl_fail_sys(err, code, c->sys_errno, "cannot read the mapped file (did it shrink?)");
    kl_err_context(err, f->path, NULL, c->off, NULL);
    return code;
}

/* Waits for chunks in order and hands them to cb; the workers release delivered chunks. */
static int deliver(mapped_run *run, kl_mapped_cb cb, void *ctx, kl_mapped_stats *st,
                   kl_err *err)
{
    uint64_t sum = 0;
    int rc = 0;
    for (size_t i = 0; i < run->n_chunks && !rc; i++) {
        mapped_chunk *c = &run->chunks[i];
        /* The delivering thread is one of the team: it works instead of sleeping while the
         * chunk it needs is not ready, and sleeps only when nothing is left to claim. */
        while (atomic_load(&c->state) == CHUNK_PENDING && work_one(run, &sum) == WORK_DONE)
            ;
        pthread_mutex_lock(&run->mu);
        while (atomic_load(&c->state) == CHUNK_PENDING)
            pthread_cond_wait(&run->ready_cv, &run->mu);
        pthread_mutex_unlock(&run->mu);
        if (atomic_load(&c->state) == CHUNK_FAILED) {
            rc = chunk_error(run, c, err);
            break;
        }
        mapped_file *f = &run->files[c->file];
        if (cb && cb(ctx, c->file, c->off, f->map + c->off, c->len)) {
            rc = kl_fail(err, KL_E_CANCELLED, "cancelled by the consumer");
            break;
        }
        st->bytes += c->len;
        st->chunks++;
        atomic_store(&run->delivered, i + 1);
        notify_delivery(run);
        release_batch(run); /* the workers may all be done populating */
    }
    atomic_fetch_add(&run->checksum, sum);
    return rc;
}

static unsigned resolve_threads(unsigned want)
{
    if (!want)
        want = kl_cpu_count(0);
    return want > MAX_THREADS ? MAX_THREADS : want;
}

static size_t resolve_chunk(size_t want)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (!want)
        want = DEFAULT_CHUNK;
    return (want + page - 1) / page * page;
}

int kl_mapped_read(const char *const *paths, size_t n, const kl_mapped_opts *opts,
                   kl_mapped_cb cb, void *ctx, kl_mapped_stats *stats, kl_err *err)
{
    kl_mapped_opts o = opts ? *opts : (kl_mapped_opts){0};
    if (o.threads > MAX_THREADS || o.chunk_bytes > ((size_t)1 << 30))
        return kl_fail(err, KL_E_USAGE, "mapped read: at most %u threads and 1 GiB chunks",
                       MAX_THREADS);
    kl_mapped_stats st = {.threads = resolve_threads(o.threads)};
    double t0 = kl_now_s();
    size_t chunk = resolve_chunk(o.chunk_bytes);
    size_t window = (size_t)(LOOKAHEAD_BYTES / chunk);
    mapped_run run = {.n_files = n, .touch = o.touch,
                      .window = window > 2 * st.threads ? window : 2 * st.threads};
    pthread_mutex_init(&run.mu, NULL);
    pthread_cond_init(&run.ready_cv, NULL);
    pthread_cond_init(&run.progress_cv, NULL);
    run.files = kl_calloc(n ? n : 1, sizeof *run.files);
    int rc = run.files ? plan(&run, paths, chunk, err)
                       : kl_fail(err, KL_E_NOMEM, "out of memory for %zu files", n);
    /* threads - 1 workers: the delivering thread works too (deliver) */
    pthread_t tid[MAX_THREADS];
    unsigned started = 0;
    for (; !rc && started + 1 < st.threads; started++)
        if (pthread_create(&tid[started], NULL, worker_main, &run) != 0)
            break; /* fewer workers: slower, still correct */
    if (!rc)
        rc = deliver(&run, cb, ctx, &st, err);
    pthread_mutex_lock(&run.mu);
    atomic_store(&run.stop, 1);
    pthread_cond_broadcast(&run.progress_cv);
    pthread_mutex_unlock(&run.mu);
    for (unsigned t = 0; t < started; t++)
        pthread_join(tid[t], NULL);
    for (size_t i = 0; run.files && i < n; i++)
        unmap_file(&run.files[i]);
    st.threads = started + 1;
    st.checksum = atomic_load(&run.checksum);
    st.elapsed_s = kl_now_s() - t0;
    kl_free(run.chunks);
    kl_free(run.files);
    pthread_cond_destroy(&run.ready_cv);
    pthread_cond_destroy(&run.progress_cv);
    pthread_mutex_destroy(&run.mu);
    if (stats)
        *stats = st;
    return rc;
}
