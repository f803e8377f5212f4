/*
 * loader/arena.c — the GPU engine's weight arenas laid out from kinds and shapes (arena.h).
 *
 * Sections: shapes; layout; sizes from a schema.
 */
#include "loader/arena.h"

#include "common/mem.h"
#include "loader/tp_split.h"

#include <string.h>

const kl_role kl_plan_fuse_roles[KL_FUSE_GROUPS][KL_FUSE_MAX + 1] = {
    [KL_FUSE_KDA] = {KL_ROLE_KDA_Q, KL_ROLE_KDA_K, KL_ROLE_KDA_V, KL_ROLE_KDA_F_A,
                     KL_ROLE_KDA_G_A, KL_ROLE_KDA_B, KL_ROLE_COUNT},
    [KL_FUSE_MLA] = {KL_ROLE_MLA_Q, KL_ROLE_MLA_KV_A, KL_ROLE_COUNT},
    [KL_FUSE_MOE] = {KL_ROLE_SHARED_GATE, KL_ROLE_SHARED_UP, KL_ROLE_ROUTER, KL_ROLE_COUNT},
    [KL_FUSE_MLP] = {KL_ROLE_MLP_GATE, KL_ROLE_MLP_UP, KL_ROLE_COUNT},
};

/* ------------------------------------------------------------------------------------------ */
/* Shapes                                                                                     */

int kl_wshape_of(const kl_schema_entry *e, kl_dtype dtype, kl_wshape *out)
{
    uint64_t rows = e->rank >= 2 ? e->shape[0] : 1;
    uint64_t cols = rows ? e->numel / rows : 0;
    if (e->part == KL_PART_PACKED)
        *out = (kl_wshape){KL_W_MXFP4, rows, cols * 2};
    else if (e->part == KL_PART_SCALE)
        *out = (kl_wshape){KL_W_MXFP4, rows, cols * 32};
    else if (dtype == KL_DT_BF16)
        *out = (kl_wshape){KL_W_BF16, rows, cols};
    else if (dtype == KL_DT_F32)
        *out = (kl_wshape){KL_W_F32, rows, cols};
    else
        return -1;
    return 0;
}

