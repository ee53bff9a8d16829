"""The openai backend against a real llama-cpp-python server on loopback, and against small
fake servers for the failure modes (refused, dying mid-stream, never answering)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

pytest.importorskip("httpx", reason="httpx (the openai extra) not installed")

from strata.backends.base import LoadConfig, RunRequest, RunTrace
from strata.backends.openai import OpenAIBackend
from strata.errors import InputError, StrataError
from strata.models.source import ResolvedModel, resolve
from strata.models.synthetic import FIRST_TEXT_ID, text_for_tokens
from tests.conftest import run_cli
from tests.seed_host import seed_host
from tests.server_fixture import (
    FakeHandler,
    RunningServer,
    fake_server,
    free_port,
    llama_server,
    silent_socket,
)

TINY = "synthetic:tiny@q8_0"
TINY_VOCAB = 512


def endpoint_model(url: str, synthetic: ResolvedModel | None = None,
                   name: str | None = None) -> ResolvedModel:
    """The endpoint, and (for a server known to serve a synthetic model) its spec."""
    return ResolvedModel(ref=url, kind="endpoint", spec=synthetic.spec if synthetic else None,
                         endpoint=url, model_name=name)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ResolvedModel]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(tmp_path_factory.mktemp("home")))
        model = resolve(TINY)
        model.path("gguf", "openai-test")
        yield model


@pytest.fixture(scope="module")
def running(tiny: ResolvedModel) -> Iterator[RunningServer]:
    pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python[server] missing")
    with llama_server(tiny.path("gguf", "openai-test"), n_ctx=512) as srv:
        yield srv


@pytest.fixture(scope="module")
def server(running: RunningServer) -> str:
    return running.url


@pytest.fixture(scope="module")
def backend(server: str, tiny: ResolvedModel) -> Iterator[OpenAIBackend]:
    b = OpenAIBackend(read_timeout=60)
    b.load(endpoint_model(server, tiny), LoadConfig())
    yield b
    b.close()


def request(b: OpenAIBackend, depth: int, prompt: int, gen: int, seed: int) -> RunRequest:
    bos = b.bos()
    assert bos is not None
    first = [bos] if depth or prompt else []
    ctx = first + b.random_tokens(depth + prompt - len(first), seed)
    return RunRequest(tuple(ctx[:depth]), tuple(ctx[depth:]), gen)


def check_monotonic(trace: RunTrace) -> None:
    stamps = [trace.t_start, *trace.token_ns]
    assert all(b > a for a, b in pairwise(stamps))


# -- against the real server -----------------------------------------------------------------


def test_server_is_described(backend: OpenAIBackend, server: str) -> None:
    info = backend.info()
    assert info["server"] == "llama-cpp-python" and info["server_tokenizer"] is True
    assert info["endpoint"] == server and info["model_name"]  # first id of /v1/models
    assert info["prompt_tokens_from"].startswith("synthetic")


def test_pp32_tg16_token_counts_match_the_server(backend: OpenAIBackend,
                                                 running: RunningServer) -> None:
    backend.run(request(backend, 0, 32, 16, seed=11))  # so the server has a previous prompt
    req = request(backend, 0, 32, 16, seed=1)
    trace = backend.run(req)
    # Only the BOS is shared with the previous prompt: the new random prompt was evaluated.
    hits = [ln for ln in running.log().splitlines() if "prefix-match hit" in ln]
    assert hits[-1].startswith("Llama.generate: 1 prefix-match hit, remaining 31 ")
    assert any("shared BOS" in n for n in trace.notes)
    check_monotonic(trace)
    assert trace.n_prompt == 32 and trace.n_gen == 16
    assert sum(trace.chunk_tokens) == 16, trace.notes  # EOS suppressed: all 16 came
    assert len(trace.token_ns) == len(trace.chunk_tokens)
    if trace.n_prompt_reported is not None:  # usage in the stream: BOS + 31 characters
        assert trace.n_prompt_reported == 32
        assert trace.n_gen_reported == 16
    else:
        assert any("no usage" in n for n in trace.notes)


def server_tokens(server: str, text: str) -> list[int]:
    """llama-cpp-python's own tokenizer endpoint (it adds BOS, as for a completion)."""
    import httpx

    resp = httpx.post(server.removesuffix("/v1") + "/extras/tokenize", json={"input": text},
                      trust_env=False)
    return list(resp.json()["tokens"])


