/* synth/synth.c — synthetic checkpoints (see synth.h). */
#include "synth/synth.h"

#include "common/clock.h"
#include "common/cpu.h"
#include "common/fs.h"
#include "common/mem.h"
#include "common/numfmt.h"
#include "common/rng.h"
#include "convert/layout.h"
#include "convert/mxfp4.h"
#include "convert/out_plan.h"
#include "convert/st_writer.h"
#include "loader/schema.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "synth stores BF16/F32 values in host order: little-endian hosts only"
#endif

/* ---- constants ---- */

#define WIN_BYTES ((size_t)4 << 20)        /* one task: an aligned 4 MiB window of a shard */
#define UNIT_BYTES ((size_t)64 << 10)      /* one RNG stream: 64 KiB of a plain tensor */
#define MX_GROUP ((uint32_t)KL_MXFP4_BLOCK) /* MXFP4 elements per scale */
#define MX_UNIT_GROUPS 4096u                /* one RNG stream: 4096 MXFP4 groups (64 KiB of
                                               weight_packed, 4 KiB of weight_scale) */
#define BTAB_MIN_NUMEL ((uint64_t)1 << 16)  /* tensors this large use a per-thread bf16 table */
#define NTAB_BITS 16
#define NTAB_SIZE (1u << NTAB_BITS)
#define MX_POOL_SIZE 65536u                 /* quantized Gaussian blocks per sigma */
#define MX_POOL_STREAM 0x6d78667034706f6full /* "mxfp4poo" */
#define MAX_THREADS 64u
#define PROGRESS_PERIOD_S 0.1

typedef struct preset {
    const char *name;
    uint32_t vocab, hidden, inter, moe_inter, layers, heads, kv_lora, rope, nope, v_head;
    uint32_t experts, top_k, kda_head_dim, kda_heads;
    uint64_t shard_bytes;
} preset;

/* tiny and small: exactly ../shared/ref/kimi_ref.py's PRESETS; full: kl_config_default_48b. */
static const preset presets[] = {
    {"tiny", 1024, 64, 96, 32, 4, 4, 16, 8, 16, 16, 8, 2, 16, 4, 256u << 10},
    {"small", 4096, 256, 512, 64, 8, 4, 512, 64, 128, 128, 32, 4, 128, 2, 4u << 20},
    {"full", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5000000000ull},
};

/* ---- standard normal table: inverse CDF at the midpoints of 65,536 equal-probability bins ---- */

static float ntab[NTAB_SIZE];
static pthread_once_t ntab_once = PTHREAD_ONCE_INIT;

/* Acklam's rational approximation, refined by one Halley step on erfc. */
static double inv_norm_cdf(double p)
{
    static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                               -2.759285104469687e+02, 1.383577518672690e+02,
                               -3.066479806614716e+01, 2.506628277459239e+00};
    static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                               -1.556989798598866e+02, 6.680131188771972e+01,
                               -1.328068155288572e+01};
    static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                               -2.400758277161838e+00, -2.549732539343734e+00,
                               4.374664141464968e+00, 2.938163982698783e+00};
    static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                               2.445134137142996e+00, 3.754408661907416e+00};
    double x, q, r;
    if (p < 0.02425) {
        q = sqrt(-2 * log(p));
        x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
    } else if (p > 1 - 0.02425) {
        q = sqrt(-2 * log(1 - p));
        x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
    } else {
        q = p - 0.5;
        r = q * q;
        x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
            (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
    }
    double e = 0.5 * erfc(-x / sqrt(2)) - p;
    double u = e * sqrt(2 * M_PI) * exp(x * x / 2);
    return x - u / (1 + x * u / 2);
}

static void ntab_init(void)
{
    for (uint32_t i = 0; i < NTAB_SIZE / 2; i++) {
        float v = (float)inv_norm_cdf(((double)i + 0.5) / NTAB_SIZE);
        ntab[i] = v;                    /* exactly symmetric: mean 0 */
        ntab[NTAB_SIZE - 1 - i] = -v;
    }
}

/* ---- value distributions ---- */

typedef enum dist_kind { DIST_NORMAL, DIST_A_LOG, DIST_DT_BIAS, DIST_MX } dist_kind;

typedef struct dist {
    dist_kind kind;
    float     mean, std;       /* DIST_NORMAL; std also for DIST_MX */
} dist;

