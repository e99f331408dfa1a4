#!/bin/sh
# The hostile-network fuzzer of the software RoCE device: tests/rxe_fuzz.sh [N] [SEED]
#
# Sends N mutated frames (default 200000) from a third station on the in-memory segment at two
# rxe devices talking RC (tests/rxe_hostile.rs, the_mutation_fuzzer): the endpoints' own
# recent frames and requests forged at the live PSNs, mangled, from the peers' addresses or
# foreign ones, the ICRC resealed half the time. Storms of 20,000 frames, seeds SEED, SEED+1,
# ... (default: RXE_FUZZ_SEED, else from the clock). Prints, last:
#     rxe-fuzz: <N> frames, <F> failures, seed <S>
# and the rate on stderr. A failed storm prints the command that replays it. Exit status 1
# when anything failed.
#
# A release build with overflow checks and debug assertions on (an arithmetic overflow on a
# network value is a panic, hence a failure), in its own target directory.
set -eu
cd "$(dirname "$0")/.."
n=${1:-${RXE_FUZZ_N:-200000}}
seed=${2:-${RXE_FUZZ_SEED:-$(date +%s%N | cut -c1-18)}}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/fuzz"
export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
cargo test --release -p bareverbs --test rxe_hostile --no-run --quiet
bin=$(cargo test --release -p bareverbs --test rxe_hostile --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
out=$(RXE_FUZZ_FRAMES=$n RXE_FUZZ_SEED=$seed "$bin" --exact the_mutation_fuzzer --nocapture \
    --test-threads 1 2>&1) && rc=0 || rc=$?
printf '%s\n' "$out" | grep -v '^rxe-fuzz: [0-9]* frames, [0-9]* failures' | grep -v '^$' >&2 || true
line=$(printf '%s\n' "$out" | grep '^rxe-fuzz: [0-9]* frames, [0-9]* failures, seed ' | tail -n 1)
if [ -z "$line" ]; then
    echo "rxe-fuzz: the fuzzer died before its summary (above)"
    echo "rxe-fuzz: $n frames, 1 failures, seed $seed"
    exit 1
fi
echo "$line"
[ "$rc" -eq 0 ]
