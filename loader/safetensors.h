/*
 * loader/safetensors.h — strict safetensors header parser.
 *
 * Reads only the 8-byte length and the JSON header of a shard, never the tensor bytes, and
 * enforces every rule of formats-and-loading.md §1.3 plus those the reference crate misses.
 * Rule ids (kl_err.rule) — each failure names the file, the tensor where one is involved and
 * the byte offset where useful:
 *   ST-HEADER-SMALL    file shorter than 8 bytes
 *   ST-HEADER-LARGE    header length N > 100,000,000
 *   ST-HEADER-LENGTH   8 + N beyond the end of the file
 *   ST-UTF8            header is not valid UTF-8
 *   ST-JSON            header is not a JSON object / has wrong value types
 *   ST-DTYPE           unknown dtype string
 *   ST-SHAPE           shape missing, not an array of non-negative integers <= 2^48-1, rank > 8
 *   ST-OFFSETS         data_offsets missing, not two integers <= 2^48-1, or end < begin
 *   ST-FIELD           unknown field in a tensor entry
 *   ST-METADATA        __metadata__ not an object of string values
 *   ST-NAME            tensor named __metadata__ (object form is the metadata; any other
 *                      form is rejected), or an empty name
 *   ST-DUPLICATE       the same tensor name twice
 *   ST-OVERFLOW        shape product or byte size overflows 64 bits
 *   ST-MISALIGNED      numel * bits not a multiple of 8
 *   ST-SIZE            end - begin != numel * bits / 8
 *   ST-OFFSET-GAP      entries sorted by offset do not start at 0 and follow each other
 *                      (a hole or an overlap)
 *   ST-FILE-LENGTH     8 + N + last end != file length (truncated or trailing bytes)
 * kl_st_open also fails with KL_E_IO (open/stat/read errors, errno kept), FILE-NOT-REGULAR (a
 * directory, FIFO, device...) and FILE-SHORT (the file shrank while being read).
 * Warnings (not errors) are flags in kl_st_file.warnings.
 *
 * Headers in the plain subset writers produce (ASCII names without escapes, integers) are read
 * straight into the tables; anything else goes through the strict JSON reader (common/json.h),
 * so results and messages are the same either way.
 * Ownership: kl_st_file owns all its memory; tensor names and metadata strings are borrowed
 * pointers valid until kl_st_close.  Thread safety: one file per thread, or read-only sharing
 * after open.
 */
#ifndef KL_LOADER_SAFETENSORS_H
#define KL_LOADER_SAFETENSORS_H

#include "common/err.h"
#include "common/strmap.h"
#include "loader/dtype.h"

#include <stddef.h>
#include <stdint.h>

#define KL_ST_MAX_HEADER 100000000ull  /* the reference crate's MAX_HEADER_SIZE */
#define KL_ST_HUB_MAX_HEADER 25000000ull /* huggingface_hub's limit: a warning above it */
#define KL_ST_MAX_DIM 281474976710655ull /* 2^48 - 1: JSON schema bound for shapes/offsets */
#define KL_ST_MAX_RANK 8

enum {
    KL_ST_WARN_LEADING_SPACE = 1u << 0, /* header starts with whitespace (readers < 0.8 fail) */
    KL_ST_WARN_HUB_LIMIT = 1u << 1,     /* header > 25 MB: huggingface_hub refuses it */
    KL_ST_WARN_NO_METADATA = 1u << 2,   /* no __metadata__ (HF writers add {"format":"pt"}) */
};

typedef struct kl_st_tensor {
    const char *name;               /* borrowed, NUL-terminated */
    kl_dtype    dtype;
    int         rank;
    uint64_t    shape[KL_ST_MAX_RANK];
    uint64_t    numel;
    uint64_t    begin, end;         /* data_offsets, relative to the data section */
    uint64_t    file_off;           /* absolute: 8 + header_bytes + begin */
    uint64_t    n_bytes;            /* end - begin */
    uint64_t    name_hash;          /* kl_strmap_hash(name), for lookups in other maps */
} kl_st_tensor;

typedef struct kl_st_meta {
    const char *key, *value;        /* borrowed */
} kl_st_meta;

typedef struct kl_st_file {
    char         *path;             /* owned copy of the path ("" for memory parses) */
    uint64_t      file_bytes;       /* file length */
    uint64_t      header_bytes;     /* N */
    uint64_t      data_off;         /* 8 + N */
    size_t        n_tensors;
    kl_st_tensor *tensors;          /* [n_tensors] sorted by begin offset */
    size_t        n_meta;
    kl_st_meta   *meta;             /* [n_meta] __metadata__ entries, file order */
    int           has_metadata;     /* __metadata__ present */
    unsigned      warnings;         /* KL_ST_WARN_* */
    char         *strings;          /* owned storage behind every borrowed string */
    kl_strmap     by_name;          /* name -> index into tensors */
} kl_st_file;

/* Opens path, reads the 8-byte length and the header bytes only, and validates them against
 * the file's size.  On failure f is left zeroed (kl_st_close is still safe). */
int kl_st_open(kl_st_file *f, const char *path, kl_err *err);

/* Parses a header held in memory: hdr points at the N JSON bytes (not the length prefix),
 * file_bytes is the length of the whole file it came from.  Used by kl_st_open and the fuzzer.
 * path is used for messages and copied (NULL = "").  hdr may be NULL only when n is 0. */
int kl_st_parse(kl_st_file *f, const char *path, const uint8_t *hdr, uint64_t n,
                uint64_t file_bytes, kl_err *err);

void kl_st_close(kl_st_file *f);

/* Tensor by name, NULL if absent. */
const kl_st_tensor *kl_st_find(const kl_st_file *f, const char *name);

/* __metadata__ value by key, NULL if absent. */
const char *kl_st_meta_get(const kl_st_file *f, const char *key);

#endif