static dist dist_for(const kl_schema_entry *e)
{
    dist d = {DIST_NORMAL, 0.0f, 1.0f};
    uint64_t last = e->rank > 0 ? e->shape[e->rank - 1] : 1;
    if (e->part != KL_PART_WEIGHT) {
        /* MXFP4: the logical input width is 2 x the packed last dimension */
        uint64_t in = e->part == KL_PART_PACKED ? last * 2 : last * MX_GROUP;
        d.kind = DIST_MX;
        d.std = (float)(1.0 / sqrt((double)(in ? in : 1)));
        return d;
    }
    switch (e->role) {
    case KL_ROLE_EMBED:
        break;
    case KL_ROLE_FINAL_NORM: case KL_ROLE_INPUT_NORM: case KL_ROLE_POST_ATTN_NORM:
    case KL_ROLE_KDA_O_NORM: case KL_ROLE_MLA_KV_A_NORM:
        d.mean = 1.0f;
        d.std = 0.1f;
        break;
    case KL_ROLE_KDA_A_LOG:
        d.kind = DIST_A_LOG;
        break;
    case KL_ROLE_KDA_DT_BIAS:
        d.kind = DIST_DT_BIAS;
        break;
    case KL_ROLE_ROUTER_BIAS:
        d.std = 0.01f;
        break;
    default:
        d.std = (float)(1.0 / sqrt((double)(last ? last : 1)));
        break;
    }
    return d;
}

/* ---- MXFP4 pools: 65,536 blocks of 32 genuinely quantized N(0, m^2) values ---- */

typedef struct mx_pool {
    float   m;                          /* sigma / 2^k, in [1, 2) */
    uint8_t (*codes)[16];               /* [MX_POOL_SIZE][16] E2M1 codes, low nibble first */
    int8_t  *e0;                        /* [MX_POOL_SIZE] block exponent: value = E2M1 * 2^e0 */
} mx_pool;

/* Gives the elements of a quantized block that coded to zero the sign of their value (code 8,
 * -0), as synth's pools always had: the quantizer never writes -0, and without this the
 * synthesized files would change.  The values are the same (-0 == 0). */
static void keep_zero_signs(uint8_t *codes, const float *x)
{
    for (uint32_t j = 0; j < MX_GROUP; j++) {
        unsigned shift = 4 * (j & 1);
        if (!((codes[j / 2] >> shift) & 7) && signbit(x[j]))
            codes[j / 2] |= (uint8_t)(KL_E2M1_SIGN << shift);
    }
}

static int mx_pool_build(mx_pool *p, float m, kl_err *err)
{
    p->m = m;
    p->codes = kl_malloc(MX_POOL_SIZE * sizeof *p->codes);
    p->e0 = kl_malloc(MX_POOL_SIZE);
    if (!p->codes || !p->e0)
        return kl_fail(err, KL_E_NOMEM, "out of memory for an MXFP4 value pool");
    uint32_t mbits;
    memcpy(&mbits, &m, sizeof mbits);
    kl_rng r;
    kl_rng_seed(&r, MX_POOL_STREAM, mbits);
    for (uint32_t i = 0; i < MX_POOL_SIZE; i++) {
        float x[MX_GROUP];
        for (uint32_t j = 0; j < MX_GROUP; j += 4) {
            uint64_t bits = kl_rng_next(&r);
            for (uint32_t k = 0; k < 4; k++)
                x[j + k] = ntab[(bits >> (16 * k)) & 0xffff] * m;
        }
        /* OCP MX: shared exponent = floor(log2(amax)) - emax(E2M1) = ... - 2 */
        uint8_t scale;
        int rc = kl_mxfp4_quantize_row_f32(x, MX_GROUP, KL_SCALE_OCP, p->codes[i], &scale, NULL,
                                           err);
        if (rc)
            return rc;
        p->e0[i] = (int8_t)(scale - KL_E8M0_BIAS);
        keep_zero_signs(p->codes[i], x);
    }
    return 0;
}

static void mx_pool_free(mx_pool *p)
{
    kl_free(p->codes);
    kl_free(p->e0);
    memset(p, 0, sizeof *p);
}

/* Splits sigma = m * 2^k with m in [1, 2). */
static float split_sigma(float sigma, int *k)
{
    int ex;
    float f = frexpf(sigma, &ex);
    *k = ex - 1;
    return f * 2.0f;
}

/* sign_mask[v]: 4 bytes whose nibble sign bits (3 and 7) are the 8 bits of v, two per byte. */
static uint32_t sign_mask[256];
static pthread_once_t sign_once = PTHREAD_ONCE_INIT;

static void sign_init(void)
{
    for (uint32_t v = 0; v < 256; v++) {
        uint32_t m = 0;
        for (uint32_t j = 0; j < 4; j++)
            m |= ((v >> (2 * j)) & 1) * KL_E2M1_SIGN << (8 * j) |
                 ((v >> (2 * j + 1)) & 1) * KL_E2M1_SIGN << (8 * j + 4);
        sign_mask[v] = m;
    }
}

/* ---- the plan: which tensors go to which shard, in which order ---- */

typedef struct shard_plan {
    size_t          first, count;      /* range of ctx.order (and ctx.begin) */
    uint64_t        tensor_bytes;
    uint64_t        file_bytes;        /* known once opened */
    char            name[64];
    char            path[4096];
    kl_st_writer    w;
    int             opened, open_failed, committed;
    atomic_size_t   remaining;         /* windows not yet written */
    pthread_mutex_t lock;
} shard_plan;

