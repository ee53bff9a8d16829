"""Per-request metrics from a RunTrace, by the definitions of docs/architecture.md §5 (the
same for every backend).

prefill t/s = N / prefill time; decode t/s = M / decode time; TTFT = first token time -
request start; TPOT = (E2E - TTFT) / (M - 1); ITL = gaps between successive tokens; E2E.
For streamed HTTP traces the prefill end is not observable: the first token's arrival
stands in for it, so decode counts the M - 1 tokens after the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

from strata.backends.base import RunTrace

NS = 1e9


@dataclass
class RunMetrics:
    prefill_tps: float | None = None
    decode_tps: float | None = None
    combined_tps: float | None = None  # llama-bench's pp+tg figure: (N + M) / E2E
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)

    def scalars(self) -> dict[str, float]:
        return {k: v for k, v in vars(self).items() if isinstance(v, float)}


def compute(trace: RunTrace) -> RunMetrics:
    if any(b < a for a, b in pairwise(trace.token_ns)):
        raise ValueError("token timestamps go backwards")
    m = RunMetrics()
    end = trace.token_ns[-1] if trace.token_ns else trace.t_prefill_end
    if end is None:
        raise ValueError("trace has neither a prefill end nor tokens")
    m.e2e_s = (end - trace.t_start) / NS
    n_total = trace.n_prompt + generated(trace)
    if trace.n_prompt and trace.token_ns:
        m.combined_tps = n_total / m.e2e_s if m.e2e_s > 0 else None
    _prefill(trace, m)
    _decode(trace, m)
    return m


def generated(trace: RunTrace) -> int:
    """Tokens generated: per-chunk counts when a server streams several tokens per chunk."""
    return sum(trace.chunk_tokens) if trace.chunk_tokens else len(trace.token_ns)


def _prefill(trace: RunTrace, m: RunMetrics) -> None:
    if trace.n_prompt and trace.t_prefill_end is not None:
        prefill_s = (trace.t_prefill_end - trace.t_start) / NS
        m.prefill_tps = trace.n_prompt / prefill_s if prefill_s > 0 else None
        m.ttft_s = prefill_s  # the first token comes from the prefill's logits
    elif trace.token_ns:
        m.ttft_s = (trace.token_ns[0] - trace.t_start) / NS
        if trace.n_prompt and m.ttft_s > 0:  # streamed: TTFT includes the first decode step
            m.prefill_tps = trace.n_prompt / m.ttft_s


def _decode(trace: RunTrace, m: RunMetrics) -> None:
    tokens = trace.token_ns
    if not tokens:
        return
    if trace.t_prefill_end is not None or not trace.n_prompt:
        # in-process: every generated token is one timed decode step after the start point
        start = trace.t_prefill_end if trace.t_prefill_end is not None else trace.t_start
        stamps = [start, *tokens]
        count = generated(trace)
    else:  # streamed: the first chunk arrives at TTFT; decode is what follows it
        first = trace.chunk_tokens[0] if trace.chunk_tokens else 1
        stamps, count = tokens, generated(trace) - first
    decode_s = (stamps[-1] - stamps[0]) / NS
    if count > 0 and decode_s > 0:
        m.decode_tps = count / decode_s
    m.itl_s = [(b - a) / NS for a, b in pairwise(stamps)]
    n = generated(trace)
    if n > 1 and m.ttft_s is not None:
        m.tpot_s = (m.e2e_s - m.ttft_s) / (n - 1)
