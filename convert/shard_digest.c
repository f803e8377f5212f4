/* convert/shard_digest.c — SHA-256 tree digest of a shard, fed by leaves (see shard_digest.h). */
#include "convert/shard_digest.h"

#include "common/fasthash.h"
#include "common/mem.h"
#include "loader/reader.h"

#include <inttypes.h>
#include <openssl/evp.h>
#include <string.h>

typedef struct leaf {
    uint64_t      bytes;
    uint64_t      seen;  /* bytes hashed so far */
    EVP_MD_CTX   *md;    /* while the leaf is partly hashed */
    int           done;
    unsigned char sum[32];
} leaf;

struct kl_sdigest {
    leaf     *leaves;
    size_t    n_leaves;
    size_t   *first;     /* [n_pieces] index of each piece's first leaf */
    uint64_t *bytes;     /* [n_pieces] */
    size_t    n_pieces;
};

static size_t leaves_of(uint64_t bytes)
{
    return bytes ? (size_t)((bytes - 1) / KL_SDIGEST_LEAF + 1) : 1;
}

/* Cuts every piece into its leaves. */
static void cut(kl_sdigest *d)
{
    size_t k = 0;
    for (size_t p = 0; p < d->n_pieces; p++) {
        d->first[p] = k;
        for (uint64_t left = d->bytes[p], i = 0; i < leaves_of(d->bytes[p]); i++, k++) {
            d->leaves[k].bytes = left < KL_SDIGEST_LEAF ? left : KL_SDIGEST_LEAF;
            left -= d->leaves[k].bytes;
        }
    }
}

int kl_sdigest_create(kl_sdigest **out, const uint64_t *piece_bytes, size_t n, kl_err *err)
{
    *out = NULL;
    size_t n_leaves = 0;
    for (size_t p = 0; p < n; p++)
        n_leaves += leaves_of(piece_bytes[p]);
    kl_sdigest *d = kl_calloc(1, sizeof *d);
    if (d) {
        d->leaves = kl_calloc(n_leaves ? n_leaves : 1, sizeof *d->leaves);
        d->first = kl_calloc(n ? n : 1, sizeof *d->first);
        d->bytes = kl_calloc(n ? n : 1, sizeof *d->bytes);
    }
    if (!d || !d->leaves || !d->first || !d->bytes) {
        kl_sdigest_destroy(d);
        return kl_fail(err, KL_E_NOMEM, "out of memory for the digests of %zu pieces", n);
    }
    memcpy(d->bytes, piece_bytes, n * sizeof *piece_bytes);
    d->n_pieces = n;
    d->n_leaves = n_leaves;
    cut(d);
    *out = d;
    return 0;
}

void kl_sdigest_destroy(kl_sdigest *d)
{
    if (!d)
        return;
    for (size_t i = 0; d->leaves && i < d->n_leaves; i++)
        EVP_MD_CTX_free(d->leaves[i].md);
    kl_free(d->leaves);
    kl_free(d->first);
    kl_free(d->bytes);
    kl_free(d);
}

/* Finishes leaf x once all its bytes are in (an empty leaf at once). */
static int finish(leaf *x, kl_err *err)
{
    unsigned len = 0;
    int ok = x->md ? EVP_DigestFinal_ex(x->md, x->sum, &len)
                   : EVP_Digest("", 0, x->sum, &len, EVP_sha256(), NULL);
    EVP_MD_CTX_free(x->md);
    x->md = NULL;
    if (ok != 1 || len != 32)
        return kl_fail(err, KL_E_BUG, "OpenSSL SHA-256 final failed");
    x->done = 1;
    return 0;
}

/* n bytes at byte `off` of leaf x (n fits the leaf). */
static int update_leaf(leaf *x, uint64_t off, const uint8_t *data, size_t n, kl_err *err)
{
    if (off != x->seen || x->done)
        return kl_fail(err, KL_E_BUG, "%zu bytes at %" PRIu64 " of a leaf that has %" PRIu64,
                       n, off, x->seen);
    if (!x->md) {
        x->md = EVP_MD_CTX_new();
        if (!x->md || EVP_DigestInit_ex(x->md, EVP_sha256(), NULL) != 1)
            return kl_fail(err, KL_E_NOMEM, "cannot start an OpenSSL SHA-256 context");
    }
    if (EVP_DigestUpdate(x->md, data, n) != 1)
        return kl_fail(err, KL_E_BUG, "OpenSSL SHA-256 update failed");
    x->seen += n;
    return x->seen == x->bytes ? finish(x, err) : 0;
}

