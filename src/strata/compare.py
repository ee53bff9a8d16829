"""`strata compare A B` and `strata history`: speedups between matching results.

A side is a selector: a run id (`12` or `run:12`), a host (`host:<fingerprint prefix>`),
a backend (`backend:torch`) or a commit (`commit:<sha prefix>`). Results on the two sides
are paired on their configuration; when both sides select backends, the backend is what is
compared, so it leaves the key. Like for like: every load setting a run can sweep or default
(threads as the backend ran them, batch, ubatch, KV types, flash attention, ngl, device,
dtype; depth is in the test) must match too. A test both sides ran only with different
settings is listed with what differs and no speedup (a -t 64 run against a -t 1 run says
nothing about the backends). Significance is Welch's t-test on the raw samples.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from strata.bench.records import PRIMARY, SETTINGS, record
from strata.bench.scenario import BenchTest
from strata.errors import InputError
from strata.measure.stats import welch
from strata.store.runs import StoredResult, select_results

ALPHA = 0.05


@dataclass(frozen=True)
class Selector:
    kind: str
    value: str
    where: str
    args: tuple[Any, ...]

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.value}"


SELECTORS: dict[str, Callable[[str], tuple[str, tuple[Any, ...]]]] = {
    "run": lambda v: ("results.run_id = ?", (_run_id(v),)),
    "host": lambda v: ("runs.fingerprint LIKE ?", (v + "%",)),
    "backend": lambda v: ("results.backend = ?", (v,)),
    "commit": lambda v: ("runs.git_commit LIKE ?", (v + "%",)),  # strata's commit
}
# The figure compared, by its name in bench records (docs/output.md): *_ts, tokens/s.
METRIC_FIELD = {"prefill_tps": "prefill_ts", "decode_tps": "decode_ts",
                "combined_tps": "avg_ts"}


def _run_id(value: str) -> int:
    if not value.isdigit():
        raise InputError(f"run:{value}: a run id is a number (see strata history)")
    return int(value)


def parse_selector(text: str) -> Selector:
    kind, sep, value = text.partition(":")
    if not sep:
        kind, value = "run", text
    if kind not in SELECTORS or not value:
        raise InputError(f"{text}: expected a run id or run:N, host:FP, backend:NAME, commit:SHA")
    where, args = SELECTORS[kind](value)
    return Selector(kind, value, where, args)


def config_key(r: StoredResult, with_backend: bool) -> tuple[Any, ...]:
    key: tuple[Any, ...] = (r.model, r.test, r.n_prompt, r.n_gen, r.n_depth)
    if with_backend:
        key += (r.backend, json.dumps(r.load_config, sort_keys=True))
    return key


def settings(r: StoredResult) -> dict[str, Any]:
    """The result's load settings as its bench record shows them (threads as run)."""
    rec = record(r)
    return {field: rec.get(field) for field, _ in SETTINGS}


def _latest_by_key(results: list[StoredResult], with_backend: bool) -> dict[tuple, StoredResult]:
    # ordered by id: latest wins; the settings are part of the key (like for like)
    return {(*config_key(r, with_backend), *settings(r).values()): r for r in results}


def differences(a: StoredResult, b: StoredResult) -> dict[str, tuple[Any, Any]]:
    """Settings in which two results differ, by header name (threads, batch, ...)."""
    sa, sb = settings(a), settings(b)
    return {short: (sa[field], sb[field]) for field, short in SETTINGS
            if sa[field] != sb[field]}


@dataclass
class Pair:
    key: tuple[Any, ...]
    a: StoredResult
    b: StoredResult
    metric: str
    a_mean: float
    b_mean: float
    speedup: float | None  # b / a: > 1 means B is faster; None when not like for like
    p: float | None  # Welch two-sided p-value on the raw samples; None with < 2 each
    differs: dict[str, tuple[Any, Any]] | None = None  # settings that differ (no speedup)

    @property
    def significant(self) -> bool | None:
        return None if self.p is None else self.p < ALPHA

    @property
    def differs_text(self) -> str | None:
        if not self.differs:
            return None
        return ", ".join(f"{k} {_shown(a)} vs {_shown(b)}" for k, (a, b) in self.differs.items())


def _shown(value: Any) -> str:
    return "default" if value is None else str(value)


def primary_metric(r: StoredResult) -> str:
    return PRIMARY[BenchTest(r.n_prompt, r.n_gen, r.n_depth).kind]


def _pair(key: tuple[Any, ...], a: StoredResult, b: StoredResult) -> Pair | None:
    metric = primary_metric(a)
    ma, mb = a.metrics.get(metric), b.metrics.get(metric)
    if not ma or not mb or not ma.get("mean"):
        return None
    differs = differences(a, b)
    if differs:  # shown, not compared
        return Pair(key, a, b, metric, ma["mean"], mb["mean"], None, None, differs)
    test = welch(ma.get("samples", []), mb.get("samples", []))
    return Pair(key, a, b, metric, ma["mean"], mb["mean"], mb["mean"] / ma["mean"],
                test.p if test else None)


