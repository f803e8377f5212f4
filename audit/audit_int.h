/*
 * audit/audit_int.h — helpers shared by the audit's source files (not for outside audit/).
 */
#ifndef KL_AUDIT_AUDIT_INT_H
#define KL_AUDIT_AUDIT_INT_H

#include "audit/audit.h"
#include "loader/checkpoint.h"
#include "loader/schema.h"

/* Appends a finding; 0 or KL_E_NOMEM. */
int kl_audit_add(kl_audit_report *r, kl_severity sev, const char *rule, const char *file,
                 const char *tensor, uint64_t offset, const char *fmt, ...) KL_PRINTF(7, 8);

/* Expert-region layout of every MoE layer (regions.c). */
int kl_audit_regions(kl_audit_report *r, const kl_checkpoint *ck, const kl_schema *s);

/* SHA-256 of every shard, compared with opts->expect (hash.c).  Findings for mismatches and
 * unreadable shards; KL_E_* only when the audit cannot run (e.g. the expect file). */
int kl_audit_hash(kl_audit_report *r, const kl_checkpoint *ck, const kl_audit_opts *o,
                  kl_err *err);

#endif
