"""A chat-completions client for any OpenAI-compatible endpoint (llama.cpp, Ollama, vLLM,
LM Studio, hosted APIs), as `kernels generate` and `kernels eval` need it.

What it promises the turn loop: a reply comes back as a `records.Reply`, or the call ends in
one `EndpointError` line that says what is wrong and what to do. Transient failures (429,
5xx, a read timeout, a connection dropped mid-reply) are retried with backoff, honouring the
server's Retry-After; everything else (refused, DNS, an HTML page, a 4xx) fails at once,
because a second try would meet the same answer. A reply's text is capped at
MAX_REPLY_CHARS: a runaway model's megabytes are cut, not fatal (extraction decides).
The API key is read from a named environment variable and only ever leaves in the
Authorization header; error messages are scrubbed of it.
"""

from __future__ import annotations

import email.utils
import ipaddress
import json
import os
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx

from strata.backends.openai_protocol import (
    _json_object,
    _one_line,
    _refused,
    _server_message,
    _sse_payloads,
)
from strata.errors import InputError
from strata.kernels.gen.records import Reply
from strata.models.endpoint import normalise_url

MAX_REPLY_CHARS = 1 << 20  # a kernel is a few KiB; beyond 1 Mi characters it is noise
MAX_BODY_BYTES = 16 << 20  # a non-streamed body (JSON escaping can multiply the text)
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
RETRY_AFTER_CAP_S = 60.0  # a server asking for minutes would stall a whole eval run
BACKOFF_CAP_S = 30.0
MODELS_SHOWN = 12  # model names listed in an error before "… and N more"

T = TypeVar("T")


class EndpointError(InputError):
    """The endpoint cannot give us a reply: one line, saying what is wrong and what to do."""


class _Retry(Exception):
    """A failure worth another try; `wait_s` is the server's Retry-After, when it sent one."""

    def __init__(self, why: str, hint: str, wait_s: float | None = None) -> None:
        super().__init__(why)
        self.why, self.hint, self.wait_s = why, hint, wait_s


