"""`strata bench MODEL -B ring`: the usual bench across real `strata ring serve` daemons on
loopback (started and ended by the test), results in a real SQLite DB.

Two members capped so that neither holds synthetic:tiny-deep alone (E's CAP): every request
crosses both. What is checked: the stored token counts are the test's, the per-request
figures are consistent with one prefill + n decode steps (ITL samples = n per repetition,
TTFT < E2E, positive rates), the records name the plan (which member holds which layers)
and the bytes per token of each link; no daemon -> one line, exit 2; no process left.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RING_SECRET, home_db
from tests.test_ring_control import CAP, MODEL, Ring, free_port, one_line_error, wait_for

N_PROMPT, N_GEN = 16, 8


@pytest.fixture
def ring(tmp_path: Path) -> Iterator[Ring]:
    # a fresh home, no roofline: bench measures none for a ring (the members run the model)
    r = Ring(tmp_path)
    try:
        yield r
    finally:
        r.stop()  # asserts that no daemon, stage or bench process is left


def test_bench_runs_across_two_capped_daemons_and_stores_consistent_results(
        ring: Ring) -> None:
    ring.start("a", "--mem-cap", CAP, wait=False)
    ring.start("b", "--mem-cap", CAP, "--peers", ring.addr("a"), wait=False)
    ring.ready("a", "b")
    wait_for(lambda: ring.live("a") == {"b"}, 10, "b never joined a")
    ring.env["STRATA_RING"] = ring.addr("b")  # any member: it passes runs to the leader
    res = ring.cli("bench", MODEL, "-B", "ring", "-p", str(N_PROMPT), "-n", str(N_GEN),
                   "-r", "1", "-o", "json", timeout=120)
    assert res.returncode == 0, (res.stderr, ring.log("a"))
    recs = {r["test"]: r for r in json.loads(res.stdout)}
    assert set(recs) == {f"pp{N_PROMPT}", f"tg{N_GEN}"}
    for r in recs.values():
        assert r["backend"] == "ring" and r["n"] == 1 and r["avg_ts"] > 0
        assert r["device"].startswith("ring ")  # the plan: "ring a[0,3)+b[3,4)"
        assert r["eta"] is None  # no roofline of this host explains a ring
        assert any(n.startswith("ring plan: ") for n in r["notes"]), r["notes"]
    # a prefill-only request has no decode step over which the driver counts link bytes
    assert any("not counted (no decode step)" in n for n in recs[f"pp{N_PROMPT}"]["notes"])

    conn = home_db(ring.home)
    run = conn.execute("SELECT * FROM runs ORDER BY id DESC LIMIT 1").fetchone()
    assert run["status"] == "complete"
    assert not conn.execute("SELECT COUNT(*) FROM measurements WHERE kind = 'roofline'"
                            ).fetchone()[0]
    rows = {row["test"]: row for row in conn.execute(
        "SELECT * FROM results WHERE run_id = ?", (run["id"],))}
    tg, pp = json.loads(rows[f"tg{N_GEN}"]["info"]), json.loads(rows[f"pp{N_PROMPT}"]["info"])
    assert tg["tokens"]["generated"] == [N_GEN] and tg["tokens"]["prompt"] == [0]
    assert pp["tokens"]["prompt"] == [N_PROMPT] and pp["tokens"]["generated"] == [0]
    plan = tg["ring"]["plan"]  # the planner's split (the first stage holds the embedding)
    assert plan[0]["first"] == 0 and plan[0]["last"] == plan[1]["first"] < 4 == plan[1]["last"]
    assert {s["member"] for s in plan} == {"a", "b"} and tg["ring"]["world"] == 2
    assert recs[f"tg{N_GEN}"]["device"] == "ring " + "+".join(
        f"{s['member']}[{s['first']},{s['last']})" for s in plan)
    links = tg["ring"]["links"]
    assert [(x["src"], x["dst"]) for x in links] == [(plan[0]["member"], plan[1]["member"]),
                                                     (plan[1]["member"], plan[0]["member"])]
    # forward: one token's activations (64 float32 + header); back: the chosen token id
    assert links[0]["bytes_per_token"] >= 64 * 4 > links[1]["bytes_per_token"] > 0

    tg_metrics = json.loads(rows[f"tg{N_GEN}"]["metrics"])
    assert tg_metrics["itl_s"]["n"] == N_GEN  # one gap per decode step (monotone stamps)
    assert 0 < tg_metrics["ttft_s"]["mean"] < tg_metrics["e2e_s"]["mean"]
    assert min(tg_metrics["itl_s"]["samples"]) >= 0
    samples = conn.execute("SELECT COUNT(*) FROM samples WHERE result_id = ? AND metric = "
                           "'decode_tps'", (rows[f"tg{N_GEN}"]["id"],)).fetchone()[0]
    assert samples == 1


def test_no_daemon_is_one_line_exit_2_before_any_measurement(tmp_path: Path) -> None:
    """Even with llamacpp alongside (which wants a roofline), the ring's preflight fails
    first: nothing measured, nothing stored."""
    r = Ring(tmp_path)
    r.env["STRATA_RING"] = f"127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    line = one_line_error(r.cli("bench", MODEL, "-B", "ring,llamacpp", "-p", "8", "-n",
                                "none", "-r", "1", timeout=60))
    assert "strata ring serve" in line and "connection refused" in line, line
    assert time.monotonic() - t0 < 20  # a roofline measurement would take 10-30 s more
    conn = home_db(tmp_path)
    assert not conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    assert not conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
    r.stop()


def test_a_request_that_lost_a_member_runs_again_and_depth_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, against a control server that answers as a daemon would: the first run
    reports a lost member (its gaps cover only the resumed part), the second does not."""
    from strata.backends.base import LoadConfig, RunRequest
    from strata.backends.ring import LOST_NOTE, RingBackend
    from strata.bench.metrics import compute
    from strata.errors import InputError
    from strata.models.source import resolve
    from strata.ring.control import wire

    stages = [{"member": "a", "first": 0, "last": 3}, {"member": "b", "first": 3, "last": 4}]
    runs: list[dict] = []

    def run(msg: dict, _chan: wire.Channel) -> dict:
        runs.append(msg)
        n, lost = msg["n"], len(runs) == 1
        gaps = n - 1 - (3 if lost else 0)
        return {"tokens": [5] * n, "ttft_s": 0.01, "prefill_s": 0.008, "itl_s": [0.002] * gaps,
                "world": 2, "stages": stages, "predicted_ms_per_token": 1.5,
                "links": [{"src": 0, "dst": 1, "bytes_per_token": 296.0, "measured": True},
                          {"src": 1, "dst": 0, "bytes_per_token": 48.0, "measured": True}],
                "lost": [{"lost": "c", "at_token": 3}] if lost else [], "resumes": []}

    def status(_msg: dict, _chan: wire.Channel) -> dict:
        return {"self": {"id": "a"}, "peers": [], "leader": "a"}

    server = wire.Server("127.0.0.1", 0, {"run": run, "status": status},
                         key=RING_SECRET.encode())
    server.serve_in_thread()
    try:
        monkeypatch.setenv("STRATA_RING", f"127.0.0.1:{server.port}")
        b = RingBackend()
        b.load(resolve(MODEL), LoadConfig())
        trace = b.run(RunRequest((), tuple(b.random_tokens(16, 1)), 8))
        assert len(runs) == 2 and runs[0]["n"] == 9 and len(runs[0]["prompt_ids"]) == 16
        assert LOST_NOTE in trace.notes and len(trace.token_ns) == 8
        m = compute(trace)
        assert m.ttft_s == pytest.approx(0.01) and m.itl_s == pytest.approx([0.002] * 8)
        info = b.info()
        assert info["device"] == "ring a[0,3)+b[3,4)" and info["ring"]["lost"][0]["lost"] == "c"
        assert info["ring"]["links"][0] == {"src": "a", "dst": "b", "bytes_per_token": 296.0,
                                            "measured": True}
        tg = b.run(RunRequest((), (), 4))  # pure tg: BOS as a one-token prompt, n = 4
        assert runs[-1]["n"] == 4 and runs[-1]["prompt_ids"] == [b.bos()]
        assert tg.t_prefill_end == tg.t_start and len(tg.token_ns) == 4
        with pytest.raises(InputError, match="depth tests"):
            b.run(RunRequest((1, 2, 3), (4,), 2))
    finally:
        server.stop()
