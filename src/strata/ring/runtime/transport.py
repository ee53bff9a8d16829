"""The ring's data plane transport: one group of TCP links per membership epoch.

The leader (rank 0) hosts the torch.distributed TCPStore rendezvous; every epoch's keys live
under their own prefix of it, so a re-formed group never meets the previous epoch's keys, and
the leader keeps one store server per port for the life of its process. Messages only ever
go round the ring (rank r sends to r + 1, the last rank back to 0), so an epoch's data plane
is one TCP connection per link: each rank listens on its address on the route to the
leader, publishes it in the store, connects to the next rank and accepts the previous one
(which names its rank first). TCP_NODELAY, and one sendmsg per message: a message costs one
trip of its bytes, where a gloo process group (this module's earlier transport) paid a
rendezvous round trip per tensor — ~140 us per message on loopback, two tensors a message.

A message is a 5 x int64 header (kind, request id, position, n tokens, width) and, for DATA
and RESULT, one payload: float32 [n, width], or int64 token ids [n] when width is 0, its bytes
right after the header. RESET and STOP have no payload; RESET's position field carries the KV
capacity (0 = free the cache) and its n field the result mode
(strata.ring.runtime.pipeline.Mode).

Failures: a crashed peer's connection closes or resets at once, a hung one stays silent, so
every wait during a request has its own deadline (`op_timeout_s`); either way the operation
raises PeerLost(rank, detect_s). Between requests a stage has nothing to
expect, so it waits on the store instead (`wait_wake`): no deadline, yet it ends when this
process closes the group, and fails when the leader (the store's host) is gone. A
timed-out group is closed, never reused (a message may be half read). The detecting process
writes what it suspects into the epoch's store before it drops its group, so the driver,
which only sees its own neighbours, can follow the reports to the peer that actually failed.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from enum import IntEnum
from typing import Any

from strata.errors import InputError

try:  # the optional [torch] extra: one line, not a traceback, when it is missing
    import torch
    import torch.distributed as dist
except ImportError as exc:
    raise InputError("strata ring runs on PyTorch (torch.distributed), which is not "
                     "installed: pip install 'strata[torch]'") from exc

HEADER_LEN = 5
READY = "ok"
_SERVERS: dict[tuple[str, int], dist.TCPStore] = {}  # the leader's store server per port
_SERVERS_LOCK = threading.Lock()


class Kind(IntEnum):
    DATA = 1  # activations (or token ids) for the next stage
    RESULT = 2  # the last stage's logits or chosen token, back to rank 0
    RESET = 3  # a new request: fresh KV cache of `pos` positions; result mode in `n`
    STOP = 4  # leave serve_stage


@dataclass(frozen=True)
class Header:
    kind: Kind
    request: int = 0
    pos: int = 0
    n: int = 0
    width: int = 0

    def tensor(self) -> torch.Tensor:
        return torch.tensor([int(self.kind), self.request, self.pos, self.n, self.width],
                            dtype=torch.int64)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> Header:
        kind, request, pos, n, width = (int(v) for v in t.tolist())
        return cls(Kind(kind), request, pos, n, width)


class PeerLost(Exception):
    """A peer of this epoch's group crashed, hung past the deadline or left.

    rank: the peer (in this epoch's numbering) the failure is blamed on; detect_s: how long
    the failing operation waited before the failure surfaced (≈ the deadline for a hung
    peer); at: time.time() of the detection, to compare with an outside clock."""

    def __init__(self, rank: int, detect_s: float, epoch: int = 0, reason: str = "") -> None:
        self.rank, self.detect_s, self.epoch, self.reason = rank, detect_s, epoch, reason
        self.at = time.time()
        super().__init__(f"ring peer {rank} lost (epoch {epoch}) after {detect_s * 1e3:.0f} ms"
                         f"{': ' + reason if reason else ''}")


@dataclass
class Group:
    """This process's membership of one epoch's process group."""

    rank: int
    world: int
    epoch: int
    links: Links | None  # None once closed
    store: dist.Store
    op_timeout_s: float
    formed_s: float = 0.0  # how long form_group took
    wakes: int = 0  # idle-ring wake-ups sent (rank 0) or consumed (the others)
    sent: dict[int, int] = field(default_factory=dict)  # bytes sent per destination rank
    received: dict[int, int] = field(default_factory=dict)  # bytes received per source rank

    # -- messages ---------------------------------------------------------------------------

    def send(self, dst: int, header: Header, payload: torch.Tensor | None = None) -> None:
        """One message to the next rank (the only one a ring sends to)."""
        links = self._links()
        if dst != links.next_rank:
            raise ValueError(f"rank {self.rank} sends to rank {links.next_rank}, not {dst}")
        parts: list[Any] = [header.tensor().numpy().tobytes()]
        if payload is not None:
            parts.append(memoryview(payload.detach().contiguous().cpu().numpy()).cast("B"))
        start = time.perf_counter()
        try:
            links.send(parts, self.op_timeout_s)
        except OSError as exc:  # reset, closed, or the deadline (socket.timeout)
            raise self._lost(dst, start, exc) from exc
        self.sent[dst] = self.sent.get(dst, 0) + sum(len(p) for p in parts)

    def recv(self, src: int) -> tuple[Header, torch.Tensor | None]:
        """The next message from `src`, within the op deadline (a stage between requests
        first waits in `wait_wake`, which has none)."""
        links = self._links()
        if src != links.prev_rank:
            raise ValueError(f"rank {self.rank} hears from rank {links.prev_rank}, not {src}")
        start = time.perf_counter()
        deadline = start + self.op_timeout_s
        buf = torch.empty(HEADER_LEN, dtype=torch.int64)
        try:
            links.recv_into(buf, deadline)
            header = Header.from_tensor(buf)
            payload = None
            if header.kind in (Kind.DATA, Kind.RESULT):
                payload = (torch.empty(header.n, dtype=torch.int64) if header.width == 0 else
                           torch.empty(header.n, header.width, dtype=torch.float32))
                links.recv_into(payload, deadline)
        except (OSError, ValueError) as exc:  # ValueError: a header that is no header
            raise self._lost(src, start, exc) from exc
        size = buf.numel() * 8 + (0 if payload is None else
                                  payload.numel() * payload.element_size())
        self.received[src] = self.received.get(src, 0) + size
        return header, payload

    # -- idle stages ----------------------------------------------------------------------------

    def wake(self) -> None:
        """Rank 0, before the first message to a ring of idle stages (a new request, STOP)."""
        self.wakes += 1
        self.store.set(f"wake/{self.wakes}", "1")

    def wait_wake(self, poll_s: float = 0.02) -> bool:
        """An idle stage: wait, with no deadline, until rank 0 wakes the ring (True) or this
        process closes the group (False). Not a gloo recv: a gloo wait cannot be interrupted
        and its timeout closes the connection. The store is polled (store.wait would log a
        warning at every expiry): every 2 ms for the first 0.1 s, for back-to-back requests,
        then every `poll_s`, which bounds what waking adds to a request after a pause."""
        self.wakes += 1
        key = [f"wake/{self.wakes}"]
        start = time.perf_counter()
        while self.links is not None:
            try:
                if self.store.check(key):
                    return True
            except RuntimeError as exc:  # the leader hosts the store: it is gone
                raise self._lost(0, start, exc) from exc
            time.sleep(0.002 if time.perf_counter() - start < 0.1 else poll_s)
        return False

    # -- readiness -------------------------------------------------------------------------------

    def mark_ready(self, error: str = "") -> None:
        """A stage: loaded (or not, with one line saying why) — what rank 0 waits for."""
        self.store.set(f"ready/{self.rank}", error or READY)

    def wait_ready(self, timeout_s: float, poll_s: float = 0.01) -> None:
        """Rank 0: until every stage has loaded its layers, so a request's timings start on a
        ready ring. InputError with a stage's own message when it could not load; PeerLost
        for a rank still silent after `timeout_s`."""
        start = time.perf_counter()
        waiting = list(range(1, self.world))
        while waiting:
            for r in list(waiting):
                if self.store.check([f"ready/{r}"]):
                    state = self.store.get(f"ready/{r}").decode()
                    if state != READY:
                        raise InputError(f"ring rank {r} cannot serve its stage: {state}")
                    waiting.remove(r)
            if waiting and time.perf_counter() - start > timeout_s:
                raise PeerLost(waiting[0], time.perf_counter() - start, self.epoch,
                               f"ranks {waiting} did not load their stages in {timeout_s:.0f} s")
            if waiting:
                time.sleep(poll_s)

    # -- failures ---------------------------------------------------------------------------

    def report_lost(self, suspect: int) -> None:
        """Tell the epoch's store whom this rank suspects (best effort: the store lives in
        the leader's process, which may be the one that is gone)."""
        with contextlib.suppress(RuntimeError):
            self.store.set(f"lost/{self.rank}", str(suspect))

    def blame(self, suspect: int) -> int:
        """Follow the survivors' reports from `suspect`: a rank that reported a loss is alive,
        so the one it suspects is the better candidate."""
        seen = {self.rank}
        while suspect not in seen:
            seen.add(suspect)
            key = f"lost/{suspect}"
            try:
                if not self.store.check([key]):
                    break
                suspect = int(self.store.get(key).decode())
            except (RuntimeError, ValueError):
                break
        return suspect

    def close(self) -> None:
        """Drop the links: their sockets close, so peers blocked on this rank fail at once
        instead of at their deadline."""
        links, self.links = self.links, None
        if links is not None:
            links.close()

    def _links(self) -> Links:
        if self.links is None:
            raise PeerLost(self.rank, 0.0, self.epoch, "the group was closed")
        return self.links

    def _lost(self, peer: int, start: float, exc: BaseException) -> PeerLost:
        waited = time.perf_counter() - start
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return PeerLost(peer, waited, self.epoch, reason[:200])



# -- forming a group ----------------------------------------------------------------------------


def _base_store(master: str, port: int, rank: int, world: int, timeout_s: float) -> dist.Store:
    timeout = timedelta(seconds=timeout_s)
    if rank != 0:
        return dist.TCPStore(master, port, world, is_master=False, timeout=timeout)
    with _SERVERS_LOCK:  # the leader serves every epoch on the same port from one server
        server = _SERVERS.get((master, port))
        if server is None:
            server = dist.TCPStore(master, port, world, is_master=True, timeout=timeout,
                                   wait_for_workers=False)
            _SERVERS[(master, port)] = server
        return server


def local_address(master: str, port: int) -> str:
    """This host's address on the route to `master` (no packet is sent): gloo binds its
    sockets there, so peers on other machines can reach them."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((master, port))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def form_group(master: str, port: int, rank: int, world: int, epoch: int,
               timeout_s: float, op_timeout_s: float | None = None,
               key: bytes | None = None) -> Group:
    """Join epoch `epoch`'s group of `world` ranks whose leader listens on master:port.

    Every rank announces itself under the epoch's prefix and waits (at most `timeout_s`) for
    all the others before the process group is built, so a missing member surfaces as
    PeerLost(that rank) after `timeout_s`, not as a hang. `op_timeout_s` (default timeout_s)
    is the deadline of each send/recv during a request. With `key` (the ring secret) each
    link's two ends prove it before any activation crosses (see Links.connect)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a group of {world}")
    start = time.perf_counter()
    try:
        base = _base_store(master, port, rank, world, timeout_s)
    except RuntimeError as exc:  # the leader's store cannot be reached (or port in use)
        raise PeerLost(0, time.perf_counter() - start, epoch,
                       f"rendezvous at {master}:{port}: {str(exc).splitlines()[0]}") from exc
    store = dist.PrefixStore(f"ring/{epoch}/", base)
    store.set(f"join/{rank}", "1")
    try:
        store.wait([f"join/{r}" for r in range(world)], timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        missing = [r for r in range(world) if not store.check([f"join/{r}"])]
        raise PeerLost(missing[0] if missing else 0, time.perf_counter() - start, epoch,
                       f"ranks {missing} did not join epoch {epoch}") from exc
    try:
        links = Links.connect(store, rank, world, local_address(master, port), timeout_s,
                              LinkProof(key, epoch) if key else None)
    except (OSError, RuntimeError) as exc:  # RuntimeError: the store's wait timed out
        raise PeerLost((rank + 1) % world, time.perf_counter() - start, epoch,
                       f"ring links of epoch {epoch}: {str(exc).splitlines()[0]}") from exc
    group = Group(rank, world, epoch, links, store, op_timeout_s or timeout_s)
    group.formed_s = time.perf_counter() - start
    return group


@dataclass
class Links:
    """One rank's two TCP connections: to the next rank (sends) and from the previous one
    (receives); both None in a group of one."""

    rank: int
    world: int
    out: socket.socket | None
    inp: socket.socket | None

    @property
    def next_rank(self) -> int:
        return (self.rank + 1) % self.world

    @property
    def prev_rank(self) -> int:
        return (self.rank - 1) % self.world

    @classmethod
    def connect(cls, store: dist.Store, rank: int, world: int, host: str,
                timeout_s: float, proof: LinkProof | None = None) -> Links:
        """Listen, publish the address, connect to the next rank, accept the previous (which
        says its rank first: anyone else is refused; with `proof`, it must also answer this
        rank's challenge with the ring secret)."""
        if world == 1:
            return cls(rank, world, None, None)
        out = inp = None
        try:
            with socket.create_server((host, 0)) as server:
                store.set(f"link/{rank}", f"{host}:{server.getsockname()[1]}")
                nxt = (rank + 1) % world
                store.wait([f"link/{nxt}"], timedelta(seconds=timeout_s))
                addr, port = store.get(f"link/{nxt}").decode().rsplit(":", 1)
                out = socket.create_connection((addr, int(port)), timeout=timeout_s)
                out.sendall(rank.to_bytes(8, "little"))
                server.settimeout(timeout_s)
                inp, _peer = server.accept()
                deadline = time.perf_counter() + timeout_s
                said = int.from_bytes(_exactly(inp, 8, deadline), "little")
                if said != (rank - 1) % world:
                    raise ConnectionError(f"rank {rank} was reached by rank {said}, not by "
                                          "its predecessor")
                if proof is not None:
                    proof.exchange(rank, world, out, inp, deadline)
        except BaseException:
            for sock in (out, inp):
                if sock is not None:
                    sock.close()
            raise
        for sock in (out, inp):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(rank, world, out, inp)

    def send(self, parts: list[Any], timeout_s: float) -> None:
        assert self.out is not None
        self.out.settimeout(timeout_s)
        total = sum(len(p) for p in parts)
        sent = self.out.sendmsg(parts)
        if sent < total:  # the kernel took part of it: the rest as one buffer
            self.out.sendall(b"".join(bytes(p) for p in parts)[sent:])

    def recv_into(self, t: torch.Tensor, deadline: float) -> None:
        assert self.inp is not None
        view = memoryview(t.numpy()).cast("B")
        got = 0
        while got < len(view):
            self.inp.settimeout(max(0.001, deadline - time.perf_counter()))
            n = self.inp.recv_into(view[got:])
            if n == 0:
                raise ConnectionResetError(f"rank {self.prev_rank} closed its link")
            got += n

    def close(self) -> None:
        for sock in (self.out, self.inp):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


@dataclass(frozen=True)
class LinkProof:
    """Both ends of a link prove the ring secret: the receiving rank sends a fresh nonce,
    the sending rank answers HMAC(secret, epoch, its rank, nonce). Ordered so that no rank
    waits on a step its neighbour takes only later (every rank sends its rank and nonce
    before it reads anything back)."""

    key: bytes
    epoch: int

    def exchange(self, rank: int, world: int, out: socket.socket, inp: socket.socket,
                 deadline: float) -> None:
        mine = os.urandom(16)
        inp.sendall(mine)
        theirs = _exactly(out, 16, deadline)
        out.sendall(self._mac(rank, theirs))
        got = _exactly(inp, 32, deadline)
        if not hmac.compare_digest(got, self._mac((rank - 1) % world, mine)):
            raise ConnectionError(f"rank {rank}'s predecessor did not prove the ring secret")

    def _mac(self, rank: int, nonce: bytes) -> bytes:
        msg = b"strata-ring/link/%d/%d/" % (self.epoch, rank) + nonce
        return hmac.new(self.key, msg, hashlib.sha256).digest()


def _exactly(sock: socket.socket, n: int, deadline: float) -> bytes:
    data = b""
    while len(data) < n:
        sock.settimeout(max(0.001, deadline - time.perf_counter()))
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("the link closed during its set-up")
        data += chunk
    return data
