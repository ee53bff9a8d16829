"""Serving load on an endpoint: `strata bench http://… --concurrency 1,2,4 --request-rate R`.

A *level* is one timed window of N requests, each a fresh random prompt of -p tokens that
asks for -n generated tokens (the openai backend builds and times every request exactly as
for a single-request test: backends/openai.py). Two ways to offer load, as `vllm bench serve`
and GuideLLM do:

  closed loop (--concurrency C)   C workers, each sending its next request the moment the
                                  previous one ends: C requests are always in flight;
  open loop (--request-rate R)    requests arrive at seeded Poisson times (exponential gaps of
                                  mean 1/R s), whatever the server's state; --concurrency then
                                  caps the requests in flight (a request arriving while C are
                                  in flight waits for a free worker, and the wait is reported).

Every worker is a thread with its own HTTP client and connection (OpenAIBackend.worker);
all prompts are built before the window, so nothing but the timed requests reaches the
server inside it. Per level (one stored result, test "pp512+tg128 c4" or "… 2/s"):

  window      first request sent → last token received (s)
  throughput  output tokens / window (output t/s), (prompt + output) / window (the stored
              primary figure, combined_tps: llama-bench's pp+tg t/s over the whole window),
              requests / window (requests/s)
  latency     TTFT, ITL (every gap between streamed tokens, pooled), TPOT, E2E per request:
              mean and p50 / p90 / p99
  goodput     requests that met every SLO (TTFT ≤ --slo-ttft-ms and TPOT, the request's
              mean ITL after its first token, ≤ --slo-itl-ms), per second of the window and
              as a share of the requests sent: vLLM bench serve's "request goodput"
  queueing    how many requests the server streamed at once (first to last token of each
              request, overlapping by more than a quarter of the median stream: a buffered
              tail is not parallel service) against how many were in flight: fewer
              means the server queues the rest (e.g. one slot: TTFT grows with concurrency,
              ITL stays flat), and the result says so.

A request that fails (an HTTP error, a timeout) is counted, noted and missing from the
latency figures; a level whose every request failed stops the sweep with the first error.
"""

from __future__ import annotations

import math
import queue
import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from strata.backends import create
from strata.backends.base import BackendUnavailable, RunRequest, RunTrace
from strata.bench.checks import incompatible
from strata.bench.metrics import NS, RunMetrics, compute, generated
from strata.bench.plan import BenchConfig, Job, plan
from strata.bench.runner import Events, Outcome
from strata.bench.scenario import BenchTest
from strata.errors import StrataError
from strata.measure.stats import summarize
from strata.models.source import ResolvedModel
from strata.store.runs import StoredResult

# Default SLOs: a chat answer that starts within 1 s and streams at reading speed or faster
# (≥ 10 t/s: at most 100 ms per token), the "usable" bar of the chat profile.
DEFAULT_SLO_TTFT_MS = 1000.0
DEFAULT_SLO_ITL_MS = 100.0
MAX_WORKERS = 256  # threads and HTTP clients one level may open


@dataclass(frozen=True)
class Level:
    """One load level: `requests` requests, at most `concurrency` in flight (None: no cap),
    arriving at Poisson times of mean rate `rate` per second (None: closed loop)."""

    concurrency: int | None
    rate: float | None
    requests: int

    @property
    def name(self) -> str:
        if self.rate is None:
            return f"c{self.concurrency}"
        cap = f" c{self.concurrency}" if self.concurrency else ""
        return f"{self.rate:g}/s{cap}"

    @property
    def workers(self) -> int:
        return min(self.concurrency or self.requests, self.requests)


def default_requests(concurrency: int | None, rate: float | None) -> int:
    """A few times the concurrency (at least 8); with a rate, about 10 s of arrivals
    (8 to 200, and at least 4 x the cap)."""
    if rate is None:
        return max(8, 4 * (concurrency or 1))
    return max(8, min(200, math.ceil(10 * rate)), 4 * (concurrency or 0))


