/* common/fs.c — file helpers (see fs.h). */
#include "common/fs.h"

#include "common/grow.h"
#include "common/mem.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int kl_open_regular(const char *path, uint64_t *size, kl_err *err)
{
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; fstat below refuses it. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot open");
        kl_err_context(err, NULL, NULL, KL_NO_OFFSET, "FILE-OPEN");
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = kl_fail_sys(err, KL_E_IO, errno, "cannot stat");
    else if (!S_ISREG(st.st_mode))
        rc = kl_fail_rule(err, KL_E_FORMAT, "FILE-NOT-REGULAR", "not a regular file");
    if (rc) {
        close(fd);
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
        return rc;
    }
    *size = (uint64_t)st.st_size;
    return fd;
}

int kl_read_file(const char *path, size_t max_bytes, char **out, size_t *len, kl_err *err)
{
    uint64_t size = 0;
    int fd = kl_open_regular(path, &size, err);
    if (fd < 0)
        return fd;
    int rc = 0;
    char *buf = NULL;
    if (size > max_bytes) {
        rc = kl_fail_rule(err, KL_E_FORMAT, "FILE-TOO-LARGE",
                          "file is %llu bytes, more than the %zu allowed",
                          (unsigned long long)size, max_bytes);
        goto done;
    }
    size_t n = (size_t)size;
    buf = kl_malloc(n + 1);
    if (!buf) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory reading %zu bytes", n);
        goto done;
    }
    rc = kl_pread_all(fd, buf, n, 0, path, err);
    if (rc)
        goto done;
    buf[n] = 0;
    *out = buf;
    *len = n;
    buf = NULL;
done:
    kl_free(buf);
    close(fd);
    if (rc)
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
    return rc;
}

