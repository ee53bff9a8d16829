"""Terminal tables of `strata whatif`: one row per (model, device), the sweep, the list."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from strata.commands.whatif import WhatIfAnswer
from strata.hardware.catalogue import CatalogueDevice
from strata.views.console import plain
from strata.views.fit import VERDICT_STYLE
from strata.views.narrow import drop_first
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


TIER_SHORT = {"this device in the DB": "this DB", "same architecture in the DB": "DB (arch)",
              "published": "published", "published, other vendor": "other vendor",
              "published, other classes": "other classes", "prior": "prior"}


def _tier(row: WhatIfRow) -> str:
    p = row.prediction("decode")
    if p is None:
        return "-"
    tier = p.eta.basis.split(":", 1)[0]
    return TIER_SHORT.get(tier, tier.split(" ", 1)[0])


def _memory(row: WhatIfRow) -> str:
    """What the plan may use, and of how much (a unified chip's GPU share of its memory)."""
    d, avail = row.device, row.fit.budget.available
    gib = (avail or 0) / 2**30
    if avail and abs(gib - d.memory_gib) > 0.01:
        return f"{gib:.0f} of {d.memory_gib:g} GiB"
    return f"{d.memory_gib:g} GiB"


def whatif_table(answer: WhatIfAnswer) -> Table:
    """The per-$ and per-W columns appear only when some row has them; on a narrow terminal
    the low-value columns go first (views/narrow.py), the decode t/s never."""
    rows = answer.rows
    models = list(dict.fromkeys(r.model.removeprefix("synthetic:") for r in rows))
    one = len(models) == 1  # one model: its name goes in the title, not in every row
    cols = [("model", "left"), ("device", "left"), ("memory", "right"), ("verdict", "left"),
            ("max ctx", "right"), ("tg t/s (range)", "right"), ("pp t/s (range)", "right"),
            ("η from", "left")]
    cost = any(r.tps_per_kusd for r in rows)
    power = any(r.tps_per_watt for r in rows)
    if cost:
        cols.append(("t/s per $1k", "right"))
    if power:
        cols.append(("t/s per W", "right"))
    title = f"strata whatif · {models[0]} · " if one else "strata whatif · "
    t = Table(title=title + "datasheet roofline x η", title_justify="left")
    for header, just in cols[1:] if one else cols:
        t.add_column(header, justify=just)  # type: ignore[arg-type]
    for r in rows:
        row: list[object] = [plain(r.model.removeprefix("synthetic:")), plain(r.device.id),
                             _memory(r),
                             Text(r.fit.verdict, style=VERDICT_STYLE.get(r.fit.verdict, "dim")),
                             f"{r.fit.max_ctx:,}" if r.fit.max_ctx else "-",
                             _range(r, "decode"), _range(r, "prefill"), plain(_tier(r))]
        if cost:
            row.append(f"{r.tps_per_kusd:.1f}" if r.tps_per_kusd else "-")
        if power:
            row.append(f"{r.tps_per_watt:.2f}" if r.tps_per_watt else "-")
        t.add_row(*(row[1:] if one else row))
    return drop_first(t, "t/s per W", "η from", "max ctx", "memory", "pp t/s (range)",
                      "t/s per $1k")


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
    t.add_column("id", overflow="fold")
    t.add_column("name", overflow="fold")
    t.add_column("arch", overflow="fold")
    for col in ("memory", "GB/s", "FP32 TFLOP/s", "FP16 TFLOP/s", "TDP W"):
        t.add_column(col, justify="right", no_wrap=True)
    for d in devices:
        fp32, fp16 = d.tflops.get("fp32"), d.tflops.get("fp16")  # absent: no source
        t.add_row(d.id, plain(d.name), d.arch, f"{d.memory_gib:g} GiB",
                  f"{d.bandwidth_gbs:,.0f}", f"{fp32:g}" if fp32 else "-",
                  f"{fp16:g}" if fp16 else "-", f"{d.tdp_w:g}" if d.tdp_w else "-")
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
