/*
 * convert/converter.c — BF16 -> MXFP4 experts, streaming and crash-safe (see converter.h).
 *
 * Sections: the plan (what goes where), the journal (what is already done), one shard
 * (read, quantize or copy, write), the small files (config, index, tokenizer), public API.
 */
#include "convert/converter.h"

#include "common/clock.h"
#include "common/cpu.h"
#include "common/fasthash.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/mem.h"
#include "common/pool.h"
#include "convert/layout.h"
#include "convert/out_plan.h"
#include "convert/shard_digest.h"
#include "convert/st_writer.h"
#include "convert/write_behind.h"
#include "loader/checkpoint.h"
#include "loader/ckcheck.h"
#include "loader/hashpass.h"
#include "loader/reader.h"
#include "loader/schema.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define JOURNAL_NAME "kl-convert.journal"
/* 2: shard digests (shard_digest.h); 3: each shard bound to its source (digest, sizes, mtimes);
 * 4: the source digest is XXH3-128 (kl_srcdigest), not SHA-256 */
#define JOURNAL_VERSION "kl-convert-journal 4"
#define JOURNAL_MAGIC "kl-convert-journal " /* any version: the journal of a kl convert run */
#define DEFAULT_SHARD_BYTES 5000000000ull
#define DEFAULT_MAX_MEMORY (2ull << 30)
#define CHUNK_BYTES (8u << 20)       /* reader chunk: the largest batch of rows */
#define CARRY_BYTES (256u << 10)     /* the longest source row */
#define GROUP_BYTES (64u << 10)      /* source bytes per quantizer item (whole rows) */
/* Copied bytes per write-behind item: several fit the queue's arena even at the smallest
 * budget (64 MiB: an 8 MiB arena, where a whole 8 MiB chunk would wait for an empty queue). */
#define COPY_ITEM_BYTES ((size_t)2 << 20)

/* ---- the plan ------------------------------------------------------------------------------ */


typedef struct conv {
    const kl_convert_opts *o;
    kl_checkpoint          ck;
    kl_ckcheck             check;      /* the source's metadata check: its tensor per entry */
    kl_config              cfg;        /* output config (MXFP4 family) */
    kl_schema              schema;     /* output schema */
    kl_layout              layout;
    const kl_ckpt_tensor **srcs;       /* [schema.n] source tensor (for PACKED and SCALE: the
                                           BF16 weight it is made from) */
    kl_dtype              *dtypes;     /* [schema.n] output dtype */
    uint64_t              *bytes;      /* [schema.n] output payload bytes */
    kl_out_plan            out;        /* the shards' file sizes */
    char                   partial[PATH_MAX];
    char                   dst_parent[PATH_MAX]; /* resolved: where DST and DST.partial go */
    size_t                 kill_after, kill_mid; /* KL_CONVERT_TEST_KILL (0 = off) */
    size_t                 shards_run;           /* shards converted by this run */
    kl_reader             *reader;
    kl_pool               *pool;
    uint64_t               total_out, done_out;
    double                 t0, last_progress;
    kl_convert_result      res;
    kl_wb                 *wb;       /* output bytes go through this write-behind queue */
} conv;

/* Source tensor for output entry e, as the source's check bound it: the same entry (found by
 * name or alias), or for MXFP4 parts the BF16 weight they are made from. */
static const kl_ckpt_tensor *find_source(const conv *c, const kl_schema_entry *e)
{
    if (e->part == KL_PART_WEIGHT)
        return kl_ckcheck_tensor(&c->check, e->name);
    char name[256];
    const char *dot = strrchr(e->name, '.'); /* ".weight_packed" / ".weight_scale" */
    if (!dot || (size_t)(dot - e->name) + 8 > sizeof name)
        return NULL;
    snprintf(name, sizeof name, "%.*s.weight", (int)(dot - e->name), e->name);
    return kl_ckcheck_tensor(&c->check, name);
}

/* The source's metadata check (loader/ckcheck: what kl audit reports as an error refuses the
 * conversion with its first finding), then the MXFP4 schema and the source of every entry. */
static int plan(conv *c, kl_err *err)
{
    int rc = kl_ckcheck_require(&c->check, &c->ck, err);
    if (rc)
        return rc;
    c->cfg = c->ck.config;
    kl_config_set_mxfp4(&c->cfg);
    rc = kl_schema_build(&c->schema, &c->cfg, err);
    if (rc)
        return rc;
    size_t n = c->schema.n;
    c->srcs = kl_calloc(n, sizeof *c->srcs);
    c->dtypes = kl_calloc(n, sizeof *c->dtypes);
    c->bytes = kl_calloc(n, sizeof *c->bytes);
    if (!c->srcs || !c->dtypes || !c->bytes)
        return kl_fail(err, KL_E_NOMEM, "out of memory planning %zu tensors", n);
    for (size_t i = 0; i < n; i++) {
        const kl_schema_entry *e = &c->schema.entries[i];
        const kl_ckpt_tensor *t = find_source(c, e);
        if (!t)
            return kl_fail_at(err, KL_E_SCHEMA, "SCHEMA-MISSING", e->name, KL_NO_OFFSET,
                              "no source tensor for this output tensor");
        if (e->part != KL_PART_WEIGHT && t->t->dtype != KL_DT_BF16 && t->t->dtype != KL_DT_F32)
            return kl_fail_at(err, KL_E_UNSUPPORTED, "CONVERT-DTYPE", t->name, KL_NO_OFFSET,
                              "expert weights must be BF16 or F32 to quantize, not %s",
                              kl_dtype_name(t->t->dtype));
        c->srcs[i] = t;
        c->dtypes[i] = e->part == KL_PART_WEIGHT ? t->t->dtype : KL_DT_U8;
        c->bytes[i] = e->part == KL_PART_WEIGHT ? t->t->n_bytes : e->numel;
        c->total_out += c->bytes[i];
    }
    uint64_t shard_bytes = c->o->shard_bytes ? c->o->shard_bytes : DEFAULT_SHARD_BYTES;
    rc = kl_layout_plan(&c->layout, &c->schema, c->bytes, shard_bytes, err);
    return rc ? rc : kl_out_plan_build(&c->out, &c->schema, &c->layout, c->dtypes, err);
}

/* The writer's tensor list of shard k (wt: layout.shards[k].count entries). */
static void shard_wtensors(const conv *c, size_t k, kl_st_wtensor *wt)
{
    kl_out_plan_wtensors(&c->schema, &c->layout, c->dtypes, k, wt);
}

/* The source extents of shard k in job order (one per output tensor but the weight_scales,
 * made with their weight_packed); pos[j] (may be NULL) receives the shard position of job j.
 * ext and pos hold layout.shards[k].count entries.  Returns the count. */
