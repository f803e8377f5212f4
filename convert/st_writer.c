/* convert/st_writer.c — safetensors shard and index writer (see st_writer.h). */
#include "convert/st_writer.h"

#include "common/checked.h"
#include "common/fs.h"
#include "common/mem.h"
#include "common/numfmt.h"
#include "common/strmap.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- constants ---- */

#define MAX_DIM 281474976710655ull  /* 2^48 - 1, the JSON schema bound for shapes and offsets */
#define INDEX_NAME "model.safetensors.index.json"

/* ---- helpers ---- */

/* Adds an exact unsigned integer (cJSON numbers are doubles; raw text keeps every digit). */
static cJSON *add_u64(cJSON *parent, const char *key, uint64_t v)
{
    char txt[24];
    snprintf(txt, sizeof txt, "%" PRIu64, v);
    cJSON *item = cJSON_CreateRaw(txt);
    if (!item)
        return NULL;
    if (key)
        cJSON_AddItemToObject(parent, key, item);
    else
        cJSON_AddItemToArray(parent, item);
    return item;
}

/* Validates one tensor and returns its byte size. */
static int tensor_size(const kl_st_wtensor *t, uint64_t *bytes, kl_err *err)
{
    if (!t->name || !t->name[0] || !strcmp(t->name, "__metadata__"))
        return kl_fail(err, KL_E_USAGE, "invalid tensor name '%s'", t->name ? t->name : "");
    unsigned bits = kl_dtype_bits(t->dtype);
    if (!bits)
        return kl_fail(err, KL_E_USAGE, "invalid dtype %d", (int)t->dtype);
    if (t->rank < 0 || t->rank > KL_ST_WRITER_MAX_RANK)
        return kl_fail(err, KL_E_USAGE, "rank %d outside 0..%d", t->rank, KL_ST_WRITER_MAX_RANK);
    uint64_t numel = 1, total_bits;
    for (int d = 0; d < t->rank; d++) {
        if (t->shape[d] > MAX_DIM || kl_mul_u64(numel, t->shape[d], &numel))
            return kl_fail(err, KL_E_USAGE, "shape dimension %d too large", d);
    }
    if (kl_mul_u64(numel, bits, &total_bits) || total_bits % 8)
        return kl_fail(err, KL_E_USAGE, "%" PRIu64 " elements of %u bits are not whole bytes",
                       numel, bits);
    *bytes = total_bits / 8;
    return 0;
}

/* Computes begin offsets and sizes; checks names, uniqueness and element alignment. */
static int layout(const kl_st_wtensor *t, size_t n, uint64_t *begin, uint64_t *n_bytes,
                  kl_err *err)
{
    kl_strmap names;
    if (kl_strmap_init(&names, n))
        return kl_fail(err, KL_E_NOMEM, "out of memory for %zu tensor names", n);
    uint64_t off = 0;
    int rc = 0;
    size_t i;
    for (i = 0; i < n; i++) {
        uint64_t sz = 0;
        rc = tensor_size(&t[i], &sz, err);
        if (rc)
            break;
        int dup = kl_strmap_put(&names, t[i].name, (uint32_t)i, NULL);
        if (dup < 0) {
            rc = kl_fail(err, KL_E_NOMEM, "out of memory for tensor names");
            break;
        }
        if (dup == 1) {
            rc = kl_fail(err, KL_E_USAGE, "tensor listed twice");
            break;
        }
        unsigned elem = kl_dtype_bits(t[i].dtype) / 8;
        if (elem > 1 && off % elem) {
            rc = kl_fail(err, KL_E_USAGE,
                         "tensor would start at data offset %" PRIu64 ", not a multiple of its "
                         "%u-byte element; reorder the tensors (holes are not allowed)", off, elem);
            break;
        }
        begin[i] = off;
        n_bytes[i] = sz;
        if (kl_add_u64(off, sz, &off) || off > MAX_DIM) {
            rc = kl_fail(err, KL_E_USAGE, "shard data larger than 2^48-1 bytes");
            break;
        }
    }
    if (rc && i < n && t[i].name)
        kl_err_context(err, NULL, t[i].name, KL_NO_OFFSET, NULL);
    kl_strmap_free(&names);
    return rc;
}

