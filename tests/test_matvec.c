/*
 * tests/test_matvec.c — engine/matvec: the scalar and AVX2/FMA weight kernels.
 *
 * AVX2 against scalar on random rows of every kind (F32 and BF16 of odd widths with tails,
 * MXFP4 of whole blocks) within 1e-5 of Σ|w·x|, both against a double reference; every E8M0
 * scale byte decoded exactly; a matrix x chunk product equal bit for bit to one dot per token
 * (any chunk size) and to itself over any thread count; row views; the vector primitives; the
 * KL_CPU_KERNELS switch; the row forms of the vector primitives equal one call per row bit
 * for bit; the AVX2 activations (polynomial exp and log) near libm's.  AVX2 cases pass
 * trivially (with a note) on a CPU without AVX2.
 */
#include "common/err.h"
#include "common/mem.h"
#include "common/mxfp4_format.h"
#include "common/numfmt.h"
#include "common/pool.h"
#include "common/rng.h"
#include "engine/matvec.h"
#include "tests/testutil.h"

#include <math.h>
#include <stdint.h>

#define REL_TOL 1e-5

/* ------------------------------------------------------------------------------------------ */
/* Random matrices                                                                            */

typedef struct tmat {
    kl_wmat  w;
    void    *data;     /* F32 / BF16 payload */
    uint8_t *packed, *scale;
} tmat;

static float gauss(kl_rng *r)
{
    float a, b;
    kl_rng_normal2(r, &a, &b);
    return a;
}

/* rows x cols of kind, random: Gaussian F32/BF16; MXFP4 random codes and scales near 2^-6. */
static void tmat_init(tmat *m, kl_wkind kind, uint64_t rows, uint64_t cols, uint64_t seed)
{
    kl_rng r;
    kl_rng_seed(&r, seed, 1);
    memset(m, 0, sizeof *m);
    m->w = (kl_wmat){.kind = kind, .rows = rows, .cols = cols};
    size_t n = (size_t)(rows * cols);
    if (kind == KL_W_F32) {
        float *p = m->data = kl_malloc(n * sizeof *p);
        for (size_t i = 0; i < n; i++)
            p[i] = gauss(&r);
    } else if (kind == KL_W_BF16) {
        uint16_t *p = m->data = kl_malloc(n * sizeof *p);
        for (size_t i = 0; i < n; i++)
            p[i] = kl_f32_to_bf16(gauss(&r));
    } else {
        m->packed = kl_malloc(n / 2);
        m->scale = kl_malloc(n / 32);
        for (size_t i = 0; i < n / 2; i++)
            m->packed[i] = (uint8_t)(kl_rng_next(&r) & 0xff);
        for (size_t i = 0; i < n / 32; i++)
            m->scale[i] = (uint8_t)(115 + kl_rng_next(&r) % 16);
        m->w.packed = m->packed;
        m->w.scale = m->scale;
    }
    m->w.data = m->data;
    ck_assert(kind == KL_W_MXFP4 ? m->packed && m->scale : m->data != NULL);
}

static void tmat_free(tmat *m)
{
    kl_free(m->data);
    kl_free(m->packed);
    kl_free(m->scale);
}

static float *rand_vec(size_t n, uint64_t seed)
{
    kl_rng r;
    kl_rng_seed(&r, seed, 2);
    float *x = kl_malloc((n ? n : 1) * sizeof *x);
    ck_assert(x != NULL);
    for (size_t i = 0; i < n; i++)
        x[i] = gauss(&r);
    return x;
}

/* Σ w·x in double and Σ |w·x| (the error scale), from the exact fp32 row. */
static void ref_dot(const kl_wmat *w, uint64_t r, const float *x, double *dot, double *mag)
{
    float *row = kl_malloc((size_t)w->cols * sizeof *row);
    kl_wmat_row_f32(w, r, row);
    *dot = *mag = 0;
    for (uint64_t c = 0; c < w->cols; c++) {
        *dot += (double)row[c] * x[c];
        *mag += fabs((double)row[c] * x[c]);
    }
    kl_free(row);
}

static const char *kind_name(kl_wkind k)
{
    return k == KL_W_F32 ? "f32" : k == KL_W_BF16 ? "bf16" : "mxfp4";
}

