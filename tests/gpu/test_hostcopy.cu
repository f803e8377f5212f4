/*
 * tests/gpu/test_hostcopy.cu — how fast a ring of pinned buffers can be filled from a file in
 * the page cache (or tmpfs) while the GPU copies out of it: the host copy is what bounds kl's
 * ring load (docs/PERFORMANCE.md, session 10: the fill ran at ~0.9 of this host's memcpy).
 * On a 4 GiB pattern file in the build folder's file system and in /dev/shm, T threads take
 * 16 MiB chunks in turn; each thread owns two pinned buffers, a stream and an event per
 * buffer: it waits for the buffer's last device copy, fills it with the chunk, and queues the
 * chunk's copy to its place in a device arena.  How a chunk reaches the buffer:
 *   pread        the kernel copies from the page cache (KL_GPU_LOAD=ring-read)
 *   memcpy       from the file mapped read-only (populated first, not timed), glibc's memcpy
 *   streaming    the same by kl_copy_streaming (common/streamcopy.h, the ring's default):
 *                non-temporal stores, the buffer's lines written without being read first
 *   streaming-fresh  the same from a mapping made inside the timed part (its page faults
 *                counted)
 *   none         no host copy (the device copies alone: the ring's ceiling)
 * Each with the device copies and without them (the host copy alone), for 8, 12 and 16
 * threads; the best of two runs, GB/s of file and the ratio to the pinned host-to-device rate
 * of the same run.  HOSTCOPY_CHUNKS_KIB (16384; a list: smaller chunks keep each thread's two
 * buffers in the CPU's caches, where the device's reads may find them), HOSTCOPY_THREADS
 * (8,12,16), HOSTCOPY_HOWS, HOSTCOPY_FILES (page-cache,tmpfs) pick the cases;
 * HOSTCOPY_HOST_ONLY=0 skips the host copy alone.  Checked: the arena after every timed run
 * with device copies, copied back, equals the file.  One JSON line per case
 * ({"test":"hostcopy-case",...}), then {"test":"hostcopy","ok":...}; exit 0 pass, 1 fail, 77 no
 * GPU.
 */
extern "C" {
#include "common/clock.h"
#include "common/streamcopy.h"
#include "kernels/runtime.h"
}
#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/pattern_file.h"

#include <atomic>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

#define MAX_CHUNK ((size_t)16 << 20)
#define MAX_T 16u
#define PER_T 2u

static double g_h2d;
static size_t g_chunk = MAX_CHUNK;   /* this case's chunk (HOSTCOPY_CHUNKS_KIB) */

static size_t n_chunks(void)
{
    return (FILE_BYTES + g_chunk - 1) / g_chunk;
}

static size_t chunk_len(size_t k)
{
    return std::min(g_chunk, FILE_BYTES - k * g_chunk);
}


struct ring {
    uint8_t     *buf[MAX_T][PER_T];
    hipStream_t  st[MAX_T];
    hipEvent_t   ev[MAX_T][PER_T];
};

/* The file mapped (2 MiB pages advised), its page-table entries made first when populate. */
static uint8_t *map_file(const char *path, int populate)
{
    uint8_t *m = map_pattern_file(path, 1);
    if (m && populate) {
        std::vector<std::thread> th;
        const size_t piece = (size_t)256 << 20, n = (FILE_BYTES + piece - 1) / piece;
        std::atomic<size_t> next{0};
        for (unsigned t = 0; t < MAX_T; t++)
            th.emplace_back([&] {
                for (size_t k; (k = next++) < n;)
                    (void)madvise(m + k * piece,
                                  std::min(piece, FILE_BYTES - k * piece), MADV_POPULATE_READ);
            });
        for (auto &x : th)
            x.join();
    }
    return m;
}