typedef struct task {
    uint32_t shard;
    uint64_t off;                      /* window start in the shard's data section */
} task;

typedef struct synth_ctx {
    const kl_synth_opts *o;
    kl_config            cfg;
    kl_schema            schema;
    kl_layout            layout;       /* file order and shard cuts */
    const size_t        *order;        /* [schema.n] schema indices in file order (layout) */
    uint64_t            *bytes;        /* [schema.n] payload bytes per schema entry */
    int32_t             *partner;      /* [schema.n] schema index keying the RNG stream */
    const uint64_t      *begin;        /* [schema.n] by file position: offset in its shard */
    shard_plan          *shards;
    size_t               n_shards;
    task                *tasks;
    size_t               n_tasks;
    mx_pool              pools[16];
    size_t               n_pools;
    uint64_t             seed;
    int                  direct;       /* O_DIRECT shard writes */
    int                  wrote_small;  /* tokenizer/config/index may exist: remove on failure */
    int                  shard_locks;  /* shards[].lock initialized */

    atomic_size_t        next_task;
    atomic_uint_fast64_t done_bytes;
    atomic_int           stop;
    pthread_mutex_t      mu;           /* err, finished */
    pthread_cond_t       cv;
    unsigned             finished;
    kl_err              *err;
    int                  rc;
} synth_ctx;

/* Lists tensors in file order and cuts them into shards (convert/layout.h). */
static int plan_shards(synth_ctx *c, uint64_t shard_bytes, kl_err *err)
{
    int rc = kl_layout_plan(&c->layout, &c->schema, c->bytes, shard_bytes, err);
    if (rc)
        return rc;
    c->order = c->layout.order;
    c->begin = c->layout.begin;
    c->shards = kl_calloc(c->layout.n_shards ? c->layout.n_shards : 1, sizeof *c->shards);
    if (!c->shards)
        return kl_fail(err, KL_E_NOMEM, "out of memory planning shards");
    c->n_shards = c->layout.n_shards;
    for (size_t k = 0; k < c->n_shards; k++) {
        shard_plan *sh = &c->shards[k];
        const kl_layout_shard *ls = &c->layout.shards[k];
        sh->first = ls->first;
        sh->count = ls->count;
        sh->tensor_bytes = ls->tensor_bytes;
        snprintf(sh->name, sizeof sh->name, "%s", ls->name);
        if (kl_path_join(sh->path, sizeof sh->path, c->o->out_dir, sh->name, err))
            return KL_E_USAGE;
    }
    for (size_t k = 0; k < c->n_shards; k++)
        pthread_mutex_init(&c->shards[k].lock, NULL);
    c->shard_locks = 1;
    return 0;
}

/* Tasks: the 4 MiB windows of every shard's data section (at least one per shard). */
static int plan_tasks(synth_ctx *c, kl_err *err)
{
    size_t n = 0;
    for (size_t k = 0; k < c->n_shards; k++) {
        uint64_t w = (c->shards[k].tensor_bytes + WIN_BYTES - 1) / WIN_BYTES;
        n += w ? w : 1;
    }
    c->tasks = kl_malloc((n ? n : 1) * sizeof *c->tasks);
    if (!c->tasks)
        return kl_fail(err, KL_E_NOMEM, "out of memory for %zu tasks", n);
    c->n_tasks = 0;
    for (size_t k = 0; k < c->n_shards; k++) {
        uint64_t w = (c->shards[k].tensor_bytes + WIN_BYTES - 1) / WIN_BYTES;
        w = w ? w : 1;
        for (uint64_t i = 0; i < w; i++)
            c->tasks[c->n_tasks++] = (task){(uint32_t)k, i * WIN_BYTES};
        atomic_init(&c->shards[k].remaining, (size_t)w);
    }
    return 0;
}

/* Validates dtypes, computes sizes, pairs each weight_scale with its weight_packed, and builds
 * one MXFP4 pool per distinct sigma. */
