"""The wire side of the openai backend: what the endpoint is, how its replies are checked
(one-line errors for anything malformed), how HTTP failures are named, how a stream is
split into events."""

from __future__ import annotations

import errno
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from strata.errors import InputError, StrataError

CONNECT_TIMEOUT_S = 5.0


DEFAULT_READ_TIMEOUT_S = 120.0


EOS_BIAS = -100.0


@dataclass
class Server:
    """What load() found out about the endpoint."""

    endpoint: str  # base URL ending /v1
    root: str  # endpoint without /v1 (where llama.cpp's extra endpoints live)
    model: str
    flavour: str  # "llama.cpp", "llama-cpp-python", "ollama" or "unknown"
    tokenizer: bool  # tokenize/detokenize endpoints available

    @property
    def prompt_cache(self) -> bool:
        return self.flavour in ("llama.cpp", "llama-cpp-python")


def _root_of(endpoint: str) -> str:
    return endpoint[: -len("/v1")] if endpoint.endswith("/v1") else endpoint


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _server_message(resp: httpx.Response) -> str:
    """The server's own error message from an error response, on one line."""
    try:
        body = resp.json()
    except ValueError:
        return _one_line(resp.text) or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body))
        if isinstance(err, dict):
            err = err.get("message", err)
        return _one_line(str(err))
    return _one_line(str(body))


def _json_object(url: str, resp: httpx.Response) -> dict[str, Any]:
    """The JSON object a route answered with. Anything else (an HTML page from a proxy or a
    web server, a truncated body, a bare list) means the URL does not lead to the API this
    backend speaks: an input error (exit 2) on one line, like every other bad reply."""
    try:
        data = resp.json()
    except ValueError:  # JSONDecodeError, and UnicodeDecodeError for binary garbage
        kind = resp.headers.get("content-type") or "no content type"
        raise InputError(f"{url}: the server answered {kind}, not JSON: "
                         f"{_one_line(resp.text, 80) or '(empty body)'} (is this an "
                         "OpenAI-compatible server?)") from None
    if not isinstance(data, dict):
        raise InputError(f"{url}: expected a JSON object, got {_one_line(resp.text, 80)}")
    return data


def _field(url: str, data: dict[str, Any], key: str) -> Any:
    """data[key], or an input error naming the route and what it answered instead."""
    if key not in data:
        raise InputError(f"{url}: the reply has no '{key}' field: "
                         f"{_one_line(json.dumps(data), 80)}")
    return data[key]


def _token_ids(url: str, tokens: Any) -> list[int]:
    """Token ids from a tokenize reply: plain ints, or {"id": ...} objects (llama.cpp with
    with_pieces). Anything else is a bad reply, said on one line."""
    try:
        return [int(t["id"]) if isinstance(t, dict) else int(t) for t in tokens]
    except (KeyError, TypeError, ValueError):
        raise InputError(f"{url}: 'tokens' is not a list of token ids: "
                         f"{_one_line(json.dumps(tokens), 80)}") from None


@dataclass
class _Stream:
    """What came back from one streamed completion."""

    token_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    uncountable: int = 0  # chunks whose text alone could not be counted (counted as 1)
    textless: int = 0  # token chunks with empty text (counted as 1)
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    timings: dict[str, Any] | None = None  # llama.cpp server's own timings, when sent
    done: bool = False


def _sse_payloads(lines: Iterator[str]) -> Iterator[str]:
    """`data:` payloads of a server-sent-event stream; "" for any other line (comments,
    keep-alive pings, blank separators) so the caller still sees time pass."""
    for line in lines:
        yield line[5:].strip() if line.startswith("data:") else ""


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) else None


def _server_message_of(data: dict[str, Any]) -> str:
    err = data.get("error")
    if isinstance(err, dict):
        err = err.get("message", err)
    return _one_line(str(err))


class _ErrorMap:
    """Turns httpx failures into one-line StrataError/InputError messages.

    `tokens` is updated while streaming so a failure can say how far the stream got.
    """

    def __init__(self, url: str, tokens: int, read_timeout: float) -> None:
        self.url, self.tokens, self.read_timeout = url, tokens, read_timeout

    def __enter__(self) -> _ErrorMap:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 _tb: Any) -> bool:
        if exc is None or not isinstance(exc, httpx.HTTPError):
            return False
        raise self._translate(exc) from exc

    def _translate(self, exc: httpx.HTTPError) -> StrataError:
        url = self.url
        if isinstance(exc, httpx.ConnectTimeout):
            return StrataError(f"endpoint {url} did not accept the connection within "
                               f"{CONNECT_TIMEOUT_S:g} s")
        if isinstance(exc, httpx.ConnectError):
            if _refused(exc):
                return InputError(f"endpoint {url} refused the connection: is the server "
                                  "running?")
            return InputError(f"cannot connect to endpoint {url}: {_one_line(str(exc), 120)}")
        if isinstance(exc, httpx.TimeoutException):
            return StrataError(f"endpoint {url} sent nothing for {self.read_timeout:g} s "
                               f"(read timeout) after {self.tokens} tokens")
        if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
            return StrataError(f"{url}: server closed the stream after {self.tokens} tokens "
                               f"({_one_line(str(exc), 80)})")
        return StrataError(f"{url}: {type(exc).__name__}: {_one_line(str(exc), 120)}")


def _refused(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError) or getattr(seen, "errno", None) == \
                errno.ECONNREFUSED:
            return True
        seen = seen.__cause__ or seen.__context__
    return "refused" in str(exc).lower()
