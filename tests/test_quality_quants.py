"""`strata quality MODEL --quants ...`: MODEL (f16) quantised to llama.cpp's mixes by
llama.cpp's own quantizer, each scored against MODEL (issue "Real files")."""

from __future__ import annotations

import json
import re
from html import escape as html_escape
from pathlib import Path

import pytest

from tests.conftest import home_db, run_cli
from tests.seed_host import seed_host

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the llamacpp extra) not installed")

MODEL = "synthetic:tiny-k@f16"
ARGS = ("--ctx", "64", "--max-chunks", "4", "-o", "json")


def test_each_mix_is_scored_against_the_f16_and_fewer_bits_cost_more(
        strata_home: Path) -> None:
    r = run_cli("quality", MODEL, "--quants", "q2_k,q8_0,q4_k_m", *ARGS, home=strata_home)
    assert r.returncode == 0, r.stderr
    rows = {row["model_label"]: row for row in json.loads(r.stdout)}
    assert list(rows) == ["q2_k", "q8_0", "q4_k_m"]  # the order asked for
    assert all(row["ref_filename"] == MODEL and row["ref_label"] == "f16" for row in rows.values())
    assert r.stderr.count("with llama.cpp's quantizer") == 3
    # 8.5, ~4.8 and ~2.6 bits per weight: the divergence from the f16 grows as bits go
    kl = [rows[m]["kl"] for m in ("q8_0", "q4_k_m", "q2_k")]
    top1 = [rows[m]["top1"] for m in ("q8_0", "q4_k_m", "q2_k")]
    assert 0 < kl[0] < kl[1] < kl[2] and top1[0] > top1[1] > top1[2]
    # the quantised files are cached: a second run scores at once
    again = run_cli("quality", MODEL, "--quants", "q8_0", *ARGS, home=strata_home)
    assert again.returncode == 0, again.stderr
    assert "quantizer" not in again.stderr
    assert json.loads(again.stdout)[0]["kl"] == rows["q8_0"]["kl"]


@pytest.mark.parametrize(("args", "says"), [
    ((MODEL, "--quants", "q9_9"), "--quants q9_9: choose from q8_0"),
    (("synthetic:tiny-k@q4_k_m", "--quants", "q8_0"), "needs the f16/f32 file"),
    ((MODEL, "--quants", "q8_0", "--ref", MODEL), "drop --ref"),
])
def test_bad_quants_input_is_one_line(strata_home: Path, args: tuple[str, ...],
                                      says: str) -> None:
    r = run_cli("quality", *args, home=strata_home)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (strata_home / "cache" / "quants").exists()


def test_mixes_are_named_by_model_and_mix_in_the_table_the_db_and_the_report(
        strata_home: Path, tmp_path: Path) -> None:
    """A quantised file lives in strata's cache; what the user reads is MODEL@mix, and the
    report's frontier draws one point per mix with the f16 as the anchor (the host's
    roofline seeded: `strata report` wants a probed host)."""
    seed_host(strata_home)
    r = run_cli("quality", MODEL, "--quants", "q8_0,q4_k_m", "--ctx", "64", "--max-chunks", "2",
                home=strata_home)
    assert r.returncode == 0, r.stderr
    names = [f"{MODEL}@q8_0", f"{MODEL}@q4_k_m"]
    rows = [line for line in r.stdout.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == names, r.stdout
    # the cache path appears only where it is the thing to type: what to bench for speed
    assert all("cache/quants" not in line or "run strata bench on both (" in line
               for line in r.stdout.splitlines()), r.stdout
    assert "q4_k_m vs f16 (llamacpp)" in r.stdout and "q8_0 vs f16 (llamacpp)" in r.stdout
    # the stored rows: the label as the model, the mix as model_label, the file in info
    with home_db(strata_home) as conn:
        stored = [json.loads(row["data"]) for row in conn.execute(
            "SELECT data FROM measurements WHERE kind = 'quality' ORDER BY id")]
    assert [(s["model"], s["model_label"], s["ref"], s["ref_label"]) for s in stored] == [
        (names[0], "q8_0", MODEL, "f16"), (names[1], "q4_k_m", MODEL, "f16")]
    assert all(Path(s["info"]["model_file"]).is_file() for s in stored)

    out = tmp_path / "report.html"
    rep = run_cli("report", "--out", str(out), home=strata_home)
    assert rep.returncode == 0, rep.stderr
    html = out.read_text(encoding="utf-8")
    frontier = re.search(r'<section id="frontier"[^>]*>(.*?)</section>', html, re.S)
    assert frontier, "no frontier section"
    body = frontier.group(1)
    for name in names:
        assert f"<td>{html_escape(name)}</td>" in body, name
    assert f"<td>{html_escape(MODEL)} (reference)</td>" in body  # the anchor
    assert "cache/quants" not in body
