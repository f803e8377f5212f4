/*
 * tests/test_kda_chunk.c — the chunked form of the KDA delta rule (kernels/kda.cu's v3) in
 * plain C, float, against the token-by-token recurrence (kimi-linear.md §3.2) in double.
 *
 * Per head, in chunks of C tokens with G = the cumulative sum of g over the chunk (per key
 * channel c) and S the state before the chunk, the recurrence
 *     S_t = diag(e^{g_t}) S_{t-1} + k̂_t u_tᵀ,  u_t = β_t (v_t − (diag(e^{g_t}) S_{t-1})ᵀ k̂_t)
 * unrolls to S_t = diag(e^{G_t}) S + Σ_{s<=t} diag(e^{G_t − G_s}) k̂_s u_sᵀ, hence
 *     u_t + Σ_{s<t} A[t][s] u_s = β_t v_t − β_t Sᵀ (k̂_t ⊙ e^{G_t}),
 *     A[t][s] = β_t Σ_c k̂_tc k̂_sc e^{G_tc − G_sc},
 * so with (I + A) X = β k̂ ⊙ e^G and (I + A) Y = β v (forward substitution, rows in order):
 *     u = Y − X S,   o_t = Sᵀ (q̂_t ⊙ e^{G_t}) + Σ_{s<=t} M[t][s] u_s,
 *     M[t][s] = Σ_c q̂_tc k̂_sc e^{G_tc − G_sc},
 *     S ← diag(e^{G_last}) S + Σ_t (k̂_t ⊙ e^{G_last − G_t}) u_tᵀ.
 * Every exponent is a difference G_t − G_s with s <= t (or G itself): never positive.
 * chunk_prep / chunk_apply below are the two kernels' steps, in the same order.
 */
#include "tests/testutil.h"

#include <stdint.h>

#define C 32 /* tokens per chunk, as kda.cu's KDA_CHUNK */

/* One head's inputs after the l2 norm and the gate: q̂, k̂, g, v [n][K], β [n]. */
typedef struct {
    uint32_t n, K;
    float *q, *k, *g, *v, *beta;
} head_in;

/* One chunk's state-free products (the scratch record of kda.cu). */
typedef struct {
    float X[C][128], Y[C][128], Qg[C][128], Kg[C][128], M[C][C], dec[128];
} chunk_rec;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double urand(double lo, double hi)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return lo + (hi - lo) * (double)(rng >> 11) / (double)(1ull << 53);
}

/* > 0: token t's key is token (t % key_period)'s (repeated keys: the hardest (I + A)). */
static uint32_t key_period;

/* Random raw inputs turned into q̂, k̂, g, β as kda.h says (the gate from a_log, f, dt). */
static head_in make_head(uint32_t n, uint32_t K, double a_log, double blo, double bhi)
{
    head_in h = {n, K, malloc(sizeof(float) * n * K), malloc(sizeof(float) * n * K),
                 malloc(sizeof(float) * n * K), malloc(sizeof(float) * n * K),
                 malloc(sizeof(float) * n)};
    for (uint32_t t = 0; t < n; t++) {
        double qq = 0, kk = 0, raw_q[128], raw_k[128];
        for (uint32_t c = 0; c < K; c++) {
            raw_q[c] = urand(-1, 1), raw_k[c] = urand(-1, 1);
            qq += raw_q[c] * raw_q[c], kk += raw_k[c] * raw_k[c];
            const double z = urand(-3, 2) + urand(-1, 1);
            const double sp = z > 20 ? z : log1p(exp(z));
            h.g[t * K + c] = (float)(-exp(a_log) * sp);
            h.v[t * K + c] = (float)urand(-1, 1);
        }
        for (uint32_t c = 0; c < K; c++) {
            h.q[t * K + c] = (float)(raw_q[c] / sqrt(qq + 1e-6) / sqrt((double)K));
            h.k[t * K + c] = (float)(raw_k[c] / sqrt(kk + 1e-6));
            if (key_period && t >= key_period)
                h.k[t * K + c] = h.k[(t % key_period) * K + c];
        }
        h.beta[t] = (float)(1.0 / (1.0 + exp(-urand(blo, bhi))));
    }
    return h;
}

