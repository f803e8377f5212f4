/*
 * tests/gpu/test_load.cu — the streaming fill of engine/gpu_plan.h on the GPU, as the backend
 * runs it (copies on one stream, an event per window slot or ring buffer; mapped windows
 * page-locked read-only; ring buffers pinned with kl_gpu_host_alloc), from a 4 GiB file in the
 * page cache of the build folder's file system (ext4 on the test machine; written, then read
 * once) and from tmpfs (/dev/shm).  The file holds a known pattern; its pieces have odd sizes
 * and odd offsets (gaps between them, as tensors in a safetensors shard) and go to 256-byte
 * aligned places of one device arena.  Checked after every fill: the arena, copied back, holds
 * every piece's bytes (the count of pieces that differ must be 0) and its checksum over the
 * pieces equals the file's.  Timed: each fill from the first read or map to the last copy
 * done (the ring's pinned buffers allocated inside it; their allocation also alone), in GB/s
 * beside the pinned host-to-device copy rate measured in the same run (the load target is
 * >= 80% of it): RING with 1, 4, 8 and 16 load threads (64 MiB buffers, threads + 4 of them),
 * with 8 threads and 16 MiB buffers, with 8 threads and O_DIRECT; MAPPED serial and with 4
 * threads; the staged reader; and the page-locking alone (map, register, unregister each
 * 256 MiB window).  Pieces up to 96 MiB for all of these; then up to 2 MiB (as a model's
 * expert codes and scales: thousands of copies) for the ring with 8 threads and mapped with 4.
 * Then the ring from buffers given ahead (the backend's prepared ring: one region on 2 MiB
 * pages registered once, its allocation timed alone) with 8, 12 and 16 threads (large pieces),
 * each reading by pread and copying out of the mapped file (from_mapping, the backend's
 * default), and 16 from the mapping and 8 by pread with model-sized pieces; and hybrid (KL_GPU_LOAD=hybrid: kl_gpu_plan_split, the ring on the
 * first part and 4 threads of mapped windows on the rest at once, one stream) with 35% and 50%
 * mapped (large) and 35% (model-sized).  One JSON line per case ({"test":"load-case",...}), then the summary line
 * ({"test":"load","ok":...}); exit 0 pass, 1 fail, 77 no GPU.
 */
extern "C" {
#include "common/clock.h"
#include "engine/gpu_plan.h"
#include "kernels/runtime.h"
}
#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/pattern_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>

/* A plan over the file: its pieces, arena size and the checksum the arena must have. */
struct test_plan {
    const char *name;
    kl_gpu_plan p;
    std::vector<kl_plan_piece> pc;
    uint64_t arena_bytes, sum;
};

/* Pieces of odd sizes (1 B .. most bytes; a quarter under 1 KB) with gaps of 0..255 bytes,
 * covering the file; their places one after another in the arena, 256-byte aligned. */
