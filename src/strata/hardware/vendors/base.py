"""The records a vendor file fills in: how torch addresses its devices (`Runtime`) and what
strata knows about the hardware family (`Vendor`); `Device` is one device of a vendor.

Two names per device, on purpose: strata's key names the vendor path ("rocm:0": the probe,
the roofline and the verdicts use it), torch's device string names the runtime ("cuda:0":
PyTorch drives ROCm GPUs through its cuda device type). Code that hands a device to torch
uses `Device.torch_key`, never the strata key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from strata.hardware.vendors.rules import HintFn, RuleFn


def _no_sync(device: str) -> None:
    """Synchronous devices (the CPU) have nothing to wait for."""


def _no_memory(device: str) -> tuple[int, int] | None:
    return None


def _no_cache(device: str) -> int | None:
    return None


@dataclass(frozen=True)
class Runtime:
    """One torch device type and how to wait for it, time it and ask it about memory.

    The callables take torch's device string and import torch themselves, so a record can be
    built (and `strata probe` run) where torch is not installed."""

    torch_type: str  # "cuda", "mps", "xpu", "cpu": what torch.device() accepts
    indexed: bool = True  # False: torch names the one device without an ordinal ("mps")
    sync: Callable[[str], None] = _no_sync
    clock: Callable[[str], Any] | None = None  # None: the host wall clock around `sync`
    memory: Callable[[str], tuple[int, int] | None] = _no_memory  # (free, total) bytes
    cache_bytes: Callable[[str], int | None] = _no_cache  # last-level cache the lab flushes

    def device_string(self, index: int) -> str:
        return f"{self.torch_type}:{index}" if self.indexed else self.torch_type

    def make_clock(self, device: str) -> Any:
        """A clock for timed calls on `device` (measure.timer's protocol)."""
        if self.clock is not None:
            return self.clock(device)
        from strata.measure.timer import HostClock

        if self.sync is _no_sync:  # nothing to wait for: keep even a no-op call out of timings
            return HostClock()
        return HostClock(lambda: self.sync(device))


@dataclass(frozen=True)
class Vendor:
    """A hardware family as strata sees it; one file per vendor registers one of these."""

    backend: str  # strata's name of the path that drives it: "cuda", "rocm", "mps", "xpu", "cpu"
    vendor: str  # GpuInfo.vendor: "nvidia", "amd", "apple", "intel", "cpu"
    runtime: Runtime
    accelerator: bool = True  # a GPU-like device kernels may ask for with "gpu"
    triton: bool = False  # Triton compiles for it (the CPU only gets the interpreter)
    # torch_build prefixes that can drive it; None: any build (macOS wheels carry MPS).
    build_tags: tuple[str, ...] | None = None
    rules: RuleFn | None = None  # None: no sourced rules, the smoke test decides
    install_hint: HintFn | None = None

    def key(self, index: int) -> str:
        """strata's device key ("rocm:0"), the same as GpuInfo.key."""
        return f"{self.backend}:{index}"

    def torch_key(self, index: int) -> str:
        """torch's device string for the device at `index` ("cuda:0" for ROCm, "mps")."""
        return self.runtime.device_string(index)


@dataclass(frozen=True)
class Device:
    """One device of this host: its vendor record, ordinal, arch and name."""

    vendor: Vendor
    index: int = 0
    arch: str | None = None
    name: str = ""

    @property
    def kind(self) -> str:
        return self.vendor.backend

    @property
    def key(self) -> str:
        return "cpu" if self.kind == "cpu" else self.vendor.key(self.index)

    @property
    def torch_key(self) -> str:
        return self.vendor.torch_key(self.index)

    def sync(self) -> None:
        self.vendor.runtime.sync(self.torch_key)

    def clock(self) -> Any:
        return self.vendor.runtime.make_clock(self.torch_key)

    def memory(self) -> tuple[int, int] | None:
        return self.vendor.runtime.memory(self.torch_key)
