"""Kernel-generation attempts: one row per model reply, and JSON Lines for replay.

The row holds every `Attempt` field (Timing as one column per field), so a run can be
re-scored or exported without the model. A JSONL file is one `Attempt.to_dict()` per line;
reading one checks each line and names the first bad one.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import fields
from pathlib import Path
from typing import Any

from strata.errors import InputError
from strata.kernels.gen.records import STATUSES, Attempt, Timing
from strata.store.db import transaction
from strata.store.hosts import _now

TIMING = tuple(f.name for f in fields(Timing))
COLUMNS = tuple(f.name for f in fields(Attempt) if f.name not in ("timing", "id")) + TIMING
REQUIRED = ("op", "dialect", "device", "endpoint", "model", "template_hash", "sample", "turn",
            "prompt", "reply", "status")


def save_attempt(conn: sqlite3.Connection, attempt: Attempt) -> int:
    """Insert `attempt` (its id, if any, is ignored: ids belong to this DB); the new id."""
    row = attempt.to_dict()
    row.update(row.pop("timing"))
    row["created_at"] = row["created_at"] or _now()
    row["cheat"], row["registered"] = int(bool(row["cheat"])), int(bool(row["registered"]))
    with transaction(conn):
        cur = conn.execute(f"INSERT INTO kernel_attempts ({', '.join(COLUMNS)}) VALUES "
                           f"({', '.join('?' * len(COLUMNS))})", [row[c] for c in COLUMNS])
    return int(cur.lastrowid or 0)


def mark_registered(conn: sqlite3.Connection, attempt_id: int) -> None:
    """The attempt whose kernel `kernels generate` registered for dispatch."""
    with transaction(conn):
        conn.execute("UPDATE kernel_attempts SET registered = 1 WHERE id = ?", (attempt_id,))


def _from_row(row: sqlite3.Row) -> Attempt:
    data = dict(zip(row.keys(), tuple(row), strict=True))
    timing = Timing(**{k: data.pop(k) for k in TIMING})
    data["cheat"], data["registered"] = bool(data["cheat"]), bool(data["registered"])
    return Attempt(**data, timing=timing)


def list_attempts(conn: sqlite3.Connection, op: str | None = None, run: str | None = None,
                  model: str | None = None, fingerprint: str | None = None) -> list[Attempt]:
    """Attempts in the order they were stored, filtered by whichever arguments are given."""
    where = [(k, v) for k, v in (("op", op), ("run", run), ("model", model),
                                 ("fingerprint", fingerprint)) if v is not None]
    sql = "SELECT * FROM kernel_attempts"
    if where:
        sql += " WHERE " + " AND ".join(f"{k}=?" for k, _ in where)
    return [_from_row(r) for r in conn.execute(sql + " ORDER BY id", [v for _, v in where])]


def export_jsonl(attempts: list[Attempt], path: Path) -> None:
    try:
        with Path(path).open("w", encoding="utf-8") as fh:
            for a in attempts:
                fh.write(json.dumps(a.to_dict(), ensure_ascii=False) + "\n")
    except OSError as exc:
        raise InputError(f"--export {path}: cannot write it ({exc.strerror})") from exc


def _attempt(data: Any) -> Attempt:
    """An Attempt from one decoded line; ValueError says what is wrong with it."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    if data["status"] not in STATUSES:
        raise ValueError(f"status {data['status']!r} is not one of {', '.join(STATUSES)}")
    known = {f.name for f in fields(Attempt)}
    kept = {k: v for k, v in data.items() if k in known}  # newer writers may add fields
    timing = kept.pop("timing", None) or {}
    if not isinstance(timing, dict):
        raise ValueError("timing is not an object")
    try:
        attempt = Attempt(**kept, timing=Timing(**{k: v for k, v in timing.items()
                                                   if k in TIMING}))
    except TypeError as exc:
        raise ValueError(str(exc)) from exc
    for name in ("sample", "turn"):
        if not isinstance(getattr(attempt, name), int):
            raise ValueError(f"{name} is not an integer")
    for name in ("reply", "prompt", "op", "dialect", "model"):
        if not isinstance(getattr(attempt, name), str):
            raise ValueError(f"{name} is not a string")
    return attempt


def read_jsonl(path: Path) -> list[Attempt]:
    """Attempts written by `export_jsonl`; a damaged file is an InputError naming the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: not found (write one with `strata kernels attempts "
                         "--export FILE.jsonl`)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read it as UTF-8 text ({exc})") from exc
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(_attempt(json.loads(line)))
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            msg = str(exc).splitlines()[0][:160]
            raise InputError(f"{path}: line {n} is not a stored attempt ({msg})") from None
    return out
