/*
 * tests/test_memplan_engine.c — the memory plan of `kl audit --tp N` (audit/memplan.c) against
 * what the engines allocate (issue 12, item 5).
 *
 * CPU engine: on the golden fixtures (ref_tiny, small4, multi), an MXFP4 conversion of
 * ref_tiny and ref_tiny with lm_head stored F32 (the audit plans with the checkpoint's dtypes,
 * not the config's defaults), every valid TP size with and without expert parallel: for
 * EVERY rank of a CPU backend (kl_backend_cpu_rank_bytes: its cut model) its matrices and
 * vectors (stored and fp32) equal the audit's per GPU; its part of a sequence's
 * KDA state and the sequence's MLA cache at 1000 tokens equal the plan's at fp32 (the CPU
 * engine's element; the audit's own line assumes a bf16 cache).
 * GPU engine at TP 1: the audit's GPU arena equals kl_gpu_plan_build's total bytes (the plan
 * engine/backend_gpu.c allocates), on the fixtures and on synthesized small and full-geometry
 * (sparse) checkpoints, BF16 and MXFP4, and splits exactly into matrices + fp32 vectors +
 * alignment; the plan from the config alone agrees where the checkpoint holds synth's dtypes.
 * GPU ranks at TP > 1: every rank's cut model (engine/tp_model.h) is planned the arena the
 * audit reports per rank, at every valid size up to 8 (fixtures and small synthesized ones).
 */
#include "audit/audit.h"
#include "common/mem.h"
#include "convert/converter.h"
#include "convert/st_writer.h"
#include "loader/checkpoint.h"
#include "engine/backend.h"
#include "engine/gpu_plan.h"
#include "engine/model.h"
#include "engine/tp_model.h"
#include "loader/tp_split.h"
#include "synth/synth.h"
#include "tests/testutil.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define CONTEXT 1000 /* tokens of the slot compared: not a power of two (caches double) */

enum { N_FIXTURES = 5, N_SYNTH = 4 };
enum { F32_HEAD = 4 }; /* g_fixture[F32_HEAD]: ref_tiny with lm_head in F32, not synth's dtype */
static char g_tmp[512], g_mxfp4[600], g_f32[600], g_synth[N_SYNTH][600];
static const char *g_fixture[N_FIXTURES] = {"tests/fixtures/ref_tiny",
                                            "tests/fixtures/golden/small4",
                                            "tests/fixtures/golden/multi", g_mxfp4, g_f32};

/* The tensors of one-shard checkpoint ck as the writer takes them, name (widened to F32)
 * first, the others in file order (their offsets stay multiples of their element sizes);
 * the index entries in ie and the new data bytes in *total. */
static size_t widened_order(const kl_checkpoint *ck, const char *name, kl_st_wtensor *wt,
                            const kl_ckpt_tensor **from, kl_st_index_entry *ie, uint64_t *total)
{
    size_t n = 1;
    *total = 0;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const kl_ckpt_tensor *t = &ck->tensors[i];
        const int wide = strcmp(t->name, name) == 0;
        const size_t k = wide ? 0 : n++;
        wt[k] = (kl_st_wtensor){.name = t->name, .dtype = wide ? KL_DT_F32 : t->t->dtype,
                                .rank = t->t->rank};
        memcpy(wt[k].shape, t->t->shape, sizeof wt[k].shape);
        from[k] = t;
        ie[i] = (kl_st_index_entry){t->name, ck->shards[0].name};
        *total += wide ? t->t->numel * 4 : t->t->n_bytes;
    }
    ck_assert_msg(wt[0].name && wt[0].dtype == KL_DT_F32, "%s: no BF16 %s", ck->dir, name);
    return n;
}

/* src (one shard) into dst with its BF16 lm_head.weight stored as F32 (the same values): a
 * checkpoint whose dtypes are not the ones synth writes. */
