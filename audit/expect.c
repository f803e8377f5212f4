/*
 * audit/expect.c — expected SHA-256 values for shards.
 *
 * Two sources:
 *  - a sha256sum-format file: "HEX  NAME" (text mode) or "HEX *NAME" (binary mode) per line,
 *    64 hex digits, CRLF tolerated, blank lines skipped; sha256sum's escaped form (a line
 *    starting with '\', "\\" and "\n" in the name) is understood.  NAME may carry a directory
 *    prefix; only the base name is matched against shard names;
 *  - a Hugging Face cache snapshot directory: each shard there is a symbolic link into
 *    ../../blobs/<sha256>, so the blob's name is the expected hash (no network needed).
 * When no source is given and the audited directory is itself such a snapshot, its links are
 * used the same way.
 *
 * Sections: helpers, sums parsing, snapshot links, public API, findings.
 */
#include "audit/expect.h"
#include "audit/report.h"

#include "audit/audit_int.h"
#include "common/fs.h"
#include "common/grow.h"
#include "common/mem.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------------------- */

static int is_hex64(const char *s, size_t n)
{
    if (n != 64)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i]))
            return 0;
    return 1;
}

static void lower_copy(char out[65], const char *s)
{
    for (int i = 0; i < 64; i++)
        out[i] = (char)tolower((unsigned char)s[i]);
    out[64] = 0;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* ---- sums parsing -------------------------------------------------------------------------- */

static int add_bad(kl_expect *e, unsigned line, uint64_t off, const char *why)
{
    if (e->n_bad_total++ >= KL_EXPECT_MAX_BAD)
        return 0;
    if (kl_grow(&e->bad, &e->cap_bad, e->n_bad + 1, sizeof *e->bad))
        return KL_E_NOMEM;
    kl_expect_bad *b = &e->bad[e->n_bad++];
    b->line = line;
    b->off = off;
    kl_copy_text(b->why, sizeof b->why, why);
    return 0;
}

/* Copies the name field (n bytes) into a kl_malloc'd string, undoing sha256sum's escapes when
 * escaped; NULL with *why set if it is not a usable name. */
static char *take_name(const char *s, size_t n, int escaped, const char **why)
{
    char *out = kl_malloc(n + 1);
    if (!out) {
        *why = NULL;
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == 0) {
            *why = "the file name holds a NUL byte";
            goto bad;
        }
        if (escaped && c == '\\') {
            if (i + 1 == n || (s[i + 1] != '\\' && s[i + 1] != 'n')) {
                *why = "bad escape in the file name";
                goto bad;
            }
            c = s[++i] == 'n' ? '\n' : '\\';
        }
        out[k++] = c;
    }
    out[k] = 0;
    if (!*base_name(out)) {
        *why = "no file name after the hash";
        goto bad;
    }
    return out;
bad:
    kl_free(out);
    return NULL;
}

/* Why the hash field (the bytes before the first space) is not 64 hex digits. */
static void describe_hash(const char *s, size_t n, char *why, size_t cap)
{
    size_t h = 0;
    while (h < n && s[h] != ' ')
        h++;
    size_t hex = 0;
    while (hex < h && isxdigit((unsigned char)s[hex]))
        hex++;
    if (hex < h)
        snprintf(why, cap, "the hash holds a character that is not a hex digit at column %zu",
                 hex + 1);
    else if (h != 64)
        snprintf(why, cap, "the hash has %zu hex digit(s), SHA-256 needs 64", h);
    else
        snprintf(why, cap, "expected two spaces (text mode) or ' *' (binary mode) between the "
                           "hash and the file name");
}

static int add_line(kl_expect *e, char *name, const char *hex, unsigned line, uint64_t off)
{
    if (kl_grow(&e->lines, &e->cap_lines, e->n_lines + 1, sizeof *e->lines)) {
        kl_free(name);
        return KL_E_NOMEM;
    }
    size_t idx = e->n_lines;
    kl_expect_line *l = &e->lines[idx];
    memset(l, 0, sizeof *l);
    l->name = name;
    lower_copy(l->sha256, hex);
    l->line = line;
    l->off = off;
    l->first = idx;
    e->n_lines++;
    uint32_t prev;
    int rc = kl_strmap_put(&e->by_name, base_name(name), (uint32_t)idx, &prev);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        kl_expect_line *p = &e->lines[prev];
        if (!strcmp(p->sha256, l->sha256)) { /* the same fact twice: harmless */
            kl_free(l->name);
            e->n_lines--;
            return 0;
        }
        p->conflict = l->conflict = true;
        l->first = prev;
    }
    return 0;
}

