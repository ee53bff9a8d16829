"""`strata ring serve/status/run` as real daemons on loopback, started and killed by the tests.

Each test starts its own `strata ring serve` processes on free ports (127.0.0.1), asks them
through the CLI as a user would, and checks that no process outlives the test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from strata.ring.control import wire
from tests.conftest import RING_SECRET
from tests.test_output_schema import check

TIMEOUT_S = 1.5  # the daemons' heartbeat timeout in these tests (pings every 0.25 s)
STRATA = [sys.executable, "-m", "strata.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Ring:
    """The daemons of one test; `stop()` ends them all and proves none is left."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.env = {**os.environ, "STRATA_HOME": str(home), "STRATA_PROGRESS": "0"}

    def start(self, name: str, *args: str, mdns: bool = False, wait: bool = True) -> int:
        """Start a daemon (its start-up probes the host: seconds); `wait=False` returns at
        once, so that a test's daemons start side by side (then call `ready`)."""
        port = free_port()
        log = (self.home / f"{name}.log").open("wb")
        cmd = [*STRATA, "ring", "serve", "--name", name, "--port", str(port), "--host",
               "127.0.0.1", "--timeout", str(TIMEOUT_S), "--mdns" if mdns else "--no-mdns",
               *args]
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env)
        self.ports[name] = port
        if wait:
            self.ready(name)
        return port

    def ready(self, *names: str) -> None:
        for name in names:
            wait_for(lambda n=name: self._answers(n), 60, f"daemon {name} never answered")

    def _answers(self, name: str) -> bool:
        if self.procs[name].poll() is not None:
            raise AssertionError(f"daemon {name} exited: {self.log(name)}")
        try:
            wire.request("127.0.0.1", self.ports[name], {"op": "ping"}, timeout_s=2)
        except wire.PeerError:
            return False
        return True

    def addr(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def log(self, name: str) -> str:
        return (self.home / f"{name}.log").read_text(errors="replace")

    def status(self, name: str) -> dict[str, Any]:
        return wire.request("127.0.0.1", self.ports[name], {"op": "status"})

    def live(self, name: str) -> set[str]:
        return {p["member"]["id"] for p in self.status(name)["peers"] if p["state"] == "live"}

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*STRATA, *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout)

    def stop(self) -> None:
        """SIGTERM every daemon still running: each must leave cleanly (exit 0: a daemon
        that exits while a thread waits in gloo aborts instead), none may linger."""
        running = [name for name, proc in self.procs.items() if proc.poll() is None]
        for name in running:
            os.kill(self.procs[name].pid, signal.SIGCONT)  # a test may have frozen it
            self.procs[name].terminate()
        for name in running:
            proc = self.procs[name]
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise AssertionError(f"daemon {name} ignored SIGTERM: {self.log(name)}") from None
            assert proc.returncode == 0, f"daemon {name}: exit {proc.returncode}: {self.log(name)}"
        # multiprocessing's resource tracker lives as long as this process once a test
        # module before this one started a LocalRing (spawn); not a daemon's child
        left = [p for p in psutil.Process().children(recursive=True)
                if "resource_tracker" not in " ".join(p.cmdline())]
        assert not left, f"processes left behind: {[p.cmdline() for p in left]}"


@pytest.fixture
def ring(tmp_path: Path) -> Iterator[Ring]:
    r = Ring(tmp_path)
    try:
        yield r
    finally:
        r.stop()


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(what)


