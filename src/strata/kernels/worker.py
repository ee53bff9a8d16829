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

from strata.kernels import checks, guards
from strata.kernels.checks import Failure
from strata.kernels.impl import Implementation
from strata.kernels.spec import KernelSpec, get_spec

_CLOCK = time.perf_counter  # captured at import: a kernel that patches time cannot skew it


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


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
    from strata.kernels.dialects import get_dialect

    return get_dialect(impl.dialect).load(impl, spec, device)


class Verifier:
    """Runs every check of DESIGN §4 over dtypes x shapes x seeds; stops at the first failure."""

    def __init__(self, impl: Implementation, spec: KernelSpec, device: str,
                 timers: dict[str, Any]) -> None:
        self.impl, self.spec, self.device, self.timers = impl, spec, device, timers
        self.kernel = load_kernel(impl, spec, device)
        self.cases = 0
        self.max_err = 0.0

    def call(self, out: Any, inputs: list[Any], params: dict[str, Any],
             watch: bool = False) -> Failure | None:
        """One guarded candidate call; `watch` also waits to see nothing changes after it."""
        return guarded_call(self.kernel.bind(out, inputs, params), out, self.device,
                            self.timers, watch)

    def case(self, shape: dict[str, int], dtype: str, seed: int,
             previous: dict[str, Any]) -> Failure | None:
        spec = self.spec
        inputs = spec.make_inputs(shape, dtype, seed, self.device)
        before = [t.clone() for t in inputs]
        params = spec.params_for(shape)
        first = nan_out(spec, shape, dtype, self.device)
        failure = self.call(first, inputs, params, watch=True)
        if failure:
            return failure
        ref = oracle(spec, inputs, params)
        second = nan_out(spec, shape, dtype, self.device)
        failure = self.call(second, inputs, params)
        if failure:
            return failure
        tol = spec.tolerance(dtype)
        key = f"{dtype}:{sorted(shape.items())}"
        failure = (checks.unchanged_inputs(before, inputs, spec.inputs)
                   or self._stale(first, ref, previous.get(key))
                   or checks.constant_output(first, ref)
                   or checks.compare(first, ref, tol)
                   or checks.runs_agree(first, second, tol, ref))
        previous[key] = (first.detach().cpu(), ref)
        self._track_error(first, ref)
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
        verifier = Verifier(impl, spec, job["device"], timers)
    except Exception as exc:  # a kernel that does not build or load
        return {"ok": False, "failure": Failure(checks.BUILD_FAILED, _one_line(exc)).to_dict(),
                "cases": 0}
    shapes = job.get("shapes") or spec.shapes["verify"]
    # Multi-element shapes first: a constant output is only recognisable there, so a kernel
    # that writes zeros is named for that rather than for a 1x1 mismatch.
    shapes = sorted(shapes, key=lambda sh: math.prod(spec.out_shape(sh)) < 2)
    return verifier.run(shapes, job["dtypes"], job["seeds"])


def run_compile(job: dict[str, Any]) -> dict[str, Any]:
    from strata.kernels.dialects.cuda import compile_cuda

    impl = Implementation.from_job(job["impl"])
    try:
        lib = compile_cuda(impl)
        getattr(lib, impl.entry)
    except Exception as exc:
        return {"ok": False, "failure": Failure(checks.BUILD_FAILED, _one_line(exc)).to_dict()}
    return {"ok": True}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) < 1500 else text[:1500] + "…"


def main(argv: list[str] | None = None) -> int:
    from strata.kernels.timing import run_bench

    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0])
    job = json.loads(path.read_text("utf-8"))
    path.unlink(missing_ok=True)  # the marker is not readable by the kernel from here on
    marker = job.pop("marker")
    runners = {"verify": run_verify, "bench": run_bench, "compile": run_compile}
    started = _CLOCK()
    try:
        result = runners[job["mode"]](job)
    except Exception as exc:
        result = {"ok": False, "failure": Failure(checks.CRASHED, _one_line(exc),
                                                  traceback.format_exc().splitlines()[-5:])
                  .to_dict()}
    result["seconds"] = _CLOCK() - started
    sys.stdout.write(f"\n{marker} {json.dumps(result)}\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
