/*
 * engine/backend_gpu.c — the GPU backend of engine/backend.h on one device.
 *
 * At creation every weight goes to device memory in the kinds it is stored in (BF16, F32,
 * MXFP4) where engine/gpu_plan.h lays it out: one allocation per layer, each layer's routed
 * experts stacked per role ([E, out, in] and [E, out, in/32] scales, kernels/gpu_api.h
 * kl_gpu_stack), fusion groups stacked, small vectors as fp32.  The bytes come straight from
 * the checkpoint's files (engine/gpu_load.h: a ring of pinned buffers that load threads fill,
 * each staged on the device whole; mapped windows page-locked; or the staged reader:
 * $KL_GPU_LOAD) or, when the host model read them, from its memory.  Per slot the
 * backend keeps, for every KDA layer, the conv windows and the fp32 delta-rule state (pools of
 * max_slots entries allocated up front) and, for every MLA layer, a latent cache of fp32 rows
 * that doubles when a chunk needs more room.
 *
 * Every operation enqueues kernels (kernels/) on one stream and returns; head() and end()
 * are the only points that wait.  Scratch for one chunk of up to max_tokens tokens is allocated
 * once.  In a build without GPU support the file compiles to the refusal at the bottom.
 *
 * Decode graphs: a chunk of one token is the decode step, and its hundreds of small kernels
 * cost more in launches than in work.  So the first such step of a slot is captured as a graph
 * (every operation from the embedding to lm_head, argmax and the copies of both into pinned
 * host buffers) and later steps replay it: begin() uploads the token's id and position (the
 * kernels read them from device memory), the operations then enqueue nothing, and head() or
 * end() launches the graph.  What a graph bakes in is keyed: the slot, its MLA cache capacity
 * (attention is launched for the capacity and each kernel reads the token's real span) and the
 * attention scratch; a change of any of them captures anew.  KL_GPU_GRAPHS=0 turns graphs off.
 */
#include "engine/backend.h"
#include "engine/backend_tp.h"

#include "engine/gpu_plan.h"
#include "engine/model.h"

#include <stdlib.h>
#include <string.h>

const char *const kl_gpu_op_names[KL_GPU_OPS] = {"embed", "norm", "kda", "mla", "moe", "mlp",
                                                 "head"};
const char *const kl_gpu_part_names[KL_GPU_PARTS] = {
    "kda_proj", "kda_conv",   "kda_gates",  "kda_recur", "kda_out",    "mla_proj",   "mla_append",
    "mla_attend", "mla_out", "moe_proj",   "moe_route", "moe_shared", "moe_experts"};

#ifdef KL_GPU

#include "common/clock.h"
#include "common/mem.h"
#include "engine/gpu_load.h"
#include "kernels/collective.h"
#include "kernels/dense.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "kernels/mla.h"
#include "kernels/moe.h"
#include "kernels/runtime.h"
#include "kernels/skinny.h"

#include <pthread.h>
#include <stdio.h>

/* Tokens per chunk ($KL_GPU_CHUNK: 16 .. GPU_CHUNK_MAX).  The grouped expert products read
 * every expert once per chunk, so larger chunks amortise the weights over more rows: an 8K
 * prompt at 1,942 tok/s in chunks of 256, 3,418 at 1,024, 4,097 at 4,096 (session 7, gemm
 * tiles v1); 5,392-5,411 at 4,096 and 5,583-5,602 at 8,192 (session 9, version 5; GPU memory
 * 40.9 against 47.1 GB); the logits are bit-identical across chunk sizes.  MLA's scratch is
 * sized for the kernels that run (kl_gpu_mla_scratch). */
#define GPU_CHUNK 8192u
#define GPU_CHUNK_MAX 8192u
/* Sequences held at once: the running ones and the server's state snapshots (serve/prefix.h
 * keeps its entries in the slots kl serve's --max-seqs leaves free).  Each costs its KDA state
 * up front (~42 MB at the full geometry: 2.7 GB for 64); MLA caches grow with use. */
#define GPU_SLOTS 64u
#define MLA_CAP0  256u  /* initial rows of a slot's MLA cache */

/* ------------------------------------------------------------------------------------------ */
/* State                                                                                      */

/* Matrices that multiply the same input, stacked by the plan (engine/gpu_plan.h) so that a
 * one-token chunk runs them as one product (one launch, one pass over more bytes: small
 * products are bound by their fixed cost, not their bytes). */
enum { FUSE_KDA = KL_FUSE_KDA, FUSE_MLA = KL_FUSE_MLA, FUSE_MOE = KL_FUSE_MOE,
       FUSE_MLP = KL_FUSE_MLP, FUSE_GROUPS = KL_FUSE_GROUPS };
#define fuse_roles kl_plan_fuse_roles

typedef struct gpu_layer {
    kl_gpu_mat   w[KL_ROLE_COUNT];   /* matrices by role (KL_GPU_W_NONE if absent) */
    kl_gpu_mat   fused[FUSE_GROUPS]; /* a group's members as one matrix (NONE: not fusable) */
    float       *vec[KL_ROLE_COUNT]; /* fp32 vectors by role */
    kl_gpu_stack ex[3];              /* routed experts: w1 (gate), w2 (down), w3 (up) */
    uint32_t     expert0;            /* ex[k] holds experts [expert0, expert0 + ex[k].n): fewer
                                        than the router's on a rank of expert parallelism */
    float       *win, *state;        /* KDA: conv windows and delta-rule state, [slots] each */
    float      **cache_h;            /* MLA: [slots] device row pointers (host copy) */
    float      **cache_d;            /* MLA: the same array on the device */
} gpu_layer;

typedef struct gpu_dims {
    uint32_t hidden, vocab;
    uint32_t kh, kd, kD, kw;         /* KDA heads, head dim, heads*dim, conv kernel */
    uint32_t nh, dn, dr, dv, R;      /* MLA */
    uint32_t E, topk, inter;         /* routed experts, per token, intermediate */
    uint32_t wide, low, ffn;         /* widest projection, low-rank output, FFN intermediate */
} gpu_dims;

/* Host-side description of the chunk in flight (its device twin: dev_tok). */
enum { TOK_IDS, TOK_SLOT, TOK_POS, TOK_RUN_START, TOK_RUN_SLOT, TOK_ARRAYS };

/* A captured decode step (see the header comment) and what it was captured for. */
typedef struct gpu_graph {
    kl_gpu_graph  exec;          /* NULL: none */
    size_t        cap;           /* the slot's MLA capacity then */
    uint32_t      span;          /* the attention's max_span then (kl_gpu_mla_graph_span) */
    const float  *mla_scratch;   /* the attention scratch then */
} gpu_graph;

typedef enum graph_mode { EAGER = 0, CAPTURE, REPLAY } graph_mode;

#define RANKS_MAX 8   /* tensor-parallel ranks of one process */
_Static_assert(RANKS_MAX <= KL_GPU_SUM_MAX, "a norm adds every rank's block output");

typedef struct gpu_be {
    kl_backend    base;
    kl_gpu_stream st;
    gpu_dims      d;
    gpu_layer    *L;
    kl_gpu_mat    embed, lm_head;
    float        *final_norm;
    size_t        win_stride, state_stride;   /* floats per slot in the KDA pools */
    size_t       *mla_cap;                    /* [slots] rows allocated per MLA cache */
    void        **allocs;                     /* device buffers owned (freed at destroy) */
    size_t        n_allocs, cap_allocs;
    /* the chunk */
    uint32_t      chunk;                      /* tokens per chunk at most */
    uint32_t     *host_tok;                   /* pinned: TOK_ARRAYS arrays of tok_stride */
    uint32_t     *dev_tok;
    uint32_t      tok_stride;                 /* this chunk's tokens + 1: a one-token step
                                                 uploads 40 bytes, not TOK_ARRAYS chunks */
    kl_gpu_tokens tok;
    uint32_t      n_want, want[GPU_CHUNK_MAX];
    uint32_t      run_len[GPU_CHUNK_MAX];
    /* scratch */
    float *x, *xn, *y, *q, *k, *v, *f, *g, *o, *lr, *lr2, *beta, *h1, *h2, *hs1, *hs2;
    float *x2;                                /* x's other buffer (norm_in_product swaps them) */
    float *router, *wt, *xw, *logits, *ex_scratch, *mla_scratch, *kda_scratch;
    float *fz;                                /* [fused rows]: a fused product's outputs */
    uint16_t *parts;                          /* a product's input as bf16 parts (gemm.h) */
    int32_t  *idx;
    uint32_t *amax;
    size_t    mla_scratch_floats;
    /* decode graphs */
    int        graphs_on;
    int        gemm_on;                       /* tensor-core products for chunks */
    int        fuse_small;                    /* one-token glu and pair launches */
    int        ride;                          /* riders: router, conv (kernels/dense.h) */
    int        norm_in_product;               /* one-token add_norms in the next product */
    struct {                                  /* an add_norm left to the next product */
        int          on;
        const float *r, *w;                   /* x += r; xn = w ⊙ rmsnorm(x) */
    } pend;
    int        chain;                         /* output products chained ($KL_GPU_CHAIN) */
    struct {                                  /* a block's output product left pending */
        int          on;
        kl_gpu_mat   w;
        const float *x;
        float       *y;                       /* y = W x */
    } pend_out;
    gpu_graph  graph[GPU_SLOTS];
    graph_mode mode;
    gpu_graph *cur;                           /* the graph of this chunk (CAPTURE, REPLAY) */
    int        head_done;                     /* head() ran for this chunk */
    int        logits_copied;                 /* host_logits hold this chunk's logits */
    float     *host_logits;                   /* pinned [vocab]: a graph step's logits, copied
                                                 after the graph when head() wants them */
    kl_gpu_load_info load;                    /* how the weights came */
    kl_gpu_profile   prof;                    /* graph size; per-operation times */
    double           prof_t0;                 /* start of the operation being timed */
    double           prof_tp;                 /* end of its last step timed (part_done) */
    uint32_t  *host_amax;                     /* pinned [1]: a graph's argmax */
    int        st_shared;                     /* st is another rank's (not destroyed here) */
    int        dev;                           /* the device it lives on */
    kl_gpu_comm *comm;                        /* rank 0 of ranks on their own GPUs: NCCL's
                                                 communicators (NULL: sums elsewhere) */
    char        sum_how[400];                 /* rank 0: where the ranks' sums run */
    kl_gpu_plan pend_plan;                    /* a rank's arenas allocated, their fill left to */
    uint8_t   **pend_arena;                   /* the ranks' one fill (kl_backend_gpu_create_
                                                 ranks); NULL once filled */
    /* the backends that step as one (see "Steps"): the ranks of one tensor-parallel model, or
     * this backend alone; member 0 leads */
    struct gpu_be *grp[RANKS_MAX];
    unsigned       grp_n, grp_r;              /* members; this one's place */
    int            sum_in_norm;               /* the next add_norm adds every member's y (the
                                                 ranks' sum deferred: gpu_all_reduce) */
} gpu_be;

static gpu_be *impl(kl_backend *be)
{
    return (gpu_be *)be->impl;
}

/* Device allocation recorded for destroy. */
static int dev_alloc(gpu_be *g, void **p, size_t bytes, kl_err *err)
{
    if (g->n_allocs == g->cap_allocs) {
        size_t cap = g->cap_allocs ? 2 * g->cap_allocs : 256;
        void **a = kl_realloc(g->allocs, cap * sizeof *a);
        if (!a)
            return kl_fail(err, KL_E_NOMEM, "out of memory");
        g->allocs = a;
        g->cap_allocs = cap;
    }
    int rc = kl_gpu_alloc(p, bytes, err);
    if (!rc)
        g->allocs[g->n_allocs++] = *p;
    return rc;
}

static int dev_floats(gpu_be *g, float **p, size_t n, kl_err *err)
{
    return dev_alloc(g, (void **)p, n * sizeof(float), err);
}

