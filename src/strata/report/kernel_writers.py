"""The report's "Models as kernel writers" section: `strata kernels eval` and `generate`
attempts of this host, scored by strata.kernels.gen.metrics (the same numbers as the CLI)."""

from __future__ import annotations

from strata.kernels.gen.metrics import BASELINES, FAST_PS, fast_key, score
from strata.report.data import ReportData
from strata.report.html import Section, empty, fmt, note, table


def _pct(v: float | None) -> str | None:
    return None if v is None else f"{v:.0%}"


def kernel_writers_section(data: ReportData) -> Section:
    title = "Models as kernel writers"
    if not data.attempts:
        return Section("kernel-writers", title,
                       empty("no model-written kernels yet",
                             "strata kernels eval --endpoint URL"), False)
    scores = score(data.attempts)
    ks = sorted({k for s in scores for k in s.pass_at})
    fast = [(b, p) for b in BASELINES for p in FAST_PS]
    heads = ["model", "dialect", "samples", "compile", "correct", *(f"pass@{k}" for k in ks),
             *(fast_key(b, p) for b, p in fast), "x eager (geomean)", "coverage",
             "turns to correct", "tokens / correct", "cheats caught"]
    rows = [[s.model, s.dialect + (f" +{s.skill}" if s.skill else ""),
             f"{s.samples} ({s.ops} ops)", _pct(s.compile_rate), _pct(s.correct_rate),
             *(_pct(s.pass_at.get(k)) for k in ks), *(_pct(s.fast[fast_key(b, p)])
                                                     for b, p in fast),
             fmt(s.geomean_speedup, ".2f", "x"), _pct(s.coverage),
             fmt(s.turns_to_first_correct, ".1f"), fmt(s.tokens_per_correct, ",.0f"),
             f"{s.cheats} ({s.cheat_rate:.0%})"] for s in scores]
    runs = sorted({a.run for a in data.attempts})
    body = table(heads, rows, cls="num") + note(
        f"{len(data.attempts)} attempts in {len(runs)} runs; every kernel verified and timed "
        "on this host (metric definitions: strata kernels eval --help)")
    return Section("kernel-writers", title, body, True)
