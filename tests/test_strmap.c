/* tests/test_strmap.c — kl_strmap (common/strmap.h): every key found after the map grows, a
 * key put twice keeps its first value, the *_h forms agree with the plain ones, names that
 * differ in one digit stay apart, and the hash reads the whole key whatever its length. */
#include "common/mem.h"
#include "common/strmap.h"
#include "tests/testutil.h"

#include <stdio.h>

enum { N_KEYS = 20000 };

/* "model.layers.L.block_sparse_moe.experts.E.w1.weight_packed"-like names, all distinct. */
static char **make_keys(void)
{
    char **k = kl_calloc(N_KEYS, sizeof *k);
    ck_assert_ptr_nonnull(k);
    for (int i = 0; i < N_KEYS; i++) {
        char buf[96];
        snprintf(buf, sizeof buf, "model.layers.%d.block_sparse_moe.experts.%d.w%d.weight_packed",
                 i / 768, i / 3 % 256, i % 3 + 1);
        k[i] = kl_strdup(buf);
        ck_assert_ptr_nonnull(k[i]);
    }
    return k;
}

static void free_keys(char **k)
{
    for (int i = 0; i < N_KEYS; i++)
        kl_free(k[i]);
    kl_free(k);
}

START_TEST(every_key_is_found_after_the_map_grows)
{
    char **k = make_keys();
    kl_strmap m;
    ck_assert_int_eq(kl_strmap_init(&m, 4), 0);
    for (int i = 0; i < N_KEYS; i++)
        ck_assert_int_eq(kl_strmap_put(&m, k[i], (uint32_t)i, NULL), 0);
    ck_assert_uint_eq(m.count, N_KEYS);
    ck_assert_msg(m.cap >= 2 * (size_t)N_KEYS, "load above one half: cap %zu", m.cap);
    for (int i = 0; i < N_KEYS; i++) {
        uint32_t v = 0;
        ck_assert_msg(kl_strmap_get(&m, k[i], &v) == 1 && v == (uint32_t)i, "%s: %u", k[i], v);
    }
    ck_assert_int_eq(kl_strmap_get(&m, "model.layers.0.block_sparse_moe.experts.0.w4", NULL), 0);
    ck_assert_int_eq(kl_strmap_get(&m, "", NULL), 0);
    kl_strmap_free(&m);
    free_keys(k);
}
END_TEST

START_TEST(a_key_put_twice_keeps_its_first_value)
{
    kl_strmap m;
    uint32_t first = 0, v = 0;
    ck_assert_int_eq(kl_strmap_init(&m, 0), 0);
    ck_assert_int_eq(kl_strmap_put(&m, "a", 1, NULL), 0);
    char again[] = "a";   /* another pointer, same text */
    ck_assert_int_eq(kl_strmap_put(&m, again, 2, &first), 1);
    ck_assert_uint_eq(first, 1);
    ck_assert(kl_strmap_get(&m, "a", &v) == 1 && v == 1);
    ck_assert_uint_eq(m.count, 1);
    kl_strmap_free(&m);
}
END_TEST

START_TEST(the_hashed_forms_agree_with_the_plain_ones)
{
    char **k = make_keys();
    kl_strmap m;
    ck_assert_int_eq(kl_strmap_init(&m, N_KEYS), 0);
    for (int i = 0; i < N_KEYS; i += 2)   /* even keys through put_h, odd through put */
        ck_assert_int_eq(kl_strmap_put_h(&m, k[i], kl_strmap_hash(k[i]), (uint32_t)i, NULL), 0);
    for (int i = 1; i < N_KEYS; i += 2)
        ck_assert_int_eq(kl_strmap_put(&m, k[i], (uint32_t)i, NULL), 0);
    for (int i = 0; i < N_KEYS; i++) {
        uint32_t a = 0, b = 0;
        ck_assert(kl_strmap_get(&m, k[i], &a) == 1 &&
                  kl_strmap_get_h(&m, k[i], kl_strmap_hash(k[i]), &b) == 1 && a == b &&
                  a == (uint32_t)i);
    }
    kl_strmap_free(&m);
    free_keys(k);
}
END_TEST

START_TEST(the_hash_reads_every_byte_of_any_length)
{
    /* keys of 0..40 bytes that differ in their last byte only hash apart */
    char a[48], b[48];
    for (size_t n = 1; n <= 40; n++) {
        memset(a, 'x', n);
        memset(b, 'x', n);
        a[n] = b[n] = '\0';
        b[n - 1] = 'y';
        ck_assert_msg(kl_strmap_hash(a) != kl_strmap_hash(b), "length %zu: last byte ignored", n);
        a[n - 1] = '\0';   /* a one byte shorter: the length counts too */
        ck_assert_msg(kl_strmap_hash(a) != kl_strmap_hash(b), "length %zu", n);
    }
    ck_assert(kl_strmap_hash("") != kl_strmap_hash("\x01"));
}
END_TEST

START_TEST(an_empty_map_finds_nothing)
{
    kl_strmap m;
    memset(&m, 0, sizeof m);
    ck_assert_int_eq(kl_strmap_get(&m, "a", NULL), 0);
    ck_assert_int_eq(kl_strmap_put(&m, "a", 7, NULL), 0);   /* a zeroed map allocates */
    uint32_t v = 0;
    ck_assert(kl_strmap_get(&m, "a", &v) == 1 && v == 7);
    kl_strmap_free(&m);
    kl_strmap_free(&m);   /* idempotent */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("strmap");
    TCase *tc = tcase_create("map");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, every_key_is_found_after_the_map_grows);
    tcase_add_test(tc, a_key_put_twice_keeps_its_first_value);
    tcase_add_test(tc, the_hashed_forms_agree_with_the_plain_ones);
    tcase_add_test(tc, the_hash_reads_every_byte_of_any_length);
    tcase_add_test(tc, an_empty_map_finds_nothing);
    suite_add_tcase(s, tc);
    return t_run_suite(s);
}
