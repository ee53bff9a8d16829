"""Every implementation strata knows for an op: built-in sources, external kernels added
with `strata kernels add`, and the torch baselines (eager, torch.compile)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from strata.kernels.capability import Requires
from strata.kernels.impl import Implementation, builtin_implementations, from_source
from strata.kernels.spec import all_specs, get_spec

EAGER = "torch.eager"
COMPILE = "torch.compile"


def baselines(op: str) -> list[Implementation]:
    """The vendor path: what a PyTorch user gets without custom kernels. Never a candidate."""
    req = Requires(device="any")
    return [Implementation(op, EAGER, "torch", None, "eager", req, origin="baseline",
                           dtypes=("float32", "bfloat16", "float16")),
            Implementation(op, COMPILE, "torch", None, "compile", req, origin="baseline",
                           dtypes=("float32", "bfloat16", "float16"))]


def external_implementations(conn: sqlite3.Connection | None) -> list[Implementation]:
    if conn is None:
        return []
    from strata.store.kernels import list_external

    found = []
    for ext in list_external(conn):
        path = Path(ext.path)
        if path.exists():  # the private copy may have been cleaned with the cache
            found.append(from_source(path, origin="external", name=ext.name))
    return found


def implementations(op: str | None = None, conn: sqlite3.Connection | None = None,
                    include_baselines: bool = False) -> list[Implementation]:
    """Candidates (and optionally baselines) for `op`, or for every op when None."""
    ops = [get_spec(op).name] if op else list(all_specs())
    found = [i for i in (*builtin_implementations(), *external_implementations(conn))
             if i.op in ops]
    if include_baselines:
        found = [b for o in ops for b in baselines(o)] + found
    return found


def find(op: str, name: str, conn: sqlite3.Connection | None = None) -> Implementation:
    from strata.errors import InputError

    impls = implementations(op, conn, include_baselines=True)
    for impl in impls:
        if impl.name == name:
            return impl
    raise InputError(f"--impl {name}: op {op} has {', '.join(i.name for i in impls)}")
