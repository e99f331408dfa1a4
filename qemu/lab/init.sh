#!/bin/busybox sh
# /init of the outer guest: mount this machine's root over 9p, chroot into it, run the lab.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules/order); do insmod "/modules/$m" 2>/dev/null; done
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^bvlab.$1=//p"; }
r=/mnt/root
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot $r || {
  echo "bvlab: cannot mount the host root"; poweroff -f; }
# Writable scratch only under /run: the repository and the lab's cache may live anywhere else
# (/tmp included), and must stay visible.
mount -t tmpfs run $r/run
mkdir -p $r/run/tmp
mount -t proc proc $r/proc
mount -t sysfs sys $r/sys
mount -t devtmpfs dev $r/dev
# The kernel's own module loads (request_module) must run modprobe inside the chroot too, on
# the outer kernel's module tree (the extracted package: modprobe -d).
printf '#!/bin/sh\nexec chroot /mnt/root /sbin/modprobe -d %s "$@"\n' "$(arg kroot)" > /modprobe-chroot
chmod +x /modprobe-chroot
echo /modprobe-chroot > /proc/sys/kernel/modprobe
TMPDIR=/run/tmp chroot $r /bin/bash "$(arg inner)" "$(arg kroot)" "$(arg mux)" "$(arg kernel)" "$(arg initrd)"
echo "bvlab: inner script exited $?"
poweroff -f