int kl_sdigest_update(kl_sdigest *d, size_t p, uint64_t off, const void *data, size_t n,
                      kl_err *err)
{
    if (p >= d->n_pieces || off > d->bytes[p] || n > d->bytes[p] - off)
        return kl_fail(err, KL_E_BUG, "digest of %zu bytes at %" PRIu64 " of piece %zu", n,
                       off, p);
    const uint8_t *b = data;
    while (n) {
        leaf *x = &d->leaves[d->first[p] + off / KL_SDIGEST_LEAF];
        uint64_t at = off % KL_SDIGEST_LEAF;
        size_t take = n < x->bytes - at ? n : (size_t)(x->bytes - at);
        int rc = update_leaf(x, at, b, take, err);
        if (rc)
            return rc;
        b += take;
        off += take;
        n -= take;
    }
    return 0;
}

int kl_sdigest_final(kl_sdigest *d, unsigned char out[32], kl_err *err)
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(md);
        return kl_fail(err, KL_E_NOMEM, "cannot start an OpenSSL SHA-256 context");
    }
    int rc = 0;
    for (size_t i = 0; !rc && i < d->n_leaves; i++) {
        leaf *x = &d->leaves[i];
        if (!x->done && x->bytes == 0)
            rc = finish(x, err);
        else if (!x->done)
            rc = kl_fail(err, KL_E_BUG, "leaf %zu: %" PRIu64 " of %" PRIu64 " bytes hashed", i,
                         x->seen, x->bytes);
        if (!rc && EVP_DigestUpdate(md, x->sum, sizeof x->sum) != 1)
            rc = kl_fail(err, KL_E_BUG, "OpenSSL SHA-256 update failed");
    }
    unsigned len = 0;
    if (!rc && (EVP_DigestFinal_ex(md, out, &len) != 1 || len != 32))
        rc = kl_fail(err, KL_E_BUG, "OpenSSL SHA-256 final failed");
    EVP_MD_CTX_free(md);
    return rc;
}

/* ---- read back ----------------------------------------------------------------------------- */

typedef struct file_pass {
    kl_sdigest *d;
    size_t      piece;  /* piece holding the next byte */
    uint64_t    off;    /* its offset there */
    kl_err     *err;
    int         rc;
} file_pass;

/* Reader callback: the file's bytes in order, split at the piece boundaries. */
static int on_bytes(void *ctx, size_t ext_idx, uint64_t ext_off, const uint8_t *data, size_t len)
{
    (void)ext_idx, (void)ext_off;
    file_pass *f = ctx;
    while (len) {
        while (f->piece < f->d->n_pieces && f->off == f->d->bytes[f->piece]) {
            f->piece++;
            f->off = 0;
        }
        uint64_t left = f->d->bytes[f->piece] - f->off;
        size_t take = left < len ? (size_t)left : len;
        if ((f->rc = kl_sdigest_update(f->d, f->piece, f->off, data, take, f->err)))
            return 1;
        f->off += take;
        data += take;
        len -= take;
    }
    return 0;
}

/* The pieces' sum, or UINT64_MAX if it overflows. */
static uint64_t total_bytes(const uint64_t *piece_bytes, size_t n)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        if (piece_bytes[i] > UINT64_MAX - 1 - sum)
            return UINT64_MAX;
        sum += piece_bytes[i];
    }
    return sum;
}

/* Opens path in a new reader r and checks its size; the file's index, or a KL_E_* code. */
static int open_file(kl_reader **r, const char *path, uint64_t total, kl_err *err)
{
    kl_reader_opts ro = {.queue_depth = 4};
    int rc = kl_reader_create(r, &ro, err);
    int idx = rc ? rc : kl_reader_add_file(*r, path, err);
    if (idx >= 0 && kl_reader_file_size(*r, (uint32_t)idx) != total) {
        idx = kl_fail(err, KL_E_IO, "%" PRIu64 " bytes where the plan has %" PRIu64,
                      kl_reader_file_size(*r, (uint32_t)idx), total);
        kl_err_context(err, path, NULL, KL_NO_OFFSET, NULL);
    }
    return idx;
}

