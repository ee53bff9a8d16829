"""The judge of model-written kernels: every adversarial fixture, wrapped in a model-style
reply, goes through extraction and the `kernels add` path (static check, link check,
sandbox, benchmark) and comes back with its status class, reason and cheat flag; the
feedback quotes the compiler, the first mismatches and the timings. Real sandboxes, a real
seeded DB (no roofline measurement); the pure rules checked on hand-built figures."""

from __future__ import annotations

import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from strata.errors import StrataError
from strata.kernels import checks, plausibility
from strata.kernels.bench import WRONG_AT_SHAPE, Figure
from strata.kernels.gen import judge
from strata.kernels.gen.feedback import ShapeTime
from strata.kernels.gen.judge import Judgement, classify, figure_problem, judge_reply
from strata.kernels.gen.records import STATUSES, Timing
from strata.kernels.impl import parse_declaration
from tests.conftest import FIXTURES
from tests.seed_host import SEEDED_ROOFLINE, seeded_home

pytest.importorskip("torch")

ADVERSARIAL = FIXTURES / "kernels" / "adversarial"
S, R, M, IMP = "static", "runtime", "mismatch", "implausible"
# fixture -> (status, reason, cheat) with every check on, as a model's reply would meet them
EXPECTED: dict[str, tuple[str, str, bool]] = {
    "background_thread.py": (S, checks.STATIC_CHECK, True),
    "calls_torch.py": (S, checks.STATIC_CHECK, True),
    "patches_timer.py": (S, checks.STATIC_CHECK, True),
    "raw_syscall.c": (S, checks.STATIC_CHECK, True),
    "declares_libc.c": (S, checks.STATIC_CHECK, True),
    "uses_dlsym.c": (S, checks.STATIC_CHECK, True),
    "declares_cpython.c": (S, checks.FORBIDDEN_LINK, True),
    "load_time_constructor.c": (S, checks.FORBIDDEN_LINK, True),
    "ifunc_resolver.c": (S, checks.FORBIDDEN_LINK, True),
    "infinite_loop.c": (R, checks.TIMEOUT, False),
    "segfault.c": (R, checks.CRASHED, False),
    "writes_file.py": (R, checks.SANDBOX_VIOLATION, True),
    "writes_at_load.py": (R, checks.SANDBOX_VIOLATION, True),
    "writes_past_end.c": (R, checks.OUT_OF_BOUNDS, True),
    "first_seed_only.c": (M, checks.WRONG_RESULT, False),
    "lower_precision.c": (M, checks.WRONG_RESULT, False),
    "data_race.c": (M, checks.DATA_RACE, False),
    "cached_output.c": (M, checks.INPUT_INDEPENDENT, True),
    "constant_fill.c": (M, checks.CONSTANT_OUTPUT, True),
    "zeros.c": (M, checks.CONSTANT_OUTPUT, True),
    "writes_inputs.c": (M, checks.MODIFIED_INPUTS, True),
    "reads_output.c": (M, checks.READS_OUTPUT, True),
    "reads_output.py": (M, checks.READS_OUTPUT, True),
    # passes verification; caught only when timed (new inputs in reused buffers)
    "skips_when_timed.c": (IMP, judge.WRONG_WHEN_TIMED, True),
    "honest_rmsnorm.c": ("ok", "", False),
}
# caught when timed, or already in verification when the allocator reused an address (as
# reads_output, as nan_parity when the skipped output still held its NaN prefill, or as a
# data_race when the reuse happened between the one-thread and the many-thread calls):
# every outcome is a rejection, which is what matters
EITHER = {"pointer_cache.c": {(IMP, judge.WRONG_WHEN_TIMED, True),
                              (M, checks.READS_OUTPUT, True), (M, checks.NAN_PARITY, False),
                              (M, checks.DATA_RACE, False)}}
BENCHED = {"pointer_cache.c", "skips_when_timed.c", "slow_rmsnorm"}
# judged with the runtime alone (static checks off) by the modules that own their class:
# the judge's own process (test_kernels_separation) and confined dispatch
# (test_kernels_production); each is named in an assertion there
ELSEWHERE = {
    "test_kernels_separation.py": {"patches_judge.c", "alias_launcher.py", "forges_done.c",
                                   "forges_result.c", "after_return.c", "span_cache.c",
                                   "wide_rows.c", "ignore_index.c", "window_capped.c"},
    "test_kernels_production.py": {"elf_lookup.c", "production_action.py"},
    "test_kernels_adversarial.py": {"conv_fixed_width.c", "conv_interior_only.c",
                                    "conv_step_keeps_state.c", "conv2d_interior_only.c",
                                    "conv2d_stride_one.c", "conv2d_weights_transposed.c"},
}

