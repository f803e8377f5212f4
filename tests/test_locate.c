/*
 * tests/test_locate.c — model arguments resolved through a Hugging Face cache (issue 9 gap 4):
 * a snapshot, a models--ORG--NAME repository folder (refs/main -> snapshots/<rev>) and ORG/NAME
 * under $HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub, built as a fake cache tree in
 * a temporary directory; then the commands that take a model directory, through $KL_BIN.
 */
#include "common/err.h"
#include "loader/locate.h"
#include "tests/testutil.h"

#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char g_root[512];   /* scratch root: holds hub/ and home/ */
static char g_hub[1024];   /* fake hub cache */
static char g_repo[1100];  /* g_hub/models--acme--tiny */
static char g_snap[1200];  /* g_repo/snapshots/rev1 */
static const char *g_kl;

static void sh(const char *cmd)
{
    ck_assert_msg(system(cmd) == 0, "failed: %s", cmd);
}

/* A synthesized tiny checkpoint laid out as the hub cache lays out a download. */
static void setup(void)
{
    g_kl = t_kl_bin();
    t_mkdtemp(g_root, sizeof g_root);
    snprintf(g_hub, sizeof g_hub, "%s/hub", g_root);
    snprintf(g_repo, sizeof g_repo, "%s/models--acme--tiny", g_hub);
    snprintf(g_snap, sizeof g_snap, "%s/snapshots/rev1", g_repo);
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "set -e; mkdir -p '%s/blobs' '%s' '%s/refs'; cd '%s/src'; "
             "for f in *; do h=$(sha256sum \"$f\" | cut -c1-64); cp \"$f\" '%s/blobs/'$h; "
             "ln -s ../../blobs/$h '%s/'\"$f\"; done; printf 'rev1' > '%s/refs/main'",
             g_repo, g_snap, g_repo, g_root, g_repo, g_snap, g_repo);
    char src[1100];
    snprintf(src, sizeof src, "%s/src", g_root);
    t_kl_synth_tiny(src, 9);
    sh(cmd);
    unsetenv("HF_HUB_CACHE");
    unsetenv("HF_HOME");
}

static void teardown(void)
{
    t_rmrf(g_root);
}

static void expect_resolved(const char *arg, const char *want)
{
    char out[4096];
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_model_dir_resolve(arg, out, sizeof out, &err);
    ck_assert_msg(rc == 0, "'%s': expected %s, got %d (%s)", arg, want, rc, t_fmt_err(&err));
    ck_assert_msg(!strcmp(out, want), "'%s': expected %s, got %s", arg, want, out);
}

static void expect_cache_error(const char *arg, const char *msg_part)
{
    char out[4096] = "untouched";
    kl_err err;
    kl_err_clear(&err);
    int rc = kl_model_dir_resolve(arg, out, sizeof out, &err);
    ck_assert_msg(rc == KL_E_IO && !strcmp(err.rule, "HF-CACHE") && strstr(err.msg, msg_part),
                  "'%s': expected KL_E_IO [HF-CACHE] '%s', got %d (%s)", arg, msg_part, rc,
                  t_fmt_err(&err));
    ck_assert_msg(!strcmp(out, "untouched"), "'%s': output written on error", arg);
}

/* ---- resolution ---------------------------------------------------------------------------- */

START_TEST(snapshot_directory_is_used_as_it_is)
{
    expect_resolved(g_snap, g_snap);
}
END_TEST

START_TEST(repository_folder_resolves_refs_main_to_its_snapshot)
{
    expect_resolved(g_repo, g_snap);
}
END_TEST

START_TEST(org_name_is_looked_up_under_hf_hub_cache)
{
    setenv("HF_HUB_CACHE", g_hub, 1);
    setenv("HF_HOME", "/nonexistent", 1);
    expect_resolved("acme/tiny", g_snap);
}
END_TEST

START_TEST(org_name_is_looked_up_under_hf_home_hub)
{
    setenv("HF_HOME", g_root, 1);
    expect_resolved("acme/tiny", g_snap);
}
END_TEST

START_TEST(org_name_is_looked_up_under_home_cache_by_default)
{
    char home[1100], cmd[4096], want[4096];
    snprintf(home, sizeof home, "%s/home", g_root);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/.cache/huggingface' && ln -s '%s' '%s/.cache/huggingface/hub'",
             home, g_hub, home);
    sh(cmd);
    setenv("HOME", home, 1);
    snprintf(want, sizeof want, "%s/.cache/huggingface/hub/models--acme--tiny/snapshots/rev1",
             home);
    expect_resolved("acme/tiny", want);
}
END_TEST

