"""Serving load (`strata bench http://… --concurrency … / --request-rate …`): the arrival
schedule and the overlap rule as pure computation, the flags' validation, and a sweep against
the real llama-cpp-python server on loopback (one slot: requests queue)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from strata.backends.base import RunRequest, RunTrace
from strata.bench.load import (
    Level,
    LevelFigures,
    Slo,
    default_requests,
    figures,
    level_notes,
    make_levels,
    max_overlap,
    poisson_arrivals,
    run_window,
    stream_slack,
)
from strata.commands.bench_options import BenchFlags, build_config
from strata.errors import InputError
from tests.conftest import home_db, run_cli
from tests.seed_host import seed_host
from tests.server_fixture import HOST, _wait_ready, free_port

TINY = "synthetic:tiny@f16"  # llama.cpp of this build runs f16 everywhere (q8_0: AMX)
URL = "http://127.0.0.1:9/v1"  # never contacted: validation fails before any request

# -- pure computation ------------------------------------------------------------------------


def test_poisson_schedule_is_seeded_and_has_the_asked_rate() -> None:
    rate, n = 5.0, 4000
    a, b = poisson_arrivals(n, rate, seed=7), poisson_arrivals(n, rate, seed=7)
    assert a == b  # same seed, same schedule
    assert poisson_arrivals(n, rate, seed=8) != a
    assert a[0] == 0.0 and len(a) == n
    gaps = [y - x for x, y in itertools.pairwise(a)]
    assert all(g >= 0 for g in gaps)
    # mean gap 1/R within 5% (its standard error is 1/R/sqrt(n) = 1.6% of 1/R)
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.05)
    # exponential gaps: the SD equals the mean (a fixed-interval schedule would have SD 0)
    assert statistics.stdev(gaps) == pytest.approx(1 / rate, rel=0.1)


def test_overlap_counts_parallel_streams_not_buffered_tails() -> None:
    one_slot = [(0, 100), (100, 200), (205, 300)]
    assert max_overlap(one_slot) == 1
    parallel = [(0, 100), (10, 110), (20, 120)]
    assert max_overlap(parallel) == 3
    tail = [(0, 100), (95, 195)]  # the first stream's last 5 ns arrive after the next began
    assert max_overlap(tail) == 2
    assert max_overlap(tail, stream_slack(tail)) == 1  # slack: a quarter of a stream
    assert max_overlap(parallel, stream_slack(parallel)) == 3


def test_levels_and_default_request_counts() -> None:
    assert [lv.name for lv in make_levels([1, 2], [], None)] == ["c1", "c2"]
    assert [lv.requests for lv in make_levels([1, 4], [], None)] == [8, 16]
    assert make_levels([2], [], 6)[0].requests == 6
    rated = make_levels([4], [0.5, 2.0], None)
    assert [lv.name for lv in rated] == ["0.5/s c4", "2/s c4"]
    assert default_requests(None, 2.0) == 20 and Level(None, 2.0, 20).workers == 20


def _figures(in_flight: int, streams: int | None, cut: int = 0) -> LevelFigures:
    return LevelFigures(runs=[], window_s=1.0, prompt_tokens=0, output_tokens=0, good=0,
                        in_flight_max=in_flight, server_parallel=streams,
                        client_wait_max_s=0.0, cut_short=cut)


def test_queueing_and_cut_streams_are_said() -> None:
    c2 = Level(2, None, 4)
    one = level_notes(c2, _figures(2, 1), "llama-cpp-python")
    assert len(one) == 1 and "one request at a time (one slot)" in one[0]
    assert level_notes(c2, _figures(2, 2), "llama.cpp") == []  # both served at once
    assert level_notes(Level(1, None, 4), _figures(1, 1), None) == []
    cut = level_notes(c2, _figures(2, 1, cut=3), "llama-cpp-python")
    assert any("3 of" in n and "--interrupt_requests False" in n for n in cut)


class _FakeWorker:
    """Streams two tokens 1 ms apart, ending when run returns; fails the requests whose
    prompt is odd (as an HTTP error would)."""

    def run(self, request: RunRequest) -> RunTrace:
        t = time.perf_counter_ns()
        if request.prompt_tokens[0] % 2:
            raise RuntimeError("HTTP 503: busy")
        stamps = []
        for _ in range(2):
            time.sleep(0.001)
            stamps.append(time.perf_counter_ns())
        return RunTrace(n_prompt=1, n_gen=2, t_start=t, t_prefill_end=None,
                        token_ns=stamps, chunk_tokens=[1, 1])


def test_a_window_counts_failed_requests_and_keeps_the_rest() -> None:
    requests = [RunRequest((), (i,), 2) for i in range(6)]
    for level in (Level(2, None, 6), Level(3, 200.0, 6)):  # closed loop, then Poisson
        window = run_window([_FakeWorker() for _ in range(level.workers)], requests, level, 1)
        f = figures(window, requests, Slo())
        assert f.failed == 3 and len(f.runs) == 3 and "503" in f.first_error
        assert f.output_tokens == 6 and f.good == 3 and f.cut_short == 0
        assert 1 <= f.in_flight_max <= level.workers
        if level.rate:  # sent no earlier than due
            sent = [t.t_start for t in window.traces if t is not None]
            due = [d for t, d in zip(window.traces, window.due_ns, strict=True) if t]
            assert all(s >= d for s, d in zip(sent, due, strict=True))
        notes = level_notes(level, f, None)
        assert any("3 of 6 requests failed" in n for n in notes)


# -- flags ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "message"), [
    ({"models": [TINY], "concurrency": "1,2"}, "needs an endpoint"),
    ({"concurrency": "0"}, ">= 1"),
    ({"concurrency": "two"}, "expected N"),
    ({"concurrency": "none"}, "one or more counts"),
    ({"request_rate": "0"}, "> 0"),
    ({"request_rate": "-2"}, "> 0"),
    ({"request_rate": "nan"}, "finite"),
    ({"request_rate": "fast"}, "requests per second"),
    ({"num_requests": 4}, "only with --concurrency"),
    ({"slo_ttft_ms": 500.0}, "only with --concurrency"),
    ({"concurrency": "4", "num_requests": 2}, "below --concurrency 4"),
    ({"concurrency": "1", "num_requests": 0}, "between 1 and 10000"),
    ({"concurrency": "1", "slo_itl_ms": 0.0}, "> 0"),
    ({"concurrency": "1", "backend": "llamacpp"}, "openai backend"),
    ({"concurrency": "1", "sustained": 5.0}, "--sustained"),
    ({"concurrency": "1", "reps": "3"}, "-r"),
    ({"concurrency": "1", "depth": "512"}, "-d"),
    ({"concurrency": "1", "n_gen": "none", "n_prompt": "none"}, "needs a prompt"),
])
def test_bad_load_flags_are_input_errors(flags: dict, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        build_config(BenchFlags(**{"models": [URL], **flags}))


def test_a_good_load_config() -> None:
    config = build_config(BenchFlags(models=[URL], concurrency="1,2", n_prompt="16",
                                     n_gen="8", num_requests=4, slo_ttft_ms=250.0))
    assert config.backends == ["openai"] and [t.name for t in config.tests] == ["pp16+tg8"]
    assert [lv.name for lv in config.load.levels] == ["c1", "c2"]
    assert config.load.slo.ttft_ms == 250.0 and config.load.slo.itl_ms == 100.0
    assert config.to_dict()["load"]["levels"][1]["concurrency"] == 2


def test_cli_refuses_load_on_a_local_model_with_exit_2(tmp_path: Path) -> None:
    proc = run_cli("bench", TINY, "--concurrency", "1,2", home=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "needs an endpoint" in proc.stderr
    assert proc.stdout == ""


# -- the real server ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("load-home")
    seed_host(home)
    return home


@contextlib.contextmanager
def _one_slot_server(model: Path) -> Iterator[str]:
    """llama-cpp-python's server, which runs one request at a time. Its default
    interrupt_requests cuts a stream short when another request waits; off here, so every
    request gets its -n tokens and the others queue (the default is noted by the sweep)."""
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", HOST,
           "--port", str(port), "--n_ctx", "512", "--interrupt_requests", "False"]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://{HOST}:{port}/v1"
            _wait_ready(url, proc, log, 60.0)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server(home: Path) -> Iterator[str]:
    os.environ["STRATA_HOME"] = str(home)  # the GGUF is written where the CLI looks
    try:
        from strata.models.source import resolve

        gguf = resolve(TINY).path("gguf", "load test")
    finally:
        os.environ.pop("STRATA_HOME", None)
    with _one_slot_server(gguf) as url:
        yield url


N_REQ, P, N = 4, 16, 32


def test_concurrency_sweep_against_the_real_server(home: Path, server: str) -> None:
    proc = run_cli("bench", server, "--concurrency", "1,2", "-p", str(P), "-n", str(N),
                   "--num-requests", str(N_REQ), "-o", "json", home=home, timeout=120)
    assert proc.returncode == 0, proc.stderr
    recs = {r["concurrency"]: r for r in json.loads(proc.stdout)}
    assert set(recs) == {1, 2}
    for c, r in recs.items():
        assert r["test"] == f"pp{P}+tg{N} c{c}" and r["backend"] == "openai"
        assert r["requests"] == N_REQ and r["request_rate"] is None
        assert r["output_tokens"] == N_REQ * N  # interrupt_requests off: every token came
        # throughputs recomputed from the record's own fields
        assert r["output_ts"] == pytest.approx(r["output_tokens"] / r["window_s"])
        assert r["requests_ps"] == pytest.approx(r["requests"] / r["window_s"])
        assert r["avg_ts"] == pytest.approx(N_REQ * (P + N) / r["window_s"])
        for name in ("ttft", "e2e", "itl"):
            p50, p90, p99 = (r[f"{name}_{p}_ms"] for p in ("p50", "p90", "p99"))
            assert 0 <= p50 <= p90 <= p99, (c, name)
        assert r["ttft_p50_ms"] <= r["e2e_p50_ms"]
        assert 0 <= r["goodput_rps"] <= r["requests_ps"] + 1e-9
        assert 0 <= r["goodput_share"] <= 1
        assert r["slo_ttft_ms"] == 1000 and r["slo_itl_ms"] == 100  # the stated defaults
        assert len(r["samples_ns"]) == N_REQ  # one end-to-end time per request
    # one slot: at c2 two requests were in flight, but never two streams at once ...
    assert recs[1]["in_flight_max"] == 1 and recs[1]["server_parallel"] == 1
    assert recs[2]["in_flight_max"] == 2 and recs[2]["server_parallel"] == 1
    assert any("one request at a time (one slot)" in n for n in recs[2]["notes"])
    assert not any("one slot" in n for n in recs[1]["notes"])
    # ... so the queued requests' TTFT includes another request's whole stream of N tokens
    assert recs[2]["ttft_p90_ms"] > recs[1]["ttft_p50_ms"]
    # stored like any result: one per level, the level in the stored info and test name
    conn = home_db(home)
    rows = conn.execute("SELECT test, info FROM results ORDER BY id").fetchall()
    assert [row["test"] for row in rows] == [f"pp{P}+tg{N} c1", f"pp{P}+tg{N} c2"]
    assert json.loads(rows[1]["info"])["load"]["concurrency"] == 2
    history = run_cli("history", "-o", "json", home=home, timeout=60)
    assert history.returncode == 0, history.stderr
    assert [h["concurrency"] for h in json.loads(history.stdout)] == [1, 2]


def test_poisson_rate_table_against_the_real_server(home: Path, server: str) -> None:
    proc = run_cli("bench", server, "--request-rate", "50", "--concurrency", "2", "-p", "8",
                   "-n", "8", "--num-requests", "4", "--slo-ttft-ms", "5000", home=home,
                   timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "serving load" in proc.stdout and "50/s c2" in proc.stdout
    assert "TTFT ≤ 5000 ms, ITL ≤ 100 ms" in proc.stdout  # the SLO is stated


def test_md_of_a_load_sweep_shows_the_level_columns() -> None:
    from strata.views.load import MD_COLUMNS, load_md

    record = {c: 1 for c in MD_COLUMNS} | {"model_filename": "http://x", "backend": "openai",
                                          "test": "pp16+tg8 c1", "request_rate": None}
    head, _rule, row = load_md([record]).splitlines()
    assert head.split(" | ")[3:5] == ["concurrency", "request_rate"]
    assert "pp16+tg8 c1" in row and row.count("|") == head.count("|")
