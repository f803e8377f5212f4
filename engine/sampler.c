/*
 * engine/sampler.c — token sampling (see sampler.h for the order of operations).
 *
 * Sections: helpers, public API.
 */
#include "engine/sampler.h"

#include "common/mem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------------------ */

/* The sorted order (sampler.h): z descending, then id ascending. */

/* 2^(j/32), j = 0..31 (exp_nonpos). */
static const double EXP2_32THS[32] = {
    0x1.0000000000000p+0, 0x1.059b0d3158574p+0, 0x1.0b5586cf9890fp+0, 0x1.11301d0125b51p+0,
    0x1.172b83c7d517bp+0, 0x1.1d4873168b9aap+0, 0x1.2387a6e756238p+0, 0x1.29e9df51fdee1p+0,
    0x1.306fe0a31b715p+0, 0x1.371a7373aa9cbp+0, 0x1.3dea64c123422p+0, 0x1.44e086061892dp+0,
    0x1.4bfdad5362a27p+0, 0x1.5342b569d4f82p+0, 0x1.5ab07dd485429p+0, 0x1.6247eb03a5585p+0,
    0x1.6a09e667f3bcdp+0, 0x1.71f75e8ec5f74p+0, 0x1.7a11473eb0187p+0, 0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0, 0x1.93737b0cdc5e5p+0, 0x1.9c49182a3f090p+0, 0x1.a5503b23e255dp+0,
    0x1.ae89f995ad3adp+0, 0x1.b7f76f2fb5e47p+0, 0x1.c199bdd85529cp+0, 0x1.cb720dcef9069p+0,
    0x1.d5818dcfba487p+0, 0x1.dfc97337b9b5fp+0, 0x1.ea4afa2a490dap+0, 0x1.f50765b6e4540p+0,
};

/* e^x for x <= 0, and 0 below -708 (where e^x would be subnormal, < 1e-307): the sampler's
 * own rather than libm's, so that every machine gets the same bits whatever its C library,
 * and short (libm's exp took ~6 ns an id: ~1 ms a token at Kimi's 163,840).  x = (k / 32) ln 2
 * + r with k = round(32 x / ln 2) (by the 1.5 * 2^52 shift, whose low bits then hold k) and
 * |r| <= ln 2 / 64 (ln 2 / 32 in two parts, the first of 37 bits, so k * LN2_HI is exact);
 * e^x = 2^(k >> 5) * 2^((k & 31) / 32) * e^r, e^r by its Taylor series to degree 5 (the next
 * term is below 3e-15 of it), 2^(k >> 5) built from its exponent bits. */
static double exp_nonpos(double x)
{
    const double INV_LN2_32 = 0x1.71547652b82fep+5, LN2_HI = 0x1.62e42fefa0000p-6,
                 LN2_LO = 0x1.cf79abc9e3b3ap-45, SHIFT = 0x1.8p52;
    const double xc = x < -708.0 ? -708.0 : x;
    const double kd = xc * INV_LN2_32 + SHIFT, k = kd - SHIFT;
    const double r = (xc - k * LN2_HI) - k * LN2_LO, r2 = r * r;
    const double e = (1.0 + r) + r2 * ((0.5 + r * (1.0 / 6.0)) +
                                       r2 * ((1.0 / 24.0) + r * (1.0 / 120.0)));
    uint64_t kb;
    memcpy(&kb, &kd, sizeof kb);
    /* kb's low 32 bits: k as a two's-complement int32 (k >= -32,704) */
    const int32_t ki = (int32_t)(uint32_t)kb;
    const uint64_t sb = (uint64_t)(int64_t)(((ki - (ki & 31)) / 32) + 1023) << 52;
    double scale;
    memcpy(&scale, &sb, sizeof scale);
    return x < -708.0 ? 0.0 : e * EXP2_32THS[ki & 31] * scale;
}

/* Work of n items in fixed pieces of SAMPLE_CHUNK on the sampler's pool (or here): each piece
 * writes only its own part, so the result never depends on the threads. */
#define SAMPLE_CHUNK 4096

