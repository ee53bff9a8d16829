"""`strata rank`: the score against a hand computation, a real ranking on llama.cpp, reuse of
stored results, the time budget, models that do not fit, and bad input."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from strata.rank import score
from strata.rank.profiles import all_profiles
from tests.conftest import run_cli
from tests.seed_host import seeded_home
from tests.test_output_schema import check

TINY = ("synthetic:tiny@q8_0", "synthetic:tiny-qwen2@q8_0")


def test_score_and_verdict_by_hand() -> None:
    chat = all_profiles()["chat"]  # targets: 512 prompt t/s, 10 gen t/s, TTFT 1 s
    assert (chat.targets.prompt_ts, chat.targets.gen_ts, chat.targets.ttft_s) == (512, 10, 1)
    fast = score.Figures(0, prefill_ts=1024.0, decode_ts=5.0, ttft_s=0.5)
    # terms 1024/512 = 2, 5/10 = 0.5, 1/0.5 = 2: 100 x (2 x 0.5 x 2)^(1/3)
    assert score.score(chat, [fast]) == pytest.approx(100 * 2 ** (1 / 3), rel=1e-12)
    assert score.verdict(chat, [fast]) == "marginal"  # 5 t/s: within 2x of 10
    deep = score.Figures(2048, prefill_ts=256.0, decode_ts=20.0, ttft_s=3.0)
    # six terms over both depths: 2, 0.5, 2, 0.5, 2, 1/3
    assert score.score(chat, [fast, deep]) == pytest.approx(
        100 * (2 * 0.5 * 2 * 0.5 * 2 / 3) ** (1 / 6), rel=1e-12)
    assert score.verdict(chat, [fast, deep]) == "unusable"  # TTFT 3 s > 2 x 1 s
    ok = score.Figures(0, prefill_ts=600.0, decode_ts=12.0, ttft_s=0.9)
    assert score.verdict(chat, [ok]) == "usable"
    # derived TTFT: the prompt at prefill speed, then one decode step
    assert score.derived_ttft(512, 1024.0, 8.0) == pytest.approx(0.5 + 0.125)


def test_every_profile_is_complete() -> None:
    profiles = all_profiles()
    assert {"chat", "rag", "code", "long-gen"} <= set(profiles)
    for p in profiles.values():
        assert p.tests() and all(t > 0 for t in (p.targets.prompt_ts, p.targets.gen_ts,
                                                  p.targets.ttft_s)), p.name


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seeded_home(tmp_path_factory, "rank-home")


def _rank(home: Path, *args: str) -> list[dict]:
    proc = run_cli("rank", *args, "-o", "json", home=home, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _runs(home: Path) -> int:
    with sqlite3.connect(home / "strata.db") as conn:
        return conn.execute("SELECT COUNT(*) FROM runs WHERE command = 'bench'").fetchone()[0]


@pytest.mark.slow
def test_rank_measures_scores_and_reuses(home: Path) -> None:
    recs = _rank(home, *TINY, "--profile", "code")
    assert {r["model_filename"] for r in recs} == set(TINY)
    for r in recs:
        check(r, "rank")  # docs/output.md's fields and types
    code = all_profiles()["code"]
    for r in recs:
        assert r["profile"] == "code" and r["basis"] == "measured" and r["fits"]
        # the score follows from the printed figures by the documented formula
        t = code.targets
        ttft_s = r["ttft_ms"] / 1e3
        assert ttft_s == pytest.approx(code.prompt_tokens / r["prefill_ts"]
                                       + 1 / r["decode_ts"], rel=1e-9)
        want = 100 * math.prod([r["prefill_ts"] / t.prompt_ts, r["decode_ts"] / t.gen_ts,
                                t.ttft_s / ttft_s]) ** (1 / 3)
        assert r["score"] == pytest.approx(want, rel=1e-9)
    assert [r["rank"] for r in recs] == [1, 2]
    assert recs[0]["score"] >= recs[1]["score"]
    runs = _runs(home)
    assert runs == 2  # one bench run per candidate
    again = _rank(home, *TINY, "--profile", "code")
    assert {r["basis"] for r in again} == {"reused"}
    assert _runs(home) == runs  # nothing measured twice
    assert {r["model_filename"]: r["score"] for r in again} == \
        {r["model_filename"]: r["score"] for r in recs}
    # the report shows the latest ranking: both models, their scores as ranked
    report = home / "report.html"
    proc = run_cli("report", "--out", str(report), home=home)
    assert proc.returncode == 0, proc.stderr
    section = report.read_text().split('id="ranking"', 1)[1].split("</section>", 1)[0]
    for r in again:
        assert r["model_filename"] in section and f"{r['score']:,.0f}" in section


@pytest.mark.slow
def test_budget_cuts_and_unfit_models_are_predicted(home: Path) -> None:
    big = "synthetic:llama-3.1-8b@f32"  # 32 GB of weights: fits in no RAM this suite runs in
    recs = _rank(home, TINY[0], big, "synthetic:llama-3.2-1b@q8_0", "--profile", "code",
                 "--budget-min", "0.001")
    by = {r["model_filename"]: r for r in recs}
    assert by[TINY[0]]["basis"] == "reused"  # stored by the test above: costs no budget
    cut = by["synthetic:llama-3.2-1b@q8_0"]
    assert cut["basis"] == "predicted" and cut["rank"] is None and cut["score"] > 0
    if not by[big]["fits"]:
        assert by[big]["basis"] == "predicted" and "fit" in by[big]["note"]


@pytest.mark.parametrize("args, needle", [
    (("--profile", "chatty", "synthetic:tiny@q8_0"), "choose from"),
    (("--budget-min", "0", "synthetic:tiny@q8_0"), "--budget-min"),
    ((), "nothing to rank"),
    (("--presets", "--quant", "q3_k"), "--quant"),
    (("--ref", "synthetic:tiny@f16", "synthetic:tiny@q8_0"), "--quality"),
])
def test_bad_input_exits_2(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    proc = run_cli("rank", *args, home=tmp_path, timeout=120)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_quality_adds_perplexity_and_kl(home: Path) -> None:
    recs = _rank(home, TINY[0], "synthetic:tiny@f16", "--profile", "code", "--quality",
                 "--ref", "synthetic:tiny@f16")
    by = {r["model_filename"]: r for r in recs}
    assert all(r["ppl"] and r["ppl"] > 1 for r in recs)
    assert by["synthetic:tiny@f16"]["kl"] == pytest.approx(0.0, abs=1e-9)  # itself
    assert by[TINY[0]]["kl"] > 0  # q8_0 rounding moves the distribution a little
    with sqlite3.connect(home / "strata.db") as conn:
        kinds = {k for (k,) in conn.execute("SELECT kind FROM measurements")}
    assert {"quality", "rank"} <= kinds


@pytest.mark.slow
def test_an_endpoint_ranks_with_its_streamed_ttft(home: Path) -> None:
    """A real llama-cpp-python server on loopback: measured through the openai backend,
    scored with the TTFT the stream showed (not derived)."""
    import os

    from strata.models.source import resolve
    from tests.server_fixture import llama_server

    os.environ["STRATA_HOME"] = str(home)  # the GGUF where the CLI run finds its cache
    try:
        gguf = resolve(TINY[0]).path("gguf", "rank endpoint test")
    finally:
        os.environ.pop("STRATA_HOME", None)
    with llama_server(gguf, n_ctx=2048) as server:  # code: 1024 + 32 tokens of context
        (rec,) = _rank(home, server.url, "--profile", "code")
    assert rec["backend"] == "openai" and rec["basis"] == "measured" and rec["ttft_measured"]
    code = all_profiles()["code"]
    t = code.targets
    want = 100 * math.prod([rec["prefill_ts"] / t.prompt_ts, rec["decode_ts"] / t.gen_ts,
                            t.ttft_s / (rec["ttft_ms"] / 1e3)]) ** (1 / 3)
    assert rec["score"] == pytest.approx(want, rel=1e-9)


def test_compare_two_hosts_rankings(tmp_path: Path) -> None:
    """`strata compare rank:A rank:B` pairs two hosts' latest rankings in a real SQLite file:
    B's score over A's per profile and model, only where both scored."""
    from strata.hardware.profile import HostProfile
    from strata.store import open_db
    from strata.store.hosts import save_host, save_measurement

    probe = Path(__file__).parent / "fixtures" / "probes" / "h100_torch28_cu128.json"
    here = json.loads(probe.read_text())
    there = json.loads(probe.read_text())
    there["hostname"], there["cpu"]["model"] = "other", "another CPU"  # another fingerprint
    conn = open_db(tmp_path / "strata.db")
    fa, fb = (save_host(conn, HostProfile.from_dict(p)) for p in (here, there))
    assert fa != fb

    def rec(model: str, score: float | None, verdict: str | None) -> dict:
        return {"profile": "chat", "model_filename": model, "backend": "llamacpp",
                "score": score, "verdict": verdict, "basis": "measured"}

    save_measurement(conn, fa, "rank", {"records": [rec("m1", 50.0, "marginal"),
                                                    rec("m2", 80.0, "usable"),
                                                    rec("m3", None, None)]})
    save_measurement(conn, fb, "rank", {"records": [rec("m1", 125.0, "usable"),
                                                    rec("m3", 90.0, "usable")]})
    conn.commit()
    conn.close()
    proc = run_cli("compare", f"rank:{fa[:8]}", f"rank:{fb[:8]}", "-o", "json", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)  # m2: only A scored it; m3: A has no score
    check(row, "compare.rank")  # docs/output.md
    assert (row["model_filename"], row["score_a"], row["score_b"]) == ("m1", 50.0, 125.0)
    assert row["ratio"] == pytest.approx(2.5) and row["verdict_b"] == "usable"
    bad = run_cli("compare", f"rank:{fa[:8]}", "3", home=tmp_path)
    assert bad.returncode == 2 and "rank:HOST on both sides" in bad.stderr
    missing = run_cli("compare", "rank:zzzz", f"rank:{fb[:8]}", home=tmp_path)
    assert missing.returncode == 2 and "no host with a ranking" in missing.stderr


def test_presets_leave_out_test_models_and_short_contexts_are_said() -> None:
    """--presets ranks published models only (the tiny test models once took ranks 1-6);
    a profile that needs more context than a model holds is never measured on it."""
    from strata.bench.scenario import BenchTest
    from strata.models.source import resolve
    from strata.rank.candidates import Candidate, expand
    from strata.rank.ranking import _too_short, _within

    published = expand([], True, "q4_0")
    assert "synthetic:llama-3.2-1b@q4_0" in published
    assert not any(ref.startswith("synthetic:tiny") for ref in published)
    assert "synthetic:tiny@q4_0" in expand([], True, "q4_0", include_test=True)
    tiny = Candidate("synthetic:tiny@q8_0", "llamacpp", resolve("synthetic:tiny@q8_0"))
    assert tiny.model.spec.ctx_max == 2048
    profiles = all_profiles()
    assert _too_short(profiles["chat"], tiny) == ("context too short for this profile: it "
                                                  "needs 2,688 tokens, the model holds 2,048")
    assert _too_short(profiles["code"], tiny) is None
    assert not _within(tiny, BenchTest(512, 0, 2048))  # chat's deep prompt: past 2,048
    assert _within(tiny, BenchTest(1024, 0, 0))


@pytest.mark.slow
def test_a_damaged_file_in_a_ranked_folder_is_a_line(home: Path, tmp_path: Path) -> None:
    from strata.models.source import resolve

    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00 not really")
    good = folder / "tiny.gguf"
    good.write_bytes(Path(resolve(TINY[0]).path("gguf", "llamacpp")).read_bytes())
    proc = run_cli("rank", str(folder), "--profile", "code,chat", "--budget-min", "0.001",
                   "-o", "json", home=home, timeout=600)
    assert proc.returncode == 0, proc.stderr
    recs = json.loads(proc.stdout)
    assert {r["model_filename"] for r in recs} == {str(good)}
    assert f"skipped {folder / 'broken.gguf'}:" in proc.stderr
    chat = next(r for r in recs if r["profile"] == "chat")
    assert chat["score"] is None and "context too short" in chat["note"], chat
