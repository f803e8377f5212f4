/*
 * tests/test_skinny_map.c — kernels/skinny_map.h on the CPU: a warp of kernels/skinny.cu run
 * lane by lane (its A words loaded and decoded, x staged and read back, accumulators stored
 * through the map) with mma.m16n8k16 emulated from the PTX ISA's fragment layout, against the
 * straightforward product, for BF16 and MXFP4 weights over several stages of K and partial n8
 * tiles.  x is exactly bf16 here (one part), so the two agree to double rounding.
 */
#include "common/rng.h"
#include "kernels/mx_bf16.h"
#include "kernels/skinny_map.h"
#include "tests/testutil.h"

#include <stdint.h>

/* A weight matrix [rows, cols] (mx: MXFP4 codes and scales, else bf16 bits) and x [n, cols]
 * of bf16 values. */
typedef struct mat {
    int mx;
    uint32_t rows, cols, n;
    uint16_t *w;
    uint8_t *packed, *scale;
    uint16_t *x;
} mat;

static double bf(uint32_t h)
{
    return kl_mxfp4_f32_from_bits((h & 0xffffu) << 16);
}

/* W[r][c] as a double (MXFP4: e2m1 · e8m0). */
static double w_at(const mat *m, uint32_t r, uint32_t c)
{
    if (!m->mx)
        return bf(m->w[(size_t)r * m->cols + c]);
    const uint8_t b = m->packed[((size_t)r * m->cols + c) / 2];
    return kl_e2m1_value(c % 2 ? b >> 4 : b & 15u) *
           kl_e8m0_value(m->scale[((size_t)r * m->cols + c) / KL_MXFP4_BLOCK]);
}

static mat mat_random(int mx, uint32_t rows, uint32_t cols, uint32_t n, uint64_t seed)
{
    kl_rng r;
    kl_rng_seed(&r, seed, (uint64_t)mx);
    mat m = {mx, rows, cols, n, NULL, NULL, NULL, malloc((size_t)n * cols * 2)};
    for (size_t i = 0; i < (size_t)n * cols; i++)
        m.x[i] = (uint16_t)(kl_rng_next(&r) >> 48 & 0xbfffu); /* finite: exponent < 255 */
    if (!mx) {
        m.w = malloc((size_t)rows * cols * 2);
        for (size_t i = 0; i < (size_t)rows * cols; i++)
            m.w[i] = (uint16_t)(kl_rng_next(&r) >> 48 & 0xbfffu);
        return m;
    }
    m.packed = malloc((size_t)rows * cols / 2);
    m.scale = malloc((size_t)rows * cols / KL_MXFP4_BLOCK);
    for (size_t i = 0; i < (size_t)rows * cols / 2; i++)
        m.packed[i] = (uint8_t)kl_rng_next(&r);
    for (size_t i = 0; i < (size_t)rows * cols / KL_MXFP4_BLOCK; i++) /* table and slow paths */
        m.scale[i] = i % 7 == 3 ? (uint8_t)(i % 2) : (uint8_t)(120 + i % 14);
    return m;
}

static void mat_free(mat *m)
{
    free(m->w);
    free(m->packed);
    free(m->scale);
    free(m->x);
}

/* Word w of lane t's unit U of row r, the stage starting at column k0 (the kernel's loads:
 * BF16 one 16-byte piece; MXFP4 the 16 bytes of the lane's scale block, decoded). */
static uint32_t a_word(const mat *m, uint32_t r, uint32_t k0, uint32_t U, uint32_t t, uint32_t w)
{
    if (!m->mx) {
        const uint16_t *p = m->w + (size_t)r * m->cols + k0 + kl_sk_col(0, U, t) + 2 * w;
        return p[0] | (uint32_t)p[1] << 16;
    }
    const uint32_t c0 = k0 + kl_sk_col(1, U & ~3u, t); /* the block's first column */
    const uint8_t *p = m->packed + ((size_t)r * m->cols + c0) / 2;
    uint32_t q[4], out[16];
    for (int i = 0; i < 4; i++)
        q[i] = p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
               (uint32_t)p[4 * i + 3] << 24;
    kl_mx_decode32(q, m->scale[((size_t)r * m->cols + c0) / KL_MXFP4_BLOCK], out);
    return out[4 * (U % 4) + w];
}

