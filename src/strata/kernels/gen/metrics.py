"""Metrics that rank language models as kernel writers on this host, and the skills A/B test.

Terms. An *attempt* is one turn: one model reply and the lab's verdict on it. A *sample* is
one conversation, the attempts sharing (run, model, dialect, op, sample, skill). Its *result*
is its best turn: the correct turn (status slow or ok) with the highest speedup over torch
eager, else the turn whose status got furthest through the judge (format < static < compile
< runtime < mismatch < implausible); ties go to the earlier turn. Scores are per
model x dialect (and skill, when one was given) over every sample of every op.

- compile rate: share of samples whose result compiled, i.e. reached runtime or beyond
  (format, static and compile failures did not).
- correct rate: share of samples with a correct turn (verified on this host: slow or ok).
- pass@k: per op, the unbiased estimator 1 - C(n-c, k) / C(n, k) with n the op's samples
  and c its correct samples (the chance that at least one of k samples drawn without
  replacement is correct), averaged over ops; absent (None) when an op has fewer than k
  samples.
- fast_p (p = 1, 1.5, 2): share of samples whose result is correct AND more than p times
  faster than the baseline, against torch eager (eager@p, timing.speedup_eager) and against
  the best verified implementation when it was judged (best@p, timing.speedup_best). A
  correct kernel without a timing counts as not fast.
- geomean speedup: per op, the best speedup over torch eager among its correct samples;
  the geometric mean of those over the ops that have one. coverage: the share of ops that
  entered it (ops with a timed correct kernel / ops).
- turns to first correct: over the samples that reached a correct turn, the mean number of
  turns up to and including the first correct one (the first turn counts 1).
- tokens per correct kernel: tokens in + out over all turns of all samples, divided by the
  number of correct samples; absent when any attempt lacks `usage` figures from its server,
  or when no sample is correct.
- cheats caught: attempts where a guard fired (cheat flag: sandbox, link check, static
  check, plausibility, input tampering), as a count and as a share of all attempts.

Skills A/B. The student runs the same ops, samples and seeds with the skill and without it;
the paired unit is (model, dialect, op, sample index). Per unit and arm the outcome is 1/0
for correct and for fast_1 (correct and > 1x torch eager). The lift is the mean over units
with the skill minus the mean without; its 95% CI is a paired bootstrap (units resampled
with replacement, 10000 draws, fixed seed 0, percentiles 2.5 and 97.5, linear
interpolation). Token ratio: tokens in + out of all turns over the paired units, with the
skill / without (absent when a server gave no usage). Verdict, on the correct-rate lift:
*beneficial* when the CI's lower bound is above 0, or the lift is >= 0 and the token ratio
<= 0.8; *harmful* when the CI's upper bound is below 0; else *no measurable effect*. The
same rule is applied to the fast_1 lift and reported beside it.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from statistics import mean

from strata.errors import InputError
from strata.kernels.gen.records import STATUSES, Attempt
from strata.measure.stats import percentile

FAST_PS = (1.0, 1.5, 2.0)
BASELINES = ("eager", "best")
COMPILED_FROM = STATUSES.index("runtime")  # statuses from here on got past the compiler
NOT_TIMED = "not timed"
BENEFICIAL, HARMFUL, NO_EFFECT = "beneficial", "harmful", "no measurable effect"


# -- the estimators ----------------------------------------------------------------------------

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: 1 - C(n-c, k) / C(n, k), for n samples of which c are correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def fast_p(tasks: list[tuple[bool, float | None]], p: float) -> float:
    """Share of (correct, speedup) tasks that are correct and faster than p; 0.0 for none."""
    if not tasks:
        return 0.0
    return sum(1 for ok, s in tasks if ok and s is not None and s > p) / len(tasks)


def geomean(xs: Iterable[float | None]) -> float | None:
    """Geometric mean of the positive values given (None and non-positive are skipped)."""
    logs = [math.log(x) for x in xs if x is not None and x > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


def paired_bootstrap(with_: Sequence[float], without: Sequence[float], *, n: int = 10000,
                     seed: int = 0, stat: Callable[[Sequence[float]], float] = mean,
                     ) -> tuple[float, float, float]:
    """(lift, lo95, hi95): stat(with) - stat(without), units resampled in pairs."""
    if len(with_) != len(without) or not with_:
        raise ValueError(f"paired bootstrap needs two equal, non-empty lists "
                         f"({len(with_)} and {len(without)} values)")
    lift = stat(with_) - stat(without)
    rng = random.Random(seed)
    units = range(len(with_))
    diffs = []
    for _ in range(n):
        idx = rng.choices(units, k=len(with_))
        diffs.append(stat([with_[i] for i in idx]) - stat([without[i] for i in idx]))
    return lift, percentile(diffs, 2.5), percentile(diffs, 97.5)


def skill_verdict(lift_lo: float, lift_hi: float, lift: float,
                  token_ratio: float | None) -> str:
    """The issue's rule: beneficial / harmful / no measurable effect."""
    if lift_lo > 0 or (lift >= 0 and token_ratio is not None and token_ratio <= 0.8):
        return BENEFICIAL
    if lift_hi < 0:
        return HARMFUL
    return NO_EFFECT


