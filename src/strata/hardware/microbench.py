"""`strata probe --measure`: bandwidth and matmul throughput -> this host's Roofline.

CPU bandwidth uses STREAM kernels in C (compiled here, OpenMP on all cores, first touch by
the workers); without a compiler it falls back to multithreaded torch ops and says so.
Matmul throughput uses torch.matmul (the vendor BLAS/oneDNN/cuBLAS path) at sizes that
saturate the device; on a CPU, fp32 takes the better of it and the same product through
oneDNN (torch's BLAS may not use the CPU's widest vectors). GPUs get device-to-device copy
timed with events and pinned host<->device transfers.
Every timing goes through strata.measure.timer.

Peaks are maxima: every figure is the best of several trials, repeated until the best two
agree (strata.measure.peak), with the trials and their spread stored next to it. The whole
measurement runs under a HostLoadMonitor, so a roofline measured while other processes
were busy says so (Roofline.host_load, Roofline.measured_busy).

Public API:
  measure_host(profile, config, progress) -> Roofline        everything, once
  measure_group(profile, device, group, config) -> {name: Figure}
      one group again: group "bandwidth" (every stream/copy figure of the device) or a
      compute dtype ("fp32", "bf16", "fp16", "int8"); what a re-measure calls
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.hardware.devices import sync
from strata.hardware.profile import CpuInfo, GpuInfo, HostProfile
from strata.hardware.specs import cpu_peak_compute, gpu_peak_bandwidth, gpu_peak_compute
from strata.hardware.telemetry.hostload import HostLoadMonitor
from strata.measure.peak import StabilityRule, best_of_trials
from strata.measure.roofline import DeviceRoofline, Figure, Roofline
from strata.measure.timer import CudaEventClock, HostClock, TimingPolicy, time_calls

STREAM_SOURCE = Path(__file__).parent / "csrc" / "stream.c"
Progress = Callable[[str], None]

# dtype -> CPU ISA features that give torch a fast path for it; None = always measured.
# fp32 is the baseline and bf16 the usual LLM dtype; fp16/int8 only where hardware helps.
CPU_DTYPE_FAST_PATH: dict[str, tuple[str, ...] | None] = {
    "fp32": None,
    "bf16": None,
    "fp16": ("avx512_fp16", "amx_tile", "fp16"),
    "int8": ("avx512_vnni", "avx_vnni", "amx_int8", "dotprod", "i8mm"),
}
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "int8"}


@dataclass
class MeasureConfig:
    bandwidth_policy: TimingPolicy  # one trial of one figure
    matmul_policy: TimingPolicy
    min_array_bytes: int = 64 << 20
    matmul_target_s: float = 0.05  # grow the matrix until one call takes this long
    cpu_matmul_max_n: int = 4096
    gpu_matmul_max_n: int = 8192
    # best of trials until the best two agree
    trials: StabilityRule = field(default_factory=StabilityRule)

    @classmethod
    def default(cls) -> MeasureConfig:
        # Shorter trials than one long run: three short looks at the peak find it more
        # reliably than one long one that a burst of other work can drag down.
        return cls(TimingPolicy(warmup_s=0.05, min_reps=3, max_reps=10, max_time_s=0.4),
                   TimingPolicy(warmup_s=0.1, min_reps=3, max_reps=10, max_time_s=0.6))

    @classmethod
    def quick(cls) -> MeasureConfig:
        """Small and short: for tests, where figures only need to exist and be sane."""
        return cls(TimingPolicy(warmup_s=0.0, min_reps=2, max_reps=3, max_time_s=0.2),
                   TimingPolicy(warmup_s=0.0, min_reps=2, max_reps=3, max_time_s=0.2),
                   min_array_bytes=8 << 20, matmul_target_s=0.005, cpu_matmul_max_n=256,
                   gpu_matmul_max_n=1024,
                   trials=StabilityRule(min_trials=2, max_trials=3, agree_rel=0.5,
                                        max_time_s=1.0))


def measure_host(profile: HostProfile, config: MeasureConfig | None = None,
                 progress: Progress | None = None) -> Roofline:
    """Every device's roofline, each figure the best of stable trials; the host load while
    it ran is recorded with it (Roofline.host_load)."""
    config = config or MeasureConfig.default()
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    unknown: dict[str, str] = {}
    with HostLoadMonitor() as load:
        devices = [measure_cpu(profile.cpu, config, say)]
        for gpu in profile.gpus:
            measure = GPU_MEASURES.get(gpu.backend)
            if measure is None:
                unknown[gpu.key] = f"no measurement path for backend {gpu.backend} yet"
                continue
            devices.append(measure(gpu, config, say))
    return Roofline(devices=devices, seconds=time.perf_counter() - t0, unknown=unknown,
                    host_load=[load.summary.to_dict()])


def measure_group(profile: HostProfile, device: str, group: str,
                  config: MeasureConfig | None = None) -> dict[str, Figure]:
    """One group of figures of one device, measured again with the same stability rule.

    group: "bandwidth" or a compute dtype. Raises ValueError for a device or group this
    host cannot measure (a re-measure then keeps the stored figure)."""
    config = config or MeasureConfig.default()
    if device == "cpu":
        if group == "bandwidth":
            return measure_cpu_bandwidth(profile.cpu, config)[0]
        import torch

        return {group: cpu_compute(torch, group, config)}
    gpu = next((g for g in profile.gpus if g.key == device), None)
    if gpu is None or gpu.backend not in GPU_MEASURES:
        raise ValueError(f"no measurement path for {device} on this host")
    import torch

    from strata.hardware.vendors import device_for_gpu

    target = device_for_gpu(gpu).torch_key  # 'rocm:0' is 'cuda:0' to torch
    clock = CudaEventClock(torch, target)
    if group == "bandwidth":
        return _gpu_bandwidth(torch, target, config, clock)
    return {group: measure_matmul(torch, group, target, config.gpu_matmul_max_n, config, clock)}


# ---------------------------------------------------------------- CPU bandwidth (STREAM)

def stream_elements(cpu: CpuInfo, min_bytes: int) -> int:
    """Doubles per array: >= 4x the last-level cache (STREAM rule), capped by free RAM."""
    llc = cpu.last_level_cache_bytes() or (32 << 20)
    want = max(4 * llc, min_bytes)
    if cpu.ram_available_bytes:
        want = min(want, cpu.ram_available_bytes // 8)  # three arrays, leave plenty free
    return want // 8


def measure_cpu_bandwidth(cpu: CpuInfo, config: MeasureConfig) -> tuple[dict[str, Figure], str]:
    """copy/triad/read GB/s; returns (figures, note on the method or the fallback)."""
    from strata.native import CompileError, load_shared

    n = stream_elements(cpu, config.min_array_bytes)
    try:
        lib = load_shared(STREAM_SOURCE)
    except (CompileError, OSError) as exc:
        return _torch_bandwidth(n, config), f"C STREAM unavailable ({exc}); used torch ops"
    return _c_stream(lib, n, config), ""


def _c_stream(lib: ctypes.CDLL, n: int, config: MeasureConfig) -> dict[str, Figure]:
    import numpy as np

    dbl_p = ctypes.POINTER(ctypes.c_double)
    lib.strata_read.restype = ctypes.c_double
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lib.strata_set_threads(threads or 1)
    # np.empty does not touch the pages; strata_init's OpenMP workers do (first touch).
    a, b, c = (np.empty(n, dtype=np.float64) for _ in range(3))
    pa, pb, pc = (x.ctypes.data_as(dbl_p) for x in (a, b, c))
    lib.strata_init(pa, pb, pc, ctypes.c_long(n))
    kernels = {
        "copy": (lambda: lib.strata_copy(pa, pc, ctypes.c_long(n)), 2),
        "triad": (lambda: lib.strata_triad(pa, pb, pc, ctypes.c_double(3.0), ctypes.c_long(n)), 3),
        "read": (lambda: lib.strata_read(pa, ctypes.c_long(n)), 1),
    }
    desc = f"C STREAM, {threads} threads, {n * 8 >> 20} MiB arrays"
    return best_of_trials(
        lambda: {name: _rate(fn, arrays * n * 8, config.bandwidth_policy, f"{desc} ({name})")
                 for name, (fn, arrays) in kernels.items()}, config.trials)


def _rate(fn: Callable[[], object], nbytes: float, policy: TimingPolicy, method: str,
          clock: Any = None) -> Figure:
    """GB/s (or GFLOP/s when nbytes is a FLOP count) from the best and the median time."""
    s = time_calls(fn, policy, clock=clock)
    return Figure(value=nbytes / s.min / 1e9, median=nbytes / s.median / 1e9,
                  method=f"{method}, best of {s.n} calls")


def _torch_bandwidth(n: int, config: MeasureConfig) -> dict[str, Figure]:
    import torch

    a, b, c = (torch.ones(n, dtype=torch.float64) for _ in range(3))  # parallel fill
    desc = f"torch ops, {torch.get_num_threads()} threads, {n * 8 >> 20} MiB arrays"
    policy = config.bandwidth_policy
    return best_of_trials(lambda: {
        "copy": _rate(lambda: c.copy_(a), 2 * n * 8, policy, f"{desc} (copy)"),
        "triad": _rate(lambda: torch.add(b, c, alpha=3.0, out=a), 3 * n * 8, policy,
                       f"{desc} (triad)"),
        "read": _rate(lambda: a.sum(), n * 8, policy, f"{desc} (read)"),
    }, config.trials)


# ---------------------------------------------------------------- matmul throughput

def _matmul_fn(torch: Any, dtype: str, n: int, device: str,
               form: str = "matmul") -> Callable[[], object]:
    if form == "conv":
        return _conv_gemm_fn(torch, n, device)
    if dtype == "int8":
        a = torch.randint(-64, 64, (n, n), dtype=torch.int8, device=device)
        b = torch.randint(-64, 64, (n, n), dtype=torch.int8, device=device)
        return lambda: torch._int_mm(a, b)
    tdt = getattr(torch, TORCH_DTYPES[dtype])
    a = torch.randn(n, n, device=device).to(tdt)
    b = torch.randn(n, n, device=device).to(tdt)
    return lambda: torch.matmul(a, b)


def _conv_gemm_fn(torch: Any, n: int, device: str) -> Callable[[], object]:
    """The same n x n x n fp32 product as a 1x1 conv2d on a channels-last image (n channels,
    n pixels): torch runs it through oneDNN, whose kernels use AVX-512 on AMD CPUs where
    torch.matmul's BLAS stays on AVX2 (half the FMA width of a Zen 5 core)."""
    import torch.nn.functional as F

    x = torch.randn(1, n, n, 1, device=device).contiguous(memory_format=torch.channels_last)
    w = torch.randn(n, n, 1, 1, device=device)
    return lambda: F.conv2d(x, w)


