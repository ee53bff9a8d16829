"""Predicted prefill and decode t/s: this host's measured roofline ceiling x η.

The ceilings come from strata.bench.explain (the same bytes and FLOPs per token that explain
every bench result); η is the median of this host's own past bench results for the backend on
that device, else a stated prior. Results that cannot inform another model's speed are left
out, and counted: cache-resident ones (per-token overhead, not the roofline) and ones
measured while other processes kept the host busy. Every figure is a prediction and carries
its basis: the results it rests on (Eta.sources) and their spread.
"""

from __future__ import annotations

import sqlite3
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from strata.bench.explain import explain
from strata.bench.scenario import BenchTest
from strata.measure.roofline import DeviceRoofline
from strata.models.spec import ModelSpec
from strata.store.runs import StoredResult, query_results

PRIOR_ETA, PRIOR_LOW, PRIOR_HIGH = 0.7, 0.5, 0.9
PHASE_KEY = {"prefill": "prefill_eta", "decode": "decode_eta"}
PREFILL_TOKENS, DECODE_TOKENS = 512, 128  # bench's defaults (-p 512 -n 128)


@dataclass(frozen=True)
class EtaSource:
    """One stored bench result an η rests on."""

    result_id: int
    run_id: int
    model: str
    test: str
    eta: float


@dataclass(frozen=True)
class Eta:
    value: float
    low: float
    high: float
    n: int  # past results it comes from; 0 = the prior
    basis: str
    sources: tuple[EtaSource, ...] = ()  # the results themselves (empty for the prior)
    left_out: tuple[str, ...] = ()  # "2 cache-resident", "1 on a busy host"

    @property
    def spread(self) -> float | None:
        """(high - low) / value across the sources; None with fewer than two."""
        return (self.high - self.low) / self.value if self.n >= 2 and self.value else None


# Why a past result cannot inform a prediction for another model on this host.
CACHE_RESIDENT = "cache-resident"
BUSY_HOST = "on a busy host"


def _exclusion(r: StoredResult, ex: dict[str, Any], device: str,
               cache_bytes: int | None) -> str | None:
    """A result whose η says nothing about a model that streams from DRAM on a quiet host:
    - cache-resident: the bytes read per token sat in the CPU's last-level cache, so η
      measured per-token overhead — for decode and prefill alike, a toy model's tiny
      matmuls say nothing about an 8B model's;
    - busy host: other processes used the CPUs during the test (HostLoadMonitor)."""
    if _cache_resident(ex, device, cache_bytes):
        return CACHE_RESIDENT
    if ((r.telemetry or {}).get("host_load") or {}).get("busy"):
        return BUSY_HOST
    return None


def _cache_resident(ex: dict[str, Any], device: str, cache_bytes: int | None) -> bool:
    if ex.get("cache_resident"):  # explain's own flag, where the result stored it
        return True
    per_token = ex.get("bytes_per_token")
    return bool(device == "cpu" and cache_bytes and per_token and per_token < cache_bytes)


