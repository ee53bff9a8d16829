"""Every stored result of the host as one table (the same flat record every printer reads)."""

from __future__ import annotations

from strata.bench.records import record, setting_text, swept
from strata.report.data import ReportData
from strata.report.html import Raw, Section, badge, details, empty, fmt, table
from strata.report.svg import esc

# the swept settings go between LEAD and TAIL, by the terminal table's rule (records.swept)
LEAD = ["model", "backend"]
TAIL = ["test", "t/s", "n", "ceiling t/s", "η", "bound", "TTFT ms", "peak RSS", "throttled",
        "host", "run", "notes"]


def headers(settings: list[tuple[str, str]]) -> list[str]:
    return LEAD + [header for _, header in settings] + TAIL


def _throttled(flag: bool | None) -> Raw | None:
    if flag is None:
        return None
    return badge("yes", "bad") if flag else badge("no", "ok")


def _host(busy: bool | None, share: float | None) -> Raw | None:
    """Other processes' CPU use during the test: a busy host explains a low figure."""
    if busy is None:
        return None
    return badge(f"busy {share or 0:.0%}", "bad") if busy else badge("quiet", "ok")


def _notes(notes: list[str]) -> Raw | None:
    if not notes:
        return None
    items = "".join(f"<li>{esc(n)}</li>" for n in notes)
    return details(f"{len(notes)} note{'s' if len(notes) > 1 else ''}", f"<ul>{items}</ul>")


def _mean_sd(ts: float | None, sd: float | None, n: int | None) -> str | None:
    """"mean ± SD"; one sample has no SD, so it shows the mean alone (never "± 0.0")."""
    if ts is None:
        return None
    return f"{ts:,.1f}" if (n or 0) < 2 or sd is None else f"{ts:,.1f} ± {sd:,.1f}"


def _row(rec: dict, run_id: int, settings: list[tuple[str, str]]) -> list[object]:
    ts = rec.get("avg_ts")
    rss = rec.get("peak_rss_bytes")
    return [rec["model_filename"], rec["backend"],
            *(setting_text(rec.get(name)) for name, _ in settings), rec["test"],
            _mean_sd(ts, rec.get("stddev_ts"), rec.get("n")), rec.get("n"),
            fmt(rec.get("ceiling_ts")), fmt(rec.get("eta"), ".2f"), rec.get("bound"),
            fmt(rec.get("ttft_ms"), ",.2f"), f"{rss / 2**20:,.0f} MiB" if rss else None,
            _throttled(rec.get("throttled")),
            _host(rec.get("host_busy"), rec.get("host_busy_share")), run_id,
            _notes(rec.get("notes") or [])]


def results_section(data: ReportData) -> Section:
    title = "All results"
    if not data.results:
        return Section("results", title, empty("no bench results yet", "strata bench MODEL"),
                       False)
    records = [(record(r), r.run_id) for r in data.results]
    settings = swept([rec for rec, _ in records])
    rows = [_row(rec, run_id, settings) for rec, run_id in records]
    runs = ", ".join(f"#{r.id} {r.status} {r.started_at}" + (f" @{r.git_commit}"
                                                            if r.git_commit else "")
                     for r in data.runs)
    body = table(headers(settings), rows, cls="num") + f'<p class="note">runs: {esc(runs)}</p>'
    return Section("results", title, body, True)
