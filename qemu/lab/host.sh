# Sourced by qemu/lab/lab.sh and qemu/roce/lab.sh: the host's Debian packages. Needs a `stage`
# function.

# Installs with apt-get those of the named packages that are missing.
install_missing() {
  local p need=()
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then
    stage "installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
}