/* $name's comma-separated numbers, each 1..MAX_T threads or a chunk in KiB (def if unset). */
static std::vector<size_t> env_numbers(const char *name, const char *def)
{
    const char *v = getenv(name);
    std::vector<size_t> out;
    for (const char *p = v && *v ? v : def; *p;) {
        char *end;
        unsigned long n = strtoul(p, &end, 10);
        if (end == p)
            break;
        if (n)
            out.push_back(strcmp(name, "HOSTCOPY_THREADS") ? n : std::min<size_t>(n, MAX_T));
        p = *end == ',' ? end + 1 : end;
    }
    return out;
}

/* Whether $name (a comma-separated list) names word; unset: every word, except for
 * HOSTCOPY_HOST_ONLY, which says "1" when the host copy alone is timed too (the default). */
static int env_has(const char *name, const char *word)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 1;
    for (const char *p = v; *p;) {
        size_t n = strcspn(p, ",");
        if (n == strlen(word) && !strncmp(p, word, n))
            return 1;
        p += n + (p[n] == ',');
    }
    return 0;
}

/* One run: the seconds from the first chunk taken to the last device copy done. */
static double run_once(ring &r, const char *path, const char *how, unsigned T, int dma,
                       uint8_t *arena)
{
    const int fresh = !strcmp(how, "streaming-fresh");
    const int by_read = !strcmp(how, "pread");
    uint8_t *m = NULL;
    if (!by_read && strcmp(how, "none") && !fresh && !(m = map_file(path, 1)))
        return 0;
    int fd = by_read ? open(path, O_RDONLY) : -1;
    if (by_read && fd < 0)
        return 0;
    std::atomic<size_t> next{0};
    std::atomic<int> failed{0};
    double t0 = kl_now_s();
    if (fresh && !(m = map_file(path, 0)))
        return 0;
    std::vector<std::thread> th;
    for (unsigned t = 0; t < T; t++)
        th.emplace_back([&, t] {
            for (size_t k, i = 0; (k = next++) < n_chunks(); i++) {
                const unsigned b = (unsigned)(i % PER_T);
                uint8_t *dst = r.buf[t][b];
                const size_t len = chunk_len(k);
                if (dma && i >= PER_T && hipEventSynchronize(r.ev[t][b]) != hipSuccess)
                    failed = 1;
                if (by_read) {
                    for (size_t got = 0; got < len;) {
                        ssize_t n = pread(fd, dst + got, len - got, (off_t)(k * g_chunk + got));
                        if (n <= 0) {
                            failed = 1;
                            break;
                        }
                        got += (size_t)n;
                    }
                } else if (!strcmp(how, "memcpy")) {
                    memcpy(dst, m + k * g_chunk, len);
                } else if (strcmp(how, "none")) {
                    kl_copy_streaming(dst, m + k * g_chunk, len);
                }
                if (dma && (hipMemcpyAsync(arena + k * g_chunk, dst, len, hipMemcpyHostToDevice,
                                           r.st[t]) != hipSuccess ||
                            hipEventRecord(r.ev[t][b], r.st[t]) != hipSuccess))
                    failed = 1;
            }
            if (dma && hipStreamSynchronize(r.st[t]) != hipSuccess)
                failed = 1;
        });
    for (auto &x : th)
        x.join();
    double s = kl_now_s() - t0;
    if (m)
        munmap(m, FILE_BYTES);
    if (fd >= 0)
        close(fd);
    return failed ? 0 : s;
}

static void check_arena(const char *where, const char *how, unsigned T, uint8_t *arena)
{
    std::vector<uint8_t> back(FILE_BYTES);
    T_CHECK(hipMemcpy(back.data(), arena, FILE_BYTES, hipMemcpyDeviceToHost));
    char what[96];
    snprintf(what, sizeof what, "%s %s-%u arena differs from the file", where, how, T);
    t_check(what, memcmp(back.data(), pattern_bytes().data(), FILE_BYTES) != 0, 0);
    T_CHECK(hipMemset(arena, 0, FILE_BYTES));
}