# Correct and slow: the first 256 outputs of each row each recompute the row's sum of
# squares, from a rotated start so the compiler cannot hoist it (about 256x the honest work).
SLOW_RMSNORM = """\
#include <math.h>
#include <stdint.h>

void strata_rmsnorm(float *out, const float *x, const float *w, int64_t rows, int64_t cols,
                    float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        double ss = 0.0;
        for (int64_t c = 0; c < cols; c++) {
            if (c < 256) {
                ss = 0.0;
                for (int64_t k = 0; k < cols; k++) {
                    int64_t i = k + c < cols ? k + c : k + c - cols;
                    ss += (double)xr[i] * xr[i];
                }
            }
            out[r * cols + c] = (float)(xr[c] / sqrt(ss / (double)cols + (double)eps) * w[c]);
        }
    }
}
"""


def model_reply(source: str, lang: str, strip_declaration: bool = False) -> str:
    """How a chat model answers: prose, a fenced block, more prose."""
    lines = source.splitlines()
    if strip_declaration:
        lines = [ln for ln in lines if "strata-kernel:" not in ln]
    body = "\n".join(lines)
    return (f"Sure! Here is an optimised kernel for this host.\n\n```{lang}\n{body}\n```\n\n"
            "It uses double accumulation and should be correct for ragged shapes.")


def _case(name: str) -> tuple[str, str, str, str]:
    """(reply, op, dialect, entry) for a fixture; C fixtures lose their declaration (the
    judge adds it back)."""
    path = ADVERSARIAL / name
    decl = parse_declaration(path)
    c = path.suffix == ".c"
    reply = model_reply(path.read_text(), "c" if c else "python", strip_declaration=c)
    return reply, decl["op"], decl["dialect"], decl["entry"]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory):
    """A seeded STRATA_HOME for the whole module (its cache holds the private copies)."""
    path = seeded_home(tmp_path_factory, "gen-judge")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(path))
        yield path


def _session(home: Path):
    from strata.kernels.service import session
    from strata.store import open_db

    return session(conn=open_db(home / "strata.db"))


@pytest.fixture(scope="module")
def judged(home: Path) -> dict[str, Judgement]:
    """Every fixture judged once, two at a time (one DB connection per thread); the
    benchmarked ones first, since they take longest."""
    _session(home)  # probe the host once, in this thread
    local = threading.local()

    def one(name: str) -> Judgement:
        if not hasattr(local, "s"):
            local.s = _session(home)
        if name == "slow_rmsnorm":
            reply, op, dialect, entry = (model_reply(SLOW_RMSNORM, "c"), "rmsnorm", "c",
                                         "strata_rmsnorm")
        else:
            reply, op, dialect, entry = _case(name)
        timeout = 10.0 if name == "infinite_loop.c" else 120.0
        return judge_reply(local.s, reply, op, dialect, "cpu", SEEDED_ROOFLINE, entry,
                           timeout_s=timeout, bench=name in BENCHED, max_time_s=0.05)[0]

    names = sorted([*EXPECTED, *EITHER, "slow_rmsnorm"], key=lambda n: n not in BENCHED)
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(names, pool.map(one, names), strict=True))


def test_every_adversarial_fixture_has_an_expectation() -> None:
    elsewhere = {n for names in ELSEWHERE.values() for n in names}
    assert {p.name for p in ADVERSARIAL.iterdir()} == {*EXPECTED, *EITHER, *elsewhere}
    tests = Path(__file__).parent
    for module, names in ELSEWHERE.items():
        text = (tests / module).read_text()
        assert all(f'"{n}"' in text for n in names), (module, names)


@pytest.mark.slow
@pytest.mark.parametrize("name", [*EXPECTED, *EITHER])
def test_each_adversarial_reply_gets_its_status_reason_and_cheat_flag(
        name: str, judged: dict[str, Judgement]) -> None:
    j = judged[name]
    allowed = EITHER.get(name) or {EXPECTED[name]}
    assert (j.status, j.reason, j.cheat) in allowed, (j.feedback, j.verdict)
    assert j.feedback.strip()
    if j.status != "ok":
        assert j.timing == Timing()


@pytest.mark.slow
def test_rejected_candidates_are_never_registered(home: Path,
                                                  judged: dict[str, Judgement]) -> None:
    from strata.kernels.registry import implementations

    s = _session(home)
    names = {i.name for i in implementations(None, s.conn) if i.origin == "external"}
    assert names == set()  # judging registers nothing
    rejected = judged["zeros.c"]
    assert rejected.impl is not None and rejected.impl.source is not None
    with pytest.raises(StrataError, match="constant_output"):
        judge.register_candidate(s, "silu_mul", "c", rejected.impl.source.read_text())
    assert not [i for i in implementations("silu_mul", s.conn) if i.origin == "external"]