/* mma.m16n8k16 as the PTX ISA lays out its fragments (lane 4 g + t): a[i] holds A[g + 8 (i %
 * 2)][2 t + 8 (i / 2) (+1)], b[i] B[2 t + 8 i (+1)][g], c[i] C[g + 8 (i / 2)][2 t + i % 2];
 * bf16 pairs, low half first; summed in double. */
static void emu_mma(double c[32][4], uint32_t a[32][4], uint32_t b[32][2])
{
    double A[16][16], B[16][8];
    for (uint32_t l = 0; l < 32; l++) {
        const uint32_t g = l / 4, t = l % 4;
        for (uint32_t i = 0; i < 4; i++) {
            A[g + 8 * (i % 2)][2 * t + 8 * (i / 2)] = bf(a[l][i]);
            A[g + 8 * (i % 2)][2 * t + 8 * (i / 2) + 1] = bf(a[l][i] >> 16);
        }
        for (uint32_t i = 0; i < 2; i++) {
            B[2 * t + 8 * i][g] = bf(b[l][i]);
            B[2 * t + 8 * i + 1][g] = bf(b[l][i] >> 16);
        }
    }
    for (uint32_t l = 0; l < 32; l++)
        for (uint32_t i = 0; i < 4; i++) {
            double s = 0;
            for (uint32_t k = 0; k < 16; k++)
                s += A[l / 4 + 8 * (i / 2)][k] * B[k][2 * (l % 4) + i % 2];
            c[l][i] += s;
        }
}

/* x of the stage at k0 (units of 32 columns, toks tokens: zero past n) as the kernel stages it
 * (part 0 only: x is bf16), 8 values per piece. */
static uint16_t *stage(const mat *m, uint32_t k0, uint32_t units, uint32_t toks)
{
    uint16_t *s = calloc((size_t)units * toks * 32, 2);
    for (uint32_t U = 0; U < units; U++)
        for (uint32_t tok = 0; tok < m->n; tok++)
            for (uint32_t t = 0; t < 4; t++)
                for (uint32_t i = 0; i < 8; i++)
                    s[8 * kl_sk_stage_at(0, U, tok, t, units, toks) + i] =
                        m->x[(size_t)tok * m->cols + k0 + kl_sk_col(m->mx, U, t) + i];
    return s;
}

/* Y [n, rows] the kernel's way: per m16 tile and n8 tile, K in stages of `stage_cols`. */
static void run_map(const mat *m, uint32_t stage_cols, double *y)
{
    const uint32_t nt_count = (m->n + 7) / 8, toks = 8 * nt_count;
    static double c[32][4];
    static uint32_t a[32][4], b[32][2];
    for (uint32_t r0 = 0; r0 < m->rows; r0 += 16)
        for (uint32_t nt = 0; nt < nt_count; nt++) {
            memset(c, 0, sizeof c);
            for (uint32_t k0 = 0; k0 < m->cols; k0 += stage_cols) {
                const uint32_t kn = m->cols - k0 < stage_cols ? m->cols - k0 : stage_cols;
                uint16_t *s = stage(m, k0, kn / KL_SK_UNIT, toks);
                for (uint32_t U = 0; U < kn / KL_SK_UNIT; U++)
                    for (uint32_t h = 0; h < 2; h++) {
                        for (uint32_t l = 0; l < 32; l++) {
                            const uint32_t g = l / 4, t = l % 4;
                            const uint16_t *p =
                                s + 8 * kl_sk_stage_at(0, U, 8 * nt + g, t, kn / 32, toks);
                            uint32_t lo[4], hi[4], xw[4];
                            for (uint32_t w = 0; w < 4; w++) {
                                lo[w] = a_word(m, r0 + g, k0, U, t, w);
                                hi[w] = a_word(m, r0 + g + 8, k0, U, t, w);
                                xw[w] = p[2 * w] | (uint32_t)p[2 * w + 1] << 16;
                            }
                            kl_sk_frags(lo, hi, xw, h, a[l], b[l]);
                        }
                        emu_mma(c, a, b);
                    }
                free(s);
            }
            for (uint32_t l = 0; l < 32; l++)
                for (uint32_t i = 0; i < 4; i++) {
                    const uint32_t row = r0 + kl_sk_c_row(l / 4, i);
                    const uint32_t tok = 8 * nt + kl_sk_c_tok(l % 4, i);
                    if (tok < m->n)
                        y[(size_t)tok * m->rows + row] = c[l][i];
                }
        }
}