def compare(conn: sqlite3.Connection, side_a: str, side_b: str) -> list[Pair]:
    a, b = parse_selector(side_a), parse_selector(side_b)
    if a.label == b.label:
        raise InputError(f"A and B are the same runs ({a.label}): give two different "
                         "selectors (see strata history)")
    with_backend = not (a.kind == b.kind == "backend")
    ra = _latest_by_key(select_results(conn, a.where, a.args), with_backend)
    rb = _latest_by_key(select_results(conn, b.where, b.args), with_backend)
    for sel, found in ((a, ra), (b, rb)):
        if not found:
            raise InputError(f"{sel.label}: no stored results match (see strata history)")
    pairs = [p for key in ra if key in rb and (p := _pair(key, ra[key], rb[key]))]
    pairs += _unmatched(ra, rb, {p.key for p in pairs})
    if not pairs:
        raise InputError(f"{a.label} and {b.label} share no configuration (same model, test "
                         "and settings); nothing to compare")
    return pairs


def _unmatched(ra: dict[tuple, StoredResult], rb: dict[tuple, StoredResult],
               paired: set[tuple]) -> list[Pair]:
    """Tests both sides ran, never with the same settings: the latest of each, shown with
    what differs and no speedup."""
    cut = len(SETTINGS)  # a key is (configuration..., settings...)
    done = {k[:-cut] for k in paired}
    first = {k[:-cut]: r for k, r in ra.items()}  # ordered by id: the latest wins
    second = {k[:-cut]: r for k, r in rb.items()}
    return [p for base, a in first.items() if base in second and base not in done
            and (p := _pair(base, a, second[base]))]


def _commits(conn: sqlite3.Connection) -> dict[int, str | None]:
    return {row[0]: row[1] for row in conn.execute("SELECT id, git_commit FROM runs")}


def _side(r: StoredResult, strata_commit: str | None, suffix: str) -> dict[str, Any]:
    rec = record(r)
    return {f"{k}_{suffix}": v for k, v in (
        ("backend", r.backend), ("run_id", r.run_id), ("result_id", r.id),
        ("avg_ts", rec["avg_ts"]), ("stddev_ts", rec["stddev_ts"]), ("n", rec["n"]),
        ("eta", rec["eta"]), ("host_busy", rec.get("host_busy")),
        ("strata_commit", strata_commit),
        ("build_commit", rec.get("build_commit")))}


def pair_records(conn: sqlite3.Connection, pairs: list[Pair]) -> list[dict[str, Any]]:
    """`strata compare` as flat records: the configuration, each side's figures suffixed
    _a and _b, speedup (B / A), Welch's p_value and significant (docs/output.md)."""
    commits = _commits(conn)
    return [{"model_filename": p.a.model, "test": p.a.test, "n_prompt": p.a.n_prompt,
             "n_gen": p.a.n_gen, "n_depth": p.a.n_depth,
             "metric": METRIC_FIELD.get(p.metric, p.metric),
             **_side(p.a, commits.get(p.a.run_id), "a"),
             **_side(p.b, commits.get(p.b.run_id), "b"),
             "threads_a": record(p.a).get("n_threads"),
             "threads_b": record(p.b).get("n_threads"),
             "speedup": p.speedup, "p_value": p.p, "significant": p.significant,
             "differs": p.differs_text}
            for p in pairs]


@dataclass
class HistoryRow:
    result: StoredResult
    fingerprint: str
    git_commit: str | None  # strata's commit when the run was made
    started_at: str
    status: str

    @property
    def build_commit(self) -> str | None:
        """llama.cpp's commit (llama-bench's build_commit), where the result recorded one."""
        return record(self.result).get("build_commit")

    def to_record(self) -> dict[str, Any]:
        """A bench record (every field) with its run's context (docs/output.md)."""
        return {"result_id": self.result.id, "run_id": self.result.run_id,
                "run_status": self.status, "run_started_at": self.started_at,
                "fingerprint": self.fingerprint, "strata_commit": self.git_commit,
                **record(self.result)}


def history(conn: sqlite3.Connection, model: str | None, backend: str | None,
            test: str | None) -> list[HistoryRow]:
    """Every stored result (oldest first), optionally narrowed, with its run's context."""
    where, args = [], []
    for column, value in (("results.model", model), ("results.backend", backend),
                          ("results.test", test)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    results = select_results(conn, " AND ".join(where), args)
    if not results:
        raise InputError("no stored bench results match: run strata bench first")
    runs = {row["id"]: row for row in conn.execute("SELECT * FROM runs")}
    return [HistoryRow(r, runs[r.run_id]["fingerprint"], runs[r.run_id]["git_commit"],
                       runs[r.run_id]["started_at"], runs[r.run_id]["status"])
            for r in results]
