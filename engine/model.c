/*
 * engine/model.c — checkpoint binding (see model.h; the weight kernels are in matvec.c).
 *
 * Sections: binding (slot lookup, vector copies); loading through the reader; public API.
 */
#include "engine/model.h"

#include "engine/backend_tp.h"

#include "common/cpu.h"
#include "common/fs.h"
#include "common/mem.h"
#include "loader/arena.h"
#include "loader/checkpoint.h"
#include "loader/ckcheck.h"
#include "loader/reader.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* Binding                                                                                    */

/* The kl_wmat an entry binds to, NULL if its layer/expert is out of range. */
static kl_wmat *slot_for(kl_model *m, const kl_schema_entry *e)
{
    if (e->layer < 0) {
        switch (e->role) {
        case KL_ROLE_EMBED: return &m->embed;
        case KL_ROLE_LM_HEAD: return &m->lm_head;
        default: return NULL;
        }
    }
    if ((uint32_t)e->layer >= m->cfg.num_hidden_layers)
        return NULL;
    kl_layer *L = &m->layers[e->layer];
    if (kl_role_is_expert(e->role)) {
        if (e->expert < 0 || (uint32_t)e->expert >= m->cfg.num_experts)
            return NULL;
        return &L->experts[e->role - KL_ROLE_EXPERT_W1][e->expert];
    }
    return &L->w[e->role];
}

static float *vec_f32(const kl_wmat *w)
{
    uint64_t n = w->rows * w->cols;
    float *v = kl_malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v)
        return NULL;
    /* F32 and BF16 rows are contiguous: one row of n (a KDA conv has 4096 rows of 4 taps) */
    kl_wmat flat = *w;
    if (w->kind == KL_W_F32 || w->kind == KL_W_BF16) {
        flat.rows = n ? 1 : 0;
        flat.cols = n;
    }
    for (uint64_t r = 0; r < flat.rows; r++)
        kl_wmat_row_f32(&flat, r, v + r * flat.cols);
    return v;
}

/* ------------------------------------------------------------------------------------------ */
/* Loading                                                                                    */

typedef struct load_ctx {
    uint8_t **dst;    /* [n_ext] */
    const kl_model_opts *opts;   /* progress callback (may be NULL) */
    uint64_t done, total;        /* payload bytes copied, to copy */
} load_ctx;

static int load_cb(void *ctx, size_t ext_idx, uint64_t ext_off, const uint8_t *data, size_t len)
{
    load_ctx *c = ctx;
    memcpy(c->dst[ext_idx] + ext_off, data, len);
    c->done += len;
    if (c->opts && c->opts->progress)
        c->opts->progress(c->opts->progress_user, c->done, c->total);
    return 0;
}

/* Vectors only (a few MB in a few hundred tensors, the GPU's load): one pread each straight
 * into its buffer.  The staged reader's ring and threads cost more to set up than these
 * reads take, and a page-cache check would mincore every page of every shard. */
static int read_direct(const kl_model *m, const kl_extent *ext, size_t n, load_ctx *lc,
                       kl_err *err)
{
    int *fd = kl_malloc((m->n_shards ? m->n_shards : 1) * sizeof *fd);
    if (!fd)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    for (uint32_t i = 0; i < m->n_shards; i++)
        fd[i] = -1;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const char *path = m->shard_paths[ext[i].file];
        int *f = &fd[ext[i].file];
        if (*f < 0 && (*f = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
            rc = kl_fail_sys(err, KL_E_IO, errno, "cannot open");
            kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
            break;
        }
        rc = kl_pread_all(*f, lc->dst[i], (size_t)ext[i].len, ext[i].off, path, err);
        lc->done += ext[i].len;
        if (!rc && lc->opts && lc->opts->progress)
            lc->opts->progress(lc->opts->progress_user, lc->done, lc->total);
    }
    for (uint32_t i = 0; i < m->n_shards; i++)
        if (fd[i] >= 0)
            close(fd[i]);
    kl_free(fd);
    return rc;
}

