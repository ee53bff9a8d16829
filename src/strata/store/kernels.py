"""Kernel lab rows: external implementations and per-host verification/benchmark results."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from strata import __version__
from strata.store.db import transaction
from strata.store.hosts import _now, git_commit


@dataclass
class KernelResult:
    op: str
    impl: str
    impl_hash: str
    kind: str  # verify | bench
    status: str
    device: str
    dtype: str
    data: dict[str, Any]
    shape: dict[str, int] | None = None
    created_at: str = ""
    id: int | None = None


def save_kernel_results(conn: sqlite3.Connection, fingerprint: str,
                        rows: list[KernelResult]) -> None:
    """All rows of one verification/benchmark in one transaction: all or nothing."""
    commit = git_commit()
    with transaction(conn):
        for r in rows:
            conn.execute(
                "INSERT INTO kernel_results (fingerprint, op, impl, impl_hash, kind, status, "
                "device, dtype, shape, data, created_at, strata, git_commit) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (fingerprint, r.op, r.impl, r.impl_hash, r.kind, r.status, r.device, r.dtype,
                 json.dumps(r.shape) if r.shape is not None else None, json.dumps(r.data),
                 _now(), __version__, commit))


def _row(row: sqlite3.Row) -> KernelResult:
    return KernelResult(op=row["op"], impl=row["impl"], impl_hash=row["impl_hash"],
                        kind=row["kind"], status=row["status"], device=row["device"],
                        dtype=row["dtype"], data=json.loads(row["data"]),
                        shape=json.loads(row["shape"]) if row["shape"] else None,
                        created_at=row["created_at"], id=row["id"])


def latest_verification(conn: sqlite3.Connection, fingerprint: str, op: str, impl: str,
                        impl_hash: str, device: str) -> KernelResult | None:
    row = conn.execute(
        "SELECT * FROM kernel_results WHERE fingerprint=? AND op=? AND impl=? AND impl_hash=? "
        "AND kind='verify' AND device=? ORDER BY id DESC LIMIT 1",
        (fingerprint, op, impl, impl_hash, device)).fetchone()
    return _row(row) if row else None


def latest_bench(conn: sqlite3.Connection, fingerprint: str, op: str, impl: str,
                 impl_hash: str, device: str) -> list[KernelResult]:
    """The rows of the most recent benchmark of this implementation version on this device."""
    last = conn.execute(
        "SELECT MAX(created_at) FROM kernel_results WHERE fingerprint=? AND op=? AND impl=? "
        "AND impl_hash=? AND kind='bench' AND device=?",
        (fingerprint, op, impl, impl_hash, device)).fetchone()[0]
    if last is None:
        return []
    rows = conn.execute(
        "SELECT * FROM kernel_results WHERE fingerprint=? AND op=? AND impl=? AND impl_hash=? "
        "AND kind='bench' AND device=? AND created_at=? ORDER BY id",
        (fingerprint, op, impl, impl_hash, device, last)).fetchall()
    return [_row(r) for r in rows]


@dataclass
class ExternalImpl:
    key: str
    op: str
    name: str
    dialect: str
    path: str
    origin_path: str
    content_hash: str
    added_at: str


def save_external(conn: sqlite3.Connection, ext: ExternalImpl) -> None:
    with transaction(conn):
        conn.execute("INSERT OR REPLACE INTO kernel_impls (key, op, name, dialect, path, "
                     "origin_path, content_hash, added_at) VALUES (?,?,?,?,?,?,?,?)",
                     (ext.key, ext.op, ext.name, ext.dialect, ext.path, ext.origin_path,
                      ext.content_hash, ext.added_at))


def list_external(conn: sqlite3.Connection) -> list[ExternalImpl]:
    rows = conn.execute("SELECT * FROM kernel_impls ORDER BY op, name").fetchall()
    return [ExternalImpl(**dict(zip(r.keys(), tuple(r), strict=True))) for r in rows]


def find_external(conn: sqlite3.Connection, name: str) -> list[ExternalImpl]:
    """Registered kernels called `name`: a key ("rmsnorm/c.ext.mine") or an implementation
    name ("c.ext.mine", which may be registered for several ops)."""
    return [e for e in list_external(conn) if name in (e.key, e.name)]


def remove_external(conn: sqlite3.Connection, ext: ExternalImpl) -> int:
    """Forget an added kernel: its registration and every verification/benchmark row of
    it, in one transaction. Returns the number of result rows deleted."""
    with transaction(conn):
        conn.execute("DELETE FROM kernel_impls WHERE key=?", (ext.key,))
        return conn.execute("DELETE FROM kernel_results WHERE op=? AND impl=?",
                            (ext.op, ext.name)).rowcount


__all__ = ["ExternalImpl", "KernelResult", "_now", "find_external", "latest_bench",
           "latest_verification", "list_external", "remove_external", "save_external",
           "save_kernel_results"]
