"""The link between two members: round-trip time and bulk bandwidth over one TCP connection.

A decoded token crosses every link of the ring once, carrying hidden x dtype bytes (8-32 KiB
for real models), so decode pays each link's latency and prefill its bandwidth (RESEARCH.md,
"Several machines"). Both are measured here on a plain TCP socket, the same kind of stream
gloo sends activations over:

- ping-pong: one byte there and back, `pings` times; the median is the RTT;
- bulk: `bulk_bytes` sent, one byte acknowledged; bandwidth = bytes / (time - RTT), the best
  of `bulk_repeats` (peaks are maxima, as for the roofline).

The protocol is tiny so that E's control daemon can hand an accepted connection to
`serve_link_probe` after its own handshake; `LinkProbeServer` is a stand-alone responder
(tests, or a node without a daemon). `measure_link` takes a connected socket or "host:port".
"""

from __future__ import annotations

import contextlib
import re
import socket
import statistics
import struct
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from strata.errors import InputError

PING, BULK, ACK, QUIT = b"p", b"b", b"k", b"q"
_LEN = struct.Struct("!Q")
CHUNK = 1 << 16  # bytes per send: large enough that syscalls do not bound loopback
PINGS = 20
BULK_BYTES = 8 * 2**20  # 8 MiB: ~0.7 s on 100 Mbit/s, a few ms on loopback
BULK_REPEATS = 2
MAX_BULK = 1 << 30  # a responder refuses more than this (a garbled header, not a probe)


@dataclass(frozen=True)
class Link:
    rtt_s: float  # round trip of one byte (median of the pings)
    bandwidth_Bps: float  # bulk transfer rate, bytes/s
    rtt_samples_s: tuple[float, ...] = ()
    method: str = ""  # how it was measured (or "given": a --link figure typed by the user)

    @property
    def rtt_ms(self) -> float:
        return self.rtt_s * 1e3

    @property
    def MBps(self) -> float:  # the contract's name: MB/s (10^6 bytes)
        return self.bandwidth_Bps / 1e6

    def one_way_s(self, nbytes: float) -> float:
        """Time for `nbytes` to arrive: half a round trip of latency plus the transfer."""
        return self.rtt_s / 2 + nbytes / self.bandwidth_Bps

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rtt_samples_s"] = list(self.rtt_samples_s)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Link:
        """From the wire form; ValueError for an RTT < 0 or a bandwidth <= 0."""
        if float(d["rtt_s"]) < 0 or float(d["bandwidth_Bps"]) <= 0:
            raise ValueError(f"rtt_s {d['rtt_s']} must be >= 0, bandwidth_Bps "
                             f"{d['bandwidth_Bps']} > 0")
        return cls(float(d["rtt_s"]), float(d["bandwidth_Bps"]),
                   tuple(d.get("rtt_samples_s", ())), str(d.get("method", "")))


_GIVEN = re.compile(r"^(?P<rtt>[0-9.]+):(?P<mbs>[0-9.]+)$")


def parse_link(text: str) -> Link:
    """`RTT_MS:MB/s` (a --link figure: a network you have not measured yet)."""
    m = _GIVEN.match(text.strip())
    try:
        rtt, mbs = (float(m["rtt"]), float(m["mbs"])) if m else (-1.0, -1.0)
    except ValueError:
        rtt = mbs = -1.0
    if rtt < 0 or mbs <= 0:
        raise InputError(f"--link {text}: expected RTT_MS:MB/s with RTT >= 0 and MB/s > 0 "
                         "(e.g. --link 0.3:110 for gigabit Ethernet)")
    return Link(rtt / 1e3, mbs * 1e6, method="given")


# -- measuring ---------------------------------------------------------------------------------


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return bytes(buf)


def _discard(sock: socket.socket, n: int) -> None:
    """Read and drop `n` bytes (into one reused buffer: the bulk is not kept)."""
    view = memoryview(bytearray(min(n, 1 << 20)))
    left = n
    while left:
        got = sock.recv_into(view, min(left, len(view)))
        if not got:
            raise ConnectionError("peer closed the connection")
        left -= got


def _connect(target: str, timeout_s: float) -> socket.socket:
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"link {target}: expected host:port")
    try:
        return socket.create_connection((host, int(port)), timeout=timeout_s)
    except OSError as exc:
        raise InputError(f"link {target}: cannot connect ({exc.strerror or exc})") from None


def _ping(sock: socket.socket) -> float:
    t0 = time.perf_counter_ns()
    sock.sendall(PING)
    if _recv_exact(sock, 1) != PING:
        raise ConnectionError("ping answered with something else: not a link probe")
    return (time.perf_counter_ns() - t0) / 1e9


