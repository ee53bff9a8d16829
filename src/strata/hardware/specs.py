"""Theoretical peaks: derived where the hardware tells us enough, else a sourced table.

Derived: NVIDIA memory bandwidth = 2 (double data rate) x max memory clock x bus width / 8.
Table (data/specs.json): datasheet dense peaks per GPU model, FP32 FLOP/cycle per CPU
microarchitecture. A peak we cannot derive or look up is absent with the reason.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from strata.hardware.profile import CpuInfo, GpuInfo
from strata.measure.roofline import Peak

SPECS_FILE = Path(__file__).parent / "data" / "specs.json"
DTYPES = ("fp32", "tf32", "bf16", "fp16", "int8")


@lru_cache(maxsize=1)
def load_specs() -> dict[str, Any]:
    return json.loads(SPECS_FILE.read_text())


def gpu_spec(name: str) -> dict[str, Any] | None:
    lowered = name.lower()
    return next((s for s in load_specs()["gpus"] if s["match"].lower() in lowered), None)


def gpu_peak_bandwidth(gpu: GpuInfo) -> Peak | None:
    if gpu.mem_clock_max_mhz and gpu.bus_width_bits:
        gbs = 2 * gpu.mem_clock_max_mhz * 1e6 * gpu.bus_width_bits / 8 / 1e9
        return Peak(gbs, f"2 x {gpu.mem_clock_max_mhz:g} MHz x {gpu.bus_width_bits} bit / 8")
    spec = gpu_spec(gpu.name)
    return Peak(spec["memory_tbs"] * 1000, spec["source"]) if spec else None


def gpu_peak_compute(gpu: GpuInfo) -> dict[str, Peak]:
    """GFLOP/s (GOP/s for int8) per dtype from the datasheet table."""
    spec = gpu_spec(gpu.name)
    if not spec:
        return {}
    return {d: Peak(spec[d] * 1000, spec["source"]) for d in DTYPES if d in spec}


def cpu_uarch(cpu: CpuInfo) -> dict[str, Any] | None:
    for row in load_specs()["cpus"]:
        if row["vendor"] != cpu.vendor or row["family"] != cpu.family or cpu.model_id is None:
            continue
        if any(lo <= cpu.model_id <= hi for lo, hi in row["models"]):
            return row
    return None


def cpu_peak_compute(cpu: CpuInfo) -> tuple[dict[str, Peak], str | None]:
    """FP32 peak = cores x clock x FLOP/cycle; returns (peaks, reason-if-absent)."""
    row = cpu_uarch(cpu)
    if row is None:
        return {}, f"microarchitecture of {cpu.vendor} family {cpu.family} model {cpu.model_id}" \
                   " not in the spec table"
    mhz, label = (cpu.freq_mhz_max, "max") if cpu.freq_mhz_max else (cpu.freq_mhz_nominal,
                                                                      "reported")
    if not mhz or not cpu.physical_cores:
        return {}, "core count or clock unknown"
    flop = row["fp32_flop_per_cycle"]
    gflops = cpu.physical_cores * mhz / 1000 * flop
    basis = (f"{cpu.physical_cores} cores x {mhz / 1000:.2f} GHz ({label}) x {flop} FP32 FLOP/cycle"
             f" ({row['uarch']}: {row['source']})")
    return {"fp32": Peak(gflops, basis)}, None