/* The largest relative difference of run_map's Y from the plain product over all outputs. */
static double map_error(int mx, uint32_t rows, uint32_t cols, uint32_t n, uint32_t stage_cols)
{
    mat m = mat_random(mx, rows, cols, n, 20261202u + rows + n);
    double *y = malloc((size_t)n * rows * sizeof *y), worst = 0;
    for (size_t i = 0; i < (size_t)n * rows; i++)
        y[i] = NAN;
    run_map(&m, stage_cols, y);
    for (uint32_t tok = 0; tok < n; tok++)
        for (uint32_t r = 0; r < rows; r++) {
            double s = 0, mag = 0;
            for (uint32_t c = 0; c < cols; c++) {
                const double p = w_at(&m, r, c) * bf(m.x[(size_t)tok * cols + c]);
                s += p;
                mag += fabs(p);
            }
            const double e = fabs(y[(size_t)tok * rows + r] - s) / (mag > 0 ? mag : 1);
            worst = e > worst || e != e ? e : worst;
        }
    mat_free(&m);
    free(y);
    return worst;
}

START_TEST(bf16_map_gives_the_product)
{
    /* three stages (256, 256, 128 columns), a partial second n8 tile; one token */
    double e = map_error(0, 48, 640, 11, 256);
    ck_assert_msg(e < 1e-13, "bf16 map: %.3g", e);
    e = map_error(0, 16, 128, 1, 128);
    ck_assert_msg(e < 1e-13, "bf16 map n=1: %.3g", e);
}
END_TEST

START_TEST(mxfp4_map_gives_the_product)
{
    /* granules of 128 in stages of 256, scales on the table and the float paths */
    double e = map_error(1, 32, 640, 9, 256);
    ck_assert_msg(e < 1e-13, "mxfp4 map: %.3g", e);
    e = map_error(1, 16, 384, 32, 128);
    ck_assert_msg(e < 1e-13, "mxfp4 map n=32: %.3g", e);
}
END_TEST

/* Every column of a stage is some lane's, once: the map is a permutation of each granule. */
START_TEST(each_granule_is_covered_once)
{
    for (int mx = 0; mx < 2; mx++) {
        int seen[KL_SK_GRAN] = {0};
        for (uint32_t U = 0; U < 4; U++)
            for (uint32_t t = 0; t < 4; t++)
                for (uint32_t i = 0; i < 8; i++) {
                    const uint32_t c = kl_sk_col(mx, U, t) + i;
                    ck_assert_uint_lt(c, KL_SK_GRAN);
                    seen[c]++;
                }
        for (uint32_t c = 0; c < KL_SK_GRAN; c++)
            ck_assert_msg(seen[c] == 1, "mx %d column %u seen %d times", mx, c, seen[c]);
        /* MXFP4: a lane's 32 values of a granule lie in one scale block */
        for (uint32_t t = 0; mx && t < 4; t++)
            for (uint32_t U = 0; U < 4; U++)
                ck_assert_uint_eq(kl_sk_col(mx, U, t) / KL_MXFP4_BLOCK, t);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("skinny_map");
    TCase *tc = tcase_create("map");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, bf16_map_gives_the_product);
    tcase_add_test(tc, mxfp4_map_gives_the_product);
    tcase_add_test(tc, each_granule_is_covered_once);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
