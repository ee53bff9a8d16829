"""The throttling verdict: pure rules over a list of samples, combined into one answer.

Each rule reads one signal (GPU clocks-event reason bits, CPU thermal-throttle counters,
a clock falling while busy) and says whether it applies to these samples and what it saw.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from strata.hardware.telemetry.samples import Sample, metric_keys, series

# NVML clocks-event reason bits (nvml.h nvmlClocksEventReason*).
NVML_REASON_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

# Bits that mean the GPU is being slowed below what its power budget allows. 0x8 covers
# thermal/power-brake HW slowdown; 0x80 is the external power brake. The power cap (0x4)
# is how boost clocks are normally managed and is reported, not counted as throttling.
NVML_THROTTLE_BITS: dict[int, str] = {
    0x8: "HW slowdown",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake slowdown",
}
NVML_INFO_BITS: dict[int, str] = {0x4: "power cap (normal under load)"}

BUSY_UTIL_PCT = 50.0  # "busy": a clock drop on an idle CPU is power saving, not throttling
CLOCK_DROP_FRACTION = 0.15  # smaller drifts are turbo bins moving with active-core count
MIN_BUSY_SAMPLES = 4


@dataclass
class RuleResult:
    """What one throttling signal says: applicable=False when the samples lack the signal."""

    signal: str
    applicable: bool
    throttled: bool = False
    evidence: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    why_not: str | None = None  # when not applicable although the metric was sampled


@dataclass
class ThrottleVerdict:
    """throttled: True/False, or None when no signal was sampled (see `reason`)."""

    throttled: bool | None
    evidence: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    reason: str | None = None

    def headline(self) -> str:
        if self.throttled is None:
            return f"cannot tell: {self.reason}"
        if self.throttled:
            return "THROTTLED: " + "; ".join(self.evidence)
        return "not throttled (checked: " + ", ".join(self.checked) + ")"


def _matching(samples: list[Sample], pattern: str) -> list[str]:
    return [k for k in metric_keys(samples) if re.fullmatch(pattern, k)]


def nvml_reason_rule(samples: list[Sample]) -> RuleResult:
    """GPU clocks-event reasons: thermal/HW slowdown bits in any sample mean throttling."""
    keys = _matching(samples, r"gpu\d+\.clocks_event_reasons")
    result = RuleResult("GPU clocks-event reasons", applicable=bool(keys))
    for key in keys:
        gpu = key.split(".")[0].upper()
        masks = [int(v) for v in series(samples, key)]
        for bit, label in NVML_THROTTLE_BITS.items():
            hits = sum(1 for m in masks if m & bit)
            if hits:
                result.throttled = True
                result.evidence.append(f"{gpu} {label} in {hits}/{len(masks)} samples")
        for bit, label in NVML_INFO_BITS.items():
            hits = sum(1 for m in masks if m & bit)
            if hits:
                result.notes.append(f"{gpu} {label} in {hits}/{len(masks)} samples")
    return result


def throttle_counter_rule(samples: list[Sample]) -> RuleResult:
    """CPU thermal-throttle counters: any increase over the run is a throttle event."""
    keys = _matching(samples, r"cpu\.(core|package)_throttle_count")
    result = RuleResult("CPU thermal-throttle counters", applicable=bool(keys))
    for key in keys:
        values = series(samples, key)
        delta = values[-1] - values[0]
        if delta > 0:
            result.throttled = True
            result.evidence.append(f"{key.split('.', 1)[1]} +{delta:g}")
    return result


def _ghz(mhz: float) -> str:
    return f"{mhz / 1000:.2f} GHz"


def _clock_drop(samples: list[Sample], device: str) -> RuleResult:
    label = "CPU" if device == "cpu" else device
    freq_key, util_key = f"{device}.freq_mhz", f"{device}.util_pct"
    busy = [s.readings[freq_key] for s in samples
            if freq_key in s.readings and s.readings.get(util_key, 0.0) >= BUSY_UTIL_PCT]
    result = RuleResult(f"{label} clock while busy", applicable=False)
    clocks = set(series(samples, freq_key))
    if len(clocks) == 1:
        # Real clocks jitter by a few kHz; a value that never moves is a VM's or a
        # firmware's nominal figure and cannot show throttling either way.
        result.why_not = f"{label} clock reads a constant {_ghz(clocks.pop())}"
        return result
    if len(busy) < MIN_BUSY_SAMPLES:
        result.why_not = (f"{label} busy (>= {BUSY_UTIL_PCT:.0f}% utilisation) in only "
                          f"{len(busy)} samples")
        return result
    result.applicable = True
    window = max(1, len(busy) // 4)
    start, end = statistics.median(busy[:window]), statistics.median(busy[-window:])
    drop = (start - end) / start if start > 0 else 0.0
    text = f"{label} clock fell from {_ghz(start)} to {_ghz(end)} ({-drop:.0%}) while busy"
    if drop >= CLOCK_DROP_FRACTION:
        result.throttled = True
        result.evidence.append(text)
    else:
        result.notes.append(f"{label} clock {_ghz(start)} -> {_ghz(end)} while busy")
    return result


def clock_drop_rule(samples: list[Sample]) -> list[RuleResult]:
    """A sustained clock fall while busy, for devices without reason bits (CPU, amdgpu).

    NVIDIA GPUs are left to their reason bits: their clocks also fall under the normal
    power cap, which must not read as throttling.
    """
    devices = [k.split(".")[0] for k in _matching(samples, r"(cpu|amdgpu\d+)\.freq_mhz")]
    return [_clock_drop(samples, d) for d in devices]


def _as_list(result: RuleResult | list[RuleResult]) -> list[RuleResult]:
    return result if isinstance(result, list) else [result]


VERDICT_RULES: dict[str, Callable[[list[Sample]], RuleResult | list[RuleResult]]] = {
    "nvml_reasons": nvml_reason_rule,
    "throttle_counters": throttle_counter_rule,
    "clock_drop": clock_drop_rule,
}


def throttle_verdict(
    samples: list[Sample], unavailable: Mapping[str, str] | None = None
) -> ThrottleVerdict:
    """Combine every rule: any throttling evidence -> True; signals but none -> False;
    no signal at all -> None, with what was missing as the reason."""
    if len(samples) < 2:
        return ThrottleVerdict(None, reason=f"too few samples ({len(samples)}) to compare")
    results = [r for rule in VERDICT_RULES.values() for r in _as_list(rule(samples))]
    applicable = [r for r in results if r.applicable]
    verdict = ThrottleVerdict(
        throttled=any(r.throttled for r in applicable) if applicable else None,
        evidence=[e for r in applicable for e in r.evidence],
        notes=[n for r in applicable for n in r.notes],
        checked=[r.signal for r in applicable],
    )
    if not applicable:
        why_nots = [r.why_not for r in results if r.why_not]
        verdict.reason = _no_signal_reason(why_nots, unavailable or {})
    return verdict


def _no_signal_reason(why_nots: list[str], unavailable: Mapping[str, str]) -> str:
    reason = ("no throttling signal in the samples (needs GPU clocks-event reasons, CPU "
              "thermal-throttle counters, or a varying clock sampled while busy)")
    missing = [k for k in ("nvml", "amdgpu", "cpu_throttle", "cpu_freq") if k in unavailable]
    if missing:  # the reasons themselves are in TelemetrySummary.unavailable
        why_nots = [*why_nots, "not sampled here: " + ", ".join(missing)]
    return "; ".join([reason, *why_nots])
