"""Telemetry samples: one tick of readings, and what a metric's name says it is.

Metric names are flat strings whose suffix says what they are (`_mhz`, `_c`, `_w`, `_pct`,
`_bytes` are gauges; `energy_j` and `_count` are cumulative counters; `_reasons` is a
bitmask). The sampling-interval defaults live here because both the sampler and the
summary use them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_INTERVAL_S = 0.25
MIN_INTERVAL_S = 0.01  # below this the readers' own cost dominates the interval
RECOMMENDED_INTERVAL_S = (0.1, 0.5)

Readings = dict[str, float]


@dataclass(frozen=True)
class Sample:
    """One tick of the sampler: when (perf_counter_ns, monotonic) and what was read."""

    t_ns: int
    readings: Readings

    def to_dict(self) -> dict[str, Any]:
        return {"t_ns": self.t_ns, "readings": dict(self.readings)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Sample:
        return cls(t_ns=int(d["t_ns"]), readings=dict(d["readings"]))


def series(samples: Iterable[Sample], key: str) -> list[float]:
    """Values of one metric in sample order, skipping samples where it is absent."""
    return [s.readings[key] for s in samples if key in s.readings]


def metric_keys(samples: Iterable[Sample]) -> list[str]:
    """Every metric name seen in the samples, sorted."""
    keys: set[str] = set()
    for s in samples:
        keys.update(s.readings)
    return sorted(keys)


# Suffix -> kind. Order matters only in that the first match wins.
METRIC_KINDS: dict[str, str] = {
    "energy_j": "energy",  # cumulative joules: the run's energy is last - first
    "_count": "counter",  # cumulative event counter: the run's count is last - first
    "_reasons": "bitmask",  # flags: count how many samples had each bit set
}


def metric_kind(key: str) -> str:
    """'gauge' unless the metric's suffix registers another kind in METRIC_KINDS."""
    for suffix, kind in METRIC_KINDS.items():
        if key.endswith(suffix):
            return kind
    return "gauge"
