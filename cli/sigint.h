/*
 * cli/sigint.h — Ctrl-C as a request, not a kill: SIGINT sets kl_cli_interrupted, which the
 * engine's loops read (kl_gen.cancel, kl_session_feed.cancel) between tokens, so `kl run` can
 * remove its temporary output and `kl chat` can stop one reply and go on.
 */
#ifndef KL_CLI_SIGINT_H
#define KL_CLI_SIGINT_H

#include <signal.h>

/* Nonzero once SIGINT arrived (after kl_cli_catch_sigint); the caller clears it. */
extern volatile sig_atomic_t kl_cli_interrupted;

/* Installs the handler.  restart 1: interrupted system calls resume (a write to a slow stdout
 * is not lost); 0: they fail with EINTR (a blocking read returns, e.g. at chat's prompt). */
void kl_cli_catch_sigint(int restart);

#endif
