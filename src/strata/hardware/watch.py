"""`strata probe --watch SECONDS`: live telemetry table, then the run's summary and verdict.

The live view goes to the console it is given (the CLI passes its stderr console,
docs/architecture.md §10: progress on stderr); the summary is returned so the CLI can also
print it as json/md.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from strata.errors import InputError
from strata.hardware.telemetry import (
    DEFAULT_INTERVAL_S,
    MIN_INTERVAL_S,
    NVML_REASON_BITS,
    Sample,
    Sampler,
    TelemetrySummary,
    ThrottleVerdict,
)

REFRESH_S = 0.25  # the screen does not need to redraw faster than people read


def _bytes(v: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= scale:
            return f"{v / scale:.2f} {unit}"
    return f"{v:.0f} B"


def _reasons(v: float) -> str:
    mask = int(v)
    names = [name for bit, name in NVML_REASON_BITS.items() if mask & bit]
    return f"{mask:#x} " + (",".join(names) if names else "none")


# metric suffix -> how to show one value of it (first match wins)
FORMATTERS: dict[str, Callable[[float], str]] = {
    "_mhz": lambda v: f"{v:,.0f} MHz",
    "_c": lambda v: f"{v:.1f} °C",
    "_w": lambda v: f"{v:.1f} W",
    "_pct": lambda v: f"{v:.1f} %",
    "_bytes": _bytes,
    "energy_j": lambda v: f"{v:,.2f} J",
    "_count": lambda v: f"{v:g}",
    "_reasons": _reasons,
}


def format_value(key: str, value: float) -> str:
    for suffix, fmt in FORMATTERS.items():
        if key.endswith(suffix):
            return fmt(value)
    return f"{value:g}"


def live_table(latest: Sample | None, summary: TelemetrySummary) -> Table:
    """Latest reading of every metric next to its min/max so far."""
    table = Table(title=f"telemetry — {summary.sample_count} samples, "
                        f"{summary.duration_s:.1f} s", title_justify="left")
    for col in ("metric", "now", "min", "max"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for key, value in sorted((latest.readings if latest else {}).items()):
        stats = summary.metrics.get(key)
        low, high = (format_value(key, stats.min), format_value(key, stats.max)) if stats \
            else ("", "")
        table.add_row(key, format_value(key, value), low, high)
    return table


def summary_table(summary: TelemetrySummary) -> Table:
    """One row per metric: gauges as min/mean/max, counters and energy as run totals."""
    table = Table(title=f"telemetry summary — {summary.sample_count} samples over "
                        f"{summary.duration_s:.2f} s (every {summary.interval_s * 1000:.0f} ms)",
                  title_justify="left")
    for col in ("metric", "min", "mean", "max"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for key, st in summary.metrics.items():
        table.add_row(key, *(format_value(key, v) for v in (st.min, st.mean, st.max)))
    for key, delta in summary.counters.items():
        table.add_row(key, "", f"Δ {delta:+g}", "")
    for key, joules in summary.energy_j.items():
        watts = summary.mean_power_w.get(key)
        mean = f"{joules:,.2f} J" + (f" ({watts:.1f} W avg)" if watts is not None else "")
        table.add_row(key, "", mean, "")
    for key, counts in summary.bitmasks.items():
        n = counts.get("samples", 0)
        bits = ", ".join(f"{name} {c}/{n}" for name, c in counts.items() if name != "samples")
        table.add_row(key, "", bits or "none set", "")
    return table


def verdict_text(verdict: ThrottleVerdict) -> Text:
    style = {True: "bold red", False: "green", None: "yellow"}[verdict.throttled]
    text = Text("Throttling: ", style="bold")
    text.append(verdict.headline(), style=style)
    for note in verdict.notes:
        text.append(f"\n  note: {note}", style="dim")
    return text


def unavailable_text(summary: TelemetrySummary) -> Text:
    text = Text()
    for name, why in summary.unavailable.items():
        text.append(f"not sampled: {name} — {why}\n", style="dim")
    return text


def render_summary(summary: TelemetrySummary) -> RenderableType:
    """Table, throttling verdict and the sources we could not read, ready to print."""
    return Group(summary_table(summary), verdict_text(summary.verdict),
                 unavailable_text(summary))


def _check_args(seconds: float, interval_s: float) -> None:
    if not seconds > 0:
        raise InputError(f"--watch SECONDS must be > 0, got {seconds!r}")
    if not interval_s >= MIN_INTERVAL_S:
        raise InputError(
            f"telemetry interval must be >= {MIN_INTERVAL_S * 1000:.0f} ms, got {interval_s!r} s"
        )


def watch(
    seconds: float,
    interval_s: float = DEFAULT_INTERVAL_S,
    console: Console | None = None,
    *,
    sampler_factory: Callable[[float], Sampler] = Sampler,
) -> TelemetrySummary:
    """Sample for `seconds`, showing a live table, then print and return the summary.

    Ctrl-C ends the watch early; the summary of what was sampled is still printed.
    """
    _check_args(seconds, interval_s)
    console = console or Console(stderr=True)
    with sampler_factory(interval_s) as sampler:
        _show_live(sampler, seconds, console)
    summary = sampler.summary()
    console.print(render_summary(summary))
    return summary


def _show_live(sampler: Sampler, seconds: float, console: Console) -> None:
    deadline = time.monotonic() + seconds
    # transient: the live table is replaced by the summary when the watch ends
    with Live(console=console, refresh_per_second=1 / REFRESH_S, transient=True) as live:
        try:
            while (left := deadline - time.monotonic()) > 0:
                live.update(live_table(sampler.latest(), sampler.summary()))
                time.sleep(min(REFRESH_S, left))
        except KeyboardInterrupt:
            pass  # an early stop is a normal way to end a watch: summarise what we have
