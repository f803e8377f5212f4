/* tests/test_grow.c — kl_grow (common/grow.h): doubling, room for what is asked, overflow
 * refused with the array left as it was. */
#include "common/err.h"
#include "common/grow.h"
#include "common/mem.h"
#include "testutil.h"

#include <stdint.h>

START_TEST(growing_one_at_a_time_keeps_every_element)
{
    uint64_t *v = NULL;
    size_t n = 0, cap = 0;
    for (uint64_t i = 0; i < 1000; i++) {
        ck_assert_int_eq(kl_grow(&v, &cap, n + 1, sizeof *v), 0);
        ck_assert_msg(cap >= n + 1, "capacity %zu for %zu elements", cap, n + 1);
        v[n++] = i * 3;
    }
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(v[i] == i * 3, "element %zu is %llu", i, (unsigned long long)v[i]);
    ck_assert_msg(cap == 1024, "capacity after 1000 pushes from 16 by doubling: %zu", cap);
    kl_free(v);
}
END_TEST

START_TEST(a_large_first_request_is_met_at_once)
{
    char *v = NULL;
    size_t cap = 0;
    ck_assert_int_eq(kl_grow(&v, &cap, 5000, 1), 0);
    ck_assert_msg(cap >= 5000 && cap < 10000, "capacity %zu for 5000", cap);
    size_t before = cap;
    ck_assert_int_eq(kl_grow(&v, &cap, 10, 1), 0);
    ck_assert_msg(cap == before, "a smaller request changed the capacity to %zu", cap);
    kl_free(v);
}
END_TEST

START_TEST(an_overflowing_size_is_refused_and_the_array_kept)
{
    uint32_t *v = NULL;
    size_t cap = 0;
    ck_assert_int_eq(kl_grow(&v, &cap, 4, sizeof *v), 0);
    uint32_t *kept = v;
    size_t kept_cap = cap;
    ck_assert_int_eq(kl_grow(&v, &cap, SIZE_MAX / 2, sizeof *v), KL_E_NOMEM);
    ck_assert_int_eq(kl_grow(&v, &cap, SIZE_MAX, 1), KL_E_NOMEM);
    ck_assert_msg(v == kept && cap == kept_cap, "a refused grow changed the array");
    kl_free(v);
}
END_TEST

static Suite *grow_suite(void)
{
    Suite *s = suite_create("grow");
    TCase *tc = tcase_create("grow");
    tcase_add_test(tc, growing_one_at_a_time_keeps_every_element);
    tcase_add_test(tc, a_large_first_request_is_met_at_once);
    tcase_add_test(tc, an_overflowing_size_is_refused_and_the_array_kept);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(grow_suite());
}
