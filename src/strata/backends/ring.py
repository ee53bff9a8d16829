"""`ring` backend: the usual bench requests, run across a `strata ring serve` ring.

Each request is one `run` of the ring's control protocol (strata.ring.control.runner: the leader
plans over the live members, assigns an epoch and drives C's Driver from the member that
holds the first layers). The daemon to ask is $STRATA_RING (HOST:PORT, default
127.0.0.1:7473); any member will do, it passes the request to the leader.

What the daemon's `run` op can and cannot express, and what this backend does about it:
  * timing: the driver (rank 0) measures TTFT, the prefill and every inter-token gap with
    perf_counter in its own process; the trace is rebuilt from those durations, so the
    control round trip and the epoch's group formation stay outside the timed region (their
    sum is kept in info()["ring"]["outside_timed_s"], never hidden).
  * one prefill + M decode steps (llama-bench's tg<M>) is `n = M + 1` tokens, the prefill's
    own token included; a pure tg<M> sends its first decode input (BOS) as a one-token
    prompt, whose "prefill" is the first decode step.
  * decode inputs: the ring feeds back the token it chose (greedy), not random ids; a dense
    model's step costs the same for any id, and the results say so.
  * depth (@d<D>): `run` has no context prefilled outside the timed region, so a depth test
    is refused in one line rather than timed with its context.
  * a member lost mid-request: the reply's gaps cover only the resumed part, so that request
    is not a sample; it runs once more on the re-planned ring and the result says so
    (benchmarks/ring_vs_single.py times churn itself).
"""

from __future__ import annotations

import os
import time
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np

from strata.backends.base import LoadConfig, RunRequest, RunTrace, decode_inputs
from strata.errors import InputError
from strata.models.source import ResolvedModel

ENV = "STRATA_RING"
GEN_INPUTS_NOTE = ("ring: each decode step feeds the token the ring chose (greedy), not a "
                   "random id: a dense model's step costs the same for any id")
CLOCK_NOTE = ("ring: times are the driving member's (rank 0); the control round trip and "
              "the epoch's group formation are outside them (info ring.outside_timed_s)")
SILENCE_S = 60.0  # the daemon says "pending" every second: this much silence is a hang
STATUS_S = 5.0
RETRIES = 1  # a request that lost a member is run again once, on the re-planned ring
LOST_NOTE = ("ring: a member was lost during a repetition: that request was run again on "
             "the re-planned ring (info ring.lost); churn is not in these figures")


def ring_address() -> tuple[str, int]:
    from strata.ring.control.wire import DEFAULT_PORT, parse_addr

    return parse_addr(os.environ.get(ENV) or f"127.0.0.1:{DEFAULT_PORT}")


def daemon_status(addr: tuple[str, int] | None = None,
                  timeout_s: float = STATUS_S) -> dict[str, Any]:
    """The daemon's status reply, or one line naming `strata ring serve` (exit 2)."""
    from strata.ring.control.wire import PeerError, request

    addr = addr or ring_address()
    try:
        return request(*addr, {"op": "status"}, timeout_s=timeout_s,
                       connect_timeout_s=timeout_s)
    except PeerError as exc:
        raise InputError(f"-B ring: {exc}; start one with `strata ring serve` (or set "
                         f"{ENV}=HOST:PORT to a member of a running ring)") from None


def preflight() -> None:
    """bench's check before the host's roofline: is a daemon there at all (a second)?"""
    daemon_status(timeout_s=1.0)


def model_argument(model: ResolvedModel) -> str:
    """What the members resolve: a synthetic/ollama ref as typed (each member writes or finds
    its own copy; the leader compares their hashes), a file as an absolute path (it must be
    at that path on every member)."""
    path = Path(model.ref).expanduser()
    return str(path.resolve()) if path.exists() else model.ref


