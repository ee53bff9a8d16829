"""The judge: every check of docs/architecture.md §8, run in this (trusted) process on
buffers it shares with the kernel's worker (kernels/process.py). The worker only executes
calls; inputs, canaries, outputs, references and the verdict never leave this process, so
a kernel that takes over its own process (rebinding Python functions, writing to stdout,
exiting early) changes nothing the judge reads.
"""

from __future__ import annotations

import math
import time
from typing import Any

from strata.kernels import buffers, checks
from strata.kernels.checks import Failure
from strata.kernels.impl import Implementation
from strata.kernels.process import (
    KernelProcess,
    RemoteKernel,
    WorkerFailure,
    WorkerSpec,
    kept_busy,
)
from strata.kernels.shm import Arena
from strata.kernels.spec import KernelSpec, get_spec

OPENMP_DIALECTS = ("c",)


def oracle(spec: KernelSpec, inputs: list[Any], params: dict[str, Any]) -> Any:
    """The reference in float64 on the CPU, from the very same (dtype-rounded) inputs."""
    import torch

    wide = [t.detach().to("cpu", torch.float64) if t.is_floating_point() else t.cpu()
            for t in inputs]
    return spec.reference(*wide, **params)


def nan_out(spec: KernelSpec, shape: dict[str, int], dtype: str, arena: Arena) -> Any:
    import torch

    out = arena.empty(spec.out_shape(shape), getattr(torch, spec.out_dtype or dtype))
    return out.fill_(float("nan"))


def worker_spec(impl: Implementation, device: str, timeout_s: float,
                memory_bytes: int | None) -> WorkerSpec:
    """A confined worker for an implementation: torch only where the kernel needs it."""
    python = impl.dialect == "triton"
    return WorkerSpec(device=device, confined=True, torch=python or device != "cpu",
                      python_kernels=python, timeout_s=timeout_s, memory_bytes=memory_bytes)


def after_return(kernel: RemoteKernel, cid: int, out: Any) -> Failure | None:
    """Nothing may change after "done": the output a moment later equals the output at
    "done", and the worker burns no CPU while it waits for the next request."""
    from strata.kernels.checks import same_values

    snapshot = out.clone()
    # work that ends within the watch changes the output; work that does not keeps the
    # worker busy throughout it
    idle = kept_busy(kernel.proc)
    kernel.refresh([cid])
    if not same_values(out, snapshot):
        return Failure(checks.ASYNC_WRITE, "the output changed after the call returned: work "
                       "continued in the background (the timer would miss it)")
    if idle.busy:
        return Failure(checks.LEFT_THREAD, f"the kernel's process kept computing after the call "
                       f"returned ({idle.cpu_s * 1e3:.1f} ms of CPU in {idle.window_s * 1e3:.0f} "
                       f"ms watched while it had nothing to do, busy in each of "
                       f"{idle.windows} windows 50 ms apart)")
    return None


class Threads:
    """Thread counts of verification calls, set in the worker (OpenMP: C kernels)."""

    def __init__(self, dialect: str, kernel: RemoteKernel) -> None:
        from strata.kernels.threads import ThreadControl

        control = ThreadControl.for_dialect(dialect) if dialect in OPENMP_DIALECTS else None
        self.active = bool(control and control.active)
        self.default = control.default if control and control.active else 1
        self.kernel = kernel

    def oversubscribed(self) -> int | None:
        import os

        return 2 * max(self.default, os.cpu_count() or 1) + 1 if self.active else None

    def limit(self, n: int | None) -> Any:
        kernel, active = self.kernel, self.active

        class _Limit:
            def __enter__(self) -> None:
                kernel.threads = n if active else None

            def __exit__(self, *exc: object) -> None:
                kernel.threads = None

        return _Limit()


