/*
 * loader/checkpoint.h — a checkpoint directory opened for metadata: config.json,
 * model.safetensors.index.json and every shard header, joined into one tensor table.
 *
 * Opening never fails on a broken file: each file's parse result is kept (ok flag + kl_err) so
 * audit can report every problem at once.  The full metadata check (index consistency, schema
 * match) is loader/ckcheck.h, which the engine and the converter use to refuse a broken checkpoint;
 * kl_ckpt_require_ok() only turns the first unparsable file into an error.  Only an unreadable
 * directory is an error of kl_ckpt_open itself.  Reads header bytes only, never tensor data, and
 * never opens a file for writing.
 *
 * Shards: those named by the index, in name order, then every other *.safetensors file of the
 * directory in name order (without an index these are the shards; with one, strays).  The
 * index and the directory's shard headers are parsed at once (up to 8 threads, no more than the
 * usable CPUs); a shard the index names but the directory lacks is opened after (its error).
 * Ownership: everything belongs to the kl_checkpoint until kl_ckpt_close.
 */
#ifndef KL_LOADER_CHECKPOINT_H
#define KL_LOADER_CHECKPOINT_H

#include "common/err.h"
#include "common/strmap.h"
#include "loader/config.h"
#include "loader/index.h"
#include "loader/reader.h"
#include "loader/safetensors.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kl_ckpt_shard {
    char       *name;          /* file name inside the directory */
    char       *path;          /* dir/name */
    bool        in_index;      /* named by the index (false: no index, or a stray file) */
    bool        ok;            /* header parsed and valid */
    kl_err      err;           /* why not, when !ok */
    kl_st_file  st;            /* valid when ok */
} kl_ckpt_shard;

typedef struct kl_ckpt_tensor {
    const char         *name;  /* borrowed from the shard header */
    uint32_t            shard; /* index into shards */
    const kl_st_tensor *t;     /* borrowed */
} kl_ckpt_tensor;

typedef struct kl_checkpoint {
    char          *dir;
    char          *config_path, *index_path;
    bool           config_ok;
    kl_err         config_err;
    kl_config      config;
    bool           has_index;  /* the index file exists */
    bool           index_ok;
    kl_err         index_err;
    kl_index       index;
    size_t         n_shards;
    kl_ckpt_shard *shards;     /* name order */
    uint32_t      *index_shard; /* [index.n_shards] index shard number -> shards index */
    size_t         n_tensors;
    kl_ckpt_tensor *tensors;   /* every tensor of every valid shard, shard order then offset */
    kl_strmap      by_name;    /* first occurrence of each name -> tensors index */
    size_t         n_dup_across_shards; /* names found in more than one shard */
} kl_checkpoint;

int  kl_ckpt_open(kl_checkpoint *ck, const char *dir, kl_err *err);

/* A job run while the index and the shard headers are parsed, on one of the threads that parse
 * them: it may read ck->config and config_ok (final by then) and nothing else of ck. */
typedef void (*kl_ckpt_job_fn)(void *ctx, const kl_checkpoint *ck);
/* kl_ckpt_open, running job(ctx, ck) alongside the parsing (job NULL: none).  The job runs at
 * most once and, when this returns, has run or never will (it does not when the open fails
 * before the parsing starts; the job's own context tells). */
int  kl_ckpt_open_with(kl_checkpoint *ck, const char *dir, kl_ckpt_job_fn job, void *job_ctx,
                       kl_err *err);
void kl_ckpt_close(kl_checkpoint *ck);

/* 0 if config, index (when present) and every shard parsed; else the first problem. */
int kl_ckpt_require_ok(const kl_checkpoint *ck, kl_err *err);

const kl_ckpt_tensor *kl_ckpt_find(const kl_checkpoint *ck, const char *name);

/* A staged reader over every shard of ck, added in shard order, so reader file i is shard i
 * (a kl_ckpt_tensor's `shard`).  opts (NULL: defaults) is adjusted by kl_reader_opts_for_files:
 * a checkpoint already in the page cache is copied from memory rather than re-read.  *out is
 * owned by the caller (kl_reader_destroy); NULL on error. */
int kl_ckpt_open_reader(const kl_checkpoint *ck, const kl_reader_opts *opts, kl_reader **out,
                        kl_err *err);

#endif
