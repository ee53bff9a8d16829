"""Benchmark runs and their results in the results DB.

A run row is written first with status 'running'; each finished test's result and raw
samples are committed together as soon as they exist, so Ctrl-C or a crash keeps every
finished result, and the run is then marked 'incomplete'.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from strata import __version__
from strata.store.db import transaction
from strata.store.hosts import git_commit

RUN_STATUSES = ("running", "complete", "incomplete", "failed")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def start_run(conn: sqlite3.Connection, fingerprint: str, command: str, argv: list[str],
              config: dict[str, Any]) -> int:
    cur = conn.execute(
        "INSERT INTO runs(fingerprint, command, argv, config, status, started_at, strata,"
        " git_commit) VALUES (?, ?, ?, ?, 'running', ?, ?, ?)",
        (fingerprint, command, json.dumps(argv), json.dumps(config, default=str), _now(),
         __version__, git_commit()))
    return int(cur.lastrowid or 0)


def finish_run(conn: sqlite3.Connection, run_id: int, status: str) -> None:
    if status not in RUN_STATUSES:
        raise ValueError(f"unknown run status {status}")
    conn.execute("UPDATE runs SET status = ?, finished_at = ? WHERE id = ?",
                 (status, _now(), run_id))


@dataclass
class StoredResult:
    """One finished test, as stored (and as every printer reads it)."""

    model: str
    backend: str
    test: str
    n_prompt: int
    n_gen: int
    n_depth: int
    load_config: dict[str, Any]
    metrics: dict[str, dict[str, Any]]  # metric -> Summary.to_dict()
    explain: dict[str, Any] | None
    telemetry: dict[str, Any] | None
    info: dict[str, Any]
    run_id: int = 0
    id: int = 0
    created_at: str = ""


def add_result(conn: sqlite3.Connection, run_id: int, r: StoredResult) -> int:
    """Store `r` with its samples; `r.created_at` is set to the stored time, so a record
    printed before reading the DB back carries its llama-bench test_time."""
    r.created_at = _now()
    with transaction(conn):
        cur = conn.execute(
            "INSERT INTO results(run_id, model, backend, test, n_prompt, n_gen, n_depth,"
            " load_config, metrics, explain, telemetry, info, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, r.model, r.backend, r.test, r.n_prompt, r.n_gen, r.n_depth,
             json.dumps(r.load_config), json.dumps(r.metrics), _dump(r.explain),
             _dump(r.telemetry), json.dumps(r.info, default=str), r.created_at))
        result_id = int(cur.lastrowid or 0)
        conn.executemany(
            "INSERT INTO samples(result_id, metric, idx, value) VALUES (?, ?, ?, ?)",
            [(result_id, metric, i, float(v)) for metric, summary in r.metrics.items()
             for i, v in enumerate(summary.get("samples", []))])
    return result_id


def update_explanation(conn: sqlite3.Connection, r: StoredResult) -> None:
    """Rewrite a stored result's explanation and info, e.g. after its η was recomputed
    against a re-measured roofline peak (the metrics and samples never change)."""
    if not r.id:
        raise ValueError("update_explanation needs a stored result (id is 0)")
    with transaction(conn):
        conn.execute("UPDATE results SET explain = ?, info = ? WHERE id = ?",
                     (_dump(r.explain), json.dumps(r.info, default=str), r.id))


def _dump(value: Any) -> str | None:
    return json.dumps(value, default=str) if value is not None else None


def results_of_run(conn: sqlite3.Connection, run_id: int) -> list[StoredResult]:
    rows = conn.execute("SELECT * FROM results WHERE run_id = ? ORDER BY id", (run_id,))
    return [_result(row) for row in rows.fetchall()]


def _result(row: sqlite3.Row) -> StoredResult:
    loads = {k: json.loads(row[k]) if row[k] is not None else None
             for k in ("load_config", "metrics", "explain", "telemetry", "info")}
    # Before -ctv existed, kv_type (-ctk) set both K and V: read old rows so, and they keep
    # comparing equal to new rows of the same settings (compare keys on the load config).
    lc = loads["load_config"]
    if isinstance(lc, dict) and "kv_type" in lc and "kv_type_v" not in lc:
        lc["kv_type_v"] = lc["kv_type"]
    return StoredResult(model=row["model"], backend=row["backend"], test=row["test"],
                        n_prompt=row["n_prompt"], n_gen=row["n_gen"], n_depth=row["n_depth"],
                        run_id=row["run_id"], id=row["id"], created_at=row["created_at"],
                        **loads)


def run_status(conn: sqlite3.Connection, run_id: int) -> str | None:
    row = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
    return row["status"] if row else None


@dataclass
class RunRow:
    id: int
    fingerprint: str
    command: str
    status: str
    started_at: str
    finished_at: str | None
    git_commit: str | None
    strata: str
    n_results: int


def list_runs(conn: sqlite3.Connection, fingerprint: str | None = None) -> list[RunRow]:
    sql = ("SELECT r.*, (SELECT COUNT(*) FROM results x WHERE x.run_id = r.id) AS n"
           " FROM runs r" + (" WHERE r.fingerprint = ?" if fingerprint else "") +
           " ORDER BY r.id")
    rows = conn.execute(sql, (fingerprint,) if fingerprint else ()).fetchall()
    return [RunRow(r["id"], r["fingerprint"], r["command"], r["status"], r["started_at"],
                   r["finished_at"], r["git_commit"], r["strata"], r["n"]) for r in rows]


def query_results(conn: sqlite3.Connection, *, fingerprint: str | None = None,
                  backend: str | None = None, model: str | None = None,
                  run_id: int | None = None) -> list[StoredResult]:
    """Stored results filtered by host, backend, model or run (None = any), oldest first."""
    where, args = [], []
    for column, value in (("runs.fingerprint", fingerprint), ("results.backend", backend),
                          ("results.model", model), ("results.run_id", run_id)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    return select_results(conn, " AND ".join(where), args)


def select_results(conn: sqlite3.Connection, where: str = "",
                   args: list[Any] | tuple[Any, ...] = ()) -> list[StoredResult]:
    """Results joined with their run; `where` may name columns of `results` and `runs`."""
    sql = ("SELECT results.* FROM results JOIN runs ON runs.id = results.run_id"
           + (f" WHERE {where}" if where else "") + " ORDER BY results.id")
    return [_result(row) for row in conn.execute(sql, list(args)).fetchall()]


def discard_empty_run(conn: sqlite3.Connection, run_id: int) -> bool:
    """Delete a run that stored no result (nothing ran, or it failed before its first test
    finished): a run row without results records nothing. True if it was deleted; a run
    that other rows still reference is kept."""
    try:
        with transaction(conn):
            cur = conn.execute("DELETE FROM runs WHERE id = ? AND NOT EXISTS"
                               " (SELECT 1 FROM results WHERE run_id = ?)", (run_id, run_id))
    except sqlite3.IntegrityError:
        return False
    return cur.rowcount > 0