/* 1 if the AVX2 set can be selected here (else a note on stderr). */
static int have_avx2(void)
{
    if (kl_matvec_set_kernels(KL_KERNELS_AVX2) == KL_KERNELS_AVX2)
        return 1;
    fprintf(stderr, "note: no AVX2/FMA on this CPU: AVX2 cases check the scalar path only\n");
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* AVX2 vs scalar                                                                             */

static void check_kind_widths(kl_wkind kind, const uint64_t *widths, size_t n_widths)
{
    int avx2 = have_avx2();
    for (size_t wi = 0; wi < n_widths; wi++) {
        uint64_t cols = widths[wi], rows = 23;
        tmat m;
        tmat_init(&m, kind, rows, cols, 100 + wi);
        float *x = rand_vec((size_t)cols, 200 + wi);
        for (uint64_t r = 0; r < rows; r++) {
            double ref, mag;
            ref_dot(&m.w, r, x, &ref, &mag);
            kl_matvec_set_kernels(KL_KERNELS_SCALAR);
            float s = kl_wmat_dot(&m.w, r, x);
            kl_matvec_set_kernels(avx2 ? KL_KERNELS_AVX2 : KL_KERNELS_SCALAR);
            float v = kl_wmat_dot(&m.w, r, x);
            double tol = REL_TOL * mag + 1e-30;
            ck_assert_msg(fabs((double)v - s) <= tol,
                          "%s %llu cols row %llu: avx2 %.9g vs scalar %.9g (|diff| %g > %g)",
                          kind_name(kind), (unsigned long long)cols, (unsigned long long)r,
                          (double)v, (double)s, fabs((double)v - s), tol);
            ck_assert_msg(fabs((double)v - ref) <= tol && fabs((double)s - ref) <= tol,
                          "%s %llu cols row %llu: avx2 %.9g scalar %.9g vs double %.9g (tol %g)",
                          kind_name(kind), (unsigned long long)cols, (unsigned long long)r,
                          (double)v, (double)s, ref, tol);
        }
        kl_free(x);
        tmat_free(&m);
    }
}

START_TEST(f32_rows_of_odd_widths_agree_with_scalar)
{
    static const uint64_t w[] = {1, 5, 8, 31, 32, 33, 63, 100, 257, 2304, 2311};
    check_kind_widths(KL_W_F32, w, sizeof w / sizeof *w);
}
END_TEST

START_TEST(bf16_rows_of_odd_widths_agree_with_scalar)
{
    static const uint64_t w[] = {1, 7, 16, 31, 32, 33, 65, 127, 129, 1024, 2304, 4099};
    check_kind_widths(KL_W_BF16, w, sizeof w / sizeof *w);
}
END_TEST

START_TEST(mxfp4_rows_of_whole_blocks_agree_with_scalar)
{
    static const uint64_t w[] = {32, 64, 96, 160, 1024, 2304};
    check_kind_widths(KL_W_MXFP4, w, sizeof w / sizeof *w);
}
END_TEST

/* One code at one position, x = 1 there and 0 elsewhere: the dot is exactly that element's
 * value, for every scale byte (subnormal 0 and 1, NaN 255) and both kernel sets. */
START_TEST(mxfp4_every_scale_byte_and_code_decodes_exactly)
{
    uint8_t packed[16], scale[1];
    float x[32];
    kl_wmat w = {.kind = KL_W_MXFP4, .rows = 1, .cols = 32, .packed = packed, .scale = scale};
    int sets = have_avx2() ? 2 : 1;
    for (int k = 0; k < sets; k++) {
        kl_matvec_set_kernels(k ? KL_KERNELS_AVX2 : KL_KERNELS_SCALAR);
        for (unsigned s = 0; s < 256; s++) {
            for (unsigned code = 0; code < 16; code++) {
                unsigned pos = (s * 7 + code * 3) % 32;
                memset(packed, 0, sizeof packed);
                packed[pos / 2] = (uint8_t)(code << (4 * (pos & 1)));
                scale[0] = (uint8_t)s;
                memset(x, 0, sizeof x);
                x[pos] = 1.0f;
                float want, got = kl_wmat_dot(&w, 0, x);
                kl_mxfp4_dequantize_row(packed, scale, 32, x);
                want = x[pos];
                int same = isnan(want) ? isnan(got) : got == want;
                ck_assert_msg(same, "%s: scale byte %u code %u at %u: expected %g, got %g",
                              kl_matvec_kernels_name(kl_matvec_kernels()), s, code, pos,
                              (double)want, (double)got);
            }
        }
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Order invariance                                                                           */

/* matmul over n tokens == one kl_wmat_dot per (token, row), bit for bit. */
static void check_matmul_equals_dots(kl_wkind kind, uint64_t cols)
{
    static const size_t ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 64};
    uint64_t rows = 37;
    tmat m;
    tmat_init(&m, kind, rows, cols, 300 + cols);
    float *x = rand_vec(64 * (size_t)cols, 400 + cols);
    float *y = kl_malloc(64 * (size_t)rows * sizeof *y);
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
        size_t n = ns[ni];
        kl_wmat_matmul(&m.w, x, n, y, NULL);
        for (size_t t = 0; t < n; t++)
            for (uint64_t r = 0; r < rows; r++) {
                float d = kl_wmat_dot(&m.w, r, x + t * cols);
                ck_assert_msg(memcmp(&d, &y[t * rows + r], sizeof d) == 0,
                              "%s %s %llu cols, %zu tokens: token %zu row %llu: matmul %.9g vs "
                              "dot %.9g", kl_matvec_kernels_name(kl_matvec_kernels()),
                              kind_name(kind), (unsigned long long)cols, n, t,
                              (unsigned long long)r, (double)y[t * rows + r], (double)d);
            }
    }
    kl_free(x);
    kl_free(y);
    tmat_free(&m);
}

START_TEST(matmul_of_any_token_count_equals_one_dot_per_token)
{
    int sets = have_avx2() ? 2 : 1;
    for (int k = 0; k < sets; k++) {
        kl_matvec_set_kernels(k ? KL_KERNELS_AVX2 : KL_KERNELS_SCALAR);
        check_matmul_equals_dots(KL_W_F32, 45);
        check_matmul_equals_dots(KL_W_BF16, 77);
        check_matmul_equals_dots(KL_W_BF16, 256);
        /* wide tiles (>= 128 columns) with a partial last chunk in chain 1, 2 and 3 */
        check_matmul_equals_dots(KL_W_BF16, 203);
        check_matmul_equals_dots(KL_W_F32, 150);
        check_matmul_equals_dots(KL_W_BF16, 187);
        check_matmul_equals_dots(KL_W_MXFP4, 96);
    }
}
END_TEST

/* Large enough to go through the pool (more than the serial threshold). */
START_TEST(thread_count_does_not_change_any_bit)
{
    static const unsigned threads[] = {1, 2, 3, 5};
    static const kl_wkind kinds[] = {KL_W_F32, KL_W_BF16, KL_W_MXFP4};
    int sets = have_avx2() ? 2 : 1;
    uint64_t rows = 1100, cols = 512;   /* 563k multiply-adds per token: the pool runs */
    size_t n = 6;
    float *x = rand_vec(n * cols, 7);
    float *y0 = kl_malloc(n * rows * sizeof *y0), *y = kl_malloc(n * rows * sizeof *y);
    for (int k = 0; k < sets; k++) {
        kl_matvec_set_kernels(k ? KL_KERNELS_AVX2 : KL_KERNELS_SCALAR);
        for (int ki = 0; ki < 3; ki++) {
            tmat m;
            tmat_init(&m, kinds[ki], rows, cols, 11 + ki);
            kl_wmat_matmul(&m.w, x, n, y0, NULL);
            for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
                kl_pool *p;
                ck_assert(kl_pool_create(&p, threads[ti], NULL) == 0);
                kl_wmat_matmul(&m.w, x, n, y, p);
                ck_assert_msg(memcmp(y0, y, n * rows * sizeof *y) == 0,
                              "%s %s: %u threads differ from serial",
                              kl_matvec_kernels_name(kl_matvec_kernels()), kind_name(kinds[ki]),
                              threads[ti]);
                kl_wmat_matvec(&m.w, x, y, p);
                ck_assert_msg(memcmp(y0, y, rows * sizeof *y) == 0,
                              "%s %s: matvec on %u threads differs from token 0 of matmul",
                              kl_matvec_kernels_name(kl_matvec_kernels()), kind_name(kinds[ki]),
                              threads[ti]);
                kl_pool_destroy(p);
            }
            tmat_free(&m);
        }
    }
    kl_free(x);
    kl_free(y0);
    kl_free(y);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Views, vector primitives, selection                                                        */

START_TEST(row_view_reads_the_same_rows)
{
    static const kl_wkind kinds[] = {KL_W_F32, KL_W_BF16, KL_W_MXFP4};
    for (int ki = 0; ki < 3; ki++) {
        tmat m;
        tmat_init(&m, kinds[ki], 20, 64, 5);
        kl_wmat v = kl_wmat_rows(&m.w, 7, 5);
        float *x = rand_vec(64, 9);
        ck_assert_msg(v.rows == 5 && v.cols == 64, "%s view: %llu x %llu", kind_name(kinds[ki]),
                      (unsigned long long)v.rows, (unsigned long long)v.cols);
        for (uint64_t r = 0; r < 5; r++) {
            float a = kl_wmat_dot(&v, r, x), b = kl_wmat_dot(&m.w, 7 + r, x);
            ck_assert_msg(a == b, "%s view row %llu: %g vs row %llu: %g", kind_name(kinds[ki]),
                          (unsigned long long)r, (double)a, (unsigned long long)(7 + r),
                          (double)b);
        }
        uint64_t want = kinds[ki] == KL_W_F32 ? 20 * 64 * 4 : kinds[ki] == KL_W_BF16 ? 20 * 64 * 2
                                                                           : 20 * (32 + 2);
        ck_assert_msg(kl_wmat_bytes(&m.w) == want, "%s bytes: expected %llu, got %llu",
                      kind_name(kinds[ki]), (unsigned long long)want,
                      (unsigned long long)kl_wmat_bytes(&m.w));
        kl_free(x);
        tmat_free(&m);
    }
}
END_TEST

/* The four primitives on both sets, against double, over lengths with tails. */
START_TEST(vector_primitives_agree_across_kernel_sets)
{
    static const size_t ns[] = {1, 7, 8, 9, 16, 100, 128};
    int sets = have_avx2() ? 2 : 1;
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        size_t n = ns[i];
        float *a = rand_vec(n, 1 + n), *b = rand_vec(n, 2 + n);
        float out[2][4][128];
        for (int k = 0; k < sets; k++) {
            kl_matvec_set_kernels(k ? KL_KERNELS_AVX2 : KL_KERNELS_SCALAR);
            float x[128], y[128];
            out[k][0][0] = kl_vec_dot(a, b, n);
            memcpy(y, b, n * sizeof *y);
            kl_vec_axpy(y, 0.75f, a, n);
            memcpy(out[k][1], y, n * sizeof *y);
            memcpy(x, a, n * sizeof *x);
            memcpy(y, b, n * sizeof *y);
            kl_vec_scale_axpy(x, 0.5f, y, -1.25f, n);
            memcpy(out[k][2], y, n * sizeof *y);
            memcpy(x, a, n * sizeof *x);
            memcpy(y, b, n * sizeof *y);
            kl_vec_axpy_axpy(x, 0.3f, b, y, 2.0f, n);
            memcpy(out[k][3], y, n * sizeof *y);
        }
        double dot = 0, mag = 0;
        for (size_t j = 0; j < n; j++) {
            dot += (double)a[j] * b[j];
            mag += fabs((double)a[j] * b[j]);
        }
        for (int k = 0; k < sets; k++)
            ck_assert_msg(fabs(out[k][0][0] - dot) <= REL_TOL * mag, "dot n=%zu set %d: %g vs %g",
                          n, k, (double)out[k][0][0], dot);
        for (size_t j = 0; j < n; j++) {
            double want[4] = {0, b[j] + 0.75 * a[j], b[j] - 1.25 * (0.5 * a[j]),
                              b[j] + 2.0 * (a[j] + 0.3 * b[j])};
            for (int op = 1; op < 4; op++)
                for (int k = 0; k < sets; k++)
                    ck_assert_msg(fabs(out[k][op][j] - want[op]) <= 1e-5 * (1 + fabs(want[op])),
                                  "op %d n=%zu [%zu] set %d: %g vs %g", op, n, j, k,
                                  (double)out[k][op][j], want[op]);
        }
        kl_free(a);
        kl_free(b);
    }
}
END_TEST

