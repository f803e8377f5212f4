/*
 * tests/gpu/test_load.cu — the streaming fill of engine/gpu_plan.h on the GPU, as the backend
 * runs it (copies on one stream, mapped windows page-locked read-only, one event per window
 * slot), from a 2 GiB file in the page cache of the build folder's file system (ext4 on the
 * test machine) and from tmpfs (/dev/shm).  The file holds a known pattern; its pieces have
 * odd sizes and odd offsets (gaps between them, as tensors in a safetensors shard) and go to
 * 256-byte aligned places of one device arena.  Checked: after each fill the arena, copied
 * back, holds every piece's bytes (the count of pieces that differ must be 0), mapped with
 * the default 256 MiB windows, with 64 MiB windows, and through the staged reader.  Timed: each fill from the first map to the last
 * copy done, in GB/s, beside the pinned host-to-device copy rate measured in the same run
 * (the load target is >= 80% of it), and how many windows were page-locked: serial, with 2
 * and 4 load threads (KL_GPU_LOAD_THREADS), 64 MiB windows, the staged reader; and the
 * page-locking alone (map, register, unregister each 256 MiB window).  One JSON line;
 * exit 0 pass, 1 fail, 77 no GPU.
 */
extern "C" {
#include "common/clock.h"
#include "engine/gpu_plan.h"
#include "kernels/runtime.h"
}
#include "tests/gpu/gpu_testutil.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#define FILE_BYTES (((size_t)2 << 30) + 12345)

/* The byte at file offset o. */
static inline uint8_t pattern(uint64_t o)
{
    uint64_t x = (o >> 3) * 0x9E3779B97F4A7C15ull;
    return (uint8_t)((x >> 56) ^ (o & 7) * 31u);
}

static std::vector<uint8_t> g_file;   /* the file's bytes */

/* Writes the pattern file; 0 when it could not be written (the case is skipped). */
static int write_file(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return 0;
    int ok = 1;
    for (size_t at = 0; ok && at < FILE_BYTES; ) {
        ssize_t w = write(fd, g_file.data() + at, std::min<size_t>(FILE_BYTES - at, 1u << 30));
        ok = w > 0;
        at += ok ? (size_t)w : 0;
    }
    close(fd);
    if (!ok)
        unlink(path);
    return ok;
}

/* Pieces of odd sizes (1 B .. 96 MiB) with gaps of 0..255 bytes, covering the file; their
 * places one after another in the arena, 256-byte aligned. */
static void make_plan(kl_gpu_plan *p, std::vector<kl_plan_piece> &pc, uint64_t *arena_bytes)
{
    pc.clear();
    uint64_t src = 8 + 1234, dst = 0;
    while (src < FILE_BYTES) {
        uint64_t r = t_u32(), n = 1 + (r % 4 == 0 ? t_u32() % 997 : t_u32() % (96u << 20));
        n = std::min<uint64_t>(n, FILE_BYTES - src);
        pc.push_back(kl_plan_piece{0, dst, 0, src, NULL, n});
        dst = (dst + n + KL_PLAN_ALIGN - 1) / KL_PLAN_ALIGN * KL_PLAN_ALIGN;
        src += n + t_u32() % 256;
    }
    *arena_bytes = dst;
    memset(p, 0, sizeof *p);
    p->n_arenas = 1;
    p->arena_bytes = arena_bytes;
    p->pieces = pc.data();
    p->n_pieces = p->n_file = pc.size();
}

/* The backend's function table (engine/backend_gpu.c fill_*). */
struct fill_ctx {
    kl_gpu_stream st;
    kl_gpu_event ev[KL_FILL_MAX_WINDOWS];
};

static int f_copy(void *ctx, void *dst, const void *src, size_t n, int pinned, kl_err *err)
{
    return kl_gpu_h2d(dst, src, n, ((fill_ctx *)ctx)->st, err);
}

