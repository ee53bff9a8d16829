"""How long a member takes per decoded token for a share of a model: its measured decoder
layer (strata.ring.control.layer_time) when it timed one, else bytes read / (bandwidth x η).
strata.ring.plan.partition searches with these; see its docstring for the rules."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from strata.fit.predict import PRIOR_ETA
from strata.ring.plan.costs import LayerCosts
from strata.ring.plan.members import Member
from strata.ring.plan.types import LayerTime

SAME_SPEED = 0.15  # measured layer times this close (relative) are one speed: noise


@dataclass(frozen=True)
class Timing:
    """How long one member takes per decoded token for any share of the model."""

    cum: tuple[float, ...]  # seconds for blocks [0, b), b = 0..n
    embed_s: float  # the first stage's embedding row (and small non-block tensors)
    head_s: float  # the last stage's norm + head
    source: str  # "measured" | "estimated"
    predicted: bool  # False: no bandwidth and no measurement (a stand-in guides the search)
    layer_ms: float | None  # the measured time per layer, if any

    def stage_s(self, first: int, last: int, is_first: bool, is_last: bool) -> float:
        return (self.cum[last] - self.cum[first] + (self.embed_s if is_first else 0.0)
                + (self.head_s if is_last else 0.0))


def eta(m: Member) -> float:
    return m.decode_eta if m.decode_eta is not None else PRIOR_ETA


def _speeds(members: Sequence[Member]) -> dict[str, float]:
    """Effective bytes/s of each member (bandwidth x η). A member with no measured bandwidth
    is searched as if it were no faster than the slowest measured one (its time is then not
    predicted; the plan says so); with none measured, all alike."""
    known = [m.bandwidth_Bps * eta(m) for m in members if m.bandwidth_Bps]
    stand_in = min(known) if known else 1.0
    return {m.id: m.bandwidth_Bps * eta(m) if m.bandwidth_Bps else stand_in for m in members}


def settle(measured: Mapping[str, LayerTime]) -> dict[str, LayerTime]:
    """Measured times within SAME_SPEED of each other as one speed (their median): a timing
    varies by that much between runs on a busy host, and a plan must not reorder members,
    move the head or re-plan a running model over noise (members on one machine tie, and
    ties resolve by id). Groups form in rising order of layer time."""
    out: dict[str, LayerTime] = {}
    ranked = sorted(measured.items(), key=lambda kv: (kv[1].layer_s, kv[0]))
    while ranked:
        low = ranked[0][1].layer_s
        group = [kv for kv in ranked if kv[1].layer_s <= low * (1 + SAME_SPEED)]
        ranked = ranked[len(group):]
        layer_s = statistics.median(t.layer_s for _, t in group)
        heads = [t.head_s for _, t in group if t.head_s is not None]
        head_s = statistics.median(heads) if heads else None
        for mid, t in group:
            out[mid] = replace(t, layer_s=layer_s,
                               head_s=head_s if t.head_s is not None else None)
    return out


def _timed_speed(costs: LayerCosts, ctx: int, timed: LayerTime) -> float:
    """Bytes/s a timed layer read: its weights and its KV cache at the timed depth."""
    n = max(1, costs.n)
    kv = sum(costs.kv) / n
    weights = sum(costs.read) / n - kv
    return (weights + kv * min(1.0, timed.depth / max(ctx, 1))) / max(timed.layer_s, 1e-9)


def timings_of(members: Sequence[Member], costs: LayerCosts, ctx: int,
             measured: Mapping[str, LayerTime]) -> dict[str, Timing]:
    speeds = _speeds(members)
    measured = settle(measured)
    out = {}
    for m in members:
        s, timed = speeds[m.id], measured.get(m.id)
        if timed is None:
            cum = tuple(r / s for r in itertools.accumulate(costs.read, initial=0.0))
            out[m.id] = Timing(cum, costs.embed_read / s, costs.head_read / s, "estimated",
                                bool(m.bandwidth_Bps), None)
            continue
        # The timed token read its layer's KV cache at `depth` positions; a token at ctx
        # reads the rest too, at this member's memory speed (the slowest measured member's
        # where it has none) — or, where no member measured one, at the speed its timed
        # layer read its own bytes (not _speeds' 1 byte/s stand-in: a 7,424,001 ms token)
        beyond = max(0.0, 1.0 - timed.depth / ctx)
        if not any(x.bandwidth_Bps for x in members):
            s = _timed_speed(costs, ctx, timed)
        per_block = [timed.layer_s + kv * beyond / s for kv in costs.kv]
        head_s = timed.head_s if timed.head_s is not None else costs.head_read / s
        out[m.id] = Timing(tuple(itertools.accumulate(per_block, initial=0.0)),
                            costs.embed_read / s, head_s, "measured", True,
                            timed.layer_s * 1e3)
    return out


