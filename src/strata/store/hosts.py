"""Host records and their measurements (roofline, telemetry) in the results DB."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from strata import __version__
from strata.hardware.profile import HostProfile


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def git_commit() -> str | None:
    """Commit of the strata checkout, when running from one (results describe themselves)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def host_summary(profile: HostProfile) -> str:
    cpu = profile.cpu
    parts = [f"{cpu.model or cpu.arch} ({cpu.logical_threads or '?'} threads)"]
    parts += [f"{g.name} [{g.arch or '?'}]" for g in profile.gpus]
    return " + ".join(parts)


def save_host(conn: sqlite3.Connection, profile: HostProfile) -> str:
    """Insert or refresh the host record; returns its fingerprint."""
    fp = profile.fingerprint()
    now = _now()
    conn.execute(
        """INSERT INTO hosts(fingerprint, hostname, summary, first_seen, last_seen, profile)
           VALUES (?, ?, ?, ?, ?, ?)
           ON CONFLICT(fingerprint) DO UPDATE SET
             hostname = excluded.hostname, summary = excluded.summary,
             last_seen = excluded.last_seen, profile = excluded.profile""",
        (fp, profile.hostname, host_summary(profile), now, now, json.dumps(profile.to_dict())),
    )
    return fp


def save_measurement(conn: sqlite3.Connection, fingerprint: str, kind: str,
                     data: dict[str, Any]) -> int:
    cur = conn.execute(
        "INSERT INTO measurements(fingerprint, kind, created_at, strata, git_commit, data)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (fingerprint, kind, _now(), __version__, git_commit(), json.dumps(data)),
    )
    return int(cur.lastrowid or 0)


def latest_measurement(conn: sqlite3.Connection, fingerprint: str,
                       kind: str) -> dict[str, Any] | None:
    row = conn.execute(
        "SELECT data FROM measurements WHERE fingerprint = ? AND kind = ?"
        " ORDER BY created_at DESC, id DESC LIMIT 1", (fingerprint, kind)).fetchone()
    return json.loads(row["data"]) if row else None


@dataclass
class HostRow:
    fingerprint: str
    hostname: str
    summary: str
    first_seen: str
    last_seen: str
    measured: bool


def list_hosts(conn: sqlite3.Connection) -> list[HostRow]:
    rows = conn.execute(
        """SELECT h.*, EXISTS(SELECT 1 FROM measurements m WHERE m.fingerprint = h.fingerprint
                                AND m.kind = 'roofline') AS measured
           FROM hosts h ORDER BY last_seen DESC""").fetchall()
    return [HostRow(r["fingerprint"], r["hostname"], r["summary"], r["first_seen"],
                    r["last_seen"], bool(r["measured"])) for r in rows]


def host_records(rows: list[HostRow]) -> list[dict[str, Any]]:
    """`strata hosts` as flat records (docs/output.md)."""
    return [{"fingerprint": r.fingerprint, "hostname": r.hostname, "summary": r.summary,
             "first_seen": r.first_seen, "last_seen": r.last_seen,
             "roofline_measured": r.measured} for r in rows]


def load_host(conn: sqlite3.Connection, fingerprint: str) -> HostProfile | None:
    row = conn.execute("SELECT profile FROM hosts WHERE fingerprint = ?",
                       (fingerprint,)).fetchone()
    return HostProfile.from_dict(json.loads(row["profile"])) if row else None
