"""`strata fit`: check the flags, read the model's metadata, probe this host, plan, print.

The prediction needs this host's roofline: fit reads the stored one (from `strata probe
--measure` or any earlier `strata bench`) and does not measure it itself — planning stays a
few seconds of metadata reading; without a roofline the output says what to run.
"""

from __future__ import annotations

import json
import sqlite3

from rich.console import Console

from strata.fit import EtaHistory, FitOptions, FitReport, fit_model
from strata.fit.plan import DEFAULT_CTX
from strata.measure.roofline import Roofline
from strata.models.source import resolve
from strata.store.hosts import latest_measurement


def run_fit(conn: sqlite3.Connection, ref: str, *, ctx: int | None, batch: int,
            kv_type: str | None, backend: str, console: Console) -> FitReport:
    """Plan `ref` on this host (ctx None: DEFAULT_CTX). InputError (exit 2) for bad flags or
    an unreadable model, raised before the host is probed."""
    from strata.host import this_host

    options = FitOptions(ctx=DEFAULT_CTX if ctx is None else ctx, batch=batch, kv_type=kv_type,
                         backend=backend)
    model = resolve(ref)  # metadata only: a synthetic preset is not materialised
    host = this_host(conn, console)
    profile, fingerprint = host.profile, host.fingerprint
    stored = latest_measurement(conn, fingerprint, "roofline")
    roofline = Roofline.from_dict(stored) if stored else None
    history = EtaHistory.from_db(conn, fingerprint, backend,
                                 profile.cpu.last_level_cache_bytes())
    report = fit_model(model, profile, options, roofline, history, fingerprint)
    sections = options.rules.sections
    if sections is not None:  # the backend's own part (lab: the kernel serving each op here)
        report.sections = sections(model, conn, fingerprint, host.caps)
    return report


def print_fit(report: FitReport, json_out: bool, out: Console) -> None:
    """JSON with everything, or the table, predictions, rules and notes (all part of the
    answer, so all on stdout)."""
    if json_out:
        out.file.write(json.dumps(report.to_dict(), indent=2) + "\n")
        return
    from strata.views.fit import fit_table, note_lines, prediction_lines, section_table

    out.print(fit_table(report))
    for line in [*prediction_lines(report), *note_lines(report)]:
        out.print(line, highlight=False)
    for section in report.sections:
        out.print(section_table(section))
        for text in section.lines:
            out.print(text, highlight=False)
