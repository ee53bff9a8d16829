"""Support verdict per device: can the installed stack drive this GPU, and what to do if not.

Two independent checks meet here:

1. **Rules** (`check_rules`): pure functions of the probed `GpuInfo` + `SoftwareStack` and a
   file of sourced facts (`data/support_facts.json`), one set per vendor in
   `strata.hardware.vendors`. They predict failures such as "no kernel image is available for
   execution on the device" before a user meets them. No hardware is touched, so recorded
   probes of other machines can be checked here.
2. **Smoke test** (`strata.hardware.smoke`): tiny ops really run on the device.

`verdict_for` combines both into a `SupportVerdict` and says so when they disagree; the
measurement wins, but the disagreement itself is reported because it means either our facts
or the smoke test's coverage is wrong.
"""

from __future__ import annotations

from typing import Any

from strata.hardware.profile import (
    GpuInfo,
    HostProfile,
    SmokeResult,
    SoftwareStack,
    SupportVerdict,
)
from strata.hardware.vendors import Vendor, get_vendor, torch_device
from strata.hardware.vendors.rules import RANK as _RANK
from strata.hardware.vendors.rules import RuleResult, load_facts

# ---------------------------------------------------------------------------------------------
# Is there a torch that can drive this backend at all?


def _stack_gate(vendor: Vendor | None, gpu: GpuInfo, sw: SoftwareStack,
                facts: dict[str, Any]) -> RuleResult | None:
    """A verdict when torch is missing or built for another backend; None when rules may go on."""
    hint = vendor.install_hint if vendor else None
    if sw.torch is None:
        return RuleResult(
            status="unsupported", fails=[f"{gpu.backend} via PyTorch: torch is not installed"],
            reasons=[f"PyTorch is not installed, so nothing can use {gpu.name}"],
            remedy=hint(gpu, sw, facts) if hint else "install PyTorch")
    tags = vendor.build_tags if vendor else None
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
    vendor = get_vendor(gpu.backend)
    gated = _stack_gate(vendor, gpu, sw, facts)
    if gated is not None:
        return gated
    if vendor is None or vendor.rules is None:
        return RuleResult(reasons=[f"no support rules for backend {gpu.backend!r}"])
    result = vendor.rules(gpu, sw, facts)
    if sw.torch_build is None and vendor.build_tags:
        result.reasons.append("torch build type unknown (CPU-only builds cannot use the GPU)")
    return result


def smoke_device_for(gpu: GpuInfo) -> str:
    """The torch device string to smoke-test `gpu` with ('cuda:0' for CUDA and ROCm, 'mps')."""
    return torch_device(gpu.key)


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


KEPT_SMOKE = ("smoke test from an earlier probe (this command did not run one; run "
              "strata probe to repeat it)")


def keep_smoke_verdicts(profile: HostProfile, stored: HostProfile | None) -> None:
    """A probe without the smoke test (--no-smoke, or any command that probes in passing)
    learns nothing about the devices: each device's stored verdict that rests on a smoke
    test stays (said so in its reasons) instead of becoming "unknown"."""
    if stored is None:
        return
    earlier = {v.device: v for v in stored.verdicts if v.smoke is not None}
    profile.verdicts = [_kept(v, earlier.get(v.device)) for v in profile.verdicts]


def _kept(new: SupportVerdict, old: SupportVerdict | None) -> SupportVerdict:
    from dataclasses import replace

    if new.smoke is not None or old is None:
        return new
    reasons = old.reasons if KEPT_SMOKE in old.reasons else [*old.reasons, KEPT_SMOKE]
    return replace(old, reasons=reasons)
