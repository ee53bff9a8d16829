"""Forward-only schema migrations. Append a new entry; never edit a released one.

Each entry is (version, statements). `migrate` applies every entry above the stored
version inside one transaction per step, so an interrupted upgrade leaves the DB at the
last complete version.
"""

from __future__ import annotations

MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, [
        """CREATE TABLE hosts (
            fingerprint TEXT PRIMARY KEY,
            hostname    TEXT NOT NULL,
            summary     TEXT NOT NULL,           -- one line: CPU / GPUs, for listings
            first_seen  TEXT NOT NULL,
            last_seen   TEXT NOT NULL,
            profile     TEXT NOT NULL            -- HostProfile as JSON (latest probe)
        )""",
        """CREATE TABLE measurements (
            id            INTEGER PRIMARY KEY AUTOINCREMENT,
            fingerprint   TEXT NOT NULL REFERENCES hosts(fingerprint),
            kind          TEXT NOT NULL,         -- 'roofline', 'telemetry', ...
            created_at    TEXT NOT NULL,
            strata        TEXT NOT NULL,         -- strata version
            git_commit    TEXT,
            data          TEXT NOT NULL          -- JSON payload, self-describing
        )""",
        "CREATE INDEX measurements_host_kind ON measurements(fingerprint, kind, created_at)",
    ]),
]