static cJSON *header_json(const kl_st_wtensor *t, size_t n, const uint64_t *begin,
                          const uint64_t *n_bytes)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    if (!meta || !cJSON_AddStringToObject(meta, "format", "pt"))
        goto fail;
    for (size_t i = 0; i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
        if (!e || !cJSON_AddStringToObject(e, "dtype", kl_dtype_name(t[i].dtype)))
            goto fail;
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        if (!shape)
            goto fail;
        for (int d = 0; d < t[i].rank; d++)
            if (!add_u64(shape, NULL, t[i].shape[d]))
                goto fail;
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        if (!offs || !add_u64(offs, NULL, begin[i]) || !add_u64(offs, NULL, begin[i] + n_bytes[i]))
            goto fail;
    }
    return root;
fail:
    cJSON_Delete(root);
    return NULL;
}

/* ---- public API ---- */

int kl_st_header_build(const kl_st_wtensor *t, size_t n, uint32_t data_align, uint8_t **out,
                       uint64_t *out_len, uint64_t *begin, uint64_t *n_bytes, kl_err *err)
{
    if (data_align == 0)
        data_align = KL_ST_WRITER_ALIGN_DEFAULT;
    if (data_align < 8 || (data_align & (data_align - 1)))
        return kl_fail(err, KL_E_USAGE, "data alignment %u is not a power of two >= 8",
                       data_align);
    uint64_t *b = kl_calloc(n ? n : 1, sizeof *b), *sz = kl_calloc(n ? n : 1, sizeof *sz);
    char *json = NULL;
    cJSON *root = NULL;
    int rc = 0;
    if (!b || !sz) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory for %zu tensors", n);
        goto done;
    }
    rc = layout(t, n, b, sz, err);
    if (rc)
        goto done;
    root = header_json(t, n, b, sz);
    json = root ? cJSON_PrintUnformatted(root) : NULL;
    if (!json) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory building a header of %zu tensors", n);
        goto done;
    }
    size_t jlen = strlen(json);
    uint64_t data_off = kl_round_up_u64(8 + (uint64_t)jlen, data_align);
    uint8_t *buf = kl_malloc((size_t)data_off);
    if (!buf) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory for a %" PRIu64 "-byte header", data_off);
        goto done;
    }
    kl_store_le64(buf, data_off - 8);
    memcpy(buf + 8, json, jlen);
    memset(buf + 8 + jlen, ' ', (size_t)(data_off - 8 - jlen));
    *out = buf;
    *out_len = data_off;
    if (begin)
        memcpy(begin, b, n * sizeof *b);
    if (n_bytes)
        memcpy(n_bytes, sz, n * sizeof *sz);
done:
    if (json)
        cJSON_free(json);
    cJSON_Delete(root);
    kl_free(b);
    kl_free(sz);
    return rc;
}

static void writer_reset(kl_st_writer *w)
{
    if (w->direct && w->dfd >= 0)
        close(w->dfd);
    kl_free(w->path);
    kl_free(w->tmp_path);
    kl_free(w->begin);
    kl_free(w->n_bytes);
    memset(w, 0, sizeof *w);
    w->fd = -1;
    w->dfd = -1;
}