class Verifier:
    """Every check over dtypes x shapes x seeds (and the op's clauses); stops at the first
    failure. Each case calls the candidate three times on guarded buffers (canaries around
    every input and the output): with the output pre-filled with NaN on the default thread
    count, then with two of {zeros, random values, another input's correct answer} on one
    thread and on an oversubscribed thread count. Every call must be right."""

    def __init__(self, impl: Implementation, spec: KernelSpec, proc: KernelProcess) -> None:
        self.impl, self.spec, self.proc = impl, spec, proc
        self.arena = Arena()
        self.kernel = RemoteKernel.load(proc, impl, spec, self.arena,
                                        record=impl.dialect == "triton")
        self.threads = Threads(impl.dialect, self.kernel)
        self.cases = 0
        self.max_err = 0.0

    def call(self, out: Any, inputs: list[Any], params: dict[str, Any],
             watch: bool = False) -> Failure | None:
        """One candidate call; `watch` also checks that nothing changes after it."""
        thunk = self.kernel.bind(out, inputs, params)
        thunk()
        return after_return(self.kernel, thunk.cid, out) if watch else None  # type: ignore

    def _calls(self, case: int) -> list[tuple[str, int | None]]:
        """(output prefill, thread count) of the three calls of case number `case`."""
        others = buffers.PREFILLS[1:]
        return [("nan", None), (others[case % 3], 1),
                (others[(case + 1) % 3], self.threads.oversubscribed())]

    def _inputs(self, shape: dict[str, int], dtype: str, seed: int,
                clause: Any = None) -> list[Any]:
        raw = self.spec.make_inputs(shape, dtype, seed, "cpu")
        if clause is not None:
            clause.apply(raw, shape, seed)
            if self.spec.derive is not None:
                self.spec.derive(raw, **self.spec.params_for(shape))
        return raw

    def case(self, shape: dict[str, int], dtype: str, seed: int,
             previous: dict[str, Any], clause: Any = None) -> Failure | None:
        spec = self.spec
        raw = self._inputs(shape, dtype, seed, clause)
        guarded = {name: buffers.guarded_copy(t, self.arena)
                   for name, t in zip(spec.inputs, raw, strict=True)}
        inputs = [g.view for g in guarded.values()]
        params = spec.params_for(shape)
        key = f"{dtype}:{sorted(shape.items())}"
        earlier = previous.get(key)
        ref: Any = None
        outs: list[tuple[str, int | None, Any]] = []
        for i, (fill, nthreads) in enumerate(self._calls(self.cases)):
            out = buffers.guarded_copy(nan_out(spec, shape, dtype, self.arena), self.arena)
            buffers.prefill(out.view, fill, earlier[1] if earlier else None)
            with self.threads.limit(nthreads):
                # watched once per shape: work after return depends on the size, not values
                watch = i == 0 and not earlier
                failure = self.call(out.view, inputs, params, watch=watch) or \
                    buffers.check_canaries({**guarded, "the output": out})
            if failure:
                return failure
            if ref is None:
                ref = oracle(spec, raw, params)
            outs.append((fill, nthreads, out.view))
        first = outs[0][2]
        tol = spec.tolerance_for(dtype, raw)

        def right_again(fill: str, nthreads: int | None) -> bool:
            """One more call in the given conditions: a cause is named only when the
            kernel is right again where it was right before."""
            out = nan_out(spec, shape, dtype, self.arena)
            buffers.prefill(out, fill, earlier[1] if earlier else None)
            with self.threads.limit(nthreads):
                self.kernel.bind(out, inputs, params)()
            return checks.compare(out, ref, tol) is None

        failure = (checks.unchanged_inputs(raw, inputs, spec.inputs)
                   or self._stale(first, ref, earlier)
                   or checks.constant_output(first, ref)
                   or self._judge_calls(outs, ref, tol, right_again))
        if failure is not None and clause is not None:
            failure.message = f"clause {clause.name} ({clause.text}): {failure.message}"
        previous[key] = (first.detach().clone(), ref)
        self._track_error(first, ref)
        return failure

    def _judge_calls(self, outs: list[tuple[str, int | None, Any]], ref: Any,
                     tol: Any, right_again: Any) -> Failure | None:
        """Each call against the reference, named by what differed between the calls."""
        results = [(fill, n, checks.compare(out, ref, tol)) for fill, n, out in outs]
        bad = [(fill, n, f) for fill, n, f in results if f is not None]
        if not bad:
            return checks.runs_agree(outs[0][2], outs[1][2], tol, ref) or \
                checks.runs_agree(outs[0][2], outs[2][2], tol, ref)
        fill, nthreads, failure = bad[0]
        single_ok = any(n == 1 and f is None for _, n, f in results)
        # A race computes wrong values; an unwritten (still NaN) output is skipped work.
        if single_ok and nthreads != 1 and self.threads.active and \
                failure.reason == checks.WRONG_RESULT and right_again("nan", 1):
            team = nthreads or "the default number of"
            return Failure(checks.DATA_RACE, f"right on 1 thread, wrong on {team} threads: "
                           f"{failure.message}", failure.details)
        if fill != "nan" and results[0][2] is None and right_again("nan", nthreads):
            return Failure(checks.READS_OUTPUT, f"right when the output held NaN, wrong when "
                           f"it held {fill.replace('_', ' ')}: the kernel depends on what "
                           f"the output buffer held before the call ({failure.message})",
                           failure.details)
        return failure

    @staticmethod
    def _stale(out: Any, ref: Any, earlier: tuple[Any, Any] | None) -> Failure | None:
        """Same output as for other inputs (whose reference differed): a cached result."""
        if earlier is None:
            return None
        old_out, old_ref = earlier
        if checks.same_values(out.detach(), old_out) and not checks.same_values(ref, old_ref):
            return Failure(checks.INPUT_INDEPENDENT, "the output for new inputs equals the "
                           "output of an earlier call: it does not depend on the inputs")
        return None

    def _track_error(self, out: Any, ref: Any) -> None:
        import torch

        got, want = out.detach().to("cpu", torch.float64), ref.to(torch.float64)
        finite = torch.isfinite(want) & torch.isfinite(got)
        if bool(finite.any()):
            rel = ((got - want).abs() / want.abs().clamp_min(1e-6))[finite]
            self.max_err = max(self.max_err, float(rel.max()))

    def _release(self) -> None:
        """Drop this case's buffers in both processes (segments are per allocation)."""
        segs = list(self.arena.segments)
        try:
            if self.proc.dead is None:
                self.proc.unmap(segs)
        finally:
            self.arena.close()

    def cases_to_run(self, shapes: list[dict[str, int]], dtypes: list[str],
                     seeds: list[int], serve: list[dict[str, int]] | None = None) -> \
            list[tuple[str, dict[str, int], int, Any]]:
        todo = [(dt, sh, seed, None) for dt in dtypes for sh in shapes for seed in seeds]
        todo += [(dt, sh, seeds[0], None) for dt in dtypes for sh in serve or []]
        for dt in dtypes:
            for clause, shape, seed in clause_cases(self.spec):
                todo.append((dt, shape, seed, clause))
        return todo

    def run(self, shapes: list[dict[str, int]], dtypes: list[str], seeds: list[int],
            serve: list[dict[str, int]] | None = None) -> dict[str, Any]:
        previous: dict[str, Any] = {}
        for dtype, shape, seed, clause in self.cases_to_run(shapes, dtypes, seeds, serve):
            try:
                failure = self.case(shape, dtype, seed, previous, clause)
            finally:
                self._release()
            self.cases += 1
            if failure:
                where = f"dtype {dtype}, shape {shape}, seed {seed}"
                if clause is not None:
                    where += f", clause {clause.name}"
                return {"ok": False, "failure": failure.to_dict(), "where": where,
                        "cases": self.cases}
        return {"ok": True, "cases": self.cases, "max_rel_err": self.max_err}


