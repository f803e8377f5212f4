/*
 * loader/locate.h — where a model argument points: a checkpoint directory, a Hugging Face cache
 * repository folder, or a repository id looked up in the local Hugging Face cache.
 *
 * The Hugging Face cache (huggingface_hub) keeps a repository as
 *   HUB/models--ORG--NAME/refs/main          the commit the "main" branch points to (text)
 *   HUB/models--ORG--NAME/snapshots/<commit>/ the files, as links into ../../blobs/<sha256>
 * where HUB is $HF_HUB_CACHE, else $HF_HOME/hub, else $HOME/.cache/huggingface/hub.
 * Nothing is downloaded; only the local cache is read.
 * Thread safety: reads the environment; no shared state.
 */
#ifndef KL_LOADER_LOCATE_H
#define KL_LOADER_LOCATE_H

#include "common/err.h"

#include <stddef.h>

/* Resolves arg to the directory that holds config.json and the shards, written to out (size n):
 *  - an existing directory is used as it is, unless it is a cache repository folder (it holds
 *    snapshots/ and no config.json): then its snapshots/<commit of refs/main>;
 *  - an existing path that is not a directory is returned unchanged (the caller's open says
 *    what is wrong with it), so an explicit path always wins over a lookup;
 *  - ORG/NAME (one '/', letters, digits, '.', '_', '-'), when no such path exists, is looked up
 *    as HUB/models--ORG--NAME and resolved as a repository folder;
 *  - anything else is returned unchanged.
 * 0, or KL_E_IO with rule "HF-CACHE" and the path in err->file (the repository is not in the
 * cache, has no refs/main, or refs/main names a snapshot that is missing), KL_E_USAGE when the
 * result does not fit in n.  out is written only on success. */
int kl_model_dir_resolve(const char *arg, char *out, size_t n, kl_err *err);

/* The Hugging Face hub cache directory as described above, into out (size n); KL_E_USAGE when
 * no variable gives one (no HOME) or it does not fit. */
int kl_hf_hub_dir(char *out, size_t n, kl_err *err);

#endif