# -- samples -----------------------------------------------------------------------------------

@dataclass
class Sample:
    """One conversation and what it came to."""

    run: str
    model: str
    dialect: str
    op: str
    sample: int
    skill: str | None
    attempts: list[Attempt]  # in turn order
    result: Attempt  # the best turn (see the module docstring)
    first_correct: int | None  # turns up to and including the first correct one (1-based)

    @property
    def correct(self) -> bool:
        return self.result.correct

    @property
    def compiled(self) -> bool:
        return STATUSES.index(self.result.status) >= COMPILED_FROM

    @property
    def tokens(self) -> int | None:
        return total_tokens(self.attempts)


def total_tokens(attempts: Iterable[Attempt]) -> int | None:
    """Tokens in + out of every attempt; None as soon as one lacks usage figures."""
    total = 0
    for a in attempts:
        if a.tokens_in is None or a.tokens_out is None:
            return None
        total += a.tokens_in + a.tokens_out
    return total


def _rank(a: Attempt) -> tuple[int, float, int]:
    """Larger is better: correct beats everything, then speedup, then how far it got."""
    speed = a.timing.speedup_eager if a.correct and a.timing.speedup_eager is not None else 0.0
    return (int(a.correct), speed if a.correct else STATUSES.index(a.status), -a.turn)


def samples(attempts: Iterable[Attempt]) -> list[Sample]:
    """Group attempts into conversations, in first-seen order."""
    groups: dict[tuple, list[Attempt]] = defaultdict(list)
    for a in attempts:
        if a.status not in STATUSES:
            raise InputError(f"attempt {a.id or ''} has unknown status {a.status!r}; "
                             f"expected one of {', '.join(STATUSES)}")
        groups[(a.run, a.model, a.dialect, a.op, a.sample, a.skill)].append(a)
    out = []
    for (run, model, dialect, op, sample, skill), group in groups.items():
        group.sort(key=lambda a: a.turn)
        first = next((i + 1 for i, a in enumerate(group) if a.correct), None)
        out.append(Sample(run, model, dialect, op, sample, skill, group,
                          max(group, key=_rank), first))
    return out


# -- the leaderboard ---------------------------------------------------------------------------

@dataclass
class Scores:
    """One leaderboard row: a model writing one dialect (with one skill, or none)."""

    model: str
    dialect: str
    skill: str | None
    samples: int
    ops: int
    attempts: int
    compile_rate: float
    correct_rate: float
    pass_at: dict[int, float | None] = field(default_factory=dict)  # k -> pass@k
    # "eager@1", ..., "best@2" -> share; None when nothing was timed (--no-bench)
    fast: dict[str, float | None] = field(default_factory=dict)
    geomean_speedup: float | None = None
    coverage: float | None = 0.0  # None when nothing was timed
    turns_to_first_correct: float | None = None
    tokens_per_correct: float | None = None
    cheats: int = 0
    cheat_rate: float = 0.0


def fast_key(baseline: str, p: float) -> str:
    return f"{baseline}@{p:g}"


def _speedup(a: Attempt, baseline: str) -> float | None:
    return a.timing.speedup_eager if baseline == "eager" else a.timing.speedup_best


def _pass_at(group: list[Sample], ks: Iterable[int]) -> dict[int, float | None]:
    by_op: dict[str, list[bool]] = defaultdict(list)
    for s in group:
        by_op[s.op].append(s.correct)
    out: dict[int, float | None] = {}
    for k in ks:
        if any(len(v) < k for v in by_op.values()):
            out[k] = None
        else:
            out[k] = mean(pass_at_k(len(v), sum(v), k) for v in by_op.values())
    return out


def _best_per_op(group: list[Sample]) -> dict[str, float | None]:
    best: dict[str, float | None] = {}
    for s in group:
        speed = s.result.timing.speedup_eager if s.correct else None
        old = best.get(s.op)
        best[s.op] = speed if old is None else (old if speed is None else max(old, speed))
    return best


