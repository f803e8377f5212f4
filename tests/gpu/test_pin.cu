/*
 * tests/gpu/test_pin.cu — what a load that does not copy on the host would cost: the GPU
 * copying straight from page-cache (or tmpfs) pages that the driver page-locks in place
 * (cudaHostRegister of a read-only file mapping).  On a 4 GiB pattern file in the build
 * folder's file system and in /dev/shm, timed beside the pinned host-to-device copy of the
 * same run:
 *   populate-T       page-table entries made by T threads (MADV_POPULATE_READ, 64 MiB each)
 *   register-T-W     T threads page-lock windows of W MiB of a fresh mapping, then unlock them
 *   register-warm-T  the same after the entries exist (populated first, not timed)
 *   dma              copies from the locked windows into device memory, alone
 *   copy-during-register  pinned copies while 4 threads lock and unlock windows (does the
 *                    driver hold copies back while it locks?)
 *   pipeline-T-W     the whole path: T threads populate and lock windows ahead, one stream
 *                    copies them in order, a thread unlocks and drops each window once copied
 *   lock-then-unlock-during-copies  page-locking alone, then unlocking alone, each while
 *                    8 GiB of pinned copies run (session 11 on the H200: locking ~30 GB/s
 *                    against ~60 alone, unlocking ~23 against ~130: the driver slows both
 *                    behind copies in flight, so a pipeline that page-locks while it copies
 *                    runs at ~20-28 GB/s whatever the threads)
 *   pipeline-...-unlock-at-end  the windows unlocked together after the last copy (their
 *                    page-table entries dropped as they are copied)
 * By default only the last two kinds run (~1 minute); PIN_ALL=1 runs every case (~3 minutes).
 * Checked: every byte the dma and pipeline cases put on the device equals the file.  Reported:
 * the kernel, transparent huge pages' settings and the file mapping's PMD-mapped share.  One
 * JSON line per case ({"test":"pin-case",...}), then {"test":"pin","ok":...}; exit 0 pass, 1
 * fail, 77 no GPU.
 */
extern "C" {
#include "common/clock.h"
#include "kernels/runtime.h"
}
#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/pattern_file.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <thread>

#if defined(__HIPCC__) && !defined(hipHostRegisterReadOnly)
#define hipHostRegisterReadOnly hipHostRegisterDefault
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

static double g_h2d;   /* pinned host-to-device GB/s of this run */

static void report(const char *where, const char *how, double s, double bytes, const char *more)
{
    printf("{\"test\":\"pin-case\",\"file\":\"%s\",\"how\":\"%s\",\"s\":%.4f,\"gbps\":%.2f,"
           "\"ratio_to_pinned_h2d\":%.3f%s%s}\n",
           where, how, s, bytes / s / 1e9, bytes / s / 1e9 / g_h2d, *more ? "," : "", more);
    fflush(stdout);
}

/* Runs body(k) for k < n on T threads taking k from a shared counter. */
template <class F> static void parallel(unsigned T, size_t n, F body)
{
    std::atomic<size_t> next{0};
    std::vector<std::thread> th;
    for (unsigned t = 0; t < T; t++)
        th.emplace_back([&] {
            for (size_t k; (k = next++) < n;)
                body(k);
        });
    for (auto &x : th)
        x.join();
}

static size_t n_windows(size_t w)
{
    return (FILE_BYTES + w - 1) / w;
}

static size_t win_len(size_t k, size_t w)
{
    return std::min(w, FILE_BYTES - k * w);
}

static void populate(uint8_t *m, unsigned T)
{
    const size_t piece = (size_t)64 << 20;
    parallel(T, n_windows(piece), [&](size_t k) {
        (void)madvise(m + k * piece, win_len(k, piece), MADV_POPULATE_READ);
    });
}

/* The kB of a smaps_rollup field ("FilePmdMapped", "ShmemPmdMapped", "Rss"), -1 if absent. */
static long smaps_kb(const char *field)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f)
        return -1;
    char line[256];
    long kb = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':')
            kb = atol(line + n + 1);
    fclose(f);
    return kb;
}

