"""Dispatch: the fastest verified implementation of an op for this host and device, with a
decision trace saying why each implementation was taken or not (docs/architecture.md §7).

Outcomes: "kernel" (a verified implementation wins), "vendor" (torch eager is faster than
every verified one), "fallback" (nothing verified runs here: the torch reference is used,
and that is reported as a fallback, never as a pass).

External kernels (`strata kernels add`, or a model's) are judged harder than built-ins,
which ship with strata: one serves only once benchmarked here (a verdict alone never
outranks the vendor path), only at shapes it was proven at (every named dim of a call
within the [min, max] of the shapes it was verified and benchmarked at, margin 0), and runs
confined (in its own process, over shared memory) unless the user trusted its exact bytes
with `strata kernels trust`.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from strata.kernels.bench import WRONG_AT_SHAPE
from strata.kernels.capability import HostCaps, KernelHost
from strata.kernels.dialects import get_dialect
from strata.kernels.impl import Implementation
from strata.kernels.plausibility import IMPLAUSIBLE, NOISY_BASELINE
from strata.kernels.registry import EAGER, implementations
from strata.kernels.spec import KernelSpec, Shape, get_spec
from strata.store.kernels import latest_bench, latest_verification, trust_of, verified_shapes

KERNEL, VENDOR, FALLBACK = "kernel", "vendor", "fallback"
NOT_BENCHMARKED = "verified, not benchmarked"
# The serving rule for external kernels, said wherever a decision is shown.
SERVE_RULE = "margin 0: each dim of a call within the [min, max] it was verified and " \
    "benchmarked at"
OUT_OF_RANGE = "an external kernel serves only within its verified ranges"
CONFINED_NOTE = "runs confined: shared memory, its own process"
Coverage = dict[str, tuple[int, int]]


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


def coverage_of(shapes: list[Shape]) -> Coverage:
    """Per dim, the [min, max] over `shapes`: the box an external kernel may serve in."""
    box: Coverage = {}
    for shape in shapes:
        for dim, value in shape.items():
            low, high = box.get(dim, (value, value))
            box[dim] = (min(low, value), max(high, value))
    return box


def coverage_text(coverage: Coverage) -> str:
    return ", ".join(f"{dim} {low}..{high}" for dim, (low, high) in coverage.items()) or \
        "no shape"


def uncovered_reason(coverage: Coverage | None, shape: Shape) -> str | None:
    """Why a call at `shape` is outside `coverage` (None: inside, or not range-limited).
    Margin 0: each dim the call names must lie within [min, max] of the proven shapes; a
    dim never proven at all is outside too."""
    if coverage is None:
        return None
    for dim, value in shape.items():
        if dim not in coverage:
            return f"{dim}={value} was never verified (verified: {coverage_text(coverage)})"
        low, high = coverage[dim]
        if not low <= value <= high:
            return f"{dim}={value} is outside the verified range {low}..{high}"
    return None


@dataclass
class Decision:
    """What serves `op` on `device`, and why. For an external kernel, `coverage` is the box
    of shapes it may serve (every dim of a call within the [min, max] of the shapes it was
    verified and benchmarked at, margin 0: check each call with `uncovered`) and `confined`
    says it must run in its own process (not trusted for its current bytes). Built-ins ship
    with strata: not range-limited (coverage None) and never confined."""

    op: str
    device: str
    outcome: str
    impl: Implementation | None
    speedup: float | None = None
    trace: list[TraceEntry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. the vendor stack's support verdict
    coverage: Coverage | None = None
    confined: bool = False

    @property
    def chosen(self) -> str:
        return self.impl.name if self.impl else EAGER

    def uncovered(self, shape: Shape) -> str | None:
        """One line on why the chosen kernel may not serve a call at `shape` (None: it
        may). A caller outside the range uses the vendor path or resolves with `shape`."""
        return uncovered_reason(self.coverage, shape)

    def to_dict(self) -> dict[str, Any]:
        coverage = None if self.coverage is None else \
            {dim: list(box) for dim, box in self.coverage.items()}
        return {"op": self.op, "device": self.device, "outcome": self.outcome,
                "chosen": self.chosen, "speedup_vs_eager": self.speedup,
                "coverage": coverage, "confined": self.confined,
                "notes": self.notes, "trace": [t.to_dict() for t in self.trace]}


@dataclass
class Candidate:
    """An implementation dispatch may choose: verified here, not disqualified."""

    impl: Implementation
    speed: float | None  # geomean speedup over eager; None: not benchmarked
    coverage: Coverage | None = None  # external kernels only
    trusted_at: str | None = None  # an external kernel the user trusted, since when
    basis: str = ""  # what `speed` was measured over, when not every benchmarked shape

    @property
    def confined(self) -> bool:
        return self.impl.origin == "external" and self.trusted_at is None

    def serving(self) -> str:
        """Where and at which shapes it serves; empty for a built-in."""
        if self.impl.origin != "external":
            return ""
        where = CONFINED_NOTE if self.confined else \
            f"trusted in-process since {(self.trusted_at or '')[:10]}"
        return f"; serves {coverage_text(self.coverage or {})} only ({SERVE_RULE}) ({where})"


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


def speed_at(rows: list[Any], shape: Shape) -> float | None:
    """The speedup over eager benchmarked at exactly `shape` (None: not benchmarked there,
    or only against a noisy baseline)."""
    for r in rows:
        if r.shape == shape and not any(f.startswith(NOISY_BASELINE)
                                        for f in r.data.get("flags", [])):
            return r.data.get("speedup_eager") or None
    return None


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

    def _judge(self, impl: Implementation, device: str, shape: Shape | None) -> \
            tuple[str | None, Candidate | None]:
        """(rejection reason, None) or (None, candidate) for one implementation on
        `device` (for calls at `shape`, when given). The latest verification decides pass
        or fail: a later failing one rejects whatever passed before."""
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
        rows = latest_bench(self.conn, self.fp, impl.op, impl.name, impl.content_hash(),
                            device)
        speed = speed_of(rows)
        if speed.problem:
            return speed.problem, None
        if impl.origin == "external":
            return self._external(impl, device, speed, shape)
        return None, _per_shape(Candidate(impl, speed.geomean), rows, shape)

    def _external(self, impl: Implementation, device: str, speed: Speed,
                  shape: Shape | None) -> tuple[str | None, Candidate | None]:
        """An external kernel, verified: it serves only once benchmarked (a verdict alone
        never outranks the vendor path), within the shapes it was proven at."""
        if speed.geomean is None:
            if speed.excluded:
                return f"benchmarked, but the torch baseline stayed noisy at every shape: an " \
                       f"external kernel serves only after strata kernels bench {impl.op} " \
                       "times it against a steady baseline", None
            return f"{NOT_BENCHMARKED}: an external kernel serves only after strata kernels " \
                   f"bench {impl.op}", None
        proven = verified_shapes(self.conn, self.fp, impl.op, impl.name, impl.content_hash(),
                                 device, get_spec(impl.op).shapes["verify"],
                                 (WRONG_AT_SHAPE, IMPLAUSIBLE))
        trust = trust_of(self.conn, impl)
        candidate = Candidate(impl, speed.geomean, coverage_of(proven),
                              trust.trusted_at if trust else None)
        outside = uncovered_reason(candidate.coverage, shape) if shape else None
        if outside:
            return f"{outside}: {OUT_OF_RANGE} ({SERVE_RULE})", None
        rows = latest_bench(self.conn, self.fp, impl.op, impl.name, impl.content_hash(),
                            device)
        return None, _per_shape(candidate, rows, shape)

    def resolve(self, spec: KernelSpec, device: str, shape: Shape | None = None) -> Decision:
        """The decision for `spec` on `device`; with `shape`, for calls at that shape only
        (an external kernel that was not proven there is passed over)."""
        decision = Decision(spec.name, device, FALLBACK, None,
                            notes=vendor_notes(self.caps, device))
        accepted: list[Candidate] = []
        for impl in implementations(spec.name, self.conn):
            reason, candidate = self._judge(impl, device, shape)
            if candidate is None:
                decision.trace.append(TraceEntry(impl.name, "rejected", str(reason)))
            else:
                accepted.append(candidate)
        self._choose(decision, accepted)
        return decision

    @staticmethod
    def _choose(decision: Decision, accepted: list[Candidate]) -> None:
        if not accepted:
            decision.trace.append(TraceEntry(EAGER, "fallback", _fallback_text(decision)))
            return
        timed = sorted((c for c in accepted if c.speed is not None),
                       key=lambda c: -(c.speed or 0.0))
        untimed = [c for c in accepted if c.speed is None]  # built-ins only
        best = _pick(decision, timed, untimed)
        if best is not None:
            decision.impl, decision.coverage = best.impl, best.coverage
            decision.confined = best.confined
        _trace_accepted(decision, timed, untimed)


def _per_shape(c: Candidate, rows: list[Any], shape: Shape | None) -> Candidate:
    """For an op dispatched per call shape (spec.per_shape), the speed benchmarked at that
    very shape when there is one: a 7x7 stem and a 1x1 GEMM favour different kernels, and a
    geometric mean over both would pick one kernel for both."""
    if shape is None or not get_spec(c.impl.op).per_shape:
        return c
    at = speed_at(rows, shape)
    if at is None:
        c.basis = " (geomean: not benchmarked at this shape)" if c.speed is not None else ""
        return c
    c.speed, c.basis = at, f" at {_shape_text(shape)} (benchmarked here)"
    return c


def _fallback_text(decision: Decision) -> str:
    covered = "no verified implementation covers it" if decision.notes else \
        "no verified implementation runs here"
    if any(OUT_OF_RANGE in e.reason for e in decision.trace):
        covered += " at this shape"
    if any(e.reason.startswith(NOT_BENCHMARKED) for e in decision.trace):
        covered += " (a verified external kernel serves once benchmarked)"
    return f"fallback to the torch reference: {covered}"


def _pick(decision: Decision, timed: list[Candidate], untimed: list[Candidate]) -> \
        Candidate | None:
    """Set the outcome: the fastest timed candidate when it beats eager (or the vendor
    stack cannot drive the device), else eager; a verified, never benchmarked built-in
    only when nothing was timed (speed unknown, still better than the reference): the most
    specialised one (Implementation.specialisation)."""
    if timed and ((timed[0].speed or 0.0) >= 1.0 or decision.notes):
        decision.outcome, decision.speedup = KERNEL, timed[0].speed
        return timed[0]
    if timed:
        decision.outcome, decision.speedup = VENDOR, 1.0
        return None
    decision.outcome = KERNEL
    return max(untimed, key=lambda c: c.impl.specialisation)


def _trace_accepted(decision: Decision, timed: list[Candidate],
                    untimed: list[Candidate]) -> None:
    for c in timed:
        if c.impl is decision.impl:
            text = f"verified, fastest: {c.speed:.2f}x torch eager{c.basis}"
            if decision.notes:
                text += " (covers what the vendor stack cannot)"
            decision.trace.append(TraceEntry(c.impl.name, "chosen", text + c.serving()))
        else:
            decision.trace.append(TraceEntry(c.impl.name, "rejected",
                                             f"slower: {c.speed:.2f}x torch eager{c.basis}"))
    for c in untimed:
        chosen = c.impl is decision.impl
        text = f"{NOT_BENCHMARKED} (speed unknown; run strata kernels bench)" if chosen \
            else NOT_BENCHMARKED
        decision.trace.append(TraceEntry(c.impl.name, "chosen" if chosen else "rejected",
                                         text))
    if decision.outcome == VENDOR:
        decision.trace.append(TraceEntry(EAGER, "chosen", "torch eager is faster than "
                                         "every verified implementation here"))


def resolve(op: str, device: str, host: KernelHost, shape: Shape | None = None) -> Decision:
    """Dispatch `op` on `device` of `host`; with `shape`, for calls at that shape (an
    external kernel serves only where it was verified and benchmarked)."""
    return Resolver(host.conn, host.fingerprint, host.caps).resolve(get_spec(op), device, shape)