START_TEST(an_existing_directory_wins_over_the_cache_lookup)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/cwd/acme/tiny'", g_root);
    sh(cmd);
    char cwd[1100];
    snprintf(cwd, sizeof cwd, "%s/cwd", g_root);
    ck_assert(chdir(cwd) == 0);
    setenv("HF_HUB_CACHE", g_hub, 1);
    expect_resolved("acme/tiny", "acme/tiny");
}
END_TEST

START_TEST(repository_without_refs_main_is_a_clear_error)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm '%s/refs/main'", g_repo);
    sh(cmd);
    expect_cache_error(g_repo, "no readable refs/main");
}
END_TEST

START_TEST(refs_main_naming_a_missing_snapshot_is_a_clear_error)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/refs/main", g_repo);
    t_write(path, "deadbeef\n", 9);
    expect_cache_error(g_repo, "snapshot directory is missing");
}
END_TEST

START_TEST(org_name_missing_from_the_cache_is_a_clear_error)
{
    setenv("HF_HUB_CACHE", g_hub, 1);
    expect_cache_error("acme/other", "neither a directory nor a repository");
}
END_TEST

START_TEST(other_missing_paths_are_returned_unchanged)
{
    setenv("HF_HUB_CACHE", g_hub, 1);
    expect_resolved("/no/such/dir", "/no/such/dir");
    expect_resolved("plain-name", "plain-name");
    expect_resolved("../acme", "../acme");
}
END_TEST

/* ---- commands ------------------------------------------------------------------------------ */

/* Runs `HF_HUB_CACHE=hub kl ARGS`; returns the exit status. */
static int run_kl(const char *args)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "HF_HUB_CACHE='%s' '%s' %s > '%s/out' 2>&1", g_hub, g_kl, args,
             g_root);
    int st = system(cmd);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (code != 0) {
        snprintf(cmd, sizeof cmd, "cat '%s/out' >&2", g_root);
        (void)system(cmd);
    }
    return code;
}

START_TEST(commands_accept_org_name_and_repository_folders)
{
    char args[4096];
    const char *cases[] = {"audit acme/tiny --hash -q", "tokenize acme/tiny --text hi",
                           "detokenize acme/tiny --ids 1,2", "read acme/tiny",
                           "run acme/tiny --ids 1,2 -n 1"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        ck_assert_msg(run_kl(cases[i]) == 0, "kl %s failed", cases[i]);
    snprintf(args, sizeof args, "audit '%s' --hash -q", g_repo);
    ck_assert_msg(run_kl(args) == 0, "kl %s failed", args);
    /* the resolved snapshot's blob links give every shard its expected hash */
    ck_assert_msg(run_kl("audit acme/tiny --hash") == 0, "kl audit acme/tiny --hash failed");
    snprintf(args, sizeof args, "grep -q '4 match, 0 mismatch, 0 without' '%s/out'", g_root);
    ck_assert_msg(system(args) == 0, "the snapshot's hashes were not all checked");
    snprintf(args, sizeof args, "convert acme/tiny '%s/conv' -q", g_root);
    ck_assert_msg(run_kl(args) == 0, "kl %s failed", args);
    /* --expect takes the repository too: the blob names check a plain copy */
    snprintf(args, sizeof args, "audit '%s/src' --expect '%s' -q", g_root, g_repo);
    ck_assert_msg(run_kl(args) == 0, "kl %s failed", args);
    ck_assert_msg(run_kl("audit acme/missing -q") == 2, "a missing repository must exit 2");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("locate");
    TCase *tc = tcase_create("hub cache");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, snapshot_directory_is_used_as_it_is);
    tcase_add_test(tc, repository_folder_resolves_refs_main_to_its_snapshot);
    tcase_add_test(tc, org_name_is_looked_up_under_hf_hub_cache);
    tcase_add_test(tc, org_name_is_looked_up_under_hf_home_hub);
    tcase_add_test(tc, org_name_is_looked_up_under_home_cache_by_default);
    tcase_add_test(tc, an_existing_directory_wins_over_the_cache_lookup);
    tcase_add_test(tc, repository_without_refs_main_is_a_clear_error);
    tcase_add_test(tc, refs_main_naming_a_missing_snapshot_is_a_clear_error);
    tcase_add_test(tc, org_name_missing_from_the_cache_is_a_clear_error);
    tcase_add_test(tc, other_missing_paths_are_returned_unchanged);
    tcase_add_test(tc, commands_accept_org_name_and_repository_folders);
    suite_add_tcase(s, tc);
    return t_run_suite(s);
}
