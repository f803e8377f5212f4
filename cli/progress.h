/*
 * cli/progress.h — the one progress line of long commands: redrawn on stderr with '\r', at
 * most 10 times a second, only when stderr is a terminal; bytes done, GB/s and ETA.
 */
#ifndef KL_CLI_PROGRESS_H
#define KL_CLI_PROGRESS_H

#include <stdint.h>

typedef struct kl_progress {
    const char *label; /* "kl read", ... */
    int on;            /* stderr is a terminal and not quiet */
    int drawn;
    double t0, last;
} kl_progress;

void kl_progress_init(kl_progress *p, const char *label, int quiet);
/* total 0 = unknown (no ETA). */
void kl_progress_show(kl_progress *p, uint64_t done, uint64_t total);
/* The same line for a count of things (e.g. "tokens"): done / total, per second, ETA. */
void kl_progress_show_count(kl_progress *p, uint64_t done, uint64_t total, const char *unit);
/* Clears the line if anything was drawn. */
void kl_progress_end(kl_progress *p);

#endif
