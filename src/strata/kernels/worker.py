"""Sandboxed side of the kernel lab: `python -m strata.kernels.worker JOBFILE`.

The parent (verify.py / bench.py) writes a job file, starts this worker with a timeout and
resource limits, and reads the one JSON line it prints after the marker. The job file is
deleted before any kernel code is loaded, so the kernel cannot read the result marker.
Built-in and untrusted implementations take the same path.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from strata.hardware.vendors import runtime_for, torch_device
from strata.kernels import buffers, checks, confine, guards, threads
from strata.kernels.checks import Failure
from strata.kernels.impl import Implementation
from strata.kernels.spec import KernelSpec, get_spec

_CLOCK = time.perf_counter  # captured at import: a kernel that patches time cannot skew it


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def _sync(device: str) -> None:
    """Wait for `device` (a torch device string) the way its vendor's runtime says."""
    runtime_for(device).sync(device)


def nan_out(spec: KernelSpec, shape: dict[str, int], dtype: str, device: str) -> Any:
    import torch

    out_dtype = _torch_dtype(spec.out_dtype or dtype)
    return torch.full(spec.out_shape(shape), float("nan"), dtype=out_dtype, device=device)


def oracle(spec: KernelSpec, inputs: list[Any], params: dict[str, Any]) -> Any:
    """The reference in float64 on the CPU, from the very same (dtype-rounded) inputs."""
    import torch

    wide = [t.detach().to("cpu", torch.float64) if t.is_floating_point() else t.cpu()
            for t in inputs]
    return spec.reference(*wide, **params)


def guarded_call(thunk: Any, out: Any, device: str, timers: dict[str, Any],
                 watch: bool) -> Failure | None:
    """Run a bound kernel under the runtime guards (torch ops recorded, timer identity,
    and with `watch`, no write or thread left behind after return)."""
    threads = threading.active_count()
    recorder = guards.OpRecorder()
    with recorder:
        thunk()
    _sync(device)
    failure = guards.check_timer(timers) or guards.check_torch_ops(recorder)
    if failure is None and watch:
        failure = guards.check_after_return(out, out.clone(), threads)
    return failure


def load_kernel(impl: Implementation, spec: KernelSpec, device: str) -> Any:
    """Load a kernel; from here on the audit guard watches (untrusted jobs)."""
    from strata.kernels.dialects import get_dialect

    if AUDIT is None:
        return get_dialect(impl.dialect).load(impl, spec, device)
    AUDIT.arm()
    if impl.dialect != "triton":
        return get_dialect(impl.dialect).load(impl, spec, device)
    AUDIT.python_kernel = True  # the module's top level is kernel code
    try:
        return _Watched(get_dialect(impl.dialect).load(impl, spec, device), AUDIT)
    finally:
        AUDIT.python_kernel = False


class _Watched:
    """A Python kernel whose calls run with the audit guard's native-code rule on."""

    def __init__(self, kernel: Any, audit: confine.AuditGuard) -> None:
        self.kernel, self.audit = kernel, audit

    def bind(self, out: Any, inputs: list[Any], params: dict[str, Any]) -> Any:
        audit = self.audit
        audit.python_kernel = True
        try:
            inner = self.kernel.bind(out, inputs, params)
        finally:
            audit.python_kernel = False

        def call() -> None:
            audit.python_kernel = True
            try:
                inner()
            finally:
                audit.python_kernel = False

        return call


class Verifier:
    """Runs every check of docs/architecture.md §8 over dtypes x shapes x seeds; stops at the
    first failure.

    Each case calls the candidate three times on guarded buffers (canaries around every
    input and the output): with the output pre-filled with NaN on the default thread count,
    then with two of {zeros, random values, another input's correct answer} on one thread
    and on an oversubscribed thread count. Every call must be right.
    """

    def __init__(self, impl: Implementation, spec: KernelSpec, device: str,
                 timers: dict[str, Any]) -> None:
        self.impl, self.spec, self.device, self.timers = impl, spec, device, timers
        self.kernel = load_kernel(impl, spec, device)
        self.threads = threads.ThreadControl.for_dialect(impl.dialect)
        self.cases = 0
        self.max_err = 0.0

    def call(self, out: Any, inputs: list[Any], params: dict[str, Any],
             watch: bool = False) -> Failure | None:
        """One guarded candidate call; `watch` also waits to see nothing changes after it."""
        return guarded_call(self.kernel.bind(out, inputs, params), out, self.device,
                            self.timers, watch)

    def _calls(self, case: int) -> list[tuple[str, int | None]]:
        """(output prefill, thread count) of the three calls of case number `case`."""
        others = buffers.PREFILLS[1:]
        return [("nan", None), (others[case % 3], 1),
                (others[(case + 1) % 3], self.threads.oversubscribed())]

    def case(self, shape: dict[str, int], dtype: str, seed: int,
             previous: dict[str, Any]) -> Failure | None:
        spec = self.spec
        raw = spec.make_inputs(shape, dtype, seed, self.device)
        guarded = {name: buffers.guarded_copy(t) for name, t in zip(spec.inputs, raw,
                                                                      strict=True)}
        inputs = [g.view for g in guarded.values()]
        params = spec.params_for(shape)
        key = f"{dtype}:{sorted(shape.items())}"
        earlier = previous.get(key)
        ref: Any = None
        outs: list[tuple[str, int | None, Any]] = []
        for i, (fill, nthreads) in enumerate(self._calls(self.cases)):
            out = buffers.guarded_copy(nan_out(spec, shape, dtype, self.device))
            buffers.prefill(out.view, fill, earlier[1] if earlier else None)
            with self.threads.limit(nthreads):
                failure = self.call(out.view, inputs, params, watch=i == 0) or \
                    buffers.check_canaries({**guarded, "the output": out})
            if failure:
                return failure
            if ref is None:
                ref = oracle(spec, inputs, params)
            outs.append((fill, nthreads, out.view))
        first = outs[0][2]

        def right_again(fill: str, nthreads: int | None) -> bool:
            """One more call in the given conditions: a cause is named only when the
            kernel is right again where it was right before (a kernel that simply went
            wrong after some calls is wrong either way)."""
            out = nan_out(spec, shape, dtype, self.device)
            buffers.prefill(out, fill, earlier[1] if earlier else None)
            with self.threads.limit(nthreads):
                self.kernel.bind(out, inputs, params)()
            return checks.compare(out, ref, spec.tolerance(dtype)) is None

        failure = (checks.unchanged_inputs(raw, inputs, spec.inputs)
                   or self._stale(first, ref, earlier)
                   or checks.constant_output(first, ref)
                   or self._judge_calls(outs, ref, spec.tolerance(dtype), right_again))
        previous[key] = (first.detach().cpu(), ref)
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
        if checks.same_values(out.detach().cpu(), old_out) and \
                not checks.same_values(ref, old_ref):
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

    def run(self, shapes: list[dict[str, int]], dtypes: list[str], seeds: list[int]) -> \
            dict[str, Any]:
        previous: dict[str, Any] = {}
        for dtype in dtypes:
            for shape in shapes:
                for seed in seeds:
                    failure = self.case(shape, dtype, seed, previous)
                    self.cases += 1
                    if failure:
                        where = f"dtype {dtype}, shape {shape}, seed {seed}"
                        return {"ok": False, "failure": failure.to_dict(), "where": where,
                                "cases": self.cases}
        return {"ok": True, "cases": self.cases, "max_rel_err": self.max_err}


