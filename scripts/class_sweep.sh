#!/usr/bin/env bash
# One table per CPU class (BENCHMARKS §1.5): the three published-width models in both dtypes under each class this
# machine can run (its own and the emulated ones, `python -m fusegraph --cpu-class C`), 1 thread unless THREADS says.
#
#   CLASSES="native avx512_bf16 avx512 avx2" MODELS="flux wan sd35" DTYPES="fp32 bf16" scripts/class_sweep.sh
#   THREADS=2 CLASSES=native scripts/class_sweep.sh        # the OpenMP team of 2 (files ..._t2_...)
#   MODE=memory CLASSES=... scripts/class_sweep.sh
#   MODE=memory LAYERS=15 MODELS=wan scripts/class_sweep.sh   # at Wan 2.1 1.3B's published depth, 30 blocks (..._mem_x15)
#   RESULTS=/tmp/mine CLASSES=native scripts/class_sweep.sh   # your machine, into a folder of your own; then
#   RESULTS=/tmp/mine .venv/bin/python scripts/bench_real_tables.py --classes
#
# MODE=speed (default): every variant in one process, ROUNDS interleaved rounds (order rotated each round), into
# docs/results/bench_real_MODEL_DTYPE_tTHREADS_class_KEY.{json,txt}. MODE=memory: Inductor and fusegraph each in a process
# of its own (resident memory beyond the model, first call, error), into ..._class_KEY_mem.{json,txt}. KEY is the
# class as the process reports it (vendor and ISA: intel_amx, intel_avx2, amd_avx512_bf16...), so sweeps on other
# machines add files beside these; docs/results/class_sweep_KEY.txt records the machine, the caps, the commit and
# the date, and scripts/bench_real_tables.py --classes prints the tables. A run whose file exists is skipped, so an
# interrupted sweep resumes; RUN=b (c, ...) adds a repeat beside the first run (files ..._b), which the tables pool
# with it: speeds over every round, memory the median over the processes. LAYERS=N (default 1) builds N blocks of
# each kind (bench real --layers) and tags the files _xN: the tables judge a cell's memory at the deepest such run,
# since the target's allowance is 5 % of the weights and the stand-in's two blocks hold less than the fixed costs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CLASSES=${CLASSES:-native avx512_bf16 avx512 avx2}
MODELS=${MODELS:-flux wan sd35}
DTYPES=${DTYPES:-fp32 bf16}
ROUNDS=${ROUNDS:-5}
MODE=${MODE:-speed}
RUN=${RUN:-}
THREADS=${THREADS:-1}
LAYERS=${LAYERS:-1}
# where the files go (and where a run's existing file is skipped); a user measuring the shipped defaults on their
# own machine names a folder of their own, since docs/results already holds the classes the developers measured
RESULTS=${RESULTS:-docs/results}
mkdir -p "$RESULTS"
case "$LAYERS" in [1-9]|[1-9][0-9]) ;; *) echo "LAYERS: expected a block count, got '$LAYERS'" >&2; exit 2 ;; esac
depth=$([ "$LAYERS" = 1 ] || echo "_x$LAYERS")
case "$THREADS" in [1-9]|[1-9][0-9]) ;; *) echo "THREADS: expected a thread count, got '$THREADS'" >&2; exit 2 ;; esac
tag=$([ "$THREADS" = 1 ] || echo " t$THREADS")
case "$RUN" in ""|[b-z]) ;; *) echo "RUN: expected empty or one letter b-z, got '$RUN'" >&2; exit 2 ;; esac
case "$MODE" in
    speed) VARIANTS=${VARIANTS:-eager;inductor;inductor_tuned;fusegraph;openvino}; suffix=""
           how=(--interleave "$ROUNDS" --interleave-only) ;;
    memory) VARIANTS=${VARIANTS:-inductor;fusegraph}; suffix=_mem; how=(--reps 1) ;;
    *) echo "MODE: expected speed or memory, got '$MODE'" >&2; exit 2 ;;
esac

for cls in $CLASSES; do
    if [ "$cls" = native ]; then cap=(); else cap=(--cpu-class "$cls"); fi
    # the class and the caps as a process started with them reports (GenuineIntel/avx2 -> intel_avx2)
    info=$("$PY" -c '
import os, subprocess, sys
from fusegraph._core import cpu_class
caps = {} if sys.argv[1] == "native" else cpu_class.environment(sys.argv[1])
probe = "from fusegraph._core import cpu_class; print(cpu_class.key())"
key = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **caps}, capture_output=True, text=True,
                     check=True).stdout.strip()
print(key, " ".join(f"{k}={v}" for k, v in sorted(caps.items())) or "(none: the machine'"'"'s own class)")
' "$cls")
    full=${info%% *}; caps=${info#* }
    key=$(echo "$full" | sed -e 's#GenuineIntel/#intel_#' -e 's#AuthenticAMD/#amd_#' -e 's#/#_#g')
    manifest=$RESULTS/class_sweep_${key}.txt
    {
        echo "class $full; caps: $caps"
        echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores" \
             "($(grep -m1 -o -w -e avx512_bf16 -e amx_bf16 /proc/cpuinfo | tr '\n' ' ')flags of note)"
        echo "torch $("$PY" -c 'import torch; print(torch.__version__)'); each run's commit below"
    } > "/tmp/class_sweep_$key.head"
    for model in $MODELS; do
        for dtype in $DTYPES; do
            out=$RESULTS/bench_real_${model}_${dtype}_t${THREADS}_class_${key}${suffix}${depth}${RUN:+_$RUN}
            if [ -s "$out.json" ]; then echo "skip $out (exists)"; continue; fi
            [ -s "$manifest" ] || cp "/tmp/class_sweep_$key.head" "$manifest"
            echo "== $(date -u +%H:%M:%S) $key $model $dtype $MODE -> $out"
            dirty=$(git diff --quiet HEAD -- fusegraph csrc 2>/dev/null || echo ', fusegraph/ or csrc/ modified')
            echo "$(date -u '+%Y-%m-%d %H:%M') UTC: $model $dtype $MODE$tag${depth:+ x$LAYERS}${RUN:+ $RUN} ($(git rev-parse --short HEAD)$dirty)" \
                >> "$manifest"
            OMP_NUM_THREADS=$THREADS "$PY" -m fusegraph "${cap[@]}" bench real --model "$model" --dtype "$dtype" \
                --threads "$THREADS" --layers "$LAYERS" "${how[@]}" --variants "$VARIANTS" --json "$out.json" | tee "$out.txt" \
                || echo "exit status $? (a variant failed; the JSON keeps what ran)"
        done
    done
done
