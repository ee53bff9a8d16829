"""The quantisation frontier: what each quantisation costs in quality for the speed it buys.

Reads `strata quality` measurements (kind 'quality': model, ref, backend, ppl, kl, top1,
speed_ratio; ref_ppl, delta_ppl and model_label when the run gives them). Speed is the stored
speed ratio vs the reference; where a row has none, the decode t/s this host measured for that
model and backend is used instead, and the axis says so. The reference itself is drawn as the
anchor: speed 1x by definition, its measured PPL, KL 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strata.report.data import ReportData
from strata.report.derive import kind
from strata.report.html import Raw, Section, badge, empty, figure, note, table
from strata.report.svg import TIMES, Chart, Series, color, esc, wants_log
from strata.store.runs import StoredResult

QUALITY = "strata quality MODEL --ref REF_MODEL"


@dataclass
class FrontierPoint:
    model: str
    ref: str | None
    backend: str
    ppl: float | None
    kl: float | None
    top1: float | None
    speed: float | None  # speed ratio vs ref, or decode t/s (see FrontierData.speed_label)
    d_ppl: float | None
    label: str = ""  # short name on the chart: the quantisation ("q4_0")
    is_ref: bool = False
    caveat: str | None = None  # why the speed figure is weak ("a busy host", "2 repetition(s)")


@dataclass
class FrontierData:
    points: list[FrontierPoint]
    speed_label: str  # axis label, with unit
    ratio: bool


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def latest_quality(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, ref, backend): the newest (rows come oldest first)."""
    by_key = {(str(q.get("model")), str(q.get("ref")), str(q.get("backend"))): q for q in rows}
    return list(by_key.values())


def decode_tps(results: list[StoredResult], model: str, backend: str) -> float | None:
    tg = [r for r in results if r.model == model and r.backend == backend and kind(r) == "tg"
          and r.metrics.get("decode_tps", {}).get("mean")]
    return tg[-1].metrics["decode_tps"]["mean"] if tg else None


def _ref_ppl(q: dict[str, Any], rows: list[dict[str, Any]]) -> float | None:
    if _num(q.get("ref_ppl")) is not None:
        return _num(q.get("ref_ppl"))
    same = [r for r in rows if r.get("model") == q.get("ref")
            and r.get("backend") == q.get("backend") and _num(r.get("ppl")) is not None]
    return _num(same[-1]["ppl"]) if same else None


def _delta(q: dict[str, Any], ppl: float | None, ref_ppl: float | None) -> float | None:
    if _num(q.get("delta_ppl")) is not None:  # the run's own, on the same positions
        return _num(q.get("delta_ppl"))
    return ppl - ref_ppl if ppl is not None and ref_ppl is not None else None


def _short(model: str, label: Any) -> str:
    return str(label) if label else model.split("@")[-1]


def _anchors(rows: list[dict[str, Any]], results: list[StoredResult],
             ratio: bool) -> list[FrontierPoint]:
    """One point per (ref, backend) with a known PPL that is not itself a measured row."""
    have = {(q.get("model"), q.get("backend")) for q in rows}
    out: dict[tuple[str, str], FrontierPoint] = {}
    for q in rows:
        ref, backend = q.get("ref"), str(q.get("backend", "?"))
        ref_ppl = _ref_ppl(q, rows)
        if not ref or (ref, backend) in have or ref_ppl is None:
            continue
        speed = 1.0 if ratio else decode_tps(results, str(ref), backend)
        out[(str(ref), backend)] = FrontierPoint(
            str(ref), None, backend, ref_ppl, 0.0, 1.0, speed, 0.0,
            f"{_short(str(ref), q.get('ref_label'))} (ref)", is_ref=True)
    return list(out.values())


def frontier_data(rows: list[dict[str, Any]], results: list[StoredResult]) -> FrontierData:
    rows = latest_quality(rows)
    ratio = all(_num(q.get("speed_ratio")) is not None for q in rows if q.get("ref"))
    points = []
    for q in rows:
        model, backend = str(q.get("model", "?")), str(q.get("backend", "?"))
        speed = _num(q.get("speed_ratio")) if ratio else decode_tps(results, model, backend)
        ppl = _num(q.get("ppl"))
        caveat = (q.get("speed") or {}).get("caveat") if ratio else None
        points.append(FrontierPoint(
            model, q.get("ref"), backend, ppl, _num(q.get("kl")), _num(q.get("top1")), speed,
            _delta(q, ppl, _ref_ppl(q, rows)), _short(model, q.get("model_label")),
            caveat=caveat))
    label = (f"decode speed vs reference ({TIMES})" if ratio
             else "decode t/s on this host (from strata bench)")
    return FrontierData(_anchors(rows, results, ratio) + points, label, ratio)


