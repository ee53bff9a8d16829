"""`strata bench`: host + roofline, pre-flight checks, the sweep, storage, printing."""

from __future__ import annotations

import sqlite3
import sys
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from strata.bench.plan import BenchConfig, Job
from strata.bench.records import record
from strata.bench.runner import Events, Outcome, Runner, resolve_all
from strata.errors import InputError
from strata.hardware.profile import HostProfile
from strata.host import this_host
from strata.models.source import ResolvedModel
from strata.store.runs import (
    StoredResult,
    add_result,
    finish_run,
    start_run,
    update_explanation,
)
from strata.views.console import progress_bar

# Weights must leave this share of available RAM free for activations, KV cache and the OS.
RAM_HEADROOM = 0.9


@dataclass
class BenchOutcome:
    run_id: int
    status: str
    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def check_fits(models: dict[str, ResolvedModel], profile: HostProfile,
               config: BenchConfig) -> None:
    """A model larger than memory is an input error, before anything is loaded."""
    on_cpu = any(lc.n_gpu_layers == 0 and lc.device == "cpu" for lc in config.loads)
    free = profile.cpu.ram_available_bytes
    if not (on_cpu and free):
        return
    for ref, model in models.items():
        need = model.spec.weight_bytes() if model.spec else 0
        if need > free * RAM_HEADROOM:
            raise InputError(f"MODEL {ref}: weights need {need / 2**30:.1f} GiB but only "
                             f"{free / 2**30:.1f} GiB of RAM is available; choose a smaller "
                             "quantisation (e.g. @q4_0) or offload with -ngl")


def _progress(console: Console, total: int, tests_per_job: list[Any]) -> tuple[Progress, Events]:
    bar = progress_bar(console)
    task = bar.add_task("starting", total=total)

    def started(job: Job) -> None:
        bar.update(task, description=f"{job.model} · {job.backend}: loading")

    def rep(job: Job, test: Any, i: int) -> None:
        bar.update(task, description=f"{job.model} · {job.backend} · {test.name} · rep {i}")

    def skipped(_what: str, _why: str) -> None:
        bar.advance(task, len(tests_per_job))  # listed with the results at the end

    return bar, Events(job_started=started, rep_done=rep,
                       test_done=lambda _r: bar.advance(task), skipped=skipped)


def run_bench(conn: sqlite3.Connection, config: BenchConfig, console: Console) -> BenchOutcome:
    models = resolve_all(config)  # bad paths and damaged files fail here, in seconds
    host = this_host(conn, console)
    profile, fingerprint = host.profile, host.fingerprint
    check_fits(models, profile, config)  # before spending time on the roofline
    roof = host.roofline(console)
    run_id = start_run(conn, fingerprint, "bench", sys.argv[1:], config.to_dict())
    done: list[StoredResult] = []

    def store(r: StoredResult) -> StoredResult:
        r.run_id, r.id = run_id, add_result(conn, run_id, r)
        done.append(r)
        return r

    total = len(config.models) * len(config.backends) * len(config.loads) * len(config.tests)
    bar, events = _progress(console, total, config.tests)
    status = "failed"
    outcome = Outcome()
    try:
        with bar:
            outcome = Runner(config, roof, store, events,
                             profile.cpu.last_level_cache_bytes(),
                             peaks=host.peak_keeper(roof),
                             update=lambda r: update_explanation(conn, r)).run(models)
        status = "complete"
    except KeyboardInterrupt:
        status = "incomplete"  # Ctrl-C: keep what finished, say so, print it
    finally:
        finish_run(conn, run_id, status)
        if status != "complete":
            console.print(f"run {run_id} marked {status}: {len(done)} finished result(s) kept")
    return BenchOutcome(run_id, status, [record(r) for r in done], outcome.skipped)


def print_outcome(outcome: BenchOutcome, fmt: str, out: Console, err: Console) -> None:
    """Table (default) or a machine format on stdout; skips and verdict notes on stderr."""
    from strata.store.export import FORMATS
    from strata.views.bench import bench_table, notes_lines

    if fmt == "table":
        if outcome.records:
            out.print(bench_table(outcome.records, title=f"strata bench · run {outcome.run_id}"))
        for line in notes_lines(outcome.records):  # name models as typed: escaped
            err.print(f"[dim]note[/dim] {escape(line)}", highlight=False)
    else:
        out.file.write(FORMATS[fmt](outcome.records))
    for what, why in outcome.skipped:
        err.print(f"[yellow]skipped[/yellow] {escape(what)}: {escape(why)}", highlight=False)
    if not outcome.records:
        err.print("no results: every backend/model pair was skipped (see above)")