static void case_populate(const char *where, const char *path, unsigned T, int huge)
{
    uint8_t *m = map_pattern_file(path, huge);
    if (!m)
        return;
    double t0 = kl_now_s();
    populate(m, T);
    double s = kl_now_s() - t0;
    char how[64], more[160];
    snprintf(how, sizeof how, "populate-%u%s", T, huge ? "-madv-huge" : "");
    snprintf(more, sizeof more, "\"file_pmd_kb\":%ld,\"shmem_pmd_kb\":%ld,\"rss_kb\":%ld",
             smaps_kb("FilePmdMapped"), smaps_kb("ShmemPmdMapped"), smaps_kb("Rss"));
    report(where, how, s, FILE_BYTES, more);
    munmap(m, FILE_BYTES);
}

/* Locks every window of w bytes of m with T threads; the seconds it took (0 when one failed). */
static double lock_all(uint8_t *m, size_t w, unsigned T)
{
    std::atomic<int> bad{0};
    double t0 = kl_now_s();
    parallel(T, n_windows(w), [&](size_t k) {
        if (hipHostRegister(m + k * w, win_len(k, w), hipHostRegisterReadOnly) != hipSuccess)
            bad++;
    });
    double s = kl_now_s() - t0;
    if (bad) {
        fprintf(stderr, "test_pin: %d windows could not be page-locked\n", bad.load());
        (void)hipGetLastError();
    }
    return bad ? 0 : s;
}

static double unlock_all(uint8_t *m, size_t w, unsigned T)
{
    double t0 = kl_now_s();
    parallel(T, n_windows(w), [&](size_t k) { (void)hipHostUnregister(m + k * w); });
    return kl_now_s() - t0;
}

/* register-T-W (warm: entries populated first). */
static void case_register(const char *where, const char *path, unsigned T, size_t wmib, int warm)
{
    uint8_t *m = map_pattern_file(path, 0);
    if (!m)
        return;
    if (warm)
        populate(m, 16);
    const size_t w = wmib << 20;
    double lock_s = lock_all(m, w, T);
    double unlock_s = lock_s > 0 ? unlock_all(m, w, T) : 0;
    munmap(m, FILE_BYTES);
    if (lock_s <= 0)
        return;
    char how[64], more[128];
    snprintf(how, sizeof how, "register%s-%u-%zuMiB", warm ? "-warm" : "", T, wmib);
    snprintf(more, sizeof more, "\"unregister_s\":%.4f,\"lock_and_unlock_gbps\":%.2f", unlock_s,
             FILE_BYTES / (lock_s + unlock_s) / 1e9);
    report(where, how, lock_s, FILE_BYTES, more);
}

/* Whether the device arena holds the file's bytes. */
static void check_arena(const char *where, const char *how, const uint8_t *arena)
{
    std::vector<uint8_t> back(FILE_BYTES);
    T_CHECK(hipMemcpy(back.data(), arena, FILE_BYTES, hipMemcpyDeviceToHost));
    char what[96];
    snprintf(what, sizeof what, "%s %s bytes differ from the file", where, how);
    t_check(what, memcmp(back.data(), pattern_bytes().data(), FILE_BYTES) != 0, 0);
    T_CHECK(hipMemset((void *)arena, 0, FILE_BYTES));
}

/* dma: copies from windows locked ahead, alone. */
static void case_dma(const char *where, const char *path, uint8_t *arena, hipStream_t st)
{
    uint8_t *m = map_pattern_file(path, 0);
    if (!m)
        return;
    const size_t w = (size_t)256 << 20;
    populate(m, 16);
    if (lock_all(m, w, 4) <= 0) {
        munmap(m, FILE_BYTES);
        return;
    }
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = kl_now_s();
        for (size_t k = 0; k < n_windows(w); k++)
            T_CHECK(hipMemcpyAsync(arena + k * w, m + k * w, win_len(k, w),
                                   hipMemcpyHostToDevice, st));
        T_CHECK(hipStreamSynchronize(st));
        best = std::min(best, kl_now_s() - t0);
    }
    report(where, "dma-from-locked-file-pages", best, FILE_BYTES, "\"windows_mib\":256");
    check_arena(where, "dma", arena);
    unlock_all(m, w, 4);
    munmap(m, FILE_BYTES);
}