/* fn(ctx, i) for i < count, on the sampler's pool when it has more than one thread. */
static void run_items(const kl_sampler *s, size_t count, void (*fn)(void *, size_t), void *ctx)
{
    if (s->pool && kl_pool_threads(s->pool) > 1 && count > 1)
        kl_pool_run(s->pool, count, fn, ctx);
    else
        for (size_t i = 0; i < count; i++)
            fn(ctx, i);
}

static void run_pieces(const kl_sampler *s, size_t n, void (*fn)(void *, size_t), void *ctx)
{
    run_items(s, (n + SAMPLE_CHUNK - 1) / SAMPLE_CHUNK, fn, ctx);
}

typedef struct weigh_job {
    const kl_sample_cand *cand;
    size_t                n;
    float                 z_max;
    double               *p;
} weigh_job;

static void weigh_piece(void *ctx, size_t c)
{
    const weigh_job *j = ctx;
    const size_t end = j->n - c * SAMPLE_CHUNK < SAMPLE_CHUNK ? j->n : (c + 1) * SAMPLE_CHUNK;
    for (size_t i = c * SAMPLE_CHUNK; i < end; i++)
        j->p[i] = exp_nonpos((double)j->cand[i].z - (double)j->z_max);
}

/* s->p[i] = e^(z_i - z_max) of cand[0..n); returns their sum in their order. */
static double weigh(const kl_sampler *s, const kl_sample_cand *cand, size_t n, float z_max)
{
    weigh_job j = {cand, n, z_max, s->p};
    run_pieces(s, n, weigh_piece, &j);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += s->p[i];
    return sum;
}

/* z's bits as a key that ascends with z (-0 read as +0: the sorted order calls them equal). */
static uint32_t z_key(float z)
{
    uint32_t b;
    z += 0.0f;
    memcpy(&b, &z, sizeof b);
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}

/* Buckets of z in its order (the key's top 12 bits): a histogram finds where the first k
 * candidates, or the first mass, of the sorted order end without sorting all. */
#define SAMPLE_BUCKETS 4096
#define RADIX_BITS     11

static uint32_t bucket_of(float z)
{
    return z_key(z) >> 20;
}

/* One pass of the radix sort over parts of the range: each part counts its digits, then
 * (after the counts become each (digit, part)'s first place) scatters its items in order. */
#define RADIX_SIZE  (1u << RADIX_BITS)
#define RADIX_PARTS 16u         /* at most (the sampler's radix scratch: parts x RADIX_SIZE) */
#define RADIX_SMALL 16384       /* fewer items: one part */

typedef struct radix_job {
    const kl_sample_cand *src;
    kl_sample_cand       *dst;
    size_t                m;
    unsigned              parts, shift;
    uint32_t             *count;   /* [parts][RADIX_SIZE] */
} radix_job;

static uint32_t radix_digit(const radix_job *j, size_t i)
{
    return (~z_key(j->src[i].z) >> j->shift) & (RADIX_SIZE - 1);   /* descending */
}

static void radix_bounds(const radix_job *j, size_t part, size_t *lo, size_t *hi)
{
    *lo = j->m * part / j->parts;
    *hi = j->m * (part + 1) / j->parts;
}

static void radix_count(void *ctx, size_t part)
{
    const radix_job *j = ctx;
    uint32_t *count = j->count + part * RADIX_SIZE;
    size_t lo, hi;
    radix_bounds(j, part, &lo, &hi);
    memset(count, 0, RADIX_SIZE * sizeof *count);
    for (size_t i = lo; i < hi; i++)
        count[radix_digit(j, i)]++;
}

static void radix_scatter(void *ctx, size_t part)
{
    const radix_job *j = ctx;
    uint32_t *at = j->count + part * RADIX_SIZE;
    size_t lo, hi;
    radix_bounds(j, part, &lo, &hi);
    for (size_t i = lo; i < hi; i++)
        j->dst[at[radix_digit(j, i)]++] = j->src[i];
}

/* A pass's counts into first places: digit by digit, part by part (so the order stays stable
 * whatever the parts). */
static void radix_places(const radix_job *j)
{
    uint32_t at = 0;
    for (uint32_t d = 0; d < RADIX_SIZE; d++)
        for (unsigned part = 0; part < j->parts; part++) {
            const uint32_t k = j->count[part * RADIX_SIZE + d];
            j->count[part * RADIX_SIZE + d] = at;
            at += k;
        }
}

