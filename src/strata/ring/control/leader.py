"""The leader's side of `strata ring run`: plan, assign an epoch, drive, re-plan on a loss.

The plan comes from strata.ring.plan.partition over the live members (this node included), with the
links between them measured by the members themselves (the activations cross the link
between two members, not the leader's). Every plan gets a new epoch; the orders go out
rank 0 first (it names its rendezvous port), then the others, then `drive` to rank 0.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from strata.errors import InputError
from strata.ring.control.orders import model_hash, reach_of, send_order
from strata.ring.control.wire import KEEPALIVE_S, Message, PeerError, Refused

Piece = Callable[[Message], None]  # {"token": id, "text": what it completes}
MAX_REPLANS = 4  # members lost in one request before the leader gives up
REPLAN_GAIN = 0.2  # a joining member moves a running model only for > 20% predicted gain
ORDER_TIMEOUT_S = 30.0  # an assign loads nothing but a hash: a member slower is hung
DRIVE_SILENCE_S = 30.0  # the driver says "pending" every second: this much silence is a hang


def lead(node: Any, msg: Message, on_piece: Piece | None = None) -> Message:
    """One request, start to end: `on_piece` hears each token with the text it completes
    as the driver chooses it (a member lost mid-way: the replayed tokens are not heard
    twice)."""
    from strata.quality.tokenizer import TextStream, decoder, end_ids

    model, n = str(msg["model"]), int(msg["n"])
    if n < 1:
        raise InputError(f"-n {n}: generate at least one token")
    msg = {**msg, "kv_type": _kv_type(msg)}  # refused here, before any member is ordered
    from strata.models.source import resolve

    resolved = resolve(node.model_ref(model))
    prompt = _prompt(resolved, msg)
    stop = end_ids(resolved) if msg.get("stop_eog") else frozenset()
    with decoder(resolved) as decode:
        stream = TextStream(decode)
        tokens: list[int] = []  # every token the driver told so far, in order

        def heard(progress: Message) -> None:
            if "token" not in progress:
                return
            token = int(progress["token"])
            tokens.append(token)
            if on_piece is not None:
                on_piece({"token": token, "text": stream.push(token)})

        answer = _generate(node, msg, model, prompt, n, stop, tokens, heard)
        answer["text"] = decode(list(answer["tokens"]))
    answer["finish"] = "stop" if answer["tokens"][-1:] and answer["tokens"][-1] in stop \
        else "length"
    return answer


def _prompt(model: Any, msg: Message) -> list[int]:
    """The request's prompt ids: given as ids, as a conversation (`messages`, through the
    chat template), as one user turn (`chat`), or as plain text."""
    from strata.quality.tokenizer import chat_tokens, tokenize

    if msg.get("prompt_ids"):
        return [int(t) for t in msg["prompt_ids"]]
    if msg.get("messages") is not None:
        turns = msg["messages"]
        if not isinstance(turns, list) or not turns or not all(
                isinstance(t, dict) and isinstance(t.get("content"), str) for t in turns):
            raise InputError("messages: give a non-empty list of {role, content} turns")
        ids = chat_tokens(model, [(str(t.get("role", "user")), t["content"]) for t in turns])
    else:
        read = chat_tokens if msg.get("chat") else tokenize  # --chat: the chat template
        ids = read(model, str(msg.get("prompt", "")))
    if not len(ids):
        raise InputError("-p: the prompt is empty")
    return [int(t) for t in ids.ids]


def _generate(node: Any, msg: Message, model: str, prompt: list[int], n: int,
              stop: frozenset[int], tokens: list[int],
              heard: Callable[[Message], None]) -> Message:
    """Plan, drive, and on a lost member plan again over the rest and resume from `tokens`
    (what the driver told so far, filled by `heard`)."""
    digest = model_hash(node.model_ref(model))
    lost: set[str] = set()
    events: list[dict[str, Any]] = []
    segments: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    kv = msg["kv_type"]  # lead() checked it
    for _ in range(MAX_REPLANS + 1):
        plan = _plan(node, model, len(prompt) + n, lost, kv)
        layout = [[s.member, s.first, s.last] for s in plan.stages]
        formed = node.ring_now  # the epoch whose group is up: reused while the plan holds
        fresh = not (formed and formed["model"] == model and formed["layout"] == layout
                     and formed.get("kv") == kv)
        if fresh:
            _release(node, formed)
            epoch = node.bump_epoch(node.epoch + 1)
        else:
            epoch = formed["epoch"]
        node.ring_now = None  # until this request succeeds on it
        rank0 = plan.stages[0].member
        drive = {"op": "drive", "epoch": epoch, "prompt": prompt, "n": n,
                 "seed": msg.get("seed"), "temperature": msg.get("temperature", 0.0),
                 "tokens": list(tokens), "stop_ids": sorted(stop)}
        reply = _assign_and_drive(node, plan, epoch, model, digest, drive, msg, fresh, heard)
        if reply.get("stale"):  # rank 0 no longer holds the epoch (restarted?): form anew
            continue
        if "result" in reply:
            node.ring_now = {"model": model, "layout": layout, "epoch": epoch, "kv": kv}
            segments.append({"epoch": epoch, "plan": _stages(plan), **reply["result"]})
            answer = _answer(model, prompt, reply["result"], plan, segments, events,
                             time.perf_counter() - t_start)
            answer["transfers"] = [{k: v for k, v in x.items() if k != "path"}
                                   for x in reply.get("transfers", [])]
            answer["kv_type"] = kv
            return answer
        who = reply.get("member") or plan.stages[int(reply["lost"])].member
        events.append({"epoch": epoch, "lost": who, "at_token": len(tokens),
                       "detect_s": reply.get("detect_s"), "reason": reply.get("reason"),
                       "driver": rank0})
        node.log(f"epoch {epoch}: lost {who} after {len(tokens)} token(s); planning again")
        lost.add(who)
    raise InputError(f"gave up after losing {len(lost)} members ({', '.join(sorted(lost))})")


def _kv_type(msg: Message) -> str:
    """The request's K/V cache type (`ring run --kv-type`; a request without one: f32, as
    before it could be chosen); InputError for a type the stages cannot hold."""
    from strata.engine.kvcache import kv_type

    kv = str(msg.get("kv_type") or "f32")
    kv_type(kv)
    return kv


def _plan(node: Any, model: str, ctx: int, lost: set[str], kv: str = "f32") -> Any:
    """The plan for this request, each stage's KV cache counted in `kv`. A member that
    joined does not move a model that runs already: the last plan's members keep it unless
    the new plan is predicted more than REPLAN_GAIN faster (an unpredicted gain counts as
    none)."""
    from strata.engine.kvcache import kv_type
    from strata.ring.plan.members import Member
    from strata.ring.plan.partition import model_spec, plan_ring

    members = [node.member, *(Member.from_dict(p.member) for p in node.live()
                              if p.member and p.id not in lost)]
    members = [m for m in members if m.id not in lost]
    links = _links(node, members)
    # Each member's timed layer of this model (asked once per model, in parallel); one that
    # cannot answer keeps the bandwidth x η estimate, and the plan's notes say so
    timer = getattr(node, "layer_timer", None)
    times, missing = timer.gather(model, members) if timer is not None else ({}, {})
    ref = node.model_ref(model)  # this node's copy: the plan reads its shapes and sizes
    cache = kv_type(kv)
    cache.check(model_spec(ref)[0].head_dim)  # q8_0: heads of whole blocks, before any plan
    elem = cache.elem_bytes  # q8_0: 34 bytes per 32 values
    try:
        plan = plan_ring(ref, members, ctx, links, measured=times, kv_elem_bytes=elem)
    except InputError as exc:
        if not lost:
            raise
        raise InputError(f"after losing {', '.join(sorted(lost))}: {exc}") from None
    last = node.last_plans.get(model)
    ids = {m.id for m in members}
    if last and set(last) <= ids and set(last) != {s.member for s in plan.stages}:
        try:
            kept = plan_ring(ref, [m for m in members if m.id in last], ctx, links,
                             measured=times, kv_elem_bytes=elem)
        except InputError:
            kept = None  # the old members cannot hold this request's context: move
        if kept is not None and _gain(kept, plan) <= REPLAN_GAIN:
            plan = kept
    node.last_plans[model] = [s.member for s in plan.stages]
    from strata.ring.control.layer_time import estimate_notes

    plan.notes += estimate_notes(times, missing, node.last_plans[model])
    return plan


def _gain(old: Any, new: Any) -> float:
    a, b = old.predicted_ms_per_token, new.predicted_ms_per_token
    return a / b - 1 if a and b else 0.0


def _links(node: Any, members: list[Any]) -> dict[tuple[str, str], Any]:
    """Each pair's link, measured once by one end and kept by the leader for later plans."""
    from strata.ring.plan.links import Link

    cache: dict[tuple[str, str], Any] = node.links
    for i, a in enumerate(members):
        for b in members[i + 1:]:
            if (a.id, b.id) in cache or (b.id, a.id) in cache:
                continue
            try:
                reply = send_order((a.host, a.port), {"op": "measure", "host": b.host,
                                                      "port": b.port}, ORDER_TIMEOUT_S)
            except PeerError as exc:
                node.log(f"link {a.id} -> {b.id} not measured: {exc}")
                continue
            cache[(a.id, b.id)] = Link.from_dict(reply["link"])
    return cache


