"""The report's "Training runs" section: the loss curves of `strata train` runs of this host
(train loss per step, validation loss at each evaluation) and one row of figures per run."""

from __future__ import annotations

from strata.report.data import ReportData
from strata.report.html import Section, empty, figure, fmt, note, table
from strata.report.svg import Chart, Series, color
from strata.store.training import Point, TrainRow

MAX_POINTS = 300  # a 1500-step curve is binned to this many means: the SVG stays small


def _binned(points: list[Point]) -> list[tuple[float, float]]:
    """(step, loss) pairs; long curves as the mean of equal runs of consecutive steps."""
    size = max(1, -(-len(points) // MAX_POINTS))
    out = []
    for i in range(0, len(points), size):
        chunk = points[i:i + size]
        out.append((sum(p.step for p in chunk) / len(chunk),
                    sum(p.loss for p in chunk) / len(chunk)))
    return out


def _name(r: TrainRow) -> str:
    return f"run {r.run_id} · {r.preset} · {r.kernels}"


def loss_chart(runs: list[TrainRow], points: dict[int, list[Point]]) -> tuple[Chart, list]:
    chart = Chart("loss vs optimizer step", "optimizer step", "loss (nats per token)",
                  uid="chart-train-loss", width=900, height=360, y_zero=False)
    entries: list[tuple[str, str, str]] = []
    # a resumed run stores the whole curve (its parent's steps too): draw the last of a chain
    continued = {r.resumed_from for r in runs if r.resumed_from}
    for i, r in enumerate(r for r in runs if r.run_id not in continued):
        col = color(i)
        train = [p for p in points.get(r.run_id, []) if p.kind == "train"]
        val = [p for p in points.get(r.run_id, []) if p.kind == "val"]
        if train:
            xy = _binned(train)
            chart.series.append(Series(f"{_name(r)} train", xy, col,
                                       tips=[f"{_name(r)}: step {x:,.0f}, train loss {y:.3f}"
                                             for x, y in xy]))
            entries.append((f"{_name(r)} · train", col, "line"))
        if val:
            chart.series.append(Series(
                f"{_name(r)} validation", [(p.step, p.loss) for p in val], col, hollow=True,
                tips=[f"{_name(r)}: step {p.step:,}, validation loss {p.loss:.3f}"
                      + (f", {p.bits_per_byte:.3f} bits/byte" if p.bits_per_byte else "")
                      for p in val]))
            entries.append((f"{_name(r)} · validation", col, "hollow"))
    return chart, entries


def _ops(r: TrainRow) -> str:
    impls = {v.get("impl", "?") for v in r.ops.values()}
    if len(impls) == 1:
        return f"all {impls.pop()}"
    return ", ".join(f"{op}: {v.get('impl', '?')}" for op, v in sorted(r.ops.items()))


def _row(r: TrainRow) -> list[object]:
    return [r.run_id, r.preset, f"{r.params:,}", r.kernels, _ops(r),
            f"{r.device} {r.dtype}" + (f" x{r.world_size}" if r.world_size > 1 else ""),
            f"{r.step:,} / {r.steps:,}", fmt(r.tokens_per_s, ",.0f"),
            fmt(None if r.mfu is None else 100 * r.mfu, ".2f", "%"), fmt(r.val_loss, ".3f"),
            fmt(r.bits_per_byte, ".3f"), r.status, r.outputs.get("gguf")]


def training_section(data: ReportData) -> Section:
    title = "Training runs"
    if not data.training:
        return Section("training", title, empty("no training runs yet", "strata train"), False)
    chart, entries = loss_chart(data.training, data.train_points)
    body = figure(chart, entries, "Lines: train loss (binned means for long runs); hollow "
                  "markers: validation loss on held-out documents.")
    heads = ["run", "preset", "params", "kernels", "ops", "device", "steps", "tokens/s",
             "MFU", "val loss", "bits/byte", "status", "GGUF"]
    body += table(heads, [_row(r) for r in data.training], cls="num")
    body += note("MFU: model FLOP/s (6 x parameters + attention, per token) over the "
                 "host's measured matmul peak for the run's dtype.")
    return Section("training", title, body, True)