static size_t shard_extents(const conv *c, size_t k, kl_extent *ext, size_t *pos)
{
    const kl_layout_shard *ls = &c->layout.shards[k];
    size_t n = 0;
    for (size_t i = 0; i < ls->count; i++) {
        size_t si = c->layout.order[ls->first + i];
        if (c->schema.entries[si].part == KL_PART_SCALE)
            continue;
        const kl_ckpt_tensor *t = c->srcs[si];
        ext[n] = (kl_extent){(uint32_t)t->shard, t->t->file_off, t->t->n_bytes};
        if (pos)
            pos[n] = i;
        n++;
    }
    return n;
}

/* Shard k's header as its writer lays it out (*hdr, kl_malloc'd) and the pieces of its
 * digest (*pieces, kl_malloc'd, count + 1): the header, then every tensor in file order. */
static int shard_pieces(const conv *c, size_t k, uint8_t **hdr, uint64_t **pieces, kl_err *err)
{
    size_t n = c->layout.shards[k].count;
    kl_st_wtensor *wt = kl_calloc(n ? n : 1, sizeof *wt);
    *hdr = NULL;
    *pieces = kl_calloc(n + 1, sizeof **pieces);
    int rc = wt && *pieces ? 0 : kl_fail(err, KL_E_NOMEM, "out of memory planning a digest");
    if (!rc) {
        shard_wtensors(c, k, wt);
        /* the writer's own call (data_align 0 = its default): the same bytes */
        rc = kl_st_header_build(wt, n, 0, hdr, &(*pieces)[0], NULL, *pieces + 1, err);
    }
    kl_free(wt);
    return rc;
}

/* ---- the journal --------------------------------------------------------------------------- */

