"""`strata bench` end to end: real llama.cpp, real PyTorch, a real server, a real DB."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import home_db, run_cli

TINY = "synthetic:tiny@q8_0"
SMALL_TEST = ("-p", "16", "-n", "8", "-r", "2")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One STRATA_HOME for the module: the roofline is measured once, automatically."""
    return tmp_path_factory.mktemp("bench-home")


def _bench(home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return run_cli("bench", *args, home=home, timeout=timeout)


def _records(proc: subprocess.CompletedProcess[str]) -> list[dict]:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_llamacpp_and_torch_agree_and_are_explained(home: Path) -> None:
    proc = _bench(home, TINY, "-B", "llamacpp,torch", *SMALL_TEST, "-o", "json")
    recs = _records(proc)
    by = {(r["backend"], r["test"]): r for r in recs}
    assert set(by) == {(b, t) for b in ("llamacpp", "torch") for t in ("pp16", "tg8")}
    for (backend, test), r in by.items():
        assert r["n"] == 2 and len(r["samples_ts"]) == 2  # -r 2: exactly two timed reps
        assert r["avg_ts"] > 0 and r["eta"] is not None and r["eta"] > 0, (backend, test)
        assert r["bytes_per_token"] > 0 and r["bound"] in ("memory", "compute")
    # the same scenario yields the same token counts on both backends
    for test in ("pp16", "tg8"):
        assert by[("llamacpp", test)]["n_prompt"] == by[("torch", test)]["n_prompt"]
    conn = home_db(home)
    run = conn.execute("SELECT * FROM runs ORDER BY id DESC LIMIT 1").fetchone()
    assert run["status"] == "complete"
    stored = conn.execute("SELECT COUNT(*) FROM results WHERE run_id = ?", (run["id"],))
    assert stored.fetchone()[0] == 4
    n_samples = conn.execute(
        "SELECT COUNT(*) FROM samples s JOIN results r ON r.id = s.result_id "
        "WHERE r.run_id = ? AND s.metric = 'decode_tps'", (run["id"],)).fetchone()[0]
    assert n_samples == 2 * 2  # two tg results with two raw samples each
    # the roofline is stored — unless other processes kept the host busy through every
    # attempt: then the run used it, flagged, stored nothing and said so (the one busy rule)
    roofs = conn.execute("SELECT COUNT(*) FROM measurements WHERE kind = 'roofline'")
    assert roofs.fetchone()[0] or "roofline not stored: the host was busy" in proc.stderr, \
        proc.stderr[-2000:]


@pytest.mark.slow
def test_token_counts_agree_across_all_three_backends(home: Path, tiny_server: str) -> None:
    local = _records(_bench(home, TINY, "-B", "llamacpp", *SMALL_TEST, "-o", "json"))
    remote = _records(_bench(home, tiny_server, "-B", "openai", *SMALL_TEST, "-o", "json"))
    tg_local = next(r for r in local if r["test"] == "tg8")
    tg_remote = next(r for r in remote if r["test"] == "tg8")
    conn = home_db(home)
    infos = [json.loads(row["info"]) for row in conn.execute(
        "SELECT info FROM results WHERE test = 'pp16' ORDER BY id")]
    prompt_counts = {tuple(i["tokens"]["prompt"]) for i in infos}
    assert prompt_counts == {(16,)}  # every backend, every rep: exactly 16 prompt tokens
    # where a server reports usage, it must agree (llama-cpp-python's stream omits it)
    assert all(i["tokens"]["prompt_reported"] in ([], [16]) for i in infos)
    assert tg_local["n_gen"] == tg_remote["n_gen"] == 8
    assert tg_remote["eta"] is None  # an endpoint's bytes are unknown: absent, not guessed


@pytest.mark.slow
def test_formats(home: Path) -> None:
    md = _bench(home, TINY, "-B", "llamacpp", "-p", "8", "-n", "none", "-r", "1", "-o", "md")
    assert md.returncode == 0, md.stderr
    # llama-bench's markdown: its columns and "mean ± sd", strata's η and bound after
    assert md.stdout.startswith("| model | size | params | backend | threads | test | t/s |")
    assert "pp8" in md.stdout and " GiB |" in md.stdout
    csv = _bench(home, TINY, "-B", "llamacpp", "-p", "8", "-n", "none", "-r", "1", "-o", "csv")
    header = csv.stdout.splitlines()[0].split(",")
    assert {"model_filename", "n_prompt", "avg_ts", "stddev_ts", "eta"} <= set(header)
    jl = _bench(home, TINY, "-B", "llamacpp", "-p", "8", "-n", "none", "-r", "1", "-o", "jsonl")
    assert [json.loads(line)["test"] for line in jl.stdout.splitlines()] == ["pp8"]
    table = _bench(home, TINY, "-B", "llamacpp", "-p", "8", "-n", "none", "-r", "1")
    assert "pp8" in table.stdout and "η" in table.stdout


@pytest.mark.parametrize("args,needle", [
    (("-p", "0"), "-p"),
    (("-d", "-5"), "-d"),
    (("-r", "0"), "-r"),
    (("-ctk", "q3_k"), "-ctk"),
    (("--backend", "vllm"), "--backend"),
    (("-o", "xml"), "--format"),
    (("--sustained", "0"), "--sustained"),
])
def test_bad_flags_exit_2(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    proc = _bench(tmp_path, TINY, *args)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "strata.db").exists() or _no_results(tmp_path)


def _no_results(home: Path) -> bool:
    try:
        return home_db(home).execute("SELECT COUNT(*) FROM results").fetchone()[0] == 0
    except sqlite3.OperationalError:
        return True


@pytest.mark.parametrize("kind", ["truncated", "missing", "no_config_dir"])
def test_bad_models_exit_2_and_store_nothing(tmp_path: Path, kind: str) -> None:
    if kind == "truncated":
        good = tmp_path / "good.gguf"
        from strata.models.source import resolve

        src = resolve(TINY).path("gguf", "test")
        data = src.read_bytes()
        good.write_bytes(data[: len(data) // 2])
        model = str(good)
    elif kind == "missing":
        model = str(tmp_path / "nope.gguf")
    else:
        (tmp_path / "empty-dir").mkdir()
        model = str(tmp_path / "empty-dir")
    proc = _bench(tmp_path, model, "-p", "8", "-n", "4")
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert _no_results(tmp_path)


def test_model_larger_than_memory_is_refused_before_writing(tmp_path: Path) -> None:
    proc = _bench(tmp_path, "synthetic:llama-3.1-8b@f32", "-B", "llamacpp", "-p", "8")
    assert proc.returncode == 2, proc.stderr
    assert "GiB" in proc.stderr and "smaller" in proc.stderr
    assert not list((tmp_path / "cache").rglob("*.gguf"))  # nothing 32 GB was written


def test_refused_endpoint_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from tests.seed_host import seed_host

    seed_host(tmp_path)  # the bound below times the refusal, not a roofline measurement
    started = time.monotonic()
    proc = _bench(tmp_path, f"http://127.0.0.1:{port}", "-p", "8", "-n", "4", "-r", "1")
    assert proc.returncode == 2, proc.stderr
    assert "refused" in proc.stderr and time.monotonic() - started < 60


@pytest.mark.slow
def test_ctrl_c_keeps_finished_results(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "STRATA_HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "strata.cli", "bench", TINY, "-B", "llamacpp", "-p",
         "8,16,32,64,128,256", "-n", "none", "-r", "200"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        # a suite started in the background inherits SIGINT ignored; a user's terminal does
        # not: give the child the default disposition, as an interactive shell would
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not _has_result(tmp_path):
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    conn = home_db(tmp_path)
    run = conn.execute("SELECT * FROM runs ORDER BY id DESC LIMIT 1").fetchone()
    assert run["status"] == "incomplete"
    kept = conn.execute("SELECT COUNT(*) FROM results WHERE run_id = ?", (run["id"],))
    assert kept.fetchone()[0] >= 1
    assert "pp8" in out  # the finished results are printed, not lost


def _has_result(home: Path) -> bool:
    try:
        return not _no_results(home)
    except sqlite3.DatabaseError:
        return False


def test_list_presets(tmp_path: Path) -> None:
    proc = run_cli("bench", "--list-presets", home=tmp_path)
    assert proc.returncode == 0
    for name in ("smollm2-135m", "qwen2.5-0.5b", "llama-3.2-1b", "llama-3.1-8b"):
        assert name in proc.stdout


@pytest.fixture(scope="module")
def tiny_server(home: Path) -> Iterator[str]:
    """A real llama-cpp-python OpenAI-compatible server on loopback, serving the tiny GGUF."""
    import os

    from tests.server_fixture import llama_server

    os.environ["STRATA_HOME"] = str(home)  # write the GGUF where the CLI runs will find it
    try:
        from strata.models.source import resolve

        gguf = resolve(TINY).path("gguf", "openai test")
    finally:
        os.environ.pop("STRATA_HOME", None)
    with llama_server(gguf) as server:
        yield server.url


@pytest.mark.slow
def test_sustained_reports_timeline_and_drop(home: Path) -> None:
    recs = _records(_bench(home, TINY, "-B", "llamacpp", "-n", "8", "-p", "none",
                           "--sustained", "3", "-o", "json"))
    assert len(recs) == 1 and recs[0]["test"].startswith("sustained tg8")
    s = recs[0]["sustained"]
    assert len(s["timeline"]) == recs[0]["n"] > 1
    times = [t for t, _ in s["timeline"]]
    assert times == sorted(times) and times[-2] < 3.0  # the last step started in time
    assert s["first_tps"] > 0 and s["last_tps"] > 0 and s["drop"] is not None
    assert s["throttled"] in (True, False, None)  # the telemetry verdict, whatever it is here


def test_every_pair_and_test_is_checked_before_the_first_measurement(tmp_path: Path) -> None:
    """A GGUF torch cannot take (qwen3moe: no transformers class from a GGUF) next to one
    it can: that pair is skipped with why, everything else measured, exit 0 (it used to
    fail the run after the first model's tests); alone, nothing runs (exit 2, no roofline
    taken); a test past a model's context is refused before anything runs."""
    from strata.models.source import resolve
    from tests.seed_host import seed_host

    seed_host(tmp_path)  # this host's roofline already stored: no measurement of it here
    ok = "synthetic:tiny@q8_0"
    moe = tmp_path / "moe.gguf"  # the file alone: no Hugging Face copy beside it
    moe.write_bytes(Path(resolve("synthetic:tiny-moe@q8_0").path("gguf", "llamacpp"))
                    .read_bytes())
    proc = run_cli("bench", ok, str(moe), "-B", "llamacpp,torch", "-p", "none", "-n", "4",
                   "-r", "1", "-o", "json", home=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    recs = json.loads(proc.stdout)
    ran = {(r["model_filename"], r["backend"]) for r in recs}
    assert ran == {(ok, "llamacpp"), (ok, "torch"), (str(moe), "llamacpp")}, ran
    for r in recs:  # no -t: where the count came from is said with the figure
        assert f"{r['n_threads']} thread(s): the default (" in " ".join(r["notes"]), r
    pinned = run_cli("bench", ok, "-B", "llamacpp", "-t", "1", "-p", "none", "-n", "4", "-r",
                     "1", "-o", "json", home=tmp_path, timeout=300)
    [one] = json.loads(pinned.stdout)
    assert one["n_threads"] == 1 and "the default" not in " ".join(one["notes"])
    assert f"skipped {moe} on torch: strata's GGUF loader for torch does not run qwen3moe" \
        in proc.stderr, proc.stderr
    alone = tmp_path / "alone"
    proc = run_cli("bench", str(moe), "-B", "torch", "-p", "none", "-n", "4", home=alone,
                   timeout=120)
    assert proc.returncode == 2 and "qwen3moe" in proc.stderr, proc.stderr
    assert not (alone / "strata.db").exists() or sqlite3.connect(alone / "strata.db").execute(
        "SELECT COUNT(*) FROM measurements").fetchone()[0] == 0
    proc = run_cli("bench", ok, "-B", "llamacpp", "-d", "4096", "-p", "16", "-n", "none",
                   home=tmp_path, timeout=120)
    line = proc.stderr.strip()
    assert proc.returncode == 2 and len(line.splitlines()) == 1, proc.stderr
    assert "pp16 @ d4096 needs 4,112 tokens of context but synthetic:tiny@q8_0 holds 2,048" \
        in line, line
