/*
 * cli/cmd_read.c — `kl read`: stream whole checkpoint files through the staged reader and
 * report bytes, seconds, GB/s, the backend used and whether O_DIRECT was used; with --hash also
 * the SHA-256 of every file (files hashed in parallel, one reader per worker); with --mapped
 * through the zero-copy mapped reader (loader/mapped.h), every byte read once by a CPU.
 * Results on stdout (text or one JSON object), errors and progress on stderr.
 */
#include "cli/cli.h"
#include "cli/progress.h"

#include "common/clock.h"
#include "common/cpu.h"
#include "common/err.h"
#include "common/fs.h"
#include "common/grow.h"
#include "common/mem.h"
#include "common/jsonout.h"
#include "common/membench.h"
#include "common/stats.h"
#include "loader/hashpass.h"
#include "loader/locate.h"
#include "loader/mapped.h"
#include "loader/reader.h"

#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char synopsis[] =
    "usage: kl read DIR|FILE... [--io uring|aio|pread|auto] [--direct|--buffered] [--hash]\n"
    "               [--mapped] [--json] [--queue-depth N] [--chunk BYTES] [--threads N]\n"
    "               [--ceiling] [--ceiling-size BYTES] [--repeat N]\n";

static const char about[] =
    "Streams every *.safetensors file of each checkpoint directory (or each FILE given) whole\n"
    "and reports bytes, seconds, GB/s, the I/O backend and whether O_DIRECT was used.\n";

static const char footer[] = "Exit status: 0 ok, 2 usage or I/O error.\n";

#define MAX_ROUNDS 100u /* --repeat */

typedef struct read_args {
    const char **paths; /* [n_paths] borrowed from argv */
    size_t n_paths;
    kl_reader_opts ro; /* zero fields take the defaults */
    unsigned threads;  /* --threads, 0 if not given */
    int hash, json, ceiling, mapped;
    size_t ceiling_bytes; /* --ceiling-size */
    unsigned repeat;      /* --repeat, 0 if not given */
    int io_given;         /* --io was given */
} read_args;

typedef struct file_list {
    char **paths; /* [n] kl_malloc'd */
    size_t n, cap;
} file_list;

/* ---- arguments ----------------------------------------------------------------------------- */

/* The option values as the table stores them. */
typedef struct read_flags {
    int direct, buffered, io;
    unsigned long long ceiling_size, repeat, queue_depth, chunk, threads;
    const char *io_name;
} read_flags;

static int parse_io(void *target, const char *v)
{
    int b = kl_io_backend_parse(v);
    if (b < 0)
        return -1;
    *(int *)target = b;
    return 0;
}

