/*
 * audit/report.h — build an audit report (collect findings) and render it as text for people
 * or JSON for programs.  The JSON schema is documented in docs/AUDIT.md.  Both renderings read
 * the same kl_audit_report.  The audit's passes (audit.c, hash.c, regions.c) add findings here,
 * so none of them calls back into another.
 */
#ifndef KL_AUDIT_REPORT_H
#define KL_AUDIT_REPORT_H

#include "audit/audit.h"

#include <cjson/cJSON.h>
#include <stdio.h>

/* ---- building ---- */

/* Appends a copy of f and counts it; 0 or KL_E_NOMEM.  Also the kl_finding_fn that collects
 * the loader's check into a report (ctx: the kl_audit_report). */
int kl_audit_collect(void *report, const kl_finding *f);

/* Appends a finding; 0 or KL_E_NOMEM. */
int kl_audit_add(kl_audit_report *r, kl_severity sev, const char *rule, const char *file,
                 const char *tensor, uint64_t offset, const char *fmt, ...) KL_PRINTF(7, 8);

/* Appends a library error as an error finding (kl_finding_from_err); 0 or KL_E_NOMEM. */
int kl_audit_add_err(kl_audit_report *r, const kl_err *e, const char *default_rule,
                     const char *default_file);

/* ---- rendering ---- */

/* Human-readable report. verbose: also list info findings and every expert region. */
void kl_audit_print_text(const kl_audit_report *r, FILE *out, int verbose);

/* Adds the report's fields to an existing JSON object; 0 or KL_E_NOMEM. */
int kl_audit_to_json(const kl_audit_report *r, cJSON *root);

#endif
