/*
 * convert/layout.h — where each tensor of a checkpoint goes: file order and shards.
 *
 * One planner for every writer (synth, convert), so both produce the layout the loader wants:
 *   - tensors in schema order, cut greedily into shards of at most shard_bytes of tensor data
 *     (a unit larger than a shard gets a shard of its own);
 *   - except MXFP4 routed-expert tensors (part PACKED or SCALE): all of one layer form one unit,
 *     sorted by name (expert 10 before expert 2; each expert's six tensors adjacent), placed where
 *     the layer's first expert tensor stands in schema order, never split across shards.
 * Offsets are back to back within a shard, as convert/st_writer.h lays tensors out.
 * Shard names: model-0000K-of-0000N.safetensors (at most 99,999 shards).
 * Ownership: the kl_layout owns its arrays; free with kl_layout_free (safe on a zeroed struct).
 */
#ifndef KL_CONVERT_LAYOUT_H
#define KL_CONVERT_LAYOUT_H

#include "common/err.h"
#include "loader/schema.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kl_layout_shard {
    size_t   first, count;   /* range of kl_layout.order */
    uint64_t tensor_bytes;
    char     name[64];       /* model-0000K-of-0000N.safetensors */
} kl_layout_shard;

typedef struct kl_layout {
    size_t           n;
    size_t          *order;  /* [n] schema indices in file order */
    uint64_t        *begin;  /* [n] by file position: data offset within its shard */
    size_t           n_shards;
    kl_layout_shard *shards;
} kl_layout;

/* bytes[i] = payload bytes of schema entry i.  On failure l is zeroed. */
int kl_layout_plan(kl_layout *l, const kl_schema *s, const uint64_t *bytes, uint64_t shard_bytes,
                   kl_err *err);
void kl_layout_free(kl_layout *l);

#endif
