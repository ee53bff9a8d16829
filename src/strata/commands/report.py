"""`strata report`: build the HTML report from the results DB, write it, optionally open it."""

from __future__ import annotations

import sqlite3
import webbrowser
from dataclasses import dataclass
from pathlib import Path

from strata.report import write_report


@dataclass
class ReportOutcome:
    path: Path
    size_bytes: int
    n_results: int
    hostname: str
    with_data: list[str]  # section titles that have data
    without_data: list[str]  # section titles that show "run strata ..." instead

    def summary(self) -> str:
        missing = f"; no data yet: {', '.join(self.without_data)}" if self.without_data else ""
        return (f"wrote {self.path} ({self.size_bytes / 1024:,.0f} KiB, {self.n_results} results "
                f"from {self.hostname}){missing}")


def run_report(conn: sqlite3.Connection, out: Path, fingerprint: str | None = None,
               on: tuple[str, ...] = ()) -> ReportOutcome:
    """Raises InputError (exit 2) for an empty DB or an --out that cannot be written; `on`:
    catalogue devices for the "what if" section."""
    if on:  # a bad device name fails before anything is built
        from strata.whatif.plan import parse_on

        for name in on:
            parse_on(name)
    report = write_report(conn, out, fingerprint, on=on)
    path = Path(out).expanduser().resolve()
    return ReportOutcome(path, path.stat().st_size, len(report.data.results),
                         report.data.host.hostname,
                         [s.title for s in report.sections if s.has_data],
                         [s.title for s in report.sections if not s.has_data])


def open_report(path: Path) -> bool:
    """Open the file in the default browser; False when no browser could be started."""
    try:
        return webbrowser.open(Path(path).resolve().as_uri())
    except webbrowser.Error:
        return False
