"""What the report shows, read from the results DB in one place (the sections only render).

The report covers one host: the most recently seen one that has anything to show, unless a
fingerprint is given. Results from other hosts are counted so the page can say they exist.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from strata.errors import InputError
from strata.hardware.profile import HostProfile
from strata.measure.roofline import Roofline
from strata.store.attempts import list_attempts
from strata.store.hosts import HostRow, latest_measurement, list_hosts, load_host
from strata.store.runs import RunRow, StoredResult, list_runs, query_results
from strata.store.training import Point, TrainRow, list_train, points_of

EMPTY_DB = "no results yet: run strata probe --measure and strata bench"


@dataclass
class ReportData:
    host: HostRow
    profile: HostProfile | None
    roofline: Roofline | None
    results: list[StoredResult]
    runs: list[RunRow]
    quality: list[dict[str, Any]] = field(default_factory=list)
    other_hosts: list[HostRow] = field(default_factory=list)
    attempts: list[Any] = field(default_factory=list)  # kernels.gen.records.Attempt
    training: list[TrainRow] = field(default_factory=list)
    train_points: dict[int, list[Point]] = field(default_factory=dict)  # run id -> curve
    ranking: dict[str, Any] | None = None  # the latest `strata rank` (a 'rank' measurement)


def _has_data(conn: sqlite3.Connection, fp: str) -> bool:
    return bool(query_results(conn, fingerprint=fp)) or bool(
        latest_measurement(conn, fp, "roofline")) or bool(list_train(conn, fp))


def pick_host(conn: sqlite3.Connection, fingerprint: str | None) -> tuple[HostRow, list[HostRow]]:
    """The host to report on and the other hosts that have data."""
    hosts = [h for h in list_hosts(conn) if _has_data(conn, h.fingerprint)]
    if not hosts:
        raise InputError(EMPTY_DB)
    if fingerprint is None:
        return hosts[0], hosts[1:]
    chosen = [h for h in hosts if h.fingerprint.startswith(fingerprint)]
    if len(chosen) != 1:
        known = ", ".join(h.fingerprint for h in hosts)
        raise InputError(f"host {fingerprint}: {'ambiguous' if chosen else 'not found'} "
                         f"(hosts with data: {known}); see strata hosts")
    return chosen[0], [h for h in hosts if h is not chosen[0]]


def quality_rows(conn: sqlite3.Connection, fingerprint: str) -> list[dict[str, Any]]:
    """Every stored `strata quality` measurement of this host, newest last.

    latest_measurement returns only one row per kind; the frontier needs them all, so this
    reads the measurements table directly (read-only).
    """
    rows = conn.execute("SELECT data, created_at FROM measurements WHERE fingerprint = ? AND "
                        "kind = 'quality' ORDER BY created_at, id", (fingerprint,)).fetchall()
    out = []
    for row in rows:
        try:
            data = json.loads(row["data"])
        except (TypeError, ValueError):
            continue  # a damaged row must not take the whole report down
        if isinstance(data, dict):
            out.append({**data, "created_at": row["created_at"]})
    return out


def load_report_data(conn: sqlite3.Connection, fingerprint: str | None = None) -> ReportData:
    host, others = pick_host(conn, fingerprint)
    fp = host.fingerprint
    stored = latest_measurement(conn, fp, "roofline")
    training = list_train(conn, fp)
    return ReportData(host=host, profile=load_host(conn, fp),
                      roofline=Roofline.from_dict(stored) if stored else None,
                      results=query_results(conn, fingerprint=fp),
                      runs=list_runs(conn, fingerprint=fp),
                      quality=quality_rows(conn, fp), other_hosts=others,
                      attempts=list_attempts(conn, fingerprint=fp), training=training,
                      train_points={r.run_id: points_of(conn, r.run_id) for r in training},
                      ranking=latest_measurement(conn, fp, "rank"))