static void make_plan(kl_gpu_plan *p, std::vector<kl_plan_piece> &pc, uint64_t *arena_bytes,
                      uint32_t most)
{
    pc.clear();
    uint64_t src = 8 + 1234, dst = 0;
    while (src < FILE_BYTES) {
        uint64_t r = t_u32(), n = 1 + (r % 4 == 0 ? t_u32() % 997 : t_u32() % most);
        n = std::min<uint64_t>(n, FILE_BYTES - src);
        pc.push_back(kl_plan_piece{0, dst, 0, src, NULL, n, 0, 0});
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

/* The backend's function table (engine/backend_gpu.c fill_*), the pinned allocations timed. */
struct fill_ctx {
    kl_gpu_stream st;
    kl_gpu_event ev[KL_FILL_MAX_SLOTS];
    double alloc_s;
};

static int f_copy(void *ctx, void *dst, const void *src, size_t n, int pinned, kl_err *err)
{
    return kl_gpu_h2d(dst, src, n, ((fill_ctx *)ctx)->st, err);
}

static int f_copy_rows(void *ctx, void *dst, const void *src, size_t width, size_t pitch,
                       size_t rows, int pinned, kl_err *err)
{
    return kl_gpu_h2d_rows(dst, src, width, pitch, rows, ((fill_ctx *)ctx)->st, err);
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

static int f_host_alloc(void *ctx, void **p, size_t n, kl_err *err)
{
    double t0 = kl_now_s();
    int rc = kl_gpu_host_alloc(p, n, err);
    ((fill_ctx *)ctx)->alloc_s += kl_now_s() - t0;
    return rc;
}

static void f_host_free(void *ctx, void *p)
{
    kl_gpu_host_free(p);
}

/* A checksum of the pieces' bytes, each at its place in base (src: 0 the arena, 1 the file). */
static uint64_t checksum(const kl_gpu_plan *p, const uint8_t *base, int file)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < p->n_pieces; i++) {
        const kl_plan_piece &x = p->pieces[i];
        const uint8_t *b = base + (file ? x.src : x.dst);
        size_t n = (size_t)x.bytes, j = 0;
        for (; j + 8 <= n; j += 8) {
            uint64_t w;
            memcpy(&w, b + j, 8);
            h = (h ^ w) * 1099511628211ull;
        }
        for (; j < n; j++)
            h = (h ^ b[j]) * 1099511628211ull;
    }
    return h;
}

static std::string g_runs;

/* Appends a case's JSON object to the summary and prints it as its own line. */
static void report(const char *obj)
{
    printf("{\"test\":\"load-case\",%s\n", obj + 1);
    g_runs += g_runs.empty() ? "" : ",";
    g_runs += obj;
}

/* One fill of path into the arena as tp says, timed, then checked byte for byte and by
 * checksum. */
static void run_fill(const char *where, const char *how, const char *path, const test_plan &tp,
                     uint8_t *arena, const kl_fill_opts *o, double h2d_gbps,
                     const kl_fill_opts *mapped_part = NULL, double share = 0)
{
    const kl_gpu_plan *p = &tp.p;
    fill_ctx f[2] = {};   /* a hybrid's second part: f[1], its own events, the same stream */
    kl_err err;
    kl_err_clear(&err);
    t_ok(kl_gpu_stream_create(&f[0].st, &err), &err, "stream");
    f[1].st = f[0].st;
    for (unsigned k = 0; k < 2; k++)
        for (unsigned i = 0; i < KL_FILL_MAX_SLOTS; i++)
            t_ok(kl_gpu_event_create(&f[k].ev[i], &err), &err, "event");
    T_CHECK(hipMemset(arena, 0, p->arena_bytes[0]));
    T_CHECK(hipDeviceSynchronize());
    kl_fill_stats st = {}, st2 = {};
    const char *paths[1] = {path};
    uint8_t *arenas[1] = {arena};
    kl_gpu_plan part[2] = {*p, {}};
    if (mapped_part)
        kl_gpu_plan_split(p, share, &part[0], &part[1]);
    double t0 = kl_now_s();
    int rc2 = 0;
    kl_err err2;
    kl_err_clear(&err2);
    std::thread second;
    if (mapped_part)   /* as the backend's KL_GPU_LOAD=hybrid: both at once */
        second = std::thread([&] {
            kl_fill_ops ops = {&f[1], f_copy, f_pin, f_unpin, f_mark, f_wait, f_host_alloc,
                               f_host_free, f_copy_rows, NULL, NULL, NULL, NULL};
            rc2 = kl_gpu_fill(&part[1], paths, arenas, &ops, mapped_part, &st2, &err2);
        });
    kl_fill_ops ops = {&f[0],  f_copy,       f_pin,       f_unpin,     f_mark,
                       f_wait, f_host_alloc, f_host_free, f_copy_rows, NULL, NULL, NULL, NULL};
    t_ok(kl_gpu_fill(&part[0], paths, arenas, &ops, o, &st, &err), &err, "kl_gpu_fill");
    if (mapped_part)
        second.join();
    t_ok(rc2, &err2, "kl_gpu_fill, mapped part");
    t_ok(kl_gpu_stream_sync(f[0].st, &err), &err, "sync");
    double s = kl_now_s() - t0;
    st.windows += st2.windows;
    st.pinned += st2.pinned;
    std::vector<uint8_t> back = t_download(arena, p->arena_bytes[0]);
    uint64_t bad = 0;   /* pieces whose bytes differ */
    for (size_t i = 0; i < p->n_pieces; i++) {
        const kl_plan_piece &x = p->pieces[i];
        bad += memcmp(back.data() + x.dst, pattern_bytes().data() + x.src, x.bytes) != 0;
    }
    uint64_t sum = checksum(p, back.data(), 0);
    char what[128], buf[900];
    snprintf(what, sizeof what, "%s %s %s pieces wrong", where, tp.name, how);
    t_check(what, (double)bad, 0);
    snprintf(what, sizeof what, "%s %s %s checksum differs", where, tp.name, how);
    t_check(what, sum == tp.sum ? 0.0 : 1.0, 0);
    const double gbps = p->file_bytes / s / 1e9;
    snprintf(buf, sizeof buf,
             "{\"file\":\"%s\",\"pieces\":\"%s\",\"n_pieces\":%zu,\"how\":\"%s\","
             "\"threads\":%u,\"buffer_mib\":%zu,\"bytes\":%llu,\"s\":%.4f,\"gbps\":%.2f,"
             "\"pinned_h2d_gbps\":%.2f,\"ratio_to_pinned_h2d\":%.3f,\"host_alloc_s\":%.4f,"
             "\"windows\":%llu,\"pinned\":%llu,\"pieces_wrong\":%llu,\"checksum_ok\":%s,"
             "\"threads_reading_s\":%.4f,\"threads_waiting_s\":%.4f,\"copier_idle_s\":%.4f,"
             "\"copier_issuing_s\":%.4f}",
             where, tp.name, p->n_pieces, how, o->threads, o->window_bytes >> 20,
             (unsigned long long)p->file_bytes, s, gbps, h2d_gbps, gbps / h2d_gbps, f[0].alloc_s,
             (unsigned long long)st.windows, (unsigned long long)st.pinned,
             (unsigned long long)bad, sum == tp.sum ? "true" : "false", st.read_s, st.wait_s,
             st.idle_s, st.issue_s);
    report(buf);
    for (unsigned k = 0; k < 2; k++)
        for (unsigned i = 0; i < KL_FILL_MAX_SLOTS; i++)
            kl_gpu_event_destroy(f[k].ev[i]);
    kl_gpu_stream_destroy(f[0].st);
}

/* Page-locking alone: every 256 MiB window of the file mapped, registered read-only and
 * released, one after another (the serial mapped fill's cost beside its copies). */
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
             "{\"file\":\"%s\",\"how\":\"register-only\",\"s\":%.4f,\"gbps\":%.2f,"
             "\"pinned_h2d_gbps\":%.2f,\"ratio_to_pinned_h2d\":%.3f,\"windows\":%zu,"
             "\"pinned\":%zu}",
             where, s, FILE_BYTES / s / 1e9, h2d_gbps, FILE_BYTES / s / 1e9 / h2d_gbps, n, ok);
    report(buf);
    close(fd);
}

