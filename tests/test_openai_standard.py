"""The openai backend against servers with only the standard routes (/v1/models,
/v1/completions): no tokenize route, so prompts are calibrated against the server's
usage.prompt_tokens. The main server is real: llama.cpp generating on a tiny GGUF behind
the standard routes (tests/standard_server.py), so every count is the model's own; small
fake servers cover replies without usage and multi-token deltas."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

pytest.importorskip("httpx", reason="httpx (the openai extra) not installed")
pytest.importorskip("llama_cpp", reason="llama-cpp-python missing")

from strata.backends.base import LoadConfig, RunRequest
from strata.backends.openai import OpenAIBackend
from strata.errors import InputError
from strata.models.source import ResolvedModel, resolve
from tests.conftest import home_db, run_cli
from tests.seed_host import seeded_home
from tests.server_fixture import FakeHandler, fake_server
from tests.standard_server import StandardServer, standard_server

FLAVOUR_PROBES = {"GET /props", "POST /extras/tokenize", "GET /api/version"}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(tmp_path_factory.mktemp("home")))
        return resolve("synthetic:tiny@q8_0").path("gguf", "openai-test")


@pytest.fixture(scope="module")
def server(tiny_gguf: Path) -> Iterator[StandardServer]:
    with standard_server(tiny_gguf) as srv:
        yield srv


def endpoint(url: str) -> ResolvedModel:
    """What `strata bench http://...` resolves to: no spec, nothing known but the URL."""
    return ResolvedModel(ref=url, kind="endpoint", spec=None, endpoint=url)


@pytest.fixture
def backend(server: StandardServer) -> Iterator[OpenAIBackend]:
    b = OpenAIBackend(read_timeout=30)
    b.load(endpoint(server.url), LoadConfig())
    yield b
    b.close()


def _timed(server: StandardServer, since: int) -> list[dict]:
    return [r for r in server.requests[since:] if r.get("stream")]


def _probes(server: StandardServer, since: int) -> list[dict]:
    return [r for r in server.requests[since:] if not r.get("stream")]


# -- the CLI, as a user runs it -------------------------------------------------------------


def test_cli_bench_without_a_tokenize_route(server: StandardServer,
                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    home = seeded_home(tmp_path_factory, "standard-home")
    proc = run_cli("bench", server.root, "-B", "openai", "-p", "32", "-n", "8", "-r", "1",
                   "-o", "json", home=home, timeout=120)
    assert proc.returncode == 0, proc.stderr
    records = {r["test"]: r for r in json.loads(proc.stdout)}
    assert set(records) == {"pp32", "tg8"} and records["pp32"]["avg_ts"] > 0
    info = {row["test"]: json.loads(row["info"]) for row in home_db(home).execute(
        "SELECT test, info FROM results")}
    pp, tg = info["pp32"], info["tg8"]
    # the synthetic vocabulary is counted exactly by the fit (BOS + 3 per space + 1 per
    # letter): the server counted the 32 tokens asked for, in the warm-up and the timed run
    assert pp["tokens"]["prompt"] == pp["tokens"]["prompt_reported"] == [32]
    calibration = pp["prompt_calibration"]
    assert calibration["method"] == "calibrated" and calibration["max_probe_error_tokens"] == 0
    assert calibration["timed_prompts_exact"] == calibration["timed_prompts_checked"] >= 2
    assert pp["server"] == "unknown" and pp["server_tokenizer"] is False
    # every result says how its tokens were counted: in info, and in a note for the tokens
    # it has (pp: the prompt's; tg: the generated ones)
    for result in (pp, tg):
        assert result["prompt_tokens_from"].startswith("calibrated on the server's usage")
        assert result["generated_tokens_from"].startswith("one token per streamed delta")
    assert any(n.startswith("prompt tokens: calibrated") for n in pp["notes"])
    assert any(n.startswith("generated tokens: one token per streamed delta")
               for n in tg["notes"])
    assert tg["tokens"]["generated"] == tg["tokens"]["generated_reported"] == [8]
    # beyond the standard routes, only the probes that tell servers apart were tried (404)
    assert set(server.paths) <= {"GET /v1/models", "POST /v1/completions", *FLAVOUR_PROBES}


# -- in-process --------------------------------------------------------------------------------


def test_calibrated_prompts_are_counted_exactly(backend: OpenAIBackend,
                                                server: StandardServer) -> None:
    since = len(server.requests)
    for n in (16, 32, 100, 400):
        trace = backend.run(RunRequest((), tuple(backend.random_tokens(n, seed=n)), 2))
        assert trace.n_prompt == trace.n_prompt_reported == n, trace.notes
        assert any(note.startswith("prompt tokens: calibrated") for note in trace.notes)
    probes = [r["prompt"] for r in _probes(server, since)]
    timed = [r["prompt"] for r in _timed(server, since)]
    assert len(probes) == 4 and all(r["max_tokens"] == 1 for r in _probes(server, since))
    # a timed prompt is never a probe's text, and never another timed prompt's
    assert len(set(timed)) == len(timed) and not set(timed) & set(probes)
    fit = backend.info()["prompt_calibration"]
    assert (fit["server_tokens_per_prompt"], fit["tokens_per_word"],
            fit["tokens_per_letter"]) == (1.0, 3.0, 1.0)


def test_tg_alone_needs_no_calibration(server: StandardServer) -> None:
    """-p none: no probe request at all; a one-word prompt, since an empty prompt is no
    request to some servers."""
    since = len(server.requests)
    b = OpenAIBackend(read_timeout=30)
    b.load(endpoint(server.url), LoadConfig())
    try:
        trace = b.run(RunRequest((), (), 8))
    finally:
        b.close()
    assert _probes(server, since) == []
    assert _timed(server, since)[0]["prompt"].strip()
    assert sum(trace.chunk_tokens) == trace.n_gen_reported == 8 and trace.n_prompt == 0
    assert any(n.startswith("tg: the request carries a one-word prompt") for n in trace.notes)


def test_depth_is_refused_without_a_tokenizer(backend: OpenAIBackend) -> None:
    ids = backend.random_tokens(40, seed=3)
    with pytest.raises(InputError, match="@d<D> needs a depth prefix of exactly D tokens"):
        backend.run(RunRequest(tuple(ids[:20]), tuple(ids[20:]), 2))


def test_prompt_shorter_than_the_servers_own_tokens(tiny_gguf: Path) -> None:
    template = "<|user|>\n{prompt}<|end|>\n<|assistant|>\n"  # 32 tokens of this vocabulary
    with standard_server(tiny_gguf, template=template) as srv:
        b = OpenAIBackend(read_timeout=30)
        b.load(endpoint(srv.url), LoadConfig())
        try:
            with pytest.raises(InputError, match="counts 32 tokens of its own in every prompt"):
                b.random_tokens(32, seed=1)
            trace = b.run(RunRequest((), tuple(b.random_tokens(64, seed=1)), 2))
        finally:
            b.close()
    assert trace.n_prompt == trace.n_prompt_reported == 64


# -- fake servers: what a real one does not do on demand ------------------------------------------


def _sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class _Scripted(FakeHandler):
    """/v1/completions: non-streamed -> `probe_usage(prompt)` (None: no usage); streamed ->
    `deltas` text deltas and the usage `stream_usage`."""

    deltas: tuple[str, ...] = ("a", "b", "c")
    stream_usage: ClassVar[dict | None] = None

    def probe_usage(self, prompt: str) -> dict | None:
        return None

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.path != "/v1/completions":
            self._send(404, b'{"detail":"Not Found"}')
            return
        if not body.get("stream"):
            reply = {"choices": [{"index": 0, "text": "a", "finish_reason": "length"}]}
            usage = self.probe_usage(body["prompt"])
            self._send(200, json.dumps({**reply, **({"usage": usage} if usage else {})})
                       .encode())
            return
        out = b"".join(_sse({"choices": [{"index": 0, "text": d, "finish_reason": None}]})
                       for d in self.deltas)
        out += _sse({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        if self.stream_usage:
            out += _sse({"choices": [], "usage": self.stream_usage})
        out += b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


class NoUsage(_Scripted):
    pass


class FlatUsage(_Scripted):
    def probe_usage(self, prompt: str) -> dict | None:
        return {"prompt_tokens": 7, "completion_tokens": 1}


class TwoTokensPerDelta(_Scripted):
    deltas = ("ab", "cd", "ef", "gh")
    stream_usage: ClassVar[dict | None] = {"prompt_tokens": 3, "completion_tokens": 8}


def _loaded(url: str) -> OpenAIBackend:
    b = OpenAIBackend(read_timeout=5)
    b.load(endpoint(url), LoadConfig())
    return b


def test_no_usage_anywhere_allows_tg_only() -> None:
    with fake_server(NoUsage) as url:
        b = _loaded(url)
        try:
            trace = b.run(RunRequest((), (), 3))  # tg: counted per delta, said so
            assert sum(trace.chunk_tokens) == 3 and trace.n_gen_reported is None
            assert any("no usage" in n for n in trace.notes)
            with pytest.raises(InputError, match=r"no usage\.prompt_tokens and the server has "
                                                 "no tokenize route") as caught:
                b.random_tokens(32, seed=1)
            assert "\n" not in str(caught.value)
        finally:
            b.close()


def test_usage_that_does_not_grow_cannot_calibrate() -> None:
    with fake_server(FlatUsage) as url:
        b = _loaded(url)
        try:
            with pytest.raises(InputError, match="does not grow with the prompt"):
                b.random_tokens(32, seed=1)
        finally:
            b.close()


def test_multi_token_deltas_take_the_servers_total() -> None:
    with fake_server(TwoTokensPerDelta) as url:
        b = _loaded(url)
        try:
            trace = b.run(RunRequest((), (), 8))
        finally:
            b.close()
    assert trace.chunk_tokens == [2, 2, 2, 2] and trace.n_gen_reported == 8
    assert any("usage counts 8 generated tokens in 4 streamed deltas" in n for n in trace.notes)
