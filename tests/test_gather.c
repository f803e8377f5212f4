/* tests/test_gather.c — kl_reader_run_gathered: scattered extents read as few long ones and
 * handed back per extent, complete and in order. */
#include "common/err.h"
#include "common/fs.h"
#include "common/mem.h"
#include "common/rng.h"
#include "loader/reader.h"
#include "testutil.h"

#define N_FILES 3
#define FILE_BYTES 200000
#define MAX_EXT 400

static uint8_t byte_at(uint32_t f, uint64_t i)
{
    return (uint8_t)(i * 131 + f * 71 + (i >> 9));
}

typedef struct files {
    char     dir[256];
    kl_reader *r;
    uint32_t idx[N_FILES];
} files;

static void files_open(files *fs, kl_io_backend backend, size_t buf_bytes)
{
    t_mkdtemp(fs->dir, sizeof fs->dir);
    kl_err err;
    kl_err_clear(&err);
    kl_reader_opts o = {.backend = backend, .direct = KL_DIRECT_OFF, .buf_bytes = buf_bytes,
                        .queue_depth = 4};
    ck_assert_msg(kl_reader_create(&fs->r, &o, &err) == 0, "%s", t_fmt_err(&err));
    uint8_t *buf = malloc(FILE_BYTES);
    for (uint32_t f = 0; f < N_FILES; f++) {
        char p[400];
        snprintf(p, sizeof p, "%s/f%u.bin", fs->dir, f);
        for (uint64_t i = 0; i < FILE_BYTES; i++)
            buf[i] = byte_at(f, i);
        t_write(p, buf, FILE_BYTES);
        int idx = kl_reader_add_file(fs->r, p, &err);
        ck_assert_msg(idx >= 0, "%s", t_fmt_err(&err));
        fs->idx[f] = (uint32_t)idx;
    }
    free(buf);
}

static void files_close(files *fs)
{
    kl_reader_destroy(fs->r);
    t_rmrf(fs->dir);
}

typedef struct check_ctx {
    const kl_extent *ext;
    uint32_t        *file_of;    /* reader index -> pattern file */
    uint64_t         got[MAX_EXT];
    size_t           current;    /* extent being delivered, SIZE_MAX before the first */
    size_t           calls, cancel_after;
} check_ctx;

static int check_chunk(void *ctx, size_t i, uint64_t off, const uint8_t *data, size_t len)
{
    check_ctx *c = ctx;
    const kl_extent *e = &c->ext[i];
    ck_assert_msg(len > 0 && e->len > 0, "callback for an empty piece of extent %zu", i);
    if (i != c->current) {
        ck_assert_msg(c->current == SIZE_MAX || c->got[c->current] == c->ext[c->current].len,
                      "extent %zu started before extent %zu was complete", i, c->current);
        ck_assert_msg(c->got[i] == 0, "extent %zu delivered in two separate stretches", i);
        c->current = i;
    }
    ck_assert_msg(off == c->got[i], "extent %zu: piece at %llu, expected %llu", i,
                  (unsigned long long)off, (unsigned long long)c->got[i]);
    ck_assert_msg(off + len <= e->len, "extent %zu: piece past its end", i);
    for (size_t k = 0; k < len; k++)
        ck_assert_msg(data[k] == byte_at(c->file_of[e->file], e->off + off + k),
                      "extent %zu: wrong byte at %llu", i, (unsigned long long)(off + k));
    c->got[i] += len;
    return ++c->calls == c->cancel_after;
}

/* Random non-overlapping extents (some empty) over the three files, in random order. */
static size_t random_extents(const files *fs, kl_rng *rng, kl_extent *ext)
{
    size_t n = 0;
    for (uint32_t f = 0; f < N_FILES; f++) {
        uint64_t pos = kl_rng_next(rng) % 5000;
        while (n < MAX_EXT) {
            uint64_t len = kl_rng_next(rng) % 7 == 0 ? 0 : 1 + kl_rng_next(rng) % 9000;
            uint64_t gap = kl_rng_next(rng) % 3 == 0 ? kl_rng_next(rng) % 3000 : 0;
            if (pos + gap + len > FILE_BYTES)
                break;
            if (kl_rng_next(rng) % 4) /* leave some ranges unread */
                ext[n++] = (kl_extent){fs->idx[f], pos + gap, len};
            pos += gap + len;
        }
    }
    for (size_t i = n; i > 1; i--) { /* shuffle */
        size_t j = kl_rng_next(rng) % i;
        kl_extent t = ext[i - 1];
        ext[i - 1] = ext[j];
        ext[j] = t;
    }
    return n;
}

