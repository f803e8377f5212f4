/* tests/test_mapped.c — the zero-copy mapped reader (loader/mapped.h). */
#include "common/err.h"
#include "common/membench.h"
#include "common/rng.h"
#include "loader/mapped.h"
#include "testutil.h"

#include <sys/stat.h>

#define N_FILES 4

typedef struct collect {
    uint8_t *got[N_FILES];     /* bytes delivered per file */
    uint64_t next_off[N_FILES];
    size_t   last_file;
    size_t   calls, cancel_after;
} collect;

static int on_chunk(void *ctx, size_t file, uint64_t off, const uint8_t *data, size_t len)
{
    collect *c = ctx;
    ck_assert_uint_lt(file, N_FILES);
    ck_assert_msg(file >= c->last_file, "file %zu delivered after file %zu", file, c->last_file);
    ck_assert_msg(off == c->next_off[file], "file %zu: chunk at %llu, expected %llu", file,
                  (unsigned long long)off, (unsigned long long)c->next_off[file]);
    memcpy(c->got[file] + off, data, len);
    c->next_off[file] = off + len;
    c->last_file = file;
    return ++c->calls == c->cancel_after;
}

/* Files of sizes 0, 1 page + 7 bytes, 5 chunks exactly, and odd; random bytes. */
static const size_t sizes[N_FILES] = {0, 4096 + 7, 5 * 8192, 3 * 8192 + 4095};

static void make_files(const char *dir, char paths[N_FILES][512], uint8_t *want[N_FILES])
{
    kl_rng rng;
    kl_rng_seed(&rng, 7, 0);
    for (int i = 0; i < N_FILES; i++) {
        snprintf(paths[i], 512, "%s/f%d.bin", dir, i);
        want[i] = malloc(sizes[i] + 1);
        for (size_t k = 0; k < sizes[i]; k++)
            want[i][k] = (uint8_t)kl_rng_next(&rng);
        t_write(paths[i], want[i], sizes[i]);
    }
}

/* The four test files in a fresh directory, their paths and contents, and the collector. */
typedef struct fixture {
    char        dir[256], paths[N_FILES][512];
    const char *p[N_FILES];
    uint8_t    *want[N_FILES];
    collect     c;
} fixture;

static void fixture_setup(fixture *f, size_t cancel_after)
{
    memset(f, 0, sizeof *f);
    t_mkdtemp(f->dir, sizeof f->dir);
    make_files(f->dir, f->paths, f->want);
    f->c.cancel_after = cancel_after;
    for (int i = 0; i < N_FILES; i++) {
        f->p[i] = f->paths[i];
        f->c.got[i] = calloc(sizes[i] + 1, 1);
    }
}

static void fixture_teardown(fixture *f)
{
    for (int i = 0; i < N_FILES; i++) {
        free(f->c.got[i]);
        free(f->want[i]);
    }
    t_rmrf(f->dir);
}

/* threads: 1 (the calling thread alone), 2, 4 */
START_TEST(delivers_every_byte_in_order)
{
    const unsigned threads = _i == 0 ? 1 : _i == 1 ? 2 : 4;
    fixture f;
    fixture_setup(&f, 0);
    kl_mapped_opts o = {.threads = threads, .chunk_bytes = 8000, .touch = 1}; /* 8192 */
    kl_mapped_stats st;
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_mapped_read(f.p, N_FILES, &o, on_chunk, &f.c, &st, &err);
    ck_assert_msg(rc == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(st.chunks, 0 + 1 + 5 + 4);
    uint64_t total = 0, sum = 0;
    for (int i = 0; i < N_FILES; i++) {
        total += sizes[i];
        ck_assert_uint_eq(f.c.next_off[i], sizes[i]);
        ck_assert_msg(!memcmp(f.c.got[i], f.want[i], sizes[i]), "file %d differs", i);
        /* the checksum is the chunk sums: recompute them with the same chunking */
        for (size_t off = 0; off < sizes[i]; off += 8192)
            sum += kl_mem_sum(f.want[i] + off, sizes[i] - off < 8192 ? sizes[i] - off : 8192);
    }
    ck_assert_uint_eq(st.bytes, total);
    ck_assert_uint_eq(st.checksum, sum);
    fixture_teardown(&f);
}
END_TEST

START_TEST(cancel_stops_delivery)
{
    fixture f;
    fixture_setup(&f, 3);
    kl_mapped_opts o = {.threads = 3, .chunk_bytes = 4096};
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_mapped_read(f.p, N_FILES, &o, on_chunk, &f.c, NULL, &err),
                     KL_E_CANCELLED);
    ck_assert_uint_eq(f.c.calls, 3);
    fixture_teardown(&f);
}
END_TEST

