"""The judge's handle on a kernel's worker process (kernels/worker.py): start it confined,
map shared memory into it, load and bind kernels, run calls and wait for "done" under a
deadline, read its CPU time from /proc — and turn a dead, silent or misbehaving worker into
a Failure. Every verdict is decided here, in the judge's process, from shared memory.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.kernels import checks, ipc
from strata.kernels.checks import Failure
from strata.kernels.shm import Arena, Segment

STARTUP_S = 120.0  # importing torch on a busy 2-core host can take a while


class WorkerFailure(Exception):
    """The worker died, hung, refused, or reported an escape attempt."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


@dataclass
class WorkerSpec:
    device: str = "cpu"
    confined: bool = True
    torch: bool = True  # the worker imports torch (Python kernels, baselines, GPU mirrors)
    python_kernels: bool = False  # Triton launchers: the audit hook refuses native calls
    timeout_s: float = 120.0
    memory_bytes: int | None = None
    per_request: bool = False  # a long-lived worker: timeout_s bounds each request, not the job


class KernelProcess:
    """One worker; `deadline` bounds the whole job, each request waits at most until then."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: Any = None
        self.scratch: Path | None = None
        self.sandbox: dict[str, Any] | None = None
        self.mapped: dict[int, bool] = {}  # segment -> mapped writable
        self.deadline = time.monotonic() + spec.timeout_s
        self._ids = itertools.count(1)
        self.dead: Failure | None = None  # why it stopped: every later request says the same

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> KernelProcess:
        from strata.kernels.confine import Plan
        from strata.kernels.sandbox import SandboxPolicy, toolchain_dirs, worker_env
        from strata.launch import _limit_setter

        s = self.spec
        self.scratch = Path(tempfile.mkdtemp(prefix="strata-ksandbox-"))
        parent, child = ipc.pair()
        config = {"device": s.device, "torch": s.torch, "python_kernels": s.python_kernels,
                  "confine": Plan(str(self.scratch), s.device != "cpu",
                                  toolchain_dirs()).to_job() if s.confined else None}
        limits = SandboxPolicy(s.timeout_s, s.memory_bytes).limits(s.device)
        log = (self.scratch / "worker.log").open("wb")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "strata.kernels.worker", "--fd", str(child.fileno()),
                 "--config", json.dumps(config)],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env=worker_env(s.device, self.scratch if s.confined else None),
                start_new_session=True, preexec_fn=_limit_setter(limits))
        finally:
            child.close()
            log.close()
        self.sock = parent
        ready = self._reply(min(STARTUP_S, self.remaining()), "start")
        if "error" in ready:
            raise WorkerFailure(Failure(checks.CRASHED, str(ready["error"])))
        self.sandbox = ready.get("sandbox")
        return self

    def remaining(self) -> float:
        if self.spec.per_request:
            return self.spec.timeout_s
        return max(0.0, self.deadline - time.monotonic())

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(ipc.ChannelClosed, OSError):
                ipc.send(self.sock, {"op": "exit"})
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._kill()
            self.proc = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def _kill(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def __enter__(self) -> KernelProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests --------------------------------------------------------------------------
    def request(self, msg: dict[str, Any], fds: tuple[int, ...] = (),
                what: str = "") -> dict[str, Any]:
        """The worker's reply; WorkerFailure when it errs, dies, hangs past the deadline or
        reports an escape attempt."""
        if self.dead is not None:
            raise WorkerFailure(self.dead)
        if self.sock is None:
            raise WorkerFailure(Failure(checks.CRASHED, "the worker is not running"))
        try:
            ipc.send(self.sock, msg, fds)
        except (ipc.ChannelClosed, OSError):
            raise WorkerFailure(self._death()) from None
        reply = self._reply(self.remaining(), what or str(msg.get("op")))
        if reply.get("violations"):
            v = reply["violations"]
            raise WorkerFailure(Failure(checks.SANDBOX_VIOLATION, f"the kernel tried to {v[0]}; "
                                        "kernels may not touch files, processes or the "
                                        "network", list(v)[:checks.MAX_SHOWN]))
        if "error" in reply:
            raise WorkerError(str(reply["error"]), [str(t) for t in reply.get("trace", [])])
        return reply

    def _reply(self, timeout: float, what: str) -> dict[str, Any]:
        self.sock.settimeout(max(0.001, timeout))
        try:
            msg, fds = ipc.recv(self.sock)
        except TimeoutError:
            self._kill()
            self.dead = Failure(checks.TIMEOUT, f"did not finish within "
                                f"{self.spec.timeout_s:g} s ({what}; killed with its "
                                "process group)")
            raise WorkerFailure(self.dead) from None
        except (ipc.ChannelClosed, OSError):
            raise WorkerFailure(self._death()) from None
        for fd in fds:  # the judge never takes descriptors from a worker
            os.close(fd)
        return msg

    def _death(self) -> Failure:
        """Why the worker is gone: its signal or exit code and the tail of its output."""
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._kill()
                code = self.proc.returncode
        how = f"killed by signal {-code}" if (code or 0) < 0 else f"exit code {code}"
        tail = self.log_tail()
        from strata.hardware.smoke import error_summary

        self.dead = Failure(checks.CRASHED, f"the worker died ({how}): "
                            f"{error_summary(tail) or 'no error output'}",
                            tail.splitlines()[-5:])
        return self.dead

    def log_tail(self, limit: int = 4000) -> str:
        if self.scratch is None:
            return ""
        try:
            data = (self.scratch / "worker.log").read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode("utf-8", "replace").strip()

    # -- memory and calls ------------------------------------------------------------------
    def map(self, seg: Segment, write: bool) -> None:
        have = self.mapped.get(seg.id)
        if have is not None and (have or not write):
            return
        self.request({"op": "map", "seg": seg.id, "nbytes": seg.nbytes, "write": write},
                     (seg.fd,))
        self.mapped[seg.id] = write

    def unmap(self, segs: list[int]) -> None:
        segs = [s for s in segs if s in self.mapped]
        if segs:
            self.request({"op": "unmap", "segs": segs})
            for s in segs:
                self.mapped.pop(s, None)

    def load(self, opname: str, impl: dict[str, Any] | None = None,
             baseline: str | None = None) -> int:
        """Load a kernel (or, in a trusted worker, a torch baseline); its id."""
        kid = next(self._ids)
        what: dict[str, Any] = {"impl": impl} if impl is not None else {"baseline": baseline}
        self.request({"op": "load", "kid": kid, "opname": opname, **what}, what="load")
        return kid

    def bind(self, kid: int, args: list[tuple[Segment, int, str, list[int]]], sizes: list[int],
             params: dict[str, float], writable: int = 1) -> int:
        """A call of kernel `kid` on these buffers (the first `writable` are outputs)."""
        for i, (seg, _, _, _) in enumerate(args):
            self.map(seg, i < writable)
        cid = next(self._ids)
        self.request({"op": "bind", "cid": cid, "kid": kid,
                      "args": [[seg.id, off, dt, shape] for seg, off, dt, shape in args],
                      "sizes": [int(n) for n in sizes], "params": params})
        return cid

    def run(self, cids: list[int], threads: int | None = None,
            record: bool = False) -> dict[str, Any]:
        reply = self.request({"op": "run", "cids": cids, "threads": threads, "record": record})
        if reply.get("open_region"):
            raise WorkerFailure(Failure(checks.LEFT_THREAD, "the kernel returned inside an "
                                        "OpenMP parallel region it opened (GOMP_parallel_start "
                                        "without GOMP_parallel_end): its team goes on "
                                        "computing after \"done\", where no timer sees it"))
        return reply

    def stage(self, cids: list[int], to: str) -> None:
        if self.spec.device != "cpu":
            self.request({"op": "stage", "cids": cids, "to": to})

    def cpu_ns(self) -> int:
        """CPU time of every thread of the worker so far (ns, from the kernel's scheduler
        statistics; the worker cannot change them)."""
        if self.proc is None:
            return 0
        total = 0
        try:
            tasks = os.listdir(f"/proc/{self.proc.pid}/task")
        except OSError:
            return 0
        for tid in tasks:
            try:
                with open(f"/proc/{self.proc.pid}/task/{tid}/schedstat") as fh:
                    total += int(fh.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
        return total


class WorkerError(WorkerFailure):
    """The worker answered with an error (a kernel that raised, a load that failed)."""

    def __init__(self, message: str, trace: list[str]) -> None:
        super().__init__(Failure(checks.CRASHED, message, trace[-checks.MAX_SHOWN:]))


class RemoteKernel:
    """A kernel loaded in a worker, called like a dialect's Kernel: `bind(out, inputs,
    params)` returns a thunk that runs the call in the worker and waits for it. Every tensor
    must live in shared memory (`arena`); `threads` sets the OpenMP team of the next calls."""

    def __init__(self, proc: KernelProcess, kid: int, spec: Any, arena: Arena, *,
                 record: bool = False, inputs_writable: bool = True) -> None:
        self.proc, self.kid, self.spec, self.arena = proc, kid, spec, arena
        self.record = record
        self.inputs_writable = inputs_writable
        self.threads: int | None = None

    @classmethod
    def load(cls, proc: KernelProcess, impl: Any, spec: Any, arena: Arena,
             **kw: Any) -> RemoteKernel:
        try:
            kid = proc.load(spec.name, impl=impl.to_job())
        except WorkerError as exc:  # a kernel that does not load
            raise WorkerFailure(Failure(checks.BUILD_FAILED, exc.failure.message,
                                        exc.failure.details)) from None
        return cls(proc, kid, spec, arena, **kw)

    def _arg(self, t: Any) -> tuple[Segment, int, str, list[int]]:
        found = self.arena.locate(t)
        if found is None:
            raise ValueError("a tensor outside shared memory reached a remote kernel")
        seg, offset = found
        return seg, offset, str(t.dtype).replace("torch.", ""), list(t.shape)

    def bind_call(self, out: Any, inputs: list[Any], params: dict[str, Any]) -> int:
        args = [self._arg(t) for t in (out, *inputs)]
        sizes = list(self.spec.sizes(out, *inputs))
        return self.proc.bind(self.kid, args, sizes,
                              {k: float(v) for k, v in params.items()},
                              writable=len(args) if self.inputs_writable else 1)

    def run(self, cids: list[int]) -> None:
        """Run bound calls in order (staged to and from a GPU around them); a torch compute
        op a Python launcher ran fails the kernel."""
        self.proc.stage(cids, "device")
        reply = self.proc.run(cids, self.threads, self.record)
        self.proc.stage(cids, "host")
        ops = reply.get("torch_ops")
        if ops:
            raise WorkerFailure(Failure(checks.CALLS_TORCH, f"the kernel called torch compute "
                                        f"op(s) {', '.join(map(str, ops))}; it must compute the "
                                        "op itself, not delegate to the vendor path"))

    def bind(self, out: Any, inputs: list[Any], params: dict[str, Any]) -> Callable[[], None]:
        cid = self.bind_call(out, inputs, params)

        def call() -> None:
            self.run([cid])

        call.cid = cid  # type: ignore[attr-defined]
        return call

    def refresh(self, cids: list[int]) -> None:
        """Bring the outputs of these calls back again (GPU; shared memory needs nothing)."""
        self.proc.stage(cids, "host")


@contextmanager
def worker(spec: WorkerSpec) -> Iterator[KernelProcess]:
    proc = KernelProcess(spec)
    try:
        yield proc.start()
    finally:
        proc.close()


# OpenMP teams spin briefly after a parallel region (libgomp's spin count; far longer on a
# VM where a pause traps), and a preempted worker may run its last microseconds late: an
# idle window may hold 2 ms plus half a core of that before it counts as work. Work that
# goes on keeps at least one core busy, so it is busy in window after window.
IDLE_ALLOWANCE_S = 0.002
BUSY_WINDOWS = 3


@dataclass
class Idle:
    """CPU the worker burned while it had nothing to do (after "done", before the next
    request): threads still computing after the call returned. `window_s` is the wall time
    the windows really lasted (a loaded host oversleeps), `windows` how many were watched."""

    window_s: float
    cpu_s: float
    windows: int = 1

    @property
    def busy(self) -> bool:
        return self.cpu_s > self.windows * IDLE_ALLOWANCE_S + 0.5 * self.window_s


def idle_cpu(proc: KernelProcess, window_s: float = 0.01) -> Idle:
    """One window: the worker's CPU over `window_s` of the parent's sleep."""
    c0, t0 = proc.cpu_ns(), time.perf_counter()
    time.sleep(window_s)
    return Idle(time.perf_counter() - t0, (proc.cpu_ns() - c0) / 1e9)


def kept_busy(proc: KernelProcess, settle_s: float = 0.03, window_s: float = 0.01,
              gap_s: float = 0.05) -> Idle:
    """Whether the worker keeps computing while it waits: after `settle_s` (an OpenMP
    team's spin), busy in each of BUSY_WINDOWS windows `gap_s` apart. The first idle window
    ends the watch (an honest kernel costs one window); a blip (a spin's tail, a page-fault
    storm, a preempted wake-up) does not last the 100 ms the later windows span."""
    time.sleep(settle_s)
    seen = Idle(0.0, 0.0, 0)
    for i in range(BUSY_WINDOWS):
        if i:
            time.sleep(gap_s)
        one = idle_cpu(proc, window_s)
        if not one.busy:
            return one
        seen = Idle(seen.window_s + one.window_s, seen.cpu_s + one.cpu_s, seen.windows + 1)
    return seen