int kl_st_writer_open(kl_st_writer *w, const char *path, const kl_st_wtensor *t, size_t n,
                      const kl_st_writer_opts *opts, kl_err *err)
{
    memset(w, 0, sizeof *w);
    w->fd = -1;
    w->dfd = -1;
    uint32_t align = opts ? opts->data_align : 0;
    int want_direct = opts && opts->direct;
    if (want_direct && align && align < KL_ST_WRITER_DIRECT_ALIGN)
        return kl_fail(err, KL_E_USAGE, "O_DIRECT needs a data alignment of at least %u",
                       KL_ST_WRITER_DIRECT_ALIGN);
    w->early_writeback = opts ? opts->early_writeback : 0;
    size_t plen = strlen(path);
    w->path = kl_strdup(path);
    w->tmp_path = kl_malloc(plen + sizeof ".partial");
    w->begin = kl_calloc(n ? n : 1, sizeof *w->begin);
    w->n_bytes = kl_calloc(n ? n : 1, sizeof *w->n_bytes);
    uint8_t *hdr = NULL;
    int rc = 0;
    if (!w->path || !w->tmp_path || !w->begin || !w->n_bytes) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory opening a shard writer");
        goto fail;
    }
    memcpy(w->tmp_path, path, plen);
    memcpy(w->tmp_path + plen, ".partial", sizeof ".partial");
    w->n_tensors = n;
    rc = kl_st_header_build(t, n, align, &hdr, &w->data_off, w->begin, w->n_bytes, err);
    if (rc)
        goto fail;
    w->header_bytes = w->data_off - 8;
    for (size_t i = 0; i < n; i++)
        w->tensor_bytes += w->n_bytes[i];
    w->file_bytes = w->data_off + w->tensor_bytes;

    /* A stale .partial is ours to replace; never follow a link planted under that name. */
    unlink(w->tmp_path);
    w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        rc = kl_fail_sys(err, KL_E_IO, errno, "cannot create");
        kl_err_context(err, w->tmp_path, NULL, KL_NO_OFFSET, NULL);
        goto fail;
    }
    w->is_open = 1;
    rc = kl_pwrite_all(w->fd, hdr, (size_t)w->data_off, 0, w->tmp_path, err);
    if (rc)
        goto fail;
    if (ftruncate(w->fd, (off_t)w->file_bytes) != 0) {
        rc = kl_fail_sys(err, KL_E_IO, errno, "cannot size the file to %" PRIu64 " bytes",
                         w->file_bytes);
        kl_err_context(err, w->tmp_path, NULL, KL_NO_OFFSET, NULL);
        goto fail;
    }
    if (want_direct) {
        w->dfd = open(w->tmp_path, O_WRONLY | O_DIRECT | O_CLOEXEC);
        w->direct = w->dfd >= 0; /* EINVAL on file systems without O_DIRECT: stay buffered */
    }
    kl_free(hdr);
    return 0;
fail:
    kl_free(hdr);
    kl_st_writer_close(w);
    return rc;
}

uint64_t kl_st_writer_tensor_off(const kl_st_writer *w, size_t i)
{
    return w->data_off + w->begin[i];
}

uint64_t kl_st_writer_tensor_bytes(const kl_st_writer *w, size_t i)
{
    return w->n_bytes[i];
}

/* Writes at absolute file position pos: the aligned part through O_DIRECT when possible. */
static int write_at(kl_st_writer *w, uint64_t pos, const void *buf, size_t n, kl_err *err)
{
    const uint8_t *p = buf;
    if (w->direct && pos % KL_ST_WRITER_DIRECT_ALIGN == 0 &&
        (uintptr_t)p % KL_ST_WRITER_DIRECT_ALIGN == 0) {
        size_t na = n / KL_ST_WRITER_DIRECT_ALIGN * KL_ST_WRITER_DIRECT_ALIGN;
        if (na) {
            int rc = kl_pwrite_all(w->dfd, p, na, pos, w->tmp_path, err);
            if (rc)
                return rc;
            p += na;
            pos += na;
            n -= na;
        }
    }
    if (!n)
        return 0;
    int rc = kl_pwrite_all(w->fd, p, n, pos, w->tmp_path, err);
    if (!rc && w->early_writeback)
        (void)sync_file_range(w->fd, (off_t)pos, (off_t)n, SYNC_FILE_RANGE_WRITE);
    return rc;
}

