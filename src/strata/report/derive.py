"""Pure derivations from stored results: roofline points, sweep series, sustained timelines.

Kept apart from the HTML so each formula can be tested on hand-made results.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from strata.bench.scenario import BenchTest
from strata.store.runs import StoredResult

PRIMARY = {"pp": "prefill_tps", "tg": "decode_tps", "pg": "combined_tps"}


def kind(r: StoredResult) -> str:
    return BenchTest(r.n_prompt, r.n_gen, r.n_depth).kind


def is_sustained(r: StoredResult) -> bool:
    return bool(r.info.get("sustained"))


def primary(r: StoredResult) -> dict[str, Any]:
    """The summary of the t/s figure that names the test (llama-bench's avg_ts)."""
    return r.metrics.get(PRIMARY[kind(r)], {})


# ---------------------------------------------------------------------------- roofline


@dataclass
class RoofPoint:
    result: StoredResult
    intensity: float  # FLOP per byte moved from memory
    gflops: float  # achieved GFLOP/s
    tokens_per_pass: float


def tokens_per_weight_pass(r: StoredResult) -> float:
    """Tokens that share one read of the weights.

    Decode reads every weight once per token. Prefill reads them once per micro-batch:
    llama.cpp splits a prompt into n_ubatch chunks (the backend reports what it used), an
    in-process torch forward takes the whole prompt. A pp+tg test mixes one prefill pass
    with one pass per generated token.
    """
    ubatch = r.info.get("n_ubatch")
    pp_tokens = min(r.n_prompt, ubatch) if isinstance(ubatch, int) and ubatch > 0 else r.n_prompt
    k = kind(r)
    if k == "tg":
        return 1.0
    if k == "pp":
        return float(max(pp_tokens, 1))
    passes = -(-r.n_prompt // max(pp_tokens, 1)) + r.n_gen
    return (r.n_prompt + r.n_gen) / passes


def roof_point(r: StoredResult) -> RoofPoint | None:
    """intensity = FLOPs/token x tokens per weight pass / bytes per token;
    achieved = t/s x FLOPs/token. None when the result has no byte/FLOP model (endpoints)."""
    ex = r.explain or {}
    flops, nbytes = ex.get("flops_per_prompt_token"), ex.get("bytes_per_token")
    tps = primary(r).get("mean")
    if not (flops and nbytes and tps):
        return None
    per_pass = tokens_per_weight_pass(r)
    return RoofPoint(r, flops * per_pass / nbytes, tps * flops / 1e9, per_pass)


# ---------------------------------------------------------------------------- sweeps


@dataclass
class SweepPoint:
    x: float
    mean: float
    sd: float
    result: StoredResult


@dataclass
class Sweep:
    """One line of a t/s-vs-depth or t/s-vs-prompt chart."""

    model: str
    backend: str
    fixed: str  # what is held constant: "pp512", "tg128" or "d0"
    points: list[SweepPoint] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.model} · {self.backend} · {self.fixed}"


def _latest(results: list[StoredResult]) -> list[StoredResult]:
    """One result per configuration: the newest (results come oldest first)."""
    by_key: dict[tuple, StoredResult] = {}
    for r in results:
        key = (r.model, r.backend, r.n_prompt, r.n_gen, r.n_depth,
               json.dumps(r.load_config, sort_keys=True, default=str))
        by_key[key] = r
    return list(by_key.values())


def _sweeps(results: list[StoredResult], keep: str, x_of, fixed_of) -> list[Sweep]:
    groups: dict[tuple[str, str, str], Sweep] = {}
    for r in _latest([r for r in results if not is_sustained(r) and kind(r) == keep]):
        summary = primary(r)
        if summary.get("mean") is None:
            continue
        key = (r.model, r.backend, fixed_of(r))
        sweep = groups.setdefault(key, Sweep(*key))
        sweep.points.append(SweepPoint(x_of(r), summary["mean"], summary.get("sd") or 0.0, r))
    for s in groups.values():
        s.points.sort(key=lambda p: p.x)
    return list(groups.values())


def depth_sweeps(results: list[StoredResult], phase: str) -> list[Sweep]:
    """t/s vs depth for one phase ('pp' or 'tg'), one line per model/backend/test size."""
    size = (lambda r: f"pp{r.n_prompt}") if phase == "pp" else (lambda r: f"tg{r.n_gen}")
    return _sweeps(results, phase, lambda r: float(r.n_depth), size)


def prompt_sweeps(results: list[StoredResult]) -> list[Sweep]:
    """Prefill t/s vs prompt size, one line per model/backend/depth."""
    return _sweeps(results, "pp", lambda r: float(r.n_prompt), lambda r: f"d{r.n_depth}")


def varied(sweeps: list[Sweep]) -> bool:
    """A sweep chart says something only when some line has two or more x values."""
    return any(len({p.x for p in s.points}) > 1 for s in sweeps)


# ---------------------------------------------------------------------------- sustained

MAX_TIMELINE_POINTS = 150  # beyond this, markers merge into a smear and the file grows fast


@dataclass
class TimeBin:
    t: float  # middle of the bin (s)
    mean: float
    lo: float
    hi: float
    n: int


def bin_timeline(timeline: list[tuple[float, float]],
                 max_points: int = MAX_TIMELINE_POINTS) -> list[TimeBin]:
    """Equal-time bins (mean, min, max t/s) when a run has more requests than can be drawn;
    one bin per request otherwise. A tiny model answers thousands of requests a minute."""
    if len(timeline) <= max_points:
        return [TimeBin(t, v, v, v, 1) for t, v in timeline]
    t0, t1 = timeline[0][0], timeline[-1][0]
    width = (t1 - t0) / max_points or 1.0
    groups: dict[int, list[float]] = defaultdict(list)
    for t, v in timeline:
        groups[min(int((t - t0) / width), max_points - 1)].append(v)
    return [TimeBin(t0 + (i + 0.5) * width, sum(vs) / len(vs), min(vs), max(vs), len(vs))
            for i, vs in sorted(groups.items())]


# ---------------------------------------------------------------------------- telemetry

# NVML clocks-event bits that mean throttling (docs/architecture.md §5: thermal 0x20/0x40;
# 0x4 is normal).
THROTTLE_BITS = 0x8 | 0x20 | 0x40 | 0x80
GAUGE_UNITS = {"_mhz": "MHz", "_c": "°C", "_w": "W"}


Points = list[tuple[float, float]]


def telemetry_series(tele: dict[str, Any] | None) -> dict[str, dict[str, Points]]:
    """unit -> metric -> [(t s, value)] from raw samples, when a result stored them.

    Results store the telemetry summary; per-sample series are drawn only where present.
    """
    samples = (tele or {}).get("samples") or []
    if not samples:
        return {}
    t0 = samples[0].get("t_ns", 0)
    out: dict[str, dict[str, Points]] = defaultdict(dict)
    for s in samples:
        t = (s.get("t_ns", 0) - t0) / 1e9
        for key, value in (s.get("readings") or {}).items():
            unit = next((u for suf, u in GAUGE_UNITS.items() if key.endswith(suf)), None)
            if unit and isinstance(value, int | float):
                out[unit].setdefault(key, []).append((t, float(value)))
    return dict(out)


def throttled_times(tele: dict[str, Any] | None) -> list[float]:
    """Sample times (s) at which a clocks-event reason mask had a throttling bit set."""
    samples = (tele or {}).get("samples") or []
    if not samples:
        return []
    t0 = samples[0].get("t_ns", 0)
    return [(s.get("t_ns", 0) - t0) / 1e9 for s in samples
            if any(k.endswith("_reasons") and int(v) & THROTTLE_BITS
                   for k, v in (s.get("readings") or {}).items())]

