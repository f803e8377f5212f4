/* tests/test_streamcopy.c — kl_copy_streaming (common/streamcopy.h) copies exactly what
 * memcpy does: every length from 0 to past the streaming threshold and around 64-byte steps,
 * every destination and source misalignment within 16 bytes, bytes around dst untouched. */
#include "common/mem.h"
#include "common/streamcopy.h"
#include "testutil.h"

#include <stdint.h>
#include <string.h>

#define MOST 20000u   /* past the 4 KiB below which it is memcpy */
#define GUARD 64u

static void check_copy(uint8_t *dst, const uint8_t *src, size_t n)
{
    memset(dst, 0xA5, n + 2 * GUARD);
    kl_copy_streaming(dst + GUARD, src, n);
    ck_assert_msg(memcmp(dst + GUARD, src, n) == 0, "%zu bytes differ", n);
    for (size_t i = 0; i < GUARD; i++) {
        ck_assert_uint_eq(dst[i], 0xA5);
        ck_assert_uint_eq(dst[GUARD + n + i], 0xA5);
    }
}

START_TEST(every_length_and_alignment_copies_exactly)
{
    uint8_t *src = kl_aligned_alloc(64, MOST + 64), *dst = kl_aligned_alloc(64, MOST + 3 * GUARD);
    ck_assert_ptr_nonnull(src);
    ck_assert_ptr_nonnull(dst);
    for (size_t i = 0; i < MOST + 64; i++)
        src[i] = (uint8_t)(i * 131u + (i >> 8));
    static const size_t lens[] = {0, 1, 15, 16, 17, 63, 64, 65, 4095, 4096, 4097, 4160, 4161,
                                  8191, 12345, MOST - 1, MOST};
    for (size_t l = 0; l < sizeof lens / sizeof *lens; l++)
        for (size_t da = 0; da < 16; da++)
            for (size_t sa = 0; sa < 16; sa += 5)
                check_copy(dst + da, src + sa, lens[l]);
    kl_aligned_free(src);
    kl_aligned_free(dst);
}
END_TEST

static Suite *streamcopy_suite(void)
{
    Suite *s = suite_create("streamcopy");
    TCase *tc = tcase_create("streamcopy");
    tcase_add_test(tc, every_length_and_alignment_copies_exactly);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(streamcopy_suite());
}
