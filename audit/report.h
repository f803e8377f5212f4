/*
 * audit/report.h — render an audit report as text for people or JSON for programs.
 * The JSON schema is documented in docs/AUDIT.md.  Both read the same kl_audit_report.
 */
#ifndef KL_AUDIT_REPORT_H
#define KL_AUDIT_REPORT_H

#include "audit/audit.h"

#include <cjson/cJSON.h>
#include <stdio.h>

/* Human-readable report. verbose: also list info findings and every expert region. */
void kl_audit_print_text(const kl_audit_report *r, FILE *out, int verbose);

/* Adds the report's fields to an existing JSON object; 0 or KL_E_NOMEM. */
int kl_audit_to_json(const kl_audit_report *r, cJSON *root);

#endif
