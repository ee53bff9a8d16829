"""Utilisation and memory readers through psutil: system CPU use, the process's RSS."""

from __future__ import annotations

from typing import Any

from strata.hardware.telemetry.readers.base import (
    Reader,
    SourceUnavailable,
    _describe,
    register_reader,
)
from strata.hardware.telemetry.samples import Readings


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
