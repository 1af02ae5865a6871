#!/usr/bin/env bash
# Device check, one call on a GPU machine (no network): build fusegraph._C with CUDA against the
# installed torch (or install a fusegraph wheel: FG_WHEEL below), then, most telling first: the CUDA op tests,
# the kernels timed against a copy of their bytes, whole models on CUDA on every route (tests/test_cuda_models.py,
# the CUDA-graph driver tests), FLUX.1 at its published width on the GPU (`bench real --device cuda`: eager,
# Inductor, Inductor's CUDA graphs, fusegraph, fusegraph's CUDA graphs), fused AOT packages, the decode and op
# benchmarks, the NCCL multi-process check (scripts/nccl_check.py), the C++ tests, the CUDA cost table
# (`bench calibrate`), and the CPU-side op, graph and fusion tests on that machine's torch. Steps that do not fit
# in the budget are skipped and listed. The step caps add up to far more than one call's budget: on the first H200
# run one 470 s call reached about `bench_real_cuda` (build 55 s, CUDA op tests 40 s, models 110 s, FLUX 80 s);
# the rest is a second call on the still-warm machine:
#   STEPS=bench_real_cuda_graphs,aot_cuda,bench_decode,bench_ops,bench_decode_mlp,nccl,cpp_tests,calibrate,\
#         graph_tests,op_tests,fusion_tests
# Usage (repo root):  OUT=/some/dir scripts/device_check.sh     (OUT defaults to ./out)
# STEPS (default: all): comma-separated step names to run (e.g. STEPS=calibrate,fusion_tests for a second call on
#   a machine still warm; the build is incremental then).
# Carry `wheels` (`make device-wheels`): diffusers, pytest, pytest-xdist and their dependencies for Python 3.12;
#   what the machine's python lacks of them is installed from there into a venv over its own packages.
# FG_WHEEL (default auto): where fusegraph._C comes from.
#   auto   a fusegraph wheel in wheels/ that fits this python and torch (scripts/packaging/pick_wheel.py), else
#          the direct CMake build into $BUILD_DIR (with the C++ tests) as without a wheel
#   FILE   that wheel (it must fit);  off  the direct CMake build only
#   build  `pip wheel --no-build-isolation` here (scikit-build-core from wheels/, `make device-wheels`, when not
#          installed); the wheel is kept in logs.tgz (dist/), so it can be carried next time; else the CMake build
# A wheel is installed into a temporary folder and checked from outside the checkout (scripts/packaging/smoke.py
# and its CUDA kernels); its _C is then copied into fusegraph/, so the tests below run that very binary.
# Every step's output is tee'd to $OUT/<step>.log; a summary is printed at the end and written to
# $OUT/summary.txt. Exit status: 0 when every step passed, else 1. Budget: BUDGET_S (470 s) for all steps.
# The device tool brings back only a few files: the logs and JSON are written to a scratch folder and packed into
# $OUT/logs.tgz when the script ends (also when it is interrupted), beside $OUT/summary.txt.
set -uo pipefail  # not -e: a failing step is recorded and the later steps still run

cd "$(dirname "$0")/.."
FINAL_OUT="${OUT:-$PWD/out}"
mkdir -p "$FINAL_OUT"
OUT="$(mktemp -d)"  # every log and JSON; packed into $FINAL_OUT/logs.tgz at exit
pack() {
  tar czf "$FINAL_OUT/logs.tgz" -C "$OUT" . 2>/dev/null
  [ -f "$OUT/summary.txt" ] && cp "$OUT/summary.txt" "$FINAL_OUT/"
}
trap pack EXIT
trap 'exit 143' TERM INT
# scripts/ and ctest's Python run from other folders: the checkout on the path; fatal signals print a stack
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONFAULTHANDLER=1
PY="${PYTHON:-$(command -v python3 || command -v python)}"
BUILD_DIR="${BUILD_DIR:-build-cuda}"
JOBS="${JOBS:-$(nproc)}"
START=$(date +%s)
BUDGET_S="${BUDGET_S:-470}"  # all steps together; each step's timeout is cut to what is left
STEPS="${STEPS:-}"
XDIST=()
declare -a SUMMARY=()
STATUS=0