/* The ring from buffers given by the caller, as the backend prepares them ahead
 * (kl_backend_gpu_prepare): one region on 2 MiB pages registered once
 * (kl_gpu_host_alloc_mapped, its allocation timed alone), 16 MiB buffers; 8, 12 and 16
 * threads with large pieces, 8 with model-sized ones. */
static void run_prepared(const char *where, const char *path, const test_plan *tp,
                         uint8_t *arena, double h2d)
{
    const size_t MiB = (size_t)1 << 20, n = 20;
    void *region = NULL, *buf[KL_FILL_MAX_SLOTS];
    int huge = 0;
    kl_err err;
    kl_err_clear(&err);
    double t0 = kl_now_s();
    t_ok(kl_gpu_host_alloc_mapped(&region, n * 16 * MiB, &huge, &err), &err, "mapped buffers");
    double s = kl_now_s() - t0;
    char buf_json[300];
    snprintf(buf_json, sizeof buf_json,
             "{\"file\":\"%s\",\"how\":\"buffers-alloc-mapped\",\"bytes\":%zu,\"s\":%.4f,"
             "\"hugetlb\":%s}", where, n * 16 * MiB, s, huge ? "true" : "false");
    report(buf_json);
    if (!region)
        return;
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t *)region + i * 16 * MiB;
    static const unsigned threads[] = {8, 12, 16};
    for (int mapping = 0; mapping < 2; mapping++)
        for (unsigned t : threads) {
            char how[64];
            snprintf(how, sizeof how, "ring-prepared-%u-threads-16MiB%s", t,
                     mapping ? "-from-mapping" : "");
            kl_fill_opts o = {KL_FILL_RING, 16 * MiB, t + 4, t, KL_DIRECT_OFF, buf, mapping, 0, 0};
            run_fill(where, how, path, tp[0], arena, &o, h2d);
        }
    kl_fill_opts m16 = {KL_FILL_RING, 16 * MiB, 20, 16, KL_DIRECT_OFF, buf, 1, 0, 0};
    run_fill(where, "ring-prepared-16-threads-16MiB-from-mapping", path, tp[1], arena, &m16, h2d);
    kl_fill_opts o = {KL_FILL_RING, 16 * MiB, 12, 8, KL_DIRECT_OFF, buf, 0, 0, 0};
    run_fill(where, "ring-prepared-8-threads-16MiB", path, tp[1], arena, &o, h2d);
    /* hybrid: the ring on the first part, 4 threads of mapped windows on the rest */
    kl_fill_opts m4 = {KL_FILL_MAPPED, 256 * MiB, 8, 4, KL_DIRECT_OFF, NULL, 0, 0, 0};
    static const double shares[] = {0.35, 0.5};
    for (double sh : shares) {
        char how[64];
        snprintf(how, sizeof how, "hybrid-ring-8-mapped-4-share-%.2f", sh);
        run_fill(where, how, path, tp[0], arena, &o, h2d, &m4, sh);
    }
    run_fill(where, "hybrid-ring-8-mapped-4-share-0.35", path, tp[1], arena, &o, h2d, &m4, 0.35);
    kl_gpu_host_free_mapped(region, n * 16 * MiB);
}

