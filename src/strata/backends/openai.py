"""Any OpenAI-compatible server, through the raw streaming completions API (httpx).

POST {endpoint}/completions with stream=true: the raw completions API (not chat) so the
prompt is exactly the text of our tokens, with no chat template around it. Timing is the
client's wall clock: t_start right before the request is sent, then the arrival of every
streamed chunk. Token counts come from the server's `usage` when it sends one.

Prompt text. A server takes text, not ids, so random prompts need a tokenizer; the first
of these that applies is used (openai_text.py has one class each):
  - a synthetic model (the ResolvedModel carries its spec, source "synthetic"): every
    text id is one character, so `text_for_tokens` gives exactly N tokens, and biasing every
    non-text id (unk, BOS, EOS, byte tokens) to -100 makes every generated token one
    character, so chunk token counts are exact;
  - the server's own tokenizer endpoints (llama.cpp's /tokenize and /detokenize,
    llama-cpp-python's /extras/tokenize and /extras/detokenize): random words cut to a
    prompt of exactly N tokens;
  - a server with only the standard routes (/v1/models, /v1/completions: Ollama, LM Studio,
    hosted APIs) serving a model whose GGUF is here (`ollama:NAME`): that GGUF's tokenizer
    cuts the words, plus the tokens the server adds to every prompt (measured);
  - nothing known: prompts built to N by a fit of the server's usage.prompt_tokens over a
    few untimed probe requests, corrected by every reply, and each prompt's figures taken
    from the server's own count.
Generated tokens are counted from the streamed text (synthetic) or one per streamed delta,
checked against usage.completion_tokens. Every result says which (info prompt_tokens_from,
generated_tokens_from, and a note).

Auth: when the environment variable OPENAI_API_KEY is set (what OpenAI's own clients read),
every request carries `Authorization: Bearer $OPENAI_API_KEY` (a hosted API's key, or the
ring secret of `strata ring serve --api`); the key is never stored or printed.

Depth (@d<D>) must be prefilled outside the timed region. Over HTTP that is only possible
with a server-side prompt cache: an untimed request with the depth prefix, then the timed
request whose prompt starts with the same prefix. Known servers with such a cache:
llama.cpp's server (cache_prompt) and llama-cpp-python (it keeps the last prompt's KV and
reuses the longest common prefix). For others depth is refused. The timed prompt is new
random text every repetition, so no cache can serve it.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from strata.backends.base import BackendUnavailable, LoadConfig, RunRequest, RunTrace
from strata.errors import InputError, StrataError
from strata.models.source import ResolvedModel

try:
    import httpx
except ImportError as _exc:
    raise BackendUnavailable(f"openai: httpx is not installed ({_exc})") from _exc

from strata.backends.openai_protocol import (
    CONNECT_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    Server,
    _ErrorMap,
    _int,
    _json_object,
    _one_line,
    _root_of,
    _server_message,
    _server_message_of,
    _sse_payloads,
    _Stream,
)
from strata.backends.openai_text import (
    CalibratedText,
    GgufVocab,
    LocalText,
    PromptText,
    ServerText,
    SyntheticText,
)

API_KEY_ENV = "OPENAI_API_KEY"


def _http_client(timeout: httpx.Timeout) -> httpx.Client:
    """A client for the endpoint: trust_env=False, since a benchmark talks to the server
    directly, never through a proxy picked up from the environment (it would add its own
    latency to every figure); the bearer token from $OPENAI_API_KEY on every request."""
    key = os.environ.get(API_KEY_ENV, "").strip()
    headers = {"Authorization": f"Bearer {key}"} if key else None
    return httpx.Client(timeout=timeout, trust_env=False, headers=headers)


# -- the backend ----------------------------------------------------------------------------


class OpenAIBackend:
    name = "openai"

    def __init__(self, read_timeout: float = DEFAULT_READ_TIMEOUT_S) -> None:
        self.read_timeout = read_timeout
        self._client: httpx.Client | None = None
        self._server: Server | None = None
        self._text: PromptText | None = None
        self._text_notes: list[str] = []  # how the prompt text came to be what it is
        self._rng = random.Random(0)  # tg prompts for servers that refuse an empty one
        self._owns_text = True  # False for a worker(): the prompt text is its parent's

    # -- load / close ------------------------------------------------------------------
    def load(self, model: ResolvedModel, config: LoadConfig) -> None:
        self.close()
        endpoint = (model.endpoint or model.ref).rstrip("/")
        if not endpoint.startswith(("http://", "https://")):
            raise InputError(f"{model.ref}: the openai backend needs an http(s):// endpoint")
        if not endpoint.endswith("/v1"):
            endpoint += "/v1"
        timeout = httpx.Timeout(self.read_timeout, connect=CONNECT_TIMEOUT_S)
        self._client = _http_client(timeout)
        try:
            self._server = self._describe(endpoint, model.model_name)
            self._text = self._prompt_text(model)
        except BaseException:
            self.close()
            raise

    def _describe(self, endpoint: str, model_name: str | None) -> Server:
        models = self._get_json(endpoint + "/models")
        ids = [m.get("id") for m in models.get("data", []) if isinstance(m, dict)]
        name = model_name or (ids[0] if ids else None)
        if not name:
            raise InputError(f"endpoint {endpoint} lists no models: pass --model-name")
        root = _root_of(endpoint)
        flavour, tokenizer = self._probe_flavour(root)
        return Server(endpoint, root, str(name), flavour, tokenizer)

    def _probe_flavour(self, root: str) -> tuple[str, bool]:
        """llama.cpp's server has /props and /tokenize; llama-cpp-python /extras/tokenize;
        Ollama /api/version. Anything else is "unknown" (the standard routes only)."""
        if self._ok("GET", root + "/props"):
            return "llama.cpp", self._ok("POST", root + "/tokenize", {"content": "a"})
        if self._ok("POST", root + "/extras/tokenize", {"input": "a"}):
            return "llama-cpp-python", True
        if self._ok("GET", root + "/api/version"):
            return "ollama", False
        return "unknown", False

    def _prompt_text(self, model: ResolvedModel) -> PromptText:
        assert self._server is not None and self._client is not None
        spec = model.spec
        if spec is not None and spec.source == "synthetic":
            return SyntheticText(spec.vocab)
        if self._server.tokenizer:
            return ServerText(self._client, self._server)
        gguf = model.artefacts.get("gguf")
        if isinstance(gguf, Path):  # the served model's file is here (ollama:NAME)
            try:
                vocab = GgufVocab(gguf)
            except Exception as exc:  # llama-cpp-python missing, or the vocabulary unreadable
                self._text_notes.append(f"the local tokenizer of {model.ref} could not be "
                                        f"read ({_one_line(str(exc), 120)}): prompts are "
                                        "calibrated against the server's counts instead")
            else:
                return LocalText(self._count_prompt, vocab, f"the GGUF of {model.ref}")
        return CalibratedText(self._count_prompt)

    def _count_prompt(self, text: str) -> int:
        """usage.prompt_tokens of `text`: an untimed, non-streamed request for one token.
        The probes' texts are never a timed prompt's, so no cache can help a timed one."""
        server = self._server
        assert server is not None and self._client is not None
        url = server.endpoint + "/completions"
        body = {"model": server.model, "prompt": text, "max_tokens": 1, "temperature": 0.0,
                "stream": False}
        with self._errors(url, 0):
            resp = self._client.post(url, json=body)
            self._raise_for_status(url, resp)
            data = _json_object(url, resp)
        usage = data.get("usage")
        n = _int(usage.get("prompt_tokens")) if isinstance(usage, dict) else None
        if n is None:
            raise InputError(f"{url}: the reply has no usage.prompt_tokens and the server has "
                             "no tokenize route, so prompts of N tokens cannot be built "
                             "(-p none runs; or serve the model with llama.cpp's server)")
        return n

    def _ready_text(self) -> PromptText:
        """The prompt text, calibrated on first use (untimed probe requests). A local
        tokenizer that the server's counts contradict gives way to calibration."""
        text = self._need_text()
        if isinstance(text, LocalText) and text.overhead is None and not text.calibrate():
            self._text_notes.append(f"{text.disagreement}: prompts are calibrated against "
                                    "the server's counts instead")
            text.close()
            text = self._text = CalibratedText(self._count_prompt)
        return text

    def worker(self) -> OpenAIBackend:
        """Another client of the same loaded endpoint, for concurrent requests (serving
        load, bench/load.py): its own httpx client and connection, sharing this backend's
        server description and prompt text, so a prompt built here is sent as is from there.
        Its connection is opened now (an untimed GET /models), not in a timed request."""
        if self._client is None or self._server is None or self._text is None:
            raise StrataError("openai: no endpoint loaded")
        other = OpenAIBackend(self.read_timeout)
        other._client = _http_client(self._client.timeout)
        other._server, other._text, other._owns_text = self._server, self._text, False
        other._text_notes = list(self._text_notes)
        try:
            other._get_json(self._server.endpoint + "/models")
        except BaseException:
            other.close()
            raise
        return other

    def close(self) -> None:
        if self._text is not None and self._owns_text:
            self._text.close()
        if self._client is not None:
            self._client.close()
        self._client = self._server = self._text = None
        self._text_notes = []

    # -- small HTTP helpers ---------------------------------------------------------------
    def _ok(self, method: str, url: str, body: dict[str, Any] | None = None) -> bool:
        assert self._client is not None
        try:  # a probe: short timeout, any failure just means "not this server"
            resp = self._client.request(method, url, json=body, timeout=CONNECT_TIMEOUT_S)
        except httpx.HTTPError:
            return False
        return resp.status_code < 400

    def _get_json(self, url: str) -> Any:
        assert self._client is not None
        with self._errors(url, 0):
            resp = self._client.get(url)
            self._raise_for_status(url, resp)
            return _json_object(url, resp)

    def _raise_for_status(self, url: str, resp: httpx.Response) -> None:
        if resp.status_code < 400:
            return
        if resp.is_stream_consumed is False:
            resp.read()
        err = InputError if resp.status_code < 500 else StrataError
        hint = ""
        if resp.status_code == 401:
            hint = (f" (set {API_KEY_ENV} to its API key)" if not os.environ.get(API_KEY_ENV)
                    else f" (the key in {API_KEY_ENV} was refused)")
        raise err(f"{url}: HTTP {resp.status_code}: {_server_message(resp)}{hint}")

    def _errors(self, url: str, tokens: int) -> _ErrorMap:
        return _ErrorMap(url, tokens, self.read_timeout)

    # -- vocabulary ------------------------------------------------------------------------
    def random_tokens(self, n: int, seed: int) -> list[int]:
        return self._ready_text().random_ids(n, seed)

    def bos(self) -> int | None:
        return self._need_text().bos

    def _need_text(self) -> PromptText:
        if self._text is None:
            raise StrataError("openai: no endpoint loaded")
        return self._text

    # -- the timed run -------------------------------------------------------------------
    def run(self, request: RunRequest) -> RunTrace:
        text, server = self._need_text(), self._server
        assert server is not None
        notes: list[str] = list(self._text_notes)
        if request.depth_tokens and text.server_counted:
            raise InputError(f"endpoint {server.endpoint}: @d<D> needs a depth prefix of "
                             "exactly D tokens, which needs a tokenizer: this server has no "
                             "tokenize route and prompts are counted by its usage; "
                             "unsupported")
        depth_text = self._text_of(request.depth_tokens, strip_bos=True)
        prompt_text = self._text_of(request.prompt_tokens, strip_bos=not request.depth_tokens)
        if request.depth_tokens:
            self._warm_depth(depth_text, notes)
        elif server.flavour == "llama-cpp-python" and request.prompt_tokens:
            notes.append("llama-cpp-python reuses the KV of the prefix shared with its previous "
                         "prompt: the shared BOS is not re-evaluated (N-1 prompt tokens are)")
        if not depth_text and not prompt_text:
            prompt_text = text.empty_prompt(self._rng)
        body = self._body(depth_text + prompt_text, max(1, request.n_gen), bool(depth_text))
        url = server.endpoint + "/completions"
        t_start = time.perf_counter_ns()
        stream = self._stream(url, body)
        trace = self._trace(request, t_start, stream, text, notes)
        if text.server_counted:
            self._server_counted(request, trace, text, notes)
        self._note_eos(request, stream, text, notes)
        self._note_how_counted(request, text, notes)
        trace.notes = notes
        return trace

    def _server_counted(self, request: RunRequest, trace: RunTrace, text: PromptText,
                        notes: list[str]) -> None:
        """A prompt the client cannot count: its length is what the server counted."""
        reported = trace.n_prompt_reported
        if not request.prompt_tokens:
            if reported is not None:
                notes.append(f"tg: the request carries a one-word prompt ({reported} tokens by "
                             "the server's count: an empty prompt is no request to some "
                             "servers); the first token includes its prefill")
            return
        if reported is None:
            notes.append(f"the server sent no usage: the {trace.n_prompt}-token prompt's "
                         "length is the calibrated estimate, unchecked")
            return
        text.observed(request.prompt_tokens, reported)
        if reported != trace.n_prompt:
            notes.append(f"the server counted {reported} prompt tokens in a prompt built to "
                         f"{trace.n_prompt}: the figures use {reported}")
            trace.n_prompt = reported

    def _note_how_counted(self, request: RunRequest, text: PromptText,
                          notes: list[str]) -> None:
        if request.prompt_tokens or request.depth_tokens:
            notes.append(f"prompt tokens: {text.kind}")
        if request.n_gen:
            notes.append(f"generated tokens: {text.generated}")

    def prompt_text(self, tokens: tuple[int, ...] | list[int]) -> str:
        """The text sent for these prompt tokens (a leading BOS is left to the server)."""
        return self._text_of(tuple(tokens), strip_bos=True)

    def _text_of(self, ids: tuple[int, ...], strip_bos: bool) -> str:
        """Prompt text. The server adds BOS itself, so a leading BOS is not sent as text."""
        text = self._need_text()
        body = list(ids)
        if body and text.bos is not None and body[0] == text.bos:
            if not strip_bos:
                raise InputError("openai: a BOS in the middle of the context cannot be sent "
                                 "as text (only the server's own leading BOS)")
            body = body[1:]
        return text.text(body) if body else ""

    def _warm_depth(self, depth_text: str, notes: list[str]) -> None:
        server = self._server
        assert server is not None and self._client is not None
        if not server.prompt_cache:
            raise InputError(f"endpoint {server.endpoint}: @d<D> needs the depth prefilled "
                             "outside the timed request, which needs a server-side prompt "
                             f"cache; this server ({server.flavour}) has none known: "
                             "unsupported")
        body = self._body(depth_text, 1, cache=True)
        body["stream"] = False
        body.pop("stream_options", None)
        url = server.endpoint + "/completions"
        with self._errors(url, 0):
            self._raise_for_status(url, self._client.post(url, json=body))
        notes.append(f"depth prefilled by an untimed request; the timed request relies on "
                     f"the {server.flavour} server's prompt cache for that prefix")

    def _body(self, prompt: str, max_tokens: int, cache: bool) -> dict[str, Any]:
        assert self._server is not None and self._text is not None
        body: dict[str, Any] = {
            "model": self._server.model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": True,  # llama.cpp server and vLLM honour it; others ignore it
        }
        bias = self._text.logit_bias()
        if bias:
            body["logit_bias"] = bias
        if self._server.flavour == "llama.cpp":
            body["cache_prompt"] = cache  # only the depth prefix may come from the cache
        return body

    def _stream(self, url: str, body: dict[str, Any]) -> _Stream:
        """Send the request and read the whole stream; raise (never return) on failure."""
        assert self._client is not None and self._text is not None
        out = _Stream()
        now, count = time.perf_counter_ns, self._text.count
        deadline_gap = int(self.read_timeout * 1e9)
        guard = self._errors(url, 0)
        with guard, self._client.stream("POST", url, json=body) as resp:
            self._raise_for_status(url, resp)
            kind = resp.headers.get("content-type", "")
            if "text/event-stream" not in kind:
                raise StrataError(f"{url}: server answered {kind or 'without a content type'}, "
                                  "not an event stream: stream=true not honoured")
            last = now()
            for payload in _sse_payloads(resp.iter_lines()):
                t = now()
                if payload == "[DONE]":
                    out.done = True
                    break
                n = self._chunk(payload, out, count) if payload else 0
                if n:
                    out.token_ns.append(t)
                    out.chunk_tokens.append(n)
                    guard.tokens += n
                    last = t
                elif t - last > deadline_gap:  # keep-alive pings only: the server is stuck
                    raise httpx.ReadTimeout("no tokens")
        if not out.done:
            raise StrataError(f"{url}: server closed the stream after {sum(out.chunk_tokens)} "
                              "tokens (no [DONE])")
        return out

    def _chunk(self, payload: str, out: _Stream, count: Callable[[str], int | None]) -> int:
        """Parse one chunk; return how many generated tokens it carries."""
        try:
            data = json.loads(payload)
        except ValueError as exc:
            raise StrataError(f"server sent a malformed stream chunk: {_one_line(payload, 80)}"
                              ) from exc
        if "error" in data:
            raise StrataError(f"server error mid-stream: {_server_message_of(data)}")
        if data.get("usage"):
            out.usage = data["usage"]
        if data.get("timings"):
            out.timings = data["timings"]
        choices = data.get("choices") or []
        if not choices:
            return 0
        choice = choices[0]
        finish = choice.get("finish_reason")
        out.finish_reason = finish or out.finish_reason
        piece = choice.get("text") or ""
        if not piece:
            if finish:  # the closing chunk: carries the reason, not a token
                return 0
            # A token whose text is not visible yet (llama-cpp-python sends the first token
            # after a bare BOS as ""; servers hold back incomplete UTF-8): one token.
            out.textless += 1
            return 1
        n = count(piece)
        if n is None:  # one token per delta, unless the text should have said
            out.uncountable += 1 if self._text is not None and self._text.counts_text else 0
            n = 1
        return n

    # -- trace -------------------------------------------------------------------------------
    def _trace(self, request: RunRequest, t_start: int, stream: _Stream, text: PromptText,
               notes: list[str]) -> RunTrace:
        n_depth = len(request.depth_tokens)
        trace = RunTrace(n_prompt=len(request.prompt_tokens), n_gen=request.n_gen,
                         t_start=t_start, t_prefill_end=None)
        if request.n_gen:
            trace.token_ns, trace.chunk_tokens = stream.token_ns, stream.chunk_tokens
        elif stream.token_ns:  # pp only: the first token's arrival marks the prefill's end
            trace.t_prefill_end = stream.token_ns[0]
            notes.append("pp over HTTP: prefill end = arrival of the first generated token "
                         "(max_tokens=1), so it includes one decode step and the network")
        if stream.usage:
            trace.n_prompt_reported = _int(stream.usage.get("prompt_tokens"))
            if trace.n_prompt_reported is not None and n_depth:
                trace.n_prompt_reported -= n_depth
                notes.append(f"n_prompt_reported = usage.prompt_tokens - {n_depth} depth "
                             "tokens")
            trace.n_gen_reported = _int(stream.usage.get("completion_tokens"))
        else:
            notes.append("server sent no usage in the stream (stream_options.include_usage "
                          "not honoured): token counts come from the streamed text")
        if stream.timings:
            trace.internal = {f"server_{k}": float(v) for k, v in stream.timings.items()
                              if isinstance(v, (int, float))}
        if not text.counts_text and stream.finish_reason != "stop":
            self._spread_reported(trace, notes)
        self._note_counts(trace, stream, notes)
        return trace

    @staticmethod
    def _spread_reported(trace: RunTrace, notes: list[str]) -> None:
        """Counted per delta, but usage says more tokens came: some deltas carried several.
        The total is the server's; spread evenly over the deltas (earliest first). Not after
        a stop, whose EOS some servers count in usage without streaming it."""
        deltas, reported = len(trace.chunk_tokens), trace.n_gen_reported
        if not trace.n_gen or not deltas or reported is None or reported <= deltas:
            return
        each, extra = divmod(reported, deltas)
        trace.chunk_tokens = [each + (i < extra) for i in range(deltas)]
        notes.append(f"usage counts {reported} generated tokens in {deltas} streamed deltas: "
                     "the server's total is used, spread evenly over the deltas")

    def _note_counts(self, trace: RunTrace, stream: _Stream, notes: list[str]) -> None:
        if stream.uncountable:
            notes.append(f"{stream.uncountable} chunk(s) could not be counted from their text; "
                         "counted as 1 token each (see n_gen_reported from usage)")
        if stream.textless:
            notes.append(f"{stream.textless} chunk(s) had empty text before the end; counted "
                         "as 1 token each")
        if any(n > 1 for n in trace.chunk_tokens):
            notes.append("server streamed multi-token chunks: ITL within a chunk is not "
                         "observable")
        got = sum(trace.chunk_tokens)
        if trace.n_gen and trace.n_gen_reported is not None and trace.n_gen_reported != got:
            notes.append(f"the stream counts {got} tokens, usage says "
                         f"{trace.n_gen_reported}")

    def _note_eos(self, request: RunRequest, stream: _Stream, text: PromptText,
                  notes: list[str]) -> None:
        got = (stream.usage or {}).get("completion_tokens", sum(stream.chunk_tokens))
        if request.n_gen and got < request.n_gen:
            notes.append(f"server stopped after {got} of {request.n_gen} tokens "
                         f"(finish_reason={stream.finish_reason}): EOS suppression "
                         "(ignore_eos, logit_bias) not honoured; the trace has fewer tokens")
        elif text.eos is None and request.n_gen:
            notes.append("EOS id unknown: only ignore_eos was sent, which llama.cpp's server "
                         "and vLLM honour (llama-cpp-python does not)")

    # -- description -----------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.name, "httpx": httpx.__version__,
                               "read_timeout_s": self.read_timeout,
                               "connect_timeout_s": CONNECT_TIMEOUT_S,
                               "timing": "client wall clock; chunk arrival times"}
        if self._server is not None:
            s = self._server
            out.update(endpoint=s.endpoint, model_name=s.model, server=s.flavour,
                       server_tokenizer=s.tokenizer, prompt_cache=s.prompt_cache)
        if self._text is not None:
            out["prompt_tokens_from"] = self._text.kind
            out["generated_tokens_from"] = self._text.generated
            out["logit_bias_ids"] = len(self._text.logit_bias())
            if self._text.describe():
                out["prompt_calibration"] = self._text.describe()
        return out


