"""Time the kernel judge adds to `strata kernels bench`, measured side by side in one run.

Runs the same `strata kernels bench OPS --shapes figure --no-compile` with this checkout and
with an older commit (default: the last one before the judge), alternating, each in a fresh
STRATA_HOME seeded with one shared roofline (so neither pays for measuring it). Verification
is included: it is part of what `kernels bench` does for a never-verified kernel.

    python benchmarks/kernels_judge_overhead.py --before a4aa684 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(src: Path, home: Path, seed_db: Path, ops: list[str], max_time: float) -> float:
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    shutil.copy(seed_db, home / "strata.db")
    env = {**os.environ, "STRATA_HOME": str(home), "PYTHONPATH": str(src)}
    started = time.perf_counter()
    for op in ops:
        proc = subprocess.run([sys.executable, "-m", "strata.cli", "kernels", "bench", op,
                               "--shapes", "figure", "--no-compile", "--max-time",
                               str(max_time), "-o", "json"], env=env, capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{src}: kernels bench {op} failed: {proc.stderr[-500:]}")
    return time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="a4aa684", help="git ref without the judge")
    ap.add_argument("--ops", default="rmsnorm,silu_mul")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-time", type=float, default=0.2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="strata-judge-bench-"))
    before = work / "before"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before),
                    args.before], check=True, capture_output=True)
    try:
        seed = work / "seed"
        env = {**os.environ, "STRATA_HOME": str(seed), "PYTHONPATH": str(ROOT / "src")}
        subprocess.run([sys.executable, "-m", "strata.cli", "probe", "--measure",
                        "--allow-busy", "--no-smoke"], env=env, check=True,
                       capture_output=True)
        ops = args.ops.split(",")
        times: dict[str, list[float]] = {"before": [], "after": []}
        for r in range(args.rounds):
            for arm, src in (("before", before / "src"), ("after", ROOT / "src")):
                t = _run(src, work / arm, seed / "strata.db", ops, args.max_time)
                times[arm].append(t)
                print(f"round {r + 1} {arm:6s} {t:7.1f} s", flush=True)
        b, a = statistics.median(times["before"]), statistics.median(times["after"])
        print(f"kernels bench {','.join(ops)} --shapes figure --no-compile: "
              f"before {b:.1f} s, after {a:.1f} s, ratio after/before {a / b:.2f}")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)],
                       capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