/* The candidates of cand[0..n) (in id order) whose bucket is c or above, into s->sorted in
 * the sorted order, their p into s->p (from s->p_id when by_id, else made); returns how many.
 * A stable LSD radix sort by z's key (3 passes of 11 bits, descending), so equal z stay in id
 * order: O(m), where qsort of a large nucleus took ~25 ms.  Large sorts run in parts on the
 * pool, a part a thread: a stable sort's result is unique, so the parts never change it. */
static size_t sort_from_bucket(kl_sampler *s, size_t n, uint32_t c, float z_max, int by_id)
{
    kl_sample_cand *src = s->tmp, *dst = s->sorted;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (bucket_of(s->cand[i].z) >= c)
            src[m++] = s->cand[i];
    const unsigned threads = s->pool ? kl_pool_threads(s->pool) : 1;
    const unsigned parts = m < RADIX_SMALL ? 1 : threads < RADIX_PARTS ? threads : RADIX_PARTS;
    for (unsigned shift = 0; shift < 32; shift += RADIX_BITS) {
        radix_job j = {src, dst, m, parts, shift, s->radix};
        run_items(s, parts, radix_count, &j);
        radix_places(&j);
        run_items(s, parts, radix_scatter, &j);
        kl_sample_cand *t = src;
        src = dst;
        dst = t;
    }
    if (src != s->sorted)
        memcpy(s->sorted, src, m * sizeof *src);
    if (by_id)   /* the candidates' p, already made: the same bits as weighing again */
        for (size_t i = 0; i < m; i++)
            s->p[i] = s->p_id[s->sorted[i].id];
    else
        weigh(s, s->sorted, m, z_max);
    return m;
}

/* The first k candidates of the sorted order into s->sorted (and their p). */
static void sort_top_k(kl_sampler *s, size_t n, size_t k, float z_max)
{
    uint32_t *count = s->hist;
    memset(count, 0, SAMPLE_BUCKETS * sizeof *count);
    for (size_t i = 0; i < n; i++)
        count[bucket_of(s->cand[i].z)]++;
    uint32_t c = SAMPLE_BUCKETS - 1;
    for (size_t seen = count[c]; seen < k && c > 0;)
        seen += count[--c];
    sort_from_bucket(s, n, c, z_max, 0);
}

/* The nucleus: the shortest prefix of the sorted order whose running sum of p (in that order)
 * reaches need, sorted at the front of cand; returns its length and its sum in *kept.  The
 * buckets' masses (summed in another order) pick which candidates to sort, with a margin of
 * 1e-9 of total for their rounding; should the sorted ones still fall short, all are sorted.
 * The candidates' p: by id in s->p_id when by_id, else by position in s->p. */
static size_t sort_nucleus(kl_sampler *s, size_t n, double need, double total, float z_max,
                           int by_id, double *kept)
{
    double *mass = s->mass;
    memset(mass, 0, SAMPLE_BUCKETS * sizeof *mass);
    for (size_t i = 0; i < n; i++)
        mass[bucket_of(s->cand[i].z)] += by_id ? s->p_id[s->cand[i].id] : s->p[i];
    uint32_t c = SAMPLE_BUCKETS - 1;
    for (double acc = mass[c]; acc < need + 1e-9 * total && c > 0;)
        acc += mass[--c];
    for (int pass = 0; pass < 2; pass++, c = 0) {
        size_t m = sort_from_bucket(s, n, c, z_max, by_id);
        double acc = 0;
        for (size_t i = 0; i < m; i++) {
            acc += s->p[i];
            if (acc >= need) {
                *kept = acc;
                return i + 1;
            }
        }
        *kept = acc;
        if (m == n)
            return n;
    }
    return n;
}

/* The plain distribution (temperature, maybe min-p; no top-k or top-p): p per id in chunks of
 * SAMPLE_CHUNK ids, each chunk's sum in id order, on the sampler's pool when it has one (the
 * chunks are fixed, so the sums and the pick do not depend on the threads). */

typedef struct plain_job {
    kl_sampler  *s;
    const float *logits;
    float        z_max;
} plain_job;

