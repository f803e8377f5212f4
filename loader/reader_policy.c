/* loader/reader_policy.c — how to read whole checkpoint files: direct or buffered, threads,
 * queue depth and chunk size, files open at once (see reader.h, kl_reader_opts_for_files and
 * what follows it). */
#include "loader/reader.h"

#include "common/cpu.h"
#include "common/fs.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#define CACHED_FRACTION 0.9
#define STREAM_QD       32u               /* O_DIRECT: deep queue of 8 MiB chunks */
#define BUFFERED_CHUNK  ((size_t)2 << 20) /* buffered: small chunks that stay in the caches */
#define MAX_OPEN_FILES  64u


static int direct_io_works(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return 0;
    close(fd);
    return 1;
}

/* Whether at least CACHED_FRACTION of all the files' bytes are in the page cache. */
static int mostly_cached(const char *const *paths, size_t n)
{
    uint64_t resident = 0, total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = 0, size = 0;
        if (kl_file_resident(paths[i], &r, &size, NULL))
            return 0;
        resident += r;
        total += size;
    }
    return total > 0 && (double)resident >= CACHED_FRACTION * (double)total;
}

int kl_reader_opts_for_files(kl_reader_opts *o, const char *const *paths, size_t n)
{
    if (!n || o->direct == KL_DIRECT_ON || o->direct == KL_DIRECT_OFF)
        return o->direct == KL_DIRECT_OFF;
    if (direct_io_works(paths[0]) && !mostly_cached(paths, n))
        return 0;
    o->direct = KL_DIRECT_OFF;
    if (o->backend == KL_IO_AUTO)
        o->backend = KL_IO_PREAD;
    o->threads = kl_cpu_count(64);
    return 1;
}

void kl_reader_opts_for_streaming(kl_reader_opts *o, unsigned threads)
{
    if (threads)
        o->threads = threads;
    if (o->direct == KL_DIRECT_OFF) {
        /* page-cache copies scale with threads; measured 20 vs 13.5 GB/s on a 2-core VM for
         * 4 x 2 MiB vs 32 x 8 MiB */
        if (!o->threads)
            o->threads = kl_cpu_count(64);
        if (!o->queue_depth)
            o->queue_depth = o->threads * 2 < 4 ? 4 : o->threads * 2;
        if (!o->buf_bytes)
            o->buf_bytes = BUFFERED_CHUNK;
    }
    if (!o->queue_depth)
        o->queue_depth = STREAM_QD;
}

size_t kl_reader_max_open_files(void)
{
    size_t b = MAX_OPEN_FILES;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 4 < b)
        b = (size_t)(rl.rlim_cur / 4);
    return b ? b : 1;
}