int kl_sdigest_file(const char *path, const uint64_t *piece_bytes, size_t n,
                    unsigned char out[32], kl_err *err)
{
    uint64_t total = total_bytes(piece_bytes, n);
    kl_sdigest *d = NULL;
    kl_reader *r = NULL;
    int rc = kl_sdigest_create(&d, piece_bytes, n, err);
    int idx = rc ? rc : open_file(&r, path, total, err);
    if (idx < 0)
        rc = idx;
    if (!rc) {
        kl_err own; /* the digest's error, which the reader would replace by "cancelled" */
        kl_err_clear(&own);
        file_pass f = {.d = d, .err = &own};
        kl_extent e = {.file = (uint32_t)idx, .off = 0, .len = total};
        rc = kl_reader_run(r, &e, 1, on_bytes, &f, err);
        if (f.rc) {
            rc = f.rc;
            if (err)
                *err = own;
        }
    }
    if (!rc)
        rc = kl_sdigest_final(d, out, err);
    kl_reader_destroy(r);
    kl_sdigest_destroy(d);
    return rc;
}

/* ---- the source digest (XXH3-128 tree, see shard_digest.h) -------------------------------- */

typedef struct src_piece {
    uint64_t     bytes, seen;
    kl_fasthash *leaf;  /* the partly hashed leaf, while there is one */
    kl_fasthash *sums;  /* the leaf digests so far, while the piece is incomplete */
    int          done;
    unsigned char sum[KL_FASTHASH_BYTES];
} src_piece;

struct kl_srcdigest {
    src_piece *pieces;
    size_t     n;
    kl_pool   *pool;
    /* the call in progress (kl_srcdigest_begin .. kl_srcdigest_end): its whole leaves, hashed
     * by kl_srcdigest_leaf, and the ragged tail after them */
    src_piece     *cur;
    const uint8_t *batch, *tail;
    uint64_t       batch_bytes, batch_last; /* all its leaves; its last (the others: full) */
    size_t         batch_n, tail_n, cap;
    unsigned char (*batch_sum)[KL_FASTHASH_BYTES]; /* [cap] */
};

int kl_srcdigest_create(kl_srcdigest **out, const uint64_t *piece_bytes, size_t n, kl_pool *pool,
                        kl_err *err)
{
    *out = NULL;
    kl_srcdigest *d = kl_calloc(1, sizeof *d);
    if (d)
        d->pieces = kl_calloc(n ? n : 1, sizeof *d->pieces);
    if (!d || !d->pieces) {
        kl_free(d);
        return kl_fail(err, KL_E_NOMEM, "out of memory for the source digest of %zu pieces", n);
    }
    for (size_t p = 0; p < n; p++)
        d->pieces[p].bytes = piece_bytes[p];
    d->n = n;
    d->pool = pool;
    *out = d;
    return 0;
}

static void piece_free(src_piece *x)
{
    kl_fasthash_destroy(x->leaf);
    kl_fasthash_destroy(x->sums);
    x->leaf = x->sums = NULL;
}

void kl_srcdigest_destroy(kl_srcdigest *d)
{
    if (!d)
        return;
    for (size_t p = 0; p < d->n; p++)
        piece_free(&d->pieces[p]);
    kl_free(d->pieces);
    kl_free(d->batch_sum);
    kl_free(d);
}

void kl_srcdigest_leaf(void *ctx, size_t i)
{
    kl_srcdigest *d = ctx;
    uint64_t len = i + 1 == d->batch_n ? d->batch_last : KL_SRCDIGEST_LEAF;
    kl_fasthash_buf(d->batch + i * KL_SRCDIGEST_LEAF, (size_t)len, d->batch_sum[i]);
}

/* Cuts data[0..n), which starts at x->seen on a leaf boundary, into whole leaves (the batch)
 * and a tail shorter than a leaf. */
static int plan_leaves(kl_srcdigest *d, src_piece *x, const uint8_t *data, size_t n,
                       kl_err *err)
{
    uint64_t left = x->bytes - x->seen, take = 0;
    size_t k = 0;
    while (left) {
        uint64_t len = left < KL_SRCDIGEST_LEAF ? left : KL_SRCDIGEST_LEAF;
        if (take + len > n)
            break;
        d->batch_last = len;
        take += len;
        left -= len;
        k++;
    }
    if (k > d->cap) {
        void *sums = kl_realloc(d->batch_sum, k * sizeof *d->batch_sum);
        if (!sums)
            return kl_fail(err, KL_E_NOMEM, "out of memory for %zu leaf digests", k);
        d->batch_sum = sums;
        d->cap = k;
    }
    d->batch = data;
    d->batch_n = k;
    d->batch_bytes = take;
    d->tail = data + take;
    d->tail_n = n - (size_t)take;
    return 0;
}