static void write_f32_lm_head(const char *src, const char *dst)
{
    kl_checkpoint ck;
    kl_err err;
    kl_err_clear(&err);
    ck_assert(kl_ckpt_open(&ck, src, &err) == 0 && ck.n_shards == 1);
    size_t len, n = ck.n_tensors;
    uint8_t *file = (uint8_t *)t_slurp(ck.shards[0].path, &len);
    kl_st_wtensor *wt = kl_calloc(n, sizeof *wt);
    const kl_ckpt_tensor **from = kl_calloc(n, sizeof *from);
    kl_st_index_entry *ie = kl_calloc(n, sizeof *ie);
    uint64_t total;
    ck_assert(widened_order(&ck, "lm_head.weight", wt, from, ie, &total) == n);
    char path[1200];
    ck_assert(mkdir(dst, 0755) == 0);
    snprintf(path, sizeof path, "%s/%s", dst, ck.shards[0].name);
    kl_st_writer w;
    ck_assert_msg(kl_st_writer_open(&w, path, wt, n, NULL, &err) == 0, "%s", t_fmt_err(&err));
    for (size_t i = 0; i < n; i++) {
        const kl_st_tensor *t = from[i]->t;
        uint32_t *wide = i ? NULL : kl_malloc(t->numel * 4);
        for (uint64_t j = 0; wide && j < t->numel; j++) /* bf16 -> f32: the high half */
            wide[j] = (uint32_t)(file[t->file_off + 2 * j] | file[t->file_off + 2 * j + 1] << 8)
                      << 16;
        ck_assert(kl_st_writer_pwrite(&w, i, 0, wide ? (void *)wide : file + t->file_off,
                                      wide ? t->numel * 4 : t->n_bytes, &err) == 0);
        kl_free(wide);
    }
    ck_assert(kl_st_writer_commit(&w, &err) == 0);
    kl_st_writer_close(&w);
    ck_assert(kl_st_index_write(dst, ie, n, total, &err) == 0);
    char *cfg = t_slurp(ck.config_path, &len);
    snprintf(path, sizeof path, "%s/config.json", dst);
    t_write(path, cfg, len);
    free(cfg);
    free(file);
    kl_free(wt);
    kl_free(from);
    kl_free(ie);
    kl_ckpt_close(&ck);
}

static void setup(void)
{
    static const struct { const char *name, *preset; kl_synth_format fmt; int sparse; } s[] = {
        {"small-bf16", "small", KL_SYNTH_BF16, 0},
        {"small-mxfp4", "small", KL_SYNTH_MXFP4, 0},
        {"full-mxfp4", "full", KL_SYNTH_MXFP4, 1},
        {"full-bf16", "full", KL_SYNTH_BF16, 1},
    };
    kl_err err;
    kl_err_clear(&err);
    t_mkdtemp(g_tmp, sizeof g_tmp);
    snprintf(g_mxfp4, sizeof g_mxfp4, "%s/tiny-mxfp4", g_tmp);
    kl_convert_opts co = {.src = "tests/fixtures/ref_tiny", .dst = g_mxfp4, .threads = 2};
    ck_assert_msg(kl_convert(&co, &err) == 0, "kl_convert: %s", t_fmt_err(&err));
    snprintf(g_f32, sizeof g_f32, "%s/tiny-f32-head", g_tmp);
    write_f32_lm_head("tests/fixtures/ref_tiny", g_f32);
    for (int i = 0; i < N_SYNTH; i++) {
        snprintf(g_synth[i], sizeof g_synth[i], "%s/%s", g_tmp, s[i].name);
        kl_synth_opts o = {.out_dir = g_synth[i], .preset = s[i].preset, .format = s[i].fmt,
                           .seed = 5, .sparse = s[i].sparse, .buffered = 1, .threads = 2};
        ck_assert_msg(kl_synth_write(&o, &err) == 0, "synth %s: %s", s[i].name,
                      t_fmt_err(&err));
    }
}

static void teardown(void)
{
    if (g_tmp[0])
        t_rmrf(g_tmp);
}

/* The audit's memory plan of dir (its checkpoint's dtypes) at tp, ep. */
static kl_memplan audit_plan(const char *dir, unsigned tp, int ep)
{
    kl_err err;
    kl_err_clear(&err);
    kl_audit_report r;
    kl_audit_opts o = {.tp = tp, .expert_parallel = ep, .context = CONTEXT};
    ck_assert_msg(kl_audit_run(&r, dir, &o, &err) == 0, "audit %s tp %u: %s", dir, tp,
                  t_fmt_err(&err));
    ck_assert_msg(r.has_memplan, "%s tp %u: no memory plan", dir, tp);
    kl_memplan m = r.memplan;
    kl_audit_report_free(&r);
    return m;
}

/* The plan from the config alone with the CPU engine's fp32 cache and state. */
static kl_memplan cpu_elem_plan(const kl_config *c, unsigned tp, int ep)
{
    kl_err err;
    kl_err_clear(&err);
    kl_memplan m;
    kl_memplan_opts o = {.tp = tp, .expert_parallel = ep, .context = CONTEXT,
                         .cache_elem_bytes = 4, .state_elem_bytes = 4};
    ck_assert_msg(kl_memplan_compute(&m, c, &o, &err) == 0, "plan: %s", t_fmt_err(&err));
    return m;
}

/* ---- CPU engine: every rank ------------------------------------------------------------ */

#define EQ(what, plan, got)                                                                    \
    ck_assert_msg((plan) == (got), "%s tp %u%s rank %u: %s planned %llu, the engine %llu", dir, \
                  tp, ep ? " (ep)" : "", r, what, (unsigned long long)(plan),                 \
                  (unsigned long long)(got))