def make_levels(concurrency: list[int], rates: list[float],
                num_requests: int | None) -> list[Level]:
    """Closed-loop levels for every concurrency; with rates, an open-loop level per rate
    (per cap, if concurrencies are given too)."""
    if not rates:
        return [Level(c, None, num_requests or default_requests(c, None)) for c in concurrency]
    caps: list[int | None] = list(concurrency) or [None]
    return [Level(c, r, num_requests or default_requests(c, r)) for r in rates for c in caps]


@dataclass(frozen=True)
class Slo:
    ttft_ms: float = DEFAULT_SLO_TTFT_MS
    itl_ms: float = DEFAULT_SLO_ITL_MS

    def met(self, m: RunMetrics) -> bool:
        """Every SLO met: TTFT, and TPOT (the request's mean ITL) where it has one."""
        if m.ttft_s is None or m.ttft_s * 1e3 > self.ttft_ms:
            return False
        return m.tpot_s is None or m.tpot_s * 1e3 <= self.itl_ms

    @property
    def text(self) -> str:
        return f"TTFT ≤ {self.ttft_ms:g} ms, ITL ≤ {self.itl_ms:g} ms"


@dataclass
class LoadPlan:
    levels: list[Level]
    slo: Slo = field(default_factory=Slo)

    def to_dict(self) -> dict[str, Any]:
        return {"levels": [asdict(lv) for lv in self.levels], "slo": asdict(self.slo)}


@dataclass
class LoadBenchConfig(BenchConfig):
    """A bench config whose tests are request shapes (pp N + tg M) run at load levels."""

    load: LoadPlan = field(default_factory=lambda: LoadPlan([]))

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "load": self.load.to_dict()}

    def n_results(self) -> int:
        return (len(self.models) * len(self.backends) * len(self.loads) * len(self.tests)
                * len(self.load.levels))


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Arrival times (s from the window's start) of n requests at Poisson rate `rate`: the
    first at 0, then exponential gaps of mean 1/rate. The same seed, the same schedule."""
    rng = random.Random(seed)
    out, t = [0.0], 0.0
    for _ in range(n - 1):
        t += rng.expovariate(rate)
        out.append(t)
    return out


# -- one window ---------------------------------------------------------------------------


@dataclass
class Window:
    """What a level's window left: per request its trace (None: failed), when it was due
    and when it was sent (ns), and the window's start."""

    t0: int
    traces: list[RunTrace | None]
    due_ns: list[int]
    errors: list[BaseException] = field(default_factory=list)

    @property
    def end(self) -> int:
        return max(_last(t) for t in self.traces if t is not None)


def _last(t: RunTrace) -> int:
    return t.token_ns[-1] if t.token_ns else (t.t_prefill_end or t.t_start)


def run_window(workers: list[Any], requests: list[RunRequest], level: Level,
               seed: int) -> Window:
    """Send `requests` through `workers` (one thread each) as `level` says; returns when
    every request has ended. Closed loop: every worker takes the next request as soon as
    it is free. Open loop: a dispatcher releases each request at its Poisson time."""
    todo: queue.Queue[int | None] = queue.Queue()
    traces: list[RunTrace | None] = [None] * len(requests)
    errors: list[BaseException] = []
    lock = threading.Lock()

    go = threading.Event()

    def work(backend: Any) -> None:
        go.wait()
        while (i := todo.get()) is not None:
            try:
                traces[i] = backend.run(requests[i])
            except BaseException as exc:  # kept, raised after the window (no thread dies loud)
                with lock:
                    errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in workers]
    offsets = (poisson_arrivals(len(requests), level.rate, seed) if level.rate
               else [0.0] * len(requests))
    if level.rate is None:  # closed loop: everything queued, the workers pace themselves
        for i in range(len(requests)):
            todo.put(i)
    for th in threads:  # started before the clock: a thread's start-up is not the server's
        th.start()
    t0 = time.perf_counter_ns()
    due = [t0 + int(o * NS) for o in offsets]
    go.set()
    if level.rate is not None:
        for i, when in enumerate(due):
            wait = (when - time.perf_counter_ns()) / NS
            if wait > 0:
                time.sleep(wait)
            todo.put(i)
    for _ in threads:
        todo.put(None)
    for th in threads:
        th.join()
    return Window(t0, traces, due, errors)


