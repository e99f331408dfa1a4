#!/bin/bash
# Runs inside the Linux guest of qemu/roce/nvmf-config.sh (chrooted into this machine's root by
# qemu/lab/init.sh): Linux's nvme-rdma over rdma_rxe, as two hosts (two host NQNs and host
# IDs), against the appliance's declared configuration:
#   lab-one: namespace 1 RAM 16 MiB, namespace 2 the virtio-blk disk (bvcfg.disk= MiB); lets in
#            host A only
#   lab-two: namespace 1 RAM 8 MiB; lets in host B only
# Checks each host's discovery log, each namespace's size and contents (a pattern naming the
# namespace written and read back with O_DIRECT, after the other namespaces were written), and
# each subsystem's refusal of the other host. Prints `nvmf-config-result: PASS|FAIL (…)`.
set -u
kroot=$1
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^bvcfg.$1=//p"; }
disk_mib=$(arg disk)
uk_ip=10.0.0.2 limit=120
one=nqn.2026-11.io.bareverbs:lab-one
two=nqn.2026-11.io.bareverbs:lab-two
host_a=nqn.2026-11.io.bareverbs:lab-a id_a=0f000000-0000-4000-8000-00000000000a
host_b=nqn.2026-11.io.bareverbs:lab-b id_b=0f000000-0000-4000-8000-00000000000b
t0=$(date +%s)
say() { echo "bvcfg[+$(( $(date +%s) - t0 ))s]: $*"; }
fail() { echo "nvmf-config-result: FAIL ($*)"; exit 1; }

