/*
 * loader/locate.c — model argument to checkpoint directory (see locate.h).
 *
 * Sections: helpers, repository folders, public API.
 */
#include "loader/locate.h"

#include "common/fs.h"
#include "common/mem.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- helpers ------------------------------------------------------------------------------- */

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static int copy_out(char *out, size_t n, const char *path, kl_err *err)
{
    size_t len = strlen(path);
    if (len >= n)
        return kl_fail(err, KL_E_USAGE, "model path too long (%zu bytes)", len);
    memcpy(out, path, len + 1);
    return 0;
}

static int cache_fail(kl_err *err, const char *path, const char *msg)
{
    kl_fail(err, KL_E_IO, "%s", msg);
    kl_err_context(err, path, NULL, KL_NO_OFFSET, "HF-CACHE");
    return KL_E_IO;
}

/* ORG/NAME as the hub spells repository ids: one '/', both parts non-empty, neither starting
 * with '.', only letters, digits, '.', '_' and '-'. */
static int is_repo_id(const char *s)
{
    const char *slash = strchr(s, '/');
    if (!slash || slash == s || !slash[1] || strchr(slash + 1, '/') || s[0] == '.' ||
        slash[1] == '.')
        return 0;
    for (const char *p = s; *p; p++)
        if (p != slash && !isalnum((unsigned char)*p) && !strchr("._-", *p))
            return 0;
    return 1;
}

/* ---- repository folders -------------------------------------------------------------------- */

/* A cache repository folder holds snapshots/ and, unlike a snapshot, no config.json. */
static int is_repo_folder(const char *dir)
{
    char p[4096];
    if (kl_path_join(p, sizeof p, dir, "config.json", NULL) || exists(p))
        return 0;
    return !kl_path_join(p, sizeof p, dir, "snapshots", NULL) && is_dir(p);
}

/* The commit refs/main names: one line of hex-like text; 0 or KL_E_IO. */
static int read_main_ref(const char *repo, char *rev, size_t n, kl_err *err)
{
    char path[4096], msg[4400];
    int rc = kl_path_join(path, sizeof path, repo, "refs/main", err);
    if (rc)
        return rc;
    char *text;
    size_t len;
    kl_err rerr;
    kl_err_clear(&rerr);
    if (kl_read_file(path, 4096, &text, &len, &rerr)) {
        snprintf(msg, sizeof msg, "no readable refs/main in the Hugging Face cache repository "
                 "(pass a snapshot directory: %s/snapshots/<commit>)", repo);
        return cache_fail(err, path, msg);
    }
    while (len && isspace((unsigned char)text[len - 1]))
        text[--len] = 0;
    int ok = len > 0 && len < n && !strchr(text, '/') && strcmp(text, ".") && strcmp(text, "..");
    if (ok)
        memcpy(rev, text, len + 1);
    kl_free(text);
    return ok ? 0 : cache_fail(err, path, "refs/main does not name a commit");
}

static int resolve_repo(const char *repo, char *out, size_t n, kl_err *err)
{
    char rev[256], snap[4096], msg[512];
    int rc = read_main_ref(repo, rev, sizeof rev, err);
    if (rc)
        return rc;
    if (snprintf(snap, sizeof snap, "%s/snapshots/%s", repo, rev) >= (int)sizeof snap)
        return kl_fail(err, KL_E_USAGE, "model path too long");
    if (!is_dir(snap)) {
        snprintf(msg, sizeof msg, "refs/main names commit %s but its snapshot directory is "
                 "missing", rev);
        return cache_fail(err, snap, msg);
    }
    return copy_out(out, n, snap, err);
}

/* ---- public API ---------------------------------------------------------------------------- */

int kl_hf_hub_dir(char *out, size_t n, kl_err *err)
{
    const char *hub = getenv("HF_HUB_CACHE"), *home = getenv("HF_HOME");
    char buf[4096];
    int w;
    if (hub && *hub)
        w = snprintf(buf, sizeof buf, "%s", hub);
    else if (home && *home)
        w = snprintf(buf, sizeof buf, "%s/hub", home);
    else if ((home = getenv("HOME")) && *home)
        w = snprintf(buf, sizeof buf, "%s/.cache/huggingface/hub", home);
    else
        return kl_fail(err, KL_E_USAGE, "no Hugging Face cache: HF_HUB_CACHE, HF_HOME and HOME "
                                        "are unset");
    if (w >= (int)sizeof buf)
        return kl_fail(err, KL_E_USAGE, "Hugging Face cache path too long");
    return copy_out(out, n, buf, err);
}

int kl_model_dir_resolve(const char *arg, char *out, size_t n, kl_err *err)
{
    if (is_dir(arg))
        return is_repo_folder(arg) ? resolve_repo(arg, out, n, err) : copy_out(out, n, arg, err);
    if (exists(arg) || !is_repo_id(arg))
        return copy_out(out, n, arg, err);
    char hub[4096], repo[4096];
    int rc = kl_hf_hub_dir(hub, sizeof hub, err);
    if (rc)
        return rc;
    const char *slash = strchr(arg, '/');
    if (snprintf(repo, sizeof repo, "%s/models--%.*s--%s", hub, (int)(slash - arg), arg,
                 slash + 1) >= (int)sizeof repo)
        return kl_fail(err, KL_E_USAGE, "model path too long");
    if (!is_dir(repo)) {
        char msg[4400];
        snprintf(msg, sizeof msg, "'%s' is neither a directory nor a repository in the Hugging "
                 "Face cache", arg);
        return cache_fail(err, repo, msg);
    }
    return resolve_repo(repo, out, n, err);
}
