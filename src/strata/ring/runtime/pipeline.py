"""Generation across a ring: the driver on rank 0 (which also runs the first stage) and the
stage loop on every other rank.

Rank r receives from r - 1 and sends to r + 1; the last rank sends its RESULT back to rank 0,
so each token crosses every link once. A request starts with RESET (a fresh KV cache on every
stage, and what the last stage returns: the chosen token, or logits), then one DATA message
for the prompt (prefill) and one per decoded token, and ends with RESET 0 (the stages idle,
each keeping its cache and bound decode step for the next request; STOP frees them). Idle
stages wait on the store, not on their links: the driver wakes them (Group.wake)
before a new request or STOP; during a request every wait has the op deadline.

After PeerLost the driver keeps what it generated; `Driver.resume` on a new group (fewer or
other ranks, new layer ranges) rebuilds every stage's cache by replaying the prompt plus the
tokens already generated as one prefill and carries on: the remaining tokens are those of an
uninterrupted run (greedy, or seeded sampling: each step's generator is seeded by (seed, step)).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from enum import IntEnum
from typing import Any

import torch

from strata.errors import InputError
from strata.ring.runtime.assign import StageAssignment, check_assignments, check_fit
from strata.ring.runtime.stage import DEFAULT_OPS, Stage, check_range
from strata.ring.runtime.transport import Group, Header, Kind, PeerLost

LOAD_TIMEOUT_S = 600.0  # how long the driver waits for the other stages to load their layers


class Mode(IntEnum):
    """What the last stage returns for each DATA message (RESET's n field)."""

    TOKEN = 0  # the greedy token of the last position: 8 bytes back instead of vocab x 4
    LAST_LOGITS = 1  # logits of the last position [1, vocab]
    ALL_LOGITS = 2  # logits of every position [T, vocab] (a prefill's whole prompt)


# -- the stage loop (ranks 1..W-1) ---------------------------------------------------------------


def serve_stage(group: Group, assignment: StageAssignment, model_ref: str,
                stage: Stage | None = None, mem_cap_bytes: int | None = None,
                on_message: Callable[[Header], None] | None = None,
                device: str = "cpu", ops: str = DEFAULT_OPS, kv: str = "f32") -> Stage:
    """Serve `assignment` until STOP (or until this process closes the group while the ring
    is idle); returns the stage (reused by the next epoch when its
    layers stay the same). On a lost peer: report it to the epoch's store, drop the group
    (so the neighbours fail at once too) and raise PeerLost. `on_message` sees every header
    before it is handled (tests use it to crash or hang a stage at a chosen step)."""
    if assignment.rank != group.rank or group.rank == 0:
        raise ValueError(f"serve_stage runs ranks 1..{group.world - 1}, not {assignment}")
    try:
        if stage is None or not stage.holds(model_ref, assignment.first, assignment.last, ops,
                                            kv):
            stage = Stage.load(model_ref, assignment.first, assignment.last, device,
                               mem_cap_bytes=mem_cap_bytes, ops=ops, kv=kv)
    except Exception as exc:  # rank 0 reports this rank's own words instead of waiting
        group.mark_ready(f"{type(exc).__name__}: {exc}" if not isinstance(exc, InputError)
                         else str(exc))
        group.close()
        raise
    group.mark_ready()
    prev, last = group.rank - 1, group.rank == group.world - 1
    nxt = 0 if last else group.rank + 1
    mode, idle = Mode.TOKEN, True
    decode = DecodeTime()
    try:
        while True:
            if idle and not group.wait_wake():  # closed by this process (the control plane)
                stage.reset(0)
                return stage
            header, payload = group.recv(prev)
            if on_message is not None:
                on_message(header)
            if header.kind == Kind.STOP:
                if not last:
                    group.send(nxt, header)
                stage.reset(0)
                return stage
            if header.kind == Kind.RESET:
                if header.pos == 0:  # the request is over: what its decode steps took here
                    decode.publish(group, header.request)
                decode = DecodeTime()
                stage.reset(header.pos) if header.pos else stage.idle()
                mode, idle = Mode(header.n), header.pos == 0
                if not last:
                    group.send(nxt, header)
            elif header.kind == Kind.DATA and payload is not None:
                _step(group, stage, header, payload, mode, nxt, decode)
            else:
                raise ValueError(f"stage {group.rank}: unexpected {header}")
    except PeerLost as lost:
        group.report_lost(lost.rank)
        group.close()
        raise


def _step(group: Group, stage: Stage, header: Header, x: torch.Tensor, mode: Mode,
          nxt: int, decode: DecodeTime) -> None:
    t0 = time.perf_counter()
    out = stage.forward(x, header.pos, last_only=stage.is_last and mode != Mode.ALL_LOGITS)
    if header.n == 1:
        decode.add(time.perf_counter() - t0)
    if not stage.is_last:
        group.send(nxt, Header(Kind.DATA, header.request, header.pos, out.shape[0],
                               out.shape[1]), out)
    elif mode == Mode.TOKEN:
        token = out[-1].argmax().reshape(1)
        group.send(nxt, Header(Kind.RESULT, header.request, header.pos, 1, 0), token)
    else:
        group.send(nxt, Header(Kind.RESULT, header.request, header.pos, out.shape[0],
                               out.shape[1]), out)


# -- the timeline: where a decoded token's time goes ------------------------------------------


@dataclass
class DecodeTime:
    """One rank's decode steps of one request: its stage's own compute."""

    compute_s: float = 0.0
    steps: int = 0

    def add(self, compute_s: float) -> None:
        self.compute_s += compute_s
        self.steps += 1

    def publish(self, group: Group, request: int) -> None:
        """Into the epoch's store, for the driver's timeline (best effort)."""
        with contextlib.suppress(RuntimeError):
            group.store.set(f"timeline/{request}/{group.rank}",
                            f"{self.compute_s} {self.steps}")


TIMELINE_WAIT_S = 2.0  # how long the driver waits for the stages' figures after a request


def timeline(group: Group, request: int, own: DecodeTime, ms_per_token: float | None
             ) -> dict[str, Any] | None:
    """Per decoded token: each rank's compute, the measured time, and the machinery (the
    measured time less every stage's compute: links, messages, Python) per hop of the ring
    (world hops; a ring of one has none, its machinery is the driver's own loop)."""
    if own.steps == 0 or ms_per_token is None:
        return None
    ranks = {0: own}
    keys = [f"timeline/{request}/{r}" for r in range(1, group.world)]
    try:
        if keys:
            group.store.wait(keys, timedelta(seconds=TIMELINE_WAIT_S))
        for r, key in enumerate(keys, start=1):
            compute, steps = group.store.get(key).decode().split()
            ranks[r] = DecodeTime(float(compute), int(steps))
    except (RuntimeError, ValueError):
        return None  # a stage that did not report: no timeline, never a made-up one
    compute = {r: 1e3 * t.compute_s / max(1, t.steps) for r, t in ranks.items()}
    machinery = ms_per_token - sum(compute.values())
    hops = group.world if group.world > 1 else 0
    return {"ms_per_token": ms_per_token, "compute_ms_per_token": compute,
            "machinery_ms_per_token": machinery,
            "machinery_ms_per_hop": machinery / hops if hops else None, "hops": hops,
            "steps": own.steps}


# -- the driver (rank 0) -----------------------------------------------------------------------


def choose(logits: torch.Tensor, temperature: float, seed: int | None, step: int) -> int:
    """Greedy at temperature 0; otherwise a sample whose generator is seeded by (seed, step)
    alone, so a resumed generation draws what the uninterrupted one would have."""
    logits = logits.detach().cpu()  # the generator lives on the CPU, whatever the device
    if temperature <= 0.0 or seed is None:
        return int(logits.argmax())
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))


