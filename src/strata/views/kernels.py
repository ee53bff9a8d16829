"""Terminal and machine views of the kernel lab: verdicts, benchmark figures, the
implementation list and dispatch decisions. One record schema feeds every format: the
machine formats go through views/output.emit with the md columns named here."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from strata.kernels.bench import Figure
from strata.kernels.dispatch import Decision
from strata.kernels.spec import shape_label
from strata.kernels.verify import Verdict

STATUS_STYLE = {"pass": "green", "fail": "bold red", "compiled": "cyan",
                "unavailable": "dim", "chosen": "green", "rejected": "dim",
                "fallback": "yellow", "kernel": "green", "vendor": "cyan"}


def _styled(text: str) -> str:
    style = STATUS_STYLE.get(text)
    return f"[{style}]{text}[/{style}]" if style else text


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


# -- verify ------------------------------------------------------------------------------------

VERIFY_COLUMNS = ("op", "impl", "device", "status", "reason", "message", "cases")


def sandbox_caption(verdicts: list[Verdict]) -> str | None:
    """How the workers were confined; loud where only resource limits held them."""
    levels = sorted({v.sandbox for v in verdicts if v.sandbox})
    if not levels:
        return None
    text = "sandbox: " + ", ".join(levels)
    return f"[yellow]{text} (no OS-level isolation here)[/yellow]" \
        if "rlimits only" in levels else text


def verdict_table(verdicts: list[Verdict]) -> Table:
    t = Table(title="Kernel verification", caption=sandbox_caption(verdicts))
    for col in ("op", "impl", "device", "status", "cases", "max rel err", "detail"):
        t.add_column(col, overflow="fold", justify="right" if col in ("cases",) else "left")
    for v in verdicts:
        detail = escape(v.message) if v.status != "pass" else ""
        if v.reason:
            detail = escape(f"{v.reason}: {v.message}" + (f" ({v.where})" if v.where else ""))
        if v.cached:
            detail = (detail + " " if detail else "") + "[dim](cached)[/dim]"
        t.add_row(v.impl.op, escape(v.impl.name), v.device or "-", _styled(v.status),
                  str(v.cases), _fmt(v.max_rel_err, ".1e"), detail)
    return t


MISMATCH_REASONS = ("wrong_result", "nan_parity", "data_race", "reads_output_buffer")


def render_failures(console: Console, verdicts: list[Verdict]) -> None:
    for v in verdicts:
        if v.status == "fail" and v.details:
            what = "first mismatches" if v.reason in MISMATCH_REASONS else "details"
            console.print(f"[bold]{escape(v.impl.key)}[/bold] {what}:")
            for line in v.details:
                console.print(f"  {line}", highlight=False, markup=False)


# -- bench -------------------------------------------------------------------------------------

BENCH_COLUMNS = ("op", "shape", "impl", "median_us", "iqr_us", "gbs", "frac_bw", "gflops",
                 "frac_flops", "speedup_eager", "speedup_compile", "note")


def figure_record(f: Figure) -> dict[str, Any]:
    iqr = (f.p75_s - f.p25_s) * 1e6 if f.p75_s is not None and f.p25_s is not None else None
    return {"op": f.op, "shape": shape_label(f.shape), "impl": f.impl, "device": f.device,
            "dtype": f.dtype, "cache": f.cache,
            "median_us": f.median_s * 1e6 if f.median_s else None, "iqr_us": iqr, "n": f.n,
            "gbs": f.gbs,
            "frac_bw": f.frac_bw, "gflops": f.tflops * 1e3 if f.tflops is not None else None,
            "frac_flops": f.frac_flops, "speedup_eager": f.speedup_eager,
            "speedup_compile": f.speedup_compile,
            "note": "; ".join([f.note, *f.flags]).strip("; ")}


def bench_table(figures: list[Figure], title: str) -> Table:
    t = Table(title=title)
    for col, right in (("shape", False), ("impl", False), ("median µs", True), ("IQR µs", True),
                       ("GB/s", True), ("% BW", True), ("GFLOP/s", True), ("% peak", True),
                       ("x eager", True), ("x compile", True), ("note", False)):
        t.add_column(col, justify="right" if right else "left", overflow="fold")
    last_shape = None
    for f in figures:
        r = figure_record(f)
        shape = r["shape"] if r["shape"] != last_shape else ""
        last_shape = r["shape"]
        t.add_row(shape, escape(f.impl), _fmt(r["median_us"], ".1f"), _fmt(r["iqr_us"], ".1f"),
                  _fmt(r["gbs"], ".1f"), _pct(f.frac_bw), _fmt(r["gflops"], ".1f"),
                  _pct(f.frac_flops), _speedup(f.speedup_eager), _speedup(f.speedup_compile),
                  escape(r["note"]))
    return t


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _speedup(x: float | None) -> str:
    if x is None:
        return "-"
    style = "green" if x >= 1.0 else "red"
    return f"[{style}]{x:.2f}x[/{style}]"


# -- list --------------------------------------------------------------------------------------

LIST_COLUMNS = ("op", "impl", "dialect", "requires", "available", "verified", "speedup",
                "speedup_low", "speedup_high", "origin", "trust")


def list_table(records: list[dict[str, Any]]) -> Table:
    t = Table(title="Kernel implementations on this host")
    for col in ("op", "impl", "dialect", "requires", "available here", "verified",
                "x eager (geomean, range)", "origin"):
        t.add_column(col, overflow="fold")
    last_op = None
    for r in records:
        op = r["op"] if r["op"] != last_op else ""
        last_op = r["op"]
        t.add_row(op, escape(r["impl"]), r["dialect"], r["requires"], r["available"],
                  _styled(r["verified"]), _speed_cell(r), _origin_cell(r))
    return t


def _origin_cell(r: dict[str, Any]) -> str:
    """An external kernel's origin says how it runs: confined (its own process) or trusted
    (in-process, `strata kernels trust`)."""
    return f"{r['origin']}, {r['trust']}" if r.get("trust") else r["origin"]


def _speed_cell(r: dict[str, Any]) -> str:
    """The geometric mean dispatch uses, with the lowest and highest shape."""
    if r.get("speed_problem"):
        return "[red]disqualified[/red]"
    if r.get("speedup") is None:
        return "-"
    spread = f" ({r['speedup_low']:.2f}-{r['speedup_high']:.2f})" \
        if r.get("speedup_shapes", 0) > 1 else ""
    return _speedup(r["speedup"]) + spread


# -- explain -----------------------------------------------------------------------------------

def render_decision(console: Console, d: Decision) -> None:
    console.print(f"[bold]{escape(d.op)}[/bold] on {escape(d.device)}: "
                  f"{_styled(d.outcome)} → [bold]{escape(d.chosen)}[/bold]"
                  + (f" ({d.speedup:.2f}x torch eager)" if d.speedup else ""))
    for note in d.notes:
        console.print(f"  [yellow]{escape(note)}[/yellow]")
    t = Table(show_header=True, box=None, pad_edge=False)
    for col in ("implementation", "decision", "why"):
        t.add_column(col, overflow="fold")
    for e in d.trace:
        t.add_row(escape(e.impl), _styled(e.verdict), escape(e.reason))
    console.print(t)