def _score_group(group: list[Sample], ks: Iterable[int]) -> Scores:
    head = group[0]
    attempts = [a for s in group for a in s.attempts]
    n = len(group)
    correct = sum(s.correct for s in group)
    # nothing timed (--no-bench): fast_p and coverage are unknown, not 0
    timed = any(a.timing.speedup_eager is not None for a in attempts)
    fast = {fast_key(b, p): fast_p([(s.correct, _speedup(s.result, b)) for s in group], p)
            if timed else None for b in BASELINES for p in FAST_PS}
    best = _best_per_op(group)
    firsts = [s.first_correct for s in group if s.first_correct is not None]
    tokens = total_tokens(attempts)
    cheats = sum(a.cheat for a in attempts)
    return Scores(
        model=head.model, dialect=head.dialect, skill=head.skill, samples=n, ops=len(best),
        attempts=len(attempts), compile_rate=sum(s.compiled for s in group) / n,
        correct_rate=correct / n, pass_at=_pass_at(group, ks), fast=fast,
        geomean_speedup=geomean(best.values()),
        coverage=sum(v is not None and v > 0 for v in best.values()) / len(best)
        if timed else None,
        turns_to_first_correct=mean(firsts) if firsts else None,
        tokens_per_correct=tokens / correct if tokens is not None and correct else None,
        cheats=cheats, cheat_rate=cheats / len(attempts))


def score(attempts: list[Attempt], ks: Iterable[int] = (1, 2, 4)) -> list[Scores]:
    """One Scores per model x dialect (x skill), in first-seen order."""
    groups: dict[tuple, list[Sample]] = defaultdict(list)
    for s in samples(attempts):
        groups[(s.model, s.dialect, s.skill)].append(s)
    return [_score_group(g, tuple(ks)) for g in groups.values()]


# -- skills A/B --------------------------------------------------------------------------------

@dataclass
class Lift:
    """One metric's paired comparison (means over the paired units)."""

    metric: str
    without: float
    with_: float
    lift: float
    lo95: float
    hi95: float
    verdict: str


@dataclass
class SkillAB:
    skill: str | None
    model: str
    dialect: str
    units: int  # paired (model, dialect, op, sample) units
    unpaired: int  # units present in one arm only (left out)
    correct: Lift
    fast_1: Lift
    tokens_without: int | None
    tokens_with: int | None
    token_ratio: float | None
    verdict: str  # the correct-rate lift's verdict (see the module docstring)


def _units(attempts: list[Attempt], arm: str) -> dict[tuple, Sample]:
    out: dict[tuple, Sample] = {}
    for s in samples(attempts):
        key = (s.model, s.dialect, s.op, s.sample)
        if key in out:
            raise InputError(f"the {arm} arm holds sample {s.sample} of {s.op} "
                             f"({s.model}, {s.dialect}) twice (runs {out[key].run!r} and "
                             f"{s.run!r}); give each arm one run")
        out[key] = s
    return out


def _lift(metric: str, with_: list[float], without: list[float], ratio: float | None,
          n: int, seed: int) -> Lift:
    lift, lo, hi = paired_bootstrap(with_, without, n=n, seed=seed)
    return Lift(metric, mean(without), mean(with_), lift, lo, hi,
                skill_verdict(lo, hi, lift, ratio))


def _is_fast_1(s: Sample) -> float:
    speed = s.result.timing.speedup_eager
    return float(s.correct and speed is not None and speed > 1.0)


def skills_ab(with_skill: list[Attempt], without: list[Attempt], *, n: int = 10000,
              seed: int = 0) -> SkillAB:
    """Pair the two arms by unit and compare correct rate, fast_1 and tokens."""
    arm_w, arm_o = _units(with_skill, "with-skill"), _units(without, "without-skill")
    keys = [k for k in arm_w if k in arm_o]
    if not keys:
        raise InputError("no (op, sample) unit appears in both arms of the skills A/B; "
                         "run the same ops and samples with and without the skill")
    sw, so = [arm_w[k] for k in keys], [arm_o[k] for k in keys]
    tok_w = total_tokens(a for s in sw for a in s.attempts)
    tok_o = total_tokens(a for s in so for a in s.attempts)
    ratio = tok_w / tok_o if tok_w is not None and tok_o else None
    correct = _lift("correct_rate", [float(s.correct) for s in sw],
                    [float(s.correct) for s in so], ratio, n, seed)
    fast = _lift("fast_1", [_is_fast_1(s) for s in sw], [_is_fast_1(s) for s in so],
                 ratio, n, seed)
    if not any(s.result.timing.speedup_eager is not None for s in (*sw, *so)):
        fast.verdict = NOT_TIMED  # all zeros because nothing was measured, not a finding
    skills = sorted({s.skill or "" for s in sw})
    return SkillAB(skill=", ".join(skills) or None, model=sw[0].model, dialect=sw[0].dialect,
                   units=len(keys), unpaired=len(arm_w) + len(arm_o) - 2 * len(keys),
                   correct=correct, fast_1=fast, tokens_without=tok_o, tokens_with=tok_w,
                   token_ratio=ratio, verdict=correct.verdict)
