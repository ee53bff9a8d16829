"""What a ring plan is: its stages, its links, the predicted time per token, and its output
forms (`strata ring plan -o json` and the flat records of jsonl/csv/md; docs/output.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def size(n: float) -> str:
    """Bytes in the largest binary unit that keeps them >= 1 (a tiny test model's share
    would read 0.00 GiB)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} B"


@dataclass(frozen=True)
class StagePlan:
    member: str  # member id
    first: int  # blocks [first, last)
    last: int
    bytes: int  # memory the share takes: weights + KV cache
    predicted_ms: float | None  # per decoded token; None: the member's bandwidth is unmeasured
    device: str
    weight_bytes: int  # blocks + the embedding (first stage) + norm and head (last stage)
    kv_bytes: int  # KV cache of its blocks at ctx
    usable_bytes: int  # HEADROOM x what the member offers
    read_bytes: float  # bytes one decoded token reads here
    eta: float  # η the prediction used
    # "measured": the member's timed decoder layer x its layers (strata.ring.control.layer_time);
    # "estimated": read_bytes / (bandwidth x η); None: neither is known (not predicted)
    time_source: str | None = None
    layer_ms: float | None = None  # the member's measured ms per decoder layer, if any

    @property
    def n_layers(self) -> int:
        return self.last - self.first

    def to_json(self) -> dict[str, Any]:
        return {"member": self.member, "device": self.device, "first": self.first,
                "last": self.last, "n_layers": self.n_layers, "memory_bytes": self.bytes,
                "weights_bytes": self.weight_bytes, "kv_bytes": self.kv_bytes,
                "usable_bytes": self.usable_bytes, "read_bytes": round(self.read_bytes),
                "eta": self.eta, "predicted_ms": self.predicted_ms,
                "time_source": self.time_source, "layer_ms": self.layer_ms}


@dataclass(frozen=True)
class LayerTime:
    """A member's measured decode time of one decoder layer of a model (one token at a small
    KV depth) and, when timed, of the final norm + head: what replaces the bandwidth x η
    estimate of its stages (strata.ring.control.layer_time measures it)."""

    layer_s: float  # one decoder layer, one token, `depth` positions in its KV cache
    head_s: float | None  # final norm + output head, one token (None: not timed)
    depth: int  # KV positions the timed token attended to
    reps: int  # timed repetitions (the median is kept)
    device: str = "cpu"

    def to_dict(self) -> dict[str, Any]:
        return {"layer_s": self.layer_s, "head_s": self.head_s, "depth": self.depth,
                "reps": self.reps, "device": self.device}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerTime:
        layer_s = float(d["layer_s"])
        if not layer_s > 0:
            raise ValueError(f"layer_s {layer_s!r} is not a positive time")
        head = d.get("head_s")
        return cls(layer_s, None if head is None else max(0.0, float(head)),
                   int(d.get("depth", 0)), int(d.get("reps", 0)), str(d.get("device", "cpu")))


@dataclass(frozen=True)
class LinkPlan:
    src: str
    dst: str
    bytes_per_token: int  # hidden x dtype (activations), or the logits going back
    carries: str  # "activations" or "logits"
    rtt_ms: float | None  # None: not measured
    MBps: float | None  # MB/s (10^6 bytes); None: not measured
    predicted_ms: float | None  # RTT/2 + bytes / bandwidth

    def to_json(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "carries": self.carries,
                "token_bytes": self.bytes_per_token, "rtt_ms": self.rtt_ms,
                "bandwidth_gbs": None if self.MBps is None else self.MBps / 1e3,
                "predicted_ms": self.predicted_ms}


# strata's own machinery per decoded token beyond the stages' compute and the links' wire
# time, as ring run's timeline measured it (smollm2-135m q8_0, 1-3 members on loopback,
# 2-core EPYC): the driver's loop (~0.2 ms with no hop) and each hop's message handling —
# the send, the receive, the next stage's dispatch (0.36-0.52 ms). Priors, not this host's.
DRIVER_MS = 0.2
HOP_MS = 0.4


@dataclass
class RingPlan:
    model: str  # the model as typed
    ctx: int
    stages: list[StagePlan]
    links: list[LinkPlan]  # round the ring: activations forward, then logits back
    single_node: str | None  # the member that holds it alone (no ring needed), else None
    unused: list[str]  # members the plan does not need
    need_bytes: int  # what the chosen members hold together
    usable_bytes: int  # what all members offer (HEADROOM x their memory)
    notes: list[str] = field(default_factory=list)

    @property
    def machinery_ms(self) -> float:
        """strata's own per-token machinery beyond compute and wire (the priors above)."""
        return DRIVER_MS + HOP_MS * len(self.links)

    @property
    def predicted_stages_ms(self) -> float | None:
        times = [s.predicted_ms for s in self.stages]
        return None if None in times else sum(t for t in times if t is not None)

    @property
    def predicted_ms_per_token(self) -> float | None:
        """Stages + links + machinery per decoded token; None when any part of it was not
        measured."""
        hops = [h.predicted_ms for h in self.links]
        stages = self.predicted_stages_ms
        if stages is None or None in hops:
            return None
        return stages + sum(h for h in hops if h is not None) + self.machinery_ms

    @property
    def predicted_ts(self) -> float | None:
        ms = self.predicted_ms_per_token
        return 1e3 / ms if ms else None

    def stage_of(self, member: str) -> StagePlan | None:
        return next((s for s in self.stages if s.member == member), None)

    def to_json(self) -> dict[str, Any]:
        return {"model_filename": self.model, "n_ctx": self.ctx, "single_node": self.single_node,
                "n_nodes": len(self.stages), "need_bytes": self.need_bytes,
                "usable_bytes": self.usable_bytes,
                "predicted_ms": self.predicted_ms_per_token,
                "predicted_stages_ms": self.predicted_stages_ms,
                "predicted_machinery_ms": self.machinery_ms,
                "predicted_ts": self.predicted_ts,
                "stages": [s.to_json() for s in self.stages],
                "links": [h.to_json() for h in self.links],
                "unused": self.unused, "notes": self.notes}

    def records(self) -> list[dict[str, Any]]:
        """One flat record per stage, with the link leaving it (the last stage's is the
        logits going back to the first; none when one member holds it all)."""
        out = []
        for stage in self.stages:
            hop = next((h for h in self.links if h.src == stage.member), None)
            link = hop.to_json() if hop else dict.fromkeys(
                ("dst", "carries", "token_bytes", "rtt_ms", "bandwidth_gbs", "predicted_ms"))
            out.append({"model_filename": self.model, "n_ctx": self.ctx, **stage.to_json(),
                        "link_dst": link["dst"], "link_token_bytes": link["token_bytes"],
                        "link_rtt_ms": link["rtt_ms"],
                        "link_bandwidth_gbs": link["bandwidth_gbs"],
                        "link_predicted_ms": link["predicted_ms"],
                        "plan_predicted_ts": self.predicted_ts})
        return out
