# Two commands a newcomer needs: `make demo` and `make test`. Each installs what it needs.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# Never put the working directory on sys.path: the folder operator/ would shadow the
# standard library's `operator` module.
export PYTHONSAFEPATH := 1
# Every Python process of the tests (servers, CLI, FUSE, CSI) would otherwise compile its
# imports from source each time it starts (~1.5 s of CPU each) where the environment sets this.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv protos deps-system test test-unit test-integration test-e2e e2e-tools test-tools e2e-images e2e-images-python e2e-images-bin lint install-yaml demo clean lock

# Every Python package at the version pinned in requirements.lock (scripts/lock.sh makes it
# from pyproject.toml): no resolving, the same versions as the images and CI.
LOCK := requirements.lock
# uv installs them (16 s with its cache warm, where pip took 80 s); the venv keeps pip for
# whoever wants it.
UV_VERSION := 0.13.9
UV_INSTALL = $(VENV)/bin/uv pip install --python $(PY) --quiet --constraint $(LOCK) --build-constraint $(LOCK)
$(VENV)/.installed: pyproject.toml setup.py contract/proto/strata.proto $(LOCK) native/Cargo.toml native/Cargo.lock native/src/lib.rs
	test -x $(PY) || python3 -m venv $(VENV)
	test -x $(VENV)/bin/uv || $(PY) -m pip install --quiet uv==$(UV_VERSION)
	$(UV_INSTALL) grpcio-tools mypy-protobuf setuptools wheel setuptools-rust
	PYTHON=$(PY) scripts/gen_protos.sh
	$(UV_INSTALL) --compile-bytecode -e '.[test]'
	$(PY) -m compileall -q -j0 cacheserver operator contract tests bench scripts > /dev/null
	touch $@

# Re-pin requirements.lock after changing the dependencies in pyproject.toml.
lock:
	scripts/lock.sh

venv: $(VENV)/.installed

protos: venv
	PYTHON=$(PY) scripts/gen_protos.sh

# Debian packages the tests use: fuse3 (FUSE mounts), iproute2 (network namespaces).
deps-system:
	scripts/install-system-deps.sh

# Everything: unit, integration (real processes) and end-to-end (a real Kubernetes control
# plane and kubelets built from Go modules into ~/.cache/strata/e2e-bin on first use). Two
# pytest runs side by side (scripts/run-suites.py, standard library only, so it starts before
# the venv exists): one makes the venv, then lints and builds helm and csi-sanity, then runs
# unit + integration; the other builds what the e2e cluster needs meanwhile (at the lowest CPU
# priority, so a cold compile does not slow the timing-bound tests), then runs the e2e suite
# once the venv is there (it does not wait for the lint).
# (No --output-sync for that make: it would hold a build's lines until the build ends; the
# build scripts print whole lines, so their lines interleave readably.)
test: deps-system
	python3 -P scripts/run-suites.py \
	  --suite unit+integration --prepare '$(MAKE) --no-print-directory venv' \
	    --prepare '$(MAKE) --no-print-directory -j2 lint test-tools' --python $(PY) \
	  -- --durations=20 tests/unit tests/integration \
	  --suite e2e --prepare '$(MAKE) --no-print-directory -j2 e2e-images' --nice 19 \
	  --after unit+integration --python $(PY) -- --durations=20 tests/e2e

# mypy --strict over the package, and the import contracts (layers) in pyproject.toml.
# (The stubs are the venv's, made again when the .proto changes: `make test` runs this while
# the e2e suite already imports them, so it must not rewrite them.)
lint: venv
	PYTHON=$(abspath $(PY)) scripts/typecheck.sh
	cd /tmp && $(abspath $(VENV))/bin/lint-imports --config $(abspath pyproject.toml)

test-unit: venv protos
	$(VENV)/bin/pytest tests/unit

test-integration: venv protos
	$(VENV)/bin/pytest tests/integration

e2e-tools:
	tests/e2e/tools/build.sh

# The two binaries the unit and integration tests use (`helm template` of the chart,
# csi-sanity against the plugin), built first: on a cold machine the whole of e2e-tools
# takes a quarter of an hour.
test-tools:
	tests/e2e/tools/build.sh helm csi-sanity

# The e2e images (a Debian base, both Dockerfiles, pause, CoreDNS, the CSI registrar) into
# ~/.cache/strata/e2e-images, rebuilt only when their inputs change. The Python ones need no
# Go binary: with -j they build while tools/build.sh compiles.
e2e-images: e2e-images-python e2e-images-bin

e2e-images-python: deps-system
	tests/e2e/images/build.sh server operator

# After the Python ones: both would otherwise make a missing base image at once.
e2e-images-bin: deps-system e2e-tools e2e-images-python
	tests/e2e/images/build.sh pause coredns csi-registrar

# manifests/install.yaml from the chart (a unit test fails when it is stale).
install-yaml: e2e-tools
	scripts/render-install.sh

test-e2e: venv deps-system protos e2e-tools e2e-images
	$(VENV)/bin/pytest tests/e2e

demo: venv deps-system protos
	$(PY) -P scripts/demo.py $(DEMO_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info

# Benchmarks (bench/README.md): as root, needs network namespaces and tc. BENCH_ARGS passes flags.
.PHONY: bench bench-quick
bench: venv protos
	$(UV_INSTALL) -e '.[bench]'
	$(PY) -P bench/run.py $(BENCH_ARGS)

bench-quick: venv protos
	$(UV_INSTALL) -e '.[bench]'
	$(PY) -P bench/run.py --quick $(BENCH_ARGS)
