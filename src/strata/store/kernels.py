"""Kernel lab rows: external implementations and per-host verification/benchmark results."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strata import __version__
from strata.store.db import transaction
from strata.store.hosts import _now, git_commit

if TYPE_CHECKING:
    from strata.kernels.impl import Implementation


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


def verified_shapes(conn: sqlite3.Connection, fingerprint: str, op: str, impl: str,
                    impl_hash: str, device: str, verify_default: list[dict[str, int]],
                    disqualifying: tuple[str, ...] = ()) -> list[dict[str, int]]:
    """Every shape this implementation version has been proven at on this device: the
    shapes of every passing verification (`data["shapes"]`; `verify_default`, the op's
    verify set, for rows written before verifications recorded theirs) and of every timed
    benchmark row whose outputs were checked and not flagged with a `disqualifying` prefix.
    All rows count, not only the latest: on-demand verification at a new shape adds one."""
    rows = conn.execute(
        "SELECT kind, status, shape, data FROM kernel_results WHERE fingerprint=? AND op=? "
        "AND impl=? AND impl_hash=? AND device=? AND ((kind='verify' AND status='pass') OR "
        "(kind='bench' AND status='ok')) ORDER BY id",
        (fingerprint, op, impl, impl_hash, device)).fetchall()
    shapes: list[dict[str, int]] = []
    for kind, _status, shape, data in rows:
        payload = json.loads(data)
        if kind == "verify":
            shapes += payload.get("shapes") or verify_default
        elif shape and not any(f.startswith(disqualifying) for f in payload.get("flags", [])):
            shapes.append(json.loads(shape))
    return shapes


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
    """Forget an added kernel: its registration, its trust and every verification/benchmark
    row of it, in one transaction. Returns the number of result rows deleted."""
    with transaction(conn):
        conn.execute("DELETE FROM kernel_impls WHERE key=?", (ext.key,))
        conn.execute("DELETE FROM kernel_trust WHERE key=?", (ext.key,))
        return conn.execute("DELETE FROM kernel_results WHERE op=? AND impl=?",
                            (ext.op, ext.name)).rowcount


# -- trust: an added kernel promoted to run in the user's own process ----------------------

@dataclass
class Trust:
    """The user's explicit promotion of one added kernel's exact source bytes: what lets it
    run in-process (strata.kernels.get, -B lab, train) instead of in a confined worker."""

    key: str
    op: str
    name: str
    source_hash: str  # sha256 of the source bytes: an edited file is untrusted again
    trusted_at: str
    note: str = ""


def source_hash(path: Path) -> str:
    """The identity trust is given to: the source bytes alone. Not the verdict's content
    hash, which also carries the harness version: new verification rules re-judge a kernel
    but do not change what the user read and promoted."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def trust_kernel(conn: sqlite3.Connection, ext: ExternalImpl, note: str = "") -> Trust:
    """Record trust in `ext`'s private copy as it is now (replacing an older trust)."""
    trust = Trust(ext.key, ext.op, ext.name, source_hash(Path(ext.path)), _now(), note)
    with transaction(conn):
        conn.execute("INSERT OR REPLACE INTO kernel_trust (key, op, name, source_hash, "
                     "trusted_at, note) VALUES (?,?,?,?,?,?)",
                     (trust.key, trust.op, trust.name, trust.source_hash, trust.trusted_at,
                      trust.note))
    return trust


def revoke_trust(conn: sqlite3.Connection, key: str) -> bool:
    """Undo `trust_kernel` for op/name `key`; False when it was not trusted."""
    with transaction(conn):
        return conn.execute("DELETE FROM kernel_trust WHERE key=?", (key,)).rowcount > 0


def trust_of(conn: sqlite3.Connection, impl: Implementation) -> Trust | None:
    """The trust that holds for `impl`'s current source bytes, or None: never for a kernel
    without a source, and not once the file differs from the bytes that were trusted."""
    if impl.source is None or not impl.source.is_file():
        return None
    row = conn.execute("SELECT key, op, name, source_hash, trusted_at, note FROM kernel_trust "
                       "WHERE key=?", (impl.key,)).fetchone()
    if row is None or row[3] != source_hash(impl.source):
        return None
    return Trust(*row)


def is_trusted(conn: sqlite3.Connection, impl: Implementation) -> bool:
    return trust_of(conn, impl) is not None


__all__ = ["ExternalImpl", "KernelResult", "Trust", "_now", "find_external", "is_trusted",
           "latest_bench", "latest_verification", "list_external", "remove_external",
           "revoke_trust", "save_external", "save_kernel_results", "source_hash",
           "trust_kernel", "trust_of", "verified_shapes"]
