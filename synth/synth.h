/*
 * synth/synth.h — synthetic Kimi-Linear checkpoints, deterministic from a seed.
 *
 * kl_synth_write builds a config for a preset, takes every tensor from the schema
 * (loader/schema.h: canonical names, shapes, synth dtypes; synth has no name strings of its
 * own) and writes, into out_dir:
 *   model-0000K-of-0000N.safetensors   the shards (convert/st_writer.h: data 4 KiB aligned)
 *   tiktoken.model, tokenizer_config.json
 *   config.json                        kl_config_to_json; family KIMI_LINEAR_MXFP4 with a
 *                                      quantization_config for the mxfp4 format
 *   model.safetensors.index.json       written last: a checkpoint without it is incomplete
 *
 * Presets ("tiny" and "small" have exactly the geometry of ../shared/ref/kimi_ref.py's presets;
 * bos/eos/pad = vocab-256, vocab-254, vocab-1 as kimi_ref sets them):
 *   tiny   vocab 1024, hidden 64, 4 layers (KDA,KDA,KDA,MLA), 8 experts top-2, 256 KiB shards
 *          (so even tiny has several shards: about 0.8 MB in BF16)
 *   small  vocab 4096, hidden 256, 8 layers, real KDA/MLA head geometry, 32 experts top-4,
 *          4 MiB shards
 *   full   kl_config_default_48b (27 layers, 20,493 tensors, 98.2 GB in BF16), 5 GB shards
 * layers != 0 replaces the layer count and keeps the 48B pattern: 1-based full-attention (MLA)
 * layers 4, 8, 12, ... plus the last layer; all others KDA.  Layer 0 stays dense.
 *
 * Shard layout: BF16 — schema order, cut greedily at shard_bytes (a tensor larger than a shard
 * gets one of its own).  MXFP4 — as BF16, except that all routed-expert tensors of one layer
 * (six per expert: w1/w2/w3 x weight_packed/weight_scale) form one region, sorted by name (so
 * expert 10 precedes expert 2 and each expert's six tensors are adjacent), placed where the
 * layer's first expert tensor appears in schema order and never split across shards.
 *
 * Values (dtype from the schema entry; every tensor non-constant):
 *   Linear/conv weights   N(0, 1/sqrt(fan_in)), fan_in = last dimension
 *   embed_tokens          N(0, 1)
 *   norm weights          1 + 0.1 N(0, 1)
 *   A_log                 log U(1, 16)
 *   dt_bias               log(expm1(U(1e-3, 0.1)))   (inverse softplus)
 *   e_score_correction    0.01 N(0, 1)
 *   MXFP4 experts         blocks of 32 N(0, 1/sqrt(in)) values quantized by convert/mxfp4.h
 *                         with the OCP rule (E8M0 scale 127 + floor(log2(block amax)) - 2), so
 *                         the dequantized std is that of the BF16 weights; elements that round
 *                         to zero keep their sign (code 8, -0), as in every version of synth.
 *                         Blocks come from a table of 65,536 quantized Gaussian blocks per
 *                         distinct sigma, picked and sign-flipped at random.
 * Determinism: every tensor is cut into fixed RNG units (64 KiB of output; for MXFP4 4096
 * groups, shared by a weight_packed and its weight_scale); each unit has its own stream keyed by
 * (seed, schema index, unit), so the bytes depend on neither the thread count nor the I/O
 * windows.  The tokenizer depends only on vocab_size.
 *
 * Sparse: headers, index, config and tokenizer are written; tensor payloads are left as holes
 * (file sizes are exact, the payload reads as zeros).
 *
 * I/O: worker threads each fill an aligned 4 MiB window of a shard's data section (the tensors
 * back to back, whatever tensors the window covers) and write it with one pwrite, through
 * O_DIRECT by default (data sections start 4 KiB aligned; the last partial page of a shard is
 * written buffered; file systems without O_DIRECT, such as tmpfs, fall back to buffered
 * writes).  O_DIRECT avoids the page-cache copy and dirty-page throttling, which made buffered
 * writes 4x slower on the development VM.  A shard is fsynced and renamed by the thread that
 * writes its last window, while the others go on with the next shard.  Memory: about 4.3 MiB
 * per thread plus the plan, independent of the checkpoint size.
 *
 * Before writing, the output is planned (convert/out_plan.h: every shard's file size) and
 * must fit the free space of out_dir's file system (KL_E_IO, rule OUT-NO-SPACE); dry_run
 * stops there.
 * The library writes into out_dir (created if missing) and replaces files of the same names;
 * the CLI refuses a non-empty directory.  On failure the shards written by this call are
 * removed and no .partial file is left.
 * Errors: KL_E_USAGE (bad options), KL_E_IO, KL_E_NOMEM, KL_E_CANCELLED (progress callback
 * returned non-zero), errors from kl_schema_build / kl_config_to_json.
 * Thread safety: kl_synth_write may run in several threads on different directories.
 */
#ifndef KL_SYNTH_SYNTH_H
#define KL_SYNTH_SYNTH_H

#include "common/err.h"
#include "convert/out_plan.h"
#include "loader/config.h"

#include <stddef.h>
#include <stdint.h>

typedef enum kl_synth_format { KL_SYNTH_BF16 = 0, KL_SYNTH_MXFP4 = 1 } kl_synth_format;

/* Called from the thread that called kl_synth_write, at most about 10 times a second and once
 * at the end; bytes are tensor payload bytes.  Return non-zero to cancel. */
typedef int (*kl_synth_progress_fn)(void *ctx, uint64_t done_bytes, uint64_t total_bytes);

typedef struct kl_synth_result {
    size_t   n_tensors;
    size_t   n_shards;
    uint64_t tensor_bytes;    /* sum of tensor payload bytes (= index total_size) */
    uint64_t file_bytes;      /* sum of shard file sizes (headers included) */
    double   elapsed_s;
} kl_synth_result;

/* All-zero options are valid: tiny preset, BF16, seed 0, preset shard size, all CPUs. */
typedef struct kl_synth_opts {
    const char          *out_dir;      /* required */
    const char          *preset;       /* "tiny" | "small" | "full"; NULL = "tiny" */
    uint32_t             layers;       /* 0 = the preset's */
    kl_synth_format      format;
    uint64_t             seed;
    uint64_t             shard_bytes;  /* 0 = preset's: 256 KiB tiny, 4 MiB small, 5e9 full */
    int                  sparse;       /* leave tensor payloads as holes */
    int                  buffered;     /* page-cache writes instead of O_DIRECT */
    unsigned             threads;      /* 0 = usable CPUs (at most 64) */
    kl_synth_progress_fn progress;     /* may be NULL */
    void                *progress_ctx;
    int                  dry_run;      /* plan and check free space only; write nothing */
    kl_out_plan         *plan;         /* filled on success if non-NULL (caller
                                          kl_out_plan_free's it) */
    kl_synth_result     *result;       /* filled on success if non-NULL */
} kl_synth_opts;

/* Writes the checkpoint described above. */
int kl_synth_write(const kl_synth_opts *o, kl_err *err);

/* The config kl_synth_write would write for o (preset, layers, format). */
int kl_synth_config(const kl_synth_opts *o, kl_config *c, kl_err *err);

/* Writes dir/tiktoken.model and dir/tokenizer_config.json for a vocabulary of vocab_size ids
 * (vocab_size - 256 regular tokens, then 256 special ids with Kimi's names at Kimi's offsets;
 * see synth/synth_tokenizer.c).  vocab_size must be in 512..2^24. */
int kl_synth_write_tokenizer(const char *dir, uint32_t vocab_size, kl_err *err);

#endif
