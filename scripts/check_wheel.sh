#!/usr/bin/env bash
# The wheel as a user gets it: `pip wheel --no-build-isolation` against the build environment's torch, installed
# into a fresh venv that has nothing but the same torch, then used from a folder outside the checkout:
# scripts/packaging/smoke.py (backend by name through the entry point, the installed copy and its package data,
# the ops against float64) and `python -m fusegraph --help`.
# Usage (repo root):  scripts/check_wheel.sh [--from-source]
#   --from-source   also `pip install --no-build-isolation .` into that venv and check again (a second build)
#   PYTHON  the build environment (default .venv/bin/python): has torch and scikit-build-core (requirements.txt)
#   WORK    scratch folder (default: a new temporary one, removed at the end); the wheel is left in $WORK/dist
set -euo pipefail

cd "$(dirname "$0")/.."
REPO="$PWD"
PY="${PYTHON:-$REPO/.venv/bin/python}"
FROM_SOURCE=0
for arg in "$@"; do
  case "$arg" in
    --from-source) FROM_SOURCE=1 ;;
    *) echo "usage: scripts/check_wheel.sh [--from-source]" >&2; exit 2 ;;
  esac
done
if [ -z "${WORK:-}" ]; then
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
fi
START=$(date +%s)
say() { echo "check_wheel [$(( $(date +%s) - START ))s] $*"; }

TORCH_VERSION="$("$PY" -c "from importlib.metadata import version; print(version('torch'))")"
say "building the wheel against torch $TORCH_VERSION ($PY)"
rm -rf "$WORK/dist"
"$PY" -m pip wheel --quiet --no-build-isolation --no-deps --wheel-dir "$WORK/dist" "$REPO"
WHEEL="$(ls "$WORK"/dist/fusegraph-*.whl)"
say "built $(basename "$WHEEL")"

# A fresh venv from the same interpreter, with the same torch (its dependencies at requirements.txt's pins).
"$("$PY" -c "import sys; print(sys._base_executable)")" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install --quiet -c "$REPO/requirements.txt" "torch==$TORCH_VERSION"
"$VPY" -m pip install --quiet "$WHEEL"  # resolves the wheel's torch requirement against that torch
"$VPY" -m pip check
say "installed into $WORK/venv"

run_checks() {
  mkdir -p "$WORK/elsewhere"
  (cd "$WORK/elsewhere" && "$VPY" "$REPO/scripts/packaging/smoke.py" "$REPO" &&
     "$VPY" -m fusegraph --help | grep -q "usage: python -m fusegraph .*demo")
  say "$1: smoke checks and python -m fusegraph --help passed"
}
run_checks "wheel"

if [ "$FROM_SOURCE" = 1 ]; then
  "$VPY" -m pip install --quiet -c "$REPO/requirements.txt" scikit-build-core
  "$VPY" -m pip uninstall --quiet --yes fusegraph
  "$VPY" -m pip install --quiet --no-build-isolation "$REPO"
  run_checks "pip install --no-build-isolation ."
fi
say "all passed"
