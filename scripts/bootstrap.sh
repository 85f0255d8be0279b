#!/usr/bin/env bash
# Installs the Debian packages kvsdk needs to build and test. Idempotent: installs only what is
# missing, so repeated runs cost one dpkg query. Runs as root or through sudo.
# --aarch64 adds the aarch64 cross toolchain, qemu-user and the arm64 -dev packages (multiarch)
# that the `aarch64` preset needs (see README "Edge builds").
set -euo pipefail

packages=(
  ninja-build
  build-essential cmake pkg-config
  libzstd-dev zstd
  libxxhash-dev  # XXH64 of snapshot frames and journal rows (header-only use: formats/xxhash64.cpp)
  libhwy-dev  # Google Highway: SIMD with runtime dispatch (backends/cpu/fast_attention*)
  flatbuffers-compiler libflatbuffers-dev
  googletest libgtest-dev libbenchmark-dev
  libboost-context-dev  # fibers of the CUDA host execution shim (backends/cuda/host)
  clang libclang-rt-dev
  gnuplot-nox python3
  python3-numpy
)
if [ "${1:-}" = "--aarch64" ]; then
  # Cross compilers, qemu-aarch64 to run the tests, and the arm64 libraries the build links
  # (GTest only for the tests); flatc keeps running from the host package above.
  packages+=(crossbuild-essential-arm64 qemu-user
             libzstd-dev:arm64 libflatbuffers-dev:arm64 libgtest-dev:arm64
             libhwy-dev:arm64)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "bootstrap: installing ${missing[*]}" >&2
if [ "$(id -u)" -eq 0 ]; then
  sudo_cmd=()
elif command -v sudo >/dev/null 2>&1; then
  sudo_cmd=(sudo)
else
  echo "bootstrap: need root or sudo to install: ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
if [[ " ${missing[*]} " == *":arm64 "* ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  "${sudo_cmd[@]}" dpkg --add-architecture arm64
fi
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
