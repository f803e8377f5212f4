/*
 * tests/test_synth.c — convert/st_writer, synth/synth, synth/synth_tokenizer, `kl synth`.
 *
 * Every checkpoint is written into a fresh temp directory and read back through the strict
 * parsers (kl_st_open, kl_index_open, kl_config_open) and compared with the schema built from
 * the config it wrote: every entry present once, in the shard the index names, with the schema's
 * shape and synth dtype.  Then: values (ranges, spread, no constant tensor), determinism across
 * thread counts and seeds, MXFP4 expert regions, sparse files, and cleanup after failures.
 */
#include "cli/cli.h"
#include "common/fs.h"
#include "common/mem.h"
#include "common/numfmt.h"
#include "convert/st_writer.h"
#include "loader/config.h"
#include "loader/hashpass.h"
#include "loader/index.h"
#include "loader/safetensors.h"
#include "loader/schema.h"
#include "synth/synth.h"
#include "tests/testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                    */

static const char *fmt_err(const kl_err *err)
{
    static char buf[1200];
    return kl_err_format(err, buf, sizeof buf);
}

static void path_in(char *out, size_t n, const char *dir, const char *name)
{
    ck_assert_int_eq(kl_path_join(out, n, dir, name, NULL), 0);
}

static int exists(const char *dir, const char *name)
{
    char p[4096];
    struct stat st;
    path_in(p, sizeof p, dir, name);
    return stat(p, &st) == 0;
}

/* Number of directory entries whose name contains `needle` (NULL: all but . and ..). */
static int count_entries(const char *dir, const char *needle)
{
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "cannot open %s", dir);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
            (!needle || strstr(de->d_name, needle)))
            n++;
    closedir(d);
    return n;
}

static uint8_t *read_all(const char *path, size_t *len)
{
    char *buf = NULL;
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_read_file(path, (size_t)1 << 32, &buf, len, &err);
    ck_assert_msg(rc == 0, "read %s: %s", path, fmt_err(&err));
    return (uint8_t *)buf;
}

static int buffered_io; /* set by tests that compare the two write paths */

static int synth(const char *dir, const char *preset, kl_synth_format fmt, uint64_t seed,
                 unsigned threads, int sparse, kl_synth_result *res, kl_err *err)
{
    kl_synth_opts o;
    memset(&o, 0, sizeof o);
    o.buffered = buffered_io;
    o.out_dir = dir;
    o.preset = preset;
    o.format = fmt;
    o.seed = seed;
    o.threads = threads;
    o.sparse = sparse;
    o.result = res;
    kl_err_clear(err);
    return kl_synth_write(&o, err);
}

/* An opened checkpoint: config, schema from that config, index, every shard header. */
typedef struct ckpt {
    char       dir[4096];
    kl_config  cfg;
    kl_schema  schema;
    kl_index   idx;
    size_t     n_shards;
    kl_st_file st[64];
} ckpt;

static void ckpt_open(ckpt *c, const char *dir)
{
    memset(c, 0, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    char p[4096];
    kl_err err;
    kl_err_clear(&err);
    path_in(p, sizeof p, dir, "config.json");
    ck_assert_msg(kl_config_open(&c->cfg, p, &err) == 0, "config: %s", fmt_err(&err));
    ck_assert_msg(kl_schema_build(&c->schema, &c->cfg, &err) == 0, "schema: %s", fmt_err(&err));
    path_in(p, sizeof p, dir, "model.safetensors.index.json");
    ck_assert_msg(kl_index_open(&c->idx, p, &err) == 0, "index: %s", fmt_err(&err));
    c->n_shards = c->idx.n_shards;
    ck_assert_uint_le(c->n_shards, 64);
    for (size_t k = 0; k < c->n_shards; k++) {
        path_in(p, sizeof p, dir, c->idx.shards[k]);
        ck_assert_msg(kl_st_open(&c->st[k], p, &err) == 0, "shard %s: %s", p, fmt_err(&err));
    }
}

static void ckpt_close(ckpt *c)
{
    for (size_t k = 0; k < c->n_shards; k++)
        kl_st_close(&c->st[k]);
    kl_index_free(&c->idx);
    kl_schema_free(&c->schema);
}

/* Shard index and tensor of a schema entry. */
static const kl_st_tensor *ckpt_find(const ckpt *c, const char *name, size_t *shard)
{
    int k = kl_index_shard_of(&c->idx, name);
    ck_assert_msg(k >= 0, "%s missing from the index", name);
    const kl_st_tensor *t = kl_st_find(&c->st[k], name);
    ck_assert_msg(t != NULL, "%s missing from shard %s", name, c->idx.shards[k]);
    if (shard)
        *shard = (size_t)k;
    return t;
}

/* The checks every written checkpoint must pass. */
static void check_layout(const ckpt *c)
{
    size_t in_shards = 0;
    uint64_t bytes = 0;
    for (size_t k = 0; k < c->n_shards; k++) {
        const kl_st_file *f = &c->st[k];
        char want[64];
        snprintf(want, sizeof want, "model-%05zu-of-%05zu.safetensors", k + 1, c->n_shards);
        uint32_t got;
        ck_assert_msg(kl_strmap_get(&c->idx.by_shard, want, &got) == 1, "no shard named %s", want);
        ck_assert_msg(f->data_off % KL_ST_WRITER_ALIGN_DEFAULT == 0, "%s data starts at %" PRIu64,
                      c->idx.shards[k], f->data_off);
        ck_assert_msg(f->warnings == 0, "%s warnings %#x", c->idx.shards[k], f->warnings);
        const char *fmt = kl_st_meta_get(f, "format");
        ck_assert_msg(fmt && !strcmp(fmt, "pt"), "__metadata__.format = %s", fmt ? fmt : "(none)");
        for (size_t i = 0; i < f->n_tensors; i++) {
            const kl_st_tensor *t = &f->tensors[i];
            ck_assert_msg(kl_index_shard_of(&c->idx, t->name) == (int)k,
                          "%s is in %s but the index says otherwise", t->name, c->idx.shards[k]);
            const kl_schema_entry *e = kl_schema_find(&c->schema, t->name);
            ck_assert_msg(e && !strcmp(e->name, t->name), "%s: not a canonical schema name",
                          t->name);
            ck_assert_msg(t->dtype == e->synth_dtype, "%s: dtype %s, schema %s", t->name,
                          kl_dtype_name(t->dtype), kl_dtype_name(e->synth_dtype));
            ck_assert_msg(t->rank == e->rank, "%s: rank %d, schema %d", t->name, t->rank,
                          e->rank);
            for (int d = 0; d < e->rank; d++)
                ck_assert_msg(t->shape[d] == e->shape[d], "%s: dim %d = %" PRIu64 ", schema %"
                              PRIu64, t->name, d, t->shape[d], e->shape[d]);
            unsigned elem = kl_dtype_bits(t->dtype) / 8;
            ck_assert_msg(elem <= 1 || t->file_off % elem == 0, "%s misaligned", t->name);
            bytes += t->n_bytes;
        }
        in_shards += f->n_tensors;
    }
    ck_assert_msg(in_shards == c->schema.n, "%zu tensors in shards, schema has %zu", in_shards,
                  c->schema.n);
    ck_assert_uint_eq(c->idx.n_entries, c->schema.n);
    for (size_t i = 0; i < c->schema.n; i++)
        ckpt_find(c, c->schema.entries[i].name, NULL);
    ck_assert_msg(c->idx.has_total_size && c->idx.total_size == bytes,
                  "total_size %" PRIu64 ", tensors hold %" PRIu64, c->idx.total_size, bytes);
}

/* Reads one tensor's bytes (kl_malloc'd). */
static uint8_t *read_tensor(const ckpt *c, const char *name, const kl_st_tensor **out)
{
    size_t k;
    const kl_st_tensor *t = ckpt_find(c, name, &k);
    uint8_t *buf = kl_malloc(t->n_bytes ? t->n_bytes : 1);
    ck_assert(buf != NULL);
    int fd = open(c->st[k].path, O_RDONLY);
    ck_assert(fd >= 0);
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_pread_all(fd, buf, t->n_bytes, t->file_off, c->st[k].path, &err) == 0,
                  "%s", fmt_err(&err));
    close(fd);
    *out = t;
    return buf;
}

