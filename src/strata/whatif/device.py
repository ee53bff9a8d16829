"""A catalogue device as the rest of strata sees a machine: a host profile (for fit's memory
verdicts) and a roofline of its datasheet figures (for explain's ceilings).

A discrete GPU sits in a host whose RAM is given (`--ram`, else this host's); a unified chip
(Apple M-series, Strix Halo, DGX Spark) is one memory the CPU and GPU share: its GPU may use
the part the OS lets it wire (Apple: macOS's recommended working set); a CPU platform holds
the model in its DRAM.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from strata.hardware.catalogue import CATALOGUE_DIR, CatalogueDevice
from strata.hardware.profile import CacheLevel, CpuInfo, GpuInfo, HostProfile, SoftwareStack
from strata.measure.roofline import DeviceRoofline, Figure

TORCH_BACKEND = {"nvidia": "cuda", "amd": "rocm", "intel": "xpu", "apple": "mps"}
RULES_FILE = CATALOGUE_DIR / "rules" / "unified.json"


@lru_cache(maxsize=1)
def unified_rules() -> dict[str, Any]:
    return json.loads(RULES_FILE.read_text(encoding="utf-8"))


def gpu_usable_bytes(dev: CatalogueDevice) -> tuple[int, str]:
    """Memory the device's GPU may hold a model in, and why that much."""
    if dev.kind != "unified":
        return dev.memory_bytes, (f"{dev.memory_gib:g} GiB of device memory "
                                  f"({dev.source('memory_gib')})")
    rule = unified_rules().get(dev.vendor)
    if rule is None:
        return dev.memory_bytes, (f"{dev.memory_gib:g} GiB unified memory, all of it (no "
                                  "sourced limit on the GPU's share for this vendor)")
    small = dev.memory_gib <= rule["small_gib"]
    frac = rule["fraction_small"] if small else rule["fraction_large"]
    return int(dev.memory_bytes * frac), (f"{frac:.3g} of {dev.memory_gib:g} GiB unified "
                                          f"memory: {rule['what']} ({rule['source']})")


@dataclass(frozen=True)
class Hosting:
    """The machine a catalogue device would sit in, for fit: RAM beside a discrete GPU."""

    ram_bytes: int
    cpu: CpuInfo | None = None  # this host's CPU (a discrete GPU's neighbour); None: generic


def host_profile(dev: CatalogueDevice, hosting: Hosting) -> HostProfile:
    sw = SoftwareStack(python="", os="", strata="")
    if dev.kind == "cpu":
        return HostProfile(dev.id, _platform_cpu(dev), [], sw)
    if dev.kind == "unified":
        cpu = CpuInfo(arch="arm64" if dev.vendor in ("apple", "nvidia") else "x86_64",
                      vendor=dev.vendor, model=dev.name, ram_total_bytes=dev.memory_bytes,
                      ram_available_bytes=dev.memory_bytes)
    else:
        base = hosting.cpu or CpuInfo(arch="x86_64", model="host CPU")
        cpu = CpuInfo(arch=base.arch, vendor=base.vendor, model=base.model,
                      physical_cores=base.physical_cores, caches=list(base.caches),
                      isa=list(base.isa), ram_total_bytes=hosting.ram_bytes,
                      ram_available_bytes=hosting.ram_bytes)
    usable, _ = gpu_usable_bytes(dev)
    gpu = GpuInfo(index=0, vendor=dev.vendor, name=dev.name,
                  backend=TORCH_BACKEND.get(dev.vendor, "cuda"), arch=dev.arch,
                  memory_total_bytes=usable, source="catalogue")
    return HostProfile(dev.id, cpu, [gpu], sw)


def _platform_cpu(dev: CatalogueDevice) -> CpuInfo:
    caches = [CacheLevel(3, "unified", dev.cache_bytes, 1)] if dev.cache_bytes else []
    return CpuInfo(arch="x86_64", vendor=dev.vendor, model=dev.name,
                   physical_cores=dev.cores, caches=caches,
                   ram_total_bytes=dev.memory_bytes, ram_available_bytes=dev.memory_bytes)


def fit_device_key(dev: CatalogueDevice) -> str:
    """The fit row of `host_profile(dev)` that is the device: the GPU's, or the CPU's."""
    return "cpu" if dev.kind == "cpu" else f"{TORCH_BACKEND.get(dev.vendor, 'cuda')}:0"


def roofline(dev: CatalogueDevice) -> DeviceRoofline:
    """Datasheet figures in the roofline's shape: explain's ceilings then come from the
    same bytes and FLOPs per token as every measured result's."""
    bw = Figure(dev.bandwidth_gbs, f"datasheet: {dev.source('bandwidth_gbs')}")
    compute = {dtype: Figure(tf * 1000, f"datasheet: {dev.source('tflops')}")
               for dtype, tf in dev.tflops.items()}
    return DeviceRoofline(device=dev.id, name=dev.name, bandwidth={"read": bw},
                          compute=compute, notes=["datasheet peaks, not measured"])
