"""Issue figures for `strata bench` on this machine, in one run:

  python benchmarks/bench_presets.py [--presets smollm2-135m,qwen2.5-0.5b] [--quants q8_0,f16]

1. t/s and η of each synthetic preset x quant on llamacpp and torch (pp512, tg128), with the
   decode ceiling from this host's measured bandwidth — η is the side-by-side ratio.
2. Wall time of the README main job (`strata probe` then `strata bench`) in a fresh
   STRATA_HOME, i.e. including the roofline measurement and writing the synthetic model.
Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def strata(*args: str, home: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STRATA_HOME": home}
    return subprocess.run([sys.executable, "-m", "strata.cli", *args], capture_output=True,
                          text=True, env=env)


def presets_table(presets: list[str], quants: list[str], home: str) -> None:
    models = [f"synthetic:{p}@{q}" for p in presets for q in quants]
    proc = strata("bench", *models, "-B", "llamacpp,torch", "-p", "512", "-n", "128",
                  "-o", "json", home=home)
    if proc.returncode != 0:
        print(proc.stderr)
        return
    print(f"{'model':<32} {'backend':<9} {'test':<6} {'t/s':>9} {'± sd':>7} {'ceiling':>9} "
          f"{'η':>5}  bound    runtime weights")
    for r in json.loads(proc.stdout):
        ceiling = r["prefill_ceiling_ts"] if r["test"].startswith("pp") else r[
            "decode_ceiling_ts"]
        eta = f"{r['eta']:.2f}" if r["eta"] is not None else "-"
        print(f"{r['model_filename']:<32} {r['backend']:<9} {r['test']:<6} {r['avg_ts']:9.1f} "
              f"{r['stddev_ts']:7.1f} {ceiling or 0:9.1f} {eta:>5}  {r['bound'] or '-':<8} "
              f"{(r['bytes_per_token'] or 0) / 2**20:.0f} MiB/token")
    for line in sorted({n for r in json.loads(proc.stdout) for n in r["notes"]}):
        print(f"  note: {line}")


def main_job_time() -> None:
    with tempfile.TemporaryDirectory() as home:
        t0 = time.perf_counter()
        probe = strata("probe", home=home)
        bench = strata("bench", home=home)
        wall = time.perf_counter() - t0
    ok = probe.returncode == 0 and bench.returncode == 0
    print(f"\nREADME main job (strata probe; strata bench) in a fresh STRATA_HOME: {wall:.0f} s "
          f"[{'ok' if ok else 'FAILED'}] (target < 180 s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="smollm2-135m,qwen2.5-0.5b")
    ap.add_argument("--quants", default="q8_0,f16")
    ap.add_argument("--skip-main-job", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as home:
        presets_table(args.presets.split(","), args.quants.split(","), home)
    if not args.skip_main_job:
        main_job_time()


if __name__ == "__main__":
    main()
