"""AMD GPUs through torch's ROCm builds: an exact gfx match on the PHYSICAL target (torch does
not check it), the HSA_OVERRIDE_GFX_VERSION trap, and which wheel ships the target.

torch addresses these GPUs as "cuda" devices, so the runtime record is NVIDIA's `CUDA`.
"""

from __future__ import annotations

import re
from typing import Any

from strata.hardware.profile import GpuInfo, SoftwareStack
from strata.hardware.vendors import register
from strata.hardware.vendors.base import Vendor
from strata.hardware.vendors.nvidia import CUDA
from strata.hardware.vendors.rules import RuleResult, index_url

# Verbatim text users would otherwise meet at run time; the smoke classifier matches it too.
INVALID_DEVICE_FUNCTION = "HIP error: invalid device function (hipErrorInvalidDeviceFunction)"



def _gfx_base(name: str) -> str:
    """'gfx90a:xnack-' -> 'gfx90a' (feature flags do not change the ISA family we match on)."""
    return name.strip().lower().split(":")[0]


def override_to_gfx(value: str | None) -> str | None:
    """HSA_OVERRIDE_GFX_VERSION '11.0.0' -> 'gfx1100', '9.0.10' -> 'gfx90a'."""
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\.(\d+)\s*", value or "")
    if not match:
        return None
    major, minor, stepping = (int(g) for g in match.groups())
    return f"gfx{major}{minor:x}{stepping:x}"


def _gfx_major(gfx: str) -> str:
    """'gfx1201' -> '12', 'gfx90a' -> '9' (the last two characters are minor and stepping)."""
    return gfx.removeprefix("gfx")[:-2]


def _rocm_arch_entry(arch: str, facts: dict[str, Any]) -> dict[str, Any] | None:
    entry = facts.get("rocm_arch_wheels", {}).get(arch)
    if entry and "same_as" in entry:
        entry = facts["rocm_arch_wheels"].get(entry["same_as"])
    return entry


def rocm_wheel_remedy(arch: str, facts: dict[str, Any]) -> str:
    entry = _rocm_arch_entry(arch, facts)
    known = (entry or {}).get("known_good")
    if not known or known.get("status") != "verified":
        return (f"no official wheel known to ship {arch}: build PyTorch with "
                f"PYTORCH_ROCM_ARCH={arch}, or use a ROCm build from AMD that lists it")
    text = (f"install a ROCm wheel whose arch list includes {arch}, e.g. "
            f'pip install "torch=={known["torch"]}.*" --index-url '
            f"{index_url(facts, known['variant'])}, and check torch.cuda.get_arch_list()")
    nightly = entry.get("added_to_nightly", {})
    if nightly.get("status") == "verified":
        text += f" ({arch} entered the PyTorch nightly wheels on {nightly['date']})"
    return text


def _rocm_rules(gpu: GpuInfo, sw: SoftwareStack, facts: dict[str, Any]) -> RuleResult:
    result = RuleResult()
    if not gpu.arch:
        result.reasons.append(f"physical gfx target of {gpu.name} is not known; kernel "
                              "availability decided by the smoke test")
        return result
    physical = _gfx_base(gpu.arch)
    compiled = list(dict.fromkeys(_gfx_base(a) for a in sw.torch_arch_list))  # keep torch's order
    if not compiled:
        result.reasons.append("torch's compiled gfx list is not known; decided by the smoke test")
        return result
    override = sw.env.get("HSA_OVERRIDE_GFX_VERSION")
    effective = override_to_gfx(override) if override else None
    if override and effective != physical:
        _apply_override(result, physical, effective, override, compiled, facts)
    else:
        if override:
            result.reasons.append(f"HSA_OVERRIDE_GFX_VERSION={override} names the physical target "
                                  f"{physical} and changes nothing; it can be removed")
        _apply_rocm_match(result, physical, compiled, sw, facts)
    return result


def _apply_rocm_match(result: RuleResult, physical: str, compiled: list[str],
                      sw: SoftwareStack, facts: dict[str, Any]) -> None:
    if physical in compiled:
        result.worsen("supported")
        result.works.append(f"ROCm kernels: torch ships {physical} code objects")
        return
    result.worsen("unsupported")
    result.predicted_error = INVALID_DEVICE_FUNCTION
    result.fails.append(f"ROCm kernels: {physical} is not in [{' '.join(compiled)}]")
    result.reasons.append(
        f"torch {sw.torch} has no {physical} code objects; ROCm needs an exact gfx match and torch "
        f"does not check it, so expect '{INVALID_DEVICE_FUNCTION}' at the first kernel launch")
    for fact in facts.get("rocm_runtime_support", {}).get(physical, []):
        if fact.get("status") == "verified":
            result.reasons.append(f"{fact['fact']} (source: {fact['source']['url']})")
    result.add_remedy(rocm_wheel_remedy(physical, facts))


def _apply_override(result: RuleResult, physical: str, effective: str | None, override: str,
                    compiled: list[str], facts: dict[str, Any]) -> None:
    shown = effective or "an unparseable target"
    result.reasons.append(f"HSA_OVERRIDE_GFX_VERSION={override} is set: the runtime treats the "
                          f"{physical} GPU as {shown}, so torch loads {shown} code on {physical} "
                          "hardware")
    if effective and effective in compiled:
        result.worsen("partial")
        result.works.append(f"ROCm kernels load (as {effective}, via the override)")
        result.fails.append(f"numerical correctness: {effective} code on {physical} hardware is "
                            "not validated by anyone")
    else:
        result.worsen("unsupported")
        result.predicted_error = INVALID_DEVICE_FUNCTION
        result.fails.append(f"ROCm kernels: neither {physical} nor {shown} is in the arch list")
    _add_override_risks(result, physical, effective, facts)
    if physical in compiled:
        result.reasons.append(f"torch already ships {physical} code: the override only does harm")
        result.add_remedy("unset HSA_OVERRIDE_GFX_VERSION")
    else:
        wheel = rocm_wheel_remedy(physical, facts)
        result.add_remedy(f"unset HSA_OVERRIDE_GFX_VERSION and {wheel}")


def _add_override_risks(result: RuleResult, physical: str, effective: str | None,
                        facts: dict[str, Any]) -> None:
    hsa = facts.get("hsa_override", {})
    for risk in hsa.get("arch_risks", []):
        if not physical.startswith(risk["arch_prefix"]):
            continue
        if risk["risk"] == "silent_nan":
            # Kept as a risk to test for, not a known fact: see the facts file for what we found.
            result.reasons.append(
                f"silent-NaN risk: wrong-target kernels may return NaN or wrong numbers without "
                f"any error ({risk['status']} for {physical}; closest evidence: "
                f"{risk['source']['url']}); the smoke test checks every dtype for NaN/Inf")
        else:
            result.reasons.append(f"{risk['text']} (source: {risk['source']['url']})")
    cross = hsa.get("cross_major", {})
    if effective and _gfx_major(effective) != _gfx_major(physical) and cross:
        result.reasons.append(f"{cross['text']} (source: {cross['source']['url']})")

def _install_hint_rocm(gpu: GpuInfo, sw: SoftwareStack, facts: dict[str, Any]) -> str:
    return rocm_wheel_remedy(_gfx_base(gpu.arch), facts) if gpu.arch else (
        "install a ROCm build of PyTorch whose arch list includes this GPU's gfx target")


VENDOR = register(Vendor(backend="rocm", vendor="amd", runtime=CUDA, triton=True,
                         build_tags=("rocm", "hip"), rules=_rocm_rules,
                         install_hint=_install_hint_rocm))
