/* loader/reader_policy.c — direct or buffered for whole checkpoint files (see reader.h,
 * kl_reader_opts_for_files). */
#include "loader/reader.h"

#include "common/cpu.h"
#include "common/fs.h"

#include <fcntl.h>
#include <unistd.h>

#define CACHED_FRACTION 0.9

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
