/*
 * convert/st_writer.h — safetensors shard writer and index writer.
 *
 * A shard is described up front as an ordered list of tensors (name, dtype, shape).  Opening
 * the writer lays them out back to back in that order (the format forbids holes between
 * tensors, so no padding is ever inserted between them), writes the complete header and sets
 * the file to its final size with ftruncate; the payload is then filled with pwrite-based calls
 * in any order and from any number of threads, or left as holes (sparse files: headers exact,
 * payload reads as zeros, no disk used).
 *
 * Layout decisions:
 *   - The header JSON is {"__metadata__":{"format":"pt"}, then the tensors in the given order},
 *     compact, integers written exactly (never through doubles), trailing-padded with spaces
 *     (0x20, accepted by every safetensors reader version) so the data section starts at a
 *     multiple of data_align (default 4096: page-aligned, so O_DIRECT readers can read the
 *     payload of a shard from an aligned start; the reference writer only pads to 8).
 *   - Each tensor's begin offset must be a multiple of its element size (bits/8; no demand for
 *     sub-byte dtypes).  As holes are not allowed, an order that breaks this is refused with
 *     KL_E_USAGE naming the tensor; the caller must reorder.
 *   - Names must be non-empty, unique and not "__metadata__"; shapes rank <= 8 with each
 *     dimension <= 2^48-1; numel * bits a multiple of 8.  A writer never produces a file the
 *     strict reader (loader/safetensors.h) rejects.
 *
 * Crash safety: everything is written to PATH.partial; kl_st_writer_commit fsyncs it, renames it
 * to PATH and fsyncs the directory.  kl_st_writer_close without a successful commit unlinks the
 * .partial file, so a failure never leaves a file under the final name.
 *
 * Ownership: the writer copies what it keeps (paths, offsets); tensor names are borrowed only
 * during kl_st_writer_open.  Thread safety: after open, kl_st_writer_tensor_off/_bytes and
 * kl_st_writer_pwrite may be called concurrently; commit/close from one thread after all writes.
 * Errors: KL_E_USAGE (invalid tensor list, write outside a tensor), KL_E_IO (with the path and
 * offset), KL_E_NOMEM.
 *
 * Home: convert/, shared with synth/.  synth/ sits above convert/ (it also uses the shard layout
 * planner and the MXFP4 quantizer from here), so the writer both use stays in convert/; nothing
 * in convert/ includes synth/.
 */
#ifndef KL_CONVERT_ST_WRITER_H
#define KL_CONVERT_ST_WRITER_H

#include "common/err.h"
#include "loader/dtype.h"

#include <stddef.h>
#include <stdint.h>

#define KL_ST_WRITER_ALIGN_DEFAULT 4096u
#define KL_ST_WRITER_MAX_RANK 8

typedef struct kl_st_wtensor {
    const char *name;                      /* borrowed during open */
    kl_dtype    dtype;
    int         rank;                      /* 0..8 (0 = scalar) */
    uint64_t    shape[KL_ST_WRITER_MAX_RANK];
} kl_st_wtensor;

#define KL_ST_WRITER_DIRECT_ALIGN 4096u /* O_DIRECT offset, length and buffer alignment */

typedef struct kl_st_writer_opts {
    uint32_t data_align;      /* data section start alignment, power of two >= 8; 0 = 4096 */
    int      early_writeback; /* start writeback of each buffered pwrite at once
                                 (sync_file_range), so dirty pages stay few and the final
                                 fsync is short */
    int      direct;          /* also open the file with O_DIRECT (needs data_align >= 4096);
                                 writes whose file offset and buffer are 4096-aligned go
                                 through it (their 4096-multiple part; any rest is buffered).
                                 Falls back to buffered writes where the file system refuses
                                 O_DIRECT; kl_st_writer.direct says which. */
} kl_st_writer_opts;

typedef struct kl_st_writer {
    char     *path;           /* owned: final name */
    char     *tmp_path;       /* owned: PATH.partial */
    int       fd;             /* valid while is_open */
    int       dfd;            /* O_DIRECT descriptor of the same file, valid while direct */
    int       direct;         /* O_DIRECT writes in use */
    int       is_open;        /* the .partial file exists and fd is open */
    int       committed;
    int       early_writeback;
    size_t    n_tensors;
    uint64_t *begin;          /* [n_tensors] data_offsets begin, relative to the data section */
    uint64_t *n_bytes;        /* [n_tensors] */
    uint64_t  header_bytes;   /* N (JSON + padding) */
    uint64_t  data_off;       /* 8 + N */
    uint64_t  tensor_bytes;   /* sum of n_bytes */
    uint64_t  file_bytes;     /* data_off + tensor_bytes */
} kl_st_writer;

/* Builds the complete header of a shard: the 8-byte little-endian length followed by the JSON
 * and its padding, *out_len = data section offset (a multiple of data_align).  begin[i] receives
 * each tensor's data_offsets begin, n_bytes[i] its size (arrays of n, may be NULL).  *out is
 * kl_malloc'd (caller kl_free's it).  Validates the list as described above. */
int kl_st_header_build(const kl_st_wtensor *t, size_t n, uint32_t data_align, uint8_t **out,
                       uint64_t *out_len, uint64_t *begin, uint64_t *n_bytes, kl_err *err);

/* Lays out the tensors, creates path.partial (truncating a stale one), writes the header and
 * sizes the file to its final length.  opts may be NULL.  On failure w is left closed (the
 * .partial file removed) and kl_st_writer_close is still safe. */
int kl_st_writer_open(kl_st_writer *w, const char *path, const kl_st_wtensor *t, size_t n,
                      const kl_st_writer_opts *opts, kl_err *err);

/* Absolute file offset and byte size of tensor i (i < n_tensors). */
uint64_t kl_st_writer_tensor_off(const kl_st_writer *w, size_t i);
uint64_t kl_st_writer_tensor_bytes(const kl_st_writer *w, size_t i);

/* Writes n bytes at byte `off` inside tensor i.  KL_E_USAGE if the range leaves the tensor. */
int kl_st_writer_pwrite(kl_st_writer *w, size_t i, uint64_t off, const void *buf, size_t n,
                        kl_err *err);

/* Writes n bytes at byte `off` of the data section (the tensors' bytes back to back, in the
 * order given to open).  KL_E_USAGE if the range passes the end of the data. */
int kl_st_writer_pwrite_data(kl_st_writer *w, uint64_t off, const void *buf, size_t n,
                             kl_err *err);

/* fsync, close, rename PATH.partial -> PATH, fsync the directory. */
int kl_st_writer_commit(kl_st_writer *w, kl_err *err);

/* Releases the writer; closes and unlinks PATH.partial unless committed.  Idempotent and safe
 * on a zeroed struct. */
void kl_st_writer_close(kl_st_writer *w);

/* One weight_map row of model.safetensors.index.json. */
typedef struct kl_st_index_entry {
    const char *tensor;
    const char *shard;        /* file name inside the checkpoint directory */
} kl_st_index_entry;

/* Writes dir/model.safetensors.index.json atomically:
 * {"metadata":{"total_size":TOTAL},"weight_map":{tensor: shard, ...}} with the weight_map
 * sorted by tensor name (as huggingface_hub writes it).  total_size should be the sum of tensor
 * bytes over all shards (not file sizes). */
int kl_st_index_write(const char *dir, const kl_st_index_entry *e, size_t n,
                      uint64_t total_size, kl_err *err);

#endif
