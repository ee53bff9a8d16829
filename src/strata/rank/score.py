"""The rank score and verdict: one formula, the same on every host.

For each depth of a profile, three terms, each the measured figure over the profile's target
(so 1 = exactly on target):

    prompt = prefill t/s / target prompt t/s
    gen    = decode t/s  / target gen t/s
    ttft   = target TTFT / TTFT

    score  = 100 x geometric mean of the three terms (over every depth of the profile)

100 means "exactly on target"; 200 is twice as good on (geometric) average. TTFT is an
endpoint's measured (streamed) time to first token; in-process backends (llama.cpp, torch)
derive it as P / prefill t/s + 1 / decode t/s: the prompt, then one decode step.

Verdict, per depth, the worst depth counts:
    usable     TTFT <= target and decode t/s >= target
    marginal   TTFT <= 2 x target and decode t/s >= target / 2
    unusable   otherwise
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from strata.rank.profiles import Profile

MARGIN = 2.0  # how far past a target still counts as "marginal"
VERDICTS = ("usable", "marginal", "unusable")  # best first


@dataclass(frozen=True)
class Figures:
    """What one depth of a profile measured (or predicted)."""

    depth: int
    prefill_ts: float
    decode_ts: float
    ttft_s: float  # measured or derived (ttft_measured says which)
    ttft_measured: bool = False


def derived_ttft(prompt_tokens: int, prefill_ts: float, decode_ts: float) -> float:
    """Prompt processing, then one decode step: when the first token can be on screen."""
    return prompt_tokens / prefill_ts + 1.0 / decode_ts


def terms(profile: Profile, f: Figures) -> tuple[float, float, float]:
    t = profile.targets
    return f.prefill_ts / t.prompt_ts, f.decode_ts / t.gen_ts, t.ttft_s / f.ttft_s


def score(profile: Profile, figures: list[Figures]) -> float:
    """100 x the geometric mean of every depth's three terms."""
    logs = [math.log(x) for f in figures for x in terms(profile, f)]
    return 100.0 * math.exp(sum(logs) / len(logs))


def verdict(profile: Profile, figures: list[Figures]) -> str:
    return max((_verdict_at(profile, f) for f in figures), key=VERDICTS.index)


def _verdict_at(profile: Profile, f: Figures) -> str:
    t = profile.targets
    if f.ttft_s <= t.ttft_s and f.decode_ts >= t.gen_ts:
        return "usable"
    if f.ttft_s <= t.ttft_s * MARGIN and f.decode_ts >= t.gen_ts / MARGIN:
        return "marginal"
    return "unusable"
