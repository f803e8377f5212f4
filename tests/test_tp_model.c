/*
 * tests/test_tp_model.c — a rank's cut model (engine/tp_model.h) piece by piece, against the
 * whole model it was cut from: its config, every matrix's shape and bytes (rows as views of
 * the whole one's, columns as copies holding the same values), the per-head vectors' slices,
 * the vocabulary part of embed and lm_head, expert parallel's owned experts, its sources (what
 * the GPU plan places) and the refusals.  End to end (logits against TP 1, memory against the
 * audit's plan) is tests/test_golden.c and tests/test_memplan_engine.c.
 */
#include "common/mem.h"
#include "engine/backend_tp.h"
#include "engine/tp_model.h"
#include "loader/tp_split.h"
#include "tests/testutil.h"

#include <string.h>

#define MULTI "tests/fixtures/golden/multi"   /* 6 layers: KDA, MLA, dense, shared experts */

/* Column c of row r of w as fp32 (F32 / BF16 payloads). */
static float at(const kl_wmat *w, uint64_t r, uint64_t c)
{
    float row[8192];
    ck_assert_uint_le(w->cols, 8192);
    kl_wmat_row_f32(w, r, row);
    return row[c];
}

/* cut is rank r of tp's cut of whole under split s: its shape and every value where it says. */
static void check_matrix(const kl_wmat *whole, const kl_wmat *cut, kl_tp_split s, unsigned tp,
                         unsigned r, const char *what)
{
    uint64_t start = 0, len = 0;
    if (s.kind == KL_TP_OUT) {
        kl_tp_part(whole->rows, tp, r, &start, &len);
        ck_assert_msg(cut->rows == len && cut->cols == whole->cols, "%s: shape", what);
        for (uint64_t i = 0; i < len; i += len > 3 ? len / 3 : 1)
            ck_assert_msg(at(cut, i, cut->cols - 1) == at(whole, start + i, whole->cols - 1),
                          "%s: row %llu", what, (unsigned long long)i);
    } else if (s.kind == KL_TP_IN) {
        kl_tp_part(whole->cols, tp, r, &start, &len);
        ck_assert_msg(cut->rows == whole->rows && cut->cols == len, "%s: shape", what);
        for (uint64_t i = 0; i < cut->rows; i += cut->rows > 3 ? cut->rows / 3 : 1)
            ck_assert_msg(at(cut, i, 0) == at(whole, i, start) &&
                              at(cut, i, len - 1) == at(whole, i, start + len - 1),
                          "%s: row %llu's columns", what, (unsigned long long)i);
    } else {
        ck_assert_msg(cut->rows == whole->rows && cut->cols == whole->cols &&
                          cut->data == whole->data, "%s: not the whole matrix", what);
    }
}

/* Rank r of tp's cut of m (ep: expert parallel), which must succeed. */
static kl_model *cut_of(const kl_model *m, unsigned tp, unsigned r, int ep)
{
    kl_model *c = NULL;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_model_tp_cut(&c, m, tp, r, ep, &err) == 0, "%s", t_fmt_err(&err));
    return c;
}

START_TEST(every_tensor_is_its_rank_s_part)
{
    const unsigned tp = 2;
    kl_model *m = t_open_model(MULTI, 0);
    for (unsigned r = 0; r < tp; r++) {
        kl_model *c = cut_of(m, tp, r, 0);
        ck_assert_uint_eq(c->cfg.num_attention_heads, m->cfg.num_attention_heads / tp);
        ck_assert_uint_eq(c->cfg.kda_num_heads, m->cfg.kda_num_heads / tp);
        ck_assert_uint_eq(c->cfg.intermediate_size, m->cfg.intermediate_size / tp);
        ck_assert_uint_eq(c->cfg.moe_intermediate_size, m->cfg.moe_intermediate_size / tp);
        ck_assert_uint_eq(c->cfg.vocab_size, m->cfg.vocab_size / tp);
        ck_assert_uint_eq(c->cfg.hidden_size, m->cfg.hidden_size);
        /* the vocabulary part of embed (and lm_head) */
        ck_assert(c->vocab_part && c->vocab0 == (uint64_t)r * m->cfg.vocab_size / tp);
        check_matrix(&m->embed, &c->embed, (kl_tp_split){KL_TP_OUT, 0}, tp, r, "embed");
        uint64_t copied = 0;
        for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++) {
            const kl_layer *W = &m->layers[l], *C = &c->layers[l];
            for (int k = 0; k < KL_ROLE_COUNT; k++) {
                const kl_tp_split s = kl_tp_split_of((kl_role)k, 0);
                if (W->w[k].kind == KL_W_NONE || kl_role_is_expert((kl_role)k))
                    continue;
                if (!W->vec[k]) {
                    check_matrix(&W->w[k], &C->w[k], s, tp, r, kl_role_name((kl_role)k));
                    copied += s.kind == KL_TP_IN ? kl_wmat_bytes(&C->w[k]) : 0;
                    continue;
                }
                /* a vector: its contiguous slice (the first dimension, or A_log's heads) */
                const uint64_t n = W->w[k].rows * W->w[k].cols, nc = C->w[k].rows * C->w[k].cols;
                const uint64_t off = s.kind == KL_TP_WHOLE ? 0 : r * nc;
                ck_assert_msg(nc == (s.kind == KL_TP_WHOLE ? n : n / tp), "%s: %llu values",
                              kl_role_name((kl_role)k), (unsigned long long)nc);
                ck_assert(memcmp(C->vec[k], W->vec[k] + off, nc * sizeof(float)) == 0);
            }
            for (int k = 0; k < 3 && W->moe; k++)
                for (uint32_t e = 0; e < m->cfg.num_experts; e++) {
                    const kl_tp_split s = kl_tp_split_of((kl_role)(KL_ROLE_EXPERT_W1 + k), 0);
                    check_matrix(&W->experts[k][e], &C->experts[k][e], s, tp, r, "expert");
                    copied += s.kind == KL_TP_IN ? kl_wmat_bytes(&C->experts[k][e]) : 0;
                }
        }
        ck_assert_uint_eq(c->cut_copied_bytes, copied);
        /* sources: every matrix in host memory, their bytes the rank's weights */
        uint64_t src_bytes = 0;
        for (size_t i = 0; i < c->n_src; i++) {
            ck_assert(c->src[i].host || c->src[i].role == KL_ROLE_FINAL_NORM);
            src_bytes += c->src[i].bytes;
        }
        ck_assert_uint_eq(src_bytes, c->weight_bytes);
        ck_assert_uint_lt(c->weight_bytes, m->weight_bytes);
        kl_model_tp_free(c);
    }
    kl_model_close(m);
}
END_TEST

