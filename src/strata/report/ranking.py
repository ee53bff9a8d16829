"""The report's "Ranking" section: the latest `strata rank` of this host, one table per
profile, best first, each score with its verdict and where its figures came from."""

from __future__ import annotations

from typing import Any

from strata.report.data import ReportData
from strata.report.html import Section, badge, empty, fmt, note, table
from strata.report.svg import esc

VERDICT_BADGE = {"usable": "ok", "marginal": "warn", "unusable": "bad"}
HEADERS = ["#", "model", "backend", "score", "verdict", "prompt t/s", "gen t/s", "TTFT s",
           "basis"]


def _row(r: dict[str, Any]) -> list[object]:
    verdict = r.get("verdict")
    ttft = r.get("ttft_ms")
    basis = r["basis"] + (f" ({r['note']})" if r.get("note") else "")
    return [r.get("rank") or "-", r["model_filename"], r["backend"], fmt(r.get("score"), ",.0f"),
            badge(verdict, VERDICT_BADGE.get(verdict, "warn")) if verdict else "-",
            fmt(r.get("prefill_ts"), ",.1f"), fmt(r.get("decode_ts"), ",.1f"),
            fmt(None if ttft is None else ttft / 1e3, ",.2f"), basis]


def ranking_section(data: ReportData) -> Section:
    title = "Ranking"
    stored = data.ranking
    if not stored or not stored.get("records"):
        return Section("ranking", title, empty("no ranking yet", "strata rank --presets"),
                       False)
    by_profile: dict[str, list[dict[str, Any]]] = {}
    for r in stored["records"]:
        by_profile.setdefault(r["profile"], []).append(r)
    body = ""
    for name, rows in by_profile.items():
        body += f"<h3>{esc(name)}</h3>" + table(HEADERS, [_row(r) for r in rows], cls="num")
    body += note("score = 100 x geometric mean of (prompt t/s / target, gen t/s / target, "
                 "target TTFT / TTFT): 100 is on the profile's target, the same formula on "
                 "every host. 'predicted' rows (cut by the time budget or not fitting here) "
                 "are roofline x η, not measurements.")
    return Section("ranking", title, body, True)