static int plan_values(synth_ctx *c, kl_err *err)
{
    const kl_schema *s = &c->schema;
    for (size_t i = 0; i < s->n; i++) {
        const kl_schema_entry *e = &s->entries[i];
        kl_dtype dt = e->synth_dtype;
        int ok = e->part == KL_PART_WEIGHT ? (dt == KL_DT_BF16 || dt == KL_DT_F32)
                                           : (dt == KL_DT_U8 || dt == KL_DT_F8_E8M0);
        if (!ok) {
            kl_fail(err, KL_E_UNSUPPORTED, "synth cannot write dtype %s", kl_dtype_name(dt));
            kl_err_context(err, NULL, e->name, KL_NO_OFFSET, NULL);
            return KL_E_UNSUPPORTED;
        }
        c->bytes[i] = e->numel * (kl_dtype_bits(dt) / 8);
        c->partner[i] = (int32_t)i;
        if (e->part == KL_PART_SCALE) {
            char name[512];
            size_t len = strlen(e->name), suf = strlen("weight_scale");
            if (len < suf || len - suf + strlen("weight_packed") >= sizeof name)
                return kl_fail(err, KL_E_BUG, "scale tensor %s has an unexpected name", e->name);
            snprintf(name, sizeof name, "%.*sweight_packed", (int)(len - suf), e->name);
            const kl_schema_entry *p = kl_schema_find(s, name);
            if (!p || p->part != KL_PART_PACKED || p->numel * 2 != e->numel * MX_GROUP)
                return kl_fail(err, KL_E_BUG, "no weight_packed matching %s", e->name);
            c->partner[i] = (int32_t)(p - s->entries);
        }
        if (e->part != KL_PART_WEIGHT) {
            int k;
            float m = split_sigma(dist_for(e).std, &k);
            size_t j = 0;
            while (j < c->n_pools && c->pools[j].m != m)
                j++;
            if (j == c->n_pools) {
                if (j == sizeof c->pools / sizeof c->pools[0])
                    return kl_fail(err, KL_E_UNSUPPORTED, "too many distinct expert widths");
                int rc = mx_pool_build(&c->pools[c->n_pools++], m, err);
                if (rc)
                    return rc;
            }
        }
    }
    return 0;
}

/* ---- generation: any byte range of a tensor, from fixed 64 KiB RNG units ---- */

typedef struct worker {
    synth_ctx *c;
    uint8_t   *buf;                    /* WIN_BYTES, page aligned (O_DIRECT) */
    uint8_t   *scratch;                /* UNIT_BYTES: units only partly inside a window */
    uint16_t  *btab;                   /* [NTAB_SIZE] bf16(ntab[i] * btab_std) */
    float      btab_std;
    pthread_t  tid;
} worker;

/* Normal values: element j of a unit uses bits 16*(j%4).. of RNG draw j/4, in every path. */
static void gen_bf16_table(uint16_t *out, size_t n, kl_rng *r, const uint16_t *btab)
{
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
        uint64_t x = kl_rng_next(r);
        out[j] = btab[x & 0xffff];
        out[j + 1] = btab[(x >> 16) & 0xffff];
        out[j + 2] = btab[(x >> 32) & 0xffff];
        out[j + 3] = btab[x >> 48];
    }
    if (j < n) {
        uint64_t x = kl_rng_next(r);
        for (; j < n; j++, x >>= 16)
            out[j] = btab[x & 0xffff];
    }
}

static void gen_generic(uint8_t *out, size_t n, kl_dtype dt, dist d, kl_rng *r)
{
    uint64_t bits = 0;
    for (size_t j = 0; j < n; j++) {
        float v;
        if (d.kind == DIST_NORMAL) {
            if (j % 4 == 0)
                bits = kl_rng_next(r);
            v = d.mean + ntab[bits & 0xffff] * d.std;
            bits >>= 16;
        } else if (d.kind == DIST_A_LOG) {
            v = (float)log(1.0 + 15.0 * kl_rng_uniform(r));                 /* log U(1, 16) */
        } else {
            double x = 1e-3 + (0.1 - 1e-3) * kl_rng_uniform(r);             /* U(1e-3, 0.1) */
            v = (float)log(expm1(x));                                       /* softplus^-1 */
        }
        if (dt == KL_DT_BF16) {
            uint16_t h = kl_f32_to_bf16(v);
            memcpy(out + 2 * j, &h, 2);
        } else {
            memcpy(out + 4 * j, &v, 4);
        }
    }
}

static void gen_mx(uint8_t *out, uint64_t n_groups, int packed, int k, const mx_pool *p,
                   kl_rng *r)
{
    for (uint64_t g = 0; g < n_groups; g++) {
        uint64_t x = kl_rng_next(r);
        uint32_t idx = (uint32_t)(x & 0xffff);
        if (packed) {
            uint32_t s = (uint32_t)(x >> 16);
            uint32_t m[4] = {sign_mask[s & 0xff], sign_mask[(s >> 8) & 0xff],
                             sign_mask[(s >> 16) & 0xff], sign_mask[s >> 24]};
            uint32_t v[4];
            memcpy(v, p->codes[idx], 16);
            for (int q = 0; q < 4; q++)
                v[q] ^= m[q];
            memcpy(out + 16 * g, v, 16);
        } else {
            out[g] = kl_e8m0_encode(k + p->e0[idx]);
        }
    }
}

static const mx_pool *find_pool(const synth_ctx *c, float m)
{
    for (size_t j = 0; j < c->n_pools; j++)
        if (c->pools[j].m == m)
            return &c->pools[j];
    return NULL;
}

