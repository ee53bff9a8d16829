"""Support verdict per device: can the installed stack drive this GPU, and what to do if not.

Two independent checks meet here:

1. **Rules** (`check_rules`): pure functions of the probed `GpuInfo` + `SoftwareStack` and a
   file of sourced facts (`data/support_facts.json`). They predict failures such as
   "no kernel image is available for execution on the device" before a user meets them.
   No hardware is touched, so recorded probes of other machines can be checked here.
2. **Smoke test** (`strata.hardware.smoke`): tiny ops really run on the device.

`verdict_for` combines both into a `SupportVerdict` and says so when they disagree; the
measurement wins, but the disagreement itself is reported because it means either our facts
or the smoke test's coverage is wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from strata.hardware.profile import GpuInfo, SmokeResult, SoftwareStack, SupportVerdict

FACTS_PATH = Path(__file__).resolve().parent / "data" / "support_facts.json"

# Verbatim texts users would otherwise meet at run time; the smoke classifier matches them too.
NO_KERNEL_IMAGE = "CUDA error: no kernel image is available for execution on the device"
INVALID_DEVICE_FUNCTION = "HIP error: invalid device function (hipErrorInvalidDeviceFunction)"
DRIVER_INSUFFICIENT = "CUDA driver version is insufficient for CUDA runtime version"
UNSUPPORTED_PTX = "the provided PTX was compiled with an unsupported toolchain"

_RANK = {"supported": 0, "partial": 1, "unsupported": 2}
DEFAULT_SMOKE_DTYPES = ("float32", "float16", "bfloat16")


@dataclass
class RuleResult:
    """What the rules alone predict for one device."""

    status: str = "unknown"  # supported | partial | unsupported | unknown
    works: list[str] = field(default_factory=list)
    fails: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    remedy: str | None = None
    predicted_error: str | None = None  # the text the user would see, if we predict one

    def worsen(self, status: str) -> None:
        """Move the status towards `status` if that is worse; never improve it."""
        if self.status == "unknown" or _RANK[status] > _RANK.get(self.status, -1):
            self.status = status

    def add_remedy(self, text: str) -> None:
        self.remedy = text if not self.remedy else f"{self.remedy}; {text}"


# ---------------------------------------------------------------------------------------------
# Facts


@lru_cache(maxsize=4)
def _load_facts_file(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def load_facts(path: str | Path | None = None) -> dict[str, Any]:
    """The sourced facts file (cached; treat the returned dict as read-only)."""
    return _load_facts_file(str(path or FACTS_PATH))


# ---------------------------------------------------------------------------------------------
# Small parsers


def version_tuple(text: str | None) -> tuple[int, ...]:
    """Leading numeric version: '2.5.1+rocm6.2' -> (2, 5, 1); '570.26' -> (570, 26)."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", text or "")
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


