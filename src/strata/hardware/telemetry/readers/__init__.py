"""Telemetry readers: the contract and registry (base.py) and one module per source.

Each source module registers its readers by name when it is imported. The order of
READER_MODULES is the order readers are opened and read each tick, and so the order of
`Sampler.sources` and `Sampler.unavailable`: it is spelled out here, not left to
whichever module happens to be imported first.
"""

from __future__ import annotations

from importlib import import_module

from strata.hardware.telemetry.readers.base import (
    READERS,
    Reader,
    ReaderContext,
    ReaderFactory,
    SourceUnavailable,
    register_reader,
)

READER_MODULES = ("cpu", "thermal", "rapl", "usage", "nvml", "amdgpu")

for _module in READER_MODULES:
    import_module(f"{__name__}.{_module}")

__all__ = [
    "READERS",
    "READER_MODULES",
    "Reader",
    "ReaderContext",
    "ReaderFactory",
    "SourceUnavailable",
    "register_reader",
]
