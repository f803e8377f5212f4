/* tests/test_pool.c — the worker team (common/pool.h): every item exactly once, back-to-back
 * runs (spinning workers), runs after idle gaps (sleeping workers), destroy at any time. */
#include "common/err.h"
#include "common/pool.h"
#include "testutil.h"

#include <stdatomic.h>
#include <time.h>

#define MAX_ITEMS 1000

typedef struct count_ctx {
    atomic_int hits[MAX_ITEMS];
} count_ctx;

static void count_item(void *ctx, size_t i)
{
    count_ctx *c = ctx;
    atomic_fetch_add(&c->hits[i], 1);
}

static kl_pool *make_pool(unsigned threads)
{
    kl_pool *p = NULL;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_pool_create(&p, threads, &err) == 0, "%s", t_fmt_err(&err));
    ck_assert_uint_eq(kl_pool_threads(p), threads);
    return p;
}

/* Runs n items and checks each was called exactly once. */
static void run_and_check(kl_pool *p, count_ctx *c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        atomic_store(&c->hits[i], 0);
    kl_pool_run(p, n, count_item, c);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(atomic_load(&c->hits[i]) == 1, "item %zu of %zu ran %d times", i, n,
                      atomic_load(&c->hits[i]));
}

/* threads 1, 2, 3, 8: thousands of back-to-back runs of 0..97 items */
START_TEST(every_item_once_in_back_to_back_runs)
{
    static const unsigned threads[] = {1, 2, 3, 8};
    kl_pool *p = make_pool(threads[_i]);
    static count_ctx c;
    for (size_t r = 0; r < 3000; r++)
        run_and_check(p, &c, r % 98);
    run_and_check(p, &c, MAX_ITEMS);
    kl_pool_destroy(p);
}
END_TEST

/* Idle gaps longer than the spin time: workers and caller go to sleep and must be woken. */
START_TEST(runs_after_idle_gaps_wake_the_team)
{
    kl_pool *p = make_pool(4);
    static count_ctx c;
    struct timespec gap = {0, 2 * 1000 * 1000}; /* 2 ms */
    for (int r = 0; r < 50; r++) {
        nanosleep(&gap, NULL);
        run_and_check(p, &c, 64);
    }
    kl_pool_destroy(p);
}
END_TEST

static void slow_item(void *ctx, size_t i)
{
    (void)ctx;
    (void)i;
    struct timespec t = {0, 3 * 1000 * 1000}; /* longer than the caller's spin */
    nanosleep(&t, NULL);
}

/* The caller finishes its share early and has to sleep until the workers are done. */
START_TEST(caller_waits_for_slow_workers)
{
    kl_pool *p = make_pool(4);
    for (int r = 0; r < 10; r++)
        kl_pool_run(p, 4, slow_item, NULL);
    kl_pool_destroy(p);
}
END_TEST

START_TEST(destroy_right_after_create_and_after_runs)
{
    kl_pool_destroy(make_pool(6));
    kl_pool *p = make_pool(6);
    static count_ctx c;
    run_and_check(p, &c, 10);
    kl_pool_destroy(p); /* workers still spinning */
    kl_pool_destroy(NULL);
}
END_TEST

static Suite *pool_suite(void)
{
    Suite *s = suite_create("pool");
    TCase *tc = tcase_create("runs");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, every_item_once_in_back_to_back_runs, 0, 4);
    tcase_add_test(tc, runs_after_idle_gaps_wake_the_team);
    tcase_add_test(tc, caller_waits_for_slow_workers);
    tcase_add_test(tc, destroy_right_after_create_and_after_runs);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(pool_suite());
}
