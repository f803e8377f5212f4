/*
 * tests/test_reader.c — loader/reader (all backends, direct and buffered), loader/hashpass and
 * kl_list_files_with_suffix.
 *
 * Fixture: files of awkward sizes (0, 1, 511, 4095, 4097, 8 MiB + 13) written once by main()
 * into a temp directory; byte i of file f is pattern(f, i), so any shifted, reordered or
 * stale slice is caught.  Backend tests are loop tests over six configurations (io_uring,
 * libaio, pread) x (O_DIRECT, buffered); a configuration the sandbox cannot run (no io_uring,
 * a file system without O_DIRECT) is skipped with a message.  Fault injection (short reads,
 * EINTR, EIO, refused O_DIRECT, unavailable rings) goes through the syscall table of
 * loader/reader_int.h.  Every test checks that kl_mem_in_use returns to where it started.
 */
#include "cli/cli.h"
#include "common/fs.h"
#include "common/mem.h"
#include "common/rng.h"
#include "loader/hashpass.h"
#include "loader/reader.h"
#include "loader/reader_int.h"
#include "tests/testutil.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libaio.h>
#include <liburing.h>
#include <openssl/evp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* Fixture                                                                                    */

#define N_FILES 6
static const uint64_t file_sizes[N_FILES] = {0, 1, 511, 4095, 4097, (8u << 20) + 13};
static char fixdir[1024];
static char paths[N_FILES][1200];
static unsigned char digests[N_FILES][32];  /* SHA-256 of each file, computed with EVP */

static uint8_t pattern(uint32_t f, uint64_t i)
{
    uint32_t x = (uint32_t)i * 0x9E3779B1u ^ (uint32_t)(i >> 32);
    return (uint8_t)((x >> 24) ^ (x >> 9) ^ (f * 37u + 1));
}

static void sha256_mem(const uint8_t *p, size_t n, unsigned char out[32])
{
    unsigned len = 0;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    EVP_DigestInit_ex(c, EVP_sha256(), NULL);
    EVP_DigestUpdate(c, p, n);
    EVP_DigestFinal_ex(c, out, &len);
    EVP_MD_CTX_free(c);
}

