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


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((qam + 2 * m) * (a + 2 * m)),
                    -(a + m) * (qab + m) * x / ((a + 2 * m) * (qap + 2 * m))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-12:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, dof: float) -> float:
    """Two-sided p-value of Student's t with `dof` degrees of freedom."""
    if math.isinf(t):
        return 0.0
    return incomplete_beta(dof / 2.0, 0.5, dof / (dof + t * t))


@dataclass
class Welch:
    diff: float  # mean_b - mean_a
    t: float
    dof: float
    p: float


def welch(a: list[float], b: list[float]) -> Welch | None:
    """Welch's unequal-variance t-test of mean(b) - mean(a); None with < 2 samples a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(b) - statistics.fmean(a)
    if va + vb == 0:
        return Welch(diff, math.inf if diff else 0.0, math.inf, 0.0 if diff else 1.0)
    t = diff / math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return Welch(diff, t, dof, t_two_sided_p(t, dof))