/* Fills w from a tensor's metadata and payload for schema entry e. */
static int bind_entry(kl_wmat *w, kl_wmat *final_norm, const kl_schema_entry *e,
                      const kl_st_tensor *t, const void *buf, kl_err *err)
{
    if (e->role == KL_ROLE_FINAL_NORM)
        w = final_norm;
    kl_wshape sh;
    if (kl_wshape_of(e, t->dtype, &sh))
        return kl_fail_at(err, KL_E_UNSUPPORTED, "", e->name, KL_NO_OFFSET,
                          "dtype %s is not supported by the CPU engine (BF16 or F32)",
                          kl_dtype_name(t->dtype));
    w->kind = sh.kind;
    if (e->part == KL_PART_SCALE) {
        w->scale = buf;
        return 0;
    }
    w->rows = sh.rows;
    w->cols = sh.cols;
    if (e->part == KL_PART_PACKED) {
        w->packed = buf;
        return 0;
    }
    w->data = buf;
    return 0;
}

/* Whether load_all reads entry e's bytes into host memory. */
static int wanted(const kl_model_opts *opts, const kl_schema_entry *e)
{
    return !(opts && opts->vectors_only) || kl_role_is_vector(e->role); /* final norm too */
}

/* Records where every tensor's bytes are (m->src, m->shard_paths). */
static int note_sources(kl_model *m, const kl_checkpoint *ck, const kl_ckcheck *chk,
                        kl_err *err)
{
    const kl_schema *s = &chk->schema;
    m->src = kl_calloc(s->n ? s->n : 1, sizeof *m->src);
    m->shard_paths = kl_calloc(ck->n_shards ? ck->n_shards : 1, sizeof *m->shard_paths);
    if (!m->src || !m->shard_paths)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    m->n_shards = (uint32_t)ck->n_shards;
    for (size_t i = 0; i < ck->n_shards; i++)
        if (!(m->shard_paths[i] = kl_strdup(ck->shards[i].path)))
            return kl_fail(err, KL_E_NOMEM, "out of memory");
    m->n_src = s->n;
    for (size_t i = 0; i < s->n; i++) {
        const kl_schema_entry *e = &s->entries[i];
        const kl_ckpt_tensor *ct = chk->bound[i];
        if (!ct)
            return kl_fail_at(err, KL_E_BUG, "", e->name, KL_NO_OFFSET,
                              "checked checkpoint lacks a schema tensor");
        m->src[i] = (kl_model_src){.role = e->role, .part = e->part, .layer = e->layer,
                                   .expert = e->expert, .shard = ct->shard,
                                   .off = ct->t->file_off, .bytes = ct->t->n_bytes};
        m->weight_bytes += ct->t->n_bytes;
    }
    return 0;
}

/* Reads every schema tensor (opts->vectors_only: only the vectors) into its own buffer and
 * binds it; chk bound each entry to its tensor and checked names, shapes and dtypes.  opts may
 * be NULL (no progress). */