static void make_fixture(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(fixdir, sizeof fixdir, "%s/kl-reader-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(fixdir)) {
        perror("mkdtemp");
        exit(1);
    }
    for (uint32_t f = 0; f < N_FILES; f++) {
        snprintf(paths[f], sizeof paths[f], "%s/f%u.safetensors", fixdir, f);
        size_t n = (size_t)file_sizes[f];
        uint8_t *buf = malloc(n ? n : 1);
        for (size_t i = 0; i < n; i++)
            buf[i] = pattern(f, i);
        FILE *fp = fopen(paths[f], "wb");
        if (!fp || fwrite(buf, 1, n, fp) != n || fclose(fp) != 0) {
            perror(paths[f]);
            exit(1);
        }
        sha256_mem(buf, n, digests[f]);
        free(buf);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                    */

typedef struct cfg {
    kl_io_backend  backend;
    kl_direct_mode direct;
    const char    *name;
} cfg;

static const cfg cfgs[] = {
    {KL_IO_URING, KL_DIRECT_ON, "uring/direct"}, {KL_IO_URING, KL_DIRECT_OFF, "uring/buffered"},
    {KL_IO_AIO, KL_DIRECT_ON, "aio/direct"},     {KL_IO_AIO, KL_DIRECT_OFF, "aio/buffered"},
    {KL_IO_PREAD, KL_DIRECT_ON, "pread/direct"}, {KL_IO_PREAD, KL_DIRECT_OFF, "pread/buffered"},
};
#define N_CFGS ((int)(sizeof cfgs / sizeof cfgs[0]))

static const char *fmt_err(const kl_err *err)
{
    static char buf[1024];
    return kl_err_format(err, buf, sizeof buf);
}

/* Creates a reader for configuration c with every fixture file added (file f = index f).
 * Returns 0, or 1 after printing a skip message when the sandbox cannot run c. */
static int open_cfg(const cfg *c, size_t buf_bytes, unsigned qd, kl_reader **out)
{
    kl_reader_opts o = {.backend = c->backend, .direct = c->direct, .buf_bytes = buf_bytes,
                        .queue_depth = qd, .threads = 3};
    kl_err err;
    kl_err_clear(&err);
    kl_reader *r = NULL;
    int rc = kl_reader_create(&r, &o, &err);
    if (rc == KL_E_UNSUPPORTED) {
        fprintf(stderr, "skip %s: %s\n", c->name, fmt_err(&err));
        return 1;
    }
    ck_assert_msg(rc == 0, "%s: create: expected 0, got %d (%s)", c->name, rc, fmt_err(&err));
    for (uint32_t f = 0; f < N_FILES; f++) {
        rc = kl_reader_add_file(r, paths[f], &err);
        if (rc == KL_E_UNSUPPORTED && c->direct == KL_DIRECT_ON) {
            fprintf(stderr, "skip %s: %s\n", c->name, fmt_err(&err));
            kl_reader_destroy(r);
            return 1;
        }
        ck_assert_msg(rc == (int)f, "%s: add %s: expected %u, got %d (%s)", c->name, paths[f], f,
                      rc, fmt_err(&err));
        ck_assert_msg(kl_reader_file_size(r, f) == file_sizes[f], "%s: size of file %u", c->name,
                      f);
    }
    kl_reader_stats st;
    kl_reader_get_stats(r, &st);
    ck_assert_msg(st.backend == c->backend, "%s: backend expected %s, got %s", c->name,
                  kl_io_backend_name(c->backend), kl_io_backend_name(st.backend));
    ck_assert_msg(st.direct == (c->direct == KL_DIRECT_ON), "%s: direct expected %d, got %d",
                  c->name, c->direct == KL_DIRECT_ON, st.direct);
    *out = r;
    return 0;
}

/* Checks order and content of every chunk against the extents. */
typedef struct checker {
    const kl_extent *ext;
    size_t           n_ext;
    size_t           cur;        /* extent expected next */
    uint64_t         next_off;   /* offset expected next within it */
    uint64_t         bytes;
    size_t           chunks;
    size_t           cancel_at;  /* return 1 on this chunk number (1-based), 0 = never */
    const char      *name;
} checker;

static int check_chunk(void *ctx, size_t ext_idx, uint64_t ext_off, const uint8_t *data,
                       size_t len)
{
    checker *k = ctx;
    k->chunks++;
    /* Skip zero-length extents, which produce no callback. */
    while (k->cur < k->n_ext && k->next_off == k->ext[k->cur].len) {
        k->cur++;
        k->next_off = 0;
    }
    ck_assert_msg(ext_idx == k->cur && ext_off == k->next_off,
                  "%s: chunk %zu out of order: expected extent %zu @ %" PRIu64
                  ", got extent %zu @ %" PRIu64,
                  k->name, k->chunks, k->cur, k->next_off, ext_idx, ext_off);
    const kl_extent *e = &k->ext[ext_idx];
    ck_assert_msg(len > 0 && ext_off + len <= e->len, "%s: chunk length %zu at %" PRIu64
                  " of extent %zu (len %" PRIu64 ")", k->name, len, ext_off, ext_idx, e->len);
    for (size_t i = 0; i < len; i++) {
        uint64_t fo = e->off + ext_off + i;
        if (data[i] != pattern(e->file, fo))
            ck_abort_msg("%s: file %u byte %" PRIu64 ": expected 0x%02x, got 0x%02x", k->name,
                         e->file, fo, pattern(e->file, fo), data[i]);
    }
    k->next_off += len;
    k->bytes += len;
    return k->cancel_at && k->chunks == k->cancel_at;
}

static void run_and_check(kl_reader *r, const kl_extent *ext, size_t n, const char *name)
{
    checker k = {.ext = ext, .n_ext = n, .name = name};
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_reader_run(r, ext, n, check_chunk, &k, &err);
    ck_assert_msg(rc == 0, "%s: run: expected 0, got %d (%s)", name, rc, fmt_err(&err));
    uint64_t want = 0;
    for (size_t i = 0; i < n; i++)
        want += ext[i].len;
    ck_assert_msg(k.bytes == want, "%s: delivered %" PRIu64 " bytes, expected %" PRIu64, name,
                  k.bytes, want);
}

static size_t mem_at_start;

static void mem_setup(void) { mem_at_start = kl_mem_in_use(); }

static void mem_teardown(void)
{
    kl_reader_set_sys(NULL);
    ck_assert_msg(kl_mem_in_use() == mem_at_start, "leak: %zu bytes in use, %zu at start",
                  kl_mem_in_use(), mem_at_start);
}

/* ------------------------------------------------------------------------------------------ */
/* Whole files, SHA-256, extents (loop over configurations)                                   */

START_TEST(reader_whole_files_match_pattern_and_sha256)
{
    const cfg *c = &cfgs[_i];
    kl_reader *r;
    if (open_cfg(c, 1 << 20, 4, &r))
        return;
    for (uint32_t f = 0; f < N_FILES; f++) {
        kl_extent e = {.file = f, .off = 0, .len = file_sizes[f]};
        checker k = {.ext = &e, .n_ext = 1, .name = c->name};
        unsigned char md[32];
        kl_err err;
        kl_err_clear(&err);
        int rc = kl_reader_stream_file(r, f, md, check_chunk, &k, &err);
        ck_assert_msg(rc == 0, "%s: stream file %u: got %d (%s)", c->name, f, rc, fmt_err(&err));
        ck_assert_msg(k.bytes == file_sizes[f], "%s: file %u: %" PRIu64 " bytes, expected %" PRIu64,
                      c->name, f, k.bytes, file_sizes[f]);
        ck_assert_msg(!memcmp(md, digests[f], 32), "%s: file %u: SHA-256 differs", c->name, f);
    }
    kl_reader_stats st;
    kl_reader_get_stats(r, &st);
    uint64_t total = 0;
    for (int f = 0; f < N_FILES; f++)
        total += file_sizes[f];
    ck_assert_msg(st.bytes == total, "%s: stats.bytes %" PRIu64 ", expected %" PRIu64, c->name,
                  st.bytes, total);
    kl_reader_destroy(r);
}
END_TEST

START_TEST(reader_unaligned_extents_deliver_exact_bytes)
{
    const cfg *c = &cfgs[_i];
    kl_reader *r;
    /* 64 KiB chunks and 3 slots: extents span many chunk boundaries and the ring wraps. */
    if (open_cfg(c, 64 << 10, 3, &r))
        return;
    const uint64_t big = file_sizes[5];
    const kl_extent ext[] = {
        {5, 1, 10},            {5, 4095, 2},          {5, 4096, 4096},
        {5, 13, 1 << 20},      {5, 65535, 65538},     {5, big - 1, 1},
        {5, big - 4109, 4109}, {5, 0, 0},             {2, 510, 1},
        {2, 0, 511},           {3, 1, 4094},          {4, 4095, 2},
        {4, 4096, 1},          {1, 0, 1},             {0, 0, 0},
        {5, 7, big - 7},       {5, 3 << 20, 1},       {5, (64 << 10) - 1, (64 << 10) + 2},
    };
    run_and_check(r, ext, sizeof ext / sizeof ext[0], c->name);
    kl_reader_destroy(r);
}
END_TEST

START_TEST(reader_many_random_extents_across_files_arrive_in_order)
{
    const cfg *c = &cfgs[_i];
    kl_reader *r;
    if (open_cfg(c, 16 << 10, 5, &r))
        return;
    enum { N = 400 };
    kl_extent *ext = calloc(N, sizeof *ext);
    kl_rng rng;
    kl_rng_seed(&rng, 42, (uint64_t)_i);
    for (size_t i = 0; i < N; i++) {
        uint32_t f = 1 + (uint32_t)(kl_rng_next(&rng) % (N_FILES - 1));
        uint64_t sz = file_sizes[f];
        uint64_t off = kl_rng_next(&rng) % sz;
        uint64_t max = sz - off;
        uint64_t cap = max < 100000 ? max : 100000;
        uint64_t len = kl_rng_next(&rng) % 4 == 0 ? 0 : 1 + kl_rng_next(&rng) % cap;
        ext[i] = (kl_extent){f, off, len};
    }
    run_and_check(r, ext, N, c->name);
    free(ext);
    kl_reader_destroy(r);
}
END_TEST

START_TEST(reader_callback_cancel_stops_and_reader_is_reusable)
{
    const cfg *c = &cfgs[_i];
    kl_reader *r;
    if (open_cfg(c, 64 << 10, 4, &r))
        return;
    kl_extent e = {5, 0, file_sizes[5]};
    checker k = {.ext = &e, .n_ext = 1, .name = c->name, .cancel_at = 3};
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_reader_run(r, &e, 1, check_chunk, &k, &err);
    ck_assert_msg(rc == KL_E_CANCELLED, "%s: expected KL_E_CANCELLED, got %d", c->name, rc);
    ck_assert_msg(k.chunks == 3, "%s: %zu callbacks after cancelling at the 3rd", c->name,
                  k.chunks);
    ck_assert_msg(err.code == KL_E_CANCELLED && !strcmp(err.file, paths[5]),
                  "%s: error should name the file: %s", c->name, fmt_err(&err));
    run_and_check(r, &e, 1, c->name);
    kl_reader_destroy(r);
}
END_TEST

START_TEST(reader_extent_past_eof_is_io_error_naming_file_and_offset)
{
    const cfg *c = &cfgs[_i];
    kl_reader *r;
    if (open_cfg(c, 64 << 10, 4, &r))
        return;
    kl_extent e = {2, 500, 20};
    checker k = {.ext = &e, .n_ext = 1, .name = c->name};
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_reader_run(r, &e, 1, check_chunk, &k, &err);
    ck_assert_msg(rc == KL_E_IO, "%s: expected KL_E_IO, got %d", c->name, rc);
    ck_assert_msg(!strcmp(err.file, paths[2]) && err.offset == 511,
                  "%s: expected file %s @ 511, got: %s", c->name, paths[2], fmt_err(&err));
    ck_assert_msg(k.chunks == 0, "%s: no data expected", c->name);
    kl_extent bad = {9, 0, 1};
    kl_err_clear(&err);
    rc = kl_reader_run(r, &bad, 1, check_chunk, &k, &err);
    ck_assert_msg(rc == KL_E_USAGE, "%s: unknown file index: expected KL_E_USAGE, got %d",
                  c->name, rc);
    kl_reader_destroy(r);
}
END_TEST

/* The file shrinks after it was opened: the read itself finds the end. */
START_TEST(reader_file_truncated_after_open_is_io_error_at_the_new_end)
{
    const cfg *c = &cfgs[_i];
    char dir[1024], p[1200];
    t_mkdtemp(dir, sizeof dir);
    snprintf(p, sizeof p, "%s/t.safetensors", dir);
    size_t n = 300000;
    uint8_t *buf = malloc(n);
    for (size_t i = 0; i < n; i++)
        buf[i] = pattern(0, i);
    t_write(p, buf, n);
    free(buf);
    kl_reader_opts o = {.backend = c->backend, .direct = c->direct, .buf_bytes = 64 << 10,
                        .queue_depth = 4};
    kl_err err;
    kl_err_clear(&err);
    kl_reader *r = NULL;
    int rc = kl_reader_create(&r, &o, &err);
    if (rc == KL_E_UNSUPPORTED) {
        fprintf(stderr, "skip %s: %s\n", c->name, fmt_err(&err));
        t_rmrf(dir);
        return;
    }
    int idx = kl_reader_add_file(r, p, &err);
    if (idx == KL_E_UNSUPPORTED) {
        fprintf(stderr, "skip %s: %s\n", c->name, fmt_err(&err));
        kl_reader_destroy(r);
        t_rmrf(dir);
        return;
    }
    ck_assert_msg(idx == 0, "%s: add: %s", c->name, fmt_err(&err));
    ck_assert(truncate(p, 100001) == 0);
    kl_extent e = {0, 0, n};
    checker k = {.ext = &e, .n_ext = 1, .name = c->name};
    rc = kl_reader_run(r, &e, 1, check_chunk, &k, &err);
    ck_assert_msg(rc == KL_E_IO, "%s: expected KL_E_IO, got %d (%s)", c->name, rc,
                  fmt_err(&err));
    ck_assert_msg(!strcmp(err.file, p) && err.offset == 100001,
                  "%s: expected %s @ 100001, got: %s", c->name, p, fmt_err(&err));
    ck_assert_msg(k.bytes <= 100001, "%s: %" PRIu64 " bytes delivered past the end", c->name,
                  k.bytes);
    /* The reader is still usable for what exists. */
    kl_extent ok = {0, 99000, 1001};
    run_and_check(r, &ok, 1, c->name);
    kl_reader_destroy(r);
    t_rmrf(dir);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Fault injection on the pread backend                                                       */

static atomic_int fault_mode;        /* which fault the fake pread injects */
static atomic_long fault_calls;
static atomic_long fault_off;        /* EIO mode: offset that fails */

enum { FAULT_SHORT = 1, FAULT_EINTR, FAULT_EIO, FAULT_EAGAIN_FOREVER };

static ssize_t fake_pread(int fd, void *buf, size_t n, off_t off)
{
    long call = atomic_fetch_add(&fault_calls, 1);
    switch (atomic_load(&fault_mode)) {
    case FAULT_EINTR:
        if (call % 2 == 0) {
            errno = EINTR;
            return -1;
        }
        break;
    case FAULT_EAGAIN_FOREVER:
        errno = EAGAIN;
        return -1;
    case FAULT_EIO:
        if ((long)off <= atomic_load(&fault_off) && atomic_load(&fault_off) < (long)(off + n)) {
            errno = EIO;
            return -1;
        }
        break;
    case FAULT_SHORT: {
        /* Do the real read, then claim fewer bytes.  Buffered: an odd third.  O_DIRECT:
         * alternately whole 512-byte blocks (as the kernel would) and all but 7 bytes, which
         * forces the resubmit to restart at an aligned offset below the bytes already held. */
        ssize_t k = pread(fd, buf, n, off);
        if (k <= 4096)
            return k;
        if (!(fcntl(fd, F_GETFL) & O_DIRECT))
            return k / 3 + 1;
        return call % 2 ? k - 7 : (k / 3) & ~(ssize_t)511;
    }
    default: break;
    }
    return pread(fd, buf, n, off);
}

static kl_reader *open_pread(kl_direct_mode direct, const char *name)
{
    kl_reader_sys sys = {.pread = fake_pread};
    kl_reader_set_sys(&sys);
    cfg c = {KL_IO_PREAD, direct, name};
    kl_reader *r = NULL;
    if (open_cfg(&c, 64 << 10, 4, &r))
        return NULL;
    return r;
}

START_TEST(pread_short_reads_are_resubmitted_and_counted)
{
    kl_direct_mode d = _i ? KL_DIRECT_OFF : KL_DIRECT_ON;
    const char *name = _i ? "pread/buffered short" : "pread/direct short";
    atomic_store(&fault_mode, FAULT_SHORT);
    kl_reader *r = open_pread(d, name);
    if (!r)
        return;
    kl_extent ext[] = {{5, 3, file_sizes[5] - 3}, {4, 0, 4097}, {2, 100, 411}};
    run_and_check(r, ext, 3, name);
    unsigned char md[32];
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_reader_stream_file(r, 5, md, NULL, NULL, &err) == 0, "%s: %s", name,
                  fmt_err(&err));
    ck_assert_msg(!memcmp(md, digests[5], 32), "%s: SHA-256 differs under short reads", name);
    kl_reader_stats st;
    kl_reader_get_stats(r, &st);
    ck_assert_msg(st.short_reads > 10, "%s: expected short reads counted, got %" PRIu64, name,
                  st.short_reads);
    ck_assert_msg(st.reads > st.short_reads, "%s: reads %" PRIu64 " <= short_reads", name,
                  st.reads);
    kl_reader_destroy(r);
}
END_TEST

START_TEST(pread_eintr_is_retried)
{
    kl_direct_mode d = _i ? KL_DIRECT_OFF : KL_DIRECT_ON;
    const char *name = _i ? "pread/buffered eintr" : "pread/direct eintr";
    atomic_store(&fault_mode, FAULT_EINTR);
    kl_reader *r = open_pread(d, name);
    if (!r)
        return;
    kl_extent ext[] = {{5, 4095, 1 << 20}, {3, 0, 4095}};
    run_and_check(r, ext, 2, name);
    ck_assert_msg(atomic_load(&fault_calls) > 2 * 16, "%s: fake pread called %ld times", name,
                  atomic_load(&fault_calls));
    kl_reader_destroy(r);
}
END_TEST

START_TEST(pread_eio_is_io_error_naming_file_and_offset)
{
    kl_direct_mode d = _i ? KL_DIRECT_OFF : KL_DIRECT_ON;
    const char *name = _i ? "pread/buffered eio" : "pread/direct eio";
    atomic_store(&fault_mode, FAULT_EIO);
    atomic_store(&fault_off, 5L << 20);
    kl_reader *r = open_pread(d, name);
    if (!r)
        return;
    kl_extent e = {5, 0, file_sizes[5]};
    checker k = {.ext = &e, .n_ext = 1, .name = name};
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_reader_run(r, &e, 1, check_chunk, &k, &err);
    ck_assert_msg(rc == KL_E_IO, "%s: expected KL_E_IO, got %d", name, rc);
    ck_assert_msg(err.sys_errno == EIO && !strcmp(err.file, paths[5]) &&
                      err.offset == (5u << 20),
                  "%s: expected EIO on %s @ %u, got: %s", name, paths[5], 5u << 20,
                  fmt_err(&err));
    ck_assert_msg(k.bytes == (5u << 20), "%s: expected the %u bytes before the fault, got %" PRIu64,
                  name, 5u << 20, k.bytes);
    /* Same reader, bytes before the bad spot: fine. */
    kl_extent ok = {5, 0, 1 << 20};
    run_and_check(r, &ok, 1, name);
    kl_reader_destroy(r);
}
END_TEST

START_TEST(pread_endless_eagain_gives_up_with_io_error)
{
    atomic_store(&fault_mode, FAULT_EAGAIN_FOREVER);
    kl_reader *r = open_pread(KL_DIRECT_OFF, "pread/eagain");
    if (!r)
        return;
    kl_extent e = {4, 0, 4097};
    checker k = {.ext = &e, .n_ext = 1, .name = "pread/eagain"};
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_reader_run(r, &e, 1, check_chunk, &k, &err);
    ck_assert_msg(rc == KL_E_IO && err.sys_errno == EAGAIN, "expected KL_E_IO/EAGAIN, got %d: %s",
                  rc, fmt_err(&err));
    kl_reader_destroy(r);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Backend selection and O_DIRECT fallback                                                    */

static int no_uring(unsigned entries, struct io_uring *ring, unsigned flags)
{
    (void)entries, (void)ring, (void)flags;
    return -ENOSYS;
}

static int no_aio(int nr, struct io_context **ctx)
{
    (void)nr, (void)ctx;
    return -EPERM;
}

START_TEST(forced_unavailable_backend_is_a_clean_unsupported_error)
{
    kl_reader_sys sys = {.uring_init = no_uring, .aio_setup = no_aio};
    kl_reader_set_sys(&sys);
    const struct {
        kl_io_backend b;
        int           errno_;
        const char   *word;
    } rows[] = {{KL_IO_URING, ENOSYS, "io_uring"}, {KL_IO_AIO, EPERM, "libaio"}};
    for (size_t i = 0; i < 2; i++) {
        kl_reader_opts o = {.backend = rows[i].b};
        kl_reader *r = (kl_reader *)1;
        kl_err err;
        kl_err_clear(&err);
        int rc = kl_reader_create(&r, &o, &err);
        ck_assert_msg(rc == KL_E_UNSUPPORTED, "%s: expected KL_E_UNSUPPORTED, got %d",
                      rows[i].word, rc);
        ck_assert_msg(r == (kl_reader *)1, "%s: out written on failure", rows[i].word);
        ck_assert_msg(err.sys_errno == rows[i].errno_ && strstr(err.msg, rows[i].word),
                      "%s: message should name the backend and errno: %s", rows[i].word,
                      fmt_err(&err));
    }
}
END_TEST

START_TEST(auto_falls_back_uring_then_aio_then_pread)
{
    const struct {
        kl_reader_sys  sys;
        kl_direct_mode direct;
        kl_io_backend  want;
    } rows[] = {
        {{0}, KL_DIRECT_AUTO, KL_IO_URING},
        {{.uring_init = no_uring}, KL_DIRECT_AUTO, KL_IO_AIO},
        {{.uring_init = no_uring, .aio_setup = no_aio}, KL_DIRECT_AUTO, KL_IO_PREAD},
        {{0}, KL_DIRECT_OFF, KL_IO_PREAD},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        kl_reader_set_sys(&rows[i].sys);
        kl_reader_opts o = {.direct = rows[i].direct, .buf_bytes = 64 << 10, .queue_depth = 2};
        kl_reader *r = NULL;
        kl_err err;
        kl_err_clear(&err);
        int rc = kl_reader_create(&r, &o, &err);
        if (rc == KL_E_UNSUPPORTED && i == 0) {
            fprintf(stderr, "skip auto row 0: %s\n", fmt_err(&err));
            continue;
        }
        ck_assert_msg(rc == 0, "row %zu: create: %s", i, fmt_err(&err));
        kl_reader_stats st;
        kl_reader_get_stats(r, &st);
        if (i == 0 && st.backend != KL_IO_URING) {
            fprintf(stderr, "skip auto row 0: io_uring unavailable, got %s\n",
                    kl_io_backend_name(st.backend));
        } else {
            ck_assert_msg(st.backend == rows[i].want, "row %zu: expected %s, got %s", i,
                          kl_io_backend_name(rows[i].want), kl_io_backend_name(st.backend));
        }
        ck_assert_msg(kl_reader_add_file(r, paths[4], &err) == 0, "row %zu: %s", i,
                      fmt_err(&err));
        unsigned char md[32];
        ck_assert_msg(kl_reader_stream_file(r, 0, md, NULL, NULL, &err) == 0, "row %zu: %s", i,
                      fmt_err(&err));
        ck_assert_msg(!memcmp(md, digests[4], 32), "row %zu: SHA-256 differs", i);
        kl_reader_destroy(r);
    }
}
END_TEST

static int open_no_direct(const char *path, int flags)
{
    if (flags & O_DIRECT) {
        errno = EINVAL;
        return -1;
    }
    return open(path, flags);
}

static int align_unsupported(int fd, uint32_t *mem, uint32_t *off)
{
    (void)fd, (void)mem, (void)off;
    return -1;
}

START_TEST(o_direct_refused_falls_back_to_buffered_in_auto_and_fails_when_forced)
{
    const kl_reader_sys rows[] = {{.open = open_no_direct}, {.dio_align = align_unsupported}};
    for (size_t i = 0; i < 2; i++) {
        kl_reader_set_sys(&rows[i]);
        for (int forced = 0; forced < 2; forced++) {
            kl_reader_opts o = {.backend = KL_IO_PREAD,
                                .direct = forced ? KL_DIRECT_ON : KL_DIRECT_AUTO,
                                .buf_bytes = 64 << 10, .queue_depth = 2};
            kl_reader *r = NULL;
            kl_err err;
            kl_err_clear(&err);
            ck_assert(kl_reader_create(&r, &o, &err) == 0);
            int rc = kl_reader_add_file(r, paths[5], &err);
            if (forced) {
                ck_assert_msg(rc == KL_E_UNSUPPORTED && !strcmp(err.file, paths[5]),
                              "row %zu forced: expected KL_E_UNSUPPORTED naming the file, "
                              "got %d: %s",
                              i, rc, fmt_err(&err));
            } else {
                ck_assert_msg(rc == 0, "row %zu auto: %s", i, fmt_err(&err));
                unsigned char md[32];
                ck_assert(kl_reader_stream_file(r, 0, md, NULL, NULL, &err) == 0);
                ck_assert_msg(!memcmp(md, digests[5], 32), "row %zu: SHA-256 differs", i);
                kl_reader_stats st;
                kl_reader_get_stats(r, &st);
                ck_assert_msg(st.direct == 0, "row %zu: expected buffered fallback", i);
            }
            kl_reader_destroy(r);
        }
    }
}
END_TEST

START_TEST(bad_options_and_files_are_rejected)
{
    kl_err err;
    kl_reader *r = NULL;
    const kl_reader_opts bad[] = {
        {.backend = (kl_io_backend)7},
        {.direct = (kl_direct_mode)9},
        {.buf_bytes = (size_t)2 << 30},
        {.queue_depth = 100000},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kl_err_clear(&err);
        int rc = kl_reader_create(&r, &bad[i], &err);
        ck_assert_msg(rc == KL_E_USAGE, "opts row %zu: expected KL_E_USAGE, got %d", i, rc);
    }
    kl_reader_opts o = {.backend = KL_IO_PREAD, .queue_depth = 2, .buf_bytes = 4096};
    ck_assert(kl_reader_create(&r, &o, NULL) == 0);
    kl_err_clear(&err);
    char missing[1300];
    snprintf(missing, sizeof missing, "%s/missing.safetensors", fixdir);
    int rc = kl_reader_add_file(r, missing, &err);
    ck_assert_msg(rc == KL_E_IO && err.sys_errno == ENOENT && !strcmp(err.file, missing),
                  "missing file: got %d: %s", rc, fmt_err(&err));
    kl_err_clear(&err);
    rc = kl_reader_add_file(r, fixdir, &err);
    ck_assert_msg(rc == KL_E_FORMAT && !strcmp(err.rule, "FILE-NOT-REGULAR") &&
                      !strcmp(err.file, fixdir),
                  "directory: got %d: %s", rc, fmt_err(&err));
    ck_assert(kl_io_backend_parse("uring") == KL_IO_URING);
    ck_assert(kl_io_backend_parse("aio") == KL_IO_AIO);
    ck_assert(kl_io_backend_parse("pread") == KL_IO_PREAD);
    ck_assert(kl_io_backend_parse("auto") == KL_IO_AUTO);
    ck_assert(kl_io_backend_parse("mmap") == -1);
    kl_reader_destroy(r);
    kl_reader_destroy(NULL);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* SHA-256 against known digests, hash pass, directory listing                                */

START_TEST(sha256_of_abc_and_empty_match_known_digests)
{
    char dir[1024], p[1200];
    t_mkdtemp(dir, sizeof dir);
    snprintf(p, sizeof p, "%s/abc", dir);
    t_write(p, "abc", 3);
    kl_reader_opts o = {.buf_bytes = 4096, .queue_depth = 2};
    kl_reader *r = NULL;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_reader_create(&r, &o, &err) == 0, "%s", fmt_err(&err));
    ck_assert(kl_reader_add_file(r, p, &err) == 0);
    ck_assert(kl_reader_add_file(r, paths[0], &err) == 1);
    unsigned char md[32];
    char hex[65];
    ck_assert(kl_reader_stream_file(r, 0, md, NULL, NULL, &err) == 0);
    kl_sha256_hex(md, hex);
    ck_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    ck_assert(kl_reader_stream_file(r, 1, md, NULL, NULL, &err) == 0);
    kl_sha256_hex(md, hex);
    ck_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    kl_extent e = {0, 1, 2};
    ck_assert_msg(kl_reader_run(r, &e, 1, NULL, NULL, &err) == 0, "run without a callback: %s",
                  fmt_err(&err));
    kl_reader_destroy(r);
    t_rmrf(dir);
}
END_TEST

START_TEST(hashpass_hashes_every_file_in_parallel_and_reports_failures)
{
    kl_hashpass_file files[N_FILES + 1];
    memset(files, 0, sizeof files);
    for (int f = 0; f < N_FILES; f++)
        files[f].path = paths[f];
    kl_hashpass_opts o = {.threads = 3, .reader = {.buf_bytes = 64 << 10}};
    kl_hashpass_stats st;
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_hashpass_run(files, N_FILES, &o, &st, &err);
    ck_assert_msg(rc == 0, "hashpass: %s", fmt_err(&err));
    uint64_t total = 0;
    for (int f = 0; f < N_FILES; f++) {
        ck_assert_msg(files[f].rc == 0 && files[f].size_bytes == file_sizes[f],
                      "file %d: rc %d size %" PRIu64, f, files[f].rc, files[f].size_bytes);
        ck_assert_msg(!memcmp(files[f].sha256, digests[f], 32), "file %d: SHA-256 differs", f);
        total += file_sizes[f];
    }
    ck_assert_msg(st.bytes == total && st.threads == 3, "stats: bytes %" PRIu64 " threads %u",
                  st.bytes, st.threads);

    char missing[1300];
    snprintf(missing, sizeof missing, "%s/gone.safetensors", fixdir);
    files[N_FILES].path = missing;
    kl_err_clear(&err);
    rc = kl_hashpass_run(files, N_FILES + 1, NULL, NULL, &err);
    ck_assert_msg(rc == KL_E_IO && !strcmp(err.file, missing), "missing file: got %d: %s", rc,
                  fmt_err(&err));
    ck_assert_msg(files[N_FILES].rc == KL_E_IO && files[5].rc == 0,
                  "per-file results: %d %d", files[N_FILES].rc, files[5].rc);
    ck_assert(!memcmp(files[5].sha256, digests[5], 32));
}
END_TEST

START_TEST(list_files_with_suffix_is_sorted_and_skips_dirs_and_dotfiles)
{
    char dir[1024], p[1200];
    t_mkdtemp(dir, sizeof dir);
    const char *names[] = {"b.safetensors", "a.safetensors", ".hidden.safetensors",
                           "c.json", "model-00002-of-00002.safetensors",
                           "model-00001-of-00002.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        t_write(p, "x", 1);
    }
    snprintf(p, sizeof p, "%s/d.safetensors", dir);
    ck_assert(mkdir(p, 0755) == 0);
    char **list = NULL;
    size_t n = 0;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_list_files_with_suffix(dir, ".safetensors", &list, &n, &err) == 0, "%s",
                  fmt_err(&err));
    const char *want[] = {"a.safetensors", "b.safetensors", "model-00001-of-00002.safetensors",
                          "model-00002-of-00002.safetensors"};
    ck_assert_msg(n == 4, "expected 4 names, got %zu", n);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(!strcmp(list[i], want[i]), "name %zu: expected %s, got %s", i, want[i],
                      list[i]);
    kl_free_name_list(list, n);
    ck_assert(kl_list_files_with_suffix(dir, ".bin", &list, &n, &err) == 0 && n == 0 && !list);
    kl_err_clear(&err);
    snprintf(p, sizeof p, "%s/nope", dir);
    ck_assert(kl_list_files_with_suffix(p, ".safetensors", &list, &n, &err) == KL_E_IO);
    ck_assert_msg(!strcmp(err.file, p), "error should name the directory: %s", fmt_err(&err));
    t_rmrf(dir);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* kl read                                                                                    */

/* Runs cmd_read with stdout captured into out (NUL-terminated); returns the exit status. */
static int run_read(const char **args, size_t n_args, char *out, size_t out_n)
{
    char *argv[16] = {"read"};
    for (size_t i = 0; i < n_args; i++)
        argv[1 + i] = (char *)args[i];
    char cap[1300];
    snprintf(cap, sizeof cap, "%s/stdout.txt", fixdir);
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    int fd = open(cap, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert(saved >= 0 && fd >= 0);
    dup2(fd, STDOUT_FILENO);
    close(fd);
    int status = cmd_read((int)n_args + 1, argv);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    FILE *fp = fopen(cap, "rb");
    size_t k = fread(out, 1, out_n - 1, fp);
    out[k] = 0;
    fclose(fp);
    unlink(cap);
    return status;
}

START_TEST(kl_read_json_hash_lists_every_file_with_its_sha256)
{
    static char out[1 << 16];
    const char *args[] = {fixdir, "--hash", "--json", "--chunk", "64K", "--threads", "2"};
    int status = run_read(args, 7, out, sizeof out);
    ck_assert_msg(status == 0, "exit %d, output: %s", status, out);
    cJSON *j = cJSON_Parse(out);
    ck_assert_msg(j != NULL, "not JSON: %s", out);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(j, "ok")));
    ck_assert_str_eq(cJSON_GetObjectItem(j, "command")->valuestring, "read");
    ck_assert_msg(cJSON_GetObjectItem(j, "files")->valuedouble == N_FILES, "files: %s", out);
    uint64_t total = 0;
    for (int f = 0; f < N_FILES; f++)
        total += file_sizes[f];
    ck_assert_msg((uint64_t)cJSON_GetObjectItem(j, "bytes")->valuedouble == total, "bytes: %s",
                  out);
    const char *keys[] = {"kl_version", "backend", "direct", "elapsed_s", "read_gbps"};
    for (size_t i = 0; i < 5; i++)
        ck_assert_msg(cJSON_GetObjectItem(j, keys[i]) != NULL, "missing key %s", keys[i]);
    cJSON *h = cJSON_GetObjectItem(j, "hashes");
    ck_assert_msg(cJSON_GetArraySize(h) == N_FILES, "hashes: %s", out);
    for (int f = 0; f < N_FILES; f++) {
        cJSON *e = cJSON_GetArrayItem(h, f);
        char hex[65];
        kl_sha256_hex(digests[f], hex);
        ck_assert_str_eq(cJSON_GetObjectItem(e, "file")->valuestring, paths[f]);
        ck_assert_str_eq(cJSON_GetObjectItem(e, "sha256")->valuestring, hex);
        ck_assert(cJSON_GetObjectItem(e, "size_bytes")->valuedouble == (double)file_sizes[f]);
    }
    cJSON_Delete(j);
}
END_TEST

START_TEST(kl_read_repeat_reports_every_round_against_its_ceiling_pass)
{
    static char out[1 << 14];
    const char *args[] = {fixdir, "--mapped", "--repeat", "3", "--ceiling-size", "4M", "--json"};
    int status = run_read(args, 7, out, sizeof out);
    ck_assert_msg(status == 0, "exit %d, output: %s", status, out);
    cJSON *j = cJSON_Parse(out);
    ck_assert_msg(j != NULL, "not JSON: %s", out);
    ck_assert_int_eq(cJSON_GetObjectItem(j, "rounds")->valueint, 3);
    ck_assert(cJSON_GetObjectItem(j, "ceiling_buffer_bytes")->valuedouble == 4 << 20);
    double ratio = cJSON_GetObjectItem(j, "ceiling_ratio")->valuedouble;
    double median = cJSON_GetObjectItem(j, "read_gbps")->valuedouble;
    double best = cJSON_GetObjectItem(j, "read_best_gbps")->valuedouble;
    ck_assert_msg(ratio > 0 && median > 0 && best >= median, "figures: %s", out);
    cJSON *rounds = cJSON_GetObjectItem(j, "round_gbps");
    ck_assert_int_eq(cJSON_GetArraySize(rounds), 3);
    for (int i = 0; i < 3; i++) {
        cJSON *pair = cJSON_GetArrayItem(rounds, i);
        ck_assert_int_eq(cJSON_GetArraySize(pair), 2);
        ck_assert(cJSON_GetArrayItem(pair, 0)->valuedouble > 0);
        ck_assert(cJSON_GetArrayItem(pair, 1)->valuedouble > 0);
    }
    cJSON_Delete(j);
    const char *zero[] = {fixdir, "--repeat", "0"};
    const char *many[] = {fixdir, "--repeat", "101"};
    ck_assert_int_eq(run_read(zero, 3, out, sizeof out), 2);
    ck_assert_int_eq(run_read(many, 3, out, sizeof out), 2);
}
END_TEST

START_TEST(kl_read_usage_and_io_errors_exit_2)
{
    static char out[1 << 14];
    char missing[1300];
    snprintf(missing, sizeof missing, "%s/nothing-here", fixdir);
    const char *bad_opt[] = {fixdir, "--frobnicate"};
    const char *bad_io[] = {fixdir, "--io", "mmap"};
    const char *none[] = {"--json"};
    const char *gone[] = {missing, "--json"};
    ck_assert_int_eq(run_read(bad_opt, 2, out, sizeof out), 2);
    ck_assert_int_eq(run_read(bad_io, 3, out, sizeof out), 2);
    ck_assert_int_eq(run_read(none, 1, out, sizeof out), 2);
    ck_assert_int_eq(run_read(gone, 2, out, sizeof out), 2);
    cJSON *j = cJSON_Parse(out);
    ck_assert_msg(j && cJSON_IsFalse(cJSON_GetObjectItem(j, "ok")), "error JSON: %s", out);
    cJSON *e = cJSON_GetObjectItem(j, "error");
    ck_assert_msg(e && !strcmp(cJSON_GetObjectItem(e, "file")->valuestring, missing),
                  "error should name the path: %s", out);
    cJSON_Delete(j);
    const char *plain[] = {paths[5], paths[4], "--io", "pread", "--buffered"};
    ck_assert_int_eq(run_read(plain, 5, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "2 files, 8392718 bytes") && strstr(out, "backend pread") &&
                      strstr(out, "direct no"),
                  "text output: %s", out);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Files that are not regular, descriptor limits, closing files                               */

/* A FIFO with no writer would block open(2) forever: every configuration must refuse it at
 * once with FILE-NOT-REGULAR naming the path, and leave regular files blocking. */
START_TEST(reader_fifo_is_refused_at_once_and_regular_files_stay_blocking)
{
    const cfg *c = &cfgs[_i];
    char dir[1024], fifo[1200];
    t_mkdtemp(dir, sizeof dir);
    snprintf(fifo, sizeof fifo, "%s/model.safetensors", dir);
    ck_assert_msg(mkfifo(fifo, 0644) == 0, "mkfifo %s: %s", fifo, strerror(errno));
    kl_reader *r;
    if (open_cfg(c, 64 << 10, 4, &r)) {
        t_rmrf(dir);
        return;
    }
    const char *others[] = {fifo, dir, "/dev/null"};
    for (size_t i = 0; i < 3; i++) {
        struct stat st;
        if (stat(others[i], &st) != 0)
            continue;
        kl_err err;
        kl_err_clear(&err);
        int rc = kl_reader_add_file(r, others[i], &err);
        ck_assert_msg(rc == KL_E_FORMAT && !strcmp(err.rule, "FILE-NOT-REGULAR") &&
                          !strcmp(err.file, others[i]),
                      "%s: %s: expected KL_E_FORMAT [FILE-NOT-REGULAR] naming the path, got %d: %s",
                      c->name, others[i], rc, fmt_err(&err));
    }
    for (uint32_t f = 0; f < N_FILES; f++) {
        int fl = fcntl(r->files[f].fd, F_GETFL);
        ck_assert_msg(fl >= 0 && !(fl & O_NONBLOCK), "%s: file %u still has O_NONBLOCK", c->name,
                      f);
    }
    /* The refused paths took no index. */
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_reader_add_file(r, paths[1], &err) == N_FILES, "%s: next index: %s",
                  c->name, fmt_err(&err));
    kl_extent ext[] = {{5, 0, file_sizes[5]}, {4, 1, 4096}};
    run_and_check(r, ext, 2, c->name);
    unsigned char md[32];
    ck_assert_msg(kl_reader_stream_file(r, N_FILES, md, NULL, NULL, &err) == 0, "%s: %s",
                  c->name, fmt_err(&err));
    ck_assert_msg(!memcmp(md, digests[1], 32), "%s: SHA-256 of the file added last", c->name);
    kl_reader_destroy(r);
    t_rmrf(dir);
}
END_TEST

START_TEST(hashpass_and_kl_read_refuse_a_fifo_with_the_whole_error)
{
    char dir[1024], fifo[1200];
    t_mkdtemp(dir, sizeof dir);
    snprintf(fifo, sizeof fifo, "%s/model.safetensors", dir);
    ck_assert(mkfifo(fifo, 0644) == 0);
    kl_hashpass_file files[2];
    memset(files, 0, sizeof files);
    files[0].path = paths[4];
    files[1].path = fifo;
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_hashpass_run(files, 2, NULL, NULL, &err);
    ck_assert_msg(rc == KL_E_FORMAT && err.code == KL_E_FORMAT &&
                      !strcmp(err.rule, "FILE-NOT-REGULAR") && !strcmp(err.file, fifo) &&
                      !strcmp(err.msg, files[1].err.msg),
                  "hashpass: expected the file's whole error, got %d: %s", rc, fmt_err(&err));
    ck_assert_msg(files[0].rc == 0 && !memcmp(files[0].sha256, digests[4], 32),
                  "the regular file is still hashed: rc %d", files[0].rc);
    static char out[1 << 14];
    const char *plain[] = {dir};
    const char *hash[] = {dir, "--hash"};
    ck_assert_int_eq(run_read(plain, 1, out, sizeof out), 2);
    ck_assert_int_eq(run_read(hash, 2, out, sizeof out), 2);
    t_rmrf(dir);
}
END_TEST

START_TEST(closed_file_keeps_its_index_and_size_and_cannot_be_read)
{
    kl_reader_opts o = {.backend = KL_IO_PREAD, .buf_bytes = 4096, .queue_depth = 2};
    kl_reader *r = NULL;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_reader_create(&r, &o, &err) == 0, "%s", fmt_err(&err));
    ck_assert(kl_reader_add_file(r, paths[2], &err) == 0);
    ck_assert(kl_reader_add_file(r, paths[3], &err) == 1);
    ck_assert_msg(kl_reader_close_file(r, 0, &err) == 0, "close: %s", fmt_err(&err));
    ck_assert_msg(kl_reader_close_file(r, 0, &err) == 0, "second close: %s", fmt_err(&err));
    ck_assert_msg(kl_reader_close_file(r, 7, &err) == KL_E_USAGE, "unknown index");
    ck_assert_msg(kl_reader_file_size(r, 0) == file_sizes[2], "size after close");
    kl_err_clear(&err);
    ck_assert_msg(kl_reader_add_file(r, paths[2], &err) == 2, "closed index reused: %s",
                  fmt_err(&err));
    kl_extent e = {0, 0, 1};
    kl_err_clear(&err);
    int rc = kl_reader_run(r, &e, 1, NULL, NULL, &err);
    ck_assert_msg(rc == KL_E_USAGE && !strcmp(err.file, paths[2]),
                  "extent on a closed file: expected KL_E_USAGE naming it, got %d: %s", rc,
                  fmt_err(&err));
    kl_err_clear(&err);
    ck_assert(kl_reader_stream_file(r, 0, NULL, NULL, NULL, &err) == KL_E_USAGE);
    /* The other files are unaffected. */
    unsigned char md[32];
    ck_assert(kl_reader_stream_file(r, 1, md, NULL, NULL, &err) == 0);
    ck_assert_msg(!memcmp(md, digests[3], 32), "file 1: SHA-256 differs");
    ck_assert(kl_reader_stream_file(r, 2, md, NULL, NULL, &err) == 0);
    ck_assert_msg(!memcmp(md, digests[2], 32), "file 2: SHA-256 differs");
    kl_reader_destroy(r);
}
END_TEST

/* Writes n small distinct files f000.safetensors... into dir; fills their SHA-256. */
static void write_many(const char *dir, size_t n, unsigned char (*md)[32])
{
    for (size_t i = 0; i < n; i++) {
        char p[1200];
        uint8_t buf[700];
        size_t len = 1 + i * 7 % sizeof buf;
        for (size_t k = 0; k < len; k++)
            buf[k] = pattern((uint32_t)i, k);
        snprintf(p, sizeof p, "%s/f%03zu.safetensors", dir, i);
        t_write(p, buf, len);
        sha256_mem(buf, len, md[i]);
    }
}

/* More files than RLIMIT_NOFILE allows open at once: hash pass, kl read and kl read --hash
 * keep descriptors bounded.  Check forks each test, so the limit stays in this test. */
START_TEST(more_files_than_rlimit_nofile_are_read_and_hashed)
{
    enum { N = 100 };
    static unsigned char md[N][32];
    static char names[N][1200];
    char dir[1024];
    t_mkdtemp(dir, sizeof dir);
    write_many(dir, N, md);
    struct rlimit old, low;
    ck_assert(getrlimit(RLIMIT_NOFILE, &old) == 0);
    low = old;
    low.rlim_cur = 64;
    ck_assert_msg(setrlimit(RLIMIT_NOFILE, &low) == 0, "setrlimit: %s", strerror(errno));

    kl_hashpass_file files[N];
    memset(files, 0, sizeof files);
    for (size_t i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "%s/f%03zu.safetensors", dir, i);
        files[i].path = names[i];
    }
    kl_err err;
    for (int b = 0; b < 3; b++) {
        kl_hashpass_opts o = {.threads = 4, .reader = {.backend = (kl_io_backend)(KL_IO_URING + b),
                                                       .queue_depth = 2, .buf_bytes = 4096}};
        kl_err_clear(&err);
        int rc = kl_hashpass_run(files, N, &o, NULL, &err);
        if (rc == KL_E_UNSUPPORTED)
            continue;
        ck_assert_msg(rc == 0, "hashpass %s with RLIMIT_NOFILE 64: %s",
                      kl_io_backend_name(o.reader.backend), fmt_err(&err));
        for (size_t i = 0; i < N; i++)
            ck_assert_msg(!memcmp(files[i].sha256, md[i], 32), "%s: file %zu: SHA-256 differs",
                          kl_io_backend_name(o.reader.backend), i);
    }
    static char out[1 << 16];
    const char *runs[][4] = {{dir, "--io", "uring", "--json"},
                             {dir, "--io", "pread", "--json"},
                             {dir, "--buffered", "--json", NULL},
                             {dir, "--hash", "--json", NULL}};
    for (size_t i = 0; i < 4; i++) {
        size_t n = runs[i][3] ? 4 : 3;
        int status = run_read(runs[i], n, out, sizeof out);
        ck_assert_msg(status == 0, "kl read run %zu: exit %d: %s", i, status, out);
        cJSON *j = cJSON_Parse(out);
        ck_assert_msg(j && cJSON_GetObjectItem(j, "files")->valuedouble == N, "run %zu: %s", i,
                      out);
        cJSON_Delete(j);
    }
    ck_assert(setrlimit(RLIMIT_NOFILE, &old) == 0);
    t_rmrf(dir);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* A ring that stops reporting completions                                                    */

static atomic_int ring_fails;  /* fail the completion wait while set */

static int failing_getevents(struct io_context *ctx, long min_nr, long nr, struct io_event *ev)
{
    if (atomic_load(&ring_fails))
        return -EINVAL;
    return io_getevents(ctx, min_nr, nr, ev, NULL);
}

static int failing_uring_wait(struct io_uring *ring, unsigned wait_nr)
{
    if (atomic_load(&ring_fails))
        return -EBADFD;
    return io_uring_submit_and_wait(ring, wait_nr);
}

START_TEST(aio_reader_is_reusable_after_the_ring_fails)
{
    kl_reader_sys sys = {.aio_getevents = failing_getevents};
    kl_reader_set_sys(&sys);
    atomic_store(&ring_fails, 0);
    const cfg *c = &cfgs[_i ? 3 : 2];
    kl_reader *r;
    if (open_cfg(c, 64 << 10, 4, &r))
        return;
    kl_extent e = {5, 0, file_sizes[5]};
    atomic_store(&ring_fails, 1);
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_reader_run(r, &e, 1, NULL, NULL, &err);
    atomic_store(&ring_fails, 0);
    ck_assert_msg(rc == KL_E_IO && err.sys_errno == EINVAL && !strcmp(err.file, paths[5]),
                  "%s: expected KL_E_IO/EINVAL naming the file, got %d: %s", c->name, rc,
                  fmt_err(&err));
    ck_assert_msg(r->inflight == 0 && !r->broken, "%s: inflight %u broken %d after the error",
                  c->name, r->inflight, r->broken);
    run_and_check(r, &e, 1, c->name);
    kl_reader_destroy(r);
}
END_TEST

START_TEST(uring_reader_whose_ring_fails_is_unusable_and_says_so)
{
    kl_reader_sys sys = {.uring_wait = failing_uring_wait};
    kl_reader_set_sys(&sys);
    atomic_store(&ring_fails, 0);
    const cfg *c = &cfgs[_i ? 1 : 0];
    kl_reader *r;
    if (open_cfg(c, 64 << 10, 4, &r))
        return;
    kl_extent e = {5, 0, file_sizes[5]};
    atomic_store(&ring_fails, 1);
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_reader_run(r, &e, 1, NULL, NULL, &err);
    ck_assert_msg(rc == KL_E_IO && err.sys_errno == EBADFD,
                  "%s: expected KL_E_IO/EBADFD, got %d: %s", c->name, rc, fmt_err(&err));
    kl_err_clear(&err);
    rc = kl_reader_run(r, &e, 1, NULL, NULL, &err);
    ck_assert_msg(rc == KL_E_IO && strstr(err.msg, "unusable"),
                  "%s: next run: expected 'reader is unusable', got %d: %s", c->name, rc,
                  fmt_err(&err));
    kl_err_clear(&err);
    rc = kl_reader_add_file(r, paths[1], &err);
    ck_assert_msg(rc == KL_E_IO && strstr(err.msg, "unusable"), "%s: add: got %d: %s", c->name,
                  rc, fmt_err(&err));
    ck_assert(kl_reader_close_file(r, 5, &err) == 0);
    atomic_store(&ring_fails, 0);
    kl_reader_destroy(r);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Suite                                                                                      */

static Suite *reader_suite(void)
{
    Suite *s = suite_create("reader");
    TCase *tc = tcase_create("backends");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, mem_setup, mem_teardown);
    tcase_add_loop_test(tc, reader_whole_files_match_pattern_and_sha256, 0, N_CFGS);
    tcase_add_loop_test(tc, reader_unaligned_extents_deliver_exact_bytes, 0, N_CFGS);
    tcase_add_loop_test(tc, reader_many_random_extents_across_files_arrive_in_order, 0, N_CFGS);
    tcase_add_loop_test(tc, reader_callback_cancel_stops_and_reader_is_reusable, 0, N_CFGS);
    tcase_add_loop_test(tc, reader_extent_past_eof_is_io_error_naming_file_and_offset, 0, N_CFGS);
    tcase_add_loop_test(tc, reader_file_truncated_after_open_is_io_error_at_the_new_end, 0,
                        N_CFGS);
    suite_add_tcase(s, tc);

    tc = tcase_create("faults");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, mem_setup, mem_teardown);
    tcase_add_loop_test(tc, pread_short_reads_are_resubmitted_and_counted, 0, 2);
    tcase_add_loop_test(tc, pread_eintr_is_retried, 0, 2);
    tcase_add_loop_test(tc, pread_eio_is_io_error_naming_file_and_offset, 0, 2);
    tcase_add_test(tc, pread_endless_eagain_gives_up_with_io_error);
    tcase_add_test(tc, forced_unavailable_backend_is_a_clean_unsupported_error);
    tcase_add_test(tc, auto_falls_back_uring_then_aio_then_pread);
    tcase_add_test(tc, o_direct_refused_falls_back_to_buffered_in_auto_and_fails_when_forced);
    tcase_add_test(tc, bad_options_and_files_are_rejected);
    suite_add_tcase(s, tc);

    tc = tcase_create("hashing");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, mem_setup, mem_teardown);
    tcase_add_test(tc, sha256_of_abc_and_empty_match_known_digests);
    tcase_add_test(tc, hashpass_hashes_every_file_in_parallel_and_reports_failures);
    tcase_add_test(tc, list_files_with_suffix_is_sorted_and_skips_dirs_and_dotfiles);
    suite_add_tcase(s, tc);

    tc = tcase_create("cli");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, mem_setup, mem_teardown);
    tcase_add_test(tc, kl_read_json_hash_lists_every_file_with_its_sha256);
    tcase_add_test(tc, kl_read_usage_and_io_errors_exit_2);
    tcase_add_test(tc, kl_read_repeat_reports_every_round_against_its_ceiling_pass);
    suite_add_tcase(s, tc);

    /* Short timeout: a regression here is a hang on a FIFO. */
    tc = tcase_create("files");
    tcase_set_timeout(tc, 20);
    tcase_add_checked_fixture(tc, mem_setup, mem_teardown);
    tcase_add_loop_test(tc, reader_fifo_is_refused_at_once_and_regular_files_stay_blocking, 0,
                        N_CFGS);
    tcase_add_test(tc, hashpass_and_kl_read_refuse_a_fifo_with_the_whole_error);
    tcase_add_test(tc, closed_file_keeps_its_index_and_size_and_cannot_be_read);
    tcase_add_test(tc, more_files_than_rlimit_nofile_are_read_and_hashed);
    suite_add_tcase(s, tc);

    tc = tcase_create("broken rings");
    tcase_set_timeout(tc, 20);
    tcase_add_checked_fixture(tc, mem_setup, mem_teardown);
    tcase_add_loop_test(tc, aio_reader_is_reusable_after_the_ring_fails, 0, 2);
    tcase_add_loop_test(tc, uring_reader_whose_ring_fails_is_unusable_and_says_so, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    make_fixture();
    int rc = t_run_suite(reader_suite());
    t_rmrf(fixdir);
    return rc;
}
