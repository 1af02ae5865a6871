#!/usr/bin/env bash
# Device check, one call on a GPU machine (no network): build fusegraph._C with CUDA against the
# installed torch, run the C++ tests, the op tests (CUDA and CPU) and the CUDA op benchmark.
# Usage (repo root):  OUT=/some/dir scripts/device_check.sh     (OUT defaults to ./out)
# Every step's output is tee'd to $OUT/<step>.log; a summary is printed at the end and written to
# $OUT/summary.txt. Exit status: 0 when every step passed, else 1. Budget: BUDGET_S (450 s) for all steps.
set -uo pipefail  # not -e: a failing step is recorded and the later steps still run

cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
BUILD_DIR="${BUILD_DIR:-build-cuda}"
JOBS="${JOBS:-$(nproc)}"
START=$(date +%s)
BUDGET_S="${BUDGET_S:-450}"  # all steps together; each step's timeout is cut to what is left
declare -a SUMMARY=()
STATUS=0

# step NAME TIMEOUT_S CMD...: run with a timeout, tee to $OUT/NAME.log, record PASS/FAIL/TIMEOUT.
step() {
  local name="$1" limit="$2"
  shift 2
  local t0=$(date +%s)
  local left=$(( START + BUDGET_S - t0 ))
  if [ "$left" -lt 15 ]; then
    STATUS=1
    skip "$name" "out of the ${BUDGET_S}s budget"
    return 0
  fi
  [ "$limit" -le "$left" ] || limit="$left"
  echo "=== [$name] $* (timeout ${limit}s)" | tee "$OUT/$name.log"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  local verdict=PASS
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then verdict=TIMEOUT; elif [ "$rc" -ne 0 ]; then verdict="FAIL(rc=$rc)"; fi
  [ "$verdict" = PASS ] || STATUS=1
  SUMMARY+=("$(printf '%-12s %-12s %4ss' "$name" "$verdict" "$(( $(date +%s) - t0 ))")")
  return 0
}

skip() {
  SUMMARY+=("$(printf '%-12s %-12s %s' "$1" SKIPPED "$2")")
  echo "=== [$1] skipped: $2" | tee "$OUT/$1.log"
}

# ---- environment ----
{
  echo "date: $(date -u)"; echo "host: $(hostname)"; echo "python: $PY"
  "$PY" - <<'EOF'
import sys, torch
print("python", sys.version.split()[0])
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
EOF
  nvidia-smi || echo "nvidia-smi not available"
  cmake --version | head -1; command -v ninja && ninja --version
} 2>&1 | tee "$OUT/env.log"

# nvcc: CUDA_HOME, /usr/local/cuda, PATH, then the usual install folders.
NVCC=""
for c in "${CUDA_HOME:-}/bin/nvcc" /usr/local/cuda/bin/nvcc "$(command -v nvcc || true)"; do
  if [ -n "$c" ] && [ -x "$c" ]; then NVCC="$c"; break; fi
done
if [ -z "$NVCC" ]; then
  NVCC="$(find /usr/local /opt /usr/lib -maxdepth 5 -name nvcc -type f -perm -u+x 2>/dev/null | head -1)"
fi
echo "nvcc: ${NVCC:-NOT FOUND}" | tee -a "$OUT/env.log"
[ -n "$NVCC" ] && "$NVCC" --version | tail -2 | tee -a "$OUT/env.log"

# ---- build ----
CMAKE_ARGS=(-S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PY")
command -v ninja >/dev/null && CMAKE_ARGS+=(-G Ninja)
if [ -n "$NVCC" ]; then
  CMAKE_ARGS+=(-DNVCC_EXECUTABLE="$NVCC")
  export CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}"
fi
HAVE_GTEST=0
for f in /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/aarch64-linux-gnu/libgtest.a /usr/lib/libgtest.a \
         /usr/local/lib/libgtest.a /usr/lib64/libgtest.a; do
  [ -e "$f" ] && HAVE_GTEST=1
done
[ "$HAVE_GTEST" = 1 ] || CMAKE_ARGS+=(-DFUSEGRAPH_BUILD_TESTS=OFF)
# A cache from another generator or torch would fail the configure: start clean when it does not match.
if [ -f "$BUILD_DIR/CMakeCache.txt" ] && ! grep -q "Python_EXECUTABLE:FILEPATH=$PY" "$BUILD_DIR/CMakeCache.txt"; then
  rm -rf "$BUILD_DIR"
fi
step configure 90 cmake "${CMAKE_ARGS[@]}"
step build 270 cmake --build "$BUILD_DIR" -j "$JOBS"
step has_cuda 30 "$PY" -c "import fusegraph, torch
assert fusegraph._C.has_cuda_kernels(), 'fusegraph._C was built without CUDA kernels'
assert torch.cuda.is_available(), 'torch sees no CUDA device'
print('fusegraph CUDA kernels: yes')"

# ---- tests ----
if [ "$HAVE_GTEST" = 1 ]; then
  step cpp_tests 60 ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
else
  skip cpp_tests "no GoogleTest (libgtest.a) on this machine"
fi
step cuda_tests 150 "$PY" -m pytest tests/ops/test_cuda_ops.py -q -p no:cacheprovider --durations=10 -rs
step op_tests 120 "$PY" -m pytest tests/ops -q -p no:cacheprovider --ignore=tests/ops/test_cuda_ops.py -rs

# ---- benchmark (another helper's command; run it only when it exists) ----
if [ -f fusegraph/bench/ops.py ] || [ -d fusegraph/bench/ops ]; then
  step bench_ops 90 "$PY" -m fusegraph bench ops --device cuda --json "$OUT/bench_ops_cuda.json"
else
  skip bench_ops "'python -m fusegraph bench ops' not available in this tree"
fi

# ---- summary ----
{
  echo "=== summary ($(( $(date +%s) - START ))s in all; logs in $OUT)"
  for line in "${SUMMARY[@]}"; do echo "  $line"; done
  grep -hE "^(FAILED|ERROR) " "$OUT"/cuda_tests.log "$OUT"/op_tests.log 2>/dev/null | head -40
  for t in cuda_tests op_tests; do
    echo "  $t: $(grep -aE "[0-9]+ (passed|failed|skipped|errors?).* in [0-9.]+s" "$OUT/$t.log" 2>/dev/null | tail -1)"
  done
  [ "$STATUS" = 0 ] && echo "RESULT: all steps passed" || echo "RESULT: some steps failed"
} 2>&1 | tee "$OUT/summary.txt"
exit "$STATUS"
