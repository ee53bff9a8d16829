"""The decode speed ratio of two models from stored `strata bench` results on this host.

Only like-for-like pairs count: the same backend, the same pure decode test (tg<M>, no
depth) and the same load settings, the latest result of each model; the quality run's own
backends are preferred, in order. A ratio from a busy host or from fewer than MIN_SAMPLES
repetitions a side is kept but marked: it says less than its two decimals suggest.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, dataclass
from typing import Any

from strata.store.runs import StoredResult, query_results

Key = tuple[str, str, str]  # backend, test, load config (JSON)
MIN_SAMPLES = 3  # repetitions a side below which a ratio is marked


@dataclass(frozen=True)
class Decode:
    tps: float
    n: int
    busy: bool  # other processes used the CPU during the test (HostLoadMonitor)


@dataclass(frozen=True)
class SpeedRatio:
    ratio: float  # decode t/s of MODEL / decode t/s of REF
    backend: str
    test: str
    model_tps: float
    ref_tps: float
    busy: bool = False  # either side measured on a busy host
    n: int = 0  # the fewer repetitions of the two sides

    @property
    def caveat(self) -> str | None:
        """Why the ratio is weak, in words; None when both sides are sound."""
        why = [w for w, bad in (("a busy host", self.busy),
                                (f"{self.n} repetition(s)", self.n < MIN_SAMPLES)) if bad]
        return " and ".join(why) or None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "caveat": self.caveat}


def _decode_tps(r: StoredResult) -> float | None:
    if r.n_prompt or r.n_depth or not r.n_gen:
        return None  # pp, pp+tg and @d tests measure something else
    value = r.metrics.get("decode_tps", {}).get("mean")
    return float(value) if value else None


def latest_decode(conn: sqlite3.Connection, fingerprint: str, model: str) -> dict[Key, Decode]:
    from strata.bench.records import record

    out: dict[Key, Decode] = {}
    for r in query_results(conn, fingerprint=fingerprint, model=model):  # oldest first
        tps = _decode_tps(r)
        if tps is not None:
            rec = record(r)
            out[(r.backend, r.test, json.dumps(r.load_config, sort_keys=True))] = Decode(
                tps, int(rec.get("n") or 0), bool(rec.get("host_busy")))
    return out


def decode_speed_ratio(conn: sqlite3.Connection, fingerprint: str, model: str, ref: str,
                       prefer: list[str]) -> SpeedRatio | None:
    """None when the DB lacks a matching pair (then: run strata bench on both)."""
    mine, theirs = latest_decode(conn, fingerprint, model), latest_decode(conn, fingerprint, ref)
    common = [k for k in mine if k in theirs]
    if not common:
        return None
    rank = {b: i for i, b in enumerate(prefer)}
    key = min(common, key=lambda k: (rank.get(k[0], len(rank)), k))  # preferred backend
    a, b = mine[key], theirs[key]
    return SpeedRatio(a.tps / b.tps, key[0], key[1], a.tps, b.tps, a.busy or b.busy,
                      min(a.n, b.n))
