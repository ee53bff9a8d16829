"""Opening the results DB: path checks, WAL, busy timeout, schema migrations."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from strata.errors import InputError
from strata.store.migrations import MIGRATIONS

SCHEMA_VERSION = MIGRATIONS[-1][0]
BUSY_TIMEOUT_MS = 10_000


def open_db(path: Path, migrations: list[tuple[int, list[str]]] = MIGRATIONS) -> sqlite3.Connection:
    """Open (creating if needed) the DB at `path` and bring its schema up to date.

    Raises InputError with a one-line, actionable message for a path that cannot hold a DB.
    """
    path = Path(path).expanduser()
    _check_path(path)
    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _wal(conn)
        conn.execute("PRAGMA foreign_keys = ON")
        migrate(conn, migrations)
    except sqlite3.DatabaseError as exc:
        raise InputError(f"--db {path}: not a usable strata database ({exc}); "
                         "point --db at a new file or restore a backup") from exc
    conn.row_factory = sqlite3.Row
    return conn


def _wal(conn: sqlite3.Connection) -> None:
    """Switch to WAL, waiting for the other processes that create the same file: SQLite
    answers this pragma "database is locked" at once, without its busy handler, while
    another connection holds the lock the switch needs."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def open_db_readonly(path: Path) -> sqlite3.Connection | None:
    """Open an existing DB for reading only; None when there is no file (an empty store).

    Creates no file or folder (a read-only command leaves no trace). A DB at an older schema
    is brought up to date first (through open_db: the file exists, so nothing is created).
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise InputError(f"--db {path}: is a directory; give a file path such as {path}/strata.db")
    if not path.exists():
        return None
    try:
        conn = sqlite3.connect(_readonly_uri(path), uri=True, timeout=BUSY_TIMEOUT_MS / 1000,
                               isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        version = _stored_version(conn)
    except sqlite3.DatabaseError as exc:
        raise InputError(f"--db {path}: not a usable strata database ({exc}); "
                         "point --db at a new file or restore a backup") from exc
    if version < SCHEMA_VERSION:
        conn.close()
        return open_db(path)
    if version > SCHEMA_VERSION:
        raise InputError(f"database schema v{version} is newer than this strata knows "
                         f"(v{SCHEMA_VERSION}); upgrade strata or use another --db")
    conn.row_factory = sqlite3.Row
    return conn


def _readonly_uri(path: Path) -> str:
    """mode=ro; and immutable when no -wal file exists. A WAL database opened read-only
    creates -wal and -shm files it cannot remove afterwards; with no -wal file, no strata
    process is writing it now (a writer keeps its -wal while open), so it is read as an
    immutable file and nothing is created. With a -wal file, a writer may be at work: the
    normal read-only mode shares its snapshot through the files already there."""
    uri = f"{path.resolve().as_uri()}?mode=ro"
    wal = path.with_name(path.name + "-wal")
    return uri if wal.exists() else uri + "&immutable=1"


def empty_db() -> sqlite3.Connection:
    """An empty store in memory (the current schema, no rows): what a read-only command
    reads when there is no DB file, instead of creating one."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    migrate(conn, MIGRATIONS)
    conn.row_factory = sqlite3.Row
    return conn


def _stored_version(conn: sqlite3.Connection) -> int:
    """The schema version of a DB opened read-only (0: no schema_version table yet)."""
    exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                          "name = 'schema_version'").fetchone()
    if not exists:
        return 0
    return int(conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0)


def _check_path(path: Path) -> None:
    if path.is_dir():
        raise InputError(f"--db {path}: is a directory; give a file path such as {path}/strata.db")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--db {path}: cannot create folder {parent} ({exc.strerror}); "
                         "choose a writable location") from exc
    if not parent.is_dir():
        raise InputError(f"--db {path}: {parent} is not a folder")


def schema_version(conn: sqlite3.Connection) -> int:
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def migrate(conn: sqlite3.Connection, migrations: list[tuple[int, list[str]]]) -> int:
    """Apply pending migrations; refuse a DB written by a newer strata."""
    current = schema_version(conn)
    newest = migrations[-1][0]
    if current > newest:
        raise InputError(f"database schema v{current} is newer than this strata knows (v{newest});"
                         " upgrade strata or use another --db")
    for version, statements in migrations:
        if version <= current:
            continue
        with transaction(conn):
            # Another process opening the same new DB may have applied it since the read
            # above (two ring workers creating the default DB at once): read again, locked.
            if version <= schema_version(conn):
                continue
            for sql in statements:
                conn.execute(sql)
            conn.execute("INSERT INTO schema_version(version) VALUES (?)", (version,))
    return newest


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """All-or-nothing writes: a result and its samples land together or not at all."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
