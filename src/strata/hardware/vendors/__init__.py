"""Typed devices: one file per vendor in this package, each registering its `Vendor`.

Like tinygrad's device files, a vendor is found by name: every module here is imported once
on first lookup and registers itself, so adding a vendor is adding a file. Lookups go by
strata's backend name ("rocm"), by a strata device key ("rocm:0") or by a torch device string
("cuda:0"), and no caller builds a device string by hand.
"""

from __future__ import annotations

import importlib
import pkgutil

from strata.hardware.profile import GpuInfo
from strata.hardware.vendors.base import Device, Runtime, Vendor

__all__ = ["Device", "Runtime", "Vendor", "all_vendors", "device_for_gpu", "get_vendor",
           "register", "runtime_for", "torch_device"]

# Modules of this package that hold shared pieces, not a vendor.
_NOT_VENDORS = frozenset({"base", "rules"})

_VENDORS: dict[str, Vendor] = {}
_RUNTIMES: dict[str, Runtime] = {}
_loaded = False


def register(vendor: Vendor) -> Vendor:
    _VENDORS[vendor.backend] = vendor
    # Several vendors may share one torch runtime (NVIDIA and AMD both use "cuda").
    _RUNTIMES.setdefault(vendor.runtime.torch_type, vendor.runtime)
    return vendor


def _discover() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _NOT_VENDORS:
            importlib.import_module(f"{__name__}.{info.name}")


def all_vendors() -> list[Vendor]:
    _discover()
    return list(_VENDORS.values())


def get_vendor(backend: str) -> Vendor | None:
    """The vendor record of a backend name ("cuda", "rocm", "mps", "xpu", "cpu")."""
    _discover()
    return _VENDORS.get(backend)


def device_for_gpu(gpu: GpuInfo) -> Device:
    """The typed device of a probed GPU; KeyError names a backend no vendor file claims."""
    vendor = get_vendor(gpu.backend)
    if vendor is None:
        raise KeyError(f"no vendor file for backend {gpu.backend!r} (strata.hardware.vendors)")
    return Device(vendor, gpu.index, gpu.arch, gpu.name)


def torch_device(key: str) -> str:
    """torch's device string for a strata key: 'rocm:0' -> 'cuda:0', 'mps:0' -> 'mps'.

    A key that already is a torch device string ('cuda:1', 'cpu') comes back unchanged."""
    backend, _, index = key.strip().lower().partition(":")
    vendor = get_vendor(backend)
    if vendor is None:
        return key
    return vendor.torch_key(int(index) if index else 0)


def runtime_for(device: str) -> Runtime:
    """The runtime of a torch device string ('cuda:0', 'cpu'); KeyError for unknown types."""
    _discover()
    torch_type = device.strip().lower().split(":", 1)[0]
    if torch_type not in _RUNTIMES:
        raise KeyError(f"no runtime for torch device {device!r}")
    return _RUNTIMES[torch_type]