def special_ids(path: Path, vocab: int) -> tuple[int | None, set[int]]:
    """(BOS to put first, ids a random prompt must avoid) from the GGUF's tokenizer keys."""
    from strata.models.gguf import scan_or_input_error

    kv = scan_or_input_error(path)[0].kv
    ids = {kv.get(f"tokenizer.ggml.{k}") for k in ("bos_token_id", "eos_token_id",
                                                   "padding_token_id")}
    special = {i for i in ids if isinstance(i, int) and not isinstance(i, bool)
               and 0 <= i < vocab}
    bos = kv.get("tokenizer.ggml.bos_token_id")
    adds_bos = kv.get("tokenizer.ggml.add_bos_token", True) is not False
    return (bos if bos in special and adds_bos else None), special


class RingBackend:
    name = "ring"

    def __init__(self) -> None:
        self.addr = ("127.0.0.1", 0)
        self.model_ref = ""
        self._bos: int | None = None
        self._allowed = np.zeros(0, dtype=np.int64)
        self._rng = np.random.default_rng(0)
        self._members: list[dict[str, Any]] = []
        self._leader: str | None = None
        self._last: dict[str, Any] = {}  # the last request's reply (its plan, links, losses)
        self._outside_s: list[float] = []
        self._lost: list[dict[str, Any]] = []  # members lost during this load's requests
        self._kv = "f16"  # every stage's K/V cache (-ctk/-ctv), set by load()

    # Backend protocol ---------------------------------------------------------------------

    def load(self, model: ResolvedModel, config: LoadConfig) -> None:
        """Nothing loads here: the members load their layers at the first request (not
        timed: the driver waits for every stage to be ready). This checks the daemon."""
        self.addr = ring_address()
        status = daemon_status(self.addr)
        self._members = [status["self"], *(p["member"] for p in status.get("peers", [])
                                           if p.get("state") == "live" and p.get("member"))]
        self._leader = status.get("leader")
        self.model_ref = model_argument(model)
        self._kv = config.kv_type  # bench_options refused a pair the stages cannot hold
        spec = model.spec_for("gguf")
        assert spec is not None
        self._bos, special = special_ids(model.path("gguf", "ring"), spec.vocab)
        self._allowed = np.setdiff1d(np.arange(spec.vocab),
                                     np.array(sorted(special), dtype=np.int64))

    def run(self, request: RunRequest) -> RunTrace:
        from strata.ring.control.wire import request as ask

        if request.depth_tokens:
            raise InputError(f"-B ring: depth tests (@d{len(request.depth_tokens)}) are not "
                             "supported: the ring daemon's run op cannot prefill a context "
                             "outside the timed region; drop -d for the ring")
        if not request.prompt_tokens and request.n_gen <= 0:
            raise InputError("empty test: no prompt tokens and nothing to generate")
        gen = decode_inputs(request, lambda n: self._rng.choice(self._allowed, size=n)
                            .tolist(), self._bos)
        prompt = list(request.prompt_tokens) or gen[:1]
        n = request.n_gen + 1 if request.prompt_tokens else request.n_gen
        msg = {"op": "run", "model": self.model_ref, "prompt_ids": prompt, "n": n,
               "kv_type": self._kv}
        for attempt in range(RETRIES + 1):
            t0 = time.perf_counter_ns()
            reply = ask(*self.addr, msg, timeout_s=SILENCE_S, connect_timeout_s=STATUS_S)
            wall_s = (time.perf_counter_ns() - t0) / 1e9
            if not reply.get("lost"):
                trace = self._trace(request, reply, n, t0, wall_s)
                trace.notes += [LOST_NOTE] if attempt else []
                return trace
            # the daemon reports only the resumed segment's gaps: the tokens before the loss
            # have no times, so this request cannot be a sample; the ring has re-planned
            self._lost += reply["lost"]
        who = ", ".join(sorted({str(e["lost"]) for e in self._lost}))
        raise InputError(f"-B ring: members were lost during {RETRIES + 1} requests in a row "
                         f"({who}): no timing to report; check `strata ring status`")

    def random_tokens(self, n: int, seed: int) -> list[int]:
        return np.random.default_rng(seed).choice(self._allowed, size=n).tolist()

    def bos(self) -> int | None:
        return self._bos

    def info(self) -> dict[str, Any]:
        return {"device": _device_text(self._last), "threads": None,
                "kv_dtype": self._kv, "dtype": "float32",
                "weights": "as each member's stage holds them (strata.ring.runtime.stage: "
                           "as stored under lab ops, float32 under torch ops)",
                "gen_inputs": GEN_INPUTS_NOTE, "ring": self._ring_info()}

    def close(self) -> None:
        self._last, self._outside_s, self._lost = {}, [], []

    # helpers --------------------------------------------------------------------------------

    def _trace(self, request: RunRequest, reply: dict[str, Any], n: int, t0: int,
               wall_s: float) -> RunTrace:
        """The driver's durations laid on this process's clock from the request's start."""
        tokens, itl = list(reply["tokens"]), [float(x) for x in reply["itl_s"]]
        if len(tokens) != n or len(itl) != n - 1:
            raise RuntimeError(f"ring: asked {n} tokens, got {len(tokens)} with "
                               f"{len(itl)} gaps")
        first = t0 + round(float(reply["ttft_s"]) * 1e9)
        stamps = [first, *(first + round(s * 1e9) for s in accumulate(itl))]
        has_prompt = bool(request.prompt_tokens)
        self._last = reply
        driver_s = float(reply["ttft_s"]) + sum(itl)
        self._outside_s.append(max(0.0, wall_s - driver_s))
        trace = RunTrace(n_prompt=len(request.prompt_tokens), n_gen=request.n_gen,
                         t_start=t0, t_prefill_end=first if has_prompt else t0,
                         token_ns=stamps[1:] if has_prompt else stamps,
                         notes=[GEN_INPUTS_NOTE, CLOCK_NOTE, _plan_note(reply)])
        trace.internal = {"driver_prefill_s": float(reply["prefill_s"]),
                          "outside_timed_s": self._outside_s[-1]}
        return trace

    def _ring_info(self) -> dict[str, Any]:
        r = self._last
        stages = r.get("stages") or []
        return {
            "connect": f"{self.addr[0]}:{self.addr[1]}", "model": self.model_ref,
            "leader": self._leader,
            "members": [{k: m.get(k) for k in ("id", "host", "port", "device",
                                               "available_bytes", "mem_cap_bytes")}
                        for m in self._members],
            "world": r.get("world"), "plan": stages,
            "predicted_ms_per_token": r.get("predicted_ms_per_token"),
            "links": link_bytes(r),
            "lost": self._lost,
            "outside_timed_s": _mean(self._outside_s)}


