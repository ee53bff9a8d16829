"""Background telemetry sampler: clocks, temperatures, power, energy, throttling.

A `Sampler` runs a thread that asks every registered reader for its readings every
`interval_s` (default 250 ms). Each reader is one small, optional source (cpufreq, hwmon,
RAPL, NVML, ...). A reader that cannot work here (file missing, root-only, library absent)
is disabled once and its reason kept in `Sampler.unavailable`: a figure we could not
measure is absent with a reason, never a guess (DESIGN §3 "Honesty").

    with Sampler(interval_s=0.25) as s:
        run_benchmark()
    summary = s.summary()          # TelemetrySummary: stats, energy, throttling verdict

Metric names are flat strings whose suffix says what they are (`_mhz`, `_c`, `_w`, `_pct`,
`_bytes` are gauges; `energy_j` and `_count` are cumulative counters; `_reasons` is a
bitmask). The summary and the throttling verdict are pure functions over a list of
`Sample`s, so recorded series from machines that are not here can be fed to them.
"""

from __future__ import annotations

import os
import re
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

DEFAULT_INTERVAL_S = 0.25
MIN_INTERVAL_S = 0.01  # below this the readers' own cost dominates the interval
RECOMMENDED_INTERVAL_S = (0.1, 0.5)

Readings = dict[str, float]


# --------------------------------------------------------------------------- samples


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


# --------------------------------------------------------------------------- readers


class SourceUnavailable(Exception):
    """Raised by a reader's open() when its source does not exist or cannot be read here."""


@dataclass(frozen=True)
class ReaderContext:
    """Where readers look. Roots are parameters so tests can point them at fake trees."""

    sysfs_root: Path = Path("/sys")
    procfs_root: Path = Path("/proc")
    pid: int = field(default_factory=os.getpid)


class Reader:
    """One telemetry source.

    open() prepares and raises SourceUnavailable (or anything else) if the source cannot
    work here; read() returns the current readings; close() releases what open() took.
    `source` says where readings come from; `dropped` names single fields that stopped
    working while the rest of the reader still does (field -> reason).
    """

    name: ClassVar[str] = ""

    def __init__(self, ctx: ReaderContext) -> None:
        self.ctx = ctx
        self.source = ""
        self.dropped: dict[str, str] = {}

    def open(self) -> None:
        """Check the source exists; raise SourceUnavailable with the reason if not."""

    def read(self) -> Readings:
        raise NotImplementedError

    def close(self) -> None:
        """Release what open() acquired (library handles)."""


ReaderFactory = Callable[[ReaderContext], Reader]

READERS: dict[str, ReaderFactory] = {}


def register_reader(cls: type[Reader]) -> type[Reader]:
    """Class decorator: make a reader available to every Sampler under `cls.name`."""
    READERS[cls.name] = cls
    return cls


def _read_text(path: Path) -> str:
    return path.read_text().strip()


def _read_float(path: Path) -> float:
    return float(_read_text(path))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class _Fields:
    """Named zero-argument getters; a getter that raises is dropped once with its reason.

    One unsupported query (energy on an older GPU, a thermal zone that returns EINVAL)
    must not cost the other readings of the same device.
    """

    def __init__(self, getters: Mapping[str, Callable[[], float]], dropped: dict[str, str]):
        self._getters = dict(getters)
        self._dropped = dropped

    def __bool__(self) -> bool:
        return bool(self._getters)

    def read(self) -> Readings:
        out: Readings = {}
        for key, get in list(self._getters.items()):
            try:
                out[key] = get()
            except Exception as exc:  # any failure of one field: drop it, keep the rest
                del self._getters[key]
                self._dropped[key] = _describe(exc)
        return out


def _file_getter(path: Path, scale: float = 1.0) -> Callable[[], float]:
    return lambda: _read_float(path) * scale


def _first_readable(paths: Iterable[Path]) -> tuple[list[Path], dict[str, str]]:
    """Split paths into those whose first read parses as a number and the failures
    (keyed by the parent directory's name, e.g. the RAPL zone)."""
    good: list[Path] = []
    bad: dict[str, str] = {}
    for p in paths:
        try:
            _read_float(p)
            good.append(p)
        except Exception as exc:
            bad[p.parent.name] = _describe(exc)
    return good, bad


