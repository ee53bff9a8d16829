"""`strata whatif`'s predictor against published measurements it was not fitted on.

    .venv/bin/python benchmarks/whatif_validation.py [--rows]

The shipped measurements (src/strata/hardware/data/catalogue/measurements.json) are split
once, in the data file: "fit" rows (Llama 3 8B Q4_K_M and F16 from XiongjieDai/GPU-
Benchmarks-on-LLM-Inference) fit η and c per device class; "holdout" rows (the same source's
70B figures, and every row of every other source: llama.cpp scoreboards and PRs, Strix Halo
logs, user submissions) are only predicted. Prints, per device class and phase, the median
and the 90th percentile of |predicted / measured - 1| (decode: models larger than the
device's cache) and, with --rows, every held-out row. Nothing here is timed.
"""

from __future__ import annotations

import argparse

from strata.whatif.published import shipped_fit
from strata.whatif.validate import check, summarise


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", action="store_true", help="print every held-out row")
    args = ap.parse_args()
    print("class fits (rows marked 'fit'):")
    for fit in shipped_fit().fits.values():
        print(f"  {fit.device_class:<11} {fit.phase:<8} {fit.basis}")
    checked = check()
    print(f"\nheld-out rows predicted: {len(checked)}")
    print(f"{'class':<11} {'phase':<8} {'n':>3} {'median':>7} {'p90':>6}  η from")
    for s in summarise(checked):
        print(f"{s.device_class:<11} {s.phase:<8} {s.n:>3} {s.median:>7.0%} {s.p90:>6.0%}  "
              f"{s.tier}")
    if args.rows:
        for c in sorted(checked, key=lambda c: -c.error):
            r = c.row
            print(f"  {r.device.id:<22} {r.model:<14} {r.quant:<7} {r.test:<7} measured "
                  f"{r.tps:>9.1f}  predicted {c.predicted_tps:>9.1f}  {c.error:>5.0%}  "
                  f"{c.tier}")


if __name__ == "__main__":
    main()