static int load_all(kl_model *m, const kl_checkpoint *ck, const kl_ckcheck *chk,
                    const kl_model_opts *opts, kl_err *err)
{
    const kl_schema *s = &chk->schema;
    kl_reader *rd = NULL;
    kl_extent *ext = NULL;
    uint8_t **dst = NULL;
    kl_wmat final_norm = {0};
    size_t n_ext = 0;
    uint64_t read_bytes = 0;
    int rc;

    m->bufs = kl_calloc(s->n ? s->n : 1, sizeof *m->bufs);
    ext = kl_calloc(s->n ? s->n : 1, sizeof *ext);
    dst = kl_calloc(s->n ? s->n : 1, sizeof *dst);
    if (!m->bufs || !ext || !dst) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory binding %zu tensors", s->n);
        goto out;
    }
    m->n_bufs = s->n;
    if ((rc = note_sources(m, ck, chk, err)))
        goto out;
    /* all of it: the staged reader (cached files copied from memory: its page-cache check);
     * vectors only: read_direct */
    int vec_only = opts && opts->vectors_only;
    if (!vec_only && (rc = kl_ckpt_open_reader(ck, NULL, &rd, err)))
        goto out;
    for (size_t i = 0; i < s->n; i++) {
        const kl_schema_entry *e = &s->entries[i];
        kl_model_src *src = &m->src[i];
        if (!wanted(opts, e))
            continue;
        m->bufs[i] = kl_malloc(src->bytes ? (size_t)src->bytes : 1);
        if (!m->bufs[i]) {
            rc = kl_fail(err, KL_E_NOMEM, "out of memory for %" PRIu64 " bytes", src->bytes);
            kl_err_context(err, NULL, e->name, KL_NO_OFFSET, NULL);
            goto out;
        }
        src->host = m->bufs[i];
        dst[n_ext] = m->bufs[i];
        ext[n_ext++] = (kl_extent){src->shard, src->off, src->bytes};
        read_bytes += src->bytes;
    }
    m->matrices_read = !vec_only;
    load_ctx lc = {dst, opts, 0, read_bytes};
    /* in file order, neighbouring tensors in one read (the schema's order jumps around) */
    rc = vec_only ? read_direct(m, ext, n_ext, &lc, err)
                  : kl_reader_run_gathered(rd, ext, n_ext, KL_GATHER_GAP, load_cb, &lc, err);
    if (rc)
        goto out;
    for (size_t i = 0; i < s->n; i++) {
        const kl_schema_entry *e = &s->entries[i];
        kl_wmat *w = e->role == KL_ROLE_FINAL_NORM ? &final_norm : slot_for(m, e);
        if (!w) {
            rc = kl_fail_at(err, KL_E_BUG, "", e->name, KL_NO_OFFSET, "schema entry has no slot");
            goto out;
        }
        if ((rc = bind_entry(w, &final_norm, e, chk->bound[i]->t, m->bufs[i], err)))
            goto out;
    }
    if (m->cfg.tie_word_embeddings)
        m->lm_head = m->embed;
    if (!(m->final_norm = vec_f32(&final_norm))) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory");
        goto out;
    }
    for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++) {
        kl_layer *L = &m->layers[l];
        for (int r = 0; r < KL_ROLE_COUNT; r++) {
            if (!kl_role_is_vector((kl_role)r) || L->w[r].kind == KL_W_NONE)
                continue;
            if (!(L->vec[r] = vec_f32(&L->w[r]))) {
                rc = kl_fail(err, KL_E_NOMEM, "out of memory");
                goto out;
            }
        }
    }
    rc = 0;
out:
    kl_reader_destroy(rd);
    kl_free(ext);
    kl_free(dst);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Public API                                                                                 */

int kl_model_open(kl_model **out, const char *dir, const kl_model_opts *opts, kl_err *err)
{
    kl_checkpoint ck;
    kl_ckcheck chk;
    int rc;
    kl_model *m = kl_calloc(1, sizeof *m);
    if (!m)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    memset(&chk, 0, sizeof chk);
    memset(&ck, 0, sizeof ck);
    /* the metadata check of kl audit: refuse what it refuses, before a byte is read */
    if ((rc = kl_ckcheck_open_require(&chk, &ck, dir, err)))
        goto fail;
    m->cfg = ck.config;
    if (!chk.has_schema) {
        rc = kl_fail(err, KL_E_UNSUPPORTED, "model family %s has no forward pass",
                     kl_family_name(m->cfg.family));
        goto fail;
    }
    m->route_weights = opts ? opts->route_weights : KL_ROUTE_UNBIASED;
    if (opts && opts->tp > 1 &&
        (rc = kl_backend_tp_check(&m->cfg, opts->tp, opts->expert_parallel, err)))
        goto fail;
    m->layers = kl_calloc(m->cfg.num_hidden_layers, sizeof *m->layers);
    if (!m->layers) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory");
        goto fail;
    }
    for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++) {
        kl_layer *L = &m->layers[l];
        L->attn = m->cfg.layer_attn[l];
        L->moe = kl_config_is_moe_layer(&m->cfg, l);
        if (!L->moe)
            continue;
        for (int k = 0; k < 3; k++) {
            if (!(L->experts[k] = kl_calloc(m->cfg.num_experts, sizeof(kl_wmat)))) {
                rc = kl_fail(err, KL_E_NOMEM, "out of memory");
                goto fail;
            }
        }
    }
    if ((rc = load_all(m, &ck, &chk, opts, err)))
        goto fail;
    unsigned threads = opts && opts->threads ? opts->threads : kl_cpu_count(64);
    if ((rc = kl_pool_create(&m->pool, threads, err)) ||
        (m->matrices_read &&
         (rc = kl_backend_cpu_create_tp(&m->be, m, opts ? opts->tp : 1,
                                        opts && opts->expert_parallel, err))))
        goto fail;
    kl_ckcheck_free(&chk);
    kl_ckpt_close(&ck);
    *out = m;
    return 0;
