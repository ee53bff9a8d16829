"""`strata ring serve --api PORT`: the OpenAI-compatible endpoint of a ring member.

One real daemon for the module (`ring serve --api --models DIR` on loopback, the test ring
secret as its bearer token) serving strata's tiny synthetic GGUF with a ChatML template;
real HTTP: its answers must equal `strata ring run` against the same daemon, and `strata
bench http://...` must measure it like any server. The queue's order, clients that leave
and every refusal are also checked in process against a scripted node (strata.ring.control.
api's server, real sockets), where a generation can be held at will.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from strata.errors import InputError
from strata.ring.control.api import ApiServer, start_api
from tests.conftest import RING_SECRET, home_db
from tests.seed_host import seeded_home
from tests.test_ring_control import STRATA, Ring, free_port, wait_for

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the chat template engine) missing")

from tests.test_quality import CHATML, with_chat_template

MODEL = "tiny.gguf"  # strata's synthetic:tiny@f32 with a ChatML template, under --models
PROMPT = "The ring turns"
AUTH = {"Authorization": f"Bearer {RING_SECRET}"}


@dataclass
class Served:
    ring: Ring
    url: str  # http://127.0.0.1:PORT

    def post(self, route: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
        return httpx.post(self.url + route, json=body, headers=kw.pop("headers", AUTH),
                          timeout=60, **kw)

    def ring_run(self, *args: str) -> dict[str, Any]:
        res = self.ring.cli("ring", "run", MODEL, *args, "--connect", self.ring.addr("a"),
                            "--json", timeout=120)
        assert res.returncode == 0, (res.stderr, self.ring.log("a"))
        return json.loads(res.stdout)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from strata.models.source import resolve

    home = tmp_path_factory.mktemp("ring-api")
    models = home / "models"
    models.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(home))
        with_chat_template(resolve("synthetic:tiny@f32").path("gguf", "llamacpp"),
                           models / MODEL, CHATML)
    ring = Ring(home)
    port = free_port()
    try:
        ring.start("a", "--api", str(port), "--models", str(models))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _health(url), 30, f"no API on {url}: {ring.log('a')}")
        yield Served(ring, url)
    finally:
        ring.stop()


def _health(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).json() == {"status": "ok"}
    except httpx.HTTPError:
        return False


def _events(resp: httpx.Response) -> list[Any]:
    """The `data:` payloads of a server-sent-event stream, JSON decoded ([DONE] as is)."""
    assert resp.headers["content-type"].startswith("text/event-stream")
    out: list[Any] = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            out.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
    return out


def _stream(served: Served, route: str, body: dict[str, Any]) -> list[Any]:
    with httpx.stream("POST", served.url + route, headers=AUTH, timeout=60,
                      json={**body, "stream": True,
                            "stream_options": {"include_usage": True}}) as resp:
        assert resp.status_code == 200, resp.read()
        return _events(resp)


# -- the real ring ----------------------------------------------------------------------------


def test_models_list_the_served_gguf(served: Served) -> None:
    doc = httpx.get(served.url + "/v1/models", headers=AUTH, timeout=10).json()
    assert doc["object"] == "list" and [m["id"] for m in doc["data"]] == [MODEL]
    model = doc["data"][0]
    assert model["object"] == "model" and model["owned_by"] == "a"
    assert model["meta"]["max_concurrency"] == 1 and "arrival order" in model["meta"][
        "scheduling"]


@pytest.mark.parametrize("sampling", [{}, {"seed": 5, "temperature": 1.0}],
                         ids=["greedy", "sampled"])
def test_completions_equal_ring_run(served: Served, sampling: dict[str, Any]) -> None:
    """Same prompt, same daemon: the API's tokens and text are `ring run`'s, and usage is
    its n_prompt/n_gen; streamed, one event per token whose texts add up to the same."""
    flags = ["--seed", "5", "--temperature", "1"] if sampling else []
    want = served.ring_run("-p", PROMPT, "-n", "12", *flags)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, **sampling}
    doc = served.post("/v1/completions", {**body, "return_token_ids": True}).json()
    choice = doc["choices"][0]
    assert choice["token_ids"] == want["tokens"] and choice["text"] == want["text"]
    assert doc["usage"] == {"prompt_tokens": want["n_prompt"], "completion_tokens": 12,
                            "total_tokens": want["n_prompt"] + 12}
    assert choice["finish_reason"] == "length" and doc["object"] == "text_completion"
    if sampling:
        assert len(set(want["tokens"])) > 3  # sampled: not one id repeated

    events = _stream(served, "/v1/completions", body)
    assert events[-1] == "[DONE]" and events[-2]["usage"] == doc["usage"]
    pieces = [e["choices"][0] for e in events[:-2]]
    assert [p["finish_reason"] for p in pieces] == [None] * 12 + ["length"]
    assert "".join(p["text"] for p in pieces) == want["text"]


def test_chat_completions_use_the_ggufs_template(served: Served) -> None:
    """messages through the GGUF's ChatML template, as `ring run --chat` (one user turn);
    streamed: the assistant role first, then one delta per token."""
    want = served.ring_run("-p", "Hi there", "-n", "10", "--chat", "--seed", "3",
                           "--temperature", "1")
    plain = served.ring_run("-p", "Hi there", "-n", "1")
    assert want["n_prompt"] > plain["n_prompt"] + 8  # the template's turn markers
    body = {"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 10,
            "seed": 3, "temperature": 1.0}  # no model: the only one served
    doc = served.post("/v1/chat/completions", {**body, "return_token_ids": True}).json()
    choice = doc["choices"][0]
    assert doc["object"] == "chat.completion" and doc["model"] == MODEL
    assert choice["token_ids"] == want["tokens"]
    assert choice["message"] == {"role": "assistant", "content": want["text"]}
    assert doc["usage"]["prompt_tokens"] == want["n_prompt"]
    assert choice["finish_reason"] == ("stop" if len(want["tokens"]) < 10 else "length")

    events = _stream(served, "/v1/chat/completions", body)
    deltas = [e["choices"][0]["delta"] for e in events[:-2]]
    assert deltas[0] == {"role": "assistant", "content": ""} and deltas[-1] == {}
    assert "".join(d.get("content", "") for d in deltas) == want["text"]
    assert len(deltas) == len(want["tokens"]) + 2
    assert events[-2]["usage"] == doc["usage"] and events[-1] == "[DONE]"


def test_concurrent_requests_are_answered_one_at_a_time(served: Served) -> None:
    """Two clients at once: each gets its own answer (as when alone), and the generations
    do not overlap (the second's first token comes after the first's last)."""
    bodies = [{"prompt": PROMPT, "max_tokens": 300, "seed": s, "temperature": 1.0,
               "ignore_eos": True} for s in (1, 2)]
    alone = [_texts(_stream(served, "/v1/completions", b)) for b in bodies]
    seen: dict[int, tuple[list[str], float, float]] = {}

    def client(i: int) -> None:
        with httpx.stream("POST", served.url + "/v1/completions", headers=AUTH, timeout=60,
                          json={**bodies[i], "stream": True}) as resp:
            times, events = [], []
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    times.append(time.perf_counter())
                    events.append(json.loads(line[6:]))
        seen[i] = (_texts(events), times[0], times[-1])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [seen[i][0] for i in range(2)] == alone
    first, second = sorted(seen.values(), key=lambda s: s[1])
    assert first[2] <= second[1], "the two generations overlapped"


def _texts(events: list[Any]) -> list[str]:
    return [e["choices"][0]["text"] for e in events if isinstance(e, dict) and e["choices"]]


def test_a_wrong_or_missing_token_is_refused_and_logged(served: Served) -> None:
    before = served.ring.log("a").count(" generated token(s)")
    for headers, why in (({}, "no Authorization header"),
                         ({"Authorization": "Bearer nope"}, "a wrong bearer token")):
        res = served.post("/v1/completions", {"prompt": PROMPT}, headers=headers)
        assert res.status_code == 401
        assert res.json()["error"]["code"] == "invalid_api_key"
        line = wait_for(lambda w=why: [x for x in served.ring.log("a").splitlines()
                                       if w in x], 5, f"no log line for {why}")
        assert len(line) == 1 and "401" in line[0] and RING_SECRET not in line[0]
    assert httpx.get(served.url + "/v1/models", timeout=5).status_code == 401
    bad = httpx.post(served.url + "/v1/completions", content=b"{not json", headers=AUTH,
                     timeout=10)
    assert bad.status_code == 400 and "not JSON" in bad.json()["error"]["message"]
    assert served.ring.log("a").count(" generated token(s)") == before  # nothing generated


def test_bench_measures_the_endpoint_under_load(served: Served,
                                                tmp_path_factory: pytest.TempPathFactory
                                                ) -> None:
    """`strata bench http://member:PORT --concurrency 1,2` with the secret as
    OPENAI_API_KEY; without it, one line naming the variable."""
    home = seeded_home(tmp_path_factory, "bench-home")
    args = ("bench", served.url, "-p", "16", "-n", "8", "--concurrency", "1,2",
            "--num-requests", "4", "-o", "json")
    res = served.ring.cli(*args, timeout=180)  # Ring's env: the test secret, no API key
    assert res.returncode == 2 and "HTTP 401" in res.stderr and "OPENAI_API_KEY" in res.stderr
    env = {**served.ring.env, "STRATA_HOME": str(home), "OPENAI_API_KEY": RING_SECRET}
    res = subprocess.run([*STRATA, *args], capture_output=True, text=True, env=env,
                         timeout=180)
    assert res.returncode == 0, (res.stderr, served.ring.log("a"))
    records = json.loads(res.stdout)
    assert [r["concurrency"] for r in records] == [1, 2]
    assert all(r["failed"] == 0 and r["output_tokens"] == 4 * 8 for r in records), records
    stored = home_db(home).execute("SELECT test FROM results").fetchall()
    assert sorted(row["test"] for row in stored) == ["pp16+tg8 c1", "pp16+tg8 c2"]


# -- in process: the queue, clients that leave, refusals ---------------------------------------


@dataclass
class ScriptedStages:
    """node.stages: each generation records its request, emits `n` pieces ("x"), waits on
    `gate` before each; a prompt "bad" is an input error, "bug" an unexpected one."""

    gate: threading.Event = field(default_factory=threading.Event)
    calls: list[dict[str, Any]] = field(default_factory=list)
    piece_s: float = 0.0

    def generate(self, msg: dict[str, Any], on_piece: Any) -> dict[str, Any]:
        self.calls.append(msg)
        if msg.get("prompt") == "bad":
            raise InputError("no chat template in this GGUF")
        if msg.get("prompt") == "bug":
            raise KeyError("surprise")
        for i in range(msg["n"]):
            assert self.gate.wait(10)
            time.sleep(self.piece_s)
            if on_piece is not None:
                on_piece({"token": i, "text": "x"})
        return {"tokens": list(range(msg["n"])), "text": "x" * msg["n"], "n_prompt": 3,
                "n_gen": msg["n"], "ttft_s": 0.0, "e2e_s": 0.0, "decode_tps": None,
                "finish": "length"}


@dataclass
class ScriptedNode:
    stages: ScriptedStages = field(default_factory=ScriptedStages)
    member: Any = field(default_factory=lambda: type("M", (), {"id": "m"})())
    lines: list[str] = field(default_factory=list)

    def list_models(self) -> list[str]:
        return ["m.gguf"]


@pytest.fixture
def api() -> Iterator[tuple[ScriptedNode, ApiServer, str]]:
    node = ScriptedNode()
    server = start_api(node, "127.0.0.1", 0, RING_SECRET, node.lines.append)
    try:
        yield node, server, f"http://127.0.0.1:{server.port}"
    finally:
        node.stages.gate.set()
        server.stop()


def _post_in_thread(url: str, prompt: str, out: dict[str, int]) -> threading.Thread:
    def send() -> None:
        res = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2},
                         headers=AUTH, timeout=30)
        out[prompt] = res.status_code
    t = threading.Thread(target=send)
    t.start()
    return t


def test_requests_wait_their_turn_in_arrival_order(api: Any) -> None:
    node, server, url = api
    turns = server.httpds[0].api.turns
    status: dict[str, int] = {}
    threads = []
    for k, prompt in enumerate(("first", "second", "third", "fourth")):
        threads.append(_post_in_thread(url, prompt, status))
        wait_for(lambda k=k: turns.queued == k + 1, 5, f"request {k} never queued")
    assert [c["prompt"] for c in node.stages.calls] == ["first"]  # one at a time
    node.stages.gate.set()
    for t in threads:
        t.join(timeout=10)
    assert [c["prompt"] for c in node.stages.calls] == ["first", "second", "third", "fourth"]
    assert set(status.values()) == {200} and turns.queued == 0


def test_a_client_that_leaves_never_wedges_the_queue(api: Any) -> None:
    """Gone mid-stream: its generation ends unheard, the next request is answered. Gone
    while queued: its turn passes without a generation."""
    node, server, url = api
    node.stages.gate.set()
    node.stages.piece_s = 0.005
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    body = json.dumps({"prompt": "left", "max_tokens": 200, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 + RING_SECRET.encode() + b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body),
                                                                                 body))
    got = b""
    while b"data: " not in got:  # the headers, then the first token's event
        more = sock.recv(4096)
        assert more, got
        got += more
    sock.close()
    res = httpx.post(url + "/v1/completions", json={"prompt": "next", "max_tokens": 3},
                     headers=AUTH, timeout=30)
    assert res.status_code == 200 and res.json()["choices"][0]["text"] == "xxx"
    assert any("the client left after" in x for x in node.lines), node.lines

    node.stages.gate.clear()
    status: dict[str, int] = {}
    holder = _post_in_thread(url, "holder", status)
    wait_for(lambda: server.httpds[0].api.turns.queued == 1, 5, "holder never queued")
    quitter = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    body = json.dumps({"prompt": "quitter", "max_tokens": 1}).encode()
    quitter.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                    + RING_SECRET.encode() + b"\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(body), body))
    wait_for(lambda: server.httpds[0].api.turns.queued == 2, 5, "quitter never queued")
    quitter.close()
    node.stages.gate.set()
    holder.join(timeout=10)
    wait_for(lambda: server.httpds[0].api.turns.queued == 0, 5, "the queue is stuck")
    assert [c["prompt"] for c in node.stages.calls] == ["left", "next", "holder"]
    assert any("left while queued" in x for x in node.lines), node.lines


@pytest.mark.parametrize(("route", "body", "status", "needle"), [
    ("/v1/completions", {"max_tokens": 2}, 400, "'prompt' must be a string"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 0}, 400, "'max_tokens' must be"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 10**9}, 400, "'max_tokens' must be"),
    ("/v1/completions", {"prompt": "a", "temperature": "hot"}, 400, "'temperature' must"),
    ("/v1/completions", {"prompt": "a", "model": "other.gguf"}, 404, "not served here"),
    ("/v1/completions", {"prompt": "a", "stop": ["\n"]}, 400, "'stop' is not supported"),
    ("/v1/completions", {"prompt": "a", "stream": "yes"}, 400, "'stream' must be true"),
    ("/v1/chat/completions", {"messages": []}, 400, "'messages' must be a non-empty"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "messages[0] needs"),
    ("/v1/completions", {"prompt": "bad"}, 400, "no chat template in this GGUF"),
    ("/v1/completions", {"prompt": "bug"}, 500, "KeyError: 'surprise'"),
    ("/v1/embeddings", {"input": "a"}, 404, "no route POST /v1/embeddings"),
])
def test_bad_requests_get_openai_errors_and_one_log_line(api: Any, route: str,
                                                         body: dict[str, Any], status: int,
                                                         needle: str) -> None:
    node, _server, url = api
    node.stages.gate.set()
    res = httpx.post(url + route, json=body, headers=AUTH, timeout=10)
    assert res.status_code == status, res.text
    error = res.json()["error"]
    assert needle in error["message"] and set(error) == {"message", "type", "code"}
    assert len(node.lines) == 2 and needle in node.lines[1], node.lines  # 0: listening
    assert "Traceback" not in "".join(node.lines)


def test_defaults_and_what_reaches_the_ring(api: Any) -> None:
    """Greedy unless asked; a sampled request without a seed gets one; ignore_eos turns
    off the end-of-generation stop; no model named: the one served; the stages' K/V cache
    f16 as `ring run`'s. /health needs no token; GET on a POST route is refused."""
    node, _server, url = api
    node.stages.gate.set()
    for body in ({"prompt": "a"}, {"prompt": "a", "temperature": 0.7, "ignore_eos": True}):
        assert httpx.post(url + "/v1/completions", json=body, headers=AUTH,
                          timeout=10).status_code == 200
    greedy, sampled = node.stages.calls
    assert greedy == {"model": "m.gguf", "prompt": "a", "n": 16, "temperature": 0.0,
                      "seed": None, "stop_eog": True, "kv_type": "f16"}  # ring run's default
    assert isinstance(sampled["seed"], int) and sampled["stop_eog"] is False
    assert httpx.get(url + "/health", timeout=5).json() == {"status": "ok"}
    assert httpx.get(url + "/v1/completions", headers=AUTH, timeout=5).status_code == 405
    assert "OpenAI-compatible endpoint on http://127.0.0.1:" in node.lines[0]


def test_a_port_in_use_is_one_line_naming_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InputError, match=f"--api {port}: cannot listen on 127.0.0.1"):
            start_api(ScriptedNode(), "127.0.0.1", port, None, print)
