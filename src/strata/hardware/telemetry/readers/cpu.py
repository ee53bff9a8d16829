"""CPU clock and thermal-throttle readers (sysfs under /sys/devices/system/cpu)."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from strata.hardware.telemetry.readers.base import (
    Reader,
    ReaderContext,
    SourceUnavailable,
    _read_float,
    _read_text,
    register_reader,
)
from strata.hardware.telemetry.samples import Readings


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
