"""CPU part of the probe: vendor, model, cores, caches, NUMA, ISA features, RAM.

Parsers take text/paths so recorded data of other machines (an Arm board, an Intel
server) can be fed through the same code in tests.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

from strata.hardware.profile import CacheLevel, CpuInfo

# normalised feature name -> flag names as Linux spells them (x86 "flags", Arm "Features").
# Only features that matter for inference kernels are listed (issue 2).
ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "avx2": ("avx2",),
    "fma": ("fma",),
    "f16c": ("f16c",),
    "avx512f": ("avx512f",),
    "avx512bw": ("avx512bw",),
    "avx512_vnni": ("avx512_vnni", "avx512vnni"),
    "avx512_bf16": ("avx512_bf16",),
    "avx512_fp16": ("avx512_fp16",),
    "avx_vnni": ("avx_vnni",),
    "amx_tile": ("amx_tile",),
    "amx_bf16": ("amx_bf16",),
    "amx_int8": ("amx_int8",),
    "neon": ("asimd", "neon"),
    "fp16": ("asimdhp",),  # Arm FP16 vector arithmetic
    "dotprod": ("asimddp",),
    "i8mm": ("i8mm",),
    "sve": ("sve",),
    "sve2": ("sve2",),
    "bf16": ("bf16",),
    "sme": ("sme",),
}

# macOS reports Arm features through sysctl hw.optional.* keys.
DARWIN_ISA_KEYS: dict[str, str] = {
    "neon": "hw.optional.neon",
    "fp16": "hw.optional.arm.FEAT_FP16",
    "dotprod": "hw.optional.arm.FEAT_DotProd",
    "i8mm": "hw.optional.arm.FEAT_I8MM",
    "bf16": "hw.optional.arm.FEAT_BF16",
    "sme": "hw.optional.arm.FEAT_SME",
}

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG]?)", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int | None:
    """'32K' / '1024K' / '32 MiB' -> bytes."""
    m = _SIZE_RE.match(text)
    return int(m.group(1)) * _UNITS[m.group(2).upper()] if m else None


def parse_cpuinfo(text: str) -> dict[str, str]:
    """First processor block of /proc/cpuinfo as a dict (keys lower-cased)."""
    info: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if info:
                break
            continue
        key, _, value = line.partition(":")
        info.setdefault(key.strip().lower(), value.strip())
    return info


def isa_from_flags(flags: set[str]) -> list[str]:
    return sorted(name for name, aliases in ISA_FLAGS.items() if flags & set(aliases))


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8' -> [0, 1, 2, 3, 8]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def read_sysfs_caches(cpu_root: Path) -> list[CacheLevel]:
    """Caches of cpu0 from sysfs, with how many instances each level has on the machine."""
    caches: list[CacheLevel] = []
    for index in sorted((cpu_root / "cpu0" / "cache").glob("index*")):
        level = int((index / "level").read_text())
        kind = (index / "type").read_text().strip().lower()
        size = parse_size((index / "size").read_text()) or 0
        shared = len(parse_cpulist((index / "shared_cpu_list").read_text()))
        online = _online_cpus(cpu_root)
        instances = max(1, online // max(1, shared)) if online else 1
        caches.append(CacheLevel(level, kind, size, instances))
    return caches


def _online_cpus(cpu_root: Path) -> int:
    try:
        return len(parse_cpulist((cpu_root / "online").read_text()))
    except OSError:
        return os.cpu_count() or 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _physical_cores(text: str) -> int | None:
    """Distinct (physical id, core id) pairs in /proc/cpuinfo."""
    pairs = set(re.findall(r"physical id\s*:\s*(\d+)[\s\S]*?core id\s*:\s*(\d+)", text))
    return len(pairs) or None


def probe_linux(proc: Path = Path("/proc"), sys_cpu: Path = Path("/sys/devices/system/cpu"),
                sys_node: Path = Path("/sys/devices/system/node")) -> CpuInfo:
    cpu = CpuInfo(arch=platform.machine())
    text = _read(proc / "cpuinfo")
    if text is None:
        cpu.unknown["cpuinfo"] = f"{proc / 'cpuinfo'} not readable"
    else:
        _fill_from_cpuinfo(cpu, text)
    _fill_caches(cpu, sys_cpu)
    _fill_freq(cpu, sys_cpu)
    nodes = list(sys_node.glob("node[0-9]*")) if sys_node.exists() else []
    if nodes:
        cpu.numa_nodes = len(nodes)
    else:
        cpu.unknown["numa_nodes"] = f"{sys_node} not present"
    return cpu


def _fill_from_cpuinfo(cpu: CpuInfo, text: str) -> None:
    first = parse_cpuinfo(text)
    cpu.vendor = first.get("vendor_id") or _arm_vendor(first.get("cpu implementer"))
    cpu.model = first.get("model name") or first.get("hardware") or first.get("cpu part")
    cpu.family = _int(first.get("cpu family"))
    cpu.model_id = _int(first.get("model"))
    flags = set((first.get("flags") or first.get("features") or "").split())
    cpu.isa = isa_from_flags(flags)
    cpu.logical_threads = text.count("processor\t") or text.count("processor ") or None
    cpu.physical_cores = _physical_cores(text) or cpu.logical_threads
    mhz = _float(first.get("cpu mhz"))
    if mhz:
        cpu.freq_mhz_nominal = mhz


_ARM_IMPLEMENTERS = {"0x41": "ARM", "0x61": "Apple", "0x51": "Qualcomm", "0x48": "HiSilicon",
                     "0x4e": "NVIDIA", "0xc0": "Ampere"}


def _arm_vendor(code: str | None) -> str | None:
    return _ARM_IMPLEMENTERS.get((code or "").lower(), code)


def _fill_caches(cpu: CpuInfo, sys_cpu: Path) -> None:
    try:
        cpu.caches = read_sysfs_caches(sys_cpu)
    except (OSError, ValueError) as exc:
        cpu.unknown["caches"] = f"sysfs cache info unreadable: {exc}"
    if not cpu.caches:
        cpu.unknown.setdefault("caches", f"{sys_cpu}/cpu0/cache has no entries")


def _fill_freq(cpu: CpuInfo, sys_cpu: Path) -> None:
    khz = _read(sys_cpu / "cpu0" / "cpufreq" / "cpuinfo_max_freq")
    if khz and khz.strip().isdigit():
        cpu.freq_mhz_max = int(khz) / 1000
    else:
        cpu.unknown["freq_mhz_max"] = "no cpufreq driver exposed (common in VMs)"


def _int(value: str | None) -> int | None:
    try:
        return int(value, 0) if value is not None else None
    except ValueError:
        return None


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def probe_darwin() -> CpuInfo:
    import subprocess

    cpu = CpuInfo(arch=platform.machine())
    try:
        out = subprocess.run(["sysctl", "-a"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        cpu.unknown["sysctl"] = str(exc)
        return cpu
    kv = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    cpu.model = kv.get("machdep.cpu.brand_string")
    cpu.vendor = "Apple" if cpu.arch == "arm64" else kv.get("machdep.cpu.vendor")
    cpu.physical_cores = _int(kv.get("hw.physicalcpu"))
    cpu.logical_threads = _int(kv.get("hw.logicalcpu"))
    cpu.isa = sorted(n for n, key in DARWIN_ISA_KEYS.items() if kv.get(key) == "1")
    for level, key in ((1, "hw.l1dcachesize"), (2, "hw.l2cachesize"), (3, "hw.l3cachesize")):
        size = _int(kv.get(key))
        if size:
            cpu.caches.append(CacheLevel(level, "data" if level == 1 else "unified", size))
    return cpu


_PLATFORM_PROBES = {"Linux": probe_linux, "Darwin": probe_darwin}


def probe_cpu() -> CpuInfo:
    probe = _PLATFORM_PROBES.get(platform.system())
    if probe is None:
        cpu = CpuInfo(arch=platform.machine(), model=platform.processor() or None)
        cpu.unknown["details"] = f"no CPU probe for {platform.system()}"
    else:
        cpu = probe()
    _fill_ram(cpu)
    if cpu.logical_threads is None:
        cpu.logical_threads = os.cpu_count()
    return cpu


def _fill_ram(cpu: CpuInfo) -> None:
    import psutil

    mem = psutil.virtual_memory()
    cpu.ram_total_bytes, cpu.ram_available_bytes = int(mem.total), int(mem.available)
