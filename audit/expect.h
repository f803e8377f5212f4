/*
 * audit/expect.h — expected SHA-256 values for shards: a sha256sum file or the blob names of a
 * Hugging Face cache snapshot (see expect.c).  The kl_expect owns its memory.
 */
#ifndef KL_AUDIT_EXPECT_H
#define KL_AUDIT_EXPECT_H

#include "common/err.h"

typedef enum kl_expect_kind {
    KL_EXPECT_SUMS,            /* sha256sum-format text */
    KL_EXPECT_SNAPSHOT,        /* a snapshot directory given by the user */
    KL_EXPECT_SNAPSHOT_AUTO,   /* no source: use the audited directory's links if any */
} kl_expect_kind;

typedef struct kl_expect {
    kl_expect_kind kind;
    char          *sums;       /* KL_EXPECT_SUMS: file text */
    char          *dir;        /* snapshot directory */
} kl_expect;

/* source NULL = automatic snapshot detection in ckpt_dir. */
int kl_expect_open(kl_expect *e, const char *source, const char *ckpt_dir, kl_err *err);
/* 1 and out (lower-case hex) if an expected hash is known for shard_name, else 0. */
int kl_expect_lookup(const kl_expect *e, const char *shard_name, char out[65]);
void kl_expect_free(kl_expect *e);

#endif
