"""GPU probers: one module per vendor path, each registered by name.

A prober returns the GPUs it found or raises `ProbeUnavailable` with the reason
(library missing, driver failed to initialise, permission denied). `probe_gpus` never
raises: reasons are collected so the probe can say what it could not learn.
"""

from __future__ import annotations

from collections.abc import Callable

from strata.hardware.profile import GpuInfo


class ProbeUnavailable(Exception):
    """This path cannot see GPUs here; the message says why."""


Prober = Callable[[], list[GpuInfo]]
PROBERS: dict[str, Prober] = {}


def register(name: str) -> Callable[[Prober], Prober]:
    def deco(fn: Prober) -> Prober:
        PROBERS[name] = fn
        return fn

    return deco


def probe_gpus() -> tuple[list[GpuInfo], dict[str, str]]:
    """All GPUs any prober sees, de-duplicated by (vendor, pci bus id or name+index)."""
    from strata.hardware.gpu import amd, nvidia, torch_devices  # noqa: F401  (registration)

    gpus: list[GpuInfo] = []
    unknown: dict[str, str] = {}
    for name, prober in PROBERS.items():
        try:
            found = prober()
        except ProbeUnavailable as exc:
            unknown[f"gpu.{name}"] = str(exc)
            continue
        except Exception as exc:  # a vendor library misbehaving must not end the probe
            unknown[f"gpu.{name}"] = f"{type(exc).__name__}: {exc}"
            continue
        gpus.extend(g for g in found if not _already_seen(g, gpus))
    return gpus, unknown


def _already_seen(gpu: GpuInfo, seen: list[GpuInfo]) -> bool:
    return any(g.vendor == gpu.vendor and g.index == gpu.index for g in seen)
