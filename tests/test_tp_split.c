/*
 * tests/test_tp_split.c — loader/tp_split.h on the tiny, small and full presets, BF16 and
 * MXFP4, every valid TP size up to 8, both ways of splitting the routed experts: every element
 * of a cut tensor is held by exactly one rank, in equal parts; whole tensors by every rank;
 * each routed expert by one rank, the same number per rank; the cuts the engines rely on.
 */
#include "loader/tp_split.h"

#include "synth/synth.h"
#include "testutil.h"

static void preset_schema(const char *preset, kl_synth_format format, kl_config *c,
                          kl_schema *s)
{
    kl_synth_opts o;
    memset(&o, 0, sizeof o);
    o.preset = preset;
    o.format = format;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_synth_config(&o, c, &err), 0);
    ck_assert_int_eq(kl_schema_build(s, c, &err), 0);
}

/* Every entry of s under tp ranks: the parts add up, and a cut gives every rank as much. */
static void check_conservation(const kl_schema *s, const kl_config *c, unsigned tp, int ep)
{
    for (size_t i = 0; i < s->n; i++) {
        const kl_schema_entry *e = &s->entries[i];
        const kl_tp_split sp = kl_tp_split_of(e->role, ep);
        uint64_t sum = 0, first = kl_tp_rank_numel(e, sp, tp, 0, c->num_experts);
        unsigned holders = 0;
        for (unsigned r = 0; r < tp; r++) {
            const uint64_t n = kl_tp_rank_numel(e, sp, tp, r, c->num_experts);
            sum += n;
            holders += n > 0;
            if (sp.kind == KL_TP_OUT || sp.kind == KL_TP_IN)
                ck_assert_msg(n == first, "%s: rank %u holds %llu, rank 0 %llu (tp %u)",
                              e->name, r, (unsigned long long)n, (unsigned long long)first, tp);
        }
        if (sp.kind == KL_TP_WHOLE)
            ck_assert_msg(sum == e->numel * tp, "%s: whole on every rank (tp %u)", e->name, tp);
        else
            ck_assert_msg(sum == e->numel, "%s: %llu elements over the ranks, %llu in all "
                          "(tp %u)", e->name, (unsigned long long)sum,
                          (unsigned long long)e->numel, tp);
        if (sp.kind == KL_TP_OWNER)
            ck_assert_msg(holders == 1, "%s: on %u ranks (tp %u)", e->name, holders, tp);
    }
}

START_TEST(tp_split_conserves_every_tensor)
{
    static const char *const presets[] = {"tiny", "small", "full"};
    for (int f = 0; f < 2; f++) {
        kl_config c;
        kl_schema s;
        preset_schema(presets[_i], f ? KL_SYNTH_MXFP4 : KL_SYNTH_BF16, &c, &s);
        for (int ep = 0; ep < 2; ep++) {
            unsigned sizes[64];
            size_t n = kl_tp_sizes(&c, ep, sizes, 64);
            ck_assert_uint_ge(n, 1);
            for (size_t k = 0; k < n && sizes[k] <= 8; k++)
                check_conservation(&s, &c, sizes[k], ep);
        }
        kl_schema_free(&s);
    }
}
END_TEST

START_TEST(tp_split_cuts_the_blocks_as_megatron_does)
{
    kl_tp_split s = kl_tp_split_of(KL_ROLE_KDA_Q, 0);
    ck_assert(s.kind == KL_TP_OUT && s.dim == 0);
    s = kl_tp_split_of(KL_ROLE_KDA_A_LOG, 0); /* [1, 1, H, 1]: by head */
    ck_assert(s.kind == KL_TP_OUT && s.dim == 2);
    static const kl_role ins[] = {KL_ROLE_KDA_O, KL_ROLE_MLA_O, KL_ROLE_MLP_DOWN,
                                  KL_ROLE_SHARED_DOWN};
    for (size_t i = 0; i < sizeof ins / sizeof *ins; i++) {
        s = kl_tp_split_of(ins[i], 0);
        ck_assert(s.kind == KL_TP_IN && s.dim == 1);
    }
    static const kl_role whole[] = {KL_ROLE_INPUT_NORM, KL_ROLE_ROUTER, KL_ROLE_ROUTER_BIAS,
                                    KL_ROLE_MLA_KV_A, KL_ROLE_MLA_KV_A_NORM, KL_ROLE_KDA_F_A,
                                    KL_ROLE_KDA_G_A, KL_ROLE_KDA_O_NORM, KL_ROLE_FINAL_NORM};
    for (size_t i = 0; i < sizeof whole / sizeof *whole; i++)
        ck_assert(kl_tp_split_of(whole[i], 1).kind == KL_TP_WHOLE);
    ck_assert(kl_tp_split_of(KL_ROLE_EMBED, 0).kind == KL_TP_OUT); /* by vocabulary */
    ck_assert(kl_tp_split_of(KL_ROLE_LM_HEAD, 0).kind == KL_TP_OUT);
    s = kl_tp_split_of(KL_ROLE_EXPERT_W2, 0);
    ck_assert(s.kind == KL_TP_IN && s.dim == 1);
    ck_assert(kl_tp_split_of(KL_ROLE_EXPERT_W1, 0).kind == KL_TP_OUT);
    ck_assert(kl_tp_split_of(KL_ROLE_EXPERT_W2, 1).kind == KL_TP_OWNER);
}
END_TEST

