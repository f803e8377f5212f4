/* cli/args.c — the one option parser of every subcommand and the value parsers it uses (see
 * cli.h). */
#include "cli/cli.h"

#include "common/err.h"
#include "common/mem.h"
#include "convert/mxfp4.h"
#include "loader/locate.h"

#include <cJSON.h>
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
static int parse_one_id(const char **p, uint64_t max, kl_token *v)
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

int kl_cli_parse_ids(const char *s, uint64_t max, kl_token **out, size_t *n)
{
    if (!s)
        return -1;
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    kl_token *ids = kl_malloc(cap * sizeof *ids);
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

int kl_cli_parse_scale_rule(void *target, const char *v)
{
    int r = kl_scale_rule_parse(v);
    if (r < 0)
        return -1;
    *(int *)target = r;
    return 0;
}

/* ---- did-you-mean ---------------------------------------------------------------------- */

/* Edit distance with adjacent transpositions (optimal string alignment); words longer than 40
 * characters are never typos worth suggesting. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    if (n > 40 || m > 40)
        return 99;
    size_t d[41][41];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            size_t cost = a[i - 1] != b[j - 1];
            size_t v = d[i - 1][j - 1] + cost;
            if (d[i - 1][j] + 1 < v)
                v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[n][m];
}

const char *kl_cli_nearest(const char *word, const char *const *cands, size_t n)
{
    const char *best = NULL;
    size_t best_d = 99, len = strlen(word);
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(word, cands[i]);
        if (d < best_d) {
            best_d = d;
            best = cands[i];
        }
    }
    /* one edit for short words, two from six characters on ("--thread" -> "--threads") */
    size_t limit = len >= 6 ? 2 : 1;
    return best_d <= limit ? best : NULL;
}

/* ---- help ------------------------------------------------------------------------------ */

#define HELP_COL_MAX 24

