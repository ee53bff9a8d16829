"""`strata quality`: checks, host record, one scoring pass per backend, storage, printing."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from strata.quality.run import Prepared, QualityConfig, QualityResult, prepare, run_quality
from strata.quality.speed import decode_speed_ratio
from strata.store.hosts import save_measurement
from strata.views.console import progress_bar

MEASUREMENT_KIND = "quality"  # hosts.measurements.kind, next to 'roofline' and 'telemetry'


def run_quality_command(conn: sqlite3.Connection, config: QualityConfig,
                        console: Console) -> list[QualityResult]:
    """Every input error surfaces before the host probe and before any weights load."""
    from strata.host import this_host

    prepared = prepare(config)
    fingerprint = this_host(conn, console).fingerprint
    results = []
    for backend in prepared.backends:
        result = _scored(prepared, backend, config, console)
        if prepared.ref is not None:
            others = [b for b in prepared.backends if b != backend]
            ratio = decode_speed_ratio(conn, fingerprint, prepared.model.ref, prepared.ref.ref,
                                       prefer=[backend, *others])
            result.speed = ratio.to_dict() if ratio else None
        save_measurement(conn, fingerprint, MEASUREMENT_KIND, result.to_dict())
        results.append(result)
    return results


def _scored(prepared: Prepared, backend: str, config: QualityConfig,
            console: Console) -> QualityResult:
    bar = progress_bar(console)
    task = bar.add_task(f"{config.model} · {backend}: chunks of {config.ctx}",
                        total=prepared.plan.n_chunks)
    with bar:
        return run_quality(prepared, backend,
                           progress=lambda done, _n: bar.update(task, completed=done))


def print_results(results: list[QualityResult], json_out: bool, out: Console,
                  err: Console) -> None:
    from strata.views.quality import frontier_line, notes, quality_table

    records = [r.to_dict() for r in results]
    if json_out:
        out.file.write(json.dumps(records, indent=2, default=str) + "\n")
        return
    out.print(quality_table(records))
    for r in records:
        if r["ref"] is not None:
            out.print(frontier_line(r), highlight=False, markup=False)
    for line in notes(records):  # model names and text paths as typed: escaped
        err.print(f"[dim]note[/dim] {escape(line)}", highlight=False)


def quality_main(model: str, ref: str | None, text: Path | None, ctx: int, backend: str,
                 max_chunks: int, json_out: bool, conn: sqlite3.Connection, out: Console,
                 err: Console) -> list[QualityResult]:
    """What the CLI command calls: run, store, print."""
    config = QualityConfig(model=model, ref=ref, text=text, ctx=ctx, backend=backend,
                           max_chunks=max_chunks)
    results = run_quality_command(conn, config, err)
    print_results(results, json_out, out, err)
    return results