@pytest.mark.slow
def test_a_correct_candidate_registers_through_the_add_path(
        home: Path, judged: dict[str, Judgement]) -> None:
    from strata.kernels.registry import implementations

    s = _session(home)
    honest = judged["honest_rmsnorm.c"]
    assert honest.impl is not None and honest.impl.source is not None
    code = honest.impl.source.read_text()
    assert code.startswith("// strata-kernel: op=rmsnorm dialect=c entry=strata_rmsnorm\n")
    impl = judge.register_candidate(s, "rmsnorm", "c", code)
    assert impl.key in {i.key for i in implementations("rmsnorm", s.conn)}


@pytest.mark.slow
def test_a_slow_correct_kernel_gets_its_timings_against_eager(
        judged: dict[str, Judgement]) -> None:
    from strata.kernels.spec import get_spec

    j = judged["slow_rmsnorm"]
    assert (j.status, j.cheat) == ("slow", False), j.feedback
    assert j.timing.speedup_eager is not None and j.timing.speedup_eager < 1.0
    assert j.timing.seconds is not None and j.timing.seconds > 0
    assert len(j.shapes) == len(get_spec("rmsnorm").shape_set("llm"))
    assert "Correct, but slower than torch eager" in j.feedback
    assert re.search(r"rows=8 cols=4096: [\d.]+ [mµn]?s; torch eager [\d.]+ [mµn]?s \(speedup "
                     r"\d+\.\d+x", j.feedback), j.feedback
    # the seeded roofline's ceiling is in the text too (a tiny share: its peaks are huge)
    assert "roofline ceiling" in j.feedback and j.timing.roofline_share is not None


@pytest.mark.slow
def test_mismatch_feedback_names_shape_seed_index_and_numbers(
        judged: dict[str, Judgement]) -> None:
    text = judged["first_seed_only.c"].feedback
    assert re.search(r"shape \{'rows': \d+, 'cols': \d+\}, seed \d", text), text
    assert re.search(r"\[\d+,\d+\]: got -?[\d.e+-]+, expected -?[\d.e+-]+", text), text
    assert re.search(r"Max relative error among these: [\d.e+-]+", text), text


@pytest.mark.slow
def test_feedback_never_shows_this_hosts_paths(home: Path,
                                               judged: dict[str, Judgement]) -> None:
    for name, j in judged.items():
        assert str(home) not in j.feedback, name


def test_compile_error_feedback_quotes_the_compiler(home: Path) -> None:
    broken = (ADVERSARIAL / "honest_rmsnorm.c").read_text().replace("double ss", "doubel ss")
    j, code = judge_reply(_session(home), model_reply(broken, "c"), "rmsnorm", "c", "cpu",
                          None)
    assert code is not None
    assert (j.status, j.reason, j.cheat) == ("compile", checks.BUILD_FAILED, False)
    assert re.search(r"kernel\.c:\d+:\d+: error: unknown type name .doubel.", j.feedback), \
        j.feedback
    assert str(home) not in j.feedback and "gen_" not in j.feedback


def test_a_python_syntax_error_is_a_compile_error_not_a_cheat(home: Path) -> None:
    src = "import triton\n\ndef strata_silu_mul(out, a, b):\n    return (\n"
    j, _ = judge_reply(_session(home), model_reply(src, "python"), "silu_mul", "triton",
                       "cpu", None, "strata_silu_mul")
    assert (j.status, j.cheat) == ("compile", False), j.feedback
    assert "syntax error" in j.feedback


def test_replies_without_a_usable_kernel_are_format_failures(home: Path) -> None:
    s = _session(home)
    for reply, needle in [("I cannot help with that.", "no fenced code block"),
                          ("<!DOCTYPE html><html><body>502 Bad Gateway</body></html>",
                           "HTML page"),
                          ("```c\nvoid strata_softmax(float *o) { }\n```", "strata_rmsnorm")]:
        j, code = judge_reply(s, reply, "rmsnorm", "c", "cpu", None)
        assert (j.status, j.cheat, code) == ("format", False, None)
        assert needle in j.reason and needle in j.feedback
        assert "strata-kernel: op=rmsnorm dialect=c entry=strata_rmsnorm" in j.feedback


def test_requiring_what_this_host_lacks_is_refused_before_it_builds(home: Path) -> None:
    src = ("// strata-kernel: op=rmsnorm dialect=c entry=strata_rmsnorm requires=warp9\n" +
           (ADVERSARIAL / "honest_rmsnorm.c").read_text())
    j, _ = judge_reply(_session(home), model_reply(src, "c"), "rmsnorm", "c", "cpu", None)
    assert (j.status, j.reason, j.cheat) == ("static", judge.UNAVAILABLE, False), j.feedback
    assert "warp9" in j.feedback


# -- the rules on their own -------------------------------------------------------------------

