"""Terminal tables of `strata whatif`: one row per (model, device), the sweep, the list."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from strata.commands.whatif import WhatIfAnswer
from strata.hardware.catalogue import CatalogueDevice
from strata.views.console import plain
from strata.views.fit import VERDICT_STYLE, size
from strata.whatif.plan import WhatIfRow
from strata.whatif.sweep import Variant


def _tps(value: float | None) -> str:
    if not value:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _range(row: WhatIfRow, phase: str) -> str:
    p = row.prediction(phase)
    if p is None:
        return "-"
    return f"{_tps(p.tps)} ({_tps(p.low_tps)}-{_tps(p.high_tps)})"


def _tier(row: WhatIfRow) -> str:
    p = row.prediction("decode")
    return p.eta.basis.split(":", 1)[0] if p else "-"


def whatif_table(answer: WhatIfAnswer) -> Table:
    t = Table(title="strata whatif · datasheet roofline x η (basis: where η comes from)",
              title_justify="left")
    for col, just in (("model", "left"), ("device", "left"), ("memory", "right"),
                      ("GB/s", "right"), ("verdict", "left"), ("max ctx", "right"),
                      ("tg t/s (range)", "right"), ("pp t/s (range)", "right"),
                      ("η basis", "left"), ("t/s per $1k", "right"), ("t/s per W", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in answer.rows:
        d = r.device
        t.add_row(plain(r.model.removeprefix("synthetic:")), plain(d.id),
                  size(r.fit.budget.available), f"{d.bandwidth_gbs:,.0f}",
                  Text(r.fit.verdict, style=VERDICT_STYLE.get(r.fit.verdict, "dim")),
                  f"{r.fit.max_ctx:,}" if r.fit.max_ctx else "-",
                  _range(r, "decode"), _range(r, "prefill"), plain(_tier(r)),
                  f"{r.tps_per_kusd:.1f}" if r.tps_per_kusd else "-",
                  f"{r.tps_per_watt:.2f}" if r.tps_per_watt else "-")
    return t


def support_lines(answer: WhatIfAnswer) -> list[str]:
    seen: dict[str, str] = {}
    for r in answer.rows:
        seen.setdefault(r.device.id, r.support.text)
    return [f"{dev}: {text}" for dev, text in seen.items() if text]


def sweep_table(dev: str, variants: list[Variant]) -> Table:
    t = Table(title=f"strata whatif --sweep memory · {dev}", title_justify="left")
    t.add_column("variant")
    models = [r.model for r in variants[0].rows] if variants else []
    for m in models:
        t.add_column(plain(m.removeprefix("synthetic:")), justify="right")
    t.add_column("largest preset that fits")
    for v in variants:
        cells = [_tps(r.tps("decode")) + " t/s" if r.tps("decode") else r.fit.verdict
                 for r in v.rows]
        t.add_row(plain(v.label), *cells, plain(v.largest or "none"))
    return t


def catalogue_table(devices: list[CatalogueDevice]) -> Table:
    t = Table(title=f"strata whatif --list · {len(devices)} devices (datasheet figures)",
              title_justify="left")
    for col, just in (("id", "left"), ("name", "left"), ("arch", "left"),
                      ("memory", "right"), ("GB/s", "right"), ("FP16 TFLOP/s", "right"),
                      ("TDP W", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for d in devices:
        fp16 = d.tflops.get("fp16") or d.tflops.get("fp32")
        t.add_row(d.id, plain(d.name), d.arch, f"{d.memory_gib:g} GiB",
                  f"{d.bandwidth_gbs:,.0f}", f"{fp16:g}" if fp16 else "-",
                  f"{d.tdp_w:g}" if d.tdp_w else "-")
    return t


def validation_table(summary: list) -> Table:  # list[validate.Summary]
    t = Table(title="strata whatif --validate · held-out published measurements, "
              "|predicted ÷ measured - 1|", title_justify="left")
    for col, just in (("class", "left"), ("phase", "left"), ("n", "right"),
                      ("median", "right"), ("p90", "right"), ("η from", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for s in summary:
        t.add_row(s.device_class, s.phase, str(s.n), f"{s.median:.0%}", f"{s.p90:.0%}", s.tier)
    return t
