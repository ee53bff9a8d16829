"""The ring's control protocol: JSON lines over TCP between `strata ring serve` daemons.

One message per line, a JSON object. A request carries `op` (hello, ping, status, assign,
drive, run, leave, bye) and the daemon answers each with one line: `{"ok": true, ...}` or
`{"ok": false, "error": "<one line for the user>"}`. The data plane (activations, KV)
never travels here: it goes over torch.distributed (strata.ring.runtime.transport); this channel
only forms the ring, tells members what to hold and carries liveness.

Liveness comes from these connections, not from mDNS (a crashed node's record lingers for
minutes): every daemon keeps one connection to each peer and pings it; a closed socket
is a lost peer at once, a silent one after the heartbeat timeout.
"""

from __future__ import annotations

import contextlib
import errno
import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from strata.errors import InputError
from strata.ring.control import auth

PROTOCOL = 2  # bumped when a message changes meaning; peers with another one are refused
DEFAULT_PORT = 7473
KEEPALIVE_S = 1.0  # a request still being worked on says so this often
HANDSHAKE_S = 5.0  # a client that has not proved the secret by then is dropped
HANDSHAKE_LINE = 1024  # what a stranger may make the daemon read before it proves anything
MAX_LINE = 1 << 24  # a run's reply carries its tokens and timings: generous, not unbounded

Message = dict[str, Any]
# A handler's reply may carry THEN: a function given the raw socket once the reply is sent
# (a link probe then runs on the same connection, past the control handshake).
THEN = "_then"
Handler = Callable[[Message, "Channel"], Message]


class PeerError(InputError):
    """A peer that cannot be reached, refuses, or does not answer in time (exit 2)."""


class Refused(PeerError):
    """The peer answered, and its answer is no (`ok: false` with its reason): it is alive."""


class Channel:
    """One TCP connection carrying JSON lines, safe to send on from several threads."""

    def __init__(self, sock: socket.socket, where: str) -> None:
        self.sock = sock
        self.where = where  # "host:port", for messages
        self._reader = sock.makefile("rb")
        self._send_lock = threading.Lock()

    def send(self, msg: Message) -> None:
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        with self._send_lock:
            self.sock.sendall(data)

    def recv(self, timeout_s: float | None, limit: int = MAX_LINE) -> Message | None:
        """The next message; None when the peer closed the connection. A silent peer
        raises TimeoutError after `timeout_s` (None: wait for ever)."""
        self.sock.settimeout(timeout_s)
        line = self._reader.readline(limit)
        if not line:
            return None
        try:
            msg = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PeerError(f"{self.where} sent something that is not the strata ring "
                            f"protocol ({exc.msg})") from None
        if not isinstance(msg, dict):
            raise PeerError(f"{self.where} sent a non-object message")
        return msg

    def read_some(self, limit: int, timeout_s: float) -> bytes:
        """Raw bytes that follow a reply (a tensor a member sends): what the line reader
        already holds first, then the socket; b"" when the peer closed."""
        self.sock.settimeout(timeout_s)
        return self._reader.read1(limit)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._reader.close()
            self.sock.close()


