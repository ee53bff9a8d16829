"""`strata train` runs in the results DB: one `train_runs` row per run (beside its `runs`
row, which holds the argv, config and status) and the loss curves in `train_points`.

The row is written when training starts and updated at every checkpoint, so an interrupted
run keeps its curve up to the last checkpoint and is marked 'incomplete'.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from strata.store.db import transaction
from strata.store.hosts import _now
from strata.store.runs import finish_run, start_run

JSON_FIELDS = ("model", "data", "ops", "outputs")


@dataclass
class TrainRow:
    run_id: int
    preset: str
    model: dict[str, Any]
    params: int
    data: dict[str, Any]
    device: str
    dtype: str
    kernels: str
    ops: dict[str, dict[str, str]]
    world_size: int
    steps: int
    out_dir: str
    step: int = 0
    tokens_seen: int = 0
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_gflops: float | None = None
    peak_basis: str | None = None
    val_loss: float | None = None
    bits_per_byte: float | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    sample: str | None = None
    resumed_from: int | None = None
    updated_at: str = ""
    # from the runs row (read only)
    status: str = ""
    started_at: str = ""
    fingerprint: str = ""


@dataclass
class Point:
    kind: str  # train | val
    step: int
    loss: float
    lr: float | None = None
    bits_per_byte: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    elapsed_s: float | None = None


_COLUMNS = tuple(f.name for f in fields(TrainRow)
                 if f.name not in ("status", "started_at", "fingerprint"))
_POINT = tuple(f.name for f in fields(Point))


def _encode(row: TrainRow) -> list[Any]:
    values = {**row.__dict__, "updated_at": _now()}
    return [json.dumps(values[c]) if c in JSON_FIELDS else values[c] for c in _COLUMNS]


def save_train(conn: sqlite3.Connection, row: TrainRow) -> None:
    """Insert or replace the run's row (its `runs` row must exist)."""
    with transaction(conn):
        conn.execute(f"INSERT OR REPLACE INTO train_runs ({', '.join(_COLUMNS)}) VALUES "
                     f"({', '.join('?' * len(_COLUMNS))})", _encode(row))


def add_points(conn: sqlite3.Connection, run_id: int, points: list[Point]) -> None:
    """Store curve points; a point stored again (a resumed step) replaces the old one."""
    if not points:
        return
    with transaction(conn):
        conn.executemany(
            f"INSERT OR REPLACE INTO train_points (run_id, {', '.join(_POINT)}) VALUES "
            f"(?, {', '.join('?' * len(_POINT))})",
            [(run_id, *(getattr(p, c) for c in _POINT)) for p in points])


def _row(r: sqlite3.Row) -> TrainRow:
    data = {c: r[c] for c in _COLUMNS}
    for c in JSON_FIELDS:
        data[c] = json.loads(data[c]) if data[c] else {}
    return TrainRow(**data, status=r["status"], started_at=r["started_at"],
                    fingerprint=r["fingerprint"])


_SELECT = ("SELECT t.*, runs.status, runs.started_at, runs.fingerprint FROM train_runs t "
           "JOIN runs ON runs.id = t.run_id")


def get_train(conn: sqlite3.Connection, run_id: int) -> TrainRow | None:
    row = conn.execute(_SELECT + " WHERE t.run_id = ?", (run_id,)).fetchone()
    return _row(row) if row else None


def list_train(conn: sqlite3.Connection, fingerprint: str | None = None) -> list[TrainRow]:
    """Training runs, oldest first; of one host when `fingerprint` is given."""
    where, args = (" WHERE runs.fingerprint = ?", (fingerprint,)) if fingerprint else ("", ())
    return [_row(r) for r in conn.execute(_SELECT + where + " ORDER BY t.run_id", args)]


def points_of(conn: sqlite3.Connection, run_id: int, kind: str | None = None) -> list[Point]:
    sql = f"SELECT {', '.join(_POINT)} FROM train_points WHERE run_id = ?"
    args: tuple[Any, ...] = (run_id,)
    if kind:
        sql, args = sql + " AND kind = ?", (run_id, kind)
    return [Point(**dict(zip(_POINT, tuple(r), strict=True)))
            for r in conn.execute(sql + " ORDER BY kind, step", args)]


@dataclass
class TrainRecorder:
    """strata.train.loop's recorder on rank 0: the `runs` row, the `train_runs` row and the
    curve points (buffered, written at each evaluation and checkpoint)."""

    conn: Any  # sqlite3.Connection
    fingerprint: str
    argv: list[str]
    row: TrainRow | None = None
    run_id: int = 0
    pending: list[Any] = field(default_factory=list)

    def open(self, cfg: Any) -> int:
        """The `runs` row; `cfg` is the TrainConfig (anything with to_dict())."""
        self.run_id = start_run(self.conn, self.fingerprint, "train", self.argv, cfg.to_dict())
        return self.run_id

    def begin(self, row: Any, history: Any) -> None:
        self.row = row
        save_train(self.conn, row)
        self.pending += [Point("train", int(s), loss, lr) for s, loss, lr in history.train]
        self.pending += [Point("val", int(s), loss, bits_per_byte=b) for s, loss, b in history.val]
        self.flush()

    def flush(self) -> None:
        add_points(self.conn, self.row.run_id, self.pending)
        self.pending = []

    def step(self, s: Any) -> None:
        self.pending.append(Point("train", s.step, s.loss, s.lr, tokens_per_s=s.tokens_per_s,
                                  mfu=s.mfu, elapsed_s=s.elapsed_s))
        self.row.tokens_per_s, self.row.mfu = s.tokens_per_s, s.mfu

    def evaluated(self, e: Any) -> None:
        self.pending.append(Point("val", e.step, e.loss, bits_per_byte=e.bits_per_byte))
        self.row.val_loss, self.row.bits_per_byte = e.loss, e.bits_per_byte
        self.flush()

    def checkpointed(self, loop: Any, path: Path) -> None:
        self.row.step, self.row.tokens_seen = loop.step, loop.tokens_seen
        self.row.outputs["checkpoint"] = str(path)
        self.flush()
        save_train(self.conn, self.row)

    def finish(self, status: str) -> None:
        if self.row is not None:
            self.flush()
            save_train(self.conn, self.row)
        if self.run_id:
            finish_run(self.conn, self.run_id, status)
