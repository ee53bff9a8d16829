"""The "what if" section: this host's measured decode t/s beside the predicted t/s of the
same models on the devices asked about (`strata report --on DEVICE`).

Only built when devices are asked for. Each benched model (llama.cpp, the backend the
published measurements are of) is planned on each device by strata.whatif; predictions are
labelled as such with the basis of their η.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from strata.report.data import ReportData
from strata.report.fit_table import benched
from strata.report.frontier import decode_tps
from strata.report.html import Section, empty, note, table

HEADERS = ["model", "this host: measured tg t/s", "device", "verdict",
           "predicted tg t/s (range)", "vs this host", "basis of η"]


def _rows(conn: sqlite3.Connection, data: ReportData, on: tuple[str, ...]) -> list[list[Any]]:
    from strata.commands.whatif import evidence, hosting
    from strata.fit.plan import FitOptions
    from strata.models.source import resolve
    from strata.whatif.plan import parse_on, whatif_row

    devices = [parse_on(x) for x in on]
    ev, host = evidence(conn), hosting(None)
    out = []
    for model, backend in benched(data):
        if backend != "llamacpp":
            continue
        here = decode_tps(data.results, model, "llamacpp")  # the newest tg result
        resolved = resolve(model)
        for dev in devices:
            row = whatif_row(resolved, dev, FitOptions(), host, ev, {})
            p = row.prediction("decode")
            ratio = f"{p.tps / here:.1f}x" if p and here else None
            out.append([model, f"{here:,.1f}" if here else None, dev.id, row.fit.verdict_text,
                        f"{p.tps:,.1f} ({p.low_tps:,.1f}-{p.high_tps:,.1f})" if p else None,
                        ratio, p.eta.basis if p else "; ".join(row.absent)])
    return out


def whatif_section(conn: sqlite3.Connection, data: ReportData, on: tuple[str, ...]) -> Section:
    title = "What if: the same models on other devices"
    rows = _rows(conn, data, on)
    if not rows:
        return Section("whatif", title, empty("no llama.cpp results to set beside the devices",
                                              "strata bench MODEL"), False)
    body = table(HEADERS, rows) + note(
        "Predicted, not measured: the device's datasheet roofline x η (this DB's results on "
        "that device or architecture, else published measurements of its class, else a "
        "prior); strata whatif --help explains the model.")
    return Section("whatif", title, body, True)
