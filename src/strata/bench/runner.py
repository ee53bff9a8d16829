"""Run a planned sweep: load each model once, warm up, repeat each test to its CI target,
explain it against the roofline, and store it the moment it is finished.

Every timed test runs under a HostLoadMonitor: a test during which other processes used
the CPUs is flagged (telemetry["host_load"], the verdict names the busy host). A result
that beats a stored roofline peak by > 5% re-measures that peak (PeakKeeper), and η of
this run's results on that device is recomputed against the corrected peak.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from strata.backends import ACCEPTS, create, describe
from strata.backends.base import Backend, BackendUnavailable, RunRequest, RunTrace
from strata.bench.checks import refused_pairs
from strata.bench.explain import explain
from strata.bench.metrics import RunMetrics, compute, generated
from strata.bench.peaks import achieved_figures
from strata.bench.plan import BenchConfig, Job, RepPolicy, plan
from strata.bench.scenario import BenchTest
from strata.bench.sustained import run_sustained, summarize_timeline
from strata.hardware.telemetry import HostLoad, HostLoadMonitor, Sampler
from strata.measure.peakguard import PeakCheck, PeakKeeper
from strata.measure.roofline import Roofline
from strata.measure.stats import summarize
from strata.models.source import ResolvedModel, resolve
from strata.store.runs import StoredResult


@dataclass
class Events:
    """Progress callbacks (the CLI draws a progress bar; tests may record)."""

    job_started: Callable[[Job], None] = lambda job: None
    rep_done: Callable[[Job, BenchTest, int], None] = lambda job, test, i: None
    test_done: Callable[[StoredResult], None] = lambda result: None
    skipped: Callable[[str, str], None] = lambda what, why: None


@dataclass
class Outcome:
    results: list[StoredResult] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (what, reason)


def resolve_all(config: BenchConfig) -> dict[str, ResolvedModel]:
    """Resolve every model before anything runs: a bad path fails in a second, not an hour in."""
    return {ref: resolve(ref, config.model_name) for ref in config.models}


@dataclass
class _Explained:
    """What re-explaining a finished result needs when a peak is corrected mid-run."""

    result: StoredResult
    model: ResolvedModel
    job: Job
    test: BenchTest
    load: HostLoad


class Runner:
    """peaks: re-measures a peak a result beats (default: re-measure in memory only; pass a
    PeakKeeper with `save` to store the corrected roofline). update(result): called for an
    already stored result whose η was recomputed (e.g. to rewrite its row)."""

    def __init__(self, config: BenchConfig, roofline: Roofline | None,
                 store: Callable[[StoredResult], StoredResult], events: Events | None = None,
                 cache_bytes: int | None = None, peaks: PeakKeeper | None = None,
                 update: Callable[[StoredResult], None] | None = None):
        self.config, self.roofline, self.store = config, roofline, store
        self.cache_bytes = cache_bytes  # last-level cache: below it DRAM is not the roof
        self.events = events or Events()
        self.rng = random.Random(config.seed)
        if peaks is None and roofline is not None:
            from strata.hardware.microbench import host_remeasure

            peaks = PeakKeeper(roofline, host_remeasure())
        self.peaks = peaks
        if peaks is not None:
            self.roofline = peaks.roofline  # one roofline object: corrections reach both
        self.update = update or (lambda _r: None)
        self._explained: list[_Explained] = []

    def run(self, models: dict[str, ResolvedModel],
            refused: dict[tuple[str, str], str] | None = None) -> Outcome:
        """Every job of the plan but the `refused` pairs (bench.checks: skipped, with why,
        before the first test runs)."""
        out = Outcome()
        refused = refused if refused is not None else refused_pairs(self.config, models)
        for (m, b), why in refused.items():
            self._skip(out, f"{m} on {b}", why)
        for job in plan(self.config):
            if (job.model, job.backend) not in refused:
                self._run_job(job, models[job.model], out)
        for r in busy_thread_notes(out.results):  # a -t sweep on a busy host: say so
            self.update(r)
        return out

    # -- one model load --------------------------------------------------------------------
    def _run_job(self, job: Job, model: ResolvedModel, out: Outcome) -> None:
        what = f"{job.model} on {job.backend}"
        try:
            backend = create(job.backend)
            self.events.job_started(job)
            backend.load(model, job.load)
        except BackendUnavailable as exc:
            self._skip(out, what, str(exc))
            return
        try:
            if self.config.sustained_s:
                out.results.append(self.store(self._run_sustained(backend, job, model)))
                self.events.test_done(out.results[-1])
                return
            for i, test in enumerate(job.tests):
                if i and self.config.delay_s:
                    time.sleep(self.config.delay_s)  # --delay: cool down between tests
                out.results.append(self.store(self._run_test(backend, job, model, test)))
                self.events.test_done(out.results[-1])
        finally:
            backend.close()

    def _skip(self, out: Outcome, what: str, why: str) -> None:
        out.skipped.append((what, why))
        self.events.skipped(what, why)

    # -- one test -----------------------------------------------------------------------
    def _request(self, backend: Backend, test: BenchTest) -> RunRequest:
        """Fresh random tokens every repetition: prompt caches never help
        (docs/architecture.md §5)."""
        seed = self.rng.randrange(1 << 30)
        bos = backend.bos()
        head = [bos] if bos is not None else []
        depth = (head + backend.random_tokens(test.depth - len(head), seed)) if test.depth else []
        first = head if not depth else []
        prompt = (first + backend.random_tokens(test.n_prompt - len(first), seed + 1)
                  if test.n_prompt else [])
        return RunRequest(tuple(depth), tuple(prompt), test.n_gen)

    def _run_test(self, backend: Backend, job: Job, model: ResolvedModel,
                  test: BenchTest) -> StoredResult:
        policy = self.config.reps
        if policy.warmup:
            backend.run(self._request(backend, test))  # not recorded
        runs: list[RunMetrics] = []
        counts: list[tuple[int, int, int | None, int | None]] = []
        notes: set[str] = set()
        with Sampler(interval_s=0.25) as sampler, HostLoadMonitor() as load:
            stop_reason = self._repeat(backend, job, test, policy, runs, counts, notes)
        return self._result(backend, job, model, test, runs, counts, notes, stop_reason,
                            sampler, load.summary)

    def _repeat(self, backend: Backend, job: Job, test: BenchTest, policy: RepPolicy,
                runs: list[RunMetrics], counts: list, notes: set[str]) -> str:
        spent = 0.0
        while True:
            trace = backend.run(self._request(backend, test))
            metrics = compute(trace)
            runs.append(metrics)
            counts.append((trace.n_prompt, generated(trace), trace.n_prompt_reported,
                           trace.n_gen_reported))
            notes.update(trace.notes)
            spent += metrics.e2e_s
            self.events.rep_done(job, test, len(runs))
            reason = _stop(runs, test, policy, spent)
            if reason:
                return reason

    def _run_sustained(self, backend: Backend, job: Job, model: ResolvedModel) -> StoredResult:
        """Back-to-back tg requests for --sustained seconds, sampled at 1 s."""
        seconds = float(self.config.sustained_s or 0)
        test = next((t for t in job.tests if t.kind == "tg"), BenchTest(0, 32))
        backend.run(self._request(backend, test))  # warm-up
        runs: list[RunMetrics] = []

        def step() -> RunTrace:
            trace = backend.run(self._request(backend, test))
            runs.append(compute(trace))
            self.events.rep_done(job, test, len(runs))
            return trace

        with Sampler(interval_s=1.0) as sampler, HostLoadMonitor() as load:
            timeline = run_sustained(step, seconds)
        report = summarize_timeline(timeline, seconds)
        tele = sampler.summary()
        report.throttled = tele.verdict.throttled
        report.evidence = list(tele.verdict.evidence)
        result = self._result(backend, job, model, test, runs, [(0, test.n_gen, None, None)],
                              set(), f"sustained {seconds:g} s", sampler, load.summary)
        result.test = f"sustained {test.name} {seconds:g}s"
        result.info["sustained"] = report.to_dict()
        return result

    def _result(self, backend: Backend, job: Job, model: ResolvedModel, test: BenchTest,
                runs: list[RunMetrics], counts: list, notes: set[str], stop_reason: str,
                sampler: Sampler, load: HostLoad) -> StoredResult:
        metrics = _summaries(runs)
        tele = sampler.summary()
        telemetry = {**tele.to_dict(), "host_load": load.to_dict()}
        info = dict(backend.info())
        notes |= set(_offload_notes(job, info)) | set(_thread_notes(job, info))
        info.update(stop_reason=stop_reason, notes=sorted(notes) + spread_notes(metrics, test),
                    tokens=_token_counts(counts),
                    memory=_memory(tele.to_dict()),
                    energy_j_per_token=_energy_per_token(tele.to_dict(), runs, test),
                    model=_spec(model, job.backend).to_dict() if model.spec
                    else {"endpoint": model.endpoint})
        ex = self._explain(model, job, test, info, metrics, load)
        result = StoredResult(model=job.model, backend=job.backend, test=test.name,
                              n_prompt=test.n_prompt, n_gen=test.n_gen, n_depth=test.depth,
                              load_config=asdict(job.load), metrics=metrics,
                              explain=ex, telemetry=telemetry, info=info)
        done = _Explained(result, model, job, test, load)
        if ex is not None:
            self._check_peaks(done)
        self._explained.append(done)
        return result

    # -- peaks that a result beats -----------------------------------------------------
    def _check_peaks(self, done: _Explained) -> None:
        """Re-measure a peak this result beats by > 5%, then recompute η of this result and
        of this run's earlier results on the same device against the corrected roofline."""
        ex = done.result.explain or {}
        if self.peaks is None or not ex.get("device"):
            return
        checks: list[PeakCheck] = []
        for group, achieved in achieved_figures(ex, done.result.metrics):
            check = self.peaks.check(ex["device"], group, achieved,
                                     why=f"bench {done.job.model} {done.test.name}")
            if check.exceeded:
                checks.append(check)
        if not checks:
            return
        done.result.info["peak_checks"] = [c.to_dict() for c in checks]
        if not any(c.raised for c in checks):
            return
        for item in [*self._explained, done]:
            item_ex = item.result.explain or {}
            if item_ex.get("device") != ex["device"]:
                continue
            item.result.explain = self._explain(item.model, item.job, item.test,
                                                item.result.info, item.result.metrics,
                                                item.load)
            if item is not done:
                item.result.info["eta_recomputed"] = "; ".join(c.note for c in checks)
                self.update(item.result)

    def _explain(self, model: ResolvedModel, job: Job, test: BenchTest, info: dict[str, Any],
                 metrics: dict[str, dict[str, Any]],
                 load: HostLoad | None = None) -> dict[str, Any] | None:
        if model.spec is None:
            info["explain_absent"] = "endpoint: the weights' types are unknown to strata"
            return None
        # the backend's own report first; else its descriptor's rule for this load
        device = info.get("device") or describe(job.backend).device(job.load)
        if device != "cpu" and info.get("gpu_offload_supported") is False:
            device = "cpu"  # a CPU-only build ignores -ngl: every layer ran on the CPU
        roof = self.roofline.device(device) if self.roofline else None
        if roof is None:
            info["explain_absent"] = f"no measured roofline for {device} on this host"
            return None
        achieved = {k: v["mean"] for k, v in metrics.items() if k.endswith("_tps")}
        dtype = info.get("dtype")
        runtime = str(dtype).removeprefix("torch.") if dtype else None
        # torch keeps K/V in the model's dtype; llama.cpp in the -ctk type
        kv = str(info.get("kv_dtype") or job.load.kv_type).removeprefix("torch.")
        spec = _spec(model, job.backend)
        return explain(spec, test, roof, kv, runtime, achieved, self.cache_bytes,
                       load).to_dict()