/* Pinned copies of 1 GiB, 8 times, alone and while 4 threads lock and unlock windows. */
static void case_interference(const char *where, const char *path, uint8_t *arena,
                              hipStream_t st)
{
    const size_t gib = (size_t)1 << 30;
    void *h = NULL;
    T_CHECK(hipHostMalloc(&h, gib, hipHostMallocDefault));
    memset(h, 1, gib);
    auto copies = [&] {
        double t0 = kl_now_s();
        for (int i = 0; i < 8; i++)
            T_CHECK(hipMemcpyAsync(arena, h, gib, hipMemcpyHostToDevice, st));
        T_CHECK(hipStreamSynchronize(st));
        return kl_now_s() - t0;
    };
    double alone = copies();
    alone = std::min(alone, copies());
    uint8_t *m = map_pattern_file(path, 0);
    const size_t w = (size_t)64 << 20;
    std::atomic<int> stop{0};
    std::atomic<size_t> cycles{0};
    auto lock_cycles = [&](size_t most) {
        for (size_t k = 0; m && !stop && cycles < most; k = (k + 1) % n_windows(w)) {
            if (hipHostRegister(m + k * w, win_len(k, w), hipHostRegisterReadOnly) == hipSuccess)
                (void)hipHostUnregister(m + k * w);
            cycles++;
        }
    };
    double t0 = kl_now_s();
    lock_cycles(64);
    double lock_alone = cycles * (double)w / (kl_now_s() - t0) / 1e9;
    cycles = 0;
    std::thread locker([&] { lock_cycles((size_t)-1); });
    double during = copies();
    stop = 1;
    locker.join();
    if (m)
        munmap(m, FILE_BYTES);
    T_CHECK(hipHostFree(h));
    char more[192];
    snprintf(more, sizeof more,
             "\"alone_gbps\":%.2f,\"lock_unlock_alone_gbps\":%.2f,"
             "\"lock_unlock_during_copies_gbps\":%.2f",
             8.0 * gib / alone / 1e9, lock_alone, cycles * (double)w / during / 1e9);
    report(where, "copy-during-register", during, 8.0 * gib, more);
    T_CHECK(hipMemset(arena, 0, FILE_BYTES));
}

/* Page-locking alone, then unlocking alone, each while pinned copies run: which of the two
 * the driver holds back behind copies in flight. */
static void case_lock_during_copies(const char *where, const char *path, uint8_t *arena,
                                    hipStream_t st)
{
    const size_t gib = (size_t)1 << 30, w = (size_t)64 << 20;
    void *h = NULL;
    T_CHECK(hipHostMalloc(&h, gib, hipHostMallocDefault));
    memset(h, 1, gib);
    uint8_t *m = map_pattern_file(path, 0);
    if (!m) {
        T_CHECK(hipHostFree(h));
        return;
    }
    populate(m, 16);
    double lock_s = 0, unlock_s = 0, copy_s[2] = {0, 0};
    for (int phase = 0; phase < 2; phase++) {
        double t0 = kl_now_s();
        for (int i = 0; i < 8; i++)
            T_CHECK(hipMemcpyAsync(arena, h, gib, hipMemcpyHostToDevice, st));
        double l0 = kl_now_s();
        for (size_t k = 0; k < n_windows(w); k++) {
            if (phase == 0)
                T_CHECK(hipHostRegister(m + k * w, win_len(k, w), hipHostRegisterReadOnly));
            else
                T_CHECK(hipHostUnregister(m + k * w));
        }
        (phase ? unlock_s : lock_s) = kl_now_s() - l0;
        T_CHECK(hipStreamSynchronize(st));
        copy_s[phase] = kl_now_s() - t0;
    }
    munmap(m, FILE_BYTES);
    T_CHECK(hipHostFree(h));
    char more[256];
    snprintf(more, sizeof more,
             "\"lock_s\":%.4f,\"lock_gbps\":%.2f,\"unlock_s\":%.4f,\"unlock_gbps\":%.2f,"
             "\"copies_s\":[%.4f,%.4f]",
             lock_s, FILE_BYTES / lock_s / 1e9, unlock_s, FILE_BYTES / unlock_s / 1e9, copy_s[0],
             copy_s[1]);
    report(where, "lock-then-unlock-during-copies", copy_s[0] + copy_s[1], 16.0 * gib, more);
}

/* The zero-copy path whole: T threads populate and lock window k once fewer than depth windows
 * are locked and not yet released; the main thread copies them in order; a thread waits for
 * each copy, unlocks its window and drops its page-table entries. */
struct pipeline {
    uint8_t *m;                /* the whole file, or NULL: each window mapped on its own */
    int fd;
    int populate, per_window;
    int defer;                 /* unlock every window at the end, not once copied */
    std::vector<uint8_t *> at; /* where window k is mapped */
    size_t w, n;
    unsigned depth;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int> locked;   /* 1 locked, -1 failed */
    size_t copied = 0, released = 0;
    std::vector<hipEvent_t> ev;
    double lock_s = 0, release_s = 0;
};