/* Every rank of a CPU backend of m at tp, ep against the plans. */
static void check_ranks(kl_model *m, const char *dir, unsigned tp, int ep)
{
    kl_err err;
    kl_err_clear(&err);
    kl_backend *be = NULL;
    ck_assert_msg(kl_backend_cpu_create_tp(&be, m, tp, ep, &err) == 0, "%s", t_fmt_err(&err));
    uint32_t slot;
    ck_assert_int_eq(be->ops->slot_open(be, &slot, &err), 0);
    ck_assert_int_eq(be->ops->slot_fill(be, slot, CONTEXT, &err), 0);
    const kl_memplan plan = audit_plan(dir, tp, ep), state = cpu_elem_plan(&m->cfg, tp, ep);
    for (unsigned r = 0; r < tp; r++) {
        kl_cpu_rank_bytes rb;
        ck_assert_int_eq(kl_backend_cpu_rank_bytes(be, r, slot, &rb, &err), 0);
        EQ("matrices", plan.matrix_bytes, rb.matrix_total);
        EQ("vectors", plan.vector_bytes, rb.vector_bytes);
        EQ("fp32 vectors", plan.vector_f32_bytes, rb.vector_f32_bytes);
        EQ("KDA state", state.kda_state_bytes, rb.kda_state_bytes);
        EQ("MLA cache", state.mla_cache_bytes, rb.mla_cache_bytes);
        ck_assert_uint_ge(rb.mla_cache_cap_bytes, rb.mla_cache_bytes);
        ck_assert_msg(tp == 1 ? rb.copied_bytes == 0 : rb.copied_bytes > 0,
                      "%s tp %u rank %u: %llu bytes of IN cuts copied", dir, tp, r,
                      (unsigned long long)rb.copied_bytes);
        if (tp == 1)
            EQ("weights", plan.weights_bytes, rb.matrix_total + rb.vector_bytes);
    }
    ck_assert_int_eq(kl_backend_cpu_rank_bytes(be, tp, slot, NULL, &err), KL_E_USAGE);
    be->ops->slot_close(be, slot);
    ck_assert_int_eq(kl_backend_cpu_rank_bytes(be, 0, slot, NULL, &err), KL_E_USAGE);
    kl_backend_free(be);
}

START_TEST(every_cpu_rank_holds_the_planned_bytes)
{
    const char *dir = g_fixture[_i];
    kl_model *m = t_open_model(dir, 0);
    const kl_memplan one = audit_plan(dir, 1, 0);
    ck_assert_uint_eq(one.matrix_bytes + one.vector_bytes, one.weights_bytes);
    size_t checked = 0;
    for (int ep = 0; ep < 2; ep++) {
        unsigned sizes[64];
        size_t n = kl_tp_sizes(&m->cfg, ep, sizes, 64);
        for (size_t k = 0; k < n && sizes[k] <= 8; k++, checked++)
            check_ranks(m, dir, sizes[k], ep);
    }
    ck_assert_msg(checked > 2, "%s: only %zu TP sizes", dir, checked);
    kl_model_close(m);
}
END_TEST

/* The plan can fail: a rank of another TP size holds other bytes. */
START_TEST(a_rank_of_another_tp_size_differs)
{
    const char *dir = g_fixture[0];
    kl_model *m = t_open_model(dir, 0);
    kl_err err;
    kl_err_clear(&err);
    kl_backend *be = NULL;
    ck_assert_int_eq(kl_backend_cpu_create_tp(&be, m, 2, 0, &err), 0);
    kl_cpu_rank_bytes rb;
    ck_assert_int_eq(kl_backend_cpu_rank_bytes(be, 1, UINT32_MAX, &rb, &err), 0);
    ck_assert_uint_ne(audit_plan(dir, 4, 0).matrix_bytes, rb.matrix_total);
    ck_assert_uint_ne(audit_plan(dir, 1, 0).matrix_bytes, rb.matrix_total);
    ck_assert_uint_eq(audit_plan(dir, 2, 0).matrix_bytes, rb.matrix_total);
    ck_assert_uint_eq(rb.kda_state_bytes + rb.mla_cache_bytes, 0); /* no slot */
    kl_backend_free(be);
    kl_model_close(m);
}
END_TEST

/* ---- GPU engine at TP 1 ---------------------------------------------------------------- */

static const char *gpu_dir(int i)
{
    return i < N_FIXTURES ? g_fixture[i] : g_synth[i - N_FIXTURES];
}