/* FNV-1a step over the 8 bytes of v. */
static uint64_t mix(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++, v >>= 8) {
        h ^= v & 0xff;
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t mix_text(uint64_t h, const char *p)
{
    for (; *p; p++)
        h = mix(h, (unsigned char)*p);
    return mix(h, 0);
}

#define MIX_SEED 1469598103934665603ull

/* The plan's fingerprint: a rerun may reuse shards only if source, rule and layout agree. */
static void fingerprint(const conv *c, char *out, size_t n)
{
    uint64_t h = MIX_SEED;
    for (size_t i = 0; i < c->ck.n_shards; i++) {
        h = mix_text(h, c->ck.shards[i].name);
        h = mix(h, c->ck.shards[i].st.file_bytes);
    }
    h = mix(h, (uint64_t)c->o->rule);
    for (size_t k = 0; k < c->layout.n_shards; k++) {
        h = mix(h, c->layout.shards[k].count);
        h = mix(h, c->layout.shards[k].tensor_bytes);
    }
    snprintf(out, n, "%s plan=%016llx rule=%s", JOURNAL_VERSION, (unsigned long long)h,
             kl_scale_rule_name(c->o->rule));
}

/* The identity of the source files shard k reads, as the file system tells it: name, size,
 * mtime and ctime (which `touch -r` cannot set back) of each, in source order.  Cheap; the
 * source digest (below) binds the bytes themselves. */
static int source_files_id(const conv *c, size_t k, uint64_t *id, kl_err *err)
{
    const kl_layout_shard *ls = &c->layout.shards[k];
    uint64_t h = MIX_SEED;
    for (size_t f = 0; f < c->ck.n_shards; f++) {
        int used = 0;
        for (size_t i = 0; i < ls->count && !used; i++)
            used = c->srcs[c->layout.order[ls->first + i]]->shard == f;
        if (!used)
            continue;
        struct stat st;
        if (stat(c->ck.shards[f].path, &st) != 0) {
            kl_fail_sys(err, KL_E_IO, errno, "cannot stat a source shard");
            kl_err_context(err, c->ck.shards[f].path, NULL, KL_NO_OFFSET, NULL);
            return KL_E_IO;
        }
        h = mix_text(h, c->ck.shards[f].name);
        h = mix(h, (uint64_t)st.st_size);
        h = mix(mix(h, (uint64_t)st.st_mtim.tv_sec), (uint64_t)st.st_mtim.tv_nsec);
        h = mix(mix(h, (uint64_t)st.st_ctim.tv_sec), (uint64_t)st.st_ctim.tv_nsec);
    }
    *id = h;
    return 0;
}

/* The pieces of shard k's source digest: its source extents in job order (shard_extents).
 * *ext and *pieces are kl_malloc'd; *n their count. */
static int source_pieces(const conv *c, size_t k, kl_extent **ext, uint64_t **pieces, size_t *n,
                         kl_err *err)
{
    size_t cap = c->layout.shards[k].count ? c->layout.shards[k].count : 1;
    *ext = kl_calloc(cap, sizeof **ext);
    *pieces = kl_calloc(cap, sizeof **pieces);
    if (!*ext || !*pieces)
        return kl_fail(err, KL_E_NOMEM, "out of memory planning a source digest");
    *n = shard_extents(c, k, *ext, NULL);
    for (size_t i = 0; i < *n; i++)
        (*pieces)[i] = (*ext)[i].len;
    return 0;
}

/* The pool that hashes whole source leaves, or NULL: the converting thread alone.  XXH3 runs
 * at ~16 GB/s on one core; 28 GB of source is 1.75 s on one thread, ~0.15 s on 16.  With
 * fewer than 4 threads, waking the pool cost more than it saved (2-core VM, 5.4 GB: 0.33 s
 * on the thread alone, 0.73-0.87 s with the pool of 2). */
static kl_pool *hash_pool(const conv *c)
{
    return kl_pool_threads(c->pool) >= 4 ? c->pool : NULL;
}

typedef struct feed {
    kl_srcdigest *dg;
    kl_err      err; /* why feeding stopped */
} feed;

static int feed_source(void *ctx, size_t ext_idx, uint64_t ext_off, const uint8_t *data,
                       size_t len)
{
    feed *f = ctx;
    return kl_srcdigest_update(f->dg, ext_idx, ext_off, data, len, &f->err);
}

/* Shard k's source digest, read now: the same pieces the conversion hashed as it read them. */
static int source_digest(const conv *c, size_t k, unsigned char out[KL_SRCDIGEST_BYTES],
                         kl_err *err)
{
    kl_extent *ext;
    uint64_t *pieces;
    size_t n = 0;
    feed f = {.dg = NULL};
    kl_err_clear(&f.err);
    int rc = source_pieces(c, k, &ext, &pieces, &n, err);
    if (!rc)
        rc = kl_srcdigest_create(&f.dg, pieces, n, hash_pool(c), err);
    if (!rc)
        rc = kl_reader_run_gathered(c->reader, ext, n, KL_GATHER_GAP, feed_source, &f, err);
    if (rc == KL_E_CANCELLED && f.err.code) { /* the digest's own error */
        if (err)
            *err = f.err;
        rc = f.err.code;
    }
    if (!rc)
        rc = kl_srcdigest_final(f.dg, out, err);
    kl_srcdigest_destroy(f.dg);
    kl_free(ext);
    kl_free(pieces);
    return rc;
}

/* What the journal records for a finished shard. */
typedef struct shard_record {
    uint64_t      size;
    unsigned char digest[32];     /* the shard file's digest (shard_digest.h) */
    unsigned char src_digest[KL_SRCDIGEST_BYTES]; /* its source extents' (kl_srcdigest) */
    uint64_t      src_files;      /* source_files_id when it was read */
} shard_record;

/* The output shard's digest, read back. */
static int shard_file_digest(const conv *c, size_t k, const char *path, unsigned char out[32])
{
    uint8_t *hdr;
    uint64_t *pieces;
    int rc = shard_pieces(c, k, &hdr, &pieces, NULL);
    if (!rc)
        rc = kl_sdigest_file(path, pieces, c->layout.shards[k].count + 1, out, NULL);
    kl_free(hdr);
    kl_free(pieces);
    return rc;
}

/* *done = 1 if the journal in DST.partial records shard k complete, with the file's current
 * size and digest, made from source files that still have the recorded identity and bytes.
 * A journal with another fingerprint proves nothing.  0, or the error of reading the source
 * (a source that cannot be read cannot be converted either). */
static int journal_says_done(const conv *c, const char *journal, size_t k, int *done, kl_err *err)
{
    *done = 0;
    const char *name = c->layout.shards[k].name;
    char fp[128], path[PATH_MAX];
    fingerprint(c, fp, sizeof fp);
    size_t fl = strlen(fp);
    if (strncmp(journal, fp, fl) || journal[fl] != '\n')
        return 0;
    char key[128];
    snprintf(key, sizeof key, "\ndone %s ", name);
    /* the last line for the shard: a shard redone after a failed check is appended again */
    const char *at = NULL;
    for (const char *f = strstr(journal + fl, key); f; f = strstr(f + 1, key))
        at = f;
    unsigned long long size, files;
    char hex[65], src_hex[33], got[65];
    if (!at || sscanf(at + strlen(key), "%llu %64s %32s %16llx", &size, hex, src_hex, &files) != 4)
        return 0;
    uint64_t files_now;
    int rc = source_files_id(c, k, &files_now, err);
    if (rc || files_now != files)
        return rc;
    if (kl_path_join(path, sizeof path, c->partial, name, NULL))
        return 0;
    struct stat st;
    if (stat(path, &st) != 0 || (unsigned long long)st.st_size != size)
        return 0;
    unsigned char sum[32];
    if (shard_file_digest(c, k, path, sum))
        return 0;
    kl_sha256_hex(sum, got);
    if (strcmp(got, hex))
        return 0;
    if ((rc = source_digest(c, k, sum, err)))
        return rc;
    kl_fasthash_hex(sum, got);
    *done = strcmp(got, src_hex) == 0;
    return 0;
}

/* Starts a fresh journal (fingerprint line) unless the existing one has the same plan.  The
 * caller checked (check_partial) that every file in DST.partial is one kl convert writes. */
static int journal_open(const conv *c, char **text, kl_err *err)
{
    char path[PATH_MAX], fp[128];
    fingerprint(c, fp, sizeof fp);
    *text = NULL;
    if (kl_path_join(path, sizeof path, c->partial, JOURNAL_NAME, err))
        return KL_E_USAGE;
    size_t len;
    kl_err ignore;
    kl_err_clear(&ignore);
    if (kl_read_file(path, 16u << 20, text, &len, &ignore) == 0 && !strncmp(*text, fp, strlen(fp)))
        return 0;
    kl_free(*text);
    *text = NULL;
    /* Another plan, an older journal format (or no journal): nothing in DST.partial can be
     * trusted or kept, and a stale shard of another plan must not end up in DST. */
    char **names = NULL;
    size_t n_names = 0;
    if (kl_list_files_with_suffix(c->partial, "", &names, &n_names, err))
        return err ? err->code : KL_E_IO;
    for (size_t i = 0; i < n_names; i++) {
        char stale[PATH_MAX];
        if (!kl_path_join(stale, sizeof stale, c->partial, names[i], NULL))
            unlink(stale);
    }
    kl_free_name_list(names, n_names);
    char line[160];
    int n = snprintf(line, sizeof line, "%s\n", fp);
    return kl_write_file_atomic(c->partial, JOURNAL_NAME, line, (size_t)n, err);
}

/* Appends "done NAME SIZE DIGEST SOURCE-DIGEST SOURCE-FILES" and fsyncs, after the shard
 * itself is durable.  DIGEST is the shard digest (shard_digest.h) its lanes computed while
 * writing it, SOURCE-DIGEST the kl_srcdigest of the source extents it was made from (hashed
 * where the reader put them), SOURCE-FILES the source files' identity (source_files_id) before
 * they were read.  The line starts with its own newline: a line torn by a crash mid-append
 * then cannot swallow the next one (blank lines are harmless to journal_says_done). */
static int journal_add(const conv *c, const char *name, const shard_record *r, kl_err *err)
{
    char jpath[PATH_MAX];
    if (kl_path_join(jpath, sizeof jpath, c->partial, JOURNAL_NAME, err))
        return KL_E_USAGE;
    char hex[65], src_hex[33], line[320];
    kl_sha256_hex(r->digest, hex);
    kl_fasthash_hex(r->src_digest, src_hex);
    int n = snprintf(line, sizeof line, "\ndone %s %llu %s %s %016llx\n", name,
                     (unsigned long long)r->size, hex, src_hex, (unsigned long long)r->src_files);
    int fd = open(jpath, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot open the journal");
        kl_err_context(err, jpath, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    int rc = kl_write_all(fd, line, (size_t)n, jpath, err);
    if (!rc && fsync(fd) != 0)
        rc = kl_fail_sys(err, KL_E_IO, errno, "cannot fsync the journal");
    close(fd);
    return rc;
}

/* ---- one shard ----------------------------------------------------------------------------- */

/* Which write-behind lane takes a run of bytes whose digest leaf needs them in order: `lane`
 * for the bytes before `end`. */
typedef struct leaf_lane {
    unsigned lane;
    uint64_t end;
} leaf_lane;

/* One source tensor being streamed into one or two output tensors. */
typedef struct job {
    size_t          packed, scale;  /* writer indices (scale unused for copies) */
    int             quantize;
    const kl_ckpt_tensor *src;
    uint64_t        row_in_bytes;   /* source bytes per row (quantized tensors) */
    uint64_t        n_in;           /* elements per row */
    uint64_t        row;            /* next row to quantize */
    leaf_lane       out;            /* lanes of the output bytes (quantized: one for all) */
} job;

typedef struct shard_run {
    conv          *c;
    kl_st_writer   w;
    kl_sdigest    *dg;              /* the journal's digest, fed by the writer lanes */
    kl_wb_target   tgt;             /* the write-behind queue's view of w and dg */
    kl_srcdigest  *src_dg;          /* the source extents' digest, fed by on_chunk */
    uint64_t       src_read, src_total; /* source bytes of this shard read, and in all */
    job           *jobs;
    size_t         n_jobs;
    uint8_t       *carry;           /* partial row between chunks */
    size_t         carry_len;
    /* quantization of one batch of rows */
    const uint8_t *rows;
    size_t         n_rows;
    size_t         group;           /* rows per quantizer item */
    size_t         n_leaf;          /* source digest leaves of the chunk, hashed in its run */
    job           *cur;
    uint8_t       *packed, *scale;  /* the batch's codes and scales: a queue reservation */
    atomic_int     qrc;             /* first quantizer failure of the batch */
    size_t         bad_row, bad_block;
    kl_err         row_err;         /* its details */
    kl_err         cb_err;          /* why the reader callback stopped */
} shard_run;

static void quantize_one(shard_run *s, size_t i)
{
    const job *j = s->cur;
    const uint8_t *in = s->rows + i * j->row_in_bytes;
    uint8_t *pk = s->packed + i * (j->n_in / 2), *sc = s->scale + i * (j->n_in / 32);
    size_t bad = 0;
    kl_err e;
    kl_err_clear(&e);
    int rc;
    if (j->src->t->dtype == KL_DT_BF16)
        rc = kl_mxfp4_quantize_row_bf16((const uint16_t *)in, j->n_in, s->c->o->rule, pk, sc,
                                        &bad, &e);
    else
        rc = kl_mxfp4_quantize_row_f32((const float *)in, j->n_in, s->c->o->rule, pk, sc, &bad,
                                       &e);
    int none = 0;
    if (rc && atomic_compare_exchange_strong(&s->qrc, &none, rc)) { /* first failure wins */
        s->bad_row = j->row + i;
        s->bad_block = bad;
        s->row_err = e;
    }
}

/* Pool item g: rows [g * group, (g + 1) * group) of the batch. */
static void quantize_group(void *arg, size_t g)
{
    shard_run *s = arg;
    size_t end = (g + 1) * s->group < s->n_rows ? (g + 1) * s->group : s->n_rows;
    for (size_t i = g * s->group; i < end; i++)
        quantize_one(s, i);
}

/* Pool item i of a chunk's run: the chunk's n_leaf source digest leaves first, then the row
 * groups, so the hashing overlaps the quantizing and the pool wakes once per chunk. */
static void chunk_item(void *arg, size_t i)
{
    shard_run *s = arg;
    if (i < s->n_leaf)
        kl_srcdigest_leaf(s->src_dg, i);
    else
        quantize_group(s, i - s->n_leaf);
}

/* Quantizes n whole rows at `rows` straight into a write-behind reservation (codes, then
 * scales: one item, so both tensors' bytes reach the digest in order on the job's lane) and
 * queues it. */
static int quantize_rows(shard_run *s, job *j, const uint8_t *rows, size_t n, kl_err *err)
{
    size_t pk = j->n_in / 2, sc = j->n_in / 32;
    kl_wb_seg seg[2] = {{j->packed, j->row * pk, n * pk}, {j->scale, j->row * sc, n * sc}};
    kl_wb_item *it;
    uint8_t *out;
    if (!j->out.end) { /* the whole job on one lane: its leaves are hashed in order */
        j->out.lane = kl_wb_pick_lane(s->c->wb);
        j->out.end = UINT64_MAX;
    }
    double t0 = kl_now_s();
    int rc = kl_wb_reserve(s->c->wb, &s->tgt, j->out.lane, seg, 2, &it, &out, err);
    s->c->res.write_s += kl_now_s() - t0;
    if (rc)
        return rc;
    s->rows = rows;
    s->n_rows = n;
    s->cur = j;
    s->packed = out;
    s->scale = out + n * pk;
    s->group = GROUP_BYTES / j->row_in_bytes ? GROUP_BYTES / j->row_in_bytes : 1;
    t0 = kl_now_s();
    kl_pool_run(s->c->pool, s->n_leaf + (n + s->group - 1) / s->group, chunk_item, s);
    s->n_leaf = 0;
    s->c->res.quantize_s += kl_now_s() - t0;
    if (atomic_load(&s->qrc)) {
        kl_wb_cancel(s->c->wb, it);
        return kl_fail_at(err, atomic_load(&s->qrc), "MXFP4-NONFINITE", j->src->name,
                          KL_NO_OFFSET, "row %zu block %zu: %s", s->bad_row, s->bad_block,
                          s->row_err.msg);
    }
    kl_wb_commit(s->c->wb, it);
    j->row += n;
    return 0;
}

/* Queues a copy of len bytes of piece `piece` at `off` for target t.  A digest leaf's bytes
 * must be hashed in order, so each leaf goes to one lane, and the next leaf to the least busy
 * lane: a large tensor (an embedding) spreads over all lanes. */
static int queue_by_leaf(shard_run *s, const kl_wb_target *t, leaf_lane *ll, size_t piece,
                         uint64_t off, const uint8_t *data, size_t len, kl_err *err)
{
    while (len) {
        if (off >= ll->end) {
            ll->lane = kl_wb_pick_lane(s->c->wb);
            ll->end = (off / KL_SDIGEST_LEAF + 1) * KL_SDIGEST_LEAF;
        }
        size_t take = ll->end - off < len ? (size_t)(ll->end - off) : len;
        take = take < COPY_ITEM_BYTES ? take : COPY_ITEM_BYTES;
        int rc = kl_wb_write(s->c->wb, t, ll->lane, piece, off, data, take, err);
        if (rc)
            return rc;
        off += take;
        data += take;
        len -= take;
    }
    return 0;
}

/* Test-only fault injection (as KL_CPU_KERNELS is for the kernels): the kill tests stop a
 * conversion at a known point instead of after a guessed delay.  KL_CONVERT_TEST_KILL=N
 * SIGKILLs the process right after the N-th shard of this run is journaled; =mid:N halfway
 * through reading the N-th shard's source. */
static void test_kill_config(conv *c)
{
    const char *v = getenv("KL_CONVERT_TEST_KILL");
    if (!v)
        return;
    int mid = !strncmp(v, "mid:", 4);
    unsigned long n = strtoul(mid ? v + 4 : v, NULL, 10);
    if (mid)
        c->kill_mid = n;
    else
        c->kill_after = n;
}

static void test_kill_at(size_t want, size_t now)
{
    if (want && want == now)
        raise(SIGKILL);
}

static int report_progress(conv *c)
{
    double now = kl_now_s();
    if (!c->o->progress || now - c->last_progress < 0.1)
        return 0;
    c->last_progress = now;
    return c->o->progress(c->o->progress_ctx, c->done_out, c->total_out);
}

/* The rows of a chunk of a quantized tensor: finishes a row carried over from the last chunk,
 * then quantizes the whole rows together with the chunk's digest leaves (s->n_leaf) and keeps
 * the rest. */
static int quantize_chunk(shard_run *s, job *j, const uint8_t *data, size_t len, kl_err *err)
{
    int rc = 0;
    if (s->carry_len) {
        size_t take = (size_t)j->row_in_bytes - s->carry_len;
        take = take < len ? take : len;
        memcpy(s->carry + s->carry_len, data, take);
        s->carry_len += take;
        data += take;
        len -= take;
        if (s->carry_len == j->row_in_bytes) {
            s->carry_len = 0;
            size_t leaves = s->n_leaf; /* one row, in the caller: not this run */
            s->n_leaf = 0;
            rc = quantize_rows(s, j, s->carry, 1, err);
            s->n_leaf = leaves;
            if (rc)
                return rc;
            s->c->done_out += j->n_in / 2 + j->n_in / 32;
        }
    }
    size_t n = len / j->row_in_bytes;
    if (n && (rc = quantize_rows(s, j, data, n, err)))
        return rc;
    size_t rest = len - n * j->row_in_bytes;
    memcpy(s->carry + s->carry_len, data + n * j->row_in_bytes, rest);
    s->carry_len += rest;
    s->c->done_out += (n * j->n_in) / 2 + (n * j->n_in) / 32;
    return 0;
}

/* Reader callback: the next piece of source tensor ext_idx, in order; a tensor is complete
 * before the next one starts (kl_reader_run_gathered).  The source digest hashes the bytes
 * where the reader put them: the ragged leaf ends here, the whole leaves on the pool (in the
 * quantizer's run, or a run of their own for a copied tensor). */
static int on_chunk(void *ctx, size_t ext_idx, uint64_t ext_off, const uint8_t *data, size_t len)
{
    shard_run *s = ctx;
    job *j = &s->jobs[ext_idx];
    kl_err *err = &s->cb_err;
    s->c->res.read_bytes += len;
    s->src_read += len;
    if (s->src_read * 2 >= s->src_total)
        test_kill_at(s->c->kill_mid, s->c->shards_run + 1);
    double t0 = kl_now_s();
    int rc = kl_srcdigest_begin(s->src_dg, ext_idx, ext_off, data, len, &s->n_leaf, err);
    if (!rc && !j->quantize) {
        kl_srcdigest_leaves(s->src_dg);
        s->n_leaf = 0;
    }
    s->c->res.src_hash_s += kl_now_s() - t0;
    if (rc)
        return rc;
    if (j->quantize) {
        rc = quantize_chunk(s, j, data, len, err);
    } else {
        t0 = kl_now_s();
        rc = queue_by_leaf(s, &s->tgt, &j->out, j->packed, ext_off, data, len, err);
        s->c->res.write_s += kl_now_s() - t0;
        s->c->done_out += len;
    }
    t0 = kl_now_s();
    if (!rc && s->n_leaf) /* no run took them (no whole row in the chunk) */
        kl_srcdigest_leaves(s->src_dg);
    s->n_leaf = 0;
    kl_srcdigest_end(s->src_dg);
    s->c->res.src_hash_s += kl_now_s() - t0;
    return rc ? rc : report_progress(s->c);
}

/* The writer's tensor list, the extents and the jobs (one per source tensor) of shard k; pos
 * is scratch of layout.shards[k].count entries. */
static int shard_setup(shard_run *s, size_t k, kl_st_wtensor *wt, kl_extent *ext, size_t *pos,
                       kl_err *err)
{
    conv *c = s->c;
    const kl_layout_shard *ls = &c->layout.shards[k];
    shard_wtensors(c, k, wt);
    s->n_jobs = shard_extents(c, k, ext, pos);
    for (size_t n = 0; n < s->n_jobs; n++) {
        size_t i = pos[n], si = c->layout.order[ls->first + i];
        const kl_schema_entry *e = &c->schema.entries[si];
        const kl_ckpt_tensor *t = c->srcs[si];
        job *j = &s->jobs[n];
        memset(j, 0, sizeof *j);
        j->packed = i;
        j->src = t;
        j->quantize = e->part == KL_PART_PACKED;
        s->src_total += ext[n].len;
        if (!j->quantize)
            continue;
        /* the weight_scale is produced with its weight_packed, which sorts just before it */
        if (i + 1 >= ls->count ||
            c->schema.entries[c->layout.order[ls->first + i + 1]].part != KL_PART_SCALE)
            return kl_fail(err, KL_E_BUG, "%s: weight_scale does not follow", e->name);
        j->scale = i + 1;
        j->n_in = t->t->shape[1];
        j->row_in_bytes = j->n_in * kl_dtype_bits(t->t->dtype) / 8;
        if (j->row_in_bytes > CARRY_BYTES || j->n_in % 32)
            return kl_fail_at(err, KL_E_UNSUPPORTED, "CONVERT-ROW", t->name, KL_NO_OFFSET,
                              "rows of %llu elements cannot be quantized here",
                              (unsigned long long)j->n_in);
    }
    return 0;
}

/* Write-behind hook, on the lanes: every output byte goes into the shard's digest (piece 0
 * is the header, piece i + 1 tensor i). */
static int digest_hook(void *ctx, size_t tensor, uint64_t off, const uint8_t *data, size_t n,
                       kl_err *err)
{
    return kl_sdigest_update(ctx, tensor + 1, off, data, n, err);
}

/* Starts shard k's digest with its header (written by kl_st_writer_open) and its source digest
 * over the extents ext[0..n_jobs), and points the queue's target at the first. */
static int start_digests(shard_run *s, size_t k, const kl_extent *ext, kl_err *err)
{
    uint8_t *hdr;
    uint64_t *pieces;
    int rc = shard_pieces(s->c, k, &hdr, &pieces, err);
    if (!rc && pieces[0] != s->w.data_off)
        rc = kl_fail(err, KL_E_BUG, "digest header of %llu bytes, shard header of %llu",
                     (unsigned long long)pieces[0], (unsigned long long)s->w.data_off);
    if (!rc)
        rc = kl_sdigest_create(&s->dg, pieces, s->c->layout.shards[k].count + 1, err);
    if (!rc)
        rc = kl_sdigest_update(s->dg, 0, 0, hdr, (size_t)pieces[0], err);
    for (size_t j = 0; !rc && j < s->n_jobs; j++) /* the header's room is enough */
        pieces[j] = ext[j].len;
    if (!rc)
        rc = kl_srcdigest_create(&s->src_dg, pieces, s->n_jobs, hash_pool(s->c), err);
    kl_free(hdr);
    kl_free(pieces);
    s->tgt = (kl_wb_target){.w = &s->w, .hook = digest_hook, .ctx = s->dg};
    return rc;
}

/* Converts shard k into DST.partial and commits it; *r receives what the journal records. */
static int convert_shard(conv *c, size_t k, shard_record *r, kl_err *err)
{
    const kl_layout_shard *ls = &c->layout.shards[k];
    shard_run s;
    memset(&s, 0, sizeof s);
    s.c = c;
    kl_err_clear(&s.cb_err);
    kl_err_clear(&s.row_err);
    kl_st_wtensor *wt = kl_calloc(ls->count ? ls->count : 1, sizeof *wt);
    kl_extent *ext = kl_calloc(ls->count ? ls->count : 1, sizeof *ext);
    size_t *pos = kl_calloc(ls->count ? ls->count : 1, sizeof *pos);
    s.jobs = kl_calloc(ls->count ? ls->count : 1, sizeof *s.jobs);
    s.carry = kl_malloc(CARRY_BYTES);
    char path[PATH_MAX];
    int rc = (!wt || !ext || !pos || !s.jobs || !s.carry)
                 ? kl_fail(err, KL_E_NOMEM, "out of memory for shard %s", ls->name)
                 : kl_path_join(path, sizeof path, c->partial, ls->name, err);
    if (!rc)
        rc = shard_setup(&s, k, wt, ext, pos, err);
    if (!rc) /* before reading: a file changed while it is read then differs from the record */
        rc = source_files_id(c, k, &r->src_files, err);
    if (!rc) {
        /* early writeback: the disk writes while we read and quantize, so the commit's
         * fsync finds little left to do. */
        kl_st_writer_opts wo = {.early_writeback = 1};
        rc = kl_st_writer_open(&s.w, path, wt, ls->count, &wo, err);
    }
    if (!rc)
        rc = start_digests(&s, k, ext, err);
    if (!rc) {
        /* The output is planned in the loader's order (experts numerically, each layer one
         * region), not the source's (official shards sort names as strings and spread experts
         * over shards); gathered reads stream each source file in order and coalesce
         * neighbouring tensors (per-tensor reads streamed at 1.3 GB/s where whole files did
         * 2.0 GB/s). */
        rc = kl_reader_run_gathered(c->reader, ext, s.n_jobs, KL_GATHER_GAP, on_chunk, &s, err);
        if (rc == KL_E_CANCELLED && s.cb_err.code) { /* the callback's own error */
            if (err)
                *err = s.cb_err;
            rc = s.cb_err.code;
        }
    }
    /* Always wait for queued writes: none may touch the writer after it is closed. */
    kl_err drain_err;
    int drc = kl_wb_drain(c->wb, &drain_err);
    if (!rc && drc) {
        if (err)
            *err = drain_err;
        rc = drc;
    }
    if (!rc)
        rc = kl_sdigest_final(s.dg, r->digest, err);
    if (!rc)
        rc = kl_srcdigest_final(s.src_dg, r->src_digest, err);
    r->size = s.w.file_bytes;
    if (!rc) {
        double t0 = kl_now_s();
        rc = kl_st_writer_commit(&s.w, err);
        c->res.commit_s += kl_now_s() - t0;
    }
    kl_st_writer_close(&s.w);
    kl_sdigest_destroy(s.dg);
    kl_srcdigest_destroy(s.src_dg);
    kl_free(wt);
    kl_free(ext);
    kl_free(pos);
    kl_free(s.jobs);
    kl_free(s.carry);
    return rc;
}

/* ---- the small files ----------------------------------------------------------------------- */

/* config.json: the source's own keys (architectures, auto_map, ...) plus our
 * quantization_config, so engines that read compressed-tensors see the scheme. */
static int write_config(const conv *c, kl_err *err)
{
    char *ours = NULL, *src_text = NULL, *out = NULL;
    size_t len;
    cJSON *src = NULL, *mine = NULL;
    int rc = kl_config_to_json(&c->cfg, &ours, err);
    if (!rc)
        rc = kl_read_file(c->ck.config_path, 16u << 20, &src_text, &len, err);
    if (!rc && (rc = kl_json_parse(src_text, len, "CFG", &src, err)))
        kl_err_context(err, c->ck.config_path, NULL, KL_NO_OFFSET, NULL);
    if (!rc)
        rc = kl_json_parse(ours, strlen(ours), "CFG", &mine, err);
    if (!rc) {
        cJSON *q = cJSON_DetachItemFromObject(mine, "quantization_config");
        if (!cJSON_IsObject(src) || !q) {
            cJSON_Delete(q);
            rc = kl_fail(err, KL_E_BUG, "cannot build config.json");
        } else {
            cJSON_DeleteItemFromObject(src, "quantization_config");
            cJSON_AddItemToObject(src, "quantization_config", q);
            out = cJSON_Print(src);
            rc = out ? kl_write_file_atomic(c->partial, "config.json", out, strlen(out), err)
                     : kl_fail(err, KL_E_NOMEM, "out of memory");
        }
    }
    cJSON_free(out);
    cJSON_Delete(src);
    cJSON_Delete(mine);
    kl_free(ours);
    kl_free(src_text);
    return rc;
}

static int write_index(const conv *c, kl_err *err)
{
    kl_st_index_entry *e = kl_calloc(c->schema.n ? c->schema.n : 1, sizeof *e);
    if (!e)
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    for (size_t k = 0; k < c->layout.n_shards; k++) {
        const kl_layout_shard *ls = &c->layout.shards[k];
        for (size_t i = 0; i < ls->count; i++) {
            size_t pos = ls->first + i;
            e[pos].tensor = c->schema.entries[c->layout.order[pos]].name;
            e[pos].shard = ls->name;
        }
    }
    int rc = kl_st_index_write(c->partial, e, c->schema.n, c->total_out, err);
    kl_free(e);
    return rc;
}

/* 1 for a top-level file of SRC that is copied as is: all but shards, config and index. */
static int is_side_file(const char *nm)
{
    size_t l = strlen(nm);
    return !(l >= 12 && !strcmp(nm + l - 12, ".safetensors")) && strcmp(nm, "config.json") &&
           strcmp(nm, "model.safetensors.index.json");
}

/* Every other top-level regular file of SRC (tokenizer, chat template, generation config,
 * remote code): copied as is. */
static int copy_side_files(const conv *c, kl_err *err)
{
    char **names = NULL;
    size_t n = 0;
    int rc = kl_list_files_with_suffix(c->ck.dir, "", &names, &n, err);
    for (size_t i = 0; !rc && i < n; i++) {
        const char *nm = names[i];
        if (!is_side_file(nm))
            continue;
        char path[PATH_MAX], *data = NULL;
        size_t len;
        rc = kl_path_join(path, sizeof path, c->ck.dir, nm, err);
        if (!rc)
            rc = kl_read_file(path, 1u << 30, &data, &len, err);
        if (!rc)
            rc = kl_write_file_atomic(c->partial, nm, data, len, err);
        kl_free(data);
    }
    kl_free_name_list(names, n);
    return rc;
}

/* ---- public API ---------------------------------------------------------------------------- */

/* DST must not exist, must not be SRC or inside it (compared after resolving links). */
static int check_paths(conv *c, kl_err *err)
{
    char src[PATH_MAX], parent[PATH_MAX], dst[PATH_MAX];
    if (!realpath(c->o->src, src)) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot resolve the source directory");
        kl_err_context(err, c->o->src, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    const char *d = c->o->dst;
    size_t end = strlen(d), at;
    while (end > 1 && d[end - 1] == '/') /* "out/" names the directory "out" */
        end--;
    for (at = end; at && d[at - 1] != '/'; at--)
        ;
    char base[NAME_MAX + 1];
    if (end - at > NAME_MAX)
        return kl_fail(err, KL_E_USAGE, "destination name is longer than %d bytes", NAME_MAX);
    memcpy(base, d + at, end - at);
    base[end - at] = 0;
    if (kl_path_parent(parent, sizeof parent, d, err))
        return KL_E_USAGE;
    char rparent[PATH_MAX];
    if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
        return kl_fail(err, KL_E_USAGE, "destination %s must name a new directory", c->o->dst);
    if (!realpath(parent, rparent)) {
        kl_fail_sys(err, KL_E_IO, errno, "the destination's parent directory does not exist");
        kl_err_context(err, c->o->dst, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    snprintf(c->dst_parent, sizeof c->dst_parent, "%s", rparent);
    int k = snprintf(dst, sizeof dst, "%s/%s", strcmp(rparent, "/") ? rparent : "", base);
    if (k < 0 || (size_t)k >= sizeof dst)
        return kl_fail(err, KL_E_USAGE, "destination path too long");
    size_t sl = strlen(src);
    if (!strcmp(dst, src) || (!strncmp(dst, src, sl) && dst[sl] == '/'))
        return kl_fail(err, KL_E_USAGE, "destination %s is inside the source %s", dst, src);
    struct stat st;
    if (lstat(c->o->dst, &st) == 0)
        return kl_fail(err, KL_E_USAGE, "destination %s already exists", c->o->dst);
    k = snprintf(c->partial, sizeof c->partial, "%s.partial", dst);
    if (k < 0 || (size_t)k >= sizeof c->partial)
        return kl_fail(err, KL_E_USAGE, "destination path too long");
    return 0;
}

static int open_source(conv *c, kl_err *err)
{
    int rc = kl_ckpt_open(&c->ck, c->o->src, err);
    if (!rc)
        rc = kl_ckpt_require_ok(&c->ck, err);
    if (rc)
        return rc;
    if (c->ck.config.family != KL_FAMILY_KIMI_LINEAR)
        return kl_fail(err, KL_E_UNSUPPORTED, "%s is a %s checkpoint; kl convert reads BF16 "
                       "Kimi-Linear", c->o->src, kl_family_name(c->ck.config.family));
    return 0;
}

/* 1 if name is a file kl convert writes into DST.partial (or its kl_write_file_atomic
 * temporary ".NAME.tmp"). */
static int name_is_ours(const conv *c, const char *name)
{
    char base[NAME_MAX + 1], path[PATH_MAX];
    size_t l = strlen(name);
    if (name[0] == '.' && l > 5 && !strcmp(name + l - 4, ".tmp"))
        snprintf(base, sizeof base, "%.*s", (int)(l - 5), name + 1);
    else
        snprintf(base, sizeof base, "%s", name);
    unsigned a, b;
    int end = 0;
    if (sscanf(base, "model-%5u-of-%5u.safetensors%n", &a, &b, &end) == 2 && end == 32 &&
        (!base[end] || !strcmp(base + end, ".partial")))
        return 1;
    if (!strcmp(base, JOURNAL_NAME) || !strcmp(base, "config.json") ||
        !strcmp(base, "model.safetensors.index.json"))
        return 1;
    struct stat st; /* a copy of one of SRC's side files */
    return is_side_file(base) && !kl_path_join(path, sizeof path, c->ck.dir, base, NULL) &&
           stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* 1 if DST.partial holds a journal of a kl convert run: the journal, or its temporary (a run
 * stopped while creating it). */
static int journal_is_ours(const conv *c)
{
    static const char *const names[] = {JOURNAL_NAME, "." JOURNAL_NAME ".tmp"};
    int ours = 0;
    for (size_t i = 0; i < 2 && !ours; i++) {
        char path[PATH_MAX], *text = NULL;
        size_t len;
        ours = !kl_path_join(path, sizeof path, c->partial, names[i], NULL) &&
               !kl_read_file(path, 16u << 20, &text, &len, NULL) &&
               !strncmp(text, JOURNAL_MAGIC, strlen(JOURNAL_MAGIC));
        kl_free(text);
    }
    return ours;
}

static int refuse_partial(const conv *c, const char *why, const char *entry, kl_err *err)
{
    kl_fail_at(err, KL_E_USAGE, "CONVERT-PARTIAL", NULL, KL_NO_OFFSET,
               "%s%s%s; kl convert resumes only its own DST.partial and never deletes what it "
               "did not create: move it away or remove it",
               why, entry ? " " : "", entry ? entry : "");
    kl_err_context(err, c->partial, NULL, KL_NO_OFFSET, NULL);
    return KL_E_USAGE;
}

/* kl never deletes what it did not create: an existing DST.partial is reused (its files
 * replaced or removed) only if it is a real directory holding a journal of ours and nothing
 * but regular files kl convert writes.  An empty one (a run stopped before its journal) holds
 * nothing to lose. */
static int check_partial(const conv *c, kl_err *err)
{
    struct stat st;
    if (lstat(c->partial, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        kl_fail_sys(err, KL_E_IO, errno, "cannot stat the work directory");
        kl_err_context(err, c->partial, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    if (S_ISLNK(st.st_mode))
        return refuse_partial(c, "it is a symbolic link", NULL, err);
    if (!S_ISDIR(st.st_mode))
        return refuse_partial(c, "it is not a directory", NULL, err);
    DIR *d = opendir(c->partial);
    if (!d) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot open the work directory");
        kl_err_context(err, c->partial, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    char bad[NAME_MAX + 1] = "";
    int any = 0;
    for (struct dirent *de; !bad[0] && (de = readdir(d));) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        any = 1;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISREG(st.st_mode) || !name_is_ours(c, de->d_name))
            snprintf(bad, sizeof bad, "%s", de->d_name);
    }
    closedir(d);
    if (bad[0])
        return refuse_partial(c, "it holds a file kl convert does not write:", bad, err);
    if (any && !journal_is_ours(c))
        return refuse_partial(c, "it holds no kl convert journal", NULL, err);
    return 0;
}

/* Bytes of SRC's side files (copied into DST). */
static uint64_t side_file_bytes(const conv *c)
{
    char **names = NULL, path[PATH_MAX];
    size_t n = 0;
    uint64_t sum = 0;
    if (kl_list_files_with_suffix(c->ck.dir, "", &names, &n, NULL))
        return 0;
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (is_side_file(names[i]) && !kl_path_join(path, sizeof path, c->ck.dir, names[i], NULL) &&
            stat(path, &st) == 0)
            sum += (uint64_t)st.st_size;
    }
    kl_free_name_list(names, n);
    return sum;
}

/* The output must fit DST's file system: what is still to be written, which a resume lowers by
 * the planned shards already in DST.partial at their planned size.  A dry run only measures. */
static int check_space(conv *c, kl_err *err)
{
    kl_out_plan *p = &c->out;
    p->other_bytes += side_file_bytes(c);
    p->total_bytes = p->shard_bytes + p->other_bytes;
    p->needed_bytes = p->total_bytes;
    for (size_t k = 0; k < p->n_shards; k++) {
        char path[PATH_MAX];
        struct stat st;
        if (!kl_path_join(path, sizeof path, c->partial, p->shards[k].name, NULL) &&
            lstat(path, &st) == 0 && S_ISREG(st.st_mode) &&
            (uint64_t)st.st_size == p->shards[k].file_bytes)
            p->needed_bytes -= p->shards[k].file_bytes;
    }
    kl_err scratch;
    kl_err_clear(&scratch);
    int rc = kl_out_plan_check_space(p, c->dst_parent, c->o->dry_run ? &scratch : err);
    return c->o->dry_run && scratch.rule[0] ? 0 : rc; /* a dry run reports "no space" */
}

/* The reader, the write-behind queue and the quantizer pool, within max_memory and no larger
 * than the plan needs (a budget is a cap: a tiny source gets small buffers). */
static int open_workers(conv *c, kl_err *err)
{
    uint64_t budget = c->o->max_memory ? c->o->max_memory : DEFAULT_MAX_MEMORY;
    uint64_t src_bytes = 0;
    for (size_t i = 0; i < c->ck.n_shards; i++)
        src_bytes += c->ck.shards[i].st.file_bytes;
    /* Reader memory: queue_depth chunks of CHUNK_BYTES within a quarter of the budget, and
     * not more chunks than the source has. */
    uint64_t qd = budget / 4 / CHUNK_BYTES, src_chunks = src_bytes / CHUNK_BYTES + 1;
    qd = qd < src_chunks ? qd : src_chunks;
    kl_reader_opts ro = {.buf_bytes = CHUNK_BYTES,
                         .queue_depth = qd < 2 ? 2 : qd > 32 ? 32 : (unsigned)qd};
    /* a cached source (or one on tmpfs) is copied from memory by pread threads; an io_uring
     * ring copied only 2.4 GB/s from tmpfs on the 16-core machine */
    int rc = kl_ckpt_open_reader(&c->ck, &ro, &c->reader, err);
    if (rc)
        return rc;
    unsigned threads = c->o->threads ? c->o->threads : kl_cpu_count(0);
    /* Write-behind: up to an eighth of the budget (256 MiB by default) of output waiting,
     * never more than the output, on a quarter as many lanes as quantizer threads (2..8): a
     * lane hashes (SHA-256, 1.3-1.8 GB/s on one core) and copies into the page cache, and
     * 9.5 GB of output must leave in the ~6 s that reading the source from memory takes on 16
     * cores.  The source is hashed where it was read (on_chunk), not here. */
    uint64_t wb_cap = budget / 8, need = c->total_out;
    wb_cap = wb_cap < need ? wb_cap : need;
    wb_cap = wb_cap < ((uint64_t)1 << 20) ? ((uint64_t)1 << 20) : wb_cap;
    unsigned lanes = threads / 4 < 2 ? 2 : threads / 4 > 8 ? 8 : threads / 4;
    if ((rc = kl_wb_create(&c->wb, (size_t)wb_cap, lanes, err)))
        return rc;
    return kl_pool_create(&c->pool, threads, err);
}

static int convert_all(conv *c, kl_err *err)
{
    if (kl_mkdir_p(c->partial, err))
        return err ? err->code : KL_E_IO;
    char *journal = NULL;
    int rc = journal_open(c, &journal, err);
    for (size_t k = 0; !rc && k < c->layout.n_shards; k++) {
        const char *name = c->layout.shards[k].name;
        int done = 0;
        if (journal && (rc = journal_says_done(c, journal, k, &done, err)))
            break;
        if (done) {
            c->res.n_shards_resumed++;
            c->done_out += c->layout.shards[k].tensor_bytes;
            continue;
        }
        shard_record r;
        rc = convert_shard(c, k, &r, err);
        if (!rc)
            rc = journal_add(c, name, &r, err);
        if (!rc)
            test_kill_at(c->kill_after, ++c->shards_run);
    }
    kl_free(journal);
    if (!rc)
        rc = write_config(c, err);
    if (!rc)
        rc = write_index(c, err);
    if (!rc)
        rc = copy_side_files(c, err);
    if (rc)
        return rc;
    /* Everything is durable in DST.partial: the journal has done its job, then publish. */
    char jpath[PATH_MAX];
    if (!kl_path_join(jpath, sizeof jpath, c->partial, JOURNAL_NAME, NULL))
        unlink(jpath);
    if (rename(c->partial, c->o->dst) != 0) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot rename %s into place", c->partial);
        kl_err_context(err, c->o->dst, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    return 0;
}

static void conv_free(conv *c)
{
    kl_pool_destroy(c->pool);
    kl_wb_destroy(c->wb);
    kl_reader_destroy(c->reader);
    kl_free(c->srcs);
    kl_free(c->dtypes);
    kl_free(c->bytes);
    kl_out_plan_free(&c->out);
    kl_layout_free(&c->layout);
    kl_schema_free(&c->schema);
    kl_ckcheck_free(&c->check);
    kl_ckpt_close(&c->ck);
}

int kl_convert(const kl_convert_opts *o, kl_err *err)
{
    if (!o || !o->src || !o->dst)
        return kl_fail(err, KL_E_USAGE, "kl convert needs SRC and DST");
    if ((unsigned)o->rule >= KL_SCALE_RULE_COUNT)
        return kl_fail(err, KL_E_USAGE, "unknown scale rule %d", (int)o->rule);
    conv c;
    memset(&c, 0, sizeof c);
    c.o = o;
    c.t0 = kl_now_s();
    test_kill_config(&c);
    int rc = check_paths(&c, err);
    if (!rc)
        rc = open_source(&c, err);
    if (!rc)
        rc = plan(&c, err);
    if (!rc)
        rc = check_partial(&c, err);
    if (!rc)
        rc = check_space(&c, err);
    if (!rc && o->plan) { /* handed over */
        *o->plan = c.out;
        memset(&c.out, 0, sizeof c.out);
    }
    if (!rc && !o->dry_run)
        rc = open_workers(&c, err);
    if (!rc && !o->dry_run)
        rc = convert_all(&c, err);
    if (!rc && o->result) {
        c.res.n_tensors = c.schema.n;
        for (size_t i = 0; i < c.schema.n; i++)
            c.res.n_quantized += c.schema.entries[i].part == KL_PART_PACKED;
        c.res.n_shards = c.layout.n_shards;
        c.res.written_bytes = c.total_out;
        c.res.elapsed_s = kl_now_s() - c.t0;
        c.res.write_wait_s = c.wb ? kl_wb_wait_s(c.wb) : 0;
        *o->result = c.res;
    }
    conv_free(&c);
    return rc;
}
