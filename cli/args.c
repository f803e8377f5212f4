/* cli/args.c — argument helpers shared by the subcommands (see cli.h). */
#include "cli/cli.h"

#include "common/err.h"
#include "common/mem.h"
#include "loader/locate.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kl_cli_parse_u64(const char *s, unsigned long long *out)
{
    if (!s || !isdigit((unsigned char)s[0]))
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

/* A decimal count with an optional binary suffix K, M, G (and T when bytes), powers of 1024;
 * bytes also take a trailing "B" or "iB". */
static int parse_scaled(const char *s, int bytes, unsigned long long *out)
{
    if (!s || !isdigit((unsigned char)s[0]))
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    unsigned long long mult = 1;
    if (*end) {
        switch (toupper((unsigned char)*end)) {
        case 'K': mult = 1ull << 10; break;
        case 'M': mult = 1ull << 20; break;
        case 'G': mult = 1ull << 30; break;
        case 'T': mult = bytes ? 1ull << 40 : 0; break;
        default: return -1;
        }
        if (!mult)
            return -1;
        end++;
        if (bytes && (!strcmp(end, "iB") || !strcmp(end, "B") || !strcmp(end, "ib") ||
                      !strcmp(end, "b")))
            end += strlen(end);
        if (*end)
            return -1;
    }
    if (v > ~0ull / mult)
        return -1;
    *out = v * mult;
    return 0;
}

int kl_cli_parse_bytes(const char *s, unsigned long long *out)
{
    return parse_scaled(s, 1, out);
}

int kl_cli_parse_tokens(const char *s, unsigned long long *out)
{
    return parse_scaled(s, 0, out);
}

int kl_cli_opt_value(int argc, char **argv, int *i, const char *name, const char **val)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0)
        return 0;
    if (a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (a[n] != 0)
        return 0;
    *val = *i + 1 < argc ? argv[++*i] : NULL;
    return 1;
}

int kl_cli_parse_float(const char *s, float *out)
{
    if (!s || !*s)
        return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return -1;
    *out = (float)v;
    return 0;
}

/* Skips blanks: space, tab, CR, LF. */
static const char *skip_blanks(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

/* One decimal id at *p (blanks around it skipped) into *v; *p past it; 0 or -1. */
static int parse_one_id(const char **p, uint64_t max, uint32_t *v)
{
    const char *q = skip_blanks(*p);
    if (!isdigit((unsigned char)*q))
        return -1;
    errno = 0;
    char *end;
    unsigned long long x = strtoull(q, &end, 10);
    if (errno || x > max)
        return -1;
    *v = (uint32_t)x;
    *p = skip_blanks(end);
    return 0;
}

int kl_cli_parse_ids(const char *s, uint64_t max, uint32_t **out, size_t *n)
{
    if (!s)
        return -1;
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    uint32_t *ids = kl_malloc(cap * sizeof *ids);
    if (!ids)
        return -1;
    size_t k = 0;
    const char *p = s;
    /* id (',' id)*: every item holds exactly one id, so "", "1,,2", "1,2," and "1 2" fail */
    for (;;) {
        if (parse_one_id(&p, max > UINT32_MAX ? UINT32_MAX : max, &ids[k]))
            break;
        k++;
        if (*p == ',') {
            p++;
            continue;
        }
        if (!*p) {
            *out = ids;
            *n = k;
            return 0;
        }
        break;
    }
    kl_free(ids);
    return -1;
}

int kl_cli_report(const char *cmd, const kl_err *err)
{
    char buf[1024];
    fprintf(stderr, "kl %s: %s\n", cmd, kl_err_format(err, buf, sizeof buf));
    switch (err->code) {
    case KL_E_FORMAT:
    case KL_E_SCHEMA:
    case KL_E_UNSUPPORTED: return KL_EXIT_PROBLEMS;
    case KL_E_BUG: return KL_EXIT_BUG;
    default: return KL_EXIT_USAGE;
    }
}

int kl_cli_model_dir(const char *cmd, const char *arg, char *out, size_t n)
{
    kl_err err;
    kl_err_clear(&err);
    return kl_model_dir_resolve(arg, out, n, &err) ? kl_cli_report(cmd, &err) : 0;
}
