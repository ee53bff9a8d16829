"""Predicted prefill and decode t/s: this host's measured roofline ceiling x η.

The ceilings come from strata.bench.explain (the same bytes and FLOPs per token that explain
every bench result); η is the median of this host's own past bench results for the backend on
that device, else a stated prior. Every figure is a prediction and carries its basis.
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
class Eta:
    value: float
    low: float
    high: float
    n: int  # past results it comes from; 0 = the prior
    basis: str


@dataclass
class EtaHistory:
    """η of this host's stored bench results for one backend, per (device, phase)."""

    backend: str
    values: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    cache_resident: dict[str, int] = field(default_factory=dict)  # device -> results left out

    @classmethod
    def from_results(cls, results: list[StoredResult], backend: str,
                     cache_bytes: int | None) -> EtaHistory:
        hist = cls(backend)
        for r in results:
            ex = r.explain or {}
            device = ex.get("device")
            if r.backend != backend or not device:
                continue
            for phase, key in PHASE_KEY.items():
                value = ex.get(key)
                if value is None:
                    continue
                if phase == "decode" and _cache_resident(ex, device, cache_bytes):
                    # the bytes read per token sat in the CPU's last-level cache: that η
                    # measures per-token overhead, not DRAM efficiency
                    hist.cache_resident[device] = hist.cache_resident.get(device, 0) + 1
                    continue
                hist.values.setdefault((device, phase), []).append(float(value))
        return hist

    @classmethod
    def from_db(cls, conn: sqlite3.Connection, fingerprint: str, backend: str,
                cache_bytes: int | None) -> EtaHistory:
        results = query_results(conn, fingerprint=fingerprint, backend=backend)
        return cls.from_results(results, backend, cache_bytes)

    def eta(self, device: str, phase: str) -> Eta:
        past = self.values.get((device, phase), [])
        if not past:
            return Eta(PRIOR_ETA, PRIOR_LOW, PRIOR_HIGH, 0,
                       f"prior η {PRIOR_ETA} (spread {PRIOR_LOW}-{PRIOR_HIGH}): no past "
                       f"{self.backend} {phase} results on {device} of this host")
        where = f"past {self.backend} {phase} result{'s' if len(past) > 1 else ''} on {device}"
        if len(past) == 1:
            return Eta(past[0], past[0], past[0], 1, f"η of 1 {where} of this host (one result: "
                                                     "no spread known)")
        return Eta(statistics.median(past), min(past), max(past), len(past),
                   f"median η of {len(past)} {where} of this host "
                   f"(range {min(past):.2f}-{max(past):.2f})")


def _cache_resident(ex: dict[str, Any], device: str, cache_bytes: int | None) -> bool:
    per_token = ex.get("bytes_per_token")
    return bool(device == "cpu" and cache_bytes and per_token and per_token < cache_bytes)


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
        return {**asdict(self), "kind": "prediction"}


def tests_for(ctx: int) -> list[BenchTest]:
    """What to predict: bench's default pp and tg, and tg near a full context."""
    n_gen = min(DECODE_TOKENS, ctx)
    tests = [BenchTest(min(PREFILL_TOKENS, ctx), 0), BenchTest(0, n_gen)]
    depth = ctx - n_gen
    if depth > PREFILL_TOKENS:
        tests.append(BenchTest(0, n_gen, depth))
    return tests


def predict(spec: ModelSpec, roof: DeviceRoofline, kv_type: str, runtime_dtype: str | None,
            history: EtaHistory, ctx: int) -> list[Prediction]:
    """Ceiling (explain's, from the measured roofline) x η, for each predicted test."""
    out = []
    for test in tests_for(ctx):
        ex = explain(spec, test, roof, kv_type, runtime_dtype, achieved={})
        phase = "prefill" if test.kind == "pp" else "decode"
        ceiling = ex.prefill_ceiling_tps if phase == "prefill" else ex.decode_ceiling_tps
        if not ceiling:
            continue  # the roofline lacks that figure: absent, never guessed
        eta = history.eta(roof.device, phase)
        out.append(Prediction(roof.device, test.name, phase, ceiling, eta, ceiling * eta.value,
                              ceiling * eta.low, ceiling * eta.high))
    return out