FORMS = {"matmul": "torch.matmul {dtype} {n}x{n}x{n} on {device}",
         "conv": "torch conv2d 1x1 channels-last {dtype} (oneDNN GEMM) {n}x{n}x{n} on {device}"}


def measure_matmul(torch: Any, dtype: str, device: str, max_n: int, config: MeasureConfig,
                   clock: Any = None, form: str = "matmul") -> Figure:
    """Grow n (powers of two) until one call takes matmul_target_s, then time it."""
    n = 256
    while n < max_n:
        fn = _matmul_fn(torch, dtype, n, device, form)
        fn()
        if time_calls(fn, TimingPolicy(0.0, 1, 1, 0.0), clock=clock).min >= config.matmul_target_s:
            break
        n *= 2
    fn = _matmul_fn(torch, dtype, n, device, form)
    unit = "GOP/s" if dtype == "int8" else "GFLOP/s"
    method = f"{FORMS[form].format(dtype=dtype, n=n, device=device)} ({unit})"
    return best_of_trials(lambda: {dtype: _rate(fn, 2 * n**3, config.matmul_policy, method,
                                                clock)}, config.trials)[dtype]


def measure_cpu_matmul(cpu: CpuInfo, config: MeasureConfig,
                       say: Progress) -> tuple[dict[str, Figure], dict[str, str]]:
    figures: dict[str, Figure] = {}
    unknown: dict[str, str] = {}
    try:
        import torch
    except ImportError:
        return figures, {"compute": "torch not installed (pip install 'strata[torch]')"}
    for dtype, needs in CPU_DTYPE_FAST_PATH.items():
        if needs is not None and not set(needs) & set(cpu.isa):
            unknown[dtype] = f"not measured: no {dtype} fast path (needs one of {', '.join(needs)})"
            continue
        say(f"cpu matmul {dtype}")
        try:
            figures[dtype] = cpu_compute(torch, dtype, config)
        except (RuntimeError, AttributeError) as exc:
            unknown[dtype] = f"torch cannot run {dtype} matmul on cpu: {exc}"
    return figures, unknown


