"""`strata kernels generate / attempts / eval` end to end: the real CLI in a subprocess talks
to a real OpenAI-compatible server on loopback (tests/replay_server.py) that replays
recorded model replies; every reply goes through the real judge (static and link checks,
sandboxed verification, benchmark against the seeded roofline) and lands in a real SQLite
file. No model is reachable here: the replies are what models have been seen to write.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import home_db, run_cli
from tests.replay_server import replay_server
from tests.seed_host import seeded_home

FIXTURES = Path(__file__).parent / "fixtures" / "kernels"
HONEST = (FIXTURES / "adversarial" / "honest_rmsnorm.c").read_text()

# A model's first try: forgets that `cols` is int64_t and misspells a variable.
BROKEN = HONEST.replace("double inv =", "double inv = undefined_name +")
# Right structure, wrong numbers: the weight is never applied.
NO_WEIGHT = HONEST.replace("* inv * w[c]", "* inv")


CORRECT = ("slow", "ok")


def reply(code: str, prose: str = "Here is the kernel.") -> str:
    return f"{prose}\n\n```c\n{code}\n```\n\nIt handles ragged shapes."


@pytest.fixture
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seeded_home(tmp_path_factory, "gen")


def generate(url: str, home: Path, *extra: str, op: str = "rmsnorm") -> Any:
    return run_cli("kernels", "generate", op, "--endpoint", url, "--samples", "1",
                   "--no-bench", *extra, home=home)


def attempts(home: Path, *extra: str) -> list[dict[str, Any]]:
    proc = run_cli("kernels", "attempts", "-o", "json", *extra, home=home)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def registered(home: Path) -> list[str]:
    with home_db(home) as conn:
        return [r["key"] for r in conn.execute("SELECT key FROM kernel_impls")]


def user_text(request: dict[str, Any]) -> str:
    return request["messages"][-1]["content"]


def test_compile_error_then_fix_is_registered(home: Path) -> None:
    with replay_server([reply(BROKEN), reply(HONEST)]) as srv:
        proc = generate(srv.url, home, "--turns", "4")
        sent = srv.requests
    assert proc.returncode == 0, proc.stderr
    rows = attempts(home)
    assert [r["status"] for r in rows[:1]] == ["compile"] and rows[1]["status"] in CORRECT
    assert len(sent) == 2  # unbenched, the first correct kernel ends the conversation
    second = user_text(sent[1])
    assert "undefined_name" in second and "error" in second  # the compiler's own words
    assert any(k.startswith("rmsnorm/") for k in registered(home))
    # every attempt names the prompt version it came from (the templates' hash)
    from strata.kernels.gen.prompt import template_hash

    assert {r["template_hash"] for r in rows} == {template_hash("c")}
    assert rows[1]["code_hash"] and rows[1]["endpoint"] == srv.url


def test_mismatch_feedback_names_where_and_by_how_much(home: Path) -> None:
    with replay_server([reply(NO_WEIGHT), reply(HONEST)]) as srv:
        proc = generate(srv.url, home, "--turns", "2", "--no-register")
        sent = srv.requests
    assert proc.returncode == 0, proc.stderr
    first = attempts(home)[0]
    assert first["status"] == "mismatch"
    feedback = user_text(sent[1])
    # the numbers the judge found are the numbers the model is shown
    numbers = re.findall(r"-?\d+\.\d+(?:e[-+]?\d+)?", first["feedback"])
    assert numbers and all(n in feedback for n in numbers[:4])
    assert re.search(r"index|\[\d+", feedback) and "expected" in feedback.lower()
    # where: the case's shape and seed; by how much: the largest relative error shown
    assert re.search(r"shape \{'rows': \d+, 'cols': \d+\}, seed \d+", feedback), feedback
    assert re.search(r"\[\d+,\d+\]: got -?[\d.e+-]+, expected -?[\d.e+-]+", feedback)
    assert re.search(r"Max relative error among these: [\d.e+-]+", feedback), feedback
    assert registered(home) == []  # --no-register


def test_the_same_failure_three_times_ends_the_sample(home: Path) -> None:
    with replay_server([reply(BROKEN)] * 3) as srv:
        proc = generate(srv.url, home, "--turns", "6")
        n = len(srv.requests)
    assert proc.returncode == 1  # no correct kernel
    assert n == 3
    assert "same compile failure 3 times" in proc.stderr
    assert registered(home) == []


# One cheat per guard over HTTP (static check, link check, input tampering, constant output,
# canaries); every fixture of the adversarial suite goes through the same reply path in
# tests/test_gen_judge.py.
@pytest.mark.parametrize(("name", "status", "reason"), [
    ("declares_libc.c", "static", "static_check"),
    ("declares_cpython.c", "static", "forbidden_link"),
    ("writes_inputs.c", "mismatch", "modified_inputs"),
    ("constant_fill.c", "mismatch", "constant_output"),
    ("writes_past_end.c", "runtime", "out_of_bounds_write")])
def test_cheats_as_model_replies_are_rejected_and_never_registered(
        home: Path, name: str, status: str, reason: str) -> None:
    code = (FIXTURES / "adversarial" / name).read_text()
    op = re.search(r"op=(\w+)", code.splitlines()[0]).group(1)  # type: ignore[union-attr]
    with replay_server([reply(code)]) as srv:
        proc = generate(srv.url, home, "--turns", "1", op=op)
    assert proc.returncode == 1, proc.stdout
    row = attempts(home)[0]
    assert (row["status"], row["reason"], row["cheat"]) == (status, reason, True), row
    assert row["feedback"].strip()  # the model is told why
    assert registered(home) == []


@pytest.mark.parametrize("text", [
    "I cannot help with that.",  # no code block
    reply(HONEST.replace("strata_rmsnorm", "my_rmsnorm")),  # the wrong entry name
    "x" * (1 << 20),  # 1 MB of junk
    "<html><body><h1>502 Bad Gateway</h1></body></html>",  # a proxy's page as the content
])
def test_replies_without_a_usable_kernel_are_format_failures(home: Path, text: str) -> None:
    with replay_server([text]) as srv:
        proc = generate(srv.url, home, "--turns", "1")
    assert proc.returncode == 1
    row = attempts(home)[0]
    assert row["status"] == "format" and row["feedback"], row


def test_retries_streaming_and_usage(home: Path) -> None:
    script = [{"status": 500, "body": {"error": "overloaded"}},
              {"status": 429, "headers": {"Retry-After": "0"}, "body": {"error": "slow down"}},
              {"text": reply(HONEST), "usage": {"prompt_tokens": 1234,
                                                "completion_tokens": 321}}]
    with replay_server(script) as srv:
        proc = generate(srv.url, home, "--turns", "1", "--stream")
        sent = srv.requests
    assert proc.returncode == 0, proc.stderr
    assert len(sent) == 3 and all(r.get("stream") for r in sent)
    row = attempts(home)[0]
    assert (row["tokens_in"], row["tokens_out"]) == (1234, 321)


@pytest.mark.parametrize("case", ["refused", "silent", "html"])
def test_unusable_endpoints_are_one_line_errors(home: Path, case: str) -> None:
    from tests.server_fixture import free_port, silent_socket

    if case == "refused":
        proc = generate(f"http://127.0.0.1:{free_port()}/v1", home)
    elif case == "silent":
        with replay_server([{"delay_s": 60, "text": "late"}] * 5) as srv:
            proc = generate(srv.url, home, "--request-timeout", "0.3")
    else:
        with silent_socket() as url:  # accepts, never answers: the models list times out
            proc = generate(url, home, "--request-timeout", "0.3")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 4, proc.stderr  # retries say so, then 1


def test_progress_shows_each_sample_and_the_api_key_is_never_stored(home: Path,
                                                                    tmp_path: Path) -> None:
    """On a terminal the status line shows every sample's turn and status; the key goes
    out only as the Authorization header: not in the DB, the export, or any output."""
    key = "sk-strata-test-" + "7c1e" * 8
    with replay_server(["Sorry, no code today."] * 2) as srv:
        proc = run_cli("kernels", "generate", "rmsnorm", "--endpoint", srv.url, "--samples",
                       "2", "--turns", "1", "--no-bench", "--api-key-env", "STRATA_TEST_KEY",
                       home=home, env={"STRATA_TEST_KEY": key, "FORCE_COLOR": "1"})
        headers = srv.headers
    assert proc.returncode == 1, proc.stderr  # no correct kernel
    assert headers and all(h.get("authorization") == f"Bearer {key}" for h in headers)
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", proc.stderr)
    # one line, every sample's turn and latest status (intermediate states such as
    # "asking" may be coalesced by the live display; the last state is always drawn)
    assert "rmsnorm: #1 t1 format · #2 t1 format" in shown, shown
    export = tmp_path / "t.jsonl"
    assert run_cli("kernels", "attempts", "--export", str(export), home=home).returncode == 0
    assert len(export.read_text().splitlines()) == 2
    stored = [p for p in home.rglob("*") if p.is_file()] + [export]
    assert all(key.encode() not in p.read_bytes() for p in stored)
    assert key not in proc.stdout + proc.stderr


def test_wrong_model_name_lists_the_servers_models(home: Path) -> None:
    with replay_server(["unused"], models=["coder-7b", "coder-32b"]) as srv:
        proc = run_cli("kernels", "generate", "rmsnorm", "--endpoint", srv.url, "--model",
                       "coder-8b", home=home)
    assert proc.returncode == 2
    assert "coder-7b" in proc.stderr and "coder-32b" in proc.stderr


def test_samples_run_concurrently_and_each_is_stored(home: Path) -> None:
    # routed by the last message: sample order does not matter; every first turn fails to
    # compile, every second turn (which carries the compiler's feedback) is right
    with replay_server(by_content={"undefined_name": reply(HONEST)},
                       script=lambda req: reply(BROKEN)) as srv:
        proc = run_cli("kernels", "generate", "rmsnorm", "--endpoint", srv.url, "--samples",
                       "3", "--turns", "2", "--no-bench", "--no-register", home=home)
    assert proc.returncode == 0, proc.stderr
    rows = attempts(home)
    assert sorted((r["sample"], r["turn"]) for r in rows) == [
        (s, t) for s in range(3) for t in (1, 2)]
    assert {r["status"] for r in rows if r["turn"] == 1} == {"compile"}
    assert {r["status"] for r in rows if r["turn"] == 2} <= set(CORRECT)
    assert len({r["run"] for r in rows}) == 1


def test_export_and_replay_rescore_offline(home: Path, tmp_path: Path) -> None:
    with replay_server(by_model={"coder-good": [reply(HONEST)],
                                 "coder-bad": [reply(NO_WEIGHT)]}) as srv:
        proc = run_cli("kernels", "eval", "--endpoint", srv.url, "--models",
                       "coder-good,coder-bad",
                       "--ops", "rmsnorm", "--samples", "1", "--turns", "1", "--no-bench",
                       "-o", "json", home=home)
    assert proc.returncode == 0, proc.stderr
    live = {r["model"]: r for r in json.loads(proc.stdout)}
    assert live["coder-good"]["correct_rate"] == 1.0
    assert live["coder-bad"]["correct_rate"] == 0.0
    transcripts = tmp_path / "t.jsonl"
    assert run_cli("kernels", "attempts", "--export", str(transcripts),
                   home=home).returncode == 0
    assert len(transcripts.read_text().splitlines()) == 2
    other = seeded_home_like(tmp_path)
    proc = run_cli("kernels", "eval", "--replay", str(transcripts), "--no-bench", "-o", "json",
                   home=other)
    assert proc.returncode == 0, proc.stderr
    replayed = {r["model"]: r for r in json.loads(proc.stdout)}
    assert replayed["coder-good"]["correct_rate"] == 1.0
    assert replayed["coder-bad"]["correct_rate"] == 0.0
    assert all(r["run"].startswith("replay-") for r in attempts(other))
    # the leaderboard is a section of `strata report`, scored as the CLI scores it
    html_path = tmp_path / "report.html"
    proc = run_cli("report", "--out", str(html_path), home=other)
    assert proc.returncode == 0, proc.stderr
    page = html_path.read_text()
    assert 'id="kernel-writers"' in page, page[:2000]
    section = page.split('id="kernel-writers"', 1)[1].split("<section", 1)[0]
    assert "Models as kernel writers" in section and "no model-written kernels" not in section
    rows = {m: re.search(rf"<tr><td>{m}</td>(.*?)</tr>", section) for m in replayed}
    assert all(rows.values()), section
    # cells: dialect, samples, compile, correct, pass@1, ...
    cells = {m: re.findall(r"<td>(.*?)</td>", row.group(1))  # type: ignore[union-attr]
             for m, row in rows.items()}
    assert cells["coder-good"][2:5] == ["100%", "100%", "100%"], cells
    assert cells["coder-bad"][2:5] == ["100%", "0%", "0%"], cells  # built, ran, wrong


def seeded_home_like(tmp_path: Path) -> Path:
    from tests.seed_host import seed_host

    seed_host(tmp_path / "other-host")
    return tmp_path / "other-host"


def test_a_real_llama_cpp_server_completes_and_is_stored(home: Path) -> None:
    """llama-cpp-python's own OpenAI server with a tiny synthetic GGUF: its replies are
    random text, so every turn is a format failure, and the run still completes, stored."""
    pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python[server] missing")
    from strata.models.source import resolve
    from tests.server_fixture import llama_server

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(home))
        gguf = resolve("synthetic:tiny@q8_0").path("gguf", "gen-test")
    # the prompt is ~20k tokens of this model's 512-token vocabulary
    with llama_server(gguf, n_ctx=32768) as srv:
        proc = run_cli("kernels", "generate", "rmsnorm", "--endpoint", srv.url, "--samples",
                       "1", "--turns", "2", "--no-bench", "--max-tokens", "16", home=home)
    assert proc.returncode == 1, proc.stderr  # no correct kernel, no crash
    rows = attempts(home)
    assert [(r["turn"], r["status"]) for r in rows] == [(1, "format"), (2, "format")]
    assert all(r["tokens_in"] and r["tokens_in"] > 1000 for r in rows)  # from `usage`


def test_the_kernelbench_conv_task_set_times_kernelbench_shapes(home: Path) -> None:
    """`--ops kernelbench-conv` asks for conv2d and conv1d, tells the model the KernelBench
    shapes it will be timed at, and benchmarks each correct reply at exactly those (not the
    ops' model shapes)."""
    from strata.kernels.impl import SOURCES
    from strata.kernels.spec import get_spec

    replies = [reply((SOURCES / "c" / f"{op}.naive.c").read_text()) for op in ("conv2d",
                                                                               "conv1d")]
    with replay_server(by_model={"coder": replies}) as srv:
        proc = run_cli("kernels", "eval", "--endpoint", srv.url, "--models", "coder", "--ops",
                       "kernelbench-conv", "--samples", "1", "--turns", "1", "-o", "json",
                       home=home)
        asked = [user_text(r) for r in srv.requests]
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["correct_rate"] == 1.0
    for op, text in zip(("conv2d", "conv1d"), asked, strict=True):
        spec = get_spec(op)
        assert f"# Task: `{op}`" in text and "KernelBench level-1 problems" in text
        with home_db(home) as conn:
            timed = {tuple(sorted(json.loads(r["shape"]).items())) for r in conn.execute(
                "SELECT shape FROM kernel_results WHERE kind = 'bench' AND op = ? AND "
                "impl LIKE 'c.ext.%'", (op,))}
        want = {tuple(sorted(s.items())) for s in spec.shapes["kernelbench"]}
        assert timed == want, (op, timed)
        assert not want & {tuple(sorted(s.items())) for s in spec.shapes["llm"]}


def test_an_unknown_task_set_is_a_one_line_error(home: Path) -> None:
    proc = run_cli("kernels", "eval", "--endpoint", "http://127.0.0.1:9/v1", "--ops",
                   "kernelbench-attention", home=home)
    assert proc.returncode == 2
    assert "kernelbench-attention" in proc.stderr and "kernelbench-conv" in proc.stderr
    assert "Traceback" not in proc.stderr
