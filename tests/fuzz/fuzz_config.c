/*
 * tests/fuzz/fuzz_config.c — libFuzzer target: config.json text -> kl_config -> schema.
 *
 * Properties checked (abort on violation, so the fuzzer reports them):
 *   - a failure fills kl_err with the returned code, a rule id and the config path;
 *   - a parsed config stays within the documented caps (layers, experts);
 *   - for Kimi-Linear families, kl_config_to_json output parses back to the same geometry;
 *   - every schema entry is found by its name and its alias.
 * Size: the library refuses more than KL_SCHEMA_MAX_ENTRIES entries (and 10^9 experts already
 * at parse time); this target builds schemas only up to FUZZ_MAX_ENTRIES so one input stays
 * fast, after checking kl_schema_count, which never allocates.
 */
#include "common/mem.h"
#include "loader/config.h"
#include "loader/schema.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_MAX_ENTRIES 50000

static void require(int cond)
{
    if (!cond)
        abort();
}

static void check_failure(int rc, const kl_err *err)
{
    require(rc < 0 && err->code == rc);
    if (rc != KL_E_NOMEM)
        require(err->rule[0] != '\0' && strcmp(err->file, "fuzz/config.json") == 0);
}

/* to_json -> parse gives back the geometry that decides the schema. */
static void check_round_trip(const kl_config *c)
{
    char *json = NULL;
    kl_err err;
    kl_err_clear(&err);
    if (kl_config_to_json(c, &json, &err))
        return;  /* out of memory only */
    kl_config back;
    kl_err_clear(&err);
    int rc = kl_config_parse(&back, "fuzz/config.json", json, strlen(json), &err);
    kl_free(json);
    require(rc == 0);
    require(back.family == c->family && back.num_hidden_layers == c->num_hidden_layers &&
            back.num_experts == c->num_experts && back.hidden_size == c->hidden_size &&
            back.first_k_dense_replace == c->first_k_dense_replace &&
            memcmp(back.layer_attn, c->layer_attn, sizeof c->layer_attn) == 0);
}

static void check_schema(const kl_config *c)
{
    size_t n = 0;
    kl_err err;
    kl_err_clear(&err);
    if (kl_schema_count(c, &n, &err)) {
        require(err.code != 0 && n == 0);
        return;
    }
    require(n <= KL_SCHEMA_MAX_ENTRIES);
    if (n > FUZZ_MAX_ENTRIES)
        return;
    kl_schema s;
    kl_err_clear(&err);
    if (kl_schema_build(&s, c, &err)) {
        require(err.code != 0 && s.entries == NULL);
        return;
    }
    require(s.n == n);
    for (size_t i = 0; i < s.n; i++) {
        require(kl_schema_find(&s, s.entries[i].name) == &s.entries[i]);
        if (s.entries[i].alias)
            require(kl_schema_find(&s, s.entries[i].alias) == &s.entries[i]);
    }
    kl_schema_free(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kl_config c;
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_config_parse(&c, "fuzz/config.json", (const char *)data, size, &err);
    if (rc) {
        check_failure(rc, &err);
        return 0;
    }
    require(c.num_hidden_layers <= KL_MAX_LAYERS && c.num_experts <= KL_MAX_EXPERTS);
    if (c.family == KL_FAMILY_KIMI_K3)
        return 0;  /* metadata only: no schema, and absent keys do not round-trip */
    check_round_trip(&c);
    check_schema(&c);
    return 0;
}