/* Bytes of a leaf hashed across calls: up to the leaf's end. */
static size_t part_leaf(src_piece *x, const uint8_t *data, size_t n)
{
    uint64_t end = (x->seen / KL_SRCDIGEST_LEAF + 1) * KL_SRCDIGEST_LEAF;
    end = end < x->bytes ? end : x->bytes;
    size_t take = end - x->seen < n ? (size_t)(end - x->seen) : n;
    if (x->seen % KL_SRCDIGEST_LEAF == 0)
        kl_fasthash_reset(x->leaf);
    kl_fasthash_update(x->leaf, data, take);
    x->seen += take;
    if (x->seen == end) {
        unsigned char sum[KL_FASTHASH_BYTES];
        kl_fasthash_final(x->leaf, sum);
        kl_fasthash_update(x->sums, sum, sizeof sum);
    }
    return take;
}

int kl_srcdigest_begin(kl_srcdigest *d, size_t p, uint64_t off, const void *data, size_t n,
                       size_t *leaves, kl_err *err)
{
    *leaves = 0;
    src_piece *x = p < d->n ? &d->pieces[p] : NULL;
    if (!x || off != x->seen || n > x->bytes - x->seen)
        return kl_fail(err, KL_E_BUG, "source digest of %zu bytes at %" PRIu64 " of piece %zu",
                       n, off, p);
    int rc = 0;
    if (n && !x->sums && !(rc = kl_fasthash_create(&x->sums, err)))
        rc = kl_fasthash_create(&x->leaf, err);
    size_t head = !rc && n && x->seen % KL_SRCDIGEST_LEAF ? part_leaf(x, data, n) : 0;
    if (!rc)
        rc = plan_leaves(d, x, (const uint8_t *)data + head, n - head, err);
    d->cur = rc ? NULL : x;
    *leaves = rc ? 0 : d->batch_n;
    return rc;
}

void kl_srcdigest_leaves(kl_srcdigest *d)
{
    if (d->pool && d->batch_n > 1)
        kl_pool_run(d->pool, d->batch_n, kl_srcdigest_leaf, d);
    else
        for (size_t i = 0; i < d->batch_n; i++)
            kl_srcdigest_leaf(d, i);
}

void kl_srcdigest_end(kl_srcdigest *d)
{
    src_piece *x = d->cur;
    if (!x)
        return;
    if (d->batch_n)
        kl_fasthash_update(x->sums, d->batch_sum, d->batch_n * KL_FASTHASH_BYTES);
    x->seen += d->batch_bytes;
    if (d->tail_n) /* shorter than a leaf, from a leaf's start: the piece goes on */
        part_leaf(x, d->tail, d->tail_n);
    if (x->seen == x->bytes && x->sums) {
        kl_fasthash_final(x->sums, x->sum);
        piece_free(x);
        x->done = 1;
    }
    d->cur = NULL;
    d->batch_n = d->tail_n = 0;
    d->batch_bytes = 0;
}

int kl_srcdigest_update(kl_srcdigest *d, size_t p, uint64_t off, const void *data, size_t n,
                        kl_err *err)
{
    size_t leaves;
    int rc = kl_srcdigest_begin(d, p, off, data, n, &leaves, err);
    if (rc)
        return rc;
    kl_srcdigest_leaves(d);
    kl_srcdigest_end(d);
    return 0;
}

int kl_srcdigest_final(kl_srcdigest *d, unsigned char out[KL_SRCDIGEST_BYTES], kl_err *err)
{
    kl_fasthash *h;
    int rc = kl_fasthash_create(&h, err);
    for (size_t p = 0; !rc && p < d->n; p++) {
        src_piece *x = &d->pieces[p];
        if (!x->done && x->bytes == 0) { /* no leaves */
            kl_fasthash_buf("", 0, x->sum);
            x->done = 1;
        }
        if (!x->done) {
            rc = kl_fail(err, KL_E_BUG, "source piece %zu: %" PRIu64 " of %" PRIu64
                         " bytes hashed", p, x->seen, x->bytes);
            break;
        }
        unsigned char le[8];
        for (int i = 0; i < 8; i++)
            le[i] = (unsigned char)(x->bytes >> (8 * i));
        kl_fasthash_update(h, le, sizeof le);
        kl_fasthash_update(h, x->sum, sizeof x->sum);
    }
    if (!rc)
        kl_fasthash_final(h, out);
    kl_fasthash_destroy(h);
    return rc;
}
