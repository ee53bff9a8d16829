"""`strata kernels bench`: verified implementations and the torch baselines timed side by
side in the sandbox, figures against this host's roofline, rows stored in the DB."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from strata.bench.explain import COMPUTE_DTYPE
from strata.hardware.telemetry import HostLoad, HostLoadMonitor
from strata.kernels import plausibility
from strata.kernels.capability import HostCaps
from strata.kernels.dialects import get_dialect
from strata.kernels.dialects.base import prepared
from strata.kernels.impl import Implementation
from strata.kernels.registry import COMPILE, EAGER, baselines
from strata.kernels.sandbox import SandboxPolicy
from strata.kernels.spec import KernelSpec, get_spec
from strata.kernels.verify import VerifyContext, verify_many
from strata.measure.peakguard import BANDWIDTH, PeakKeeper
from strata.measure.roofline import Roofline
from strata.store.kernels import KernelResult, save_kernel_results

WRONG_AT_SHAPE = "wrong at this shape"  # dispatch rejects a kernel carrying this flag
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
MIN_FLUSH_BYTES = 8 << 20
CACHE_MODES = ("cold", "warm")


@dataclass
class BenchSettings:
    shapes: str = "llm"
    dtype: str = "float32"
    compile: bool = True
    # cold: flush before every call (docs/architecture.md §8); warm: back to back
    cache: str = "cold"
    warmup_s: float = 0.05
    max_time_s: float = 0.5
    min_reps: int = 3
    max_reps: int = 200

    def policy(self) -> dict[str, Any]:
        return {"warmup_s": self.warmup_s, "min_reps": self.min_reps,
                "max_reps": self.max_reps, "max_time_s": self.max_time_s}


@dataclass
class Figure:
    """One contender at one shape."""

    op: str
    impl: str
    shape: dict[str, int]
    device: str
    dtype: str
    median_s: float | None = None
    p25_s: float | None = None
    p75_s: float | None = None
    n: int = 0
    gbs: float | None = None
    tflops: float | None = None
    frac_bw: float | None = None
    frac_flops: float | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    cache: str = "cold"
    note: str = ""  # untimed / error / recheck
    flags: list[str] = field(default_factory=list)

    @property
    def disqualified(self) -> bool:
        """Wrong or physically impossible: never a dispatch candidate."""
        return any(f.startswith((WRONG_AT_SHAPE, plausibility.IMPLAUSIBLE))
                   for f in self.flags)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def flush_bytes(caps: HostCaps, device: str) -> int:
    """>= 2x the probed last-level cache (CPU); 0 lets the GPU worker size it from its L2."""
    if device != "cpu" or caps.profile is None:
        return 0
    llc = caps.profile.cpu.last_level_cache_bytes() or 0
    return max(MIN_FLUSH_BYTES, 2 * llc)


def _figure(spec: KernelSpec, name: str, shape: dict[str, int], device: str, dtype: str,
            res: dict[str, Any], eager: dict[str, Any], compiled: dict[str, Any],
            roof: Roofline | None, cache: str = "cold") -> Figure:
    fig = Figure(spec.name, name, shape, device, dtype, cache=cache)
    if not res.get("median_s"):  # absent, or 0: nothing to divide a figure by
        fig.note = res.get("untimed") or res.get("error") or "no timing"
        if res.get("wrong"):
            fig.flags.append(WRONG_AT_SHAPE)
        return fig
    fig.median_s, fig.p25_s, fig.p75_s, fig.n = (res["median_s"], res["p25_s"], res["p75_s"],
                                                 int(res["n"]))
    nbytes, flops = spec.bytes(shape, ELEMENT_BYTES.get(dtype, 4)), spec.flops(shape)
    fig.gbs = nbytes / fig.median_s / 1e9
    fig.tflops = flops / fig.median_s / 1e12
    dev = roof.device(device.split(":")[0] if device == "cpu" else device) if roof else None
    if dev is not None:
        peak_bw = dev.peak_bandwidth_gbs()
        peak_gf = dev.peak_gflops(COMPUTE_DTYPE.get(dtype, dtype))
        fig.frac_bw = fig.gbs / peak_bw if peak_bw else None
        fig.frac_flops = fig.tflops * 1e3 / peak_gf if peak_gf else None
        if name not in (EAGER, COMPILE):
            bound = plausibility.min_time_s(nbytes, flops, peak_bw, peak_gf, cache == "cold")
            flag = plausibility.implausible(fig.median_s, bound)
            if flag:
                fig.flags.append(flag)
    if eager.get("median_s") and name != EAGER:
        fig.speedup_eager = eager["median_s"] / fig.median_s
    if compiled.get("median_s") and name != COMPILE:
        fig.speedup_compile = compiled["median_s"] / fig.median_s
    if fig.frac_bw is not None and fig.frac_flops is not None and \
            max(fig.frac_bw, fig.frac_flops) > 1.05 and not fig.disqualified:
        fig.flags.append("above the roofline: the data stayed in cache or the byte/FLOP "
                         "model is wrong")
    return fig


@dataclass
class BenchContext:
    verify: VerifyContext
    roofline: Roofline | None
    settings: BenchSettings
    policy: SandboxPolicy = field(default_factory=lambda: SandboxPolicy(timeout_s=900.0))
    jobs: int = 1  # parallel verifications before timing (timing itself runs alone)
    progress: Callable[[str], None] = lambda _msg: None
    peaks: PeakKeeper | None = None  # re-measures a roofline peak a result beats by > 5%


def _groups(impls: list[Implementation], caps: HostCaps) -> dict[tuple[str, str], list[
        Implementation]]:
    """(device, private worker name or "") -> implementations: trusted built-ins share one
    worker per device; each external kernel gets its own."""
    groups: dict[tuple[str, str], list[Implementation]] = {}
    for impl in impls:
        device = get_dialect(impl.dialect).run_device(impl.requires, caps) or "cpu"
        key = (device, impl.name if impl.origin == "external" else "")
        groups.setdefault(key, []).append(impl)
    return groups


def bench_op(op: str, impls: list[Implementation], ctx: BenchContext) -> list[Figure]:
    """Verify what is not yet verified, then time the passing implementations."""
    spec = get_spec(op)
    shapes = spec.shape_set(ctx.settings.shapes)
    impls = [i for i in impls if ctx.settings.dtype in i.dtypes]  # e.g. c kernels: fp32
    passing = [v.impl for v in verify_many(impls, ctx.verify, ctx.jobs) if v.passed]
    figures: list[Figure] = []
    groups = _groups(passing, ctx.verify.caps) or {("cpu", ""): []}
    for (device, _), group in groups.items():
        figures += _bench_group(spec, group, device, shapes, ctx)
    _store(ctx, spec, figures, {i.name: i for i in passing})
    return figures


def _bench_group(spec: KernelSpec, group: list[Implementation], device: str,
                 shapes: list[dict[str, int]], ctx: BenchContext) -> list[Figure]:
    s = ctx.settings
    names = [EAGER, *([COMPILE] if s.compile else [])]
    ctx.progress(f"benchmarking {spec.name} on {device}: "
                 f"{', '.join([*names, *(i.name for i in group)])}")
    runner = GroupRunner(spec, device, ctx)
    try:
        group = runner.prepare(group)
    except RuntimeError as exc:
        return [Figure(spec.name, i.name, sh, device, s.dtype, note=str(exc))
                for sh in shapes for i in group]
    with HostLoadMonitor() as monitor:  # other processes' CPU while we time (issue 10 §1)
        base = runner.baselines(names, shapes)
        cand = runner.candidates(group, shapes) if group else \
            {"ok": True, "rows": [{"shape": sh, "results": {}} for sh in shapes]}
    runner.load = monitor.summary
    for result in (base, cand):
        if not result.get("ok"):
            failure = result.get("failure", {})
            note = f"{failure.get('reason')}: {failure.get('message')}"
            return [Figure(spec.name, i.name, sh, device, s.dtype, note=note)
                    for sh in shapes for i in group]
    rows = [{"shape": b["shape"], "results": {**b["results"], **c["results"]}}
            for b, c in zip(base["rows"], cand["rows"], strict=True)]
    noisy = runner.settle_noisy_baselines(rows)
    _check_peaks(spec, device, rows, ctx)  # before the figures judge against the roofline
    figures = []
    for i, row in enumerate(rows):
        res = row["results"]
        eager, compiled = res.get(EAGER, {}), res.get(COMPILE, {})
        for name, data in res.items():
            fig = _figure(spec, name, row["shape"], device, s.dtype, data, eager, compiled,
                          ctx.roofline, s.cache)
            if i in noisy:
                fig.flags.append(f"{plausibility.NOISY_BASELINE} ({noisy[i]})")
            if runner.load is not None and runner.load.busy:
                fig.flags.append(runner.load.verdict)
            figures.append(fig)
    runner.recheck_large_speedups(figures, {i.name: i for i in group})
    return figures


def _check_peaks(spec: KernelSpec, device: str, rows: list[dict[str, Any]],
                 ctx: BenchContext) -> None:
    """A figure beyond a stored peak re-measures that peak first (once per group and run):
    a roofline measured low must not make an honest kernel look implausible."""
    if ctx.peaks is None or ctx.roofline is None:
        return
    group = COMPUTE_DTYPE.get(ctx.settings.dtype, ctx.settings.dtype)
    for row in rows:
        shape = row["shape"]
        nbytes = spec.bytes(shape, ELEMENT_BYTES.get(ctx.settings.dtype, 4))
        for name, res in row["results"].items():
            if not res.get("median_s"):
                continue
            why = f"kernels bench {spec.name} {name}"
            if ctx.settings.cache == "cold":  # warm data may come from cache: no DRAM claim
                ctx.peaks.check(device, BANDWIDTH, nbytes / res["median_s"] / 1e9, why)
            ctx.peaks.check(device, group, spec.flops(shape) / res["median_s"] / 1e9, why)


class GroupRunner:
    """The jobs behind one benchmark group: baselines in a trusted worker, candidates in a
    confined one, re-measurements and re-checks each in a new process."""

    def __init__(self, spec: KernelSpec, device: str, ctx: BenchContext) -> None:
        self.spec, self.device, self.ctx = spec, device, ctx
        self.load: HostLoad | None = None
        self.overhead_s = 0.0  # the channel's round trip, measured by the trusted worker

    def _job(self, shapes: list[dict[str, int]]) -> Any:
        from strata.kernels.timing import BenchJob

        st = self.ctx.settings
        return BenchJob(self.spec.name, self.device, st.dtype, shapes, st.policy(),
                        flush_bytes(self.ctx.verify.caps, self.device), st.cache,
                        self.ctx.policy.timeout_s, self.ctx.policy.memory_bytes
                        if self.device == "cpu" else None)

    def prepare(self, group: list[Implementation]) -> list[Implementation]:
        """Build and import-check each kernel here (the worker may not run a compiler)."""
        ready = []
        for impl in group:
            try:
                ready.append(prepared(impl, self.ctx.verify.caps))
            except Exception as exc:
                raise RuntimeError(f"{impl.name}: {exc}") from exc
        return ready

    def baselines(self, names: list[str], shapes: list[dict[str, int]]) -> dict[str, Any]:
        """The torch baselines, timed by this process in a trusted worker (which also gives
        the channel's round trip that every sample sheds)."""
        from strata.kernels.timing import run_baselines

        result = run_baselines(self._job(shapes), names)
        if result.get("ok"):
            self.overhead_s = float(result.get("overhead_s", 0.0))
        return result

    def candidates(self, group: list[Implementation],
                   shapes: list[dict[str, int]]) -> dict[str, Any]:
        """Kernels timed and checked by this process; they run in a confined worker."""
        from strata.kernels.timing import run_candidates

        return run_candidates(self._job(shapes), group, self.overhead_s)

    def settle_noisy_baselines(self, rows: list[dict[str, Any]]) -> dict[int, str]:
        """Re-measure noisy eager times once (new process); what stays noisy is returned."""
        nbytes = [self.spec.bytes(r["shape"], ELEMENT_BYTES.get(self.ctx.settings.dtype, 4))
                  for r in rows]
        noisy = plausibility.noisy_shapes(plausibility.baseline_times(rows, EAGER, nbytes))
        if not noisy:
            return {}
        self.ctx.progress(f"re-measuring a noisy baseline ({len(noisy)} shape(s))")
        again = self.baselines([EAGER], [rows[i]["shape"] for i in noisy])
        for i, row in zip(noisy, again.get("rows", []), strict=False):
            rows[i]["results"][EAGER] = row["results"][EAGER]
        return plausibility.noisy_shapes(plausibility.baseline_times(rows, EAGER, nbytes))

    def recheck_large_speedups(self, figures: list[Figure],
                               impls: dict[str, Implementation]) -> None:
        """> 10x over eager: time the kernel and eager again in new processes on new
        inputs; the figure keeps the smaller speedup, and a wrong re-check disqualifies."""
        for fig in figures:
            if fig.impl not in impls or fig.disqualified or \
                    (fig.speedup_eager or 0) <= plausibility.SUSPICIOUS_SPEEDUP:
                continue
            base = self.baselines([EAGER], [fig.shape])
            cand = self.candidates([impls[fig.impl]], [fig.shape])
            self._apply_recheck(fig, base, cand)

    def _apply_recheck(self, fig: Figure, base: dict[str, Any], cand: dict[str, Any]) -> None:
        try:
            eager = base["rows"][0]["results"][EAGER]
            again = cand["rows"][0]["results"][fig.impl]
        except (KeyError, IndexError, TypeError):
            fig.flags.append("speedup > 10x could not be re-checked; not counted")
            fig.speedup_eager = None
            return
        if again.get("wrong") or "median_s" not in again or "median_s" not in eager:
            fig.flags.append(f"{WRONG_AT_SHAPE}: re-check on new inputs failed "
                             f"({again.get('error', 'no timing')})")
            return
        ratio = eager["median_s"] / again["median_s"]
        fig.flags.append(f"speedup > 10x re-checked in a new process on new inputs: "
                         f"{ratio:.1f}x")
        fig.speedup_eager = min(fig.speedup_eager or ratio, ratio)


def _store(ctx: BenchContext, spec: KernelSpec, figures: list[Figure],
           impls: dict[str, Implementation]) -> None:
    hashes = {b.name: b.content_hash() for b in baselines(spec.name)}
    hashes.update({name: impl.content_hash() for name, impl in impls.items()})
    rows = [KernelResult(f.op, f.impl, hashes.get(f.impl, "?"), "bench",
                         "ok" if f.median_s is not None else "error", f.device, f.dtype,
                         f.to_dict(), f.shape) for f in figures]
    if rows:
        save_kernel_results(ctx.verify.conn, ctx.verify.fingerprint, rows)
