/* cli/outplan.c — the output plan in text and JSON (see outplan.h). */
#include "cli/outplan.h"

#include "common/jsonout.h"

#include <stdio.h>

void kl_cli_plan_print(const kl_out_plan *p)
{
    for (size_t k = 0; k < p->n_shards; k++)
        printf("  %s  %zu tensors  %llu bytes\n", p->shards[k].name, p->shards[k].n_tensors,
               (unsigned long long)p->shards[k].file_bytes);
    printf("plan: %zu shards, %llu bytes (%.2f GB) + about %llu bytes of other files; %llu bytes "
           "to write, %llu free (%.2f GB): %s\n",
           p->n_shards, (unsigned long long)p->shard_bytes, (double)p->shard_bytes / 1e9,
           (unsigned long long)p->other_bytes, (unsigned long long)p->needed_bytes,
           (unsigned long long)p->free_bytes, (double)p->free_bytes / 1e9,
           p->needed_bytes <= p->free_bytes ? "fits" : "does NOT fit");
}

void kl_cli_plan_json(cJSON *j, const kl_out_plan *p)
{
    cJSON_AddBoolToObject(j, "dry_run", 1);
    cJSON *a = cJSON_AddArrayToObject(j, "shards");
    for (size_t k = 0; k < p->n_shards; k++) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "name", p->shards[k].name);
        cJSON_AddNumberToObject(s, "tensors", (double)p->shards[k].n_tensors);
        kl_json_add_u64(s, "tensor_bytes", p->shards[k].tensor_bytes);
        kl_json_add_u64(s, "file_bytes", p->shards[k].file_bytes);
        cJSON_AddItemToArray(a, s);
    }
    kl_json_add_u64(j, "shard_bytes", p->shard_bytes);
    kl_json_add_u64(j, "other_bytes", p->other_bytes);
    kl_json_add_u64(j, "total_bytes", p->total_bytes);
    kl_json_add_u64(j, "needed_bytes", p->needed_bytes);
    kl_json_add_u64(j, "free_bytes", p->free_bytes);
    cJSON_AddBoolToObject(j, "fits", p->needed_bytes <= p->free_bytes);
}