static void run_case(ring &r, const char *where, const char *path, const char *how,
                     unsigned T, int dma, uint8_t *arena)
{
    double best = 0;
    for (int rep = 0; rep < 2; rep++) {
        double s = run_once(r, path, how, T, dma, arena);
        char what[96];
        snprintf(what, sizeof what, "%s %s-%u%s run failed", where, how, T,
                 dma ? "" : "-host-only");
        t_check(what, s <= 0, 0);
        if (s > 0 && (best == 0 || s < best))
            best = s;
    }
    if (dma && strcmp(how, "none") && best > 0)
        check_arena(where, how, T, arena);
    double gbps = best > 0 ? FILE_BYTES / best / 1e9 : 0;
    printf("{\"test\":\"hostcopy-case\",\"file\":\"%s\",\"how\":\"%s\",\"threads\":%u,"
           "\"chunk_kib\":%zu,\"device_copies\":%s,\"s\":%.4f,\"gbps\":%.2f,"
           "\"ratio_to_pinned_h2d\":%.3f}\n",
           where, how, T, g_chunk >> 10, dma ? "true" : "false", best, gbps, gbps / g_h2d);
    fflush(stdout);
}

int main(void)
{
    if (!t_have_gpu("test_hostcopy"))
        return 77;
    kl_err err;
    kl_err_clear(&err);
    double d2d = 0;
    t_ok(kl_gpu_measure_rates((size_t)1 << 30, 5, &d2d, &g_h2d, &err), &err, "rates");
    uint8_t *arena = (uint8_t *)t_alloc(FILE_BYTES);
    ring r;
    for (unsigned t = 0; t < MAX_T; t++) {
        T_CHECK(hipStreamCreateWithFlags(&r.st[t], hipStreamNonBlocking));
        for (unsigned b = 0; b < PER_T; b++) {
            T_CHECK(hipHostMalloc((void **)&r.buf[t][b], MAX_CHUNK, hipHostMallocDefault));
            memset(r.buf[t][b], 0, MAX_CHUNK);
            T_CHECK(hipEventCreateWithFlags(&r.ev[t][b], hipEventDisableTiming));
        }
    }
    const char *files[2][2] = {{"page-cache", "build/kl_test_hostcopy.bin"},
                               {"tmpfs", "/dev/shm/kl_test_hostcopy.bin"}};
    static const char *hows[] = {"none", "pread", "memcpy", "streaming", "streaming-fresh"};
    const std::vector<size_t> chunks_kib = env_numbers("HOSTCOPY_CHUNKS_KIB", "16384");
    const std::vector<size_t> threads = env_numbers("HOSTCOPY_THREADS", "8,12,16");
    for (const auto &fl : files) {
        if (!env_has("HOSTCOPY_FILES", fl[0]))
            continue;
        if (!write_file(fl[1])) {
            fprintf(stderr, "test_hostcopy: cannot write %s: %s skipped\n", fl[1], fl[0]);
            continue;
        }
        read_once(fl[1]);
        for (size_t kib : chunks_kib)
            for (const char *how : hows)
                for (size_t T : threads)
                    for (int dma = 1; dma >= 0; dma--)
                        if ((dma || strcmp(how, "none")) && env_has("HOSTCOPY_HOWS", how) &&
                            (dma || env_has("HOSTCOPY_HOST_ONLY", "1"))) {
                            g_chunk = std::min(MAX_CHUNK, kib << 10);
                            run_case(r, fl[0], fl[1], how, (unsigned)T, dma, arena);
                        }
        unlink(fl[1]);
    }
    for (unsigned t = 0; t < MAX_T; t++) {
        for (unsigned b = 0; b < PER_T; b++) {
            hipHostFree(r.buf[t][b]);
            hipEventDestroy(r.ev[t][b]);
        }
        hipStreamDestroy(r.st[t]);
    }
    hipFree(arena);
    printf("{\"test\":\"hostcopy\",\"ok\":%s,\"pinned_h2d_gbps\":%.2f,\"checks\":[%s]}\n",
           t_all_ok ? "true" : "false", g_h2d, t_checks.c_str());
    return t_all_ok ? 0 : 1;
}
