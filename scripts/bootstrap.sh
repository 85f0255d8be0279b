#!/usr/bin/env bash
# Installs the Debian packages kvsdk needs to build and test. Idempotent: installs only what is
# missing, so repeated runs cost one dpkg query. Runs as root or through sudo.
set -euo pipefail

packages=(
  ninja-build
  build-essential cmake pkg-config
  libzstd-dev zstd
  flatbuffers-compiler libflatbuffers-dev
  googletest libgtest-dev libbenchmark-dev
  clang libclang-rt-dev
  gnuplot-nox python3
  python3-numpy
)

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
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
