#!/bin/sh
# The hostile-NIC fuzzer of the Intel links: tests/intel_fuzz.sh [N] [SEED]
#
# N executions (default 1000000) per NIC family (igb, e1000e) against the NIC models of
# bareverbs-model in hostile mode (tests/intel_fuzz.rs): forged descriptor write-backs,
# scribbled descriptors, withheld done bits, dropped and duplicated frames, lying registers at
# bring-up. Prints one line per family, e.g.
#     intel-fuzz igb: <N> executions, <F> failures; received ..., refused length ..., ...
# A release build with overflow checks and debug assertions on, in its own target directory.
# Exit status 1 when a session failed (its replay command is printed).
set -eu
cd "$(dirname "$0")/.."
n=${1:-${INTEL_FUZZ_EXECS:-1000000}}
seed=${2:-${INTEL_FUZZ_SEED:-$(date +%s%N | cut -c1-18)}}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/fuzz"
export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
out=$(INTEL_FUZZ_EXECS=$n INTEL_FUZZ_SEED=$seed \
    cargo test --release -p bareverbs --test intel_fuzz --quiet -- --nocapture 2>&1) && rc=0 || rc=$?
printf '%s\n' "$out" | grep -E '^intel-fuzz|panicked|replay' || true
[ "$rc" -eq 0 ]
