"""What an implementation needs (device kind, arch range, ISA features, tools) and what this
host offers. `Requires.check` says yes, or why not, in words for the decision trace."""

from __future__ import annotations

import re
import shutil
import sqlite3
from dataclasses import dataclass, field
from typing import Protocol

from strata.hardware.profile import HostProfile
from strata.hardware.vendors import all_vendors, device_for_gpu, torch_device

# Device kinds a requirement may name; "gpu" means any of the accelerator kinds. Derived from
# the vendor files, so a new vendor is a kind kernels can ask for.
GPU_KINDS = tuple(v.backend for v in all_vendors() if v.accelerator)
_ARCH = re.compile(r"^(sm|gfx)_?(\d+)(\+)?(?:-(\d+))?$")


@dataclass(frozen=True)
class ArchRange:
    family: str  # "sm" or "gfx"
    low: int
    high: int | None  # inclusive; None: open-ended ("sm_80+")

    @classmethod
    def parse(cls, text: str) -> ArchRange:
        m = _ARCH.match(text.strip().lower())
        if not m:
            raise ValueError(f"arch range {text!r}: expected e.g. sm_80+, sm_80-90, gfx1200")
        family, low, plus, high = m.groups()
        hi = None if plus else int(high) if high else int(low)
        return cls(family, int(low), hi)

    def contains(self, arch: str | None) -> bool:
        m = _ARCH.match((arch or "").lower())
        if not m or m.group(1) != self.family:
            return False
        value = int(m.group(2))
        return value >= self.low and (self.high is None or value <= self.high)

    def __str__(self) -> str:
        tail = "+" if self.high is None else "" if self.high == self.low else f"-{self.high}"
        return f"{self.family}_{self.low}{tail}"


@dataclass(frozen=True)
class Device:
    """A device as the lab sees it. `key` is strata's name ("rocm:0"): results are stored,
    dispatched and matched to the roofline and the support verdicts under it. torch knows
    the device as `torch_key` ("cuda:0": PyTorch addresses ROCm GPUs as cuda); the worker
    translates at its door, so no kernel job hands strata's name to torch."""

    key: str  # "cpu", "cuda:0", "rocm:0", "mps"
    kind: str  # "cpu", "cuda", "rocm", "mps"
    arch: str | None = None  # "sm_90", "gfx1201"
    name: str = ""

    @property
    def torch_key(self) -> str:
        return torch_device(self.key)


@dataclass
class HostCaps:
    """The probe's view of this host, reduced to what kernels can require."""

    isa: set[str]
    devices: list[Device]
    tools: set[str] = field(default_factory=set)  # "cc", "nvcc", "triton"
    profile: HostProfile | None = None

    def device(self, key: str) -> Device | None:
        kind = key.split(":")[0]
        for dev in self.devices:
            if dev.key == key or (":" not in key and dev.kind == kind):
                return dev
        return None


def triton_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


class KernelHost(Protocol):
    """Where dispatch and verification look: the results store, the host's fingerprint in it
    and what the host can run. A `strata.host.Host` (this machine) or a `RecordedHost`."""

    @property
    def conn(self) -> sqlite3.Connection: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def caps(self) -> HostCaps: ...


@dataclass(frozen=True)
class RecordedHost:
    """A host known from recorded data, not probed here (a GPU this machine lacks): its
    fingerprint in `conn` and the capabilities its recorded probe gives."""

    conn: sqlite3.Connection
    fingerprint: str
    caps: HostCaps


def host_caps(profile: HostProfile) -> HostCaps:
    devices = [Device("cpu", "cpu", profile.cpu.arch, profile.cpu.model or "")]
    for gpu in profile.gpus:
        dev = device_for_gpu(gpu)
        # One device without an ordinal in torch ("mps") keeps that bare name in the lab too.
        key = dev.key if dev.vendor.runtime.indexed else dev.torch_key
        devices.append(Device(key, dev.kind, gpu.arch, gpu.name))
    return HostCaps(set(profile.cpu.isa), devices, _tools(), profile)


def _tools() -> set[str]:
    """The tools every dialect asks about (Dialect.tool_probes), present on this host."""
    from strata.kernels.dialects import DIALECTS

    probes = {name: probe for d in DIALECTS.values() for name, probe in d.tool_probes.items()}
    return {name for name, present in probes.items() if present()}


def c_compiler_present() -> bool:
    return any(shutil.which(name) for name in ("cc", "gcc", "clang"))


def nvcc_present() -> bool:
    return shutil.which("nvcc") is not None


@dataclass(frozen=True)
class Requires:
    device: str = "cpu"  # "cpu", "cuda", "rocm", "gpu", "any"
    arch: ArchRange | None = None
    isa: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str, default_device: str = "cpu") -> Requires:
        """From a declaration such as "avx2,fma" or "cuda,sm_80+" (docs/kernels-abi.md)."""
        device, arch, isa = default_device, None, []
        for item in filter(None, (t.strip().lower() for t in text.split(","))):
            if item in (*GPU_KINDS, "cpu", "gpu", "any"):
                device = item
            elif _ARCH.match(item):
                arch = ArchRange.parse(item)
            else:
                isa.append(item)
        return cls(device, arch, tuple(isa))

    def describe(self) -> str:
        parts = [self.device] + ([str(self.arch)] if self.arch else []) + list(self.isa)
        return ",".join(parts)

    def matching_device(self, caps: HostCaps) -> Device | None:
        for dev in caps.devices:
            kind_ok = (self.device in (dev.kind, "any")
                       or (self.device == "gpu" and dev.kind in GPU_KINDS))
            if kind_ok and (self.arch is None or self.arch.contains(dev.arch)):
                return dev
        return None

    def check(self, caps: HostCaps) -> str | None:
        """None when this host satisfies the requirement, else the reason it does not."""
        missing_tools = [t for t in self.tools if t not in caps.tools]
        if missing_tools:
            return f"needs {', '.join(missing_tools)} (not found on this host)"
        if self.matching_device(caps) is None:
            want = self.device + (f" {self.arch}" if self.arch else "")
            have = ", ".join(f"{d.kind}{' ' + d.arch if d.arch and d.kind != 'cpu' else ''}"
                             for d in caps.devices)
            return f"needs a {want} device (this host has: {have})"
        missing = [f for f in self.isa if f not in caps.isa]
        if missing:
            return f"needs CPU features {', '.join(missing)} (this CPU lacks them)"
        return None
