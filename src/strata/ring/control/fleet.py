"""`strata fleet bench`: the normal `strata bench` on every ring member, gathered in one DB.

Each member runs the bench on its own hardware (not on the ring), as a `strata bench`
subprocess with its own results DB, so a member keeps its roofline and its own history. The
caller asks each member over the control protocol (op "bench"), then stores every member's
host record, roofline and runs in its own DB as runs of that member's host: `strata
compare`, `history` and `report` then see the whole fleet.

Member side: `handlers(node)` gives the "bench" op. The subprocess gets its own process
group and dies with its caller: a closed connection or the timeout stops it (SIGINT, so the
bench keeps and marks what finished; SIGKILL after a grace period), and on Linux the kernel
kills it if the daemon itself dies (PR_SET_PDEATHSIG). No bench outlives its request.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from strata.errors import InputError
from strata.ring.control import wire
from strata.ring.control.wire import Channel, Message, PeerError
from strata.store.runs import StoredResult

BENCH_TIMEOUT_S = 3600.0  # one member's whole sweep; --timeout changes it
# A member working on a request says so every wire.KEEPALIVE_S: a silence this long is
# a hung daemon (the bench's own length is bounded by the member, with --timeout).
SILENCE_S = 60.0
KILL_GRACE_S = 3.0  # SIGINT first (the bench stores what finished), then SIGKILL
POLL_S = 0.25  # how often a member checks that its caller is still there
# Flags the member sets itself: its own DB (a caller never names a member's files) and the
# machine output the reply is built from.
MEMBER_FLAGS = ("--db", "--list-presets")
STRATA = [sys.executable, "-m", "strata.cli"]


# --- member side ------------------------------------------------------------------------
def handlers(node: Any, db: Path | None = None) -> dict[str, wire.Handler]:
    """The ops this module adds to a ring daemon (`node.handlers.update(...)`). The
    member's bench uses `db`, else the daemon's own (`node.config.db`, serve's --db, when
    it has one), else the default results DB."""
    from strata.paths import default_db_path

    db = db or getattr(getattr(node, "config", None), "db", None) or default_db_path()
    bench = MemberBench(str(node.member.id), Path(db), node.model_ref)
    return {"bench": bench.handle}


@dataclass
class MemberBench:
    """One member's bench service: one bench at a time (two would disturb each other's
    figures; a second caller is told the member is busy)."""

    member_id: str
    db: Path
    ref: Callable[[str], str]  # a model name -> this member's file (node.model_ref)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, msg: Message, chan: Channel) -> Message:
        args = bench_args(msg.get("args"))
        names = set(bench_models(args))  # the node vetted them; here they become local
        args = [self.ref(a) if a in names else a for a in args]
        timeout_s = float(msg.get("timeout_s") or BENCH_TIMEOUT_S)
        if not self.lock.acquire(blocking=False):
            raise InputError(f"{self.member_id}: busy with another fleet bench; try again "
                             "when it is done")
        try:
            return self._run(args, timeout_s, chan)
        finally:
            self.lock.release()

    def _run(self, args: list[str], timeout_s: float, chan: Channel) -> Message:
        from strata.store import open_db

        conn = open_db(self.db)
        try:
            before = conn.execute("SELECT COALESCE(MAX(id), 0) FROM runs").fetchone()[0]
            argv = ["bench", *args, "-o", "json", "--no-progress", "--db", str(self.db)]
            t0 = time.perf_counter()
            rc, stderr, why = run_until(argv, timeout_s, lambda: caller_gone(chan))
            runs = runs_since(conn, before, argv)
            lines = [line.strip() for line in stderr.splitlines() if line.strip()]
            error = why or (error_line(lines, rc) if rc else None)
            if not runs:
                raise InputError(error or "bench stored no result")
            return {"member": self.member_id, **host_of(conn, runs[0]["fingerprint"]),
                    "runs": [run_payload(conn, run) for run in runs], "error": error,
                    "skipped": [line.split(" ", 1)[1] for line in lines
                                if line.startswith("skipped ")],
                    "seconds": time.perf_counter() - t0}
        finally:
            conn.close()


def bench_args(raw: Any) -> list[str]:
    if not isinstance(raw, list) or not raw or not all(isinstance(a, str) for a in raw):
        raise InputError("bench: 'args' must be a non-empty list of strings (MODEL and flags)")
    named = [a for a in raw if a.split("=", 1)[0] in MEMBER_FLAGS]
    if named:
        raise InputError(f"{named[0].split('=', 1)[0]}: not a fleet bench flag (each member "
                         "uses its own results DB)")
    return list(raw)


def bench_models(raw: Any) -> list[str]:
    """The MODEL arguments (positional and -m) of a fleet bench's argv, as `strata bench`
    parses them: every one is a name the member must serve (node.vet)."""
    import typer.main

    from strata.cli import app

    args = bench_args(raw)
    bench = typer.main.get_command(app).commands["bench"]  # type: ignore[attr-defined]
    try:
        ctx = bench.make_context("bench", list(args), resilient_parsing=True)
    except Exception as exc:  # click's usage errors: the member's bench would fail too
        raise InputError(f"bench: {exc}") from None
    found = [*(ctx.params.get("models") or []), *(ctx.params.get("model_opt") or [])]
    return [str(m) for m in found]


def run_until(argv: list[str], timeout_s: float,
              gone: Callable[[], bool]) -> tuple[int, str, str | None]:
    """Run `strata <argv>` in its own process group until it exits, the timeout passes or
    `gone()` says the caller left; (exit code, stderr, why it was stopped or None)."""
    env = {**os.environ, "STRATA_PROGRESS": "0"}
    proc = subprocess.Popen([*STRATA, *argv], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True, preexec_fn=_die_with_parent())
    deadline = time.monotonic() + timeout_s
    why = None
    while why is None:
        try:
            _, stderr = proc.communicate(timeout=POLL_S)
            return proc.returncode, stderr, None
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() > deadline:
            why = f"bench ran past the {timeout_s:g} s timeout: stopped"
        elif gone():
            why = "the caller went away: bench stopped"
    _signal(proc, signal.SIGINT)  # the bench keeps what finished and marks the run
    try:
        _, stderr = proc.communicate(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        _signal(proc, signal.SIGKILL)
        _, stderr = proc.communicate()
    _signal(proc, signal.SIGKILL)  # anything it started in its group goes too
    return proc.returncode, stderr, why


def _signal(proc: subprocess.Popen[str], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


_PRCTL: Any = None


def _die_with_parent() -> Any:
    """A preexec function asking Linux to SIGKILL the bench when the daemon dies (the
    daemon then has no chance to stop it). The libc lookup happens here, in the parent:
    a forked child of a threaded process must not load libraries."""
    global _PRCTL
    if not sys.platform.startswith("linux"):
        return None
    if _PRCTL is None:
        _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
    prctl = _PRCTL
    return lambda: prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def caller_gone(chan: Channel) -> bool:
    """The caller closed its connection (it sends nothing while it waits for the reply)."""
    try:
        readable, _, _ = select.select([chan.sock], [], [], 0)
        if not readable:
            return False
        return chan.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (OSError, ValueError):
        return True


def error_line(lines: list[str], rc: int) -> str:
    """The bench's own one-line error, without its 'error: ' prefix."""
    errors = [line for line in lines if line.startswith("error:")]
    if errors:
        return errors[-1].removeprefix("error:").strip()
    return lines[-1] if lines else f"bench exited with status {rc}"


