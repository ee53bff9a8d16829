"""Terminal view of a fit plan: one row per device, then predictions, rules and notes."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from strata.bench.explain import eta_text
from strata.fit import FITS, NO, PARTIAL, DeviceFit, Eta, FitReport, Prediction
from strata.fit.backends import FitSection
from strata.fit.experts import NEWER_FLAGS, TEXT
from strata.views.console import plain
from strata.views.narrow import drop_first

GiB, MiB = 2**30, 2**20
VERDICT_STYLE = {FITS: "green", PARTIAL: "yellow", NO: "red"}


def size(n: int | float | None) -> str:
    if n is None:
        return "?"
    return f"{n / GiB:,.2f} GiB" if n >= GiB else f"{n / MiB:,.1f} MiB"


def _max_ctx(row: DeviceFit) -> str:
    if row.max_ctx is None:
        return "-" if row.budget.available is None else "none"
    return f"{row.max_ctx:,}" + (" (model max)" if row.max_ctx_is_model_limit else "")


def fit_table(report: FitReport) -> Table:
    """One row per device; on a narrow terminal the low-value columns go first
    (views/narrow.py), total, verdict and max ctx last."""
    o = report.options
    kv = report.model["kv_type"]
    title = (f"strata fit · {report.model['ref']} ({report.model['quant']}) · {o.backend} · "
             f"ctx {o.ctx:,} x batch {o.batch} · KV {kv}")
    t = Table(title=plain(title), title_justify="left")  # the model ref as typed
    for col, just in (("device", "left"), ("weights", "right"), ("KV", "right"),
                      ("buffers", "right"), ("overhead", "right"), ("total", "right"),
                      ("available", "right"), ("verdict", "left"), ("-ngl", "right"),
                      ("max ctx", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for row in report.rows:
        m = row.placement.device
        ngl = row.placement.ngl
        t.add_row(plain(f"{row.budget.device} ({row.budget.name})"), size(m.weights),
                  size(m.kv),
                  size(m.buffers), size(m.overhead), size(m.total), size(row.budget.available),
                  Text(row.verdict_text, style=VERDICT_STYLE.get(row.verdict, "dim")),
                  "-" if ngl is None or row.verdict == NO else str(ngl), _max_ctx(row))
    return drop_first(t, "overhead", "buffers", "-ngl", "weights", "KV", "available",
                      "max ctx")


def section_table(section: FitSection) -> Table:
    """A backend's own part of the answer (lab: op, kernel, why), every cell as data."""
    t = Table(title=plain(section.title), title_justify="left")
    for col in section.columns:
        t.add_column(col)
    for row in section.rows:
        t.add_row(*(plain(cell) for cell in row))
    return t


def _eta_text(p: Prediction) -> str:
    return f"ceiling {p.ceiling_tps:,.1f} t/s x η {eta_text(p.eta.value)}: {p.eta.basis}"


MAX_SOURCES = 6  # results named per η; the rest are counted


def sources_text(eta: Eta) -> str | None:
    """Which stored results an η rests on, so a user can look at (or delete) them."""
    if not eta.sources:
        return None
    named = ", ".join(f"#{s.result_id} {s.model} {s.test} η {eta_text(s.eta)}"
                      for s in eta.sources[:MAX_SOURCES])
    more = len(eta.sources) - MAX_SOURCES
    spread = f"; spread {eta.spread:.0%} of the median" if eta.spread is not None else ""
    return f"η rests on: {named}" + (f" and {more} more" if more > 0 else "") + spread


