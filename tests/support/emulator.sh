# Sourced by the shell-driven tests: cross builds run the target's binaries through an emulator
# (KVSDK_RUN, e.g. "qemu-aarch64 -L /usr/aarch64-linux-gnu").
# emulated BINARY DIR: prints a command that runs BINARY, through a wrapper script written into
# DIR when KVSDK_RUN is set, else BINARY itself.
emulated() {
  if [ -z "${KVSDK_RUN:-}" ]; then
    printf '%s\n' "$1"
    return
  fi
  local wrapper
  wrapper="$2/$(basename "$1").emulated"
  printf '#!/bin/sh\nexec %s "%s" "$@"\n' "$KVSDK_RUN" "$1" >"$wrapper"
  chmod +x "$wrapper"
  printf '%s\n' "$wrapper"
}