# -- one level's figures ------------------------------------------------------------------


def max_overlap(intervals: list[tuple[int, int]], slack: int = 0) -> int:
    """Most intervals that overlap at one instant, counting two as overlapping only where
    they share more than `slack` (each is shrunk by slack/2 at both ends)."""
    events: list[tuple[int, int]] = []
    for a, b in intervals:
        a2, b2 = a + slack // 2, b - slack // 2
        if b2 > a2:
            events += [(a2, 1), (b2, -1)]
    best = cur = 0
    for _, step in sorted(events):  # an end sorts before a start at the same instant
        cur += step
        best = max(best, cur)
    return best


def stream_slack(streams: list[tuple[int, int]]) -> int:
    """How long two streams must overlap to count as served at once (ns): a quarter of
    the median stream. A one-slot server that buffers its output still sends the tail of
    one stream while the next has begun (a short overlap); streams served in parallel
    overlap for most of their length."""
    if not streams:
        return 0
    return int(statistics.median(b - a for a, b in streams) / 4)


@dataclass
class LevelFigures:
    runs: list[RunMetrics]
    window_s: float
    prompt_tokens: int
    output_tokens: int
    good: int
    in_flight_max: int
    server_parallel: int | None  # None: no request streamed two tokens
    client_wait_max_s: float
    cut_short: int
    failed: int = 0
    first_error: str = ""


def figures(window: Window, requests: list[RunRequest], slo: Slo) -> LevelFigures:
    traces = [t for t in window.traces if t is not None]
    runs = [compute(t) for t in traces]
    window_s = (window.end - window.t0) / NS
    streams = [(t.token_ns[0], t.token_ns[-1]) for t in traces if len(t.token_ns) > 1]
    slack = stream_slack(streams)
    waits = [(t.t_start - due) / NS for t, due in zip(window.traces, window.due_ns, strict=True)
             if t is not None]
    return LevelFigures(
        runs=runs, window_s=window_s, prompt_tokens=sum(t.n_prompt for t in traces),
        output_tokens=sum(generated(t) for t in traces),
        good=sum(slo.met(r) for r in runs),
        in_flight_max=max_overlap([(t.t_start, _last(t)) for t in traces]),
        server_parallel=max(1, max_overlap(streams, slack)) if streams else None,
        client_wait_max_s=max(0.0, max(waits, default=0.0)),
        cut_short=sum(1 for t, q in zip(window.traces, requests, strict=True)
                      if t is not None and generated(t) < q.n_gen),
        failed=len(requests) - len(traces),
        first_error=_one_line(window.errors[0]) if window.errors else "")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def summaries(runs: list[RunMetrics]) -> dict[str, dict[str, Any]]:
    """Per-request figures as stored metrics (ITL pooled over every request's gaps)."""
    out: dict[str, dict[str, Any]] = {}
    for key in ("prefill_tps", "decode_tps", "ttft_s", "tpot_s", "e2e_s"):
        values = [getattr(r, key) for r in runs if getattr(r, key) is not None]
        if values:
            out[key] = summarize(values).to_dict()
    itl = [x for r in runs for x in r.itl_s]
    if itl:
        out["itl_s"] = summarize(itl).to_dict()
    return out