def summary_line(p: FrontierPoint, ratio: bool) -> str:
    """'q4_0 vs f16: 2.40x decode, +0.080 PPL, KL 0.02, top-1 97.0%' (what is known of it)."""
    head = f"{p.model}" + (f" vs {p.ref}" if p.ref else "") + f" ({p.backend}):"
    parts = []
    if p.speed is not None:
        parts.append(f"{p.speed:.2f}{TIMES} decode" if ratio else f"{p.speed:,.1f} decode t/s")
        if p.caveat:
            parts[-1] += f" (weak: {p.caveat})"
    if p.d_ppl is not None:
        parts.append(f"{p.d_ppl:+.3f} PPL")
    elif p.ppl is not None:
        parts.append(f"PPL {p.ppl:.3f}")
    if p.kl is not None:
        parts.append(f"KL {p.kl:.3g}")
    if p.top1 is not None:
        parts.append(f"top-1 {p.top1:.1%}")
    return f"{head} {', '.join(parts)}"


def _chart(fd: FrontierData, metric: str, short: str, y_label: str, uid: str) -> Chart | None:
    pts = [p for p in fd.points if p.speed is not None and getattr(p, metric) is not None]
    if not [p for p in pts if not p.is_ref]:
        return None  # the reference alone is no frontier
    ys = [getattr(p, metric) for p in pts]
    chart = Chart(f"{short} vs speed", fd.speed_label, y_label, uid=uid,
                  y_log=wants_log(ys, ratio=100.0), y_zero=False)
    for i, backend in enumerate(sorted({p.backend for p in pts})):
        mine = sorted((p for p in pts if p.backend == backend), key=lambda p: p.speed or 0)
        chart.series.append(Series(backend, [(p.speed or 0, getattr(p, metric)) for p in mine],
                                   color(i), line=False,
                                   tips=[summary_line(p, fd.ratio) for p in mine],
                                   labels=[p.label for p in mine]))
    return chart


def _fmt(v: float | None, spec: str) -> str | None:
    return None if v is None else format(v, spec)


def _speed_cell(p: FrontierPoint, ratio: bool) -> object:
    """The speed, marked as quality's table marks it when a side was busy or had n < 3."""
    text = _fmt(p.speed, ".2f") if ratio else _fmt(p.speed, ",.1f")
    if text is None or not p.caveat:
        return text
    return Raw(f"{esc(text)} {badge('weak: ' + p.caveat, 'bad')}")


def _table(fd: FrontierData) -> Raw:
    rows = [(p.model + (" (reference)" if p.is_ref else ""), p.ref, p.backend,
             _fmt(p.ppl, ".3f"), _fmt(p.d_ppl, "+.3f"), _fmt(p.kl, ".4g"), _fmt(p.top1, ".1%"),
             _speed_cell(p, fd.ratio)) for p in fd.points]
    speed_col = f"speed vs ref ({TIMES})" if fd.ratio else "decode t/s"
    return table(["model", "ref", "backend", "PPL", "ΔPPL", "KL", "top-1", speed_col], rows,
                 cls="num")


def frontier_section(data: ReportData) -> Section:
    title = "Quantisation frontier"
    if not data.quality:
        return Section("frontier", title, empty("no quality results yet", QUALITY), False)
    fd = frontier_data(data.quality, data.results)
    figs = []
    for metric, short, label in (("ppl", "perplexity", "perplexity (lower is better)"),
                                 ("kl", "KL divergence", "KL vs reference (nats/token)")):
        chart = _chart(fd, metric, short, label, f"chart-frontier-{metric}")
        if chart:
            figs.append(figure(chart, [(s.name, s.color, "marker") for s in chart.series]))
    parts = [f'<div class="grid">{"".join(figs)}</div>' if figs else
             empty("no quality result has both a speed and a PPL/KL figure yet",
                   "strata bench MODEL and " + QUALITY), _table(fd)]
    parts += [note(summary_line(p, fd.ratio)) for p in fd.points if p.ref]
    return Section("frontier", title, Raw("".join(parts)), bool(figs))
