"""NVIDIA GPUs through NVML (package nvidia-ml-py, imported lazily)."""

from __future__ import annotations

from typing import Any

from strata.hardware.gpu import ProbeUnavailable, register
from strata.hardware.profile import GpuInfo


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise ProbeUnavailable("nvidia-ml-py not installed (pip install 'strata[nvidia]')") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise ProbeUnavailable(f"NVML failed to initialise: {exc}") from exc
    return pynvml


def _try(unknown: dict[str, str], name: str, fn: Any, *args: Any) -> Any:
    """Call one NVML query; a query the device/driver does not support is recorded."""
    try:
        return fn(*args)
    except Exception as exc:
        unknown[name] = f"NVML: {exc}"
        return None


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


@register("nvidia")
def probe_nvidia() -> list[GpuInfo]:
    nv = _nvml()
    try:
        driver = _text(nv.nvmlSystemGetDriverVersion())
        return [_one(nv, i, driver) for i in range(nv.nvmlDeviceGetCount())]
    finally:
        nv.nvmlShutdown()


def _one(nv: Any, index: int, driver: str | None) -> GpuInfo:
    h = nv.nvmlDeviceGetHandleByIndex(index)
    gpu = GpuInfo(index=index, vendor="nvidia", name=_text(nv.nvmlDeviceGetName(h)) or "?",
                  backend="cuda", driver_version=driver, source="nvml")
    cc = _try(gpu.unknown, "arch", nv.nvmlDeviceGetCudaComputeCapability, h)
    if cc:
        gpu.arch = f"sm_{cc[0]}{cc[1]}"
    mem = _try(gpu.unknown, "memory_total_bytes", nv.nvmlDeviceGetMemoryInfo, h)
    gpu.memory_total_bytes = int(mem.total) if mem else None
    gpu.bus_width_bits = _try(gpu.unknown, "bus_width_bits", nv.nvmlDeviceGetMemoryBusWidth, h)
    gpu.mem_clock_max_mhz = _try(gpu.unknown, "mem_clock_max_mhz", nv.nvmlDeviceGetMaxClockInfo,
                                 h, nv.NVML_CLOCK_MEM)
    gpu.sm_clock_max_mhz = _try(gpu.unknown, "sm_clock_max_mhz", nv.nvmlDeviceGetMaxClockInfo,
                                h, nv.NVML_CLOCK_SM)
    gpu.multiprocessors = _try(gpu.unknown, "multiprocessors",
                               getattr(nv, "nvmlDeviceGetNumGpuCores", None) or _no_query, h)
    pci = _try(gpu.unknown, "pci_bus_id", nv.nvmlDeviceGetPciInfo, h)
    gpu.pci_bus_id = _text(pci.busId) if pci else None
    return gpu


def _no_query(*_: Any) -> None:
    raise RuntimeError("query not available in this nvidia-ml-py")


def cuda_driver_api() -> str | None:
    """Highest CUDA version the installed driver supports, e.g. '12.8' (None without NVML)."""
    try:
        nv = _nvml()
    except ProbeUnavailable:
        return None
    try:
        v = nv.nvmlSystemGetCudaDriverVersion_v2()
        return f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:
        return None
    finally:
        nv.nvmlShutdown()