int kl_write_all(int fd, const void *buf, size_t n, const char *path, kl_err *err)
{
    const char *p = buf;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            kl_fail_sys(err, KL_E_IO, errno, "write failed");
            kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
            return KL_E_IO;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int kl_pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *path, kl_err *err)
{
    const char *p = buf;
    while (n) {
        ssize_t k = pwrite(fd, p, n, (off_t)off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            kl_fail_sys(err, KL_E_IO, errno, "write failed");
            kl_err_context(err, path, NULL, off, NULL);
            return KL_E_IO;
        }
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

int kl_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path, kl_err *err)
{
    char *p = buf;
    while (n) {
        ssize_t k = pread(fd, p, n, (off_t)off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            kl_fail_sys(err, KL_E_IO, errno, "read failed");
            kl_err_context(err, path, NULL, off, NULL);
            return KL_E_IO;
        }
        if (k == 0) {
            kl_fail_rule(err, KL_E_FORMAT, "FILE-SHORT", "file ends %zu bytes early", n);
            kl_err_context(err, path, NULL, off, NULL);
            return KL_E_FORMAT;
        }
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

int kl_path_join(char *out, size_t n, const char *dir, const char *name, kl_err *err)
{
    size_t dl = strlen(dir);
    int k = (dl && dir[dl - 1] == '/') ? snprintf(out, n, "%s%s", dir, name)
                                       : snprintf(out, n, "%s/%s", dir, name);
    if (k < 0 || (size_t)k >= n)
        return kl_fail(err, KL_E_USAGE, "path %s/%s is too long", dir, name);
    return 0;
}

int kl_path_parent(char *out, size_t n, const char *path, kl_err *err)
{
    size_t l = strlen(path);
    while (l > 1 && path[l - 1] == '/') /* "out/" names "out" */
        l--;
    while (l && path[l - 1] != '/') /* the last name */
        l--;
    while (l > 1 && path[l - 1] == '/')
        l--;
    const char *p = l ? path : ".";
    l = l ? l : 1;
    if (l >= n)
        return kl_fail(err, KL_E_USAGE, "path %s is too long", path);
    memcpy(out, p, l);
    out[l] = 0;
    return 0;
}

int kl_write_file_atomic(const char *dir, const char *name, const void *data, size_t n,
                         kl_err *err)
{
    char tmp[4096], dst[4096], tmpname[1024];
    snprintf(tmpname, sizeof tmpname, ".%s.tmp", name);
    if (kl_path_join(tmp, sizeof tmp, dir, tmpname, err) ||
        kl_path_join(dst, sizeof dst, dir, name, err))
        return KL_E_USAGE;
    unlink(tmp); /* never follow a link planted under the temporary name */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot create");
        kl_err_context(err, tmp, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    int rc = kl_write_all(fd, data, n, tmp, err);
    if (!rc && fsync(fd) != 0) {
        rc = kl_fail_sys(err, KL_E_IO, errno, "fsync failed");
        kl_err_context(err, tmp, NULL, KL_NO_OFFSET, NULL);
    }
    if (close(fd) != 0 && !rc) {
        rc = kl_fail_sys(err, KL_E_IO, errno, "close failed");
        kl_err_context(err, tmp, NULL, KL_NO_OFFSET, NULL);
    }
    if (!rc && rename(tmp, dst) != 0) {
        rc = kl_fail_sys(err, KL_E_IO, errno, "cannot rename into place");
        kl_err_context(err, dst, NULL, KL_NO_OFFSET, NULL);
    }
    if (rc) {
        unlink(tmp);
        return rc;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

int kl_mkdir_p(const char *path, kl_err *err)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return kl_fail(err, KL_E_USAGE, "path too long");
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            goto fail;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        goto fail;
    return 0;
fail:
    kl_fail_sys(err, KL_E_IO, errno, "cannot create directory");
    kl_err_context(err, buf, NULL, KL_NO_OFFSET, NULL);
    return KL_E_IO;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void kl_free_name_list(char **names, size_t n)
{
    if (!names)
        return;
    for (size_t i = 0; i < n; i++)
        kl_free(names[i]);
    kl_free(names);
}

/* 1 if dir/name is a directory (following symlinks); 0 otherwise, also when stat fails. */
static int is_dir_entry(int dfd, const struct dirent *e)
{
    if (e->d_type == DT_DIR)
        return 1;
    if (e->d_type != DT_UNKNOWN && e->d_type != DT_LNK)
        return 0;
    struct stat st;
    return fstatat(dfd, e->d_name, &st, 0) == 0 && S_ISDIR(st.st_mode);
}

int kl_list_files_with_suffix(const char *dir, const char *suffix, char ***names, size_t *n,
                              kl_err *err)
{
    DIR *d = opendir(dir);
    if (!d) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot open directory");
        kl_err_context(err, dir, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    size_t slen = strlen(suffix), count = 0, cap = 0;
    char **list = NULL;
    int rc = 0;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno) {
                rc = kl_fail_sys(err, KL_E_IO, errno, "cannot read directory");
                kl_err_context(err, dir, NULL, KL_NO_OFFSET, NULL);
            }
            break;
        }
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || len < slen || strcmp(e->d_name + len - slen, suffix) != 0 ||
            is_dir_entry(dirfd(d), e))
            continue;
        if (kl_grow(&list, &cap, count + 1, sizeof *list)) {
            rc = kl_fail(err, KL_E_NOMEM, "out of memory listing %s", dir);
            break;
        }
        if (!(list[count] = kl_strndup(e->d_name, len))) {
            rc = kl_fail(err, KL_E_NOMEM, "out of memory listing %s", dir);
            break;
        }
        count++;
    }
    closedir(d);
    if (rc) {
        kl_free_name_list(list, count);
        return rc;
    }
    if (count > 1)
        qsort(list, count, sizeof *list, cmp_names);
    *names = list;
    *n = count;
    return 0;
}

int kl_file_resident(const char *path, uint64_t *resident, uint64_t *size, kl_err *err)
{
    *resident = 0;
    int fd = kl_open_regular(path, size, err);
    if (fd < 0)
        return fd;
    const uint64_t window = (uint64_t)1 << 30;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    unsigned char *vec = kl_malloc((size_t)(window / page));
    int rc = vec ? 0 : kl_fail(err, KL_E_NOMEM, "out of memory");
    for (uint64_t off = 0; !rc && off < *size; off += window) {
        size_t len = (size_t)(*size - off < window ? *size - off : window);
        void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)off);
        if (m == MAP_FAILED || mincore(m, len, vec) != 0) {
            rc = kl_fail_sys(err, KL_E_IO, errno, "cannot tell what is cached");
            kl_err_context(err, path, NULL, off, NULL);
        }
        for (size_t i = 0; !rc && i < (len + page - 1) / page; i++)
            if (vec[i] & 1)
                *resident += i + 1 == (len + page - 1) / page ? len - i * page : page;
        if (m != MAP_FAILED)
            munmap(m, len);
    }
    kl_free(vec);
    close(fd);
    return rc;
}
