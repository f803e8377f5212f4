/*
 * audit/expect.c — expected SHA-256 values for shards.
 *
 * Two sources:
 *  - a sha256sum-format file: "HEX  NAME" or "HEX *NAME" per line (NAME may carry a directory
 *    prefix; only the base name is matched against shard names);
 *  - a Hugging Face cache snapshot directory: each shard there is a symbolic link into
 *    ../../blobs/<sha256>, so the blob's name is the expected hash (no network needed).
 * When no source is given and the audited directory is itself such a snapshot, its links are
 * used the same way.
 */
#include "audit/expect.h"

#include "common/fs.h"
#include "common/mem.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int is_hex64(const char *s, size_t n)
{
    if (n != 64)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i]))
            return 0;
    return 1;
}

static void lower_copy(char out[65], const char *s)
{
    for (int i = 0; i < 64; i++)
        out[i] = (char)tolower((unsigned char)s[i]);
    out[64] = 0;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* Finds NAME's hash in sha256sum text; 1 if found. */
static int lookup_sums(const char *text, const char *name, char out[65])
{
    const char *line = text;
    while (*line) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len > 66 && is_hex64(line, 64) && line[64] == ' ' &&
            (line[65] == ' ' || line[65] == '*')) {
            char file[4096];
            size_t fl = len - 66;
            if (fl && line[66 + fl - 1] == '\r')
                fl--;
            if (fl < sizeof file) {
                memcpy(file, line + 66, fl);
                file[fl] = 0;
                if (!strcmp(base_name(file), name)) {
                    lower_copy(out, line);
                    return 1;
                }
            }
        }
        line += len + (end ? 1 : 0);
    }
    return 0;
}

/* Expected hash from a snapshot link DIR/NAME -> .../blobs/<sha256>; 1 if found. */
static int lookup_link(const char *dir, const char *name, char out[65])
{
    char path[4096], target[4096];
    if (kl_path_join(path, sizeof path, dir, name, NULL))
        return 0;
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n <= 0)
        return 0;
    target[n] = 0;
    const char *b = base_name(target);
    if (!is_hex64(b, strlen(b)) || !strstr(target, "blobs/"))
        return 0;
    lower_copy(out, b);
    return 1;
}

int kl_expect_open(kl_expect *e, const char *source, const char *ckpt_dir, kl_err *err)
{
    memset(e, 0, sizeof *e);
    if (!source) {
        e->kind = KL_EXPECT_SNAPSHOT_AUTO;
        e->dir = kl_strdup(ckpt_dir);
        return e->dir ? 0 : kl_fail(err, KL_E_NOMEM, "out of memory");
    }
    struct stat st;
    if (stat(source, &st) != 0) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot read the --expect source");
        kl_err_context(err, source, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    if (S_ISDIR(st.st_mode)) {
        e->kind = KL_EXPECT_SNAPSHOT;
        e->dir = kl_strdup(source);
        return e->dir ? 0 : kl_fail(err, KL_E_NOMEM, "out of memory");
    }
    size_t len;
    e->kind = KL_EXPECT_SUMS;
    return kl_read_file(source, 64u << 20, &e->sums, &len, err);
}

int kl_expect_lookup(const kl_expect *e, const char *shard_name, char out[65])
{
    switch (e->kind) {
    case KL_EXPECT_SUMS: return lookup_sums(e->sums, shard_name, out);
    case KL_EXPECT_SNAPSHOT:
    case KL_EXPECT_SNAPSHOT_AUTO: return lookup_link(e->dir, shard_name, out);
    }
    return 0;
}

void kl_expect_free(kl_expect *e)
{
    if (!e)
        return;
    kl_free(e->sums);
    kl_free(e->dir);
    memset(e, 0, sizeof *e);
}
