"""NVIDIA GPUs through torch's CUDA runtime: compute capability vs the wheel's compiled arch
list (cubin/PTX rules), the driver vs torch's CUDA runtime, and which wheel to install.

The `CUDA` runtime record is shared with AMD: PyTorch's ROCm builds drive HIP devices through
the same torch.cuda API and "cuda" device type.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from strata.hardware.profile import GpuInfo, SoftwareStack
from strata.hardware.vendors import register
from strata.hardware.vendors.base import Runtime, Vendor
from strata.hardware.vendors.rules import RuleResult, fmt_version, index_url, version_tuple

# Verbatim texts users would otherwise meet at run time; the smoke classifier matches them too.
NO_KERNEL_IMAGE = "CUDA error: no kernel image is available for execution on the device"
DRIVER_INSUFFICIENT = "CUDA driver version is insufficient for CUDA runtime version"
UNSUPPORTED_PTX = "the provided PTX was compiled with an unsupported toolchain"


def cuda_runtime_of(sw: SoftwareStack) -> str | None:
    """torch's CUDA runtime ('12.8') from torch_cuda_runtime or the build tag 'cuda 12.8'."""
    if sw.torch_cuda_runtime:
        return sw.torch_cuda_runtime
    match = re.match(r"\s*cuda\s*([\d.]+)", sw.torch_build or "", re.IGNORECASE)
    return match.group(1) if match else None


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
    driver = fmt_version(_toolkit_min_driver(wheel["cuda"], facts)) or "unknown"
    return (f'torch {wheel["torch"]} {wheel["variant"]} (pip install "torch=={wheel["torch"]}.*" '
            f'--index-url {index_url(facts, wheel["variant"])}; needs driver >= {driver})')


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
        found = fmt_version(_toolkit_min_driver(self.runtime, self.facts))
        return found or f"one for CUDA {self.runtime}"

    @property
    def family_driver(self) -> str:
        return fmt_version(_family_min_driver(self.runtime, self.facts)) or self.full_driver

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


def _install_hint_cuda(gpu: GpuInfo, sw: SoftwareStack, facts: dict[str, Any]) -> str:
    device = parse_cuda_arch(gpu.arch)
    if device is None or device.kind != "sm":
        return "install a CUDA build of PyTorch (see https://pytorch.org/get-started/locally/)"
    return cuda_wheel_remedy(device, sw.nvidia_driver or gpu.driver_version, facts)


# ---------------------------------------------------------------------------------------------
# torch's cuda device type (NVIDIA CUDA and AMD ROCm builds alike)


def _cuda_sync(device: str) -> None:
    import torch

    torch.cuda.synchronize(device)


def _cuda_clock(device: str) -> Any:
    """CUDA/HIP events: device-side time of the work, free of host launch jitter."""
    import torch

    from strata.measure.timer import CudaEventClock

    return CudaEventClock(torch, torch.device(device))


def _cuda_memory(device: str) -> tuple[int, int] | None:
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total)


def _cuda_l2_bytes(device: str) -> int | None:
    import torch

    size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", None)
    return int(size) if size else None


CUDA = Runtime("cuda", sync=_cuda_sync, clock=_cuda_clock, memory=_cuda_memory,
               cache_bytes=_cuda_l2_bytes)

VENDOR = register(Vendor(backend="cuda", vendor="nvidia", runtime=CUDA, triton=True,
                         build_tags=("cuda",), rules=_cuda_rules,
                         install_hint=_install_hint_cuda))