START_TEST(gpu_arena_of_the_audit_is_the_gpu_plans)
{
    const char *dir = gpu_dir(_i);
    kl_model *m = t_open_model(dir, 1);
    kl_err err;
    kl_err_clear(&err);
    kl_gpu_plan p;
    ck_assert_msg(kl_gpu_plan_build(&p, m, &err) == 0, "%s: %s", dir, t_fmt_err(&err));
    const kl_memplan a = audit_plan(dir, 1, 0), c = cpu_elem_plan(&m->cfg, 1, 0);
    ck_assert_msg(a.has_gpu_arena && a.gpu_arena_bytes == p.total_bytes,
                  "%s: the audit's GPU arena %llu, the GPU plan's %llu", dir,
                  (unsigned long long)a.gpu_arena_bytes, (unsigned long long)p.total_bytes);
    ck_assert_uint_eq(a.gpu_arena_bytes,
                      a.matrix_bytes + a.vector_f32_bytes + a.gpu_arena_pad_bytes);
    ck_assert_uint_lt(a.gpu_arena_pad_bytes, (uint64_t)KL_PLAN_ALIGN * 64 * p.n_arenas);
    if (_i != F32_HEAD) /* synth's dtypes: the config alone says as much */
        ck_assert_uint_eq(c.gpu_arena_bytes, a.gpu_arena_bytes);
    else /* lm_head in F32: the checkpoint's dtypes count, twice its BF16 bytes */
        ck_assert_uint_eq(a.matrix_bytes - c.matrix_bytes,
                          (uint64_t)m->cfg.vocab_size * m->cfg.hidden_size * 2);
    kl_gpu_plan_free(&p);
    kl_model_close(m);
}
END_TEST

/* ---- GPU ranks at TP > 1 ---------------------------------------------------------------- */

/* Every rank's cut model (engine/tp_model.h) gets, from the GPU plan, the arena the audit
 * reports per rank, at every valid TP size up to 8, routed experts cut by width and with
 * expert parallel (each rank's experts one run of ids, placed from the first it holds) (the
 * fixtures and the small synthesized checkpoints: a cut needs the matrices in memory, which
 * the full geometry's would not fit). */
START_TEST(gpu_arena_of_every_rank_is_its_cut_models_plan)
{
    const char *dir = gpu_dir(_i);
    kl_model *m = t_open_model(dir, 0);
    kl_err err;
    kl_err_clear(&err);
    size_t checked = 0, n0 = 0;
    for (int ep = 0; ep < 2; ep++) {
        unsigned sizes[64];
        const size_t n = kl_tp_sizes(&m->cfg, ep, sizes, 64);
        n0 = ep ? n0 : n;
        for (size_t k = 1; k < n && sizes[k] <= 8; k++) {
            const unsigned tp = sizes[k];
            const kl_memplan a = audit_plan(dir, tp, ep);
            ck_assert_msg(a.has_gpu_arena, "%s tp %u ep %d: no GPU arena", dir, tp, ep);
            ck_assert_uint_eq(a.gpu_arena_bytes,   /* the same cut as the per-GPU figures */
                              a.matrix_bytes + a.vector_f32_bytes + a.gpu_arena_pad_bytes);
            for (unsigned r = 0; r < tp; r++, checked++) {
                kl_model *cut = NULL;
                kl_gpu_plan p;
                ck_assert_msg(kl_model_tp_cut(&cut, m, tp, r, ep, &err) == 0, "%s",
                              t_fmt_err(&err));
                ck_assert_msg(kl_gpu_plan_build(&p, cut, &err) == 0, "%s", t_fmt_err(&err));
                ck_assert_msg(a.gpu_arena_bytes == p.total_bytes, "%s tp %u ep %d rank %u: the "
                              "audit's GPU arena %llu, the rank's plan %llu", dir, tp, ep, r,
                              (unsigned long long)a.gpu_arena_bytes,
                              (unsigned long long)p.total_bytes);
                for (uint32_t l = 0; ep && l < cut->cfg.num_hidden_layers; l++)
                    if (p.layer[l].n_experts)
                        ck_assert_uint_eq(p.layer[l].expert0, r * p.layer[l].n_experts);
                kl_gpu_plan_free(&p);
                kl_model_tp_free(cut);
            }
        }
    }
    /* only the MXFP4 tiny has no size but 1 (its experts are one 32-value block wide) */
    ck_assert_msg(checked >= 2 || (n0 == 1 && dir == g_mxfp4), "%s: %zu ranks checked", dir,
                  checked);
    kl_model_close(m);
}
END_TEST

static Suite *memplan_engine_suite(void)
{
    Suite *s = suite_create("memplan_engine");
    TCase *tc = tcase_create("engines");
    tcase_set_timeout(tc, 600);
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, every_cpu_rank_holds_the_planned_bytes, 0, N_FIXTURES);
    tcase_add_test(tc, a_rank_of_another_tp_size_differs);
    tcase_add_loop_test(tc, gpu_arena_of_the_audit_is_the_gpu_plans, 0, N_FIXTURES + N_SYNTH);
    tcase_add_loop_test(tc, gpu_arena_of_every_rank_is_its_cut_models_plan, 0, N_FIXTURES + 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(memplan_engine_suite());
}