def run_verify(job: dict[str, Any]) -> dict[str, Any]:
    timers = guards.timer_identities()  # before any kernel code is imported
    impl = Implementation.from_job(job["impl"])
    spec = get_spec(impl.op)
    try:
        # The job names strata's device ("rocm:0"); torch knows it as "cuda:0".
        verifier = Verifier(impl, spec, torch_device(job["device"]), timers)
    except Exception as exc:  # a kernel that does not build or load
        return {"ok": False, "failure": Failure(checks.BUILD_FAILED, _one_line(exc)).to_dict(),
                "cases": 0}
    shapes = job.get("shapes") or spec.shapes["verify"]
    # Multi-element shapes first: a constant output is only recognisable there, so a kernel
    # that writes zeros is named for that rather than for a 1x1 mismatch.
    shapes = sorted(shapes, key=lambda sh: math.prod(spec.out_shape(sh)) < 2)
    return verifier.run(shapes, job["dtypes"], job["seeds"])


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) < 1500 else text[:1500] + "…"


# The audit guard of this worker (None for trusted jobs); armed before kernel code loads.
AUDIT: confine.AuditGuard | None = None


def _confine(job: dict[str, Any]) -> dict[str, Any] | None:
    """Confine this process before anything of the kernel's is loaded (untrusted jobs)."""
    global AUDIT
    if "confine" not in job:
        return None
    plan = confine.Plan.from_job(job["confine"])
    applied = confine.confine(plan)
    python_kernels = any(i.get("dialect") == "triton" for i in _job_impls(job))
    AUDIT = confine.AuditGuard(plan.scratch, allow_spawn=plan.gpu,
                               refuse_native=python_kernels and not plan.gpu).install()
    return applied.to_dict()


def _job_impls(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [job["impl"]] if "impl" in job else list(job.get("impls", []))


def _prepare_harness(job: dict[str, Any]) -> None:
    """Import what the harness needs before the audit guard is armed (imports of torch and
    triton open files and probe libraries; none of that is the kernel's doing)."""
    import torch  # noqa: F401

    if any(i.get("dialect") == "triton" for i in _job_impls(job)):
        try:
            import triton
            import triton.language  # noqa: F401
        except ImportError:
            pass


def _violations(result: dict[str, Any]) -> dict[str, Any]:
    """A recorded escape attempt fails the job, whatever the kernel did with the error."""
    if AUDIT is None or not AUDIT.violations:
        return result
    failure = Failure(checks.SANDBOX_VIOLATION, f"the kernel tried to {AUDIT.violations[0]}; "
                      "kernels may not touch files, processes or the network",
                      AUDIT.violations[:checks.MAX_SHOWN])
    return {**result, "ok": False, "failure": failure.to_dict()}


def main(argv: list[str] | None = None) -> int:
    from strata.kernels.timing import run_bench

    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0])
    job = json.loads(path.read_text("utf-8"))
    path.unlink(missing_ok=True)  # the marker is not readable by the kernel from here on
    marker = job.pop("marker")
    sandbox = _confine(job)
    runners = {"verify": run_verify, "bench": run_bench}
    started = _CLOCK()
    try:
        _prepare_harness(job)
        result = runners[job["mode"]](job)
    except Exception as exc:
        result = {"ok": False, "failure": Failure(checks.CRASHED, _one_line(exc),
                                                  traceback.format_exc().splitlines()[-5:])
                  .to_dict()}
    result = _violations(result)
    result["seconds"] = _CLOCK() - started
    if sandbox is not None:
        result["sandbox"] = sandbox
    sys.stdout.write(f"\n{marker} {json.dumps(result)}\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    # `python -m` runs this file as __main__, a second copy of the module: run the one that
    # timing.py and the dialects import, so there is one AUDIT guard, armed wherever a
    # kernel is loaded (verification and benchmark alike).
    from strata.kernels import worker

    raise SystemExit(worker.main())