static void free_head(head_in *h)
{
    free(h->q), free(h->k), free(h->g), free(h->v), free(h->beta);
}

/* The recurrence, token by token, in double: o [n][K], S [K][K] updated. */
static void ref_seq(const head_in *h, double *S, double *o)
{
    const uint32_t K = h->K;
    double u[128];
    for (uint32_t t = 0; t < h->n; t++) {
        const float *q = h->q + t * K, *k = h->k + t * K, *g = h->g + t * K, *v = h->v + t * K;
        for (uint32_t i = 0; i < K; i++)
            for (uint32_t j = 0; j < K; j++)
                S[i * K + j] *= exp((double)g[i]);
        for (uint32_t j = 0; j < K; j++) {
            double a = 0;
            for (uint32_t i = 0; i < K; i++)
                a += S[i * K + j] * k[i];
            u[j] = h->beta[t] * (v[j] - a);
        }
        for (uint32_t j = 0; j < K; j++) {
            double r = 0;
            for (uint32_t i = 0; i < K; i++) {
                S[i * K + j] += k[i] * u[j];
                r += S[i * K + j] * q[i];
            }
            o[t * K + j] = r;
        }
    }
}

/* The state-free part of the chunk of L tokens from t0 (the prep kernel). */
static void chunk_prep(const head_in *h, uint32_t t0, uint32_t L, chunk_rec *r)
{
    const uint32_t K = h->K;
    static float G[C][128];
    for (uint32_t c = 0; c < K; c++) {
        float acc = 0;
        for (uint32_t t = 0; t < L; t++)
            G[t][c] = acc += h->g[(t0 + t) * K + c];
    }
    float A[C][C];
    for (uint32_t t = 0; t < L; t++)
        for (uint32_t s = 0; s < C; s++) {
            float a = 0, m = 0;
            for (uint32_t c = 0; s <= t && c < K; c++) {
                const float e = expf(G[t][c] - G[s][c]), ks = h->k[(t0 + s) * K + c];
                a += h->k[(t0 + t) * K + c] * ks * e;
                m += h->q[(t0 + t) * K + c] * ks * e;
            }
            A[t][s] = s < t ? h->beta[t0 + t] * a : 0.0f;
            r->M[t][s] = m;
        }
    for (uint32_t t = 0; t < L; t++) {
        const float b = h->beta[t0 + t];
        for (uint32_t c = 0; c < K; c++) {
            const size_t i = (size_t)(t0 + t) * K + c;
            r->X[t][c] = b * h->k[i] * expf(G[t][c]);
            r->Y[t][c] = b * h->v[i];
            r->Qg[t][c] = h->q[i] * expf(G[t][c]);
            r->Kg[t][c] = h->k[i] * expf(G[L - 1][c] - G[t][c]);
        }
    }
    for (uint32_t c = 0; c < K; c++) { /* forward substitution, a column at a time */
        r->dec[c] = expf(G[L - 1][c]);
        for (uint32_t t = 0; t < L; t++) {
            float x = r->X[t][c], y = r->Y[t][c];
            for (uint32_t s = 0; s < t; s++) {
                x -= A[t][s] * r->X[s][c];
                y -= A[t][s] * r->Y[s][c];
            }
            r->X[t][c] = x, r->Y[t][c] = y;
        }
    }
}

/* The chunk against the state (the state kernel): o rows t0.., S updated. */
static void chunk_apply(const chunk_rec *r, uint32_t K, uint32_t L, float *S, float *o)
{
    static float U[C][128];
    for (uint32_t t = 0; t < L; t++)
        for (uint32_t j = 0; j < K; j++) {
            float x = 0, y = 0;
            for (uint32_t i = 0; i < K; i++) {
                x += r->X[t][i] * S[i * K + j];
                y += r->Qg[t][i] * S[i * K + j];
            }
            U[t][j] = r->Y[t][j] - x;
            o[t * K + j] = y;
        }
    for (uint32_t t = 0; t < L; t++)
        for (uint32_t j = 0; j < K; j++) {
            float y = 0;
            for (uint32_t s = 0; s <= t; s++)
                y += r->M[t][s] * U[s][j];
            o[t * K + j] += y;
        }
    for (uint32_t i = 0; i < K; i++)
        for (uint32_t j = 0; j < K; j++) {
            float y = 0;
            for (uint32_t t = 0; t < L; t++)
                y += r->Kg[t][i] * U[t][j];
            S[i * K + j] = r->dec[i] * S[i * K + j] + y;
        }
}

