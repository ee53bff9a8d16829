"""Dispatch: the fastest verified implementation of an op for this host and device, with a
decision trace saying why each implementation was taken or not (docs/architecture.md §7).

Outcomes: "kernel" (a verified implementation wins), "vendor" (torch eager is faster than
every verified one), "fallback" (nothing verified runs here: the torch reference is used,
and that is reported as a fallback, never as a pass).
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from strata.kernels.bench import WRONG_AT_SHAPE
from strata.kernels.capability import HostCaps
from strata.kernels.dialects import get_dialect
from strata.kernels.impl import Implementation
from strata.kernels.plausibility import IMPLAUSIBLE, NOISY_BASELINE
from strata.kernels.registry import EAGER, implementations
from strata.kernels.spec import KernelSpec, get_spec
from strata.store.kernels import latest_bench, latest_verification

KERNEL, VENDOR, FALLBACK = "kernel", "vendor", "fallback"


def unrunnable_reason(impl: Implementation, device: str, caps: HostCaps) -> str | None:
    """Why `impl` cannot serve timed calls on `device` of this host (None: it can)."""
    dialect = get_dialect(impl.dialect)
    missing = impl.requires.check(caps)
    if missing:
        return f"capability missing: {missing}"
    where = dialect.run_device(impl.requires, caps)
    if where != device:
        return f"runs on {where}, not {device}"
    if dialect.untimed_reason(device):
        return f"usable only for correctness here ({dialect.untimed_reason(device)})"
    return None


@dataclass
class TraceEntry:
    impl: str
    verdict: str  # chosen | rejected | baseline
    reason: str

    def to_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


@dataclass
class Decision:
    op: str
    device: str
    outcome: str
    impl: Implementation | None
    speedup: float | None = None
    trace: list[TraceEntry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. the vendor stack's support verdict

    @property
    def chosen(self) -> str:
        return self.impl.name if self.impl else EAGER

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "device": self.device, "outcome": self.outcome,
                "chosen": self.chosen, "speedup_vs_eager": self.speedup,
                "notes": self.notes, "trace": [t.to_dict() for t in self.trace]}


@dataclass(frozen=True)
class Speed:
    """What dispatch uses: the geometric-mean speedup over eager across the counted shapes,
    with its spread (lowest and highest shape), or the problem that disqualifies."""

    geomean: float | None = None
    low: float | None = None
    high: float | None = None
    shapes: int = 0
    excluded: int = 0  # shapes whose baseline stayed noisy
    problem: str | None = None


def _shape_text(shape: dict[str, int] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (shape or {}).items())


def speed_of(rows: list[Any]) -> Speed:
    """Speed from stored benchmark rows (KernelResult): a wrong or implausible figure at any
    shape disqualifies; a noisy-baseline shape does not count."""
    for r in rows:
        for flag in r.data.get("flags", []):
            if flag.startswith(WRONG_AT_SHAPE):
                return Speed(problem=f"wrong result at benchmarked shape "
                             f"{_shape_text(r.shape)}: {r.data.get('note') or flag}")
            if flag.startswith(IMPLAUSIBLE):
                return Speed(problem=f"{flag} (shape {_shape_text(r.shape)})")
    counted = [r for r in rows if not any(f.startswith(NOISY_BASELINE)
                                          for f in r.data.get("flags", []))]
    ups = [u for u in (r.data.get("speedup_eager") for r in counted) if u]
    if not ups:
        return Speed(excluded=len(rows) - len(counted))
    mean = math.exp(sum(math.log(u) for u in ups) / len(ups))
    return Speed(mean, min(ups), max(ups), len(ups), len(rows) - len(counted))


def _speed(conn: sqlite3.Connection, fp: str, impl: Implementation, device: str) -> \
        tuple[float | None, str | None]:
    """(geometric-mean speedup over torch eager across the last benchmark's shapes, problem)."""
    speed = speed_of(latest_bench(conn, fp, impl.op, impl.name, impl.content_hash(), device))
    return speed.geomean, speed.problem


def vendor_notes(caps: HostCaps, device: str) -> list[str]:
    """The probe's support verdict for `device` when the vendor stack cannot drive it."""
    profile = caps.profile
    if profile is None or device == "cpu":
        return []
    notes = []
    for verdict in profile.verdicts:
        if verdict.device == device and verdict.status in ("unsupported", "partial"):
            why = "; ".join(verdict.reasons[:2]) or verdict.status
            notes.append(f"vendor stack: {verdict.status} on {device} ({why})")
    return notes


class Resolver:
    def __init__(self, conn: sqlite3.Connection, fingerprint: str, caps: HostCaps) -> None:
        self.conn, self.fp, self.caps = conn, fingerprint, caps

    def _judge(self, impl: Implementation, device: str) -> tuple[str | None, float | None]:
        """(rejection reason or None, speedup) for one implementation on `device`."""
        unrunnable = unrunnable_reason(impl, device, self.caps)
        if unrunnable:
            return unrunnable, None
        stored = latest_verification(self.conn, self.fp, impl.op, impl.name,
                                     impl.content_hash(), device)
        if stored is None:
            return f"not verified (run: strata kernels verify {impl.op} --impl {impl.name})", \
                None
        if stored.status != "pass":
            failure = stored.data.get("failure") or {}
            return f"failed verification: {failure.get('reason')}: " \
                   f"{failure.get('message', '')}", None
        speed, problem = _speed(self.conn, self.fp, impl, device)
        return problem, speed

    def resolve(self, spec: KernelSpec, device: str) -> Decision:
        decision = Decision(spec.name, device, FALLBACK, None,
                            notes=vendor_notes(self.caps, device))
        accepted: list[tuple[Implementation, float | None]] = []
        for impl in implementations(spec.name, self.conn):
            reason, speed = self._judge(impl, device)
            if reason:
                decision.trace.append(TraceEntry(impl.name, "rejected", reason))
            else:
                accepted.append((impl, speed))
        self._choose(decision, accepted)
        return decision

    @staticmethod
    def _choose(decision: Decision, accepted: list[tuple[Implementation, float | None]]) -> \
            None:
        if not accepted:
            covered = "no verified implementation covers it" if decision.notes else \
                "no verified implementation runs here"
            decision.trace.append(TraceEntry(EAGER, "fallback", f"fallback to the torch "
                                             f"reference: {covered}"))
            return
        timed = sorted((a for a in accepted if a[1] is not None), key=lambda a: -a[1])
        untimed = [a for a in accepted if a[1] is None]
        if (timed and timed[0][1] >= 1.0) or (timed and decision.notes):
            best, speed = timed[0]
            decision.outcome, decision.impl, decision.speedup = KERNEL, best, speed
        elif timed:
            decision.outcome, decision.speedup = VENDOR, 1.0
        elif untimed:  # verified, never benchmarked: usable, speed unknown
            best, speed = untimed[0]
            decision.outcome, decision.impl = KERNEL, best
        for impl, speed in timed:
            if impl is decision.impl:
                text = f"verified, fastest: {speed:.2f}x torch eager"
                if decision.notes:
                    text += " (covers what the vendor stack cannot)"
                decision.trace.append(TraceEntry(impl.name, "chosen", text))
            else:
                decision.trace.append(TraceEntry(impl.name, "rejected",
                                                 f"slower: {speed:.2f}x torch eager"))
        for impl, _ in untimed:
            verdict = "chosen" if impl is decision.impl else "rejected"
            text = "verified, not benchmarked (speed unknown; run strata kernels bench)"
            decision.trace.append(TraceEntry(impl.name, verdict, text if verdict == "chosen"
                                             else "verified, not benchmarked"))
        if decision.outcome == VENDOR:
            decision.trace.append(TraceEntry(EAGER, "chosen", "torch eager is faster than "
                                             "every verified implementation here"))


def resolve(op: str, device: str, conn: sqlite3.Connection, fingerprint: str,
            caps: HostCaps) -> Decision:
    return Resolver(conn, fingerprint, caps).resolve(get_spec(op), device)