static double value_at(const uint8_t *p, kl_dtype dt, uint64_t i)
{
    if (dt == KL_DT_BF16)
        return kl_bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
}

typedef struct stats {
    double mean, std, min, max;
} stats;

static stats tensor_stats(const ckpt *c, const char *name)
{
    const kl_st_tensor *t;
    uint8_t *b = read_tensor(c, name, &t);
    stats s = {0, 0, INFINITY, -INFINITY};
    double sum = 0, sq = 0;
    for (uint64_t i = 0; i < t->numel; i++) {
        double v = value_at(b, t->dtype, i);
        sum += v;
        sq += v * v;
        s.min = fmin(s.min, v);
        s.max = fmax(s.max, v);
    }
    s.mean = sum / (double)t->numel;
    s.std = sqrt(fmax(0, sq / (double)t->numel - s.mean * s.mean));
    kl_free(b);
    return s;
}

static const kl_schema_entry *first_of_role(const ckpt *c, kl_role r)
{
    for (size_t i = 0; i < c->schema.n; i++)
        if (c->schema.entries[i].role == r && c->schema.entries[i].part == KL_PART_WEIGHT)
            return &c->schema.entries[i];
    return NULL;
}

/* Every file of two checkpoint directories is byte-identical (same != 0) or every shard
 * differs (same == 0). */
static void compare_dirs(const char *a, const char *b, int same)
{
    ckpt ca;
    ckpt_open(&ca, a);
    static const char *const small_files[] = {"config.json", "model.safetensors.index.json",
                                              "tiktoken.model", "tokenizer_config.json"};
    for (size_t i = 0; i < ca.n_shards + 4; i++) {
        const char *name = i < ca.n_shards ? ca.idx.shards[i] : small_files[i - ca.n_shards];
        char pa[4096], pb[4096];
        path_in(pa, sizeof pa, a, name);
        path_in(pb, sizeof pb, b, name);
        size_t la, lb;
        uint8_t *da = read_all(pa, &la), *db = read_all(pb, &lb);
        int equal = la == lb && !memcmp(da, db, la);
        if (same || i >= ca.n_shards)
            ck_assert_msg(equal, "%s differs between %s and %s", name, a, b);
        else
            ck_assert_msg(!equal, "%s is identical for two seeds", name);
        kl_free(da);
        kl_free(db);
    }
    ckpt_close(&ca);
}

/* ------------------------------------------------------------------------------------------ */
/* st_writer                                                                                  */

static void wt(kl_st_wtensor *t, const char *name, kl_dtype dt, int rank, uint64_t d0,
               uint64_t d1)
{
    memset(t, 0, sizeof *t);
    t->name = name;
    t->dtype = dt;
    t->rank = rank;
    t->shape[0] = d0;
    t->shape[1] = d1;
}

START_TEST(st_writer_writes_a_page_aligned_shard_the_strict_reader_accepts)
{
    char dir[256], path[4096];
    t_mkdtemp(dir, sizeof dir);
    path_in(path, sizeof path, dir, "a.safetensors");
    kl_st_wtensor t[4];
    wt(&t[0], "w.f32", KL_DT_F32, 2, 3, 5);
    wt(&t[1], "w.bf16", KL_DT_BF16, 1, 7, 0);
    wt(&t[2], "w.u8", KL_DT_U8, 2, 3, 3);
    wt(&t[3], "scalar", KL_DT_U8, 0, 0, 0);
    kl_st_writer w;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_st_writer_open(&w, path, t, 4, NULL, &err) == 0, "%s", fmt_err(&err));
    ck_assert_msg(!exists(dir, "a.safetensors") && exists(dir, "a.safetensors.partial"),
                  "writes go to the .partial file until commit");
    ck_assert_uint_eq(w.data_off % 4096, 0);
    ck_assert_uint_eq(kl_st_writer_tensor_off(&w, 1), w.data_off + 60);
    ck_assert_uint_eq(kl_st_writer_tensor_bytes(&w, 2), 9);
    uint8_t bytes[60];
    for (int i = 0; i < 60; i++)
        bytes[i] = (uint8_t)(i * 7 + 1);
    ck_assert_int_eq(kl_st_writer_pwrite(&w, 0, 0, bytes, 60, &err), 0);
    ck_assert_int_eq(kl_st_writer_pwrite(&w, 2, 4, bytes, 5, &err), 0);
    ck_assert_int_eq(kl_st_writer_pwrite(&w, 2, 5, bytes, 5, &err), KL_E_USAGE);
    ck_assert_int_eq(kl_st_writer_commit(&w, &err), 0);
    kl_st_writer_close(&w);
    ck_assert(exists(dir, "a.safetensors") && !exists(dir, "a.safetensors.partial"));

    kl_st_file f;
    kl_err_clear(&err);
    ck_assert_msg(kl_st_open(&f, path, &err) == 0, "%s", fmt_err(&err));
    ck_assert_uint_eq(f.n_tensors, 4);
    ck_assert_uint_eq(f.data_off % 4096, 0);
    ck_assert_uint_eq(f.warnings, 0);
    ck_assert_str_eq(kl_st_meta_get(&f, "format"), "pt");
    const kl_st_tensor *a = kl_st_find(&f, "w.f32"), *u = kl_st_find(&f, "w.u8");
    ck_assert(a && a->begin == 0 && a->end == 60 && a->shape[1] == 5);
    ck_assert(u && u->begin == 74 && u->n_bytes == 9);
    ck_assert(kl_st_find(&f, "scalar") && kl_st_find(&f, "scalar")->n_bytes == 1);
    size_t len;
    uint8_t *all = read_all(path, &len);
    ck_assert_uint_eq(len, f.file_bytes);
    ck_assert_int_eq(all[8], '{');
    ck_assert_int_eq(all[f.data_off - 1], ' ');
    ck_assert_int_eq(memcmp(all + a->file_off, bytes, 60), 0);
    ck_assert_int_eq(memcmp(all + u->file_off + 4, bytes, 5), 0);
    kl_free(all);
    kl_st_close(&f);
    t_rmrf(dir);
}
END_TEST