def _bulk(sock: socket.socket, nbytes: int, payload: memoryview) -> float:
    """Seconds from the header leaving to the acknowledgement of the last byte arriving."""
    t0 = time.perf_counter_ns()
    sock.sendall(BULK + _LEN.pack(nbytes))
    left = nbytes
    while left:
        n = min(left, len(payload))
        sock.sendall(payload[:n])
        left -= n
    if _recv_exact(sock, 1) != ACK:
        raise ConnectionError("bulk not acknowledged: not a link probe")
    return (time.perf_counter_ns() - t0) / 1e9


def measure_link(target: socket.socket | str, *, pings: int = PINGS,
                 bulk_bytes: int = BULK_BYTES, bulk_repeats: int = BULK_REPEATS,
                 timeout_s: float = 10.0) -> Link:
    """RTT and bandwidth to a link-probe responder: `target` is a connected socket (left
    open, the responder told to stop) or "host:port" (connected and closed here).
    InputError naming the target when it cannot be reached or does not answer as a probe."""
    own = isinstance(target, str)
    sock = _connect(target, timeout_s) if isinstance(target, str) else target
    where = target if isinstance(target, str) else _peer_name(sock)
    try:
        sock.settimeout(timeout_s)
        _nodelay(sock)
        _ping(sock)  # warm-up: the first round trip pays for cold paths
        rtts = [_ping(sock) for _ in range(max(1, pings))]
        rtt = statistics.median(rtts)
        payload = memoryview(bytes(min(CHUNK, bulk_bytes)))
        best = min(_bulk(sock, bulk_bytes, payload) for _ in range(max(1, bulk_repeats)))
        sock.sendall(QUIT)
    except (OSError, ConnectionError) as exc:
        raise InputError(f"link {where}: measurement failed ({exc})") from None
    finally:
        if own:
            sock.close()
    # the acknowledgement's trip back is latency, not transfer
    transfer = max(best - rtt, best * 1e-3)
    return Link(rtt, bulk_bytes / transfer, tuple(rtts),
                f"TCP: median of {len(rtts)} one-byte ping-pongs; best of {bulk_repeats} "
                f"x {bulk_bytes / 2**20:g} MiB bulk, bytes / (time - RTT)")


def _nodelay(sock: socket.socket) -> None:
    """Send each ping at once (Nagle would hold a one-byte write back); a non-TCP socket
    (a local socket pair in a test) has no such option and needs none."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _peer_name(sock: socket.socket) -> str:
    with contextlib.suppress(OSError):
        peer = sock.getpeername()
        if isinstance(peer, tuple):
            return f"{peer[0]}:{peer[1]}"
    return "peer"


# -- answering ---------------------------------------------------------------------------------


def serve_link_probe(sock: socket.socket, timeout_s: float = 30.0) -> None:
    """Answer one prober on `sock` until it says quit or goes away (the socket is left
    open: the caller owns it)."""
    sock.settimeout(timeout_s)
    _nodelay(sock)
    while True:
        op = sock.recv(1)
        if op in (b"", QUIT):
            return
        if op == PING:
            sock.sendall(PING)
        elif op == BULK:
            (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
            if n > MAX_BULK:
                raise ConnectionError(f"bulk of {n} bytes asked: not a link probe")
            _discard(sock, n)
            sock.sendall(ACK)
        else:
            raise ConnectionError(f"unknown link-probe op {op!r}")


class LinkProbeServer:
    """A listening socket that answers `measure_link("host:port")`, one thread per prober."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sock = socket.create_server((host, port))
        self.port: int = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True,
                                        name=f"link-probe :{self.port}")

    def __enter__(self) -> LinkProbeServer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):  # wakes the blocked accept(); close alone does not
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed: stop
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    @staticmethod
    def _answer(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError, ConnectionError):
            serve_link_probe(conn)


def from_document(doc: Any, where: str) -> dict[tuple[str, str], Link]:
    """Measured links from JSON: {"links": [{"src", "dst", "rtt_s", "bandwidth_Bps"}, ...]}
    (absent: none). InputError naming `where` for a malformed entry."""
    raw = doc.get("links", []) if isinstance(doc, dict) else []
    out: dict[tuple[str, str], Link] = {}
    for entry in raw:
        try:
            out[(str(entry["src"]), str(entry["dst"]))] = Link.from_dict(entry)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{where}: a link needs src, dst, rtt_s and bandwidth_Bps "
                             f"({exc})") from None
    return out