def cpu_compute(torch: Any, dtype: str, config: MeasureConfig) -> Figure:
    """A CPU's throughput at `dtype`: torch.matmul, and for fp32 also the same product through
    oneDNN (a channels-last 1x1 conv): the faster vendor path is what the hardware can do,
    and a kernel beating the slower one is not beyond this host's roofline."""
    best = measure_matmul(torch, dtype, "cpu", config.cpu_matmul_max_n, config)
    if dtype != "fp32":
        return best
    try:
        conv = measure_matmul(torch, dtype, "cpu", config.cpu_matmul_max_n, config,
                              form="conv")
    except RuntimeError:  # a torch built without oneDNN
        return best
    return conv if conv.value > best.value else best


def measure_cpu(cpu: CpuInfo, config: MeasureConfig, say: Progress) -> DeviceRoofline:
    dev = DeviceRoofline(device="cpu", name=cpu.model or cpu.arch)
    say("cpu memory bandwidth (STREAM)")
    dev.bandwidth, note = measure_cpu_bandwidth(cpu, config)
    if note:
        dev.unknown["bandwidth_method"] = note
    dev.compute, unknown = measure_cpu_matmul(cpu, config, say)
    dev.unknown.update(unknown)
    dev.peak_compute, reason = cpu_peak_compute(cpu)
    if reason:
        dev.unknown["peak_compute"] = reason
    dev.unknown["peak_bandwidth"] = ("not derivable: memory channels and speed are not exposed"
                                     " without DMI access")
    _flag_above_peak(dev)
    return dev