/* ------------------------------------------------------------------------------------------ */
/* Upload: the plan (engine/gpu_plan.h), one device arena per layer, filled from the files     */
/* (engine/gpu_load.h)                                                                        */

static kl_gpu_wkind gpu_kind(kl_wkind k)
{
    switch (k) {
    case KL_W_F32: return KL_GPU_W_F32;
    case KL_W_BF16: return KL_GPU_W_BF16;
    case KL_W_MXFP4: return KL_GPU_W_MXFP4;
    default: return KL_GPU_W_NONE;
    }
}

/* The device matrix a plan matrix is in the arena at base. */
static kl_gpu_mat view(const kl_plan_mat *w, uint8_t *base)
{
    kl_gpu_mat v = {gpu_kind(w->kind), w->rows, w->cols, NULL, NULL, NULL};
    if (w->kind == KL_W_MXFP4) {
        v.packed = base + w->data;
        v.scale = base + w->scale;
    } else if (w->kind != KL_W_NONE) {
        v.data = base + w->data;
    }
    return v;
}

static void bind_layer(gpu_layer *gl, const kl_plan_layer *pl, uint8_t *base)
{
    for (int r = 0; r < KL_ROLE_COUNT; r++) {
        gl->w[r] = view(&pl->w[r], base);
        gl->vec[r] = pl->vec[r] == KL_PLAN_NONE ? NULL : (float *)(void *)(base + pl->vec[r]);
    }
    for (int grp = 0; grp < FUSE_GROUPS; grp++)
        gl->fused[grp] = view(&pl->fused[grp], base);
    for (int k = 0; k < 3 && pl->n_experts; k++)
        gl->ex[k] = (kl_gpu_stack){view(&pl->ex[k], base), pl->n_experts};
    gl->expert0 = pl->expert0;
}


/* Pools and scratch (alloc_pools, alloc_scratch: device allocations that need only the
 * model's shapes and the plan) made on a thread of their own while the fill copies. */
typedef struct side_alloc {
    gpu_be   *g;
    pthread_t th;
    int       started, rc;
    kl_err    err;
    double    s;
} side_alloc;

static int alloc_pools(gpu_be *g, kl_err *err);
static int alloc_scratch(gpu_be *g, kl_err *err);

static void *side_main(void *arg)
{
    side_alloc *a = arg;
    double t0 = kl_now_s();
    kl_err_clear(&a->err);
    int rc = kl_gpu_device_open(a->g->dev, NULL, 0, &a->err);
    if (!rc)
        rc = alloc_pools(a->g, &a->err);
    if (!rc)
        rc = alloc_scratch(a->g, &a->err);
    a->rc = rc;
    a->s = kl_now_s() - t0;
    return NULL;
}

/* Starts side_main on its thread (overlap on), else runs it here. */
static void side_start(side_alloc *a, gpu_be *g, int overlap)
{
    *a = (side_alloc){.g = g};
    a->started = overlap && pthread_create(&a->th, NULL, side_main, a) == 0;
    if (!a->started)
        side_main(a);
}

/* Joins the side thread; its error unless rc already is one. */
static int side_end(side_alloc *a, int rc, kl_err *err)
{
    if (a->started)
        pthread_join(a->th, NULL);
    a->started = 0;
    if (!rc && a->rc && err)
        *err = a->err;
    return rc ? rc : a->rc;
}

/* Every weight: the plan, one device allocation per arena, the views, then the fill (pools
 * and scratch allocated meanwhile).  Phases timed into g->load. */
