#!/usr/bin/env bash
# fusegraph on 64-bit ARM Linux, checked from this x86-64 machine: build the whole C++ side (kernels, ops library,
# Python extension, GoogleTest suite) with Debian's aarch64 cross GCC against the aarch64 torch wheel from PyPI,
# then run the C++ tests under qemu-user as a Neoverse N1 (AWS Graviton2, Ampere Altra: NEON, no SVE) and as a CPU
# with 256-bit SVE (Graviton3's Neoverse V1), where ATen runs its SVE256 kernels and fusegraph its NEON build.
#
# What it shows: the build works on ARM (CMake picks the DEFAULT kernels, which at::vec makes NEON; no x86 flag or
# intrinsic leaks in), and the NEON kernels give the same results as the float64 references, with poisoned outputs,
# odd sizes, non-contiguous views and every dtype, as tests/cpp checks them on x86. What it cannot show: speed (qemu
# translates every instruction); the Python side (Debian's
# aarch64 python3.11 runs under qemu, but `import torch` of PyPI's aarch64 wheel loads its CUDA libraries, cuDNN,
# cuBLAS and NCCL among them, GBs of wheels; the CPU-only aarch64 wheel is on download.pytorch.org, which these
# machines cannot reach).
# On an aarch64 machine it does nothing: `make build` and `make test` there build and test natively.
#
# Set-up, once per machine (root; Debian's archive and PyPI only): the packages g++-aarch64-linux-gnu, qemu-user,
# libgtest-dev:arm64 and libpython3.11-dev:arm64 (dpkg multiarch), and the aarch64 wheels of the venv's torch
# version and of the two CUDA runtime libraries libtorch_cpu links (PyPI's aarch64 torch is its CUDA build; no GPU
# is needed to load it), unpacked under $BUILD/deps.
#
#   scripts/cross_check.sh                 # set up, build, run every C++ test under qemu
#   GTEST_FILTER='RmsNorm*' scripts/cross_check.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build-aarch64}
JOBS=${JOBS:-2}
PY=${PY:-$ROOT/.venv/bin/python}
DEPS=$BUILD/deps
SITE=$DEPS/site
log() { echo "[cross_check $(date -u +%H:%M:%S)] $*"; }

case "$(uname -m)" in
  aarch64|arm64) log "this machine is aarch64: make build / make test build and test natively; nothing to do"; exit 0 ;;
esac
[ -x "$PY" ] || { echo "cross_check: $PY not found; run 'make build' first" >&2; exit 2; }
PYVER=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
TORCH_VERSION=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')

# ---- 1. Debian packages ----
need=()
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
[ -e /usr/lib/aarch64-linux-gnu/libgtest.a ] || need+=(libgtest-dev:arm64)
[ -e "/usr/include/aarch64-linux-gnu/python$PYVER/pyconfig.h" ] || need+=("libpython$PYVER-dev:arm64")
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# ---- 2. the aarch64 wheels: torch (same version as the venv's) and the CUDA runtime pieces it names ----
if [ ! -f "$SITE/.complete" ]; then
  log "downloading torch $TORCH_VERSION for aarch64"
  rm -rf "$DEPS"
  mkdir -p "$DEPS/wheels" "$SITE"
  plat=(--platform manylinux2014_aarch64)
  for m in 17 24 25 26 27 28; do plat+=(--platform "manylinux_2_${m}_aarch64"); done
  dl() { "$PY" -m pip download --quiet --no-deps --only-binary :all: --python-version "$PYVER" "${plat[@]}" \
           -d "$DEPS/wheels" "$@"; }
  dl "torch==$TORCH_VERSION"
  unzip -q -o "$DEPS"/wheels/torch-*.whl -d "$SITE"
  # libtorch_cpu.so NEEDs libcudart and libcupti: the versions torch's own metadata pins (cuda-toolkit==X).
  ct=$(sed -n 's/^Requires-Dist: cuda-toolkit\[[^]]*\]==\([0-9.]*\).*/\1/p' "$SITE"/torch-*.dist-info/METADATA)
  if [ -n "$ct" ]; then
    "$PY" -m pip download --quiet --only-binary :all: --python-version "$PYVER" "${plat[@]}" -d "$DEPS/wheels" \
      "cuda-toolkit[cudart,cupti]==$ct"
    for w in "$DEPS"/wheels/nvidia_cuda_runtime-*.whl "$DEPS"/wheels/nvidia_cuda_cupti-*.whl; do
      unzip -q -o "$w" -d "$SITE"
    done
  fi
  rm -rf "$DEPS/wheels"  # unpacked; the torch wheel alone is ~430 MB
  touch "$SITE/.complete"
fi

# ---- the sysroot qemu runs the tests in: the cross toolchain's loader and libc, plus what torch's cpuinfo reads at
# start: /proc/cpuinfo and /sys CPU entries of a 2-core Neoverse N1 (MIDR 0x413fd0c1). qemu-user looks a path up
# under -L first; without these, cpuinfo parses this machine's x86 /proc/cpuinfo and crashes in cpuinfo_arm_linux_init.
ROOTFS=$BUILD/sysroot
if [ ! -f "$ROOTFS/proc/cpuinfo" ]; then
  mkdir -p "$ROOTFS/proc" "$ROOTFS/sys/devices/system/cpu"
  ln -sfn /usr/aarch64-linux-gnu/lib "$ROOTFS/lib"
  for i in 0 1; do
    printf 'processor\t: %d\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\nCPU revision\t: 1\n\n' "$i"
    mkdir -p "$ROOTFS/sys/devices/system/cpu/cpu$i/regs/identification"
    echo 0x00000000413fd0c1 > "$ROOTFS/sys/devices/system/cpu/cpu$i/regs/identification/midr_el1"
  done > "$ROOTFS/proc/cpuinfo"
  for f in possible present online; do echo 0-1 > "$ROOTFS/sys/devices/system/cpu/$f"; done