int kl_st_writer_pwrite(kl_st_writer *w, size_t i, uint64_t off, const void *buf, size_t n,
                        kl_err *err)
{
    if (!w->is_open || i >= w->n_tensors || off > w->n_bytes[i] || n > w->n_bytes[i] - off)
        return kl_fail(err, KL_E_USAGE, "write of %zu bytes at %" PRIu64 " outside tensor %zu",
                       n, off, i);
    return write_at(w, w->data_off + w->begin[i] + off, buf, n, err);
}

int kl_st_writer_pwrite_data(kl_st_writer *w, uint64_t off, const void *buf, size_t n,
                             kl_err *err)
{
    if (!w->is_open || off > w->tensor_bytes || n > w->tensor_bytes - off)
        return kl_fail(err, KL_E_USAGE, "write of %zu bytes at data offset %" PRIu64
                       " past the end of the data (%" PRIu64 " bytes)", n, off, w->tensor_bytes);
    return write_at(w, w->data_off + off, buf, n, err);
}

/* fsync of the directory holding path, so the rename itself is durable. */
static int fsync_parent(const char *path, kl_err *err)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        kl_fail_sys(err, KL_E_IO, e, "cannot sync directory");
        kl_err_context(err, dir, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    close(fd);
    return 0;
}

int kl_st_writer_commit(kl_st_writer *w, kl_err *err)
{
    if (!w->is_open)
        return kl_fail(err, KL_E_USAGE, "commit of a writer that is not open");
    if (fsync(w->fd) != 0) {
        kl_fail_sys(err, KL_E_IO, errno, "fsync failed");
        kl_err_context(err, w->tmp_path, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    if (w->direct) {
        close(w->dfd); /* its writes are in the file: the fsync above covered them */
        w->dfd = -1;
        w->direct = 0;
    }
    int rc = close(w->fd);
    w->fd = -1;
    if (rc != 0) {
        kl_fail_sys(err, KL_E_IO, errno, "close failed");
        kl_err_context(err, w->tmp_path, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    if (rename(w->tmp_path, w->path) != 0) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot rename to %s", w->path);
        kl_err_context(err, w->tmp_path, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    w->committed = 1;
    w->is_open = 0;
    return fsync_parent(w->path, err);
}

void kl_st_writer_close(kl_st_writer *w)
{
    if (w->is_open && !w->committed) {
        if (w->fd >= 0)
            close(w->fd);
        unlink(w->tmp_path);
    }
    writer_reset(w);
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const kl_st_index_entry *)a)->tensor, ((const kl_st_index_entry *)b)->tensor);
}

int kl_st_index_write(const char *dir, const kl_st_index_entry *e, size_t n,
                      uint64_t total_size, kl_err *err)
{
    kl_st_index_entry *sorted = kl_malloc((n ? n : 1) * sizeof *sorted);
    cJSON *root = cJSON_CreateObject();
    char *json = NULL;
    int rc = 0;
    if (!sorted || !root) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory for an index of %zu tensors", n);
        goto done;
    }
    memcpy(sorted, e, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_entry);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(sorted[i - 1].tensor, sorted[i].tensor)) {
            rc = kl_fail(err, KL_E_USAGE, "tensor %s listed twice in the index", sorted[i].tensor);
            goto done;
        }
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
    int ok = meta && map && add_u64(meta, "total_size", total_size);
    for (size_t i = 0; ok && i < n; i++)
        ok = cJSON_AddStringToObject(map, sorted[i].tensor, sorted[i].shard) != NULL;
    json = ok ? cJSON_Print(root) : NULL;
    if (!json) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory serializing the index");
        goto done;
    }
    size_t len = strlen(json);
    json[len] = '\n'; /* replace the NUL: the buffer is written with its length */
    rc = kl_write_file_atomic(dir, INDEX_NAME, json, len + 1, err);
done:
    if (json)
        cJSON_free(json);
    cJSON_Delete(root);
    kl_free(sorted);
    return rc;
}