/* KL_ARGS_RUN, or the exit status (0 after --help). */
static int parse_args(int argc, char **argv, read_args *a)
{
    read_flags f;
    memset(&f, 0, sizeof f);
    f.io = -1;
    const kl_opt opts[] = {
        KL_VALUE("--io", 0, KL_OPT_FN, &f.io, "B",
                 "I/O backend; auto (default) tries io_uring, libaio, then pread threads\n"
                 "(pread threads directly with --buffered)",
                 .fn = parse_io, .wants = "one of uring, aio, pread, auto"),
        KL_FLAG("--direct", 0, &f.direct,
                "O_DIRECT or fail (default: O_DIRECT where the file system allows it)",
                .group = 1),
        KL_FLAG("--buffered", 0, &f.buffered, "read through the page cache", .group = 1),
        KL_FLAG("--mapped", 0, &a->mapped,
                "zero-copy from the page cache: map the files, populate chunks in\n"
                "parallel (MADV_POPULATE_READ, Linux 5.14+) and have the workers read\n"
                "every byte once; the zero-copy path for uploads from the cache.\n"
                "Not with --hash, --direct or --io"),
        KL_FLAG("--hash", 0, &a->hash, "SHA-256 of every file; files are hashed in parallel"),
        KL_FLAG("--json", 0, &a->json, "one JSON object on stdout"),
        KL_VALUE("--queue-depth", 0, KL_OPT_U64, &f.queue_depth, "N",
                 "chunks in flight per reader (default 32; 2 per CPU with --buffered;\n"
                 "4 per worker with --hash)",
                 .lo = 1, .hi = 4096),
        KL_VALUE("--chunk", 0, KL_OPT_BYTES, &f.chunk, "BYTES",
                 "chunk size such as 8M (default 8 MiB; 2 MiB with --buffered and\n"
                 "--mapped)",
                 .lo = 4096, .hi = 1 << 30, .wants = "a size from 4K to 1G"),
        KL_VALUE("--threads", 0, KL_OPT_U64, &f.threads, "N",
                 "with --hash: files hashed at once (default min(CPUs, files));\n"
                 "otherwise pread worker threads (default: the queue depth; the number\n"
                 "of CPUs with --buffered and --mapped)",
                 .lo = 1, .hi = 1024),
        KL_FLAG("--ceiling", 0, &a->ceiling,
                "also measure the host memory-read ceiling (one thread per CPU, a 4 GiB\n"
                "buffer on huge pages): right after each read, one pass that reads as\n"
                "many bytes as the read did; reports the read rate as a fraction of it"),
        KL_VALUE("--ceiling-size", 0, KL_OPT_BYTES, &f.ceiling_size, "BYTES",
                 "the ceiling's buffer (implies --ceiling)", .lo = 1 << 20,
                 .hi = 1099511627776.0, .wants = "a size from 1M to 1T"),
        KL_VALUE("--repeat", 0, KL_OPT_U64, &f.repeat, "N",
                 "read N times (1 to 100), each followed by its ceiling pass; reports\n"
                 "medians and bests (page-cache rates on a shared host vary by +-10%)",
                 .lo = 1, .hi = MAX_ROUNDS),
        {0}};
    const kl_cmd_spec spec = {"read", synopsis, about, opts, footer, 1, 0,
                              "a checkpoint directory or file"};
    kl_args pa;
    int rc = kl_args_parse(&spec, argc, argv, &pa);
    if (rc != KL_ARGS_RUN)
        return rc;
    a->paths = pa.pos; /* owned by a from here: kl_free(a->paths) */
    a->n_paths = pa.n_pos;
    a->ro.direct = f.direct ? KL_DIRECT_ON : f.buffered ? KL_DIRECT_OFF : KL_DIRECT_AUTO;
    a->io_given = f.io >= 0;
    a->ro.backend = f.io >= 0 ? (kl_io_backend)f.io : KL_IO_AUTO;
    a->ro.queue_depth = (unsigned)f.queue_depth;
    a->ro.buf_bytes = (size_t)f.chunk;
    a->threads = (unsigned)f.threads;
    a->ceiling |= f.ceiling_size != 0;
    a->ceiling_bytes = (size_t)f.ceiling_size;
    a->repeat = (unsigned)f.repeat;
    if (a->mapped && (a->hash || a->io_given || a->ro.direct == KL_DIRECT_ON))
        return kl_cli_usage("--mapped reads cached pages in place: not with --hash, --io or "
                            "--direct");
    return KL_ARGS_RUN;
}

/* ---- file list ----------------------------------------------------------------------------- */

static int list_push(file_list *l, char *path)
{
    if (!path)
        return KL_E_NOMEM;
    if (kl_grow(&l->paths, &l->cap, l->n + 1, sizeof *l->paths)) {
        kl_free(path);
        return KL_E_NOMEM;
    }
    l->paths[l->n++] = path;
    return 0;
}

static void list_free(file_list *l)
{
    kl_free_name_list(l->paths, l->n);
    memset(l, 0, sizeof *l);
}

/* Adds path itself, or every *.safetensors file of it when it is a directory. */
static int collect(file_list *l, const char *arg, kl_err *err)
{
    char path[4096]; /* a directory may be a Hugging Face cache repository or ORG/NAME */
    int rc = kl_model_dir_resolve(arg, path, sizeof path, err);
    if (rc)
        return rc;
    struct stat st;
    if (stat(path, &st) != 0) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot access");
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    if (!S_ISDIR(st.st_mode))
        return list_push(l, kl_strdup(path)) ? kl_fail(err, KL_E_NOMEM, "out of memory") : 0;
    char **names = NULL;
    size_t n = 0;
    rc = kl_list_files_with_suffix(path, ".safetensors", &names, &n, err);
    if (rc)
        return rc;
    if (!n) {
        kl_fail(err, KL_E_USAGE, "no *.safetensors files in the directory");
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
        rc = KL_E_USAGE;
    }
    for (size_t i = 0; i < n && !rc; i++) {
        char buf[4096];
        rc = kl_path_join(buf, sizeof buf, path, names[i], err);
        if (!rc && list_push(l, kl_strdup(buf)))
            rc = kl_fail(err, KL_E_NOMEM, "out of memory");
    }
    kl_free_name_list(names, n);
    return rc;
}

/* ---- progress ------------------------------------------------------------------------------ */

typedef struct read_progress {
    kl_progress line;
    uint64_t bytes;
} read_progress;

