# Cross build for 64-bit ARM Linux on an x86-64 machine (scripts/cross_check.sh): Debian's cross GCC, and
# qemu-user to run what it builds (gtest discovery, ctest). Debian packages: g++-aarch64-linux-gnu, qemu-user,
# libgtest-dev:arm64 (multiarch).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# -L: the aarch64 loader and libc. FG_QEMU_SYSROOT (scripts/cross_check.sh makes one) adds an ARM /proc/cpuinfo and
# /sys CPU entries, which torch's cpuinfo reads at start (under qemu-user it would read this x86 machine's and
# crash). The CPU model: a Neoverse N1 (AWS Graviton2, Ampere Altra): NEON, no SVE, so ATen runs its DEFAULT (NEON)
# kernels, as fusegraph's do. Put /usr/aarch64-linux-gnu/lib first in LD_LIBRARY_PATH (the script does): the
# loader under -L must get the libc of its own glibc build, not the multiarch libc6:arm64 the host's loader cache
# names, or every program hangs at its second thread.
if(NOT FG_QEMU_SYSROOT)
  set(FG_QEMU_SYSROOT /usr/aarch64-linux-gnu)
endif()
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;${FG_QEMU_SYSROOT};-cpu;neoverse-n1)
