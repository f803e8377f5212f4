/*
 * engine/cost.c — memory before loading, memory available, bytes per decoded token (cost.h).
 */
#include "engine/cost.h"

#include "loader/checkpoint.h"
#include "loader/ckcheck.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

int kl_cost_plan_read(const char *dir, kl_cost_plan *p, kl_err *err)
{
    kl_checkpoint ck;
    kl_ckcheck chk;
    /* the engine's own metadata check (kl_model_open): the same refusal, before loading */
    int rc = kl_ckcheck_open_require(&chk, &ck, dir, err);
    if (rc) {
        kl_err_context(err, dir, NULL, KL_NO_OFFSET, NULL);   /* where not already named */
        return rc;
    }
    memset(p, 0, sizeof *p);
    for (size_t i = 0; chk.has_schema && i < chk.schema.n; i++)
        if (chk.bound[i])
            p->weight_bytes += chk.bound[i]->t->n_bytes;
    p->max_position = ck.config.max_position;
    p->vocab_size = ck.config.vocab_size;
    kl_ckcheck_free(&chk);
    kl_ckpt_close(&ck);
    return 0;
}

int kl_cost_mem_available(const char *meminfo_path, uint64_t *bytes, kl_err *err)
{
    const char *path = meminfo_path ? meminfo_path : "/proc/meminfo";
    FILE *f = fopen(path, "r");
    if (!f) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot read the available memory");
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    char line[256];
    unsigned long long kb = 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    fclose(f);
    if (!found || kb > UINT64_MAX / 1024) {
        kl_fail(err, KL_E_FORMAT, "no MemAvailable line in kB");
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
        return KL_E_FORMAT;
    }
    *bytes = (uint64_t)kb * 1024;
    return 0;
}

int kl_cost_check_memory(uint64_t need_bytes, uint64_t avail_bytes, kl_err *err)
{
    if (need_bytes <= avail_bytes)
        return 0;
    return kl_fail(err, KL_E_NOMEM, "the model needs %.3f GB of host memory and %.3f GB are "
                   "available (%" PRIu64 " > %" PRIu64 " bytes, MemAvailable)",
                   (double)need_bytes / 1e9, (double)avail_bytes / 1e9, need_bytes,
                   avail_bytes);
}

static int is_shared_role(int r)
{
    return r == KL_ROLE_SHARED_GATE || r == KL_ROLE_SHARED_UP || r == KL_ROLE_SHARED_DOWN;
}

void kl_cost_token_bytes(const kl_model *m, kl_token_bytes *tb)
{
    const kl_config *c = &m->cfg;
    memset(tb, 0, sizeof *tb);
    for (uint32_t l = 0; l < c->num_hidden_layers; l++) {
        const kl_layer *L = &m->layers[l];
        for (int r = 0; r < KL_ROLE_COUNT; r++)
            *(is_shared_role(r) ? &tb->shared_experts : &tb->non_expert) +=
                (double)kl_wmat_bytes(&L->w[r]);
        if (!L->moe || !c->num_experts)
            continue;
        double all = 0;
        for (int k = 0; k < 3; k++)
            for (uint32_t e = 0; e < c->num_experts; e++)
                all += (double)kl_wmat_bytes(&L->experts[k][e]);
        tb->routed_experts += all / c->num_experts * c->num_experts_per_token;
    }
    tb->non_expert += (double)c->hidden_size * sizeof(float); /* the final norm */
    tb->lm_head = (double)kl_wmat_bytes(&m->lm_head);
    tb->embedding_row = m->embed.rows ? (double)kl_wmat_bytes(&m->embed) / m->embed.rows : 0;
    tb->total = tb->non_expert + tb->shared_experts + tb->routed_experts + tb->lm_head +
                tb->embedding_row;
}