/* One row form against the loop of one-row calls: out (and x, y) must match bit for bit. */
static void check_row_forms(size_t nr, size_t n, int set)
{
    size_t ld = n + 3;
    float *rows = rand_vec(nr * ld, 10 + nr * n), *a = rand_vec(n, 11 + n);
    float *c = rand_vec(nr, 12 + nr), *c2 = rand_vec(nr, 13 + nr), *y0 = rand_vec(n, 14 + n);
    float *x[2], *y[2], out[2][17];
    for (int k = 0; k < 2; k++) {
        x[k] = kl_malloc(nr * ld * sizeof *x[k]);
        y[k] = kl_malloc(n * sizeof *y[k]);
    }
    for (int op = 0; op < 4; op++) {
        for (int k = 0; k < 2; k++) {   /* k = 0: one call per row; k = 1: the row form */
            memcpy(x[k], rows, nr * ld * sizeof *rows);
            memcpy(y[k], y0, n * sizeof *y0);
            for (size_t r = 0; k == 0 && r < nr; r++) {
                float *xr = x[k] + r * ld;
                if (op == 0)
                    out[k][r] = kl_vec_dot(a, xr, n);
                else if (op == 1)
                    kl_vec_axpy(y[k], c[r], xr, n);
                else if (op == 2)
                    kl_vec_scale_axpy(xr, c[r], y[k], c2[r], n);
                else
                    kl_vec_axpy_axpy(xr, c[r], a, y[k], c2[r], n);
            }
            if (k == 1 && op == 0)
                kl_vec_dot_rows(a, x[k], ld, nr, n, out[k]);
            else if (k == 1 && op == 1)
                kl_vec_axpy_rows(y[k], c, x[k], ld, nr, n);
            else if (k == 1 && op == 2)
                kl_vec_scale_axpy_rows(x[k], ld, c, y[k], c2, nr, n);
            else if (k == 1)
                kl_vec_axpy_axpy_rows(x[k], ld, c, a, y[k], c2, nr, n);
        }
        int same = op == 0 ? !memcmp(out[0], out[1], nr * sizeof **out)
                           : !memcmp(y[0], y[1], n * sizeof *y[0]) &&
                                 !memcmp(x[0], x[1], nr * ld * sizeof *x[0]);
        ck_assert_msg(same, "row form %d (set %d, %zu rows of %zu): differs from one call per "
                      "row", op, set, nr, n);
    }
    for (int k = 0; k < 2; k++) {
        kl_free(x[k]);
        kl_free(y[k]);
    }
    kl_free(rows);
    kl_free(a);
    kl_free(c);
    kl_free(c2);
    kl_free(y0);
}

