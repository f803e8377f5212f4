/*
 * convert/converter.h — BF16 Kimi-Linear checkpoint -> MXFP4 routed experts
 * (compressed-tensors "mxfp4-pack-quantized"), streaming and crash-safe.
 *
 * kl_convert audits SRC first (metadata only) and refuses a source with problems; then, for
 * every tensor of the MXFP4 schema in the order of convert/layout.h (each layer's experts one
 * contiguous region of one shard, each expert's six tensors adjacent):
 *   - routed-expert w1/w2/w3: the BF16 source rows are quantized (convert/mxfp4.h) into
 *     NAME.weight_packed (U8 [out, in/2]) and NAME.weight_scale (U8 [out, in/32]);
 *   - every other tensor is copied byte for byte under its official name (the layer-0 dense MLP
 *     may be spelled block_sparse_moe.* in the source);
 * writes the index (total_size = tensor bytes), config.json (the source's keys plus a
 * compressed-tensors quantization_config) and copies every other top-level file (tokenizer,
 * chat template, generation config, code).
 *
 * Safety: SRC is only ever opened read-only; DST must not be SRC or inside it, and must not
 * exist yet.  Everything is built in DST.partial/; each finished shard is fsynced, renamed from
 * NAME.partial and recorded in DST.partial/kl-convert.journal with its size and digest (a
 * SHA-256 tree over 32 MiB leaves, convert/shard_digest.h, computed while the shard is
 * written, so no shard is read back).  A rerun after a crash (kill -9 anywhere) keeps the
 * shards the journal proves complete and redoes the rest; the result is byte-identical to an
 * uninterrupted run.  A shard is proven complete by its journal line: same plan, same size,
 * same digest read back, and made from the same source — the same source files (name, size,
 * mtime, ctime) holding the same bytes (an XXH3-128 tree over the shard's source extents,
 * kl_srcdigest in convert/shard_digest.h: it catches a replaced or edited source, not an
 * attacker; taken while they were read and compared on resume by reading them again).  A
 * shard whose source changed is redone, never reused; a journal of an older format starts the
 * run over.
 * DST.partial is renamed to DST only when everything is on disk.  kl never deletes what it did
 * not create: a DST.partial that is a symbolic link, not a directory, or holds anything but
 * kl convert's own journal and files is refused (KL_E_USAGE, rule CONVERT-PARTIAL).
 * Before anything is written the output is planned (every shard's file size,
 * convert/out_plan.h) and must fit the free space of DST's file system (KL_E_IO, rule
 * OUT-NO-SPACE, with both numbers); dry_run stops there.
 * Test-only: KL_CONVERT_TEST_KILL=N makes the process SIGKILL itself right after the N-th
 * shard of the run is journaled, =mid:N halfway through reading the N-th shard's source (the
 * kill tests stop a run at a known point with it; as KL_CPU_KERNELS, not for users).
 * Pipeline: the reader keeps its ring of source reads in flight; the converting thread copies
 * or quantizes (with the pool, straight into the write-behind queue) each chunk as it arrives,
 * and hashes it in place for the source digest (whole leaves on the pool; no copy); writer
 * lanes hash and pwrite the queued output.  Reading, quantizing and writing overlap, and only
 * the shard's fsync waits at its end.  A resume reads the source of every journaled shard
 * again to check its digest.
 * Memory: bounded by the reader's ring, the write-behind arena and per-thread buffers
 * (≤ max_memory, default 2 GiB, a cap: buffers are no larger than the source and output
 * need), never by the model size.
 */
#ifndef KL_CONVERT_CONVERTER_H
#define KL_CONVERT_CONVERTER_H

#include "common/err.h"
#include "convert/mxfp4.h"
#include "convert/out_plan.h"

#include <stdint.h>

typedef struct kl_convert_result {
    size_t   n_tensors, n_quantized, n_shards, n_shards_resumed;
    uint64_t read_bytes;       /* source bytes read */
    uint64_t written_bytes;    /* output tensor bytes */
    double   elapsed_s;
    /* where the converting thread spent its time (the rest is waiting for source reads) */
    double   quantize_s;       /* quantizer pool runs */
    double   src_hash_s;       /* hashing the source bytes for the journal (kl_srcdigest),
                                * but for the leaves hashed in the quantizer's runs */
    double   write_s;          /* handing output bytes to the write-behind queue */
    double   write_wait_s;     /* of which blocked on a full queue (the disk behind) */
    double   commit_s;         /* per-shard fsync + rename */
} kl_convert_result;

/* Called from the converting thread at most ~10 times a second; return non-zero to cancel. */
typedef int (*kl_convert_progress_fn)(void *ctx, uint64_t done_bytes, uint64_t total_bytes);

typedef struct kl_convert_opts {
    const char            *src, *dst;
    kl_scale_rule          rule;          /* default (0) KL_SCALE_OCP */
    unsigned               threads;       /* quantizer threads; 0 = usable CPUs (kl_cpu_count) */
    uint64_t               max_memory;    /* 0 = 2 GiB */
    uint64_t               shard_bytes;   /* 0 = 5e9 */
    kl_convert_progress_fn progress;
    void                  *progress_ctx;
    int                    dry_run;       /* plan and check only: nothing is written */
    kl_out_plan           *plan;          /* filled on success if non-NULL (free_bytes set;
                                             caller kl_out_plan_free's it) */
    kl_convert_result     *result;        /* filled on success if non-NULL */
} kl_convert_opts;

/* Errors: KL_E_USAGE (paths), KL_E_FORMAT/KL_E_SCHEMA (source refused: the message is the
 * audit's first problem, with its file, tensor and rule), KL_E_UNSUPPORTED (source not a BF16
 * Kimi-Linear checkpoint), KL_E_IO (also OUT-NO-SPACE), KL_E_NOMEM, KL_E_CANCELLED. */
int kl_convert(const kl_convert_opts *o, kl_err *err);

#endif
