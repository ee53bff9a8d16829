"""Published measurements shipped with the catalogue, and what they teach per device class.

Each row is one figure someone published (device, backend, model, quant, test, t/s, source).
strata recomputes the bytes and FLOPs per token of that model with the same arithmetic as
every bench explanation, on the device's datasheet roofline, and fits per device class:

- decode: t = x/η + c, x = bytes per token ÷ datasheet bandwidth (the time a token would
  take at the full datasheet rate), t = 1/measured t/s; η is the share of the datasheet
  bandwidth the class reaches, c the fixed per-token cost (kernel launches, sync, sampling;
  it dominates small models). Least squares on the rows marked "fit"; η ≤ 1 and c ≥ 0.
- prefill: η = measured ÷ the roofline ceiling (compute-bound at these sizes), median.

Rows marked "holdout" never enter a fit: `strata whatif --validate` predicts them.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from strata.bench.explain import explain
from strata.bench.scenario import BenchTest
from strata.errors import InputError
from strata.hardware.catalogue import (
    CATALOGUE_DIR,
    MEASUREMENTS_FILE,
    CatalogueDevice,
    load_catalogue,
)
from strata.whatif.device import roofline

RANGE_QUANTILES = (0.1, 0.9)  # a fit's range: these quantiles of measured ÷ predicted
MIN_PREFILL_DEVICES = 2  # devices a class's prefill η is fitted from, at least


@dataclass(frozen=True)
class PublishedRow:
    device: CatalogueDevice
    backend: str
    model: str
    quant: str
    test: str
    phase: str
    tps: float
    source: str
    split: str  # "fit" or "holdout"
    note: str = ""

    @property
    def ref(self) -> str:
        return f"synthetic:{self.model}@{self.quant.lower()}"


@dataclass(frozen=True)
class Point:
    """A published row with its physics: `ideal_s`, seconds per token at the datasheet
    roofline's ceiling (decode: bytes/token ÷ bandwidth unless the FLOPs are slower)."""

    row: PublishedRow
    ideal_s: float
    bytes_per_token: float
    dtype: str | None = None  # the compute roof's dtype (prefill's η differs per dtype)

    @property
    def measured_s(self) -> float:
        return 1.0 / self.row.tps


@lru_cache(maxsize=4)
def load_rows(folder: Path = CATALOGUE_DIR) -> tuple[tuple[PublishedRow, ...], tuple[str, ...]]:
    """The rows whose device is in the catalogue, and one line per row left out (device
    not in the catalogue, model or quant strata cannot shape)."""
    path = folder / MEASUREMENTS_FILE
    if not path.exists():
        return (), ()
    raw = json.loads(path.read_text(encoding="utf-8"))
    by_id = {d.id: d for d in load_catalogue(folder)}
    rows, skipped = [], []
    for r in raw.get("rows", []):
        dev = by_id.get(r["device"])
        if dev is None:
            skipped.append(f"{r['device']}: not in the catalogue")
            continue
        rows.append(PublishedRow(dev, r["backend"], r["model"], r["quant"], r["test"],
                                 r["phase"], float(r["tps"]), r["source"],
                                 r.get("split", "holdout"), r.get("note", "")))
    return tuple(rows), tuple(skipped)


def _test(name: str) -> BenchTest:
    """'tg128' / 'pp512' (llama-bench's names; a published figure has no depth)."""
    n = int(name[2:])
    return BenchTest(n, 0) if name.startswith("pp") else BenchTest(0, n)


@lru_cache(maxsize=512)
def _spec(ref: str) -> Any:
    from strata.models.source import resolve

    return resolve(ref).spec


def point(row: PublishedRow) -> Point | None:
    """The row's physics, or None where strata cannot shape its model or quant."""
    try:
        spec = _spec(row.ref)
    except InputError:
        return None
    if row.phase == "prefill" and not row.device.tflops:
        return None  # no sourced FLOP/s: prefill has no ceiling to compare against
    ex = explain(spec, _test(row.test), roofline(row.device), "f16", None, achieved={})
    ceiling = ex.decode_ceiling_tps if row.phase == "decode" else ex.prefill_ceiling_tps
    dtype = ex.compute_dtype if row.phase == "prefill" else None
    return Point(row, 1.0 / ceiling, ex.bytes_per_token, dtype) if ceiling else None