/* Chunk c: p[i] = e^(z_i - z_max), 0 for a NaN logit or one under min-p; its sum. */
static void weigh_chunk(void *ctx, size_t c)
{
    const plain_job *j = ctx;
    const kl_sampler *s = j->s;
    const uint32_t i0 = (uint32_t)c * SAMPLE_CHUNK;
    const uint32_t i1 = s->n_vocab - i0 < SAMPLE_CHUNK ? s->n_vocab : i0 + SAMPLE_CHUNK;
    const float t = s->opts.temperature;
    const double thr = (double)s->opts.min_p;
    double sum = 0;
    for (uint32_t i = i0; i < i1; i++) {
        const float l = j->logits[i];
        double p = isnan(l) ? 0.0 : exp_nonpos((double)(l / t) - (double)j->z_max);
        p = p >= thr ? p : 0.0;
        s->p[i] = p;
        sum += p;
    }
    s->chunk_sum[c] = sum;
}

/* The id at u of the plain distribution: the cumulative sum walked chunk by chunk (before
 * chunk c: its predecessors' sums in order; inside it: its own p in id order); rounding that
 * leaves u past every chunk takes the last id with p > 0. */
static kl_token pick_plain(kl_sampler *s, const float *logits, float z_max, double u)
{
    const size_t chunks = (s->n_vocab + SAMPLE_CHUNK - 1) / SAMPLE_CHUNK;
    plain_job job = {s, logits, z_max};
    run_pieces(s, s->n_vocab, weigh_chunk, &job);
    double total = 0;
    for (size_t c = 0; c < chunks; c++)
        total += s->chunk_sum[c];
    const double target = u * total;
    double before = 0;
    for (size_t c = 0; c < chunks; c++) {
        const double t = target - before;
        if (t < s->chunk_sum[c]) {
            const uint32_t i0 = (uint32_t)c * SAMPLE_CHUNK;
            double acc = 0;
            for (uint32_t i = i0; i < s->n_vocab && i < i0 + SAMPLE_CHUNK; i++) {
                acc += s->p[i];
                if (t < acc)
                    return i;
            }
        }
        before += s->chunk_sum[c];
    }
    kl_token last = 0;
    for (uint32_t i = 0; i < s->n_vocab; i++)
        last = s->p[i] > 0 ? i : last;
    return last;
}

/* ---- public API --------------------------------------------------------------------------- */

int kl_sampler_init(kl_sampler *s, uint32_t n_vocab, const kl_sampler_opts *o, kl_err *err)
{
    memset(s, 0, sizeof *s);
    kl_sampler_opts opts = {0};
    if (o)
        opts = *o;
    if (opts.top_p == 0)
        opts.top_p = 1;
    if (n_vocab == 0)
        return kl_fail(err, KL_E_USAGE, "sampler needs a vocabulary of at least one id");
    if (!isfinite(opts.temperature) || opts.temperature < 0)
        return kl_fail(err, KL_E_USAGE, "temperature %g: want a finite value >= 0",
                       (double)opts.temperature);
    if (!(opts.top_p > 0 && opts.top_p <= 1))
        return kl_fail(err, KL_E_USAGE, "top-p %g: want a value in (0, 1]", (double)opts.top_p);
    if (!(opts.min_p >= 0 && opts.min_p <= 1))
        return kl_fail(err, KL_E_USAGE, "min-p %g: want a value in [0, 1]", (double)opts.min_p);
    s->cand = kl_calloc(n_vocab, sizeof *s->cand);
    s->p = kl_calloc(n_vocab, sizeof *s->p);
    s->p_id = kl_calloc(n_vocab, sizeof *s->p_id);
    s->sorted = kl_calloc(n_vocab, sizeof *s->sorted);
    s->tmp = kl_calloc(n_vocab, sizeof *s->tmp);
    s->hist = kl_calloc(SAMPLE_BUCKETS, sizeof *s->hist);
    s->chunk_sum = kl_calloc((n_vocab + SAMPLE_CHUNK - 1) / SAMPLE_CHUNK, sizeof *s->chunk_sum);
    s->mass = kl_calloc(SAMPLE_BUCKETS, sizeof *s->mass);
    s->chunk_n = kl_calloc((n_vocab + SAMPLE_CHUNK - 1) / SAMPLE_CHUNK, sizeof *s->chunk_n);
    s->radix = kl_calloc((size_t)RADIX_PARTS * RADIX_SIZE, sizeof *s->radix);
    if (!s->cand || !s->sorted || !s->tmp || !s->p || !s->p_id || !s->hist || !s->mass ||
        !s->chunk_sum ||
        !s->chunk_n || !s->radix) {
        kl_sampler_free(s);
        return kl_fail(err, KL_E_NOMEM, "sampler scratch for %u ids", (unsigned)n_vocab);
    }
    s->opts = opts;
    s->n_vocab = n_vocab;
    kl_rng_seed(&s->rng, opts.seed, 0);
    return 0;
}

