"""AMD GPUs: the physical gfx target from the KFD topology (sysfs).

The KFD topology reports what the silicon is; HSA_OVERRIDE_GFX_VERSION only changes what
the runtime pretends it is, so the support rules must see this value, not the override.
"""

from __future__ import annotations

from pathlib import Path

from strata.hardware.gpu import ProbeUnavailable, register
from strata.hardware.profile import GpuInfo

KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")


def gfx_from_target_version(value: int) -> str:
    """KFD gfx_target_version (major*10000 + minor*100 + stepping) -> 'gfxNNNN'.

    Minor and stepping are hex digits in the LLVM name: 90010 -> gfx90a, 120001 -> gfx1201.
    """
    major, rest = divmod(value, 10000)
    minor, stepping = divmod(rest, 100)
    return f"gfx{major}{minor:x}{stepping:x}"


def parse_properties(text: str) -> dict[str, int]:
    props: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            props[key] = int(value)
    return props


def probe_kfd(nodes_root: Path = KFD_NODES) -> list[GpuInfo]:
    if not nodes_root.exists():
        raise ProbeUnavailable(f"{nodes_root} absent (no amdgpu/KFD driver loaded)")
    gpus: list[GpuInfo] = []
    for node in sorted(nodes_root.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
        gpu = _node_gpu(node, len(gpus))
        if gpu is not None:
            gpus.append(gpu)
    return gpus


def _node_gpu(node: Path, index: int) -> GpuInfo | None:
    try:
        props = parse_properties((node / "properties").read_text())
    except OSError:
        return None
    target = props.get("gfx_target_version", 0)
    if not target:  # CPU nodes have no gfx target
        return None
    name = _read_name(node) or f"AMD GPU ({gfx_from_target_version(target)})"
    gpu = GpuInfo(index=index, vendor="amd", name=name, backend="rocm",
                  arch=gfx_from_target_version(target), source="kfd-sysfs")
    gpu.multiprocessors = props.get("simd_count")
    _fill_memory(gpu, node)
    return gpu


def _read_name(node: Path) -> str | None:
    try:
        name = (node / "name").read_text().strip()
    except OSError:
        return None
    return name or None


def _fill_memory(gpu: GpuInfo, node: Path) -> None:
    banks = sorted((node / "mem_banks").glob("*"))
    for bank in banks:
        props = parse_properties((bank / "properties").read_text())
        gpu.memory_total_bytes = (gpu.memory_total_bytes or 0) + props.get("size_in_bytes", 0)
        gpu.bus_width_bits = props.get("width") or gpu.bus_width_bits
        gpu.mem_clock_max_mhz = props.get("mem_clk_max") or gpu.mem_clock_max_mhz
    if not banks:
        gpu.unknown["memory_total_bytes"] = "KFD node lists no memory banks"


@register("amd")
def probe_amd() -> list[GpuInfo]:
    gpus = probe_kfd()
    _add_amdsmi_names(gpus)
    return gpus


def _add_amdsmi_names(gpus: list[GpuInfo]) -> None:
    """Marketing names and driver version from amdsmi when it is installed (optional)."""
    try:
        import amdsmi
    except ImportError:
        for g in gpus:
            g.unknown["driver_version"] = "amdsmi not installed"
        return
    try:
        amdsmi.amdsmi_init()
        handles = amdsmi.amdsmi_get_processor_handles()
        for gpu, h in zip(gpus, handles, strict=False):
            info = amdsmi.amdsmi_get_gpu_asic_info(h)
            gpu.name = info.get("market_name") or gpu.name
            gpu.driver_version = amdsmi.amdsmi_get_gpu_driver_info(h).get("driver_version")
        amdsmi.amdsmi_shut_down()
    except Exception as exc:  # amdsmi raises its own error types
        for g in gpus:
            g.unknown["amdsmi"] = f"amdsmi failed: {exc}"