def test_prompt_text_is_exactly_n_server_tokens(backend: OpenAIBackend, server: str) -> None:
    req = request(backend, 0, 32, 1, seed=2)
    text = backend.prompt_text(req.prompt_tokens)
    assert text == text_for_tokens(req.prompt_tokens[1:])  # one character per token
    assert server_tokens(server, text) == list(req.prompt_tokens)  # the server adds BOS


def test_tg8_from_bos_only(backend: OpenAIBackend) -> None:
    trace = backend.run(request(backend, 0, 0, 8, seed=3))
    check_monotonic(trace)
    assert trace.n_prompt == 0 and sum(trace.chunk_tokens) == 8


def test_pp_only_marks_prefill_end_with_first_token(backend: OpenAIBackend) -> None:
    trace = backend.run(request(backend, 0, 24, 0, seed=4))
    assert trace.token_ns == [] and trace.t_prefill_end is not None
    assert trace.t_prefill_end > trace.t_start
    assert any("prefill end" in n for n in trace.notes)


def test_depth_uses_the_servers_prompt_cache(backend: OpenAIBackend,
                                            running: RunningServer) -> None:
    trace = backend.run(request(backend, 16, 32, 4, seed=5))
    check_monotonic(trace)
    assert sum(trace.chunk_tokens) == 4
    assert any("prompt cache" in n for n in trace.notes)
    if trace.n_prompt_reported is not None:
        assert trace.n_prompt_reported == 32
    # The server says so itself: the 16 depth tokens came from its KV, 32 were evaluated.
    hits = [ln for ln in running.log().splitlines() if "prefix-match hit" in ln]
    assert hits and hits[-1].startswith("Llama.generate: 16 prefix-match hit, remaining 32 ")


def test_random_prompts_differ_per_seed(backend: OpenAIBackend) -> None:
    a, b = backend.random_tokens(64, 1), backend.random_tokens(64, 2)
    assert a != b and a == backend.random_tokens(64, 1)
    assert all(FIRST_TEXT_ID <= t < TINY_VOCAB for t in a + b)


def test_server_tokenizer_route_for_unknown_models(server: str) -> None:
    b = OpenAIBackend(read_timeout=60)
    b.load(endpoint_model(server), LoadConfig())  # no spec: the server's tokenizer is used
    try:
        assert b.info()["prompt_tokens_from"].startswith("server tokenizer")
        ids = b.random_tokens(20, seed=7)
        assert len(ids) == 20 and ids != b.random_tokens(20, seed=8)
        bos = b.bos()
        assert bos == 1
        assert server_tokens(server, b.prompt_text([bos, *ids])) == [bos, *ids]
        trace = b.run(RunRequest((), (bos, *ids), 2))
        assert len(trace.token_ns) >= 1  # counted per chunk; no synthetic text to count
    finally:
        b.close()


# -- failure modes ----------------------------------------------------------------------------


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def text_chunk(i: int) -> bytes:
    return sse({"choices": [{"index": 0, "text": text_for_tokens([FIRST_TEXT_ID + i]),
                             "finish_reason": None}]})