fail:
    kl_err_context(err, dir, NULL, KL_NO_OFFSET, NULL);
    kl_ckcheck_free(&chk);
    kl_ckpt_close(&ck);
    kl_model_close(m);
    return rc;
}

int kl_model_use_backend(kl_model *m, kl_backend *be, kl_err *err)
{
    if (!be || be->m != m)
        return kl_fail(err, KL_E_USAGE, "no backend, or one created for another model");
    if (be == m->be)
        return 0;
    for (uint32_t i = 0; m->be && i < m->be->max_slots; i++)
        if (m->be->slot_used[i])
            return kl_fail(err, KL_E_USAGE, "the %s backend still has a sequence open (slot "
                           "%u): free every state first", m->be->name, i);
    kl_backend_free(m->be);
    m->be = be;
    return 0;
}

void kl_model_close(kl_model *m)
{
    if (!m)
        return;
    kl_backend_free(m->be);
    kl_pool_destroy(m->pool);
    if (m->layers) {
        for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++) {
            for (int r = 0; r < KL_ROLE_COUNT; r++)
                kl_free(m->layers[l].vec[r]);
            for (int k = 0; k < 3; k++)
                kl_free(m->layers[l].experts[k]);
        }
    }
    kl_free(m->layers);
    for (size_t i = 0; i < m->n_bufs; i++)
        kl_free(m->bufs[i]);
    kl_free(m->bufs);
    kl_free(m->src);
    for (uint32_t i = 0; m->shard_paths && i < m->n_shards; i++)
        kl_free(m->shard_paths[i]);
    kl_free(m->shard_paths);
    kl_free(m->final_norm);
    kl_free(m);
}

/* ------------------------------------------------------------------------------------------ */
/* Widths                                                                                     */

static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/* The largest row count of role r over all layers. */
static uint64_t max_rows(const kl_model *m, kl_role r)
{
    uint64_t n = 0;
    for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++)
        n = max_u64(n, m->layers[l].w[r].rows);
    return n;
}

void kl_model_widths_get(const kl_model *m, kl_model_widths *w)
{
    const kl_config *c = &m->cfg;
    static const kl_role wide_roles[] = {KL_ROLE_KDA_Q, KL_ROLE_KDA_K, KL_ROLE_KDA_V,
                                         KL_ROLE_KDA_F_B, KL_ROLE_KDA_G_B, KL_ROLE_MLA_Q};
    uint64_t qk = (uint64_t)c->qk_nope_head_dim + c->qk_rope_head_dim;
    w->wide = max_u64((uint64_t)c->kda_num_heads * c->kda_head_dim,
                      max_u64(c->num_attention_heads * qk,
                              (uint64_t)c->num_attention_heads * c->v_head_dim));
    for (size_t i = 0; i < sizeof wide_roles / sizeof *wide_roles; i++)
        w->wide = max_u64(w->wide, max_rows(m, wide_roles[i]));
    w->low = max_u64((uint64_t)c->kv_lora_rank + c->qk_rope_head_dim,
                     max_u64(max_rows(m, KL_ROLE_KDA_F_A), max_rows(m, KL_ROLE_KDA_G_A)));
    w->mlp = max_rows(m, KL_ROLE_MLP_GATE);
    w->shared = max_rows(m, KL_ROLE_SHARED_GATE);
    w->routed = 0;   /* every expert: a rank of expert parallelism holds only its own */
    for (uint32_t l = 0; l < c->num_hidden_layers; l++)
        for (uint32_t e = 0; m->layers[l].moe && m->layers[l].experts[0] && e < c->num_experts;
             e++)
            w->routed = max_u64(w->routed, m->layers[l].experts[0][e].rows);
}
