#!/bin/sh
# One prepared GPU check for a lent device machine (see the device tool's README):
# the GPU-marked tests, then the kernel lab's GPU figures, everything logged under $OUT.
# Runs from the repo root under the machine's own python3 (torch, triton, nvcc there);
# strata's small pure-Python deps missing there are installed from carried wheels
# (.device-wheels/, made here with:
#  pip download platformdirs gguf pyelftools --no-deps -d .device-wheels).
set -u
OUT=${OUT:-/tmp/strata-device-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD" PYTHONUNBUFFERED=1 STRATA_HOME="$OUT/home"
[ -d .device-wheels ] && python3 -m pip install --no-index --no-deps -q .device-wheels/*.whl
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels_gpu.py tests/test_devices.py \
    tests/test_lab_gpu.py \
    -s > "$OUT/gpu_tests.txt" 2>&1
# The confined GPU worker (Landlock allows the toolchain, seccomp keeps exec): its level and
# any sandbox_violation of a built-in kernel show here.
python3 -m strata.cli kernels verify rmsnorm --force > "$OUT/verify_rmsnorm.txt" 2>&1
S="python3 -m strata.cli kernels"
$S verify -o json > "$OUT/verify.json" 2> "$OUT/verify.err"
{
  $S bench matmul --shapes gpu --dtype bfloat16 --no-compile --max-time 1 -o md
  for op in rmsnorm silu_mul; do
    $S bench $op --shapes figure --no-compile --cache warm -o md
  done
  $S bench matvec_q8_0 --shapes figure --no-compile -o md
} > "$OUT/bench.md" 2> "$OUT/bench.err"
# -B lab on the GPU's Triton kernels against torch eager on the same model (no CUDA llama.cpp
# build there): decode and prefill t/s side by side
python3 -m strata.cli bench synthetic:llama-3.2-1b@q8_0 -B lab,torch --device cuda -p 512 -n 64 \
    -r 3 -o md > "$OUT/lab_bench.md" 2> "$OUT/lab_bench.err"
tail -5 "$OUT/gpu_tests.txt"; cat "$OUT/bench.md" "$OUT/lab_bench.md"
