"""Any OpenAI-compatible server, through the raw streaming completions API (httpx).

POST {endpoint}/completions with stream=true: the raw completions API (not chat) so the
prompt is exactly the text of our tokens, with no chat template around it. Timing is the
client's wall clock: t_start right before the request is sent, then the arrival of every
streamed chunk. Token counts come from the server's `usage` when it sends one.

Prompt text. A server takes text, not ids, so random prompts need a tokenizer:
  - a synthetic model (the ResolvedModel carries its spec, source "synthetic"): every
    text id is one character, so `text_for_tokens` gives exactly N tokens, and biasing every
    non-text id (unk, BOS, EOS, byte tokens) to -100 makes every generated token one
    character, so chunk token counts are exact;
  - any other model: the server's own tokenizer endpoints (llama.cpp's /tokenize and
    /detokenize, llama-cpp-python's /extras/tokenize and /extras/detokenize) turn random
    words into a prompt of exactly N tokens; without them the backend refuses, saying why.

Depth (@d<D>) must be prefilled outside the timed region. Over HTTP that is only possible
with a server-side prompt cache: an untimed request with the depth prefix, then the timed
request whose prompt starts with the same prefix. Known servers with such a cache:
llama.cpp's server (cache_prompt) and llama-cpp-python (it keeps the last prompt's KV and
reuses the longest common prefix). For others depth is refused. The timed prompt is new
random text every repetition, so no cache can serve it.
"""

from __future__ import annotations

import json
import random
import string
import time
from collections.abc import Callable
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
    EOS_BIAS,
    Server,
    _ErrorMap,
    _field,
    _int,
    _json_object,
    _one_line,
    _root_of,
    _server_message,
    _server_message_of,
    _sse_payloads,
    _Stream,
    _token_ids,
)

# -- server description ---------------------------------------------------------------------


# -- tokens <-> text ------------------------------------------------------------------------


class PromptText:
    """Turns token ids into prompt text and counts the tokens in streamed text."""

    kind = ""
    bos: int | None = None
    eos: int | None = None

    def random_ids(self, n: int, seed: int) -> list[int]:
        raise NotImplementedError

    def text(self, ids: list[int]) -> str:
        raise NotImplementedError

    def count(self, text: str) -> int | None:
        """Tokens in a streamed chunk's text; None when the text alone cannot say."""
        return None

    def logit_bias(self) -> dict[str, float]:
        return {str(self.eos): EOS_BIAS} if self.eos is not None else {}


class SyntheticText(PromptText):
    """The synthetic vocabulary: one character per text token, nothing else in text."""

    kind = "synthetic vocabulary (one character per token)"

    def __init__(self, vocab: int) -> None:
        from strata.models import synthetic

        self._syn = synthetic
        self.vocab = vocab
        self.bos, self.eos = synthetic.BOS_ID, synthetic.EOS_ID

    def random_ids(self, n: int, seed: int) -> list[int]:
        rng = random.Random(seed)
        return [rng.randrange(self._syn.FIRST_TEXT_ID, self.vocab) for _ in range(n)]

    def text(self, ids: list[int]) -> str:
        try:
            return self._syn.text_for_tokens(ids)
        except ValueError as exc:
            raise InputError(f"openai: {exc}") from exc

    def count(self, text: str) -> int | None:
        try:
            return len(self._syn.tokens_for_text(text))
        except ValueError:
            return None

    def logit_bias(self) -> dict[str, float]:
        # Every id that is not one plain character: EOS (never stop early) and unk, BOS and
        # the byte tokens (their text is not one character each, which would break counts).
        return {str(i): EOS_BIAS for i in range(self._syn.FIRST_TEXT_ID)}


class ServerText(PromptText):
    """The server's tokenizer: random words, cut where the server counts exactly N tokens."""

    kind = "server tokenizer (random words cut to exactly N tokens by the server)"

    def __init__(self, client: httpx.Client, server: Server) -> None:
        self._client, self._server = client, server
        self._texts: dict[tuple[int, ...], str] = {}
        with_special = self._tokenize("", special=True)
        self.bos = with_special[0] if with_special else None

    def _post(self, path: str, body: dict[str, Any], key: str) -> Any:
        """POST to a tokenizer route and return field `key` of its JSON reply."""
        url = self._server.root + path
        resp = self._client.post(url, json=body)
        if resp.status_code >= 400:
            raise StrataError(f"{url}: HTTP {resp.status_code}: {_server_message(resp)}")
        return _field(url, _json_object(url, resp), key)

    def _tokenize(self, text: str, special: bool = False) -> list[int]:
        if self._server.flavour == "llama.cpp":
            path, body = "/tokenize", {"content": text, "add_special": special}
        else:
            path, body = "/extras/tokenize", {"input": text, "model": self._server.model}
        ids = _token_ids(self._server.root + path, self._post(path, body, "tokens"))
        # llama-cpp-python always adds BOS: strip it when not wanted
        if self._server.flavour != "llama.cpp" and not special and ids and ids[0] == self.bos:
            ids = ids[1:]
        return ids

    def _detokenize(self, ids: list[int]) -> str:
        if self._server.flavour == "llama.cpp":
            return str(self._post("/detokenize", {"tokens": ids}, "content"))
        body = {"tokens": ids, "model": self._server.model}
        return str(self._post("/extras/detokenize", body, "text"))

    def random_ids(self, n: int, seed: int) -> list[int]:
        if n == 0:
            return []
        for attempt in range(4):
            rng = random.Random(seed * 16 + attempt)
            # n + 8 words: at least n + 8 tokens, since every word is at least one token
            fitted = self._fit(" ".join(_word(rng) for _ in range(n + 8)), n)
            if fitted is not None:
                ids, text = fitted
                self._texts[tuple(ids)] = text  # run() sends exactly this text
                return ids
        raise StrataError(f"{self._server.root}: could not build a prompt of exactly {n} "
                          "tokens with the server's tokenizer")

    def _fit(self, text: str, n: int) -> tuple[list[int], str] | None:
        """The shortest prefix of `text` that the server tokenizes into exactly n tokens.

        Cutting text (not ids) never splits a character, whatever the vocabulary; the token
        count grows with the prefix length, so a binary search finds the cut.
        """
        lo, hi = 0, len(text)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if len(self._tokenize(text[:mid])) >= n:
                hi = mid
            else:
                lo = mid
        for cut in range(hi, min(hi + 4, len(text)) + 1):  # counts can wobble at merges
            ids = self._tokenize(text[:cut])
            if len(ids) == n:
                return ids, text[:cut]
        return None

    def text(self, ids: list[int]) -> str:
        return self._texts.get(tuple(ids)) or self._detokenize(ids)


