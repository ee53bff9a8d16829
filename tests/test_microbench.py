"""Roofline measurement on this CPU (quick sizes), and derived/tabled peaks."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.hardware.cpu import probe_cpu
from strata.hardware.microbench import MeasureConfig, measure_host, stream_elements
from strata.hardware.profile import CacheLevel, CpuInfo, GpuInfo, HostProfile, SoftwareStack
from strata.hardware.specs import cpu_peak_compute, gpu_peak_bandwidth, gpu_peak_compute


def test_stream_arrays_exceed_four_times_llc() -> None:
    cpu = CpuInfo(arch="x86_64", caches=[CacheLevel(3, "unified", 32 << 20)],
                  ram_available_bytes=64 << 30)
    assert stream_elements(cpu, 1) * 8 >= 4 * (32 << 20)
    small_ram = CpuInfo(arch="x86_64", caches=[CacheLevel(3, "unified", 32 << 20)],
                        ram_available_bytes=256 << 20)
    assert stream_elements(small_ram, 1) * 8 <= (256 << 20) // 8  # never starves the machine


@pytest.mark.slow
def test_quick_roofline_on_this_cpu(strata_home: Path) -> None:
    profile = HostProfile("h", probe_cpu(), [], SoftwareStack("3", "Linux", "0"))
    seen: list[str] = []
    roof = measure_host(profile, MeasureConfig.quick(), progress=seen.append)
    cpu = roof.device("cpu")
    assert cpu is not None
    assert set(cpu.bandwidth) == {"copy", "triad", "read"}
    assert "C STREAM" in cpu.bandwidth["triad"].method  # the compiler is there: no fallback
    for fig in cpu.bandwidth.values():
        assert 0.1 < fig.value < 10_000  # GB/s: sane for any machine
        assert fig.median <= fig.value * 1.0001  # best >= median by construction
    assert "fp32" in cpu.compute and cpu.compute["fp32"].value > 0.1
    for fig in [*cpu.bandwidth.values(), *cpu.compute.values()]:  # peaks are maxima
        assert 2 <= len(fig.trials) <= 3 and fig.value == max(fig.trials)
        assert fig.spread is not None and fig.stability
    assert len(roof.host_load) == 1 and "busy" in roof.host_load[0]  # the load meanwhile
    assert cpu.ridge_point("fp32") == pytest.approx(
        cpu.compute["fp32"].value / cpu.peak_bandwidth_gbs())
    assert any("STREAM" in s for s in seen) and any("matmul" in s for s in seen)


# Recorded NVML values of an H100 SXM5 80GB (max memory clock 2619 MHz, 5120-bit HBM3).
H100 = GpuInfo(index=0, vendor="nvidia", name="NVIDIA H100 80GB HBM3", backend="cuda",
               arch="sm_90", bus_width_bits=5120, mem_clock_max_mhz=2619)


def test_nvidia_bandwidth_is_derived_from_clock_and_bus() -> None:
    peak = gpu_peak_bandwidth(H100)
    assert peak is not None and peak.value == pytest.approx(3352.3, rel=1e-3)
    assert "5120 bit" in peak.basis


def test_spec_table_gives_dense_peaks_and_falls_back_for_bandwidth() -> None:
    h200 = GpuInfo(index=0, vendor="nvidia", name="NVIDIA H200", backend="cuda")
    peaks = gpu_peak_compute(h200)
    assert peaks["bf16"].value == pytest.approx(989_500)  # dense, not the sparsity figure
    assert gpu_peak_bandwidth(h200).value == pytest.approx(4800)
    pcie = GpuInfo(index=0, vendor="nvidia", name="NVIDIA H100 PCIe", backend="cuda")
    assert gpu_peak_compute(pcie)["bf16"].value == pytest.approx(756_000)
    assert gpu_peak_compute(GpuInfo(0, "nvidia", "Mystery GPU", "cuda")) == {}


def test_cpu_peak_from_uarch_table() -> None:
    zen3 = CpuInfo(arch="x86_64", vendor="AuthenticAMD", family=25, model_id=1,
                   physical_cores=2, freq_mhz_max=3500.0)
    peaks, reason = cpu_peak_compute(zen3)
    assert reason is None and peaks["fp32"].value == pytest.approx(2 * 3.5 * 32)
    unknown = CpuInfo(arch="riscv64", vendor="Acme", family=1, model_id=1, physical_cores=4)
    peaks, reason = cpu_peak_compute(unknown)
    assert peaks == {} and "not in the spec table" in reason


def test_figure_above_theoretical_peak_is_flagged_not_hidden() -> None:
    from strata.hardware.microbench import _flag_above_peak
    from strata.measure.roofline import DeviceRoofline, Figure, Peak

    dev = DeviceRoofline("cpu", "x", compute={"fp32": Figure(180.0, "m"), "bf16": Figure(1, "m")},
                         peak_compute={"fp32": Peak(156.5, "2 cores x 2.45 GHz (reported)")})
    _flag_above_peak(dev)
    assert len(dev.notes) == 1 and "1.15x" in dev.notes[0] and "reported" in dev.notes[0]
    dev.compute["fp32"] = Figure(150.0, "m")
    dev.notes.clear()
    _flag_above_peak(dev)
    assert dev.notes == []
