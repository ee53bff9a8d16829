"""A quality measurement, stored: every input checked before the host probe and before any
weights load, then one scoring pass per backend, each with the decode speed ratio from
stored bench results, saved as a host measurement. `strata quality` (commands/quality.py,
with its progress bar and printing) and `strata rank --quality` both run through
`score_and_store`."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from rich.console import Console

from strata.quality.run import Progress, QualityConfig, QualityResult, prepare, run_quality
from strata.quality.speed import decode_speed_ratio
from strata.store.hosts import save_measurement

MEASUREMENT_KIND = "quality"  # hosts.measurements.kind, next to 'roofline' and 'telemetry'

# (what is being scored, chunks in all) -> (what to hold open while it scores, the per-chunk
# callback): the CLI draws a progress bar (commands/quality.py); without one it runs quietly.
ScoreProgress = Callable[[str, int], tuple[AbstractContextManager[Any], Progress | None]]


def quiet(_what: str, _total: int) -> tuple[AbstractContextManager[Any], Progress | None]:
    return nullcontext(), None


class Partial(Exception):
    """A later backend failed after earlier ones were scored and stored: their results,
    to print before the error (`error`, what the user sees)."""

    def __init__(self, results: list[QualityResult], error: BaseException) -> None:
        super().__init__(str(error))
        self.results, self.error = results, error


def score_and_store(conn: sqlite3.Connection, config: QualityConfig, console: Console,
                    progress: ScoreProgress = quiet) -> list[QualityResult]:
    """One result per backend, stored; `console` takes the host probe's lines. A backend
    that fails after another was scored raises Partial (with what was scored)."""
    from strata.host import this_host

    prepared = prepare(config)
    fingerprint = this_host(conn, console).fingerprint
    results: list[QualityResult] = []
    for backend in prepared.backends:
        held, step = progress(f"{config.name or config.model} · {backend}: chunks of {config.ctx}",
                              prepared.plan.n_chunks)
        try:
            with held:
                result = run_quality(prepared, backend, progress=step)
        except Exception as exc:
            if results:
                raise Partial(results, exc) from exc
            raise
        if prepared.ref is not None:
            others = [b for b in prepared.backends if b != backend]
            ratio = decode_speed_ratio(conn, fingerprint, prepared.model.ref, prepared.ref.ref,
                                       prefer=[backend, *others])
            result.speed = ratio.to_dict() if ratio else None
        save_measurement(conn, fingerprint, MEASUREMENT_KIND, result.to_dict())
        results.append(result)
    return results