def _cpu_dirs(ctx: ReaderContext) -> list[Path]:
    base = ctx.sysfs_root / "devices/system/cpu"
    return sorted(p for p in base.glob("cpu[0-9]*") if re.fullmatch(r"cpu\d+", p.name))


@register_reader
class CpuFreqReader(Reader):
    """Per-core current frequency: cpufreq sysfs, else the 'cpu MHz' lines of /proc/cpuinfo.

    VMs and some ARM boards have no cpufreq driver, hence the fallback; /proc/cpuinfo on a
    VM may show a constant nominal clock, which the source string makes visible.
    """

    name = "cpu_freq"

    def open(self) -> None:
        files = [d / "cpufreq/scaling_cur_freq" for d in _cpu_dirs(self.ctx)]
        self._files = [f for f in files if f.exists()]
        if self._files:
            self.source = "sysfs cpufreq scaling_cur_freq"
            return
        self._cpuinfo = self.ctx.procfs_root / "cpuinfo"
        if self._cpuinfo.exists() and self._cpuinfo_mhz():
            self.source = "/proc/cpuinfo 'cpu MHz'"
            return
        raise SourceUnavailable(
            "no cpufreq/scaling_cur_freq under /sys/devices/system/cpu and no 'cpu MHz' "
            "in /proc/cpuinfo"
        )

    def _cpuinfo_mhz(self) -> list[float]:
        lines = self._cpuinfo.read_text().splitlines()
        return [float(ln.split(":", 1)[1]) for ln in lines if ln.startswith("cpu MHz")]

    def read(self) -> Readings:
        # scaling_cur_freq is in kHz
        mhz = [_read_float(f) / 1000 for f in self._files] if self._files else self._cpuinfo_mhz()
        return {
            "cpu.freq_mhz": statistics.fmean(mhz),
            "cpu.freq_min_core_mhz": min(mhz),
            "cpu.freq_max_core_mhz": max(mhz),
        }


@register_reader
class CpuThrottleReader(Reader):
    """Intel's thermal-throttle event counters (x86 therm_throt driver).

    core counts are per logical CPU and are summed; package counts repeat on every CPU of
    a package, so they are taken once per physical package.
    """

    name = "cpu_throttle"

    def open(self) -> None:
        self._core: list[Path] = []
        self._package: dict[str, Path] = {}
        for d in _cpu_dirs(self.ctx):
            tt = d / "thermal_throttle"
            if (tt / "core_throttle_count").exists():
                self._core.append(tt / "core_throttle_count")
            if (tt / "package_throttle_count").exists():
                self._package.setdefault(self._package_id(d), tt / "package_throttle_count")
        if not (self._core or self._package):
            raise SourceUnavailable(
                "no /sys/devices/system/cpu/cpu*/thermal_throttle counters "
                "(Intel therm_throt interface; absent on AMD and in most VMs)"
            )
        self.source = "sysfs thermal_throttle"

    @staticmethod
    def _package_id(cpu_dir: Path) -> str:
        try:
            return _read_text(cpu_dir / "topology/physical_package_id")
        except OSError:
            return cpu_dir.name  # unknown topology: count per CPU rather than guess

    def read(self) -> Readings:
        out: Readings = {}
        if self._core:
            out["cpu.core_throttle_count"] = sum(_read_float(p) for p in self._core)
        if self._package:
            out["cpu.package_throttle_count"] = sum(
                _read_float(p) for p in self._package.values()
            )
        return out


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", text.strip()) or "unnamed"