def _release(node: Any, formed: dict[str, Any] | None) -> None:
    """Before a new epoch: the old one's rank 0 STOPs its ring (best effort: it may be the
    member that is gone), so no member keeps waiting on a group nobody will use."""
    if not formed:
        return
    rank0 = formed["layout"][0][0]
    addr = reach_of(node).get(rank0)
    if addr is not None:
        with contextlib.suppress(PeerError):
            send_order(addr, {"op": "release", "epoch": formed["epoch"]}, ORDER_TIMEOUT_S)


def _assign_and_drive(node: Any, plan: Any, epoch: int, model: str, digest: str,
                      drive: Message, msg: Message, fresh: bool,
                      heard: Callable[[Message], None]) -> Message:
    """The epoch's orders (a new epoch only), then the generation (`drive`, whose tokens go
    to `heard` as they come); a member lost on the way is reported as {"lost": rank,
    "member": id}. A refusal (another model file) fails the run."""
    by_id = {node.member.id: node.member,
             **{p.id: p.member for p in node.live() if p.id}}
    # Orders go where this node's link reaches each member; the rendezvous is announced at
    # rank 0's advertised host, the address every other member must reach.
    reach = reach_of(node)
    stages = plan.stages
    assignments = [[rank, s.first, s.last] for rank, s in enumerate(stages)]
    order = {"op": "assign", "epoch": epoch, "world": len(stages), "model": model,
             "model_hash": digest, "assignments": assignments,
             "op_timeout_s": msg.get("op_timeout_s"), "kv_type": msg["kv_type"],
             "source": list(_addr(node.member))}  # a member without the file fetches here
    master = _addr(by_id[stages[0].member])[0]
    transfers: list[dict[str, Any]] = []  # members that fetched their share's tensors
    for rank, stage in enumerate(stages if fresh else []):
        addr = reach[stage.member]
        try:
            reply = send_order(addr, {**order, "rank": rank, "first": stage.first,
                                      "last": stage.last, "master": master,
                                      "port": order.get("port", 0)}, ORDER_TIMEOUT_S)
        except Refused as exc:  # alive and saying no (another model file): no re-plan helps
            raise InputError(f"member {stage.member} refused: {exc}") from None
        except PeerError as exc:
            return {"lost": rank, "member": stage.member, "reason": str(exc)}
        if rank == 0:
            order["port"] = reply["store_port"]
        if reply.get("fetched") and reply["fetched"]["tensors"]:
            transfers.append({"member": stage.member, **reply["fetched"]})
    try:
        return {**send_order(reach[stages[0].member], drive, _drive_silence(msg), heard),
                "transfers": transfers}
    except Refused as exc:  # e.g. a stage that cannot load: what it says is the error
        if not fresh and "holds no rank 0 order" in str(exc):
            return {"stale": True}
        raise InputError(f"member {stages[0].member} (rank 0): {exc}") from None
    except PeerError as exc:  # the driver itself went away: start its share elsewhere
        return {"lost": 0, "member": stages[0].member, "reason": str(exc)}