@dataclass
class EtaHistory:
    """η of this host's stored bench results for one backend, per (device, phase)."""

    backend: str
    values: dict[tuple[str, str], list[EtaSource]] = field(default_factory=dict)
    # (device, phase) -> reason -> results left out
    excluded: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)

    @property
    def cache_resident(self) -> dict[str, int]:
        """device -> decode results left out as cache-resident."""
        return {d: reasons[CACHE_RESIDENT] for (d, phase), reasons in self.excluded.items()
                if phase == "decode" and reasons.get(CACHE_RESIDENT)}

    @classmethod
    def from_results(cls, results: list[StoredResult], backend: str,
                     cache_bytes: int | None) -> EtaHistory:
        hist = cls(backend)
        for r in results:
            ex = r.explain or {}
            device = ex.get("device")
            if r.backend != backend or not device:
                continue
            why = _exclusion(r, ex, device, cache_bytes)
            for phase, key in PHASE_KEY.items():
                value = ex.get(key)
                if value is None:
                    continue
                if why:
                    reasons = hist.excluded.setdefault((device, phase), {})
                    reasons[why] = reasons.get(why, 0) + 1
                    continue
                hist.values.setdefault((device, phase), []).append(
                    EtaSource(r.id, r.run_id, r.model, r.test, float(value)))
        return hist

    @classmethod
    def from_db(cls, conn: sqlite3.Connection, fingerprint: str, backend: str,
                cache_bytes: int | None) -> EtaHistory:
        results = query_results(conn, fingerprint=fingerprint, backend=backend)
        return cls.from_results(results, backend, cache_bytes)

    def eta(self, device: str, phase: str) -> Eta:
        sources = tuple(self.values.get((device, phase), []))
        left_out = tuple(f"{n} {why}" for why, n in
                         self.excluded.get((device, phase), {}).items())
        skipped = f"; left out: {', '.join(left_out)}" if left_out else ""
        if not sources:
            return Eta(PRIOR_ETA, PRIOR_LOW, PRIOR_HIGH, 0,
                       f"prior η {PRIOR_ETA} (spread {PRIOR_LOW}-{PRIOR_HIGH}): no past "
                       f"{self.backend} {phase} results on {device} of this host that can "
                       f"inform it{skipped}", left_out=left_out)
        past = [s.eta for s in sources]
        where = f"past {self.backend} {phase} result{'s' if len(past) > 1 else ''} on {device}"
        if len(past) == 1:
            return Eta(past[0], past[0], past[0], 1,
                       f"η of 1 {where} of this host (one result: no spread known){skipped}",
                       sources, left_out)
        return Eta(statistics.median(past), min(past), max(past), len(past),
                   f"median η of {len(past)} {where} of this host "
                   f"(range {min(past):.2f}-{max(past):.2f}){skipped}", sources, left_out)


@dataclass
class Prediction:
    device: str
    test: str  # llama-bench name: "pp512", "tg128", "tg128 @ d3968"
    phase: str  # "prefill" or "decode"
    ceiling_tps: float
    eta: Eta
    tps: float
    low_tps: float
    high_tps: float

    def to_dict(self) -> dict[str, Any]:
        out = {**asdict(self), "kind": "prediction"}
        out["eta"]["spread"] = self.eta.spread
        return out

    def to_json(self) -> dict[str, Any]:
        """The output vocabulary (docs/output.md): t/s as *_ts, η a number, its basis and
        the results it rests on beside it as eta_*."""
        e = self.eta
        return {"device": self.device, "test": self.test, "phase": self.phase,
                "ceiling_ts": self.ceiling_tps, "eta": e.value, "predicted_ts": self.tps,
                "predicted_low_ts": self.low_tps, "predicted_high_ts": self.high_tps,
                "eta_low": e.low, "eta_high": e.high, "eta_n": e.n, "eta_spread": e.spread,
                "eta_basis": e.basis,
                "eta_sources": [{"result_id": s.result_id, "run_id": s.run_id,
                                 "model_filename": s.model, "test": s.test, "eta": s.eta}
                                for s in e.sources],
                "eta_left_out": list(e.left_out)}


def tests_for(ctx: int) -> list[BenchTest]:
    """What to predict: bench's default pp and tg, and tg near a full context."""
    n_gen = min(DECODE_TOKENS, ctx)
    tests = [BenchTest(min(PREFILL_TOKENS, ctx), 0), BenchTest(0, n_gen)]
    depth = ctx - n_gen
    if depth > PREFILL_TOKENS:
        tests.append(BenchTest(0, n_gen, depth))
    return tests


def predict(spec: ModelSpec, roof: DeviceRoofline, kv_type: str, runtime_dtype: str | None,
            history: EtaHistory, ctx: int,
            tests: list[BenchTest] | None = None) -> list[Prediction]:
    """Ceiling (explain's, from the measured roofline) x η, for each predicted test: `tests`
    (rank's profiles), else bench's defaults for a context of `ctx` (fit)."""
    out = []
    for test in tests if tests is not None else tests_for(ctx):
        if test.kind == "pg":
            continue  # a pp+tg mix has no single phase to predict
        ex = explain(spec, test, roof, kv_type, runtime_dtype, achieved={})
        phase = "prefill" if test.kind == "pp" else "decode"
        ceiling = ex.prefill_ceiling_tps if phase == "prefill" else ex.decode_ceiling_tps
        if not ceiling:
            continue  # the roofline lacks that figure: absent, never guessed
        eta = history.eta(roof.device, phase)
        out.append(Prediction(roof.device, test.name, phase, ceiling, eta, ceiling * eta.value,
                              ceiling * eta.low, ceiling * eta.high))
    return out
