# shellcheck shell=bash
# The instruction counter of the labs (qemu/roce/lab.sh, qemu/roce/nvmf.sh), sourced: the QEMU
# plugin qemu/roce/icount.c and the Linux guests' marker qemu/roce/mark.c, built into
# $cache/icount, and the count of a window between two marks. Needs $here (qemu/roce), $cache,
# $qemu and a `stage` function.
#
# QEMU's plugin header from the source package of the QEMU that modern-qemu.sh unpacks (Debian's
# bookworm-backports, 10.0; only the upstream tarball is needed, and only the header is
# unpacked), then the plugin and the Linux guests' marker, built with gcc. The lab's QEMU must
# load it (plugin API 2 or later, QEMU 9.0 or later); else there is no efficiency line.
counter_dir=$cache/icount
counter_so=$counter_dir/icount.so counter_mark=$counter_dir/mark counter=
build_counter() { # sets counter (the plugin) or why
  local src=$counter_dir/src hdr tarball apt
  mkdir -p "$src"
  hdr=$(find "$src" -path '*/include/qemu/qemu-plugin.h' 2>/dev/null | head -1)
  if [ -z "$hdr" ]; then
    mkdir -p "$src/apt/lists/partial" "$src/apt/archives/partial"
    echo "deb-src http://deb.debian.org/debian bookworm-backports main" > "$src/apt/sources.list"
    apt=(apt-get -q -o "Dir::Etc::SourceList=$src/apt/sources.list" -o "Dir::Etc::SourceParts=-"
         -o "Dir::State::Lists=$src/apt/lists" -o "Dir::Cache::Archives=$src/apt/archives"
         -o "APT::Sandbox::User=root")
    # (The status is not the test: a mirror without Debian's .dsc still serves the tarball.)
    { "${apt[@]}" update && (cd "$src" && "${apt[@]}" source --download-only qemu/bookworm-backports); } \
      > "$src/fetch.log" 2>&1 || true
    tarball=$(ls "$src"/qemu_*.orig.tar.xz 2>/dev/null | head -1)
    [ -n "$tarball" ] || { why="no QEMU source package (see $src/fetch.log)"; return 1; }
    tar -C "$src" -xJf "$tarball" --wildcards '*/include/qemu/qemu-plugin.h' ||
      { why="no qemu-plugin.h in $tarball"; return 1; }
    rm -f "$tarball"
    hdr=$(find "$src" -path '*/include/qemu/qemu-plugin.h' | head -1)
  fi
  # shellcheck disable=SC2046 # pkg-config's flags are words
  gcc -O2 -Wall -Wextra -Werror -shared -fPIC -I"$(dirname "$hdr")" $(pkg-config --cflags glib-2.0) \
      -o "$counter_so" "$here/icount.c" > "$counter_dir/build.log" 2>&1 &&
    gcc -O2 -Wall -Wextra -Werror -o "$counter_mark" "$here/mark.c" >> "$counter_dir/build.log" 2>&1 ||
    { why="the plugin did not build (see $counter_dir/build.log)"; return 1; }
  rm -f "$counter_dir/probe.txt"
  printf '{"execute":"qmp_capabilities"}\n{"execute":"quit"}\n' |
    timeout 30 "$qemu" -accel tcg -machine none -nodefaults -display none -qmp stdio \
      -plugin "$counter_so,out=$counter_dir/probe.txt" > "$counter_dir/probe.log" 2>&1
  grep -q '^total ' "$counter_dir/probe.txt" 2>/dev/null ||
    { why="the lab's QEMU does not load it: $(grep -v '^{' "$counter_dir/probe.log" | tail -1)"; return 1; }
  counter=$counter_so
  stage "instruction counter built against $(sed -n 's/^#define QEMU_PLUGIN_VERSION /plugin API /p' "$hdr") ($(basename "$(dirname "$(dirname "$(dirname "$hdr")")")")'s qemu-plugin.h)"
}
# Instructions in a case's window, from a counter's output: its mark 01KK minus its mark 00KK.
window_count() { # FILE KK
  awk -v s="00$2" -v e="01$2" '$1 == "mark" && $2 == s {a = $3}
    $1 == "mark" && $2 == e && a != "" {printf "%.0f\n", $3 - a; exit}' "$1" 2>/dev/null
}
