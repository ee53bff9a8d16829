"""`strata bench`: the stored sweep (bench/sweep.py) with a progress bar, then printing."""

from __future__ import annotations

import sqlite3
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from strata.bench.plan import BenchConfig, Job
from strata.bench.runner import Events
from strata.bench.sweep import BenchOutcome, SweepProgress, run_sweep
from strata.store.runs import StoredResult
from strata.views.console import PlainProgress, progress_bar

__all__ = ["BenchOutcome", "print_outcome", "run_bench", "sweep_progress"]


def run_bench(conn: sqlite3.Connection, config: BenchConfig, console: Console,
              keep_error: bool = False) -> BenchOutcome:
    """Run and store the sweep with a progress bar on `console` (bench/sweep.py: an error
    that stops it part-way is raised once what finished is stored; with keep_error it is
    returned in the outcome, so the CLI prints the records before the error)."""
    return run_sweep(conn, config, console, keep_error=keep_error,
                     progress=sweep_progress(console))


def sweep_progress(console: Console) -> SweepProgress:
    """The sweep's progress on `console`, for bench/sweep.py's `run_sweep`."""
    return lambda total, tests: _progress(console, total, tests)


def _progress(console: Console, total: int,
              tests_per_job: list[Any]) -> tuple[Progress | PlainProgress, Events]:
    """A live bar on a terminal; piped, one plain line per finished test (or skipped pair)."""
    bar = progress_bar(console)
    task = bar.add_task("starting", total=total)

    def started(job: Job) -> None:
        bar.update(task, description=f"{job.model} · {job.backend}: loading")

    def rep(job: Job, test: Any, i: int) -> None:
        bar.update(task, description=f"{job.model} · {job.backend} · {test.name} · rep {i}")

    def done(r: StoredResult) -> None:
        n = r.metrics.get("e2e_s", {}).get("n")
        unit = "request" if r.info.get("load") else "rep"  # a load level: its requests
        reps = f" · {n} {unit}{'s' if n != 1 else ''}" if n else ""
        bar.update(task, description=f"{r.model} · {r.backend} · {r.test}{reps}", advance=1)

    def skipped(what: str, _why: str) -> None:  # the reason is listed with the results
        bar.update(task, description=f"{what}: skipped", advance=len(tests_per_job))

    return bar, Events(job_started=started, rep_done=rep, test_done=done, skipped=skipped)


def print_outcome(outcome: BenchOutcome, fmt: str, out: Console, err: Console) -> None:
    """Table (default) or a machine format on stdout; skips and verdict notes on stderr."""
    from strata.store.export import FORMATS
    from strata.views.bench import bench_table, notes_lines

    if fmt == "table":
        title = f"strata bench · run {outcome.run_id}"
        loaded = [r for r in outcome.records if r.get("requests") is not None]
        if loaded:
            from strata.views.load import load_tables

            for table in load_tables(loaded, title=title):
                out.print(table)
        if len(loaded) < len(outcome.records):
            out.print(bench_table([r for r in outcome.records if r.get("requests") is None],
                                  title=title))
        for line in notes_lines(outcome.records):  # name models as typed: escaped
            err.print(f"[dim]note[/dim] {escape(line)}", highlight=False)
    elif fmt == "md" and outcome.records and all(r.get("requests") is not None
                                                 for r in outcome.records):
        from strata.views.load import load_md

        out.file.write(load_md(outcome.records))  # a load sweep's own columns
        out.file.flush()
    elif outcome.records or not (outcome.error or outcome.nothing_ran()):
        out.file.write(FORMATS[fmt](outcome.records))
        out.file.flush()
    if outcome.nothing_ran() and len(outcome.skipped) == 1:
        return  # the caller's one-line error carries the only skip and its reason
    for what, why in outcome.skipped:
        err.print(f"[yellow]skipped[/yellow] {escape(what)}: {escape(why)}", highlight=False)