def runs_since(conn: sqlite3.Connection, before: int, argv: list[str]) -> list[sqlite3.Row]:
    """The runs our subprocess stored: newer than `before` and made with exactly `argv`
    (a bench someone runs by hand on the member at the same time is not ours)."""
    rows = conn.execute("SELECT * FROM runs WHERE id > ? AND command = 'bench' ORDER BY id",
                        (before,)).fetchall()
    return [r for r in rows if json.loads(r["argv"] or "[]") == argv]


def host_of(conn: sqlite3.Connection, fingerprint: str) -> dict[str, Any]:
    """The member's host as its bench stored it: profile, fingerprint, roofline if any."""
    from strata.store.hosts import latest_measurement, load_host

    profile = load_host(conn, fingerprint)
    return {"fingerprint": fingerprint,
            "hostname": profile.hostname if profile else None,
            "profile": profile.to_dict() if profile else None,
            "roofline": latest_measurement(conn, fingerprint, "roofline")}


def run_payload(conn: sqlite3.Connection, run: sqlite3.Row) -> dict[str, Any]:
    from strata.store.runs import results_of_run

    keys = ("id", "status", "started_at", "finished_at", "strata", "git_commit", "argv",
            "config")
    return {"run": {k: run[k] for k in keys},
            "results": [asdict(r) for r in results_of_run(conn, run["id"])]}


