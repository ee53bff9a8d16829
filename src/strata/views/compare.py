"""Terminal tables for `strata compare` and `strata history`."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from strata.bench.records import record
from strata.compare import ALPHA, HistoryRow, Pair, primary_metric
from strata.views.console import plain


def _speedup(p: Pair) -> Text:
    if p.speedup is None:
        return Text("—", style="dim")
    if p.significant is False:
        return Text(f"{p.speedup:.3f}", style="dim")
    return Text(f"{p.speedup:.3f}", style="green" if p.speedup > 1 else "red")


def _sig(p: Pair) -> str:
    if p.differs:
        return f"not like for like: {p.differs_text}"
    busy = [side for side, r in (("A", p.a), ("B", p.b)) if record(r).get("host_busy")]
    mark = f"; {' and '.join(busy)} on a busy host" if busy else ""
    if p.p is None:
        return f"n/a (< 2 samples){mark}"
    return f"{p.p:.3g} {'yes' if p.significant else 'no'}{mark}"


def compare_table(pairs: list[Pair], label_a: str, label_b: str) -> Table:
    # The labels are the selectors the user typed: a Text title, never markup or emoji.
    t = Table(title=plain(f"B = {label_b} vs A = {label_a} (speedup = B / A; significant: "
                          f"Welch p < {ALPHA})"), title_justify="left")
    for col, just in (("model", "left"), ("backend A/B", "left"), ("test", "left"),
                      ("threads", "right"), ("A t/s", "right"), ("B t/s", "right"),
                      ("speedup", "right"), ("p, significant", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for p in pairs:
        backends = p.a.backend if p.a.backend == p.b.backend else f"{p.a.backend}/{p.b.backend}"
        t.add_row(plain(p.a.model), plain(backends), plain(p.a.test), _threads(p),
                  mean_sd(p.a.metrics[p.metric]), mean_sd(p.b.metrics[p.metric]),
                  _speedup(p), plain(_sig(p)))
    return t


def _threads(p: Pair) -> str:
    a, b = record(p.a).get("n_threads"), record(p.b).get("n_threads")
    return "-" if a is None and b is None else (str(a) if a == b else f"{a}/{b}")


def mean_sd(summary: dict[str, Any], spec: str = ",.2f") -> str:
    """"mean ± SD", or the mean alone when one sample has no SD (never "± 0.00"); "!" marks
    an SD above the mean, as the bench table does."""
    mean, sd, n = summary.get("mean"), summary.get("sd"), summary.get("n") or 0
    if mean is None:
        return "-"
    if n < 2 or sd is None:
        return f"{mean:{spec}}"
    return f"{mean:{spec}} ± {sd:{spec}}" + (" !" if sd > mean else "")


def history_table(rows: list[HistoryRow]) -> Table:
    t = Table(title="Bench history", title_justify="left")
    for col in HISTORY_COLUMNS:
        t.add_column(col)
    for h in rows:
        r = h.result
        value = r.metrics.get(primary_metric(r), {})
        tps = mean_sd(value) if value else "-"
        t.add_row(str(r.run_id), h.started_at, h.status, h.fingerprint[:8],
                  *map(plain, (h.git_commit or "-", r.model, r.backend, r.test)), tps,
                  "yes" if record(r).get("host_busy") else "",
                  plain(h.build_commit or "-"))
    return t


# Whose commit each is: strata's checkout when the run was made; the llama.cpp build the
# result ran on (llama-bench's build_commit; "-" for other backends).
HISTORY_COLUMNS = ("run", "date", "status", "host", "strata commit", "model", "backend", "test",
                   "t/s", "busy", "llama.cpp commit")
# -o md: the table's columns, by their record field names
HISTORY_FIELDS = ("run_id", "run_started_at", "run_status", "fingerprint", "strata_commit",
                  "model_filename", "backend", "test", "avg_ts", "stddev_ts", "host_busy",
                  "build_commit")
COMPARE_FIELDS = ("model_filename", "backend_a", "backend_b", "test", "threads_a",
                  "threads_b", "avg_ts_a", "avg_ts_b", "host_busy_a", "host_busy_b", "speedup",
                  "p_value", "significant", "differs")
