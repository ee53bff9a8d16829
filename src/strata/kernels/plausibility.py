"""Rules that keep a benchmark figure from claiming what cannot be true.

- **Noisy baseline:** a speedup is only as good as its denominator. An eager time whose IQR
  exceeds half its median, or that is more than 10x slower than any other shape's time
  scaled up to this shape's size, is re-measured; if it stays noisy the shape does not
  count for dispatch (a 9.4 ms outlier once turned an honest kernel into "173x").
- **Physically impossible speed:** no kernel reads its bytes faster than DRAM delivers them
  with cold caches, nor does more FLOP/s than the measured peak. A time more than
  `MARGIN` below that bound is disqualified as implausible (it skipped work or reused a
  result), not merely flagged.
- **Large speedups** (> 10x eager) are re-checked in a new worker process on new inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

NOISY_IQR = 0.5  # IQR / median above this: noisy
NEIGHBOUR_FACTOR = 10.0
MARGIN = 1.2  # a time may beat the roofline bound by at most this factor (timer, peak error)
SUSPICIOUS_SPEEDUP = 10.0

NOISY_BASELINE = "noisy baseline: this shape does not count for dispatch"
IMPLAUSIBLE = "implausible"  # prefix of the flag; dispatch disqualifies the implementation


@dataclass(frozen=True)
class BaselineTime:
    shape: dict[str, int]
    median_s: float
    p25_s: float
    p75_s: float
    nbytes: float  # the op's bytes at this shape (sizes the neighbour comparison)


def noisy_reason(times: list[BaselineTime], index: int) -> str | None:
    """Why the baseline at `index` cannot be trusted, or None."""
    t = times[index]
    if t.median_s <= 0:
        return "no valid baseline time"
    iqr = t.p75_s - t.p25_s
    if iqr > NOISY_IQR * t.median_s:
        return f"IQR {iqr * 1e6:.1f} µs exceeds half the median {t.median_s * 1e6:.1f} µs"
    others = [o for i, o in enumerate(times) if i != index and o.median_s > 0]
    if not others:
        return None
    # The neighbour: the other shape closest in size. Its time scaled up by the size ratio
    # (never down: small shapes carry fixed overheads) predicts this one.
    near = min(others, key=lambda o: abs(math.log(max(t.nbytes, 1.0) / max(o.nbytes, 1.0))))
    bound = near.median_s * max(1.0, t.nbytes / max(near.nbytes, 1.0))
    if t.median_s > NEIGHBOUR_FACTOR * bound:
        return (f"{t.median_s * 1e6:.1f} µs is more than {NEIGHBOUR_FACTOR:g}x what the "
                f"neighbouring shape {_label(near.shape)} predicts ({bound * 1e6:.1f} µs)")
    return None


def _label(shape: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


def noisy_shapes(times: list[BaselineTime]) -> dict[int, str]:
    """Index -> reason for every baseline time that must be re-measured."""
    return {i: r for i in range(len(times)) if (r := noisy_reason(times, i))}


def min_time_s(nbytes: float, flops: float, peak_bw_gbs: float | None,
               peak_gflops: float | None, cold: bool) -> float | None:
    """The least time the op can take here: its bytes at DRAM bandwidth (cold caches only:
    warm data may come from cache) and its FLOPs at the measured peak."""
    bounds = []
    if cold and peak_bw_gbs:
        bounds.append(nbytes / (peak_bw_gbs * 1e9))
    if peak_gflops and flops > 0:
        bounds.append(flops / (peak_gflops * 1e9))
    return max(bounds) if bounds else None


def implausible(median_s: float, bound_s: float | None) -> str | None:
    """The disqualifying flag for a time beyond the roofline, or None."""
    if bound_s is None or median_s <= 0 or median_s * MARGIN >= bound_s:
        return None
    return (f"{IMPLAUSIBLE}: {median_s * 1e6:.2f} µs is {bound_s / median_s:.1f}x faster "
            f"than this host's roofline allows ({bound_s * 1e6:.2f} µs); disqualified")


def baseline_times(rows: list[dict[str, Any]], name: str, nbytes: list[float]) -> \
        list[BaselineTime]:
    """The baseline `name` of each benchmark row (missing ones as median 0)."""
    out = []
    for row, size in zip(rows, nbytes, strict=True):
        r = row["results"].get(name, {})
        out.append(BaselineTime(row["shape"], float(r.get("median_s") or 0.0),
                                float(r.get("p25_s") or 0.0), float(r.get("p75_s") or 0.0),
                                size))
    return out
