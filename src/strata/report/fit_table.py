"""The fit table: will each benched model fit on each device here, and how fast would it run.

`strata fit` is optional to the report: when `strata.fit` imports, its planner is asked about
every (model, backend) benched on this host, from metadata only (nothing is loaded), with the
same defaults as `strata fit MODEL`; otherwise the section names the command. Predictions are
labelled as predictions with their basis (docs/architecture.md §5, honesty).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from strata.backends import names
from strata.report.data import ReportData
from strata.report.html import Raw, Section, badge, empty, note, table
from strata.report.svg import TIMES, esc

# (model ref, backend) -> FitReport (anything with to_dict()) or its dict
Planner = Callable[[str, str], Any]
FIT = "strata fit MODEL"
VERDICT_BADGE = {"fits": "ok", "partial": "warn", "does not fit": "bad"}
HEADERS = ["model", "backend", "device", "verdict", "needs / available", "max ctx",
           "quantisations that fit", "predicted t/s (range)", "basis of η"]


def default_planner(conn: sqlite3.Connection, data: ReportData) -> Planner | None:
    """strata.fit's planner for this host and DB, or None when fit is not installed."""
    try:
        from strata.fit import EtaHistory, FitOptions, fit_model
        from strata.models.source import resolve
    except ImportError:
        return None
    profile = data.profile
    if profile is None:
        return None
    cache = profile.cpu.last_level_cache_bytes()

    def plan(model: str, backend: str) -> Any:
        history = EtaHistory.from_db(conn, data.host.fingerprint, backend, cache)
        return fit_model(resolve(model), profile, FitOptions(backend=backend), data.roofline,
                         history, data.host.fingerprint)

    return plan


def benched(data: ReportData) -> list[tuple[str, str]]:
    """(model, backend) pairs benched here that fit can plan: metadata exists (not an
    endpoint) and fit knows the backend's memory rules. Newest first."""
    seen: dict[tuple[str, str], None] = {}
    plannable = names(fit=True)  # backends whose descriptor declares fit rules
    for r in reversed(data.results):
        if r.backend in plannable and "endpoint" not in (r.info.get("model") or {}):
            seen.setdefault((r.model, r.backend), None)
    return list(seen)


def as_dict(plan: Any) -> dict[str, Any]:
    plan = plan.to_dict() if hasattr(plan, "to_dict") else plan
    return plan if isinstance(plan, dict) else {}


def _size(n: Any) -> str | None:
    if not isinstance(n, int | float):
        return None
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def _lines(items: list[str]) -> Raw | None:
    return Raw("<br>".join(esc(i) for i in items)) if items else None


def _eta_basis(eta: dict[str, Any]) -> str | None:
    """The η's basis and the stored results it rests on (result ids, as `strata history`)."""
    basis = eta.get("basis")
    sources = eta.get("sources") or []
    if not basis or not sources:
        return basis
    named = ", ".join(f"#{s.get('result_id')} {s.get('model')} {s.get('test')} "
                      f"η {s.get('eta', 0):.2f}" for s in sources[:6])
    more = f" and {len(sources) - 6} more" if len(sources) > 6 else ""
    return f"{basis}; rests on {named}{more}"


def _predicted(plan: dict[str, Any], device: str) -> tuple[Raw | None, Raw | None]:
    """One line per predicted test on the device ('tg128 41.5 (30.0-48.0)'), and the basis
    of each distinct η used."""
    lines, bases = [], []
    for p in plan.get("predictions") or []:
        if p.get("device") != device or not p.get("tps"):
            continue
        spread = (f" ({p['low_tps']:,.1f}-{p['high_tps']:,.1f})"
                  if p.get("low_tps") is not None and p.get("high_tps") is not None else "")
        lines.append(f"{p.get('test', '?')}: {p['tps']:,.1f}{spread}")
        basis = _eta_basis(p.get("eta") or {})
        if basis and basis not in bases:
            bases.append(basis)
    return _lines(lines), Raw(f'<span class="small">{_lines(bases)}</span>') if bases else None


def plan_rows(model: str, backend: str, plan: dict[str, Any]) -> list[list[object]]:
    rows: list[list[object]] = []
    for d in plan.get("devices") or []:
        device = d.get("device", "?")
        need = ((d.get("placement") or {}).get("device") or {}).get("total")
        predicted, basis = _predicted(plan, device)
        verdict = d.get("verdict") or "?"
        text = d.get("verdict_text") or verdict
        rows.append([model, backend, f"{device} ({d.get('name', '?')})",
                     Raw(badge(verdict, VERDICT_BADGE.get(verdict, "unknown"))
                         + (f"<br>{esc(text)}" if text != verdict else "")),
                     f"{_size(need) or '?'} / {_size(d.get('available')) or '?'}",
                     f"{d['max_ctx']:,}" if isinstance(d.get("max_ctx"), int) else None,
                     ", ".join(d.get("quants_that_fit") or []) or None, predicted, basis])
    return rows


def _offload_lines(plan: dict[str, Any]) -> list[str]:
    """A MoE model a GPU cannot hold whole: the expert-offload placement, if it fits."""
    out = []
    for d in plan.get("devices") or []:
        eo = d.get("expert_offload")
        if not eo or not eo.get("fits"):
            continue
        tg = next((p for p in eo.get("predictions") or [] if "@" not in p["test"]), None)
        speed = f"; predicted {tg['test']} ≈ {tg['tps']:,.1f} t/s" if tg else ""
        out.append(f"{d.get('device', '?')}: experts on the CPU ({eo['flags']}) fits: "
                   f"{_size(eo['device']['total'])} on the GPU, {_size(eo['host']['total'])} "
                   f"of RAM{speed}")
    return out


def _failure(model: str, exc: Exception) -> Raw:
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return note(f"{model}: fit failed ({first}); run strata fit {model}")


def fit_section(data: ReportData, planner: Planner | None) -> Section:
    title = "Fit: memory and predicted speed"
    pairs = benched(data)
    if planner is None:
        hint = f"strata fit {pairs[0][0]}" if pairs else FIT
        return Section("fit", title, empty("fit predictions are not in this report", hint),
                       False)
    if not pairs:
        return Section("fit", title, empty("no benched models to plan for yet", FIT), False)
    rows: list[list[object]] = []
    notes: list[Raw] = []
    ctx = None
    for model, backend in pairs:
        try:
            plan = as_dict(planner(model, backend))
        except Exception as exc:  # one model's planning failure must not hide the others
            notes.append(_failure(model, exc))
            continue
        rows += plan_rows(model, backend, plan)
        ctx = ctx or (plan.get("options") or {}).get("ctx")
        notes += [note(f"{model} · {backend}: no prediction: {why}")
                  for why in plan.get("prediction_absent") or []]
        notes += [note(f"{model} · {backend}: {line}") for line in _offload_lines(plan)]
    head = note(f"Planned from metadata alone at strata fit's defaults (context {ctx:,}, "
                "batch 1). Predicted t/s are predictions, not measurements: this host's "
                f"measured roofline {TIMES} η, range in brackets." if ctx else
                "Predicted t/s are predictions, not measurements.")
    body = (head + table(HEADERS, rows, cls="num") if rows else Raw("")) + "".join(notes)
    return Section("fit", title, Raw(body), bool(rows))
