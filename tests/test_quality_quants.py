"""`strata quality MODEL --quants ...`: MODEL (f16) quantised to llama.cpp's mixes by
llama.cpp's own quantizer, each scored against MODEL (issue "Real files")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

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
