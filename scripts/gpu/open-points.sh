#!/bin/bash
# The measurements still open in issues 2 and 3, in one device call (about 7 minutes; carry
# build/portable and .ref):
#   issue 2: page-cache reads with --mapped against the memory-read ceiling, 8 runs
#   issue 3: conversion on the one disk (perf) and with the output in tmpfs (split)
# Each step has a time limit so that one stuck step cannot eat the session's device time.
set -u
OUT=${OUT:-/tmp/kl-out}; mkdir -p "$OUT"
LAYERS=7 CACHE_REPS=${CACHE_REPS:-8} timeout 150 bash scripts/gpu/foundation.sh cache > /dev/null 2>&1
rm -rf /tmp/klwork/big
REPS=1 timeout 330 bash scripts/gpu/convert.sh "perf split" > /dev/null 2>&1
rm -rf /tmp/klconv /dev/shm/klconv
# summaries
grep -E '"read"|cached by|FileHuge|page cache' "$OUT/foundation.log" | python3 -c "
import json, sys
for l in sys.stdin:
    if not l.startswith('{'):
        print(l.rstrip()); continue
    r = json.loads(l)
    print(r['backend'], 'rounds', r.get('rounds'), 'median', round(r['read_gbps'], 1), 'best', round(r['read_best_gbps'], 1),
          '| ceiling median', round(r.get('ceiling_gbps', 0), 1), 'best', round(r.get('ceiling_best_gbps', 0), 1),
          '| median ratio', round(r.get('ceiling_ratio', 0), 3), 'huge', r.get('ceiling_huge_page_bytes'))
    for p in r.get('round_gbps', []):
        print('   round', [round(x, 1) for x in p], round(p[0] / p[1], 3) if len(p) == 2 else '')"
grep -E "dd|together|disk|tmpfs|elapsed" "$OUT/convert.log" | sed 's/"src".*"read_bytes"/ /' | cut -c1-330