@register_reader
class HwmonTempReader(Reader):
    """Every temp*_input of /sys/class/hwmon (k10temp, coretemp, nvme, amdgpu, ...)."""

    name = "hwmon"

    def open(self) -> None:
        base = self.ctx.sysfs_root / "class/hwmon"
        getters: dict[str, Callable[[], float]] = {}
        for chip in sorted(base.glob("hwmon*")):
            chip_name = self._chip_name(chip)
            for temp in sorted(chip.glob("temp*_input")):
                label = self._label(temp)
                key = f"temp.{chip_name}.{label}_c"
                if key in getters:  # two chips with one name (two NVMe drives)
                    key = f"temp.{chip_name}.{chip.name}.{label}_c"
                getters[key] = _file_getter(temp, 1e-3)  # millidegrees Celsius
        self._fields = _Fields(getters, self.dropped)
        if not self._fields:
            raise SourceUnavailable("no temp*_input under /sys/class/hwmon")
        self.source = "sysfs hwmon"

    @staticmethod
    def _chip_name(chip: Path) -> str:
        try:
            return _slug(_read_text(chip / "name"))
        except OSError:
            return chip.name

    @staticmethod
    def _label(temp_input: Path) -> str:
        stem = temp_input.name.removesuffix("_input")
        try:
            return _slug(_read_text(temp_input.with_name(f"{stem}_label")))
        except OSError:
            return stem

    def read(self) -> Readings:
        return self._fields.read()


@register_reader
class ThermalZoneReader(Reader):
    """ACPI/SoC thermal zones (/sys/class/thermal/thermal_zone*/temp), common on laptops/ARM."""

    name = "thermal_zones"

    def open(self) -> None:
        base = self.ctx.sysfs_root / "class/thermal"
        getters: dict[str, Callable[[], float]] = {}
        for zone in sorted(base.glob("thermal_zone*")):
            try:
                kind = _slug(_read_text(zone / "type"))
            except OSError:
                kind = "zone"
            getters[f"temp.{zone.name}.{kind}_c"] = _file_getter(zone / "temp", 1e-3)
        self._fields = _Fields(getters, self.dropped)
        if not self._fields:
            raise SourceUnavailable("no /sys/class/thermal/thermal_zone*")
        self.source = "sysfs thermal"

    def read(self) -> Readings:
        return self._fields.read()


@dataclass
class EnergyAccumulator:
    """Turns a wrapping microjoule counter into joules since the first reading.

    RAPL's energy_uj wraps at max_energy_range_uj (about every minute at high power on
    some parts), so a run longer than one wrap is only correct if every interval is added.
    """

    max_range_uj: float
    last_uj: float | None = None
    total_j: float = 0.0

    def update(self, raw_uj: float) -> float:
        if self.last_uj is not None:
            delta = raw_uj - self.last_uj
            if delta < 0:  # wrapped past max_energy_range_uj
                delta += self.max_range_uj
            self.total_j += delta * 1e-6
        self.last_uj = raw_uj
        return self.total_j


@register_reader
class RaplReader(Reader):
    """Intel RAPL energy counters (AMD Zen exposes them as intel-rapl too, kernel >= 5.8).

    energy_uj has been root-only since 2020 (CVE-2020-8694, the PLATYPUS attack), so
    'PermissionError' is the usual reason on desktops run as a normal user.
    """

    name = "rapl"

    def open(self) -> None:
        base = self.ctx.sysfs_root / "class/powercap"
        zones = sorted(p for p in base.glob("intel-rapl:*") if (p / "energy_uj").exists())
        if not zones:
            raise SourceUnavailable("no /sys/class/powercap/intel-rapl:*/energy_uj")
        readable, failed = _first_readable(z / "energy_uj" for z in zones)
        if not readable:
            first = next(iter(failed.values()))
            raise SourceUnavailable(
                f"energy_uj not readable ({first}); RAPL counters are root-only on "
                "current kernels: run as root or grant read access"
            )
        self._zones = {self._key(p.parent): (p, self._accumulator(p.parent)) for p in readable}
        self.dropped.update(failed)
        self.source = "sysfs powercap intel-rapl"

    def _key(self, zone: Path) -> str:
        # Subzones (intel-rapl:0:0 'core') are contained in their package: name both.
        parts = zone.name.split(":")
        name = self._zone_name(zone)
        if len(parts) > 2:
            parent = self._zone_name(zone.with_name(":".join(parts[:2])))
            name = f"{parent}.{name}"
        return f"rapl.{name}.energy_j"

    @staticmethod
    def _zone_name(zone: Path) -> str:
        try:
            return _slug(_read_text(zone / "name"))
        except OSError:
            return _slug(zone.name)

    @staticmethod
    def _accumulator(zone: Path) -> EnergyAccumulator:
        try:
            max_range = _read_float(zone / "max_energy_range_uj")
        except (OSError, ValueError):
            max_range = 2.0**32  # the register width when the kernel does not say
        return EnergyAccumulator(max_range)

    def read(self) -> Readings:
        return {key: acc.update(_read_float(path)) for key, (path, acc) in self._zones.items()}


