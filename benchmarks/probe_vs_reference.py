"""Side-by-side check of `strata probe --measure` against plain references, in one run.

  python benchmarks/probe_vs_reference.py [--rounds 3]

Bandwidth: strata's STREAM figures vs an independent C triad/copy program that this script
writes and compiles itself (-O3 -march=native -fopenmp, its own clock_gettime timing, same
array size). Matmul: strata's fp32/bf16 figures vs a bare torch.matmul loop at the same
shape. Rounds alternate reference and strata so drift on a shared machine hits both.
Also times the whole `strata probe --measure` command (target: under 60 s).
Prints ratios; asserts nothing (speed goals are benchmarks, not tests).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REFERENCE_C = r"""
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
                          return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    long n = atol(argv[1]); int reps = atoi(argv[2]);
    double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) { a[i] = 1.0; b[i] = 2.0; c[i] = 0.0; }
    double best_copy = 1e30, best_triad = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now();
        #pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) c[i] = a[i];
        t = now() - t; if (r && t < best_copy) best_copy = t;
        t = now();
        #pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) a[i] = b[i] + 3.0 * c[i];
        t = now() - t; if (r && t < best_triad) best_triad = t;
    }
    printf("copy %.3f\ntriad %.3f\n", 16.0 * n / best_copy / 1e9, 24.0 * n / best_triad / 1e9);
    printf("check %g\n", a[n / 2] + c[n / 3]);  /* keep the work observable */
    return 0;
}
"""


def build_reference(workdir: Path) -> Path:
    src, exe = workdir / "triad.c", workdir / "triad"
    src.write_text(REFERENCE_C)
    subprocess.run(["cc", "-O3", "-march=native", "-fopenmp", str(src), "-o", str(exe)],
                   check=True)
    return exe


def run_reference(exe: Path, n: int) -> dict[str, float]:
    out = subprocess.run([str(exe), str(n), "21"], capture_output=True, text=True, check=True)
    return {k: float(v) for k, v in re.findall(r"^(copy|triad) ([\d.]+)$", out.stdout, re.M)}


def torch_matmul_reference(dtype_name: str, n: int, seconds: float = 1.5) -> float:
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    torch.matmul(a, b)
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from strata.hardware.cpu import probe_cpu
    from strata.hardware.microbench import (
        MeasureConfig,
        measure_cpu_bandwidth,
        measure_cpu_matmul,
        stream_elements,
    )

    cpu = probe_cpu()
    config = MeasureConfig.default()
    n = stream_elements(cpu, config.min_array_bytes)
    print(f"machine: {cpu.vendor} {cpu.model}, {cpu.logical_threads} threads, "
          f"LLC {(cpu.last_level_cache_bytes() or 0) >> 20} MiB; arrays {n * 8 >> 20} MiB each")
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_reference(Path(tmp))
        ref: dict[str, float] = {"copy": 0.0, "triad": 0.0}
        ours: dict[str, float] = {"copy": 0.0, "triad": 0.0}
        for _ in range(args.rounds):
            for k, v in run_reference(exe, n).items():
                ref[k] = max(ref[k], v)
            figures, note = measure_cpu_bandwidth(cpu, config)
            for k in ours:
                ours[k] = max(ours[k], figures[k].value)
    print("\nbandwidth (GB/s, best over rounds)    strata   C reference   ratio")
    for k in ("copy", "triad"):
        print(f"  {k:<36} {ours[k]:8.1f}   {ref[k]:11.1f}   {ours[k] / ref[k]:5.2f}"
              f"   (target >= 0.90)")
    if note:
        print(f"  note: {note}")

    figures, unknown = measure_cpu_matmul(cpu, config, lambda _m: None)
    print("\nmatmul (GFLOP/s)                       strata   torch loop    ratio")
    for dtype, fig in figures.items():
        shape = int(re.search(r"(\d+)x", fig.method).group(1))
        ref_v = torch_matmul_reference(dtype, shape)
        print(f"  {dtype} {shape}^3{'':<27} {fig.value:8.1f}   {ref_v:11.1f}   "
              f"{fig.value / ref_v:5.2f}")
    for dtype, why in unknown.items():
        print(f"  {dtype}: {why}")

    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "STRATA_HOME": home}
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "strata.cli", "probe", "--measure",
                               "--json", "--allow-busy"],
                              capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t
    status = "ok" if proc.returncode == 0 else f"FAILED rc={proc.returncode}"
    print(f"\n`strata probe --measure` wall time (fresh STRATA_HOME, includes compiling the "
          f"STREAM kernels and the smoke test): {wall:.1f} s [{status}] (target < 60 s)")


if __name__ == "__main__":
    main()