def one_line_error(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def test_peers_form_one_ring_and_a_crashed_one_leaves_it(ring: Ring) -> None:
    """a alone, b knows a, c knows b only: gossip makes all three members of each other."""
    ring.start("a", wait=False)
    ring.start("b", "--peers", ring.addr("a"), wait=False)
    ring.start("c", "--peers", ring.addr("b"), wait=False)
    ring.ready("a", "b", "c")
    for name, others in (("a", {"b", "c"}), ("b", {"a", "c"}), ("c", {"a", "b"})):
        wait_for(lambda n=name, o=others: ring.live(n) == o, 10,
                 f"{name} never saw {others}: {ring.status(name)}")
    res = ring.cli("ring", "status", "--connect", ring.addr("c"), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    check(doc, "ring.status")  # every field as docs/output.md says
    check(doc["self"], "ring.status.member")
    for peer in doc["peers"]:
        check(peer, "ring.status.peers[]")
        check(peer["member"], "ring.status.member")
    assert doc["leader"] == "a" and doc["self"]["id"] == "c"
    assert all(p["member"]["device"] == "cpu" and p["member"]["available_bytes"] > 0
               and p["rtt_ms"] is not None for p in doc["peers"])
    table = ring.cli("ring", "status", "--connect", ring.addr("a")).stdout
    assert "3 member(s), leader a" in table and table.count("live") == 2, table

    # A crash closes the control connection: the others drop it at once, not at --timeout.
    epoch = ring.status("a")["epoch"]
    ring.procs["c"].kill()
    ring.procs["c"].wait()
    t0 = time.monotonic()
    wait_for(lambda: ring.live("a") == {"b"}, TIMEOUT_S + 1, "a still lists c")
    detect = time.monotonic() - t0
    assert ring.status("a")["epoch"] > epoch
    assert detect < TIMEOUT_S, f"a crash is a closed socket: seen in {detect:.2f} s"


def test_zeroconf_finds_peers_on_loopback(ring: Ring) -> None:
    """No --peers: the two daemons find each other by mDNS on 127.0.0.1."""
    reason = _multicast_unusable()
    if reason:
        pytest.skip(f"multicast DNS does not work on this host's loopback: {reason}")
    ring.start("m1", mdns=True, wait=False)
    ring.start("m2", mdns=True, wait=False)
    ring.ready("m1", "m2")
    wait_for(lambda: ring.live("m1") == {"m2"} and ring.live("m2") == {"m1"}, 15,
             f"mDNS found nothing: {ring.status('m1')}")
    assert ring.status("m1")["mdns"] == "on"


def _multicast_unusable() -> str | None:
    """Why two zeroconf instances in this process cannot see each other, or None."""
    try:
        from zeroconf import IPVersion, ServiceInfo, Zeroconf
    except ImportError:
        return "python-zeroconf is not installed"
    kind = "_strata-probe._tcp.local."
    zcs: list[Any] = []
    try:
        a, b = (Zeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
                for _ in range(2))
        zcs = [a, b]
        a.register_service(ServiceInfo(kind, f"p{os.getpid()}.{kind}", port=1,
                                       addresses=[socket.inet_aton("127.0.0.1")]))
        return None if b.get_service_info(kind, f"p{os.getpid()}.{kind}", timeout=3000) \
            else "a record registered on 127.0.0.1 was not seen by a second instance"
    except OSError as exc:
        return str(exc)
    finally:
        for zc in zcs:
            zc.close()


def test_another_version_is_refused_with_the_reason(ring: Ring) -> None:
    ring.start("a", wait=False)
    ring.start("b", "--peers", ring.addr("a"), "--version-as", "0.0.1", wait=False)
    ring.ready("a", "b")
    peer = wait_for(lambda: next((p for p in ring.status("b")["peers"]
                                  if p["state"] == "refused"), None), 10, "b was not refused")
    assert "strata 0.0.1 cannot join a ring of strata" in peer["reason"], peer
    assert ring.live("a") == set() and ring.live("b") == set()
    res = ring.cli("ring", "status", "--connect", ring.addr("b"))
    assert "refused" in res.stdout and "install the same version" in res.stdout, res.stdout
    assert f"(127.0.0.1:{ring.ports['a']}, refused): another strata version: install the " \
        "same one on every member" in " ".join(res.stdout.split()), res.stdout


def test_port_in_use_unreachable_and_hung_daemons_are_one_line_errors(ring: Ring) -> None:
    dead = free_port()  # nobody listens there
    line = one_line_error(ring.cli("ring", "status", "--connect", f"127.0.0.1:{dead}"))
    assert "connection refused" in line
    ring.start("a", "--peers", f"127.0.0.1:{dead}", wait=False)
    ring.start("h", "--peers", ring.addr("a"), wait=False)
    ring.ready("a", "h")
    line = one_line_error(ring.cli("ring", "serve", "--name", "b", "--port",
                                   str(ring.ports["a"]), "--host", "127.0.0.1", "--no-mdns"))
    assert f"port {ring.ports['a']} is in use" in line and "--port" in line
    line = one_line_error(ring.cli("ring", "serve", "--name", "b", "-t", "0", "--host",
                                   "127.0.0.1", "--no-mdns"))
    assert "--threads" in line, line
    peer = wait_for(lambda: next((p for p in ring.status("a")["peers"]
                                  if p["state"] == "unreachable"), None), 10, "no unreachable")
    assert peer["addr"] == f"127.0.0.1:{dead}" and "refused" in peer["reason"]
    assert peer["fix"].startswith(f"nothing listens at 127.0.0.1:{dead}: start `strata ring "
                                  "serve` there"), peer
    # A hung daemon (stopped, its socket still accepting): one line after --timeout.
    wait_for(lambda: ring.live("a") == {"h"}, 10, "h never joined")
    os.kill(ring.procs["h"].pid, signal.SIGSTOP)
    t0 = time.monotonic()
    line = one_line_error(ring.cli("ring", "status", "--connect", ring.addr("h"),
                                   "--timeout", "1"))
    assert "no answer within 1 s" in line and "hung" in line, line  # not even the handshake
    line = one_line_error(ring.cli("ring", "run", MODEL, "-p", PROMPT, "-n", "4", "--connect",
                                   ring.addr("h"), "--timeout", "1"))
    assert "no answer within 1 s" in line and "hung" in line, line
    wait_for(lambda: ring.live("a") == set(), 3 * TIMEOUT_S, "a kept the hung peer")
    assert time.monotonic() - t0 < 4 * TIMEOUT_S + 3
    lost = next(p for p in ring.status("a")["peers"] if p["member"]
                and p["member"]["id"] == "h")
    assert lost["state"] in ("lost", "unreachable") and "no answer" in lost["reason"], lost


# -- runs across the ring ---------------------------------------------------------------------

MODEL = "synthetic:tiny-deep@f32"  # 4 layers, 898 KiB as stored (float32; + KV cache)
CAP = "0.0008"  # GiB: no member holds it alone (0.9 x 839 KiB), any two do
PROMPT = "The ring turns"


def _run(ring: Ring, at: str, n: int, heard: list[dict[str, Any]] | None = None,
         **extra: Any) -> dict[str, Any]:
    """A generation asked of daemon `at` (the CLI's request, its default f16 K/V cache
    included, without its start-up); with `heard`, streamed: each token's message is
    appended to it as it comes."""
    return wire.request("127.0.0.1", ring.ports[at],
                        {"op": "run", "model": MODEL, "prompt": PROMPT, "n": n,
                         "stream": heard is not None, "kv_type": "f16", **extra},
                        timeout_s=120, on_progress=None if heard is None else heard.append)


def test_runs_equal_one_process_and_survive_a_lost_member(ring: Ring) -> None:
    """solo holds the model alone; a, b and (later) c are capped so that two are needed.
    b and c crash at the 20th activation they receive in one request (a test hook)."""
    ring.start("solo", wait=False)
    ring.start("a", "--mem-cap", CAP, wait=False)
    ring.start("b", "--mem-cap", CAP, "--peers", ring.addr("a"), "--die-at", "20", wait=False)
    ring.ready("solo", "a", "b")
    wait_for(lambda: ring.live("a") == {"b"}, 10, "b never joined")

    # Greedy, through the CLI at b (it passes the request to the leader, a): as one process.
    res = ring.cli("ring", "run", MODEL, "-p", PROMPT, "-n", "8", "--connect", ring.addr("b"),
                   "--json")
    assert res.returncode == 0, (res.stderr, ring.log("a"))
    two = json.loads(res.stdout)
    check(two, "ring.run")
    one = _run(ring, "solo", 8)
    assert one["world"] == 1 and two["world"] == 2 and not two["lost"], two
    assert two["tokens"] == one["tokens"] and len(one["tokens"]) == 8
    assert two["text"] == one["text"] != ""  # the tokens as text, by the model's tokenizer
    shown = ring.cli("ring", "run", MODEL, "-p", PROMPT, "-n", "8", "--connect", ring.addr("b"))
    assert shown.returncode == 0 and shown.stdout.startswith(two["text"] + "\n"), shown.stdout
    assert shown.stdout.count(two["text"]) == 1  # streamed, not printed again at the end
    line = one_line_error(ring.cli("ring", "run", MODEL, "-p", PROMPT, "-n", "2", "--chat",
                                   "--connect", ring.addr("a")))
    assert "no chat template" in line and "--chat" in line, line
    assert [s["member"] for s in two["stages"]] == ["a", "b"]
    # The plan's figure is the same order as the measured one (a 27,136,118 ms prediction
    # for a ~10 ms token once went out): stages timed by the members, links, machinery.
    measured = 1e3 / two["decode_tps"]
    print(f"\npredicted {two['predicted_ms_per_token']} ms/token, measured {measured:.2f}")
    assert 0.2 < two["predicted_ms_per_token"] / measured < 5
    ring.start("c", "--mem-cap", CAP, "--peers", ring.addr("b"), "--die-at", "20", wait=False)
    links = {(x["src"], x["dst"]): x for x in ring.status("a")["links"]}
    assert links[("a", "b")]["bandwidth_Bps"] > 0  # measured by a member for the plan
    table = ring.cli("ring", "status", "--connect", ring.addr("a")).stdout
    assert "links measured for the plan" in table, table
    held = ring.status("a")["stage"]  # a's share of the last run, and how it computes it
    assert (held["first"], held["last"], held["ops"]) == (two["stages"][0]["first"],
                                                          two["stages"][0]["last"], "lab")
    # ring run's default K/V cache, llama.cpp's: f16 in every stage (and said so)
    assert two["kv_type"] == held["kv"] == "f16" and "K/V cache f16" in table, table
    # a q8_0 cache holds blocks of 32 values: tiny-deep's heads of 16 are refused by the
    # leader before any plan or stage
    line = one_line_error(ring.cli("ring", "run", MODEL, "-p", PROMPT, "-n", "2", "--kv-type",
                                   "q8_0", "--connect", ring.addr("b")))
    assert "blocks of 32 values, but this model's heads have 16" in line, line
    assert held["on_torch"] == [] and "every op verified here" in table, (held, table)

    # Another model file on a member: the order is refused with the reason.
    order = {"op": "assign", "epoch": 99, "rank": 1, "world": 2, "first": 2, "last": 4,
             "model": MODEL, "model_hash": "0" * 16, "master": "127.0.0.1", "port": 1,
             "assignments": [[0, 0, 2], [1, 2, 4]]}
    with pytest.raises(wire.PeerError, match="differs here"):
        wire.request("127.0.0.1", ring.ports["solo"], order, timeout_s=60)
    ring.ready("c")
    wait_for(lambda: ring.live("a") == {"b", "c"}, 10, "c never joined")

    # c joined between requests, but the plan stays on a, b (no predicted gain > 20%).
    # b dies after 19 tokens: the leader plans a + c and the replay gives the same text
    # (sampled: greedy tokens of random weights repeat one id).
    sampling = {"seed": 5, "temperature": 1.0}
    reference = _run(ring, "solo", 30, **sampling)["tokens"]
    assert len(set(reference)) > 10
    heard: list[dict[str, Any]] = []
    resumed = _run(ring, "a", 30, heard, **sampling)
    assert [(e["lost"], e["at_token"]) for e in resumed["lost"]] == [("b", 19)], resumed
    assert [s["member"] for s in resumed["stages"]] == ["a", "c"]
    assert resumed["tokens"] == reference
    # streamed as made, across the loss: each token once, in order, the text whole
    assert [h["token"] for h in heard] == reference
    assert "".join(h["text"] for h in heard) == resumed["text"] != ""

    # Again: c goes too, and a alone cannot hold the model: the error says what is missing.
    wait_for(lambda: ring.live("a") == {"c"}, 5, "a still lists b")
    line = one_line_error(ring.cli("ring", "run", MODEL, "-p", PROMPT, "-n", "30", "--seed",
                                   "5", "--temp", "1", "--connect", ring.addr("a")))
    assert "after losing c:" in line and "missing" in line, line


def test_members_time_a_layer_and_the_plan_uses_it(ring: Ring) -> None:
    """`time_layer`: a member's decode time of one tiny-deep layer (loaded alone through
    strata.ring.runtime.stage); `ring plan --connect` asks every live member for theirs."""
    ring.start("a", "--mem-cap", CAP, wait=False)
    ring.start("b", "--mem-cap", CAP, "--peers", ring.addr("a"), wait=False)
    ring.ready("a", "b")
    wait_for(lambda: ring.live("a") == {"b"}, 10, "b never joined")
    timed = wire.request("127.0.0.1", ring.ports["b"], {"op": "time_layer",
                                                           "model": MODEL}, timeout_s=60)
    assert 0 < timed["layer_s"] < 1 and timed["head_s"] >= 0 and timed["depth"] == 16, timed
    assert timed["reps"] >= 5 and len(timed["model_hash"]) == 16

    res = ring.cli("ring", "plan", MODEL, "--connect", ring.addr("a"), "-c", "64", "--json")
    assert res.returncode == 0, (res.stderr, ring.log("a"))
    plan = json.loads(res.stdout)
    assert {s["member"] for s in plan["stages"]} == {"a", "b"}
    assert all(s["time_source"] == "measured" and s["layer_ms"] > 0 for s in plan["stages"])
    assert any(n.startswith("stage time measured: ") for n in plan["notes"]), plan["notes"]


def test_the_timed_run_of_layers_outgrows_the_cache() -> None:
    """A layer timed alone again and again is read from the cache; the timed run holds
    twice the last-level cache's bytes (smollm2-135m q8_0: 4.5 MB layers), one layer off
    the CPU."""
    import math

    from strata.hardware.cpu import probe_cpu
    from strata.models.synthetic import parse_ref
    from strata.ring.control.layer_time import span

    spec = parse_ref("synthetic:smollm2-135m@q8_0").gguf_spec()  # a plan: nothing written
    llc = probe_cpu().last_level_cache_bytes() or 32 << 20
    k = span(spec, "cpu")
    per_layer = spec.weight_bytes() / spec.n_layers
    assert k == math.ceil(2 * llc / per_layer) > 1
    assert (k - 1) * per_layer < 2 * llc <= k * per_layer
    assert span(spec, "cuda:0") == 1


def test_a_member_that_cannot_time_keeps_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader's gather: a refusal and a silent member leave those two on bandwidth x η
    (with the reason, in the plan's notes); the one that answers is measured. Fake daemons
    on three loopback addresses (three machines to the gather), so this runs in a second."""
    import threading
    from types import SimpleNamespace

    from strata.errors import InputError
    from strata.ring.control import layer_time
    from strata.ring.plan.members import Member
    from strata.ring.plan.partition import plan_ring

    monkeypatch.setattr(layer_time, "GATHER_TIMEOUT_S", 0.5)
    hang = threading.Event()

    def refuse(_msg: Any, _chan: Any) -> Any:
        raise InputError("cannot load it here")

    def silent(_msg: Any, _chan: Any) -> Any:
        hang.wait(5)
        return {}

    answers = {"layer_s": 1e-6, "head_s": 1e-7, "depth": 16, "reps": 5}  # a: the fastest
    servers = {mid: wire.Server(host, 0, {"time_layer": fn}, key=RING_SECRET.encode())
               for mid, host, fn in (("a", "127.0.0.1", lambda _m, _c: dict(answers)),
                                     ("b", "127.0.0.2", refuse), ("c", "127.0.0.3", silent))}
    for s in servers.values():
        s.serve_in_thread()
    members = [Member(id=mid, host=s.host, port=s.port, device="cpu",
                      available_bytes=2**30, mem_cap_bytes=700_000, bandwidth_Bps=1e9,
                      flops=None, strata_version="t", epoch=0) for mid, s in servers.items()]
    node = SimpleNamespace(member=members[0], config=SimpleNamespace(host="127.0.0.1",
                                                                     port=servers["a"].port),
                           live=lambda: [SimpleNamespace(id=m.id, addr=(m.host, m.port))
                                         for m in members[1:]])
    try:
        times, missing = layer_time.LayerTimer(node).gather(MODEL, members)
    finally:
        hang.set()
        for s in servers.values():
            s.stop()
    assert set(times) == {"a"} and times["a"].layer_s == 1e-6
    assert "cannot load it here" in missing["b"] and "within 0.5 s" in missing["c"], missing
    plan = plan_ring(MODEL, members, 64, measured=times)
    plan.notes += layer_time.estimate_notes(times, missing, [s.member for s in plan.stages])
    sources = {s.member: s.time_source for s in plan.stages}
    assert sources.get("a") == "measured" and "estimated" in sources.values(), sources
    assert any("bandwidth x η estimate" in n for n in plan.notes), plan.notes
