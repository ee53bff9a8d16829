"""`--sustained SECONDS`: decode continuously, report the t/s timeline and the drop.

The drop compares the first and the last minute (the first and last quarter when the run
is shorter than two minutes); the telemetry verdict says whether throttle flags coincide.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from strata.backends.base import RunTrace
from strata.bench.metrics import compute


@dataclass
class SustainedReport:
    seconds: float
    window_s: float  # length of the first/last windows compared
    timeline: list[tuple[float, float]] = field(default_factory=list)  # (t since start, t/s)
    first_tps: float | None = None
    last_tps: float | None = None
    drop: float | None = None  # (first - last) / first; positive = slowed down
    throttled: bool | None = None
    evidence: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def window_for(seconds: float) -> float:
    return 60.0 if seconds >= 120 else seconds / 4


def summarize_timeline(timeline: list[tuple[float, float]], seconds: float) -> SustainedReport:
    rep = SustainedReport(seconds=seconds, window_s=window_for(seconds), timeline=timeline)
    if not timeline:
        return rep
    start, end = timeline[0][0], timeline[-1][0]
    # windows anchored on the first and last samples, so neither is ever empty
    first = [v for t, v in timeline if t <= start + rep.window_s]
    last = [v for t, v in timeline if t >= end - rep.window_s]
    if first and last:
        rep.first_tps, rep.last_tps = sum(first) / len(first), sum(last) / len(last)
        rep.drop = (rep.first_tps - rep.last_tps) / rep.first_tps
    return rep


def run_sustained(step: Callable[[], RunTrace], seconds: float,
                  on_step: Callable[[float], None] = lambda t: None) -> list[tuple[float, float]]:
    """Call `step` (one tg request) back to back for `seconds`; returns the t/s timeline."""
    timeline: list[tuple[float, float]] = []
    start = time.perf_counter()
    while (now := time.perf_counter() - start) < seconds:
        tps = compute(step()).decode_tps
        if tps is not None:
            timeline.append((time.perf_counter() - start, tps))
        on_step(now)
    return timeline
