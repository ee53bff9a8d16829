"""`strata fit`: check the flags, read the model's metadata, probe this host, plan, print.

The prediction needs this host's roofline: fit reads the stored one (from `strata probe
--measure` or any earlier `strata bench`) and does not measure it itself — planning stays a
few seconds of metadata reading; without a roofline the output says what to run. It writes
nothing: the DB is only read (this host is probed, not stored).
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from rich.console import Console

from strata.fit import EtaHistory, FitOptions, FitReport, fit_model
from strata.fit.plan import DEFAULT_CTX, FIT_COLUMNS, check_model
from strata.measure.roofline import Roofline
from strata.models.source import resolve
from strata.store.hosts import latest_measurement

if TYPE_CHECKING:
    from strata.host import Host


def run_fit(conn: sqlite3.Connection | None, ref: str, *, ctx: int | None, batch: int,
            kv_type: str | None, backend: str, console: Console, swa_full: bool = False
            ) -> FitReport:
    """Plan `ref` on this host (ctx None: DEFAULT_CTX) from what `conn` holds (None: no DB
    yet, an empty store). Nothing is written. InputError (exit 2) for bad flags or an
    unreadable model, raised before the host is probed."""
    from strata.store.db import empty_db

    model = resolve(ref)  # metadata only: a synthetic preset is not materialised
    options = FitOptions(ctx=_ctx(model, ctx), batch=batch, kv_type=kv_type, backend=backend,
                         swa_full=swa_full)
    check_model(model, options)
    conn = conn if conn is not None else empty_db()
    host = _this_host(conn, console)
    profile, fingerprint = host.profile, host.fingerprint
    stored = latest_measurement(conn, fingerprint, "roofline")
    roofline = Roofline.from_dict(stored) if stored else None
    history = EtaHistory.from_db(conn, fingerprint, backend,
                                 profile.cpu.last_level_cache_bytes())
    report = fit_model(model, profile, options, roofline, history, fingerprint)
    sections = options.rules.sections
    if sections is not None:  # the backend's own part (lab: the kernel serving each op here)
        report.sections = sections(model, host, report.model["kv_type"])
    return report


def _ctx(model: object, ctx: int | None) -> int:
    """The default, or the model's own context where that is shorter."""
    if ctx is not None:
        return ctx
    spec = getattr(model, "spec", None)
    limit = getattr(spec, "ctx_max", 0) if spec is not None else 0
    return min(DEFAULT_CTX, limit) if limit else DEFAULT_CTX


def run_fit_on(conn: sqlite3.Connection | None, ref: str, on: list[str], *, ctx: int | None,
               batch: int, kv_type: str | None, backend: str, swa_full: bool,
               ram_gib: float | None) -> FitReport:
    """`fit --on DEVICE…`: the plan on catalogue devices (strata.whatif), predictions from
    their datasheet rooflines and η from this DB, published measurements or a prior."""
    from strata.commands.whatif import evidence, hosting, options_for
    from strata.whatif.plan import fit_on, parse_on

    devices = [parse_on(x) for x in on]
    model = resolve(ref)
    options = options_for(_ctx(model, ctx), kv_type, True, batch, backend, swa_full)
    check_model(model, options)
    return fit_on(model, devices, options, hosting(ram_gib), evidence(conn))


def _this_host(conn: sqlite3.Connection, console: Console) -> Host:
    """This host, probed (no smoke test) but not stored: fit only reads the DB."""
    from strata.hardware.probe import probe_host
    from strata.host import Host

    with console.status("probing host…"):
        profile = probe_host(smoke=False)
    return Host(conn, profile, profile.fingerprint())


def print_fit(report: FitReport, fmt: str, out: Console) -> None:
    """fmt: table (the table, predictions, rules and notes: all part of the answer, so all on
    stdout), json (everything), jsonl, csv or md (one record per device)."""
    from strata.views.output import emit

    emit(out, fmt, report.records(), document=report.to_json(), md_columns=MD_FIELDS,
         table=lambda: _print_table(report, out))


MD_FIELDS = FIT_COLUMNS  # -o md: the table's columns (strata.fit.plan)


def _print_table(report: FitReport, out: Console) -> None:
    from strata.views.fit import fit_table, note_lines, prediction_lines, section_table

    out.print(fit_table(report))  # narrowed on a narrow terminal (views/narrow.py)
    for line in [*prediction_lines(report), *note_lines(report)]:
        out.print(line, highlight=False)
    for section in report.sections:
        out.print(section_table(section))
        for text in section.lines:
            out.print(text, highlight=False)