def clause_cases(spec: KernelSpec) -> list[tuple[Any, dict[str, int], int]]:
    """(clause, shape, seed) for every clause the op's spec lists (none before clauses)."""
    cases = getattr(spec, "clause_cases", None)
    return list(cases()) if callable(cases) else []


def run_verify(job: dict[str, Any]) -> dict[str, Any]:
    """A verification job, judged here; the kernel runs in a confined worker."""
    started = time.perf_counter()
    impl = Implementation.from_job(job["impl"])
    spec = get_spec(impl.op)
    shapes = job.get("shapes") or spec.shapes["verify"]
    # Multi-element shapes first: a constant output is only recognisable there, so a kernel
    # that writes zeros is named for that rather than for a 1x1 mismatch.
    shapes = sorted(shapes, key=lambda sh: math.prod(spec.out_shape(sh)) < 2)
    proc = KernelProcess(worker_spec(impl, job["device"], float(job["timeout_s"]),
                                     job.get("memory_bytes")))
    verifier: Verifier | None = None
    try:
        proc.start()
        verifier = Verifier(impl, spec, proc)
        result = verifier.run(shapes, job["dtypes"], job["seeds"], job.get("serve"))
    except WorkerFailure as exc:
        result = {"ok": False, "failure": exc.failure.to_dict(),
                  "cases": verifier.cases if verifier else 0}
    finally:
        proc.close()
    result["seconds"] = time.perf_counter() - started
    result["shapes"] = [*shapes, *(job.get("serve") or []),
                        *(sh for _, sh, _ in clause_cases(spec))]
    if proc.sandbox is not None:
        result["sandbox"] = proc.sandbox
    return result
