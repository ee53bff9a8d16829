"""Metrics for models as kernel writers, checked against values computed by hand."""

from __future__ import annotations

import io
import itertools
import json
import math

import pytest
from rich.console import Console

from strata.errors import InputError
from strata.kernels.gen.metrics import (
    BENEFICIAL,
    HARMFUL,
    NO_EFFECT,
    fast_p,
    geomean,
    paired_bootstrap,
    pass_at_k,
    samples,
    score,
    skill_verdict,
    skills_ab,
)
from strata.kernels.gen.records import Attempt, Timing
from strata.views import kernels_gen as views
from strata.views.output import emit as emit_to


def emit(records: list[dict], fmt: str, columns: tuple[str, ...],
         numeric: tuple[str, ...] = ()) -> str:
    """What `-o fmt` prints for these records (views.output.emit, md: these columns, these
    right-aligned)."""
    buf = io.StringIO()
    emit_to(Console(file=buf), fmt, records, md_columns=columns, md_numeric=numeric)
    return buf.getvalue()


def att(op: str, sample: int, turn: int, status: str, eager: float | None = None,
        best: float | None = None, tin: int | None = 10, tout: int | None = 10, *,
        cheat: bool = False, model: str = "m", run: str = "r1",
        skill: str | None = None) -> Attempt:
    return Attempt(op=op, dialect="c", device="cpu", endpoint="http://127.0.0.1:1/v1",
                   model=model, template_hash="t", sample=sample, turn=turn, prompt="[]",
                   reply="", status=status, tokens_in=tin, tokens_out=tout,
                   timing=Timing(speedup_eager=eager, speedup_best=best), cheat=cheat,
                   run=run, skill=skill, latency_s=1.5)


# -- pass@k ------------------------------------------------------------------------------------