/* Bytes per RNG unit of an entry: 64 KiB, or 4 KiB for weight_scale (4096 groups). */
static uint64_t unit_bytes(const kl_schema_entry *e)
{
    return e->part == KL_PART_SCALE ? MX_UNIT_GROUPS : UNIT_BYTES;
}

/* Generates unit u of schema entry si into out (at most unit_bytes); returns its length. */
static size_t gen_unit(worker *w, size_t si, uint64_t u, uint8_t *out)
{
    const synth_ctx *c = w->c;
    const kl_schema_entry *e = &c->schema.entries[si];
    uint64_t ub = unit_bytes(e), off = u * ub, len = c->bytes[si] - off;
    len = len < ub ? len : ub;
    dist d = dist_for(e);
    kl_rng r;
    kl_rng_seed(&r, c->seed, ((uint64_t)c->partner[si] << 36) | u);
    if (e->part != KL_PART_WEIGHT) {
        int packed = e->part == KL_PART_PACKED;
        int k;
        const mx_pool *p = find_pool(c, split_sigma(d.std, &k));
        gen_mx(out, packed ? len / 16 : len, packed, k, p, &r);
        return (size_t)len;
    }
    size_t esz = kl_dtype_bits(e->synth_dtype) / 8, n = (size_t)len / esz;
    if (e->synth_dtype == KL_DT_BF16 && d.kind == DIST_NORMAL && d.mean == 0.0f &&
        e->numel >= BTAB_MIN_NUMEL) {
        if (w->btab_std != d.std) { /* same bytes as gen_generic, table-driven */
            for (uint32_t i = 0; i < NTAB_SIZE; i++)
                w->btab[i] = kl_f32_to_bf16(ntab[i] * d.std);
            w->btab_std = d.std;
        }
        gen_bf16_table((uint16_t *)(void *)out, n, &r, w->btab);
    } else {
        gen_generic(out, n, e->synth_dtype, d, &r);
    }
    return (size_t)len;
}

/* Bytes [off, off + len) of schema entry si into out. */
static void gen_range(worker *w, size_t si, uint64_t off, uint64_t len, uint8_t *out)
{
    uint64_t ub = unit_bytes(&w->c->schema.entries[si]);
    while (len) {
        uint64_t u = off / ub, in = off % ub;
        uint64_t avail = w->c->bytes[si] - u * ub;
        avail = avail < ub ? avail : ub;
        uint64_t take = avail - in < len ? avail - in : len;
        if (in == 0 && take == avail) {
            gen_unit(w, si, u, out);
        } else {
            gen_unit(w, si, u, w->scratch);
            memcpy(out, w->scratch + in, (size_t)take);
        }
        out += take;
        off += take;
        len -= take;
    }
}

/* Fills window [a, a + n) of a shard's data section (tensors back to back). */
static void gen_window(worker *w, const shard_plan *sh, uint64_t a, size_t n)
{
    const synth_ctx *c = w->c;
    const uint64_t *begin = c->begin + sh->first;
    size_t lo = 0, hi = sh->count; /* first slot whose end is past a */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (begin[mid] + c->bytes[c->order[sh->first + mid]] <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t slot = lo; slot < sh->count && begin[slot] < a + n; slot++) {
        size_t si = c->order[sh->first + slot];
        uint64_t t0 = begin[slot], t1 = t0 + c->bytes[si];
        uint64_t s0 = t0 > a ? t0 : a, s1 = t1 < a + n ? t1 : a + n;
        if (s1 > s0)
            gen_range(w, si, s0 - t0, s1 - s0, w->buf + (s0 - a));
    }
}

/* ---- shard lifecycle and workers ---- */

static void record_error(synth_ctx *c, const kl_err *e, int rc)
{
    pthread_mutex_lock(&c->mu);
    if (!c->rc) {
        c->rc = rc;
        if (c->err)
            *c->err = *e;
    }
    pthread_mutex_unlock(&c->mu);
    atomic_store(&c->stop, 1);
}

static int shard_open(synth_ctx *c, shard_plan *sh, kl_err *err)
{
    kl_st_wtensor *t = kl_calloc(sh->count ? sh->count : 1, sizeof *t);
    if (!t)
        return kl_fail(err, KL_E_NOMEM, "out of memory for a shard header");
    for (size_t i = 0; i < sh->count; i++) {
        const kl_schema_entry *e = &c->schema.entries[c->order[sh->first + i]];
        t[i].name = e->name;
        t[i].dtype = e->synth_dtype;
        t[i].rank = e->rank;
        memcpy(t[i].shape, e->shape, sizeof e->shape);
    }
    kl_st_writer_opts wo = {.data_align = KL_ST_WRITER_ALIGN_DEFAULT,
                            .early_writeback = !c->direct, .direct = c->direct};
    int rc = kl_st_writer_open(&sh->w, sh->path, t, sh->count, &wo, err);
    kl_free(t);
    if (rc)
        return rc;
    for (size_t i = 0; i < sh->count; i++)
        if (sh->w.begin[i] != c->begin[sh->first + i])
            return kl_fail(err, KL_E_BUG, "writer and plan disagree on tensor offsets");
    sh->opened = 1;
    sh->file_bytes = sh->w.file_bytes;
    return 0;
}

