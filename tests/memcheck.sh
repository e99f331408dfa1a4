#!/usr/bin/env bash
# Runs every host test binary of the workspace under valgrind's memcheck and prints, last,
# `memcheck: <binaries> binaries, <errors> errors`. Exits non-zero on any memcheck error or
# failing test. (The property and fuzz suites run with small budgets here: memcheck is slow.)
#
#   tests/memcheck.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install valgrind" >&2; exit 1; }
export PROPTEST_CASES=${PROPTEST_CASES:-16}
export BAREVERBS_FUZZ_EXECS=${BAREVERBS_FUZZ_EXECS:-200}
# The tests with long runs (8 MiB messages, 200 hosts, seconds of lossy traffic) take a
# smaller budget under valgrind when this is set.
export BAREVERBS_MEMCHECK=1
bins=$(cargo test --workspace --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])')
n=0 errors=0 failed=0
for b in $bins; do
  n=$((n + 1))
  log=$(mktemp) out=$(mktemp) st=0
  # --fair-sched=yes: valgrind runs one thread at a time, and its default lock lets the
  # thread that releases it take it again at once; a test whose threads poll each other's
  # progress (the perftest -R host test: three threads on two devices) then starved for
  # minutes on CI's machine, intermittently, with no memory error.
  valgrind --tool=memcheck --fair-sched=yes --error-exitcode=99 --errors-for-leak-kinds=none \
    --log-file="$log" "$b" -q >"$out" 2>&1 || st=$?
  e=$(awk '/ERROR SUMMARY:/ {s += $4} END {print s + 0}' "$log")
  errors=$((errors + e))
  printf '%-60s %s errors\n' "$(basename "$b")" "$e"
  [ "$e" = 0 ] || sed -n '1,60p' "$log"
  if [ "$st" != 0 ] && [ "$st" != 99 ]; then
    # A test failed (not a memcheck error): say which, with the end of what it printed.
    failed=$((failed + 1))
    echo "memcheck: $(basename "$b") exited with status $st under valgrind:"
    tail -n 40 "$out"
  fi
  rm -f "$log" "$out"
done
echo "memcheck: $n binaries, $errors errors"
[ "$errors" = 0 ] && [ "$failed" = 0 ]
