"""Apple silicon GPUs through torch's MPS backend: no arch list to check, only the macOS and
torch versions bfloat16 needs."""

from __future__ import annotations

import re
from typing import Any

from strata.hardware.profile import GpuInfo, SoftwareStack
from strata.hardware.vendors import register
from strata.hardware.vendors.base import Runtime, Vendor
from strata.hardware.vendors.rules import RuleResult, fmt_version, version_tuple


def macos_version(os_text: str | None) -> tuple[int, ...]:
    """'macOS-14.6.1-arm64-arm-64bit' (platform.platform()) or 'Darwin 23.6.0' -> (14, 6, 1)."""
    text = os_text or ""
    match = re.search(r"mac\s*os[-\s]*(\d+(?:\.\d+)*)", text, re.IGNORECASE)
    if match:
        return version_tuple(match.group(1))
    darwin = re.search(r"darwin[-\s]*(\d+)", text, re.IGNORECASE)
    # Darwin 20 = macOS 11, and so on: the kernel major runs 9 ahead since Big Sur.
    if darwin and int(darwin.group(1)) >= 20:
        return (int(darwin.group(1)) - 9,)
    return ()



def _mps_rules(gpu: GpuInfo, sw: SoftwareStack, facts: dict[str, Any]) -> RuleResult:
    result = RuleResult(status="supported")
    result.works += ["float32 tensors", "float16 tensors"]
    mps = facts.get("mps", {})
    if not mps.get("float64", {}).get("supported", True):
        result.reasons.append("float64 is not available on MPS (by design of the backend)")
    bf16 = mps.get("bfloat16")
    macos = macos_version(sw.os)
    if not bf16:
        result.reasons.append("bfloat16 on MPS: no sourced rule; decided by the smoke test")
    elif not macos:
        result.reasons.append(f"macOS version not known from {sw.os!r}: bfloat16 (needs macOS "
                              f"{bf16['min_macos']}+) decided by the smoke test")
    else:
        _apply_mps_bf16(result, sw, macos, bf16)
    result.reasons.append("MPS has no compiled arch list to check; the smoke test verifies it")
    return result


def _apply_mps_bf16(result: RuleResult, sw: SoftwareStack, macos: tuple[int, ...],
                    bf16: dict[str, Any]) -> None:
    need_os, need_torch = version_tuple(bf16["min_macos"]), version_tuple(bf16["min_torch"])
    torch_ok = version_tuple(sw.torch)[:2] >= need_torch[:2]
    if macos >= need_os and torch_ok:
        result.works.append("bfloat16 tensors")
        return
    result.worsen("partial")
    result.fails.append(f"bfloat16 tensors (need macOS {bf16['min_macos']}+ and torch "
                        f">= {bf16['min_torch']}; found macOS {fmt_version(macos)}, "
                        f"torch {sw.torch})")
    result.reasons.append(f"source: {bf16['source']['url']} ({bf16['source']['says']})")
    if macos < need_os:
        result.add_remedy(f"use float16 or float32, or update macOS to {bf16['min_macos']}+")
    else:
        result.add_remedy(f'pip install "torch>={bf16["min_torch"]}"')


def _install_hint_mps(gpu: GpuInfo, sw: SoftwareStack, facts: dict[str, Any]) -> str:
    return "pip install torch (the macOS arm64 wheels on PyPI include the MPS backend)"


def _mps_sync(device: str) -> None:
    import torch

    torch.mps.synchronize()


def _mps_memory(device: str) -> tuple[int, int] | None:
    """MPS shares system memory and names no free figure: (recommended - allocated, recommended)."""
    import torch

    total = int(torch.mps.recommended_max_memory())
    return max(0, total - int(torch.mps.driver_allocated_memory())), total


MPS = Runtime("mps", indexed=False, sync=_mps_sync, memory=_mps_memory)

VENDOR = register(Vendor(backend="mps", vendor="apple", runtime=MPS, rules=_mps_rules,
                         install_hint=_install_hint_mps))
