"""Issue 10 §2: a roofline that holds still.

Peaks are maxima: each figure is the best of trials kept until the best two agree; a result
above a stored peak re-measures it and η is recomputed. Recorded trial values (the fp32
figures the issue saw: 92, 105 and 172 GFLOP/s on one machine) drive the rules; the
re-measure itself is real (quick sizes) in the runner test.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from itertools import count

import pytest

from strata.commands.probe import busy_refusal, measure_until_quiet
from strata.measure.peak import (
    StabilityRule,
    best_of_trials,
    merge_roofline,
    spread,
    stop_reason,
)
from strata.measure.peakguard import PeakKeeper, check_peak
from strata.measure.roofline import DeviceRoofline, Figure, Roofline

RULE = StabilityRule(min_trials=3, max_trials=8, agree_rel=0.03, max_time_s=float("inf"))


def test_the_issues_three_figures_are_not_a_stable_peak() -> None:
    assert stop_reason([92.0, 105.0, 172.0], 0.0, RULE) is None  # 39% apart: keep going
    reason = stop_reason([92.0, 105.0, 172.0, 169.5], 0.0, RULE)
    assert reason is not None and reason.startswith("stable: best two of 4 trials within 1.5%")
    assert stop_reason([170.0, 171.0], 0.0, RULE) is None  # agree, but fewer than min_trials


def test_bounded_by_count_and_time_and_says_not_stable() -> None:
    wild = [92.0, 172.0, 105.0, 140.0, 60.0, 120.0, 150.0, 100.0]
    reason = stop_reason(wild, 0.0, RULE)
    assert reason is not None and reason.startswith("NOT stable: max trials (8)")
    timed = stop_reason([92.0, 172.0, 105.0], 99.0, StabilityRule(max_time_s=10.0))
    assert timed is not None and "time limit (10 s)" in timed


def _replay(values: list[float]) -> Iterator[dict[str, Figure]]:
    for v in values:
        yield {"fp32": Figure(v, f"recorded {v}", median=v * 0.9)}


def test_best_of_trials_keeps_the_maximum_and_the_spread() -> None:
    trials = _replay([92.0, 105.0, 172.0, 169.5, 1.0])
    ticks = count()
    fig = best_of_trials(lambda: next(trials), RULE, clock=lambda: float(next(ticks)))["fp32"]
    assert fig.value == 172.0 and fig.method == "recorded 172.0"  # the best trial's own
    assert fig.trials == [92.0, 105.0, 172.0, 169.5]  # stopped once stable: 5th never ran
    assert fig.spread == pytest.approx((172 - 92) / 172)
    assert fig.stability is not None and fig.stability.startswith("stable")
    assert spread([100.0]) is None


def test_figures_with_trials_round_trip_and_old_ones_still_load() -> None:
    fig = Figure(172.0, "m", 160.0, trials=[92.0, 172.0], spread=0.47, stability="stable")
    roof = Roofline([DeviceRoofline("cpu", "x", compute={"fp32": fig})], 1.0,
                    host_load=[{"busy": True, "verdict": "host busy: …"}])
    again = Roofline.from_dict(roof.to_dict())
    assert again.device("cpu").compute["fp32"] == fig and again.measured_busy
    old = {"devices": [{"device": "cpu", "name": "x",
                        "compute": {"fp32": {"value": 92.0, "method": "m"}}}], "seconds": 1}
    legacy = Roofline.from_dict(old)
    assert legacy.device("cpu").compute["fp32"].trials == [] and not legacy.measured_busy


# ---------------------------------------------------------------- re-measure on a beaten peak

def _roof(fp32: float = 100.0, triad: float = 40.0) -> Roofline:
    return Roofline([DeviceRoofline("cpu", "x", bandwidth={"triad": Figure(triad, "m")},
                                    compute={"fp32": Figure(fp32, "m", trials=[fp32])})], 1.0)


def test_a_result_within_five_percent_does_not_remeasure() -> None:
    calls: list[tuple[str, str]] = []
    keeper = PeakKeeper(_roof(), lambda d, g: calls.append((d, g)) or {})
    assert not keeper.check("cpu", "fp32", 104.9).exceeded and calls == []
    assert check_peak(_roof().device("cpu"), "bandwidth", 42.1).exceeded is True


def test_a_beaten_peak_is_remeasured_once_raised_and_stored() -> None:
    saved: list[dict] = []
    calls: list[tuple[str, str]] = []

    def remeasure(device: str, group: str) -> dict[str, Figure]:
        calls.append((device, group))
        return {"fp32": Figure(171.0, "fresh", trials=[168.0, 171.0])}

    keeper = PeakKeeper(_roof(), remeasure, save=lambda r: saved.append(r.to_dict()))
    check = keeper.check("cpu", "fp32", 150.0, why="bench #7 pp512")
    assert calls == [("cpu", "fp32")] and check.remeasured and check.raised
    assert (check.stored, check.peak) == (100.0, 171.0) and not check.still_exceeded
    fig = keeper.roofline.device("cpu").compute["fp32"]
    assert fig.value == 171.0 and fig.trials == [100.0, 168.0, 171.0]  # every trial kept
    assert len(saved) == 1 and saved[0]["devices"][0]["compute"]["fp32"]["value"] == 171.0
    assert "100.0 -> 171.0 GFLOP/s" in keeper.roofline.remeasured[0]
    assert "bench #7 pp512" in keeper.roofline.remeasured[0]
    again = keeper.check("cpu", "fp32", 400.0)  # still beaten: a finding about the result
    assert calls == [("cpu", "fp32")] and again.exceeded and not again.remeasured


def test_a_remeasure_that_comes_back_lower_keeps_the_peak_and_stores_nothing() -> None:
    saved: list[Roofline] = []
    keeper = PeakKeeper(_roof(), lambda d, g: {"fp32": Figure(95.0, "fresh", trials=[95.0])},
                        save=saved.append)
    check = keeper.check("cpu", "fp32", 130.0)
    assert check.remeasured and not check.raised and check.still_exceeded
    assert keeper.roofline.device("cpu").compute["fp32"].value == 100.0 and saved == []
    assert "holds" in check.note


def test_a_remeasure_that_fails_keeps_the_stored_peak() -> None:
    def broken(device: str, group: str) -> dict[str, Figure]:
        raise RuntimeError("no torch")

    check = PeakKeeper(_roof(), broken).check("cpu", "fp32", 130.0)
    assert check.exceeded and not check.remeasured and "no torch" in check.note


# ---------------------------------------------------------------- probe --measure on a busy host

def _measured(fp32: float, busy: bool) -> Roofline:
    roof = _roof(fp32=fp32)
    roof.host_load = [{"busy": busy, "busy_share": 0.5 if busy else 0.02,
                       "verdict": f"host {'busy' if busy else 'quiet'}: other processes used "
                                  f"{50 if busy else 2}% of the CPUs during this test"}]
    return roof


def test_busy_attempts_are_retried_and_each_figure_is_their_best() -> None:
    attempts = iter([_measured(92.0, True), _measured(172.0, True), _measured(105.0, True)])
    said: list[str] = []
    roof = measure_until_quiet(lambda say: next(attempts), said.append, pause_s=0.0)
    assert len(roof.host_load) == 3 and roof.measured_busy  # every attempt was busy
    assert roof.device("cpu").compute["fp32"].value == 172.0
    assert any("measuring again (2 of 3)" in s for s in said)
    text = busy_refusal(roof)
    assert text.startswith("roofline not stored: the host was busy in all 3 attempts")
    assert "--allow-busy" in text and "50%" in text


def test_a_quiet_attempt_ends_the_retries_and_clears_the_flag() -> None:
    attempts = iter([_measured(92.0, True), _measured(168.0, False), _measured(1.0, True)])
    roof = measure_until_quiet(lambda say: next(attempts), lambda _m: None, pause_s=0.0)
    assert len(roof.host_load) == 2 and not roof.measured_busy
    assert roof.device("cpu").compute["fp32"].value == 168.0


def test_merge_keeps_figures_only_the_second_attempt_measured() -> None:
    first, second = _roof(), _roof(fp32=120.0)
    first.device("cpu").unknown["bf16"] = "failed"
    second.device("cpu").compute["bf16"] = Figure(200.0, "m")
    merged = merge_roofline(first, second, "second attempt")
    cpu = merged.device("cpu")
    assert cpu.compute["bf16"].value == 200.0 and "bf16" not in cpu.unknown
    assert cpu.compute["fp32"].value == 120.0 and cpu.bandwidth["triad"].value == 40.0


# ---------------------------------------------------------------- a real bench run

def test_bench_results_beating_a_low_peak_remeasure_it_and_recompute_eta(tmp_path) -> None:
    """A roofline recorded absurdly low (as a busy host can make it): the run's own results
    beat it, the peak is re-measured for real (quick sizes) and η is recomputed."""
    pytest.importorskip("torch")
    from strata.backends.base import LoadConfig
    from strata.bench.plan import BenchConfig, RepPolicy
    from strata.bench.runner import Runner, resolve_all
    from strata.bench.scenario import BenchTest
    from strata.hardware.cpu import probe_cpu
    from strata.hardware.microbench import MeasureConfig, host_remeasure
    from strata.hardware.profile import HostProfile, SoftwareStack
    from strata.store import open_db
    from strata.store.hosts import latest_measurement, save_host, save_measurement
    from strata.store.runs import (
        StoredResult,
        add_result,
        results_of_run,
        start_run,
        update_explanation,
    )

    low = Roofline([DeviceRoofline(
        "cpu", "recorded low", bandwidth={"triad": Figure(0.001, "recorded", trials=[0.001])},
        compute={d: Figure(0.001, "recorded", trials=[0.001]) for d in ("fp32", "bf16")})],
        1.0)
    profile = HostProfile("h", probe_cpu(), [], SoftwareStack("3", "Linux", "0"))
    conn = open_db(tmp_path / "strata.db")  # the real store, as `strata bench` wires it
    fp = save_host(conn, profile)
    run_id = start_run(conn, fp, "bench", [], {})
    saved: list[dict] = []

    def save(roof: Roofline) -> None:
        saved.append(roof.to_dict())
        save_measurement(conn, fp, "roofline", roof.to_dict())

    def store(r: StoredResult) -> StoredResult:
        r.run_id, r.id = run_id, add_result(conn, run_id, r)
        stored.append(r)
        return r

    keeper = PeakKeeper(low, host_remeasure(profile, MeasureConfig.quick()), save=save)
    config = BenchConfig(models=["synthetic:tiny@f32"], backends=["torch"],
                         tests=[BenchTest(16, 0), BenchTest(0, 4)], loads=[LoadConfig()],
                         reps=RepPolicy.fixed(2))
    stored: list[StoredResult] = []
    updated: list[StoredResult] = []
    def update(r: StoredResult) -> None:
        updated.append(r)
        update_explanation(conn, r)

    Runner(config, low, store, peaks=keeper, update=update).run(resolve_all(config))
    pp, tg = stored
    cpu = keeper.roofline.device("cpu")
    dtype = pp.explain["compute_dtype"]
    assert cpu.peak_gflops(dtype) > 0.01 and cpu.peak_bandwidth_gbs() > 0.01  # re-measured
    assert {c["group"] for r in stored for c in r.info["peak_checks"]} == {dtype, "bandwidth"}
    assert all(c["raised"] for r in stored for c in r.info["peak_checks"])
    assert len(saved) == 2  # each corrected roofline stored once
    # η of every result of the run is against the corrected peaks, the earlier one included
    assert pp.explain["compute_gflops"] == pytest.approx(cpu.peak_gflops(dtype))
    assert tg.explain["bandwidth_gbs"] == pytest.approx(cpu.peak_bandwidth_gbs())
    assert pp.explain["bandwidth_gbs"] == pytest.approx(cpu.peak_bandwidth_gbs())
    assert updated == [pp] and "re-measured" in pp.info["eta_recomputed"]
    # prefill's ceiling, by hand from the corrected peaks: the lower of the compute roof
    # (FLOP/s ÷ FLOPs per prompt token) and the memory roof (the weights streamed once for
    # the 16-token pass) — which one binds a 16-token prefill of this tiny model depends on
    # the two figures just measured
    tps = pp.metrics["prefill_tps"]["mean"]
    compute = cpu.peak_gflops(dtype) * 1e9 / pp.explain["flops_per_prompt_token"]
    memory = cpu.peak_bandwidth_gbs() * 1e9 / (pp.explain["bytes_per_token"] / 16)
    assert pp.explain["prefill_eta"] == pytest.approx(tps / min(compute, memory))
    rows = {r.test: r for r in results_of_run(conn, run_id)}  # what the DB now holds
    assert rows["pp16"].explain == pp.explain and rows["tg4"].explain == tg.explain
    assert rows["pp16"].info["eta_recomputed"] == pp.info["eta_recomputed"]
    assert latest_measurement(conn, fp, "roofline")["devices"][0]["peak_bandwidth_gbs"] \
        == pytest.approx(cpu.peak_bandwidth_gbs())


def test_probe_measure_on_a_busy_host_stores_nothing_unless_allowed(tmp_path) -> None:
    """run_probe end to end on a real probe and a real DB; the three attempts are recorded
    busy measurements."""
    from rich.console import Console

    from strata.commands.probe import run_probe
    from strata.store import open_db
    from strata.store.hosts import latest_measurement

    conn = open_db(tmp_path / "strata.db")
    quiet = Console(file=io.StringIO())

    def busy(fp32: float):
        return lambda profile, say: _measured(fp32, busy=True)

    seen = iter([92.0, 172.0, 105.0, 150.0, 160.0, 90.0])
    refused = run_probe(conn, True, False, 10.0, quiet, pause_s=0.0,
                        measurer=lambda p, s: busy(next(seen))(p, s))
    assert refused.refused and refused.refused.startswith("roofline not stored")
    assert latest_measurement(conn, refused.fingerprint, "roofline") is None  # nothing stored
    data = refused.to_dict()
    assert data["roofline_stored"] is False and data["roofline"]["measured_busy"] is True
    allowed = run_probe(conn, True, False, 10.0, quiet, allow_busy=True, pause_s=0.0,
                        measurer=lambda p, s: busy(next(seen))(p, s))
    assert allowed.refused is None
    stored = latest_measurement(conn, allowed.fingerprint, "roofline")
    assert stored["measured_busy"] is True and len(stored["host_load"]) == 3  # flagged
    assert stored["devices"][0]["compute"]["fp32"]["value"] == 160.0  # best of the three


def _stable(fp32: float, triad: float = 40.0, stable: bool = True) -> Roofline:
    roof = _measured(fp32, busy=False)
    cpu = roof.device("cpu")
    said = "stable: best two of 3 trials within 1.0%" if stable else "NOT stable: max trials (8)"
    cpu.compute["fp32"] = Figure(fp32, "m", trials=[fp32 * 0.99, fp32], stability=said)
    cpu.bandwidth["triad"] = Figure(triad, "m", trials=[triad], stability=said)
    return roof


def test_later_probe_runs_keep_the_stored_peak_and_fresh_forgets_it(tmp_path) -> None:
    """Five quiet `probe --measure` runs whose fp32 figure swings as on the issue's machine
    (quiet-host runs measured in an earlier session: 157, 179, 151, 171, 163 GFLOP/s): the
    stored peak rises to the best run and stays there; a lower run says what it kept;
    --fresh stores a run as is; an unstable stored figure is never kept."""
    from rich.console import Console

    from strata.commands.probe import run_probe
    from strata.store import open_db
    from strata.store.hosts import latest_measurement

    conn = open_db(tmp_path / "strata.db")
    quiet = Console(file=io.StringIO())

    def stored_fp32(fp: str) -> float:
        return latest_measurement(conn, fp, "roofline")["devices"][0]["compute"]["fp32"]["value"]

    seen = []
    for fp32, triad in [(157.1, 40.0), (178.7, 38.0), (151.0, 41.0), (171.2, 39.0), (162.8, 40.5)]:
        result = run_probe(conn, True, False, 10.0, quiet, pause_s=0.0,
                           measurer=lambda p, s, a=fp32, b=triad: _stable(a, b))
        seen.append(stored_fp32(result.fingerprint))
    assert seen == [157.1, 178.7, 178.7, 178.7, 178.7]  # without the rule: the five as measured
    assert any("fp32: measured 162.8 now, kept 178.7" in k for k in result.kept)
    assert result.to_dict()["peaks_kept"] == result.kept
    stored = latest_measurement(conn, result.fingerprint, "roofline")["devices"][0]
    assert stored["bandwidth"]["triad"]["value"] == 41.0  # each figure on its own
    fig = stored["compute"]["fp32"]
    assert len(fig["trials"]) == 10 and fig["spread"] == pytest.approx(
        (178.7 - 151.0 * 0.99) / 178.7)  # the spread across runs is stored with it

    fresh = run_probe(conn, True, False, 10.0, quiet, pause_s=0.0, fresh=True,
                      measurer=lambda p, s: _stable(150.0))
    assert fresh.kept == [] and stored_fp32(fresh.fingerprint) == 150.0
    glitch = run_probe(conn, True, False, 10.0, quiet, pause_s=0.0, fresh=True,
                       measurer=lambda p, s: _stable(900.0, stable=False))
    assert stored_fp32(glitch.fingerprint) == 900.0  # stored as measured (flagged unstable)…
    after = run_probe(conn, True, False, 10.0, quiet, pause_s=0.0,
                      measurer=lambda p, s: _stable(160.0))
    assert after.kept == [] and stored_fp32(after.fingerprint) == 160.0  # …but never kept


def test_a_command_that_measures_the_roofline_keeps_the_same_busy_rule(
        tmp_path, monkeypatch) -> None:
    """One rule for every path (issue 30): Host.roofline — the path bench, rank, train and
    the kernel lab take — retries a busy host and, busy every time, uses the roofline for
    this run only and stores nothing, saying so; probe --measure refuses the same way."""
    from rich.console import Console

    import strata.hardware.microbench as microbench
    import strata.host as host_module
    from strata.hardware.probe import probe_host
    from strata.host import Host
    from strata.store import open_db
    from strata.store.hosts import latest_measurement, save_host

    conn = open_db(tmp_path / "strata.db")
    profile = probe_host(smoke=False)
    fp = save_host(conn, profile)
    calls = []
    monkeypatch.setattr(microbench, "measure_host",
                        lambda p, progress=None: calls.append(1) or _measured(100.0, busy=True))
    monkeypatch.setattr(host_module, "BUSY_PAUSE_S", 0.0)
    monkeypatch.setattr(host_module.measure_until_quiet, "__defaults__",
                        (host_module.MEASURE_ATTEMPTS, 0.0))
    said = io.StringIO()
    host = Host(conn, profile, fp)
    roof = host.roofline(Console(file=said, width=200))
    assert roof.measured_busy and len(calls) == host_module.MEASURE_ATTEMPTS
    assert latest_measurement(conn, fp, "roofline") is None  # never stored silently
    assert "roofline not stored" in said.getvalue() and "this run uses it" in said.getvalue()
    assert host.roofline(Console(file=io.StringIO())) is roof  # not measured twice a run
    assert len(calls) == host_module.MEASURE_ATTEMPTS