class DiesMidStream(FakeHandler):
    """Chunked SSE: three tokens, then the connection drops without the final chunk."""

    def completions(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(3):
            data = text_chunk(i)
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        self.close_connection = True


class EndsWithoutDone(FakeHandler):
    """A well-formed close-delimited body that simply stops: no [DONE]."""

    protocol_version = "HTTP/1.0"

    def completions(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(2):
            self.wfile.write(text_chunk(i))


class NeverAnswers(FakeHandler):
    def completions(self) -> None:
        self.release.wait(30)  # accepts the request, says nothing


class OnlyPings(FakeHandler):
    """Streams keep-alive comments forever and never a token (a stuck server)."""

    def completions(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        while not self.release.wait(0.1):
            try:
                self.wfile.write(b": ping\n\n")
                self.wfile.flush()
            except OSError:  # the client gave up
                return


class NotStreaming(FakeHandler):
    def completions(self) -> None:
        self._send(200, b'{"choices": [{"text": "x", "finish_reason": "length"}]}')


class BadRequest(FakeHandler):
    def completions(self) -> None:
        self._send(400, b'{"error": {"message": "max_tokens is too large: 99999"}}')


class StopsEarly(FakeHandler):
    """Honours nothing: two tokens, finish_reason stop, usage, [DONE]."""

    def completions(self) -> None:
        body = text_chunk(0) + text_chunk(1)
        body += sse({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})
        body += sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
        body += b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def tiny_spec_model(tmp_path_factory: pytest.TempPathFactory) -> ResolvedModel:
    return resolve(TINY)  # the spec only: nothing is written


def loaded(url: str, model: ResolvedModel, read_timeout: float = 5) -> OpenAIBackend:
    b = OpenAIBackend(read_timeout=read_timeout)
    b.load(endpoint_model(url, model), LoadConfig())
    return b


def small_request() -> RunRequest:
    return RunRequest((), (1, FIRST_TEXT_ID, FIRST_TEXT_ID + 1), 8)


def test_refused_port_is_a_fast_clear_error(tiny_spec_model: ResolvedModel) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    t0 = time.monotonic()
    with pytest.raises(InputError, match="refused the connection: is the server running"):
        loaded(url, tiny_spec_model)
    assert time.monotonic() - t0 < 3


def test_dying_mid_stream_is_an_error_not_a_partial_trace(
        tiny_spec_model: ResolvedModel) -> None:
    with fake_server(DiesMidStream) as url:
        b = loaded(url, tiny_spec_model)
        with pytest.raises(StrataError, match="closed the stream after 3 tokens"):
            b.run(small_request())
        b.close()


def test_stream_without_done_is_an_error(tiny_spec_model: ResolvedModel) -> None:
    with fake_server(EndsWithoutDone) as url:
        b = loaded(url, tiny_spec_model)
        with pytest.raises(StrataError, match=r"after 2 tokens \(no \[DONE\]\)"):
            b.run(small_request())
        b.close()


@pytest.mark.parametrize("handler", [NeverAnswers, OnlyPings],
                         ids=["never-answers", "only-pings"])
def test_silent_server_times_out(tiny_spec_model: ResolvedModel, handler: type) -> None:
    with fake_server(handler) as url:
        b = loaded(url, tiny_spec_model, read_timeout=1.0)
        t0 = time.monotonic()
        with pytest.raises(StrataError, match="sent nothing for 1 s"):
            b.run(small_request())
        assert time.monotonic() - t0 < 4
        b.close()


def test_server_ignoring_stream_true_is_an_error(tiny_spec_model: ResolvedModel) -> None:
    with fake_server(NotStreaming) as url:
        b = loaded(url, tiny_spec_model)
        with pytest.raises(StrataError, match="not an event stream"):
            b.run(small_request())
        b.close()


def test_silent_socket_times_out_at_load(tiny_spec_model: ResolvedModel) -> None:
    with silent_socket() as url:
        t0 = time.monotonic()
        with pytest.raises(StrataError, match="read timeout"):
            loaded(url, tiny_spec_model, read_timeout=1.0)
        assert time.monotonic() - t0 < 4


def test_http_error_carries_the_servers_message(tiny_spec_model: ResolvedModel) -> None:
    with fake_server(BadRequest) as url:
        b = loaded(url, tiny_spec_model)
        with pytest.raises(InputError, match="HTTP 400: max_tokens is too large: 99999"):
            b.run(small_request())
        b.close()


def test_early_stop_is_reported_never_padded(tiny_spec_model: ResolvedModel) -> None:
    with fake_server(StopsEarly) as url:
        b = loaded(url, tiny_spec_model)
        trace = b.run(small_request())
        b.close()
    assert len(trace.token_ns) == 2 and sum(trace.chunk_tokens) == 2
    assert trace.n_gen_reported == 2
    assert any("stopped after 2 of 8" in n for n in trace.notes)


def test_unknown_server_without_tokenizer_is_calibrated() -> None:
    """No tokenize route: prompts are calibrated against the server's usage (the standard
    routes' own tests are in test_openai_standard.py); loading probes nothing yet."""
    with fake_server(StopsEarly) as url:
        b = OpenAIBackend()
        b.load(endpoint_model(url), LoadConfig())
        info = b.info()
        b.close()
    assert info["server"] == "unknown" and info["server_tokenizer"] is False
    assert info["prompt_tokens_from"].startswith("calibrated on the server's usage")
    assert info["generated_tokens_from"].startswith("one token per streamed delta")


def test_depth_without_a_known_prompt_cache_is_refused(
        tiny_spec_model: ResolvedModel) -> None:
    with fake_server(StopsEarly) as url:
        b = loaded(url, tiny_spec_model)
        req = RunRequest((1, FIRST_TEXT_ID), (FIRST_TEXT_ID + 1,), 2)
        with pytest.raises(InputError, match="prompt cache"):
            b.run(req)
        b.close()


# -- a tokenize route that does not answer JSON -----------------------------------------------


class BadTokenizer(FakeHandler):
    """Looks like llama.cpp's server (/props answers), but /tokenize answers `reply`: what a
    proxy's error page, a truncated body or another API looks like from here."""

    reply: bytes = b""
    content_type = "application/json"

    def do_GET(self) -> None:
        if self.path == "/props":
            self._send(200, b"{}")
        else:
            super().do_GET()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/tokenize":
            self._send(404, b'{"detail":"Not Found"}')
            return
        self.send_response(200)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.reply)))
        self.end_headers()
        self.wfile.write(self.reply)