/* The same bytes through O_DIRECT (aligned windows, buffered tail) and through the page cache
 * give the same file. */
START_TEST(st_writer_direct_and_buffered_writes_give_the_same_file)
{
    char dir[256], pa[4096], pb[4096];
    t_mkdtemp(dir, sizeof dir);
    path_in(pa, sizeof pa, dir, "d.safetensors");
    path_in(pb, sizeof pb, dir, "b.safetensors");
    kl_st_wtensor t[2];
    wt(&t[0], "big", KL_DT_BF16, 2, 5000, 3);   /* 30,000 bytes */
    wt(&t[1], "tail", KL_DT_U8, 1, 777, 0);     /* ends mid-page */
    size_t n = 30000 + 777;
    uint8_t *data = kl_aligned_alloc(4096, 32768);
    ck_assert(data != NULL);
    for (size_t i = 0; i < n; i++)
        data[i] = (uint8_t)(i * 131 + 7);
    kl_err err;
    kl_err_clear(&err);
    for (int direct = 0; direct < 2; direct++) {
        kl_st_writer w;
        kl_st_writer_opts o = {.data_align = 4096, .direct = direct, .early_writeback = 1};
        ck_assert_msg(kl_st_writer_open(&w, direct ? pa : pb, t, 2, &o, &err) == 0, "%s",
                      fmt_err(&err));
        ck_assert_int_eq(kl_st_writer_pwrite_data(&w, 0, data, 16384, &err), 0);
        ck_assert_int_eq(kl_st_writer_pwrite_data(&w, 16384, data + 16384, n - 16384, &err), 0);
        ck_assert_int_eq(kl_st_writer_pwrite_data(&w, n - 1, data, 2, &err), KL_E_USAGE);
        ck_assert_int_eq(kl_st_writer_commit(&w, &err), 0);
        kl_st_writer_close(&w);
    }
    size_t la, lb;
    uint8_t *a = read_all(pa, &la), *b = read_all(pb, &lb);
    ck_assert_uint_eq(la, lb);
    ck_assert_int_eq(memcmp(a, b, la), 0);
    ck_assert_int_eq(memcmp(a + la - n, data, n), 0);
    kl_free(a);
    kl_free(b);
    kl_aligned_free(data);
    t_rmrf(dir);
}
END_TEST

START_TEST(st_writer_honours_a_smaller_data_alignment)
{
    kl_st_wtensor t[1];
    wt(&t[0], "x", KL_DT_BF16, 1, 3, 0);
    uint8_t *hdr;
    uint64_t len, begin, nb;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_st_header_build(t, 1, 8, &hdr, &len, &begin, &nb, &err), 0);
    ck_assert_uint_eq(len % 8, 0);
    ck_assert_uint_lt(len, 4096);
    ck_assert_uint_eq(kl_load_le64(hdr), len - 8);
    ck_assert_uint_eq(nb, 6);
    kl_free(hdr);
    ck_assert_int_eq(kl_st_header_build(t, 1, 12, &hdr, &len, NULL, NULL, &err), KL_E_USAGE);
}
END_TEST

START_TEST(st_writer_refuses_bad_tensor_lists_without_creating_files)
{
    char dir[256], path[4096];
    t_mkdtemp(dir, sizeof dir);
    path_in(path, sizeof path, dir, "b.safetensors");
    struct {
        const char *why;
        kl_st_wtensor t[2];
        size_t n;
    } rows[5];
    memset(rows, 0, sizeof rows);
    rows[0].why = "a BF16 tensor after 3 bytes would be misaligned";
    wt(&rows[0].t[0], "u", KL_DT_U8, 1, 3, 0);
    wt(&rows[0].t[1], "h", KL_DT_BF16, 1, 2, 0);
    rows[0].n = 2;
    rows[1].why = "duplicate name";
    wt(&rows[1].t[0], "d", KL_DT_U8, 1, 4, 0);
    wt(&rows[1].t[1], "d", KL_DT_U8, 1, 4, 0);
    rows[1].n = 2;
    rows[2].why = "tensor named __metadata__";
    wt(&rows[2].t[0], "__metadata__", KL_DT_U8, 1, 4, 0);
    rows[2].n = 1;
    rows[3].why = "odd number of F4 elements";
    wt(&rows[3].t[0], "f4", KL_DT_F4, 1, 3, 0);
    rows[3].n = 1;
    rows[4].why = "dimension above 2^48-1";
    wt(&rows[4].t[0], "big", KL_DT_U8, 1, 1ull << 48, 0);
    rows[4].n = 1;
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        kl_st_writer w;
        kl_err err;
        kl_err_clear(&err);
        size_t before = kl_mem_in_use();
        int rc = kl_st_writer_open(&w, path, rows[r].t, rows[r].n, NULL, &err);
        ck_assert_msg(rc == KL_E_USAGE, "%s: rc %d (%s)", rows[r].why, rc, fmt_err(&err));
        kl_st_writer_close(&w);
        ck_assert_msg(count_entries(dir, NULL) == 0, "%s: a file was left behind", rows[r].why);
        ck_assert_msg(kl_mem_in_use() == before, "%s: leaked %zu bytes", rows[r].why,
                      kl_mem_in_use() - before);
    }
    t_rmrf(dir);
}
END_TEST

START_TEST(st_writer_close_without_commit_removes_the_partial_file)
{
    char dir[256], path[4096];
    t_mkdtemp(dir, sizeof dir);
    path_in(path, sizeof path, dir, "c.safetensors");
    kl_st_wtensor t[1];
    wt(&t[0], "x", KL_DT_U8, 1, 1000, 0);
    kl_st_writer w;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_st_writer_open(&w, path, t, 1, NULL, &err), 0);
    uint8_t b[10] = {1};
    ck_assert_int_eq(kl_st_writer_pwrite(&w, 0, 0, b, 10, &err), 0);
    ck_assert_int_eq(count_entries(dir, ".partial"), 1);
    kl_st_writer_close(&w); /* a failure path: never committed */
    ck_assert_int_eq(count_entries(dir, NULL), 0);
    kl_st_writer_close(&w); /* idempotent */

    /* a directory in the way of the final name: commit fails, nothing looks complete */
    ck_assert_int_eq(mkdir(path, 0755), 0);
    ck_assert_int_eq(kl_st_writer_open(&w, path, t, 1, NULL, &err), 0);
    ck_assert_int_eq(kl_st_writer_commit(&w, &err), KL_E_IO);
    kl_st_writer_close(&w);
    ck_assert_int_eq(count_entries(dir, ".partial"), 0);

    /* a missing directory: open fails with the path in the error */
    char bad[4200];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.safetensors", dir);
    kl_err_clear(&err);
    ck_assert_int_eq(kl_st_writer_open(&w, bad, t, 1, NULL, &err), KL_E_IO);
    ck_assert_msg(strstr(err.file, "x.safetensors.partial") != NULL, "%s", fmt_err(&err));
    kl_st_writer_close(&w);
    t_rmrf(dir);
}
END_TEST

