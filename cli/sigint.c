/* cli/sigint.c — SIGINT sets a flag (see sigint.h). */
#include "cli/sigint.h"

#include <string.h>

volatile sig_atomic_t kl_cli_interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    kl_cli_interrupted = 1;
}

void kl_cli_catch_sigint(int restart)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}
