"""`strata fleet bench` against real ring daemons on loopback, each with its own STRATA_HOME.

Two `strata ring serve` processes (their roofline seeded, so no member spends its time
measuring one) answer the bench op; the caller's own DB then holds both members' runs, and
`history` and `compare` read them. Also: a member that is down, bad bench flags, a model a
member lacks, and a bench stopped by its timeout or by its caller leaving, with no process
left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from strata.ring.control import wire
from tests.conftest import home_db
from tests.seed_host import seed_host
from tests.test_output_schema import check
from tests.test_ring_control import free_port, wait_for

STRATA = [sys.executable, "-m", "strata.cli"]
BENCH = ["synthetic:tiny", "-B", "llamacpp", "-p", "16", "-n", "4", "-r", "1"]


class Fleet:
    """Daemons a and b (b joins a), each with a seeded STRATA_HOME of its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.fingerprint = ""

    def start(self, name: str, *args: str) -> None:
        """Its home: a copy of one seeded DB (one probe, not one per member) and the shared
        model cache (content-keyed: the first member's synthetic GGUF serves the next)."""
        seed, home = self.root / "seed", self.root / name
        if not self.fingerprint:
            self.fingerprint = seed_host(seed)
            (self.root / "cache").mkdir()
        home.mkdir()
        shutil.copy(seed / "strata.db", home / "strata.db")
        (home / "cache").symlink_to(self.root / "cache")
        port = self.ports[name] = free_port()
        env = {**os.environ, "STRATA_HOME": str(home), "STRATA_PROGRESS": "0"}
        log = (self.root / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            [*STRATA, "ring", "serve", "--name", name, "--port", str(port), "--host",
             "127.0.0.1", "--no-mdns", "--timeout", "2", *args],
            stdout=log, stderr=subprocess.STDOUT, env=env)

    def addr(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def live(self, name: str) -> set[str]:
        try:
            status = wire.request("127.0.0.1", self.ports[name], {"op": "status"})
        except wire.PeerError:
            return set()
        return {p["member"]["id"] for p in status["peers"] if p["state"] == "live"}

    def benches(self, name: str) -> list[psutil.Process]:
        """The bench subprocesses daemon `name` runs now."""
        kids = psutil.Process(self.procs[name].pid).children(recursive=True)
        return [k for k in kids if "bench" in _cmdline(k)]

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise AssertionError(f"daemon {name} ignored SIGTERM") from None
        # multiprocessing's resource tracker lives as long as this process once a test
        # module before this one started a LocalRing (spawn); not a daemon's child
        left = [p for p in psutil.Process().children(recursive=True)
                if "resource_tracker" not in " ".join(p.cmdline())]
        assert not left, f"processes left behind: {[_cmdline(p) for p in left]}"


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(tmp_path_factory.mktemp("fleet"))
    try:
        f.start("a")
        f.start("b", "--peers", f.addr("a"))
        wait_for(lambda: "b" in f.live("a"), 90, "b never joined a's ring")
        yield f
    finally:
        f.stop()


def cli(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STRATA_HOME": str(home), "STRATA_PROGRESS": "0", "COLUMNS": "200"}
    return subprocess.run([*STRATA, *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def read(home: Path, *args: str) -> Any:
    """A read-only command's --json, run in this process (no interpreter start-up)."""
    from typer.testing import CliRunner

    from strata.cli import app

    res = CliRunner().invoke(app, [*args, "--json", "--db", str(home / "strata.db")])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_every_member_lands_in_the_callers_db(fleet: Fleet, tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there: a member that is down
    proc = cli(tmp_path, "fleet", "bench", *BENCH, "--connect", fleet.addr("a"), "--peers",
               dead, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    check(doc, "fleet.bench")
    members = {m["node"]: m for m in doc["members"]}
    assert set(members) == {"a", "b", dead}
    assert "connection refused" in members[dead]["error"] and members[dead]["results"] == 0
    for name in ("a", "b"):
        m = members[name]
        check(m, "fleet.bench.members[]")
        assert m["error"] is None and m["results"] == 2 and m["addr"] == fleet.addr(name)
        assert m["fingerprint"] == fleet.fingerprint
    results = doc["results"]
    for r in results:
        check(r, "fleet.bench.results[]", extra=("bench",))
    assert sorted((r["node"], r["test"]) for r in results) == [
        ("a", "pp16"), ("a", "tg4"), ("b", "pp16"), ("b", "tg4")]
    assert all(r["avg_ts"] > 0 and r["eta"] is not None for r in results)  # seeded roofline

    conn = home_db(tmp_path)  # the caller's own DB: both members' runs, as their host's
    runs = conn.execute("SELECT * FROM runs ORDER BY id").fetchall()
    assert [json.loads(r["config"])["fleet"]["node"] for r in runs] == \
        [r["node"] for r in results][::2]
    assert {r["fingerprint"] for r in runs} == {fleet.fingerprint}
    assert all(r["status"] == "complete" and r["command"] == "bench" for r in runs)
    host = conn.execute("SELECT * FROM hosts").fetchone()
    assert host["fingerprint"] == fleet.fingerprint and host["hostname"] == socket.gethostname()
    assert conn.execute("SELECT COUNT(*) FROM measurements WHERE kind = 'roofline'"
                        ).fetchone()[0] == 1  # the same roofline twice is stored once
    assert conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0] >= 4

    history = read(tmp_path, "history")
    assert [(h["run_id"], h["test"], h["avg_ts"]) for h in history] == \
        [(r["run_id"], r["test"], r["avg_ts"]) for r in results]
    a_run, b_run = (members[n]["run_ids"][0] for n in ("a", "b"))
    pairs = read(tmp_path, "compare", f"run:{a_run}", f"run:{b_run}")
    assert sorted(p["test"] for p in pairs) == ["pp16", "tg4"]


def test_bad_bench_flags_are_one_line_exit_2(fleet: Fleet, tmp_path: Path) -> None:
    from strata.cli.fleet import check_bench_flags
    from strata.errors import InputError

    proc = cli(tmp_path, "fleet", "bench", "synthetic:tiny", "-p", "0", "--connect",
               fleet.addr("a"))
    assert proc.returncode == 2 and "-p 0" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1  # refused before any member ran
    for flags, needle in ((["--bogus"], "No such option: --bogus"),
                          (["-B", "vllm"], "--backend vllm"), (["-n"], "-n"),
                          (["--list-presets"], "not a fleet bench flag")):
        with pytest.raises(InputError, match=needle):
            check_bench_flags(["synthetic:tiny", *flags])
    # A member asked directly checks them too, and answers with the bench's own line.
    with pytest.raises(wire.PeerError, match=r"-p 0: values must be >= 1"):
        wire.request("127.0.0.1", fleet.ports["a"], {"op": "bench", "args": [
            "synthetic:tiny", "-p", "0"]}, timeout_s=60)
    with pytest.raises(wire.PeerError, match="not a fleet bench flag"):
        wire.request("127.0.0.1", fleet.ports["a"], {"op": "bench", "args": [
            "synthetic:tiny", "--db", "/tmp/x.db"]}, timeout_s=60)


def test_a_model_no_member_has_is_a_line_each(fleet: Fleet, tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere.gguf")
    proc = cli(tmp_path, "fleet", "bench", missing, "-p", "8", "-n", "none", "--connect",
               fleet.addr("a"), "--parallel")
    assert proc.returncode == 2
    assert "nothing ran on any of the 2 member(s)" in proc.stderr
    for name in ("a", "b"):
        line = next(x for x in proc.stdout.splitlines() if x.lstrip("│ ").startswith(name))
        assert "nothing ran" in line and "nowhere.gguf" in line, proc.stdout
    assert not (tmp_path / "strata.db").exists() or \
        home_db(tmp_path).execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


LONG = ["synthetic:tiny", "-B", "llamacpp", "-p", "none", "-n", "4", "--sustained", "120"]


def test_no_bench_outlives_its_timeout_caller_or_daemon(fleet: Fleet) -> None:
    with pytest.raises(wire.PeerError, match="past the 2 s timeout"):
        wire.request("127.0.0.1", fleet.ports["b"], {"op": "bench", "args": LONG,
                                                        "timeout_s": 2}, timeout_s=30)
    assert not fleet.benches("b")
    chan = wire.connect("127.0.0.1", fleet.ports["a"], 5)
    chan.send({"op": "bench", "args": LONG})
    (bench,) = wait_for(lambda: fleet.benches("a"), 30, "a never started its bench")
    chan.close()  # the caller goes away (Ctrl-C, a crash): its bench must not run on
    wait_for(lambda: not bench.is_running() or bench.status() == psutil.STATUS_ZOMBIE, 10,
             "a's bench outlived its caller")
    wait_for(lambda: not fleet.benches("a"), 10, "a's bench was not reaped")
    # A daemon killed outright has no chance to stop its bench: the kernel ends it
    # (PR_SET_PDEATHSIG). b is not used after this test.
    chan = wire.connect("127.0.0.1", fleet.ports["b"], 5)
    chan.send({"op": "bench", "args": LONG})
    (bench,) = wait_for(lambda: fleet.benches("b"), 30, "b never started its bench")
    fleet.procs["b"].kill()
    fleet.procs["b"].wait()
    wait_for(lambda: not bench.is_running() or bench.status() == psutil.STATUS_ZOMBIE, 10,
             "b's bench outlived its daemon")
    chan.close()


def test_table_and_flat_records_from_stored_results(fleet: Fleet,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Rendered in this process from what a real member stored (no new bench): bench's
    own table led by a node column, the members table, and the flat records."""
    from strata.cli.fleet import _tables, show
    from strata.ring.control.fleet import MemberOutcome
    from strata.store import open_db
    from strata.store.runs import query_results

    results = query_results(open_db(fleet.root / "a" / "strata.db"))
    if not results:
        pytest.skip("member a stored no result (the first test did not run)")
    outcomes = [MemberOutcome("a", fleet.addr("a"), "h", fleet.fingerprint, [1], results),
                MemberOutcome("c", "127.0.0.1:9", error="connection refused")]
    _tables(outcomes)
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if "backend" in line)
    assert header.split()[1:4] == ["node", "┃", "model"]  # the lead column, then bench's
    assert "ceiling t/s" in text and "η" in text
    assert "nothing ran: connection refused" in text
    show(outcomes, "jsonl")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["node"], x.get("test"), x["error"]) for x in lines] == [
        *(("a", r.test, None) for r in results), ("c", None, "connection refused")]
