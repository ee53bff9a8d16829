"""The one timing path: warm-up by time, repeated timed calls, device sync at boundaries.

Every timed number in strata comes from `time_calls`. Devices that run asynchronously
(CUDA, ROCm, MPS) pass a `sync` callable so the clock only stops when the work is done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from strata.hardware.devices import sync
from strata.measure.stats import Summary, summarize


@dataclass
class TimingPolicy:
    warmup_s: float = 0.05  # warm caches, clocks, lazy init; not recorded
    min_reps: int = 3
    max_reps: int = 50
    max_time_s: float = 2.0  # stop repeating after this much timed work
    target_rel_ci: float | None = None  # stop early once the 95% CI is this tight


def _noop() -> None:
    return None


class Clock(Protocol):
    def measure(self, fn: Callable[[], object]) -> float: ...


class HostClock:
    """Wall clock around the call; `sync` waits for asynchronous devices at both ends."""

    def __init__(self, sync: Callable[[], None] = _noop) -> None:
        self.sync = sync

    def measure(self, fn: Callable[[], object]) -> float:
        self.sync()
        t0 = time.perf_counter_ns()
        fn()
        self.sync()
        return (time.perf_counter_ns() - t0) / 1e9


class CudaEventClock:
    """CUDA/ROCm events: device-side time of the work, free of host launch jitter."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch, self.device = torch, device

    def measure(self, fn: Callable[[], object]) -> float:
        cuda = self.torch.cuda
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        sync(self.device)  # queued work done before the start event (the device runtime's)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def time_once(fn: Callable[[], object], clock: Clock | None = None,
              before: Callable[[], None] = _noop) -> float:
    """Seconds for one call of fn; `before` (e.g. a cache flush) runs untimed."""
    before()
    return (clock or HostClock()).measure(fn)


def time_calls(fn: Callable[[], object], policy: TimingPolicy | None = None,
               clock: Clock | None = None,
               before: Callable[[], None] = _noop) -> Summary:
    """Warm up for policy.warmup_s, then time repeated calls; returns seconds per call."""
    policy = policy or TimingPolicy()
    clock = clock or HostClock()
    deadline = time.perf_counter() + policy.warmup_s
    time_once(fn, clock, before)  # at least one untimed call, whatever the warm-up length
    while time.perf_counter() < deadline:
        time_once(fn, clock, before)
    samples: list[float] = []
    spent = 0.0
    while len(samples) < policy.max_reps:
        samples.append(time_once(fn, clock, before))
        spent += samples[-1]
        if len(samples) >= policy.min_reps and _done(samples, spent, policy):
            break
    return summarize(samples)


def _done(samples: list[float], spent: float, policy: TimingPolicy) -> bool:
    if spent >= policy.max_time_s:
        return True
    if policy.target_rel_ci is None:
        return False
    return summarize(samples).rel_ci95 <= policy.target_rel_ci
