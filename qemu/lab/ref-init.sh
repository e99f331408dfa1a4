#!/bin/busybox sh
# /init of the reference guest: Linux's vmxnet3 and vmw_pvrdma on the same device, then refqp.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules/order); do insmod "/modules/$m" || echo "refinit: insmod $m failed"; done
# The port is ACTIVE only once the paired vmxnet3 is up.
for n in /sys/class/net/*; do ip link set "$(basename "$n")" up; done
for i in $(seq 1 50); do [ -e /dev/infiniband/uverbs0 ] && break; sleep 0.2; done
dmesg | grep -i pvrdma | sed 's/^/refinit: /'
/bin/refqp
echo "refinit: refqp exited $?"
poweroff -f