def _fmt(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def cuda_runtime_of(sw: SoftwareStack) -> str | None:
    """torch's CUDA runtime ('12.8') from torch_cuda_runtime or the build tag 'cuda 12.8'."""
    if sw.torch_cuda_runtime:
        return sw.torch_cuda_runtime
    match = re.match(r"\s*cuda\s*([\d.]+)", sw.torch_build or "", re.IGNORECASE)
    return match.group(1) if match else None


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


# ---------------------------------------------------------------------------------------------
# CUDA: compute capability vs the compiled arch list


@dataclass(frozen=True)
class CudaTarget:
    """One entry of torch.cuda.get_arch_list(): a cubin (sm_XY) or PTX (compute_XY)."""

    kind: str  # "sm" = cubin (machine code), "compute" = PTX (JIT-compiled by the driver)
    major: int
    minor: int
    suffix: str = ""  # "a": arch-specific features, "f": family-specific features
    name: str = ""

    @property
    def cc(self) -> tuple[int, int]:
        return (self.major, self.minor)


def parse_cuda_arch(text: str | None) -> CudaTarget | None:
    """'sm_90a' / 'compute_120' / '8.9' -> CudaTarget; None when it is not a CUDA arch."""
    raw = (text or "").strip().lower()
    dotted = re.fullmatch(r"(\d+)\.(\d)", raw)
    if dotted:
        major, minor = int(dotted.group(1)), int(dotted.group(2))
        return CudaTarget("sm", major, minor, "", f"sm_{major}{minor}")
    match = re.fullmatch(r"(sm|compute)_(\d{2,3})([af]?)", raw)
    if not match:
        return None
    digits = match.group(2)  # the last digit is the minor: sm_120 = 12.0, sm_89 = 8.9
    return CudaTarget(match.group(1), int(digits[:-1]), int(digits[-1]), match.group(3), raw)


def cubin_runs_on(target: CudaTarget, device: CudaTarget) -> bool:
    """A cubin runs on later minors of the same major only; 'a' cubins only on that exact chip."""
    if target.kind != "sm" or target.major != device.major:
        return False
    if target.suffix == "a":
        return target.minor == device.minor
    return device.minor >= target.minor


def ptx_runs_on(target: CudaTarget, device: CudaTarget) -> bool:
    """PTX JIT-compiles forward to any later compute capability (suffixed PTX stays narrow)."""
    if target.kind != "compute":
        return False
    if target.suffix == "a":
        return target.cc == device.cc
    if target.suffix == "f":
        return target.major == device.major and device.minor >= target.minor
    return device.cc >= target.cc


@dataclass(frozen=True)
class KernelMatch:
    how: str | None  # "cubin", "ptx" or None (nothing in the list can run on the device)
    entry: str | None = None


def match_cuda_kernels(device: CudaTarget, arch_list: list[str]) -> KernelMatch:
    """Best way the device can run kernels from a wheel with this arch list (cubin beats PTX)."""
    targets = [t for t in (parse_cuda_arch(a) for a in arch_list) if t is not None]
    cubins = [t for t in targets if cubin_runs_on(t, device)]
    if cubins:
        return KernelMatch("cubin", max(cubins, key=lambda t: t.cc).name)
    ptx = [t for t in targets if ptx_runs_on(t, device)]
    if ptx:
        return KernelMatch("ptx", max(ptx, key=lambda t: t.cc).name)
    return KernelMatch(None)


def _verified_cuda_wheels(facts: dict[str, Any]) -> list[dict[str, Any]]:
    entries = facts.get("cuda_wheels", {}).get("entries", [])
    return [w for w in entries if w.get("status") == "verified"]


def _toolkit_min_driver(cuda: str, facts: dict[str, Any]) -> tuple[int, ...]:
    """Minimum driver that fully supports CUDA `cuda`; an unlisted minor takes the next listed."""
    table = facts.get("cuda_toolkit_driver", {}).get("min_driver_linux", {})
    wanted = version_tuple(cuda)[:2]
    listed = sorted((version_tuple(k)[:2], version_tuple(v)) for k, v in table.items())
    for toolkit, driver in listed:
        if toolkit >= wanted and toolkit[0] == wanted[0]:
            return driver
    return ()


def _family_min_driver(cuda: str, facts: dict[str, Any]) -> tuple[int, ...]:
    family = facts.get("cuda_minor_version_compat", {}).get("family_min_driver_linux", {})
    major = version_tuple(cuda)[:1]
    return version_tuple(family.get(str(major[0]))) if major else ()


def _wheel_runs_device(wheel: dict[str, Any], device: CudaTarget) -> bool:
    return match_cuda_kernels(device, wheel["archs"]).how is not None


def _wheel_label(wheel: dict[str, Any], facts: dict[str, Any]) -> str:
    url = facts.get("pytorch_index", {}).get("url_pattern", "https://download.pytorch.org/whl/{variant}")
    driver = _fmt(_toolkit_min_driver(wheel["cuda"], facts)) or "unknown"
    return (f'torch {wheel["torch"]} {wheel["variant"]} (pip install "torch=={wheel["torch"]}.*" '
            f'--index-url {url.format(variant=wheel["variant"])}; needs driver >= {driver})')


def _newest(wheels: list[dict[str, Any]]) -> dict[str, Any]:
    """Newest torch release; within it the oldest CUDA, which asks the least of the driver."""
    def key(wheel: dict[str, Any]) -> tuple[tuple[int, ...], list[int]]:
        return version_tuple(wheel["torch"]), [-part for part in version_tuple(wheel["cuda"])]

    return max(wheels, key=key)


def cuda_wheel_remedy(device: CudaTarget, driver: str | None, facts: dict[str, Any]) -> str:
    """Which official wheel carries kernels for `device`, preferring one the driver can run."""
    arch = f"sm_{device.major}{device.minor}"
    candidates = [w for w in _verified_cuda_wheels(facts) if _wheel_runs_device(w, device)]
    parts: list[str] = []
    if not candidates:
        parts.append(f"no official wheel known to ship {arch} kernels: build PyTorch from source "
                     f"with TORCH_CUDA_ARCH_LIST={device.major}.{device.minor}")
    else:
        runnable = [w for w in candidates if driver and
                    version_tuple(driver) >= _toolkit_min_driver(w["cuda"], facts)]
        if runnable:
            parts.append(f"install a wheel with {arch} kernels that this driver supports: "
                         f"{_wheel_label(_newest(runnable), facts)}")
        else:
            parts.append(f"install a wheel with {arch} kernels: "
                         f"{_wheel_label(_newest(candidates), facts)}")
    first = facts.get("cuda_arch_first_wheel", {}).get(arch)
    if first and first.get("status") == "verified":
        parts.append(f"{arch} first shipped in torch {first['torch']} {first['variant']} wheels "
                     f"(CUDA {_variant_cuda(first['variant'])})")
    return "; ".join(parts)


def _variant_cuda(variant: str) -> str:
    """'cu128' -> '12.8' (the index naming drops the dot)."""
    digits = variant.removeprefix("cu")
    return f"{digits[:-1]}.{digits[-1]}" if digits.isdigit() and len(digits) >= 2 else variant


def _cuda_rules(gpu: GpuInfo, sw: SoftwareStack, facts: dict[str, Any]) -> RuleResult:
    result = RuleResult()
    device = parse_cuda_arch(gpu.arch)
    if device is None or device.kind != "sm":
        result.reasons.append(f"compute capability of {gpu.name} is not known (arch={gpu.arch!r}); "
                              "kernel availability decided by the smoke test")
        _check_cuda_driver(result, gpu, sw, facts, relies_on_ptx=False)
        return result
    if not sw.torch_arch_list:
        result.reasons.append("torch's compiled arch list is not known; kernel availability "
                              "decided by the smoke test")
        _check_cuda_driver(result, gpu, sw, facts, relies_on_ptx=False)
        return result
    match = match_cuda_kernels(device, sw.torch_arch_list)
    _apply_cuda_match(result, gpu, sw, device, match, facts)
    _check_cuda_driver(result, gpu, sw, facts, relies_on_ptx=match.how == "ptx")
    return result


def _apply_cuda_match(result: RuleResult, gpu: GpuInfo, sw: SoftwareStack, device: CudaTarget,
                      match: KernelMatch, facts: dict[str, Any]) -> None:
    arch = device.name
    compiled = " ".join(sw.torch_arch_list)
    if match.how == "cubin":
        result.worsen("supported")
        result.works.append(f"CUDA kernels: {match.entry} cubin runs on {arch} "
                            f"(same major, minor {device.minor} >= cubin's)")
    elif match.how == "ptx":
        result.worsen("supported")
        result.works.append(f"CUDA kernels: JIT-compiled from {match.entry} PTX for {arch}")
        result.reasons.append(f"no {arch}-compatible cubin in torch's arch list; the driver "
                              f"compiles {match.entry} PTX at first use (slow first run)")
    else:
        result.worsen("unsupported")
        result.predicted_error = NO_KERNEL_IMAGE
        result.fails.append(f"CUDA kernels: none of [{compiled}] runs on {arch}")
        result.reasons.append(f"torch {sw.torch} was compiled for [{compiled}]: no cubin of major "
                              f"{device.major} with minor <= {device.minor} and no PTX <= "
                              f"compute_{device.major}{device.minor}; expect '{NO_KERNEL_IMAGE}'")
        driver = sw.nvidia_driver or gpu.driver_version
        result.add_remedy(cuda_wheel_remedy(device, driver, facts))


def _driver_level(runtime: str, driver: str | None, driver_api: str | None,
                  facts: dict[str, Any]) -> str:
    """full | minor_compat | too_old | unknown, for torch's CUDA runtime on this driver."""
    rt = version_tuple(runtime)[:2]
    if driver_api:
        api = version_tuple(driver_api)[:2]
        if api >= rt:
            return "full"
        return "minor_compat" if api[:1] == rt[:1] else "too_old"
    if not driver:
        return "unknown"
    found = version_tuple(driver)
    full, family = _toolkit_min_driver(runtime, facts), _family_min_driver(runtime, facts)
    if full and found >= full:
        return "full"
    if family and found >= family:
        return "minor_compat"
    return "too_old" if family or full else "unknown"


@dataclass
class DriverCheck:
    """Inputs of one driver-vs-runtime check (the level handlers below share them)."""

    result: RuleResult
    gpu: GpuInfo
    sw: SoftwareStack
    runtime: str  # torch's CUDA runtime, "12.8"
    driver: str | None  # "570.133.07"
    facts: dict[str, Any]
    relies_on_ptx: bool  # the device has no cubin, only PTX to JIT

    @property
    def full_driver(self) -> str:
        return _fmt(_toolkit_min_driver(self.runtime, self.facts)) or f"one for CUDA {self.runtime}"

    @property
    def family_driver(self) -> str:
        return _fmt(_family_min_driver(self.runtime, self.facts)) or self.full_driver

    @property
    def api_note(self) -> str:
        return f" (CUDA {self.sw.cuda_driver_api})" if self.sw.cuda_driver_api else ""


def _check_cuda_driver(result: RuleResult, gpu: GpuInfo, sw: SoftwareStack,
                       facts: dict[str, Any], relies_on_ptx: bool) -> None:
    runtime = cuda_runtime_of(sw)
    if runtime is None:
        result.reasons.append("torch's CUDA runtime version is not known; driver not checked")
        return
    check = DriverCheck(result, gpu, sw, runtime, sw.nvidia_driver or gpu.driver_version, facts,
                        relies_on_ptx)
    _DRIVER_LEVELS[_driver_level(runtime, check.driver, sw.cuda_driver_api, facts)](check)


def _driver_full(c: DriverCheck) -> None:
    c.result.works.append(f"driver {c.driver or '?'}{c.api_note} supports torch's CUDA "
                          f"{c.runtime} runtime")


def _driver_unknown(c: DriverCheck) -> None:
    c.result.reasons.append(f"NVIDIA driver version unknown; not checked against CUDA {c.runtime}")


def _driver_minor_compat(c: DriverCheck) -> None:
    c.result.reasons.append(
        f"driver {c.driver or '?'}{c.api_note} is older than torch's CUDA {c.runtime} runtime: it "
        "runs under CUDA minor version compatibility (same major family, limited feature set), "
        "not with full support")
    if c.relies_on_ptx:
        # PTX from a newer toolkit cannot be JIT-compiled by an older driver.
        c.result.worsen("unsupported")
        c.result.predicted_error = UNSUPPORTED_PTX
        c.result.fails.append(f"PTX JIT: needs a driver for CUDA {c.runtime} (>= {c.full_driver})")
    else:
        c.result.worsen("partial")
        c.result.fails.append("features beyond minor version compatibility (e.g. JIT of newer "
                              f"PTX) until the driver is >= {c.full_driver}")
    c.result.add_remedy(f"update the NVIDIA driver to >= {c.full_driver} for full CUDA "
                        f"{c.runtime} support")


def _driver_too_old(c: DriverCheck) -> None:
    c.result.worsen("unsupported")
    c.result.predicted_error = DRIVER_INSUFFICIENT
    c.result.fails.append(f"driver {c.driver or '?'}{c.api_note} cannot run torch's CUDA "
                          f"{c.runtime} runtime")
    c.result.reasons.append(
        f"CUDA {c.runtime} needs driver >= {c.family_driver} even under minor version "
        f"compatibility (>= {c.full_driver} for full support); expect '{DRIVER_INSUFFICIENT}'")
    c.result.add_remedy(f"update the NVIDIA driver to >= {c.full_driver}")
    device = parse_cuda_arch(c.gpu.arch)
    older = [w for w in _verified_cuda_wheels(c.facts)
             if c.driver and version_tuple(c.driver) >= _toolkit_min_driver(w["cuda"], c.facts)
             and (device is None or _wheel_runs_device(w, device))]
    if older:
        c.result.add_remedy("or install a wheel this driver supports: "
                            f"{_wheel_label(_newest(older), c.facts)}")


_DRIVER_LEVELS: dict[str, Callable[[DriverCheck], None]] = {
    "full": _driver_full,
    "minor_compat": _driver_minor_compat,
    "too_old": _driver_too_old,
    "unknown": _driver_unknown,
}


# ---------------------------------------------------------------------------------------------
# ROCm: exact gfx match on the PHYSICAL target (torch does not check this on ROCm)


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
    url = facts.get("pytorch_index", {}).get("url_pattern", "https://download.pytorch.org/whl/{variant}")
    text = (f"install a ROCm wheel whose arch list includes {arch}, e.g. "
            f'pip install "torch=={known["torch"]}.*" --index-url '
            f"{url.format(variant=known['variant'])}, and check torch.cuda.get_arch_list()")
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


# ---------------------------------------------------------------------------------------------
# Apple MPS and Intel XPU


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
                        f">= {bf16['min_torch']}; found macOS {_fmt(macos)}, torch {sw.torch})")
    result.reasons.append(f"source: {bf16['source']['url']} ({bf16['source']['says']})")
    if macos < need_os:
        result.add_remedy(f"use float16 or float32, or update macOS to {bf16['min_macos']}+")
    else:
        result.add_remedy(f'pip install "torch>={bf16["min_torch"]}"')


