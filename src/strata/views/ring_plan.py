"""How `strata ring plan` prints: the stages, the links, the predicted time per token."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from strata.ring.plan.types import RingPlan, size
from strata.views.console import plain

# -o md: the table's columns, by their record field names (docs/output.md, ring.plan.records)
MD_FIELDS = ("member", "device", "first", "last", "memory_bytes", "usable_bytes",
             "read_bytes", "predicted_ms", "time_source", "link_dst", "link_token_bytes",
             "link_rtt_ms", "link_bandwidth_gbs", "link_predicted_ms")


def _num(value: float | None, fmt: str = "{:.2f}") -> str:
    if value is None:
        return "—"
    return f"{value:.3g}" if 0 < abs(value) < 0.1 else fmt.format(value)  # a tiny model's µs


def _source(source: str | None, layer_ms: float | None) -> str:
    """Where the stage's ms/token comes from: a timed layer (its ms shown) or the bytes."""
    if source == "measured" and layer_ms is not None:
        return f"measured ({_num(layer_ms, '{:.3f}')} ms/layer)"
    return source or "—"


def _layers(plan: RingPlan, i: int) -> str:
    s = plan.stages[i]
    ends = (["embd"] if i == 0 else []) + (["head"] if i == len(plan.stages) - 1 else [])
    return f"{s.first}-{s.last - 1}" + (f" +{'+'.join(ends)}" if ends else "")


def stage_table(plan: RingPlan) -> Table:
    table = Table(title=f"{plan.model}: {len(plan.stages)} node(s), ctx {plan.ctx}",
                  title_justify="left")
    for col, justify in (("node", "left"), ("device", "left"), ("layers", "left"),
                         ("memory", "right"), ("of", "right"), ("read/token", "right"),
                         ("ms/token", "right"), ("time", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for i, s in enumerate(plan.stages):
        table.add_row(plain(s.member), plain(s.device), _layers(plan, i),
                      size(s.bytes), size(s.usable_bytes), size(s.read_bytes),
                      _num(s.predicted_ms), _source(s.time_source, s.layer_ms))
    return table


def link_table(plan: RingPlan) -> Table:
    table = Table(title="links (one hop each per token)", title_justify="left")
    for col, justify in (("link", "left"), ("carries", "left"), ("bytes/token", "right"),
                         ("RTT ms", "right"), ("MB/s", "right"), ("ms/token", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for h in plan.links:
        table.add_row(plain(f"{h.src} → {h.dst}"), h.carries, f"{h.bytes_per_token:,}",
                      _num(h.rtt_ms, "{:.3f}"), _num(h.MBps, "{:.1f}"),
                      _num(h.predicted_ms, "{:.3f}"))
    return table


def summary_lines(plan: RingPlan) -> list[str]:
    lines = []
    if plan.single_node:
        lines.append(f"fits on {plan.single_node} alone: no ring needed")
    ms, stages_ms = plan.predicted_ms_per_token, plan.predicted_stages_ms
    if ms is not None and plan.predicted_ts is not None:
        lines.append(f"predicted decode: {ms:.2f} ms/token = {plan.predicted_ts:.2f} t/s at "
                     f"ctx {plan.ctx} (a prediction, not a measurement)")
    elif stages_ms is not None:
        lines.append(f"predicted stages alone: {stages_ms:.2f} ms/token (links not measured: "
                     "no t/s predicted)")
    if plan.unused:
        lines.append(f"not needed: {', '.join(plan.unused)}")
    return lines + plan.notes


def print_plan(plan: RingPlan, out: Console) -> None:
    out.print(stage_table(plan))
    if plan.links:
        out.print(link_table(plan))
    for line in summary_lines(plan):
        out.print(plain(line), soft_wrap=True)