# step NAME TIMEOUT_S CMD...: run with a timeout, tee to $OUT/NAME.log, record PASS/FAIL/TIMEOUT.
step() {
  local name="$1" limit="$2"
  shift 2
  case "$name" in configure|build|has_cuda|wheel_*) ;;  # always: what the other steps need (incremental)
    *) if [ -n "$STEPS" ] && [[ ",$STEPS," != *",$name,"* ]]; then return 0; fi ;;
  esac
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

# ---- python packages the machine lacks (no network): from the carried wheels/ into a venv over its own ----
if [ -d wheels ] && ls wheels/*.whl >/dev/null 2>&1; then
  MISSING=()
  for mod in diffusers:diffusers pytest:pytest xdist:pytest-xdist; do
    "$PY" -c "import ${mod%%:*}" 2>/dev/null || MISSING+=("${mod#*:}")
  done
  if [ "${#MISSING[@]}" -gt 0 ] && "$PY" -c "import sys; sys.exit(sys.prefix == sys.base_prefix)"; then
    # the machine's python is a venv already (torch in it): install into it; a venv over a venv would not see torch
    "$PY" -m pip install --quiet --no-index --find-links wheels "${MISSING[@]}" >>"$OUT/env.log" 2>&1 &&
      echo "installed from wheels/ into $("$PY" -c "import sys; print(sys.prefix)"): ${MISSING[*]}" |
        tee -a "$OUT/env.log" || echo "pip install from wheels/ failed (env.log)" | tee -a "$OUT/env.log"
  elif [ "${#MISSING[@]}" -gt 0 ]; then
    VENV="$(mktemp -d)/venv"
    if "$PY" -m venv --system-site-packages "$VENV" >>"$OUT/env.log" 2>&1 &&
       "$VENV/bin/python" -m pip install --quiet --no-index --find-links wheels "${MISSING[@]}" >>"$OUT/env.log" 2>&1 &&
       "$VENV/bin/python" -c "import torch" 2>>"$OUT/env.log"; then
      echo "installed from wheels/ into $VENV (over the machine's packages): ${MISSING[*]}" | tee -a "$OUT/env.log"
      PY="$VENV/bin/python"
    else  # no venv module: diffusers alone, without its dependencies, on PYTHONPATH (as before)
      echo "venv failed (env.log): diffusers from wheels/ on PYTHONPATH only" | tee -a "$OUT/env.log"
      DIFFUSERS_DIR="$(mktemp -d)"
      "$PY" -m pip install --quiet --no-deps --no-index --target "$DIFFUSERS_DIR" wheels/diffusers-*.whl &&
        export PYTHONPATH="$DIFFUSERS_DIR${PYTHONPATH:+:$PYTHONPATH}"
    fi
  fi
fi
"$PY" -c "import xdist" 2>/dev/null && XDIST=(-n 8)
"$PY" -c "
for m in ('diffusers', 'pytest', 'xdist'):
    try:
        print(m, getattr(__import__(m), '__version__', '?'))
    except Exception as e:
        print(m, 'missing:', type(e).__name__, e)
" 2>&1 | tee -a "$OUT/env.log"

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

if [ -n "$NVCC" ]; then
  export CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}"
fi

# ---- a fusegraph wheel (FG_WHEEL) ----
FG_WHEEL="${FG_WHEEL:-auto}"
WHEEL=""
case "$FG_WHEEL" in
  off) ;;
  auto) WHEEL="$("$PY" scripts/packaging/pick_wheel.py wheels 2>>"$OUT/env.log")" || WHEEL="" ;;
  build)
    SKB_ENV=()
    if ! "$PY" -c "import scikit_build_core" 2>/dev/null; then
      SKB_DIR="$(mktemp -d)"
      "$PY" -m pip install --quiet --no-deps --no-index --target "$SKB_DIR" wheels/scikit_build_core-*.whl \
        wheels/pathspec-*.whl wheels/packaging-*.whl 2>&1 | tee -a "$OUT/env.log" && SKB_ENV=(PYTHONPATH="$SKB_DIR")
    fi
    if "$PY" -c "import scikit_build_core" 2>/dev/null || [ "${#SKB_ENV[@]}" -gt 0 ]; then
      rm -rf "$OUT/dist"
      WHEEL_ARGS=(--no-build-isolation --no-deps --no-index --wheel-dir "$OUT/dist")
      [ -z "$NVCC" ] || WHEEL_ARGS+=(-C "cmake.define.NVCC_EXECUTABLE=$NVCC")
      step wheel_build 300 env "${SKB_ENV[@]}" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
        "$PY" -m pip wheel "${WHEEL_ARGS[@]}" .
      WHEEL="$(ls "$OUT"/dist/fusegraph-*.whl 2>/dev/null | head -1)"
    else
      skip wheel_build "no scikit-build-core here and none in wheels/ (make device-wheels): the CMake build"
    fi ;;
  *) WHEEL="$("$PY" scripts/packaging/pick_wheel.py "$FG_WHEEL" 2>>"$OUT/env.log")" ||
       { STATUS=1; WHEEL=""; skip wheel_install "FG_WHEEL=$FG_WHEEL does not fit (env.log): the CMake build"; } ;;
esac
if [ -n "$WHEEL" ]; then
  echo "fusegraph wheel: $WHEEL" | tee -a "$OUT/env.log"
  WHEEL_SITE="$(mktemp -d)"
  step wheel_install 60 "$PY" -m pip install --no-deps --no-index --target "$WHEEL_SITE" "$WHEEL"
  step wheel_smoke 150 env PYTHONPATH="$WHEEL_SITE" "$PY" scripts/packaging/smoke.py "$PWD" --cuda
  rm -f fusegraph/_C*.so fusegraph/libfusegraph_ops.so
  cp "$WHEEL_SITE"/fusegraph/_C*.so "$WHEEL_SITE"/fusegraph/libfusegraph_ops.so fusegraph/ || WHEEL=""
fi

# ---- build (without a wheel) ----
CMAKE_ARGS=(-S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PY")
GENERATOR="$(command -v ninja >/dev/null && echo Ninja || echo 'Unix Makefiles')"
CMAKE_ARGS+=(-G "$GENERATOR")
[ -z "$NVCC" ] || CMAKE_ARGS+=(-DNVCC_EXECUTABLE="$NVCC")
HAVE_GTEST=0
for f in /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/aarch64-linux-gnu/libgtest.a /usr/lib/libgtest.a \
         /usr/local/lib/libgtest.a /usr/lib64/libgtest.a; do
  [ -e "$f" ] && HAVE_GTEST=1
done
[ "$HAVE_GTEST" = 1 ] || CMAKE_ARGS+=(-DFUSEGRAPH_BUILD_TESTS=OFF)
# A cache from another generator or torch would fail the configure: start clean when it does not match.
if [ -f "$BUILD_DIR/CMakeCache.txt" ]; then
  if ! grep "^Python_EXECUTABLE:" "$BUILD_DIR/CMakeCache.txt" | grep -qF "=$PY" ||
     ! grep -qF "CMAKE_GENERATOR:INTERNAL=$GENERATOR" "$BUILD_DIR/CMakeCache.txt"; then
    echo "stale $BUILD_DIR (other python or generator): starting clean"
    rm -rf "$BUILD_DIR"
  fi
fi
if [ -z "$WHEEL" ]; then
  step configure 90 cmake "${CMAKE_ARGS[@]}"
  step build 270 cmake --build "$BUILD_DIR" -j "$JOBS"
fi
step has_cuda 30 "$PY" -c "import fusegraph, torch
assert fusegraph._C.has_cuda_kernels(), 'fusegraph._C was built without CUDA kernels'
assert torch.cuda.is_available(), 'torch sees no CUDA device'
print('fusegraph CUDA kernels: yes')"

# ---- tests and benchmarks, most telling first ----
step cuda_tests 150 "$PY" -m pytest tests/ops/test_cuda_ops.py -q -p no:cacheprovider --durations=10 -rs ${XDIST[@]+"${XDIST[@]}"}
# the CUDA-graph route layer by layer, each stage in a process of its own (the first GPU run lost every process
# that took that route to a segfault: this names the layer, with faulthandler's stack)
step cuda_graph_probe 150 "$PY" scripts/cuda_graph_probe.py

# ---- quick kernel timing (independent of the bench CLI): fused op vs eager vs a copy of the same bytes ----
step cuda_timing 60 "$PY" - "$OUT/cuda_kernel_timing.json" <<'PYEOF'
import json, sys
import torch
import torch.nn.functional as F
import fusegraph  # noqa: F401
ops = torch.ops.fusegraph
dev, bf16 = "cuda", torch.bfloat16
B, S, D, H, HD = 2, 4096, 3072, 24, 128
x = torch.randn(B, S, D, device=dev, dtype=bf16)
w = torch.randn(D, device=dev, dtype=bf16)
emb = torch.randn(B, 1, 6 * D, device=dev, dtype=bf16)
shift, scale, gate = emb.chunk(6, dim=-1)[:3]
y = torch.randn_like(x)
q = torch.randn(B, H, S, HD, device=dev, dtype=bf16)
ang = torch.randn(S, HD, device=dev)
cos, sin = ang.cos(), ang.sin()


def rot_half(t):
    return torch.cat([-t[..., HD // 2:], t[..., :HD // 2]], dim=-1)


# name: (fused, eager, bytes a fused kernel must move: inputs read once + output written once)
cases = {
    "rms_norm": (lambda: ops.rms_norm(x, w, 1e-6), lambda: torch.rms_norm(x, (D,), w, 1e-6), 2 * x.nbytes),
    "adaln": (lambda: ops.adaln(x, scale, shift, 1e-6),
              lambda: F.layer_norm(x, (D,), eps=1e-6) * (1 + scale) + shift, 2 * x.nbytes),
    "adaln_rms": (lambda: ops.adaln(x, scale, shift, 1e-6, norm="rms"),
                  lambda: torch.rms_norm(x, (D,), None, 1e-6) * (1 + scale) + shift, 2 * x.nbytes),
    "adaln_noshift": (lambda: ops.adaln(x, scale, None, 1e-6, weight=w, norm="rms"),
                      lambda: torch.rms_norm(x, (D,), w, 1e-6) * (1 + scale), 2 * x.nbytes),
    "rope_half": (lambda: ops.rope(q, cos, sin, interleaved=False),
                  lambda: (q.float() * cos + rot_half(q).float() * sin).to(bf16), 2 * q.nbytes + 2 * cos.nbytes),
    "gelu_tanh": (lambda: ops.gelu_tanh(x), lambda: F.gelu(x, approximate="tanh"), 2 * x.nbytes),
    "fast_gelu": (lambda: ops.fast_gelu(x), lambda: x * torch.sigmoid(1.702 * x), 2 * x.nbytes),
    "mul_add": (lambda: ops.mul_add(y, gate, x), lambda: x + gate * y, 3 * x.nbytes),
}


def ms(fn, iters=50):
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


results = {}
print(f"{'op':13s} {'fused ms':>9s} {'eager ms':>9s} {'copy ms':>9s} {'fused GB/s':>10s} {'max|diff|':>10s}")
for name, (fused, eager, nbytes) in cases.items():
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=dev)  # copy: reads and writes nbytes in all
    dst = torch.empty_like(src)
    t_f, t_e, t_c = ms(fused), ms(eager), ms(lambda: dst.copy_(src))
    diff = (fused().float() - eager().float()).abs().max().item()
    results[name] = dict(fused_ms=t_f, eager_ms=t_e, copy_ms=t_c, bytes=nbytes, fused_gbps=nbytes / t_f / 1e6,
                         max_abs_diff_vs_eager=diff)
    print(f"{name:13s} {t_f:9.4f} {t_e:9.4f} {t_c:9.4f} {nbytes / t_f / 1e6:10.1f} {diff:10.3g}")
json.dump(dict(device=torch.cuda.get_device_name(0), torch=torch.__version__,
               shapes=dict(B=B, S=S, D=D, H=H, HD=HD), results=results), open(sys.argv[1], "w"), indent=1)
PYEOF

# whole models on CUDA on every route, and the CUDA-graph driver (the tests turn the route on themselves)
step cuda_models 180 "$PY" -m pytest tests/test_cuda_models.py tests/graph/test_cuda_driver.py -q -p no:cacheprovider \
  --durations=10 -rs ${XDIST[@]+"${XDIST[@]}"}
# FLUX.1 at its published width (hidden 3072, 1 double + 1 single block) at 1024x1024 (4096 image + 512 text
# tokens): without CUDA graphs first (a crash of a CUDA-graph variant loses its whole process), then with them
# (Inductor's, and fusegraph's turned on with FUSEGRAPH_CUDA_GRAPHS=1)
step bench_real_cuda 150 "$PY" -m fusegraph bench real --device cuda --model flux --dtype bf16 --tokens 4096,512 \
  --variants "eager;inductor;fusegraph" --interleave 20 --interleave-only --json "$OUT/bench_real_cuda_flux.json"
step bench_real_cuda_graphs 150 env FUSEGRAPH_CUDA_GRAPHS=1 "$PY" -m fusegraph bench real --device cuda --model flux \
  --dtype bf16 --tokens 4096,512 --variants "inductor;inductor_cudagraphs;fusegraph:mode=reduce-overhead" \
  --interleave 20 --interleave-only --json "$OUT/bench_real_cuda_flux_graphs.json"
# Fused AOTInductor packages made and run on CUDA (GUIDE §2.8): correctness, build/load time, steady speed.
step aot_cuda 120 "$PY" scripts/aot_device_check.py --device cuda "$OUT/aot_cuda.json"
step bench_decode 60 env FUSEGRAPH_CUDA_GRAPHS=1 "$PY" -m fusegraph bench decode --device cuda --dtype bfloat16
step bench_ops 60 "$PY" -m fusegraph bench ops --device cuda --json "$OUT/bench_ops_cuda.json"
step bench_decode_mlp 60 "$PY" -m fusegraph bench model --model decode_mlp --device cuda --reps 100
# ---- multi-process (issue #9): NCCL, CUDA graphs with collectives inside, every rank capturing the same graph ----
# 2 ranks when there are >= 2 GPUs; with 1 GPU the NCCL path runs with world size 1 (said in the log).
NGPU="$("$PY" -c "import torch; print(min(2, torch.cuda.device_count()))" 2>/dev/null || echo 0)"
if [ "$NGPU" -ge 1 ]; then
  [ "$NGPU" -ge 2 ] || echo "nccl: one GPU: running the NCCL path with world size 1" | tee -a "$OUT/env.log"
  step nccl 90 env FUSEGRAPH_CUDA_GRAPHS=1 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$NGPU" scripts/nccl_check.py
else
  skip nccl "no CUDA device"
fi
if [ -n "$WHEEL" ]; then
  skip cpp_tests "_C from the wheel, which has no GoogleTest build (FG_WHEEL=off for the C++ tests)"
elif [ "$HAVE_GTEST" = 1 ]; then
  step cpp_tests 60 ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
else
  skip cpp_tests "no GoogleTest (libgtest.a) on this machine"
fi
# the per-site choice's table for this GPU (fused op vs Triton code for the site)
step calibrate 150 "$PY" -m fusegraph bench calibrate --device cuda --families rms_norm,adaln,rope,gelu,mul_add \
  --dtypes bf16 --out "$OUT/cost_cuda.json"
# the CPU side on this machine's torch (the development machine runs them on its own torch)
step graph_tests 120 env FUSEGRAPH_CUDA_GRAPHS=1 "$PY" -m pytest tests/graph -q -p no:cacheprovider -rs ${XDIST[@]+"${XDIST[@]}"}
step op_tests 120 "$PY" -m pytest tests/ops -q -p no:cacheprovider --ignore=tests/ops/test_cuda_ops.py -rs ${XDIST[@]+"${XDIST[@]}"}
step fusion_tests 150 "$PY" -m pytest tests/fusion tests/backend -q -p no:cacheprovider -rs ${XDIST[@]+"${XDIST[@]}"}

# ---- summary ----
{
  echo "=== summary ($(( $(date +%s) - START ))s in all; logs in $OUT)"
  for line in "${SUMMARY[@]}"; do echo "  $line"; done
  grep -hE "^(FAILED|ERROR) " "$OUT"/cuda_tests.log "$OUT"/cuda_models.log "$OUT"/graph_tests.log "$OUT"/op_tests.log \
    "$OUT"/fusion_tests.log 2>/dev/null | head -40
  for t in cuda_tests cuda_models graph_tests op_tests fusion_tests; do
    echo "  $t: $(grep -aE "[0-9]+ (passed|failed|skipped|errors?).* in [0-9.]+s" "$OUT/$t.log" 2>/dev/null | tail -1)"
  done
  [ "$STATUS" = 0 ] && echo "RESULT: all steps passed" || echo "RESULT: some steps failed"
  echo "logs and JSON: $FINAL_OUT/logs.tgz"
} 2>&1 | tee "$OUT/summary.txt"
exit "$STATUS"
