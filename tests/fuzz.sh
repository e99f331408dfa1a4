#!/bin/sh
# The hostile-device fuzzer: tests/fuzz.sh [N] [SEED]
#
# Runs N executions (default 2000) with seeds SEED, SEED+1, ... (default: from the clock; or
# FUZZ_SEED) on FUZZ_THREADS workers (default 2), and prints, last:
#     fuzz: <N> executions, <F> failures, seed <S>
# Each failure prints the seed that replays it: tests/fuzz.sh 1 <seed> (with its trace).
# FUZZ_VERBOSE=1 traces every execution. Exit status 1 when anything failed.
#
# The build is a release build with overflow checks and debug assertions on (an arithmetic
# overflow on a device value is a panic, hence a failure), in its own target directory so that
# it does not disturb the ordinary builds.
set -eu
cd "$(dirname "$0")/.."
n=${1:-${FUZZ_N:-2000}}
seed=${2:-${FUZZ_SEED:-}}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/fuzz"
export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
cargo test --release --test fuzz --no-run --quiet
bin=$(cargo test --release --test fuzz --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
status=0
if [ -n "$seed" ]; then
    "$bin" "$n" "$seed" || status=$?
else
    "$bin" "$n" || status=$?
fi
if [ "$status" -gt 1 ]; then
    # The process died (a panic while panicking aborts): it could not print its summary.
    echo "fuzz: the fuzzer died (status $status); the seed it was running is printed above"
    echo "fuzz: $n executions, 1 failures, seed ${seed:-unknown}"
fi
exit "$status"