/* dot / axpy / scale_axpy / axpy_axpy over rows equal one call per row, on both sets, for row
 * counts around the groups (4 and 8) and lengths with tails. */
START_TEST(row_forms_equal_one_call_per_row_bit_for_bit)
{
    static const size_t ns[] = {1, 7, 8, 9, 16, 100, 128};
    static const size_t nrs[] = {1, 3, 4, 5, 8, 9, 17};
    int sets = have_avx2() ? 2 : 1;
    for (int k = 0; k < sets; k++) {
        kl_matvec_set_kernels(k ? KL_KERNELS_AVX2 : KL_KERNELS_SCALAR);
        for (size_t i = 0; i < sizeof ns / sizeof *ns; i++)
            for (size_t j = 0; j < sizeof nrs / sizeof *nrs; j++)
                check_row_forms(nrs[j], ns[i], k);
    }
    kl_matvec_set_kernels(KL_KERNELS_AUTO);
}
END_TEST

/* Activation k (0 silu, 1 silu_mul, 2 sigmoid, 3 exp_shift, 4 exp_softplus) of x in place. */
static void apply_act(int k, float *x, const float *y, size_t n)
{
    switch (k) {
    case 0: kl_vec_silu(x, n); break;
    case 1: kl_vec_silu_mul(x, y, n); break;
    case 2: kl_vec_sigmoid(x, n); break;
    case 3: kl_vec_exp_shift(x, 1.5f, n); break;
    default: kl_vec_exp_softplus(x, y, -0.75f, n); break;
    }
}

