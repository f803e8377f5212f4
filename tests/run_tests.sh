#!/bin/sh
# Runs every test binary given on the command line; prints one summary line.
# Check prints its own "N%: Checks: ..." line per suite; the last line here counts binaries.
passed=0; failed=0
for t in "$@"; do
    echo "== $t"
    if "$t"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $t"; fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