static int on_chunk(void *ctx, size_t ext_idx, uint64_t ext_off, const uint8_t *data, size_t len)
{
    (void)ext_idx, (void)ext_off, (void)data;
    read_progress *p = ctx;
    p->bytes += len;
    kl_progress_show(&p->line, p->bytes, 0);
    return 0;
}

static void on_hash_progress(void *ctx, uint64_t bytes_done)
{
    read_progress *p = ctx;
    kl_progress_show(&p->line, bytes_done, 0);
}

/* ---- the two modes ------------------------------------------------------------------------- */

typedef struct read_result {
    const char *backend;        /* kl_io_backend_name, or "mapped" */
    int direct;
    uint64_t bytes;
    double elapsed_s;
} read_result;

/* Every round of a run: the read, and with --ceiling the memory-read pass right after it. */
typedef struct read_rounds {
    unsigned n;
    read_result read[MAX_ROUNDS];
    double ceiling_gbps[MAX_ROUNDS]; /* 0 without --ceiling */
    unsigned ceiling_threads;
    size_t ceiling_buffer;
    uint64_t ceiling_huge;
} read_rounds;

/* One reader over every file, whole files as extents (tuning: kl_reader_opts_for_streaming).
 * Files are opened, read and closed in batches of kl_reader_max_open_files(); the ring drains
 * only at a batch boundary. */
static int read_all(const read_args *a, const file_list *l, read_result *res, kl_err *err)
{
    kl_reader_opts ro = a->ro;
    kl_reader_opts_for_streaming(&ro, a->threads);
    size_t batch = kl_reader_max_open_files();
    kl_reader *r = NULL;
    kl_extent *ext = kl_calloc(batch, sizeof *ext);
    int rc = ext ? kl_reader_create(&r, &ro, err) : kl_fail(err, KL_E_NOMEM, "out of memory");
    read_progress pr = {.bytes = 0};
    if (!rc)
        kl_progress_init(&pr.line, "kl read", 0);
    for (size_t first = 0; !rc && first < l->n; first += batch) {
        size_t n = l->n - first < batch ? l->n - first : batch, added = 0;
        for (; added < n; added++) {
            int idx = kl_reader_add_file(r, l->paths[first + added], err);
            if (idx < 0) {
                rc = idx;
                break;
            }
            ext[added] = (kl_extent){
                .file = (uint32_t)idx, .off = 0, .len = kl_reader_file_size(r, (uint32_t)idx)};
        }
        if (!rc)
            rc = kl_reader_run(r, ext, n, on_chunk, &pr, err);
        for (size_t i = 0; i < added; i++)
            kl_reader_close_file(r, ext[i].file, NULL);
    }
    if (r) {
        res->elapsed_s = kl_now_s() - pr.line.t0;
        kl_progress_end(&pr.line);
        kl_reader_stats st;
        kl_reader_get_stats(r, &st);
        res->backend = kl_io_backend_name(st.backend);
        res->direct = st.direct;
        res->bytes = st.bytes;
    }
    kl_reader_destroy(r);
    kl_free(ext);
    return rc;
}

/* --hash: kl_hashpass over the files; fills files[] (caller-allocated, l->n entries). */
static int hash_all(const read_args *a, const file_list *l, kl_hashpass_file *files,
                    read_result *res, kl_err *err)
{
    read_progress pr = {.bytes = 0};
    kl_progress_init(&pr.line, "kl read", 0);
    kl_hashpass_opts ho = {.threads = a->threads, .reader = a->ro};
    ho.progress = on_hash_progress;
    ho.progress_ctx = &pr;
    for (size_t i = 0; i < l->n; i++)
        files[i].path = l->paths[i];
    kl_hashpass_stats st;
    int rc = kl_hashpass_run(files, l->n, &ho, &st, err);
    kl_progress_end(&pr.line);
    if (!rc) {
        res->backend = kl_io_backend_name(st.backend);
        res->direct = st.direct;
        res->bytes = st.bytes;
        res->elapsed_s = st.elapsed_s;
    }
    return rc;
}

/* --mapped: every file through the mapped reader, the workers reading every byte once. */
static int read_mapped(const read_args *a, const file_list *l, read_result *res, kl_err *err)
{
    kl_mapped_opts mo = {.threads = a->threads, .chunk_bytes = a->ro.buf_bytes, .touch = 1};
    read_progress pr = {.bytes = 0};
    kl_progress_init(&pr.line, "kl read", 0);
    kl_mapped_stats st;
    int rc = kl_mapped_read((const char *const *)l->paths, l->n, &mo, on_chunk, &pr, &st,
                            err);
    kl_progress_end(&pr.line);
    res->backend = "mapped";
    res->bytes = st.bytes;
    res->elapsed_s = st.elapsed_s;
    return rc;
}