def bad_tokenizer(reply: bytes, content_type: str = "application/json") -> type[BadTokenizer]:
    return type("BadTokenizer", (BadTokenizer,), {"reply": reply, "content_type": content_type})


HTML = b"<html><head><title>502 Bad Gateway</title></head>\n<body>nginx</body></html>"


@pytest.mark.parametrize(("reply", "content_type", "needle"), [
    (HTML, "text/html", "answered text/html, not JSON: <html>"),
    (b'{"tokens": [1, 2', "application/json", "not JSON: {\"tokens\": [1, 2"),
    (b"", "application/json", "not JSON: (empty body)"),
    (b"[1, 2, 3]", "application/json", "expected a JSON object"),
    (b'{"ids": [1, 2]}', "application/json", "no 'tokens' field"),
    (b'{"tokens": ["a", null]}', "application/json", "not a list of token ids"),
], ids=["html", "truncated", "empty", "list", "no-tokens", "not-ids"])
def test_bad_tokenize_reply_is_a_one_line_input_error(reply: bytes, content_type: str,
                                                      needle: str) -> None:
    with fake_server(bad_tokenizer(reply, content_type)) as url, \
            pytest.raises(InputError) as caught:
        OpenAIBackend(read_timeout=5).load(endpoint_model(url), LoadConfig())
    message = str(caught.value)
    assert needle in message and "/tokenize" in message and "\n" not in message


def test_cli_html_from_tokenize_exits_2_without_traceback(tmp_path: Path) -> None:
    home = tmp_path / "home"
    seed_host(home)  # the roofline is stored: bench reaches the endpoint in seconds
    with fake_server(bad_tokenizer(HTML, "text/html")) as url:
        proc = run_cli("bench", url, "-B", "openai", "-p", "16", "-n", "8", "-r", "1",
                       home=home, timeout=120)
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.stdout, err)
    # bench says the run is marked failed, then the error: one line, the last one
    assert "Traceback" not in err, err
    assert [line for line in err.splitlines() if line.startswith("error:")] == \
        [err.splitlines()[-1]], err
    assert "/tokenize: the server answered text/html, not JSON" in err
