#!/bin/sh
# The CM fuzzer: tests/cm_fuzz.sh [N] [SEED]
#
# Injects N mutated CM MADs (default 200000) at two CMs on the in-memory segment that hold a
# long-lived connection and make short ones one after another (tests/cm_fuzz.rs,
# the_cm_fuzzer): REQ, MRA, REJ, REP, RTU, DREQ, DREP and SIDR messages taken from the wire,
# mangled, from a stranger's addresses (any connection named) or from the peer's own (the
# long-lived one never named). Oracles: no panic, every episode over within a bound of the
# test clock, a stranger's episode ends exactly as planned, the long-lived connection never
# sees an event and still carries data, the tables come back. Sessions of 20,000 MADs, seeds
# SEED, SEED+1, ... (default: CM_FUZZ_SEED, else from the clock). Prints, last:
#     cm-fuzz: <N> MADs, <F> failures; established <E>, rejected <R>, disconnected <D>, timeouts <T>, dropped <X>, seed <S>
# (counted from the CMs' events and counters), and the rate and the other counts on stderr.
# A failed session prints the command that replays it. Exit status 1 when anything failed,
# or when the run reached less than the floors below.
#
# A release build with overflow checks and debug assertions on, in its own target directory.
set -eu
cd "$(dirname "$0")/.."
n=${1:-${CM_FUZZ_N:-200000}}
seed=${2:-${CM_FUZZ_SEED:-$(date +%s%N | cut -c1-18)}}

# Coverage floors, per 1,000,000 MADs (scaled to N). Set from a first measurement of the CI
# run (1,000,000 MADs, seed 20261125): established 556, rejected 179, disconnected 1,112,
# dropped 555,600 (seeds 7 and 99: 486/177/972/557,569 and 543/160/1,086/570,362). Each
# floor is about 60 % of that: a change that makes the MADs die before the CM's state
# machines, or the episodes stall, fails CI; the seed-to-seed spread does not.
floor_established=310
floor_rejected=90
floor_disconnected=620
floor_dropped=320000

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/fuzz"
export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
cargo test --release -p bareverbs --test cm_fuzz --no-run --quiet
bin=$(cargo test --release -p bareverbs --test cm_fuzz --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
out=$(CM_FUZZ_MADS=$n CM_FUZZ_SEED=$seed "$bin" --exact the_cm_fuzzer --nocapture \
    --test-threads 1 2>&1) && rc=0 || rc=$?
printf '%s\n' "$out" | grep -v '^cm-fuzz: [0-9]* MADs, [0-9]* failures' | grep -v '^$' >&2 || true
line=$(printf '%s\n' "$out" | grep '^cm-fuzz: [0-9]* MADs, [0-9]* failures; .*, seed ' | tail -n 1)
if [ -z "$line" ]; then
    echo "cm-fuzz: the fuzzer died before its summary (above)"
    echo "cm-fuzz: $n MADs, 1 failures, seed $seed"
    exit 1
fi
echo "$line"
[ "$rc" -eq 0 ] || exit 1
get() { printf '%s\n' "$line" | sed -n "s|.*[;,] $1 \([0-9]*\).*|\1|p"; }
sent=$(printf '%s\n' "$line" | sed -n 's/^cm-fuzz: \([0-9]*\) MADs.*/\1/p')
low=0
for k in "established:$floor_established" "rejected:$floor_rejected" \
    "disconnected:$floor_disconnected" "dropped:$floor_dropped"; do
    name=${k%:*}
    want=$(( ${k##*:} * sent / 1000000 ))
    got=$(get "$name")
    if [ "${got:-0}" -lt "$want" ]; then
        echo "cm-fuzz: $name $got, below the floor $want for $sent MADs"
        low=1
    fi
done
[ "$low" -eq 0 ]