def _pass_at_k_by_enumeration(n: int, c: int, k: int) -> float:
    """Share of the k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 7))
def test_pass_at_k_equals_enumerating_every_subset(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_by_enumeration(n, c, k))


def test_pass_at_k_hand_values_and_bounds() -> None:
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(3, 1, 1) == pytest.approx(1 / 3)
    assert pass_at_k(3, 0, 3) == 0.0
    for bad in ((2, 1, 3), (2, 3, 1), (2, 1, 0)):  # k > n, c > n, k < 1
        with pytest.raises(ValueError):
            pass_at_k(*bad)


# -- fast_p, geomean ---------------------------------------------------------------------------

def test_fast_p_counts_correct_and_strictly_faster() -> None:
    tasks = [(True, 2.5), (True, 1.2), (False, 3.0), (True, None), (True, 1.0)]
    assert fast_p(tasks, 1.0) == pytest.approx(2 / 5)  # 2.5, 1.2 (1.0 is not > 1)
    assert fast_p(tasks, 1.5) == pytest.approx(1 / 5)  # 2.5 (3.0 is wrong)
    assert fast_p(tasks, 2.5) == 0.0  # strict
    assert fast_p(tasks, 0.0) == pytest.approx(3 / 5)  # untimed correct is not fast
    assert fast_p([], 1.0) == 0.0


def test_geomean() -> None:
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([1.0, None, 4.0]) == pytest.approx(2.0)
    assert geomean([None]) is None
    assert geomean([]) is None


# -- the paired bootstrap ----------------------------------------------------------------------

def test_bootstrap_identical_arms_give_zero_lift_and_zero_ci() -> None:
    xs = [1.0, 0.0, 1.0, 1.0, 0.0]
    assert paired_bootstrap(xs, list(xs), n=2000) == (0.0, 0.0, 0.0)


def test_bootstrap_always_better_arm_has_positive_lower_bound() -> None:
    # Differences per unit: 1, 1, 1, 0. A resample of 4 units has k ones with k ~ Bin(4, .75):
    # P(k=0) = 0.0039, P(k<=1) = 0.0508, so the 2.5th percentile of the mean is 1/4; the top
    # (k=4, P = 0.316) makes the 97.5th percentile 1.
    lift, lo, hi = paired_bootstrap([1.0, 1.0, 1.0, 0.0], [0.0] * 4)
    assert lift == pytest.approx(0.75)
    assert lo == pytest.approx(0.25)
    assert hi == pytest.approx(1.0)
    lift, lo, hi = paired_bootstrap([0.0] * 4, [1.0, 1.0, 1.0, 0.0])  # the mirror image
    assert (lift, lo, hi) == pytest.approx((-0.75, -1.0, -0.25))
    # Differences 1, 1, 0: k ones of 3 with k ~ Bin(3, 2/3), P(k=0) = 1/27 = 0.037 > 0.025,
    # so the 2.5th percentile is 0 (a 5th percentile would be 1/3); P(k=3) = 8/27 -> hi 1.
    assert paired_bootstrap([1.0, 1.0, 0.0], [0.0] * 3) == pytest.approx((2 / 3, 0.0, 1.0))
    # Differences 1, 0, 0: P(k=3) = 1/27 > 0.025, so the 97.5th percentile is 1 (a 95th
    # would be 2/3); P(k=0) = 8/27 -> lo 0.
    assert paired_bootstrap([1.0, 0.0, 0.0], [0.0] * 3) == pytest.approx((1 / 3, 0.0, 1.0))


def test_bootstrap_pairs_units_and_is_reproducible() -> None:
    # Both arms vary a lot but every unit gains exactly 0.1: pairing makes the CI a point.
    with_ = [5.1, 0.1, 9.1, 2.1, 7.1]
    without = [5.0, 0.0, 9.0, 2.0, 7.0]
    assert paired_bootstrap(with_, without, n=500) == pytest.approx((0.1, 0.1, 0.1))
    mixed = ([1.0, 0.0, 1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    # With 20 draws the interpolated percentiles depend on the draws: the seed fixes them.
    few = {paired_bootstrap(*mixed, n=20, seed=s) for s in range(10)}
    assert len(few) > 1
    assert paired_bootstrap(*mixed, n=20, seed=3) == paired_bootstrap(*mixed, n=20, seed=3)
    first = paired_bootstrap(*mixed, seed=7)
    assert first[1] <= first[0] <= first[2]
    assert first[1] < 0 < first[2]  # +1/3 on six units is not distinguishable from 0
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [1.0, 0.0])
    with pytest.raises(ValueError):
        paired_bootstrap([], [])


# -- the verdict at its boundaries -------------------------------------------------------------

@pytest.mark.parametrize(("lo", "hi", "lift", "ratio", "verdict"), [
    (1e-9, 0.5, 0.2, None, BENEFICIAL),  # lower bound above 0
    (0.0, 0.5, 0.2, None, NO_EFFECT),  # lower bound at 0 is not above it
    (-0.1, 0.1, 0.0, 0.8, BENEFICIAL),  # lift >= 0 and ratio <= 0.8, both at the boundary
    (-0.1, 0.1, 0.0, 0.8000001, NO_EFFECT),
    (-0.1, 0.1, -1e-9, 0.5, NO_EFFECT),  # a token saving does not excuse a negative lift
    (-0.1, 0.1, 0.0, None, NO_EFFECT),  # no usage figures: the token clause cannot hold
    (-0.5, -1e-9, -0.2, 0.5, HARMFUL),
    (-0.5, 0.0, -0.2, None, NO_EFFECT),  # upper bound at 0 is not below it
])
def test_skill_verdict_boundaries(lo: float, hi: float, lift: float, ratio: float | None,
                                  verdict: str) -> None:
    assert skill_verdict(lo, hi, lift, ratio) == verdict


# -- samples and score() -----------------------------------------------------------------------

def test_a_sample_is_its_best_turn() -> None:
    got = samples([att("a", 0, 1, "compile"), att("a", 0, 2, "mismatch"),
                   att("a", 0, 3, "format")])
    assert len(got) == 1
    assert (got[0].result.status, got[0].result.turn, got[0].first_correct) \
        == ("mismatch", 2, None)
    got = samples([att("a", 0, 1, "ok", 1.4), att("a", 0, 2, "ok", 1.4)])
    assert got[0].result.turn == 1  # equal speed: the earlier turn
    with pytest.raises(InputError, match="unknown status 'great'"):
        samples([att("a", 0, 1, "great")])


def _board() -> list[Attempt]:
    m = [  # model "m": 3 ops, 7 samples, 13 attempts
        att("rmsnorm", 0, 1, "compile", tin=100, tout=50),
        att("rmsnorm", 0, 2, "ok", 2.5, 1.2, tin=200, tout=60),
        att("rmsnorm", 0, 3, "ok", 1.1, 0.5, tin=210, tout=70),  # slower: turn 2 stays best
        att("rmsnorm", 1, 1, "slow", 0.8, 0.5, tin=150, tout=40),
        att("rmsnorm", 1, 2, "mismatch", tin=100, tout=40),
        att("rmsnorm", 1, 3, "ok", 1.6, 0.9, tin=180, tout=30),
        att("softmax", 0, 1, "format", tin=100, tout=30),
        att("softmax", 0, 2, "runtime", cheat=True, tin=120, tout=40),
        att("softmax", 1, 1, "static", cheat=True, tin=100, tout=20),
        att("softmax", 1, 2, "slow", 0.9, 0.4, tin=130, tout=30),
        att("softmax", 2, 1, "compile", tin=90, tout=25),
        att("silu", 0, 1, "mismatch", tin=80, tout=20),
        att("silu", 1, 1, "format", tin=70, tout=10),
    ]
    m2 = [  # model "m2": a server without usage figures, one correct kernel untimed
        att("rmsnorm", 0, 1, "ok", 3.0, 1.5, tin=None, tout=12, model="m2"),
        att("softmax", 0, 1, "ok", None, None, model="m2"),
    ]
    return list(reversed(m)) + m2  # out of turn order on purpose


def test_score_by_hand() -> None:
    rows = score(_board(), ks=(1, 2, 4))
    assert [(r.model, r.dialect) for r in rows] == [("m", "c"), ("m2", "c")]
    r = rows[0]
    assert (r.samples, r.ops, r.attempts) == (7, 3, 13)
    # Results: rmsnorm 0 -> ok 2.5/1.2, rmsnorm 1 -> ok 1.6/0.9, softmax 0 -> runtime,
    # softmax 1 -> slow 0.9/0.4, softmax 2 -> compile, silu 0 -> mismatch, silu 1 -> format.
    assert r.compile_rate == pytest.approx(5 / 7)  # all but softmax 2 and silu 1
    assert r.correct_rate == pytest.approx(3 / 7)
    # pass@1 per op: rmsnorm (n=2, c=2) 1; softmax (3, 1) 1 - 2/3 = 1/3; silu (2, 0) 0.
    # pass@2: rmsnorm 1; softmax 1 - C(2,2)/C(3,2) = 2/3; silu 0. pass@4: n < 4 -> None.
    assert r.pass_at[1] == pytest.approx((1 + 1 / 3 + 0) / 3)
    assert r.pass_at[2] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert r.pass_at[4] is None
    # correct results' speedups: eager 2.5, 1.6, 0.9; best 1.2, 0.9, 0.4.
    assert r.fast == pytest.approx({"eager@1": 2 / 7, "eager@1.5": 2 / 7, "eager@2": 1 / 7,
                                    "best@1": 1 / 7, "best@1.5": 0.0, "best@2": 0.0})
    # best per op: rmsnorm max(2.5, 1.6) = 2.5, softmax 0.9, silu none: sqrt(2.25).
    assert r.geomean_speedup == pytest.approx(1.5)
    assert r.coverage == pytest.approx(2 / 3)
    # first correct turn: rmsnorm 0 at 2, rmsnorm 1 at 1 (slow), softmax 1 at 2.
    assert r.turns_to_first_correct == pytest.approx(5 / 3)
    # tokens: rmsnorm 0: 150 + 260 + 280 = 690; rmsnorm 1: 190 + 140 + 210 = 540;
    # softmax: 130 + 160 = 290, 120 + 160 = 280, 115; silu: 100, 80. Sum 2095 over 3 correct.
    assert r.tokens_per_correct == pytest.approx(2095 / 3)
    assert (r.cheats, r.cheat_rate) == (2, pytest.approx(2 / 13))

    r2 = rows[1]
    assert (r2.samples, r2.ops, r2.correct_rate, r2.compile_rate) == (2, 2, 1.0, 1.0)
    assert r2.pass_at == {1: 1.0, 2: None, 4: None}
    assert r2.fast["eager@1"] == pytest.approx(0.5)  # the untimed kernel is not fast
    assert r2.fast["best@1.5"] == 0.0  # 1.5 is not > 1.5
    assert (r2.geomean_speedup, r2.coverage) == (pytest.approx(3.0), pytest.approx(0.5))
    assert r2.tokens_per_correct is None  # one reply came without usage
    assert r2.turns_to_first_correct == 1.0


def test_score_keeps_skill_arms_and_runs_apart() -> None:
    rows = score([att("a", 0, 1, "ok", 2.0, skill="s@1"), att("a", 0, 1, "mismatch")])
    assert [(r.skill, r.correct_rate) for r in rows] == [("s@1", 1.0), (None, 0.0)]
    rows = score([att("a", 0, 1, "ok", 2.0, run="r1"), att("a", 0, 1, "mismatch", run="r2")])
    assert len(rows) == 1 and rows[0].samples == 2 and rows[0].pass_at[1] == 0.5


# -- skills A/B --------------------------------------------------------------------------------

def _arms(tout_none: bool = False) -> tuple[list[Attempt], list[Attempt]]:
    w = [att("a", 0, 1, "ok", 2.0, skill="k"), att("a", 1, 1, "slow", 0.9, skill="k"),
         att("b", 0, 1, "mismatch", skill="k"), att("b", 1, 1, "ok", 1.5, skill="k")]
    o = [att("a", 0, 1, "compile"), att("a", 0, 2, "mismatch"),
         att("a", 1, 1, "compile"), att("a", 1, 2, "slow", 0.9),
         att("b", 0, 1, "format"), att("b", 0, 2, "mismatch"),
         att("b", 1, 1, "format"), att("b", 1, 2, "compile", tout=None if tout_none else 10),
         att("c", 0, 1, "ok", 5.0, tin=1000)]  # unpaired: left out, tokens too
    return w, o


def test_skills_ab_by_hand() -> None:
    ab = skills_ab(*_arms())
    assert (ab.skill, ab.model, ab.units, ab.unpaired) == ("k", "m", 4, 1)
    # correct per unit: with 1, 1, 0, 1; without 0, 1, 0, 0 -> diffs 1, 0, 0, 1.
    # A resample of 4 has no 1 with P = 1/16 > 2.5% and all 1 with P = 1/16: CI [0, 1].
    c = ab.correct
    assert (c.with_, c.without, c.lift) == pytest.approx((0.75, 0.25, 0.5))
    assert (c.lo95, c.hi95) == pytest.approx((0.0, 1.0))
    # fast_1: with 1, 0, 0, 1; without 0 everywhere (0.9 is slower than eager).
    f = ab.fast_1
    assert (f.with_, f.without, f.lift, f.lo95, f.hi95) == pytest.approx((0.5, 0, 0.5, 0, 1))
    # tokens: 4 attempts x 20 with the skill, 8 x 20 without (unit c is unpaired).
    assert (ab.tokens_with, ab.tokens_without) == (80, 160)
    assert ab.token_ratio == pytest.approx(0.5)
    assert ab.verdict == c.verdict == BENEFICIAL  # lo = 0, but lift >= 0 at half the tokens


def test_skills_ab_without_usage_rests_on_the_ci() -> None:
    ab = skills_ab(*_arms(tout_none=True))
    assert ab.tokens_without is None and ab.token_ratio is None
    assert ab.verdict == NO_EFFECT  # lo = 0 is not above 0


def test_skills_ab_refuses_unpaired_or_doubled_arms() -> None:
    with pytest.raises(InputError, match="no \\(op, sample\\) unit"):
        skills_ab([att("a", 0, 1, "ok")], [att("b", 0, 1, "ok")])
    twice = [att("a", 0, 1, "ok", run="r1"), att("a", 0, 1, "ok", run="r2")]
    with pytest.raises(InputError, match="twice"):
        skills_ab(twice, [att("a", 0, 1, "ok")])


# -- views -------------------------------------------------------------------------------------

def _text(table) -> str:
    console = Console(record=True, width=400, color_system=None)
    console.print(table)
    return console.export_text()


def test_leaderboard_views() -> None:
    rows = score(_board(), ks=(1, 2))
    records = [views.scores_record(r) for r in rows]
    cols = views.leaderboard_columns(rows)
    md = emit(records, "md", cols, views.leaderboard_numeric(rows))
    head, _rule, first, second = md.splitlines()
    assert "pass@2" in head and "fast_eager@1.5" in head and "pass@4" not in head
    cells = dict(zip(head.split(" | "), first.split(" | "), strict=True))
    # md carries full precision, as csv does (docs/output.md): 4/9 whole
    assert float(cells["pass@1"]) == pytest.approx(4 / 9, rel=1e-15)
    assert len(cells["pass@1"]) > 10 and cells["geomean_speedup"] == "1.5"
    cells = dict(zip(head.split(" | "), second.split(" | "), strict=True))
    assert cells["pass@2"] == "" and cells["tokens_per_correct"] == ""  # None: no figure
    assert json.loads(emit(records, "json", cols))[0]["cheats"] == 2
    text = _text(views.leaderboard_table(rows))
    assert "44%" in text and "1.50x" in text and "2 (15%)" in text


def test_attempt_sample_and_ab_views() -> None:
    board = _board()
    text = _text(views.attempts_table(board))
    assert "runtime (cheat)" in text and "2.50x" in text
    rec = views.attempt_record(board[-2])
    assert (rec["tokens"], rec["tokens_out"]) == (None, 12) and "prompt" not in rec
    assert views.attempt_record(board[0])["tokens"] == 80
    results = samples(board)
    rms0 = next(s for s in results if (s.model, s.op, s.sample) == ("m", "rmsnorm", 0))
    rec = views.sample_record(rms0)
    assert (rec["turns"], rec["best_turn"], rec["first_correct"], rec["tokens"]) \
        == (3, 2, 2, 690)
    assert "2.50x" in _text(views.samples_table(results))
    ab = skills_ab(*_arms())
    recs = views.ab_records(ab)
    assert [r["metric"] for r in recs] == ["correct_rate", "fast_1", "tokens"]
    assert recs[2]["ratio"] == pytest.approx(0.5) and recs[0]["verdict"] == BENEFICIAL
    md = emit(recs, "md", views.AB_COLUMNS, views.AB_NUMERIC)
    assert "| correct_rate | 0.25 | 0.75 | 0.5 | 0.0 | 1.0 |  | beneficial |" in md
    text = _text(views.ab_table(ab))
    assert "+50 pt" in text and "beneficial" in text and "ratio 0.50" in text
    assert math.isclose(ab.fast_1.lift, 0.5)


def test_nothing_timed_is_unknown_not_zero() -> None:
    """--no-bench: correct kernels without timings make fast_p and coverage unknown (None),
    and the A/B fast_1 verdict says so instead of 'no measurable effect'."""
    from strata.kernels.gen.metrics import NOT_TIMED, score, skills_ab

    untimed = [att("rmsnorm", 0, 1, "ok"), att("rmsnorm", 1, 1, "mismatch")]
    (s,) = score(untimed, ks=(1,))
    assert s.correct_rate == 0.5
    assert s.coverage is None and all(v is None for v in s.fast.values())
    timed = [att("rmsnorm", 0, 1, "ok", eager=2.0), att("rmsnorm", 1, 1, "mismatch")]
    (t,) = score(timed, ks=(1,))
    assert t.fast["eager@1"] == 0.5 and t.coverage == 1.0
    ab = skills_ab(untimed, [att("rmsnorm", 0, 1, "mismatch"), att("rmsnorm", 1, 1, "ok")])
    assert ab.fast_1.verdict == NOT_TIMED


# -- the definitions, where users read them ----------------------------------------------------

def test_eval_help_and_readme_define_every_metric() -> None:
    """`strata kernels eval --help` names and defines each metric; the README quotes the
    definitions of metrics.py word for word (so the two cannot drift apart)."""
    import re
    from pathlib import Path

    from typer.testing import CliRunner

    from strata.cli import app
    from strata.kernels.gen import metrics

    page = CliRunner().invoke(app, ["kernels", "eval", "--help"], env={"COLUMNS": "200"},
                              terminal_width=200).output
    flat = " ".join(page.replace("│", " ").split())
    for term in ("compile share of samples", "correct share", "pass@k the unbiased",
                 "1 - C(n-c,k)/C(n,k)", "fast_p share of samples correct", "eager@p",
                 "best@p", "p = 1, 1.5, 2", "geomean speedup over eager", "coverage the share",
                 "turns to the first correct", "tokens per correct", "cheats attempts where "
                 "a guard fired"):
        assert term in flat, (term, flat)

    def words(text: str) -> str:
        return " ".join(text.replace(">", " ").split())

    readme = words((Path(__file__).parent.parent / "README.md").read_text())
    doc = metrics.__doc__ or ""
    for para in re.split(r"\n\s*\n", doc.split("Terms.", 1)[1]):
        for item in re.split(r"\n- ", para):  # each bullet on its own
            assert words(item.removeprefix("- ")) in readme, item