static int shard_commit(shard_plan *sh, kl_err *err)
{
    int rc = kl_st_writer_commit(&sh->w, err);
    if (sh->w.committed) /* renamed into place, even if the directory fsync then failed */
        sh->committed = 1;
    kl_st_writer_close(&sh->w);
    return rc;
}

static int run_task(worker *w, const task *t, kl_err *err)
{
    synth_ctx *c = w->c;
    shard_plan *sh = &c->shards[t->shard];
    int rc = 0;
    pthread_mutex_lock(&sh->lock);
    if (sh->open_failed)
        rc = KL_E_CANCELLED; /* the thread that failed to open it reported why */
    else if (!sh->opened && (rc = shard_open(c, sh, err))) {
        record_error(c, err, rc); /* before any thread can report KL_E_CANCELLED for it */
        sh->open_failed = 1;
    }
    pthread_mutex_unlock(&sh->lock);
    if (rc)
        return rc;
    size_t len = (size_t)(sh->tensor_bytes - t->off < WIN_BYTES ? sh->tensor_bytes - t->off
                                                                 : WIN_BYTES);
    if (len) {
        gen_window(w, sh, t->off, len);
        rc = kl_st_writer_pwrite_data(&sh->w, t->off, w->buf, len, err);
        if (rc)
            return rc;
        atomic_fetch_add(&c->done_bytes, len);
    }
    if (atomic_fetch_sub(&sh->remaining, 1) == 1) {
        pthread_mutex_lock(&sh->lock);
        rc = shard_commit(sh, err);
        pthread_mutex_unlock(&sh->lock);
    }
    return rc;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    synth_ctx *c = w->c;
    kl_err err;
    kl_err_clear(&err);
    while (!atomic_load(&c->stop)) {
        size_t i = atomic_fetch_add(&c->next_task, 1);
        if (i >= c->n_tasks)
            break;
        int rc = run_task(w, &c->tasks[i], &err);
        if (rc) {
            record_error(c, &err, rc);
            break;
        }
    }
    pthread_mutex_lock(&c->mu);
    c->finished++;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static unsigned thread_count(const kl_synth_opts *o, size_t n_tasks)
{
    unsigned n = o->threads ? o->threads : kl_cpu_count(0);
    if (n > MAX_THREADS)
        n = MAX_THREADS;
    if (n > n_tasks)
        n = (unsigned)(n_tasks ? n_tasks : 1);
    return n;
}

static uint64_t total_bytes(const synth_ctx *c)
{
    uint64_t t = 0;
    for (size_t k = 0; k < c->n_shards; k++)
        t += c->shards[k].tensor_bytes;
    return t;
}

/* Runs the workers; the calling thread reports progress until they finish. */
static int run_workers(synth_ctx *c, kl_err *err)
{
    unsigned n = thread_count(c->o, c->n_tasks);
    worker *ws = kl_calloc(n, sizeof *ws);
    if (!ws)
        return kl_fail(err, KL_E_NOMEM, "out of memory for %u workers", n);
    /* from here on, errors go through record_error (workers share c->err) */
    unsigned started = 0;
    int rc = 0;
    for (; started < n; started++) {
        worker *w = &ws[started];
        w->c = c;
        w->btab_std = NAN;
        w->buf = kl_aligned_alloc(KL_ST_WRITER_DIRECT_ALIGN, WIN_BYTES);
        w->scratch = kl_malloc(UNIT_BYTES);
        w->btab = kl_malloc(NTAB_SIZE * sizeof *w->btab);
        kl_err e;
        kl_err_clear(&e);
        if (!w->buf || !w->scratch || !w->btab)
            rc = kl_fail(&e, KL_E_NOMEM, "out of memory for worker buffers");
        else if ((errno = pthread_create(&w->tid, NULL, worker_main, w)) != 0)
            rc = kl_fail_sys(&e, KL_E_NOMEM, errno, "cannot start a worker thread");
        if (rc) {
            record_error(c, &e, rc);
            break;
        }
    }
    uint64_t total = total_bytes(c);
    double last = kl_now_s();
    pthread_mutex_lock(&c->mu);
    while (c->finished < started) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(PROGRESS_PERIOD_S * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        double now = kl_now_s();
        if (c->o->progress && now - last >= PROGRESS_PERIOD_S && c->finished < started) {
            last = now;
            pthread_mutex_unlock(&c->mu);
            if (c->o->progress(c->o->progress_ctx, atomic_load(&c->done_bytes), total)) {
                kl_err e;
                kl_err_clear(&e);
                kl_fail(&e, KL_E_CANCELLED, "cancelled");
                record_error(c, &e, KL_E_CANCELLED);
            }
            pthread_mutex_lock(&c->mu);
        }
    }
    pthread_mutex_unlock(&c->mu);
    for (unsigned i = 0; i < started; i++)
        pthread_join(ws[i].tid, NULL);
    for (unsigned i = 0; i < n; i++) {
        kl_aligned_free(ws[i].buf);
        kl_free(ws[i].scratch);
        kl_free(ws[i].btab);
    }
    kl_free(ws);
    return c->rc; /* the first error, already copied into c->err */
}

/* Sparse: headers only; payloads stay holes. */
static int write_sparse(synth_ctx *c, kl_err *err)
{
    for (size_t k = 0; k < c->n_shards; k++) {
        int rc = shard_open(c, &c->shards[k], err);
        if (!rc)
            rc = shard_commit(&c->shards[k], err);
        if (rc)
            return rc;
    }
    return 0;
}

static const char *const small_files[] = {"tiktoken.model", "tokenizer_config.json",
                                           "config.json", "model.safetensors.index.json"};

static void ctx_free(synth_ctx *c, int failed)
{
    for (size_t i = 0; failed && c->wrote_small && i < sizeof small_files / sizeof *small_files;
         i++) {
        char path[4096];
        if (!kl_path_join(path, sizeof path, c->o->out_dir, small_files[i], NULL))
            unlink(path);
    }
    for (size_t k = 0; k < c->n_shards; k++) {
        shard_plan *sh = &c->shards[k];
        kl_st_writer_close(&sh->w); /* removes a .partial that was never committed */
        if (failed && sh->committed)
            unlink(sh->path);
        if (c->shard_locks)
            pthread_mutex_destroy(&sh->lock);
    }
    for (size_t j = 0; j < c->n_pools; j++)
        mx_pool_free(&c->pools[j]);
    kl_free(c->shards);
    kl_free(c->tasks);
    kl_free(c->bytes);
    kl_free(c->partner);
    kl_layout_free(&c->layout);
    kl_schema_free(&c->schema);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

/* ---- public API ---- */

static const preset *find_preset(const char *name)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(presets[i].name, name ? name : "tiny"))
            return &presets[i];
    return NULL;
}