def _spec(model: ResolvedModel, backend: str) -> Any:
    """The spec of the form this backend reads (a synthetic @q4_0 is Q4_0 as GGUF but F16
    as safetensors)."""
    fmt = next((f for f in ACCEPTS.get(backend, ()) if f in model.artefacts), None)
    return (model.spec_for(fmt) if fmt else None) or model.spec


def busy_thread_notes(results: list[StoredResult]) -> list[StoredResult]:
    """A thread sweep on a busy host where fewer threads won: the results of that test say
    so (other processes hold cores, so a larger team waits on them), and their low-η
    verdicts stop suggesting too few threads. Returns the results it changed."""
    from collections import defaultdict

    from strata.bench.records import SETTINGS, record

    groups: dict[tuple[Any, ...], list[tuple[int, float, bool, StoredResult]]] = \
        defaultdict(list)
    for r in results:
        rec = record(r)
        if not isinstance(rec.get("n_threads"), int) or not rec.get("avg_ts"):
            continue
        key = (r.model, r.backend, r.test,
               *(repr(rec.get(f)) for f, _ in SETTINGS if f != "n_threads"))
        groups[key].append((rec["n_threads"], rec["avg_ts"], bool(rec.get("host_busy")), r))
    changed = []
    for members in groups.values():
        if len({m[0] for m in members}) < 2 or not any(m[2] for m in members):
            continue
        best = max(members, key=lambda m: m[1])
        more = max(m[0] for m in members)
        if more <= best[0]:
            continue
        note = (f"on this busy host {best[0]} thread(s) beat {more}: other processes hold "
                "cores, so a larger team waits on them; re-run on a quiet host before "
                "choosing -t")
        for *_, r in members:
            r.info["notes"] = [*r.info.get("notes", []), note]
            if r.explain:
                r.explain["verdict"] = [v.replace("too few threads, ", "")
                                        for v in r.explain.get("verdict", [])]
            changed.append(r)
    return changed