def parse_addr(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """"host:port" (or "host", or "[v6]:port") -> (host, port); InputError naming the text."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep or (host.startswith("[") != host.endswith("]")):
        host, port = text, str(default_port)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"peer {text!r}: expected host:port (port 1-65535)")
    return host, int(port)


def parse_peers(text: str | None) -> list[tuple[str, int]]:
    return [parse_addr(p) for p in (text or "").split(",") if p.strip()]


def connect(host: str, port: int, timeout_s: float, key: bytes | None = None) -> Channel:
    """A connection to a daemon that proved the ring secret both ways (`key`, default this
    process's: strata.ring.control.auth), or one line saying why not (refused, unreachable,
    slow, another secret)."""
    key = key if key is not None else auth.current()
    where = f"{host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except ConnectionRefusedError:
        raise PeerError(f"{where}: connection refused (no strata ring serve there?)") from None
    except TimeoutError:
        raise PeerError(f"{where}: unreachable (no answer to connect within "
                        f"{timeout_s:g} s)") from None
    except OSError as exc:
        raise PeerError(f"{where}: unreachable ({exc.strerror or exc})") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    chan = Channel(sock, where)
    try:
        _prove(chan, key, timeout_s)
    except BaseException:
        chan.close()
        raise
    return chan


def _prove(chan: Channel, key: bytes, timeout_s: float) -> None:
    """The client's half of the handshake: answer the daemon's challenge, check its proof."""
    try:
        challenge = chan.recv(timeout_s)
        if challenge is None or challenge.get("op") != "challenge":
            raise PeerError(f"{chan.where}: not a strata ring daemon of protocol {PROTOCOL} "
                            "(it sent no challenge): run the same strata version everywhere")
        theirs, mine = str(challenge.get("nonce", "")), auth.nonce()
        chan.send({"op": "auth", "nonce": mine, "mac": auth.mac(key, auth.CLIENT, theirs, mine)})
        reply = chan.recv(timeout_s)
    except TimeoutError:
        raise PeerError(f"{chan.where}: no answer within {timeout_s:g} s (the daemon is hung "
                        "or overloaded)") from None
    except OSError as exc:
        raise PeerError(f"{chan.where}: connection lost in the handshake "
                        f"({exc.strerror or exc})") from None
    if reply is None:
        raise PeerError(f"{chan.where}: closed the connection in the handshake")
    if not reply.get("ok"):
        raise Refused(f"{chan.where}: {reply.get('error') or 'refused the handshake'}")
    if not auth.same(auth.mac(key, auth.SERVER, mine, theirs), reply.get("mac")):
        raise Refused(f"{chan.where}: answered without proving the ring secret (not a member "
                      "of this ring, or another secret)")


Progress = Callable[[Message], None]


def call(chan: Channel, msg: Message, timeout_s: float | None,
         on_progress: Progress | None = None) -> Message:
    """Send one request on `chan` and wait for its answer; a refusal is a PeerError.
    `timeout_s` bounds each silence, not the whole request (see Server._answer). A
    "pending" message that carries more than the keepalive (a generated token, for one) goes
    to `on_progress` as it arrives."""
    try:
        chan.send(msg)
        reply = chan.recv(timeout_s)
        while reply is not None and reply.get("pending"):  # still working: wait on
            if on_progress is not None and len(reply) > 1:
                on_progress(reply)
            reply = chan.recv(timeout_s)
    except TimeoutError:
        raise PeerError(f"{chan.where}: no answer to '{msg.get('op')}' within {timeout_s:g} s "
                        "(the daemon is hung or overloaded)") from None
    except OSError as exc:
        raise PeerError(f"{chan.where}: connection lost during '{msg.get('op')}' "
                        f"({exc.strerror or exc})") from None
    if reply is None:
        raise PeerError(f"{chan.where}: closed the connection during '{msg.get('op')}'")
    if not reply.get("ok"):
        raise Refused(f"{chan.where}: {reply.get('error') or 'refused without a reason'}")
    return reply


def request(host: str, port: int, msg: Message, timeout_s: float | None = 5.0,
            connect_timeout_s: float = 5.0, on_progress: Progress | None = None) -> Message:
    """One request on a fresh connection (what the CLI and the leader's orders use)."""
    chan = connect(host, port, connect_timeout_s)
    try:
        return call(chan, msg, timeout_s, on_progress)
    finally:
        chan.close()


@dataclass
class Server:
    """A threaded TCP server: one thread per connection, requests answered in order through
    `handlers` (op -> handler). A handler's InputError becomes an `ok: false` answer."""

    host: str
    port: int
    handlers: dict[str, Handler]
    key: bytes  # the ring secret every connection proves first (strata.ring.control.auth)
    idle_timeout_s: float = 30.0  # a client silent this long is dropped (one-shot CLI calls)
    sock: socket.socket | None = None  # already bound (the daemon binds before it probes)
    extra: list[socket.socket] = field(default_factory=list)  # more addresses, same port
    vet: Callable[[Message], None] | None = None  # refuses a request before any handler
    log: Callable[[str], None] = lambda _line: None

    def __post_init__(self) -> None:
        self.sock = self.sock or bind(self.host, self.port)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._channels: set[Channel] = set()
        self._lock = threading.Lock()

    def serve_in_thread(self) -> threading.Thread:
        for extra in self.extra:
            threading.Thread(target=self._accept_loop, args=(extra,), name="ring-accept",
                             daemon=True).start()
        thread = threading.Thread(target=self._accept_loop, args=(self.sock,),
                                  name="ring-accept", daemon=True)
        thread.start()
        return thread

    def _accept_loop(self, listening: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                sock, addr = listening.accept()
            except OSError:
                return  # closed by stop()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            chan = Channel(sock, f"{addr[0]}:{addr[1]}")
            with self._lock:
                self._channels.add(chan)
            threading.Thread(target=self._serve, args=(chan,), daemon=True,
                             name=f"ring-conn {chan.where}").start()

    def _serve(self, chan: Channel) -> None:
        try:
            if not self._challenge(chan):
                return
            while not self._stop.is_set():
                msg = chan.recv(self.idle_timeout_s)
                if msg is None:
                    return
                reply = self._answer(msg, chan)
                then = reply.pop(THEN, None)
                chan.send(reply)
                if then is not None:  # the socket now speaks another protocol: hand it over
                    then(chan.sock)
                    return
        except (OSError, InputError, ConnectionError):
            return  # the other side went away or spoke nonsense: drop the connection
        finally:
            with self._lock:
                self._channels.discard(chan)
            chan.close()

    def _challenge(self, chan: Channel) -> bool:
        """The daemon's half of the handshake: a fresh nonce, the client's proof over it
        and its own, then this daemon's proof. A stranger is told why, logged in one line
        and dropped before any request is read."""
        mine = auth.nonce()
        chan.send({"op": "challenge", "protocol": PROTOCOL, "nonce": mine})
        try:
            answer = chan.recv(HANDSHAKE_S, limit=HANDSHAKE_LINE)
        except (TimeoutError, PeerError):
            answer = None
        if answer is None or answer.get("op") != "auth":
            why = "no ring-secret proof (an older strata, or not a ring client)"
        elif not auth.same(auth.mac(self.key, auth.CLIENT, mine, str(answer.get("nonce"))),
                           answer.get("mac")):
            why = "wrong ring secret (or a replayed handshake)"
        else:
            chan.send({"ok": True, "mac": auth.mac(self.key, auth.SERVER,
                                                   str(answer["nonce"]), mine)})
            return True
        self.log(f"refused {chan.where}: {why}")
        with contextlib.suppress(OSError):
            chan.send({"ok": False, "error": f"refused: {why}; every member and client needs "
                       f"the ring's secret (--secret-file or ${auth.ENV})"})
        return False

    def _answer(self, msg: Message, chan: Channel) -> Message:
        """The handler's answer; while it works (a generation can take minutes) the client
        hears {"pending": true} every KEEPALIVE_S, so silence means a hung daemon."""
        box: list[Message] = []
        done = threading.Event()

        def work() -> None:
            box.append(self.dispatch(msg, chan))
            done.set()

        threading.Thread(target=work, daemon=True, name=f"ring-op {msg.get('op')}").start()
        while not done.wait(KEEPALIVE_S):
            chan.send({"pending": True})
        return box[0]

    def dispatch(self, msg: Message, chan: Channel) -> Message:
        handler = self.handlers.get(str(msg.get("op")))
        if handler is None:
            return {"ok": False, "error": f"unknown request {msg.get('op')!r}"}
        try:
            if self.vet is not None:
                self.vet(msg)
            reply = handler(msg, chan)
        except InputError as exc:
            return {"ok": False, "error": str(exc)}
        except Exception as exc:  # a bug or a failure of the thing run: say it, stay up
            return {"ok": False, "error": f"{msg.get('op')} failed: {type(exc).__name__}: "
                    f"{exc}".splitlines()[0]}
        return {"ok": True, **reply}

    def stop(self) -> None:
        self._stop.set()
        for sock in (self.sock, *self.extra):
            with contextlib.suppress(OSError):
                sock.close()
        with self._lock:
            chans = list(self._channels)
        for chan in chans:
            chan.close()


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, or one line: a port in use names the flag that changes it."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    # SO_REUSEADDR lets a restarted daemon take its port back at once (TIME_WAIT); on Linux
    # it does not let two live daemons share a port, which is what we want refused.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise InputError(f"port {port} is in use on {host or 'this host'} (another strata "
                             "ring serve?): choose another with --port") from None
        raise InputError(f"cannot listen on {host or '*'}:{port}: {exc.strerror or exc}") \
            from None
    return sock
