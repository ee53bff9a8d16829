"""`strata kernels bench`, timed by the judge: one timing path for every dialect and baseline.

Each contender runs in a worker process (kernels/process.py: candidates confined, the torch
baselines in a trusted one); this process prepares the inputs in shared memory, times a
batch of calls with its own clock from the request to the worker's "done", and checks what
the calls left behind. Per shape: inputs no kernel can predict (buffers.InputStream: OS-random
windows of generated pools, mixed), the cache flushed before every call (cold; a buffer
>= 2x the probed last-level cache, touched by the worker), warm-up by time, median and IQR
from `strata.measure` (docs/architecture.md §5, §8).

Completion is defined by the output: right after "done" a random sample of every output is
remembered and compared again one call later (an output that changes after "done" is work
after return), the worker's CPU time while it waits is read from /proc (threads still
computing are visible), inputs are sampled before and after, and outputs are checked against
the reference (every call where that is cheap, else a random sample chosen after the call).

The channel's own round trip (a null request to the trusted baseline worker, its minimum)
is subtracted from every sample, kernel and baseline alike; it never flatters a figure (the
minimum under-states the cost a call carries). Calls are batched so the round trip stays
small next to tiny kernels.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from strata.kernels import checks
from strata.kernels.buffers import InputStream, Slot, TimedOutputChecker, probes_intact
from strata.kernels.impl import Implementation
from strata.kernels.judge import after_return, oracle
from strata.kernels.process import (
    BUSY_WINDOWS,
    Idle,
    KernelProcess,
    RemoteKernel,
    WorkerFailure,
    WorkerSpec,
    worker,
)
from strata.kernels.shm import Arena
from strata.kernels.spec import KernelSpec, get_spec
from strata.measure.stats import percentile
from strata.measure.timer import HostClock, TimingPolicy, time_calls

BASELINES = ("torch.eager", "torch.compile")
CHECK_MAX_ELEMENTS = 1 << 26  # skip the float64 re-check where the oracle itself gets slow
OVERHEAD_PINGS = 40
BATCH_MAX = 32
BATCH_BYTES = 256 << 20  # shared memory a warm batch may take
SNAPSHOT_ELEMENTS = 1024


def flusher(device: str, nbytes: int) -> Callable[[], None]:
    """Touch a buffer larger than the cache (in this process; benchmarks outside the lab).

    On the CPU the flush is a single-threaded numpy pass: a torch op would wake torch's
    OpenMP team right before the timed call and let it spin into the measurement.
    """
    if device == "cpu":
        import numpy as np

        host = np.zeros(max(1, nbytes // 4), dtype=np.float32)

        def flush_host() -> None:
            np.add(host, 1.0, out=host)

        return flush_host
    import torch

    from strata.hardware.vendors import runtime_for

    runtime = runtime_for(device)
    if nbytes <= 0:  # 2x the GPU's last-level cache, from the runtime
        nbytes = 2 * (runtime.cache_bytes(device) or 64 << 20)
    buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)

    def flush() -> None:
        buf.add_(1.0)
        runtime.sync(device)

    return flush


def clock_for(device: str) -> Any:
    """The clock its vendor's runtime times `device` with (events on cuda, else wall clock)."""
    from strata.hardware.vendors import runtime_for

    return runtime_for(device).make_clock(device)


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median_s": percentile(ordered, 50), "p25_s": percentile(ordered, 25),
            "p75_s": percentile(ordered, 75), "min_s": ordered[0], "n": len(ordered)}


def measure_overhead(proc: KernelProcess, n: int = OVERHEAD_PINGS) -> float:
    """The minimum round trip of an empty run request (seconds)."""
    best = math.inf
    for _ in range(n):
        t0 = time.perf_counter_ns()
        proc.run([])
        best = min(best, (time.perf_counter_ns() - t0) / 1e9)
    return best


