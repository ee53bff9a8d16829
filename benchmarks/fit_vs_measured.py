"""`strata fit`'s predicted t/s against what `strata bench` then measures, model by model.

    .venv/bin/python benchmarks/fit_vs_measured.py [--models synthetic:a@q8_0,...]
        [-B llamacpp] [-r 3] [--home DIR]

A fresh STRATA_HOME: the roofline is measured once (`strata probe --measure`); then, for each
model in order, `strata fit MODEL -o json` predicts pp512 and tg128 *before* the model is
benched (its η comes from the models measured before it, or the stated prior for the first),
and `strata bench MODEL -p 512 -n 128` measures them. Nothing is tuned on the figure it is
checked against. Prints, per model and test: predicted t/s (with its range), measured t/s,
predicted / measured - 1; then the median and the largest |error| per phase.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

STRATA = [sys.executable, "-m", "strata.cli"]
MODELS = "synthetic:smollm2-135m@q8_0,synthetic:qwen3-0.6b@q4_k_m,synthetic:llama-3.2-1b@q4_0"


def cli(home: Path, *args: str, timeout: float = 1800) -> Any:
    env = {**os.environ, "STRATA_HOME": str(home), "STRATA_PROGRESS": "0"}
    proc = subprocess.run([*STRATA, *args, "-o", "json"], capture_output=True, text=True,
                          env=env, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"strata {' '.join(args)}: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("-B", "--backend", default="llamacpp")
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--home", type=Path, default=None)
    args = ap.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="strata-fitcheck-"))
    cli(home, "probe", "--measure", timeout=600)
    rows, errors = [], {"prefill": [], "decode": []}
    for model in args.models.split(","):
        fit = cli(home, "fit", model, "-B", args.backend, "--ctx", "640")
        want = {p["test"]: p for p in fit["predictions"]}
        bench = cli(home, "bench", model, "-B", args.backend, "-p", "512", "-n", "128",
                    "-r", str(args.r))
        for rec in bench:
            p = want.get(rec["test"])
            if p is None or not rec["avg_ts"]:
                rows.append((model, rec["test"], None, None, rec["avg_ts"], None,
                             "; ".join(fit["prediction_absent"]) or "no prediction"))
                continue
            err = p["predicted_ts"] / rec["avg_ts"] - 1
            errors[p["phase"]].append(err)
            rows.append((model, rec["test"], p["predicted_ts"],
                         (p["predicted_low_ts"], p["predicted_high_ts"]), rec["avg_ts"], err,
                         f"η {p['eta']:.2g} ({p['eta_basis']})"))
    print(f"home {home}; backend {args.backend}; {args.r} repetitions")
    print(f"{'model':34} {'test':8} {'predicted t/s':>24} {'measured':>10} {'error':>8}")
    for model, test, pred, rng, meas, err, why in rows:
        shown = "-" if pred is None else f"{pred:,.1f} [{rng[0]:,.0f}-{rng[1]:,.0f}]"
        error = "-" if err is None else f"{err:+.0%}"
        print(f"{model:34} {test:8} {shown:>24} {meas or 0:>10,.1f} {error:>8}  {why}")
    for phase, errs in errors.items():
        if errs:
            print(f"{phase}: median |error| {statistics.median(abs(e) for e in errs):.0%}, "
                  f"largest {max(abs(e) for e in errs):.0%} over {len(errs)} test(s)")


if __name__ == "__main__":
    main()
