/*
 * tests/test_backend_tp.c — the tensor-parallel wrapper (engine/backend_tp.h) over stand-in
 * ranks whose head() returns set vocabulary parts: the wrapper's rows are the parts side by
 * side, and its argmax (from the ranks' own, no pass over the joined row) is exactly
 * kl_sample_argmax of the joined row — ties to the lower id across ranks, NaN skipped, a part
 * of only NaN, infinities.  The real ranks' logits against TP 1 are tests/test_golden.c.
 */
#include "common/mem.h"
#include "engine/backend_tp.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "tests/testutil.h"

#include <math.h>
#include <string.h>

#define ROWS 6

/* A stand-in rank: ROWS rows of its vocabulary part. */
typedef struct fake_rank {
    kl_backend be;
    uint32_t   vocab;
    float      part[ROWS * 16];
} fake_rank;

static fake_rank *fake(kl_backend *be)
{
    return be->impl;
}

static int fake_begin(kl_backend *be, const kl_batch *c, kl_err *err)
{
    (void)be, (void)c, (void)err;
    return 0;
}

static int fake_head(kl_backend *be, float *logits, kl_token *argmax, kl_err *err)
{
    (void)err;
    const fake_rank *f = fake(be);
    for (size_t k = 0; k < ROWS; k++) {
        if (logits)
            memcpy(logits + k * f->vocab, f->part + k * f->vocab, f->vocab * sizeof *logits);
        if (argmax)
            argmax[k] = kl_sample_argmax(f->part + k * f->vocab, f->vocab);
    }
    return 0;
}

static int fake_end(kl_backend *be, kl_err *err)
{
    (void)be, (void)err;
    return 0;
}

static int fake_all_reduce(kl_backend *const *ranks, unsigned n, kl_tp_sum which, kl_err *err)
{
    (void)ranks, (void)n, (void)which, (void)err;
    return 0;
}

static void fake_destroy(kl_backend *be)
{
    kl_free(be->slot_len);
    kl_free(be->slot_used);
    kl_free(fake(be));
}

static const kl_backend_ops fake_ops = {.begin = fake_begin, .head = fake_head,
                                        .end = fake_end, .all_reduce = fake_all_reduce,
                                        .destroy = fake_destroy};

/* A model of rank r's cut: its vocabulary part, its backend the stand-in over `part`. */
static kl_model *fake_cut(uint32_t vocab, const float *part)
{
    kl_model *m = kl_calloc(1, sizeof *m);
    fake_rank *f = kl_calloc(1, sizeof *f);
    ck_assert(m && f && vocab <= 16);
    m->cfg.vocab_size = vocab;
    f->vocab = vocab;
    memcpy(f->part, part, ROWS * vocab * sizeof *part);
    f->be = (kl_backend){.ops = &fake_ops, .name = "fake", .m = m, .max_tokens = ROWS,
                         .max_slots = 1, .impl = f};
    f->be.slot_len = kl_calloc(1, sizeof *f->be.slot_len);
    f->be.slot_used = kl_calloc(1, sizeof *f->be.slot_used);
    m->be = &f->be;
    return m;
}

START_TEST(head_joins_parts_and_takes_the_first_largest)
{
    /* three ranks of 3, 4 and 2 ids; row by row what decides the argmax */
    enum { V = 9 };
    const float I = INFINITY, N = NAN;
    const float row[ROWS][V] = {
        {1, 5, 2, /**/ 0, 5, 5, 1, /**/ 3, 4},    /* tie across ranks: id 1 */
        {1, 2, 2, /**/ 0, 7, 1, 7, /**/ 7, 4},    /* tie in rank 1 and with rank 2: id 4 */
        {N, N, N, /**/ -1, -2, N, -1, /**/ N, -5}, /* rank 0 only NaN: id 3 */
        {N, N, N, /**/ N, N, N, N, /**/ N, N},     /* all NaN: 0, as kl_sample_argmax */
        {-I, -I, -I, /**/ -I, -I, -I, -I, /**/ -I, I}, /* +inf in the last rank: id 8 */
        {0, 0, 0, /**/ 0, 0, 0, 0, /**/ 0, 0}};    /* all equal: id 0 */
    const uint32_t vocab[3] = {3, 4, 2};
    kl_model whole = {0};
    whole.cfg.vocab_size = V;
    kl_model *cuts[3];
    for (uint32_t r = 0, v0 = 0; r < 3; v0 += vocab[r++]) {
        float part[ROWS * 4];
        for (size_t k = 0; k < ROWS; k++)
            memcpy(part + k * vocab[r], &row[k][v0], vocab[r] * sizeof(float));
        cuts[r] = fake_cut(vocab[r], part);
    }
    kl_backend *be = NULL;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_backend_tp_create(&be, &whole, cuts, 3, &err) == 0, "%s", t_fmt_err(&err));
    const kl_token ids[ROWS] = {0};
    const uint32_t slot[ROWS] = {0};
    const uint8_t want[ROWS] = {1, 1, 1, 1, 1, 1};
    const kl_batch c = {.n = ROWS, .ids = ids, .slot = slot, .want = want};
    float logits[ROWS * V];
    kl_token am[ROWS], am_only[ROWS];
    ck_assert_int_eq(be->ops->begin(be, &c, &err), 0);
    ck_assert_int_eq(be->ops->head(be, logits, am, &err), 0);
    ck_assert_int_eq(be->ops->head(be, NULL, am_only, &err), 0);   /* the argmax alone */
    ck_assert_int_eq(be->ops->end(be, &err), 0);
    ck_assert_int_eq(memcmp(logits, row, sizeof logits), 0);
    const kl_token expect[ROWS] = {1, 4, 3, 0, 8, 0};
    for (size_t k = 0; k < ROWS; k++) {
        ck_assert_uint_eq(kl_sample_argmax(row[k], V), expect[k]);
        ck_assert_msg(am[k] == expect[k] && am_only[k] == expect[k],
                      "row %zu: argmax %u / %u, want %u", k, am[k], am_only[k], expect[k]);
    }
    kl_backend_free(be);
}
END_TEST

static Suite *backend_tp_suite(void)
{
    Suite *s = suite_create("backend_tp");
    TCase *tc = tcase_create("head");
    tcase_add_test(tc, head_joins_parts_and_takes_the_first_largest);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(backend_tp_suite());
}
