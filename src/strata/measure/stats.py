"""Summary statistics for every timed number strata reports."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

# Two-sided 95% Student-t quantiles by degrees of freedom (standard table values);
# beyond 30 the normal quantile is within 2% of the t quantile.
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t95(dof: int) -> float:
    if dof < 1:
        return math.inf
    return _T95[dof - 1] if dof <= len(_T95) else 1.96


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100), the numpy default method."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class Summary:
    n: int
    mean: float
    sd: float  # sample standard deviation (n - 1); 0 for n == 1
    median: float
    min: float
    max: float
    p90: float
    p99: float
    iqr: float
    ci95_half: float  # half-width of the 95% CI of the mean
    samples: list[float] = field(default_factory=list)

    @property
    def rel_ci95(self) -> float:
        return self.ci95_half / abs(self.mean) if self.mean else math.inf

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def summarize(values: list[float]) -> Summary:
    if not values:
        raise ValueError("cannot summarise an empty sample")
    n = len(values)
    sd = statistics.stdev(values) if n > 1 else 0.0
    return Summary(
        n=n, mean=statistics.fmean(values), sd=sd, median=statistics.median(values),
        min=min(values), max=max(values), p90=percentile(values, 90), p99=percentile(values, 99),
        iqr=percentile(values, 75) - percentile(values, 25),
        ci95_half=t95(n - 1) * sd / math.sqrt(n) if n > 1 else math.inf,
        samples=list(values),
    )
