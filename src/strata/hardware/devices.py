"""One device runtime: a torch device and strata's key for it, resolved once.

Two names per device (hardware/vendors/base.py): torch's ("cuda:0" on an AMD GPU too, since
ROCm builds of torch reuse the cuda device type) and strata's key ("rocm:0"), under which the
probe, rooflines and kernel verdicts are stored. Every place that needs one from the other,
or a device sync, asks here — a key built by hand from the torch type misses every stored
ROCm row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strata.hardware.vendors import get_vendor, runtime_for


@dataclass(frozen=True)
class Device:
    torch: str  # torch's device string: "cpu", "cuda:0", "mps"
    key: str  # strata's device key: "cpu", "cuda:0", "rocm:0", "mps:0"

    @property
    def is_cpu(self) -> bool:
        return self.key == "cpu"

    def sync(self) -> None:
        """Wait for the device's queued work (nothing to wait for on the CPU)."""
        sync(self.torch)


def _hip_build() -> bool:
    """Whether the installed torch is a ROCm build (its "cuda" devices are AMD GPUs)."""
    try:
        import torch
    except ImportError:
        return False
    return getattr(torch.version, "hip", None) is not None


def resolve(spec: Any, hip: bool | None = None) -> Device:
    """A device from what a user or caller names: a strata key ("rocm:0"), a torch string
    ("cuda", "cuda:1", "mps") or a torch.device. torch's "cuda" is an AMD GPU ("rocm") when
    torch is a ROCm build (`hip`, default: the installed torch's build). KeyError for a type
    no vendor file claims."""
    text = str(spec).strip().lower()
    kind, _, index = text.partition(":")
    if kind == "cpu":
        return Device("cpu", "cpu")
    if kind == "cuda" and (_hip_build() if hip is None else hip):
        kind = "rocm"
    vendor = get_vendor(kind)
    if vendor is None:
        raise KeyError(f"no vendor file for device {text!r} (strata.hardware.vendors)")
    n = int(index) if index.isdigit() else 0
    return Device(vendor.torch_key(n), vendor.key(n))


def key_for(device: Any, hip: bool | None = None) -> str:
    """strata's key for a torch device (torch.device or string): "cuda:1" -> "cuda:1", or
    "rocm:1" on a ROCm build of torch."""
    return resolve(device, hip).key


def sync(device: Any) -> None:
    """Synchronize a torch device (torch.device or string); a no-op on the CPU."""
    text = str(device)
    if text.partition(":")[0] == "cpu":
        return
    runtime_for(text).sync(text)