static int upload_model(gpu_be *g, const kl_gpu_prep *pr, kl_err *err)
{
    const kl_model *m = g->base.m;
    kl_gpu_load_info *li = &g->load;
    double t0 = kl_now_s();
    kl_gpu_plan p;
    int rc = kl_gpu_plan_build(&p, m, err);
    if (rc)
        return rc;
    double t1 = kl_now_s();
    uint8_t **arena = kl_calloc(p.n_arenas, sizeof *arena);
    if (!arena)
        rc = kl_fail(err, KL_E_NOMEM, "out of memory");
    for (uint32_t a = 0; !rc && a < p.n_arenas; a++)
        rc = dev_alloc(g, (void **)&arena[a], p.arena_bytes[a], err);
    if (!rc) {   /* the views first: the pools and scratch need the fused groups' rows */
        uint8_t *glob = arena[p.n_arenas - 1];
        g->embed = view(&p.embed, glob);
        g->lm_head = view(&p.lm_head, glob);
        g->final_norm = (float *)(void *)(glob + p.final_norm);
        for (uint32_t l = 0; l + 1 < p.n_arenas; l++)
            bind_layer(&g->L[l], &p.layer[l], arena[l]);
    }
    double t2 = kl_now_s();
    side_alloc side = {0};
    if (!rc)   /* pools and scratch beside the fill, or (staged) before it */
        side_start(&side, g, pr->overlap && !pr->defer_fill && !kl_gpu_load_staged());
    if (!rc && !pr->defer_fill)
        rc = kl_gpu_load_fill(g->st, g->dev, (const char *const *)m->shard_paths, &p, arena, pr,
                              &g->load, err);
    double t3 = kl_now_s();
    rc = side_end(&side, rc, err);
    li->plan_s = t1 - t0;
    li->alloc_s = t2 - t1;
    li->fill_s = t3 - t2;
    li->pools_s = side.s;
    li->finish_s = kl_now_s() - t3;   /* waiting for the pools, if they took longer */
    if (!rc && pr->defer_fill) {   /* kept for the ranks' one fill */
        g->pend_plan = p;
        g->pend_arena = arena;
        return 0;
    }
    kl_free(arena);
    kl_gpu_plan_free(&p);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Dimensions, pools, scratch                                                                 */

static uint32_t max2u(uint32_t a, uint32_t b)
{
    return a > b ? a : b;
}

static void get_dims(const kl_model *m, gpu_dims *d)
{
    const kl_config *c = &m->cfg;
    *d = (gpu_dims){.hidden = c->hidden_size, .vocab = c->vocab_size, .kh = c->kda_num_heads,
                    .kd = c->kda_head_dim, .kw = c->kda_conv_kernel,
                    .nh = c->num_attention_heads, .dn = c->qk_nope_head_dim,
                    .dr = c->qk_rope_head_dim, .dv = c->v_head_dim, .R = c->kv_lora_rank,
                    .E = c->num_experts, .topk = c->num_experts_per_token};
    d->kD = d->kh * d->kd;
    kl_model_widths w;
    kl_model_widths_get(m, &w);
    d->wide = (uint32_t)w.wide;
    d->low = (uint32_t)w.low;
    d->ffn = (uint32_t)(w.mlp > w.shared ? w.mlp : w.shared);
    d->inter = (uint32_t)w.routed;
}

/* The most rows of any fused group (after the upload). */
static size_t fused_rows(const gpu_be *g)
{
    size_t n = 1;
    for (uint32_t l = 0; l < g->base.m->cfg.num_hidden_layers; l++)
        for (int grp = 0; grp < FUSE_GROUPS; grp++)
            if (g->L[l].fused[grp].rows > n)
                n = g->L[l].fused[grp].rows;
    return n;
}

static int alloc_scratch(gpu_be *g, kl_err *err)
{
    const gpu_dims *d = &g->d;
    size_t T = g->chunk, H = d->hidden, W = d->wide;
    struct { float **p; size_t n; } t[] = {
        {&g->x, T * H}, {&g->xn, T * H}, {&g->y, T * H}, {&g->q, T * W}, {&g->k, T * W},
        {&g->v, T * W}, {&g->f, T * W}, {&g->g, T * W}, {&g->o, T * W}, {&g->lr, T * d->low},
        {&g->lr2, T * d->low}, {&g->beta, T * max2u(d->kh, 1)}, {&g->h1, T * max2u(d->ffn, 1)},
        {&g->h2, T * max2u(d->ffn, 1)}, {&g->router, T * max2u(d->E, 1)},
        {&g->wt, T * max2u(d->topk, 1)}, {&g->xw, T * H}, {&g->logits, T * d->vocab},
        {&g->fz, fused_rows(g)}, {&g->x2, T * H},
        {&g->kda_scratch, d->kh ? kl_gpu_kda_scratch(g->chunk, d->kh, d->kd) : 1},
        {&g->ex_scratch, d->inter ? kl_gpu_experts_scratch(g->chunk, d->topk, d->inter, H)
                                  : 1},
    };
    int rc = 0;
    for (size_t i = 0; !rc && i < sizeof t / sizeof *t; i++)
        rc = dev_floats(g, t[i].p, t[i].n ? t[i].n : 1, err);
    const uint32_t widest = max2u(max2u(d->hidden, d->wide), d->ffn);
    if (!rc)
        rc = dev_alloc(g, (void **)&g->parts, kl_gpu_gemm_parts_bytes((uint32_t)T, widest), err);
    if (!rc)
        rc = dev_alloc(g, (void **)&g->idx, T * max2u(d->topk, 1) * sizeof *g->idx, err);
    if (!rc)
        rc = dev_alloc(g, (void **)&g->amax, T * sizeof *g->amax, err);
    if (!rc)
        rc = dev_alloc(g, (void **)&g->dev_tok, TOK_ARRAYS * (T + 1) * sizeof(uint32_t), err);
    if (!rc)
        rc = kl_gpu_host_alloc((void **)&g->host_tok, TOK_ARRAYS * (T + 1) * sizeof(uint32_t),
                               err);
    if (!rc)
        rc = kl_gpu_host_alloc((void **)&g->host_logits, (size_t)d->vocab * sizeof(float), err);
    if (!rc)
        rc = kl_gpu_host_alloc((void **)&g->host_amax, sizeof *g->host_amax, err);
    return rc;
}

/* KDA pools for every slot, and the MLA pointer tables (caches come at the first chunk). */
static int alloc_pools(gpu_be *g, kl_err *err)
{
    const gpu_dims *d = &g->d;
    const kl_model *m = g->base.m;
    g->win_stride = (size_t)3 * d->kD * (d->kw > 1 ? d->kw - 1 : 1);
    g->state_stride = (size_t)d->kh * d->kd * d->kd;
    int rc = 0;
    for (uint32_t l = 0; !rc && l < m->cfg.num_hidden_layers; l++) {
        gpu_layer *gl = &g->L[l];
        if (m->layers[l].attn == KL_ATTN_KDA) {
            rc = dev_floats(g, &gl->win, GPU_SLOTS * g->win_stride, err);
            if (!rc)
                rc = dev_floats(g, &gl->state, GPU_SLOTS * g->state_stride, err);
            continue;
        }
        gl->cache_h = kl_calloc(GPU_SLOTS, sizeof *gl->cache_h);
        if (!gl->cache_h)
            return kl_fail(err, KL_E_NOMEM, "out of memory");
        rc = dev_alloc(g, (void **)&gl->cache_d, GPU_SLOTS * sizeof *gl->cache_d, err);
        if (!rc)
            rc = kl_gpu_memset(gl->cache_d, 0, GPU_SLOTS * sizeof *gl->cache_d, g->st, err);
    }
    return rc;
}

/* Grows slot s's MLA caches to hold need rows (doubling), keeping the rows it holds. */
static int reserve_mla(gpu_be *g, uint32_t s, size_t need, kl_err *err)
{
    if (g->mla_cap[s] >= need)
        return 0;
    size_t cap = g->mla_cap[s] ? g->mla_cap[s] : MLA_CAP0;
    while (cap < need)
        cap *= 2;
    size_t row = (size_t)g->d.R + g->d.dr, keep = g->base.slot_len[s];
    const kl_model *m = g->base.m;
    for (uint32_t l = 0; l < m->cfg.num_hidden_layers; l++) {
        gpu_layer *gl = &g->L[l];
        if (m->layers[l].attn != KL_ATTN_MLA)
            continue;
        float *c = NULL;
        int rc = kl_gpu_alloc((void **)&c, cap * row * sizeof *c, err);
        if (!rc && keep)
            rc = kl_gpu_d2d(c, gl->cache_h[s], keep * row * sizeof *c, g->st, err);
        if (!rc)
            rc = kl_gpu_h2d(gl->cache_d + s, &c, sizeof c, g->st, err);
        if (!rc)
            rc = kl_gpu_stream_sync(g->st, err);   /* before the old rows go, and &c */
        if (rc) {
            kl_gpu_free(c);
            return rc;
        }
        kl_gpu_free(gl->cache_h[s]);
        gl->cache_h[s] = c;
    }
    g->mla_cap[s] = cap;
    return 0;
}

static kl_gpu_mla_dims mla_dims(const gpu_be *g)
{
    const kl_gpu_mla_dims md = {g->d.nh, g->d.dn, g->d.dr, g->d.dv, g->d.R};
    return md;
}

/* MLA attention scratch for the chunk's longest span. */
static int reserve_mla_scratch(gpu_be *g, kl_err *err)
{
    const kl_gpu_mla_dims md = mla_dims(g);
    size_t need = kl_gpu_mla_scratch(&md, g->tok.n, g->tok.max_span);
    if (need <= g->mla_scratch_floats)
        return 0;
    size_t cap = g->mla_scratch_floats ? g->mla_scratch_floats : need;
    while (cap < need)
        cap *= 2;
    kl_gpu_free(g->mla_scratch);
    g->mla_scratch = NULL;
    g->mla_scratch_floats = 0;
    int rc = kl_gpu_alloc((void **)&g->mla_scratch, cap * sizeof(float), err);
    if (!rc)
        g->mla_scratch_floats = cap;
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Slots                                                                                      */

static int zero_slot(gpu_be *g, uint32_t s, kl_err *err)
{
    const kl_model *m = g->base.m;
    int rc = 0;
    for (uint32_t l = 0; !rc && l < m->cfg.num_hidden_layers; l++) {
        gpu_layer *gl = &g->L[l];
        if (!gl->win)
            continue;
        rc = kl_gpu_memset(gl->win + s * g->win_stride, 0, g->win_stride * sizeof(float),
                           g->st, err);
        if (!rc)
            rc = kl_gpu_memset(gl->state + s * g->state_stride, 0,
                               g->state_stride * sizeof(float), g->st, err);
    }
    g->base.slot_len[s] = 0;
    return rc;
}

static int gpu_slot_open(kl_backend *be, uint32_t *slot, kl_err *err)
{
    gpu_be *g = impl(be);
    for (uint32_t s = 0; s < be->max_slots; s++) {
        if (be->slot_used[s])
            continue;
        int rc = zero_slot(g, s, err);
        if (rc)
            return rc;
        be->slot_used[s] = 1;
        *slot = s;
        return 0;
    }
    return kl_fail(err, KL_E_NOMEM, "all %u GPU sequence slots are in use", be->max_slots);
}

static void gpu_slot_close(kl_backend *be, uint32_t slot)
{
    be->slot_used[slot] = 0;
}

static void gpu_slot_reset(kl_backend *be, uint32_t slot)
{
    kl_err e;
    kl_err_clear(&e);
    (void)zero_slot(impl(be), slot, &e);   /* a memset fails only with a broken device */
}

static int gpu_slot_copy(kl_backend *be, uint32_t dst, uint32_t src, kl_err *err)
{
    gpu_be *g = impl(be);
    size_t n = be->slot_len[src], row = (size_t)g->d.R + g->d.dr;
    int rc = reserve_mla(g, dst, n, err);
    for (uint32_t l = 0; !rc && l < be->m->cfg.num_hidden_layers; l++) {
        gpu_layer *gl = &g->L[l];
        if (gl->win) {
            rc = kl_gpu_d2d(gl->win + dst * g->win_stride, gl->win + src * g->win_stride,
                            g->win_stride * sizeof(float), g->st, err);
            if (!rc)
                rc = kl_gpu_d2d(gl->state + dst * g->state_stride,
                                gl->state + src * g->state_stride,
                                g->state_stride * sizeof(float), g->st, err);
        } else if (n) {
            rc = kl_gpu_d2d(gl->cache_h[dst], gl->cache_h[src], n * row * sizeof(float), g->st,
                            err);
        }
    }
    if (!rc)
        rc = kl_gpu_stream_sync(g->st, err);
    if (!rc)
        be->slot_len[dst] = n;
    return rc;
}

static int gpu_slot_fill(kl_backend *be, uint32_t slot, size_t n, kl_err *err)
{
    gpu_be *g = impl(be);
    size_t row = ((size_t)g->d.R + g->d.dr) * sizeof(float);
    int rc = reserve_mla(g, slot, n, err);
    if (!rc)
        rc = zero_slot(g, slot, err);
    for (uint32_t l = 0; !rc && n && l < be->m->cfg.num_hidden_layers; l++)
        if (g->L[l].cache_h)
            rc = kl_gpu_memset(g->L[l].cache_h[slot], 0, n * row, g->st, err);
    if (!rc)
        rc = kl_gpu_stream_sync(g->st, err);
    if (!rc)
        be->slot_len[slot] = n;
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* The chunk                                                                                  */

static uint32_t *tok_array(const gpu_be *g, uint32_t *base, int which)
{
    return base + (size_t)which * g->tok_stride;
}

/* Runs, positions and wanted rows of the chunk into host_tok and g->tok (host counts). */
static void describe_chunk(gpu_be *g, const kl_batch *c)
{
    g->tok_stride = (uint32_t)c->n + 1;   /* the arrays packed for this chunk */
    uint32_t *ids = tok_array(g, g->host_tok, TOK_IDS);
    uint32_t *ts = tok_array(g, g->host_tok, TOK_SLOT), *tp = tok_array(g, g->host_tok, TOK_POS);
    uint32_t *rs = tok_array(g, g->host_tok, TOK_RUN_START);
    uint32_t *rsl = tok_array(g, g->host_tok, TOK_RUN_SLOT);
    kl_gpu_tokens *t = &g->tok;
    t->n = (uint32_t)c->n;
    t->n_runs = t->max_run = t->max_span = 0;
    g->n_want = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        uint32_t s = c->slot[i];
        if (i == 0 || s != c->slot[i - 1]) {
            rs[t->n_runs] = i;
            rsl[t->n_runs] = s;
            g->run_len[t->n_runs++] = 0;
        }
        uint32_t r = t->n_runs - 1;
        ids[i] = c->ids[i];
        ts[i] = s;
        tp[i] = (uint32_t)g->base.slot_len[s] + g->run_len[r]++;
        t->max_run = max2u(t->max_run, g->run_len[r]);
        t->max_span = max2u(t->max_span, tp[i] + 1);
        if (c->want ? c->want[i] : i + 1 == t->n)
            g->want[g->n_want++] = i;
    }
    rs[t->n_runs] = t->n;
    t->tok_slot = tok_array(g, g->dev_tok, TOK_SLOT);
    t->tok_pos = tok_array(g, g->dev_tok, TOK_POS);
    t->run_start = tok_array(g, g->dev_tok, TOK_RUN_START);
    t->run_slot = tok_array(g, g->dev_tok, TOK_RUN_SLOT);
}

/* ------------------------------------------------------------------------------------------ */
/* Steps: the members of grp step as one.  The leader's begin() prepares every member's chunk  */
/* and decides whether the one-token step replays graphs or captures them; whichever member's  */
/* head() or end() comes first runs them for all.  Each stream's first member captures,        */
/* launches and waits for what every member enqueues on that stream (ranks sharing a device    */
/* share its stream: one graph; ranks on their own devices: one graph each, NCCL inside).      */

static int member_dev(const gpu_be *m, kl_err *err)
{
    return kl_gpu_device_open(m->dev, NULL, 0, err);
}

/* Whether member r is the first on its stream. */
static int stream_owner(const gpu_be *g, unsigned r)
{
    for (unsigned q = 0; q < r; q++)
        if (g->grp[q]->st == g->grp[r]->st)
            return 0;
    return 1;
}

/* Ends a capture that failed half way on every stream (each must leave capture mode), drops
 * what was captured and runs the members eager. */
static void abandon_capture(gpu_be *g)
{
    kl_err e;
    kl_err_clear(&e);
    for (unsigned r = 0; r < g->grp_n; r++) {
        gpu_be *m = g->grp[r];
        kl_gpu_graph gr = NULL;
        if (m->mode == CAPTURE && stream_owner(g, r) && !member_dev(m, &e) &&
            !kl_gpu_capture_end(m->st, &gr, NULL, 0, &e))
            kl_gpu_graph_destroy(gr);
        if (m->mode != EAGER) {
            kl_gpu_graph_destroy(m->cur->exec);
            m->cur->exec = NULL;
        }
        m->mode = EAGER;
    }
}

static int norm_flush(gpu_be *g, kl_err *err);
static int mm(gpu_be *g, const kl_gpu_mat *w, const float *x, float *y, kl_err *err);
static int out_flush(gpu_be *g, kl_err *err);

/* The start of every operation that enqueues work: an add_norm left pending runs first,
 * unless `taking` (the operation's group_products takes it); profiling, the stream drained. */
static int op_begin(gpu_be *g, int taking, kl_err *err)
{
    int rc = taking ? 0 : norm_flush(g, err);
    if (rc || !g->prof.on)
        return rc;
    rc = kl_gpu_stream_sync(g->st, err);
    g->prof_t0 = g->prof_tp = kl_now_s();
    return rc;
}

static int op_start(gpu_be *g, kl_err *err)
{
    return op_begin(g, 0, err);
}

/* The end of a step inside an operation: profiling, the time since the step before (or the
 * operation's start) once the stream has drained. */
static int part_done(gpu_be *g, kl_gpu_part part, int rc, kl_err *err)
{
    if (rc || !g->prof.on)
        return rc;
    rc = kl_gpu_stream_sync(g->st, err);
    const double now = kl_now_s();
    g->prof.part_s[part] += now - g->prof_tp;
    g->prof_tp = now;
    return rc;
}

/* The end of every operation: a failure while capturing abandons the capture, so the stream
 * leaves capture mode (the orchestration stops at the first error); profiling, the time since
 * op_start once the stream has drained. */
static int op_done(gpu_be *g, kl_gpu_op op, int rc, kl_err *err)
{
    if (rc && g->mode == CAPTURE)
        abandon_capture(g);
    if (!rc && g->prof.on) {
        rc = kl_gpu_stream_sync(g->st, err);
        g->prof.op_s[op] += kl_now_s() - g->prof_t0;
        g->prof.op_n[op]++;
    }
    return rc;
}

/* Decides how a one-token step runs: REPLAY the graphs captured for the same slot and, on every
 * member, the same MLA capacity and scratch, or CAPTURE new ones (after dropping stale ones). */
static int choose_graph(gpu_be *g, uint32_t slot, kl_err *err)
{
    int same = 1;
    for (unsigned r = 0; r < g->grp_n; r++) {
        gpu_be *m = g->grp[r];
        const gpu_graph *gr = m->cur = &m->graph[slot];
        same &= gr->cap == m->mla_cap[slot] && gr->span == m->tok.max_span &&
                gr->mla_scratch == m->mla_scratch &&
                (gr->exec || !stream_owner(g, r));
    }
    int rc = 0;
    for (unsigned r = 0; r < g->grp_n && !rc; r++) {
        gpu_be *m = g->grp[r];
        if (!same) {
            kl_gpu_graph_destroy(m->cur->exec);
            *m->cur = (gpu_graph){NULL, m->mla_cap[slot], m->tok.max_span, m->mla_scratch};
            if (stream_owner(g, r) && !(rc = member_dev(m, err)))
                rc = kl_gpu_capture_begin(m->st, err);
        }
        m->mode = rc ? m->mode : same ? REPLAY : CAPTURE;
    }
    if (rc)
        abandon_capture(g);
    return rc;
}

/* A member's chunk before anything is enqueued for it: described, its MLA caches and the
 * attention scratch sized, its token arrays uploaded. */
static int prepare_chunk(gpu_be *g, const kl_batch *c, int graph, kl_err *err)
{
    if (c->n > g->chunk)
        return kl_fail(err, KL_E_BUG, "chunk of %zu tokens (at most %u)", c->n, g->chunk);
    int rc = member_dev(g, err);
    if (!rc)   /* host_tok may still feed the last chunk */
        rc = kl_gpu_stream_sync(g->st, err);
    if (rc)
        return rc;
    describe_chunk(g, c);
    for (uint32_t r = 0; !rc && r < g->tok.n_runs; r++) {
        uint32_t s = tok_array(g, g->host_tok, TOK_RUN_SLOT)[r];
        rc = reserve_mla(g, s, g->base.slot_len[s] + g->run_len[r], err);
    }
    if (graph) { /* attention sized for the capacity (or a bound that picks faster kernels):
                    the graph holds until the cache grows or the span passes the bound */
        const kl_gpu_mla_dims md = mla_dims(g);
        g->tok.max_span = kl_gpu_mla_graph_span(&md, g->tok.max_span,
                                                (uint32_t)g->mla_cap[c->slot[0]]);
    }
    if (!rc)
        rc = reserve_mla_scratch(g, err);
    if (!rc)
        rc = kl_gpu_h2d(g->dev_tok, g->host_tok, TOK_ARRAYS * g->tok_stride * sizeof(uint32_t),
                        g->st, err);
    g->mode = EAGER;
    g->head_done = 0;
    g->logits_copied = 0;
    g->sum_in_norm = 0;
    g->pend.on = 0;   /* nothing left from a step that failed midway */
    g->pend_out.on = 0;
    return rc;
}

/* The leader's part of begin(): every member's chunk prepared, then a one-token step's graphs
 * chosen; the leader's device current again. */
static int begin_step(gpu_be *g, const kl_batch *c, kl_err *err)
{
    const int graph = g->graphs_on && c->n == 1;
    int rc = 0;
    for (unsigned r = 0; r < g->grp_n && !rc; r++)
        rc = prepare_chunk(g->grp[r], c, graph, err);
    if (!rc && graph)
        rc = choose_graph(g, c->slot[0], err);
    return rc ? rc : member_dev(g, err);
}

static int gpu_begin(kl_backend *be, const kl_batch *c, kl_err *err)
{
    gpu_be *g = impl(be);
    int rc = g->grp_r ? 0 : begin_step(g, c, err);
    if (!rc && g->mode != REPLAY) {
        rc = op_start(g, err);
        if (!rc)
            rc = kl_gpu_embed(&g->embed, (uint32_t)be->m->vocab0, be->m->vocab_part,
                              tok_array(g, g->dev_tok, TOK_IDS), g->tok.n, g->x, g->st, err);
        rc = op_done(g, KL_GPU_OP_EMBED, rc, err);
    }
    return rc;
}

static const float *norm_weight(gpu_be *g, kl_norm_which which, uint32_t layer)
{
    switch (which) {
    case KL_NORM_INPUT: return g->L[layer].vec[KL_ROLE_INPUT_NORM];
    case KL_NORM_POST: return g->L[layer].vec[KL_ROLE_POST_ATTN_NORM];
    default: return g->final_norm;
    }
}

static int norm_op(kl_backend *be, kl_norm_which which, uint32_t layer, int add, kl_err *err)
{
    gpu_be *g = impl(be);
    if (g->mode == REPLAY)
        return 0;
    const float *ys[RANKS_MAX];   /* what x adds: y, or every rank's in rank order */
    unsigned ny = 0;
    if (add && g->sum_in_norm)
        for (unsigned r = 0; r < g->grp_n; r++)
            ys[ny++] = g->grp[r]->y;
    else if (add)
        ys[ny++] = g->y;
    g->sum_in_norm = 0;
    const int defer = ny == 1 && g->tok.n == 1 && g->norm_in_product && g->grp_n <= 1 &&
                      which != KL_NORM_FINAL;
    /* deferred, it may chain with the output product left pending (out_product) */
    int rc = defer && !g->pend.on ? op_begin(g, 1, err) : op_start(g, err);
    if (!rc && defer) {
        g->pend.on = 1;   /* the next operation's group_products makes it (or norm_flush) */
        g->pend.r = ys[0];
        g->pend.w = norm_weight(g, which, layer);
    } else if (!rc && !(rc = out_flush(g, err)))
        rc = kl_gpu_sum_add_rmsnorm(g->x, ys, ny, norm_weight(g, which, layer), g->tok.n,
                                    g->d.hidden, (float)be->m->cfg.rms_norm_eps, g->xn, g->st,
                                    err);
    return op_done(g, KL_GPU_OP_NORM, rc, err);
}

/* A block's output product, y = W x: left pending on a one-token step when chains are on
 * (the next block's first product may make it in its own launch, kl_gpu_matmul_chain), else
 * launched. */
static int out_product(gpu_be *g, const kl_gpu_mat *w, const float *x, float *y, kl_err *err)
{
    if (g->chain && g->tok.n == 1 && g->grp_n <= 1 && w->kind == KL_GPU_W_BF16) {
        g->pend_out.on = 1;
        g->pend_out.w = *w;
        g->pend_out.x = x;
        g->pend_out.y = y;
        return 0;
    }
    return mm(g, w, x, y, err);
}

/* The pending output product, launched. */
static int out_flush(gpu_be *g, kl_err *err)
{
    if (!g->pend_out.on)
        return 0;
    g->pend_out.on = 0;
    return mm(g, &g->pend_out.w, g->pend_out.x, g->pend_out.y, err);
}

/* What is pending, launched in order: the output product, then the add_norm. */
static int norm_flush(gpu_be *g, kl_err *err)
{
    const int rc = out_flush(g, err);
    if (rc || !g->pend.on)
        return rc;
    g->pend.on = 0;
    return kl_gpu_add_rmsnorm(g->x, g->pend.r, g->pend.w, 1, g->d.hidden,
                              (float)g->base.m->cfg.rms_norm_eps, g->xn, g->st, err);
}

/* Whether a pending add_norm can be made inside the one-token product by w. */
static int norm_in_product_takes(const gpu_be *g, const kl_gpu_mat *w)
{
    return g->pend.on && kl_gpu_matmul_norm_takes(w, g->x, g->pend.r, g->pend.w, g->x2, g->xn);
}

/* The product that made the add_norm wrote the residual into x2: x2 becomes x. */
static void swap_residual(gpu_be *g)
{
    float *t = g->x;
    g->x = g->x2;
    g->x2 = t;
}

/* The pending add_norm inside the one-token product y = xn Wᵀ (norm_in_product_takes): x + r
 * then lives in x2, which becomes x. */
static int norm_in_product(gpu_be *g, const kl_gpu_mat *w, float *y, kl_err *err)
{
    int rc = out_flush(g, err);   /* the norm adds its output */
    if (rc)
        return rc;
    g->pend.on = 0;
    rc = kl_gpu_matmul_norm(w, g->x, g->pend.r, g->pend.w, (float)g->base.m->cfg.rms_norm_eps,
                            g->x2, g->xn, y, g->st, err);
    swap_residual(g);
    return rc;
}

/* Whether the pending output product, the pending add_norm of its output and w's product
 * run as one chain (kernels/dense.h, kl_gpu_matmul_chain). */
static int chain_takes(const gpu_be *g, const kl_gpu_mat *w)
{
    return g->pend_out.on && g->pend.on && g->pend.r == g->pend_out.y &&
           kl_gpu_matmul_chain_takes(&g->pend_out.w, g->pend_out.x, w, g->x, g->pend.w, g->x2,
                                     g->xn);
}

static int chain_in_product(gpu_be *g, const kl_gpu_mat *w, float *y, kl_err *err)
{
    g->pend.on = g->pend_out.on = 0;
    const int rc = kl_gpu_matmul_chain(&g->pend_out.w, g->pend_out.x, g->pend_out.y, g->x,
                                       g->pend.w, (float)g->base.m->cfg.rms_norm_eps, g->x2,
                                       g->xn, w, y, g->st, err);
    swap_residual(g);
    return rc;
}

static int gpu_norm(kl_backend *be, kl_norm_which which, uint32_t layer, kl_err *err)
{
    return norm_op(be, which, layer, 0, err);
}

static int gpu_add_norm(kl_backend *be, kl_norm_which which, uint32_t layer, kl_err *err)
{
    return norm_op(be, which, layer, 1, err);
}

/* Whether a product by w of n rows runs on the tensor cores (kernels/gemm.h): many rows,
 * unless $KL_GPU_GEMM=0; else the fp32 kernels of kernels/dense.h. */
static int on_tensor_cores(const gpu_be *g, const kl_gpu_mat *w, uint32_t n)
{
    int tc = w->kind == KL_GPU_W_BF16 || w->kind == KL_GPU_W_MXFP4;
    return g->gemm_on && tc && n >= KL_GPU_GEMM_MIN_N && w->cols % 32 == 0;
}

/* y [n, rows] = x [n, cols] Wᵀ; split_done: x's parts are in g->parts already (an earlier
 * product of the same x split them). */
static int product(gpu_be *g, const kl_gpu_mat *w, const float *x, uint32_t n, float *y,
                   int split_done, kl_err *err)
{
    if (on_tensor_cores(g, w, n))
        return kl_gpu_gemm_p(w, x, n, y, g->parts, split_done, g->st, err);
    return kl_gpu_matmul(w, x, n, y, g->st, err);
}

/* y [n, rows] = x [n, cols] Wᵀ for the chunk's tokens */
static int mm(gpu_be *g, const kl_gpu_mat *w, const float *x, float *y, kl_err *err)
{
    return product(g, w, x, g->tok.n, y, 0, err);
}

/* Whether mm(w) splits its input into g->parts. */
static int splits(const gpu_be *g, const kl_gpu_mat *w)
{
    return on_tensor_cores(g, w, g->tok.n) && kl_gpu_gemm_uses_parts(w, g->parts);
}

/* Whether the chunk runs group grp's products as one (a one-token chunk, the group fused). */
static int fused(const gpu_be *g, const gpu_layer *L, int grp)
{
    return g->tok.n == 1 && L->fused[grp].kind != KL_GPU_W_NONE;
}

/* Whether a chunk of 2 .. 31 tokens runs group grp's products as one skinny product of the
 * fused matrix (kernels/skinny.h, when switched on). */
static int skinny_fused(const gpu_be *g, const gpu_layer *L, int grp, const float *x)
{
    const kl_gpu_mat *w = &L->fused[grp];
    return g->tok.n >= 2 && w->kind != KL_GPU_W_NONE && !on_tensor_cores(g, w, g->tok.n) &&
           kl_gpu_skinny_takes(w, x, g->tok.n);
}

/* Group grp's products in one skinny launch, each member's rows (stacked in fuse_roles order
 * in the fused matrix) into the buffer out[i] names. */
static int skinny_group(gpu_be *g, const gpu_layer *L, int grp, const float *x, float **out,
                        kl_err *err)
{
    kl_gpu_skinny_out so = {0};
    uint32_t end = 0;
    for (int i = 0; fuse_roles[grp][i] != KL_ROLE_COUNT; i++) {
        const uint32_t rows = L->w[fuse_roles[grp][i]].rows;
        if (!rows)
            continue;
        end += rows;
        so.end[so.count] = end;
        so.y[so.count++] = out[i];
    }
    return kl_gpu_skinny_parts(&L->fused[grp], x, g->tok.n, &so, g->st, err);
}

/* Outputs of the products of x by group grp's members: fused, the members' outputs lie one
 * after another in g->fz (out[i] points at member i's); else each is its own product into the
 * buffer out[i] names on entry (one launch for all when skinny_fused). */
static int group_products(gpu_be *g, const gpu_layer *L, int grp, const float *x, float **out,
                          kl_err *err)
{
    if (skinny_fused(g, L, grp, x))   /* chunks of 2 or more: no pending add_norm */
        return norm_flush(g, err) ? err->code : skinny_group(g, L, grp, x, out, err);
    if (fused(g, L, grp)) {
        float *p = g->fz;
        for (int i = 0; fuse_roles[grp][i] != KL_ROLE_COUNT; i++) {
            out[i] = p;
            p += L->w[fuse_roles[grp][i]].rows;
        }
        if (x == g->xn && chain_takes(g, &L->fused[grp]))
            return chain_in_product(g, &L->fused[grp], g->fz, err);
        if (x == g->xn && norm_in_product_takes(g, &L->fused[grp]))
            return norm_in_product(g, &L->fused[grp], g->fz, err);
        return norm_flush(g, err) ? err->code : mm(g, &L->fused[grp], x, g->fz, err);
    }
    int rc = norm_flush(g, err), split_done = 0;   /* the members share one split of x */
    for (int i = 0; !rc && fuse_roles[grp][i] != KL_ROLE_COUNT; i++) {
        const kl_gpu_mat *w = &L->w[fuse_roles[grp][i]];
        if (w->kind == KL_GPU_W_NONE)
            continue;
        const int split = splits(g, w);
        rc = product(g, w, x, g->tok.n, out[i], split_done && split, err);
        split_done |= split;
    }
    return rc;
}

static int gpu_kda(kl_backend *be, uint32_t layer, kl_err *err)
{
    gpu_be *g = impl(be);
    if (g->mode == REPLAY)
        return 0;
    gpu_layer *L = &g->L[layer];
    const gpu_dims *d = &g->d;
    /* q, k, v, f_a, g_a, b: fuse_roles[FUSE_KDA] order */
    float *o6[6] = {g->q, g->k, g->v, g->lr, g->lr2, g->beta};
    int rc = op_begin(g, 1, err);   /* group_products takes a pending add_norm */
    if (!rc)
        rc = part_done(g, KL_GPU_PART_KDA_PROJ, group_products(g, L, FUSE_KDA, g->xn, o6, err),
                       err);
    float *q = o6[0], *k = o6[1], *v = o6[2], *fa = o6[3], *ga = o6[4], *beta = o6[5];
    kl_gpu_kda_conv_args ca = {
        .qkv = {q, k, v},
        .taps = {L->vec[KL_ROLE_KDA_Q_CONV], L->vec[KL_ROLE_KDA_K_CONV],
                 L->vec[KL_ROLE_KDA_V_CONV]},
        .D = d->kD, .W = d->kw, .win = L->win, .win_stride = g->win_stride};
    const kl_gpu_mat *fb = &L->w[KL_ROLE_KDA_F_B], *gb = &L->w[KL_ROLE_KDA_G_B];
    if (!rc && g->tok.n == 1 && g->fuse_small && g->ride)   /* conv + the two expansions */
        rc = kl_gpu_matmul_pair_conv(fb, fa, g->f, gb, ga, g->g, &ca, &g->tok, g->st, err);
    else {
        if (!rc)
            rc = part_done(g, KL_GPU_PART_KDA_CONV, kl_gpu_kda_conv(&ca, &g->tok, g->st, err),
                           err);
        if (!rc && g->tok.n == 1 && g->fuse_small)   /* the two low-rank expansions, one launch */
            rc = kl_gpu_matmul_pair(fb, fa, g->f, gb, ga, g->g, 1, g->st, err);
        else if (!rc) {
            rc = mm(g, fb, fa, g->f, err);
            if (!rc) rc = mm(g, gb, ga, g->g, err);
        }
    }
    rc = part_done(g, KL_GPU_PART_KDA_GATES, rc, err);
    if (!rc) {
        kl_gpu_kda_recur_args ra = {
            .q = q, .k = k, .v = v, .f = g->f, .beta_logit = beta, .gate = g->g,
            .a_log = L->vec[KL_ROLE_KDA_A_LOG], .dt_bias = L->vec[KL_ROLE_KDA_DT_BIAS],
            .o_norm = L->vec[KL_ROLE_KDA_O_NORM], .eps = (float)be->m->cfg.rms_norm_eps,
            .H = d->kh, .K = d->kd, .state = L->state, .state_stride = g->state_stride,
            .o = g->o, .scratch = g->kda_scratch};
        rc = part_done(g, KL_GPU_PART_KDA_RECUR, kl_gpu_kda_recur(&ra, &g->tok, g->st, err),
                       err);
    }
    if (!rc)
        rc = part_done(g, KL_GPU_PART_KDA_OUT,
                       out_product(g, &L->w[KL_ROLE_KDA_O], g->o, g->y, err), err);
    return op_done(g, KL_GPU_OP_KDA, rc, err);
}

static int gpu_mla(kl_backend *be, uint32_t layer, kl_err *err)
{
    gpu_be *g = impl(be);
    if (g->mode == REPLAY)
        return 0;
    gpu_layer *L = &g->L[layer];
    const kl_gpu_mla_dims md = mla_dims(g);
    float *o2[2] = {g->q, g->lr};   /* q, kv_a */
    int rc = op_begin(g, 1, err);   /* group_products takes a pending add_norm */
    if (!rc)
        rc = part_done(g, KL_GPU_PART_MLA_PROJ, group_products(g, L, FUSE_MLA, g->xn, o2, err),
                       err);
    if (!rc) {
        kl_gpu_mla_append_args aa = {md, o2[1], L->vec[KL_ROLE_MLA_KV_A_NORM], L->cache_d};
        rc = part_done(g, KL_GPU_PART_MLA_APPEND, kl_gpu_mla_append(&aa, &g->tok, g->st, err),
                       err);
    }
    if (!rc) {
        kl_gpu_mla_attend_args at = {md, o2[0], &L->w[KL_ROLE_MLA_KV_B],
                                     (const float *const *)L->cache_d, g->mla_scratch, g->o};
        rc = part_done(g, KL_GPU_PART_MLA_ATTEND, kl_gpu_mla_attend(&at, &g->tok, g->st, err),
                       err);
    }
    if (!rc)
        rc = part_done(g, KL_GPU_PART_MLA_OUT,
                       out_product(g, &L->w[KL_ROLE_MLA_O], g->o, g->y, err), err);
    return op_done(g, KL_GPU_OP_MLA, rc, err);
}

/* y = down(SiLU(h1) ⊙ h2) for the chunk: the end of a gated MLP whose gate and up products
 * h1 and h2 [n, down->cols] are done. */
static int glu_down(gpu_be *g, float *h1, const float *h2, const kl_gpu_mat *down, kl_err *err)
{
    if (g->tok.n == 1 && g->fuse_small)   /* one launch: the gating made inside the product */
        return kl_gpu_matmul_glu(down, h1, h2, 1, g->y, g->st, err);
    int rc = kl_gpu_silu_mul(h1, h2, (size_t)g->tok.n * down->cols, g->st, err);
    return rc ? rc : mm(g, down, h1, g->y, err);
}

static int gpu_mlp(kl_backend *be, uint32_t layer, kl_err *err)
{
    gpu_be *g = impl(be);
    if (g->mode == REPLAY)
        return 0;
    gpu_layer *L = &g->L[layer];
    float *o2[2] = {g->h1, g->h2};   /* gate, up */
    int rc = op_begin(g, 1, err);   /* group_products takes a pending add_norm */
    if (!rc)
        rc = group_products(g, L, FUSE_MLP, g->xn, o2, err);
    if (!rc)
        rc = glu_down(g, o2[0], o2[1], &L->w[KL_ROLE_MLP_DOWN], err);
    return op_done(g, KL_GPU_OP_MLP, rc, err);
}

static int gpu_moe(kl_backend *be, uint32_t layer, kl_err *err)
{
    gpu_be *g = impl(be);
    if (g->mode == REPLAY)
        return 0;
    gpu_layer *L = &g->L[layer];
    const kl_config *c = &be->m->cfg;
    int shared = L->w[KL_ROLE_SHARED_GATE].kind != KL_GPU_W_NONE;
    float *o3[3] = {g->h1, g->h2, g->router};   /* shared gate, shared up, router */
    int rc = op_begin(g, 1, err);   /* group_products takes a pending add_norm */
    if (!rc)
        rc = part_done(g, KL_GPU_PART_MOE_PROJ, group_products(g, L, FUSE_MOE, g->xn, o3, err),
                       err);
    kl_gpu_route_args ra = {
        .logits = o3[2], .bias = L->vec[KL_ROLE_ROUTER_BIAS], .n = g->tok.n,
        .n_experts = g->d.E, .top_k = g->d.topk,
        .biased_weights = be->m->route_weights == KL_ROUTE_BIASED,
        .renormalize = c->moe_renormalize, .scaling = (float)c->routed_scaling_factor,
        .idx = g->idx, .wt = g->wt, .first = L->expert0,
        .held = L->ex[0].n < g->d.E ? L->ex[0].n : 0};   /* expert parallel: its ids */
    /* one-token steps: the router rides in the shared expert's down launch */
    const int ride = shared && g->tok.n == 1 && g->fuse_small && g->ride;
    if (!rc && !ride)
        rc = part_done(g, KL_GPU_PART_MOE_ROUTE, kl_gpu_route(&ra, g->st, err), err);
    if (!rc && ride)
        rc = part_done(g, KL_GPU_PART_MOE_SHARED,
                       kl_gpu_matmul_glu_route(&L->w[KL_ROLE_SHARED_DOWN], o3[0], o3[1], 1,
                                               g->y, &ra, g->st, err), err);
    else if (!rc && shared)
        rc = part_done(g, KL_GPU_PART_MOE_SHARED,
                       glu_down(g, o3[0], o3[1], &L->w[KL_ROLE_SHARED_DOWN], err), err);
    if (!rc) {
        kl_gpu_experts_args ea = {
            .w1 = &L->ex[0], .w2 = &L->ex[1], .w3 = &L->ex[2], .x = g->xn, .n = g->tok.n,
            .top_k = g->d.topk, .idx = g->idx, .wt = g->wt, .scratch = g->ex_scratch, .y = g->y,
            .add_to_y = shared};
        rc = part_done(g, KL_GPU_PART_MOE_EXPERTS, kl_gpu_experts(&ea, g->st, err), err);
    }
    return op_done(g, KL_GPU_OP_MOE, rc, err);
}

/* lm_head on the wanted rows of xn; logits and/or argmax copied to the given host buffers
 * (either may be NULL).  Enqueued only. */
static int enqueue_head(gpu_be *g, float *logits, uint32_t *argmax, kl_err *err)
{
    size_t H = g->d.hidden, V = g->d.vocab;
    int rc = 0;
    if (!g->n_want)
        return 0;
    /* the wanted rows of xn, packed; when they are its first rows (a one-token step), xn
     * itself: no copy, and the head's product follows the final norm directly */
    uint32_t first = 0;
    while (first < g->n_want && g->want[first] == first)
        first++;
    const float *xw = first == g->n_want ? g->xn : g->xw;
    for (uint32_t i = 0; !rc && xw == g->xw && i < g->n_want; i++)
        rc = kl_gpu_d2d(g->xw + i * H, g->xn + (size_t)g->want[i] * H, H * sizeof(float), g->st,
                        err);
    if (!rc)
        rc = product(g, &g->lm_head, xw, g->n_want, g->logits, 0, err);
    if (!rc && argmax)
        rc = kl_gpu_argmax(g->logits, g->n_want, (uint32_t)V, g->amax, g->st, err);
    if (!rc && logits)
        rc = kl_gpu_d2h(logits, g->logits, (size_t)g->n_want * V * sizeof(float), g->st, err);
    if (!rc && argmax)
        rc = kl_gpu_d2h(argmax, g->amax, g->n_want * sizeof *argmax, g->st, err);
    return rc;
}

/* Every member's head enqueued into its pinned buffers, then each stream's capture ended; the
 * members' modes REPLAY, or EAGER with nothing kept after a failure. */
static int end_capture(gpu_be *g, kl_err *err)
{
    int rc = 0;
    for (unsigned r = 0; r < g->grp_n && !rc; r++) {
        gpu_be *m = g->grp[r];
        if (!(rc = member_dev(m, err)))
            rc = enqueue_head(m, NULL, m->host_amax, err);   /* logits: run_graph */
    }
    size_t nodes = 0;   /* kernels and copies of the whole step */
    for (unsigned r = 0; r < g->grp_n && !rc; r++) {
        gpu_be *m = g->grp[r];
        size_t k = 0;
        if (stream_owner(g, r) && !(rc = member_dev(m, err)))   /* NCCL's kernels: see runtime.h */
            rc = kl_gpu_capture_end(m->st, &m->cur->exec, &k, !g->grp[0]->comm, err);
        m->mode = rc ? m->mode : REPLAY;
        nodes += k;
    }
    if (rc)
        abandon_capture(g);
    else
        g->grp[0]->prof.graph_nodes = nodes;
    return rc;
}

/* m's wanted row of logits into its pinned host_logits, on its stream (a graph step's head). */
static int copy_logits(gpu_be *m, kl_err *err)
{
    int rc = member_dev(m, err);
    if (!rc)
        rc = kl_gpu_d2h(m->host_logits, m->logits, (size_t)m->n_want * m->d.vocab * sizeof(float),
                        m->st, err);
    m->logits_copied = !rc;
    return rc;
}

/* The step's graphs (captured first, when CAPTURE) launched on every stream and waited for,
 * each member's logits copied into its host_logits after them when logits is set (outside the
 * graph: a greedy step copies back only its argmax); g's device current again. */
static int run_graph(gpu_be *g, int logits, kl_err *err)
{
    int rc = g->mode == CAPTURE ? end_capture(g, err) : 0;
    if (rc)
        return rc;
    for (unsigned r = 0; r < g->grp_n; r++)
        g->grp[r]->head_done = 1;
    for (unsigned r = 0; r < g->grp_n && !rc; r++) {
        const gpu_be *m = g->grp[r];
        if (stream_owner(g, r) && !(rc = member_dev(m, err)))
            rc = kl_gpu_graph_launch(m->cur->exec, m->st, err);
    }
    for (unsigned r = 0; r < g->grp_n && !rc && logits; r++)
        rc = copy_logits(g->grp[r], err);
    for (unsigned r = 0; r < g->grp_n && !rc; r++)
        if (stream_owner(g, r))
            rc = kl_gpu_stream_sync(g->grp[r]->st, err);
    return rc ? rc : member_dev(g, err);
}

static int gpu_head(kl_backend *be, float *logits, kl_token *argmax, kl_err *err)
{
    gpu_be *g = impl(be);
    if (g->mode == EAGER) {
        int rc = op_start(g, err);
        if (!rc)
            rc = enqueue_head(g, logits, argmax, err);
        rc = op_done(g, KL_GPU_OP_HEAD, rc, err);
        return rc ? rc : kl_gpu_stream_sync(g->st, err);
    }
    int rc = g->head_done ? 0 : run_graph(g, logits != NULL, err);   /* one wanted row */
    if (!rc && logits && !g->logits_copied && !(rc = copy_logits(g, err)))
        rc = kl_gpu_stream_sync(g->st, err);   /* the graph ran for a head without logits */
    if (!rc && logits)
        memcpy(logits, g->host_logits, (size_t)g->d.vocab * sizeof *logits);
    if (!rc && argmax)
        argmax[0] = g->host_amax[0];
    return rc;
}

static int gpu_end(kl_backend *be, kl_err *err)
{
    gpu_be *g = impl(be);
    int rc = g->mode != EAGER && !g->head_done ? run_graph(g, 0, err) : 0;
    g->mode = EAGER;
    if (!rc)
        rc = kl_gpu_stream_sync(g->st, err);
    if (rc)
        return rc;
    const uint32_t *rsl = tok_array(g, g->host_tok, TOK_RUN_SLOT);
    for (uint32_t r = 0; r < g->tok.n_runs; r++)
        be->slot_len[rsl[r]] += g->run_len[r];
    return 0;
}

static void gpu_destroy(kl_backend *be)
{
    gpu_be *g = impl(be);
    if (!g)
        return;
    if (g->L) {
        for (uint32_t l = 0; l < be->m->cfg.num_hidden_layers; l++) {
            for (uint32_t s = 0; g->L[l].cache_h && s < GPU_SLOTS; s++)
                kl_gpu_free(g->L[l].cache_h[s]);
            kl_free(g->L[l].cache_h);
        }
    }
    for (uint32_t s = 0; s < GPU_SLOTS; s++)
        kl_gpu_graph_destroy(g->graph[s].exec);
    for (size_t i = 0; i < g->n_allocs; i++)
        kl_gpu_free(g->allocs[i]);
    kl_gpu_host_free(g->host_logits);
    kl_gpu_host_free(g->host_amax);
    kl_gpu_free(g->mla_scratch);
    kl_gpu_host_free(g->host_tok);
    if (!g->st_shared)
        kl_gpu_stream_destroy(g->st);
    kl_gpu_plan_free(&g->pend_plan);
    kl_free(g->pend_arena);
    kl_gpu_comm_free(g->comm);
    kl_free(g->allocs);
    kl_free(g->L);
    kl_free(g->mla_cap);
    kl_free(be->slot_used);
    kl_free(be->slot_len);
    kl_free(g);
}

/* The buffer an all-reduce sums: the embeddings (x) or a block's output (y). */
static float *sum_buf(kl_backend *be, kl_tp_sum which)
{
    return which == KL_TP_SUM_X ? impl(be)->x : impl(be)->y;
}

/* Ranks all on rank 0's device (sharing its stream), the embeddings (a block's outputs are
 * summed by the next norm: gpu_all_reduce): rank 0's buffer += each other rank's in rank order
 * ((x0 + x1) + x2 ...: the CPU's and the host path's order, the same fp32 adds), then copied
 * to the others.  Enqueued only. */
static int sum_on_device(kl_backend *const *ranks, unsigned n, kl_tp_sum which, size_t len,
                         kl_err *err)
{
    const gpu_be *g0 = impl(ranks[0]);
    float *s = sum_buf(ranks[0], which);
    int rc = kl_gpu_device_open(g0->dev, NULL, 0, err);
    for (unsigned r = 1; r < n && !rc; r++)
        rc = kl_gpu_add(s, sum_buf(ranks[r], which), len, g0->st, err);
    for (unsigned r = 1; r < n && !rc; r++)
        rc = kl_gpu_d2d(sum_buf(ranks[r], which), s, len * sizeof(float), g0->st, err);
    return rc;
}

/* Ranks on several devices: each rank's buffer copied to the host, summed there in rank order
 * and copied back to every rank (NCCL inside the captured step is what makes tensor
 * parallelism across GPUs fast: docs/TP-GPU.md). */
static int sum_through_host(kl_backend *const *ranks, unsigned n, kl_tp_sum which, size_t len,
                            kl_err *err)
{
    const size_t bytes = len * sizeof(float);
    float *sum = kl_malloc(bytes), *part = kl_malloc(bytes);
    int rc = sum && part ? 0 : kl_fail(err, KL_E_NOMEM, "out of memory for an all-reduce");
    for (unsigned r = 0; r < n && !rc; r++) {
        gpu_be *g = impl(ranks[r]);
        rc = kl_gpu_device_open(g->dev, NULL, 0, err);
        if (!rc)
            rc = kl_gpu_d2h(r ? part : sum, sum_buf(ranks[r], which), bytes, g->st, err);
        if (!rc)
            rc = kl_gpu_stream_sync(g->st, err);
        for (size_t i = 0; !rc && r && i < len; i++)
            sum[i] += part[i];
    }
    for (unsigned r = 0; r < n && !rc; r++) {
        gpu_be *g = impl(ranks[r]);
        rc = kl_gpu_device_open(g->dev, NULL, 0, err);
        if (!rc)
            rc = kl_gpu_h2d(sum_buf(ranks[r], which), sum, bytes, g->st, err);
        if (!rc)
            rc = kl_gpu_stream_sync(g->st, err);
    }
    kl_free(sum);
    kl_free(part);
    return rc;
}

/* Ranks on their own GPUs: NCCL's sum on the ranks' streams.  Enqueued only. */
static int sum_nccl(kl_backend *const *ranks, unsigned n, kl_tp_sum which, size_t len,
                    kl_err *err)
{
    float *bufs[RANKS_MAX];
    kl_gpu_stream st[RANKS_MAX];
    for (unsigned r = 0; r < n; r++) {
        bufs[r] = sum_buf(ranks[r], which);
        st[r] = impl(ranks[r])->st;
    }
    return kl_gpu_comm_sum(impl(ranks[0])->comm, bufs, len, st, err);
}

/* The ranks of engine/backend_tp.h: their buffers summed for every rank — on the device when
 * they share one (a block's outputs by each rank's next norm, which reads them all: one launch
 * a rank, no adds or copies between), by NCCL when each has its own, else through the host. */
static int gpu_all_reduce(kl_backend *const *ranks, unsigned n, kl_tp_sum which, kl_err *err)
{
    const gpu_be *g0 = impl(ranks[0]);
    const size_t len = (size_t)g0->tok.n * g0->d.hidden;
    if (g0->mode == REPLAY)   /* the sums are in the step's graphs */
        return 0;
    int shared = 1;
    for (unsigned r = 1; r < n; r++)
        shared &= impl(ranks[r])->dev == g0->dev && impl(ranks[r])->st == g0->st;
    if (!len || n < 2)
        return 0;
    if (shared && which == KL_TP_SUM_Y) {   /* each rank's next add_norm sums the ys itself */
        for (unsigned r = 0; r < n; r++)
            impl(ranks[r])->sum_in_norm = 1;
        return 0;
    }
    return shared ? sum_on_device(ranks, n, which, len, err)
           : g0->comm ? sum_nccl(ranks, n, which, len, err)
                      : sum_through_host(ranks, n, which, len, err);
}

static const kl_backend_ops gpu_ops = {
    .slot_open = gpu_slot_open, .slot_close = gpu_slot_close, .slot_reset = gpu_slot_reset,
    .slot_copy = gpu_slot_copy, .slot_fill = gpu_slot_fill, .begin = gpu_begin,
    .norm = gpu_norm, .add_norm = gpu_add_norm,
    .kda = gpu_kda, .mla = gpu_mla, .moe = gpu_moe, .mlp = gpu_mlp, .head = gpu_head,
    .end = gpu_end, .destroy = gpu_destroy,
};

/* Ranks of engine/backend_tp.h may live on several devices driven from one thread: each of
 * their operations makes its rank's device current first (one table, so that a plain
 * backend's operations stay as they are). */
static int on_dev(kl_backend *be, kl_err *err)
{
    return kl_gpu_device_open(impl(be)->dev, NULL, 0, err);
}

static void on_dev_quiet(kl_backend *be)
{
    kl_err e;
    kl_err_clear(&e);
    (void)on_dev(be, &e);
}

#define RANK_OP(name, params, args)                                                            \
    static int rank_##name params                                                              \
    {                                                                                          \
        int rc = on_dev(be, err);                                                              \
        return rc ? rc : gpu_##name args;                                                      \
    }
RANK_OP(slot_open, (kl_backend *be, uint32_t *slot, kl_err *err), (be, slot, err))
RANK_OP(slot_copy, (kl_backend *be, uint32_t dst, uint32_t src, kl_err *err), (be, dst, src, err))
RANK_OP(slot_fill, (kl_backend *be, uint32_t slot, size_t n, kl_err *err), (be, slot, n, err))
RANK_OP(begin, (kl_backend *be, const kl_batch *c, kl_err *err), (be, c, err))
RANK_OP(norm, (kl_backend *be, kl_norm_which w, uint32_t l, kl_err *err), (be, w, l, err))
RANK_OP(add_norm, (kl_backend *be, kl_norm_which w, uint32_t l, kl_err *err), (be, w, l, err))
RANK_OP(kda, (kl_backend *be, uint32_t l, kl_err *err), (be, l, err))
RANK_OP(mla, (kl_backend *be, uint32_t l, kl_err *err), (be, l, err))
RANK_OP(moe, (kl_backend *be, uint32_t l, kl_err *err), (be, l, err))
RANK_OP(mlp, (kl_backend *be, uint32_t l, kl_err *err), (be, l, err))
RANK_OP(head, (kl_backend *be, float *logits, kl_token *argmax, kl_err *err),
        (be, logits, argmax, err))
RANK_OP(end, (kl_backend *be, kl_err *err), (be, err))

static void rank_slot_close(kl_backend *be, uint32_t slot)
{
    on_dev_quiet(be);
    gpu_slot_close(be, slot);
}

static void rank_slot_reset(kl_backend *be, uint32_t slot)
{
    on_dev_quiet(be);
    gpu_slot_reset(be, slot);
}

static void rank_destroy(kl_backend *be)
{
    on_dev_quiet(be);
    gpu_destroy(be);
}

static const kl_backend_ops gpu_rank_ops = {
    .slot_open = rank_slot_open, .slot_close = rank_slot_close, .slot_reset = rank_slot_reset,
    .slot_copy = rank_slot_copy, .slot_fill = rank_slot_fill, .begin = rank_begin,
    .norm = rank_norm, .add_norm = rank_add_norm, .kda = rank_kda, .mla = rank_mla,
    .moe = rank_moe, .mlp = rank_mlp, .head = rank_head, .end = rank_end,
    .destroy = rank_destroy, .all_reduce = gpu_all_reduce,
};

int kl_backend_gpu_check(kl_err *err)
{
    if (kl_gpu_device_count() < 1)
        return kl_fail(err, KL_E_UNSUPPORTED, "no GPU found (use --device cpu)");
    return 0;
}

int kl_backend_gpu_prepare(kl_gpu_prep **out, kl_err *err)
{
    *out = kl_gpu_prep_new();
    if (!*out)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    kl_gpu_prep_start(*out);
    return 0;
}

void kl_backend_gpu_prepare_free(kl_gpu_prep *pr)
{
    kl_gpu_prep_free(pr);
}

/* The backend's settings from the environment (engine/backend.h). */
static void read_settings(gpu_be *g)
{
    const char *chunk = getenv("KL_GPU_CHUNK");
    g->chunk = chunk && atoi(chunk) >= 16 && atoi(chunk) <= (int)GPU_CHUNK_MAX
                   ? (uint32_t)atoi(chunk) : GPU_CHUNK;
    const char *graphs = getenv("KL_GPU_GRAPHS"), *prof = getenv("KL_GPU_PROFILE");
    g->prof.on = prof && !strcmp(prof, "1");
    const char *gemm = getenv("KL_GPU_GEMM"), *fs = getenv("KL_GPU_FUSE_SMALL");
    /* tensor-core products for chunks (X in three bf16 parts, each K step's sums added in
     * fp32 registers: ~5e-7 a product, docs/CORRECTNESS.md); $KL_GPU_GEMM=0: fp32 kernels */
    g->gemm_on = !(gemm && !strcmp(gemm, "0"));
    if (!g->gemm_on)
        kl_gpu_experts_version_set(2);
    g->fuse_small = !(fs && !strcmp(fs, "0"));
    /* one-token steps: the router and KDA's conv ride in products' launches (profiling times
     * them apart); $KL_GPU_RIDE=0: their own launches */
    const char *ride = getenv("KL_GPU_RIDE");
    g->ride = !(ride && !strcmp(ride, "0")) && !g->prof.on;
    /* one-token steps: an add_norm made inside the next block's first product (its blocks
     * stage xn themselves); $KL_GPU_NORM_IN_PRODUCT=0: its own launch */
    const char *nip = getenv("KL_GPU_NORM_IN_PRODUCT");
    g->norm_in_product = !(nip && !strcmp(nip, "0")) && !g->prof.on;
    /* ... and a block's output product chained with them (kl_gpu_matmul_chain, one launch:
     * +2.3% decode, session 20); $KL_GPU_CHAIN=0: apart */
    const char *chain = getenv("KL_GPU_CHAIN");
    g->chain = !(chain && !strcmp(chain, "0")) && g->norm_in_product;
    g->graphs_on = !(graphs && !strcmp(graphs, "0")) && !g->prof.on;
}

/* Everything after the backend's host state: the prepared device and buffers, the weights
 * (pools and scratch meanwhile), the stream drained and the buffers freed; phases timed. */
static int create_device(gpu_be *g, kl_gpu_prep *pr, kl_err *err)
{
    int rc = kl_gpu_prep_take(pr, &g->load, err);
    if (!rc) {
        g->st = pr->st;   /* the backend's now */
        pr->st = NULL;
        rc = upload_model(g, pr, err);
    }
    double t0 = kl_now_s();
    if (!rc)
        rc = kl_gpu_stream_sync(g->st, err);
    kl_backend_gpu_prepare_free(pr);
    g->load.finish_s += kl_now_s() - t0;
    return rc;
}

int kl_backend_gpu_create_prepared(kl_backend **out, kl_model *m, kl_gpu_prep *pr, kl_err *err)
{
    *out = NULL;
    if (!pr && !(pr = kl_gpu_prep_new()))
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    if (!pr->started && m->matrices_read)   /* every byte from host memory: no ring */
        pr->want_buffers = 0;
    gpu_be *g = NULL;
    int rc = kl_backend_gpu_check(err);
    if (!rc && !(g = kl_calloc(1, sizeof *g)))
        rc = kl_fail(err, KL_E_NOMEM, "out of memory");
    if (rc) {
        kl_backend_gpu_prepare_free(pr);
        return rc;
    }
    read_settings(g);
    g->dev = pr->dev;
    g->grp[0] = g;   /* alone until kl_backend_gpu_create_ranks makes it a rank */
    g->grp_n = 1;
    g->base = (kl_backend){.ops = &gpu_ops, .name = "gpu", .m = m, .max_tokens = g->chunk,
                           .max_slots = GPU_SLOTS, .impl = g};
    get_dims(m, &g->d);
    g->L = kl_calloc(m->cfg.num_hidden_layers ? m->cfg.num_hidden_layers : 1, sizeof *g->L);
    g->mla_cap = kl_calloc(GPU_SLOTS, sizeof *g->mla_cap);
    g->base.slot_len = kl_calloc(GPU_SLOTS, sizeof *g->base.slot_len);
    g->base.slot_used = kl_calloc(GPU_SLOTS, sizeof *g->base.slot_used);
    if (!g->L || !g->mla_cap || !g->base.slot_used || !g->base.slot_len) {
        kl_backend_gpu_prepare_free(pr);
        rc = kl_fail(err, KL_E_NOMEM, "out of memory");
    } else {
        rc = create_device(g, pr, err);
    }
    if (rc) {
        gpu_destroy(&g->base);
        return rc;
    }
    *out = &g->base;
    return 0;
}

int kl_backend_gpu_create(kl_backend **out, kl_model *m, kl_err *err)
{
    return kl_backend_gpu_create_prepared(out, m, NULL, err);
}

/* ------------------------------------------------------------------------------------------ */
/* Tensor-parallel ranks: their arenas allocated, then filled together in one pass over the    */
/* files (kl_gpu_plan_merge): each byte read once and copied to every rank that holds it       */

/* The ranks' one fill: a copy goes to the stream of the rank whose arena holds dst (its
 * device made current first); a mark records the slot's event on every rank's own stream. */
typedef struct ranks_fill {
    gpu_be *const  *g;
    unsigned        n;
    uint8_t *const *arena;        /* [n_arenas] the merged plan's */
    const uint64_t *bytes;        /* [n_arenas] */
    uint32_t        n_arenas;
    int             cur;          /* the device current on the copying thread (-1: unknown) */
    kl_gpu_event    ev[RANKS_MAX][KL_FILL_MAX_SLOTS];   /* ranks with a stream of their own */
    uint64_t        copied[RANKS_MAX];                  /* bytes sent to each rank */
} ranks_fill;

/* The rank whose arena holds dst, its device current on this thread; bytes counted to it. */
static gpu_be *rank_of(ranks_fill *f, const void *dst, uint64_t bytes, kl_err *err)
{
    unsigned per = f->n_arenas / f->n;   /* each rank's plan has the same arenas */
    for (uint32_t a = 0; a < f->n_arenas; a++) {
        if ((const uint8_t *)dst < f->arena[a] || (const uint8_t *)dst >= f->arena[a] + f->bytes[a])
            continue;
        gpu_be *g = f->g[a / per];
        f->copied[a / per] += bytes;
        if (g->dev != f->cur && kl_gpu_device_open(g->dev, NULL, 0, err))
            return NULL;
        f->cur = g->dev;
        return g;
    }
    kl_fail(err, KL_E_BUG, "a copy to no rank's weights");
    return NULL;
}

static int ranks_copy(void *ctx, void *dst, const void *src, size_t bytes, int pinned,
                      kl_err *err)
{
    gpu_be *g = rank_of(ctx, dst, bytes, err);
    return g ? kl_gpu_h2d(dst, src, bytes, g->st, err) : err->code;
}

static int ranks_copy_rows(void *ctx, void *dst, const void *src, size_t width, size_t pitch,
                           size_t rows, int pinned, kl_err *err)
{
    gpu_be *g = rank_of(ctx, dst, (uint64_t)width * rows, err);
    return g ? kl_gpu_h2d_rows(dst, src, width, pitch, rows, g->st, err) : err->code;
}

static int ranks_mark(void *ctx, unsigned slot, kl_err *err)
{
    ranks_fill *f = ctx;
    int rc = 0;
    for (unsigned r = 0; r < f->n && !rc; r++)
        if (!f->g[r]->st_shared) {
            rc = kl_gpu_device_open(f->g[r]->dev, NULL, 0, err);
            f->cur = f->g[r]->dev;
            if (!rc)
                rc = kl_gpu_event_record(f->ev[r][slot], f->g[r]->st, err);
        }
    return rc;
}

static int ranks_wait(void *ctx, unsigned slot, kl_err *err)
{
    ranks_fill *f = ctx;
    int rc = 0;
    for (unsigned r = 0; r < f->n && !rc; r++)
        if (!f->g[r]->st_shared)
            rc = kl_gpu_event_sync(f->ev[r][slot], err);
    return rc;
}

/* How the ranks' fill reads: $KL_GPU_LOAD as kl_gpu_load_options takes it, but through the
 * ring where it names the staged reader (which refuses the ranks' shared bytes) or a hybrid. */
static const char *ranks_options(kl_fill_opts *o)
{
    const char *how = getenv("KL_GPU_LOAD");
    if (how && !strcmp(how, "direct"))
        how = "ring-direct";
    else if (how && (!strcmp(how, "read") || !strcmp(how, "hybrid")))
        how = "ring";
    return kl_gpu_load_options(how, 0, o);   /* copies to each rank: no lanes */
}

/* Every rank's pending arenas filled in one pass; the fill's figures go to rank 0's load, but
 * for the bytes each rank was sent (its own load's bytes). */
static int fill_ranks(gpu_be *const *g, unsigned n, const kl_model *m, kl_err *err)
{
    ranks_fill *f = kl_calloc(1, sizeof *f);
    kl_gpu_plan plans[RANKS_MAX], all = {0};
    uint8_t **arena = NULL;
    int rc = f ? 0 : kl_fail(err, KL_E_NOMEM, "out of memory");
    for (unsigned r = 0; r < n; r++)
        plans[r] = g[r]->pend_plan;
    if (!rc)
        rc = kl_gpu_plan_merge(plans, n, &all, err);
    if (!rc && !(arena = kl_calloc(all.n_arenas ? all.n_arenas : 1, sizeof *arena)))
        rc = kl_fail(err, KL_E_NOMEM, "out of memory");
    for (unsigned r = 0, a = 0; !rc && r < n; a += plans[r++].n_arenas)
        memcpy(arena + a, g[r]->pend_arena, plans[r].n_arenas * sizeof *arena);
    if (f)
        *f = (ranks_fill){.g = g, .n = n, .arena = arena, .bytes = all.arena_bytes,
                          .n_arenas = all.n_arenas, .cur = -1};
    for (unsigned r = 0; !rc && r < n; r++)
        for (unsigned s = 0; !rc && !g[r]->st_shared && s < KL_FILL_MAX_SLOTS; s++)
            if (!(rc = kl_gpu_device_open(g[r]->dev, NULL, 0, err)))
                rc = kl_gpu_event_create(&f->ev[r][s], err);
    kl_fill_opts o;
    kl_gpu_load_info *li = &g[0]->load;
    li->how = ranks_options(&o);
    kl_fill_ops ops = {f,          ranks_copy, NULL, NULL, ranks_mark, ranks_wait,
                       NULL,       NULL,       ranks_copy_rows,
                       NULL,       NULL,       NULL, NULL};   /* not staged: copies to each rank */
    kl_gpu_load_host_ops(&ops);
    kl_fill_stats st = {0};
    double t0 = kl_now_s();
    if (!rc)
        rc = kl_gpu_fill(&all, (const char *const *)m->shard_paths, arena, &ops, &o, &st, err);
    for (unsigned r = 0; r < n; r++) {   /* every copy done (or stopped) before anything goes */
        kl_err e;
        kl_err_clear(&e);
        int s = g[r]->st_shared ? 0 : kl_gpu_device_open(g[r]->dev, NULL, 0, &e);
        if (!s && !g[r]->st_shared)
            s = kl_gpu_stream_sync(g[r]->st, &e);
        if (s && !rc) {
            *err = e;
            rc = s;
        }
    }
    li->fill_s += kl_now_s() - t0;
    const kl_fill_stats none = {0};
    kl_gpu_load_note(li, &st, &none, &o);
    li->buffer_mem = "pinned";
    for (unsigned r = 0; f && r < n; r++)   /* each rank's own: the bytes sent to it */
        g[r]->load.bytes = f->copied[r];
    for (unsigned r = 0; f && r < n; r++)
        for (unsigned s = 0; s < KL_FILL_MAX_SLOTS; s++)
            kl_gpu_event_destroy(f->ev[r][s]);
    for (unsigned r = 0; r < n; r++) {   /* filled (or failed): the ranks hold no plan now */
        kl_gpu_plan_free(&g[r]->pend_plan);
        kl_free(g[r]->pend_arena);
        g[r]->pend_arena = NULL;
    }
    kl_gpu_plan_free(&all);
    kl_free(arena);
    kl_free(f);
    return rc;
}

/* Rank r, created on device r % ndev: a rank's ops and the stream of the first rank on its
 * device when there is one. */
static int rank_setup(kl_backend *const *be, unsigned r, unsigned ndev, kl_err *err)
{
    gpu_be *g = impl(be[r]);
    g->base.ops = &gpu_rank_ops;
    if (r < ndev)
        return 0;
    /* ranks on one device take turns on one stream: kernels that keep scratch in device
     * globals (the skinny products' split sums) must not run for two ranks at once */
    int rc = kl_gpu_stream_sync(g->st, err);
    if (!rc) {
        kl_gpu_stream_destroy(g->st);
        g->st = impl(be[r % ndev])->st;
        g->st_shared = 1;
    }
    return rc;
}

/* The ranks made one group that steps as one (see "Steps"), and where their sums will run
 * (rank 0's comm and sum_how): on the device when every rank is on one, through NCCL when
 * each has its own, else (no library; ranks sharing some devices) through the host, which
 * waits between blocks: no graphs then. */
static void sums_setup(gpu_be *const *g, unsigned n, unsigned ndev)
{
    for (unsigned r = 0; r < n; r++) {
        memcpy(g[r]->grp, g, n * sizeof *g);
        g[r]->grp_n = n;
        g[r]->grp_r = r;
    }
    gpu_be *g0 = g[0];
    const size_t cap = sizeof g0->sum_how;
    int devs[RANKS_MAX], host = 0;
    kl_err e;
    kl_err_clear(&e);
    for (unsigned r = 0; r < n; r++)
        devs[r] = g[r]->dev;
    if (n < 2)
        snprintf(g0->sum_how, cap, "none (one rank)");
    else if (ndev == 1)
        snprintf(g0->sum_how, cap, "device (the ranks share one GPU; a block's outputs added "
                 "by the next norm)");
    else if ((host = n > ndev))
        snprintf(g0->sum_how, cap, "host (%u ranks on %u GPUs)", n, ndev);
    else if (!kl_gpu_comm_create(&g0->comm, devs, n, &e))
        snprintf(g0->sum_how, cap, "nccl (%s)", kl_gpu_comm_library());
    else {
        host = 1;
        snprintf(g0->sum_how, cap, "host (%s)", e.msg);
    }
    for (unsigned r = 0; host && r < n; r++)
        g[r]->graphs_on = 0;
}

int kl_backend_gpu_create_ranks(kl_backend **out, kl_model *const *cuts, unsigned n,
                                kl_err *err)
{
    if (!n || n > RANKS_MAX)
        return kl_fail(err, KL_E_USAGE, "%u GPU ranks (1 to %d)", n, RANKS_MAX);
    memset(out, 0, n * sizeof *out);
    const unsigned ndev = kl_gpu_device_count() > 0 ? (unsigned)kl_gpu_device_count() : 1;
    gpu_be *g[RANKS_MAX];
    int rc = 0;
    for (unsigned r = 0; r < n && !rc; r++) {
        kl_gpu_prep *pr = kl_gpu_prep_new();
        if (!pr) {
            rc = kl_fail(err, KL_E_NOMEM, "out of memory");
            break;
        }
        pr->dev = (int)(r % ndev);
        pr->want_buffers = 0;   /* the ranks' one fill allocates its own */
        pr->defer_fill = 1;
        if (!(rc = kl_backend_gpu_create_prepared(&out[r], cuts[r], pr, err)))
            rc = rank_setup(out, r, ndev, err);
        g[r] = out[r] ? impl(out[r]) : NULL;
    }
    if (!rc)
        rc = fill_ranks(g, n, cuts[0], err);
    if (!rc)
        sums_setup(g, n, ndev);
    for (unsigned r = 0; rc && r < n; r++) {
        kl_backend_free(out[r]);
        out[r] = NULL;
    }
    return rc;
}

int kl_backend_gpu_devices(void)
{
    return kl_gpu_device_count();
}

const char *kl_backend_gpu_tp_sums(const kl_backend *be)
{
    kl_backend *r0 = kl_backend_tp_rank(be, 0);
    return r0 && r0->ops == &gpu_rank_ops ? impl(r0)->sum_how : "";
}

int kl_backend_gpu_available(void)
{
    return kl_gpu_device_count() > 0;
}

/* Adds rank info r to the sum s (the ranks were loaded one after another). */
static void add_load_info(kl_gpu_load_info *s, const kl_gpu_load_info *r)
{
    s->bytes += r->bytes, s->windows += r->windows, s->pinned += r->pinned;
    s->staged += r->staged;
    double *sum[] = {&s->device_s, &s->buffers_s, &s->wait_s, &s->plan_s, &s->alloc_s,
                     &s->fill_s, &s->pools_s, &s->finish_s, &s->fill_read_s, &s->fill_wait_s,
                     &s->fill_idle_s, &s->fill_issue_s};
    const double *add[] = {&r->device_s, &r->buffers_s, &r->wait_s, &r->plan_s, &r->alloc_s,
                           &r->fill_s, &r->pools_s, &r->finish_s, &r->fill_read_s,
                           &r->fill_wait_s, &r->fill_idle_s, &r->fill_issue_s};
    for (size_t i = 0; i < sizeof sum / sizeof *sum; i++)
        *sum[i] += *add[i];
}

void kl_backend_gpu_load_info(const kl_backend *be, kl_gpu_load_info *out)
{
    *out = be && (be->ops == &gpu_ops || be->ops == &gpu_rank_ops)
               ? impl((kl_backend *)be)->load
               : (kl_gpu_load_info){.how = ""};
    const unsigned n = kl_backend_tp_size(be);
    for (unsigned r = 0; r < n; r++) {   /* tensor parallel: rank 0's settings, summed work */
        kl_gpu_load_info ri;
        kl_backend_gpu_load_info(kl_backend_tp_rank(be, r), &ri);
        if (!r)
            *out = ri;
        else
            add_load_info(out, &ri);
    }
}

void kl_backend_gpu_profile(kl_backend *be, kl_gpu_profile *out, int reset)
{
    if (kl_backend_tp_size(be))   /* tensor parallel: rank 0's (it counts the step's graphs) */
        be = kl_backend_tp_rank(be, 0);
    kl_gpu_profile *p = be && (be->ops == &gpu_ops || be->ops == &gpu_rank_ops)
                            ? &impl(be)->prof : NULL;
    if (out)
        *out = p ? *p : (kl_gpu_profile){0};
    if (p && reset) {
        memset(p->op_s, 0, sizeof p->op_s);
        memset(p->op_n, 0, sizeof p->op_n);
        memset(p->part_s, 0, sizeof p->part_s);
    }
}

int kl_backend_gpu_ceilings(kl_gpu_ceilings *c, kl_err *err)
{
    memset(c, 0, sizeof *c);
    size_t fr;
    int rc = kl_gpu_device_open(0, c->device, sizeof c->device, err);
    if (!rc)
        rc = kl_gpu_mem_info(&fr, &c->mem_total, err);
    c->mem_used = rc ? 0 : c->mem_total - fr;
    if (!rc)
        rc = kl_gpu_measure_rates((size_t)1 << 30, 5, &c->hbm_gbps, &c->h2d_gbps, err);
    return rc;
}

#else /* no GPU support in this build */

void kl_backend_gpu_profile(kl_backend *be, kl_gpu_profile *out, int reset)
{
    (void)be;
    (void)reset;
    if (out)
        *out = (kl_gpu_profile){0};
}

static int no_gpu(kl_err *err)
{
    return kl_fail(err, KL_E_UNSUPPORTED, "this kl was built without GPU support (build it "
                   "with make GPU=cuda or make GPU=hip)");
}

int kl_backend_gpu_prepare(kl_gpu_prep **out, kl_err *err)
{
    *out = NULL;
    return no_gpu(err);
}

void kl_backend_gpu_prepare_free(kl_gpu_prep *pr)
{
    (void)pr;
}

int kl_backend_gpu_create_prepared(kl_backend **out, kl_model *m, kl_gpu_prep *pr, kl_err *err)
{
    (void)m;
    (void)pr;
    *out = NULL;
    return no_gpu(err);
}

int kl_backend_gpu_create(kl_backend **out, kl_model *m, kl_err *err)
{
    return kl_backend_gpu_create_prepared(out, m, NULL, err);
}

const char *kl_backend_gpu_tp_sums(const kl_backend *be)
{
    (void)be;
    return "";
}

int kl_backend_gpu_create_ranks(kl_backend **out, kl_model *const *cuts, unsigned n,
                                kl_err *err)
{
    (void)cuts;
    memset(out, 0, n * sizeof *out);
    return no_gpu(err);
}

int kl_backend_gpu_devices(void)
{
    return 0;
}

int kl_backend_gpu_available(void)
{
    return 0;
}

int kl_backend_gpu_check(kl_err *err)
{
    return no_gpu(err);
}

void kl_backend_gpu_load_info(const kl_backend *be, kl_gpu_load_info *out)
{
    (void)be;
    *out = (kl_gpu_load_info){.how = ""};
}

int kl_backend_gpu_ceilings(kl_gpu_ceilings *c, kl_err *err)
{
    memset(c, 0, sizeof *c);
    return no_gpu(err);
}

#endif
