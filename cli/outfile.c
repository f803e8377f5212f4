/* cli/outfile.c — whole-or-nothing output files (see outfile.h). */
#include "cli/outfile.h"

#include "common/mem.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- paths -------------------------------------------------------------------------------- */

static int io_fail(kl_err *err, int e, const char *path, const char *msg)
{
    kl_fail_sys(err, KL_E_IO, e, "%s", msg);
    kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
    return KL_E_IO;
}

/* The directory part of path ("." when none) into out (PATH_MAX). */
static void parent_of(const char *path, char *out)
{
    snprintf(out, PATH_MAX, "%s", path);
    char *slash = strrchr(out, '/');
    if (!slash)
        snprintf(out, PATH_MAX, ".");
    else if (slash == out)
        out[1] = 0;
    else
        *slash = 0;
}

/* 1 if the directory dir (resolved) or any directory above it is guard (by device and inode). */
static int dir_within(const char *dir, const struct stat *guard)
{
    char real[PATH_MAX];
    if (!realpath(dir, real))
        return 0;
    for (;;) {
        struct stat st;
        if (stat(real, &st) == 0 && st.st_dev == guard->st_dev && st.st_ino == guard->st_ino)
            return 1;
        char *slash = strrchr(real, '/');
        if (!slash || (slash == real && !real[1]))
            return 0;
        if (slash == real)
            real[1] = 0;
        else
            *slash = 0;
    }
}

/* KL_E_USAGE if path, or where it leads when it is a symlink, lies inside guard_dir. */
static int check_guard(const char *path, const char *guard_dir, kl_err *err)
{
    struct stat g;
    if (!guard_dir || stat(guard_dir, &g) != 0)
        return 0;
    char dir[PATH_MAX], real[PATH_MAX];
    parent_of(path, dir);
    int inside = dir_within(dir, &g);
    if (!inside && realpath(path, real)) {
        parent_of(real, dir);
        inside = dir_within(dir, &g);
    }
    if (inside)
        return kl_fail(err, KL_E_USAGE, "%s is inside the model directory %s: refusing to write "
                       "there", path, guard_dir);
    return 0;
}

/* ---- public API --------------------------------------------------------------------------- */

int kl_outfile_open(kl_outfile *o, const char *path, const char *guard_dir, kl_err *err)
{
    memset(o, 0, sizeof *o);
    o->path = path;
    struct stat st;
    if (!path || !*path || path[strlen(path) - 1] == '/')
        return kl_fail(err, KL_E_USAGE, "the output path must name a file");
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return kl_fail(err, KL_E_USAGE, "%s exists and is not a regular file", path);
    int rc = check_guard(path, guard_dir, err);
    if (rc)
        return rc;
    /* beside the path, so the rename stays in one file system */
    char dir[PATH_MAX];
    parent_of(path, dir);
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t n = strlen(dir) + strlen(base) + 16;
    if (!(o->tmp = kl_malloc(n)))
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    snprintf(o->tmp, n, "%s/.%s.XXXXXX", dir, base);
    int fd = mkstemp(o->tmp);
    if (fd < 0) {
        rc = io_fail(err, errno, path, "cannot create a temporary file beside the output");
        kl_free(o->tmp);
        o->tmp = NULL;
        return rc;
    }
    /* mkstemp makes it 0600: give it the mode a new file gets (0666 less the umask) */
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(fd, 0666 & ~mask) != 0 || !(o->f = fdopen(fd, "wb"))) {
        rc = io_fail(err, errno, path, "cannot open the output");
        close(fd);
        kl_outfile_discard(o);
        return rc;
    }
    return 0;
}

int kl_outfile_commit(kl_outfile *o, kl_err *err)
{
    if (!o->f)
        return kl_fail(err, KL_E_BUG, "output file committed twice");
    int rc = 0;
    if (fflush(o->f) != 0 || fsync(fileno(o->f)) != 0)
        rc = io_fail(err, errno, o->path, "cannot write the output");
    if (fclose(o->f) != 0 && !rc)
        rc = io_fail(err, errno, o->path, "cannot write the output");
    o->f = NULL;
    if (!rc && rename(o->tmp, o->path) != 0)
        rc = io_fail(err, errno, o->path, "cannot move the output into place");
    if (rc) {
        kl_outfile_discard(o);
        return rc;
    }
    kl_free(o->tmp);
    o->tmp = NULL;
    /* the rename is durable once the directory is */
    char dir[PATH_MAX];
    parent_of(o->path, dir);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

void kl_outfile_discard(kl_outfile *o)
{
    if (o->f)
        fclose(o->f);
    o->f = NULL;
    if (o->tmp)
        unlink(o->tmp);
    kl_free(o->tmp);
    o->tmp = NULL;
}