START_TEST(st_index_write_is_sorted_and_parses)
{
    char dir[256];
    t_mkdtemp(dir, sizeof dir);
    kl_st_index_entry e[3] = {{"b.weight", "s2.safetensors"},
                              {"a.weight", "s1.safetensors"},
                              {"c.weight", "s2.safetensors"}};
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_st_index_write(dir, e, 3, 98245363456ull, &err), 0);
    char p[4096];
    path_in(p, sizeof p, dir, "model.safetensors.index.json");
    kl_index idx;
    ck_assert_msg(kl_index_open(&idx, p, &err) == 0, "%s", fmt_err(&err));
    ck_assert(idx.has_total_size && idx.total_size == 98245363456ull);
    ck_assert_uint_eq(idx.n_entries, 3);
    ck_assert_str_eq(idx.entries[0].tensor, "a.weight");
    ck_assert_str_eq(idx.shards[kl_index_shard_of(&idx, "c.weight")], "s2.safetensors");
    kl_index_free(&idx);
    e[2].tensor = "a.weight";
    ck_assert_int_eq(kl_st_index_write(dir, e, 3, 1, &err), KL_E_USAGE);
    t_rmrf(dir);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* synth: layout                                                                              */

START_TEST(synth_tiny_bf16_matches_the_schema)
{
    char dir[256];
    t_mkdtemp(dir, sizeof dir);
    kl_synth_result res;
    kl_err err;
    ck_assert_msg(synth(dir, "tiny", KL_SYNTH_BF16, 1, 2, 0, &res, &err) == 0, "%s",
                  fmt_err(&err));
    ckpt c;
    ckpt_open(&c, dir);
    check_layout(&c);
    ck_assert_int_eq(c.cfg.family, KL_FAMILY_KIMI_LINEAR);
    ck_assert_uint_eq(c.cfg.vocab_size, 1024);
    ck_assert_uint_eq(c.cfg.hidden_size, 64);
    ck_assert_uint_eq(c.cfg.num_hidden_layers, 4);
    ck_assert_uint_eq(c.cfg.num_experts, 8);
    ck_assert_int_eq(c.cfg.bos_token_id, 768);
    ck_assert_int_eq(c.cfg.eos_token_id, 770);
    ck_assert_int_eq(c.cfg.pad_token_id, 1023);
    for (uint32_t L = 0; L < 4; L++)
        ck_assert_int_eq(c.cfg.layer_attn[L], L == 3 ? KL_ATTN_MLA : KL_ATTN_KDA);
    ck_assert_msg(c.n_shards >= 3, "tiny should span several shards, got %zu", c.n_shards);
    ck_assert_uint_eq(res.n_shards, c.n_shards);
    ck_assert_uint_eq(res.n_tensors, c.schema.n);
    ck_assert_uint_eq(res.tensor_bytes, c.idx.total_size);
    uint64_t files = 0;
    for (size_t k = 0; k < c.n_shards; k++)
        files += c.st[k].file_bytes;
    ck_assert_uint_eq(res.file_bytes, files);
    ck_assert_int_eq(count_entries(dir, ".partial"), 0);
    ck_assert_int_eq(count_entries(dir, ".tmp"), 0);
    ck_assert_int_eq(count_entries(dir, NULL), (int)c.n_shards + 4);
    ckpt_close(&c);
    t_rmrf(dir);
}
END_TEST

START_TEST(synth_small_keeps_kimi_ref_geometry)
{
    kl_synth_opts o;
    memset(&o, 0, sizeof o);
    o.preset = "small";
    kl_config c;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_synth_config(&o, &c, &err), 0);
    ck_assert_uint_eq(c.vocab_size, 4096);
    ck_assert_uint_eq(c.hidden_size, 256);
    ck_assert_uint_eq(c.intermediate_size, 512);
    ck_assert_uint_eq(c.moe_intermediate_size, 64);
    ck_assert_uint_eq(c.num_hidden_layers, 8);
    ck_assert_uint_eq(c.num_attention_heads, 4);
    ck_assert_uint_eq(c.kv_lora_rank, 512);
    ck_assert_uint_eq(c.qk_rope_head_dim, 64);
    ck_assert_uint_eq(c.qk_nope_head_dim, 128);
    ck_assert_uint_eq(c.v_head_dim, 128);
    ck_assert_uint_eq(c.num_experts, 32);
    ck_assert_uint_eq(c.num_experts_per_token, 4);
    ck_assert_uint_eq(c.kda_head_dim, 128);
    ck_assert_uint_eq(c.kda_num_heads, 2);
    ck_assert_uint_eq(c.num_shared_experts, 1);
    ck_assert_uint_eq(c.first_k_dense_replace, 1);
    for (uint32_t L = 0; L < 8; L++)
        ck_assert_int_eq(c.layer_attn[L], (L == 3 || L == 7) ? KL_ATTN_MLA : KL_ATTN_KDA);
    o.preset = "huge";
    ck_assert_int_eq(kl_synth_config(&o, &c, &err), KL_E_USAGE);
}
END_TEST

START_TEST(synth_layers_keep_the_three_to_one_pattern)
{
    char dir[256];
    t_mkdtemp(dir, sizeof dir);
    kl_synth_opts o;
    memset(&o, 0, sizeof o);
    o.out_dir = dir;
    o.layers = 6;
    o.sparse = 1;
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_synth_write(&o, &err) == 0, "%s", fmt_err(&err));
    ckpt c;
    ckpt_open(&c, dir);
    check_layout(&c);
    ck_assert_uint_eq(c.cfg.num_hidden_layers, 6);
    for (uint32_t L = 0; L < 6; L++)  /* 1-based MLA: 4 and the last (6) */
        ck_assert_msg(c.cfg.layer_attn[L] == ((L == 3 || L == 5) ? KL_ATTN_MLA : KL_ATTN_KDA),
                      "layer %u", L);
    ckpt_close(&c);
    t_rmrf(dir);
}
END_TEST

