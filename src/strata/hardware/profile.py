"""Dataclasses that describe a host: CPU, GPUs, software stack, support verdicts.

Every probe part fills what it can and records what it could not learn in `unknown`
(field -> reason), so a missing library or an unreadable sysfs file is reported, never
guessed and never a crash.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any


@dataclass
class CacheLevel:
    level: int
    kind: str  # "data", "instruction", "unified"
    size_bytes: int
    instances: int = 1  # how many copies exist on the package (per-core L1/L2 vs shared L3)


@dataclass
class CpuInfo:
    arch: str  # platform.machine(): x86_64, aarch64, arm64
    vendor: str | None = None
    model: str | None = None
    family: int | None = None
    model_id: int | None = None
    physical_cores: int | None = None
    logical_threads: int | None = None
    freq_mhz_max: float | None = None
    freq_mhz_nominal: float | None = None
    caches: list[CacheLevel] = field(default_factory=list)
    numa_nodes: int | None = None
    isa: list[str] = field(default_factory=list)  # normalised names, see cpu.ISA_FLAGS
    ram_total_bytes: int | None = None
    ram_available_bytes: int | None = None
    unknown: dict[str, str] = field(default_factory=dict)

    def cache_bytes(self, level: int) -> int | None:
        """Total bytes of one cache level across the package (data/unified only)."""
        sizes = [c.size_bytes * c.instances for c in self.caches
                 if c.level == level and c.kind != "instruction"]
        return sum(sizes) if sizes else None

    def last_level_cache_bytes(self) -> int | None:
        levels = [c.level for c in self.caches if c.kind != "instruction"]
        return self.cache_bytes(max(levels)) if levels else None


@dataclass
class GpuInfo:
    index: int
    vendor: str  # "nvidia", "amd", "apple", "intel"
    name: str
    backend: str  # what drives it in torch: "cuda", "rocm", "mps", "xpu"
    arch: str | None = None  # "sm_90", "gfx1201" (physical), "apple-m3", ...
    memory_total_bytes: int | None = None
    bus_width_bits: int | None = None
    mem_clock_max_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    multiprocessors: int | None = None
    driver_version: str | None = None
    pci_bus_id: str | None = None
    source: str = ""  # "nvml", "amdsmi", "kfd-sysfs", "torch"
    unknown: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.backend}:{self.index}"


@dataclass
class SoftwareStack:
    python: str
    os: str
    strata: str
    torch: str | None = None
    torch_build: str | None = None  # "cpu", "cuda 12.8", "rocm 6.4"
    torch_arch_list: list[str] = field(default_factory=list)  # sm_XY / compute_XY / gfxNNNN
    torch_cuda_runtime: str | None = None
    torch_hip_runtime: str | None = None
    llama_cpp: str | None = None  # llama-cpp-python's (the binding's) version
    llama_cpp_version: str | None = None  # libllama's own llama_version(), e.g. "0.5.0-dev"
    llama_cpp_commit: str | None = None  # llama.cpp commit it was built from (ggml_commit)
    llama_cpp_features: str | None = None
    triton: str | None = None
    nvidia_driver: str | None = None
    cuda_driver_api: str | None = None  # highest CUDA version the driver supports, "12.8"
    amd_driver: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # relevant overrides, e.g. HSA_OVERRIDE_*
    unknown: dict[str, str] = field(default_factory=dict)


@dataclass
class SmokeResult:
    device: str  # "cpu", "cuda:0", ...
    ok: bool
    dtypes_ok: list[str] = field(default_factory=list)
    dtypes_failed: dict[str, str] = field(default_factory=dict)  # dtype -> failure class
    failure_class: str | None = None  # whole-device failure class, if any
    detail: str = ""  # first line(s) of the error text
    seconds: float | None = None


@dataclass
class SupportVerdict:
    device: str
    status: str  # "supported", "partial", "unsupported", "unknown"
    works: list[str] = field(default_factory=list)
    fails: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    remedy: str | None = None
    smoke: SmokeResult | None = None


@dataclass
class HostProfile:
    hostname: str
    cpu: CpuInfo
    gpus: list[GpuInfo]
    software: SoftwareStack
    verdicts: list[SupportVerdict] = field(default_factory=list)
    unknown: dict[str, str] = field(default_factory=dict)  # e.g. "gpu.nvidia": "NVML: no driver"

    def fingerprint(self) -> str:
        """Stable id of hardware + software stack: same machine and stack -> same id.

        Volatile values (available RAM, current clocks, hostname) are left out so that
        repeated probes of one machine land on one host record.
        """
        cpu = self.cpu
        hw = {
            "cpu": [cpu.arch, cpu.vendor, cpu.model, cpu.physical_cores, cpu.logical_threads,
                    sorted(cpu.isa), cpu.ram_total_bytes and cpu.ram_total_bytes >> 28],
            "gpus": [[g.vendor, g.name, g.arch, g.memory_total_bytes, g.pci_bus_id]
                     for g in self.gpus],
        }
        sw = self.software
        stack = [sw.python, sw.os, sw.torch, sw.torch_build, sw.llama_cpp, sw.triton,
                 sw.nvidia_driver, sw.amd_driver]
        blob = json.dumps({"hw": hw, "sw": stack}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostProfile:
        return _from_dict(cls, data)


def _from_dict(cls: type, data: Any) -> Any:
    """Rebuild nested dataclasses from `asdict` output (recorded probe data, DB rows)."""
    if not is_dataclass(cls) or not isinstance(data, dict):
        return data
    hints = {f.name: f.type for f in fields(cls)}
    kwargs = {}
    for name, value in data.items():
        if name not in hints:
            continue  # tolerate fields from newer versions
        kwargs[name] = _convert(hints[name], value)
    return cls(**kwargs)


_NESTED = {
    "CpuInfo": CpuInfo, "GpuInfo": GpuInfo, "SoftwareStack": SoftwareStack,
    "SupportVerdict": SupportVerdict, "SmokeResult": SmokeResult, "CacheLevel": CacheLevel,
}


def _convert(type_str: Any, value: Any) -> Any:
    text = str(type_str)
    for name, klass in _NESTED.items():
        if f"list[{name}]" in text and isinstance(value, list):
            return [_from_dict(klass, v) for v in value]
        if text.startswith(name) and isinstance(value, dict):
            return _from_dict(klass, value)
    return value