int kl_role_is_vector(kl_role r)
{
    switch (r) {
    case KL_ROLE_INPUT_NORM: case KL_ROLE_POST_ATTN_NORM: case KL_ROLE_FINAL_NORM:
    case KL_ROLE_KDA_Q_CONV: case KL_ROLE_KDA_K_CONV: case KL_ROLE_KDA_V_CONV:
    case KL_ROLE_KDA_A_LOG: case KL_ROLE_KDA_DT_BIAS: case KL_ROLE_KDA_O_NORM:
    case KL_ROLE_MLA_KV_A_NORM: case KL_ROLE_ROUTER_BIAS:
        return 1;
    default:
        return 0;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Layout                                                                                     */

uint64_t kl_plan_data_bytes(const kl_plan_mat *w)
{
    uint64_t n = (uint64_t)w->rows * w->cols;
    switch (w->kind) {
    case KL_W_F32: return n * 4;
    case KL_W_BF16: return n * 2;
    case KL_W_MXFP4: return n / 2;
    default: return 0;
    }
}

uint64_t kl_plan_scale_bytes(const kl_plan_mat *w)
{
    return w->kind == KL_W_MXFP4 ? (uint64_t)w->rows * (w->cols / 32) : 0;
}

/* Reserves bytes at the next aligned offset of an arena whose end is *top. */
static uint64_t take(uint64_t *top, uint64_t bytes)
{
    uint64_t o = (*top + KL_PLAN_ALIGN - 1) / KL_PLAN_ALIGN * KL_PLAN_ALIGN;
    *top = o + bytes;
    return o;
}

static kl_plan_mat mat_of(const kl_wshape *w)
{
    return (kl_plan_mat){w->kind, (uint32_t)w->rows, (uint32_t)w->cols, 0, 0};
}

/* n matrices one after another in one block (values, then scales): out[i] is member i; the
 * result is all of them as one matrix. */
static kl_plan_mat stack(uint64_t *top, const kl_wshape *const *w, uint32_t n, kl_plan_mat *out)
{
    uint64_t db = 0, sb = 0, rows = 0;
    for (uint32_t i = 0; i < n; i++) {
        out[i] = mat_of(w[i]);
        db += kl_plan_data_bytes(&out[i]);
        sb += kl_plan_scale_bytes(&out[i]);
        rows += out[i].rows;
    }
    uint64_t d = take(top, db), s = sb ? take(top, sb) : 0;
    for (uint32_t i = 0; i < n; i++) {
        out[i].data = d;
        out[i].scale = s;
        d += kl_plan_data_bytes(&out[i]);
        s += kl_plan_scale_bytes(&out[i]);
    }
    kl_plan_mat whole = out[0];
    whole.rows = (uint32_t)rows;
    return whole;
}

/* A fusion group: stacked when every member is present with one kind and width and all but
 * the last have a multiple of 4 rows; else each member on its own. */
static void plan_group(uint64_t *top, const kl_arena_layer_in *in, kl_plan_layer *pl, int grp)
{
    const kl_wshape *w[KL_FUSE_MAX] = {0};
    kl_plan_mat views[KL_FUSE_MAX];
    uint32_t n = 0;
    int same = 1;
    for (const kl_role *r = kl_plan_fuse_roles[grp]; *r != KL_ROLE_COUNT; r++, n++) {
        w[n] = &in->w[*r];
        same &= w[n]->kind != KL_W_NONE && w[n]->kind == w[0]->kind && w[n]->cols == w[0]->cols;
    }
    for (uint32_t i = 0; i + 1 < n; i++)
        same &= w[i]->rows % 4 == 0;
    memset(&pl->fused[grp], 0, sizeof pl->fused[grp]);
    for (uint32_t i = 0; !same && i < n; i++)
        if (w[i]->kind != KL_W_NONE)
            stack(top, &w[i], 1, &pl->w[kl_plan_fuse_roles[grp][i]]);
    if (!same)
        return;
    pl->fused[grp] = stack(top, w, n, views);
    for (uint32_t i = 0; i < n; i++)
        pl->w[kl_plan_fuse_roles[grp][i]] = views[i];
}

/* The fusion group role r belongs to, or -1. */
static int group_of(kl_role r)
{
    for (int grp = 0; grp < KL_FUSE_GROUPS; grp++)
        for (const kl_role *m = kl_plan_fuse_roles[grp]; *m != KL_ROLE_COUNT; m++)
            if (*m == r)
                return grp;
    return -1;
}

/* E experts of one role stacked: values of all, then scales of all. */
static void plan_experts(uint64_t *top, const kl_wshape *ex, uint32_t E, kl_plan_mat *out)
{
    *out = mat_of(ex);
    out->data = take(top, E * kl_plan_data_bytes(out));
    uint64_t sb = kl_plan_scale_bytes(out);
    out->scale = sb ? take(top, E * sb) : 0;
}

void kl_arena_layer(uint64_t *top, const kl_arena_layer_in *in, kl_plan_layer *pl)
{
    memset(pl, 0, sizeof *pl);
    for (int r = 0; r < KL_ROLE_COUNT; r++)
        pl->vec[r] = KL_PLAN_NONE;
    for (int grp = 0; grp < KL_FUSE_GROUPS; grp++)
        plan_group(top, in, pl, grp);
    for (int r = 0; r < KL_ROLE_COUNT; r++) {
        const kl_wshape *w = &in->w[r];
        if (w->kind == KL_W_NONE || group_of((kl_role)r) >= 0)
            continue;
        if (kl_role_is_vector((kl_role)r))
            pl->vec[r] = take(top, w->rows * w->cols * sizeof(float));
        else
            stack(top, &w, 1, &pl->w[r]);
    }
    for (int k = 0; k < 3 && in->n_experts && in->ex[k].kind != KL_W_NONE; k++)
        plan_experts(top, &in->ex[k], in->n_experts, &pl->ex[k]);
    pl->n_experts = in->n_experts;
}

void kl_arena_global(uint64_t *top, const kl_wshape *embed, const kl_wshape *lm_head,
                     uint64_t hidden, kl_plan_mat *embed_out, kl_plan_mat *lm_out,
                     uint64_t *final_norm)
{
    *embed_out = stack(top, &embed, 1, embed_out);
    *lm_out = lm_head ? stack(top, &lm_head, 1, lm_out) : *embed_out;
    *final_norm = take(top, hidden * sizeof(float));
}

/* ------------------------------------------------------------------------------------------ */
/* Sizes from a schema                                                                        */

/* The bytes weight w takes in an arena: fp32 for a vector role, else its stored kind. */
static uint64_t placed_bytes(kl_role r, const kl_wshape *w)
{
    kl_plan_mat m = mat_of(w);
    if (w->kind == KL_W_NONE)
        return 0;
    if (kl_role_is_vector(r))
        return w->rows * w->cols * sizeof(float);
    return kl_plan_data_bytes(&m) + kl_plan_scale_bytes(&m);
}

/* Rank 0's part of weight w of role r under tensor parallelism tp, as engine/tp_model.c cuts
 * a model for its ranks: loader/tp_split.h's cut (the valid sizes divide evenly); a vector cut
 * along its first dimension, or along the rest when it has one row (A_log's heads, dt_bias). */
static kl_wshape cut_shape(kl_role r, kl_wshape w, unsigned tp, int ep)
{
    const kl_tp_split s = kl_tp_split_of(r, ep);
    if (tp <= 1 || w.kind == KL_W_NONE || s.kind == KL_TP_WHOLE || s.kind == KL_TP_OWNER)
        return w;
    if (s.kind == KL_TP_IN || (kl_role_is_vector(r) && w.rows == 1))
        w.cols /= tp;
    else
        w.rows /= tp;
    return w;
}

/* Entry e (stored as dt) into the layout inputs: in[layer], or the global shapes (rank 0's
 * cut at tp; with ep, the routed experts it owns whole, of n_experts). */
static int note_entry(const kl_schema_entry *e, kl_dtype dt, unsigned tp, int ep,
                      uint32_t n_experts, kl_arena_layer_in *in, uint32_t n_layers,
                      kl_wshape *glob, kl_err *err)
{
    kl_wshape w;
    if (kl_wshape_of(e, dt, &w))
        return kl_fail_at(err, KL_E_UNSUPPORTED, "", e->name, KL_NO_OFFSET,
                          "dtype %s is not held by the engines (BF16 or F32)", kl_dtype_name(dt));
    w = cut_shape(e->role, w, tp, ep);
    if (e->layer < 0) {
        glob[e->role] = w;
        return 0;
    }
    if ((uint32_t)e->layer >= n_layers)
        return kl_fail_at(err, KL_E_BUG, "", e->name, KL_NO_OFFSET, "layer past the config's");
    kl_arena_layer_in *li = &in[e->layer];
    if (kl_role_is_expert(e->role)) {
        if (ep && tp > 1 && kl_tp_expert_owner((uint32_t)e->expert, n_experts, tp) != 0)
            return 0;   /* another rank's */
        li->ex[e->role - KL_ROLE_EXPERT_W1] = w;
        li->n_experts = e->expert + 1 > (int32_t)li->n_experts ? (uint32_t)e->expert + 1
                                                                : li->n_experts;
    } else {
        li->w[e->role] = w;
    }
    return 0;
}

/* The matrix and vector bytes of one layer's inputs. */
static void layer_sizes(const kl_arena_layer_in *in, kl_arena_sizes *s)
{
    for (int r = 0; r < KL_ROLE_COUNT; r++) {
        uint64_t b = placed_bytes((kl_role)r, &in->w[r]);
        if (kl_role_is_vector((kl_role)r))
            s->vector_bytes += b;
        else
            s->matrix_bytes += b;
    }
    for (int k = 0; k < 3; k++)
        s->matrix_bytes += in->n_experts * placed_bytes(KL_ROLE_EXPERT_W1 + k, &in->ex[k]);
}

int kl_arena_size_schema(const kl_schema *s, const kl_config *c, const kl_dtype *dtypes,
                         unsigned tp, int ep, kl_arena_sizes *out, kl_err *err)
{
    uint32_t L = c->num_hidden_layers;
    kl_arena_layer_in *in = kl_calloc(L ? L : 1, sizeof *in);
    kl_wshape glob[KL_ROLE_COUNT];
    kl_arena_sizes sz = {0};
    memset(glob, 0, sizeof glob);
    int rc = in ? 0 : kl_fail(err, KL_E_NOMEM, "out of memory");
    for (size_t i = 0; !rc && i < s->n; i++)
        rc = note_entry(&s->entries[i], dtypes ? dtypes[i] : s->entries[i].synth_dtype, tp, ep,
                        c->num_experts, in, L, glob, err);
    for (uint32_t l = 0; !rc && l < L; l++) {
        kl_plan_layer pl;
        uint64_t top = 0;
        kl_arena_layer(&top, &in[l], &pl);
        sz.total_bytes += top;
        layer_sizes(&in[l], &sz);
    }
    if (!rc) {
        kl_plan_mat e, h;
        uint64_t top = 0, fn;
        const int tied = glob[KL_ROLE_LM_HEAD].kind == KL_W_NONE;
        kl_arena_global(&top, &glob[KL_ROLE_EMBED], tied ? NULL : &glob[KL_ROLE_LM_HEAD],
                        c->hidden_size, &e, &h, &fn);
        sz.total_bytes += top;
        sz.matrix_bytes += placed_bytes(KL_ROLE_EMBED, &glob[KL_ROLE_EMBED]) +
                           placed_bytes(KL_ROLE_LM_HEAD, &glob[KL_ROLE_LM_HEAD]);
        sz.vector_bytes += (uint64_t)c->hidden_size * sizeof(float);
        sz.pad_bytes = sz.total_bytes - sz.matrix_bytes - sz.vector_bytes;
        *out = sz;
    }
    kl_free(in);
    return rc;
}