/* One line (without its '\n'); blank lines are skipped. */
static int parse_line(kl_expect *e, const char *s, size_t n, unsigned line, uint64_t off)
{
    if (n && s[n - 1] == '\r')
        n--;
    size_t blank = 0;
    while (blank < n && isspace((unsigned char)s[blank]))
        blank++;
    if (blank == n)
        return 0;
    int escaped = s[0] == '\\';
    const char *h = s + escaped;
    size_t hn = n - escaped;
    char why[160];
    if (hn < 67 || !is_hex64(h, 64) || h[64] != ' ' || (h[65] != ' ' && h[65] != '*')) {
        describe_hash(h, hn, why, sizeof why);
        if (hn >= 66 && is_hex64(h, 64) && h[64] == ' ' && (h[65] == ' ' || h[65] == '*'))
            snprintf(why, sizeof why, "no file name after the hash");
        return add_bad(e, line, off, why);
    }
    const char *bad = NULL;
    char *name = take_name(h + 66, hn - 66, escaped, &bad);
    if (!name)
        return bad ? add_bad(e, line, off, bad) : KL_E_NOMEM;
    return add_line(e, name, h, line, off);
}

static int parse_sums(kl_expect *e, const char *text, size_t len)
{
    int rc = kl_strmap_init(&e->by_name, 16);
    unsigned line = 0;
    for (size_t pos = 0; !rc && pos < len;) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - (text + pos)) : len - pos;
        rc = parse_line(e, text + pos, n, ++line, pos);
        pos += n + 1;
    }
    return rc;
}

/* ---- snapshot links ------------------------------------------------------------------------ */

/* Expected hash from a snapshot link DIR/NAME -> .../blobs/<sha256>; 1 if found. */
static int lookup_link(const char *dir, const char *name, char out[65])
{
    char path[4096], target[4096];
    if (kl_path_join(path, sizeof path, dir, name, NULL))
        return 0;
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n <= 0)
        return 0;
    target[n] = 0;
    const char *b = base_name(target);
    if (!is_hex64(b, strlen(b)) || !strstr(target, "blobs/"))
        return 0;
    lower_copy(out, b);
    return 1;
}

/* ---- public API ---------------------------------------------------------------------------- */

static int open_source(kl_expect *e, const char *source, kl_err *err)
{
    struct stat st;
    if (stat(source, &st) != 0) {
        kl_fail_sys(err, KL_E_IO, errno, "cannot read the --expect source");
        kl_err_context(err, source, NULL, KL_NO_OFFSET, NULL);
        return KL_E_IO;
    }
    if (S_ISDIR(st.st_mode)) {
        e->kind = KL_EXPECT_SNAPSHOT;
        e->dir = kl_strdup(source);
        return e->dir ? 0 : kl_fail(err, KL_E_NOMEM, "out of memory");
    }
    e->kind = KL_EXPECT_SUMS;
    char *text;
    size_t len;
    int rc = kl_read_file(source, 64u << 20, &text, &len, err);
    if (rc)
        return rc;
    rc = parse_sums(e, text, len);
    kl_free(text);
    return rc ? kl_fail(err, KL_E_NOMEM, "out of memory reading %s", source) : 0;
}

int kl_expect_open(kl_expect *e, const char *source, const char *ckpt_dir, kl_err *err)
{
    memset(e, 0, sizeof *e);
    if (!source) {
        e->kind = KL_EXPECT_SNAPSHOT_AUTO;
        e->dir = kl_strdup(ckpt_dir);
        return e->dir ? 0 : kl_fail(err, KL_E_NOMEM, "out of memory");
    }
    if (!(e->source = kl_strdup(source)))
        return kl_fail(err, KL_E_NOMEM, "out of memory");
    int rc = open_source(e, source, err);
    if (rc)
        kl_expect_free(e);
    return rc;
}

