"""An OpenAI-compatible HTTP endpoint on a ring member (`strata ring serve --api PORT`).

GET /v1/models, POST /v1/completions and /v1/chat/completions, GET /health. A generation is
`node.stages.generate`: one request across the ring, passed to the leader, so any member
serves the API; `messages` go through the GGUF's own chat template (llama.cpp's engine).

Queue. The ring runs one sequence at a time: requests take a ticket as they arrive and wait
their turn (`Turns`, first come first served), as each model's `meta` in /v1/models says. A
generation runs in a worker thread that ends the turn when the generation ends, not when
its client leaves: a client gone mid-stream costs the rest of its generation (the pieces go
nowhere), never the queue; one gone before its turn is skipped.

Streaming is server-sent events over chunked HTTP/1.1: one `data: {json}` event per token
(as llama.cpp's server: a client counts tokens by events; a token whose text is an
incomplete UTF-8 character has empty text), then one with the finish reason, the usage
event when stream_options.include_usage asks (strata bench does), `data: [DONE]`.
Keep-alive and TCP_NODELAY: a benchmark's timed request pays no connection set-up, and a
token leaves when it exists.

Auth. With a token (the ring secret), every route but /health needs `Authorization: Bearer
<token>` (compared in constant time), else 401. Every refusal is an OpenAI error object and
one line in the daemon's log (the client, what was wrong; never the token), no traceback.

Unlike OpenAI, temperature defaults to 0: greedy, the same tokens as `strata ring run`. A
sampled request without a seed gets a random one. Extensions: `ignore_eos` (llama.cpp's:
max_tokens whatever the model says) and `return_token_ids` (vLLM's: the ids, `token_ids`).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import math
import os
import queue
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from strata.errors import InputError, StrataError

MAX_BODY_BYTES = 16 << 20
MAX_TOKENS = 1 << 16  # beyond any context a ring serves: a larger max_tokens is a mistake
DEFAULT_TOKENS = {"text": 16, "chat": 256}  # OpenAI's completions default; chat: a reply
IDLE_TIMEOUT_S = 300.0  # a keep-alive connection's silence, or a stalled client's writes
SCHEDULING = "one generation at a time, in arrival order (requests queue)"
# OpenAI parameters this endpoint cannot honour: refused, not silently ignored.
UNSUPPORTED = ("stop", "logit_bias", "logprobs", "top_logprobs", "echo", "suffix", "tools",
               "functions", "n", "best_of")
Log = Callable[[str], None]


class ApiError(Exception):
    """A refused request: its HTTP status, OpenAI's error fields, and for the log only
    `detail` (what was wrong, where the client hears generic words)."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 kind: str = "invalid_request_error", detail: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.kind = status, message, code, kind
        self.detail = detail or message

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "code": self.code}}


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


@dataclass
class Job:
    """One parsed request: what to ask the ring and how to answer."""

    kind: str  # "text" (/v1/completions) or "chat"
    msg: dict[str, Any]  # node.stages.generate's request
    stream: bool
    include_usage: bool
    token_ids: bool  # return_token_ids
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def model(self) -> str:
        return str(self.msg["model"])


# -- requests ---------------------------------------------------------------------------------


