"""What a bench result achieved, as roofline figures: the input of a peak re-check.

A prefill test achieved t/s x FLOPs per prompt token of the compute dtype's FLOP/s; a decode
test achieved t/s x bytes per token of memory bandwidth. When either beats the stored peak
by more than peakguard.PEAK_MARGIN, the peak is re-measured (issue 10 §2).
"""

from __future__ import annotations

from typing import Any

from strata.measure.peakguard import BANDWIDTH


def achieved_figures(explain: dict[str, Any],
                     metrics: dict[str, dict[str, Any]]) -> list[tuple[str, float]]:
    """(group, achieved GB/s or GFLOP/s) for each phase this result can speak for.

    A cache-resident decode is left out: its bytes never came from DRAM, so beating the DRAM
    figure says nothing about the DRAM figure (explain already says so)."""
    out: list[tuple[str, float]] = []
    prefill = (metrics.get("prefill_tps") or {}).get("mean")
    flops, dtype = explain.get("flops_per_prompt_token"), explain.get("compute_dtype")
    if prefill and flops and dtype and explain.get("prefill_eta") is not None:
        out.append((dtype, prefill * flops / 1e9))
    decode = (metrics.get("decode_tps") or {}).get("mean")
    nbytes = explain.get("bytes_per_token")
    if decode and nbytes and explain.get("decode_eta") is not None \
            and not explain.get("cache_resident"):
        out.append((BANDWIDTH, decode * nbytes / 1e9))
    return out
