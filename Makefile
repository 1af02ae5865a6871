# The README's two commands: `make demo` and `make test`. Both set up everything on a fresh machine:
# .venv (pinned requirements, torch==2.13.0 CPU), GoogleTest (Debian's libgtest-dev), the C++ extension.
SHELL := /bin/bash
PYTHON_BOOT ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUILD_DIR ?= build
JOBS ?= 2
# pytest runs in $(JOBS) worker processes (pytest-xdist), each on one OpenMP thread: two 2-thread teams on two cores
# stall each other. Tests that check the kernels' split between threads set their own count (tests/helpers.py).
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -n $(JOBS)
DEPS_STAMP := $(VENV)/.fusegraph-deps

.PHONY: all demo test test-full test-zoo test-pipelines build venv system-deps cpp-test pytest bench wheel wheel-check cross-check device-wheels clean

all: build

$(PY):
	$(PYTHON_BOOT) -m venv $(VENV)

# The checkout is used in place: `make build` puts fusegraph/_C*.so next to the Python files. The editable install
# only registers it with the venv (fusegraph importable from anywhere, the torch_dynamo_backends entry point);
# wheel.cmake=false: no second build of the extension (scikit-build-core would build it in its own folder).
$(DEPS_STAMP): requirements.txt pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -C wheel.cmake=false -C editable.mode=inplace -e .
	touch $@

venv: $(DEPS_STAMP)

# GoogleTest has no source other than Debian's package here; install it when missing (root on these machines).
system-deps:
	@if [ ! -e /usr/lib/x86_64-linux-gnu/libgtest.a ] && [ ! -e /usr/lib/aarch64-linux-gnu/libgtest.a ] && \
	    [ ! -e /usr/lib/libgtest.a ] && [ ! -e /usr/local/lib/libgtest.a ]; then \
	  echo "installing libgtest-dev"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq libgtest-dev >/dev/null; \
	fi

build: $(DEPS_STAMP) system-deps
	@GEN=$$(command -v ninja >/dev/null && echo "-G Ninja"); \
	if [ ! -f $(BUILD_DIR)/CMakeCache.txt ]; then \
	  cmake -S . -B $(BUILD_DIR) $$GEN -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(abspath $(PY)) >/dev/null; \
	fi
	cmake --build $(BUILD_DIR) -j $(JOBS)
	@# the pattern families' search patterns, traced once here rather than in every process (fusion/traced.py)
	OMP_NUM_THREADS=1 $(PY) -c "from fusegraph.fusion import passes; passes.ship_patterns(['--if-stale'])"

cpp-test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

pytest: build
	$(PYTEST) tests

# 64-bit ARM, from an x86-64 machine: the C++ side cross-built with Debian's aarch64 GCC against PyPI's aarch64 torch,
# and the C++ tests run under qemu-user as a Neoverse N1 (scripts/cross_check.sh; ~3 min, ~1 GB under build-aarch64).
cross-check: $(DEPS_STAMP)
	JOBS=$(JOBS) PY=$(abspath $(PY)) scripts/cross_check.sh

# wheel-check and cross-check before pytest: pytest's summary stays the last line.
test: cpp-test wheel-check cross-check
	$(PYTEST) tests

# Every tier: the cases `make test` leaves to it (marker `full`), the full zoo and every pipeline on every route.
test-full: build
	FUSEGRAPH_TESTS=full FUSEGRAPH_ZOO=full FUSEGRAPH_PIPELINES=full $(PYTEST) tests

# The full model zoo (tests/zoo): every diffusers transformer class on every route; `make test` runs its fast tier.
test-zoo: build
	FUSEGRAPH_ZOO=full $(PYTEST) tests/zoo

# Whole diffusers pipelines (tests/pipelines): Flux, SD3 and Wan on every route; `make test` runs its fast tier.
test-pipelines: build
	FUSEGRAPH_PIPELINES=full $(PYTEST) tests/pipelines

demo: build
	$(PY) -m fusegraph demo

bench: build
	$(PY) -m fusegraph bench ops

# The wheel users get (pyproject.toml: scikit-build-core runs CMakeLists.txt against the venv's torch, no tests).
wheel: $(DEPS_STAMP)
	$(PY) -m pip wheel --no-build-isolation --no-deps --wheel-dir dist .

# That wheel built, installed into a fresh venv with only the same torch and used from outside the checkout.
wheel-check: $(DEPS_STAMP)
	PYTHON=$(abspath $(PY)) scripts/check_wheel.sh

# The GPU machine has no network (and Python 3.12): scripts/device_check.sh installs what it lacks of diffusers,
# pytest and pytest-xdist (and their dependencies, at requirements.txt's pins) from this folder into a venv over the
# machine's own packages, and can build the fusegraph wheel there with the carried scikit-build-core.
DEVICE_PY ?= 3.12
device-wheels: $(DEPS_STAMP)
	mkdir -p wheels && grep -v '^torch==' requirements.txt > wheels/constraints.txt
	$(PY) -m pip download --quiet --dest wheels --python-version $(DEVICE_PY) --only-binary=:all: \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -c wheels/constraints.txt diffusers pytest pytest-xdist scikit-build-core

clean:
	rm -rf $(BUILD_DIR) build-aarch64 dist fusegraph/_C*.so fusegraph/libfusegraph_ops.so
