"""Intel GPUs through torch's XPU backend: no sourced arch rules yet; the smoke test decides."""

from __future__ import annotations

from typing import Any

from strata.hardware.profile import GpuInfo, SoftwareStack
from strata.hardware.vendors import register
from strata.hardware.vendors.base import Runtime, Vendor
from strata.hardware.vendors.rules import RuleResult


def _xpu_rules(gpu: GpuInfo, sw: SoftwareStack, facts: dict[str, Any]) -> RuleResult:
    return RuleResult(status="unknown", reasons=[
        "no sourced arch rules for Intel XPU; support is verified by the smoke test only"])


def _install_hint_xpu(gpu: GpuInfo, sw: SoftwareStack, facts: dict[str, Any]) -> str:
    return "install a PyTorch build with XPU support (torch.xpu.is_available() must be True)"


def _xpu_sync(device: str) -> None:
    import torch

    torch.xpu.synchronize(device)


def _xpu_memory(device: str) -> tuple[int, int] | None:
    import torch

    free, total = torch.xpu.mem_get_info(device)
    return int(free), int(total)


XPU = Runtime("xpu", sync=_xpu_sync, memory=_xpu_memory)

# Triton runs on Intel GPUs through the XPU backend that ships with torch's XPU wheels.
VENDOR = register(Vendor(backend="xpu", vendor="intel", runtime=XPU, triton=True,
                         build_tags=("xpu",), rules=_xpu_rules, install_hint=_install_hint_xpu))
