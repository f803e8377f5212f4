/*
 * loader/hashpass.c — parallel whole-file SHA-256 (see hashpass.h).
 * Divisions: includes; work distribution; workers; public API.
 */
#include "loader/hashpass.h"

#include "common/clock.h"
#include "common/cpu.h"
#include "common/mem.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_QD 4u
#define DEFAULT_BUF ((size_t)8 << 20)

/* ---- work distribution --------------------------------------------------------------------- */

typedef struct pass {
    kl_hashpass_file       *files;
    size_t                  n_files;
    size_t                 *order;        /* [n_files] file indices, largest first */
    atomic_size_t           next;         /* next position in order */
    atomic_uint_fast64_t    bytes;        /* hashed so far, all workers */
    pthread_mutex_t         progress_mu;  /* keeps progress calls from overlapping */
    const kl_hashpass_opts *opts;
} pass;

typedef struct worker {
    pass      *p;
    kl_reader *r;
    size_t     n_done;                    /* files this worker opened */
    pthread_t  th;
} worker;

typedef struct sized {
    uint64_t size;
    size_t   idx;
} sized;

static int cmp_larger_first(const void *a, const void *b)
{
    const sized *x = a, *y = b;
    if (x->size != y->size)
        return x->size > y->size ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Largest files first: with more files than workers, the last file to start is a small one. */
static int order_by_size(pass *p)
{
    sized *tmp = kl_calloc(p->n_files, sizeof *tmp);
    p->order = kl_calloc(p->n_files, sizeof *p->order);
    if (!tmp || !p->order) {
        kl_free(tmp);
        return KL_E_NOMEM;
    }
    for (size_t i = 0; i < p->n_files; i++) {
        struct stat st;
        tmp[i].idx = i;
        tmp[i].size = stat(p->files[i].path, &st) == 0 ? (uint64_t)st.st_size : 0;
    }
    qsort(tmp, p->n_files, sizeof *tmp, cmp_larger_first);
    for (size_t i = 0; i < p->n_files; i++)
        p->order[i] = tmp[i].idx;
    kl_free(tmp);
    return 0;
}

/* ---- workers ------------------------------------------------------------------------------- */

static int on_chunk(void *ctx, size_t ext_idx, uint64_t ext_off, const uint8_t *data, size_t len)
{
    (void)ext_idx, (void)ext_off, (void)data;
    pass *p = ctx;
    uint64_t total = atomic_fetch_add(&p->bytes, len) + len;
    if (p->opts->progress && pthread_mutex_trylock(&p->progress_mu) == 0) {
        p->opts->progress(p->opts->progress_ctx, total);
        pthread_mutex_unlock(&p->progress_mu);
    }
    return 0;
}

static void hash_one(worker *w, kl_hashpass_file *f)
{
    kl_err_clear(&f->err);
    f->size_bytes = 0;
    int idx = kl_reader_add_file(w->r, f->path, &f->err);
    if (idx < 0) {
        f->rc = idx;
        return;
    }
    w->n_done++;
    f->size_bytes = kl_reader_file_size(w->r, (uint32_t)idx);
    f->rc = kl_reader_stream_file(w->r, (uint32_t)idx, f->sha256, on_chunk, w->p, &f->err);
    if (f->rc)
        kl_err_context(&f->err, f->path, NULL, KL_NO_OFFSET, NULL);
    /* One descriptor per worker at a time, however many files the pass has. */
    kl_reader_close_file(w->r, (uint32_t)idx, NULL);
}

static void *work(void *arg)
{
    worker *w = arg;
    pass *p = w->p;
    for (;;) {
        size_t k = atomic_fetch_add(&p->next, 1);
        if (k >= p->n_files)
            break;
        hash_one(w, &p->files[p->order[k]]);
    }
    return NULL;
}

/* ---- public API ---------------------------------------------------------------------------- */

static unsigned pick_threads(const kl_hashpass_opts *o, size_t n_files)
{
    unsigned t = o->threads ? o->threads : kl_cpu_count(0);
    /* A worker holds up to two descriptors (its file, an io_uring ring): stay well inside
     * RLIMIT_NOFILE, leaving half of it to the rest of the process. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        rlim_t cap = rl.rlim_cur / 4;
        if ((rlim_t)t > cap)
            t = (unsigned)cap;
    }
    if (t > n_files)
        t = (unsigned)n_files;
    return t ? t : 1;
}

static void fill_stats(kl_hashpass_stats *st, const worker *w, unsigned nt, const pass *p,
                       double t0)
{
    if (!st)
        return;
    memset(st, 0, sizeof *st);
    st->threads = nt;
    st->direct = 1;
    int any = 0;
    for (unsigned i = 0; i < nt; i++) {
        kl_reader_stats rs;
        kl_reader_get_stats(w[i].r, &rs);
        st->backend = rs.backend;
        st->short_reads += rs.short_reads;
        if (w[i].n_done) {
            st->direct &= rs.direct;
            any = 1;
        }
    }
    st->direct &= any;
    st->bytes = atomic_load(&p->bytes);
    st->elapsed_s = kl_now_s() - t0;
}

int kl_hashpass_run(kl_hashpass_file *files, size_t n_files, const kl_hashpass_opts *opts,
                    kl_hashpass_stats *st, kl_err *err)
{
    kl_hashpass_opts o;
    if (opts)
        o = *opts;
    else
        memset(&o, 0, sizeof o);
    if (n_files && !files)
        return kl_fail(err, KL_E_USAGE, "kl_hashpass_run: files is NULL");
    for (size_t i = 0; i < n_files; i++)
        if (!files[i].path)
            return kl_fail(err, KL_E_USAGE, "kl_hashpass_run: file %zu has no path", i);
    if (!o.reader.queue_depth)
        o.reader.queue_depth = DEFAULT_QD;
    if (!o.reader.buf_bytes)
        o.reader.buf_bytes = DEFAULT_BUF;

    double t0 = kl_now_s();
    unsigned nt = pick_threads(&o, n_files);
    pass p = {.files = files, .n_files = n_files, .opts = &o};
    atomic_init(&p.next, 0);
    atomic_init(&p.bytes, 0);
    pthread_mutex_init(&p.progress_mu, NULL);
    worker *w = kl_calloc(nt, sizeof *w);
    int rc = 0;
    if (!w || order_by_size(&p)) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory for %u hash workers", nt);
        goto done;
    }
    /* All readers first, so an unusable backend fails the call before any file is read. */
    for (unsigned i = 0; i < nt; i++) {
        w[i].p = &p;
        rc = kl_reader_create(&w[i].r, &o.reader, err);
        if (rc)
            goto done;
    }
    unsigned started = 0;
    if (nt > 1) {
        for (; started < nt; started++)
            if (pthread_create(&w[started].th, NULL, work, &w[started]) != 0)
                break;  /* fewer workers: the ones running take all files */
    }
    if (!started)
        work(&w[0]);
    for (unsigned i = 0; i < started; i++)
        pthread_join(w[i].th, NULL);
    fill_stats(st, w, nt, &p, t0);
    for (size_t i = 0; i < n_files; i++) {
        if (files[i].rc) {
            /* The whole record (rule, tensor, offset), unless err already holds an error. */
            rc = files[i].rc;
            if (err && !err->code)
                *err = files[i].err;
            break;
        }
    }
done:
    if (w)
        for (unsigned i = 0; i < nt; i++)
            kl_reader_destroy(w[i].r);
    kl_free(w);
    kl_free(p.order);
    pthread_mutex_destroy(&p.progress_mu);
    return rc;
}

void kl_sha256_hex(const unsigned char sha256[32], char hex[65])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[sha256[i] >> 4];
        hex[2 * i + 1] = digits[sha256[i] & 15];
    }
    hex[64] = 0;
}