def _xpu_rules(gpu: GpuInfo, sw: SoftwareStack, facts: dict[str, Any]) -> RuleResult:
    return RuleResult(status="unknown", reasons=[
        "no sourced arch rules for Intel XPU; support is verified by the smoke test only"])


RuleFn = Callable[[GpuInfo, SoftwareStack, dict[str, Any]], RuleResult]
RULES: dict[str, RuleFn] = {
    "cuda": _cuda_rules,
    "rocm": _rocm_rules,
    "mps": _mps_rules,
    "xpu": _xpu_rules,
}


# ---------------------------------------------------------------------------------------------
# Is there a torch that can drive this backend at all?

# torch_build tags that can drive a backend; None = any build (macOS wheels carry MPS).
_BUILD_TAGS: dict[str, tuple[str, ...] | None] = {
    "cuda": ("cuda",),
    "rocm": ("rocm", "hip"),
    "xpu": ("xpu",),
    "mps": None,
}


def _install_hint_cuda(gpu: GpuInfo, sw: SoftwareStack, facts: dict[str, Any]) -> str:
    device = parse_cuda_arch(gpu.arch)
    if device is None or device.kind != "sm":
        return "install a CUDA build of PyTorch (see https://pytorch.org/get-started/locally/)"
    return cuda_wheel_remedy(device, sw.nvidia_driver or gpu.driver_version, facts)


