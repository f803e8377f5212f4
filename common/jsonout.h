/*
 * common/jsonout.h — helpers for the JSON that commands print (built with cJSON).
 */
#ifndef KL_COMMON_JSONOUT_H
#define KL_COMMON_JSONOUT_H

#include <cjson/cJSON.h>
#include <stdint.h>

/* Adds an unsigned integer: a number up to 2^53, a decimal string above (cJSON stores
 * doubles, which hold integers exactly only up to 2^53).  Returns the item, NULL on failure. */
cJSON *kl_json_add_u64(cJSON *obj, const char *key, uint64_t v);

#endif
