#!/usr/bin/env bash
# Cargo's runner for the host target (.cargo/config.toml). The unikernel is booted in QEMU;
# everything else cargo runs (tests, doctests, tools) is executed directly.
set -euo pipefail
case "$(basename "$1")" in
  bareverbs-unikernel) exec "$(dirname "$0")/boot.sh" "$@" ;;
  *) exec "$@" ;;
esac
