/*
 * scripts/split_forms.c — host model of the tensor-core products' split forms (kernels/gemm.h):
 * how close each form comes to the exact dot product, to choose a form before writing its
 * kernel.  Rows of x (fp32, activations of scale 1e-2 .. 1e2 with rare outliers) against BF16
 * weight rows, each K step of 64 summed in fp32 and added to the running sum in fp32 (form 2):
 *   three bf16 parts: x = hi + lo + lo2, three products a weight (today's kernels);
 *   two fp16 parts:   x scaled by a power of two so its largest |x| is in [2^13, 2^14), then
 *                     hi = fp16(x), lo = fp16(x - hi); weights scaled by 2^6 into fp16's normal
 *                     range (exact: a bf16 significand fits fp16's); two products a weight;
 *   one bf16 part:    hi only (engines that compute in bf16).
 * Prints the relative L2 error of each against the dot products in double.  Build and run:
 *   cc -O2 -o /tmp/split_forms scripts/split_forms.c -lm && /tmp/split_forms [wide]
 * ("wide": weights of random magnitude over 2^-16 .. 2^-2 and outliers 1,000x in x).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K 2304
#define ROWS 256
#define TRIALS 50

static float bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16;
    memcpy(&f, &u, 4);
    return f;
}

static float fp16(float f)
{
    return (float)(_Float16)f;
}

static double uniform(void)
{
    return (rand() + 0.5) / ((double)RAND_MAX + 1);
}

static double gauss(void)
{
    return sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform());
}

static float x[K], w[ROWS][K];

/* One trial's x and weights. */
static void fill(int wide)
{
    const double scale = pow(10, -2 + 4 * uniform());
    for (int k = 0; k < K; k++)
        x[k] = (float)(gauss() * scale * (uniform() < 0.01 ? (wide ? 1000 : 30) : 1));
    for (int r = 0; r < ROWS; r++)
        for (int k = 0; k < K; k++)
            w[r][k] = bf16(wide ? (float)((uniform() < 0.5 ? -1 : 1) * pow(2, -16 + 14 * uniform()))
                                : (float)(gauss() * 0.02));
}

int main(int argc, char **argv)
{
    const int wide = argc > 1 && !strcmp(argv[1], "wide");
    double err[3] = {0, 0, 0}, norm = 0;
    srand(1);
    for (int trial = 0; trial < TRIALS; trial++) {
        fill(wide);
        float most = 0;
        for (int k = 0; k < K; k++)
            most = fabsf(x[k]) > most ? fabsf(x[k]) : most;
        int e;
        frexpf(most, &e);
        const float s = ldexpf(1.0f, 14 - e); /* largest |x s| in [2^13, 2^14) */
        for (int r = 0; r < ROWS; r++) {
            double exact = 0;
            for (int k = 0; k < K; k++)
                exact += (double)w[r][k] * x[k];
            float sum[3] = {0, 0, 0};
            for (int k0 = 0; k0 < K; k0 += 64) {
                float step[3] = {0, 0, 0};
                for (int k = k0; k < k0 + 64; k++) {
                    const float hi = bf16(x[k]), lo = bf16(x[k] - hi), lo2 = bf16(x[k] - hi - lo);
                    const float h16 = fp16(x[k] * s), l16 = fp16(x[k] * s - h16);
                    const float w16 = fp16(w[r][k] * 64.0f);
                    step[0] += w[r][k] * hi + w[r][k] * lo2 + w[r][k] * lo;
                    step[1] += w16 * h16 + w16 * l16;
                    step[2] += w[r][k] * hi;
                }
                for (int f = 0; f < 3; f++)
                    sum[f] += step[f];
            }
            const double got[3] = {sum[0], sum[1] / (s * 64.0), sum[2]};
            for (int f = 0; f < 3; f++)
                err[f] += (got[f] - exact) * (got[f] - exact);
            norm += exact * exact;
        }
    }
    printf("relative L2 against double (%s): three bf16 parts %.3g, two fp16 parts %.3g, one "
           "bf16 part %.3g\n", wide ? "wide" : "normal", sqrt(err[0] / norm),
           sqrt(err[1] / norm), sqrt(err[2] / norm));
    return 0;
}
