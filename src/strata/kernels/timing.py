"""Worker side of `strata kernels bench`: one timing path for every dialect and baseline.

Per shape: the same input stream for all contenders (fresh inputs every call, mixed from
sets seeded by the job, so baselines in their own process see the same distribution), the
cache flushed before every timed call (buffer >= 2x the probed last-level cache, or GPU L2),
warm-up by time, median and IQR from `strata.measure` (docs/architecture.md §5, §8). A contender
is checked against the float64 reference at each benchmarked shape and its timed calls' outputs are
checked after they return: a fast wrong answer is reported as wrong, not as fast.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from strata.hardware.vendors import runtime_for, torch_device
from strata.kernels import checks
from strata.kernels.buffers import InputStream, TimedOutputChecker, rotating_thunk
from strata.kernels.impl import Implementation
from strata.kernels.spec import KernelSpec, get_spec
from strata.measure.stats import percentile
from strata.measure.timer import TimingPolicy, time_calls

BASELINES = ("torch.eager", "torch.compile")
CHECK_MAX_ELEMENTS = 1 << 26  # skip the float64 re-check where the oracle itself gets slow


def flusher(device: str, nbytes: int) -> Callable[[], None]:
    """Touch a buffer larger than the cache so every timed call starts cold.

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
    return runtime_for(device).make_clock(device)


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median_s": percentile(ordered, 50), "p25_s": percentile(ordered, 25),
            "p75_s": percentile(ordered, 75), "min_s": ordered[0], "n": len(ordered)}


def _time(thunk: Callable[[], object], policy: TimingPolicy, device: str,
          before: Callable[[], None]) -> dict[str, float]:
    return _stats(time_calls(thunk, policy, clock_for(device), before=before).samples)


def _baseline_fn(name: str, spec: KernelSpec, inputs: list[Any], params: dict[str, Any]) -> \
        Callable[..., object]:
    fn = functools.partial(spec.vendor(), **params)
    if name == "torch.compile":
        import torch

        fn = torch.compile(fn, dynamic=False)
        fn(*inputs)  # compile outside the timed region; raises where compile does not work
    return fn


class ShapeBench:
    """One shape: every contender timed on a stream of fresh inputs (docs/architecture.md §8:
    timed calls never see the same inputs twice), the cache flushed before each call."""

    def __init__(self, spec: KernelSpec, shape: dict[str, int], dtype: str, device: str,
                 policy: TimingPolicy, flush: Callable[[], None],
                 timers: dict[str, Any], seed: int = 0) -> None:
        self.spec, self.shape, self.dtype, self.device = spec, shape, dtype, device
        self.policy, self.flush, self.seed = policy, flush, seed
        self.params = spec.params_for(shape)
        self.timers = timers

    def _stream(self) -> InputStream:
        return InputStream(self.spec, self.shape, self.dtype, self.device,
                           base_seed=1000 * (self.seed + 1))

    def baseline(self, name: str) -> dict[str, Any]:
        stream = self._stream()
        try:
            fn = _baseline_fn(name, self.spec, stream.slot(0).inputs, self.params)
        except Exception as exc:  # torch.compile without a working toolchain, etc.
            return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        thunk, before, _ = rotating_thunk(stream, lambda sl: functools.partial(fn, *sl.inputs),
                                          None, self.flush)
        return _time(thunk, self.policy, self.device, before)

    def check(self, out: Any, inputs: list[Any]) -> str | None:
        from strata.kernels.worker import oracle

        if out.numel() > CHECK_MAX_ELEMENTS:
            return None
        ref = oracle(self.spec, inputs, self.params)
        failure = checks.compare(out, ref, self.spec.tolerance(self.dtype))
        return f"{failure.reason}: {failure.message}" if failure else None

    def candidate(self, kernel: Any, untimed: str | None) -> dict[str, Any]:
        from strata.kernels.worker import guarded_call

        if untimed:  # an interpreter: verified on small shapes, far too slow at real ones
            return {"untimed": untimed}
        stream = self._stream()
        first = stream.refresh()
        # The first call at a benchmarked shape runs under the verification guards too:
        # a kernel may cheat only at sizes the verifier never used.
        failure = guarded_call(kernel.bind(first.out, first.inputs, self.params), first.out,
                               self.device, self.timers, watch=True)
        if failure:
            return {"error": f"{failure.reason}: {failure.message}", "wrong": True}
        wrong = self.check(first.out, first.inputs)
        if wrong:
            return {"error": wrong, "wrong": True}
        checker = TimedOutputChecker(self.spec, self.shape, self.dtype)
        thunk, before, finish = rotating_thunk(
            stream, lambda sl: kernel.bind(sl.out, sl.inputs, self.params), checker,
            self.flush)
        result = _time(thunk, self.policy, self.device, before)
        finish()
        if checker.failure:
            return {"error": checker.failure, "wrong": True}
        return {**result, "checked_calls": checker.checked, "calls": stream.calls}


def run_bench(job: dict[str, Any]) -> dict[str, Any]:
    """A "baselines" job (trusted: torch only) or a "candidates" job (kernels, confined).
    They run in separate processes: a kernel can neither observe nor slow the baseline."""
    from strata.kernels.dialects import get_dialect
    from strata.kernels.guards import timer_identities
    from strata.kernels.worker import load_kernel

    timers = timer_identities()  # before any kernel code is imported
    spec = get_spec(job["op"])
    # The job names strata's device ("rocm:0"); torch knows it as "cuda:0".
    device, dtype = torch_device(job["device"]), job["dtype"]
    policy = TimingPolicy(**job["policy"])
    # warm: no flush, calls back to back as in a decode loop (caches, thread pools hot)
    flush = flusher(device, int(job["flush_bytes"])) if job.get("cache", "cold") == "cold" \
        else (lambda: None)
    impls = [Implementation.from_job(j) for j in job.get("impls", [])]
    kernels: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for impl in impls:
        try:
            kernels[impl.name] = load_kernel(impl, spec, device)
        except Exception as exc:
            errors[impl.name] = f"{checks.BUILD_FAILED}: {str(exc)[:300]}"
    rows = []
    for shape in job["shapes"]:
        sb = ShapeBench(spec, shape, dtype, device, policy, flush, timers,
                        int(job.get("seed", 0)))
        row: dict[str, Any] = {"shape": shape, "results": {}}
        for name in job.get("baselines", []):
            row["results"][name] = sb.baseline(name)
        for impl in impls:
            if impl.name in errors:
                row["results"][impl.name] = {"error": errors[impl.name]}
                continue
            untimed = get_dialect(impl.dialect).untimed_reason(device)
            row["results"][impl.name] = sb.candidate(kernels[impl.name], untimed)
        rows.append(row)
    return {"ok": True, "rows": rows}