def queueing_note(level: Level, f: LevelFigures, flavour: str | None) -> str | None:
    """Deterministic from the timestamps: fewer requests streamed at once than were in
    flight means the server queued the others."""
    k, m = f.server_parallel, f.in_flight_max
    if k is None or m < 2 or k >= m:
        return None
    who = f"the {flavour} server" if flavour and flavour != "unknown" else "the server"
    if k == 1:
        return (f"{level.name}: {who} runs one request at a time (one slot): with up to {m} "
                "in flight, no two streamed at once, so later requests queue (TTFT grows "
                "with concurrency while ITL stays flat)")
    return (f"{level.name}: {who} streamed at most {k} requests at once while up to {m} were "
            f"in flight ({k} slots?): the others queue (TTFT grows, ITL stays flat)")


def _p50_ms(runs: list[RunMetrics], key: str) -> float | None:
    values = [x for r in runs for x in (r.itl_s if key == "itl_s" else [getattr(r, key)])
              if x is not None]
    return statistics.median(values) * 1e3 if values else None


def _against_c1(f: LevelFigures, c1: LevelFigures) -> str:
    """The queueing in numbers: median TTFT and ITL here and at concurrency 1."""
    parts = []
    for key, name in (("ttft_s", "TTFT"), ("itl_s", "ITL")):
        here, base = _p50_ms(f.runs, key), _p50_ms(c1.runs, key)
        if here is not None and base is not None:
            parts.append(f"{name} p50 {here:.1f} ms vs {base:.1f} ms at c1")
    return f": {'; '.join(parts)}" if parts else ""


def level_notes(level: Level, f: LevelFigures, flavour: str | None,
                c1: LevelFigures | None = None) -> list[str]:
    notes = []
    q = queueing_note(level, f, flavour)
    if q:
        notes.append(q + (_against_c1(f, c1) if c1 is not None else ""))
    if f.failed:
        notes.append(f"{level.name}: {f.failed} of {level.requests} requests failed (the "
                     f"first: {f.first_error}); the figures are the completed requests', and "
                     "goodput counts the failed ones as missing the SLO")
    if f.cut_short:
        why = (" (llama-cpp-python's server interrupts a stream when another request "
               "arrives unless started with --interrupt_requests False)"
               if flavour == "llama-cpp-python" else "")
        notes.append(f"{level.name}: {f.cut_short} of {len(f.runs)} requests ended before "
                     f"their -n tokens{why}: output t/s counts the tokens that came")
    if level.rate is not None and f.client_wait_max_s > 0.010:
        why = (f"all {level.concurrency} workers busy, as --concurrency caps them, or a busy "
               "client host" if level.concurrency and level.concurrency < level.requests
               else "a busy client host: each request had a worker of its own")
        notes.append(f"{level.name}: requests were sent up to {f.client_wait_max_s * 1e3:.0f} "
                     f"ms after their arrival time ({why}); latencies count from the send")
    return notes


def level_info(level: Level, f: LevelFigures, slo: Slo, seed: int) -> dict[str, Any]:
    n, planned = len(f.runs), level.requests
    return {
        "concurrency": level.concurrency, "request_rate": level.rate,
        "arrivals": "poisson" if level.rate else "closed loop", "seed": seed,
        "num_requests": planned, "requests": n, "failed": f.failed, "workers": level.workers,
        "window_s": f.window_s, "prompt_tokens": f.prompt_tokens,
        "output_tokens": f.output_tokens, "output_tps": f.output_tokens / f.window_s,
        "requests_ps": n / f.window_s, "slo_ttft_ms": slo.ttft_ms, "slo_itl_ms": slo.itl_ms,
        "good_requests": f.good, "goodput_rps": f.good / f.window_s,
        "goodput_share": f.good / planned, "in_flight_max": f.in_flight_max,
        "server_parallel": f.server_parallel, "cut_short": f.cut_short,
        "client_wait_max_s": f.client_wait_max_s,
    }


# -- the sweep ----------------------------------------------------------------------------


