"""Telemetry sampler: real sampling on this machine, fake sysfs trees, recorded series."""

from __future__ import annotations

import ctypes.util
import io
import itertools
import json
import sys
import threading
import time
import types
from pathlib import Path

import pytest
from rich.console import Console

from strata.errors import InputError
from strata.hardware import telemetry as tm
from strata.hardware.telemetry import (
    READERS,
    EnergyAccumulator,
    Reader,
    ReaderContext,
    Sample,
    Sampler,
    SourceUnavailable,
    TelemetrySummary,
    summarize,
    throttle_verdict,
)
from strata.hardware.telemetry.readers import base as reader_base
from strata.hardware.watch import format_value, render_summary, summary_table, watch

SYS_CPU = Path("/sys/devices/system/cpu")


def _busy(seconds: float) -> None:
    """Keep one core busy so utilisation and clocks are sampled under load."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def _machine_has_cpu_freq() -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    has_mhz = cpuinfo.exists() and "cpu MHz" in cpuinfo.read_text()
    return has_mhz or any(SYS_CPU.glob("cpu[0-9]*/cpufreq/scaling_cur_freq"))


def _machine_has_nvml() -> bool:
    return ctypes.util.find_library("nvidia-ml") is not None or Path("/proc/driver/nvidia").exists()


def _telemetry_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "strata-telemetry"]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _samples(rows: list[dict[str, float]], interval_s: float = 0.25) -> list[Sample]:
    """A recorded series: one reading dict per tick, timestamps interval_s apart."""
    step = int(interval_s * 1e9)
    return [Sample(t_ns=10**12 + i * step, readings=r) for i, r in enumerate(rows)]


# --------------------------------------------------------------------------- real sampler


@pytest.fixture(scope="module")
def real_run() -> Sampler:
    with Sampler(interval_s=0.1) as sampler:
        _busy(1.0)
    return sampler


def test_real_sampler_sample_count_and_monotonic_time(real_run: Sampler) -> None:
    samples = real_run.samples
    # 1 s at 100 ms: ~11 (first, ticks, final at stop). Generous for a loaded CI box;
    # the upper bound holds because an overrun skips ticks instead of bursting.
    assert 4 <= len(samples) <= 14
    stamps = [s.t_ns for s in samples]
    assert all(b > a for a, b in itertools.pairwise(stamps))
    assert 0.8 <= (stamps[-1] - stamps[0]) / 1e9 <= 5.0


def test_real_sampler_reads_what_the_machine_exposes(real_run: Sampler) -> None:
    keys = tm.metric_keys(real_run.samples)
    if _machine_has_cpu_freq():
        assert "cpu_freq" in real_run.sources
        assert all(s.readings["cpu.freq_mhz"] > 0 for s in real_run.samples)
    else:
        assert "cpu_freq" in real_run.unavailable
    # psutil is a dependency: utilisation (from the second tick on) and RSS always exist
    assert "cpu.util_pct" in keys
    assert all(0 <= v <= 100 for v in tm.series(real_run.samples, "cpu.util_pct"))
    assert min(tm.series(real_run.samples, "proc.rss_bytes")) > 1_000_000


def test_real_sampler_accounts_for_every_reader(real_run: Sampler) -> None:
    unavailable = real_run.unavailable
    for name in READERS:
        assert (name in real_run.sources) != (name in unavailable), name
    assert all(isinstance(v, str) and v for v in unavailable.values())
    if not _machine_has_nvml():
        assert "NVML" in unavailable["nvml"] or "pynvml" in unavailable["nvml"]


def test_stop_joins_the_thread(real_run: Sampler) -> None:
    assert not real_run.running
    assert _telemetry_threads() == []


def test_real_summary_is_storable(real_run: Sampler) -> None:
    summary = real_run.summary()
    assert summary.sample_count == len(real_run.samples)
    assert summary.metrics["proc.rss_bytes"].n == summary.sample_count
    stored = json.loads(json.dumps(real_run.to_dict()))
    assert len(stored["samples"]) == summary.sample_count
    back = TelemetrySummary.from_dict(stored["summary"])
    assert back == summary


def test_start_stop_api_and_lifecycle_rules() -> None:
    sampler = Sampler(interval_s=0.05, readers={"process": READERS["process"]}).start()
    assert sampler.running
    time.sleep(0.2)
    sampler.stop()
    sampler.stop()  # idempotent
    assert not sampler.running
    assert _telemetry_threads() == []
    with pytest.raises(RuntimeError):
        sampler.start()
    with pytest.raises(ValueError):
        Sampler(interval_s=0.001)


def test_stop_takes_a_final_sample_so_counters_cover_the_whole_run() -> None:
    # A long interval: only the first tick happens before stop, so the second sample
    # can only be the final one taken at stop.
    with Sampler(interval_s=30, readers={"process": READERS["process"]}) as sampler:
        time.sleep(0.05)
        before_stop = time.perf_counter_ns()
    samples = sampler.samples
    assert len(samples) == 2
    assert samples[0].t_ns < before_stop <= samples[1].t_ns


# --------------------------------------------------------------------------- fake sysfs


@pytest.fixture
def fake_sys(tmp_path: Path) -> Path:
    """A sysfs tree with one of every source (Intel CPU, hwmon, zone, RAPL, amdgpu)."""
    root = tmp_path / "sys"
    cpu = root / "devices/system/cpu"
    for i, khz in enumerate((3_500_000, 2_100_000)):
        _write(cpu / f"cpu{i}/cpufreq/scaling_cur_freq", f"{khz}\n")
        _write(cpu / f"cpu{i}/thermal_throttle/core_throttle_count", f"{i + 1}\n")
        _write(cpu / f"cpu{i}/thermal_throttle/package_throttle_count", "7\n")
        _write(cpu / f"cpu{i}/topology/physical_package_id", "0\n")
    _write(root / "class/hwmon/hwmon0/name", "k10temp\n")
    _write(root / "class/hwmon/hwmon0/temp1_input", "55250\n")
    _write(root / "class/hwmon/hwmon0/temp1_label", "Tctl\n")
    _write(root / "class/thermal/thermal_zone0/type", "x86_pkg_temp\n")
    _write(root / "class/thermal/thermal_zone0/temp", "48000\n")
    rapl = root / "class/powercap/intel-rapl:0"
    _write(rapl / "name", "package-0\n")
    _write(rapl / "energy_uj", "1000000\n")
    _write(rapl / "max_energy_range_uj", "262143328850\n")
    card = root / "class/drm/card0/device"
    _write(card / "vendor", "0x1002\n")
    _write(card / "gpu_busy_percent", "97\n")
    _write(card / "hwmon/hwmon3/power1_average", "245000000\n")
    _write(card / "hwmon/hwmon3/temp1_input", "71000\n")
    _write(card / "hwmon/hwmon3/freq1_input", "2400000000\n")
    return root


def _open(name: str, root: Path) -> Reader:
    reader = READERS[name](ReaderContext(sysfs_root=root, procfs_root=root / "proc"))
    reader.open()
    return reader


def test_sysfs_readers_parse_a_fake_tree(fake_sys: Path) -> None:
    assert _open("cpu_freq", fake_sys).read() == {
        "cpu.freq_mhz": 2800.0, "cpu.freq_min_core_mhz": 2100.0, "cpu.freq_max_core_mhz": 3500.0,
    }
    # core counts summed per CPU (1 + 2); the package count once per package, not per CPU
    assert _open("cpu_throttle", fake_sys).read() == {
        "cpu.core_throttle_count": 3.0, "cpu.package_throttle_count": 7.0,
    }
    assert _open("hwmon", fake_sys).read() == {"temp.k10temp.Tctl_c": pytest.approx(55.25)}
    assert _open("thermal_zones", fake_sys).read() == {
        "temp.thermal_zone0.x86_pkg_temp_c": 48.0,
    }
    amd = _open("amdgpu", fake_sys).read()
    assert amd == {"amdgpu0.power_w": pytest.approx(245.0), "amdgpu0.temp_c": 71.0,
                   "amdgpu0.freq_mhz": pytest.approx(2400.0), "amdgpu0.util_pct": 97.0}


def test_cpu_freq_falls_back_to_proc_cpuinfo(tmp_path: Path) -> None:
    _write(tmp_path / "proc/cpuinfo", "processor\t: 0\ncpu MHz\t\t: 2000.5\n"
                                      "processor\t: 1\ncpu MHz\t\t: 3000.5\n")
    reader = _open("cpu_freq", tmp_path)
    assert "cpuinfo" in reader.source
    assert reader.read()["cpu.freq_mhz"] == pytest.approx(2500.5)


def test_rapl_energy_accumulates_across_wraparound(fake_sys: Path) -> None:
    energy = fake_sys / "class/powercap/intel-rapl:0/energy_uj"
    reader = _open("rapl", fake_sys)
    assert reader.read() == {"rapl.package-0.energy_j": 0.0}
    energy.write_text("3000000\n")
    assert reader.read()["rapl.package-0.energy_j"] == pytest.approx(2.0)
    energy.write_text("500000\n")  # wrapped: (max - 3e6) + 0.5e6 microjoules more
    expected = 2.0 + (262143328850 - 3_000_000 + 500_000) * 1e-6
    assert reader.read()["rapl.package-0.energy_j"] == pytest.approx(expected)


def test_energy_accumulator_wraps() -> None:
    acc = EnergyAccumulator(max_range_uj=1000.0)
    assert [acc.update(v) for v in (900.0, 950.0, 50.0, 100.0)] == pytest.approx(
        [0.0, 50e-6, 150e-6, 200e-6]
    )


def test_rapl_permission_denied_is_recorded(fake_sys: Path, monkeypatch) -> None:
    real = reader_base._read_text

    def root_only(path: Path) -> str:
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(reader_base, "_read_text", root_only)
    sampler = Sampler(0.05, readers={"rapl": READERS["rapl"]}, sysfs_root=fake_sys).start()
    sampler.stop()
    assert "PermissionError" in sampler.unavailable["rapl"]
    assert "root" in sampler.unavailable["rapl"]


def test_empty_roots_make_every_sysfs_source_unavailable(tmp_path: Path) -> None:
    names = ("cpu_freq", "cpu_throttle", "hwmon", "thermal_zones", "rapl", "amdgpu")
    sampler = Sampler(0.05, readers={n: READERS[n] for n in names},
                      sysfs_root=tmp_path, procfs_root=tmp_path)
    with sampler:
        pass
    assert set(sampler.unavailable) == set(names)
    assert "thermal_throttle" in sampler.unavailable["cpu_throttle"]
    assert "intel-rapl" in sampler.unavailable["rapl"]
    assert all(s.readings == {} for s in sampler.samples)


def test_garbage_file_disables_its_reader_and_sampling_goes_on(tmp_path: Path) -> None:
    _write(tmp_path / "devices/system/cpu/cpu0/cpufreq/scaling_cur_freq", "garbage\n")
    readers = {"cpu_freq": READERS["cpu_freq"], "process": READERS["process"]}
    with Sampler(0.05, readers=readers, sysfs_root=tmp_path) as sampler:
        time.sleep(0.3)
    assert sampler.unavailable["cpu_freq"].startswith("read failed: ValueError")
    assert "cpu_freq" not in sampler.sources
    assert len(sampler.samples) >= 3
    assert all("proc.rss_bytes" in s.readings for s in sampler.samples)
    assert _telemetry_threads() == []


def test_unreadable_field_is_dropped_and_the_others_kept(fake_sys: Path) -> None:
    # A directory where a file should be fails to read even for root.
    (fake_sys / "class/hwmon/hwmon0/temp2_input").mkdir()
    with Sampler(0.05, readers={"hwmon": READERS["hwmon"]}, sysfs_root=fake_sys) as sampler:
        time.sleep(0.15)
    assert "IsADirectoryError" in sampler.unavailable["hwmon.temp.k10temp.temp2_c"]
    assert all(s.readings == {"temp.k10temp.Tctl_c": pytest.approx(55.25)}
               for s in sampler.samples)


class _Flaky(Reader):
    """Works twice, then raises: a reader failing in the middle of a run."""

    name = "flaky"
    closed = False

    def open(self) -> None:
        self.calls = 0

    def read(self) -> dict[str, float]:
        self.calls += 1
        if self.calls > 2:
            raise RuntimeError("device fell off the bus")
        return {"flaky.x_w": 1.0}

    def close(self) -> None:
        _Flaky.closed = True


class _BrokenOpen(Reader):
    name = "broken"

    def open(self) -> None:
        raise KeyError("bad driver")


def test_reader_that_raises_mid_run_is_disabled_once() -> None:
    _Flaky.closed = False
    readers = {"flaky": _Flaky, "broken": _BrokenOpen, "process": READERS["process"]}
    with Sampler(0.02, readers=readers) as sampler:
        time.sleep(0.3)
    samples = sampler.samples
    assert sampler.unavailable["flaky"] == "read failed: RuntimeError: device fell off the bus"
    assert sampler.unavailable["broken"].startswith("open failed: KeyError")
    assert _Flaky.closed
    assert sum("flaky.x_w" in s.readings for s in samples) == 2
    assert all("proc.rss_bytes" in s.readings for s in samples)  # the sampler kept going
    assert len(samples) > 4


# --------------------------------------------------------------------------- NVML (faked)


class _NvErr(Exception):
    pass


def _fake_pynvml(*, energy: bool, event_reasons: bool, mask: int) -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    nv.NVMLError = _NvErr
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_TEMPERATURE_GPU = 1, 2, 0
    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 1
    nv.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"
    nv.nvmlSystemGetDriverVersion = lambda: "550.54"
    nv.nvmlDeviceGetClockInfo = lambda h, kind: {1: 1980, 2: 2619}[kind]
    nv.nvmlDeviceGetTemperature = lambda h, s: 81
    nv.nvmlDeviceGetPowerUsage = lambda h: 650_000
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=99, memory=60)
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=80 * 2**30)
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: mask

    def no_function(h):
        raise _NvErr("Function Not Found")

    def total_energy(h):
        if not energy:
            raise _NvErr("Not Supported")
        return 5_000_000

    nv.nvmlDeviceGetCurrentClocksEventReasons = (lambda h: mask) if event_reasons \
        else no_function
    nv.nvmlDeviceGetTotalEnergyConsumption = total_energy
    return nv


def test_nvml_reader_with_a_fake_driver(monkeypatch) -> None:
    fake = _fake_pynvml(energy=False, event_reasons=False, mask=0x44)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with Sampler(0.05, readers={"nvml": READERS["nvml"]}) as sampler:
        time.sleep(0.1)
    last = sampler.samples[-1].readings
    assert last["gpu0.power_w"] == 650.0
    assert last["gpu0.clocks_event_reasons"] == 0x44  # via the older throttle-reasons call
    assert "gpu0.energy_j" not in last
    assert "Not Supported" in sampler.unavailable["nvml.gpu0.energy_j"]
    verdict = sampler.summary().verdict
    assert verdict.throttled is True
    assert any("HW thermal slowdown" in e for e in verdict.evidence)


def test_nvml_missing_library_or_module_is_a_reason(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with Sampler(0.05, readers={"nvml": READERS["nvml"]}) as sampler:
        pass
    assert "strata[nvidia]" in sampler.unavailable["nvml"]

    fake = _fake_pynvml(energy=True, event_reasons=True, mask=0)

    def no_lib():
        raise _NvErr("NVML Shared Library Not Found")

    fake.nvmlInit = no_lib
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with pytest.raises(SourceUnavailable, match="Shared Library Not Found"):
        READERS["nvml"](ReaderContext()).open()


# --------------------------------------------------------------------------- verdict


def _h100_series(thermal_from: int, n: int = 40) -> list[Sample]:
    """Recorded shape of a long decode on an NVIDIA card: power cap from the start,
    HW thermal slowdown (0x40, with 0x8) once hot, SM clock falling with it."""
    rows = []
    for i in range(n):
        hot = i >= thermal_from
        rows.append({
            "gpu0.clocks_event_reasons": 0x4 | (0x48 if hot else 0),
            "gpu0.sm_clock_mhz": 1410.0 if hot else 1980.0,
            "gpu0.temp_c": 88.0 if hot else 70.0 + i * 0.3,
            "gpu0.power_w": 690.0,
            "gpu0.util_pct": 100.0,
            "gpu0.energy_j": 1000.0 + i * 690 * 0.25,
        })
    return _samples(rows)


def test_verdict_thermal_bits_mean_throttled() -> None:
    verdict = throttle_verdict(_h100_series(thermal_from=28))
    assert verdict.throttled is True
    assert "GPU0 HW thermal slowdown in 12/40 samples" in verdict.evidence
    assert "GPU0 HW slowdown in 12/40 samples" in verdict.evidence
    assert "GPU clocks-event reasons" in verdict.checked


def test_verdict_power_cap_only_is_not_throttling() -> None:
    rows = [{"gpu0.clocks_event_reasons": 0x4 if i % 3 else 0x5, "gpu0.sm_clock_mhz": 1755.0,
             "gpu0.util_pct": 100.0} for i in range(30)]
    verdict = throttle_verdict(_samples(rows))
    assert verdict.throttled is False
    assert verdict.evidence == []
    assert verdict.notes == ["GPU0 power cap (normal under load) in 30/30 samples"]


def test_verdict_without_any_signal_is_none_with_reason() -> None:
    verdict = throttle_verdict(_samples([{"proc.rss_bytes": 1e9}] * 10),
                               unavailable={"nvml": "NVML Shared Library Not Found"})
    assert verdict.throttled is None
    assert "no throttling signal" in verdict.reason
    assert "nvml" in verdict.reason
    assert throttle_verdict([]).throttled is None


def test_verdict_cpu_throttle_counter_increase() -> None:
    rows = [{"cpu.package_throttle_count": 10.0 + (3 if i > 5 else 0),
             "cpu.core_throttle_count": 4.0} for i in range(10)]
    verdict = throttle_verdict(_samples(rows))
    assert verdict.throttled is True
    assert verdict.evidence == ["package_throttle_count +3"]

    flat = [{"cpu.package_throttle_count": 10.0}] * 10
    assert throttle_verdict(_samples(flat)).throttled is False


def _cpu_rows(mhz: list[float], util: float) -> list[dict[str, float]]:
    return [{"cpu.freq_mhz": f, "cpu.util_pct": util} for f in mhz]


def test_verdict_cpu_clock_drop_while_busy() -> None:
    mhz = [3500.0, 3510.0, 3490.0, 3500.0, 3000.0, 2600.0, 2100.0, 2110.0, 2090.0, 2100.0]
    verdict = throttle_verdict(_samples(_cpu_rows(mhz, util=98.0)))
    assert verdict.throttled is True
    assert verdict.evidence == [
        "CPU clock fell from 3.50 GHz to 2.10 GHz (-40%) while busy"
    ]


def test_verdict_cpu_clock_small_drift_or_idle_is_not_throttling() -> None:
    drift = [3500.0, 3480.0, 3450.0, 3420.0, 3400.0, 3410.0, 3390.0, 3400.0]
    assert throttle_verdict(_samples(_cpu_rows(drift, util=95.0))).throttled is False
    # The same 40% fall on an idle machine is power saving: no verdict from it.
    idle_drop = [3500.0] * 4 + [2100.0] * 4
    idle = throttle_verdict(_samples(_cpu_rows(idle_drop, util=3.0)))
    assert idle.throttled is None
    assert "busy" in idle.reason


def test_verdict_constant_vm_clock_cannot_tell() -> None:
    verdict = throttle_verdict(_samples(_cpu_rows([2445.426] * 10, util=99.0)))
    assert verdict.throttled is None
    assert "constant 2.45 GHz" in verdict.reason


def test_verdict_amdgpu_clock_drop() -> None:
    rows = [{"amdgpu0.freq_mhz": 2500.0 if i < 6 else 1700.0, "amdgpu0.util_pct": 100.0}
            for i in range(12)]
    verdict = throttle_verdict(_samples(rows))
    assert verdict.throttled is True
    assert verdict.evidence[0].startswith("amdgpu0 clock fell from 2.50 GHz to 1.70 GHz")


# --------------------------------------------------------------------------- summary


def test_summary_stats_energy_and_bitmasks_from_recorded_series() -> None:
    samples = _h100_series(thermal_from=28)
    summary = summarize(samples, interval_s=0.25, sources={"nvml": "NVML driver 550"})
    assert summary.sample_count == 40
    assert summary.duration_s == pytest.approx(39 * 0.25)
    assert summary.energy_j["gpu0.energy_j"] == pytest.approx(39 * 690 * 0.25)
    assert summary.mean_power_w["gpu0.energy_j"] == pytest.approx(690.0)
    sm = summary.metrics["gpu0.sm_clock_mhz"]
    assert (sm.min, sm.max, sm.n) == (1410.0, 1980.0, 40)
    assert sm.mean == pytest.approx((28 * 1980 + 12 * 1410) / 40)
    assert summary.bitmasks["gpu0.clocks_event_reasons"] == {
        "samples": 40, "sw_power_cap": 40, "hw_slowdown": 12, "hw_thermal_slowdown": 12,
    }
    assert "gpu0.clocks_event_reasons" not in summary.metrics
    assert summary.verdict.throttled is True


def test_summary_counters_are_run_deltas() -> None:
    rows = [{"cpu.core_throttle_count": 100.0 + i} for i in range(5)]
    assert summarize(_samples(rows)).counters == {"cpu.core_throttle_count": 4.0}


# --------------------------------------------------------------------------- watch


def test_watch_shows_live_readings_and_prints_the_verdict() -> None:
    out = io.StringIO()
    summary = watch(0.4, 0.1, Console(file=out, width=200))
    text = out.getvalue()
    assert summary.sample_count >= 3
    assert "Throttling:" in text
    assert "proc.rss_bytes" in text
    assert "not sampled:" in text or not summary.unavailable
    assert _telemetry_threads() == []


def test_watch_rejects_bad_arguments() -> None:
    with pytest.raises(InputError, match="--watch"):
        watch(0, 0.25, Console(file=io.StringIO()))
    with pytest.raises(InputError, match="interval"):
        watch(1, 0.001, Console(file=io.StringIO()))


def test_summary_table_renders_every_kind() -> None:
    summary = summarize(_h100_series(thermal_from=28))
    console = Console(file=io.StringIO(), width=200)
    console.print(summary_table(summary))
    console.print(render_summary(summary))
    text = console.file.getvalue()
    assert "1,980 MHz" in text
    assert "hw_thermal_slowdown 12/40" in text
    assert "(690.0 W avg)" in text
    assert "THROTTLED" in text
    assert format_value("proc.rss_bytes", 3 * 2**30) == "3.00 GiB"
    reasons = format_value("gpu0.clocks_event_reasons", 0x44)
    assert reasons == "0x44 sw_power_cap,hw_thermal_slowdown"
