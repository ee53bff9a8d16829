"""The text a model reads after each turn: what the lab found, in the lab's own numbers.

One function per kind of finding. The texts quote the verifier (reason, message, the
first mismatches with shape and seed, the compiler's own lines) rather than paraphrase
it, and never show this host's paths: the private copy's path is replaced by the file
name the model would recognise (kernel.c, kernel.py, kernel.cu).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from strata.kernels.verify import Verdict

MAX_COMPILER_LINES = 40
MAX_LINE = 240
_MISMATCH = re.compile(r"^(?P<index>\[[\d,]*\]): got (?P<got>\S+), expected (?P<want>\S+)$")


@dataclass
class ShapeTime:
    """One benchmarked shape: the candidate against eager, the best verified kernel and
    the roofline ceiling (seconds; None where not known)."""

    shape: dict[str, int]
    seconds: float
    eager_s: float | None = None
    best_s: float | None = None
    best_impl: str | None = None
    ceiling_s: float | None = None
    speedup_eager: float | None = None  # the benchmark's figure (re-checked above 10x)
    noisy: bool = False  # eager's time stayed noisy: this shape does not count


def shown_name(source: Path | None) -> str:
    return "kernel" + (source.suffix if source is not None else "")


def _scrub(text: str, source: Path | None) -> str:
    """The private copy's path (and its directory) out of a message."""
    if source is None:
        return text
    text = text.replace(str(source), shown_name(source)).replace(str(source.parent) + "/", "")
    return text.replace(source.name, shown_name(source))


def _lines(verdict: Verdict, limit: int) -> list[str]:
    src = verdict.impl.source
    return [_scrub(line, src)[:MAX_LINE] for line in verdict.details[:limit]]


def format_feedback(problem: str, op: str, dialect: str, entry: str) -> str:
    return (f"Your reply could not be used: {problem}.\n"
            f"Reply with one fenced code block that defines {entry} (op {op}, dialect "
            f"{dialect}); its first line is the declaration\n"
            f"strata-kernel: op={op} dialect={dialect} entry={entry}")


def static_feedback(verdict: Verdict) -> str:
    head = _scrub(verdict.message, verdict.impl.source).removeprefix("refused before loading: ")
    rest = "\n".join(f"- {line}" for line in _lines(verdict, 8))
    return (f"Refused before it ran: {head}\n{rest}\n"
            "A kernel computes the op itself: no vendor or torch calls, no threads other than "
            "OpenMP, no files, processes, timers, network or inline assembly.").strip()


def compile_feedback(verdict: Verdict) -> str:
    """The compiler's own lines (first error first), trimmed."""
    lines = _lines(verdict, MAX_COMPILER_LINES) or [_scrub(verdict.message,
                                                           verdict.impl.source)]
    return "It did not compile. The compiler said:\n" + "\n".join(lines)


def runtime_feedback(verdict: Verdict) -> str:
    where = f" ({verdict.where})" if verdict.where else ""
    text = f"It failed when run{where}: {verdict.reason or 'error'}: " + \
        _scrub(verdict.message, verdict.impl.source)
    more = _lines(verdict, 8)
    return text + ("\n" + "\n".join(more) if more else "")


def _rel_errors(details: list[str]) -> list[float]:
    out = []
    for line in details:
        m = _MISMATCH.match(line.strip())
        if not m:
            continue
        try:
            got, want = float(m.group("got")), float(m.group("want"))
        except ValueError:
            continue
        if math.isfinite(got) and math.isfinite(want) and want != 0.0:
            out.append(abs(got - want) / abs(want))
    return out


def mismatch_feedback(verdict: Verdict) -> str:
    """Where (dtype, shape, seed), the verifier's summary, the first wrong elements and
    their relative error."""
    where = f" at {verdict.where}" if verdict.where else ""
    lines = [f"Wrong result{where}: {verdict.reason}: {verdict.message}"]
    shown = verdict.details[:8]
    if shown:
        lines.append("First mismatches (index: got, expected):")
        lines += [f"  {d}" for d in shown]
    rel = _rel_errors(shown)
    if rel:
        lines.append(f"Max relative error among these: {max(rel):.3g}")
    return "\n".join(lines)


def _us(seconds: float | None) -> str:
    """Three significant digits in the unit that keeps them readable (no exponents)."""
    if seconds is None:
        return "?"
    for scale, unit in ((1e-6, "ns"), (1e-3, "µs"), (1.0, "ms")):
        if abs(seconds) < scale:
            return f"{_sig3(seconds * 1e3 / scale)} {unit}"
    return f"{_sig3(seconds)} s"


def _sig3(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def _shape(shape: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


def timing_feedback(status: str, rows: list[ShapeTime], note: str = "") -> str:
    """Per shape: the candidate's median, and the ratio to eager, the best verified kernel
    and the roofline ceiling (share > 1 would be beyond physics; the judge refuses it)."""
    if not rows:
        return ("Correct on every verification case. " + (note or "Not timed.")).strip()
    head = ("Correct, but slower than torch eager." if status == "slow" else
            "Correct and faster than torch eager.")
    lines = [head, "Median times at the benchmark shapes (cold caches):"]
    for r in rows:
        parts = [f"{_shape(r.shape)}: {_us(r.seconds)}"]
        if r.eager_s and r.speedup_eager:
            noisy = ", noisy: not counted" if r.noisy else ""
            parts.append(f"torch eager {_us(r.eager_s)} (speedup {r.speedup_eager:.2f}x{noisy})")
        if r.best_s:
            parts.append(f"best verified kernel {r.best_impl} {_us(r.best_s)} "
                         f"(speedup {r.best_s / r.seconds:.2f}x)")
        if r.ceiling_s:
            parts.append(f"roofline ceiling {_us(r.ceiling_s)} "
                         f"({r.ceiling_s / r.seconds:.1%} of it reached)")
        lines.append("- " + "; ".join(parts))
    if note:
        lines.append(note)
    lines.append("Make it faster if you can, keeping it correct.")
    return "\n".join(lines)


def implausible_feedback(problem: str) -> str:
    return (f"Refused at the benchmark: {problem}. Timed calls get new inputs in reused "
            "buffers and their outputs are checked; a kernel must do all of its work on "
            "every call.")
