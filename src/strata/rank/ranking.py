"""`strata rank`: place every candidate, reuse what the DB holds, measure what is missing
within the time budget (fastest first, so the slowest are the ones cut), predict the rest,
and order the candidates per profile by the one score (score.py)."""

from __future__ import annotations

import sqlite3
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from strata.bench import sweep
from strata.bench.plan import BenchConfig, RepPolicy
from strata.bench.scenario import BenchTest
from strata.fit.predict import EtaHistory
from strata.host import Host, this_host
from strata.measure.roofline import Roofline
from strata.quality import stored
from strata.rank import measure, score
from strata.rank.candidates import Candidate, place
from strata.rank.profiles import Profile

# Rank's repetitions: enough for a mean to order models by, not a paper's CI (bench does that).
RANK_REPS = RepPolicy(min_reps=2, max_reps=3, target_rel_ci=0.05, max_time_s=30.0)


@dataclass
class Entry:
    """One candidate under one profile."""

    candidate: Candidate
    profile: Profile
    figures: list[score.Figures]
    basis: str  # measured | reused | predicted (the weakest of its tests)
    score: float | None
    verdict: str | None
    note: str = ""
    ppl: float | None = None
    kl: float | None = None

    def record(self, rank: int | None) -> dict[str, Any]:
        c = self.candidate
        return {"profile": self.profile.name, "rank": rank, "model_filename": c.ref,
                "backend": c.backend, "device": c.device, "score": self.score,
                "verdict": self.verdict, "basis": self.basis,
                "prefill_ts": _worst(self.figures, "prefill_ts", min),
                "decode_ts": _worst(self.figures, "decode_ts", min),
                "ttft_ms": (_worst(self.figures, "ttft_s", max) or 0) * 1e3
                if self.figures else None,
                "ttft_measured": all(f.ttft_measured for f in self.figures)
                if self.figures else None,
                "n_depth": [f.depth for f in self.figures], "ppl": self.ppl, "kl": self.kl,
                "fits": c.unfit is None, "note": self.note}


def _worst(figures: list[score.Figures], name: str, pick: Any) -> float | None:
    return pick(getattr(f, name) for f in figures) if figures else None


@dataclass
class RankOutcome:
    entries: dict[str, list[Entry]]  # profile name -> best first
    cut: list[tuple[str, str]] = field(default_factory=list)  # (candidate, why)
    reused: int = 0
    measured: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    budget_s: float = 0.0
    spent_s: float = 0.0
    ratios: list[float] = field(default_factory=list)  # measured time / predicted time

    def slowdown(self) -> float:
        """How much slower than predicted the candidates measured so far ran (median, at
        least 1): later estimates are scaled by it, so the budget holds when the
        predictions are optimistic."""
        return max(1.0, statistics.median(self.ratios)) if self.ratios else 1.0

    def records(self) -> list[dict[str, Any]]:
        return [e.record(i + 1 if e.score is not None and e.basis != measure.PREDICTED
                         else None)
                for entries in self.entries.values() for i, e in enumerate(entries)]


@dataclass
class RankRequest:
    refs: list[str]
    profiles: list[Profile]
    backend: str = "llamacpp"
    budget_s: float = 600.0
    quality: bool = False
    ref: str | None = None  # quality reference (same vocabulary)
    quality_chunks: int = 8
    reps: RepPolicy = RANK_REPS


@dataclass(frozen=True)
class RankProgress:
    """How rank's measurements report their progress (the CLI: bench's and quality's bars,
    commands/bench.py and commands/quality.py); quiet by default."""

    bench: sweep.SweepProgress = sweep.quiet
    quality: stored.ScoreProgress = stored.quiet


def run_rank(conn: sqlite3.Connection, req: RankRequest, console: Console,
             progress: RankProgress = RankProgress()) -> RankOutcome:
    host = this_host(conn, console)
    roof = host.roofline(console)
    tests = sorted({t for p in req.profiles for t in p.tests()})
    ctx = max(p.context for p in req.profiles)
    out = RankOutcome({}, budget_s=req.budget_s)
    cands = _placed(req, host, ctx, out)
    figures = {plan.candidate.label: _gather(conn, plan, req, out, console, progress.bench)
               for plan in _plans(conn, host, roof, cands, tests, req)}
    quality = _quality(conn, req, cands, out, console, progress.quality) if req.quality \
        else {}
    for p in req.profiles:
        entries = [_entry(p, c, figures[c.label], quality.get(c.ref)) for c in cands]
        out.entries[p.name] = sorted(entries, key=_order)
    from strata.store.hosts import save_measurement

    save_measurement(conn, host.fingerprint, "rank", {"records": out.records(),
                                                       "cut": out.cut})
    return out