def _thread_notes(job: Job, info: dict[str, Any]) -> list[str]:
    """Where the thread count came from, when -t did not give it: a figure's threads are
    part of what it means (compare pairs only equal ones)."""
    threads = info.get("threads")
    if job.load.threads is not None or not isinstance(threads, int):
        return []
    import os

    why = ("OMP_NUM_THREADS" if os.environ.get("OMP_NUM_THREADS", "").strip().isdigit()
           else "this host's physical cores")
    return [f"{threads} thread(s): the default ({why}); -t 1,2,... sweeps others"]


def _offload_notes(job: Job, info: dict[str, Any]) -> list[str]:
    """-ngl N on a build that cannot offload (llama.cpp built for the CPU only): say that
    nothing was offloaded, so nobody reads these figures as GPU figures."""
    ngl = job.load.n_gpu_layers
    if ngl > 0 and info.get("gpu_offload_supported") is False:
        return [f"-ngl {ngl}: this llama.cpp build cannot offload to a GPU: nothing was "
                "offloaded, every layer ran on the CPU (judged against the CPU roofline)"]
    return []


def spread_notes(metrics: dict[str, dict[str, Any]], test: BenchTest) -> list[str]:
    """A note when the test's figure varies more than its mean (SD > mean over n > 1
    samples): the mean of such samples says little, and every printer should say so."""
    s = metrics.get(test.primary_metric) or {}
    mean, sd, n = s.get("mean"), s.get("sd"), s.get("n") or 0
    if mean is None or sd is None or n < 2 or sd <= mean:
        return []
    return [f"SD {sd:,.2f} t/s is larger than the mean {mean:,.2f} t/s over {n} samples: "
            "they disagree too much for the mean to be trusted; re-run on a quiet host or with "
            "more repetitions (-r)"]


