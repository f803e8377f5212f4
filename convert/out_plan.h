/*
 * convert/out_plan.h — what a writer of a checkpoint (convert, synth) is about to put on disk:
 * every shard's file size, known before anything is written, and the check that it fits.
 *
 * kl_out_plan_build lays every shard of a kl_layout out as convert/st_writer.h will (the same
 * header builder, default data alignment), so a shard's planned file_bytes equal the size of
 * the file written later.  other_bytes estimates the small files: the index (from the tensor
 * and shard names) plus a margin for config and tokenizer; callers add files they copy.
 * kl_out_plan_check_space compares what is still to be written (needed_bytes, which a caller
 * resuming may lower) with the space available to an unprivileged user on dir's file system
 * (statvfs f_bavail * f_frsize) and refuses with both numbers.
 * Ownership: the plan owns its shard array; kl_out_plan_free (safe on a zeroed struct).
 * Errors: KL_E_NOMEM, KL_E_IO (statvfs failed; not enough space: rule OUT-NO-SPACE), errors of
 * kl_st_header_build.
 */
#ifndef KL_CONVERT_OUT_PLAN_H
#define KL_CONVERT_OUT_PLAN_H

#include "common/err.h"
#include "convert/layout.h"
#include "convert/st_writer.h"
#include "loader/schema.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kl_out_shard {
    char     name[64];        /* model-0000K-of-0000N.safetensors */
    size_t   n_tensors;
    uint64_t tensor_bytes;    /* payload */
    uint64_t file_bytes;      /* header + payload: the file's size once written */
} kl_out_shard;

typedef struct kl_out_plan {
    size_t        n_shards;
    kl_out_shard *shards;       /* [n_shards], owned */
    uint64_t      shard_bytes;  /* sum of the shards' file_bytes */
    uint64_t      other_bytes;  /* index, config, tokenizer, copied files (an estimate) */
    uint64_t      total_bytes;  /* shard_bytes + other_bytes */
    uint64_t      needed_bytes; /* still to write; total_bytes unless the caller lowers it */
    uint64_t      free_bytes;   /* set by kl_out_plan_check_space */
} kl_out_plan;

/* The writer's tensor list of shard k: names borrowed from s, dtypes[schema index]. */
void kl_out_plan_wtensors(const kl_schema *s, const kl_layout *l, const kl_dtype *dtypes,
                          size_t k, kl_st_wtensor *wt);

/* Plans every shard of l (dtypes[schema index] as written); zeroes p first. */
int  kl_out_plan_build(kl_out_plan *p, const kl_schema *s, const kl_layout *l,
                       const kl_dtype *dtypes, kl_err *err);

/* Fills p->free_bytes from the file system of dir (or, while dir does not exist yet, of its
 * parent); KL_E_IO "OUT-NO-SPACE" when
 * p->needed_bytes exceed it, naming dir and both numbers. */
int  kl_out_plan_check_space(kl_out_plan *p, const char *dir, kl_err *err);

void kl_out_plan_free(kl_out_plan *p);

#endif