/* One read of every file in the mode the arguments ask for. */
static int read_once(const read_args *a, const file_list *l, kl_hashpass_file *files,
                     read_result *res, kl_err *err)
{
    if (a->hash)
        return hash_all(a, l, files, res, err);
    if (a->mapped)
        return read_mapped(a, l, res, err);
    return read_all(a, l, res, err);
}

/* The rounds: each read, then (--ceiling) a memory-read pass over as many bytes as it read,
 * so the two see the same machine at nearly the same time and for about as long. */
static int run_rounds(const read_args *a, const file_list *l, kl_hashpass_file *files,
                      read_rounds *out, kl_err *err)
{
    kl_membench *mb = NULL;
    if (a->ceiling) {
        int rc = kl_membench_open(a->ceiling_bytes ? a->ceiling_bytes : (size_t)4 << 30,
                                  kl_cpu_count(256), &mb, err);
        if (rc)
            return rc;
        out->ceiling_threads = kl_membench_threads(mb);
        out->ceiling_buffer = kl_membench_buffer_bytes(mb);
        out->ceiling_huge = kl_membench_huge_bytes(mb);
    }
    unsigned want = a->repeat ? a->repeat : 1;
    int rc = 0;
    for (out->n = 0; out->n < want && !rc; out->n++) {
        read_result *r = &out->read[out->n];
        rc = read_once(a, l, files, r, err);
        if (rc)
            break;
        if (mb) {
            uint64_t bytes;
            double s = kl_membench_pass(mb, r->bytes ? r->bytes : 1, &bytes);
            out->ceiling_gbps[out->n] = s > 0 ? (double)bytes / s / 1e9 : 0.0;
        }
    }
    kl_membench_close(mb);
    return rc;
}

/* ---- output -------------------------------------------------------------------------------- */

static double gbps(const read_result *res)
{
    return res->elapsed_s > 0 ? (double)res->bytes / res->elapsed_s / 1e9 : 0.0;
}

static double median_of(const double *v, unsigned n)
{
    double s[MAX_ROUNDS];
    memcpy(s, v, n * sizeof *v);
    return kl_median(s, n);
}

static double max_of(const double *v, unsigned n)
{
    double m = 0;
    for (unsigned i = 0; i < n; i++)
        m = v[i] > m ? v[i] : m;
    return m;
}

/* The figures reported: per-round rates and their medians and bests. */
typedef struct read_summary {
    double gbps[MAX_ROUNDS], elapsed[MAX_ROUNDS], ratio[MAX_ROUNDS];
    double read_median, read_best, elapsed_median;
    double ceiling_median, ceiling_best, ratio_median;
} read_summary;

static void summarize(const read_rounds *r, read_summary *s)
{
    for (unsigned i = 0; i < r->n; i++) {
        s->gbps[i] = gbps(&r->read[i]);
        s->elapsed[i] = r->read[i].elapsed_s;
        s->ratio[i] = r->ceiling_gbps[i] > 0 ? s->gbps[i] / r->ceiling_gbps[i] : 0.0;
    }
    s->read_median = median_of(s->gbps, r->n);
    s->read_best = max_of(s->gbps, r->n);
    s->elapsed_median = median_of(s->elapsed, r->n);
    s->ceiling_median = median_of(r->ceiling_gbps, r->n);
    s->ceiling_best = max_of(r->ceiling_gbps, r->n);
    s->ratio_median = median_of(s->ratio, r->n);
}

static void print_text(const file_list *l, const kl_hashpass_file *files, const read_rounds *r,
                       const read_summary *s)
{
    const read_result *last = &r->read[r->n - 1];
    for (size_t i = 0; files && i < l->n; i++) {
        char hex[65];
        kl_sha256_hex(files[i].sha256, hex);
        printf("%s  %s\n", hex, files[i].path); /* the sha256sum line format */
    }
    printf("%zu file%s, %llu bytes", l->n, l->n == 1 ? "" : "s",
           (unsigned long long)last->bytes);
    if (r->n == 1)
        printf(" in %.3f s: %.3f GB/s", last->elapsed_s, s->read_median);
    else
        printf(", %u rounds: median %.3f s, %.3f GB/s (best %.3f GB/s)", r->n,
               s->elapsed_median, s->read_median, s->read_best);
    printf(" (backend %s, direct %s)\n", last->backend, last->direct ? "yes" : "no");
    if (r->ceiling_threads)
        printf("memory-read ceiling (%u threads, a pass over as many bytes after each read): "
               "median %.3f GB/s, best %.3f GB/s; the read ran at %.1f%% of it (median of the "
               "rounds)\n", r->ceiling_threads, s->ceiling_median, s->ceiling_best,
               100.0 * s->ratio_median);
}