/* loop: max_gap 0, 100, 1 MiB x backends pread, auto; chunk sizes force splits */
START_TEST(every_extent_whole_in_order_and_complete_before_the_next)
{
    static const uint64_t gaps[] = {0, 100, 1 << 20};
    files fs;
    files_open(&fs, _i < 3 ? KL_IO_PREAD : KL_IO_AUTO, _i % 2 ? 4096 : 65536);
    uint32_t file_of[N_FILES + 8] = {0};
    for (uint32_t f = 0; f < N_FILES; f++)
        file_of[fs.idx[f]] = f;
    kl_rng rng;
    kl_rng_seed(&rng, 11, (uint64_t)_i);
    for (int round = 0; round < 5; round++) {
        kl_extent ext[MAX_EXT];
        size_t n = random_extents(&fs, &rng, ext);
        check_ctx c = {.ext = ext, .file_of = file_of, .current = SIZE_MAX};
        kl_err err;
        kl_err_clear(&err);
        int rc = kl_reader_run_gathered(fs.r, ext, n, gaps[_i % 3], check_chunk, &c, &err);
        ck_assert_msg(rc == 0, "%s", t_fmt_err(&err));
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(c.got[i] == ext[i].len, "extent %zu: %llu of %llu bytes", i,
                          (unsigned long long)c.got[i], (unsigned long long)ext[i].len);
    }
    files_close(&fs);
}
END_TEST

START_TEST(bad_extents_are_refused_and_cancel_names_the_extent)
{
    files fs;
    files_open(&fs, KL_IO_PREAD, 4096);
    uint32_t file_of[N_FILES + 8] = {0};
    for (uint32_t f = 0; f < N_FILES; f++)
        file_of[fs.idx[f]] = f;
    kl_extent overlap[2] = {{fs.idx[1], 5000, 100}, {fs.idx[1], 5050, 10}};
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_reader_run_gathered(fs.r, overlap, 2, 0, NULL, NULL, &err), KL_E_USAGE);
    ck_assert_msg(strstr(err.msg, "overlap") != NULL, "%s", err.msg);

    kl_extent ext[3] = {{fs.idx[2], 0, 50000}, {fs.idx[0], 10, 20}, {fs.idx[2], 60000, 10}};
    check_ctx c = {.ext = ext, .file_of = file_of, .current = SIZE_MAX, .cancel_after = 2};
    kl_err_clear(&err);
    ck_assert_int_eq(kl_reader_run_gathered(fs.r, ext, 3, 0, check_chunk, &c, &err),
                     KL_E_CANCELLED);
    ck_assert_uint_eq(c.calls, 2);
    ck_assert_msg(strstr(err.msg, "extent 0") != NULL, "the caller's index: %s", err.msg);

    /* checked before merging: an extent that overflows or runs past its file fails */
    kl_extent wrap[2] = {{fs.idx[0], 0, 100}, {fs.idx[0], 200, UINT64_MAX - 150}};
    kl_err_clear(&err);
    ck_assert_int_eq(kl_reader_run_gathered(fs.r, wrap, 2, 4096, NULL, NULL, &err), KL_E_USAGE);
    ck_assert_msg(strstr(err.msg, "extent 1") && strstr(err.msg, "overflows"), "%s", err.msg);
    kl_extent past[2] = {{fs.idx[0], 0, 100}, {fs.idx[0], FILE_BYTES - 10, 20}};
    kl_err_clear(&err);
    ck_assert_int_eq(kl_reader_run_gathered(fs.r, past, 2, 1 << 20, NULL, NULL, &err), KL_E_IO);
    ck_assert_msg(strstr(err.msg, "past the end") != NULL, "%s", err.msg);
    files_close(&fs);
}
END_TEST

/* A file just written and read sits in the page cache: it is streamed with buffered reads. */
START_TEST(cached_files_are_read_buffered)
{
    files fs;
    files_open(&fs, KL_IO_PREAD, 4096);
    char p[400];
    snprintf(p, sizeof p, "%s/f0.bin", fs.dir);
    char *data = NULL;
    size_t len = 0;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_read_file(p, FILE_BYTES, &data, &len, &err), 0); /* now cached */
    kl_free(data);
    uint64_t resident = 0, size = 0;
    ck_assert_msg(kl_file_resident(p, &resident, &size, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(size, FILE_BYTES);
    ck_assert_msg(resident == size, "%llu of %llu bytes resident", (unsigned long long)resident,
                  (unsigned long long)size);
    kl_reader_opts o = {0};
    const char *paths[1] = {p};
    ck_assert_int_eq(kl_reader_opts_for_files(&o, paths, 1), 1);
    ck_assert_int_eq(o.direct, KL_DIRECT_OFF);
    ck_assert_int_eq(o.backend, KL_IO_PREAD);
    ck_assert_uint_ge(o.threads, 1);
    kl_reader_opts forced = {.direct = KL_DIRECT_ON};
    ck_assert_int_eq(kl_reader_opts_for_files(&forced, paths, 1), 0); /* the caller's choice */
    ck_assert_int_eq(forced.direct, KL_DIRECT_ON);
    const char *missing[1] = {"/nonexistent/kl.bin"};
    ck_assert_int_ne(kl_file_resident(missing[0], &resident, &size, &err), 0);
    files_close(&fs);
}
END_TEST

static Suite *gather_suite(void)
{
    Suite *s = suite_create("gather");
    TCase *tc = tcase_create("runs");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, every_extent_whole_in_order_and_complete_before_the_next, 0, 6);
    tcase_add_test(tc, bad_extents_are_refused_and_cancel_names_the_extent);
    tcase_add_test(tc, cached_files_are_read_buffered);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(gather_suite());
}