START_TEST(synth_full_sparse_has_the_48b_tensor_table)
{
    char dir[256];
    t_mkdtemp(dir, sizeof dir);
    kl_synth_result res;
    kl_err err;
    ck_assert_msg(synth(dir, "full", KL_SYNTH_BF16, 0, 0, 1, &res, &err) == 0, "%s",
                  fmt_err(&err));
    ck_assert_uint_eq(res.n_tensors, 20493);
    ckpt c;
    ckpt_open(&c, dir);
    check_layout(&c);
    uint64_t f32_bytes = 0;
    for (size_t i = 0; i < c.schema.n; i++)
        if (c.schema.entries[i].synth_dtype == KL_DT_F32)
            f32_bytes += c.schema.entries[i].numel * 2; /* the extra half of 4-byte values */
    ck_assert_uint_eq(c.idx.total_size, 98245363456ull + f32_bytes);
    ck_assert_uint_eq(c.n_shards, (size_t)((c.idx.total_size + 4999999999ull) / 5000000000ull));
    for (size_t k = 0; k < c.n_shards; k++) {
        struct stat st;
        ck_assert_int_eq(stat(c.st[k].path, &st), 0);
        ck_assert_uint_eq((uint64_t)st.st_size, c.st[k].file_bytes);
        ck_assert_msg((uint64_t)st.st_blocks * 512 < (1u << 24), "%s allocates %lld bytes",
                      c.st[k].path, (long long)st.st_blocks * 512);
    }
    ckpt_close(&c);
    t_rmrf(dir);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* synth: values and determinism                                                              */

START_TEST(synth_values_follow_their_distributions)
{
    char dir[256];
    t_mkdtemp(dir, sizeof dir);
    kl_err err;
    ck_assert_msg(synth(dir, "tiny", KL_SYNTH_BF16, 3, 0, 0, NULL, &err) == 0, "%s",
                  fmt_err(&err));
    ckpt c;
    ckpt_open(&c, dir);
    /* no tensor is constant */
    for (size_t i = 0; i < c.schema.n; i++) {
        const kl_st_tensor *t;
        uint8_t *b = read_tensor(&c, c.schema.entries[i].name, &t);
        unsigned el = kl_dtype_bits(t->dtype) / 8;
        int varies = 0;
        for (uint64_t j = 1; j < t->numel && !varies; j++)
            varies = memcmp(b, b + j * el, el) != 0;
        ck_assert_msg(varies, "%s is constant", t->name);
        kl_free(b);
    }
    stats s = tensor_stats(&c, first_of_role(&c, KL_ROLE_EMBED)->name);
    ck_assert_msg(fabs(s.mean) < 0.02 && fabs(s.std - 1) < 0.03, "embed mean %g std %g", s.mean,
                  s.std);
    const kl_schema_entry *e = first_of_role(&c, KL_ROLE_KDA_Q);
    double want = 1 / sqrt((double)e->shape[e->rank - 1]);
    s = tensor_stats(&c, e->name);
    ck_assert_msg(fabs(s.std / want - 1) < 0.1, "%s std %g want %g", e->name, s.std, want);
    s = tensor_stats(&c, first_of_role(&c, KL_ROLE_INPUT_NORM)->name);
    ck_assert_msg(fabs(s.mean - 1) < 0.06 && s.std > 0.05 && s.std < 0.15, "norm %g %g", s.mean,
                  s.std);
    s = tensor_stats(&c, first_of_role(&c, KL_ROLE_KDA_A_LOG)->name);
    ck_assert_msg(s.min >= 0 && s.max <= log(16.0) + 1e-3, "A_log in [%g, %g]", s.min, s.max);
    s = tensor_stats(&c, first_of_role(&c, KL_ROLE_KDA_DT_BIAS)->name);
    ck_assert_msg(s.min >= log(expm1(1e-3)) - 0.01 && s.max <= log(expm1(0.1)) + 0.01,
                  "dt_bias in [%g, %g]", s.min, s.max);
    s = tensor_stats(&c, first_of_role(&c, KL_ROLE_ROUTER_BIAS)->name);
    ck_assert_msg(s.std > 0.002 && s.std < 0.03 && fabs(s.mean) < 0.02, "bias %g %g", s.mean,
                  s.std);
    ckpt_close(&c);
    t_rmrf(dir);
}
END_TEST

START_TEST(synth_is_deterministic_for_a_seed_and_any_thread_count_or_write_path)
{
    char a[256], b[256], d[256];
    t_mkdtemp(a, sizeof a);
    t_mkdtemp(b, sizeof b);
    t_mkdtemp(d, sizeof d);
    kl_err err;
    for (int fmt = 0; fmt < 2; fmt++) {
        ck_assert_msg(synth(a, "tiny", (kl_synth_format)fmt, 42, 1, 0, NULL, &err) == 0, "%s",
                      fmt_err(&err));
        buffered_io = 1; /* also independent of the write path */
        ck_assert_msg(synth(b, "tiny", (kl_synth_format)fmt, 42, 5, 0, NULL, &err) == 0, "%s",
                      fmt_err(&err));
        buffered_io = 0;
        ck_assert_msg(synth(d, "tiny", (kl_synth_format)fmt, 43, 3, 0, NULL, &err) == 0, "%s",
                      fmt_err(&err));
        compare_dirs(a, b, 1);
        compare_dirs(a, d, 0);
        t_rmrf(a);
        t_rmrf(b);
        t_rmrf(d);
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* synth: MXFP4                                                                               */

/* Checks that each layer's routed-expert tensors are one run of adjacent tensors in one shard,
 * in strcmp order, six per expert. */
static void check_expert_regions(const ckpt *c)
{
    for (uint32_t L = 0; L < c->cfg.num_hidden_layers; L++) {
        size_t shard = SIZE_MAX, n = 0;
        for (size_t i = 0; i < c->schema.n; i++) {
            const kl_schema_entry *e = &c->schema.entries[i];
            if (e->layer != (int32_t)L || !kl_role_is_expert(e->role))
                continue;
            ck_assert_msg(e->part != KL_PART_WEIGHT, "%s is not MXFP4", e->name);
            size_t k;
            ckpt_find(c, e->name, &k);
            ck_assert_msg(shard == SIZE_MAX || shard == k, "layer %u experts span shards", L);
            shard = k;
            n++;
        }
        if (!n)
            continue;
        ck_assert_uint_eq(n, 6 * (size_t)c->cfg.num_experts);
        const kl_st_file *f = &c->st[shard];
        size_t first = SIZE_MAX, last = 0, cnt = 0;
        for (size_t i = 0; i < f->n_tensors; i++) {
            const kl_schema_entry *e = kl_schema_find(&c->schema, f->tensors[i].name);
            if (e->layer == (int32_t)L && kl_role_is_expert(e->role)) {
                first = first == SIZE_MAX ? i : first;
                last = i;
                cnt++;
            }
        }
        ck_assert_msg(last - first + 1 == cnt, "layer %u experts are not contiguous", L);
        for (size_t i = first + 1; i <= last; i++)
            ck_assert_msg(strcmp(f->tensors[i - 1].name, f->tensors[i].name) < 0,
                          "%s before %s", f->tensors[i - 1].name, f->tensors[i].name);
        for (size_t i = first; i <= last; i += 6) /* six adjacent tensors per expert */
            for (size_t j = 1; j < 6; j++) {
                const kl_schema_entry *a = kl_schema_find(&c->schema, f->tensors[i].name);
                const kl_schema_entry *b = kl_schema_find(&c->schema, f->tensors[i + j].name);
                ck_assert_int_eq(a->expert, b->expert);
            }
    }
}

START_TEST(synth_mxfp4_experts_are_contiguous_and_dequantize_to_the_bf16_spread)
{
    char dir[256];
    t_mkdtemp(dir, sizeof dir);
    kl_err err;
    ck_assert_msg(synth(dir, "tiny", KL_SYNTH_MXFP4, 5, 0, 0, NULL, &err) == 0, "%s",
                  fmt_err(&err));
    ckpt c;
    ckpt_open(&c, dir);
    check_layout(&c);
    ck_assert_int_eq(c.cfg.family, KL_FAMILY_KIMI_LINEAR_MXFP4);
    ck_assert(c.cfg.quantized);
    ck_assert_str_eq(c.cfg.quant_format, "mxfp4-pack-quantized");
    check_expert_regions(&c);

    /* dequantize every w1 of layer 1: element 2i = low nibble, 2i+1 = high nibble */
    static const double lut[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4,
                                   -6};
    double sum = 0, sq = 0, n = 0;
    unsigned hist[8] = {0};
    for (uint32_t x = 0; x < c.cfg.num_experts; x++) {
        char pn[256], sn[256];
        snprintf(pn, sizeof pn, "model.layers.1.block_sparse_moe.experts.%u.w1.weight_packed", x);
        snprintf(sn, sizeof sn, "model.layers.1.block_sparse_moe.experts.%u.w1.weight_scale", x);
        const kl_st_tensor *tp, *ts;
        uint8_t *p = read_tensor(&c, pn, &tp), *s = read_tensor(&c, sn, &ts);
        uint64_t rows = tp->shape[0], half = tp->shape[1];
        ck_assert_uint_eq(ts->shape[1] * 16, half);
        for (uint64_t r = 0; r < rows; r++)
            for (uint64_t i = 0; i < half * 2; i++) {
                uint8_t byte = p[r * half + i / 2];
                uint8_t code = i % 2 ? byte >> 4 : byte & 15;
                double v = lut[code] * ldexp(1.0, (int)s[r * ts->shape[1] + i / 32] - 127);
                hist[code & 7]++;
                sum += v;
                sq += v * v;
                n++;
            }
        kl_free(p);
        kl_free(s);
    }
    double want = 1 / sqrt((double)c.cfg.hidden_size), std = sqrt(sq / n - (sum / n) * (sum / n));
    ck_assert_msg(fabs(std / want - 1) < 0.1, "dequantized std %g, want %g", std, want);
    ck_assert_msg(fabs(sum / n) < 0.1 * want, "dequantized mean %g", sum / n);
    for (int m = 0; m < 8; m++)  /* every magnitude used; none dominates */
        ck_assert_msg(hist[m] > 0 && hist[m] < n * 0.4, "code magnitude %d: %u of %g", m,
                      hist[m], n);
    ckpt_close(&c);
    t_rmrf(dir);
}
END_TEST

/* SHA-256 of a file, as hex, through the library's hash pass. */
static void file_sha256(const char *path, char hex[65])
{
    kl_hashpass_file f = {.path = path};
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_hashpass_run(&f, 1, NULL, NULL, &err) == 0, "%s", fmt_err(&err));
    kl_sha256_hex(f.sha256, hex);
}

/* The bytes of a synthesized checkpoint are part of its contract (deterministic from the seed,
 * whatever the version): pinned for tiny seed 7, BF16 and MXFP4 (whose expert blocks come from
 * the quantizer, zero codes keeping their sign). */
START_TEST(synth_tiny_shards_keep_their_bytes)
{
    static const struct {
        kl_synth_format fmt;
        const char *shard, *sha;
    } want[] = {
        {KL_SYNTH_BF16, "model-00001-of-00004.safetensors",
         "54d0740edd0595bfb4d705e3b907439e56ff4eaae6e236e4ddf01a398a67bc84"},
        {KL_SYNTH_BF16, "model-00004-of-00004.safetensors",
         "a8d5001f40659005e9ff3bf80533a59e5c41fe1091d855fe076974c0845180fd"},
        {KL_SYNTH_MXFP4, "model-00001-of-00003.safetensors",
         "8df49a7c033bceabac5334f62fc20b54a8eb99bc6e313fd0035b8a5292f61ae5"},
        {KL_SYNTH_MXFP4, "model-00002-of-00003.safetensors",
         "878ce0e59544b032969aef9b2779f86274326d82c3671b74ac9b414bc2a6c302"},
        {KL_SYNTH_MXFP4, "model-00003-of-00003.safetensors",
         "0a96ee03beff39099e601acb437c8b5cdb8682ba6aac1c5228446677ca82e14e"},
    };
    for (int fmt = KL_SYNTH_BF16; fmt <= KL_SYNTH_MXFP4; fmt++) {
        char dir[256];
        t_mkdtemp(dir, sizeof dir);
        kl_err err;
        ck_assert_msg(synth(dir, "tiny", (kl_synth_format)fmt, 7, 2, 0, NULL, &err) == 0, "%s",
                      fmt_err(&err));
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            if ((int)want[i].fmt != fmt)
                continue;
            char path[512], hex[65];
            snprintf(path, sizeof path, "%s/%s", dir, want[i].shard);
            file_sha256(path, hex);
            ck_assert_msg(strcmp(hex, want[i].sha) == 0, "%s: sha256 %s, want %s", path, hex,
                          want[i].sha);
        }
        t_rmrf(dir);
    }
}
END_TEST

START_TEST(synth_mxfp4_small_orders_expert_10_before_expert_2)
{
    char dir[256];
    t_mkdtemp(dir, sizeof dir);
    kl_err err;
    ck_assert_msg(synth(dir, "small", KL_SYNTH_MXFP4, 0, 0, 1, NULL, &err) == 0, "%s",
                  fmt_err(&err));
    ckpt c;
    ckpt_open(&c, dir);
    check_layout(&c);
    check_expert_regions(&c);
    const kl_st_tensor *t10 = ckpt_find(&c, "model.layers.2.block_sparse_moe.experts.10.w1."
                                            "weight_packed", NULL);
    const kl_st_tensor *t2 = ckpt_find(&c, "model.layers.2.block_sparse_moe.experts.2.w1."
                                           "weight_packed", NULL);
    ck_assert_uint_lt(t10->begin, t2->begin);
    ckpt_close(&c);
    t_rmrf(dir);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* synth: sparse files, tokenizer, failures                                                   */

START_TEST(synth_sparse_writes_exact_sizes_and_holes)
{
    char dir[256], full[256];
    t_mkdtemp(dir, sizeof dir);
    t_mkdtemp(full, sizeof full);
    kl_err err;
    ck_assert_msg(synth(dir, "small", KL_SYNTH_BF16, 9, 0, 1, NULL, &err) == 0, "%s",
                  fmt_err(&err));
    ck_assert_msg(synth(full, "small", KL_SYNTH_BF16, 9, 0, 0, NULL, &err) == 0, "%s",
                  fmt_err(&err));
    ckpt c, f;
    ckpt_open(&c, dir);
    ckpt_open(&f, full);
    check_layout(&c);
    ck_assert_uint_eq(c.n_shards, f.n_shards);
    for (size_t k = 0; k < c.n_shards; k++) {
        struct stat st;
        ck_assert_int_eq(stat(c.st[k].path, &st), 0);
        ck_assert_uint_eq((uint64_t)st.st_size, c.st[k].file_bytes);
        ck_assert_uint_eq(c.st[k].file_bytes, f.st[k].file_bytes);
        if (c.st[k].file_bytes > (1u << 20))
            ck_assert_msg((uint64_t)st.st_blocks * 512 < c.st[k].file_bytes / 2,
                          "%s: %lld bytes allocated of %" PRIu64, c.st[k].path,
                          (long long)st.st_blocks * 512, c.st[k].file_bytes);
        /* the headers are the same as a full write's */
        size_t la, lb;
        uint8_t *a = read_all(c.st[k].path, &la), *b = read_all(f.st[k].path, &lb);
        ck_assert_int_eq(memcmp(a, b, (size_t)c.st[k].data_off), 0);
        kl_free(a);
        kl_free(b);
    }
    ckpt_close(&c);
    ckpt_close(&f);
    t_rmrf(dir);
    t_rmrf(full);
}
END_TEST

static int b64val(char ch)
{
    const char *tbl = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *p = strchr(tbl, ch);
    return ch && p ? (int)(p - tbl) : -1;
}

START_TEST(synth_tokenizer_ranks_are_reachable_merges)
{
    char dir[256], p[4096];
    t_mkdtemp(dir, sizeof dir);
    kl_err err;
    kl_err_clear(&err);
    ck_assert_int_eq(kl_synth_write_tokenizer(dir, 1024, &err), 0);
    path_in(p, sizeof p, dir, "tiktoken.model");
    size_t len;
    char *txt = (char *)read_all(p, &len);
    /* decode every line */
    enum { N = 768 };
    static char tok[N][24];
    static size_t tl[N];
    size_t n = 0;
    for (char *line = strtok(txt, "\n"); line; line = strtok(NULL, "\n"), n++) {
        ck_assert_uint_lt(n, N);
        char *sp = strchr(line, ' ');
        ck_assert(sp != NULL);
        ck_assert_int_eq(atoi(sp + 1), (int)n);
        size_t o = 0;
        uint32_t acc = 0;
        int bits = 0;
        for (char *q = line; q < sp && *q != '='; q++) {
            int v = b64val(*q);
            ck_assert_msg(v >= 0, "bad base64 in line %zu", n);
            acc = acc << 6 | (uint32_t)v;
            bits += 6;
            if (bits >= 8) {
                bits -= 8;
                tok[n][o++] = (char)(acc >> bits);
                ck_assert_uint_lt(o, sizeof tok[0]);
            }
        }
        tl[n] = o;
    }
    ck_assert_uint_eq(n, N);
    for (size_t r = 0; r < 256; r++)
        ck_assert(tl[r] == 1 && (uint8_t)tok[r][0] == r);
    for (size_t r = 256; r < N; r++) {
        ck_assert_uint_ge(tl[r], 2);
        int split = 0;
        for (size_t cut = 1; cut < tl[r] && !split; cut++) {
            int left = 0, right = 0;
            for (size_t q = 0; q < r && !(left && right); q++) {
                left |= tl[q] == cut && !memcmp(tok[q], tok[r], cut);
                right |= tl[q] == tl[r] - cut && !memcmp(tok[q], tok[r] + cut, tl[r] - cut);
            }
            split = left && right;
        }
        ck_assert_msg(split, "rank %zu is not a merge of two lower ranks", r);
        for (size_t q = 256; q < r; q++)
            ck_assert_msg(tl[q] != tl[r] || memcmp(tok[q], tok[r], tl[r]), "rank %zu repeats", r);
    }
    kl_free(txt);

    path_in(p, sizeof p, dir, "tokenizer_config.json");
    char *cfg = (char *)read_all(p, &len);
    static const char *const want[] = {
        "\"768\":", "\"[BOS]\"", "\"769\":", "\"[EOS]\"", "\"770\":", "\"<|im_end|>\"",
        "\"785\":", "\"<|im_middle|>\"", "\"1022\":", "\"[UNK]\"", "\"1023\":", "\"[PAD]\"",
        "<|reserved_token_773|>", "<|tool_call_begin|>", "\"chat_template\""};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(cfg, want[i]) != NULL, "tokenizer_config.json lacks %s", want[i]);
    /* ids in order: [BOS] at 3840 comes right after its key */
    char *bos = strstr(cfg, "\"768\":");
    ck_assert(bos && strstr(bos, "[BOS]") < strstr(bos, "\"769\":"));
    char *im_middle = strstr(cfg, "\"785\":");
    ck_assert(im_middle && strstr(im_middle, "<|im_middle|>") < strstr(im_middle, "\"786\":"));
    kl_free(cfg);
    t_rmrf(dir);
}
END_TEST

/* Cancels at its first call; counts the calls made before the end. */
static int cancel_at_once(void *ctx, uint64_t done, uint64_t total)
{
    *(int *)ctx += done < total;
    return 1;
}

START_TEST(synth_failures_leave_no_complete_looking_files)
{
    char dir[256], p[4096];
    kl_synth_result res;
    kl_err err;
    t_mkdtemp(dir, sizeof dir);
    ck_assert_int_eq(synth(dir, "tiny", KL_SYNTH_BF16, 0, 0, 1, &res, &err), 0);
    ck_assert_uint_ge(res.n_shards, 3);
    t_rmrf(dir);

    /* a directory squats on shard 2's name: its rename fails after shard 1 committed */
    t_mkdtemp(dir, sizeof dir);
    char name[64];
    snprintf(name, sizeof name, "model-00002-of-%05zu.safetensors", res.n_shards);
    path_in(p, sizeof p, dir, name);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    int rc = synth(dir, "tiny", KL_SYNTH_BF16, 0, 2, 0, NULL, &err);
    ck_assert_msg(rc == KL_E_IO, "rc %d: %s", rc, fmt_err(&err));
    ck_assert_msg(strstr(err.file, ".partial") != NULL, "%s", fmt_err(&err));
    ck_assert_msg(count_entries(dir, NULL) == 1, "files left: %d", count_entries(dir, NULL));
    t_rmrf(dir);

    /* a progress callback that cancels */
    t_mkdtemp(dir, sizeof dir);
    kl_synth_opts o;
    memset(&o, 0, sizeof o);
    int calls = 0;
    o.out_dir = dir;
    o.preset = "small";
    o.threads = 1;
    o.progress = cancel_at_once;
    o.progress_ctx = &calls;
    kl_err_clear(&err);
    rc = kl_synth_write(&o, &err);
    if (rc == 0) { /* finished before the first progress call (0.1 s): the final call only */
        ck_assert_int_eq(calls, 0);
    } else {
        ck_assert_msg(rc == KL_E_CANCELLED, "rc %d: %s", rc, fmt_err(&err));
        ck_assert_msg(count_entries(dir, NULL) == 0, "files left: %d", count_entries(dir, NULL));
    }
    t_rmrf(dir);

    o.out_dir = NULL;
    ck_assert_int_eq(kl_synth_write(&o, &err), KL_E_USAGE);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* kl synth                                                                                   */

START_TEST(cmd_synth_refuses_a_non_empty_directory_and_bad_options)
{
    char dir[256], p[4096];
    t_mkdtemp(dir, sizeof dir);
    char *ok_argv[] = {"synth", dir, "--preset=tiny", "--format", "mxfp4", "--seed", "3",
                       "--shard-size", "128K", "--threads", "2", "-q", NULL};
    ck_assert_int_eq(cmd_synth(12, ok_argv), KL_EXIT_OK);
    ck_assert(exists(dir, "model.safetensors.index.json"));
    ck_assert_int_eq(cmd_synth(12, ok_argv), KL_EXIT_USAGE); /* now non-empty */
    path_in(p, sizeof p, dir, "new");
    char *bad[][4] = {{"synth", p, "--preset", "huge"},
                      {"synth", p, "--format", "fp8"},
                      {"synth", p, "--layers", "0"},
                      {"synth", p, "--shard-size", "lots"},
                      {"synth", p, "--bogus", "1"},
                      {"synth", "--seed", "1", p}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(cmd_synth(4, bad[i]) == (i < 5 ? KL_EXIT_USAGE : KL_EXIT_OK),
                      "case %zu", i);
    char *none[] = {"synth", NULL};
    ck_assert_int_eq(cmd_synth(1, none), KL_EXIT_USAGE);
    t_rmrf(dir);
}
END_TEST

START_TEST(path_parent_names_the_directory_holding_a_path)
{
    static const char *const cases[][2] = {{"a/b", "a"},  {"a/b/", "a"},  {"b", "."},
                                           {"/b", "/"},   {"/", "/"},     {"a//b", "a"},
                                           {"/x/y/z", "/x/y"}, {"b/", "."}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[64];
        ck_assert_int_eq(kl_path_parent(out, sizeof out, cases[i][0], NULL), 0);
        ck_assert_msg(!strcmp(out, cases[i][1]), "parent of '%s': want '%s', got '%s'",
                      cases[i][0], cases[i][1], out);
    }
    char tiny[2];
    ck_assert_int_eq(kl_path_parent(tiny, sizeof tiny, "ab/c", NULL), KL_E_USAGE);
}
END_TEST

START_TEST(cmd_synth_refuses_a_missing_parent_directory)
{
    const char *kl = getenv("KL_BIN");
    ck_assert_msg(kl && *kl, "KL_BIN must name the kl binary under test");
    char dir[256], p[4096], cmd[9000], errf[4096];
    t_mkdtemp(dir, sizeof dir);
    path_in(p, sizeof p, dir, "nope/out");
    path_in(errf, sizeof errf, dir, "err.txt");
    snprintf(cmd, sizeof cmd, "'%s' synth '%s' -q 2> '%s'", kl, p, errf);
    int st = system(cmd);
    size_t len;
    char *text = (char *)read_all(errf, &len);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == KL_EXIT_USAGE, "status %d: %s", st, text);
    ck_assert_msg(strstr(text, "nope") && strstr(text, "does not exist"), "%s", text);
    ck_assert_msg(!exists(dir, "nope"), "synth created the missing parent");
    kl_free(text);
    t_rmrf(dir);
}
END_TEST

START_TEST(synth_dry_run_writes_nothing_and_plans_the_real_sizes)
{
    char dir[256], out[4096], p[4096];
    t_mkdtemp(dir, sizeof dir);
    path_in(out, sizeof out, dir, "out");
    kl_out_plan plan, again;
    kl_synth_result res;
    kl_synth_opts o = {.out_dir = out, .preset = "small", .threads = 2, .buffered = 1,
                       .dry_run = 1, .plan = &plan, .result = &res};
    kl_err err;
    kl_err_clear(&err);
    ck_assert_msg(kl_synth_write(&o, &err) == 0, "%s", fmt_err(&err));
    ck_assert_msg(!exists(dir, "out"), "a dry run created OUT");
    ck_assert(plan.n_shards > 1 && plan.free_bytes > 0);
    ck_assert(plan.needed_bytes == plan.total_bytes && plan.total_bytes > plan.shard_bytes);
    o.dry_run = 0;
    o.plan = &again;
    ck_assert_msg(kl_synth_write(&o, &err) == 0, "%s", fmt_err(&err));
    for (size_t k = 0; k < plan.n_shards; k++) {
        struct stat st;
        path_in(p, sizeof p, out, plan.shards[k].name);
        ck_assert_msg(stat(p, &st) == 0, "planned shard %s not written", p);
        ck_assert_msg((uint64_t)st.st_size == plan.shards[k].file_bytes,
                      "%s: planned %" PRIu64 " bytes, wrote %lld", p, plan.shards[k].file_bytes,
                      (long long)st.st_size);
    }
    ck_assert(res.file_bytes == plan.shard_bytes && res.n_shards == plan.n_shards);
    kl_out_plan_free(&plan);
    kl_out_plan_free(&again);
    /* the flag: the plan on stdout, nothing on disk */
    path_in(p, sizeof p, dir, "cli");
    char *argv[] = {"synth", p, "--dry-run", "-q", NULL};
    ck_assert_int_eq(cmd_synth(4, argv), KL_EXIT_OK);
    ck_assert_msg(!exists(dir, "cli"), "kl synth --dry-run created OUT");
    t_rmrf(dir);
}
END_TEST

static Suite *synth_suite(void)
{
    Suite *s = suite_create("synth");
    TCase *w = tcase_create("st_writer");
    tcase_add_test(w, st_writer_writes_a_page_aligned_shard_the_strict_reader_accepts);
    tcase_add_test(w, st_writer_direct_and_buffered_writes_give_the_same_file);
    tcase_add_test(w, st_writer_honours_a_smaller_data_alignment);
    tcase_add_test(w, st_writer_refuses_bad_tensor_lists_without_creating_files);
    tcase_add_test(w, st_writer_close_without_commit_removes_the_partial_file);
    tcase_add_test(w, st_index_write_is_sorted_and_parses);
    suite_add_tcase(s, w);

    TCase *l = tcase_create("layout");
    tcase_set_timeout(l, 60);
    tcase_add_test(l, synth_tiny_bf16_matches_the_schema);
    tcase_add_test(l, synth_small_keeps_kimi_ref_geometry);
    tcase_add_test(l, synth_layers_keep_the_three_to_one_pattern);
    tcase_add_test(l, synth_full_sparse_has_the_48b_tensor_table);
    suite_add_tcase(s, l);

    TCase *v = tcase_create("values");
    tcase_set_timeout(v, 60);
    tcase_add_test(v, synth_values_follow_their_distributions);
    tcase_add_test(v, synth_is_deterministic_for_a_seed_and_any_thread_count_or_write_path);
    suite_add_tcase(s, v);

    TCase *m = tcase_create("mxfp4");
    tcase_set_timeout(m, 60);
    tcase_add_test(m, synth_mxfp4_experts_are_contiguous_and_dequantize_to_the_bf16_spread);
    tcase_add_test(m, synth_mxfp4_small_orders_expert_10_before_expert_2);
    tcase_add_test(m, synth_tiny_shards_keep_their_bytes);
    suite_add_tcase(s, m);

    TCase *f = tcase_create("files");
    tcase_set_timeout(f, 60);
    tcase_add_test(f, synth_sparse_writes_exact_sizes_and_holes);
    tcase_add_test(f, synth_tokenizer_ranks_are_reachable_merges);
    tcase_add_test(f, synth_failures_leave_no_complete_looking_files);
    tcase_add_test(f, cmd_synth_refuses_a_non_empty_directory_and_bad_options);
    tcase_add_test(f, path_parent_names_the_directory_holding_a_path);
    tcase_add_test(f, cmd_synth_refuses_a_missing_parent_directory);
    tcase_add_test(f, synth_dry_run_writes_nothing_and_plans_the_real_sizes);
    suite_add_tcase(s, f);
    return s;
}

int main(void)
{
    return t_run_suite(synth_suite());
}
