#!/bin/sh
# tests/gpu_wait.sh — every kernel of kernels/ starts with KL_GPU_GRID_WAIT() (kernels/gpu.h):
# the decode graphs' programmatic edges (kernels/runtime.cu) start a kernel before the one it
# depends on has finished, so a kernel without the wait would read stale memory (or, marked
# KL_GPU_GRID_WAIT_LATER(), one that waits after reading what was complete before: gpu.h).
# Run by `make test`; names the file and kernel that lacks it.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
bad=0
for f in "$here"/kernels/*.cu "$here"/kernels/*.cuh; do
    [ -f "$f" ] || continue
    # each __global__ declaration: the line after its body's opening brace must be the wait
    awk -v file="$(basename "$f")" '
        /^(template *<.*> *)?__global__/ { want = 1; decl = $0; next }
        want && /^\{/ { getline nxt; if (nxt !~ /^    KL_GPU_GRID_WAIT(_LATER)?\(\);/) {
                            printf "gpu_wait: %s: a kernel does not start with KL_GPU_GRID_WAIT(): %s\n", file, decl
                            bad = 1 }
                        want = 0; next }
        want && !/^\{/ && decl !~ /\(/ { decl = decl " " $0 }
        END { exit bad }' "$f" || bad=1
done
exit $bad
