"""GPUs visible only through PyTorch: Apple MPS and Intel XPU.

CUDA/ROCm devices are found by NVML/KFD without importing torch; torch is the only
window onto MPS and XPU devices.
"""

from __future__ import annotations

import platform
from typing import Any

from strata.hardware.gpu import ProbeUnavailable, register
from strata.hardware.profile import GpuInfo


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ProbeUnavailable("torch not installed (pip install 'strata[torch]')") from exc
    return torch


@register("mps")
def probe_mps() -> list[GpuInfo]:
    torch = _torch()
    if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ProbeUnavailable("torch.backends.mps not available (not an Apple-silicon Mac)")
    chip = platform.processor() or "Apple silicon"
    return [GpuInfo(index=0, vendor="apple", name=chip, backend="mps",
                    arch=_apple_arch(), source="torch")]


def _apple_arch() -> str | None:
    import subprocess

    try:
        brand = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                               text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    # "Apple M3 Pro" -> "apple-m3"
    parts = brand.lower().split()
    return f"apple-{parts[1]}" if len(parts) > 1 and parts[0] == "apple" else None


@register("xpu")
def probe_xpu() -> list[GpuInfo]:
    torch = _torch()
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        raise ProbeUnavailable("torch.xpu not available (no Intel GPU or non-XPU torch build)")
    gpus = []
    for i in range(xpu.device_count()):
        props = xpu.get_device_properties(i)
        gpus.append(GpuInfo(index=i, vendor="intel", name=props.name, backend="xpu",
                            memory_total_bytes=int(props.total_memory),
                            driver_version=getattr(props, "driver_version", None),
                            source="torch"))
    return gpus
