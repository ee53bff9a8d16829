"""Peaks are maxima: a roofline figure is the best of several trials, kept until it holds.

One trial (a STREAM pass, a timed matmul) can land on a moment when the OS, another process
or a clock change cost it a third of its speed. The best of one trial then halves every
ceiling computed from it. `best_of_trials` repeats a trial until the best two agree within
`StabilityRule.agree_rel` (the peak was reached twice), bounded by a count and a time, and
keeps every trial's value so the spread is stored next to the figure.

The stopping rule is the pure function `stop_reason(values, spent_s, rule)`; recorded trial
values can be fed to it.

Across runs the same holds: a later `probe --measure` of the same host (same fingerprint: the
same hardware and software stack) keeps an earlier run's stable peak when it measures less
(`keep_stored_peaks`), so one slow run cannot lower every ceiling computed afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from strata.measure.roofline import Figure, Roofline


@dataclass(frozen=True)
class StabilityRule:
    min_trials: int = 3
    max_trials: int = 8
    agree_rel: float = 0.03  # best two trials within 3% of the best: the peak holds
    max_time_s: float = 12.0  # all trials of one figure (group) together

    def __post_init__(self) -> None:
        if not 1 <= self.min_trials <= self.max_trials:
            raise ValueError(f"need 1 <= min_trials <= max_trials, got {self}")


def best_two_gap(values: list[float]) -> float | None:
    """(best - second best) / best; None with fewer than two positive values."""
    top = sorted((v for v in values if v > 0), reverse=True)[:2]
    return (top[0] - top[1]) / top[0] if len(top) == 2 else None


def spread(values: list[float]) -> float | None:
    """(best - worst) / best over the trials: how much one trial alone could be off."""
    good = [v for v in values if v > 0]
    return (max(good) - min(good)) / max(good) if len(good) >= 2 else None


def stop_reason(values: list[float], spent_s: float, rule: StabilityRule) -> str | None:
    """Why to stop after these trials, or None to run another."""
    gap = best_two_gap(values)
    if len(values) >= rule.min_trials and gap is not None and gap <= rule.agree_rel:
        return f"stable: best two of {len(values)} trials within {gap:.1%}"
    if len(values) >= rule.max_trials:
        return _unstable(values, f"max trials ({rule.max_trials})")
    if spent_s >= rule.max_time_s and len(values) >= min(rule.min_trials, 2):
        return _unstable(values, f"time limit ({rule.max_time_s:g} s)")
    return None


def _unstable(values: list[float], limit: str) -> str:
    gap = best_two_gap(values)
    seen = f"best two {gap:.1%} apart" if gap is not None else "one usable trial"
    return f"NOT stable: {limit} reached, {seen}"


def is_stable(reason: str) -> bool:
    return reason.startswith("stable")


Trial = Callable[[], Mapping[str, Figure]]


def best_of_trials(trial: Trial, rule: StabilityRule,
                   clock: Callable[[], float] = time.perf_counter) -> dict[str, Figure]:
    """Run `trial` (one pass measuring one or more named figures) until every figure is
    stable or a bound is hit; each figure is its best trial, with all trial values kept."""
    runs: list[Mapping[str, Figure]] = []
    t0 = clock()
    while True:
        runs.append(trial())
        values = {k: [r[k].value for r in runs if k in r] for k in runs[0]}
        reasons = {k: stop_reason(v, clock() - t0, rule) for k, v in values.items()}
        if all(reasons.values()):
            break
    out = {}
    for key, vals in values.items():
        best = max((r[key] for r in runs if key in r), key=lambda f: f.value)
        out[key] = replace(best, trials=vals, spread=spread(vals),
                           stability=str(reasons[key]))
    return out


def merge_best(old: Figure | None, new: Figure, why: str) -> Figure:
    """The higher of two measurements of one figure (peaks are maxima), every trial kept;
    `why` says what the later measurement was for (a re-measure, a second attempt)."""
    if old is None:
        return new
    trials = [*(old.trials or [old.value]), *(new.trials or [new.value])]
    best = new if new.value > old.value else old
    said = best.stability or ""
    return replace(best, trials=trials, spread=spread(trials),
                   stability=said if why in said else f"{said}; {why}".lstrip("; "))


KEEP_TRIALS = 32  # trial values kept per figure across runs (the newest): enough for a spread


def _reached(fig: Figure) -> bool:
    """A figure whose best two trials agreed: the peak was reached, not a one-off."""
    return bool(fig.stability) and is_stable(str(fig.stability))


def keep_stored_peaks(new: Roofline, stored: Roofline) -> list[str]:
    """Fold an earlier run's stable figures of this host into `new` (each figure the higher;
    trials of both runs kept, newest KEEP_TRIALS) and say which figures kept the earlier value.

    Only figures that were stable when stored are kept: an unstable high value (a timer
    glitch) must not outlive the run that produced it. `strata probe --measure --fresh`
    stores a measurement as is (after a BIOS, firmware or power-limit change)."""
    kept = []
    for dev in new.devices:
        old = stored.device(dev.device)
        if old is None:
            continue
        for kind in ("bandwidth", "compute"):
            figures: dict[str, Figure] = getattr(dev, kind)
            for name, before in getattr(old, kind).items():
                now = figures.get(name)
                if now is None or not _reached(before):
                    continue
                merged = merge_best(before, now, "best over runs of this host")
                figures[name] = replace(merged, trials=merged.trials[-KEEP_TRIALS:],
                                        spread=spread(merged.trials[-KEEP_TRIALS:]))
                if before.value > now.value:
                    kept.append(f"{dev.device} {name}: measured {now.value:.4g} now, kept "
                                f"{before.value:.4g} from an earlier run (peaks are maxima; "
                                "--fresh forgets it)")
    return kept


def merge_roofline(into: Roofline, new: Roofline, why: str) -> Roofline:
    """Fold a second measurement of the same host into `into`: every figure the higher of
    the two (peaks are maxima), both attempts' host load kept."""
    for dev in new.devices:
        mine = into.device(dev.device)
        if mine is None:
            into.devices.append(dev)
            continue
        for kind in ("bandwidth", "compute"):
            held: dict[str, Figure] = getattr(mine, kind)
            for name, fig in getattr(dev, kind).items():
                held[name] = merge_best(held.get(name), fig, why)
                mine.unknown.pop(name, None)  # measured now, whatever failed before
    into.seconds += new.seconds
    into.host_load += new.host_load
    return into


def trust_lines(roof: Roofline) -> list[str]:
    """How much each figure can be trusted: its trials' spread, and the host load."""
    lines = []
    for dev in roof.devices:
        for kind in ("bandwidth", "compute"):
            for name, fig in getattr(dev, kind).items():
                if fig.trials:
                    spread = f", spread {fig.spread:.1%}" if fig.spread is not None else ""
                    lines.append(f"{dev.device} {name}: best of {len(fig.trials)} trials"
                                 f"{spread} ({fig.stability})")
    lines += [f"measured while {h['verdict']}" for h in roof.host_load if h.get("verdict")]
    lines += [f"re-measured: {r}" for r in roof.remeasured]
    return lines
