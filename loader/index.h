/*
 * loader/index.h — model.safetensors.index.json parser.
 *
 * Shape: {"metadata": {"total_size": INT, ...}, "weight_map": {"tensor": "shard file", ...}}.
 * Parsing checks the file's own structure; consistency with the shards (missing/extra tensors,
 * tensor in the wrong shard, total_size vs bytes) is checked by audit against the headers.
 * Rule ids:
 *   IDX-JSON        not valid JSON / not an object / weight_map missing or not an object
 *   IDX-UTF8        not valid UTF-8
 *   IDX-ENTRY       a weight_map value is not a string, or an empty tensor or file name
 *   IDX-DUPLICATE   the same tensor name twice in weight_map
 *   IDX-SHARD-NAME  a shard name that is absolute, contains "/" or "..", or does not end in
 *                   ".safetensors"
 *   IDX-TOTAL-SIZE  metadata.total_size present but not a non-negative integer as written (once)
 * Also IDX-JSON: "metadata" not an object, "metadata" or "weight_map" twice.  kl_index_open
 * adds KL_E_IO and FILE-NOT-REGULAR / FILE-TOO-LARGE (common/fs.h).
 * A plain index (ASCII names without escapes, integers, root members metadata and weight_map
 * only) is read without a JSON tree; anything else goes through the strict reader, with the
 * same results and messages.
 * Ownership: kl_index owns everything; names are valid until kl_index_free.
 */
#ifndef KL_LOADER_INDEX_H
#define KL_LOADER_INDEX_H

#include "common/err.h"
#include "common/strmap.h"

#include <stddef.h>
#include <stdint.h>

/* kl_index_open refuses larger files (FILE-TOO-LARGE): the 48B index is about 2 MB. */
#define KL_INDEX_MAX_BYTES 100000000u

typedef struct kl_index_entry {
    const char *tensor;             /* borrowed */
    uint32_t    shard;              /* index into kl_index.shards */
} kl_index_entry;

typedef struct kl_index {
    int             has_total_size;
    uint64_t        total_size;
    size_t          n_entries;
    kl_index_entry *entries;        /* [n_entries] in file order */
    size_t          n_shards;
    const char    **shards;         /* [n_shards] distinct file names, first-seen order */
    char           *strings;        /* owned storage */
    kl_strmap       by_tensor;      /* tensor -> entry index */
    kl_strmap       by_shard;       /* shard file -> shard index */
} kl_index;

/* Reads and parses path.  On failure idx is zeroed. */
int kl_index_open(kl_index *idx, const char *path, kl_err *err);
/* Parses JSON text of len bytes (need not be NUL-terminated); path only for messages. */
int kl_index_parse(kl_index *idx, const char *path, const char *json, size_t len, kl_err *err);
void kl_index_free(kl_index *idx);

/* Shard index of a tensor, or -1 if the index does not name it. */
int kl_index_shard_of(const kl_index *idx, const char *tensor);

#endif