def _stop(runs: list[RunMetrics], test: BenchTest, policy: RepPolicy, spent: float) -> str | None:
    if len(runs) >= policy.max_reps:
        return f"max reps ({policy.max_reps})"
    if len(runs) < policy.min_reps:
        return None
    if spent >= policy.max_time_s:
        return f"time limit ({policy.max_time_s:g} s)"
    values = [getattr(r, test.primary_metric) for r in runs]
    if None in values:
        return None
    ci = summarize(values).rel_ci95
    return f"95% CI within {policy.target_rel_ci:.0%}" if ci <= policy.target_rel_ci else None


def _summaries(runs: list[RunMetrics]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key in ("prefill_tps", "decode_tps", "combined_tps", "ttft_s", "tpot_s", "e2e_s"):
        values = [getattr(r, key) for r in runs if getattr(r, key) is not None]
        if values:
            out[key] = summarize(values).to_dict()
    itl = [x for r in runs for x in r.itl_s]
    if itl:
        out["itl_s"] = summarize(itl).to_dict()  # pooled over repetitions, per token
    return out


def _token_counts(counts: list) -> dict[str, Any]:
    """Token counts seen per repetition; reported ones come from the server's `usage`."""
    prompt, gen, prompt_rep, gen_rep = zip(*counts, strict=True)
    return {"prompt": sorted(set(prompt)), "generated": sorted(set(gen)),
            "prompt_reported": sorted({p for p in prompt_rep if p is not None}),
            "generated_reported": sorted({g for g in gen_rep if g is not None})}


def _memory(tele: dict[str, Any]) -> dict[str, float]:
    """Peak RSS and device memory, sampled outside the timed thread (docs/architecture.md §5)."""
    out = {}
    for key, stats in tele.get("metrics", {}).items():
        if key == "proc.rss_bytes" or key.endswith("mem_used_bytes"):
            out[f"peak_{key}"] = stats["max"]
    return out


def _energy_per_token(tele: dict[str, Any], runs: list[RunMetrics], test: BenchTest) -> dict:
    tokens = len(runs) * (test.n_prompt + test.n_gen)
    return {k: j / tokens for k, j in tele.get("energy_j", {}).items()} if tokens else {}
