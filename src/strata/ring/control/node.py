"""The `strata ring serve` daemon: membership, liveness and the control server.

Each daemon keeps one outgoing control connection per peer (`Link`): a hello (strata
version, protocol, member info) admits the peer, then a ping every `heartbeat_s` keeps it
live. A closed connection drops the peer at once (a crash: the kernel closes the socket),
a silent one after `timeout_s` (a hung process). The leader is the member with the lowest
id among the live ones, this node included; the membership epoch rises with every change,
so an order from an older epoch is recognisable as stale.

Peers come from `--peers`, from mDNS, from an incoming hello and from what live peers say
they know (gossip in hello/ping answers), so one `--peers` entry is enough to join.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from strata import __version__
from strata.errors import InputError
from strata.ring.control import wire
from strata.ring.control.diagnose import explain, ring_hints
from strata.ring.control.discovery import Advert, Zeroconf
from strata.ring.control.models import ModelDirs
from strata.ring.control.runner import StageHost
from strata.ring.control.wire import Channel, Message, PeerError

Addr = tuple[str, int]
Log = Callable[[str], None]


@dataclass
class NodeConfig:
    name: str
    host: str = "0.0.0.0"  # where the control server listens
    port: int = wire.DEFAULT_PORT
    peers: list[Addr] = field(default_factory=list)
    device: str = "cpu"
    ops: str = "lab"  # how this node's stages compute: lab kernels (as stored) or torch
    mem_cap_bytes: int | None = None
    threads: int | None = None  # the kernels' thread team (None: hardware.threads' default)
    advertise: str | None = None  # the address peers reach us by (default: from the socket)
    mdns: bool = True
    heartbeat_s: float = 0.5
    timeout_s: float = 3.0  # a peer silent this long is dropped
    version: str = __version__  # what hello announces (a test may pretend another)
    die_at: int | None = None  # test hook: crash at this activation message of a run
    db: Path | None = None  # results DB (serve --db): roofline and η here, fleet's benches
    secret: bytes = b""  # the ring secret every connection proves (strata.ring.control.auth)
    models: ModelDirs | None = None  # what this member serves (default: the current directory)


@dataclass
class PeerState:
    """What this node knows of one peer address; `member` once its hello was accepted."""

    addr: Addr
    state: str = "connecting"  # connecting | live | unreachable | refused | lost | left
    member: dict[str, Any] | None = None
    reason: str | None = None
    rtt_ms: float | None = None
    last_seen: float = 0.0

    @property
    def id(self) -> str | None:
        return None if self.member is None else str(self.member["id"])


class Node:
    """The daemon's state; `start()` binds the port (or fails in one line) and starts the
    accept loop, discovery and the links; `stop()` says bye to the peers and closes all."""

    def __init__(self, config: NodeConfig, member: Any, log: Log | None = None) -> None:
        self.config = config
        self.member = member  # strata.ring.plan.members.Member of this host
        self.log = log or (lambda _line: None)
        self.epoch = 0
        self.peers: dict[Addr, PeerState] = {}
        self.lock = threading.RLock()
        self.stopped = threading.Event()
        self.handlers: dict[str, wire.Handler] = {
            "hello": self._on_hello, "ping": self._on_ping, "status": self._on_status,
            "bye": self._on_bye, "leave": self._on_leave, "probe": self._on_probe,
            "measure": self._on_measure}
        self.server: wire.Server | None = None
        self.mdns: Zeroconf | None = None
        self.links: dict[tuple[str, str], Any] = {}  # measured links, by (from id, to id)
        self.last_plans: dict[str, list[str]] = {}  # model -> member ids of its last plan
        self.ring_now: dict[str, Any] | None = None  # leader: the epoch whose group is up
        self.stages = StageHost(self)  # this node's share of a run, and `run` itself
        self.handlers.update(self.stages.handlers())
        from strata.ring.control import fleet  # `strata fleet bench` asks members to bench

        self.handlers.update(fleet.handlers(self))
        from strata.ring.control import layer_time  # `time_layer`: the plan's measured stage times

        self.handlers.update(layer_time.handlers(self))
        from strata.ring.control.transfer import Source  # members without the file

        self.handlers.update(Source(self).handlers())

    # --- life cycle -------------------------------------------------------------------
    def start(self, sock: socket.socket | None = None,
              extra: list[socket.socket] | None = None) -> None:
        """`sock`: the control port, bound already (wire.bind) so that a port in use is
        reported before the host is probed; `extra`: the same port on more addresses."""
        if not self.config.secret:
            raise InputError("a ring node needs a secret (strata.ring.control.auth)")
        self.server = wire.Server(self.config.host, self.config.port, self.handlers,
                                  key=self.config.secret,
                                  idle_timeout_s=max(30.0, 4 * self.config.timeout_s),
                                  sock=sock, extra=list(extra or []), vet=self.vet,
                                  log=self.log)
        self.member.port = self.config.port = self.server.port
        self.server.serve_in_thread()
        for addr in self.config.peers:
            self.add_peer(addr)
        if self.config.mdns:
            host = self.config.advertise or ("" if self.config.host in ("", "0.0.0.0")
                                             else self.config.host)
            self.mdns = Zeroconf(self._advert(), self.server.port,
                                 lambda h, p, _props: self.add_peer((h, p)), interface=host)
            if not self.mdns.start():
                self.log(f"mDNS off: {self.mdns.reason}; peers come from --peers")

    def stop(self) -> None:
        """Leave cleanly: peers hear 'bye' now instead of waiting out the timeout."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        for peer in self.live():
            with contextlib.suppress(InputError):
                wire.request(*peer.addr, {"op": "bye", "id": self.member.id},
                                timeout_s=1.0, connect_timeout_s=1.0)
        self.stages.shutdown()
        if self.mdns is not None:
            self.mdns.close()
        if self.server is not None:
            self.server.stop()

    # --- membership -------------------------------------------------------------------
    def add_peer(self, addr: Addr) -> None:
        """Start a link to `addr` unless one exists (or it is this node's own address)."""
        addr = (addr[0], int(addr[1]))
        with self.lock:
            if self.stopped.is_set() or addr in self.peers or self._is_self(addr):
                return
            self.peers[addr] = PeerState(addr)
        threading.Thread(target=Link(self, addr).run, daemon=True,
                         name=f"ring-link {addr[0]}:{addr[1]}").start()

    def _is_self(self, addr: Addr) -> bool:
        return addr[1] == self.config.port and addr[0] in (
            "127.0.0.1", "localhost", self.config.host, self.member.host)

    def live(self) -> list[PeerState]:
        with self.lock:
            return [p for p in self.peers.values() if p.state == "live"]

    def member_ids(self) -> list[str]:
        return sorted([self.member.id, *(p.id for p in self.live() if p.id)])

    def leader(self) -> str:
        """Lowest id among the live members: every node computes the same one once their
        views agree, without an election round."""
        return self.member_ids()[0]

    def transition(self, peer: PeerState, state: str, reason: str | None = None) -> None:
        """Record a peer's new state; a member arriving or going bumps the epoch."""
        with self.lock:
            was_member = peer.state == "live"
            if peer.state == state and peer.reason == reason:
                return
            peer.state, peer.reason = state, reason
            if was_member != (state == "live"):
                self.epoch += 1
                if self.mdns is not None:
                    self.mdns.update(self._advert())
        who = peer.id or f"{peer.addr[0]}:{peer.addr[1]}"
        self.log(f"{who}: {state}" + (f" ({reason})" if reason else "")
                 + f"; epoch {self.epoch}, leader {self.leader()}")

    def bump_epoch(self, at_least: int) -> int:
        with self.lock:
            self.epoch = max(self.epoch + 1, at_least)
            return self.epoch

    def _advert(self) -> Advert:
        m = self.member
        return Advert(m.id, m.device, int(m.available_bytes or 0), m.bandwidth_Bps,
                      self.config.version, self.epoch)

    def known(self) -> list[dict[str, Any]]:
        """Live peers as id/host/port, for gossip."""
        return [{"id": p.id, "host": p.addr[0], "port": p.addr[1]} for p in self.live()]

    def learn(self, known: list[dict[str, Any]]) -> None:
        live_ids = set(self.member_ids())
        for k in known:
            if k.get("id") not in live_ids:
                self.add_peer((str(k["host"]), int(k["port"])))

    def peer_by_id(self, member_id: str) -> PeerState | None:
        return next((p for p in self.live() if p.id == member_id), None)

    # --- what peers may name ------------------------------------------------------------
    @property
    def models(self) -> ModelDirs:
        if self.config.models is None:
            self.config.models = ModelDirs.of(None)
        return self.config.models

    def model_ref(self, name: str) -> str:
        """The local file (or preset) a peer's model name stands for, if served here."""
        return self.models.ref(name)

    def list_models(self) -> list[str]:
        return self.models.names()

    def vet(self, msg: Message) -> None:
        """Every request that names a model is checked here, before its handler runs: a
        model outside --models is refused with nothing opened and no work started."""
        if "model" in msg and not (msg.get("op") == "assign" and msg.get("source")):
            # (an order naming a source: a model not here is fetched into the cache)
            self.model_ref(str(msg["model"]))
        if msg.get("op") == "bench":
            from strata.ring.control.fleet import bench_models

            for name in bench_models(msg.get("args")):
                self.model_ref(name)

    # --- handlers ---------------------------------------------------------------------
    def check_hello(self, msg: Message) -> None:
        """Refuse, with the reason, a peer that cannot be in this ring."""
        if msg.get("protocol") != wire.PROTOCOL:
            raise InputError(f"ring protocol {msg.get('protocol')} is not this node's "
                             f"{wire.PROTOCOL}: run the same strata version on every node")
        if msg.get("version") != self.config.version:
            raise InputError(f"strata {msg.get('version')} cannot join a ring of strata "
                             f"{self.config.version} (node {self.member.id}): install the "
                             "same version on every node")
        from strata.ring.plan.members import Member

        theirs = Member.from_dict(dict(msg.get("member") or {})).to_dict()  # checks fields
        if theirs.get("id") == self.member.id and int(theirs.get("port", 0)) != \
                self.config.port:
            raise InputError(f"id {self.member.id!r} is taken by the node at port "
                             f"{self.config.port}: give each daemon its own --name")

    def hello_message(self) -> Message:
        return {"op": "hello", "protocol": wire.PROTOCOL, "version": self.config.version,
                "member": self.member.to_dict(), "epoch": self.epoch, "known": self.known()}

    def _on_hello(self, msg: Message, chan: Channel) -> Message:
        self.check_hello(msg)
        theirs = dict(msg.get("member") or {})
        if theirs.get("id") != self.member.id:
            # They reached us; we reach them too (our own link gives us their liveness).
            self.add_peer((chan.where.rpartition(":")[0], int(theirs.get("port", 0))))
            self.learn(list(msg.get("known") or []))
        return {"member": self.member.to_dict(), "version": self.config.version,
                "epoch": self.epoch, "leader": self.leader(), "known": self.known()}

    def _on_ping(self, msg: Message, chan: Channel) -> Message:
        return {"epoch": self.epoch, "known": self.known(), "t": msg.get("t")}

    def _on_bye(self, msg: Message, chan: Channel) -> Message:
        for peer in self.live():
            if peer.id == msg.get("id"):
                self.transition(peer, "left", "said bye")
        return {}

    def _on_leave(self, msg: Message, chan: Channel) -> Message:
        # Answer first, then stop: the caller gets its reply before the sockets close.
        threading.Timer(0.05, self.stop).start()
        return {"leaving": self.member.id}

    def _on_probe(self, msg: Message, chan: Channel) -> Message:
        """Answer a link measurement on this connection (strata.ring.plan.links' protocol)."""
        from strata.ring.plan.links import serve_link_probe

        return {wire.THEN: lambda sock: serve_link_probe(sock, self.config.timeout_s * 4)}

    def _on_measure(self, msg: Message, chan: Channel) -> Message:
        """Measure the link from this node to another member (RTT, bandwidth): the plan
        needs the link as the activations will cross it, not as the leader sees it."""
        from strata.ring.plan.links import measure_link

        host, port = str(msg["host"]), int(msg["port"])
        probe = wire.connect(host, port, self.config.timeout_s)
        try:
            wire.call(probe, {"op": "probe"}, self.config.timeout_s)
            link = measure_link(probe.sock, timeout_s=max(10.0, self.config.timeout_s))
        finally:
            probe.close()
        return {"link": link.to_dict()}

    def _on_status(self, msg: Message, chan: Channel) -> Message:
        with self.lock:
            peers = [asdict(p) for p in self.peers.values()]
        now = time.monotonic()
        for p in peers:
            p["addr"] = f"{p['addr'][0]}:{p['addr'][1]}"
            p["last_seen_s"] = round(now - p.pop("last_seen"), 3) if p["state"] == "live" \
                else None
            p["fix"] = explain(p["state"], p["reason"], p["addr"])
        reply = {"self": self.member.to_dict(), "version": self.config.version,
                "epoch": self.epoch, "leader": self.leader(), "peers": peers,
                "links": [{"src": a, "dst": b, **link.to_dict()}
                          for (a, b), link in list(self.links.items())],
                "mdns": "off (--no-mdns)" if self.mdns is None else (self.mdns.reason or "on")}
        reply["hints"] = ring_hints(reply)
        reply["stage"] = self.stages.describe()
        return reply


