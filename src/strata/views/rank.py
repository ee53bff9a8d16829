"""`strata rank` tables: one per profile, best first, with the verdict and where each
figure came from (measured now, reused from the DB, or predicted)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from strata.rank.ranking import Entry, RankOutcome, pareto
from strata.views.console import plain

VERDICT_STYLE = {"usable": "green", "marginal": "yellow", "unusable": "red"}
RANK_COLUMNS = ("profile", "rank", "model_filename", "backend", "score", "verdict",
                "prefill_ts", "decode_ts", "ttft_ms", "basis")


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def profile_table(entries: list[Entry], with_quality: bool) -> Table:
    p = entries[0].profile
    t = Table(title=f"{p.name}: {p.description}", title_justify="left")
    cols = ["#", "model", "backend", "score", "verdict", "prompt t/s", "gen t/s", "TTFT s",
            "basis"] + (["PPL"] if with_quality else [])
    for c in cols:
        t.add_column(c, justify="right" if c in ("#", "score", "prompt t/s", "gen t/s",
                                                  "TTFT s", "PPL") else "left")
    for i, e in enumerate(entries):
        r = e.record(i + 1)
        shown = e.score is not None and e.basis != "predicted"
        verdict = Text(e.verdict or "-", style=VERDICT_STYLE.get(e.verdict or "", "dim"))
        ttft = "-" if r["ttft_ms"] is None else f"{r['ttft_ms'] / 1e3:,.2f}"
        basis = e.basis if not e.note else f"{e.basis} ({e.note})"
        row = [str(i + 1) if shown else "-", plain(e.candidate.ref), plain(e.candidate.backend),
               _num(e.score, ",.0f"), verdict, _num(r["prefill_ts"], ",.1f"),
               _num(r["decode_ts"], ",.1f"), ttft, plain(basis)]
        if with_quality:
            row.append(_num(e.ppl, ",.3f"))
        t.add_row(*row)
    return t


def summary_lines(outcome: RankOutcome, with_quality: bool) -> list[str]:
    lines = [f"results: {outcome.measured} test(s) measured now, {outcome.reused} reused from "
             f"the database (same host, software and config); budget "
             f"{outcome.budget_s / 60:.1f} min, {outcome.spent_s / 60:.1f} min spent"]
    lines += [f"cut (time budget): {what}: {why}" for what, why in outcome.cut]
    lines += [f"skipped {what}: {why}" for what, why in outcome.skipped]
    if with_quality:
        for name, entries in outcome.entries.items():
            front = pareto(entries)
            if front:
                lines.append(f"{name}: quality/speed frontier (no other model is both faster "
                             f"and lower in perplexity): "
                             + ", ".join(e.candidate.ref for e in front))
    lines.append("score = 100 x geometric mean of (prompt t/s / target, gen t/s / target, "
                 "target TTFT / TTFT); 100 = on target (strata rank --help)")
    return lines


def rank_compare_table(rows: list[dict], label_a: str, label_b: str) -> Table:
    """`strata compare rank:A rank:B`: one row per profile and model both scored."""
    t = Table(title=plain(f"B = {label_b} vs A = {label_a} (ratio = score B / score A)"),
              title_justify="left")
    for col in ("profile", "model", "backend", "score A", "score B", "ratio", "verdict A/B"):
        t.add_column(col, justify="right" if col.startswith(("score", "ratio")) else "left")
    for r in rows:
        t.add_row(plain(r["profile"]), plain(r["model_filename"]), plain(r["backend"]),
                  f"{r['score_a']:,.0f}", f"{r['score_b']:,.0f}", f"{r['ratio']:.2f}x",
                  plain(f"{r['verdict_a']} / {r['verdict_b']}"))
    return t
