#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then builds and runs a consumer through
# find_package(kvsdk) (shared and static) and through pkg-config.
# Cross builds set KVSDK_CONSUMER_TOOLCHAIN (toolchain file for the consumer), CC (the cross C
# compiler) and KVSDK_RUN (the emulator that runs the consumers, e.g. qemu-aarch64).
set -euo pipefail
build_dir=$1
src_dir=$2
run=(${KVSDK_RUN:-})
toolchain=()
[ -n "${KVSDK_CONSUMER_TOOLCHAIN:-}" ] && toolchain=(-DCMAKE_TOOLCHAIN_FILE="$KVSDK_CONSUMER_TOOLCHAIN")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$src_dir/tests/packaging/consumer" -B "$work/consumer" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" "${toolchain[@]}" >/dev/null
cmake --build "$work/consumer" >/dev/null
LD_LIBRARY_PATH="$work/prefix/lib" "${run[@]}" "$work/consumer/consumer_shared"
"${run[@]}" "$work/consumer/consumer_static"
libdir=$(ls -d "$work"/prefix/lib*/pkgconfig | head -n1)
export PKG_CONFIG_PATH=$libdir
# pkg-config files carry the configured prefix; point it at the scratch prefix.
sed -i "s|^prefix=.*|prefix=$work/prefix|" "$libdir/kvsdk.pc"
"${CC:-cc}" "$src_dir/tests/packaging/consumer/main.c" -o "$work/pc_consumer" $(pkg-config --cflags --libs kvsdk)
LD_LIBRARY_PATH="$(dirname "$libdir")" "${run[@]}" "$work/pc_consumer"
test -L "$(dirname "$libdir")/libkvsdk.so.0"
echo "install test: OK"