# --- caller side ------------------------------------------------------------------------
@dataclass
class Target:
    """A member to ask: where it listens, its id once known, and why it is skipped."""

    addr: str
    node: str | None = None
    reason: str | None = None  # set: not asked (not a live member), or why asking failed


@dataclass
class MemberOutcome:
    """What one member's bench left in the caller's DB (or why nothing)."""

    node: str
    addr: str
    hostname: str | None = None
    fingerprint: str | None = None
    run_ids: list[int] = field(default_factory=list)
    results: list[StoredResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float | None = None


def find_targets(connect: list[str], peers: list[str], timeout_s: float) -> list[Target]:
    """Members from each --connect daemon's status (itself and its peers), then each
    --peers daemon (asked for its id too, so that a member reached under two addresses is
    asked once). A daemon that does not answer is a target with its reason."""
    found: dict[str, Target] = {}

    def status_of(where: str) -> Message:
        host, port = wire.parse_addr(where)
        addr = f"{host}:{port}"
        try:
            status = wire.request(host, port, {"op": "status"}, timeout_s=timeout_s,
                                     connect_timeout_s=timeout_s)
        except PeerError as exc:
            found.setdefault(addr, Target(addr, reason=_unprefixed(str(exc), addr)))
            return {}
        # asked directly and answering: it wins over what another daemon said of it
        found[addr] = Target(addr, str(status["self"]["id"]))
        return status

    for where in connect:
        for p in status_of(where).get("peers", []):
            member = p.get("member") or {}
            addr = f"{member['host']}:{member['port']}" if member else str(p["addr"])
            reason = None if p.get("state") == "live" else \
                f"not a live member ({p.get('state')}: {p.get('reason') or 'no reason given'})"
            found.setdefault(addr, Target(addr, member.get("id"), reason))
    for where in peers:
        status_of(where)
    best: dict[str, Target] = {}  # one member known under two addresses is asked once,
    for t in found.values():  # where it answered if it did
        key = t.node or t.addr
        if key not in best or (best[key].reason and not t.reason):
            best[key] = t
    return list(best.values())


def ask(target: Target, args: list[str], timeout_s: float) -> Message:
    """One member's bench reply; PeerError (one line) when it cannot or did not run."""
    if target.reason:
        raise PeerError(target.reason)
    host, port = wire.parse_addr(target.addr)
    return wire.request(host, port, {"op": "bench", "args": args, "timeout_s": timeout_s},
                           timeout_s=SILENCE_S, connect_timeout_s=10.0)


def store_reply(conn: sqlite3.Connection, target: Target, reply: Message) -> MemberOutcome:
    """The member's host (profile → fingerprint), roofline and runs, into the caller's DB."""
    from strata.hardware.profile import HostProfile
    from strata.store.hosts import latest_measurement, save_host, save_measurement

    node = str(reply.get("member") or target.node or target.addr)
    outcome = MemberOutcome(node, target.addr, reply.get("hostname"), reply.get("fingerprint"),
                            skipped=list(reply.get("skipped") or []), error=reply.get("error"),
                            seconds=reply.get("seconds"))
    if reply.get("profile"):
        outcome.fingerprint = save_host(conn, HostProfile.from_dict(reply["profile"]))
    if outcome.fingerprint is None:
        raise PeerError(f"{node}: its reply has no host fingerprint")
    roof = reply.get("roofline")
    if roof and latest_measurement(conn, outcome.fingerprint, "roofline") != roof:
        save_measurement(conn, outcome.fingerprint, "roofline", roof)
    for payload in reply.get("runs", []):
        run_id, results = store_run(conn, outcome, payload)
        outcome.run_ids.append(run_id)
        outcome.results += results
    return outcome


def store_run(conn: sqlite3.Connection, outcome: MemberOutcome,
              payload: dict[str, Any]) -> tuple[int, list[StoredResult]]:
    from strata.store.runs import add_result, finish_run, start_run

    run = payload["run"]
    config = json.loads(run["config"] or "{}")
    # Where the run came from: the member, its address and its own run id.
    config["fleet"] = {"node": outcome.node, "addr": outcome.addr, "member_run_id": run["id"]}
    run_id = start_run(conn, outcome.fingerprint or "", "bench", json.loads(run["argv"] or "[]"),
                       config)
    results = []
    for data in payload["results"]:
        r = StoredResult(**{**data, "id": 0, "run_id": run_id})
        r.id = add_result(conn, run_id, r)
        # add_result stamps now; the test ran when the member says (llama-bench test_time)
        r.created_at = data["created_at"] or r.created_at
        conn.execute("UPDATE results SET created_at = ? WHERE id = ?", (r.created_at, r.id))
        results.append(r)
    finish_run(conn, run_id, run["status"] if run["status"] != "running" else "incomplete")
    # The member's own times and versions: results describe the run that made them.
    conn.execute("UPDATE runs SET started_at = ?, finished_at = COALESCE(?, finished_at),"
                 " strata = ?, git_commit = ? WHERE id = ?",
                 (run["started_at"], run["finished_at"], run["strata"], run["git_commit"],
                  run_id))
    return run_id, results


Say = Callable[[str], None]


def gather(conn: sqlite3.Connection, targets: list[Target], args: list[str],
           timeout_s: float, parallel: bool, say: Say) -> list[MemberOutcome]:
    """Every target's bench, stored as it arrives (here, in the caller's thread: one
    SQLite connection); one after another unless `parallel`. A member that fails is an
    outcome with its reason, never an exception."""
    done: dict[str, MemberOutcome] = {}

    def one(t: Target) -> tuple[Target, Message | None, str | None]:
        if not t.reason:
            say(f"{t.node or t.addr}: running strata bench there…")
        try:
            return t, ask(t, args, timeout_s), None
        except PeerError as exc:
            return t, None, _unprefixed(str(exc), t.addr)

    def keep(t: Target, reply: Message | None, error: str | None) -> None:
        if reply is not None:
            try:
                done[t.addr] = store_reply(conn, t, reply)
            except (PeerError, KeyError, TypeError) as exc:
                error = f"its reply could not be stored: {exc}"
        if error is not None:
            done[t.addr] = MemberOutcome(t.node or t.addr, t.addr, error=error)
        o = done[t.addr]
        say(f"{o.node}: {len(o.results)} result(s) stored" + (f"; {o.error}" if o.error else "")
            if o.results else f"{o.node}: nothing ran: {o.error}")

    if parallel and len(targets) > 1:
        with ThreadPoolExecutor(len(targets)) as pool:
            for fut in as_completed([pool.submit(one, t) for t in targets]):
                keep(*fut.result())
    else:
        for t in targets:
            keep(*one(t))
    return [done[t.addr] for t in targets]


def _unprefixed(message: str, addr: str) -> str:
    """A PeerError names the address; the outcome carries it apart already."""
    return message.removeprefix(f"{addr}: ")


NODE_FIELDS = ("node", "addr", "hostname", "fingerprint", "run_id", "error")


def result_records(outcomes: list[MemberOutcome]) -> list[dict[str, Any]]:
    """Flat records: each stored result (its member first, then bench's record), and one
    record with the member fields only for a member whose bench ended in an error."""
    from strata.bench.records import record

    out: list[dict[str, Any]] = []
    for o in outcomes:
        head = {"node": o.node, "addr": o.addr, "hostname": o.hostname,
                "fingerprint": o.fingerprint}
        out += [{**head, "run_id": r.run_id, "error": None, **record(r)} for r in o.results]
        if o.error:
            out.append({**head, "run_id": None, "error": o.error})
    return out


def member_records(outcomes: list[MemberOutcome]) -> list[dict[str, Any]]:
    return [{"node": o.node, "addr": o.addr, "hostname": o.hostname,
             "fingerprint": o.fingerprint, "run_ids": o.run_ids, "results": len(o.results),
             "seconds": o.seconds, "skipped": o.skipped, "error": o.error} for o in outcomes]
