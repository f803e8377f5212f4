/*
 * cli/outplan.h — printing the output plan of `convert --dry-run` and `synth --dry-run`
 * (convert/out_plan.h): one line per shard and the totals on stdout, or JSON fields.
 */
#ifndef KL_CLI_OUTPLAN_H
#define KL_CLI_OUTPLAN_H

#include "convert/out_plan.h"

#include <cJSON.h>

/* Text: the shards, then "total ... needed ... free ... (fits | does NOT fit)". */
void kl_cli_plan_print(const kl_out_plan *p);
/* Adds dry_run, shards [{name, tensors, tensor_bytes, file_bytes}], shard_bytes, other_bytes,
 * total_bytes, needed_bytes, free_bytes and fits to j. */
void kl_cli_plan_json(cJSON *j, const kl_out_plan *p);

#endif
