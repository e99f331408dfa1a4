#!/bin/sh
# The capsule fuzzer of the NVMe-oF target: tests/capsule_fuzz.sh [N] [SEED]
#
# Sends N mutated command capsules (default 50000) from an allowed host to the target in
# nvmf/ on the in-memory segment, while a second, well-behaved host does verified I/O
# (nvmf/tests/capsule_fuzz.rs, the_capsule_fuzzer): exactly one answer per capsule, the
# medium written only as the commands say (a shadow copy), the host's memory touched only
# in the ranges its keyed SGLs name, the other host served. Sessions of 20,000 capsules,
# seeds SEED, SEED+1, ... (default: NVMF_FUZZ_SEED, else from the clock). Prints, last:
#     nvmf-fuzz: <N> capsules, <F> failures; answered <A>, successes <S>, error statuses <E>, disconnects <D>, good-host I/O <G>, seed <S>
# and on stderr the rate, the commands by opcode, the error statuses and the other checks'
# counts. A failed session prints the command that replays it. Exit status 1 when anything
# failed, or when the run reached less than the floors below.
#
# A release build with overflow checks and debug assertions on, in its own target directory.
set -eu
cd "$(dirname "$0")/.."
n=${1:-${NVMF_FUZZ_N:-50000}}
seed=${2:-${NVMF_FUZZ_SEED:-$(date +%s%N | cut -c1-18)}}

# Coverage floors, per 100,000 capsules (scaled to N). Set from a first measurement of the CI
# run (100,000 capsules, seed 20261125): successes 27,649, error statuses 61,363, disconnects
# 6,870, good-host I/O 37,869. Each floor is about 60 % of that: a change that makes the
# capsules die before the target's command paths (or stops the other host being served)
# fails CI, the seed-to-seed spread does not.
floor_successes=16500
floor_errors=37000
floor_disconnects=4000
floor_good=21000

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/fuzz"
export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
cargo test --release -p bareverbs-nvmf --test capsule_fuzz --no-run --quiet
bin=$(cargo test --release -p bareverbs-nvmf --test capsule_fuzz --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
out=$(NVMF_FUZZ_CAPSULES=$n NVMF_FUZZ_SEED=$seed "$bin" --exact the_capsule_fuzzer --nocapture \
    --test-threads 1 2>&1) && rc=0 || rc=$?
printf '%s\n' "$out" | grep -v '^nvmf-fuzz: [0-9]* capsules, [0-9]* failures' | grep -v '^$' >&2 || true
line=$(printf '%s\n' "$out" | grep '^nvmf-fuzz: [0-9]* capsules, [0-9]* failures; .*, seed ' | tail -n 1)
if [ -z "$line" ]; then
    echo "nvmf-fuzz: the fuzzer died before its summary (above)"
    echo "nvmf-fuzz: $n capsules, 1 failures, seed $seed"
    exit 1
fi
echo "$line"
[ "$rc" -eq 0 ] || exit 1
get() { printf '%s\n' "$line" | sed -n "s|.*[;,] $1 \([0-9]*\).*|\1|p"; }
sent=$(printf '%s\n' "$line" | sed -n 's/^nvmf-fuzz: \([0-9]*\) capsules.*/\1/p')
low=0
for k in "successes:$floor_successes" "error statuses:$floor_errors" \
    "disconnects:$floor_disconnects" "good-host I/O:$floor_good"; do
    name=${k%:*}
    want=$(( ${k##*:} * sent / 100000 ))
    got=$(get "$name")
    if [ "${got:-0}" -lt "$want" ]; then
        echo "nvmf-fuzz: $name $got, below the floor $want for $sent capsules"
        low=1
    fi
done
[ "$low" -eq 0 ]