class ChatClient:
    """POST /chat/completions (streamed or not) and GET /models, with retries.

    `retries` is the number of extra tries after the first. `timeout_s` is the longest the
    server may stay silent (no byte, or in a stream no event but keep-alive pings). Safe to
    share between threads: it holds no per-request state (httpx.Client is thread-safe).
    """

    def __init__(self, endpoint: str, api_key_env: str | None = None, *,
                 timeout_s: float = 300.0, connect_timeout_s: float = 5.0,
                 retries: int = 3, stream: bool = False, backoff_s: float = 1.0,
                 on_retry: Callable[[str], None] | None = None) -> None:
        self.endpoint = _normalised(endpoint)
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.retries, self.stream, self.backoff_s = max(0, retries), stream, backoff_s
        self.on_retry = on_retry or (lambda _msg: None)
        self.api_key_env = api_key_env
        headers = {"Authorization": f"Bearer {_api_key(api_key_env)}"} if api_key_env else {}
        # A loopback server is talked to directly; a remote one may need the user's proxy.
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s), headers=headers,
            trust_env=not _loopback(self.endpoint))
        self._models: list[str] | None = None

    # -- public API ----------------------------------------------------------------------
    def models(self) -> list[str]:
        """The ids /models lists, in the server's order (fetched once, then remembered)."""
        if self._models is None:
            data = self._call("/models", None, lambda url, resp, _t0: _body(url, resp))
            entries = data.get("data")
            if not isinstance(entries, list):
                raise EndpointError(f"{self.endpoint}/models: the reply has no 'data' list: "
                                    f"{_one_line(json.dumps(data), 80)}")
            self._models = [str(m["id"]) for m in entries if isinstance(m, dict) and
                            m.get("id")]
        return list(self._models)

    def resolve_model(self, name: str | None) -> str:
        """`name` if the server serves it; None -> the first model the server lists."""
        ids = self.models()
        if not ids:
            raise EndpointError(f"endpoint {self.endpoint} lists no models at /models: is a "
                                "model loaded on the server?")
        if name is None:
            return ids[0]
        if name in ids:
            return name
        shown = ", ".join(ids[:MODELS_SHOWN])
        more = f" … and {len(ids) - MODELS_SHOWN} more" if len(ids) > MODELS_SHOWN else ""
        raise EndpointError(f"endpoint {self.endpoint} does not serve model '{name}'; "
                            f"it serves: {shown}{more}")

    def chat(self, model: str, messages: list[dict[str, str]], *, temperature: float,
             max_tokens: int | None = None, seed: int | None = None) -> Reply:
        body: dict[str, Any] = {"model": model, "messages": messages,
                                "temperature": temperature}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if seed is not None:
            body["seed"] = seed
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}  # usage in a final chunk
        return self._call("/chat/completions", body,
                          lambda url, resp, t0: self._reply(url, resp, t0, model))

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- one request, with retries ---------------------------------------------------------
    def _call(self, route: str, body: dict[str, Any] | None,
              read: Callable[[str, httpx.Response, float], T]) -> T:
        url = self.endpoint + route
        try:
            for attempt in range(self.retries + 1):
                try:
                    return self._once(url, body, read)
                except _Retry as retry:
                    if attempt == self.retries:
                        tries = f"{attempt + 1} {'try' if attempt == 0 else 'tries'}"
                        raise EndpointError(f"{url}: {retry.why} ({tries}): {retry.hint}"
                                            ) from None
                    wait = self._wait_s(attempt, retry.wait_s)
                    self.on_retry(self._scrub(f"{url}: {retry.why}; retrying in {wait:g} s"))
                    time.sleep(wait)
            raise AssertionError("unreachable")  # the loop returns or raises
        except EndpointError as exc:  # the one exit for errors: scrubbed of the key
            raise EndpointError(self._scrub(str(exc))) from None

    def _once(self, url: str, body: dict[str, Any] | None,
              read: Callable[[str, httpx.Response, float], T]) -> T:
        t0 = time.perf_counter()
        try:
            with self._client.stream("POST" if body is not None else "GET", url,
                                     json=body) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    self._refuse(url, resp)
                return read(url, resp, t0)
        except httpx.HTTPError as exc:
            raise self._translated(url, exc) from None

    def _wait_s(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, RETRY_AFTER_CAP_S)
        return min(self.backoff_s * 2 ** attempt, BACKOFF_CAP_S)

    def _refuse(self, url: str, resp: httpx.Response) -> None:
        """An HTTP error status: _Retry for a transient one, else EndpointError."""
        code, msg = resp.status_code, _server_message(resp)
        if code in RETRY_STATUSES:
            hint = ("rate limited: lower the concurrency or try later" if code == 429 else
                    "the server keeps failing: check its log")
            raise _Retry(f"HTTP {code}: {msg}", hint, _retry_after(resp))
        if code in (401, 403):
            var = (f"the key in ${self.api_key_env}" if self.api_key_env else
                   "no key was sent (pass the name of the env var that holds it)")
            raise EndpointError(f"{url}: HTTP {code}: {msg} (authorisation refused: {var})")
        if code == 404:
            raise EndpointError(f"{url}: HTTP 404: {msg} (is {self.endpoint} the base URL of "
                                "an OpenAI-compatible server?)")
        raise EndpointError(f"{url}: HTTP {code}: {msg}")

    def _translated(self, url: str, exc: httpx.HTTPError) -> Exception:
        if isinstance(exc, httpx.ConnectTimeout):
            return EndpointError(f"endpoint {url} did not accept the connection within "
                                 f"{self.connect_timeout_s:g} s: is the host reachable?")
        if isinstance(exc, httpx.ConnectError):
            if _refused(exc):
                return EndpointError(f"endpoint {url} refused the connection: is the server "
                                     "running on that port?")
            return EndpointError(f"cannot connect to endpoint {url}: "
                                 f"{_one_line(str(exc), 120)}")
        if isinstance(exc, httpx.TimeoutException):
            return _Retry(f"no answer for {self.timeout_s:g} s (read timeout)",
                          "the server is stuck or the model is slower than the timeout")
        if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
            return _Retry(f"the server closed the connection mid-reply "
                          f"({_one_line(str(exc), 80)})", "check the server's log")
        return EndpointError(f"{url}: {type(exc).__name__}: {_one_line(str(exc), 120)}")

    def _scrub(self, text: str) -> str:
        auth = self._client.headers.get("authorization", "")
        key = auth.removeprefix("Bearer ")
        return text.replace(key, "***") if key else text

    # -- reading a reply -------------------------------------------------------------------
    def _reply(self, url: str, resp: httpx.Response, t0: float, model: str) -> Reply:
        # Dispatch on what came back, not on what was asked: some servers ignore `stream`.
        if "text/event-stream" in resp.headers.get("content-type", ""):
            return self._streamed(url, resp, t0, model)
        return _whole(url, _body(url, resp), t0, model)

    def _streamed(self, url: str, resp: httpx.Response, t0: float, model: str) -> Reply:
        parts: list[str] = []
        size = deltas = 0
        usage: dict[str, Any] | None = None
        finish: str | None = None
        seen_model, done = None, False
        last = time.perf_counter()
        for payload in _sse_payloads(resp.iter_lines()):
            now = time.perf_counter()
            if not payload:  # keep-alive pings alone must not hold us past the timeout
                if now - last > self.timeout_s:
                    raise httpx.ReadTimeout("only keep-alive pings")
                continue
            if payload == "[DONE]":
                done = True
                break
            last, data = now, _chunk(url, payload)
            usage = data.get("usage") or usage
            seen_model = data.get("model") or seen_model
            choice = _first_choice(data)
            finish = choice.get("finish_reason") or finish
            piece = (choice.get("delta") or {}).get("content")
            if isinstance(piece, str) and piece:
                parts.append(piece)
                size, deltas = size + len(piece), deltas + 1
            if size > MAX_REPLY_CHARS:  # runaway: stop reading, keep what came
                finish = "length"  # as a server says when max_tokens cut the reply
                break
        if not done and finish is None:
            raise _Retry("the server closed the stream before the reply ended (no [DONE])",
                         "check the server's log")
        tokens_in, tokens_out = _usage(usage)
        return Reply(text="".join(parts)[:MAX_REPLY_CHARS], model=str(seen_model or model),
                     tokens_in=tokens_in, tokens_out=tokens_out if usage else deltas,
                     latency_s=time.perf_counter() - t0, finish_reason=finish)