def _word(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 8)))


# -- one streamed request -------------------------------------------------------------------


# -- the backend ----------------------------------------------------------------------------


class OpenAIBackend:
    name = "openai"

    def __init__(self, read_timeout: float = DEFAULT_READ_TIMEOUT_S) -> None:
        self.read_timeout = read_timeout
        self._client: httpx.Client | None = None
        self._server: Server | None = None
        self._text: PromptText | None = None

    # -- load / close ------------------------------------------------------------------
    def load(self, model: ResolvedModel, config: LoadConfig) -> None:
        self.close()
        endpoint = (model.endpoint or model.ref).rstrip("/")
        if not endpoint.startswith(("http://", "https://")):
            raise InputError(f"{model.ref}: the openai backend needs an http(s):// endpoint")
        if not endpoint.endswith("/v1"):
            endpoint += "/v1"
        # trust_env=False: a benchmark talks to the server directly, never through a proxy
        # picked up from the environment (it would add its own latency to every figure).
        timeout = httpx.Timeout(self.read_timeout, connect=CONNECT_TIMEOUT_S)
        self._client = httpx.Client(timeout=timeout, trust_env=False)
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
        """llama.cpp's server has /props and /tokenize; llama-cpp-python /extras/tokenize."""
        if self._ok("GET", root + "/props"):
            return "llama.cpp", self._ok("POST", root + "/tokenize", {"content": "a"})
        if self._ok("POST", root + "/extras/tokenize", {"input": "a"}):
            return "llama-cpp-python", True
        return "unknown", False

    def _prompt_text(self, model: ResolvedModel) -> PromptText:
        assert self._server is not None and self._client is not None
        spec = model.spec
        if spec is not None and spec.source == "synthetic":
            return SyntheticText(spec.vocab)
        if self._server.tokenizer:
            return ServerText(self._client, self._server)
        raise InputError(f"endpoint {self._server.endpoint}: random prompts of exact length "
                         "need the server's tokenizer (/tokenize, /detokenize) and this "
                         f"server ({self._server.flavour}) has none: unsupported")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = self._server = self._text = None

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
        raise err(f"{url}: HTTP {resp.status_code}: {_server_message(resp)}")

    def _errors(self, url: str, tokens: int) -> _ErrorMap:
        return _ErrorMap(url, tokens, self.read_timeout)

    # -- vocabulary ------------------------------------------------------------------------
    def random_tokens(self, n: int, seed: int) -> list[int]:
        return self._need_text().random_ids(n, seed)

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
        notes: list[str] = []
        depth_text = self._text_of(request.depth_tokens, strip_bos=True)
        prompt_text = self._text_of(request.prompt_tokens, strip_bos=not request.depth_tokens)
        if request.depth_tokens:
            self._warm_depth(depth_text, notes)
        elif server.flavour == "llama-cpp-python" and request.prompt_tokens:
            notes.append("llama-cpp-python reuses the KV of the prefix shared with its previous "
                         "prompt: the shared BOS is not re-evaluated (N-1 prompt tokens are)")
        body = self._body(depth_text + prompt_text, max(1, request.n_gen), bool(depth_text))
        url = server.endpoint + "/completions"
        t_start = time.perf_counter_ns()
        stream = self._stream(url, body)
        trace = self._trace(request, t_start, stream, notes)
        self._note_eos(request, stream, text, notes)
        trace.notes = notes
        return trace

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
        if n is None:
            out.uncountable += 1
            n = 1
        return n

    # -- trace -------------------------------------------------------------------------------
    def _trace(self, request: RunRequest, t_start: int, stream: _Stream,
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
        self._note_counts(trace, stream, notes)
        return trace

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
            notes.append(f"streamed text counts {got} tokens, usage says "
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
            out["logit_bias_ids"] = len(self._text.logit_bias())
        return out


