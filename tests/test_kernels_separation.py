"""The judge and the kernel live in different processes (issue "Trust the judge (3)"): one
cheat per class that won against a judge sharing the kernel's process (see each fixture's
header for how it won), each refused now, and no file appears outside the sandbox.

- patches_judge.c: native code finds dlsym through libc's ELF tables and rebinds the judge's
  Python functions in its own process — the judge is not there;
- alias_launcher.py: a Triton launcher behind `import torch as tl` patches the judge from
  Python — same;
- forges_done.c: writes forged "done" replies to every descriptor and computes nothing —
  the judge reads the output itself;
- forges_result.c: looked for the result marker to print a forged verdict — there is none
  (its verdict is the judge's: it computes right, so it passes);
- after_return.c: keeps an OpenMP team computing after "done" — the worker sees the calling
  thread still inside the region it opened (omp_get_level) right after each call, which does
  not race the team the way sampling outputs or the worker's idle CPU does (a team that
  finished before the judge looked once passed a loaded CI host);
- span_cache.c: answers from the span of cached results of a small input basis — inputs are
  OS-random windows of generated pools now;
- ignore_index.c: clamps an out-of-range target (ignore_index, padding) into [0, V) — the
  op's clause cases put such targets in every verification;
- wide_rows.c: wrong only above the verified row counts — verified at the serve shapes, and
  dispatch serves only what was verified (else verifies on demand or falls back);
- window_capped.c: an attention_window right only for windows up to 100 — the window is a
  value in pos that dispatch reads from each call, verified on demand where it is new.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import pytest

from strata.kernels import checks
from strata.kernels.impl import Implementation, from_source
from strata.kernels.verify import Verdict, VerifyContext, verify_many
from tests.conftest import FIXTURES

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow

ADVERSARIAL = FIXTURES / "kernels" / "adversarial"
ESCAPES = "/tmp/strata_escape_*"

# fixture -> reasons it may be refused with (static checks off: the runtime must hold)
REFUSED = {
    # the output is left as the judge filled it
    "patches_judge.c": {checks.NAN_PARITY, checks.WRONG_RESULT, checks.CRASHED},
    "alias_launcher.py": {checks.NAN_PARITY, checks.WRONG_RESULT, checks.CRASHED},
    # its writes reach the worker's descriptors of the shared buffers too: canaries or NaN
    "forges_done.c": {checks.NAN_PARITY, checks.WRONG_RESULT, checks.OUT_OF_BOUNDS,
                      checks.MODIFIED_INPUTS, checks.CRASHED},
}


def _external(name: str) -> Implementation:
    return from_source(ADVERSARIAL / name, origin="external")


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Verdict]:
    from strata.kernels.service import session
    from strata.store import open_db

    for leftover in glob.glob(ESCAPES):
        os.remove(leftover)
    home = tmp_path_factory.mktemp("separation-home")
    old = os.environ.get("STRATA_HOME")
    os.environ["STRATA_HOME"] = str(home)
    try:
        s = session(conn=open_db(home / "strata.db"))
        names = [*REFUSED, "forges_result.c", "ignore_index.c"]
        ctx = VerifyContext(s.conn, s.fingerprint, s.caps, static=False)
        verdicts = verify_many([_external(n) for n in names], ctx, jobs=2)
    finally:
        if old is None:
            os.environ.pop("STRATA_HOME", None)
        else:
            os.environ["STRATA_HOME"] = old
    return dict(zip(names, verdicts, strict=True))


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_kernel_that_takes_over_its_process_cannot_reach_the_verdict(
        name: str, judged: dict[str, Verdict]) -> None:
    if name.endswith(".py"):
        pytest.importorskip("triton")
    v = judged[name]
    assert v.status == "fail", v.to_dict()
    assert v.reason in REFUSED[name], v.to_dict()
    assert glob.glob(ESCAPES) == []


def test_the_result_line_forger_gets_the_judges_own_verdict(
        judged: dict[str, Verdict]) -> None:
    v = judged["forges_result.c"]
    # no marker exists anywhere for it to find; it falls back to computing honestly
    assert v.status == "pass" and v.cases > 0 and v.max_rel_err is not None, v.to_dict()
    assert v.max_rel_err < 1e-4


def _bench(kernel_session: Any, op: str, cheat: Implementation,
           shapes: str = "figure") -> list[Any]:
    from strata.kernels.bench import BenchContext, BenchSettings, bench_op
    from strata.kernels.sandbox import SandboxPolicy

    s = kernel_session
    vctx = VerifyContext(s.conn, s.fingerprint, s.caps, static=False)
    settings = BenchSettings(shapes=shapes, compile=False, max_time_s=0.1, min_reps=3,
                             max_reps=30)
    figures = bench_op(op, [cheat], BenchContext(vctx, None, settings,
                                                 SandboxPolicy(timeout_s=600), 1))
    return [f for f in figures if f.impl == cheat.name]


def test_work_after_return_is_seen_and_disqualified(kernel_session: Any) -> None:
    """Its serve shapes are large enough to go async, and verification calls each case
    several times: the first call that leaves its team open fails it, and the reason is the
    open region whatever the host's load (no race with the team). The worker joined the team
    before replying, so nothing wrote into the judge's buffers afterwards (no crash)."""
    s = kernel_session
    cheat = _external("after_return.c")
    verdict = verify_many([cheat], VerifyContext(s.conn, s.fingerprint, s.caps,
                                                 static=False))[0]
    assert verdict.status == "fail" and verdict.reason == checks.LEFT_THREAD, verdict.to_dict()
    assert "OpenMP parallel region" in verdict.message, verdict.to_dict()
    # the benchmark verifies first: it never times it
    assert all(f.median_s is None for f in _bench(kernel_session, "silu_mul", cheat))