kl_token kl_sample_argmax(const float *logits, uint32_t n)
{
    kl_token best = 0;
    int found = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (isnan(logits[i]))
            continue;
        if (!found || logits[i] > logits[best]) {
            best = i;
            found = 1;
        }
    }
    return best;
}

typedef struct cand_job {
    kl_sampler  *s;
    const float *logits;
    float        z_max;
    int          weigh;
} cand_job;

/* Chunk c of the vocabulary: its ids with a logit (not NaN) as candidates from the chunk's own
 * start in cand (and their p when weighing); their count in chunk_n[c]. */
static void cand_chunk(void *ctx, size_t c)
{
    const cand_job *j = ctx;
    kl_sampler *s = j->s;
    const uint32_t i0 = (uint32_t)c * SAMPLE_CHUNK;
    const uint32_t i1 = s->n_vocab - i0 < SAMPLE_CHUNK ? s->n_vocab : i0 + SAMPLE_CHUNK;
    const float t = s->opts.temperature;
    uint32_t k = i0;
    for (uint32_t i = i0; i < i1; i++) {
        if (isnan(j->logits[i]))
            continue;
        const float z = j->logits[i] / t;
        s->cand[k] = (kl_sample_cand){z, i};
        if (j->weigh)
            s->p_id[i] = exp_nonpos((double)z - (double)j->z_max);
        k++;
    }
    s->chunk_n[c] = k - i0;
}

/* The candidates in id order at the front of cand (and their p in s->p_id when weigh), made by
 * chunks on the pool and then moved together; returns how many. */
static size_t candidates(kl_sampler *s, const float *logits, float z_max, int weigh)
{
    cand_job j = {s, logits, z_max, weigh};
    run_pieces(s, s->n_vocab, cand_chunk, &j);
    size_t n = 0;
    for (size_t c = 0; c * SAMPLE_CHUNK < s->n_vocab; c++) {
        const size_t i0 = c * SAMPLE_CHUNK, k = s->chunk_n[c];
        if (n != i0)
            memmove(s->cand + n, s->cand + i0, k * sizeof *s->cand);
        n += k;
    }
    return n;
}

/* kl_sampler_pick once best, the argmax of a row with a non-NaN logit, is known: each pass
 * over the vocabulary does all it can (candidates, their p and its sum in one), since the
 * passes, not the arithmetic, are what a pick costs (~1-2 ms a token at 163,840 ids). */