@dataclass(frozen=True)
class LinkBytes:
    src: int
    dst: int
    bytes_per_token: float  # decode phase: header + payload per generated token
    measured: bool  # False: an inner link, whose messages have link 0→1's sizes


@dataclass
class Resumption:
    lost_rank: int
    at_token: int  # tokens already generated when the peer was lost
    replayed: int  # positions replayed into the new ranks' caches
    replay_s: float
    world: int


@dataclass
class RequestState:
    """A request in flight: what a resume needs (a new leader may take it over)."""

    request: int
    prompt: list[int]
    n_predict: int
    seed: int | None
    temperature: float
    keep_logits: bool
    tokens: list[int] = field(default_factory=list)
    step_logits: list[torch.Tensor] = field(default_factory=list)  # [vocab] per token
    prefill_logits: torch.Tensor | None = None  # [T, vocab] with keep_logits
    token_times: list[float] = field(default_factory=list)  # perf_counter at each token
    start: float = 0.0  # perf_counter at the request: timings only mean something in the
    # process that started it (another leader resuming it gets tokens right, times not)
    prefill_s: float = 0.0
    resumes: list[Resumption] = field(default_factory=list)
    stop_ids: frozenset[int] = frozenset()  # end-of-generation ids: the request ends there
    on_token: Callable[[int], None] | None = None  # told each token as it is chosen

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.n_predict or bool(
            self.tokens and self.tokens[-1] in self.stop_ids)

    @property
    def mode(self) -> Mode:
        if self.keep_logits:
            return Mode.ALL_LOGITS
        return Mode.TOKEN if self.temperature <= 0.0 or self.seed is None else Mode.LAST_LOGITS

    @property
    def capacity(self) -> int:
        return len(self.prompt) + self.n_predict


