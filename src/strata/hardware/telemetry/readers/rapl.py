"""Energy reader: Intel/AMD RAPL counters (sysfs powercap), with counter-wrap handling."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from strata.hardware.telemetry.readers.base import (
    Reader,
    SourceUnavailable,
    _first_readable,
    _read_float,
    _read_text,
    _slug,
    register_reader,
)
from strata.hardware.telemetry.samples import Readings


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
