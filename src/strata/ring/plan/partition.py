"""The partition: which members hold which contiguous layers, in which order.

Rules (issue 15):
- each stage's share — its blocks' weights as the runtime holds them, its KV cache at the
  requested context, the token embedding on the first stage, the final norm and head on the
  last (a tied head needs its own copy of the embedding there) — fits in HEADROOM (0.9) of
  what its member offers;
- as few members as the model needs (one is a valid plan: "fits on X alone: no ring needed");
- among those, members, order and sizes that minimise the predicted time per decoded token:
      Σ stages  the stage's time per token
    + Σ links   RTT / 2 + bytes / link bandwidth   (one hop each way round the ring,
                activations forward, the logits back to the driver on the first stage)
    + machinery DRIVER_MS + HOP_MS x hops   (strata's own: the driver's loop, and each
                hop's send, receive and dispatch; priors from ring run's timeline)
  A stage's time is MEASURED when its member timed one decoder layer of this model
  (strata.ring.control.layer_time: one token at a small KV depth): layers x that time, + the KV
  cache the token reads beyond the timed depth at bandwidth x η, + the head as timed (else
  its bytes at bandwidth x η), + one embedding row at bandwidth x η (a lookup: negligible).
  Otherwise it is ESTIMATED: bytes the stage reads per token / (member bandwidth x η).
  Bytes read per token are the roofline's (docs/architecture.md §5): every weight of the
  stage's blocks except the routed experts a token does not use (a MoE keeps all its experts
  with their layer: memory counts all, time the n_experts_used), one row of the embedding, the
  whole head, and the stage's KV cache at the full context. η is the member's own past torch
  decode η, else fit's prior (strata.fit.predict.PRIOR_ETA): a prediction, labelled so. The
estimate was 40x off on a busy host (11 ms/token predicted, ~500 ms measured), hence the
measured per-layer time wherever a member can give one.

Search: every ordered choice of k members (k = 1, 2, ...) whose memory could hold the model,
each split by a dynamic programme over the layer boundaries (O(k·L) with a sliding-window
minimum, since a stage's time is a prefix-sum difference over its blocks plus its ends).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strata.errors import InputError
from strata.fit.predict import PRIOR_ETA
from strata.models.spec import ModelSpec
from strata.ring.plan.costs import LayerCosts
from strata.ring.plan.links import Link
from strata.ring.plan.members import HEADROOM, Member
from strata.ring.plan.timing import SAME_SPEED, Timing, eta, timings_of
from strata.ring.plan.types import (  # noqa: F401  (DRIVER_MS: the plan's machinery prior)
    DRIVER_MS,
    HOP_MS,
    LayerTime,
    LinkPlan,
    RingPlan,
    StagePlan,
    size,
)

# how the ring's stages hold weights, per ops backend (strata.ring.runtime.stage): the lab's
# kernels read the GGUF's blocks as stored (None), the torch ops dequantise to float32
HELD_DTYPE: dict[str, str | None] = {"lab": None, "torch": "float32"}
MAX_ORDERS = 20_000  # ordered member choices tried per size k (8 members, k = 4: 1680)

Links = Mapping[tuple[str, str], Link] | Link | None


@dataclass
class _Candidate:
    order: tuple[Member, ...]
    bounds: list[tuple[int, int]]
    cost_s: float
    complete: bool = True  # False: MAX_ORDERS cut the search short (the best found so far)


def plan_ring(model: str | ModelSpec, members: Sequence[Member], ctx: int, links: Links = None,
              dtype_bytes: int = 4, *, weights_dtype: str | None = None,
              kv_elem_bytes: float | None = None, return_bytes: int | None = None,
              measured: Mapping[str, LayerTime] | None = None) -> RingPlan:
    """The plan for `model` (a ref strata.models.source resolves, or a ModelSpec) on
    `members` at context `ctx`. `links`: measured links by (from id, to id) (either
    direction serves), one Link for every pair, or None (link time then not predicted).
    `dtype_bytes`: activations on the wire; `weights_dtype`: how stages hold weights (None:
    as stored, as lab ops do; "float32" as torch ops do: HELD_DTYPE); `kv_elem_bytes`: KV
    cache element (default dtype_bytes); `return_bytes`: what the last stage sends back per
    token (default: vocab x dtype_bytes of logits);
    `measured`: per member id, its timed decoder layer of this model (replaces the bandwidth
    estimate of that member's stages; members absent from it keep the estimate).
    InputError when the members cannot hold the model, naming what is missing."""
    spec, ref = model_spec(model)
    if ctx < 1:
        raise InputError(f"--ctx {ctx}: must be at least 1 token")
    if not members:
        raise InputError("no members to plan on: give --node NAME:GiB[:GB/s] or --members FILE")
    ids = [m.id for m in members]
    if len(set(ids)) != len(ids):
        raise InputError(f"member ids must be unique (got {', '.join(sorted(ids))})")
    if weights_dtype is not None:
        from strata.fit.weights import as_float

        spec = as_float(spec, weights_dtype)
    costs = LayerCosts.of(spec, ctx, kv_elem_bytes if kv_elem_bytes is not None else dtype_bytes)
    wire = spec.hidden * dtype_bytes
    back = return_bytes if return_bytes is not None else spec.vocab * dtype_bytes
    timings = timings_of(members, costs, ctx, measured or {})
    ordered = sorted(members, key=lambda m: m.id)  # ties resolve the same way every time
    for k in range(1, len(members) + 1):
        best = _best_of_size(k, ordered, costs, timings, links, wire, back)
        if best is not None:
            return _build(ref, spec, ctx, costs, best, members, timings, links, wire, back,
                          weights_dtype)
    raise InputError(_shortfall(ref, ctx, costs, members))


def model_spec(model: str | ModelSpec) -> tuple[ModelSpec, str]:
    """The spec of `model` (a ref: its metadata only) and the name the plan gives it."""
    if isinstance(model, ModelSpec):
        return model, model.name
    from strata.models.source import resolve

    spec = resolve(model).spec  # metadata only: a synthetic preset is not written
    if spec is None:
        raise InputError(f"MODEL {model}: an endpoint has no layers to split (give a .gguf "
                         "file, a Hugging Face directory or synthetic:<preset>)")
    return spec, model


def link_between(links: Links, a: str, b: str) -> Link | None:
    if links is None or isinstance(links, Link):
        return links
    return links.get((a, b)) or links.get((b, a))


def _hops(order: Sequence[Member], wire: int, back: int) -> list[tuple[str, str, int, str]]:
    """(from, to, bytes per token, what) round the ring: activations forward, logits back."""
    if len(order) < 2:
        return []
    hops = [(a.id, b.id, wire, "activations") for a, b in itertools.pairwise(order)]
    return [*hops, (order[-1].id, order[0].id, back, "logits")]


def _links_s(order: Sequence[Member], links: Links, wire: int, back: int) -> float:
    """Link time per token, each hop's handling included; an unmeasured link's wire time
    counts 0 in the search (and is not predicted)."""
    total = 0.0
    for a, b, nbytes, _ in _hops(order, wire, back):
        link = link_between(links, a, b)
        total += HOP_MS / 1e3 + (link.one_way_s(nbytes) if link is not None else 0.0)
    return total


def _best_of_size(k: int, ordered: list[Member], costs: LayerCosts,
                  timings: dict[str, Timing], links: Links, wire: int,
                  back: int) -> _Candidate | None:
    if k > costs.n:
        return None  # every stage holds at least one block
    need = costs.need(k)
    best: _Candidate | None = None
    tried = 0
    for combo in itertools.combinations(ordered, k):
        if sum(m.usable_bytes for m in combo) < need:
            continue  # cannot hold it in any order
        for order in itertools.permutations(combo):
            tried += 1
            if tried > MAX_ORDERS:
                if best is not None:
                    best.complete = False
                return best
            hop_s = _links_s(order, links, wire, back)
            if best is not None and hop_s >= best.cost_s:
                continue
            split = _split(order, costs, timings)
            if split is None:
                continue
            layer_s, bounds = split
            if best is None or hop_s + layer_s < best.cost_s * (1 - 1e-12):
                best = _Candidate(order, bounds, hop_s + layer_s)
    return best


def _split(order: Sequence[Member], costs: LayerCosts,
           timings: dict[str, Timing]) -> tuple[float, list[tuple[int, int]]] | None:
    """The fastest contiguous split of the blocks over `order` (each stage >= 1 block, each
    within its member's usable bytes): (layer seconds per token, [(first, last), ...])."""
    n, k = costs.n, len(order)
    mem = [0, *itertools.accumulate(costs.mem)]
    inf = math.inf
    f = [0.0] + [inf] * n  # f[b]: best seconds for blocks [0, b) on the stages so far
    backs: list[list[int]] = []
    for j, member in enumerate(order):
        extra_mem = (costs.embed_mem if j == 0 else 0) + (costs.head_mem if j == k - 1 else 0)
        if k == 1:
            extra_mem -= costs.tied_copy
        room = member.usable_bytes - extra_mem
        timing = timings[member.id]
        cum = timing.cum  # this member's seconds for blocks [0, b)
        extra_s = timing.stage_s(0, 0, j == 0, j == k - 1)  # its ends, if any
        g, arg = [inf] * (n + 1), [-1] * (n + 1)
        window: deque[int] = deque()  # starts a, by rising f[a] - cum[a]
        lo = 0
        last_b = n - (k - 1 - j)  # leave a block for each later stage
        for b in range(1, last_b + 1):
            a = b - 1
            if f[a] < inf:
                key = f[a] - cum[a]
                while window and f[window[-1]] - cum[window[-1]] >= key:
                    window.pop()
                window.append(a)
            while lo < b and mem[b] - mem[lo] > room:
                lo += 1  # starts before lo leave too much for this member
            while window and window[0] < lo:
                window.popleft()
            if window and (j < k - 1 or b == n) and mem[b] - mem[window[0]] <= room:
                a = window[0]
                g[b] = f[a] + cum[b] - cum[a] + extra_s
                arg[b] = a
        backs.append(arg)
        f = g
    if f[n] == inf:
        return None
    bounds, b = [], n
    for arg in reversed(backs):
        bounds.append((arg[b], b))
        b = arg[b]
    return f[n], bounds[::-1]


def _build(ref: str, spec: ModelSpec, ctx: int, costs: LayerCosts, best: _Candidate,
           members: Sequence[Member], timings: dict[str, Timing], links: Links, wire: int,
           back: int, weights_dtype: str | None) -> RingPlan:
    k = len(best.order)
    stages = []
    for j, (member, (first, last)) in enumerate(zip(best.order, best.bounds, strict=True)):
        weights = sum(costs.mem[first:last]) - sum(costs.kv[first:last])
        read = sum(costs.read[first:last])
        if j == 0:
            weights, read = weights + costs.embed_mem, read + costs.embed_read
        if j == k - 1:
            weights, read = weights + costs.head_mem, read + costs.head_read
        if k == 1:
            weights -= costs.tied_copy
        kv = sum(costs.kv[first:last])
        timing = timings[member.id]
        ms = timing.stage_s(first, last, j == 0, j == k - 1) * 1e3 if timing.predicted \
            else None
        stages.append(StagePlan(member.id, first, last, weights + kv, ms, member.device,
                                weights, kv, member.usable_bytes, read, eta(member),
                                timing.source if timing.predicted else None,
                                timing.layer_ms))
    hops = []
    for a, b, nbytes, what in _hops(best.order, wire, back):
        link = link_between(links, a, b)
        hops.append(LinkPlan(a, b, nbytes, what, link.rtt_ms if link else None,
                             link.MBps if link else None,
                             link.one_way_s(nbytes) * 1e3 if link else None))
    used = {m.id for m in best.order}
    notes = _notes(spec, stages, hops, weights_dtype, ctx)
    if not best.complete:
        notes.append(f"searched the first {MAX_ORDERS:,} member orders of {k} members only: "
                     "a faster order may exist")
    return RingPlan(ref, ctx, stages, hops, best.order[0].id if k == 1 else None,
                    [m.id for m in members if m.id not in used], costs.need(k),
                    sum(m.usable_bytes for m in members), notes)


def _notes(spec: ModelSpec, stages: list[StagePlan], hops: list[LinkPlan],
           weights_dtype: str | None, ctx: int) -> list[str]:
    held = (f"as {weights_dtype} (how --ops torch stages hold them)" if weights_dtype else
            "as stored in the file (how --ops lab stages hold them)")
    notes = [f"weights {held}, KV cache at --ctx {ctx}; each share "
             f"within {HEADROOM:g} of its member's memory",
             "time per token = Σ stages + Σ links (RTT/2 + bytes / MB/s); a stage's time is "
             "measured (its member's timed decoder layer x layers, + the KV cache beyond the "
             "timed depth and the embedding row at bandwidth x η) or estimated (bytes read / "
             f"(bandwidth x η)); η: a member's past torch decode η, else the prior {PRIOR_ETA}"]
    by_source: dict[str, list[str]] = {}
    for s in stages:
        if s.time_source:
            by_source.setdefault(s.time_source, []).append(s.member)
    for source, who in by_source.items():
        notes.append(f"stage time {source}: {', '.join(who)}" + (
            f" (a decoder layer timed on its machine; times within {SAME_SPEED:.0%} count as one "
            "speed)" if source == "measured" else ""))
    if spec.is_moe:
        notes.append(f"mixture of experts: each layer's {spec.n_experts} experts stay with it "
                     f"(memory counts all); a token reads {spec.n_experts_used} per layer")
    slow = [s.member for s in stages if s.predicted_ms is None]
    if slow:
        notes.append(f"not predicted: no measured bandwidth for {', '.join(slow)} "
                     "(strata probe --measure on it, or --node NAME:GiB:GB/s)")
    unmeasured = [f"{h.src}→{h.dst}" for h in hops if h.predicted_ms is None]
    if unmeasured:
        notes.append(f"link time not predicted: {', '.join(unmeasured)} not measured "
                     "(give --link RTT_MS:MB/s, or plan from a running ring)")
    return notes


def _shortfall(ref: str, ctx: int, costs: LayerCosts, members: Sequence[Member]) -> str:
    usable = sum(m.usable_bytes for m in members)
    need = costs.need(1 if len(members) == 1 else 2)
    kv = sum(costs.kv)
    offered = sum(m.offered_bytes for m in members)
    who = f"{len(members)} members offer" if len(members) > 1 else "1 member offers"
    have = f"{who} {size(usable)} usable ({HEADROOM:g} of {size(offered)})"
    if usable < need:
        missing = need - usable
        return (f"{ref} at a context of {ctx} tokens needs {size(need)} (weights "
                f"{size(need - kv)} + KV cache {size(kv)}) but the {have}: {size(missing)} "
                f"missing — add a member with {size(missing / HEADROOM)} free, or use a "
                "shorter context")
    biggest = max(members, key=lambda m: m.usable_bytes)
    return (f"{ref} at a context of {ctx} tokens: the {have}, enough in total, but no "
            "contiguous split fits: "
            f"a block needs up to {size(max(costs.mem))}, the first stage also holds the "
            f"embedding ({size(costs.embed_mem)}) and the last the head "
            f"({size(costs.head_mem)}), and the largest member ({biggest.id}) offers "
            f"{size(biggest.usable_bytes)} usable — add memory to the members")
