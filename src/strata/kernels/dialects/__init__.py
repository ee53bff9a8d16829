"""Dialect registry: each module registers one Dialect; core code looks them up by name."""

from __future__ import annotations

from pathlib import Path

from strata.errors import InputError
from strata.kernels.dialects import c, cuda, triton
from strata.kernels.dialects.base import Dialect, Kernel

DIALECTS: dict[str, Dialect] = {d.name: d for d in (c.DIALECT, triton.DIALECT, cuda.DIALECT)}


def get_dialect(name: str, path: Path | None = None) -> Dialect:
    if name not in DIALECTS:
        where = f"FILE {path}: " if path else ""
        raise InputError(f"{where}unknown dialect {name!r} (choose from {', '.join(DIALECTS)})")
    return DIALECTS[name]


__all__ = ["DIALECTS", "Dialect", "Kernel", "get_dialect"]