class Link:
    """This node's connection to one peer: connect, hello, then ping until it fails; then
    retry (a restarted node rejoins by itself). One thread per peer address."""

    RETRY_S = 1.0
    REFUSED_RETRY_S = 10.0  # another version will not change by itself; check rarely

    def __init__(self, node: Node, addr: Addr) -> None:
        self.node, self.addr = node, addr
        self.peer = node.peers[addr]

    def run(self) -> None:
        cfg = self.node.config
        while not self.node.stopped.is_set():
            wait = self.RETRY_S
            try:
                chan = wire.connect(*self.addr, timeout_s=cfg.timeout_s)
            except wire.Refused as exc:  # another ring's secret: it will not change soon
                self.node.transition(self.peer, "refused", str(exc).split(": ", 1)[-1])
                wait = self.REFUSED_RETRY_S
            except PeerError as exc:
                self.node.transition(self.peer, "unreachable", str(exc).split(": ", 1)[-1])
            else:
                try:
                    wait = self._session(chan)
                finally:
                    chan.close()
                if wait is None:
                    return
            self.node.stopped.wait(wait)

    def _session(self, chan: Channel) -> float | None:
        """Hello and pings on one connection; the seconds to wait before retrying, or None
        when this address should be forgotten (it is this node itself, or a duplicate)."""
        node, cfg = self.node, self.node.config
        t0 = time.perf_counter()
        try:
            reply = wire.call(chan, node.hello_message(), cfg.timeout_s)
        except PeerError as exc:
            refused = "closed the connection" not in str(exc) and "no answer" not in str(exc)
            node.transition(self.peer, "refused" if refused else "unreachable",
                            str(exc).split(": ", 1)[-1])
            return self.REFUSED_RETRY_S if refused else self.RETRY_S
        member = dict(reply["member"])
        if member["id"] == node.member.id or self._duplicate(member["id"]):
            with node.lock:  # ourselves under another address, or a peer already linked
                node.peers.pop(self.addr, None)
            return None
        self.peer.member = member
        self.peer.rtt_ms = (time.perf_counter() - t0) * 1e3  # until the first ping's
        self.peer.last_seen = time.monotonic()
        node.transition(self.peer, "live")
        node.learn(list(reply.get("known") or []))
        return self._ping_loop(chan)

    def _duplicate(self, member_id: str) -> bool:
        other = self.node.peer_by_id(member_id)
        return other is not None and other is not self.peer

    def _ping_loop(self, chan: Channel) -> float:
        node, cfg = self.node, self.node.config
        while not node.stopped.wait(cfg.heartbeat_s):
            if self.peer.state != "live":
                return Link.RETRY_S  # it said bye: reconnect later if it comes back
            t0 = time.perf_counter()
            try:
                reply = wire.call(chan, {"op": "ping", "t": t0}, cfg.timeout_s)
            except PeerError as exc:
                hung = "no answer" in str(exc)
                node.transition(self.peer, "lost", f"no answer within {cfg.timeout_s:g} s"
                                if hung else "connection closed")
                return Link.RETRY_S
            self.peer.rtt_ms = (time.perf_counter() - t0) * 1e3
            self.peer.last_seen = time.monotonic()
            node.learn(list(reply.get("known") or []))
        return Link.RETRY_S
