/*
 * audit/expect.h — expected SHA-256 values for shards: a sha256sum file or the blob names of a
 * Hugging Face cache snapshot (see expect.c).  The kl_expect owns its memory.
 *
 * With an explicit source the rules are those of `sha256sum -c --strict`: every line of a sums
 * file must parse, a name listed twice with different hashes is a conflict, and every shard
 * needs exactly one well-formed expected hash.  kl_expect_report turns what breaks these rules
 * into audit findings (rules EXPECT-LINE, EXPECT-CONFLICT, EXPECT-MISSING, EXPECT-EXTRA); see
 * docs/AUDIT.md.  Without a source (automatic snapshot detection) a shard without a blob link is
 * simply unchecked.
 */
#ifndef KL_AUDIT_EXPECT_H
#define KL_AUDIT_EXPECT_H

#include "common/err.h"
#include "common/strmap.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum kl_expect_kind {
    KL_EXPECT_SUMS,            /* sha256sum-format text */
    KL_EXPECT_SNAPSHOT,        /* a snapshot directory given by the user */
    KL_EXPECT_SNAPSHOT_AUTO,   /* no source: use the audited directory's links if any */
} kl_expect_kind;

typedef struct kl_expect_line {
    char    *name;             /* base name of the listed file (owned) */
    char     sha256[65];       /* lower-case hex */
    unsigned line;             /* 1-based line number */
    uint64_t off;              /* byte offset of the line in the file */
    bool     conflict;         /* another line names the same file with another hash */
    size_t   first;            /* conflicting later line: index of the first line; else self */
} kl_expect_line;

typedef struct kl_expect_bad {
    unsigned line;             /* 1-based */
    uint64_t off;              /* byte offset of the line */
    char     why[160];
} kl_expect_bad;

typedef struct kl_expect {
    kl_expect_kind  kind;
    char           *source;    /* sums file or snapshot directory as given (owned) */
    char           *dir;       /* snapshot directory */
    kl_expect_line *lines;     /* KL_EXPECT_SUMS: well-formed lines */
    size_t          n_lines, cap_lines;
    kl_expect_bad  *bad;       /* KL_EXPECT_SUMS: the first KL_EXPECT_MAX_BAD malformed lines */
    size_t          n_bad, cap_bad;
    size_t          n_bad_total;
    kl_strmap       by_name;   /* base name -> index of its first line */
} kl_expect;

#define KL_EXPECT_MAX_BAD 20

/* source NULL = automatic snapshot detection in ckpt_dir.  A sums file is read and parsed
 * here; malformed lines are recorded, not errors.  KL_E_IO/KL_E_FORMAT if the source cannot be
 * read, KL_E_NOMEM. */
int kl_expect_open(kl_expect *e, const char *source, const char *ckpt_dir, kl_err *err);
/* 1 and out (lower-case hex) if exactly one well-formed expected hash is known for shard_name,
 * else 0 (none, or conflicting lines). */
int kl_expect_lookup(const kl_expect *e, const char *shard_name, char out[65]);
void kl_expect_free(kl_expect *e);

struct kl_audit_report;
struct kl_checkpoint;
/* Adds the findings of an explicit source to r: malformed lines (EXPECT-LINE), conflicting
 * lines (EXPECT-CONFLICT), shards without an expected hash (EXPECT-MISSING), and lines naming a
 * file that is not a shard (EXPECT-EXTRA: an error for a .safetensors name, a warning for other
 * files, which hash lists of whole repositories carry).  Nothing for automatic detection.
 * 0 or KL_E_NOMEM. */
int kl_expect_report(const kl_expect *e, struct kl_audit_report *r,
                     const struct kl_checkpoint *ck);

#endif