int kl_synth_config(const kl_synth_opts *o, kl_config *c, kl_err *err)
{
    const preset *p = find_preset(o->preset);
    if (!p)
        return kl_fail(err, KL_E_USAGE, "unknown preset '%s' (tiny, small, full)", o->preset);
    if (o->format != KL_SYNTH_BF16 && o->format != KL_SYNTH_MXFP4)
        return kl_fail(err, KL_E_USAGE, "unknown format %d", (int)o->format);
    if (o->layers > KL_MAX_LAYERS)
        return kl_fail(err, KL_E_USAGE, "%u layers: at most %d", o->layers, KL_MAX_LAYERS);
    kl_config_default_48b(c);
    if (p->vocab) {
        c->vocab_size = p->vocab;
        c->hidden_size = p->hidden;
        c->intermediate_size = p->inter;
        c->moe_intermediate_size = p->moe_inter;
        c->num_hidden_layers = p->layers;
        c->num_attention_heads = p->heads;
        c->num_key_value_heads = p->heads;
        c->kv_lora_rank = p->kv_lora;
        c->qk_rope_head_dim = p->rope;
        c->qk_nope_head_dim = p->nope;
        c->v_head_dim = p->v_head;
        c->num_experts = p->experts;
        c->num_experts_per_token = p->top_k;
        c->kda_head_dim = p->kda_head_dim;
        c->kda_num_heads = p->kda_heads;
        c->bos_token_id = (int64_t)p->vocab - 256;
        c->eos_token_id = (int64_t)p->vocab - 254;
        c->pad_token_id = (int64_t)p->vocab - 1;
    }
    if (o->layers)
        c->num_hidden_layers = o->layers;
    uint32_t L = c->num_hidden_layers;
    memset(c->layer_attn, 0, sizeof c->layer_attn);
    for (uint32_t i = 0; i < L; i++) /* 1-based full-attention layers 4, 8, ... and the last */
        c->layer_attn[i] = ((i + 1) % 4 == 0 || i + 1 == L) ? KL_ATTN_MLA : KL_ATTN_KDA;
    if (o->format == KL_SYNTH_MXFP4) {
        kl_config_set_mxfp4(c);
    } else {
        c->family = KL_FAMILY_KIMI_LINEAR;
        c->quantized = false;
    }
    return 0;
}

static int write_config(const synth_ctx *c, kl_err *err)
{
    char *json = NULL;
    int rc = kl_config_to_json(&c->cfg, &json, err);
    if (!rc)
        rc = kl_write_file_atomic(c->o->out_dir, "config.json", json, strlen(json), err);
    kl_free(json);
    return rc;
}

