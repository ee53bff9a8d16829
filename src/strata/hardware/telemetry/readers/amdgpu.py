"""AMD GPU reader through the amdgpu driver's sysfs files (no library needed)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from strata.hardware.telemetry.readers.base import (
    Reader,
    SourceUnavailable,
    _Fields,
    _file_getter,
    _read_text,
    register_reader,
)
from strata.hardware.telemetry.samples import Readings

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