def _placed(req: RankRequest, host: Host, ctx: int, out: RankOutcome) -> list[Candidate]:
    """Every model placed; one that cannot be read (a damaged file in a ranked folder) is a
    line among the skipped, not the end of the ranking."""
    from strata.errors import InputError

    cands = []
    for ref in req.refs:
        try:
            cands.append(place(ref, req.backend, host.profile, ctx))
        except InputError as exc:
            out.skipped.append((ref, str(exc)))
    if not cands:
        raise InputError("no model to rank could be read: " + "; ".join(
            f"{ref}: {why}" for ref, why in out.skipped))
    return cands


def _within(c: Candidate, t: BenchTest) -> bool:
    """Does the test fit the model's context (an endpoint's is the server's business)?"""
    spec = c.model.spec
    return spec is None or not spec.ctx_max or t.depth + t.n_prompt + t.n_gen <= spec.ctx_max


def _too_short(p: Profile, c: Candidate) -> str | None:
    spec = c.model.spec
    need = max(p.depths) + p.prompt_tokens + p.gen_tokens
    if spec is None or not spec.ctx_max or need <= spec.ctx_max:
        return None
    return (f"context too short for this profile: it needs {need:,} tokens, the model "
            f"holds {spec.ctx_max:,}")


def _order(e: Entry) -> tuple[int, float]:
    """Measured (or reused) scores first, best first; then predictions; then the unscored."""
    group = 0 if e.score is not None and e.basis != measure.PREDICTED else (
        1 if e.score is not None else 2)
    return group, -(e.score or 0.0)


# -- gathering figures -----------------------------------------------------------------


@dataclass
class _Plan:
    candidate: Candidate
    reused: dict[BenchTest, measure.TestFigure]
    guesses: dict[BenchTest, measure.TestFigure]
    missing: list[BenchTest]
    estimate_s: float | None


def _plans(conn: sqlite3.Connection, host: Host, roof: Roofline, cands: list[Candidate],
           tests: list[BenchTest], req: RankRequest) -> list[_Plan]:
    """What each candidate still needs, ordered by its predicted time: the budget then cuts
    the slowest. Endpoints (no prediction) go first: their speed is the question."""
    plans = []
    histories: dict[str, EtaHistory] = {}
    cache = host.profile.cpu.last_level_cache_bytes()
    for c in cands:
        history = histories.setdefault(c.backend, EtaHistory.from_db(
            conn, host.fingerprint, c.backend, cache))
        mine = [t for t in tests if _within(c, t)]  # never measured past its context
        reused = measure.reusable(conn, host.fingerprint, c, mine)
        guesses = measure.predicted(c, roof, history, mine, cache)
        # for the budget only, a cache-resident model gets a time estimate too (roofline x η
        # is no honest figure for it, but it bounds the time well enough to plan)
        timing = guesses or measure.predicted(c, roof, history, mine, None)
        missing = [t for t in mine if t not in reused]
        plans.append(_Plan(c, reused, guesses, missing,
                           measure.estimate_s(missing, timing, req.reps.max_reps)))
    return sorted(plans, key=lambda plan: plan.estimate_s or 0.0)


def _gather(conn: sqlite3.Connection, plan: _Plan, req: RankRequest, out: RankOutcome,
            console: Console,
            progress: sweep.SweepProgress) -> dict[BenchTest, measure.TestFigure]:
    c = plan.candidate
    got = dict(plan.reused)
    out.reused += len(plan.reused)
    if not plan.missing:
        return got
    if c.unfit is not None:
        return {**plan.guesses, **got}
    left = req.budget_s - out.spent_s
    need = None if plan.estimate_s is None else plan.estimate_s * out.slowdown()
    if left <= 0 or (need is not None and need > left):
        out.cut.append((c.label, f"needs about {(need or 0) / 60:.1f} min (predicted, x "
                        f"{out.slowdown():.1f} as the measured ones ran), "
                        f"{max(left, 0) / 60:.1f} min of the budget left"))
        return {**plan.guesses, **got}
    start = time.monotonic()
    measured = _bench(conn, c, plan.missing, req, out, console, progress)
    took = time.monotonic() - start
    out.spent_s += took
    if plan.estimate_s:
        out.ratios.append(took / plan.estimate_s)
    out.measured += len(measured)
    return {**plan.guesses, **got, **measured}