static int f_pin(void *ctx, void *p, size_t n)
{
    kl_err e;
    kl_err_clear(&e);
    return kl_gpu_host_register(p, n, 1, &e);
}

static void f_unpin(void *ctx, void *p)
{
    kl_gpu_host_unregister(p);
}

static int f_mark(void *ctx, unsigned s, kl_err *err)
{
    fill_ctx *f = (fill_ctx *)ctx;
    return kl_gpu_event_record(f->ev[s], f->st, err);
}

static int f_wait(void *ctx, unsigned s, kl_err *err)
{
    return kl_gpu_event_sync(((fill_ctx *)ctx)->ev[s], err);
}

static std::string g_runs;

/* One fill of path into the arena, timed, then checked byte for byte. */
static void run_fill(const char *where, const char *how, const char *path, const kl_gpu_plan *p,
                     uint8_t *arena, const kl_fill_opts *o, double h2d_gbps)
{
    fill_ctx f = {};
    kl_err err;
    kl_err_clear(&err);
    t_ok(kl_gpu_stream_create(&f.st, &err), &err, "stream");
    for (unsigned i = 0; i < KL_FILL_MAX_WINDOWS; i++)
        t_ok(kl_gpu_event_create(&f.ev[i], &err), &err, "event");
    T_CHECK(hipMemset(arena, 0, p->arena_bytes[0]));
    T_CHECK(hipDeviceSynchronize());
    kl_fill_ops ops = {&f, f_copy, f_pin, f_unpin, f_mark, f_wait};
    kl_fill_stats st = {};
    const char *paths[1] = {path};
    uint8_t *arenas[1] = {arena};
    double t0 = kl_now_s();
    t_ok(kl_gpu_fill(p, paths, arenas, &ops, o, &st, &err), &err, "kl_gpu_fill");
    t_ok(kl_gpu_stream_sync(f.st, &err), &err, "sync");
    double s = kl_now_s() - t0;
    std::vector<uint8_t> back = t_download(arena, p->arena_bytes[0]);
    uint64_t bad = 0;   /* pieces whose bytes differ */
    for (size_t i = 0; i < p->n_pieces; i++) {
        const kl_plan_piece &x = p->pieces[i];
        bad += memcmp(back.data() + x.dst, g_file.data() + x.src, x.bytes) != 0;
    }
    char what[96], buf[400];
    snprintf(what, sizeof what, "%s %s pieces wrong", where, how);
    t_check(what, (double)bad, 0);
    const double gbps = p->file_bytes / s / 1e9;
    snprintf(buf, sizeof buf,
             "%s{\"file\":\"%s\",\"how\":\"%s\",\"bytes\":%llu,\"s\":%.4f,\"gbps\":%.2f,"
             "\"ratio_to_pinned_h2d\":%.3f,\"windows\":%llu,\"pinned\":%llu}",
             g_runs.empty() ? "" : ",", where, how, (unsigned long long)p->file_bytes, s, gbps,
             gbps / h2d_gbps, (unsigned long long)st.windows, (unsigned long long)st.pinned);
    g_runs += buf;
    for (unsigned i = 0; i < KL_FILL_MAX_WINDOWS; i++)
        kl_gpu_event_destroy(f.ev[i]);
    kl_gpu_stream_destroy(f.st);
}

/* Page-locking alone: every 256 MiB window of the file mapped, registered read-only and
 * released, one after another (the serial fill's cost beside its copies). */