/* Expert parallel: contiguous blocks of E / tp experts per rank. */
START_TEST(tp_split_expert_owners_are_even_blocks)
{
    for (unsigned tp = 1; tp <= 8; tp *= 2) {
        unsigned count[8] = {0};
        for (uint32_t e = 0; e < 256; e++) {
            const unsigned r = kl_tp_expert_owner(e, 256, tp);
            ck_assert_uint_lt(r, tp);
            ck_assert_uint_eq(r, e / (256 / tp));
            count[r]++;
        }
        for (unsigned r = 0; r < tp; r++)
            ck_assert_uint_eq(count[r], 256 / tp);
    }
}
END_TEST

/* Expert parallel leaves the routed experts whole: their one 32-value block (tiny, MXFP4)
 * no longer bounds the sizes, the shared experts' width does. */
START_TEST(tp_split_expert_parallel_sizes)
{
    kl_config c;
    kl_schema s;
    preset_schema("tiny", KL_SYNTH_MXFP4, &c, &s);
    kl_schema_free(&s);
    ck_assert_uint_eq(kl_tp_expert_blocks(&c), c.moe_intermediate_size / 32);
    unsigned split[64], ep[64];
    size_t ns = kl_tp_sizes(&c, 0, split, 64), ne = kl_tp_sizes(&c, 1, ep, 64);
    for (size_t i = 0; i < ns; i++)
        ck_assert(kl_tp_size_ok(&c, 1, split[i])); /* every split size also holds under EP */
    ck_assert_uint_ge(ne, ns);
    for (size_t i = 0; i < ne; i++) {
        ck_assert_uint_eq(c.num_experts % ep[i], 0);
        ck_assert_uint_eq((c.moe_intermediate_size * c.num_shared_experts) % ep[i], 0);
    }
    /* the tiny preset: 4 heads of each kind, 8 experts, widths 96 and 32 (one block) */
    ck_assert_uint_eq(kl_tp_expert_blocks(&c), 1);
    char text[64];
    kl_tp_sizes_text(&c, 0, text, sizeof text);
    ck_assert_str_eq(text, "1");
    kl_tp_sizes_text(&c, 1, text, sizeof text);
    ck_assert_str_eq(text, "1, 2, 4");
}
END_TEST

/* MXFP4 experts cut along K (w2 under TP) keep whole 32-value scale blocks on a rank. */
START_TEST(tp_split_keeps_mxfp4_blocks_whole)
{
    kl_config c;
    kl_schema s;
    preset_schema("full", KL_SYNTH_MXFP4, &c, &s);
    size_t seen = 0;
    for (size_t i = 0; i < s.n; i++) {
        const kl_schema_entry *e = &s.entries[i];
        const kl_tp_split sp = kl_tp_split_of(e->role, 0);
        if (e->role != KL_ROLE_EXPERT_W2 || e->part != KL_PART_SCALE)
            continue;
        seen++;
        for (unsigned tp = 2; tp <= 8; tp *= 2)
            ck_assert_uint_eq(e->shape[sp.dim] % tp, 0); /* whole blocks per rank */
    }
    ck_assert_uint_gt(seen, 0);
    kl_schema_free(&s);
}
END_TEST

static Suite *tp_suite(void)
{
    Suite *s = suite_create("tp_split");
    TCase *tc = tcase_create("split");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, tp_split_conserves_every_tensor, 0, 3);
    tcase_add_test(tc, tp_split_cuts_the_blocks_as_megatron_does);
    tcase_add_test(tc, tp_split_expert_parallel_sizes);
    tcase_add_test(tc, tp_split_expert_owners_are_even_blocks);
    tcase_add_test(tc, tp_split_keeps_mxfp4_blocks_whole);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(tp_suite());
}
