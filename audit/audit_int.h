/*
 * audit/audit_int.h — the audit's passes, called by audit.c (not for outside audit/).
 * Each adds its findings through report.h; none calls back into audit.c.
 */
#ifndef KL_AUDIT_AUDIT_INT_H
#define KL_AUDIT_AUDIT_INT_H

#include "audit/audit.h"
#include "loader/checkpoint.h"
#include "loader/schema.h"

/* Expert-region layout of every MoE layer (regions.c). */
int kl_audit_regions(kl_audit_report *r, const kl_checkpoint *ck, const kl_schema *s);

/* SHA-256 of every shard, compared with opts->expect (hash.c).  Findings for mismatches and
 * unreadable shards; KL_E_* only when the audit cannot run (e.g. the expect file). */
int kl_audit_hash(kl_audit_report *r, const kl_checkpoint *ck, const kl_audit_opts *o,
                  kl_err *err);

#endif
