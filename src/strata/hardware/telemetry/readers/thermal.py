"""Temperature readers: hwmon chips and ACPI/SoC thermal zones (sysfs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from strata.hardware.telemetry.readers.base import (
    Reader,
    SourceUnavailable,
    _Fields,
    _file_getter,
    _read_text,
    _slug,
    register_reader,
)
from strata.hardware.telemetry.samples import Readings


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
