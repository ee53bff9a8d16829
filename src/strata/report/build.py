"""Assemble the report from its sections and write it atomically."""

from __future__ import annotations

import os
import sqlite3
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from strata import __version__
from strata.errors import InputError
from strata.report.charts import palette_for, roofline_section, sustained_section, sweeps_section
from strata.report.data import ReportData, load_report_data
from strata.report.fit_table import Planner, default_planner, fit_section
from strata.report.frontier import frontier_section
from strata.report.host import host_section
from strata.report.html import Section, page
from strata.report.kernel_writers import kernel_writers_section
from strata.report.ranking import ranking_section
from strata.report.results_table import results_section
from strata.report.svg import esc
from strata.report.training import training_section

AUTO = "auto"  # planner: strata.fit's when it is installed


@dataclass
class Report:
    html: str
    sections: list[Section]
    data: ReportData

    def section(self, sid: str) -> Section:
        return next(s for s in self.sections if s.id == sid)


def _header(data: ReportData, now: datetime) -> str:
    h = data.host
    lines = [f"<h1>strata report — {esc(h.hostname)}</h1>",
             f"<p>{esc(h.summary)} · host {esc(h.fingerprint)}</p>",
             f"<p>{len(data.results)} results in {len(data.runs)} runs · generated "
             f"{esc(now.isoformat(timespec='seconds'))} by strata {esc(__version__)}</p>"]
    if data.other_hosts:
        names = ", ".join(f"{o.hostname} ({o.fingerprint})" for o in data.other_hosts)
        lines.append(f"<p>Other hosts in this database (not shown): {esc(names)}</p>")
    return "".join(lines)


def build_report(conn: sqlite3.Connection, fingerprint: str | None = None,
                 planner: Planner | Literal["auto"] | None = AUTO,
                 now: datetime | None = None, on: tuple[str, ...] = ()) -> Report:
    """The whole report as one HTML string; InputError when the DB has nothing to show."""
    data = load_report_data(conn, fingerprint)
    pal = palette_for(data.results)
    plan = default_planner(conn, data) if isinstance(planner, str) else planner
    sections = [host_section(data), roofline_section(data, pal), sweeps_section(data, pal),
                sustained_section(data, pal), frontier_section(data),
                fit_section(data, plan), ranking_section(data), kernel_writers_section(data),
                training_section(data), results_section(data)]
    if on:  # strata report --on DEVICE: this host beside the devices asked about
        from strata.report.whatif import whatif_section

        sections.insert(6, whatif_section(conn, data, on))
    now = now or datetime.now(timezone.utc)
    footer = ("Self-contained: no scripts, fonts or network requests. Hover a point for its "
              "figures. Measured values are from this host's results database; fit figures "
              "are predictions.")
    html = page(f"strata report — {data.host.hostname}", _header(data, now), sections, footer)
    return Report(html, sections, data)


def check_out(out: Path) -> Path:
    """--out must name a file in a folder that exists: no folder is created silently (a
    typo in a path would otherwise grow a tree). InputError (exit 2) in one line."""
    out = Path(out).expanduser()
    if out.is_dir():
        raise InputError(f"--out {out}: is a folder; give a file path such as {out}/report.html")
    blocker = next((p for p in out.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise InputError(f"--out {out}: {blocker} is a file, not a folder; choose another path")
    if not out.parent.is_dir():
        raise InputError(f"--out {out}: the folder {out.parent} does not exist; create it "
                         "first (mkdir -p) or choose another path")
    return out


def write_text_atomic(out: Path, text: str) -> Path:
    """Write via a temp file in the same folder, so a failed write never leaves half a report.

    Raises InputError (exit 2) naming --out when the location cannot be written.
    """
    out = check_out(out)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=out.parent)
    except OSError as exc:
        raise _unwritable(out, exc) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a report is meant to be shared
        os.replace(tmp, out)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _unwritable(out, exc) from exc
    return out


def _unwritable(out: Path, exc: OSError) -> InputError:
    return InputError(f"--out {out}: cannot write ({exc.strerror or exc}); choose a writable "
                      "location")


def write_report(conn: sqlite3.Connection, out: Path, fingerprint: str | None = None,
                 planner: Planner | Literal["auto"] | None = AUTO,
                 on: tuple[str, ...] = ()) -> Report:
    report = build_report(conn, fingerprint, planner, on=on)
    write_text_atomic(out, report.html)
    return report