@dataclass
class GenerationResult:
    tokens: list[int]
    ttft_s: float
    prefill_s: float
    itl_s: list[float]  # gap before each token after the first (a resume's gap included)
    links: list[LinkBytes]
    step_logits: list[torch.Tensor] | None  # logits that chose each token (keep_logits)
    prefill_logits: torch.Tensor | None  # every prompt position's logits (keep_logits)
    resumes: list[Resumption]
    world: int
    timeline: dict[str, Any] | None = None  # pipeline.timeline of the decode steps


class Driver:
    """Rank 0: runs the first stage, feeds the ring, chooses tokens."""

    def __init__(self, group: Group, assignments: list[StageAssignment], model_ref: str,
                 stage: Stage | None = None, mem_cap_bytes: int | None = None,
                 load_timeout_s: float = LOAD_TIMEOUT_S, device: str = "cpu",
                 ops: str = DEFAULT_OPS, kv: str = "f32") -> None:
        self.model_ref, self.mem_cap_bytes, self.device = model_ref, mem_cap_bytes, device
        self.ops, self.kv = ops, kv
        self.load_timeout_s = load_timeout_s
        self.stage = stage
        self.state: RequestState | None = None
        self.decode = DecodeTime()  # this rank's share of the request's decode steps
        self.last_lost = -1  # the rank blamed for the last PeerLost (old epoch's numbering)
        self._ring_idle = True  # the stages wait in Group.wait_wake: wake them first
        self._next_request = 1
        self._use(group, assignments)

    def _use(self, group: Group, assignments: list[StageAssignment]) -> None:
        if group.rank != 0:
            raise ValueError("the driver is rank 0")
        mine = next((a for a in assignments if a.rank == 0), None)
        if mine is None:
            raise InputError(f"no stage assignment for rank 0 in {assignments}")
        if self.stage is None or not self.stage.holds(self.model_ref, mine.first, mine.last,
                                                      self.ops, self.kv):
            self.stage = None  # free the old share before loading the new one
            self.stage = Stage.load(self.model_ref, mine.first, mine.last, self.device,
                                    mem_cap_bytes=self.mem_cap_bytes, ops=self.ops,
                                    kv=self.kv)
        check_range(self.stage.spec, mine.first, mine.last)
        check_assignments(self.stage.spec.n_layers, assignments, group.world)
        if getattr(self, "group", None) is not group:
            self._ring_idle = True  # a new group's stages start idle
            if group.world > 1:
                group.wait_ready(self.load_timeout_s)
        self.group, self.assignments = group, assignments

    # -- the public steps -------------------------------------------------------------------

    def generate(self, prompt_ids: list[int], n_predict: int, seed: int | None = None,
                 temperature: float = 0.0, keep_logits: bool = False,
                 stop_ids: frozenset[int] = frozenset(),
                 on_token: Callable[[int], None] | None = None) -> GenerationResult:
        """`n_predict` tokens, fewer when one of `stop_ids` comes first; `on_token` hears
        each token as it is chosen (a stream), the result holds them all."""
        if not prompt_ids or n_predict < 1:
            raise InputError("a generation needs a non-empty prompt and n_predict >= 1")
        self.state = RequestState(self._next_request, list(prompt_ids), n_predict, seed,
                                  temperature, keep_logits, start=time.perf_counter(),
                                  stop_ids=stop_ids, on_token=on_token)
        self._next_request += 1
        return self._run(replay=False)

    def resume(self, group: Group, assignments: list[StageAssignment],
               mem_caps: dict[int, int | None] | None = None,
               state: RequestState | None = None) -> GenerationResult:
        """Carry on the interrupted request (this driver's, or `state` from another leader)
        on a new group: check the new ranks can hold their shares, replay, continue."""
        state = state or self.state
        if state is None:
            raise InputError("nothing to resume: no request was interrupted")
        if mem_caps:
            check_fit(self.model_ref, assignments, state.capacity, mem_caps)
        self._use(group, assignments)
        self.state = state
        return self._run(replay=True)

    def stop(self) -> None:
        """Send STOP round the ring: every stage leaves serve_stage."""
        if self.group.world > 1:
            self._wake()
            self.group.send(1, Header(Kind.STOP))

    # -- the request --------------------------------------------------------------------------

    def _run(self, replay: bool) -> GenerationResult:
        s = self.state
        assert s is not None and self.stage is not None
        try:
            self._reset(s.capacity, s.mode, s.request)
            if replay and s.tokens:
                self._replay(s)
            elif not s.tokens:
                self._prefill(s)
            sent0, recv0 = self._counters()
            steps, self.decode = 0, DecodeTime()
            while not s.done:
                pos = len(s.prompt) + len(s.tokens) - 1
                self._token(s, self._forward(s, torch.tensor([s.tokens[-1]]), pos))
                steps += 1
            links = self._links(sent0, recv0, steps)
            self._reset(0, s.mode, s.request)
            gaps = [b - a for a, b in itertools.pairwise(s.token_times)]
            ms = 1e3 * sum(gaps) / len(gaps) if gaps else None
            line = timeline(self.group, s.request, self.decode, ms)
        except PeerLost as lost:
            self.last_lost = self.group.blame(lost.rank)
            self.group.close()  # the survivors blocked on rank 0 fail now, not at a deadline
            blamed = PeerLost(self.last_lost, lost.detect_s, lost.epoch, lost.reason)
            blamed.at = lost.at
            raise blamed from lost
        times = s.token_times
        return GenerationResult(
            list(s.tokens), times[0] - s.start, s.prefill_s,
            [b - a for a, b in itertools.pairwise(times)], links,
            s.step_logits if s.keep_logits else None, s.prefill_logits, s.resumes,
            self.group.world, line)

    def _prefill(self, s: RequestState) -> None:
        t0 = time.perf_counter()
        out = self._forward(s, torch.tensor(s.prompt), 0)
        s.prefill_s = time.perf_counter() - t0
        if s.keep_logits and out.dim() == 2:
            s.prefill_logits = out
        self._token(s, out)

    def _replay(self, s: RequestState) -> None:
        """Rebuild every cache from the prompt and all generated tokens but the last (the
        next decode step feeds that one, as the uninterrupted run did)."""
        known = s.prompt + s.tokens[:-1]
        t0 = time.perf_counter()
        self._forward(s, torch.tensor(known), 0)
        s.resumes.append(Resumption(self.last_lost, len(s.tokens), len(known),
                                    time.perf_counter() - t0, self.group.world))

    def _forward(self, s: RequestState, ids: torch.Tensor, pos: int) -> torch.Tensor:
        """One DATA round trip: logits (or a token id, Mode.TOKEN) for positions pos.."""
        assert self.stage is not None
        t0 = time.perf_counter()
        out = self.stage.forward(ids, pos, last_only=self.stage.is_last and
                                 s.mode != Mode.ALL_LOGITS)
        if ids.shape[0] == 1:
            self.decode.add(time.perf_counter() - t0)
        if self.group.world == 1:
            return out
        g = self.group
        g.send(1, Header(Kind.DATA, s.request, pos, out.shape[0], out.shape[1]), out)
        header, payload = g.recv(g.world - 1)
        if header.kind != Kind.RESULT or header.request != s.request or payload is None:
            raise RuntimeError(f"ring protocol: expected the RESULT of request {s.request}, "
                               f"got {header}")
        return payload

    def _token(self, s: RequestState, out: torch.Tensor) -> None:
        if out.dtype == torch.int64:  # Mode.TOKEN: the last stage chose it
            token = int(out[-1])
        else:
            logits = out[-1]
            token = choose(logits, s.temperature, s.seed, len(s.tokens))
            if s.keep_logits:
                s.step_logits.append(logits)
        s.tokens.append(token)
        s.token_times.append(time.perf_counter())
        if s.on_token is not None:
            s.on_token(token)

    def _reset(self, capacity: int, mode: Mode, request: int) -> None:
        assert self.stage is not None
        self.stage.reset(capacity) if capacity else self.stage.idle()
        if self.group.world > 1:
            if capacity > 0:
                self._wake()
            self.group.send(1, Header(Kind.RESET, request, capacity, int(mode)))
            self._ring_idle = capacity == 0

    def _wake(self) -> None:
        if self._ring_idle:
            self.group.wake()
            self._ring_idle = False

    def _counters(self) -> tuple[int, int]:
        g = self.group
        return g.sent.get(1, 0), g.received.get(g.world - 1, 0)

    def _links(self, sent0: int, recv0: int, steps: int) -> list[LinkBytes]:
        g = self.group
        if g.world == 1 or steps == 0:
            return []
        sent, recv = self._counters()
        forward = (sent - sent0) / steps
        links = [LinkBytes(r, r + 1, forward, r == 0) for r in range(g.world - 1)]
        return [*links, LinkBytes(g.world - 1, 0, (recv - recv0) / steps, True)]