def _install_hint_rocm(gpu: GpuInfo, sw: SoftwareStack, facts: dict[str, Any]) -> str:
    return rocm_wheel_remedy(_gfx_base(gpu.arch), facts) if gpu.arch else (
        "install a ROCm build of PyTorch whose arch list includes this GPU's gfx target")


def _install_hint_mps(gpu: GpuInfo, sw: SoftwareStack, facts: dict[str, Any]) -> str:
    return "pip install torch (the macOS arm64 wheels on PyPI include the MPS backend)"


def _install_hint_xpu(gpu: GpuInfo, sw: SoftwareStack, facts: dict[str, Any]) -> str:
    return "install a PyTorch build with XPU support (torch.xpu.is_available() must be True)"


INSTALL_HINTS: dict[str, Callable[[GpuInfo, SoftwareStack, dict[str, Any]], str]] = {
    "cuda": _install_hint_cuda,
    "rocm": _install_hint_rocm,
    "mps": _install_hint_mps,
    "xpu": _install_hint_xpu,
}


def _stack_gate(gpu: GpuInfo, sw: SoftwareStack, facts: dict[str, Any]) -> RuleResult | None:
    """A verdict when torch is missing or built for another backend; None when rules may go on."""
    hint = INSTALL_HINTS.get(gpu.backend)
    if sw.torch is None:
        return RuleResult(
            status="unsupported", fails=[f"{gpu.backend} via PyTorch: torch is not installed"],
            reasons=[f"PyTorch is not installed, so nothing can use {gpu.name}"],
            remedy=hint(gpu, sw, facts) if hint else "install PyTorch")
    tags = _BUILD_TAGS.get(gpu.backend)
    build = (sw.torch_build or "").strip().lower()
    if tags is None or not build or build.startswith(tags):
        return None
    return RuleResult(
        status="unsupported",
        fails=[f"{gpu.backend} via PyTorch: torch {sw.torch} is a '{sw.torch_build}' build"],
        reasons=[f"torch {sw.torch} ({sw.torch_build} build) cannot drive {gpu.name}, which "
                 f"needs a {gpu.backend} build"],
        remedy=hint(gpu, sw, facts) if hint else None)


