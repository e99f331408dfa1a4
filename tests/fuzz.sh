#!/bin/sh
# The hostile-device fuzzer: tests/fuzz.sh [N] [SEED]
#
# Runs N executions (default 200000, about 10 s on 2 cores once built) with seeds SEED,
# SEED+1, ... (default: FUZZ_SEED, else from the clock) on FUZZ_THREADS workers (default 2), and
# prints, last:
#     fuzz: <N> executions, <F> failures, seed <S>
# Each failure prints the seed that replays it, `tests/fuzz.sh 1 <seed>`, which prints its trace.
# FUZZ_MODE=honest|hostile runs only honest devices (faults injected as usual) or only lying
# ones (default: a mix). FUZZ_VERBOSE=1 traces every execution. FUZZ_VALGRIND=<n> first runs n executions under
# valgrind's memcheck (single-threaded; its errors count as failures). Exit status 1 when
# anything failed.
#
# The build is a release build with overflow checks and debug assertions on (an arithmetic
# overflow on a device value is a panic, hence a failure) and line tables (for the backtrace of
# a replayed panic), in its own target directory so that ordinary builds are not disturbed.
set -eu
cd "$(dirname "$0")/.."
n=${1:-${FUZZ_N:-200000}}
seed=${2:-${FUZZ_SEED:-$(date +%s%N | cut -c1-18)}}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/fuzz"
export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
cargo test --release --test fuzz --no-run --quiet
bin=$(cargo test --release --test fuzz --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)

extra=0
if [ "${FUZZ_VALGRIND:-0}" -gt 0 ]; then
    if command -v valgrind >/dev/null; then
        echo "fuzz: ${FUZZ_VALGRIND} executions under valgrind (memcheck)" >&2
        FUZZ_THREADS=1 valgrind --quiet --error-exitcode=3 "$bin" "$FUZZ_VALGRIND" "$seed" \
            >/dev/null || { [ $? -eq 3 ] && extra=1 && echo "FAIL: valgrind reported errors (above), seed $seed"; }
    else
        echo "fuzz: FUZZ_VALGRIND set but valgrind is not installed" >&2
    fi
fi

# The binary's output goes through as it comes; its summary line gets the valgrind failures
# added, or is written here if the process died before writing it (a panic while panicking
# aborts; the seed it was running is in its last words on stderr).
"$bin" "$n" "$seed" | awk -v extra="$extra" -v n="$n" -v seed="$seed" '
    { if (have) { print prev; fflush() } prev = $0; have = 1 }
    END {
        if (have && prev ~ /^fuzz: [0-9]+ executions, [0-9]+ failures, seed /) {
            split(prev, f, " ")
            f[4] += extra
            print "fuzz: " f[2] " executions, " f[4] " failures, seed " f[7]
            exit (f[4] > 0 ? 1 : 0)
        }
        if (have) print prev
        print "fuzz: the fuzzer died before its summary; replay the seed it names above"
        print "fuzz: " n " executions, " extra + 1 " failures, seed " seed
        exit 1
    }'