def _drive_silence(msg: Message) -> float:
    """How long the driver may be silent before it is lost: the request's op deadline when
    it gives one (a driver whose link went down is then found as fast as a stage the driver
    waits on), never under two of its keepalives; else DRIVE_SILENCE_S."""
    op = msg.get("op_timeout_s")
    return DRIVE_SILENCE_S if not op else max(float(op), 2 * KEEPALIVE_S)


def _addr(member: Any) -> tuple[str, int]:
    m = member if isinstance(member, dict) else member.to_dict()
    return str(m["host"]), int(m["port"])


def _stages(plan: Any) -> list[dict[str, Any]]:
    return [{"member": s.member, "first": s.first, "last": s.last} for s in plan.stages]


def _answer(model: str, prompt: list[int], result: Message, plan: Any,
            segments: list[dict[str, Any]], events: list[dict[str, Any]],
            total_s: float) -> Message:
    itl = [x for seg in segments for x in seg["itl_s"]]
    decode_s = sum(itl)
    return {"model_filename": model, "prompt_ids": prompt, "tokens": result["tokens"],
            "n_prompt": len(prompt), "n_gen": len(result["tokens"]),
            "ttft_s": segments[0]["ttft_s"], "prefill_s": segments[0]["prefill_s"],
            "decode_tps": len(itl) / decode_s if decode_s > 0 else None, "itl_s": itl,
            "e2e_s": total_s, "world": result["world"], "stages": _stages(plan),
            "predicted_ms_per_token": plan.predicted_ms_per_token,
            "links": result["links"], "resumes": result["resumes"], "lost": events,
            "timeline": segments[-1].get("timeline")}
