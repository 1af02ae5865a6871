# The README's two commands: `make demo` and `make test`. Both set up everything on a fresh machine:
# .venv (pinned requirements, torch==2.13.0 CPU), GoogleTest (Debian's libgtest-dev), the C++ extension.
SHELL := /bin/bash
PYTHON_BOOT ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUILD_DIR ?= build
JOBS ?= 2
DEPS_STAMP := $(VENV)/.fusegraph-deps

.PHONY: all demo test test-zoo build venv system-deps cpp-test pytest bench device-wheels clean

all: build

$(PY):
	$(PYTHON_BOOT) -m venv $(VENV)

$(DEPS_STAMP): requirements.txt pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
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

cpp-test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

pytest: build
	$(PY) -m pytest tests

test: cpp-test
	$(PY) -m pytest tests

# The full model zoo (tests/zoo): every diffusers transformer class on every route; `make test` runs its fast tier.
test-zoo: build
	FUSEGRAPH_ZOO=full $(PY) -m pytest tests/zoo

demo: build
	$(PY) -m fusegraph demo

bench: build
	$(PY) -m fusegraph bench ops

# The GPU machine has no network and no diffusers: scripts/device_check.sh installs this wheel when carried.
device-wheels: $(DEPS_STAMP)
	$(PY) -m pip download --quiet --no-deps --dest wheels "diffusers==$$(sed -n 's/^diffusers==//p' requirements.txt)"

clean:
	rm -rf $(BUILD_DIR) fusegraph/_C*.so