def _psutil() -> Any:
    try:
        import psutil
    except ImportError as exc:
        raise SourceUnavailable("psutil not installed (pip install psutil)") from exc
    return psutil


@register_reader
class CpuUtilReader(Reader):
    """System-wide CPU utilisation between two samples (psutil.cpu_percent)."""

    name = "cpu_util"

    def open(self) -> None:
        self._ps = _psutil()
        self._primed = False
        self.source = "psutil.cpu_percent"

    def read(self) -> Readings:
        value = self._ps.cpu_percent(interval=None)
        # psutil keeps the previous times per calling thread; the first call in the
        # sampler thread compares against nothing and returns a meaningless 0.0.
        if not self._primed:
            self._primed = True
            return {}
        return {"cpu.util_pct": value}


@register_reader
class ProcessReader(Reader):
    """Resident memory of the measured process (this one unless a pid is given)."""

    name = "process"

    def open(self) -> None:
        ps = _psutil()
        try:
            self._proc = ps.Process(self.ctx.pid)
        except ps.Error as exc:
            raise SourceUnavailable(f"process {self.ctx.pid}: {_describe(exc)}") from exc
        self.source = f"psutil pid {self.ctx.pid}"

    def read(self) -> Readings:
        return {"proc.rss_bytes": float(self._proc.memory_info().rss)}