int kl_expect_lookup(const kl_expect *e, const char *shard_name, char out[65])
{
    uint32_t idx;
    switch (e->kind) {
    case KL_EXPECT_SUMS:
        if (!kl_strmap_get(&e->by_name, shard_name, &idx) || e->lines[idx].conflict)
            return 0;
        memcpy(out, e->lines[idx].sha256, 65);
        return 1;
    case KL_EXPECT_SNAPSHOT:
    case KL_EXPECT_SNAPSHOT_AUTO: return lookup_link(e->dir, shard_name, out);
    }
    return 0;
}

void kl_expect_free(kl_expect *e)
{
    if (!e)
        return;
    for (size_t i = 0; i < e->n_lines; i++)
        kl_free(e->lines[i].name);
    kl_free(e->lines);
    kl_free(e->bad);
    kl_strmap_free(&e->by_name);
    kl_free(e->source);
    kl_free(e->dir);
    memset(e, 0, sizeof *e);
}

/* ---- findings ------------------------------------------------------------------------------ */

/* Findings for the lines of a sums file; shards maps every shard name of the checkpoint. */
static int report_lines(const kl_expect *e, kl_audit_report *r, const kl_strmap *shards)
{
    int rc = 0;
    for (size_t i = 0; i < e->n_bad; i++)
        rc |= kl_audit_add(r, KL_SEV_ERROR, "EXPECT-LINE", e->source, NULL, e->bad[i].off,
                           "line %u: %s", e->bad[i].line, e->bad[i].why);
    if (e->n_bad_total > e->n_bad)
        rc |= kl_audit_add(r, KL_SEV_ERROR, "EXPECT-LINE", e->source, NULL, KL_NO_OFFSET,
                           "%zu more malformed line(s) not listed", e->n_bad_total - e->n_bad);
    for (size_t i = 0; i < e->n_lines; i++) {
        const kl_expect_line *l = &e->lines[i];
        const char *name = base_name(l->name);
        if (l->conflict && l->first != i)
            rc |= kl_audit_add(r, KL_SEV_ERROR, "EXPECT-CONFLICT", e->source, NULL, l->off,
                               "line %u: %s listed with SHA-256 %s, line %u has %s", l->line,
                               name, l->sha256, e->lines[l->first].line,
                               e->lines[l->first].sha256);
        if (l->first != i)
            continue;
        if (!kl_strmap_get(shards, name, NULL))
            rc |= kl_audit_add(r, has_suffix(name, ".safetensors") ? KL_SEV_ERROR : KL_SEV_WARN,
                               "EXPECT-EXTRA", e->source, NULL, l->off,
                               "line %u: %s is not a shard of this checkpoint (not checked)",
                               l->line, name);
    }
    return rc;
}

int kl_expect_report(const kl_expect *e, kl_audit_report *r, const kl_checkpoint *ck)
{
    if (e->kind == KL_EXPECT_SNAPSHOT_AUTO)
        return 0;
    int rc = 0;
    if (e->kind == KL_EXPECT_SUMS) {
        kl_strmap shards;
        rc = kl_strmap_init(&shards, ck->n_shards);
        for (size_t i = 0; !rc && i < ck->n_shards; i++)
            rc = kl_strmap_put(&shards, ck->shards[i].name, (uint32_t)i, NULL) < 0;
        if (!rc)
            rc = report_lines(e, r, &shards);
        kl_strmap_free(&shards);
    }
    char hex[65];
    for (size_t i = 0; i < ck->n_shards; i++)
        if (!kl_expect_lookup(e, ck->shards[i].name, hex))
            rc |= kl_audit_add(r, KL_SEV_ERROR, "EXPECT-MISSING", ck->shards[i].path, NULL,
                               KL_NO_OFFSET, "no expected SHA-256 for this shard in %s%s",
                               e->source, e->kind == KL_EXPECT_SUMS
                                              ? " (no well-formed line names it, or lines "
                                                "conflict)"
                                              : " (not a link into a blobs/ directory)");
    return rc ? KL_E_NOMEM : 0;
}
