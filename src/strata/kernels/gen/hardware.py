"""The hardware dialect a kernel writer needs, as text: CPU ISA features, cores, caches and
the measured roofline; or a GPU's name, compute capability / gfx target, SMs or CUs, shared
memory per block and measured bandwidth. From the probe (HostProfile) and the stored
roofline, never from a literal about this host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from strata.errors import InputError

if TYPE_CHECKING:
    from strata.hardware.profile import CpuInfo, GpuInfo
    from strata.host import Host
    from strata.measure.roofline import DeviceRoofline, Roofline

# Max shared memory per block (bytes, opt-in) by CUDA compute capability (CUDA C++
# Programming Guide, "Technical Specifications per Compute Capability"): the probe does
# not read it, and it decides which tilings fit.
CUDA_SMEM_OPTIN = {"7.0": 96 << 10, "7.2": 96 << 10, "7.5": 64 << 10, "8.0": 163 << 10,
                   "8.6": 99 << 10, "8.7": 163 << 10, "8.9": 99 << 10, "9.0": 227 << 10,
                   "10.0": 227 << 10, "10.3": 227 << 10, "12.0": 99 << 10}


def _size(n: int | None) -> str:
    if not n:
        return "?"
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.4g} {unit}"
    return f"{n} B"


def _caches(cpu: CpuInfo) -> str:
    parts = []
    for c in sorted(cpu.caches, key=lambda c: (c.level, c.kind)):
        if c.kind == "instruction":
            continue
        name = f"L{c.level}{'d' if c.kind == 'data' else ''}"
        where = f"per core (x{c.instances})" if c.instances > 1 else "shared"
        parts.append(f"{name} {_size(c.size_bytes)} {where}")
    return ", ".join(parts) or "not probed"


def _isa_summary(isa: list[str]) -> str:
    groups = {"AVX2": ("avx2", "fma"), "AVX-512": ("avx512f", "avx512bw"),
              "VNNI": ("avx512_vnni", "avx_vnni"), "BF16": ("avx512_bf16", "bf16", "amx_bf16"),
              "AMX": ("amx_tile",), "NEON": ("neon",), "SVE": ("sve", "sve2")}
    return "; ".join(f"{g}: {'yes' if any(f in isa for f in fs) else 'no'}"
                     for g, fs in groups.items())


def _measured(dev: DeviceRoofline | None, what: str) -> str:
    if dev is None:
        return f"{what}: not measured on this host (run `strata probe --measure`)"
    bw = [f"{k} {f.value:,.0f} GB/s" for k, f in dev.bandwidth.items()
          if k in dev._ON_DEVICE]
    fl = [f"{k} {f.value:,.0f} GFLOP/s" for k, f in dev.compute.items()]
    return (f"{what} (measured here, the roofline): memory bandwidth "
            f"{', '.join(bw) or 'not measured'}; compute {', '.join(fl) or 'not measured'}")


def _cpu_text(cpu: CpuInfo, dev: DeviceRoofline | None) -> str:
    from strata.native import DEFAULT_FLAGS

    clock = f", up to {cpu.freq_mhz_max / 1000:.2f} GHz" if cpu.freq_mhz_max else ""
    return "\n".join([
        f"- CPU: {cpu.model or 'unknown model'} ({cpu.arch}), {cpu.physical_cores or '?'} "
        f"physical cores / {cpu.logical_threads or '?'} threads{clock}, "
        f"{cpu.numa_nodes or 1} NUMA node(s)",
        f"- ISA features: {', '.join(cpu.isa) or 'none probed'} ({_isa_summary(cpu.isa)})",
        f"- caches: {_caches(cpu)}; RAM {_size(cpu.ram_total_bytes)}",
        f"- compiler: cc {' '.join(DEFAULT_FLAGS)} (-march=native targets exactly this CPU)",
        f"- {_measured(dev, 'CPU')}"])


def _gpu_text(gpu: GpuInfo, dev: DeviceRoofline | None) -> str:
    from strata.hardware.specs import gpu_peak_bandwidth, gpu_peak_compute

    arch = gpu.arch or "unknown"
    lines = [f"- GPU {gpu.key}: {gpu.name} ({gpu.vendor}, driven by {gpu.backend}), "
             f"{_size(gpu.memory_total_bytes)} memory"]
    if arch.startswith("sm_"):
        cc = f"{arch[3:-1]}.{arch[-1]}"
        smem = CUDA_SMEM_OPTIN.get(cc)
        lines.append(f"- compute capability {cc} ({arch}); {gpu.multiprocessors or '?'} SMs; "
                     "warp 32 threads")
        lines.append(f"- shared memory per block: 48 KiB static, up to "
                     f"{_size(smem) if smem else '?'} dynamic with cudaFuncSetAttribute "
                     "(from the compute-capability table, not probed)")
    elif arch.startswith("gfx"):
        wave = 64 if arch.startswith("gfx9") else 32
        lines.append(f"- gfx target {arch}; {gpu.multiprocessors or '?'} CUs; wavefront "
                     f"{wave}; LDS 64 KiB per workgroup")
    else:
        lines.append(f"- arch {arch}; {gpu.multiprocessors or '?'} compute units")
    if gpu.sm_clock_max_mhz:
        lines.append(f"- clock up to {gpu.sm_clock_max_mhz:g} MHz")
    peak = gpu_peak_bandwidth(gpu)
    if peak:
        lines.append(f"- theoretical memory bandwidth {peak.value:,.0f} GB/s ({peak.basis})")
    peaks = gpu_peak_compute(gpu)
    if peaks:
        lines.append("- datasheet compute: " + ", ".join(f"{k} {p.value:,.0f} GFLOP/s"
                                                       for k, p in peaks.items()))
    lines.append(f"- {_measured(dev, 'GPU')}")
    return "\n".join(lines)


def gpu_for(host: Host, device: str) -> GpuInfo | None:
    kind, _, index = device.partition(":")
    for gpu in host.profile.gpus:
        if gpu.key == device or (kind in ("cuda", gpu.backend) and
                                 str(gpu.index) == (index or "0")):
            return gpu
    return None


def hardware_dialect(host: Host, device: str, roofline: Roofline | None) -> str:
    """CPU ISA, cores, caches and measured peaks, or the GPU's name, arch, SMs/CUs, shared
    memory and measured bandwidth: what a kernel writer must know about this silicon."""
    dev = roofline.device(device) if roofline is not None else None
    if device == "cpu":
        return _cpu_text(host.profile.cpu, dev)
    gpu = gpu_for(host, device)
    if gpu is None:
        have = ", ".join(g.key for g in host.profile.gpus) or "none"
        raise InputError(f"--device {device}: no such device on this host (GPUs: {have})")
    if dev is None and roofline is not None:
        dev = roofline.device(gpu.key)
    return _gpu_text(gpu, dev)


