/* cli/progress.c — the progress line (see progress.h). */
#include "cli/progress.h"

#include "common/clock.h"

#include <stdio.h>
#include <unistd.h>

void kl_progress_init(kl_progress *p, const char *label, int quiet)
{
    p->label = label;
    p->on = !quiet && isatty(STDERR_FILENO);
    p->drawn = 0;
    p->t0 = kl_now_s();
    p->last = 0;
}

void kl_progress_show(kl_progress *p, uint64_t done, uint64_t total)
{
    double now = kl_now_s();
    if (!p->on || now - p->last < 0.1)
        return;
    p->last = now;
    double dt = now - p->t0, rate = dt > 0 ? (double)done / dt : 0;
    if (total) {
        double eta = rate > 0 && total > done ? (double)(total - done) / rate : 0;
        fprintf(stderr, "\r%s: %.2f / %.2f GB  %.2f GB/s  ETA %.0f s   ", p->label,
                (double)done / 1e9, (double)total / 1e9, rate / 1e9, eta);
    } else {
        fprintf(stderr, "\r%s: %.2f GB  %.2f GB/s   ", p->label, (double)done / 1e9, rate / 1e9);
    }
    fflush(stderr);
    p->drawn = 1;
}

void kl_progress_show_count(kl_progress *p, uint64_t done, uint64_t total, const char *unit)
{
    double now = kl_now_s();
    if (!p->on || now - p->last < 0.1)
        return;
    p->last = now;
    double dt = now - p->t0, rate = dt > 0 ? (double)done / dt : 0;
    double eta = rate > 0 && total > done ? (double)(total - done) / rate : 0;
    fprintf(stderr, "\r%s: %llu / %llu %s  %.1f/s  ETA %.0f s   ", p->label,
            (unsigned long long)done, (unsigned long long)total, unit, rate, eta);
    fflush(stderr);
    p->drawn = 1;
}

void kl_progress_end(kl_progress *p)
{
    if (p->drawn)
        fprintf(stderr, "\r%72s\r", "");
    p->drawn = 0;
}