static void pipe_lock(pipeline &p, size_t k)
{
    {
        std::unique_lock<std::mutex> l(p.mu);
        p.cv.wait(l, [&] { return k < p.released + p.depth; });
    }
    double t0 = kl_now_s();
    uint8_t *at = p.m + k * p.w;
    if (p.per_window) {
        void *m = mmap(NULL, win_len(k, p.w), PROT_READ, MAP_SHARED, p.fd, (off_t)(k * p.w));
        at = m == MAP_FAILED ? NULL : (uint8_t *)m;
    }
    if (at && p.populate)
        (void)madvise(at, win_len(k, p.w), MADV_POPULATE_READ);
    int ok = at && hipHostRegister(at, win_len(k, p.w), hipHostRegisterReadOnly) == hipSuccess;
    std::lock_guard<std::mutex> l(p.mu);
    p.at[k] = at;
    p.lock_s += kl_now_s() - t0;
    p.locked[k] = ok ? 1 : -1;
    p.cv.notify_all();
}

static void pipe_release(pipeline &p)
{
    for (size_t k = 0; k < p.n; k++) {
        {
            std::unique_lock<std::mutex> l(p.mu);
            p.cv.wait(l, [&] { return p.copied > k; });
        }
        double t0 = kl_now_s();
        T_CHECK(hipEventSynchronize(p.ev[k % p.depth]));
        if (p.locked[k] == 1 && !p.defer)
            (void)hipHostUnregister(p.at[k]);
        if (p.per_window && p.at[k])
            munmap(p.at[k], win_len(k, p.w));
        else
            (void)madvise(p.at[k], win_len(k, p.w), MADV_DONTNEED);
        std::lock_guard<std::mutex> l(p.mu);
        p.release_s += kl_now_s() - t0;
        p.released = k + 1;
        p.cv.notify_all();
    }
}

static void case_pipeline(const char *where, const char *path, unsigned T, size_t wmib,
                          int populate, int per_window, uint8_t *arena, hipStream_t st,
                          int defer = 0)
{
    pipeline p;
    p.defer = defer;
    p.populate = populate;
    p.per_window = per_window;
    p.fd = open(path, O_RDONLY);
    p.m = per_window ? NULL : map_pattern_file(path, 0);
    if (p.fd < 0 || (!per_window && !p.m)) {
        if (p.fd >= 0)
            close(p.fd);
        return;
    }
    p.w = wmib << 20;
    p.n = n_windows(p.w);
    p.depth = 2 * T;
    p.locked.assign(p.n, 0);
    p.at.assign(p.n, NULL);
    p.ev.resize(p.depth);
    for (auto &e : p.ev)
        T_CHECK(hipEventCreateWithFlags(&e, hipEventDisableTiming));
    double t0 = kl_now_s();
    std::thread release([&] { pipe_release(p); });
    std::thread lockers([&] { parallel(T, p.n, [&](size_t k) { pipe_lock(p, k); }); });
    int failed = 0;
    for (size_t k = 0; k < p.n; k++) {
        std::unique_lock<std::mutex> l(p.mu);
        p.cv.wait(l, [&] { return p.locked[k] != 0; });
        l.unlock();
        failed += p.locked[k] < 0;
        if (p.at[k])
            T_CHECK(hipMemcpyAsync(arena + k * p.w, p.at[k], win_len(k, p.w),
                                   hipMemcpyHostToDevice, st));
        T_CHECK(hipEventRecord(p.ev[k % p.depth], st));
        l.lock();
        p.copied = k + 1;
        p.cv.notify_all();
    }
    lockers.join();
    release.join();
    T_CHECK(hipStreamSynchronize(st));
    double u0 = kl_now_s();
    if (defer)
        parallel(T, p.n, [&](size_t k) {
            if (p.locked[k] == 1)
                (void)hipHostUnregister(p.at[k]);
        });
    double s = kl_now_s() - t0, unlock_end_s = kl_now_s() - u0;
    for (auto &e : p.ev)
        T_CHECK(hipEventDestroy(e));
    if (p.m)
        munmap(p.m, FILE_BYTES);
    close(p.fd);
    char how[64], more[256];
    snprintf(how, sizeof how, "pipeline-%u-%zuMiB%s%s%s", T, wmib,
             populate ? "" : "-no-populate", per_window ? "-map-per-window" : "",
             defer ? "-unlock-at-end" : "");
    snprintf(more, sizeof more,
             "\"threads_locking_s\":%.3f,\"releasing_s\":%.3f,\"windows_not_locked\":%d,"
             "\"mapped_at_most_mib\":%zu,\"populate\":%s,\"map_per_window\":%s,"
             "\"unlock_at_end_s\":%.4f",
             p.lock_s, p.release_s, failed, p.depth * wmib, p.populate ? "true" : "false",
             p.per_window ? "true" : "false", unlock_end_s);
    report(where, how, s, FILE_BYTES, more);
    check_arena(where, how, arena);
}