def prediction_lines(report: FitReport) -> list[Text]:
    lines = []
    roof = "datasheet" if report.host.startswith("catalogue") else "measured"  # fit --on
    for device in dict.fromkeys(p.device for p in report.predictions):
        lines.append(Text.assemble(("predicted", "bold"), f" on {device} with "
                                   f"{report.options.backend} (a prediction from the {roof} "
                                   "roofline, not a measurement):"))
        shown: set[str] = set()
        for p in (p for p in report.predictions if p.device == device):
            spread = f" ({p.low_tps:,.1f}-{p.high_tps:,.1f})" if p.high_tps > p.low_tps else ""
            lines.append(Text(f"  {p.test:<14} ≈ {p.tps:,.1f} t/s{spread}  {_eta_text(p)}"))
            rests = sources_text(p.eta)
            if rests and p.phase not in shown:  # once per phase: its tests share the η
                shown.add(p.phase)
                lines.append(Text(f"  {'':<14}   {rests}", style="dim"))
    lines += _offload_prediction_lines(report)
    lines += [Text.assemble(("no prediction", "yellow"), f": {why}")
              for why in report.prediction_absent]
    return lines


def _offload_prediction_lines(report: FitReport) -> list[Text]:
    """Decode with the experts on the CPU, for a MoE model a GPU cannot hold whole."""
    lines = []
    for row in report.rows:
        eo = row.expert_offload
        if eo is None or not eo.predictions:
            continue
        lines.append(Text.assemble(("predicted", "bold"), f" on {row.budget.device} with "
                                   f"experts on the CPU ({eo.flags}; a prediction, not a "
                                   "measurement):"))
        for p, basis in zip(eo.predictions, eo.basis, strict=True):
            spread = f" ({p.low_tps:,.1f}-{p.high_tps:,.1f})" if p.high_tps > p.low_tps else ""
            lines.append(Text(f"  {p.test:<14} ≈ {p.tps:,.1f} t/s{spread}  {_eta_text(p)}"))
            lines.append(Text(f"  {'':<14}   {basis.split(': ', 1)[1]}", style="dim"))
    return lines


def note_lines(report: FitReport) -> list[Text]:
    return [Text(line, style="dim") for line in _notes(report)]


def _stored_line(report: FitReport) -> str:
    """A mix is many types: what the file holds of each (a Q4_K_M's largest may be Q5_0)."""
    parts = ", ".join(f"{t} {size(n)}" for t, n in report.model["bytes_by_type"].items())
    return f"weights as stored ({report.model['quant']}): {parts}"


def _notes(report: FitReport) -> list[str]:
    lines = [_stored_line(report), _quants_line(report)]
    for row in report.rows:
        host = row.placement.host
        if host is not None and row.verdict in (FITS, PARTIAL):
            lines.append(f"{row.budget.device} also needs {size(host.total)} of RAM (token "
                         f"embedding, layers left on the CPU, logits, runtime)")
        lines += _offload_lines(row)
        lines.append(f"{row.budget.device}: {row.reason}; available = {row.budget.basis}")
    lines += [f"rule: {r}" for r in report.rules]
    lines += [f"note: {n}" for n in report.notes]
    return lines


def _offload_lines(row: DeviceFit) -> list[str]:
    eo = row.expert_offload
    if eo is None:
        return []
    device = row.budget.device
    if not eo.fits:
        return [f"{device}: experts on the CPU ({eo.flags}) does not fit either: {eo.reason}"]
    return [f"{device}: {TEXT}: pass {eo.flags} (newer llama.cpp: {NEWER_FLAGS}): "
            f"{size(eo.device.total)} on the GPU (weights {size(eo.device.weights)}, KV "
            f"{size(eo.device.kv)}, buffers {size(eo.device.buffers)}), {size(eo.host.total)} "
            f"of RAM (experts and embedding {size(eo.host.weights)})"]


def _quants_line(report: FitReport) -> str:
    weights = ", ".join(f"{q.quant} {size(q.weight_bytes)}" + ("" if q.exact else " (est.)")
                        for q in report.quants)
    if report.quants and all(q.exact for q in report.quants):
        weights += " (all exact)"
    fits = "; ".join(f"{r.budget.device}: {' '.join(r.quants) or 'none'}" for r in report.rows)
    return (f"weights at each quantisation: {weights}. Whole on the device at ctx "
            f"{report.options.ctx:,}: {fits}")
