"""An OpenAI-compatible server with only the standard routes, generating for real.

What Ollama, LM Studio and most hosted APIs look like to a client: GET /v1/models and
POST /v1/completions (streamed or not, `stream_options.include_usage` honoured), and no
tokenize route, /props or anything else (404). Behind the routes is llama.cpp
(llama-cpp-python's `Llama`) running a real GGUF, so every prompt is tokenized by the
model's own tokenizer and `usage` counts are the tokens really evaluated and generated.

`template` wraps every prompt as a chat template does ("<|user|>{prompt}<|end|>"), so the
server counts tokens of its own in every prompt, as Ollama does. `ollama=True` also answers
GET /api/version as Ollama does. One token per streamed delta; a token whose bytes are not
yet whole UTF-8 streams as an empty delta, as llama.cpp's server does. `ignore_eos` and
`logit_bias` are honoured (llama.cpp's server and vLLM do; Ollama ignores both).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.server_fixture import FakeHandler, fake_server


@dataclass
class StandardServer:
    url: str  # base URL ending /v1
    model_id: str
    requests: list[dict[str, Any]] = field(default_factory=list)  # /v1/completions bodies
    paths: list[str] = field(default_factory=list)  # every request's method and path

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")


class _Model:
    """One llama.cpp model shared by the server's threads, one request at a time."""

    def __init__(self, gguf: Path, n_ctx: int, template: str) -> None:
        import llama_cpp

        self.llm = llama_cpp.Llama(str(gguf), n_ctx=n_ctx, n_threads=1, verbose=False)
        self.template = template
        self.lock = threading.Lock()

    def tokens(self, prompt: str) -> list[int]:
        text = self.template.format(prompt=prompt) if self.template else prompt
        return self.llm.tokenize(text.encode(), add_bos=True, special=False)

    def generate(self, prompt: str, max_tokens: int, bias: dict[int, float]) -> Iterator[str]:
        """The text of each generated token (greedy), "" while its UTF-8 is incomplete."""
        import numpy as np

        def biased(_ids: Any, logits: Any) -> Any:
            for token, value in bias.items():
                logits[token] = -np.inf if value <= -100 else logits[token] + value
            return logits

        pending = b""
        tokens = self.llm.generate(self.tokens(prompt), temp=0.0,
                                   logits_processor=[biased] if bias else None)
        for done, token in enumerate(tokens):
            if token == self.llm.token_eos() or done == max_tokens:
                return
            pending += self.llm.detokenize([token])
            try:
                piece, pending = pending.decode("utf-8"), b""
            except UnicodeDecodeError:
                piece = ""
            yield piece


class _Handler(FakeHandler):
    model: _Model
    state: StandardServer  # not `server`: that is the HTTPServer
    ollama: bool

    def do_GET(self) -> None:
        self.state.paths.append(f"GET {self.path}")
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [
                {"id": self.state.model_id, "object": "model", "owned_by": "test"}]})
        elif self.ollama and self.path == "/api/version":
            self._json(200, {"version": "0.0.0-test"})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        self.state.paths.append(f"POST {self.path}")
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/completions":
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        body = json.loads(raw)
        self.state.requests.append(body)
        if body.get("model") != self.state.model_id:
            self._json(404, {"error": {"message": f"model '{body.get('model')}' not found"}})
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError), self.model.lock:
            self._complete(body)

    def _complete(self, body: dict[str, Any]) -> None:
        prompt = str(body.get("prompt", ""))
        bias = {int(k): float(v) for k, v in (body.get("logit_bias") or {}).items()}
        if body.get("ignore_eos"):
            bias[self.model.llm.token_eos()] = -100.0
        n_prompt = len(self.model.tokens(prompt))
        pieces = self.model.generate(prompt, int(body.get("max_tokens") or 16), bias)
        if not body.get("stream"):
            texts = list(pieces)
            self._json(200, {"object": "text_completion", "model": self.state.model_id,
                             "choices": [{"index": 0, "text": "".join(texts),
                                          "finish_reason": "length"}],
                             "usage": _usage(n_prompt, len(texts))})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        n = 0
        for piece in pieces:
            n += 1
            self._event({"choices": [{"index": 0, "text": piece, "finish_reason": None}]})
        self._event({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event({"choices": [], "usage": _usage(n_prompt, n)})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _event(self, data: dict[str, Any]) -> None:
        data = {"id": "cmpl-test", "object": "text_completion", "created": int(time.time()),
                "model": self.state.model_id, **data}
        self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
        self.wfile.flush()

    def _json(self, status: int, body: Any) -> None:
        self._send(status, json.dumps(body).encode())


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


@contextlib.contextmanager
def standard_server(gguf: Path, model_id: str = "tiny", template: str = "",
                    ollama: bool = False, n_ctx: int = 1024) -> Iterator[StandardServer]:
    """Serve `gguf` under `model_id` on a free loopback port; yields the StandardServer."""
    state = StandardServer(url="", model_id=model_id)
    handler = type("StandardHandler", (_Handler,), {
        "model": _Model(gguf, n_ctx, template), "state": state, "ollama": ollama})
    with fake_server(handler) as url:
        state.url = url
        yield state