static void print_host(void)
{
    struct utsname u;
    char thp[128] = "?", shm[128] = "?";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f && fgets(thp, sizeof thp, f))
        thp[strcspn(thp, "\n")] = 0;
    if (f)
        fclose(f);
    f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
    if (f && fgets(shm, sizeof shm, f))
        shm[strcspn(shm, "\n")] = 0;
    if (f)
        fclose(f);
    uname(&u);
    printf("{\"test\":\"pin-host\",\"kernel\":\"%s\",\"thp\":\"%s\",\"shmem_thp\":\"%s\","
           "\"pinned_h2d_gbps\":%.2f}\n", u.release, thp, shm, g_h2d);
}

static void run_file(const char *where, const char *path, uint8_t *arena, hipStream_t st)
{
    case_lock_during_copies(where, path, arena, st);
    for (unsigned T : {1u, 2u, 4u})
        case_pipeline(where, path, T, 64, 1, 0, arena, st, 1);
    case_pipeline(where, path, 2, 256, 1, 0, arena, st, 1);
    if (!getenv("PIN_ALL"))   /* the cases above only */
        return;
    for (unsigned T : {1u, 4u, 16u})
        case_populate(where, path, T, 0);
    case_populate(where, path, 16, 1);
    for (unsigned T : {1u, 2u, 4u, 8u})
        case_register(where, path, T, 256, 0);
    case_register(where, path, 4, 64, 0);
    case_register(where, path, 4, 1024, 0);
    for (unsigned T : {1u, 4u, 8u})
        case_register(where, path, T, 256, 1);
    case_dma(where, path, arena, st);
    case_interference(where, path, arena, st);
    for (unsigned T : {1u, 2u, 4u, 8u})
        case_pipeline(where, path, T, 64, 1, 0, arena, st);
    case_pipeline(where, path, 4, 64, 0, 0, arena, st);
    case_pipeline(where, path, 4, 64, 1, 1, arena, st);
    case_pipeline(where, path, 4, 64, 0, 1, arena, st);
    case_pipeline(where, path, 4, 256, 1, 0, arena, st);
    case_pipeline(where, path, 4, 16, 1, 0, arena, st);
    case_pipeline(where, path, 8, 16, 1, 0, arena, st);
}

int main(void)
{
    if (!t_have_gpu("test_pin"))
        return 77;
    kl_err err;
    kl_err_clear(&err);
    double d2d = 0;
    t_ok(kl_gpu_measure_rates((size_t)1 << 30, 5, &d2d, &g_h2d, &err), &err, "rates");
    print_host();
    uint8_t *arena = (uint8_t *)t_alloc(FILE_BYTES);
    hipStream_t st;
    T_CHECK(hipStreamCreateWithFlags(&st, hipStreamNonBlocking));
    const char *files[2][2] = {{"page-cache", "build/kl_test_pin.bin"},
                               {"tmpfs", "/dev/shm/kl_test_pin.bin"}};
    for (const auto &fl : files) {
        if (!write_file(fl[1])) {
            fprintf(stderr, "test_pin: cannot write %s: %s skipped\n", fl[1], fl[0]);
            continue;
        }
        read_once(fl[1]);
        run_file(fl[0], fl[1], arena, st);
        unlink(fl[1]);
    }
    T_CHECK(hipStreamDestroy(st));
    hipFree(arena);
    printf("{\"test\":\"pin\",\"ok\":%s,\"pinned_h2d_gbps\":%.2f,\"checks\":[%s]}\n",
           t_all_ok ? "true" : "false", g_h2d, t_checks.c_str());
    return t_all_ok ? 0 : 1;
}