[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
for m in rdma_rxe rdma_cm nvme-fabrics; do modprobe -d "$kroot" "$m" || fail "modprobe $m"; done
# As in nvmf-linux.sh: no fast registrations on the send queue (docs/testing.md).
modprobe -d "$kroot" nvme-rdma register_always=N || fail "modprobe nvme-rdma"
ip link set lo up
ip link set eth0 mtu 1500 up
ip addr add 10.0.0.1/24 dev eth0
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add"
say "rxe0 up on eth0"

# The subsystem NQNs a host's discovery log lists (the appliance may still be booting: until
# the log answers).
listed() { # HOSTNQN HOSTID
  local out deadline=$(( $(date +%s) + limit ))
  while :; do
    out=$(timeout 60 nvme discover -t rdma -a "$uk_ip" -s 4420 --hostnqn="$1" --hostid="$2" 2>&1) && break
    [ "$(date +%s)" -ge "$deadline" ] && { echo "no discovery log: $(tail -1 <<<"$out")"; return 1; }
    sleep 1
  done
  awk '/^subnqn:/ {print $2}' <<<"$out" | grep -v 'nvmexpress.discovery' | sort | tr '\n' ' '
}
# The block device of NQN's namespace NSID, once it has appeared: the multipath head under the
# subsystem or the controller's own disk (each subsystem here has one host connected).
device() { # NQN NSID
  local s d
  for _ in $(seq 1 ${3:-100}); do
    for s in /sys/class/nvme-subsystem/nvme-subsys* /sys/class/nvme/nvme*; do
      [ "$(cat "$s/subsysnqn" 2>/dev/null)" = "$1" ] || continue
      for d in "$s"/nvme*n"$2"; do
        [ -e "$d" ] && [ -b "/dev/${d##*/}" ] && { echo "/dev/${d##*/}"; return 0; }
      done
    done
    sleep 0.2
  done
  return 1
}
mib_of() { echo $(( $(blockdev --getsize64 "$1") / 1048576 )); }
# 1 MiB of "TAG block N" lines padded to 512 bytes, blocks FIRST.. (the host's check is the
# same text as nvmf-config.sh's check of the disk image).
pattern() { awk -v tag="$1" -v first="$2" -v n="$3" 'BEGIN { for (s = first; s < first + n; s++) { l = sprintf("%s block %08d\n", tag, s); printf "%s", l; for (i = length(l); i < 512; i++) printf "." } }'; }
write_ns() { # DEV TAG
  pattern "$2" 2048 2048 | dd of="$1" bs=512 seek=2048 oflag=direct conv=fsync status=none
}
check_ns() { # DEV TAG
  cmp -s <(dd if="$1" bs=512 skip=2048 count=2048 iflag=direct status=none) <(pattern "$2" 2048 2048)
}

seen_a=$(listed "$host_a" "$id_a") || fail "host A: $seen_a"
seen_b=$(listed "$host_b" "$id_b") || fail "host B: $seen_b"
say "host A's discovery log: $seen_a; host B's: $seen_b"
[ "$seen_a" = "$one " ] || fail "host A's discovery log lists '$seen_a', only $one wanted"
[ "$seen_b" = "$two " ] || fail "host B's discovery log lists '$seen_b', only $two wanted"

# The refusals first (nvme-cli would not connect a host twice to one subsystem anyway).
out=$(timeout 90 nvme connect -t rdma -a "$uk_ip" -s 4420 -n "$two" --hostnqn="$host_a" --hostid="$id_a" 2>&1) &&
  fail "host A connected to $two, which lets in host B only"
out=$(timeout 90 nvme connect -t rdma -a "$uk_ip" -s 4420 -n "$one" --hostnqn="$host_b" --hostid="$id_b" 2>&1) &&
  fail "host B connected to $one, which lets in host A only"
refusals=$(dmesg | grep -a -c "is not allowed")

timeout 90 nvme connect -t rdma -a "$uk_ip" -s 4420 -n "$one" --hostnqn="$host_a" --hostid="$id_a" >/dev/null 2>&1 ||
  fail "host A's connect to $one"
timeout 90 nvme connect -t rdma -a "$uk_ip" -s 4420 -n "$two" --hostnqn="$host_b" --hostid="$id_b" >/dev/null 2>&1 ||
  fail "host B's connect to $two"
a1=$(device "$one" 1) || fail "no namespace 1 of $one"
a2=$(device "$one" 2) || fail "no namespace 2 of $one"
b1=$(device "$two" 1) || fail "no namespace 1 of $two"
device "$one" 3 5 >/dev/null 2>&1 && fail "$one has a namespace 3"
device "$two" 2 5 >/dev/null 2>&1 && fail "$two has a namespace 2"
sizes="$(mib_of "$a1") $(mib_of "$a2") $(mib_of "$b1")"
say "devices $a1 $a2 $b1, MiB $sizes"
[ "$sizes" = "16 $disk_mib 8" ] || fail "namespace sizes $sizes MiB, 16 $disk_mib 8 wanted"

# Every namespace written, then every one read back: the RAM namespaces do not overlap.
write_ns "$a1" "lab-one ns1" && write_ns "$a2" "lab-one ns2" && write_ns "$b1" "lab-two ns1" ||
  fail "writing the patterns"
check_ns "$a1" "lab-one ns1" || fail "$one namespace 1 does not read back what was written"
check_ns "$a2" "lab-one ns2" || fail "$one namespace 2 does not read back what was written"
check_ns "$b1" "lab-two ns1" || fail "$two namespace 1 does not read back what was written"
nvme flush "$a2" >/dev/null 2>&1 || fail "nvme flush of $one namespace 2"
nvme disconnect -n "$one" >/dev/null 2>&1
nvme disconnect -n "$two" >/dev/null 2>&1
echo "nvmf-config-result: PASS (2 subsystems, 3 namespaces as declared: host A's discovery log lists $one alone, host B's $two alone; $one: namespace 1 16 MiB RAM, namespace 2 the $disk_mib MiB disk; $two: namespace 1 8 MiB RAM; 1 MiB written to each and read back as written; host A refused by $two and host B by $one ($refusals 'not allowed' lines in the kernel log))"
