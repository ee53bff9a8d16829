"""A bench sweep, stored: resolve the models, check they fit, measure the roofline when a
backend wants one, run the sweep and store every result as it finishes, then close the run.
`strata bench` (commands/bench.py, with its progress bar and printing) and `strata rank`
(which measures what the DB lacks) both run through `run_sweep`."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from strata.backends import describe
from strata.bench.checks import check_contexts, refused_pairs
from strata.bench.load import LoadBenchConfig, LoadRunner
from strata.bench.plan import BenchConfig
from strata.bench.records import record
from strata.bench.runner import Events, Outcome, Runner, resolve_all
from strata.errors import InputError
from strata.hardware.profile import HostProfile
from strata.host import this_host
from strata.models.source import ResolvedModel
from strata.store.runs import (
    StoredResult,
    add_result,
    discard_empty_run,
    finish_run,
    start_run,
    update_explanation,
)

# Weights must leave this share of available RAM free for activations, KV cache and the OS.
RAM_HEADROOM = 0.9

# (tests to run in all, the config's tests) -> (what to hold open while it runs, its events):
# the CLI draws a progress bar (commands/bench.py); without one the sweep runs quietly.
SweepProgress = Callable[[int, list[Any]], tuple[AbstractContextManager[Any], Events]]


def quiet(_total: int, _tests: list[Any]) -> tuple[AbstractContextManager[Any], Events]:
    return nullcontext(), Events()


@dataclass
class BenchOutcome:
    """What a bench run left: its records (stored), skips, and the error that ended it early
    (None when it ran to its end). run_id is 0 when nothing was stored: a run that finished
    no test leaves no row."""

    run_id: int
    status: str
    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    error: BaseException | None = None

    def nothing_ran(self) -> str | None:
        """Why no test ran (every model/backend pair skipped), or None if one did."""
        if self.records or self.error is not None or self.status != "complete":
            return None
        if len(self.skipped) == 1:
            what, why = self.skipped[0]
            return f"nothing ran: {what}: {why}"
        if self.skipped:
            return (f"nothing ran: all {len(self.skipped)} model/backend pairs were skipped "
                    "(reasons above)")
        return "nothing ran: the sweep planned no test"


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


def warn_no_offload(config: BenchConfig, console: Console) -> None:
    """-ngl N > 0 for llama.cpp on a build that cannot offload (built for the CPU only):
    llama.cpp ignores it silently; say so before the run, so nobody reads CPU figures as GPU
    figures. The results carry the same note."""
    ngl = max((lc.n_gpu_layers for lc in config.loads), default=0)
    if ngl <= 0 or "llamacpp" not in config.backends:
        return
    try:
        import llama_cpp
    except ImportError:
        return  # the backend is skipped with its own reason
    if not llama_cpp.llama_supports_gpu_offload():
        console.print(f"[yellow]warning[/yellow] -ngl {ngl}: this llama.cpp build cannot "
                      "offload to a GPU (CPU-only build): nothing is offloaded, every layer "
                      "runs on the CPU", highlight=False)


def run_sweep(conn: sqlite3.Connection, config: BenchConfig, console: Console, *,
              keep_error: bool = False, progress: SweepProgress = quiet) -> BenchOutcome:
    """Run and store the sweep. An error that stops it part-way is raised once what finished
    is stored; with keep_error it is returned in the outcome instead, next to the records,
    so the caller prints them before the error. `console` takes the host probe's and the
    run's own lines (stderr in the CLI)."""
    models = resolve_all(config)  # bad paths and damaged files fail here, in seconds
    check_contexts(config, models)  # a test past a model's context: before anything runs
    refused = refused_pairs(config, models)  # pairs a backend cannot take: skipped first
    if len(refused) == len(config.models) * len(config.backends):  # nothing can run
        return BenchOutcome(0, "complete", [], [(f"{m} on {b}", why)
                                              for (m, b), why in refused.items()])
    host = this_host(conn, console)
    profile, fingerprint = host.profile, host.fingerprint
    check_fits(models, profile, config)  # before spending time on the roofline
    descriptors = [describe(b) for b in config.backends]
    for d in descriptors:
        if d.preflight is not None:
            d.preflight()  # e.g. no ring daemon: say so before measuring anything
    warn_no_offload(config, console)
    load = config if isinstance(config, LoadBenchConfig) else None
    # serving load measures a server, and a ring runs on other machines: no roofline of
    # this host explains either
    wants_roofline = load is None and any(d.roofline for d in descriptors)
    roof = host.roofline(console) if wants_roofline else None
    run_id = start_run(conn, fingerprint, "bench", sys.argv[1:], config.to_dict())
    done: list[StoredResult] = []

    def store(r: StoredResult) -> StoredResult:
        r.run_id, r.id = run_id, add_result(conn, run_id, r)
        done.append(r)
        return r

    total = len(config.models) * len(config.backends) * len(config.loads) * len(config.tests)
    total = load.n_results() if load is not None else total
    bar, events = progress(total, config.tests)
    status, error = "failed", None
    outcome = Outcome()
    try:
        with bar:
            if load is not None:
                outcome = LoadRunner(load, store, events).run(models)
            else:
                outcome = Runner(config, roof, store, events,
                                 profile.cpu.last_level_cache_bytes(),
                                 peaks=host.peak_keeper(roof),
                                 update=lambda r: update_explanation(conn, r)).run(models,
                                                                                   refused)
        status = "complete"
    except KeyboardInterrupt:
        status = "incomplete"  # Ctrl-C: keep what finished, say so, print it
    except Exception as exc:  # a later test failed: keep and print what finished, then fail
        error = exc
    finally:
        run_id = _close_run(conn, run_id, status, len(done), console)
    if error is not None and not keep_error:
        raise error
    return BenchOutcome(run_id, status, [record(r) for r in done],
                        outcome.skipped, error)


def _close_run(conn: sqlite3.Connection, run_id: int, status: str, kept: int,
               console: Console) -> int:
    """Mark the run; a run that stored no result is deleted (a refused endpoint or a sweep
    that skipped everything is not a run). Returns the run id, 0 if deleted."""
    if not kept and discard_empty_run(conn, run_id):
        if status == "incomplete":  # a failure says so in its own one-line error
            console.print("interrupted before any test finished: nothing stored")
        return 0
    finish_run(conn, run_id, status)
    if status != "complete":
        console.print(f"run {run_id} marked {status}: {kept} finished result(s) kept")
    return run_id
