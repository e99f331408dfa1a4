#!/bin/bash
# qperf (Debian's 0.4.11-3) for qemu/roce/linux.sh, in a Linux guest:
#   qperf.sh server                     qperf's server (port 19765) until a client's `quit`
#   qperf.sh client PEER TEST [OPTS…]   one test against PEER, then `quit` to end its server
# qperf's server never exits by itself: it forks a child for every request and goes on
# listening; its `quit` request (a client's `qperf PEER quit`) makes it exit 0. So the client
# runs its test, then `quit`, and the server side is a plain `qperf`. The client exits 0 only
# if the test exited 0 and printed its result (`bw =` or `latency =`), and the quit was taken;
# the server only if it printed nothing (qperf's server is silent unless a test failed).
# docs/qperf.md has qperf's protocol and what each test does.
set -u
role=$1
if [ "$role" = server ]; then
  # The server prints nothing unless a test failed (its child's error, e.g. `failed to
  # receive synchronization after test: timed out`); it exits 0 on `quit` either way.
  out=$(qperf 2>&1)
  st=$?
  echo "$out"
  [ "$st" = 0 ] || exit "$st"
  [ -z "$out" ] || { echo "qperf.sh: the server's test failed (above)"; exit 1; }
  exit 0
fi
peer=$2 test=$3
shift 3
# -ws: qperf tries its connection again for that many seconds while nobody listens yet.
out=$(qperf "$peer" -ws 30 "$@" "$test" 2>&1)
st=$?
echo "$out"
q=$(qperf "$peer" -ws 10 quit 2>&1)
qst=$?
# (qperf prints the test's name, `quit:`, and nothing else when the quit went well.)
[ "$q" = "quit:" ] || echo "quit: $q"
if [ "$st" = 0 ] && ! grep -qE "^ *(bw|latency|msg_rate) += " <<<"$out"; then
  echo "qperf.sh: $test printed no result"
  exit 1
fi
[ "$st" = 0 ] || exit "$st"
[ "$qst" = 0 ] || { echo "qperf.sh: quit failed ($qst)"; exit "$qst"; }
exit 0
