"""Results store: a real SQLite file, WAL, migrations, bad paths, concurrent writers."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from strata.errors import InputError
from strata.hardware.profile import CpuInfo, HostProfile, SoftwareStack
from strata.store import SCHEMA_VERSION, open_db
from strata.store.db import migrate
from strata.store.hosts import (
    latest_measurement,
    list_hosts,
    load_host,
    save_host,
    save_measurement,
)
from strata.store.migrations import MIGRATIONS


def _profile(model: str = "Test CPU") -> HostProfile:
    return HostProfile(hostname="h", cpu=CpuInfo(arch="x86_64", model=model, isa=["avx2"]),
                       gpus=[], software=SoftwareStack(python="3.11", os="Linux", strata="0"))


def test_new_db_is_wal_and_versioned(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "a" / "s.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION


def test_host_roundtrip_and_upsert(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "s.db")
    p = _profile()
    fp = save_host(conn, p)
    assert save_host(conn, p) == fp  # same machine + stack -> same record
    save_host(conn, _profile("Other CPU"))
    assert len(list_hosts(conn)) == 2
    loaded = load_host(conn, fp)
    assert loaded is not None and loaded.cpu.model == "Test CPU" and loaded.fingerprint() == fp
    save_measurement(conn, fp, "roofline", {"v": 1})
    save_measurement(conn, fp, "roofline", {"v": 2})
    assert latest_measurement(conn, fp, "roofline") == {"v": 2}
    assert [h.measured for h in list_hosts(conn) if h.fingerprint == fp] == [True]


def test_forward_migration_keeps_rows(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    conn = open_db(path)
    fp = save_host(conn, _profile())
    conn.close()
    extra = [*MIGRATIONS, (SCHEMA_VERSION + 1, ["ALTER TABLE hosts ADD COLUMN note TEXT"])]
    conn = open_db(path, extra)
    assert conn.execute("SELECT fingerprint, note FROM hosts").fetchone()[:] == (fp, None)
    # and the stock strata now refuses a DB newer than it knows, without touching it
    conn.close()
    with pytest.raises(InputError, match="newer"):
        open_db(path)


def test_failed_migration_rolls_back(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    migrate(conn, MIGRATIONS)
    broken = [*MIGRATIONS, (SCHEMA_VERSION + 1, ["CREATE TABLE t (x)", "NOT SQL"])]
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, broken)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "t" not in tables
    assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION


@pytest.mark.parametrize("kind", ["directory", "garbage", "unwritable_parent"])
def test_bad_db_paths_are_input_errors(tmp_path: Path, kind: str) -> None:
    if kind == "directory":
        path = tmp_path
    elif kind == "garbage":
        path = tmp_path / "junk.db"
        path.write_bytes(b"this is not sqlite" * 100)
    else:
        blocker = tmp_path / "file"
        blocker.write_text("x")
        path = blocker / "sub" / "s.db"  # parent is a file: cannot create the folder
    before = path.read_bytes() if kind == "garbage" else None
    with pytest.raises(InputError, match="--db"):
        open_db(path)
    if before is not None:
        assert path.read_bytes() == before  # the user's file is left as it was


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    fp = save_host(open_db(path), _profile())

    def writer(k: int) -> None:
        conn = open_db(path)
        for i in range(25):
            save_measurement(conn, fp, "roofline", {"writer": k, "i": i})

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    n = open_db(path).execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
    assert n == 100


def test_runs_and_result_queries(tmp_path: Path) -> None:
    from strata.store.runs import (
        StoredResult,
        add_result,
        finish_run,
        list_runs,
        query_results,
        results_of_run,
        start_run,
    )

    conn = open_db(tmp_path / "s.db")
    fp = save_host(conn, _profile())
    run = start_run(conn, fp, "bench", ["bench"], {"x": 1})

    def result(backend: str, values: list[float]) -> StoredResult:
        return StoredResult(model="m", backend=backend, test="tg8", n_prompt=0, n_gen=8,
                            n_depth=0, load_config={}, explain=None, telemetry=None, info={},
                            metrics={"decode_tps": {"mean": sum(values) / len(values),
                                                    "samples": values}})

    add_result(conn, run, result("llamacpp", [1.0, 2.0, 3.0]))
    add_result(conn, run, result("torch", [4.0]))
    finish_run(conn, run, "complete")
    assert [r.backend for r in results_of_run(conn, run)] == ["llamacpp", "torch"]
    assert [r.backend for r in query_results(conn, backend="torch")] == ["torch"]
    assert query_results(conn, fingerprint="other") == []
    runs = list_runs(conn)
    assert (runs[0].status, runs[0].n_results) == ("complete", 2)
    raw = conn.execute("SELECT value FROM samples ORDER BY result_id, idx").fetchall()
    assert [r[0] for r in raw] == [1.0, 2.0, 3.0, 4.0]  # raw samples stored, in order
    with pytest.raises(ValueError):
        finish_run(conn, run, "bogus")