def _nvml_reasons_getter(nv: Any, handle: Any) -> Callable[[], float]:
    """Clocks-event reasons (driver >= 535 name) or the older 'throttle reasons' call."""
    for name in ("nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(nv, name, None)
        if fn is None:
            continue
        try:
            fn(handle)
        except nv.NVMLError:
            continue  # symbol missing in this driver: try the older name
        return lambda fn=fn: float(fn(handle))
    return _unsupported("neither clocks-event nor throttle reasons are supported")


def _unsupported(why: str) -> Callable[[], float]:
    """A getter that fails on first use, so _Fields records `why` as the field's reason."""

    def get() -> float:
        raise RuntimeError(why)

    return get


def _nvml_getters(nv: Any, handle: Any, prefix: str) -> dict[str, Callable[[], float]]:
    return {
        f"{prefix}.sm_clock_mhz": lambda: float(nv.nvmlDeviceGetClockInfo(handle,
                                                                         nv.NVML_CLOCK_SM)),
        f"{prefix}.mem_clock_mhz": lambda: float(nv.nvmlDeviceGetClockInfo(handle,
                                                                          nv.NVML_CLOCK_MEM)),
        f"{prefix}.temp_c": lambda: float(nv.nvmlDeviceGetTemperature(handle,
                                                                     nv.NVML_TEMPERATURE_GPU)),
        f"{prefix}.power_w": lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000,  # mW
        f"{prefix}.util_pct": lambda: float(nv.nvmlDeviceGetUtilizationRates(handle).gpu),
        f"{prefix}.mem_util_pct": lambda: float(nv.nvmlDeviceGetUtilizationRates(handle).memory),
        f"{prefix}.mem_used_bytes": lambda: float(nv.nvmlDeviceGetMemoryInfo(handle).used),
        f"{prefix}.clocks_event_reasons": _nvml_reasons_getter(nv, handle),
        # mJ since the driver loaded (Volta+); the run's energy is the difference.
        f"{prefix}.energy_j": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000,
    }


@register_reader
class NvmlReader(Reader):
    """NVIDIA GPUs through NVML (package nvidia-ml-py, imported only when sampling)."""

    name = "nvml"

    def open(self) -> None:
        try:
            import pynvml as nv
        except ImportError as exc:
            raise SourceUnavailable(
                "pynvml not installed (pip install 'strata[nvidia]')"
            ) from exc
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise SourceUnavailable(f"NVML init failed: {exc} (no NVIDIA driver?)") from exc
        self._nv = nv
        count = nv.nvmlDeviceGetCount()
        if count == 0:
            self.close()
            raise SourceUnavailable("NVML reports no NVIDIA GPUs")
        getters: dict[str, Callable[[], float]] = {}
        for i in range(count):
            getters.update(_nvml_getters(nv, nv.nvmlDeviceGetHandleByIndex(i), f"gpu{i}"))
        self._fields = _Fields(getters, self.dropped)
        self.source = f"NVML driver {nv.nvmlSystemGetDriverVersion()}"

    def read(self) -> Readings:
        return self._fields.read()

    def close(self) -> None:
        nv = getattr(self, "_nv", None)
        if nv is not None:
            self._nv = None
            nv.nvmlShutdown()  # reference counted: other users of NVML are unaffected


# amdgpu hwmon/device files -> (metric suffix, scale to the metric's unit)
AMDGPU_FILES: dict[str, tuple[str, float]] = {
    "hwmon/power1_average": ("power_w", 1e-6),  # microwatts
    "hwmon/power1_input": ("power_w", 1e-6),  # RDNA3+ report instantaneous power only
    "hwmon/temp1_input": ("temp_c", 1e-3),  # edge
    "hwmon/temp2_input": ("temp_junction_c", 1e-3),
    "hwmon/temp3_input": ("temp_mem_c", 1e-3),
    "hwmon/freq1_input": ("freq_mhz", 1e-6),  # sclk in Hz
    "hwmon/freq2_input": ("mem_freq_mhz", 1e-6),
    "gpu_busy_percent": ("util_pct", 1.0),
    "mem_info_vram_used": ("mem_used_bytes", 1.0),
}


@register_reader
class AmdGpuReader(Reader):
    """AMD GPUs through the amdgpu driver's sysfs (no library needed)."""

    name = "amdgpu"

    def open(self) -> None:
        base = self.ctx.sysfs_root / "class/drm"
        cards = [c for c in sorted(base.glob("card*")) if re.fullmatch(r"card\d+", c.name)]
        getters: dict[str, Callable[[], float]] = {}
        for idx, card in enumerate(c for c in cards if self._is_amd(c)):
            getters.update(self._card_getters(card / "device", f"amdgpu{idx}"))
        self._fields = _Fields(getters, self.dropped)
        if not self._fields:
            raise SourceUnavailable("no amdgpu card with hwmon files under /sys/class/drm")
        self.source = "sysfs amdgpu"

    @staticmethod
    def _is_amd(card: Path) -> bool:
        try:
            return _read_text(card / "device/vendor") == "0x1002"
        except OSError:
            return False

    @staticmethod
    def _card_getters(device: Path, prefix: str) -> dict[str, Callable[[], float]]:
        # "hwmon/x" names a file of the card's (single) hwmon directory, whatever its number
        hwmon = next(iter(sorted(device.glob("hwmon/hwmon*"))), device / "hwmon/missing")
        getters: dict[str, Callable[[], float]] = {}
        for rel, (suffix, scale) in AMDGPU_FILES.items():
            path = hwmon / rel.removeprefix("hwmon/") if rel.startswith("hwmon/") else device / rel
            key = f"{prefix}.{suffix}"
            if key not in getters and path.exists():  # first listed file wins (power)
                getters[key] = _file_getter(path, scale)
        return getters

    def read(self) -> Readings:
        return self._fields.read()


# --------------------------------------------------------------------------- verdict

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


# --------------------------------------------------------------------------- summary


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


# --------------------------------------------------------------------------- sampler


class Sampler:
    """Background thread that samples every available reader every `interval_s`.

    Readers are opened in start() on the caller's thread, so `unavailable` is complete as
    soon as start() returns; reads happen on the sampler thread. A Sampler runs once.
    """

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        readers: Mapping[str, ReaderFactory] | None = None,
        sysfs_root: Path | str = "/sys",
        procfs_root: Path | str = "/proc",
        pid: int | None = None,
    ) -> None:
        if not interval_s >= MIN_INTERVAL_S:
            raise ValueError(f"interval_s must be >= {MIN_INTERVAL_S} s, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self._factories = dict(READERS if readers is None else readers)
        self._ctx = ReaderContext(Path(sysfs_root), Path(procfs_root), pid or os.getpid())
        self._active: dict[str, Reader] = {}
        self._closed: dict[str, Reader] = {}  # kept after stop for `dropped` and `source`
        self._disabled: dict[str, str] = {}
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Sampler:
        if self._thread is not None:
            raise RuntimeError("a Sampler runs once; create a new one for another run")
        for name, factory in self._factories.items():
            self._open(name, factory)
        self._thread = threading.Thread(target=self._run, name="strata-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Take a last sample, join the thread and release the readers. Idempotent."""
        thread = self._thread
        if thread is None or (not thread.is_alive() and not self._active):
            return  # never started, or already stopped
        self._stop.set()
        thread.join(timeout=max(5.0, 10 * self.interval_s))
        if thread.is_alive():
            # A reader is stuck in the kernel or a driver: do not close what it is using.
            self._disabled["sampler"] = "sampler thread did not stop; a reader is hanging"
            return
        for name in list(self._active):
            self._close(name)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- results

    @property
    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    def latest(self) -> Sample | None:
        with self._lock:
            return self._samples[-1] if self._samples else None

    @property
    def unavailable(self) -> dict[str, str]:
        """reader (or reader.field) -> why it gives no readings here."""
        out = dict(self._disabled)
        for name, reader in list(self._active.items()) + list(self._closed.items()):
            out.update({f"{name}.{k}": v for k, v in dict(reader.dropped).items()})
        return out

    @property
    def sources(self) -> dict[str, str]:
        """reader -> where its readings come from, for readers that worked."""
        readers = list(self._active.items()) + list(self._closed.items())
        return {name: r.source for name, r in readers if name not in self._disabled}

    def summary(self) -> TelemetrySummary:
        return summarize(self.samples, self.interval_s, self.unavailable, self.sources)

    def to_dict(self, include_samples: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"summary": self.summary().to_dict()}
        if include_samples:
            out["samples"] = [s.to_dict() for s in self.samples]
        return out

    # -- internals

    def _open(self, name: str, factory: ReaderFactory) -> None:
        try:
            reader = factory(self._ctx)
            reader.open()
        except SourceUnavailable as exc:
            self._disabled[name] = str(exc)
            return
        except Exception as exc:  # a broken reader must never stop the sampler
            self._disabled[name] = f"open failed: {_describe(exc)}"
            return
        self._active[name] = reader

    def _close(self, name: str) -> None:
        reader = self._active.pop(name)
        self._closed[name] = reader
        try:
            reader.close()
        except Exception as exc:
            reader.dropped["close"] = _describe(exc)

    def _take_sample(self) -> None:
        t_ns = time.perf_counter_ns()
        readings: Readings = {}
        for name, reader in list(self._active.items()):
            try:
                readings.update(reader.read())
            except Exception as exc:  # disable once, keep the reason, keep sampling
                self._disabled[name] = f"read failed: {_describe(exc)}"
                self._close(name)
        with self._lock:
            self._samples.append(Sample(t_ns, readings))

    def _run(self) -> None:
        next_t = time.perf_counter()
        while True:
            self._take_sample()
            next_t += self.interval_s
            delay = next_t - time.perf_counter()
            if delay < 0:  # a slow read overran the interval: skip ticks, never burst
                next_t, delay = time.perf_counter(), 0.0
            if self._stop.wait(delay):
                break
        self._take_sample()  # at stop, so counters and energy cover the whole run