def _flag_above_peak(dev: DeviceRoofline) -> None:
    """A measured figure above its theoretical peak means the peak's basis is wrong (e.g. the
    CPU boosts above the clock it reports): say so next to the figure, never hide it."""
    for dtype in dev.compute:
        frac = dev.fraction_of_peak("compute", dtype)
        if frac and frac > 1.05:
            dev.notes.append(f"{dtype}: measured is {frac:.2f}x the theoretical peak, whose "
                             f"basis understates this device ({dev.peak_compute[dtype].basis})")


# ---------------------------------------------------------------- GPUs (CUDA and ROCm)

def measure_cuda(gpu: GpuInfo, config: MeasureConfig, say: Progress) -> DeviceRoofline:
    dev = DeviceRoofline(device=gpu.key, name=gpu.name)
    dev.peak_bandwidth = gpu_peak_bandwidth(gpu)
    dev.peak_compute = gpu_peak_compute(gpu)
    try:
        import torch
    except ImportError:
        dev.unknown["all"] = "torch not installed (pip install 'strata[torch]')"
        return dev
    if not torch.cuda.is_available():
        dev.unknown["all"] = "torch cannot use this GPU (see the support verdict)"
        return dev
    from strata.hardware.vendors import device_for_gpu

    device = device_for_gpu(gpu).torch_key  # ROCm builds drive AMD GPUs as torch 'cuda'
    clock = CudaEventClock(torch, device)
    say(f"{device} memory bandwidth")
    dev.bandwidth = _gpu_bandwidth(torch, device, config, clock)
    for dtype in ("fp32", "bf16", "fp16", "int8"):
        say(f"{device} matmul {dtype}")
        try:
            dev.compute[dtype] = measure_matmul(torch, dtype, device, config.gpu_matmul_max_n,
                                                config, clock)
        except RuntimeError as exc:
            dev.unknown[dtype] = f"{dtype} matmul failed: {str(exc).splitlines()[0]}"
    _flag_above_peak(dev)
    return dev


def _gpu_bandwidth(torch: Any, device: str, config: MeasureConfig,
                   clock: Any) -> dict[str, Figure]:
    n = (1 << 30) // 4  # 1 GiB of fp32: far beyond any GPU L2
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    host_n = (256 << 20) // 4
    pinned = torch.empty(host_n, dtype=torch.float32).pin_memory()
    dev_buf = torch.empty(host_n, dtype=torch.float32, device=device)
    policy = config.bandwidth_policy
    host_clock = HostClock(lambda: sync(device))  # host copies: wall clock, device synced
    return best_of_trials(lambda: {
        "copy": _rate(lambda: dst.copy_(src), 2 * n * 4, policy, f"{device} d2d copy 1 GiB",
                      clock),
        "h2d": _rate(lambda: dev_buf.copy_(pinned, non_blocking=True), host_n * 4, policy,
                     "pinned host->device 256 MiB", host_clock),
        "d2h": _rate(lambda: pinned.copy_(dev_buf, non_blocking=True), host_n * 4, policy,
                     "device->pinned host 256 MiB", host_clock),
    }, config.trials)


# backend -> measurement; ROCm builds of torch expose AMD GPUs through torch.cuda too.
GPU_MEASURES: dict[str, Callable[[GpuInfo, MeasureConfig, Progress], DeviceRoofline]] = {
    "cuda": measure_cuda,
    "rocm": measure_cuda,
}


def host_remeasure(profile: HostProfile | None = None,
                   config: MeasureConfig | None = None) -> Callable[[str, str], dict[str, Figure]]:
    """A `remeasure(device, group)` for strata.measure.peakguard.PeakKeeper; probes the host
    (no smoke test) the first time it is needed when no profile is given."""
    held: list[HostProfile] = [profile] if profile is not None else []

    def remeasure(device: str, group: str) -> dict[str, Figure]:
        if not held:
            from strata.hardware.probe import probe_host

            held.append(probe_host(smoke=False))
        return measure_group(held[0], device, group, config)

    return remeasure