/* Every activation on AVX2 within 1e-5 relative (1e-30 absolute: saturated exp) of the scalar
 * set's libm values, over -95..95 (sigmoid's and silu's saturation, softplus' threshold at 20;
 * exp itself only where it does not saturate) and lengths with tails. */
START_TEST(activations_agree_with_libm)
{
    if (!have_avx2())
        return;
    enum { N = 1001 };
    static const size_t lens[] = {1, 7, 8, 13, N};
    float *x0 = kl_malloc(N * sizeof *x0), *y = rand_vec(N, 77);
    float *ref = kl_malloc(N * sizeof *ref), *got = kl_malloc(N * sizeof *got);
    for (size_t i = 0; i < N; i++)
        x0[i] = -95.0f + 190.0f * (float)i / (float)(N - 1);
    for (int k = 0; k < 5; k++) {
        memcpy(ref, x0, N * sizeof *ref);
        kl_matvec_set_kernels(KL_KERNELS_SCALAR);
        apply_act(k, ref, y, N);
        kl_matvec_set_kernels(KL_KERNELS_AVX2);
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
            size_t n = lens[li];
            memcpy(got, x0 + (N - n), n * sizeof *got);
            apply_act(k, got, y + (N - n), n);
            for (size_t i = 0; i < n; i++) {
                double r = ref[N - n + i], g = got[i], z = x0[N - n + i] - 1.5;
                if (k == 3 && (z > 88.0 || z < -87.3))
                    continue;   /* exp saturates there (matvec.h) */
                ck_assert_msg(fabs(g - r) <= 1e-5 * fabs(r) + 1e-30,
                              "activation %d at x=%g (n=%zu): AVX2 %.9g, libm %.9g", k,
                              (double)x0[N - n + i], n, g, r);
            }
        }
    }
    kl_matvec_set_kernels(KL_KERNELS_AUTO);
    kl_free(x0);
    kl_free(y);
    kl_free(ref);
    kl_free(got);
}
END_TEST

