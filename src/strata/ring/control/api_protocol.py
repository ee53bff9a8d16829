"""The OpenAI protocol of `strata ring serve --api`: a request body in, a reply out.

Its one job is the wire format, as pure functions (no sockets, no threads): `parse_job`
turns a /v1/completions or /v1/chat/completions body into a `Job` (node.stages.generate's
request and how to answer it) or an `ApiError` saying what is wrong; `reply`, `chunk` and
`usage_chunk` build the answer to a request, whole or one server-sent event at a time (one
event per token, as llama.cpp's server: a client counts tokens by events; a token whose text
is an incomplete UTF-8 character has empty text); `error_of` says a failed generation's
error as OpenAI's error object. The HTTP server and the queue are strata.ring.control.api.

OpenAI parameters this endpoint cannot honour (`UNSUPPORTED`) are refused, not silently
ignored. Unlike OpenAI, temperature defaults to 0: greedy, the same tokens as `strata ring
run`. A sampled request without a seed gets a random one. Extensions: `ignore_eos`
(llama.cpp's: max_tokens whatever the model says) and `return_token_ids` (vLLM's: the ids,
`token_ids`).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from strata.errors import InputError, StrataError

MAX_TOKENS = 1 << 16  # beyond any context a ring serves: a larger max_tokens is a mistake
DEFAULT_TOKENS = {"text": 16, "chat": 256}  # OpenAI's completions default; chat: a reply
API_KV_TYPE = "f16"  # every stage's K/V cache under the API: `ring run`'s default, llama.cpp's
# OpenAI parameters this endpoint cannot honour: refused, not silently ignored.
UNSUPPORTED = ("stop", "logit_bias", "logprobs", "top_logprobs", "echo", "suffix", "tools",
               "functions", "n", "best_of")


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
    msg["kv_type"] = API_KV_TYPE
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


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line of at most `limit` characters (for an error message or the log)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_of(exc: BaseException) -> ApiError:
    """What a failed generation says to its client: the message of an input error (a bad
    model file, no chat template), one line naming anything unexpected."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, InputError):
        return ApiError(400, one_line(str(exc)))
    if isinstance(exc, StrataError):
        return ApiError(500, one_line(str(exc)), kind="server_error")
    return ApiError(500, one_line(f"{type(exc).__name__}: {exc}"), kind="server_error")