# ---------------------------------------------------------------------------------------------
# Public API


def check_rules(gpu: GpuInfo, sw: SoftwareStack, facts: dict[str, Any] | None = None) -> RuleResult:
    """What the rules predict for `gpu` with this software stack (no hardware access)."""
    facts = load_facts() if facts is None else facts
    gated = _stack_gate(gpu, sw, facts)
    if gated is not None:
        return gated
    rule = RULES.get(gpu.backend)
    if rule is None:
        return RuleResult(reasons=[f"no support rules for backend {gpu.backend!r}"])
    result = rule(gpu, sw, facts)
    if sw.torch_build is None and _BUILD_TAGS.get(gpu.backend):
        result.reasons.append("torch build type unknown (CPU-only builds cannot use the GPU)")
    return result


# torch device strings per backend: ROCm builds reuse the "cuda" device type.
_TORCH_DEVICE_TYPE = {"cuda": "cuda", "rocm": "cuda", "mps": "mps", "xpu": "xpu"}


def smoke_device_for(gpu: GpuInfo) -> str:
    """The torch device string to smoke-test `gpu` with ('cuda:0' for CUDA and ROCm, 'mps')."""
    kind = _TORCH_DEVICE_TYPE.get(gpu.backend, gpu.backend)
    return kind if kind == "mps" else f"{kind}:{gpu.index}"


