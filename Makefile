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

# ggml's AMX matmul, which -march=native turns on for Xeons with AMX, segfaults on the first
# q8_0 prompt (ggml_backend_amx_mul_mat; llama.cpp issue #20824, open): on x86_64 llama.cpp
# is built without it (the AVX-512/VNNI paths remain). LLAMA_CMAKE_ARGS= builds it as is.
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
ifeq ($(shell uname -m),x86_64)
LLAMA_CMAKE_ARGS ?= -DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)'
endif
PIP_LLAMA := CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install --quiet \
	-c requirements/cpu-constraints.txt

# The constraints file pins the CPU wheel of torch so a CPU machine does not pull a
# multi-GB CUDA build (GPU users install their own torch first) and the llama-cpp-python
# release known to build here; pip compiles it once (~7 min on 2 cores) and caches the wheel.
# A cached wheel built with AMX (before the flags above) is dropped and rebuilt once.
$(STAMP): pyproject.toml requirements/cpu-constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PIP_LLAMA) -e '.[torch,llamacpp,kernels,dev,notebook]'
	$(PY) scripts/llamacpp_amx.py || { $(PY) -m pip cache remove llama_cpp_python; \
		$(PIP_LLAMA) --force-reinstall --no-deps llama-cpp-python; }
	touch $(STAMP)

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache
