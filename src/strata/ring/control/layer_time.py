"""A member's measured decode time of one decoder layer of a model: what the plan uses
instead of bytes / (bandwidth x η), which was 40x off on a busy host.

`time_layer(model)` loads a run of middle decoder layers through strata.ring.runtime.stage
(a stage that is neither first nor last takes float32 activations and returns them: no
embedding, no head), with the member's own ops and thread count (`serve --ops`, `-t`), fills
its KV cache to DEPTH positions untimed, then times a one-token forward at that depth
(strata.measure.timer: warm-up, repetitions of a ~20 ms batch of such tokens, the median);
the layer's time is the run's over its length. The run holds at least twice the last-level
cache's bytes where the model has that many (`span`): a ring streams its layers from memory
token after token, and one small layer timed again and again would be read from the cache
(smollm2-135m's 4 MB q8_0 layer, timed alone, predicted 4.1 ms/token where the model takes
6.3). The head is timed the same way, after a run of the last layers.
The head is timed the same way on the last stage (last layer + final norm + head) minus the
layer time. A fraction of a second for a small model; the daemon keeps it per model hash.

Daemon ops (strata.ring.control.node registers `handlers(node)`):
- `time_layer` {model} -> {model_hash, layer_s, head_s, depth, reps, device}: this member's.
- `layer_times` {model} -> {times: {id: LayerTime dict}, missing: {id: reason}}: every live
  member's, asked in parallel (what `strata ring plan --connect` uses).
The leader calls `gather` before it plans a model it has not timed on a machine yet (one
member per machine and device times: members there share its cores).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from strata.measure.timer import TimingPolicy
from strata.ring.control.orders import reach_of, send_order
from strata.ring.control.wire import Channel, Handler, Message, PeerError
from strata.ring.plan.types import LayerTime

DEPTH = 16  # KV positions before the timed token: decode, not an empty-cache toy
GATHER_TIMEOUT_S = 30.0  # a member may first write a synthetic model or read a layer
BATCH_S = 0.02  # seconds of decoding per timed repetition
MAX_BATCH = 64
# A fraction of a second in all: a short warm-up, then the median of 5 to 25 tokens
TIMING = TimingPolicy(warmup_s=0.02, min_reps=5, max_reps=25, max_time_s=0.25)


def time_layer(model_ref: str, device: str = "cpu", ops: str | None = None,
               threads: int | None = None) -> LayerTime:
    """This host's decode time of a middle layer (the mean over a `span` of them) and of the
    head of `model_ref`, with `ops` (None: the default) on `threads` (None: hardware.threads'
    default), sized in this thread (OpenMP's count is per thread)."""
    from strata.hardware.threads import set_threads
    from strata.models.source import resolve
    from strata.ring.runtime.stage import DEFAULT_OPS

    set_threads(threads)
    ops = ops or DEFAULT_OPS
    spec = resolve(model_ref).spec
    n = spec.n_layers if spec is not None else 0
    if n < 1:
        raise ValueError(f"{model_ref}: no decoder layers to time")
    # Middle layers when there are some (n >= 3): neither the first (the embedding) nor the
    # last (the head); else layer 0, whose one-row embedding lookup is negligible beside it.
    # With one layer the head is inside the time.
    k = span(spec, device) if n >= 3 else 1
    k = min(k, n - 2) if n >= 3 else 1
    lo = 1 + (n - 2 - k) // 2 if n >= 3 else 0
    run_s, reps = _time_stage(model_ref, lo, lo + k, device, ops)
    layer_s, head_s = run_s / k, None
    if n >= 2:  # the last stage: its layers + norm + head; the head is the difference
        last_k = min(k, n - 1)
        last_s, _ = _time_stage(model_ref, n - last_k, n, device, ops)
        head_s = max(0.0, last_s - last_k * layer_s)
    return LayerTime(layer_s, head_s, DEPTH, reps, device)


def span(spec: Any, device: str) -> int:
    """Layers whose stored bytes reach twice this host's last-level cache (1 off the CPU:
    a GPU's layers stream from its memory however many there are)."""
    if device != "cpu" or not spec.n_layers:
        return 1
    per_layer = spec.weight_bytes() / spec.n_layers
    return max(1, math.ceil(_flush_bytes() / max(per_layer, 1.0)))


def _time_stage(model_ref: str, first: int, last: int, device: str, ops: str
                ) -> tuple[float, int]:
    """Median seconds of a one-token forward of stage [first, last) at depth DEPTH."""
    import torch

    from strata.measure.timer import HostClock, time_calls
    from strata.ring.runtime.stage import Stage

    stage = Stage.load(model_ref, first, last, device=device, ops=ops)
    stage.reset(DEPTH + 1)
    gen = torch.Generator().manual_seed(0)

    def tokens(t: int) -> torch.Tensor:
        if stage.is_first:
            return torch.randint(0, stage.vocab, (t,), generator=gen)
        return torch.randn(t, stage.spec.hidden, generator=gen)

    stage.forward(tokens(DEPTH), 0)  # the context the timed token attends to (untimed)
    one = tokens(1)
    from strata.hardware.devices import resolve

    clock = HostClock(resolve(stage.device).sync)

    def decode() -> None:  # the same slot every call: one token at depth DEPTH exactly
        stage.forward(one, DEPTH, last_only=True)

    decode()
    # A repetition decodes `batch` tokens (~BATCH_S): on a busy host one short call is
    # either unhindered (1 ms) or preempted (10-40 ms), so the median of single calls
    # says whichever was likelier that moment; a batch averages preemption in, as a
    # stage's forward over many layers does.
    batch = max(1, min(MAX_BATCH, math.ceil(BATCH_S / max(clock.measure(decode), 1e-6))))
    summary = time_calls(lambda: [decode() for _ in range(batch)], TIMING, clock)
    return summary.median / batch, summary.n * batch


def _flush_bytes() -> int:
    """Twice this host's last-level cache (64 MiB where the probe cannot tell)."""
    from strata.hardware.cpu import probe_cpu

    llc = probe_cpu().last_level_cache_bytes()
    return 2 * llc if llc else 64 << 20


@dataclass
class LayerTimer:
    """A daemon's timings: its own per model hash, and (as leader) what members answered."""

    node: Any  # strata.ring.control.node.Node
    own: dict[str, LayerTime] = field(default_factory=dict)  # by model hash
    # (model, host, device) -> that machine's time, or why there is none
    known: dict[tuple[str, str, str], LayerTime | str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handlers(self) -> dict[str, Handler]:
        return {"time_layer": self.time_layer, "layer_times": self.layer_times}

    def time_layer(self, msg: Message, chan: Channel) -> Message:
        model = self.node.model_ref(str(msg["model"]))
        digest = self.node.stages._hash(model)  # the same file, the same time: key by it
        with self.lock:  # one timing at a time: two at once would time each other
            if digest not in self.own:
                config = self.node.config
                self.own[digest] = time_layer(model, config.device, config.ops,
                                              config.threads)
            timed = self.own[digest]
        return {"model_hash": digest, **timed.to_dict()}

    def layer_times(self, msg: Message, chan: Channel) -> Message:
        from strata.ring.plan.members import Member

        node = self.node
        members = [node.member, *(Member.from_dict(p.member) for p in node.live() if p.member)]
        times, missing = self.gather(str(msg["model"]), members)
        return {"times": {k: v.to_dict() for k, v in times.items()}, "missing": missing}

    def gather(self, model: str, members: list[Any]) -> tuple[dict[str, LayerTime],
                                                               dict[str, str]]:
        """Each member's timed layer of `model`. One member per machine and device is asked
        (members there share its cores and memory: their timings would differ only by the
        load of the moment, and a plan must not reorder them over that); machines in
        parallel, not again for this model. A machine that fails or is silent past
        GATHER_TIMEOUT_S keeps the bandwidth x η estimate, with the reason."""
        reach = reach_of(self.node)
        machine = {m.id: (reach[m.id][0], str(m.device)) for m in members if m.id in reach}
        ask: dict[tuple[str, str], str] = {}  # machine -> the member (lowest id) that times
        for mid, key in sorted(machine.items()):
            if (model, *key) not in self.known:
                ask.setdefault(key, mid)
        answers: dict[tuple[str, str], LayerTime | str] = {}

        def one_host(keys: list[tuple[str, str]]) -> None:
            for key in keys:  # one at a time on a host: two would time each other's load
                try:
                    reply = send_order(reach[ask[key]], {"op": "time_layer", "model": model},
                                       GATHER_TIMEOUT_S)
                    answers[key] = LayerTime.from_dict(reply)
                except (PeerError, KeyError, ValueError, TypeError) as exc:
                    answers[key] = f"no layer time from {ask[key]} ({exc})"

        by_host: dict[str, list[tuple[str, str]]] = {}
        for key in ask:
            by_host.setdefault(key[0], []).append(key)
        threads = [threading.Thread(target=one_host, args=(keys,), daemon=True,
                                    name=f"ring-time {host}") for host, keys in by_host.items()]
        for t in threads:
            t.start()
        deadline = time.monotonic() + GATHER_TIMEOUT_S  # one for all: they run side by side
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        for key, mid in ask.items():
            self.known[(model, *key)] = answers.get(
                key, f"no layer time from {mid} within {GATHER_TIMEOUT_S:g} s")
        times, missing = {}, {}
        for m in members:
            got = self.known.get((model, *machine[m.id]), "") if m.id in machine else ""
            if isinstance(got, LayerTime):
                times[m.id] = got
            else:
                missing[m.id] = got or "not reachable from the leader"
        return times, missing


def handlers(node: Any) -> dict[str, Handler]:
    """The ops of `node`'s LayerTimer (kept on the node as `node.layer_timer`)."""
    node.layer_timer = LayerTimer(node)
    return node.layer_timer.handlers()


def estimate_notes(times: dict[str, LayerTime], missing: dict[str, str], planned: list[str],
                   otherwise: str = "no layer time") -> list[str]:
    """A plan note per planned member that kept the bandwidth x η estimate, and why."""
    return [f"{mid}: bandwidth x η estimate, {missing.get(mid, otherwise)}"
            for mid in planned if mid not in times]
