"""`strata report`: one self-contained HTML file (inline SVG plots, no scripts, no network).

Public API:
  build_report(conn, fingerprint=None, planner="auto", now=None) -> Report (html, sections, data)
  write_report(conn, out, fingerprint=None, planner="auto") -> Report   (atomic write)
  EMPTY_DB: the message of the InputError raised when the DB has nothing to show
  strata.report.svg: the plotting module (scales, Chart, Series, RefLine, Band, Area, esc)
"""

from strata.report.build import Report, build_report, write_report
from strata.report.data import EMPTY_DB

__all__ = ["EMPTY_DB", "Report", "build_report", "write_report"]
