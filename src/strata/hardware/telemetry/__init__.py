"""Background telemetry sampler: clocks, temperatures, power, energy, throttling.

A `Sampler` runs a thread that asks every registered reader for its readings every
`interval_s` (default 250 ms). Each reader is one small, optional source (cpufreq, hwmon,
RAPL, NVML, ...). A reader that cannot work here (file missing, root-only, library absent)
is disabled once and its reason kept in `Sampler.unavailable`: a figure we could not
measure is absent with a reason, never a guess (docs/architecture.md §5 "Honesty").

    with Sampler(interval_s=0.25) as s:
        run_benchmark()
    summary = s.summary()          # TelemetrySummary: stats, energy, throttling verdict

Metric names are flat strings whose suffix says what they are (`_mhz`, `_c`, `_w`, `_pct`,
`_bytes` are gauges; `energy_j` and `_count` are cumulative counters; `_reasons` is a
bitmask). The summary and the throttling verdict are pure functions over a list of
`Sample`s, so recorded series from machines that are not here can be fed to them.

One job per module:
    samples.py   Sample, metric names and kinds, interval defaults
    readers/     the reader contract and registry (base.py), one module per source
    verdict.py   throttling rules and the combined verdict
    hostload.py  HostLoadMonitor: CPU used by processes outside strata's tree (busy host)
    summary.py   TelemetrySummary and summarize()
    sampler.py   the Sampler thread

This module only re-exports the public names, so `from strata.hardware.telemetry import X`
works for all of them.
"""

from __future__ import annotations

from strata.hardware.telemetry.hostload import (
    BUSY_SHARE,
    BUSY_STEAL_SHARE,
    HostLoad,
    HostLoadMonitor,
    HostLoadUnavailable,
    LoadSnapshot,
    OtherProcess,
    host_load,
)
from strata.hardware.telemetry.readers import (
    READERS,
    Reader,
    ReaderContext,
    ReaderFactory,
    SourceUnavailable,
    register_reader,
)
from strata.hardware.telemetry.readers.amdgpu import AMDGPU_FILES, AmdGpuReader
from strata.hardware.telemetry.readers.cpu import CpuFreqReader, CpuThrottleReader
from strata.hardware.telemetry.readers.nvml import NvmlReader
from strata.hardware.telemetry.readers.rapl import EnergyAccumulator, RaplReader
from strata.hardware.telemetry.readers.thermal import HwmonTempReader, ThermalZoneReader
from strata.hardware.telemetry.readers.usage import CpuUtilReader, ProcessReader
from strata.hardware.telemetry.sampler import Sampler
from strata.hardware.telemetry.samples import (
    DEFAULT_INTERVAL_S,
    METRIC_KINDS,
    MIN_INTERVAL_S,
    RECOMMENDED_INTERVAL_S,
    Readings,
    Sample,
    metric_keys,
    metric_kind,
    series,
)
from strata.hardware.telemetry.summary import MetricStats, TelemetrySummary, summarize
from strata.hardware.telemetry.verdict import (
    BUSY_UTIL_PCT,
    CLOCK_DROP_FRACTION,
    MIN_BUSY_SAMPLES,
    NVML_INFO_BITS,
    NVML_REASON_BITS,
    NVML_THROTTLE_BITS,
    VERDICT_RULES,
    RuleResult,
    ThrottleVerdict,
    clock_drop_rule,
    nvml_reason_rule,
    throttle_counter_rule,
    throttle_verdict,
)

__all__ = [
    "AMDGPU_FILES",
    "BUSY_SHARE",
    "BUSY_STEAL_SHARE",
    "BUSY_UTIL_PCT",
    "CLOCK_DROP_FRACTION",
    "DEFAULT_INTERVAL_S",
    "METRIC_KINDS",
    "MIN_BUSY_SAMPLES",
    "MIN_INTERVAL_S",
    "NVML_INFO_BITS",
    "NVML_REASON_BITS",
    "NVML_THROTTLE_BITS",
    "READERS",
    "RECOMMENDED_INTERVAL_S",
    "VERDICT_RULES",
    "AmdGpuReader",
    "CpuFreqReader",
    "CpuThrottleReader",
    "CpuUtilReader",
    "EnergyAccumulator",
    "HostLoad",
    "HostLoadMonitor",
    "HostLoadUnavailable",
    "HwmonTempReader",
    "LoadSnapshot",
    "MetricStats",
    "NvmlReader",
    "OtherProcess",
    "ProcessReader",
    "RaplReader",
    "Reader",
    "ReaderContext",
    "ReaderFactory",
    "Readings",
    "RuleResult",
    "Sample",
    "Sampler",
    "SourceUnavailable",
    "TelemetrySummary",
    "ThermalZoneReader",
    "ThrottleVerdict",
    "clock_drop_rule",
    "host_load",
    "metric_keys",
    "metric_kind",
    "nvml_reason_rule",
    "register_reader",
    "series",
    "summarize",
    "throttle_counter_rule",
    "throttle_verdict",
]