def link_bytes(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """Bytes per decoded token on each link, by member id (the driver counts ranks)."""
    stages = reply.get("stages") or []
    ids = [s["member"] for s in stages]
    out = []
    for link in reply.get("links") or []:
        src, dst = int(link["src"]), int(link["dst"])
        out.append({"src": ids[src] if src < len(ids) else src,
                    "dst": ids[dst] if dst < len(ids) else dst,
                    "bytes_per_token": link["bytes_per_token"],
                    "measured": link.get("measured", True)})
    return out


def _device_text(reply: dict[str, Any]) -> str:
    """The plan as the record's device: "ring a[0,2)+b[2,4)" (which member, which layers)."""
    stages = reply.get("stages") or []
    if not stages:
        return "ring"
    return "ring " + "+".join(f"{s['member']}[{s['first']},{s['last']})" for s in stages)


def _plan_note(reply: dict[str, Any]) -> str:
    # the driver counts a link's bytes over decode steps: a prefill-only request has none
    none = "none (one member)" if len(reply.get("stages") or []) < 2 else \
        "not counted (no decode step)"
    links = ", ".join(f"{x['src']}→{x['dst']} {x['bytes_per_token']:,.0f} B"
                      for x in link_bytes(reply)) or none
    pred = reply.get("predicted_ms_per_token")
    predicted = f"; plan predicted {pred:.2f} ms/token" if pred else ""
    return f"ring plan: {_device_text(reply).removeprefix('ring ')}; bytes/token per " \
           f"link: {links}{predicted}"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
