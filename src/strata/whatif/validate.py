"""Predict the published measurements the fit never saw, and say how far off it is.

Rows marked "holdout" in the shipped measurements are predicted from the class fits of the
rows marked "fit" (strata.whatif.published) — the same path `strata whatif` takes for a
device without DB results. Error = |predicted ÷ measured - 1|, summarised per device class
and phase as median and 90th percentile; the goal (issue 29) is median ≤ 20 % and p90 ≤ 40 %
for decode of models larger than the device's cache.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from strata.whatif.provenance import Evidence
from strata.whatif.published import PublishedRow, fit_published, load_rows, points_of


@dataclass(frozen=True)
class Checked:
    row: PublishedRow
    predicted_tps: float
    tier: str
    larger_than_cache: bool

    @property
    def error(self) -> float:
        return abs(self.predicted_tps / self.row.tps - 1)


@dataclass(frozen=True)
class Summary:
    device_class: str
    phase: str
    n: int
    median: float
    p90: float
    tier: str


def check(rows: list[PublishedRow] | None = None) -> list[Checked]:
    all_rows, _ = load_rows()
    held = rows if rows is not None else [r for r in all_rows if r.split == "holdout"]
    evidence = Evidence(fit_published())
    points, _ = points_of(held)
    out = []
    for p in points:
        dev = p.row.device
        speed = evidence.speed(dev, p.row.phase, p.dtype)
        big = not dev.cache_bytes or p.bytes_per_token > dev.cache_bytes
        out.append(Checked(p.row, speed.tps(p.ideal_s), speed.tier, big))
    return out


def p90(values: list[float]) -> float:
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    return statistics.quantiles(s, n=10, method="inclusive")[-1]


def summarise(checked: list[Checked]) -> list[Summary]:
    out = []
    keys = sorted({(c.row.device.device_class, c.row.phase) for c in checked})
    for cls, phase in keys:
        mine = [c for c in checked if c.row.device.device_class == cls and c.row.phase == phase
                and (phase != "decode" or c.larger_than_cache)]
        if not mine:
            continue
        errs = [c.error for c in mine]
        out.append(Summary(cls, phase, len(mine), statistics.median(errs), p90(errs),
                           mine[0].tier))
    return out