class LoadRunner:
    """Runs a LoadBenchConfig: per (model, backend, load) one warm-up request, then every
    request shape at every level, each level stored the moment it is finished."""

    def __init__(self, config: LoadBenchConfig, store: Callable[[StoredResult], StoredResult],
                 events: Events | None = None) -> None:
        self.config, self.store = config, store
        self.events = events or Events()
        self.rng = random.Random(config.seed)
        self._c1: dict[tuple[str, BenchTest], LevelFigures] = {}  # (model, shape) at c1

    def run(self, models: dict[str, ResolvedModel]) -> Outcome:
        out = Outcome()
        for job in plan(self.config):
            self._run_job(job, models[job.model], out)
        return out

    def _run_job(self, job: Job, model: ResolvedModel, out: Outcome) -> None:
        what = f"{job.model} on {job.backend}"
        reason = incompatible(model, job.backend)
        if reason:
            out.skipped.append((what, reason))
            self.events.skipped(what, reason)
            return
        try:
            backend = create(job.backend)
            self.events.job_started(job)
            backend.load(model, job.load)
        except BackendUnavailable as exc:
            out.skipped.append((what, str(exc)))
            self.events.skipped(what, str(exc))
            return
        if not hasattr(backend, "worker"):
            backend.close()
            raise StrataError(f"the {job.backend} backend cannot send concurrent requests")
        workers: list[Any] = []
        try:
            backend.run(self._request(backend, job.tests[0]))  # warm-up, not recorded
            need = max(lv.workers for lv in self.config.load.levels)
            workers = [backend.worker() for _ in range(need)]
            for test in job.tests:
                for i, level in enumerate(self.config.load.levels):
                    if (i or test is not job.tests[0]) and self.config.delay_s:
                        time.sleep(self.config.delay_s)
                    result = self._level(backend, workers, job, model, test, level)
                    out.results.append(self.store(result))
                    self.events.test_done(out.results[-1])
        finally:
            for w in workers:
                w.close()
            backend.close()

    def _request(self, backend: Any, test: BenchTest) -> RunRequest:
        """A fresh random prompt: no prompt cache can serve it (as Runner._request)."""
        seed = self.rng.randrange(1 << 30)
        bos = backend.bos()
        head = [bos] if bos is not None else []
        prompt = head + backend.random_tokens(test.n_prompt - len(head), seed)
        return RunRequest((), tuple(prompt), test.n_gen)

    def _level(self, backend: Any, workers: list[Any], job: Job, model: ResolvedModel,
               test: BenchTest, level: Level) -> StoredResult:
        requests = [self._request(backend, test) for _ in range(level.requests)]
        seed = self.config.seed
        window = run_window(workers[:level.workers], requests, level, seed)
        if window.errors and all(t is None for t in window.traces):
            exc = window.errors[0]
            raise StrataError(f"{level.name}: all {len(requests)} requests failed; the "
                              f"first: {exc}") from exc
        slo = self.config.load.slo
        f = figures(window, requests, slo)
        if level.rate is None and level.concurrency == 1:
            self._c1[(job.model, test)] = f
        metrics = summaries(f.runs)
        total = (f.prompt_tokens + f.output_tokens) / f.window_s
        metrics["combined_tps"] = summarize([total]).to_dict()  # the whole window: n = 1
        metrics["output_tps"] = summarize([f.output_tokens / f.window_s]).to_dict()
        info = dict(backend.info())
        flavour = info.get("server")
        done = [t for t in window.traces if t is not None]
        notes = {n for t in done for n in t.notes}
        info.update(
            stop_reason=f"one window of {level.requests} requests",
            notes=sorted(notes) + level_notes(level, f, flavour,
                                              self._c1.get((job.model, test))),
            tokens={"prompt": sorted({t.n_prompt for t in done}),
                    "generated": sorted({generated(t) for t in done})},
            load=level_info(level, f, slo, seed),
            model={"endpoint": model.endpoint},
            explain_absent="serving load: the figures are the server's, not one model run's")
        return StoredResult(model=job.model, backend=job.backend,
                            test=f"{test.name} {level.name}", n_prompt=test.n_prompt,
                            n_gen=test.n_gen, n_depth=0, load_config=asdict(job.load),
                            metrics=metrics, explain=None, telemetry=None, info=info)
