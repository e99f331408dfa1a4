# Sourced by qemu/lab/lab.sh and qemu/roce/lab.sh: Debian's kernel (with its modules) and a
# busybox initramfs whose /init (qemu/lab/init.sh) mounts this machine's root read-only over 9p,
# chroots into it and runs the script named by `bvlab.inner=` on the kernel command line.
# Both are cached in $cache and rebuilt only when missing (the initramfs also when init.sh
# changes). Needs: $cache, $lab_dir (qemu/lab), and a `stage` function.

# --- the outer guest's kernel (Debian bookworm's), with modules.dep ----------------------------
if [ ! -f "$cache/kernel.ok" ]; then
  stage "fetching Debian's linux-image"
  rm -rf "$cache/kroot" "$cache"/linux-image-*.deb
  kernel_pkg() { { apt-cache depends linux-image-amd64 2>/dev/null || true; } | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
  pkg=$(kernel_pkg)
  if [ -z "$pkg" ]; then # a machine whose apt package lists were never fetched, or were cleaned
    stage "apt-get update (no package list names linux-image-amd64)"
    apt-get update -qq
    pkg=$(kernel_pkg)
  fi
  [ -n "$pkg" ] || { echo "guest.sh: apt knows no linux-image-amd64, even after apt-get update" >&2; exit 1; }
  (cd "$cache" && apt-get download "$pkg" >/dev/null)
  dpkg -x "$cache"/linux-image-*.deb "$cache/kroot"
  rm -f "$cache"/linux-image-*.deb
  kver=$(ls "$cache/kroot/lib/modules")
  depmod -b "$cache/kroot" "$kver"
  touch "$cache/kernel.ok"
fi
kver=$(ls "$cache/kroot/lib/modules")
kmods="$cache/kroot/lib/modules/$kver"


add() { # a module and, first, its dependencies (modules.dep order), into $order
  local m=$1 d
  for d in $(awk -v m="$m:" '$1 == m { $1 = ""; print }' "$kmods/modules.dep"); do add "$d"; done
  case " ${order[*]} " in *" $m "*) ;; *) order+=("$m") ;; esac
}

# --- the initramfs: busybox, the virtio/9p modules, /init --------------------------------------
if [ ! -f "$cache/initramfs.cpio.gz" ] || [ "$lab_dir/init.sh" -nt "$cache/initramfs.cpio.gz" ]; then
  stage "building the initramfs"
  ir="$cache/initramfs"
  rm -rf "$ir" && mkdir -p "$ir"/{bin,proc,sys,dev,mnt/root,modules}
  cp /bin/busybox "$ir/bin/busybox"
  order=()
  for m in kernel/drivers/virtio/virtio_pci.ko kernel/drivers/net/virtio_net.ko \
           kernel/net/9p/9pnet_virtio.ko kernel/fs/9p/9p.ko; do add "$m"; done
  for m in "${order[@]}"; do cp "$kmods/$m" "$ir/modules/"; basename "$m" >> "$ir/modules/order"; done
  cp "$lab_dir/init.sh" "$ir/init"
  chmod +x "$ir/init"
  (cd "$ir" && find . | cpio -o -H newc 2>/dev/null | gzip -1) > "$cache/initramfs.tmp"
  mv "$cache/initramfs.tmp" "$cache/initramfs.cpio.gz"
fi