START_TEST(environment_variable_selects_the_scalar_kernels)
{
    setenv("KL_CPU_KERNELS", "scalar", 1);
    kl_cpu_kernels k = kl_matvec_set_kernels(KL_KERNELS_AUTO);
    ck_assert_msg(k == KL_KERNELS_SCALAR && kl_matvec_kernels() == KL_KERNELS_SCALAR,
                  "KL_CPU_KERNELS=scalar: expected scalar, got %s", kl_matvec_kernels_name(k));
    unsetenv("KL_CPU_KERNELS");
    k = kl_matvec_set_kernels(KL_KERNELS_AUTO);
    ck_assert_msg(k == (have_avx2() ? KL_KERNELS_AVX2 : KL_KERNELS_SCALAR),
                  "no KL_CPU_KERNELS: expected the best set, got %s", kl_matvec_kernels_name(k));
}
END_TEST

/* ------------------------------------------------------------------------------------------ */

static Suite *matvec_suite(void)
{
    Suite *s = suite_create("matvec");
    TCase *tc = tcase_create("kernels");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, f32_rows_of_odd_widths_agree_with_scalar);
    tcase_add_test(tc, bf16_rows_of_odd_widths_agree_with_scalar);
    tcase_add_test(tc, mxfp4_rows_of_whole_blocks_agree_with_scalar);
    tcase_add_test(tc, mxfp4_every_scale_byte_and_code_decodes_exactly);
    tcase_add_test(tc, matmul_of_any_token_count_equals_one_dot_per_token);
    tcase_add_test(tc, thread_count_does_not_change_any_bit);
    tcase_add_test(tc, row_view_reads_the_same_rows);
    tcase_add_test(tc, vector_primitives_agree_across_kernel_sets);
    tcase_add_test(tc, row_forms_equal_one_call_per_row_bit_for_bit);
    tcase_add_test(tc, activations_agree_with_libm);
    tcase_add_test(tc, environment_variable_selects_the_scalar_kernels);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(matvec_suite());
}
