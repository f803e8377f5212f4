/*
 * tests/gpu/pattern_file.h — the file the load tests read: FILE_BYTES of a known pattern,
 * written once to a path, read once so it starts warm in the page cache, mapped.  Header only.
 */
#ifndef KL_TESTS_GPU_PATTERN_FILE_H
#define KL_TESTS_GPU_PATTERN_FILE_H

#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#define FILE_BYTES (((size_t)4 << 30) + 12345)

/* The byte at file offset o. */
static inline uint8_t pattern(uint64_t o)
{
    uint64_t x = (o >> 3) * 0x9E3779B97F4A7C15ull;
    return (uint8_t)((x >> 56) ^ (o & 7) * 31u);
}

/* The file's bytes, made once. */
static inline const std::vector<uint8_t> &pattern_bytes(void)
{
    static std::vector<uint8_t> file;
    if (file.empty()) {
        file.resize(FILE_BYTES);
        for (size_t i = 0; i < FILE_BYTES; i++)
            file[i] = pattern(i);
    }
    return file;
}

/* Writes the pattern file; 0 when it could not be written (the case is skipped). */
static inline int write_file(const char *path)
{
    const std::vector<uint8_t> &bytes = pattern_bytes();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return 0;
    int ok = 1;
    for (size_t at = 0; ok && at < FILE_BYTES; ) {
        ssize_t w = write(fd, bytes.data() + at, std::min<size_t>(FILE_BYTES - at, 1u << 30));
        ok = w > 0;
        at += ok ? (size_t)w : 0;
    }
    close(fd);
    if (!ok)
        unlink(path);
    return ok;
}

/* Reads the whole file once (so a page-cache case starts warm). */
static inline void read_once(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return;
    std::vector<uint8_t> buf((size_t)64 << 20);
    for (off_t at = 0;;) {
        ssize_t n = pread(fd, buf.data(), buf.size(), at);
        if (n <= 0)
            break;
        at += n;
    }
    close(fd);
}

/* The pattern file at path mapped read-only (MAP_SHARED, FILE_BYTES), 2 MiB pages advised
 * when huge; NULL when it cannot be opened or mapped. */
static inline uint8_t *map_pattern_file(const char *path, int huge)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return NULL;
    void *m = mmap(NULL, FILE_BYTES, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return NULL;
    if (huge)
        (void)madvise(m, FILE_BYTES, MADV_HUGEPAGE);
    return (uint8_t *)m;
}

#endif
