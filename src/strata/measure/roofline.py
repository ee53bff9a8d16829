"""The roofline of a device: measured peak bandwidth and FLOP/s per dtype, ridge points.

Every later command (bench η, fit predictions) reads ceilings from here, never from a
literal in its own code (docs/architecture.md §2, principle 2).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Figure:
    """One measured figure, with how it was measured."""

    value: float  # GB/s for bandwidth, GFLOP/s (GOP/s for int8) for compute
    method: str  # "C STREAM triad, 2 threads, 3 x 128 MiB arrays, best of 12"
    median: float | None = None  # same unit as value, from the median time
    # Peaks are maxima (strata.measure.peak): value is the best of these trials.
    trials: list[float] = field(default_factory=list)
    spread: float | None = None  # (best - worst) / best over the trials
    stability: str | None = None  # "stable: best two of 4 trials within 1.2%" or "NOT stable…"


@dataclass
class Peak:
    """A theoretical peak, derived or from the sourced spec table."""

    value: float
    basis: str  # "2 x 2619 MHz x 5120 bit / 8" or "NVIDIA H200 datasheet"


@dataclass
class DeviceRoofline:
    device: str  # "cpu", "cuda:0"
    name: str
    bandwidth: dict[str, Figure] = field(default_factory=dict)  # copy, triad, read, h2d, d2h
    compute: dict[str, Figure] = field(default_factory=dict)  # fp32, bf16, fp16, int8
    peak_bandwidth: Peak | None = None
    peak_compute: dict[str, Peak] = field(default_factory=dict)
    unknown: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # caveats about the figures above

    # Host<->device transfers are not the device's memory roof.
    _ON_DEVICE = ("copy", "triad", "read")

    def peak_bandwidth_gbs(self) -> float | None:
        """Best measured on-device stream rate (STREAM reports the best kernel rate)."""
        rates = [f.value for k, f in self.bandwidth.items() if k in self._ON_DEVICE]
        return max(rates) if rates else None

    def peak_gflops(self, dtype: str) -> float | None:
        fig = self.compute.get(dtype)
        return fig.value if fig else None

    def ridge_point(self, dtype: str) -> float | None:
        """FLOP per byte at which a kernel stops being memory bound."""
        bw, fl = self.peak_bandwidth_gbs(), self.peak_gflops(dtype)
        return fl / bw if bw and fl else None

    def fraction_of_peak(self, kind: str, name: str) -> float | None:
        if kind == "bandwidth":
            fig, peak = self.bandwidth.get(name), self.peak_bandwidth
        else:
            fig, peak = self.compute.get(name), self.peak_compute.get(name)
        return fig.value / peak.value if fig and peak and peak.value else None


@dataclass
class Roofline:
    devices: list[DeviceRoofline]
    seconds: float  # wall time of the whole measurement
    unknown: dict[str, str] = field(default_factory=dict)
    # HostLoad.to_dict() of each measurement attempt (other processes' CPU use meanwhile)
    host_load: list[dict[str, Any]] = field(default_factory=list)
    remeasured: list[str] = field(default_factory=list)  # what raised a figure later, and why

    @property
    def measured_busy(self) -> bool:
        """Every attempt ran while other processes were busy: the figures may be low."""
        return bool(self.host_load) and all(h.get("busy") for h in self.host_load)

    def device(self, name: str) -> DeviceRoofline | None:
        return next((d for d in self.devices if d.device == name), None)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["measured_busy"] = self.measured_busy
        for dev, raw in zip(self.devices, out["devices"], strict=True):
            raw["peak_bandwidth_gbs"] = dev.peak_bandwidth_gbs()
            raw["ridge_points"] = {d: dev.ridge_point(d) for d in dev.compute}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Roofline:
        return cls(devices=[_device(d) for d in data["devices"]], seconds=data["seconds"],
                   unknown=data.get("unknown", {}), host_load=data.get("host_load", []),
                   remeasured=data.get("remeasured", []))


def _device(d: dict[str, Any]) -> DeviceRoofline:
    peak = d.get("peak_bandwidth")
    return DeviceRoofline(
        device=d["device"], name=d["name"],
        bandwidth={k: Figure(**v) for k, v in d.get("bandwidth", {}).items()},
        compute={k: Figure(**v) for k, v in d.get("compute", {}).items()},
        peak_bandwidth=Peak(**peak) if peak else None,
        peak_compute={k: Peak(**v) for k, v in d.get("peak_compute", {}).items()},
        unknown=d.get("unknown", {}),
        notes=d.get("notes", []),
    )