def smoke_status(smoke: SmokeResult) -> str:
    """supported when every requested dtype passed, partial when some did, else unsupported."""
    if smoke.ok and not smoke.dtypes_failed and smoke.failure_class is None:
        return "supported"
    return "partial" if smoke.dtypes_ok else "unsupported"


SMOKE_REMEDIES: dict[str, str] = {
    "no_torch": "install PyTorch (pip install torch, or the strata[torch] extra)",
    "no_device": "torch cannot reach this device: check the torch build (torch.version.cuda / "
                 "torch.version.hip) and device visibility (CUDA_VISIBLE_DEVICES, "
                 "HIP_VISIBLE_DEVICES)",
    "missing_kernel_image": "install a torch wheel compiled for this GPU's architecture",
    "invalid_device_function": "install a torch ROCm wheel whose arch list has this GPU's gfx "
                               "target",
    "driver_mismatch": "update the driver (reboot after a driver update: a loaded older kernel "
                       "module gives 'Driver/library version mismatch')",
    "out_of_memory": "free device memory (other processes?) and rerun the probe",
    "timeout": "the device did not answer in time: check the driver (dmesg) and other GPU jobs",
    "silent_nan": "do not trust this device/dtype: it returned NaN/Inf from finite inputs",
    "wrong_result": "do not trust this device/dtype: results differ from the float64 reference",
    "unsupported_dtype": "use a dtype the device supports",
}


def _smoke_failures(smoke: SmokeResult) -> list[str]:
    fails = [f"{dtype}: {cls} (smoke)" for dtype, cls in smoke.dtypes_failed.items()]
    if smoke.failure_class:
        fails.append(f"device: {smoke.failure_class} (smoke): {smoke.detail}".rstrip(": "))
    return fails