@dataclass(frozen=True)
class ClassFit:
    """η and c of one device class and phase, from published rows."""

    device_class: str
    phase: str
    dtype: str | None  # prefill: the compute dtype the fit is for; decode: None
    eta: float
    c_s: float  # fixed seconds per token (decode); 0 for prefill
    low: float  # measured ÷ predicted at RANGE_QUANTILES over the fit rows
    high: float
    n: int
    devices: tuple[str, ...] = ()

    def predict_s(self, ideal_s: float) -> float:
        return ideal_s / self.eta + self.c_s

    @property
    def basis(self) -> str:
        c = f", c {self.c_s * 1e3:.2f} ms/token" if self.phase == "decode" else ""
        on = f" ({self.dtype} roof)" if self.dtype else ""
        return (f"published: η {self.eta:.2f}{c} fitted on {self.n} {self.phase}{on} figures of "
                f"{len(self.devices)} {self.device_class} devices (measured ÷ predicted "
                f"{self.low:.2f}-{self.high:.2f})")


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    if len(s) < 10:  # too few for a quantile to mean more than the extremes
        return s[0] if q < 0.5 else s[-1]
    return statistics.quantiles(s, n=20, method="inclusive")[round(q * 20) - 1]


def fit_decode(xs: list[float], ts: list[float]) -> tuple[float, float]:
    """(η, c) of t = x/η + c by least squares over ideal seconds `xs` and measured seconds
    `ts`, η ≤ 1 and c ≥ 0; one point or one x: c = 0."""
    mx, mt = statistics.fmean(xs), statistics.fmean(ts)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (t - mt) for x, t in zip(xs, ts, strict=True)) / sxx if sxx else 0
    c = mt - slope * mx
    if sxx == 0 or slope <= 0 or c < 0:  # no spread of sizes, or a fit that says nonsense
        slope, c = sum(ts) / sum(xs), 0.0  # through the origin: t = x/η
    if slope < 1:  # faster than the datasheet: the figure's bandwidth understates the device
        slope, c = 1.0, max(0.0, mt - mx)
    return 1.0 / slope, c


def fit_class(device_class: str, phase: str, points: list[Point],
              dtype: str | None = None) -> ClassFit | None:
    mine = [p for p in points if p.row.device.device_class == device_class
            and p.row.phase == phase and p.dtype == dtype]
    devices = {p.row.device.id for p in mine}
    if not mine or (phase == "prefill" and len(devices) < MIN_PREFILL_DEVICES):
        return None  # one device's prefill says how its kernels suit it, not its class
    if phase == "decode":
        eta, c = fit_decode([p.ideal_s for p in mine], [p.measured_s for p in mine])
    else:  # never above the roof: a figure over it means the datasheet peak is not the roof
        eta, c = min(1.0, statistics.median(p.ideal_s / p.measured_s for p in mine)), 0.0
    fit = ClassFit(device_class, phase, dtype, eta, c, 1.0, 1.0, len(mine),
                   tuple(sorted({p.row.device.id for p in mine})))
    ratios = [fit.predict_s(p.ideal_s) / p.measured_s for p in mine]  # measured/predicted t/s
    return ClassFit(device_class, phase, dtype, eta, c, _quantile(ratios, RANGE_QUANTILES[0]),
                    _quantile(ratios, RANGE_QUANTILES[1]), len(mine), fit.devices)


@dataclass
class Published:
    """Every class fit from the shipped rows marked "fit" (or from `rows` given)."""

    fits: dict[tuple[str, str, str | None], ClassFit] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def get(self, device_class: str, phase: str, dtype: str | None = None) -> ClassFit | None:
        return self.fits.get((device_class, phase, dtype if phase == "prefill" else None))


def points_of(rows: tuple[PublishedRow, ...] | list[PublishedRow]
              ) -> tuple[list[Point], list[str]]:
    points, skipped = [], []
    for r in rows:
        p = point(r)
        if p is None:
            skipped.append(f"{r.device.id} {r.model} {r.quant} {r.test}: a model or quant "
                       "strata cannot shape, or a prefill without a FLOP/s figure")
        else:
            points.append(p)
    return points, skipped


def fit_published(rows: list[PublishedRow] | None = None) -> Published:
    all_rows, skipped = load_rows()
    chosen = rows if rows is not None else [r for r in all_rows if r.split == "fit"]
    points, unshaped = points_of(chosen)
    out = Published(skipped=[*skipped, *unshaped])
    for cls, phase, dtype in sorted({(p.row.device.device_class, p.row.phase, p.dtype)
                                     for p in points}, key=str):
        fit = fit_class(cls, phase, points, dtype)
        if fit is not None:
            out.fits[(cls, phase, dtype)] = fit
    return out


@lru_cache(maxsize=1)
def shipped_fit() -> Published:
    return fit_published()
