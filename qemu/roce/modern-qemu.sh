#!/usr/bin/env bash
# A modern QEMU (10.0, which has no pvrdma) beside the system's, for the RoCE lab on a Debian 12
# host whose own QEMU is 7.2 (kept for the pvrdma lab). Prints the path of a qemu-system-x86_64
# to give qemu/roce/lab.sh as BAREVERBS_ROCE_QEMU; prints nothing and exits 1 when it cannot
# provide one (no network, no bookworm-backports, no mount namespace).
#
#   qemu/roce/modern-qemu.sh     # e.g. $PWD/qemu/lab/.cache/qemu10/qemu-system-x86_64
#
# Debian's bookworm-backports packages are downloaded with apt-get into the lab cache, with a
# private source list and package lists (the system's apt configuration is not touched), and
# unpacked there. QEMU looks for its modules (display, audio) in the compiled-in folder first,
# which holds 7.2's, and aborts on loading one of another build; the wrapper runs it in a
# private mount namespace with 10.0's modules bound over that folder. A host whose own QEMU is
# 9.1 or later needs none of this: qemu/roce/lab.sh uses PATH's QEMU.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${BAREVERBS_LAB_CACHE:-$here/../lab/.cache}
dir=$(mkdir -p "$cache/qemu10" && cd "$cache/qemu10" && pwd)
wrapper=$dir/qemu-system-x86_64
suite=bookworm-backports
log=$dir/fetch.log

if ! [ -x "$dir/root/usr/bin/qemu-system-x86_64" ]; then
  {
    mkdir -p "$dir/apt/lists/partial" "$dir/apt/archives/partial" "$dir/debs"
    echo "deb http://deb.debian.org/debian $suite main" > "$dir/apt/sources.list"
    apt=(apt-get -q -o "Dir::Etc::SourceList=$dir/apt/sources.list" -o "Dir::Etc::SourceParts=-"
         -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::Cache::Archives=$dir/apt/archives"
         -o "APT::Sandbox::User=root")
    "${apt[@]}" update
    (cd "$dir/debs" && "${apt[@]}" download "qemu-system-x86/$suite" "qemu-system-common/$suite" \
      "qemu-system-data/$suite" "qemu-system-modules-spice/$suite")
    for d in "$dir"/debs/*.deb; do dpkg-deb -x "$d" "$dir/root"; done
  } > "$log" 2>&1 || { echo "modern-qemu.sh: could not fetch QEMU from $suite (see $log)" >&2; exit 1; }
fi

cat > "$wrapper" <<EOF
#!/bin/sh
# QEMU from $suite, unpacked by qemu/roce/modern-qemu.sh: run with its own modules.
exec unshare -m sh -c 'mount --bind "\$0/usr/lib/x86_64-linux-gnu/qemu" /usr/lib/x86_64-linux-gnu/qemu && exec "\$0/usr/bin/qemu-system-x86_64" "\$@"' "$dir/root" "\$@"
EOF
chmod +x "$wrapper"
"$wrapper" -nodefaults -display none -netdev help >/dev/null 2>&1 ||
  { echo "modern-qemu.sh: the unpacked QEMU does not run here ($("$wrapper" --version 2>&1 | tail -1))" >&2; exit 1; }
echo "$wrapper"
