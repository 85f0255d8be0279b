# Toolchain for 64-bit Arm Linux (NVIDIA Jetson, Raspberry Pi 4/5, Graviton...).
#
# Cross from x86-64 Debian/Ubuntu: uses the distribution's aarch64-linux-gnu-gcc/g++
# (crossbuild-essential-arm64), finds the arm64 multiarch -dev packages in
# /usr/lib/aarch64-linux-gnu, runs host programs (flatc) from the host, and runs the built
# tests under qemu-aarch64 through CMAKE_CROSSCOMPILING_EMULATOR, so ctest works unchanged.
# `scripts/bootstrap.sh --aarch64` installs all of it.
#
# With a target sysroot (e.g. a Jetson root file system copied from the device or from L4T),
# pass -DKVSDK_AARCH64_SYSROOT=/path/to/rootfs: compilers then link against it and qemu loads
# the target's libraries from it.
#
# On an aarch64 machine (a Jetson itself) this file changes nothing: the native compilers and
# libraries are used as in any native build.

if(CMAKE_HOST_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$")
  return()
endif()

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
# Debian's multiarch triplet: where find_package/find_library look for the arm64 packages.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(KVSDK_AARCH64_TRIPLE aarch64-linux-gnu CACHE STRING "GNU triple of the aarch64 cross compilers")
set(KVSDK_AARCH64_SYSROOT "" CACHE PATH "Target root file system (empty: Debian multiarch)")

set(CMAKE_C_COMPILER ${KVSDK_AARCH64_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${KVSDK_AARCH64_TRIPLE}-g++)
# nvcc compiles host code with the cross g++ (the `jetson` preset).
if(NOT CMAKE_CUDA_HOST_COMPILER)
  set(CMAKE_CUDA_HOST_COMPILER ${KVSDK_AARCH64_TRIPLE}-g++)
endif()

if(KVSDK_AARCH64_SYSROOT)
  set(CMAKE_SYSROOT ${KVSDK_AARCH64_SYSROOT})
  set(CMAKE_FIND_ROOT_PATH ${KVSDK_AARCH64_SYSROOT})
  set(_kvsdk_qemu_args -L ${KVSDK_AARCH64_SYSROOT})
else()
  # Without a sysroot, headers are shared with the host (/usr/include) and the target
  # libraries live in /usr/lib/aarch64-linux-gnu; keep the host's x86-64 ones out of reach.
  list(APPEND CMAKE_IGNORE_PATH /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu
       /usr/lib/x86_64-linux-gnu/cmake)
  # qemu runs the arm64 multiarch loader /lib/ld-linux-aarch64.so.1 (libc6:arm64) and its libc
  # from the host's paths. Not `-L /usr/aarch64-linux-gnu`: that loader comes from
  # libc6-arm64-cross while ld.so.cache still hands it the multiarch libc, a different glibc
  # build whenever the two packages' versions differ (2.36-8cross1 vs 2.36-9+deb12u14 here),
  # and a mismatched loader/libc pair hangs in the first pthread_create.
  set(_kvsdk_qemu_args)
endif()
# Programs (flatc, nm) come from the host; libraries, headers and packages from the target.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# ctest (and gtest_discover_tests, which lists the tests by running each binary) runs target
# executables through qemu (-L: where qemu finds the target's dynamic loader and libraries).
find_program(KVSDK_QEMU_AARCH64 qemu-aarch64)
if(KVSDK_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${KVSDK_QEMU_AARCH64} ${_kvsdk_qemu_args})
endif()
