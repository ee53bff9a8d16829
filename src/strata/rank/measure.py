"""The figures a candidate needs for its profiles: reused from the DB when this host, this
software and this configuration already measured them; measured by `strata bench` when
missing; predicted (roofline x η, strata fit's rule) when they cannot be measured here."""

from __future__ import annotations

import sqlite3
from dataclasses import asdict, dataclass
from typing import Any

from strata import __version__
from strata.backends.base import LoadConfig
from strata.bench.scenario import BenchTest
from strata.fit.predict import EtaHistory, predict
from strata.measure.roofline import Roofline
from strata.rank.candidates import Candidate
from strata.store.runs import StoredResult, select_results

REUSED, MEASURED, PREDICTED = "reused", "measured", "predicted"
LOAD_S = 10.0  # loading a model and the sweep's own overhead, per candidate


@dataclass(frozen=True)
class TestFigure:
    """One bench test of one candidate: its t/s (prefill for pp, decode for tg)."""

    test: BenchTest
    ts: float
    basis: str  # REUSED | MEASURED | PREDICTED
    ttft_ms: float | None = None  # the backend's measured TTFT, where it has one
    result_id: int | None = None
    busy: bool = False  # measured while other processes kept the host busy

    def to_dict(self) -> dict[str, Any]:
        return {"test": self.test.name, "avg_ts": self.ts, "basis": self.basis,
                "ttft_ms": self.ttft_ms, "result_id": self.result_id, "host_busy": self.busy}


def _same_load(stored: dict[str, Any], load: LoadConfig) -> bool:
    """A stored load config equals `load`: fields added since it was stored take their
    defaults (store.runs' rule), and n_ctx (sized per sweep) does not change the speed."""
    want = {k: v for k, v in asdict(load).items() if k != "n_ctx"}
    have = {**{k: v for k, v in asdict(LoadConfig()).items() if k != "n_ctx"},
            **{k: v for k, v in stored.items() if k in want}}
    return have == want


def _busy(r: StoredResult) -> bool:
    return bool(((r.telemetry or {}).get("host_load") or {}).get("busy"))


def reusable(conn: sqlite3.Connection, fingerprint: str, c: Candidate,
             tests: list[BenchTest]) -> dict[BenchTest, TestFigure]:
    """The latest stored result for each test whose host fingerprint (hardware and the
    software stack), strata version, model, backend and load config all match: one measured
    on a quiet host if there is one, else one flagged busy (its figure says so)."""
    rows = select_results(conn, "runs.fingerprint = ? AND runs.strata = ? AND results.model = ?"
                          " AND results.backend = ?", [fingerprint, __version__, c.ref,
                                                       c.backend])
    wanted = {(t.n_prompt, t.n_gen, t.depth): t for t in tests}
    quiet: dict[BenchTest, TestFigure] = {}
    busy: dict[BenchTest, TestFigure] = {}
    for r in rows:  # oldest first: the latest match wins
        test = wanted.get((r.n_prompt, r.n_gen, r.n_depth))
        if test is None or not _same_load(r.load_config, c.load):
            continue
        figure = _figure(test, r.metrics, REUSED, r.id, _busy(r))
        if figure is not None:
            (busy if figure.busy else quiet)[test] = figure
    return {**busy, **quiet}


def _figure(test: BenchTest, metrics: dict[str, Any], basis: str, result_id: int | None,
            busy: bool) -> TestFigure | None:
    ts = (metrics.get(test.primary_metric) or {}).get("mean")
    if not ts:
        return None
    ttft = (metrics.get("ttft_s") or {}).get("mean")
    return TestFigure(test, float(ts), basis, ttft * 1e3 if ttft is not None else None,
                      result_id, busy)


def from_records(records: list[dict[str, Any]], tests: list[BenchTest]) -> dict[
        BenchTest, TestFigure]:
    """Figures from what `strata bench` just measured (its output records)."""
    wanted = {(t.n_prompt, t.n_gen, t.depth): t for t in tests}
    out: dict[BenchTest, TestFigure] = {}
    for rec in records:
        test = wanted.get((rec["n_prompt"], rec["n_gen"], rec["n_depth"]))
        if test is not None and rec.get("avg_ts"):
            out[test] = TestFigure(test, float(rec["avg_ts"]), MEASURED, rec.get("ttft_ms"),
                                   None, bool(rec.get("host_busy")))
    return out


def predicted(c: Candidate, roof: Roofline | None, history: EtaHistory,
              tests: list[BenchTest], cache_bytes: int | None) -> dict[BenchTest, TestFigure]:
    """Roofline ceiling x η for each test (strata fit's prediction), on the device the
    candidate runs on — or the CPU for one that fits nowhere ("how fast if it did"). None
    for a model whose weights sit in the CPU's last-level cache: the DRAM roofline does not
    bound it, so no honest prediction exists (it is cheap to measure instead)."""
    spec = c.model.spec_for("gguf" if c.backend in ("llamacpp", "lab") else "hf")
    device = roof.device(c.device or "cpu") if roof is not None else None
    if spec is None or device is None:
        return {}
    if device.device == "cpu" and cache_bytes and spec.streamed_weight_bytes() < cache_bytes:
        return {}
    by_name = {t.name: t for t in tests}
    preds = predict(spec, device, c.load.kv_type, None, history, 0, tests)
    return {by_name[p.test]: TestFigure(by_name[p.test], p.tps, PREDICTED) for p in preds
            if p.tps > 0}


def estimate_s(missing: list[BenchTest], guesses: dict[BenchTest, TestFigure],
               reps: int) -> float | None:
    """Seconds the missing tests should take (warm-up + reps each; the context and prompt at
    the slowest predicted prefill rate, the generation at the slowest decode rate); None when
    a rate is not predicted (an endpoint)."""
    pp = [g.ts for t, g in guesses.items() if t.kind == "pp"]
    tg = [g.ts for t, g in guesses.items() if t.kind == "tg"]
    if not missing:
        return 0.0
    if not pp or not tg:
        return None
    per_rep = sum((t.depth + t.n_prompt) / min(pp) + t.n_gen / min(tg) for t in missing)
    return LOAD_S + (reps + 1) * per_rep
