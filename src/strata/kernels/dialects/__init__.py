"""Dialect registry: every module of this package that defines `DIALECT` is one dialect
(found by name, like the vendor files); core code looks them up here. Adding a dialect is
adding one file (plus its sources under kernels/sources/<name>/)."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from strata.errors import InputError
from strata.kernels.dialects.base import Dialect, Kernel


def _discover() -> dict[str, Dialect]:
    found: dict[str, Dialect] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name == "base":
            continue
        dialect = getattr(importlib.import_module(f"{__name__}.{info.name}"), "DIALECT", None)
        if isinstance(dialect, Dialect):
            found[dialect.name] = dialect
    # The historical order (c, triton, cuda) keeps listings stable; new ones follow.
    order = {"c": 0, "triton": 1, "cuda": 2}
    return dict(sorted(found.items(), key=lambda kv: (order.get(kv[0], 9), kv[0])))


DIALECTS: dict[str, Dialect] = _discover()


def get_dialect(name: str, path: Path | None = None) -> Dialect:
    if name not in DIALECTS:
        where = f"FILE {path}: " if path else ""
        raise InputError(f"{where}unknown dialect {name!r} (choose from {', '.join(DIALECTS)})")
    return DIALECTS[name]


__all__ = ["DIALECTS", "Dialect", "Kernel", "get_dialect"]