@dataclass
class Watch:
    """What the judge remembers between timed calls: output samples taken at "done" and
    the worker's CPU time while it idled."""

    proc: KernelProcess
    snapshots: dict[int, list[tuple[Any, Any]]] = field(default_factory=dict)
    idle_cpu_s: float = 0.0
    idle_s: float = 0.0
    failure: str | None = None
    run: Idle = field(default_factory=lambda: Idle(0.0, 0.0, 0))  # busy windows in a row

    def at_done(self, group: int, slots: list[Slot]) -> tuple[int, float]:
        """Right after "done": sample the outputs; return the CPU clock and wall time."""
        import torch

        cpu, now = self.proc.cpu_ns(), time.perf_counter()
        shots = []
        for slot in slots:
            flat = slot.out.view(-1)
            k = min(SNAPSHOT_ELEMENTS, flat.numel())
            idx = torch.randint(0, flat.numel(), (k,))
            shots.append((idx, flat[idx].clone()))
        self.snapshots[group] = shots
        return cpu, now

    def stable(self, group: int, slots: list[Slot]) -> None:
        """The outputs still hold what they held at "done"."""
        for slot, (idx, vals) in zip(slots, self.snapshots.pop(group, []), strict=False):
            if self.failure is None and not checks.same_values(slot.out.view(-1)[idx], vals):
                self.failure = (f"{checks.ASYNC_WRITE}: an output changed after the call "
                                "returned (work continued after \"done\")")

    def idle(self, cpu0: int, t0: float) -> None:
        """One gap between batches: work hidden there keeps the worker busy gap after gap
        (BUSY_WINDOWS in a row); one busy gap is a spin's tail or a preempted wake-up."""
        one = Idle(time.perf_counter() - t0, (self.proc.cpu_ns() - cpu0) / 1e9)
        self.idle_s += one.window_s
        self.idle_cpu_s += one.cpu_s
        if not one.busy:
            self.run = Idle(0.0, 0.0, 0)
            return
        r = self.run = Idle(self.run.window_s + one.window_s, self.run.cpu_s + one.cpu_s,
                            self.run.windows + 1)
        if self.failure is None and r.windows >= BUSY_WINDOWS:
            self.failure = (f"{checks.LEFT_THREAD}: the kernel's process computed "
                            f"{r.cpu_s * 1e3:.1f} ms while it had nothing to do "
                            f"({r.window_s * 1e3:.1f} ms over {r.windows} gaps between "
                            "calls)")