static void add_ceiling_json(cJSON *root, const read_rounds *r, const read_summary *s)
{
    cJSON_AddNumberToObject(root, "ceiling_gbps", s->ceiling_median);
    cJSON_AddNumberToObject(root, "ceiling_best_gbps", s->ceiling_best);
    cJSON_AddNumberToObject(root, "ceiling_ratio", s->ratio_median);
    cJSON_AddNumberToObject(root, "ceiling_threads", r->ceiling_threads);
    kl_json_add_u64(root, "ceiling_buffer_bytes", r->ceiling_buffer);
    kl_json_add_u64(root, "ceiling_huge_page_bytes", r->ceiling_huge);
}

static void add_hashes_json(cJSON *root, const file_list *l, const kl_hashpass_file *files)
{
    cJSON *arr = cJSON_AddArrayToObject(root, "hashes");
    for (size_t i = 0; i < l->n; i++) {
        char hex[65];
        kl_sha256_hex(files[i].sha256, hex);
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "file", files[i].path);
        kl_json_add_u64(f, "size_bytes", files[i].size_bytes);
        cJSON_AddStringToObject(f, "sha256", hex);
        cJSON_AddItemToArray(arr, f);
    }
}

static int report(const read_args *a, const file_list *l, const kl_hashpass_file *files,
                  const read_rounds *r)
{
    read_summary s;
    summarize(r, &s);
    if (!a->json) {
        print_text(l, files, r, &s);
        return KL_EXIT_OK;
    }
    const read_result *last = &r->read[r->n - 1];
    cJSON *root = kl_cli_json_head(1);
    cJSON_AddStringToObject(root, "backend", last->backend);
    cJSON_AddBoolToObject(root, "direct", last->direct);
    cJSON_AddNumberToObject(root, "files", (double)l->n);
    kl_json_add_u64(root, "bytes", last->bytes);
    cJSON_AddNumberToObject(root, "rounds", r->n);
    cJSON_AddNumberToObject(root, "elapsed_s", s.elapsed_median);
    cJSON_AddNumberToObject(root, "read_gbps", s.read_median);
    cJSON_AddNumberToObject(root, "read_best_gbps", s.read_best);
    if (r->ceiling_threads)
        add_ceiling_json(root, r, &s);
    if (r->n > 1) {
        cJSON *arr = cJSON_AddArrayToObject(root, "round_gbps");
        for (unsigned i = 0; i < r->n; i++) {
            double pair[2] = {s.gbps[i], r->ceiling_gbps[i]};
            cJSON_AddItemToArray(arr, cJSON_CreateDoubleArray(pair, r->ceiling_threads ? 2 : 1));
        }
    }
    if (files)
        add_hashes_json(root, l, files);
    return kl_cli_print_json(root);
}

/* ---- entry --------------------------------------------------------------------------------- */

int cmd_read(int argc, char **argv)
{
    read_args a;
    memset(&a, 0, sizeof a);
    int status = parse_args(argc, argv, &a);
    if (status != KL_ARGS_RUN) {
        kl_free(a.paths);
        return status;
    }
    kl_err err;
    kl_err_clear(&err);
    file_list l = {0};
    kl_hashpass_file *files = NULL;
    read_rounds *rounds = kl_calloc(1, sizeof *rounds);
    int rc = rounds ? 0 : kl_fail(&err, KL_E_NOMEM, "out of memory");
    for (size_t i = 0; i < a.n_paths && !rc; i++)
        rc = collect(&l, a.paths[i], &err);
    if (!rc && a.hash) {
        files = kl_calloc(l.n, sizeof *files);
        if (!files)
            rc = kl_fail(&err, KL_E_NOMEM, "out of memory");
    }
    if (!rc)
        rc = run_rounds(&a, &l, files, rounds, &err);
    status = rc ? kl_cli_report_as(err.code == KL_E_BUG ? KL_EXIT_BUG : KL_EXIT_USAGE, &err)
                : report(&a, &l, files, rounds);
    kl_free(rounds);
    kl_free(files);
    list_free(&l);
    kl_free(a.paths);
    return status;
}
