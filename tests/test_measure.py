"""Stats, the timing path, and roofline arithmetic."""

from __future__ import annotations

import math
import statistics

import pytest

from strata.measure.roofline import DeviceRoofline, Figure, Peak, Roofline
from strata.measure.stats import percentile, summarize, t95
from strata.measure.timer import TimingPolicy, time_calls


def test_summary_matches_definitions() -> None:
    xs = [1.0, 2.0, 3.0, 4.0, 10.0]
    s = summarize(xs)
    assert s.n == 5 and s.mean == 4.0 and s.median == 3.0
    assert s.sd == pytest.approx(statistics.stdev(xs))
    assert s.ci95_half == pytest.approx(2.776 * s.sd / math.sqrt(5))
    assert s.p90 == pytest.approx(7.6)  # linear interpolation between 4 and 10
    assert s.iqr == pytest.approx(4.0 - 2.0)
    assert percentile([5.0], 99) == 5.0
    assert t95(1) == 12.706 and t95(100) == 1.96


def test_summary_rejects_empty() -> None:
    with pytest.raises(ValueError):
        summarize([])


def test_time_calls_counts_and_warmup() -> None:
    calls: list[int] = []
    flushes: list[int] = []
    s = time_calls(lambda: calls.append(1), TimingPolicy(warmup_s=0.0, min_reps=4, max_reps=7,
                                                         max_time_s=10.0),
                   before=lambda: flushes.append(1))
    assert s.n == 7  # no CI target: runs to max_reps
    assert len(calls) == 8  # one untimed warm-up call + 7 timed
    assert len(flushes) == len(calls)  # `before` runs ahead of every call, untimed
    assert all(x >= 0 for x in s.samples)


def test_time_calls_stops_on_ci_target() -> None:
    s = time_calls(lambda: sum(range(2000)),
                   TimingPolicy(warmup_s=0.0, min_reps=3, max_reps=500, max_time_s=10.0,
                                target_rel_ci=0.5))
    assert 3 <= s.n < 500 and s.rel_ci95 <= 0.5


def test_roofline_ridge_fraction_and_roundtrip() -> None:
    dev = DeviceRoofline(device="cpu", name="x",
                         bandwidth={"copy": Figure(40.0, "m"), "triad": Figure(50.0, "m"),
                                    "h2d": Figure(999.0, "m")},
                         compute={"fp32": Figure(1000.0, "m")},
                         peak_bandwidth=Peak(100.0, "b"), peak_compute={"fp32": Peak(2000, "b")})
    assert dev.peak_bandwidth_gbs() == 50.0  # host transfers are not the memory roof
    assert dev.ridge_point("fp32") == 20.0
    assert dev.fraction_of_peak("compute", "fp32") == 0.5
    assert dev.ridge_point("bf16") is None
    r = Roofline([dev], seconds=1.5)
    back = Roofline.from_dict(r.to_dict())
    assert back.device("cpu").ridge_point("fp32") == 20.0
    assert r.to_dict()["devices"][0]["ridge_points"] == {"fp32": 20.0}


def test_student_t_p_values_match_tables() -> None:
    from strata.measure.stats import t_two_sided_p

    # two-sided critical values from standard t tables: p = 0.05 at these t
    for dof, t in ((1, 12.706), (5, 2.571), (10, 2.228), (30, 2.042)):
        assert t_two_sided_p(t, dof) == pytest.approx(0.05, abs=2e-4)
    assert t_two_sided_p(0.0, 7) == pytest.approx(1.0)


def test_welch_detects_a_real_difference_only() -> None:
    from strata.measure.stats import welch

    a = [100.0, 101.0, 99.0, 100.5, 99.5]
    far = welch(a, [110.0, 111.0, 109.0, 110.5, 109.5])
    near = welch(a, [100.2, 101.1, 99.3, 100.4, 99.9])
    assert far is not None and far.p < 1e-6 and far.diff == pytest.approx(10.0)
    assert near is not None and near.p > 0.5
    assert welch([1.0], [2.0, 3.0]) is None