# -- helpers ---------------------------------------------------------------------------------


def _normalised(endpoint: str) -> str:
    scheme = endpoint.partition("://")[0].lower()
    if scheme not in ("http", "https"):
        raise EndpointError(f"endpoint {endpoint}: expected an http(s):// URL, e.g. "
                            "http://127.0.0.1:8080/v1")
    try:
        return normalise_url(endpoint)
    except InputError as exc:  # its message names the MODEL argument; here it is an endpoint
        raise EndpointError(str(exc).replace(f"MODEL {endpoint}", f"endpoint {endpoint}", 1)
                            ) from None


def _api_key(var: str) -> str:
    key = os.environ.get(var, "").strip()
    if not key:
        raise EndpointError(f"the API key variable ${var} is not set (or empty): export it, "
                            "or leave the key option out for a server without keys")
    return key


def _loopback(endpoint: str) -> bool:
    host = urlsplit(endpoint).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _retry_after(resp: httpx.Response) -> float | None:
    """Retry-After as seconds: a number, or an HTTP date; None when absent or unreadable."""
    value = resp.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _body(url: str, resp: httpx.Response) -> dict[str, Any]:
    """The JSON object of a whole (non-streamed) reply, as an EndpointError if it is not."""
    size = resp.headers.get("content-length", "")
    if size.isdigit() and int(size) > MAX_BODY_BYTES:
        raise EndpointError(f"{url}: the reply is {int(size) >> 20} MiB, more than any chat "
                            f"reply ({MAX_BODY_BYTES >> 20} MiB): is this the right server?")
    resp.read()
    try:
        return _json_object(url, resp)
    except InputError as exc:
        raise EndpointError(str(exc)) from None


def _chunk(url: str, payload: str) -> dict[str, Any]:
    try:
        data = json.loads(payload)
    except ValueError:
        raise EndpointError(f"{url}: the server sent a malformed stream event: "
                            f"{_one_line(payload, 80)}") from None
    if not isinstance(data, dict):
        raise EndpointError(f"{url}: a stream event is not a JSON object: "
                            f"{_one_line(payload, 80)}")
    if data.get("error"):
        raise EndpointError(f"{url}: the server reported an error mid-stream: "
                            f"{_one_line(json.dumps(data['error']), 160)}")
    return data


def _first_choice(data: dict[str, Any]) -> dict[str, Any]:
    choices = data.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}  # e.g. the final usage-only chunk


def _whole(url: str, data: dict[str, Any], t0: float, model: str) -> Reply:
    choice = _first_choice(data)
    if not choice:
        raise EndpointError(f"{url}: the reply has no choices: "
                            f"{_one_line(json.dumps(data), 80)}")
    tokens_in, tokens_out = _usage(data.get("usage"))
    text = _text(choice.get("message"))
    finish = "length" if len(text) > MAX_REPLY_CHARS else choice.get("finish_reason")
    return Reply(text=text[:MAX_REPLY_CHARS], model=str(data.get("model") or model),
                 tokens_in=tokens_in, tokens_out=tokens_out,
                 latency_s=time.perf_counter() - t0, finish_reason=finish)


def _text(message: Any) -> str:
    """message.content: a string, a list of content parts, or None (a refusal, a tool call)."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _usage(usage: Any) -> tuple[int | None, int | None]:
    if not isinstance(usage, dict):
        return None, None
    return _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))


def _count(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