static int pick_from(kl_sampler *s, const float *logits, kl_token best, double u, kl_token *id)
{
    const kl_sampler_opts *o = &s->opts;
    const uint32_t n_vocab = s->n_vocab;
    /* 1. greedy; a +inf or all -inf maximum leaves no distribution to sample either */
    if (o->temperature == 0 || o->top_k == 1 || !isfinite(logits[best])) {
        *id = best;
        return 0;
    }
    const float z_max = logits[best] / o->temperature;
    if (!isfinite(z_max)) { /* a tiny temperature overflowed: the limit is greedy */
        *id = best;
        return 0;
    }
    if (o->top_p >= 1 && (o->top_k == 0 || o->top_k >= n_vocab)) {
        *id = pick_plain(s, logits, z_max, u);
        return 0;
    }
    /* 1-2. temperature-scaled candidates in id order, with their p and its sum (in id order)
     * but for a top-k (its own k only) */
    kl_sample_cand *c = s->cand;   /* the candidates in their order */
    double *p = s->p, total = 0;
    size_t n = candidates(s, logits, z_max, o->top_k == 0);
    for (size_t i = 0; o->top_k == 0 && i < n; i++)
        total += s->p_id[c[i].id];
    /* 3. top-k: its k candidates sorted (their sum in that order); else all, in id order */
    const int sorted = o->top_k > 0 && o->top_k < n;
    if (sorted) {
        sort_top_k(s, n, o->top_k, z_max);
        n = o->top_k;
        c = s->sorted;
    }
    if (o->top_k > 0)
        total = weigh(s, c, n, z_max);
    /* 4. top-p: the shortest sorted prefix of mass >= top_p */
    if (o->top_p < 1) {
        double need = (double)o->top_p * total, acc = 0;
        if (sorted) {
            size_t keep = 0;
            while (keep < n) {
                acc += p[keep++];
                if (acc >= need)
                    break;
            }
            n = keep;
        } else {
            n = sort_nucleus(s, n, need, total, z_max, o->top_k == 0, &acc);
            c = s->sorted;
        }
        total = acc;
    }
    /* 5. min-p: p_max = exp(0) = 1 unnormalised (the argmax is always kept) */
    if (o->min_p > 0) {
        double thr = (double)o->min_p, kept = 0;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (p[i] >= thr) {
                c[k] = c[i];
                p[k++] = p[i];
                kept += p[i];
            }
        }
        n = k;
        total = kept;
    }
    /* 6. sample by the cumulative sum; the last candidate absorbs rounding */
    double target = u * total, acc = 0;
    for (size_t i = 0; i < n; i++) {
        acc += p[i];
        if (target < acc) {
            *id = c[i].id;
            return 0;
        }
    }
    *id = c[n - 1].id;
    return 0;
}

int kl_sampler_pick(kl_sampler *s, const float *logits, double u, kl_token *id, kl_err *err)
{
    size_t n = 0;
    for (uint32_t i = 0; i < s->n_vocab; i++)
        n += !isnan(logits[i]);
    if (n == 0)
        return kl_fail(err, KL_E_USAGE, "every one of the %u logits is NaN",
                       (unsigned)s->n_vocab);
    return pick_from(s, logits, kl_sample_argmax(logits, s->n_vocab), u, id);
}

int kl_sampler_sample(kl_sampler *s, const float *logits, kl_token *id, kl_err *err)
{
    double u = kl_rng_uniform(&s->rng);
    return kl_sampler_pick(s, logits, u, id, err);
}

int kl_sampler_sample_best(kl_sampler *s, const float *logits, kl_token best, kl_token *id,
                           kl_err *err)
{
    if (!logits && !kl_sampler_greedy(s))
        return kl_fail(err, KL_E_USAGE, "sampling needs the logits (only a greedy pick goes "
                       "by the argmax alone)");
    if (!logits && best >= s->n_vocab)
        return kl_fail(err, KL_E_USAGE, "argmax %u outside the vocabulary (%u)", (unsigned)best,
                       (unsigned)s->n_vocab);
    /* a non-NaN logit at the argmax: not every logit is NaN (else kl_sampler_sample's error) */
    if (best < s->n_vocab && (!logits || !isnan(logits[best]))) {
        const double u = kl_rng_uniform(&s->rng);   /* one draw per call, as kl_sampler_sample */
        if (kl_sampler_greedy(s)) {
            *id = best;
            return 0;
        }
        return pick_from(s, logits, best, u, id);
    }
    return kl_sampler_sample(s, logits, id, err);
}

void kl_sampler_set_pool(kl_sampler *s, kl_pool *pool)
{
    s->pool = pool;
}

int kl_sampler_greedy(const kl_sampler *s)
{
    return s->opts.temperature == 0 || s->opts.top_k == 1;
}

void kl_sampler_free(kl_sampler *s)
{
    kl_free(s->cand);
    kl_free(s->p);
    kl_free(s->p_id);
    s->p_id = NULL;
    kl_free(s->sorted);
    kl_free(s->tmp);
    kl_free(s->hist);
    kl_free(s->chunk_sum);
    kl_free(s->mass);
    kl_free(s->chunk_n);
    kl_free(s->radix);
    s->chunk_n = NULL;
    s->radix = NULL;
    s->cand = NULL;
    s->p = NULL;
    s->sorted = NULL;
    s->tmp = NULL;
    s->hist = NULL;
    s->chunk_sum = NULL;
    s->mass = NULL;
    s->n_vocab = 0;
}