/* Tokens [t0, t1) of the head in chunks from t0. */
static void chunked(const head_in *h, uint32_t t0, uint32_t t1, float *S, float *o)
{
    static chunk_rec r;
    for (uint32_t t = t0; t < t1; t += C) {
        const uint32_t L = t1 - t < C ? t1 - t : C;
        chunk_prep(h, t, L, &r);
        chunk_apply(&r, h->K, L, S, o + (size_t)t * h->K);
    }
}

static double rel_l2(const float *y, const double *ref, size_t n)
{
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++)
        e += (y[i] - ref[i]) * (y[i] - ref[i]), r += ref[i] * ref[i];
    return r > 0 ? sqrt(e / r) : sqrt(e);
}

/* n tokens, chunked as one call or as two calls split at `split` (state carried), against
 * the recurrence from the same random non-zero state; the errors of o and S. */
static void check_case(uint32_t n, uint32_t split, double a_log, double blo, double bhi,
                       double tol)
{
    const uint32_t K = 128;
    head_in h = make_head(n, K, a_log, blo, bhi);
    double *Sd = malloc(sizeof(double) * K * K), *od = malloc(sizeof(double) * n * K);
    float *S = malloc(sizeof(float) * K * K), *o = malloc(sizeof(float) * n * K);
    for (uint32_t i = 0; i < K * K; i++)
        S[i] = (float)urand(-0.5, 0.5), Sd[i] = S[i];
    ref_seq(&h, Sd, od);
    chunked(&h, 0, split, S, o);
    chunked(&h, split, n, S, o);
    const double eo = rel_l2(o, od, (size_t)n * K), es = rel_l2(S, Sd, (size_t)K * K);
    ck_assert_msg(eo < tol && es < tol, "n %u split %u a_log %.1f beta [%.0f, %.0f]: o %.2e "
                  "S %.2e (tol %.0e)", n, split, a_log, blo, bhi, eo, es, tol);
    free_head(&h);
    free(Sd), free(od), free(S), free(o);
}

START_TEST(test_chunk_vs_recurrence)
{
    /* a_log -1: weak decay (g ~ -0.3); 3: strong (g ~ -20, e^g underflows); -9: ~1e-4 */
    check_case(100, 100, -1.0, -2, 2, 5e-6);
    check_case(100, 100, 3.0, -2, 2, 5e-6);
    check_case(257, 257, -9.0, -2, 2, 5e-6);
    check_case(33, 33, -1.0, 6, 12, 5e-6);     /* β near 1 */
    check_case(64, 64, -1.0, -14, -8, 5e-6);   /* β near 0 */
    check_case(17, 17, 0.0, -2, 2, 5e-6);
    check_case(1, 1, 0.0, -2, 2, 5e-6);
}
END_TEST

START_TEST(test_chunk_split_calls)
{
    check_case(256, 128, -1.0, -2, 2, 5e-6);   /* two calls of 128 equal one of 256 */
    check_case(100, 45, -2.0, -2, 2, 5e-6);    /* a call ending mid-chunk */
}
END_TEST

START_TEST(test_chunk_repeated_keys)
{
    key_period = 1;                            /* one key, β near 1, almost no decay */
    check_case(70, 70, -9.0, 6, 12, 5e-6);
    key_period = 3;
    check_case(70, 70, -9.0, 6, 12, 5e-6);
    key_period = 0;
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("kda_chunk");
    TCase *tc = tcase_create("chunk");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_chunk_vs_recurrence);
    tcase_add_test(tc, test_chunk_split_calls);
    tcase_add_test(tc, test_chunk_repeated_keys);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return t_run_suite(suite());
}