START_TEST(refuses_what_is_not_a_regular_file)
{
    char dir[256], fifo[512], missing[512];
    t_mkdtemp(dir, sizeof dir);
    snprintf(fifo, sizeof fifo, "%s/pipe", dir);
    snprintf(missing, sizeof missing, "%s/absent.safetensors", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    kl_err err;
    const char *cases[3] = {fifo, dir, missing};
    const int codes[3] = {KL_E_FORMAT, KL_E_FORMAT, KL_E_IO};
    for (int i = 0; i < 3; i++) {
        kl_err_clear(&err);
        const char *p[1] = {cases[i]};
        ck_assert_int_eq(kl_mapped_read(p, 1, NULL, NULL, NULL, NULL, &err), codes[i]);
        ck_assert_str_eq(err.file, cases[i]);
        ck_assert(!t_has_control(err.msg));
    }
    kl_mapped_opts bad = {.threads = 65};
    const char *p[1] = {dir};
    ck_assert_int_eq(kl_mapped_read(p, 1, &bad, NULL, NULL, NULL, &err), KL_E_USAGE);
    t_rmrf(dir);
}
END_TEST

/* The ceiling's passes: the buffer is whole 2 MiB pieces, a pass reads whole pieces and wraps
 * around the buffer when asked for more bytes than it holds. */
START_TEST(membench_passes_wrap_around_the_buffer_in_whole_pieces)
{
    const uint64_t mib = 1 << 20;
    kl_membench *b = NULL;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_membench_open(5 * mib, 2, &b, &err), 0);
    ck_assert_uint_eq(kl_membench_buffer_bytes(b), 6 * mib);
    ck_assert_uint_eq(kl_membench_threads(b), 2);
    uint64_t got = 0;
    ck_assert(kl_membench_pass(b, 1, &got) > 0);
    ck_assert_uint_eq(got, 2 * mib);
    ck_assert(kl_membench_pass(b, 15 * mib, &got) > 0);
    ck_assert_uint_eq(got, 16 * mib); /* two laps and two pieces */
    kl_membench_close(b);
    kl_membench_close(NULL);
    ck_assert_int_eq(kl_membench_open(5 * mib, 0, &b, &err), KL_E_USAGE);
    ck_assert_ptr_null(b);
    kl_membench_result r;
    ck_assert_int_eq(kl_membench_read(4 * mib, 2, 3, &r, &err), 0);
    ck_assert_uint_eq(r.bytes, 4 * mib);
    ck_assert(r.read_gbps > 0 && r.median_gbps > 0 && r.read_gbps >= r.median_gbps);
    /* the copy ceiling: the same passes, each piece copied into a second buffer */
    kl_membench_result c;
    ck_assert_int_eq(kl_membench_copy(4 * mib, 2, 3, &c, &err), 0);
    ck_assert_uint_eq(c.bytes, 4 * mib);
    ck_assert_uint_eq(c.threads, 2);
    ck_assert(c.read_gbps > 0 && c.read_gbps >= c.median_gbps);
    ck_assert_int_eq(kl_membench_copy(4 * mib, 2, 0, &c, &err), KL_E_USAGE);
}
END_TEST

static Suite *mapped_suite(void)
{
    Suite *s = suite_create("mapped");
    TCase *tc = tcase_create("read");
    tcase_add_loop_test(tc, delivers_every_byte_in_order, 0, 3);
    tcase_add_test(tc, cancel_stops_delivery);
    tcase_add_test(tc, refuses_what_is_not_a_regular_file);
    tcase_add_test(tc, membench_passes_wrap_around_the_buffer_in_whole_pieces);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(mapped_suite());
}
