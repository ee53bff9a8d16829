"""Results store: a real SQLite file, WAL, migrations, bad paths, concurrent writers."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from strata.errors import InputError
from strata.hardware.profile import CpuInfo, HostProfile, SoftwareStack
from strata.store import SCHEMA_VERSION, open_db
from strata.store.db import migrate, schema_version
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


# -- kernel-generation attempts (migration 4) ------------------------------------------------

def _attempt(**kw: object):  # -> strata.kernels.gen.records.Attempt
    from strata.kernels.gen.records import Attempt, Timing

    base: dict[str, object] = dict(
        op="rmsnorm", dialect="c", device="cpu", endpoint="http://127.0.0.1:8080/v1",
        model="tiny", template_hash="abc123", sample=0, turn=1,
        prompt='[{"role": "user", "content": "write rmsnorm"}]', reply="```c\n...\n```",
        status="ok", reason="", feedback="Correct \u2014 1.5x eager", code="void f(){}",
        code_hash="0123", tokens_in=120, tokens_out=None, latency_s=0.25,
        timing=Timing(1.5, None, 0.2, 3e-5), cheat=False, registered=True,
        skill="c-skill@ff", run="r1", fingerprint="fp1")
    base.update(kw)
    return Attempt(**base)  # type: ignore[arg-type]


def test_attempts_roundtrip_filter_and_jsonl(tmp_path: Path) -> None:
    from strata.store.attempts import export_jsonl, list_attempts, read_jsonl, save_attempt

    conn = open_db(tmp_path / "s.db")
    first = _attempt()
    ids = [save_attempt(conn, first),
           save_attempt(conn, _attempt(model="big", turn=2, status="static", cheat=True,
                                       registered=False, skill=None)),
           save_attempt(conn, _attempt(op="softmax", run="r2", status="format", code=None,
                                       code_hash=None, tokens_in=None))]
    assert ids == sorted(ids) and len(set(ids)) == 3
    stored = list_attempts(conn)
    assert [a.id for a in stored] == ids
    again = stored[0]
    assert again.created_at  # stamped on save
    assert (again.timing, again.cheat, again.registered, again.tokens_out) == \
        (first.timing, False, True, None)
    assert {k: v for k, v in again.to_dict().items() if k not in ("id", "created_at")} == \
        {k: v for k, v in first.to_dict().items() if k not in ("id", "created_at")}
    assert [a.model for a in list_attempts(conn, op="rmsnorm")] == ["tiny", "big"]
    assert [a.op for a in list_attempts(conn, run="r2")] == ["softmax"]
    assert [a.status for a in list_attempts(conn, model="big", op="rmsnorm")] == ["static"]
    assert list_attempts(conn, fingerprint="other") == []
    path = tmp_path / "t.jsonl"
    export_jsonl(stored, path)
    assert read_jsonl(path) == stored
    # a replayed file lands in another DB as new rows
    other = open_db(tmp_path / "o.db")
    for a in read_jsonl(path):
        save_attempt(other, a)
    assert [a.reply for a in list_attempts(other)] == [a.reply for a in stored]


@pytest.mark.parametrize("line, needle", [
    ("not json", "line 2 is not a stored attempt"),
    ("[1, 2]", "not a JSON object"),
    ('{"op": "rmsnorm"}', "missing dialect"),
])
def test_a_damaged_transcript_is_one_line_naming_the_line(tmp_path: Path, line: str,
                                                          needle: str) -> None:
    import json

    from strata.store.attempts import read_jsonl

    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(_attempt().to_dict()) + "\n" + line + "\n")
    with pytest.raises(InputError, match=needle) as info:
        read_jsonl(path)
    assert "\n" not in str(info.value)
    bad_status = {**_attempt().to_dict(), "status": "great"}
    path.write_text(json.dumps(bad_status) + "\n")
    with pytest.raises(InputError, match=r"line 1 .*status 'great'"):
        read_jsonl(path)
    with pytest.raises(InputError, match="not found"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_processes_creating_one_new_db_at_once_all_open_it(tmp_path: Path) -> None:
    """Ring workers (and daemons) started together open the default DB before it exists:
    each must see the schema the first one wrote, not fail on 'table already exists'."""
    import subprocess
    import sys

    db, go = tmp_path / "new.db", tmp_path / "go"
    script = ("import pathlib, sys, time\n"
              "from strata.store.db import open_db\n"
              "go = pathlib.Path(sys.argv[2])\n"
              "while not go.exists(): time.sleep(0.001)\n"
              "open_db(pathlib.Path(sys.argv[1])).close()\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(db), str(go)],
                              stderr=subprocess.PIPE, text=True) for _ in range(6)]
    time.sleep(1.0)  # every interpreter up and waiting on the same start
    go.touch()
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    conn = open_db(db)
    assert schema_version(conn) == MIGRATIONS[-1][0]
    assert conn.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == len(MIGRATIONS)
