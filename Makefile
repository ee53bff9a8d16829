# Two entry points (see README): `make demo` runs the main job, `make test` the tests.
# Each creates its own virtual environment and installs strata from this checkout.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.strata-installed

.PHONY: demo test lint bench clean

# The main job: what this machine is, then how fast the default synthetic preset runs on
# every backend here (bench measures this host's roofline first if it has none).
demo: $(STAMP)
	$(VENV)/bin/strata probe
	$(VENV)/bin/strata bench

test: $(STAMP)
	sh scripts/install_test_deps.sh
	$(VENV)/bin/ruff check src tests benchmarks
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/probe_vs_reference.py
	$(PY) benchmarks/llamacpp_overhead.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

# The constraints file pins the CPU wheel of torch so a CPU machine does not pull a
# multi-GB CUDA build (GPU users install their own torch first) and the llama-cpp-python
# release known to build here; pip compiles it once (~7 min on 2 cores) and caches the wheel.
$(STAMP): pyproject.toml requirements/cpu-constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -c requirements/cpu-constraints.txt -e '.[torch,llamacpp,kernels,dev]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache
