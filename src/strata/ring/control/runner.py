"""A generation across the ring: the leader's plan and orders, the members' stages.

`run` (any daemon; forwarded to the leader): the leader plans on the live members
(strata.ring.plan.partition), opens a new epoch, sends each planned member an `assign` (its rank and
layers, the rendezvous of the rank-0 member, the model and its hash), then asks the rank-0
member to `drive` (strata.ring.runtime.pipeline.Driver). When a peer is lost mid-generation the
driver answers with the tokens made so far; the leader drops the lost member, plans again
over the survivors — or fails with the plan's own message of what is missing — and the new
rank 0 resumes by replaying prompt + tokens (the rest equals an uninterrupted run).

Each request forms its epoch's group and ends with STOP, so between requests no member
waits on a group: a node that joins or leaves changes the next plan, never a running one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.errors import InputError
from strata.ring.control import wire
from strata.ring.control.leader import Piece, lead
from strata.ring.control.orders import model_hash
from strata.ring.control.wire import Channel, Message

FORM_TIMEOUT_S = 30.0  # every planned member joins the epoch's group within this


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class StageHost:
    """A member's side: the stage it serves for the current epoch, the driver on rank 0."""

    node: Any  # strata.ring.control.node.Node
    stage: Any = None  # the last Stage loaded, reused when the next epoch keeps its layers
    group: Any = None  # the epoch's group this node serves a stage of (ranks 1..)
    driver: Any = None  # rank 0: the Driver of the current epoch, its group kept
    worker: threading.Thread | None = None
    order: Message = field(default_factory=dict)  # the current epoch's assign
    store_port: int | None = None  # the rendezvous this node hosts when it is rank 0
    hashes: dict[str, str] = field(default_factory=dict)
    run_lock: threading.Lock = field(default_factory=threading.Lock)

    def handlers(self) -> dict[str, wire.Handler]:
        return {"assign": self.assign, "drive": self.drive, "release": self.release,
                "run": self.run}

    def _hash(self, model: str) -> str:
        if model not in self.hashes:
            self.hashes[model] = model_hash(model)
        return self.hashes[model]

    def assign(self, msg: Message, chan: Channel) -> Message:
        """The leader's order for an epoch: refuse another model, else take the share (its
        tensors fetched from the order's source first when the file is not here)."""
        local, fetched = self._local(msg)
        if msg["epoch"] < self.node.epoch and self.order.get("epoch", -1) >= msg["epoch"]:
            raise InputError(f"stale order for epoch {msg['epoch']} (this node is at "
                             f"{self.node.epoch})")
        self.node.bump_epoch(msg["epoch"])
        self._drop_group()
        self.order = {**msg, "local": local}
        said = {"fetched": None if fetched is None else fetched.to_dict()}
        if msg["rank"] == 0:  # the driver hosts the epoch's rendezvous; same port for life
            self.store_port = self.store_port or _free_port(self.node.member.host)
            return {"store_port": self.store_port, **said}
        self.worker = threading.Thread(target=self._serve, args=(dict(self.order),),
                                       daemon=True, name=f"ring-stage epoch {msg['epoch']}")
        self.worker.start()
        return said

    def _local(self, msg: Message) -> tuple[str, Any]:
        """This member's copy of the order's model: its own file (the same as the leader's,
        by hash), else the share's tensors fetched from the order's source into
        $STRATA_HOME/ring/models (the name is never opened as a path here)."""
        from strata.ring.control.transfer import fetch

        try:
            ref = self.node.model_ref(msg["model"])
        except InputError:
            if not msg.get("source"):
                raise
        else:
            mine = self._hash(ref)
            if msg.get("model_hash") != mine:
                raise InputError(f"model {msg['model']} differs here (hash {mine}, the "
                                 f"leader's {msg.get('model_hash')}): give every node the "
                                 "same file")
            return ref, None
        from strata.paths import home_dir

        source = (str(msg["source"][0]), int(msg["source"][1]))
        got = fetch(source, str(msg["model"]), int(msg["first"]), int(msg["last"]),
                    home_dir() / "ring" / "models")
        if got.tensors:
            rate = got.rate_Bps or 0.0
            self.node.log(f"fetched {got.tensors} tensors ({got.bytes / 1e6:.1f} MB) of "
                          f"{msg['model']} from {source[0]}:{source[1]} in {got.seconds:.2f} s "
                          f"({rate / 1e6:.1f} MB/s) into {got.path}")
        return str(got.path), got

    def _drop_group(self) -> None:
        """Leave the previous epoch: as rank 0, STOP its ring; as a stage, close its group
        (serve_stage leaves an idle group at once)."""
        self.release({}, None)
        if self.group is not None:
            self.group.close()
            self.group = None
        if self.worker is not None:
            self.worker.join(timeout=2)

    def shutdown(self) -> None:
        """The daemon is stopping: leave every group first (a process that exits while a
        thread still waits in gloo aborts instead of exiting)."""
        self._drop_group()

    def describe(self) -> Message | None:
        """The share this member holds now, for `ring status`: which layers of which model,
        how they compute, and the ops that run on torch for want of a verified kernel."""
        stage = self.driver.stage if self.driver is not None else self.stage
        if stage is None:
            return None
        return {"model": self.order.get("model", Path(stage.ref).name), "first": stage.first,
                "last": stage.last, "ops": stage.ops, "kv": stage.kv,
                "on_torch": stage.on_torch()}

    def release(self, msg: Message, chan: Channel | None) -> Message:
        """Rank 0 of an epoch the leader is replacing: STOP the ring, drop the group."""
        driver, self.driver = self.driver, None
        if driver is not None:
            with contextlib.suppress(Exception):  # the ring may be half gone already
                driver.stop()
            driver.group.close()
        return {}

    def _serve(self, order: Message) -> None:
        from strata.ring.runtime.assign import StageAssignment
        from strata.ring.runtime.pipeline import serve_stage
        from strata.ring.runtime.transport import PeerLost, form_group

        mine = StageAssignment(order["rank"], order["first"], order["last"])
        group = None
        self._use_threads()
        try:
            group = self.group = form_group(order["master"], order["port"], order["rank"],
                                            order["world"], order["epoch"], FORM_TIMEOUT_S,
                                            order.get("op_timeout_s"),
                                            self.node.config.secret)
            self.stage = serve_stage(group, mine, order["local"], self.stage,
                                     self.node.config.mem_cap_bytes, self._die_hook(),
                                     device=self.node.config.device,
                                     ops=self.node.config.ops,
                                     kv=order.get("kv_type") or "f32")
        except PeerLost as exc:
            self.node.log(f"epoch {order['epoch']}: {exc}")
        except Exception as exc:  # a stage that cannot load: rank 0 reports its words
            self.node.log(f"epoch {order['epoch']}: stage failed: {type(exc).__name__}: {exc}")
        finally:
            if group is not None:
                group.close()

    def _use_threads(self) -> None:
        """Size this thread's kernel team (`serve -t`): OpenMP's count is per calling
        thread, and a stage runs in the thread that serves or drives it."""
        from strata.hardware.threads import set_threads

        set_threads(self.node.config.threads)

    def _die_hook(self) -> Any:
        """--die-at N (a hidden test hook): SIGKILL this daemon at its N-th activation
        message, so a test can lose a member at a known point of a generation."""
        die_at = self.node.config.die_at
        if not die_at:
            return None
        from strata.ring.runtime.transport import Kind

        seen = [0]

        def hook(header: Any) -> None:
            if header.kind == Kind.RESET and header.pos > 0:  # a request starts: count anew
                seen[0] = 0
            if header.kind == Kind.DATA:
                seen[0] += 1
                if seen[0] == die_at:
                    os.kill(os.getpid(), signal.SIGKILL)
        return hook

    def drive(self, msg: Message, chan: Channel) -> Message:
        """Rank 0: generate (or resume) on the epoch's group, formed on the epoch's first
        request and kept for the next ones (the stages wait idle between requests)."""
        from strata.ring.runtime.assign import StageAssignment
        from strata.ring.runtime.pipeline import Driver, RequestState
        from strata.ring.runtime.transport import PeerLost, form_group

        order = self.order
        if order.get("epoch") != msg["epoch"] or order.get("rank") != 0:
            raise InputError(f"drive for epoch {msg['epoch']}: this node holds no rank 0 "
                             "order for it")
        assignments = [StageAssignment(*a) for a in order["assignments"]]
        t0 = time.perf_counter()
        self._use_threads()
        driver = self.driver
        try:
            if driver is None or driver.group.epoch != order["epoch"]:
                self.release({}, None)
                group = form_group(order["master"], self.store_port or 0, 0, order["world"],
                                   order["epoch"], FORM_TIMEOUT_S, order.get("op_timeout_s"),
                                   self.node.config.secret)
                driver = Driver(group, assignments, order["local"], self.stage,
                                self.node.config.mem_cap_bytes, device=self.node.config.device,
                                ops=self.node.config.ops, kv=order.get("kv_type") or "f32")
                self.driver, self.stage = driver, driver.stage
            formed_s = time.perf_counter() - t0
            prompt, n = list(msg["prompt"]), int(msg["n"])
            seed, temp = msg.get("seed"), float(msg.get("temperature", 0.0))
            stop = frozenset(int(t) for t in msg.get("stop_ids") or ())

            def told(token: int) -> None:  # the leader streams it and resumes from them
                chan.send({"pending": True, "token": token})
            if msg.get("tokens"):  # a resumption: the caches are rebuilt from known tokens
                state = RequestState(1, prompt, n, seed, temp, False,
                                     tokens=list(msg["tokens"]), start=time.perf_counter(),
                                     stop_ids=stop, on_token=told)
                result = driver.resume(driver.group, assignments, state=state)
            else:
                result = driver.generate(prompt, n, seed, temp, stop_ids=stop, on_token=told)
        except PeerLost as lost:  # the driver has closed the group: the epoch is over
            self.driver = None
            tokens = list(driver.state.tokens) if driver and driver.state else []
            return {"lost": lost.rank, "detect_s": lost.detect_s, "reason": lost.reason,
                    "tokens": tokens}
        except BaseException:
            self.release({}, None)
            raise
        return {"result": _plain(result), "formed_s": formed_s}

    def run(self, msg: Message, chan: Channel) -> Message:
        """A client's request; with "stream", each token and its text reach it as pending
        messages while the generation goes on."""
        def tell(piece: Message) -> None:
            chan.send({"pending": True, **piece})
        return self.generate(msg, tell if msg.get("stream") else None)

    def generate(self, msg: Message, on_piece: Piece | None = None) -> Message:
        """One generation across the ring (the `run` request's fields), asked of the leader:
        `on_piece` hears {"token", "text"} per token as it is chosen."""
        leader = self.node.leader()
        if leader != self.node.member.id:  # one leader plans; the others pass it on
            peer = self.node.peer_by_id(leader)
            if peer is None:
                raise InputError(f"leader {leader} is not reachable from {self.node.member.id}")
            forward = {**msg, "op": "run", "stream": on_piece is not None}
            reply = wire.request(*peer.addr, forward, timeout_s=30.0,  # silence, not total
                                 on_progress=None if on_piece is None else
                                 lambda m: on_piece({k: v for k, v in m.items()
                                                     if k != "pending"}))
            reply.pop("ok", None)
            return reply
        with self.run_lock:  # one request at a time: each forms its own epoch's group
            return lead(self.node, msg, on_piece)


def _plain(result: Any) -> dict[str, Any]:
    """A GenerationResult as JSON values."""
    from dataclasses import asdict

    return {"tokens": result.tokens, "ttft_s": result.ttft_s, "prefill_s": result.prefill_s,
            "itl_s": result.itl_s, "world": result.world,
            "links": [asdict(x) for x in result.links],
            "resumes": [asdict(r) for r in result.resumes], "timeline": result.timeline}

