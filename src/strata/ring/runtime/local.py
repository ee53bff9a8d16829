"""A ring of local processes on loopback, commanded by the parent over pipes.

The parent plays the control plane (in a real ring: `strata ring serve` daemons): it tells
each worker process which epoch, rank and layers to serve, and the rank-0 worker to drive a
generation or to resume one. Used by the tests and by same-machine benchmarks; every
message across the pipes is plain Python (lists, floats, numpy arrays), never a torch tensor.

Worker commands (a dict with "op"):
  serve   form_group + serve_stage; answers {"ok": True, "stopped": True} or a lost record
  drive   form_group as rank 0 + Driver.generate; answers {"ok": True, "result": ...}
  generate  another Driver.generate on the same group (the stages idle in between)
  resume  form_group + Driver.resume (after a lost peer)
  check   pipeline.check_fit; answers {"ok": False, "error": message} when it does not fit
  stop    Driver.stop (STOP round the ring)
  form / close   rank 0 forms a group without driving it / closes its group
  exit    leave the loop
`close_after_s` (serve): close the group from another thread after that long, as a control
plane dropping an idle epoch does. `die_at` / `hang_at` (serve): SIGKILL / SIGSTOP this
worker when its n-th DATA message arrives, after writing time.time() to the answer pipe.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any

CTX = mp.get_context("spawn")  # fork would copy the parent's threads and torch state


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _result(result: Any) -> dict[str, Any]:
    """A GenerationResult as plain values (tensors -> numpy)."""
    out = {k: getattr(result, k) for k in ("tokens", "ttft_s", "prefill_s", "itl_s", "world",
                                           "timeline")}
    out["links"] = [asdict(link) for link in result.links]
    out["resumes"] = [asdict(r) for r in result.resumes]
    out["step_logits"] = (None if result.step_logits is None else
                          [t.numpy().copy() for t in result.step_logits])
    out["prefill_logits"] = (None if result.prefill_logits is None else
                             result.prefill_logits.numpy().copy())
    return out


def _lost(exc: Any) -> dict[str, Any]:
    return {"ok": False, "lost": exc.rank, "detect_s": exc.detect_s, "at": exc.at,
            "error": str(exc)}


@dataclass
class _Worker:
    conn: Connection
    stage: Any = None
    driver: Any = None
    group: Any = None
    data_seen: int = 0

    def hook(self, cmd: dict[str, Any]) -> Any:
        from strata.ring.runtime.transport import Kind

        self.data_seen = 0  # counted per serve command
        def on_message(header: Any) -> None:
            if header.kind != Kind.DATA:
                return
            self.data_seen += 1
            for key, sig in (("die_at", signal.SIGKILL), ("hang_at", signal.SIGSTOP)):
                if cmd.get(key) == self.data_seen:
                    self.conn.send({"ok": False, "signal": key, "at": time.time()})
                    os.kill(os.getpid(), sig)
        return on_message

    def form(self, cmd: dict[str, Any], rank: int) -> Any:
        from strata.ring.runtime.transport import form_group

        return form_group("127.0.0.1", cmd["port"], rank, cmd["world"], cmd["epoch"],
                          cmd["timeout_s"], cmd.get("op_timeout_s"))

    def handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        from strata.ring.runtime.assign import StageAssignment, check_fit
        from strata.ring.runtime.pipeline import Driver, serve_stage
        from strata.ring.runtime.transport import PeerLost

        op = cmd["op"]
        assignments = [StageAssignment(*a) for a in cmd.get("assignments", [])]
        try:
            if op == "serve":
                self.group = self.form(cmd, cmd["rank"])
                if cmd.get("close_after_s"):  # the control plane dropping an idle epoch
                    threading.Timer(cmd["close_after_s"], self.group.close).start()
                mine = next(a for a in assignments if a.rank == cmd["rank"])
                self.stage = serve_stage(self.group, mine, cmd["model"], self.stage,
                                         cmd.get("mem_cap"), self.hook(cmd),
                                         ops=cmd.get("ops", "lab"))
                return {"ok": True, "stopped": True}
            if op in ("drive", "generate"):  # generate: another request, same group
                if op == "drive":
                    self.group = self.form(cmd, 0)
                    self.driver = Driver(self.group, assignments, cmd["model"],
                                         ops=cmd.get("ops", "lab"))
                res = self.driver.generate(cmd["prompt"], cmd["n_predict"], cmd.get("seed"),
                                           cmd.get("temperature", 0.0),
                                           cmd.get("keep_logits", False))
                return {"ok": True, "result": _result(res), "formed_s": self.group.formed_s}
            if op == "resume":
                if cmd.get("caps"):  # before forming: a plan that cannot fit forms nothing
                    check_fit(cmd["model"], assignments, self.driver.state.capacity,
                              cmd["caps"])
                t0 = time.perf_counter()
                self.group = self.form(cmd, 0)
                reform_s = time.perf_counter() - t0
                res = self.driver.resume(self.group, assignments, cmd.get("caps"))
                return {"ok": True, "result": _result(res), "reform_s": reform_s}
            if op == "form":  # rank 0 holding a group without driving it
                self.group = self.form(cmd, 0)
                return {"ok": True}
            if op == "close":
                self.group.close()
                return {"ok": True}
            if op == "check":
                check_fit(cmd["model"], assignments, cmd["ctx"], cmd["caps"])
                return {"ok": True}
            if op == "stop":
                self.driver.stop()
                return {"ok": True}
        except PeerLost as exc:
            return _lost(exc)
        except Exception as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return {"ok": False, "error": f"unknown op {op!r}"}


def worker_main(conn: Connection) -> None:
    import torch

    torch.set_num_threads(1)  # several ranks share this machine's cores
    worker = _Worker(conn)
    while True:
        try:
            cmd = conn.recv()
        except EOFError:  # the parent is gone: so are we
            return
        if cmd.get("op") == "exit":
            # skip the interpreter's teardown (torch's and gloo's take ~1.5 s on a busy host):
            # nothing is left to flush but the standard streams
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        conn.send(worker.handle(cmd))


@dataclass
class LocalRing:
    """n worker processes; `send` a command to one, `answer` waits for its reply."""

    n: int
    procs: list[Any] = field(default_factory=list)
    conns: list[Connection] = field(default_factory=list)

    def start(self) -> LocalRing:
        for _ in range(self.n):
            self.add()
        return self

    def add(self) -> int:
        parent, child = CTX.Pipe()
        proc = CTX.Process(target=worker_main, args=(child,), daemon=True)
        proc.start()
        child.close()
        self.procs.append(proc)
        self.conns.append(parent)
        return len(self.procs) - 1

    def send(self, i: int, **cmd: Any) -> None:
        self.conns[i].send(cmd)

    def answer(self, i: int, timeout: float = 60.0) -> dict[str, Any]:
        if not self.conns[i].poll(timeout):
            raise TimeoutError(f"worker {i} did not answer in {timeout:.0f} s")
        return dict(self.conns[i].recv())

    def close(self, timeout: float = 5.0) -> list[int]:
        """exit every worker; SIGKILL (and reap) the ones that do not leave in time, whose
        indices it returns."""
        killed = []
        for conn in self.conns:
            with contextlib.suppress(OSError, BrokenPipeError):
                conn.send({"op": "exit"})
        deadline = time.monotonic() + timeout
        for i, proc in enumerate(self.procs):
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                killed.append(i)
                proc.kill()
                proc.join(5.0)
        for conn in self.conns:
            conn.close()
        return killed

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]
