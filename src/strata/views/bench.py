"""Terminal table of bench results: model, backend, swept settings, test, t/s ± SD, η, bound.

One sample has no SD: its t/s prints alone, n shows 1. A result whose SD is larger than its
mean is marked "!" (the runner stores a note saying so with the result)."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from strata.bench.explain import eta_text
from strata.bench.records import setting_text, swept
from strata.views.console import plain


def _eta(value: float | None) -> Text:
    if value is None:
        return Text("-", style="dim")
    style = "red" if value < 0.4 or value > 1.05 else ("yellow" if value < 0.6 else "green")
    return Text(eta_text(value), style=style)


def noisy(r: dict[str, Any]) -> bool:
    """A result whose samples spread wider than their mean: the mean alone misleads."""
    mean, sd = r.get("avg_ts"), r.get("stddev_ts")
    return bool(mean is not None and sd is not None and (r.get("n") or 0) > 1 and sd > mean)


def _tps(r: dict[str, Any]) -> Text:
    """Mean ± SD; one sample has no SD (never "± 0.00"); "!" marks an SD above the mean."""
    if r["avg_ts"] is None:
        return Text("-", style="dim")
    if (r.get("n") or 0) < 2 or r.get("stddev_ts") is None:
        return Text(f"{r['avg_ts']:,.2f}")
    text = f"{r['avg_ts']:,.2f} ± {r['stddev_ts']:,.2f}"
    return Text(f"{text} !", style="red") if noisy(r) else Text(text)


def bench_table(records: list[dict[str, Any]], title: str = "strata bench") -> Table:
    settings = swept(records)  # same rule as md and the HTML report
    t = Table(title=title, title_justify="left")
    for col, just in (("model", "left"), ("backend", "left"),
                      *((header, "right") for _, header in settings), ("test", "left"),
                      ("t/s", "right"), ("n", "right"), ("ceiling t/s", "right"),
                      ("η", "right"), ("bound", "left"), ("TTFT ms", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in records:
        ceiling = r["ceiling_ts"]
        t.add_row(plain(r["model_filename"]), plain(r["backend"]),
                  *(plain(setting_text(r.get(name))) for name, _ in settings), plain(r["test"]),
                  _tps(r), str(r["n"] or "-"), f"{ceiling:,.1f}" if ceiling else "-",
                  _eta(r["eta"]), plain(r["bound"] or "-"),
                  f"{r['ttft_ms']:,.1f}" if r["ttft_ms"] is not None else "-")
    return t


def notes_lines(records: list[dict[str, Any]]) -> list[str]:
    """Verdicts and caveats worth reading, once per (model, backend, note)."""
    seen: set[tuple[str, str, str]] = set()
    lines = []
    for r in records:
        for note in r["notes"]:
            key = (r["model_filename"], r["backend"], note)
            if key not in seen:
                seen.add(key)
                lines.append(f"{r['model_filename']} / {r['backend']}: {note}")
    return lines