/* Expert parallel: rank r holds its owner's experts whole, none of the others; the width of
 * the routed experts stays whole in its config. */
START_TEST(expert_parallel_ranks_hold_their_experts_whole)
{
    const unsigned tp = 2;
    kl_model *m = t_open_model(MULTI, 0);
    for (unsigned r = 0; r < tp; r++) {
        kl_model *c = cut_of(m, tp, r, 1);
        ck_assert_uint_eq(c->cfg.moe_intermediate_size, m->cfg.moe_intermediate_size);
        size_t held = 0;
        for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++)
            for (uint32_t e = 0; m->layers[l].moe && e < m->cfg.num_experts; e++) {
                const int mine = kl_tp_expert_owner(e, m->cfg.num_experts, tp) == r;
                for (int k = 0; k < 3; k++) {
                    const kl_wmat *w = &c->layers[l].experts[k][e];
                    ck_assert(mine ? w->kind != KL_W_NONE && w->data ==
                                         m->layers[l].experts[k][e].data
                                   : w->kind == KL_W_NONE);
                }
                held += (size_t)mine;
            }
        ck_assert_uint_gt(held, 0);
        kl_model_tp_free(c);
    }
    kl_model_close(m);
}
END_TEST

/* TP 1: the model's own weights, nothing copied, the vocabulary whole. */
START_TEST(one_rank_is_the_whole_model)
{
    kl_model *m = t_open_model(MULTI, 0), *c = cut_of(m, 1, 0, 0);
    ck_assert(!c->vocab_part && c->vocab0 == 0 && c->cut_copied_bytes == 0);
    ck_assert(!memcmp(&c->cfg, &m->cfg, sizeof c->cfg));
    ck_assert_ptr_eq(c->embed.data, m->embed.data);
    ck_assert_ptr_eq(c->layers[1].w[KL_ROLE_MLA_O].data, m->layers[1].w[KL_ROLE_MLA_O].data);
    kl_model_tp_free(c);
    kl_model_close(m);
}
END_TEST

/* A size that does not split the model (naming the valid ones), a rank past the size, CPU
 * ranks of a model whose matrices were never read (a GPU rank's cut streams from the files:
 * tests/test_gpu_plan.c). */
START_TEST(refusals)
{
    kl_model *m = t_open_model(MULTI, 0), *v = t_open_model(MULTI, 1), *c = NULL;
    kl_backend *be = NULL;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_model_tp_cut(&c, m, 3, 0, 0, &err), KL_E_USAGE);
    ck_assert_msg(strstr(err.msg, "valid sizes: 1, 2, 4"), "%s", err.msg);
    kl_err_clear(&err);
    ck_assert_int_eq(kl_model_tp_cut(&c, m, 2, 2, 0, &err), KL_E_USAGE);
    ck_assert_ptr_null(c);
    kl_err_clear(&err);
    ck_assert_int_eq(kl_backend_tp_create_on(&be, v, 2, 0, 0, &err), KL_E_USAGE);
    ck_assert_msg(strstr(err.msg, "vectors only"), "%s", err.msg);
    ck_assert_ptr_null(be);
    ck_assert_int_eq(kl_model_tp_cut(&c, v, 2, 1, 0, &err), 0);   /* a GPU rank's: from files */
    ck_assert(!c->matrices_read && c->n_shards == v->n_shards);
    /* nothing copied: MLA's o_proj in layer 1 is its columns of each row in the file */
    ck_assert(c->cut_copied_bytes == 0 && c->n_bufs == 0);
    ck_assert_ptr_null(c->layers[1].w[KL_ROLE_MLA_O].data);
    kl_model_tp_free(c);
    kl_model_tp_free(NULL);
    kl_model_close(v);
    kl_model_close(m);
}
END_TEST

static Suite *tp_model_suite(void)
{
    Suite *s = suite_create("tp_model");
    TCase *tc = tcase_create("cut");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, every_tensor_is_its_rank_s_part);
    tcase_add_test(tc, expert_parallel_ranks_hold_their_experts_whole);
    tcase_add_test(tc, one_rank_is_the_whole_model);
    tcase_add_test(tc, refusals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(tp_model_suite());
}
