/*
 * cli/outfile.h — an output file that appears whole or not at all: written to a temporary
 * file next to its final path, flushed and fsync'd, then renamed over the path (and the
 * directory fsync'd).  Any error, or a discard, removes the temporary file, so a full disk or an
 * interrupted run never leaves a file that looks complete; an existing file at the path stays
 * as it was until the rename.
 *
 * kl_outfile_open refuses, before creating anything: a path that exists and is not a regular
 * file (a directory, /dev/full, a FIFO), and a path inside the guard directory (a model's
 * directory: `--logits-out MODEL/config.json`).  "Inside" compares device and inode numbers of
 * the guard with every directory from the path's resolved parent up to /, so symlinks, "..",
 * bind mounts and other spellings of the same directory are caught; a path that is itself a
 * symlink is also checked where it points.
 *
 * Errors: KL_E_USAGE (refused paths), KL_E_IO (with the path as file context), KL_E_NOMEM.
 * Ownership: the struct owns the temporary file and its name until commit or discard.
 */
#ifndef KL_CLI_OUTFILE_H
#define KL_CLI_OUTFILE_H

#include "common/err.h"

#include <stdio.h>

typedef struct kl_outfile {
    const char *path;   /* final path (borrowed) */
    char       *tmp;    /* temporary file beside it (kl_malloc'd), NULL when none */
    FILE       *f;      /* open on tmp */
} kl_outfile;

/* Checks path against guard_dir (may be NULL) and creates the temporary file; *o is zeroed
 * first, so kl_outfile_discard is always safe. */
int  kl_outfile_open(kl_outfile *o, const char *path, const char *guard_dir, kl_err *err);
/* Flushes, fsyncs and closes the temporary file, then renames it to path; on any error the
 * temporary file is removed and path is left as it was. */
int  kl_outfile_commit(kl_outfile *o, kl_err *err);
/* Closes and removes the temporary file if any (idempotent). */
void kl_outfile_discard(kl_outfile *o);

#endif