fi
QEMU=(qemu-aarch64 -L "$ROOTFS" -cpu neoverse-n1)
# Two threads, as on a small ARM instance (tests/cpp/test_thread_split.cpp sets 4 for itself).
export OMP_NUM_THREADS=2
# The cross toolchain's libc first: its loader (the sysroot's) and its libc must be one glibc build. Without it the
# loader takes libc from this machine's /etc/ld.so.cache, which lists the multiarch libc6:arm64 (another build of
# 2.36; libgtest-dev:arm64 brings it), and the two disagree on the loader's shared state: pthread_create then loops
# for ever walking a stack list the other one laid out, and every program hangs at its second thread.
LIBS=/usr/aarch64-linux-gnu/lib:$SITE/torch/lib
for d in "$SITE"/nvidia/*/lib; do if [ -d "$d" ]; then LIBS=$LIBS:$d; fi; done
# The aarch64 loader (under qemu) finds torch's libraries and the CUDA runtime here; x86 programs skip them.
export LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# ---- 3. configure and build ----
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  log "configuring $BUILD"
  GEN=$(command -v ninja >/dev/null && echo "-G Ninja" || true)
  # shellcheck disable=SC2086
  cmake -S "$ROOT" -B "$BUILD" $GEN -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_TOOLCHAIN_FILE="$ROOT/cmake/aarch64-linux-gnu.cmake" \
    -DFUSEGRAPH_TORCH_DIR="$SITE/torch" -DPython_EXECUTABLE="$PY" -DPython_INCLUDE_DIR="/usr/include/python$PYVER" \
    -DFG_QEMU_SYSROOT="$ROOTFS" >/dev/null
fi
log "building (aarch64, $JOBS jobs)"
cmake --build "$BUILD" -j "$JOBS" --target fusegraph_ops _C fusegraph_cpp_tests fusegraph_aot_runner
for f in "$BUILD/fusegraph/libfusegraph_ops.so" "$BUILD/fusegraph_cpp_tests"; do
  readelf -h "$f" | grep -q 'AArch64' || { echo "cross_check: $f is not an aarch64 binary" >&2; exit 1; }
done
if readelf -d "$BUILD/fusegraph/libfusegraph_ops.so" | grep -q 'libtorch_cuda'; then
  echo "cross_check: libfusegraph_ops links libtorch_cuda without a CUDA build" >&2; exit 1
fi

# ---- the CUDA entry points (csrc/ops/cuda/*_cuda.cpp) compiled against this CUDA torch's headers: the x86 build
# has a CPU torch, whose headers lack c10/cuda, so they were compiled only on a GPU machine (the .cu kernels are
# nvcc-checked by the x86 build). Host code: the x86 compiler, syntax and types only; CUDA's runtime headers from
# the installed toolkit (CUDA_HOME, else nvcc's).
CUDA_INC=${CUDA_HOME:-}/include
if [ ! -f "$CUDA_INC/cuda_runtime.h" ] && command -v nvcc >/dev/null; then
  CUDA_INC=$(dirname "$(readlink -f "$(command -v nvcc)")")/../include
  [ -f "$CUDA_INC/cuda_runtime.h" ] || CUDA_INC=/usr/local/cuda/include
fi
if [ -f "$CUDA_INC/cuda_runtime.h" ]; then
  caps=$(grep -o 'FUSEGRAPH_CPU_CAPS=[0-9]*' "$BUILD/build.ninja" "$BUILD/CMakeCache.txt" 2>/dev/null | head -1 | cut -d= -f2)
  for f in "$ROOT"/csrc/ops/cuda/*_cuda.cpp; do
    ${CXX:-g++} -std=c++17 -fsyntax-only -w -DUSE_CUDA -DFUSEGRAPH_CPU_CAPS="${caps:-1}" -I"$ROOT/csrc" \
      -I"$SITE/torch/include" -I"$SITE/torch/include/torch/csrc/api/include" -I"$CUDA_INC" "$f"
  done
  log "the CUDA entry points compile against torch $TORCH_VERSION's CUDA headers"
else
  log "no CUDA toolkit headers (cuda_runtime.h): the CUDA entry points are not compiled here"
fi

# ---- 4. the C++ tests, as a Neoverse N1 (NEON; ATen's capability DEFAULT), then as a CPU with 256-bit SVE (Neoverse
# V1, AWS Graviton3: ATen reports SVE256 and runs its SVE kernels; fusegraph's stub still runs its NEON build) ----
for cpu in neoverse-n1 max,sve256=on; do
  log "running the C++ tests under ${QEMU[*]/neoverse-n1/$cpu}"
  "${QEMU[@]/neoverse-n1/$cpu}" "$BUILD/fusegraph_cpp_tests" --gtest_brief=1 \
    ${GTEST_FILTER:+--gtest_filter="$GTEST_FILTER"}
done
log "aarch64: built, and the C++ tests passed under qemu (NEON and SVE-256 CPUs)"
