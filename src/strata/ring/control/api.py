"""The HTTP side of `strata ring serve --api PORT`: an OpenAI-compatible endpoint's server
and its queue.

GET /v1/models, POST /v1/completions and /v1/chat/completions, GET /health. Its one job is
serving: sockets, threads, the queue, auth and the log. What a request says and what its
answer looks like (parsing, validation, replies and streamed chunks) is strata.ring.control.
api_protocol's, as pure functions. A generation is `node.stages.generate`: one request
across the ring, passed to the leader, so any member serves the API; `messages` go through
the GGUF's own chat template (llama.cpp's engine).

Queue. The ring runs one sequence at a time: requests take a ticket as they arrive and wait
their turn (`Turns`, first come first served), as each model's `meta` in /v1/models says. A
generation runs in a worker thread that ends the turn when the generation ends, not when
its client leaves: a client gone mid-stream costs the rest of its generation (the pieces go
nowhere), never the queue; one gone before its turn is skipped.

Streaming is server-sent events over chunked HTTP/1.1 (the events are api_protocol's
`chunk`s), then `data: [DONE]`. Keep-alive and TCP_NODELAY: a benchmark's timed request pays
no connection set-up, and a token leaves when it exists.

Auth. With a token (the ring secret), every route but /health needs `Authorization: Bearer
<token>` (compared in constant time), else 401. Every refusal is an OpenAI error object and
one line in the daemon's log (the client, what was wrong; never the token), no traceback.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import queue
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from strata.errors import InputError
from strata.ring.control.api_protocol import (
    ApiError,
    Job,
    chunk,
    error_of,
    one_line,
    parse_job,
    reply,
    usage_chunk,
)

MAX_BODY_BYTES = 16 << 20
IDLE_TIMEOUT_S = 300.0  # a keep-alive connection's silence, or a stalled client's writes
SCHEDULING = "one generation at a time, in arrival order (requests queue)"
Log = Callable[[str], None]


class Turns:
    """A FIFO lock: tickets in arrival order; `wait` returns at this ticket's turn, `leave`
    ends it. (threading.Lock wakes waiters in no promised order.)"""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._issued = self._serving = 0

    def wait(self) -> None:
        with self._cond:
            ticket, self._issued = self._issued, self._issued + 1
            self._cond.wait_for(lambda: self._serving == ticket)

    def leave(self) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()

    @property
    def queued(self) -> int:
        """Requests holding a ticket: the one generating and those waiting."""
        with self._cond:
            return self._issued - self._serving


# -- the server -------------------------------------------------------------------------------


@dataclass
class Api:
    """What every request handler shares: the node, the token, the log, the queue."""

    node: Any  # strata.ring.control.node.Node
    token: str | None
    log: Log
    turns: Turns = field(default_factory=Turns)
    started: int = field(default_factory=lambda: int(time.time()))

    def models(self) -> list[dict[str, Any]]:
        owner = str(self.node.member.id)
        meta = {"scheduling": SCHEDULING, "max_concurrency": 1, "queued": self.turns.queued,
                "served_by": "strata ring"}
        return [{"id": name, "object": "model", "created": self.started, "owned_by": owner,
                 "meta": meta} for name in self.node.list_models()]

    def start(self, job: Job) -> queue.Queue[tuple[str, Any]]:
        """Run `job` in a worker thread once it is this request's turn (the caller has
        waited for it); events come on the returned queue: ("piece", {token, text})...,
        then ("done", result) or ("error", exception). The worker ends the turn."""
        events: queue.Queue[tuple[str, Any]] = queue.Queue()
        on_piece = (lambda piece: events.put(("piece", piece))) if job.stream else None

        def work() -> None:
            try:
                events.put(("done", self.node.stages.generate(dict(job.msg), on_piece)))
            except BaseException as exc:  # the handler answers it; the thread must not die
                events.put(("error", exc))
            finally:
                self.turns.leave()

        try:
            threading.Thread(target=work, daemon=True, name=f"api {job.id}").start()
        except BaseException:
            self.turns.leave()
            raise
        return events


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a connection left open never holds the daemon's exit

    def __init__(self, addr: tuple[str, int], api: Api) -> None:
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        self.api = api
        super().__init__(addr, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a benchmark's requests reuse a connection
    disable_nagle_algorithm = True  # each token's event leaves at once
    timeout = IDLE_TIMEOUT_S
    server: _Server

    # -- routing ---------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        try:
            if path == "/health":
                return self._json(200, {"status": "ok"})
            self._authorize()
            if path == "/v1/models":
                self._only(method, "GET")
                return self._json(200, {"object": "list", "data": self.api.models()})
            kind = {"/v1/completions": "text", "/v1/chat/completions": "chat"}.get(path)
            if kind is None:
                raise ApiError(404, f"no route {method} {path} (this endpoint serves "
                                    "/v1/models, /v1/completions, /v1/chat/completions)")
            self._only(method, "POST")
            self._generate(parse_job(kind, self._body(), self.api.node.list_models()))
        except Exception as exc:  # an ApiError, or a bug: one line either way
            self._refuse(error_of(exc))

    @property
    def api(self) -> Api:
        return self.server.api

    def _only(self, method: str, allowed: str) -> None:
        if method != allowed:
            raise ApiError(405, f"{method} {self.path}: use {allowed}")

    # -- auth and input --------------------------------------------------------------------
    def _authorize(self) -> None:
        token = self.api.token
        if token is None:
            return
        scheme, _, given = (self.headers.get("Authorization") or "").strip().partition(" ")
        if not scheme:
            wrong = "no Authorization header"
        elif scheme.lower() != "bearer":
            wrong = f"an Authorization header of scheme '{one_line(scheme, 20)}', not Bearer"
        elif not hmac.compare_digest(given.strip().encode(), token.encode()):
            wrong = "a wrong bearer token"
        else:
            return
        raise ApiError(401, "missing or wrong API key: use the ring secret as the bearer "
                            "token (Authorization: Bearer …)", "invalid_api_key",
                       detail=f"refused: {wrong}")

    def _body(self) -> Any:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raise ApiError(411, "send the body with a Content-Length (not chunked)")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise ApiError(400, "Content-Length is not a number") from None
        if length > MAX_BODY_BYTES:
            raise ApiError(413, f"the body is over {MAX_BODY_BYTES >> 20} MiB")
        raw = self.rfile.read(length) if length > 0 else b""
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, f"the body is not JSON: {one_line(repr(raw[:60]), 80)}"
                           ) from None

    # -- generation --------------------------------------------------------------------------
    def _generate(self, job: Job) -> None:
        waited = time.perf_counter()
        self.api.turns.wait()
        waited = time.perf_counter() - waited
        if self._client_gone():  # it left while queued: its turn passes
            self.api.turns.leave()
            self.close_connection = True
            return self._note(f"{job.id}: the client left while queued ({waited:.1f} s)")
        events = self.api.start(job)
        kind, value = events.get()
        if kind == "error":
            raise error_of(value)
        if not job.stream:
            self._done(job, value, waited)  # logged first: the line exists once answered
            return self._json(200, reply(job, value))
        self._stream(job, events, (kind, value), waited)

    def _stream(self, job: Job, events: queue.Queue[tuple[str, Any]],
                first: tuple[str, Any], waited: float) -> None:
        """Server-sent events, the first one already taken off the queue (a generation that
        fails before its first token got a plain error reply instead)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        try:
            if job.kind == "chat":
                self._event(chunk(job, role=True))
            kind, value = first
            while kind == "piece":
                self._event(chunk(job, str(value["text"]), token=int(value["token"])))
                sent += 1
                kind, value = events.get()
            if kind == "error":  # mid-stream: the status is sent; say it in the stream
                self._event(error_of(value).body())
                self._note(f"{job.id}: failed after {sent} token(s): {error_of(value).message}")
            else:
                self._done(job, value, waited)
                self._event(chunk(job, finish=str(value["finish"])))
                if job.include_usage:
                    self._event(usage_chunk(job, value))
            self._write(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")  # the chunked body's end
        except Exception as exc:  # the client left (OSError): the generation ends unheard
            self.close_connection = True
            what = "the client left" if isinstance(exc, OSError) else "failed"
            return self._note(f"{job.id}: {what} after {sent} token(s) "
                              f"({one_line(f'{type(exc).__name__}: {exc}', 120)})")

    def _event(self, obj: dict[str, Any]) -> None:
        # ASCII JSON: a token's U+2028 or U+0085 raw would split the line for clients that
        # split lines as Python's str.splitlines does (httpx's iter_lines among them)
        self._write(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def _write(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _client_gone(self) -> bool:
        """The peer closed its side (a readable socket with nothing to read)."""
        try:
            ready, _, _ = select.select([self.connection], [], [], 0)
            return bool(ready) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    # -- answers and the log -----------------------------------------------------------------
    def _json(self, status: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        with contextlib.suppress(OSError):  # a client gone: nothing to tell it
            self.wfile.write(data)

    def _refuse(self, exc: ApiError) -> None:
        self._note(f"{self.command} {self.path}: {exc.status} {exc.detail}")
        self.close_connection = True  # its body may be left unread: the next starts afresh
        self._json(exc.status, exc.body())

    def _done(self, job: Job, result: dict[str, Any], waited: float) -> None:
        self._note(f"{job.id} {job.model}: {result['n_prompt']} prompt + {result['n_gen']} "
                   f"generated token(s), {result['finish']}, {float(result['e2e_s']):.2f} s"
                   + (f" after {waited:.1f} s queued" if waited >= 0.05 else ""))

    def _note(self, line: str) -> None:
        self.api.log(f"api {self.client_address[0]}: {line}")

    def log_message(self, format: str, *args: Any) -> None:
        """http.server's own lines (one per request, on stderr) are not wanted: the daemon
        logs what matters in one line each through `_note`."""

    def log_error(self, format: str, *args: Any) -> None:
        line = format % args
        if "timed out" not in line:  # an idle keep-alive connection ending is no news
            self._note(one_line(line))


@dataclass
class ApiServer:
    """The running endpoint: `port` (the one bound, when 0 was asked) and `stop()`."""

    httpds: list[_Server]  # one per address, sharing one Api (one queue)
    threads: list[threading.Thread]

    @property
    def port(self) -> int:
        return int(self.httpds[0].server_address[1])

    def stop(self) -> None:
        for httpd in self.httpds:
            httpd.shutdown()
            httpd.server_close()
        for thread in self.threads:
            thread.join(timeout=2)


def start_api(node: Any, host: str | list[str], port: int, token: str | None,
              log: Log) -> ApiServer:
    """Serve the OpenAI-compatible API of `node` on host:port (each of the hosts, one
    queue for all) in daemon threads; a port that cannot be bound is an InputError naming
    --api, and nothing is left listening."""
    api = Api(node, token, log)
    server = ApiServer([], [])
    for h in [host] if isinstance(host, str) else host:
        try:
            httpd = _Server((h, server.port if server.httpds else port), api)
        except OSError as exc:
            server.stop()
            raise InputError(f"--api {port}: cannot listen on {h}:{port} "
                             f"({exc.strerror or exc}): choose another port") from None
        thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                  daemon=True, name=f"ring-api {h}:{port}")
        thread.start()
        server.httpds.append(httpd)
        server.threads.append(thread)
        log(f"api: OpenAI-compatible endpoint on http://{h or '0.0.0.0'}:"
            f"{httpd.server_port}/v1" + (" (bearer token: the ring secret)"
                                         if token is not None else " (no token)"))
    return server