def _bench(conn: sqlite3.Connection, c: Candidate, missing: list[BenchTest],
           req: RankRequest, out: RankOutcome, console: Console,
           progress: sweep.SweepProgress) -> dict[BenchTest, measure.TestFigure]:
    config = BenchConfig(models=[c.ref], backends=[c.backend], tests=missing, loads=[c.load],
                         reps=req.reps)
    outcome = sweep.run_sweep(conn, config, console, keep_error=True, progress=progress)
    out.skipped += outcome.skipped
    if outcome.error is not None:  # what finished is stored and used; the rest is predicted
        out.skipped.append((c.label, str(outcome.error)))
    return measure.from_records(outcome.records, missing)


def _quality(conn: sqlite3.Connection, req: RankRequest, cands: list[Candidate],
             out: RankOutcome, console: Console,
             progress: stored.ScoreProgress) -> dict[str, tuple[float, float | None]]:
    """Perplexity (and KL against --ref) of every candidate that runs here."""
    from strata.errors import InputError
    from strata.quality.run import QualityConfig

    found: dict[str, tuple[float, float | None]] = {}
    for c in cands:
        if c.is_endpoint or c.unfit is not None:
            continue
        config = QualityConfig(model=c.ref, ref=req.ref, backend=c.backend,
                               max_chunks=req.quality_chunks)
        try:
            result = stored.score_and_store(conn, config, console, progress)[0]
        except InputError as exc:
            out.skipped.append((f"{c.ref} quality", str(exc)))
            continue
        found[c.ref] = (result.figures.ppl, result.figures.kl)
    return found


# -- scoring ---------------------------------------------------------------------------


def _entry(p: Profile, c: Candidate, got: dict[BenchTest, measure.TestFigure],
           quality: tuple[float, float | None] | None) -> Entry:
    ppl, kl = quality or (None, None)
    short = _too_short(p, c)
    if short:
        return Entry(c, p, [], measure.PREDICTED, None, None, short, ppl, kl)
    depths, bases = [], set()
    for d in p.depths:
        pp = got.get(BenchTest(p.prompt_tokens, 0, d))
        tg = got.get(BenchTest(0, p.gen_tokens, d))
        if pp is None or tg is None:
            why = c.unfit or "no figure: neither measured nor predictable here"
            return Entry(c, p, [], measure.PREDICTED, None, None, why, ppl, kl)
        bases |= {pp.basis, tg.basis}
        # an endpoint's streamed TTFT includes what a user waits for (HTTP, queueing, the
        # first decode step); in-process, the pp test's TTFT is its prefill alone
        measured_ttft = (c.is_endpoint and pp.ttft_ms is not None
                         and pp.basis != measure.PREDICTED)
        ttft = pp.ttft_ms / 1e3 if measured_ttft else score.derived_ttft(
            p.prompt_tokens, pp.ts, tg.ts)
        depths.append(score.Figures(d, pp.ts, tg.ts, ttft, measured_ttft))
    basis = next(b for b in (measure.PREDICTED, measure.MEASURED, measure.REUSED)
                 if b in bases)
    busy = any(f.busy for f in got.values() if f.basis != measure.PREDICTED)
    note = c.unfit or ("host busy while measured: slower than when quiet" if busy else "")
    return Entry(c, p, depths, basis, score.score(p, depths), score.verdict(p, depths),
                 note, ppl, kl)


def pareto(entries: list[Entry]) -> list[Entry]:
    """The quality-vs-speed frontier: entries no other entry beats on both score (higher)
    and perplexity (lower)."""
    scored = [e for e in entries if e.score is not None and e.ppl is not None]
    return [e for e in scored
            if not any(o is not e and o.score >= e.score and o.ppl <= e.ppl  # type: ignore
                       and (o.score > e.score or o.ppl < e.ppl) for o in scored)]  # type: ignore