def _smoke_classes(smoke: SmokeResult) -> list[str]:
    classes = [smoke.failure_class] if smoke.failure_class else []
    return classes + [c for c in smoke.dtypes_failed.values() if c not in classes]


def _disagreement(rules: RuleResult, smoke: SmokeResult, measured: str) -> str | None:
    """Say so when rules and smoke test disagree; None when they agree."""
    classes = ", ".join(_smoke_classes(smoke)) or "failure"
    worse = _RANK[measured] > _RANK.get(rules.status, -1)
    if rules.status in ("supported", "partial") and worse:
        nan = "found NaN/Inf" if "silent_nan" in _smoke_classes(smoke) else f"failed ({classes})"
        return (f"rules and smoke test disagree: rules predict '{rules.status}' but the smoke "
                f"test {nan}; trusting the measurement")
    if rules.status == "unsupported" and measured != "unsupported":
        return ("rules and smoke test disagree: rules predict 'unsupported' "
                f"({rules.predicted_error or 'see fails'}) but the smoke test passed; its tiny "
                "kernels may not cover the missing ones, or the recorded arch list is incomplete")
    return None


def _combined_status(rules: RuleResult, measured: str) -> str:
    if rules.status == "unknown":
        return measured
    if rules.status == "unsupported" and measured != "unsupported":
        return "partial"  # something ran, but the rules name a concrete gap
    return max(rules.status, measured, key=lambda s: _RANK[s])


def combine(device: str, rules: RuleResult, smoke: SmokeResult | None) -> SupportVerdict:
    """Merge rules and smoke test into one verdict, stating any disagreement."""
    verdict = SupportVerdict(device=device, status=rules.status, works=list(rules.works),
                             fails=list(rules.fails), reasons=list(rules.reasons),
                             remedy=rules.remedy, smoke=smoke)
    if smoke is None:
        verdict.reasons.append("smoke test not run: verdict from rules alone")
        return verdict
    measured = smoke_status(smoke)
    verdict.status = _combined_status(rules, measured)
    verdict.works += [f"{dtype} (smoke)" for dtype in smoke.dtypes_ok]
    verdict.fails += _smoke_failures(smoke)
    disagreement = _disagreement(rules, smoke, measured)
    if disagreement:
        verdict.reasons.append(disagreement)
    elif rules.status == "unknown":
        verdict.reasons.append(f"verdict from the smoke test ({measured})")
    elif measured == rules.status:
        verdict.reasons.append(f"smoke test agrees ({measured})")
    else:
        verdict.reasons.append(f"smoke test passed ({measured}); the rules' concerns above still "
                               "apply to workloads beyond its tiny kernels")
    if not verdict.remedy:
        verdict.remedy = next((SMOKE_REMEDIES[c] for c in _smoke_classes(smoke)
                               if c in SMOKE_REMEDIES), None)
    return verdict


def verdict_for(gpu: GpuInfo | None, sw: SoftwareStack, smoke: SmokeResult | None,
                facts: dict[str, Any] | None = None) -> SupportVerdict:
    """Support verdict for one GPU (rules + smoke); `gpu=None` gives the CPU verdict."""
    if gpu is None:
        return cpu_verdict(smoke, sw)
    return combine(gpu.key, check_rules(gpu, sw, facts), smoke)


def cpu_verdict(smoke: SmokeResult | None, sw: SoftwareStack | None = None) -> SupportVerdict:
    """The CPU has no arch list to check: its verdict is the smoke test's.

    Without a smoke result, `sw` still tells whether torch is there at all.
    """
    if smoke is None and sw is not None and sw.torch is None:
        return SupportVerdict(device="cpu", status="unsupported",
                              fails=["torch tensors: PyTorch is not installed"],
                              reasons=["PyTorch is not installed; smoke test not run"],
                              remedy=SMOKE_REMEDIES["no_torch"])
    if smoke is None:
        return SupportVerdict(device="cpu", status="unknown",
                              reasons=["smoke test not run: nothing known about CPU tensors"])
    rules = RuleResult(status="unknown", reasons=["no arch rules apply to CPUs"])
    return combine("cpu", rules, smoke)
