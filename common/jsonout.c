/* common/jsonout.c — JSON output helpers (see jsonout.h). */
#include "common/jsonout.h"

#include <inttypes.h>
#include <stdio.h>

cJSON *kl_json_add_u64(cJSON *obj, const char *key, uint64_t v)
{
    if (v <= (1ull << 53))
        return cJSON_AddNumberToObject(obj, key, (double)v);
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    return cJSON_AddStringToObject(obj, key, buf);
}