def test_span_caching_finds_no_span_to_answer_from(kernel_session: Any) -> None:
    """Inputs are windows at OS-random offsets of generated pools, floating ones mixed with
    random factors: no x is a combination of a few cached ones, so the kernel computes (or
    is wrong). Its timed outputs are right, and no figure beats its honest compute."""
    from strata.kernels import buffers
    from strata.kernels.shm import Arena
    from strata.kernels.spec import get_spec

    spec = get_spec("matvec_q8_0")
    shape = spec.shapes["figure"][0]
    stream = buffers.InputStream(spec, shape, "float32", Arena(), slots_n=1)
    xs = torch.stack([stream.refresh(0).inputs[1].reshape(-1).clone() for _ in range(12)])
    # twelve fresh x's span twelve dimensions (a mix of 4 pool sets spanned at most 4)
    assert int(torch.linalg.matrix_rank(xs.double())) == 12
    ws = {bytes(stream.refresh(0).inputs[0].reshape(-1)[:4096].numpy()) for _ in range(8)}
    assert len(ws) == 8  # quantised weights are windows too, never one of a few fixed sets
    timed = _bench(kernel_session, "matvec_q8_0", _external("span_cache.c"))
    assert timed
    for f in timed:
        assert f.disqualified or (f.note == "" and f.median_s is not None), f.to_dict()


def test_a_kernel_wrong_above_the_verified_rows_is_not_served_there(
        kernel_session: Any) -> None:
    """wide_rows.c is right up to 64 rows. The op's serve shapes (the rows the lab and
    training run) are part of an external kernel's verification; and a call outside what
    was verified is verified on demand, or served by the vendor path."""
    from strata.kernels import Choice
    from strata.kernels.dispatch import Decision
    from strata.kernels.spec import get_spec

    s = kernel_session
    impl = _external("wide_rows.c")
    spec = get_spec("rmsnorm")
    serve = spec.shapes.get("serve", [])
    verdict = verify_many([impl], VerifyContext(s.conn, s.fingerprint, s.caps, static=False))[0]
    assert any(sh["rows"] > 64 for sh in serve), serve
    assert verdict.status == "fail" and verdict.reason == checks.WRONG_RESULT, verdict.message
    # served as if it had won at 1..8 rows: a 512-row call is verified on demand first
    decision = Decision("rmsnorm", "cpu", "kernel", impl, coverage={"rows": (1, 8),
                        "cols": (1, 4096)}, confined=True)
    choice = Choice(decision, spec, caps=s.caps, host=s)
    x, w = spec.make_inputs({"rows": 512, "cols": 256}, "float32", 0, "cpu")
    out = torch.empty(512, 256)
    choice(out, x, w, eps=1e-6)
    assert (out - spec.reference(x, w, 1e-6)).abs().max() < 1e-4  # the vendor path served
    reasons = [t.reason for t in decision.trace if t.verdict == "verified on demand"]
    assert reasons and "rows=512" in reasons[0] and "fail" in reasons[0], decision.trace
    choice.close()
    assert glob.glob(ESCAPES) == []


def test_a_window_outside_the_verified_ones_is_verified_on_demand(kernel_session: Any) -> None:
    """window_capped.c is right for windows up to 100. The window is a value in pos (P and W
    are dims read from the call), so dispatch's coverage holds it like any shape: a kernel
    served as if it had been verified at windows 1..64 meets a 512-position window (Gemma
    3's) verified on demand there, fails, and the vendor path serves the call."""
    from strata.kernels import Choice
    from strata.kernels.dispatch import Decision
    from strata.kernels.spec import get_spec

    s = kernel_session
    spec = get_spec("attention_window")
    verdict = verify_many([_external("window_capped.c")],
                          VerifyContext(s.conn, s.fingerprint, s.caps, static=False))[0]
    assert verdict.status == "fail" and verdict.reason == checks.WRONG_RESULT  # W=512 shapes
    coverage = {"H": (1, 8), "Hkv": (1, 8), "T": (1, 128), "P": (0, 4096), "C": (1, 4096),
                "D": (1, 256), "W": (1, 64)}
    decision = Decision("attention_window", "cpu", "kernel", _external("window_capped.c"),
                        coverage=coverage, confined=True)
    choice = Choice(decision, spec, caps=s.caps, host=s)
    shape = {"H": 2, "Hkv": 1, "T": 1, "P": 600, "C": 601, "D": 16, "W": 512}
    inputs = spec.make_inputs(shape, "float32", 0, "cpu")
    out = torch.empty(2, 1, 16)
    choice(out, *inputs, scale=0.25)
    want = spec.reference(*inputs, 0.25)
    assert (out - want).abs().max() < 1e-4  # the vendor path served, not the capped window
    reasons = [t.reason for t in decision.trace if t.verdict == "verified on demand"]
    assert reasons and "W=512" in reasons[0] and "fail" in reasons[0], decision.trace
    choice.close()


def test_a_kernel_that_ignores_an_abi_clause_fails_naming_the_clause(
        judged: dict[str, Verdict]) -> None:
    v = judged["ignore_index.c"]
    assert v.status == "fail" and v.reason == checks.WRONG_RESULT, (v.reason, v.message)
    assert "clause ignore_index" in v.message and "target outside [0, V)" in v.message


def test_escape_fixtures_leave_no_file(judged: dict[str, Verdict]) -> None:
    assert judged
    assert glob.glob(ESCAPES) == []
    assert not Path("/tmp/strata_escape_elf_lookup").exists()
