/*
 * loader/ckcheck.h — the metadata check of an opened checkpoint: one home for what `kl audit`
 * reports and what the engine and the converter refuse.
 *
 * kl_ckcheck_run walks a kl_checkpoint (config, index and shard headers, never tensor bytes)
 * and reports each problem as a finding through a callback, in this order:
 *   files    config / index / shard parse errors (FILE-*, CFG-*, IDX-*, ST-* rules), a missing
 *            index for several shards (IDX-MISSING), no shard (CK-NO-SHARDS), shards the
 *            index does not name (CK-EXTRA-SHARD, warning), header warnings (ST-LEADING-SPACE,
 *            ST-HUB-LIMIT); a truncated shard says by how many bytes and which shard it is
 *   index    every weight_map entry sits in the shard it names (IDX-WRONG-SHARD, IDX-ABSENT),
 *            every header tensor is listed (IDX-UNLISTED)
 *   dups     a tensor stored in two shards (CK-DUPLICATE)
 *   size     metadata.total_size against the tensor bytes (IDX-TOTAL-SIZE warning; info when
 *            absent; not compared while a shard is unreadable)
 *   schema   the tensor set against the schema of the config: each entry found under its name
 *            or its alias (SCHEMA-ALIAS-TWICE when both), with exactly the schema's shape
 *            (SCHEMA-SHAPE) and an accepted dtype (SCHEMA-DTYPE); SCHEMA-MISSING,
 *            SCHEMA-UNEXPECTED.  A missing tensor that the index places in an unreadable shard
 *            (or, without a usable index, any missing tensor while a shard is unreadable) is
 *            not reported one by one: one CK-NOT-CHECKED warning per shard counts them, so an
 *            interrupted download is one error plus one warning.  Kimi K3 has no schema
 *            (CK-K3-METADATA-ONLY, info); a config the schema refuses is SCHEMA-BUILD.
 * A rule reported per tensor lists its first KL_CKCHECK_LIST_MAX findings, then one finding of
 * the same rule and severity counts the rest, so 600,000 unexpected tensors stay cheap.
 *
 * The result binds each schema entry to its checkpoint tensor (NULL where missing): the
 * engine loads and the converter reads through that table, so nothing is looked up twice.
 *
 * Ownership: kl_ckcheck owns its schema and table; tensors are borrowed from the checkpoint
 * (valid until kl_ckpt_close).  The callback's finding is valid during the call only.
 * Thread safety: none inside; distinct checks on one read-only checkpoint are fine.
 */
#ifndef KL_LOADER_CKCHECK_H
#define KL_LOADER_CKCHECK_H

#include "common/err.h"
#include "loader/checkpoint.h"
#include "loader/schema.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Findings of one rule listed one by one before the rest are counted in one finding. */
#define KL_CKCHECK_LIST_MAX 100

typedef enum kl_severity { KL_SEV_INFO = 0, KL_SEV_WARN = 1, KL_SEV_ERROR = 2 } kl_severity;

/* A problem found in a checkpoint: data, not an error. */
typedef struct kl_finding {
    kl_severity severity;
    char        rule[32];
    char        file[256];
    char        tensor[192];
    uint64_t    offset;       /* KL_NO_OFFSET if none */
    char        message[320];
} kl_finding;

/* Receives each finding: returns 0 to go on, 1 to end the check early (the rest is not
 * looked at), or a negative KL_E_* to fail the check with that code. */
typedef int (*kl_finding_fn)(void *ctx, const kl_finding *f);

typedef struct kl_ckcheck {
    bool                   has_schema;   /* the config has a schema and it was built */
    kl_schema              schema;       /* valid when has_schema */
    const kl_ckpt_tensor **bound;        /* [schema.n] tensor of each entry, NULL if missing */
    size_t                 n_errors, n_warnings, n_infos; /* findings passed to the callback */
    bool                   stopped;      /* the callback ended the check early */
    size_t                 n_bad_shards; /* shards whose header could not be used */
    uint64_t               file_bytes, header_bytes, tensor_bytes; /* over usable shards */
} kl_ckcheck;

/* Checks ck (see above) and fills c, which the caller frees with kl_ckcheck_free (also after
 * an error).  Returns 0 whatever was found; a negative KL_E_* only when the check could not run
 * (out of memory) or the callback returned one. */
int kl_ckcheck_run(kl_ckcheck *c, const kl_checkpoint *ck, kl_finding_fn fn, void *ctx,
                   kl_err *err);

/* The check for a caller that refuses a broken checkpoint (engine, converter): 0 when no
 * error-severity finding, else KL_E_FORMAT with the first one's file, tensor, offset and rule
 * and the message "checkpoint refused: MESSAGE (kl audit DIR lists every problem)".  Stops at
 * that first error, so the cost stays linear whatever follows.  Free c with kl_ckcheck_free. */
int kl_ckcheck_require(kl_ckcheck *c, const kl_checkpoint *ck, kl_err *err);

/* kl_ckpt_open(ck, dir) then kl_ckcheck_require(c, ck), with the schema built from the config
 * while the index and the shard headers are parsed (kl_ckpt_open_with).  Same results and
 * errors as the two calls; on success the caller frees both (kl_ckcheck_free, kl_ckpt_close),
 * on failure both are freed and zeroed here. */
int kl_ckcheck_open_require(kl_ckcheck *c, kl_checkpoint *ck, const char *dir, kl_err *err);

void kl_ckcheck_free(kl_ckcheck *c);

/* The checkpoint tensor bound to the schema entry named name (canonical or alias), NULL when
 * the schema has no such entry or the checkpoint lacks it. */
const kl_ckpt_tensor *kl_ckcheck_tensor(const kl_ckcheck *c, const char *name);

/* Fills every field of f; the message is fmt formatted with ap (cut to fit). */
void kl_finding_vset(kl_finding *f, kl_severity sev, const char *rule, const char *file,
                     const char *tensor, uint64_t offset, const char *fmt, va_list ap)
    KL_PRINTF(7, 0);

/* f as a finding of severity sev made from a parser's error: its rule (default_rule when
 * empty), file (default_file when empty), tensor, offset, and message with the errno text. */
void kl_finding_from_err(kl_finding *f, kl_severity sev, const kl_err *e,
                         const char *default_rule, const char *default_file);

/* "info", "warning", "error". */
const char *kl_severity_name(kl_severity s);

#endif
