"""One candidate kernel through the door every external kernel takes (`strata kernels add`:
static check, link check, sandboxed verification, benchmark at the `llm` shapes), and the
lab's verdict turned into a status class, a cheat flag and the next turn's feedback.

Status classes (records.STATUSES), by the verifier's reason code (kernels/checks.py):

| reason                                                | status      | cheat |
|-------------------------------------------------------|-------------|-------|
| extraction problem; a declaration from_source refuses | format      | no    |
| static_check: a forbidden construct                   | static      | yes   |
| static_check: only Python syntax errors               | compile     | no    |
| forbidden_link                                        | static      | yes   |
| unavailable (requires what this host lacks)           | static      | no    |
| build_failed                                          | compile     | no    |
| not_run (compiles; no device here to run it)          | runtime     | no    |
| crashed, timeout                                      | runtime     | no    |
| sandbox_violation, left_thread, async_write,          | runtime     | yes   |
|   patched_timer, calls_torch_op, out_of_bounds_write  |             |       |
| wrong_result, nan_parity, nondeterministic, data_race | mismatch    | no    |
| modified_inputs, reads_output_buffer,                 | mismatch    | yes   |
|   constant_output, input_independent                  |             |       |
| implausible (faster than the roofline allows),        | implausible | yes   |
|   wrong_when_timed, recheck_failed (benchmark)        |             |       |
| correct, slower than torch eager                      | slow        | no    |
| correct, not slower than eager (or untimed)           | ok          | no    |

A reason the table does not know is a runtime failure, not a cheat.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.errors import InputError, StrataError
from strata.kernels import checks, plausibility
from strata.kernels.gen import feedback as fb
from strata.kernels.gen.records import Timing, code_hash
from strata.kernels.impl import Implementation
from strata.kernels.verify import Verdict

FORMAT, STATIC, COMPILE, RUNTIME, MISMATCH, IMPLAUSIBLE, SLOW, OK = (
    "format", "static", "compile", "runtime", "mismatch", "implausible", "slow", "ok")
DECLARATION = "declaration"  # from_source refused the declaration (e.g. requires=)
UNAVAILABLE, NOT_RUN = "unavailable", "not_run"
WRONG_WHEN_TIMED, RECHECK_FAILED = "wrong_when_timed", "recheck_failed"

STATUS_OF: dict[str, str] = {
    checks.STATIC_CHECK: STATIC, checks.FORBIDDEN_LINK: STATIC, UNAVAILABLE: STATIC,
    checks.BUILD_FAILED: COMPILE,
    NOT_RUN: RUNTIME, checks.CRASHED: RUNTIME, checks.TIMEOUT: RUNTIME,
    checks.SANDBOX_VIOLATION: RUNTIME, checks.LEFT_THREAD: RUNTIME,
    checks.ASYNC_WRITE: RUNTIME, checks.PATCHED_TIMER: RUNTIME, checks.CALLS_TORCH: RUNTIME,
    checks.OUT_OF_BOUNDS: RUNTIME,
    checks.WRONG_RESULT: MISMATCH, checks.NAN_PARITY: MISMATCH,
    checks.NONDETERMINISTIC: MISMATCH, checks.DATA_RACE: MISMATCH,
    checks.MODIFIED_INPUTS: MISMATCH, checks.READS_OUTPUT: MISMATCH,
    checks.CONSTANT_OUTPUT: MISMATCH, checks.INPUT_INDEPENDENT: MISMATCH,
    plausibility.IMPLAUSIBLE: IMPLAUSIBLE, WRONG_WHEN_TIMED: IMPLAUSIBLE,
    RECHECK_FAILED: IMPLAUSIBLE,
}
# A guard fired: the kernel did what no honest kernel needs to (escape, tamper, skip work).
CHEAT_REASONS = frozenset({
    checks.STATIC_CHECK, checks.FORBIDDEN_LINK, checks.SANDBOX_VIOLATION, checks.LEFT_THREAD,
    checks.ASYNC_WRITE, checks.PATCHED_TIMER, checks.CALLS_TORCH, checks.OUT_OF_BOUNDS,
    checks.MODIFIED_INPUTS, checks.READS_OUTPUT, checks.CONSTANT_OUTPUT,
    checks.INPUT_INDEPENDENT, plausibility.IMPLAUSIBLE, WRONG_WHEN_TIMED, RECHECK_FAILED})
SUFFIX = {"c": ".c", "cuda": ".cu", "triton": ".py"}


@dataclass
class Judgement:
    status: str  # one of records.STATUSES
    reason: str  # reason code (checks.*, or this module's), "" for ok/slow
    cheat: bool
    feedback: str  # the next turn's user text
    timing: Timing = field(default_factory=Timing)
    verdict: Verdict | None = None
    figures: list = field(default_factory=list)  # bench.Figure, eager's included
    impl: Implementation | None = None  # the private copy that was verified
    shapes: list[fb.ShapeTime] = field(default_factory=list)

    @property
    def correct(self) -> bool:
        return self.status in (SLOW, OK)


def classify(reason: str | None, details: list[str] | None = None) -> tuple[str, bool]:
    """(status, cheat) of a failure's reason code; see the module's table."""
    code = reason or ""
    if code == checks.STATIC_CHECK and details and \
            all("syntax error" in d for d in details):
        return COMPILE, False  # a Python file that does not parse: a build error, not a cheat
    return STATUS_OF.get(code, RUNTIME), code in CHEAT_REASONS


def write_candidate(op: str, dialect: str, code: str) -> Path:
    """The candidate as a private file named by its hash (the same code is the same file)."""
    from strata.paths import cache_dir, publish

    if dialect not in SUFFIX:
        raise InputError(f"--dialect {dialect}: no generated kernels for it (choose from "
                         f"{', '.join(SUFFIX)})")
    folder = cache_dir() / "kernels" / "generated" / op
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"gen_{code_hash(code)}{SUFFIX[dialect]}"
    if not path.exists():  # samples often write the same code at once: never half a file
        publish(path, code.encode("utf-8"))
    return path


def _from_verdict(verdict: Verdict) -> Judgement:
    if verdict.status == "unavailable":
        reason, status, cheat = UNAVAILABLE, STATIC, False
        text = f"It cannot run on this host: {verdict.message}. Declare only what it has."
        return Judgement(status, reason, cheat, text, verdict=verdict, impl=verdict.impl)
    if verdict.status == "compiled":
        return Judgement(RUNTIME, NOT_RUN, False, "It compiles, but this host has no device "
                         "to run it on: not verified.", verdict=verdict, impl=verdict.impl)
    status, cheat = classify(verdict.reason, verdict.details)
    text = {STATIC: fb.static_feedback, COMPILE: fb.compile_feedback,
            MISMATCH: fb.mismatch_feedback}.get(status, fb.runtime_feedback)(verdict)
    return Judgement(status, verdict.reason or "error", cheat, text, verdict=verdict,
                     impl=verdict.impl)


def judge_candidate(session: Any, op: str, dialect: str, device: str, code: str,
                    roofline: Any, *, timeout_s: float = 120.0, bench: bool = True,
                    max_time_s: float = 0.2, shapes: str = "llm",
                    progress: Callable[[str], None] = lambda _m: None) -> Judgement:
    """Verify (and, when correct and `bench`, benchmark) one extracted candidate. `device`
    is where the caller wants it to run; the verdict names where it ran."""
    from strata.kernels.service import add_external, run_bench, run_verify

    path = write_candidate(op, dialect, code)
    try:
        impl = add_external(session, path)
    except InputError as exc:  # e.g. requires= names no known feature
        return Judgement(FORMAT, DECLARATION, False, f"The declaration was refused: {exc}")
    verdict = run_verify(session, [impl], force=False, timeout_s=timeout_s,
                         progress=progress, jobs=1)[0]
    if not verdict.passed:
        return _from_verdict(verdict)
    judged = Judgement(OK, "", False, "", verdict=verdict, impl=impl)
    if not bench:
        judged.feedback = fb.timing_feedback(OK, [], "Not timed in this run.")
        return judged
    judged.figures = run_bench(session, [impl], roofline, shapes=shapes, compile_=False,
                               max_time_s=max_time_s, progress=progress)
    _judge_figures(session, judged, verdict.device or device)
    return judged


def _judge_figures(session: Any, judged: Judgement, device: str) -> None:
    impl = judged.impl
    assert impl is not None
    mine = [f for f in judged.figures if f.impl == impl.name]
    refused = figure_problem(mine)
    if refused is not None:
        judged.reason, problem = refused
        judged.status, judged.cheat = classify(judged.reason)
        judged.feedback = fb.implausible_feedback(problem) if judged.status == IMPLAUSIBLE \
            else f"Verified, then wrong at a benchmark shape: {problem}"
        return
    judged.shapes = shape_times(judged.figures, impl.name,
                                best_verified(session, impl.op, device, impl.name))
    judged.timing = timing_of(judged.shapes)
    untimed = next((f.note for f in mine if f.median_s is None and f.note), "")
    judged.status = status_of(judged.timing)
    judged.feedback = fb.timing_feedback(judged.status, judged.shapes,
                                         f"Not timed: {untimed}" if untimed else "")


def figure_problem(figures: list) -> tuple[str, str] | None:
    """(reason code, text) when a benchmark figure disqualifies the candidate, else None:
    wrong at a benchmarked shape (on the first, guarded call: its own reason; on a timed
    call or the > 10x re-check: skipped work), or faster than the roofline allows."""
    from strata.kernels.bench import WRONG_AT_SHAPE

    for fig in figures:
        shape = " ".join(f"{k}={v}" for k, v in fig.shape.items())
        for flag in fig.flags:
            if flag.startswith(plausibility.IMPLAUSIBLE):
                return plausibility.IMPLAUSIBLE, f"{flag} (shape {shape})"
            if flag.startswith(WRONG_AT_SHAPE) and "re-check" in flag:
                return RECHECK_FAILED, f"{flag} (shape {shape})"
            if flag.startswith(WRONG_AT_SHAPE):
                return _wrong_reason(fig.note), f"{fig.note} (shape {shape})"
        code = _note_reason(fig.note)
        if fig.median_s is None and code in STATUS_OF:  # the benchmark job itself failed
            return code, f"{fig.note} (shape {shape})"
    return None


def _note_reason(note: str) -> str:
    return note.split(":", 1)[0].strip() if ":" in note else ""


def _wrong_reason(note: str) -> str:
    if note.startswith("timed call #"):  # the first call was right: work skipped when timed
        return WRONG_WHEN_TIMED
    return _note_reason(note) if _note_reason(note) in STATUS_OF else checks.WRONG_RESULT


def best_verified(session: Any, op: str, device: str, exclude: str) -> \
        dict[str, tuple[str, float]]:
    """Shape key -> (implementation, median seconds) of the fastest other kernel whose
    latest stored benchmark on this host is clean (a benchmarked kernel was verified)."""
    from strata.kernels.dispatch import speed_of
    from strata.kernels.registry import implementations
    from strata.store.kernels import latest_bench

    best: dict[str, tuple[str, float]] = {}
    for impl in implementations(op, session.conn):
        if impl.name == exclude or impl.source is None:
            continue
        rows = latest_bench(session.conn, session.fingerprint, op, impl.name,
                            impl.content_hash(), device)
        if not rows or speed_of(rows).problem:
            continue
        for r in rows:
            t = r.data.get("median_s")
            key = _key(r.shape or {})
            if t and r.data.get("cache", "cold") == "cold" and (key not in best or
                                                                t < best[key][1]):
                best[key] = (impl.name, float(t))
    return best


def _key(shape: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(shape.items()))


def shape_times(figures: list, name: str, best: dict[str, tuple[str, float]]) -> \
        list[fb.ShapeTime]:
    from strata.kernels.registry import EAGER

    eager = {_key(f.shape): f.median_s for f in figures if f.impl == EAGER}
    rows = []
    for f in figures:
        if f.impl != name or f.median_s is None:
            continue
        # ceiling / time = the larger of the bandwidth and FLOP/s fractions of the peaks
        share = max((x for x in (f.frac_bw, f.frac_flops) if x is not None), default=None)
        other = best.get(_key(f.shape))
        noisy = any(x.startswith(plausibility.NOISY_BASELINE) for x in f.flags)
        rows.append(fb.ShapeTime(f.shape, f.median_s, eager.get(_key(f.shape)),
                                 other[1] if other else None, other[0] if other else None,
                                 share * f.median_s if share else None, f.speedup_eager,
                                 noisy))
    return rows


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def timing_of(rows: list[fb.ShapeTime]) -> Timing:
    """Geometric means over the shapes that count (a noisy eager time does not count for
    the speedup over eager, as in dispatch); `seconds` at the largest shape."""
    if not rows:
        return Timing()
    largest = max(rows, key=lambda r: math.prod(r.shape.values()))
    return Timing(
        speedup_eager=_geomean([r.speedup_eager for r in rows
                                if r.speedup_eager and not r.noisy]),
        speedup_best=_geomean([r.best_s / r.seconds for r in rows if r.best_s]),
        roofline_share=_geomean([r.ceiling_s / r.seconds for r in rows if r.ceiling_s]),
        seconds=largest.seconds)


def status_of(timing: Timing) -> str:
    """Correct: slow when measurably slower than torch eager, else ok (untimed included)."""
    fast = timing.speedup_eager
    return SLOW if fast is not None and fast < 1.0 else OK


def register_candidate(session: Any, op: str, dialect: str, code: str, *,
                       timeout_s: float = 120.0,
                       progress: Callable[[str], None] = lambda _m: None) -> Implementation:
    """Register a candidate for dispatch exactly as `strata kernels add` does: only if it
    verifies (the verdict is usually cached from judging it)."""
    from strata.kernels.service import add_kernel

    outcome = add_kernel(session, write_candidate(op, dialect, code), timeout_s=timeout_s,
                         progress=progress)
    if not outcome.registered:
        raise StrataError(f"{outcome.impl.key}: not registered, it did not verify "
                          f"({outcome.verdict.reason}: {outcome.verdict.message})")
    return outcome.impl


def judge_reply(session: Any, reply: str, op: str, dialect: str, device: str,
                roofline: Any, entry: str | None = None, **kw: Any) -> tuple[Judgement,
                                                                              str | None]:
    """Extraction then judgement: (judgement, extracted code or None)."""
    from strata.kernels.gen.extract import default_entry, extract_code

    entry = entry or default_entry(op, dialect)
    got = extract_code(reply, op, dialect, entry)
    if got.code is None:
        return Judgement(FORMAT, got.problem, False,
                         fb.format_feedback(got.problem, op, dialect, entry)), None
    return judge_candidate(session, op, dialect, device, got.code, roofline, **kw), got.code