def parse_job(kind: str, body: Any, models: list[str]) -> Job:
    """A request body as a Job, or an ApiError (400/404) saying what is wrong."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    for key in UNSUPPORTED:
        value = body.get(key)
        if value not in (None, 1) if key in ("n", "best_of") else value:
            raise ApiError(400, f"'{key}' is not supported by the strata ring endpoint "
                                "(one choice per request, no stop strings, no logprobs)",
                           "unsupported_parameter")
    msg: dict[str, Any] = {"model": _model(body.get("model"), models)}
    if kind == "chat":
        msg["messages"] = _messages(body.get("messages"))
        limit = body.get("max_completion_tokens")  # OpenAI's newer name, else the old
        limit = body.get("max_tokens") if limit is None else limit
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]  # a batch of one
        if not isinstance(prompt, str):
            raise ApiError(400, "'prompt' must be a string (one prompt per request; token "
                                "ids are not supported)")
        msg["prompt"] = prompt
        limit = body.get("max_tokens")
    msg["n"] = _integer("max_tokens", limit, 1, MAX_TOKENS, DEFAULT_TOKENS[kind])
    msg["seed"] = _integer("seed", body.get("seed"), 0, (1 << 63) - 1, None)
    temp = body.get("temperature")
    if temp is not None and (isinstance(temp, bool) or not isinstance(temp, (int, float))
                             or not math.isfinite(temp) or temp < 0):
        raise ApiError(400, f"'temperature' must be a number >= 0, not {json.dumps(temp)}")
    msg["temperature"] = float(temp or 0.0)  # greedy by default, as `strata ring run`
    if msg["temperature"] > 0 and msg["seed"] is None:  # the ring samples only with a seed
        msg["seed"] = int.from_bytes(os.urandom(4), "little")
    msg["stop_eog"] = not _flag(body, "ignore_eos")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object")
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    return Job(kind, msg, _flag(body, "stream"), bool(options.get("include_usage")),
               _flag(body, "return_token_ids"), id=prefix + secrets.token_hex(12))


def _model(name: Any, models: list[str]) -> str:
    served = ", ".join(models) or "no model"
    if name is None and len(models) == 1:
        return models[0]
    if not isinstance(name, str) or not name:
        raise ApiError(400, f"'model' is required (this member serves {served})")
    if name not in models:
        raise ApiError(404, f"model '{name}' is not served here (this member serves "
                            f"{served})", "model_not_found")
    return name


def _messages(messages: Any) -> list[dict[str, str]]:
    """{role, content} pairs; content a string or OpenAI's list of text parts."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list of {role, content}")
    out = []
    for i, m in enumerate(messages):
        role, content = (m.get("role"), m.get("content")) if isinstance(m, dict) else (0, 0)
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                             for p in content):
            content = "".join(p.get("text") or "" for p in content)
        if not isinstance(role, str) or not role or not isinstance(content, str):
            raise ApiError(400, f"messages[{i}] needs a 'role' string and text 'content'")
        out.append({"role": role, "content": content})
    return out


def _integer(key: str, value: Any, lo: int, hi: int, default: int | None) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ApiError(400, f"'{key}' must be an integer from {lo} to {hi}, not "
                            f"{json.dumps(value)}")
    return value


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise ApiError(400, f"'{key}' must be true or false")
    return value


# -- replies ----------------------------------------------------------------------------------


def usage(result: dict[str, Any]) -> dict[str, int]:
    p, g = int(result["n_prompt"]), int(result["n_gen"])
    return {"prompt_tokens": p, "completion_tokens": g, "total_tokens": p + g}


def reply(job: Job, result: dict[str, Any]) -> dict[str, Any]:
    """The whole answer to a request without `stream`."""
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": result["finish"]}
    if job.kind == "chat":
        choice["message"] = {"role": "assistant", "content": result["text"]}
    else:
        choice["text"] = result["text"]
    if job.token_ids:
        choice["token_ids"] = list(result["tokens"])
    obj = "chat.completion" if job.kind == "chat" else "text_completion"
    return {"id": job.id, "object": obj, "created": job.created, "model": job.model,
            "choices": [choice], "usage": usage(result)}


def chunk(job: Job, text: str | None = None, finish: str | None = None,
          token: int | None = None, role: bool = False) -> dict[str, Any]:
    """One streamed event: a token's text, the opening role (chat) or the finish reason."""
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    if job.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if text is not None:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    if job.token_ids and token is not None:
        choice["token_ids"] = [token]
    return _event(job, [choice])


def usage_chunk(job: Job, result: dict[str, Any]) -> dict[str, Any]:
    return {**_event(job, []), "usage": usage(result)}


def _event(job: Job, choices: list[dict[str, Any]]) -> dict[str, Any]:
    obj = "chat.completion.chunk" if job.kind == "chat" else "text_completion"
    out = {"id": job.id, "object": obj, "created": job.created, "model": job.model,
           "choices": choices}
    if job.include_usage:  # OpenAI's shape: null on every chunk but the last
        out["usage"] = None
    return out


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _error_of(exc: BaseException) -> ApiError:
    """What a failed generation says to its client: the message of an input error (a bad
    model file, no chat template), one line naming anything unexpected."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, InputError):
        return ApiError(400, _one_line(str(exc)))
    if isinstance(exc, StrataError):
        return ApiError(500, _one_line(str(exc)), kind="server_error")
    return ApiError(500, _one_line(f"{type(exc).__name__}: {exc}"), kind="server_error")


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
            self._refuse(_error_of(exc))

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
            wrong = f"an Authorization header of scheme '{_one_line(scheme, 20)}', not Bearer"
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
            raise ApiError(400, f"the body is not JSON: {_one_line(repr(raw[:60]), 80)}"
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
            raise _error_of(value)
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
                self._event(_error_of(value).body())
                self._note(f"{job.id}: failed after {sent} token(s): {_error_of(value).message}")
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
                              f"({_one_line(f'{type(exc).__name__}: {exc}', 120)})")

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
            self._note(_one_line(line))


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