class ShapeBench:
    """One shape: every contender timed on a stream of fresh inputs (docs/architecture.md §8:
    timed calls never see the same inputs twice), the cache flushed before each call."""

    def __init__(self, spec: KernelSpec, shape: dict[str, int], dtype: str,
                 proc: KernelProcess, policy: TimingPolicy, cache: str, flush_bytes: int,
                 overhead_s: float) -> None:
        self.spec, self.shape, self.dtype, self.proc = spec, shape, dtype, proc
        self.policy, self.cache, self.flush_bytes = policy, cache, flush_bytes
        self.params = spec.params_for(shape)
        self.overhead_s = overhead_s

    def _flush(self) -> None:
        if self.cache == "cold":
            self.proc.request({"op": "flush", "nbytes": self.flush_bytes})

    def _batch(self, single_s: float, slot_bytes: int) -> int:
        """Calls per timed request: enough that the round trip is small next to them,
        within a memory budget. Each call of a batch has its own slot (inputs and output),
        so after the cache was flushed before the batch (cold), every call still reads
        data no call before it touched."""
        want = math.ceil(20 * self.overhead_s / max(single_s, 1e-7))
        return max(1, min(BATCH_MAX, want, BATCH_BYTES // max(1, 2 * slot_bytes)))

    def time(self, kernel: RemoteKernel, checker: TimedOutputChecker | None,
             watch: Watch | None, arena: Arena, first: Slot, single_s: float) -> \
            dict[str, Any]:
        slot_bytes = sum(t.numel() * t.element_size() for t in (first.out, *first.inputs))
        batch = self._batch(single_s, slot_bytes)
        stream = InputStream(self.spec, self.shape, self.dtype, arena, slots_n=2 * batch)
        groups = [stream.slots[:batch], stream.slots[batch:]]
        indices = [list(range(batch)), list(range(batch, 2 * batch))]
        cids = [[kernel.bind_call(s.out, s.inputs, self.params) for s in g] for g in groups]
        state = {"current": 0, "used": [False, False], "done": None}

        def before() -> None:
            g = state["current"] = (state["current"] + 1) % 2
            if state["done"] is not None and watch is not None:
                watch_prev = 1 - g
                kernel.refresh(cids[watch_prev])
                cpu0, t0 = watch.at_done(watch_prev, groups[watch_prev])
            else:
                cpu0, t0 = 0, 0.0
            if state["used"][g]:
                self._after(g, groups[g], checker, watch)
            for i in indices[g]:
                stream.refresh(i)
            self.proc.stage(cids[g], "device")
            if watch is not None and state["done"] is not None:
                watch.idle(cpu0, t0)
            self._flush()

        def thunk() -> None:
            g = state["current"]
            self.proc.run(cids[g])
            state["used"][g] = True
            state["done"] = g

        summary = time_calls(thunk, self.policy, HostClock(), before=before)
        if state["done"] is not None:
            kernel.refresh(cids[state["done"]])
            if watch is not None:
                watch.at_done(state["done"], groups[state["done"]])
        for g in (0, 1):
            if state["used"][g]:
                self._after(g, groups[g], checker, watch, force=True)
        samples = [max(s - self.overhead_s, 0.0) / batch for s in summary.samples]
        return {**_stats(samples), "batch": batch, "calls": stream.calls}

    @staticmethod
    def _after(g: int, slots: list[Slot], checker: TimedOutputChecker | None,
               watch: Watch | None, force: bool = False) -> None:
        if watch is not None:
            watch.stable(g, slots)
        if checker is not None:
            for slot in slots:
                checker.after_call(slot, checker.checked, force=force)

    def single(self, kernel: RemoteKernel, arena: Arena) -> tuple[Slot, float, int]:
        """One call on fresh inputs, timed: (its slot, seconds, call id)."""
        stream = InputStream(self.spec, self.shape, self.dtype, arena, slots_n=1)
        slot = stream.refresh(0)
        cid = kernel.bind_call(slot.out, slot.inputs, self.params)
        self.proc.stage([cid], "device")
        self._flush()
        t0 = time.perf_counter_ns()
        self.proc.run([cid])
        seconds = max((time.perf_counter_ns() - t0) / 1e9 - self.overhead_s, 0.0)
        kernel.refresh([cid])
        return slot, seconds, cid

    def _release(self, arena: Arena) -> None:
        """This shape's buffers dropped in both processes."""
        try:
            if self.proc.dead is None:
                self.proc.unmap(list(arena.segments))
        finally:
            arena.close()

    def baseline(self, kernel: RemoteKernel) -> dict[str, Any]:
        arena = kernel.arena
        try:
            first, single_s, _ = self.single(kernel, arena)
            return self.time(kernel, None, None, arena, first, single_s)
        except WorkerFailure as exc:  # torch.compile without a working toolchain, etc.
            return {"error": exc.failure.message.splitlines()[0][:200]}
        finally:
            self._release(arena)

    def check(self, out: Any, inputs: list[Any]) -> str | None:
        if out.numel() > CHECK_MAX_ELEMENTS:
            return None
        ref = oracle(self.spec, inputs, self.params)
        failure = checks.compare(out, ref, self.spec.tolerance_for(self.dtype, inputs))
        return f"{failure.reason}: {failure.message}" if failure else None

    def candidate(self, kernel: RemoteKernel, untimed: str | None) -> dict[str, Any]:
        if untimed:  # an interpreter: verified on small shapes, far too slow at real ones
            return {"untimed": untimed}
        arena = kernel.arena
        try:
            return self._candidate(kernel, arena)
        finally:
            self._release(arena)

    def _candidate(self, kernel: RemoteKernel, arena: Arena) -> dict[str, Any]:
        # The first call at a benchmarked shape runs under the verification guards too:
        # a kernel may cheat only at sizes the verifier never used.
        first, single_s, cid = self.single(kernel, arena)
        failure = after_return(kernel, cid, first.out)
        if failure is None and not probes_intact(first):
            failure = checks.Failure(checks.MODIFIED_INPUTS, "the kernel wrote into its inputs")
        if failure:
            return {"error": f"{failure.reason}: {failure.message}", "wrong": True}
        wrong = self.check(first.out, first.inputs)
        if wrong:
            return {"error": wrong, "wrong": True}
        checker = TimedOutputChecker(self.spec, self.shape, self.dtype)
        watch = Watch(self.proc)
        result = self.time(kernel, checker, watch, arena, first, single_s)
        problem = checker.failure or watch.failure
        if problem:
            return {"error": problem, "wrong": True}
        return {**result, "checked_calls": checker.checked,
                "idle_cpu_ms": round(watch.idle_cpu_s * 1e3, 3)}


@dataclass
class BenchJob:
    op: str
    device: str
    dtype: str
    shapes: list[dict[str, int]]
    policy: dict[str, Any]
    flush_bytes: int
    cache: str = "cold"
    timeout_s: float = 900.0
    memory_bytes: int | None = None

    @classmethod
    def from_dict(cls, job: dict[str, Any]) -> BenchJob:
        return cls(job["op"], job["device"], job["dtype"], job["shapes"], job["policy"],
                   int(job["flush_bytes"]), job.get("cache", "cold"),
                   float(job.get("timeout_s", 900.0)), job.get("memory_bytes"))


def run_baselines(job: BenchJob, names: list[str]) -> dict[str, Any]:
    """The torch baselines in a trusted worker; also measures the channel's round trip."""
    spec = get_spec(job.op)
    wspec = WorkerSpec(device=job.device, confined=False, torch=True,
                       timeout_s=job.timeout_s, memory_bytes=job.memory_bytes)
    try:
        with worker(wspec) as proc:
            overhead = measure_overhead(proc)
            kids = {name: proc.load(job.op, baseline=name) for name in names}
            rows = []
            for shape in job.shapes:
                sb = _shape_bench(spec, shape, job, proc, overhead)
                rows.append({"shape": shape, "results": {
                    name: sb.baseline(RemoteKernel(proc, kid, spec, Arena()))
                    for name, kid in kids.items()}})
    except WorkerFailure as exc:
        return {"ok": False, "failure": exc.failure.to_dict()}
    return {"ok": True, "rows": rows, "overhead_s": overhead}


def run_candidates(job: BenchJob, impls: list[Implementation],
                   overhead_s: float) -> dict[str, Any]:
    """Kernels in one confined worker (the caller gives each external kernel its own)."""
    from strata.kernels.dialects import get_dialect
    from strata.kernels.judge import worker_spec

    spec = get_spec(job.op)
    python = any(i.dialect == "triton" for i in impls)
    wspec = worker_spec(impls[0], job.device, job.timeout_s, job.memory_bytes)
    wspec.python_kernels = python
    wspec.torch = python or job.device != "cpu"
    try:
        with worker(wspec) as proc:
            arena = Arena()
            kernels: dict[str, RemoteKernel] = {}
            errors: dict[str, str] = {}
            for impl in impls:
                try:
                    kernels[impl.name] = RemoteKernel.load(proc, impl, spec, arena)
                except WorkerFailure as exc:
                    errors[impl.name] = f"{exc.failure.reason}: {exc.failure.message[:300]}"
            rows = []
            for shape in job.shapes:
                sb = _shape_bench(spec, shape, job, proc, overhead_s)
                row: dict[str, Any] = {"shape": shape, "results": {}}
                for impl in impls:
                    if impl.name in errors:
                        row["results"][impl.name] = {"error": errors[impl.name]}
                        continue
                    untimed = get_dialect(impl.dialect).untimed_reason(job.device)
                    row["results"][impl.name] = sb.candidate(kernels[impl.name], untimed)
                rows.append(row)
    except WorkerFailure as exc:
        return {"ok": False, "failure": exc.failure.to_dict()}
    return {"ok": True, "rows": rows}


def _shape_bench(spec: KernelSpec, shape: dict[str, int], job: BenchJob,
                 proc: KernelProcess, overhead_s: float) -> ShapeBench:
    return ShapeBench(spec, shape, job.dtype, proc, TimingPolicy(**job.policy), job.cache,
                      job.flush_bytes or _default_flush(job.device), overhead_s)


def _default_flush(device: str) -> int:
    return 64 << 20