/* "-n, --name METAVAR" of one option into buf; its length. */
static size_t opt_label(const kl_opt *o, char *buf, size_t n)
{
    int k;
    if (o->short_name && o->name)
        k = snprintf(buf, n, "-%c, %s", o->short_name, o->name);
    else if (o->name)
        k = snprintf(buf, n, "%s", o->name);
    else
        k = snprintf(buf, n, "-%c", o->short_name);
    if (o->metavar && k >= 0 && (size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k, " %s", o->metavar);
    return k < 0 ? 0 : (size_t)k < n ? (size_t)k : n - 1;
}

static void help_line(FILE *f, const char *label, const char *help, int col)
{
    int len = fprintf(f, "  %s", label);
    if (len > col - 2) {
        fputc('\n', f);
        len = 0;
    }
    for (const char *p = help;;) {
        const char *nl = strchr(p, '\n');
        int seg = nl ? (int)(nl - p) : (int)strlen(p);
        fprintf(f, "%*s%.*s\n", col - len, "", seg, p);
        if (!nl)
            break;
        p = nl + 1;
        len = 0;
    }
}

void kl_args_help(const kl_cmd_spec *spec, FILE *f)
{
    fputs(spec->synopsis, f);
    if (spec->about)
        fprintf(f, "\n%s", spec->about);
    char label[128];
    int col = 14;
    for (const kl_opt *o = spec->opts; o && (o->name || o->short_name); o++) {
        int w = (int)opt_label(o, label, sizeof label) + 4;
        if (w > col && w <= HELP_COL_MAX)
            col = w;
    }
    fputc('\n', f);
    for (const kl_opt *o = spec->opts; o && (o->name || o->short_name); o++) {
        opt_label(o, label, sizeof label);
        help_line(f, label, o->help ? o->help : "", col);
    }
    help_line(f, "-h, --help", "this text", col);
    if (spec->footer)
        fprintf(f, "\n%s", spec->footer);
}

/* --help: the text on stdout, or inside one JSON object with --json. */
static int print_help(const kl_cmd_spec *spec)
{
    if (!kl_cli_json()) {
        kl_args_help(spec, stdout);
        return KL_EXIT_OK;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m)
        return kl_cli_fail(KL_EXIT_BUG, "nomem", "out of memory", NULL);
    kl_args_help(spec, m);
    fclose(m);
    cJSON *root = kl_cli_json_head(1);
    cJSON_AddStringToObject(root, "help", text ? text : "");
    free(text);
    return kl_cli_print_json(root);
}

/* ---- parsing --------------------------------------------------------------------------- */

#define MAX_OPTS 64

typedef struct parse_state {
    const kl_cmd_spec *spec;
    unsigned char seen[MAX_OPTS];
    const kl_opt *group_first[MAX_OPTS]; /* by group id */
} parse_state;

static int is_end(const kl_opt *o)
{
    return !o->name && !o->short_name;
}

/* The option arg names (without "=VALUE"), or NULL. */
static const kl_opt *find_opt(const kl_opt *opts, const char *arg, size_t len)
{
    for (const kl_opt *o = opts; o && !is_end(o); o++) {
        if (arg[1] == '-' ? o->name && strlen(o->name) == len && !strncmp(o->name, arg, len)
                          : o->short_name && len == 2 && arg[1] == o->short_name)
            return o;
    }
    return NULL;
}

static int unknown_option(const kl_cmd_spec *spec, const char *arg, size_t len)
{
    const char *names[MAX_OPTS + 1];
    size_t n = 0;
    for (const kl_opt *o = spec->opts; o && !is_end(o) && n < MAX_OPTS; o++)
        if (o->name)
            names[n++] = o->name;
    names[n++] = "--help";
    char word[64];
    snprintf(word, sizeof word, "%.*s", (int)(len < 63 ? len : 63), arg);
    const char *near = kl_cli_nearest(word, names, n);
    if (near)
        return kl_cli_usage("unknown option '%s'; did you mean '%s'?", word, near);
    return kl_cli_usage("unknown option '%s'", word);
}

/* "an integer from 1 to 1024" and the like, for a bad value of o. */
static void describe_wants(const kl_opt *o, char *buf, size_t n)
{
    if (o->wants) {
        snprintf(buf, n, "%s", o->wants);
        return;
    }
    const char *what = o->kind == KL_OPT_FLOAT    ? "a number"
                       : o->kind == KL_OPT_BYTES  ? "a byte count such as 8M"
                       : o->kind == KL_OPT_TOKENS ? "a token count such as 128K"
                       : o->kind == KL_OPT_U64    ? "an integer"
                                                  : "a value";
    if (o->kind == KL_OPT_CHOICE) {
        size_t k = (size_t)snprintf(buf, n, "one of ");
        for (const char *p = o->choices; *p && k + 3 < n; p++) {
            if (*p == '|')
                k += (size_t)snprintf(buf + k, n - k, ", ");
            else
                buf[k++] = *p, buf[k] = 0;
        }
    } else if ((o->kind == KL_OPT_U64 || o->kind == KL_OPT_FLOAT) && o->hi > 0) {
        snprintf(buf, n, o->kind == KL_OPT_U64 ? "%s from %.0f to %.0f" : "%s from %g to %g",
                 what, o->lo, o->hi);
    } else if ((o->kind == KL_OPT_U64 || o->kind == KL_OPT_FLOAT) && o->lo > 0) {
        snprintf(buf, n, o->kind == KL_OPT_U64 ? "%s >= %.0f" : "%s >= %g", what, o->lo);
    } else {
        snprintf(buf, n, "%s", what);
    }
}

static int in_bounds(const kl_opt *o, double v)
{
    return v >= o->lo && (o->hi <= 0 || v <= o->hi);
}

/* Stores value v of option o in its target: 0, or -1 for a bad value. */
static int apply_value(const kl_opt *o, const char *v)
{
    unsigned long long u;
    float f;
    switch (o->kind) {
    case KL_OPT_FLAG: *(int *)o->target = o->flag_value ? o->flag_value : 1; return 0;
    case KL_OPT_STR: *(const char **)o->target = v; return 0;
    case KL_OPT_U64:
    case KL_OPT_BYTES:
    case KL_OPT_TOKENS:
        if ((o->kind == KL_OPT_U64     ? kl_cli_parse_u64(v, &u)
             : o->kind == KL_OPT_BYTES ? kl_cli_parse_bytes(v, &u)
                                       : kl_cli_parse_tokens(v, &u)) ||
            !in_bounds(o, (double)u))
            return -1;
        *(unsigned long long *)o->target = u;
        return 0;
    case KL_OPT_FLOAT:
        if (kl_cli_parse_float(v, &f) || !in_bounds(o, f))
            return -1;
        *(float *)o->target = f;
        return 0;
    case KL_OPT_CHOICE: {
        size_t len = strlen(v);
        int idx = 0;
        for (const char *p = o->choices; *p; idx++) {
            const char *bar = strchr(p, '|');
            size_t n = bar ? (size_t)(bar - p) : strlen(p);
            if (n == len && len && !strncmp(p, v, n)) {
                *(int *)o->target = idx;
                return 0;
            }
            p += n + (bar != NULL);
        }
        return -1;
    }
    case KL_OPT_FN: return o->fn(o->target, v);
    }
    return -1;
}

/* Refuses a second use of a single-use option and two options of one group. */
static int check_repeat(parse_state *ps, const kl_opt *o, const char *shown)
{
    size_t k = (size_t)(o - ps->spec->opts);
    if (k >= MAX_OPTS)
        return kl_cli_fail(KL_EXIT_BUG, "bug", "option table longer than MAX_OPTS", NULL);
    if (ps->seen[k] && !o->multi && o->kind != KL_OPT_FLAG)
        return kl_cli_usage("%s given more than once", shown);
    ps->seen[k] = 1;
    if (o->group > 0 && o->group < MAX_OPTS) {
        const kl_opt *first = ps->group_first[o->group];
        if (first && first != o)
            return kl_cli_usage("%s and %s cannot be used together",
                                first->name ? first->name : "?", shown);
        ps->group_first[o->group] = o;
    }
    return 0;
}

/* One option at argv[*i] (its value consumed): 0 or a usage exit status. */
static int parse_option(parse_state *ps, int argc, char **argv, int *i)
{
    const char *arg = argv[*i], *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    const kl_opt *o = find_opt(ps->spec->opts, arg, len);
    if (!o)
        return unknown_option(ps->spec, arg, len);
    char shown[64];
    snprintf(shown, sizeof shown, "%.*s", (int)(len < 63 ? len : 63), arg);
    const char *v = NULL;
    if (o->kind == KL_OPT_FLAG) {
        if (eq)
            return kl_cli_usage("%s takes no value", shown);
    } else if (eq) {
        v = eq + 1;
    } else if (*i + 1 < argc) {
        v = argv[++*i];
    } else {
        return kl_cli_usage("%s needs a value (%s)", shown, o->metavar ? o->metavar : "VALUE");
    }
    int rc = check_repeat(ps, o, shown);
    if (rc)
        return rc;
    if (apply_value(o, v)) {
        char wants[160];
        describe_wants(o, wants, sizeof wants);
        return kl_cli_usage("%s wants %s, not '%s'", shown, wants, v);
    }
    return 0;
}

static int check_positionals(const kl_cmd_spec *spec, const kl_args *out)
{
    if (out->n_pos < spec->min_pos)
        return kl_cli_usage("missing %s", spec->pos_name ? spec->pos_name : "arguments");
    if (spec->max_pos && out->n_pos > spec->max_pos)
        return kl_cli_usage("unexpected argument '%s' (wants %s)", out->pos[spec->max_pos],
                            spec->pos_name ? spec->pos_name : "no arguments");
    return 0;
}

static int wants_json(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--json"))
            return 1;
    return 0;
}

int kl_args_parse(const kl_cmd_spec *spec, int argc, char **argv, kl_args *out)
{
    memset(out, 0, sizeof *out);
    kl_cli_begin(spec->name, wants_json(argc, argv));
    parse_state ps;
    memset(&ps, 0, sizeof ps);
    ps.spec = spec;
    out->pos = kl_calloc(argc > 0 ? (size_t)argc : 1, sizeof *out->pos);
    if (!out->pos)
        return kl_cli_fail(KL_EXIT_USAGE, "nomem", "out of memory", NULL);
    int only_pos = 0, rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || !a[1])
            out->pos[out->n_pos++] = a;
        else if (!strcmp(a, "--"))
            only_pos = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            rc = -2;
        else
            rc = parse_option(&ps, argc, argv, &i);
    }
    if (rc == -2) /* help wins over everything else on the line */
        rc = print_help(spec);
    else if (!rc && !(rc = check_positionals(spec, out)))
        return KL_ARGS_RUN;
    kl_args_free(out);
    return rc;
}

int kl_args_parse_into(const kl_cmd_spec *spec, int argc, char **argv, const char **pos,
                       size_t n)
{
    kl_args pa;
    int rc = kl_args_parse(spec, argc, argv, &pa);
    for (size_t i = 0; i < n; i++)
        pos[i] = rc == KL_ARGS_RUN && i < pa.n_pos ? pa.pos[i] : NULL;
    if (rc == KL_ARGS_RUN)
        kl_args_free(&pa);
    return rc;
}

void kl_args_free(kl_args *a)
{
    kl_free(a->pos);
    a->pos = NULL;
    a->n_pos = 0;
}

int kl_cli_model_dir(const char *cmd, const char *arg, char *out, size_t n)
{
    kl_err err;
    kl_err_clear(&err);
    return kl_model_dir_resolve(arg, out, n, &err) ? kl_cli_report(cmd, &err) : 0;
}
