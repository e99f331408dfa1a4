#!/usr/bin/env bash
# Cargo's runner for the host target (.cargo/config.toml). The kernels are booted in QEMU (the
# example by boot.sh, the appliance by appliance.sh);
# everything else cargo runs (tests, doctests, tools) is executed directly — except under
# `cargo miri`, which runs them itself.
set -euo pipefail
# `cargo miri` builds stand-ins (JSON files) instead of executables, and registers itself as the
# runner that interprets them (invoked as `cargo-miri runner <stand-in> <args>`), but for
# `cfg(all())`, which this runner, keyed on the host triple, outranks. It marks its cargo runs
# with MIRI_LOCAL_CRATES and is their rustc wrapper: hand over to it as it would be invoked.
if [ -n "${MIRI_LOCAL_CRATES:-}" ] && [ -n "${RUSTC_WRAPPER:-}" ]; then
  exec "$RUSTC_WRAPPER" runner "$@"
fi
case "$(basename "$1")" in
  bareverbs-unikernel) exec "$(dirname "$0")/boot.sh" "$@" ;;
  bareverbs-appliance) exec "$(dirname "$0")/appliance.sh" "$@" ;;
  *) exec "$@" ;;
esac