static int write_index(const synth_ctx *c, kl_err *err)
{
    size_t n = c->schema.n;
    kl_st_index_entry *e = kl_malloc((n ? n : 1) * sizeof *e);
    if (!e)
        return kl_fail(err, KL_E_NOMEM, "out of memory for the index");
    for (size_t k = 0; k < c->n_shards; k++)
        for (size_t i = 0; i < c->shards[k].count; i++) {
            size_t pos = c->shards[k].first + i;
            e[pos].tensor = c->schema.entries[c->order[pos]].name;
            e[pos].shard = c->shards[k].name;
        }
    int rc = kl_st_index_write(c->o->out_dir, e, n, total_bytes(c), err);
    kl_free(e);
    return rc;
}

/* The shards' planned file sizes (convert/out_plan.h) and the free-space check; sparse files
 * need only their headers.  The plan goes to o->plan when asked for. */
static int plan_output(synth_ctx *c, kl_err *err)
{
    kl_dtype *dt = kl_calloc(c->schema.n ? c->schema.n : 1, sizeof *dt);
    if (!dt)
        return kl_fail(err, KL_E_NOMEM, "out of memory planning the output");
    for (size_t i = 0; i < c->schema.n; i++)
        dt[i] = c->schema.entries[i].synth_dtype;
    kl_out_plan p;
    int rc = kl_out_plan_build(&p, &c->schema, &c->layout, dt, err);
    kl_free(dt);
    if (rc)
        return rc;
    for (size_t k = 0; c->o->sparse && k < p.n_shards; k++)
        p.needed_bytes -= p.shards[k].tensor_bytes;
    kl_err scratch; /* a dry run reports "no space" in the plan */
    kl_err_clear(&scratch);
    rc = kl_out_plan_check_space(&p, c->o->out_dir, c->o->dry_run ? &scratch : err);
    if (c->o->dry_run && scratch.rule[0])
        rc = 0;
    if (!rc && c->o->plan)
        *c->o->plan = p;
    else
        kl_out_plan_free(&p);
    return rc;
}

int kl_synth_write(const kl_synth_opts *o, kl_err *err)
{
    double t0 = kl_now_s();
    if (!o || !o->out_dir || !o->out_dir[0])
        return kl_fail(err, KL_E_USAGE, "no output directory");
    const preset *p = find_preset(o->preset);
    synth_ctx c;
    memset(&c, 0, sizeof c);
    c.o = o;
    c.err = err;
    c.seed = o->seed;
    c.direct = !o->buffered;
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    pthread_once(&ntab_once, ntab_init);
    pthread_once(&sign_once, sign_init);

    int rc = kl_synth_config(o, &c.cfg, err);
    if (!rc)
        rc = kl_schema_build(&c.schema, &c.cfg, err);
    if (rc)
        goto done;
    size_t n = c.schema.n;
    c.bytes = kl_calloc(n ? n : 1, sizeof *c.bytes);
    c.partner = kl_calloc(n ? n : 1, sizeof *c.partner);
    if (!c.bytes || !c.partner) {
        rc = kl_fail(err, KL_E_NOMEM, "out of memory for %zu tensors", n);
        goto done;
    }
    uint64_t shard_bytes = o->shard_bytes ? o->shard_bytes : p->shard_bytes;
    if ((rc = plan_values(&c, err)) || (rc = plan_shards(&c, shard_bytes, err)) ||
        (!o->sparse && (rc = plan_tasks(&c, err))) || (rc = plan_output(&c, err)) ||
        o->dry_run)
        goto done;
    if ((rc = kl_mkdir_p(o->out_dir, err)))
        goto done;
    rc = o->sparse ? write_sparse(&c, err) : run_workers(&c, err);
    if (!rc)
        c.wrote_small = 1;
    if (!rc)
        rc = kl_synth_write_tokenizer(o->out_dir, c.cfg.vocab_size, err);
    if (!rc)
        rc = write_config(&c, err);
    if (!rc)
        rc = write_index(&c, err); /* last: its presence marks a complete checkpoint */
    if (!rc && o->progress)
        o->progress(o->progress_ctx, total_bytes(&c), total_bytes(&c));
    if (!rc && o->result) {
        kl_synth_result *r = o->result;
        memset(r, 0, sizeof *r);
        r->n_tensors = n;
        r->n_shards = c.n_shards;
        r->tensor_bytes = total_bytes(&c);
        for (size_t k = 0; k < c.n_shards; k++)
            r->file_bytes += c.shards[k].file_bytes;
        r->elapsed_s = kl_now_s() - t0;
    }
done:
    if (rc)
        kl_err_context(err, o->out_dir, NULL, KL_NO_OFFSET, NULL);
    ctx_free(&c, rc != 0);
    return rc;
}