static void time_register(const char *where, const char *path, double h2d_gbps)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return;
    const size_t win = (size_t)256 << 20;
    size_t ok = 0, n = 0;
    double t0 = kl_now_s();
    for (size_t at = 0; at < FILE_BYTES; at += win, n++) {
        size_t len = std::min(win, FILE_BYTES - at);
        void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)at);
        if (m == MAP_FAILED)
            continue;
        kl_err e;
        kl_err_clear(&e);
        if (!kl_gpu_host_register(m, len, 1, &e)) {
            ok++;
            kl_gpu_host_unregister(m);
        } else if (ok == 0 && n == 0) {
            fprintf(stderr, "test_load: %s: page-locking a mapped window: %s\n", where, e.msg);
        }
        munmap(m, len);
    }
    double s = kl_now_s() - t0;
    char buf[300];
    snprintf(buf, sizeof buf,
             "%s{\"file\":\"%s\",\"how\":\"register-only\",\"s\":%.4f,\"gbps\":%.2f,"
             "\"ratio_to_pinned_h2d\":%.3f,\"windows\":%zu,\"pinned\":%zu}",
             g_runs.empty() ? "" : ",", where, s, FILE_BYTES / s / 1e9,
             FILE_BYTES / s / 1e9 / h2d_gbps, n, ok);
    g_runs += buf;
    close(fd);
}

int main(void)
{
    if (!t_have_gpu("test_load"))
        return 77;
    kl_err err;
    kl_err_clear(&err);
    double d2d = 0, h2d = 0;
    t_ok(kl_gpu_measure_rates((size_t)1 << 30, 5, &d2d, &h2d, &err), &err, "rates");
    g_file.resize(FILE_BYTES);
    for (size_t i = 0; i < FILE_BYTES; i++)
        g_file[i] = pattern(i);
    kl_gpu_plan p;
    std::vector<kl_plan_piece> pc;
    uint64_t arena_bytes = 0;
    make_plan(&p, pc, &arena_bytes);
    uint64_t fb = 0;
    for (const auto &x : pc)
        fb += x.bytes;
    p.file_bytes = fb;
    uint8_t *arena = (uint8_t *)t_alloc(arena_bytes);
    const char *files[2][2] = {{"page-cache", "build/kl_test_load.bin"},
                               {"tmpfs", "/dev/shm/kl_test_load.bin"}};
    for (const auto &fl : files) {
        if (!write_file(fl[1])) {
            fprintf(stderr, "test_load: cannot write %s: %s skipped\n", fl[1], fl[0]);
            continue;
        }
        time_register(fl[0], fl[1], h2d);
        kl_fill_opts mapped = {KL_FILL_MAPPED, 0, 0, 0, KL_DIRECT_OFF};
        kl_fill_opts small = {KL_FILL_MAPPED, (size_t)64 << 20, 3, 0, KL_DIRECT_OFF};
        kl_fill_opts t2 = {KL_FILL_MAPPED, 0, 4, 2, KL_DIRECT_OFF};
        kl_fill_opts t4 = {KL_FILL_MAPPED, 0, 8, 4, KL_DIRECT_OFF};
        kl_fill_opts t4s = {KL_FILL_MAPPED, (size_t)64 << 20, 8, 4, KL_DIRECT_OFF};
        kl_fill_opts rd = {KL_FILL_READ, 0, 0, 0, KL_DIRECT_OFF};
        run_fill(fl[0], "mapped", fl[1], &p, arena, &mapped, h2d);
        run_fill(fl[0], "mapped-64MiB", fl[1], &p, arena, &small, h2d);
        run_fill(fl[0], "mapped-2-threads", fl[1], &p, arena, &t2, h2d);
        run_fill(fl[0], "mapped-4-threads", fl[1], &p, arena, &t4, h2d);
        run_fill(fl[0], "mapped-4-threads-64MiB", fl[1], &p, arena, &t4s, h2d);
        run_fill(fl[0], "read", fl[1], &p, arena, &rd, h2d);
        unlink(fl[1]);
    }
    hipFree(arena);
    printf("{\"test\":\"load\",\"ok\":%s,\"pinned_h2d_gbps\":%.2f,\"d2d_copy_gbps\":%.1f,"
           "\"checks\":[%s],\"fills\":[%s]}\n",
           t_all_ok ? "true" : "false", h2d, d2d, t_checks.c_str(), g_runs.c_str());
    return t_all_ok ? 0 : 1;
}
