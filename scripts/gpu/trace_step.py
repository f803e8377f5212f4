#!/usr/bin/env python3
"""Where a decode step's time goes, from tests/gpu/kernel_trace.c's timeline (graph replays
included, kernels overlapping through programmatic launches as they do in a real step).

Each kernel is charged the time from the latest end among the kernels before it to its own end
(so a step's charges add up to its GPU time, and a kernel hidden under its predecessor costs
only what it runs past it).  Steps start at each embed kernel; the first SKIP steps and the
last are left out.  Kernels are grouped by name and grid, so each weight shape of a product is
its own row.

    trace_step.py TRACE [--skip 4] [--show-step] [--top 40]
"""
import argparse, collections, re, statistics, sys


def short_name(mangled):
    m = re.match(r"_Z(?:N\d*)?(\d+)", mangled)
    return mangled[m.end():m.end() + int(m.group(1))] if m else mangled[:60]


def read(path):
    ks = []
    for line in open(path):
        f = line.split(None, 7)
        if len(f) == 8:
            ks.append((int(f[0]), int(f[1]), short_name(f[7].strip()),
                       int(f[3]), int(f[4]), int(f[5])))
    ks.sort()
    return ks


def steps_of(ks, skip):
    starts = [i for i, k in enumerate(ks) if k[2] == "embed_kernel"]
    return [ks[a:b] for a, b in zip(starts, starts[1:])][skip:]


def charge(step, next_start):
    prev_end, out = step[0][0], []
    for k in step:
        out.append((k, max(0, k[1] - max(prev_end, k[0])), max(0, k[0] - prev_end)))
        prev_end = max(prev_end, k[1])
    return out, next_start - prev_end


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--skip", type=int, default=4)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--show-step", action="store_true",
                    help="list one median step kernel by kernel")
    a = ap.parse_args()
    ks = read(a.trace)
    steps = steps_of(ks, a.skip)
    if len(steps) < 2:
        sys.exit("trace_step: fewer than two decode steps in %s" % a.trace)
    walls = [s2[0][0] - s1[0][0] for s1, s2 in zip(steps, steps[1:])]
    steps = steps[:-1]
    # per kernel and grid: launches, duration, charge, idle before it
    per = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    host_gap = 0.0
    for st, nxt_wall in zip(steps, walls):
        ch, tail = charge(st, st[0][0] + nxt_wall)
        host_gap += tail
        for k, c, idle in ch:
            key = "%s g%dx%d b%d" % (k[2], k[3], k[4], k[5])
            p = per[key]
            p[0] += 1; p[1] += k[1] - k[0]; p[2] += c; p[3] += idle
    n = len(steps)
    wall = statistics.median(walls) / 1e3
    print("trace: %d steps, median step %.1f us (%.1f tok/s), %d kernels a step, "
          "%.1f us a step between the last kernel's end and the next step's first" %
          (n, wall, 1e6 / wall, len(steps[0]), host_gap / n / 1e3))
    tot = sum(p[2] for p in per.values()) / n / 1e3
    print("%-52s %6s %9s %9s %9s %6s" %
          ("kernel grid block", "n/step", "dur us", "charge us", "idle us", "share"))
    for key, p in sorted(per.items(), key=lambda kv: -kv[1][2])[:a.top]:
        print("%-52s %6.0f %9.2f %9.1f %9.1f %5.1f%%" % (key[:52], p[0] / n, p[1] / p[0] / 1e3,
              p[2] / n / 1e3, p[3] / n / 1e3, 100 * p[2] / n / 1e3 / tot))
    byname = collections.defaultdict(float)
    for key, p in per.items():
        byname[key.split()[0]] += p[2] / n / 1e3
    ranked = sorted(byname.items(), key=lambda kv: -kv[1])
    print("by kernel: " + ", ".join("%s %.0f" % kv for kv in ranked))
    if a.show_step:
        mid = sorted(range(len(walls)), key=lambda i: walls[i])[len(walls) // 2]
        ch, _ = charge(steps[mid], steps[mid][0][0] + walls[mid])
        t0 = steps[mid][0][0]
        for k, c, idle in ch:
            print("step %8.2f %7.2f %7.2f %6.2f  %s g%dx%d b%d" %
                  ((k[0] - t0) / 1e3, (k[1] - k[0]) / 1e3, c / 1e3, idle / 1e3,
                   k[2], k[3], k[4], k[5]))


main()
