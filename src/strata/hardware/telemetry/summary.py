"""The run summary: a pure reduction of a sample series to stats, energy and the verdict."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from strata.hardware.telemetry.samples import (
    DEFAULT_INTERVAL_S,
    Sample,
    metric_keys,
    metric_kind,
    series,
)
from strata.hardware.telemetry.verdict import NVML_REASON_BITS, ThrottleVerdict, throttle_verdict


@dataclass
class MetricStats:
    min: float
    mean: float
    max: float
    n: int


@dataclass
class TelemetrySummary:
    """What a run stores: per-metric stats, counter deltas, energy and the verdict."""

    duration_s: float
    sample_count: int
    interval_s: float
    metrics: dict[str, MetricStats] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    energy_j: dict[str, float] = field(default_factory=dict)
    mean_power_w: dict[str, float] = field(default_factory=dict)  # energy / counter span
    bitmasks: dict[str, dict[str, int]] = field(default_factory=dict)  # bit -> samples set
    verdict: ThrottleVerdict = field(default_factory=lambda: ThrottleVerdict(None))
    unavailable: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TelemetrySummary:
        d = dict(d)
        d["metrics"] = {k: MetricStats(**v) for k, v in d.get("metrics", {}).items()}
        d["verdict"] = ThrottleVerdict(**d["verdict"])
        return cls(**d)


def _span_s(samples: list[Sample], key: str) -> float:
    times = [s.t_ns for s in samples if key in s.readings]
    return (times[-1] - times[0]) / 1e9 if times else 0.0


def _bit_counts(masks: list[float]) -> dict[str, int]:
    counts: dict[str, int] = {"samples": len(masks)}
    bits = 0
    for m in masks:
        bits |= int(m)
    for i in range(bits.bit_length()):
        bit = 1 << i
        if bits & bit:
            name = NVML_REASON_BITS.get(bit, f"bit_{bit:#x}")
            counts[name] = sum(1 for m in masks if int(m) & bit)
    return counts


def summarize(
    samples: list[Sample],
    interval_s: float = DEFAULT_INTERVAL_S,
    unavailable: Mapping[str, str] | None = None,
    sources: Mapping[str, str] | None = None,
) -> TelemetrySummary:
    """Pure: reduce a sample series to a TelemetrySummary (stats by metric kind + verdict)."""
    duration = (samples[-1].t_ns - samples[0].t_ns) / 1e9 if samples else 0.0
    out = TelemetrySummary(duration, len(samples), interval_s,
                           unavailable=dict(unavailable or {}), sources=dict(sources or {}))
    for key in metric_keys(samples):
        values = series(samples, key)
        kind = metric_kind(key)
        if kind == "gauge":
            out.metrics[key] = MetricStats(min(values), statistics.fmean(values), max(values),
                                           len(values))
        elif kind == "counter":
            out.counters[key] = values[-1] - values[0]
        elif kind == "energy" and len(values) >= 2:
            out.energy_j[key] = values[-1] - values[0]
            span = _span_s(samples, key)
            if span > 0:
                out.mean_power_w[key] = out.energy_j[key] / span
        elif kind == "bitmask":
            out.bitmasks[key] = _bit_counts(values)
    out.verdict = throttle_verdict(samples, unavailable)
    return out