def test_every_reason_code_has_a_status_class() -> None:
    codes = [v for k, v in vars(checks).items() if k.isupper() and isinstance(v, str)
             and k != "MAX_SHOWN"]
    assert len(codes) >= 19
    for code in codes:
        status, _ = classify(code)
        assert status in STATUSES and code in judge.STATUS_OF, code
    assert classify(None) == ("runtime", False)
    assert classify("something_new") == ("runtime", False)
    assert classify(checks.STATIC_CHECK, ["line 4: syntax error: '(' was never closed"]) == \
        ("compile", False)
    assert classify(checks.STATIC_CHECK, ["line 4: uses open()"]) == ("static", True)


def _fig(impl: str = "c.ext.gen_x", median: float | None = 1e-4, flags: list[str] | None
         = None, note: str = "", shape: dict[str, int] | None = None) -> Figure:
    return Figure("rmsnorm", impl, shape or {"rows": 8, "cols": 4096}, "cpu", "float32",
                  median_s=median, note=note, flags=flags or [])


def test_benchmark_figures_that_disqualify_a_verified_kernel() -> None:
    flag = plausibility.implausible(1e-7, 1e-5)
    assert flag is not None
    assert figure_problem([_fig(flags=[flag])])[0] == plausibility.IMPLAUSIBLE
    recheck = f"{WRONG_AT_SHAPE}: re-check on new inputs failed (no timing)"
    assert figure_problem([_fig(flags=[recheck])])[0] == judge.RECHECK_FAILED
    timed = "timed call #9 was wrong (nan_parity: 3 element(s) NaN/Inf ...)"
    wrong = [WRONG_AT_SHAPE]
    assert figure_problem([_fig(median=None, flags=wrong, note=timed)])[0] == \
        judge.WRONG_WHEN_TIMED
    first = "out_of_bounds_write: wrote 4 floats past the end"
    assert figure_problem([_fig(median=None, flags=wrong, note=first)])[0] == \
        checks.OUT_OF_BOUNDS
    crashed = "crashed: the worker died (signal 11)"
    assert figure_problem([_fig(median=None, note=crashed)])[0] == checks.CRASHED
    assert figure_problem([_fig(), _fig(median=None, note="untimed: Triton interpreter")]) is None
    assert classify(judge.WRONG_WHEN_TIMED) == ("implausible", True)


def test_timing_is_a_geomean_over_shapes_and_slow_means_slower_than_eager() -> None:
    rows = [ShapeTime({"rows": 1, "cols": 8}, 2e-6, 4e-6, 1e-6, "c.avx2", 1e-6, 2.0),
            ShapeTime({"rows": 8, "cols": 8}, 8e-6, 4e-6, 4e-6, "c.avx2", 2e-6, 0.5),
            ShapeTime({"rows": 8, "cols": 64}, 1e-5, 9e-5, None, None, None, 300.0, True)]
    t = judge.timing_of(rows)
    assert t.speedup_eager == pytest.approx(1.0)  # sqrt(2 * 0.5); the noisy shape not counted
    assert t.speedup_best == pytest.approx(0.5)
    assert t.roofline_share == pytest.approx((0.5 * 0.25) ** 0.5)
    assert t.seconds == 1e-5
    assert judge.status_of(t) == "ok"
    assert judge.status_of(Timing(speedup_eager=0.9)) == "slow"
    assert judge.status_of(Timing()) == "ok"  # correct, untimed


def test_shape_times_read_eager_and_the_best_stored_kernel() -> None:
    figs = [_fig("torch.eager", 4e-4), _fig("c.ext.gen_x", 1e-4),
            _fig("c.ext.gen_x", 2e-4, shape={"rows": 1, "cols": 4096})]
    figs[1].speedup_eager, figs[1].frac_bw, figs[1].frac_flops = 4.0, 0.25, 0.01
    best = {"cols=4096,rows=8": ("c.avx2", 5e-5)}
    rows = judge.shape_times(figs, "c.ext.gen_x", best)
    assert [(r.eager_s, r.best_s, r.best_impl, r.speedup_eager) for r in rows] == \
        [(4e-4, 5e-5, "c.avx2", 4.0), (None, None, None, None)]
    assert rows[0].ceiling_s == pytest.approx(0.25 * 1e-4)


def test_write_candidate_is_content_addressed(home: Path) -> None:
    a = judge.write_candidate("rmsnorm", "c", "int x;\n")
    assert a == judge.write_candidate("rmsnorm", "c", "int x;\n")
    assert a != judge.write_candidate("rmsnorm", "c", "int y;\n")
    assert a.suffix == ".c" and str(a).startswith(os.environ["STRATA_HOME"])
    assert judge.write_candidate("rmsnorm", "triton", "x = 1\n").suffix == ".py"