/* The cases of one file: every way with large pieces (tp[0]), the ring with 8 threads and the
 * mapped fill with model-sized pieces (tp[1]: experts' ~1 MiB codes and small scales). */
static void run_file(const char *where, const char *path, const test_plan *tp, uint8_t *arena,
                     double h2d)
{
    const test_plan &p = tp[0];
    const size_t MiB = (size_t)1 << 20;
    time_register(where, path, h2d);
    static const unsigned ring_threads[] = {1, 4, 8, 16};
    for (unsigned t : ring_threads) {
        char how[32];
        snprintf(how, sizeof how, "ring-%u-threads", t);
        kl_fill_opts o = {KL_FILL_RING, 64 * MiB, 0, t, KL_DIRECT_OFF, NULL, 0, 0, 0};
        run_fill(where, how, path, p, arena, &o, h2d);
    }
    kl_fill_opts small = {KL_FILL_RING, 16 * MiB, 0, 8, KL_DIRECT_OFF, NULL, 0, 0, 0};
    kl_fill_opts dio = {KL_FILL_RING, 64 * MiB, 0, 8, KL_DIRECT_ON, NULL, 0, 0, 0};
    kl_fill_opts mapped = {KL_FILL_MAPPED, 256 * MiB, 3, 0, KL_DIRECT_OFF, NULL, 0, 0, 0};
    kl_fill_opts t4 = {KL_FILL_MAPPED, 256 * MiB, 8, 4, KL_DIRECT_OFF, NULL, 0, 0, 0};
    kl_fill_opts rd = {KL_FILL_READ, 0, 0, 0, KL_DIRECT_OFF, NULL, 0, 0, 0};
    run_fill(where, "ring-8-threads-16MiB", path, p, arena, &small, h2d);
    run_fill(where, "ring-direct-8-threads", path, p, arena, &dio, h2d);
    read_once(path);   /* O_DIRECT may have dropped cached pages */
    run_fill(where, "mapped", path, p, arena, &mapped, h2d);
    run_fill(where, "mapped-4-threads", path, p, arena, &t4, h2d);
    run_fill(where, "read", path, p, arena, &rd, h2d);
    kl_fill_opts r8 = {KL_FILL_RING, 64 * MiB, 0, 8, KL_DIRECT_OFF, NULL, 0, 0, 0};
    run_fill(where, "ring-8-threads", path, tp[1], arena, &r8, h2d);
    run_fill(where, "mapped-4-threads", path, tp[1], arena, &t4, h2d);
    run_prepared(where, path, tp, arena, h2d);
}

int main(void)
{
    if (!t_have_gpu("test_load"))
        return 77;
    kl_err err;
    kl_err_clear(&err);
    double d2d = 0, h2d = 0;
    t_ok(kl_gpu_measure_rates((size_t)1 << 30, 5, &d2d, &h2d, &err), &err, "rates");
    static test_plan tp[2];
    const uint32_t most[2] = {96u << 20, 2u << 20};
    uint64_t arena_bytes = 0;
    for (int i = 0; i < 2; i++) {
        tp[i].name = i ? "model-sized" : "large";
        make_plan(&tp[i].p, tp[i].pc, &tp[i].arena_bytes, most[i]);
        for (const auto &x : tp[i].pc)
            tp[i].p.file_bytes += x.bytes;
        tp[i].sum = checksum(&tp[i].p, pattern_bytes().data(), 1);
        arena_bytes = std::max(arena_bytes, tp[i].arena_bytes);
    }
    uint8_t *arena = (uint8_t *)t_alloc(arena_bytes);
    const char *files[2][2] = {{"page-cache", "build/kl_test_load.bin"},
                               {"tmpfs", "/dev/shm/kl_test_load.bin"}};
    for (const auto &fl : files) {
        if (!write_file(fl[1])) {
            fprintf(stderr, "test_load: cannot write %s: %s skipped\n", fl[1], fl[0]);
            continue;
        }
        read_once(fl[1]);
        run_file(fl[0], fl[1], tp, arena, h2d);
        unlink(fl[1]);
    }
    hipFree(arena);
    printf("{\"test\":\"load\",\"ok\":%s,\"pinned_h2d_gbps\":%.2f,\"d2d_copy_gbps\":%.1f,"
           "\"checks\":[%s],\"fills\":[%s]}\n",
           t_all_ok ? "true" : "false", h2d, d2d, t_checks.c_str(), g_runs.c_str());
    return t_all_ok ? 0 : 1;
}
