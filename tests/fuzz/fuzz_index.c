/*
 * tests/fuzz/fuzz_index.c — libFuzzer target for kl_index_parse: the input is the index JSON.
 * On success the entry/shard tables are cross-checked; a violation traps.
 */
#include "common/err.h"
#include "loader/index.h"

#include <stdint.h>
#include <string.h>

#define CHECK(cond)                                                                           \
    do {                                                                                      \
        if (!(cond))                                                                          \
            __builtin_trap();                                                                 \
    } while (0)

static void check_index(const kl_index *idx)
{
    CHECK(idx->n_shards <= idx->n_entries);
    for (size_t i = 0; i < idx->n_entries; i++) {
        const kl_index_entry *e = &idx->entries[i];
        CHECK(e->tensor && e->tensor[0]);
        CHECK(e->shard < idx->n_shards);
        CHECK(kl_index_shard_of(idx, e->tensor) == (int)e->shard);
    }
    for (size_t s = 0; s < idx->n_shards; s++) {
        const char *name = idx->shards[s];
        size_t len = strlen(name);
        CHECK(len > 12 && strcmp(name + len - 12, ".safetensors") == 0);
        CHECK(!strchr(name, '/') && !strstr(name, ".."));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kl_index idx;
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_index_parse(&idx, "fuzz.index.json", (const char *)data, size, &err);
    if (rc == 0) {
        check_index(&idx);
    } else {
        CHECK(rc < 0 && err.code == rc && err.msg[0] && !strchr(err.msg, '\n'));
        CHECK(rc != KL_E_FORMAT || err.rule[0]);
        CHECK(!idx.entries && !idx.strings && idx.n_entries == 0);
    }
    kl_index_free(&idx);
    return 0;
}
