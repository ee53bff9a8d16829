"""Support rules and verdicts, checked against recorded probes of machines that are not here."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from strata.hardware.profile import GpuInfo, HostProfile, SmokeResult, SoftwareStack
from strata.hardware.support import check_rules, cpu_verdict, smoke_device_for, verdict_for
from strata.hardware.vendors.amd import INVALID_DEVICE_FUNCTION, override_to_gfx
from strata.hardware.vendors.nvidia import (
    DRIVER_INSUFFICIENT,
    NO_KERNEL_IMAGE,
    UNSUPPORTED_PTX,
    match_cuda_kernels,
    parse_cuda_arch,
)
from strata.hardware.vendors.rules import FACTS_PATH, load_facts, version_tuple

PROBES = Path(__file__).parent / "fixtures" / "probes"


def probe(name: str) -> HostProfile:
    return HostProfile.from_dict(json.loads((PROBES / f"{name}.json").read_text()))


def gpu_and_stack(name: str) -> tuple[GpuInfo, SoftwareStack]:
    profile = probe(name)
    return profile.gpus[0], profile.software


def has(items: list[str], *needles: str) -> bool:
    """True when one item contains every needle."""
    return any(all(n in item for n in needles) for item in items)


def smoke(device: str, ok: list[str], failed: dict[str, str] | None = None,
          failure_class: str | None = None, detail: str = "") -> SmokeResult:
    failed = failed or {}
    return SmokeResult(device=device, ok=bool(ok) and not failed and failure_class is None,
                       dtypes_ok=ok, dtypes_failed=failed, failure_class=failure_class,
                       detail=detail, seconds=1.0)


# --- recorded probes ---------------------------------------------------------------------------


def test_fixtures_round_trip_through_host_profile() -> None:
    for path in PROBES.glob("*.json"):
        data = json.loads(path.read_text())
        profile = HostProfile.from_dict(data)
        assert isinstance(profile.gpus[0], GpuInfo), path.name
        assert isinstance(profile.software, SoftwareStack), path.name
        data.pop("_fixture_note")
        got = profile.to_dict()
        # fields the probe gained after a fixture was recorded read as absent (None)
        added = set(got["software"]) - set(data["software"])
        assert all(got["software"].pop(k) is None for k in added), (path.name, added)
        assert got == data, path.name


def test_rdna4_on_rocm62_wheel_is_unsupported_with_remedy() -> None:
    gpu, sw = gpu_and_stack("rdna4_rx9070xt_torch25_rocm62")
    rules = check_rules(gpu, sw)
    verdict = verdict_for(gpu, sw, None)

    assert verdict.status == "unsupported"
    assert verdict.device == "rocm:0"
    assert rules.predicted_error == INVALID_DEVICE_FUNCTION
    assert has(verdict.fails, "gfx1201 is not in", "gfx1100")
    assert has(verdict.reasons, "exact gfx match", "torch does not check it")
    assert has(verdict.reasons, "ROCm 6.3 does not support gfx1201")
    assert "gfx1201" in verdict.remedy
    assert "https://download.pytorch.org/whl/rocm7.2" in verdict.remedy
    assert "HSA_OVERRIDE" not in verdict.remedy  # nothing to unset here


def test_rdna4_with_hsa_override_is_flagged_for_silent_nans() -> None:
    gpu, sw = gpu_and_stack("rdna4_rx9070xt_torch25_rocm62_hsa_override")
    assert sw.env == {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}
    verdict = verdict_for(gpu, sw, None)

    # The override makes gfx1100 kernels load on gfx1201 hardware: not "unsupported", not fine.
    assert verdict.status == "partial"
    assert has(verdict.works, "as gfx1100")
    assert has(verdict.fails, "numerical correctness", "gfx1100 code on gfx1201")
    assert has(verdict.reasons, "HSA_OVERRIDE_GFX_VERSION=11.0.0",
               "treats the gfx1201 GPU as gfx1100")
    assert has(verdict.reasons, "silent-NaN risk")
    assert has(verdict.reasons, "rocm-systems/pull/3461")  # sourced crash/hang reports
    assert has(verdict.reasons, "major version differs")  # 12 -> 11 crosses majors
    assert verdict.remedy.startswith("unset HSA_OVERRIDE_GFX_VERSION")
    assert "whl/rocm7.2" in verdict.remedy


def test_rdna4_override_and_nan_in_smoke_test_lists_the_nan_dtype() -> None:
    gpu, sw = gpu_and_stack("rdna4_rx9070xt_torch25_rocm62_hsa_override")
    found = smoke("cuda:0", ["float32"], {"float16": "silent_nan", "bfloat16": "silent_nan"})
    verdict = verdict_for(gpu, sw, found)

    assert verdict.status == "partial"
    assert has(verdict.fails, "float16: silent_nan")
    assert has(verdict.works, "float32 (smoke)")
    assert verdict.smoke is found


def test_override_on_a_supported_wheel_is_reported_as_harmful() -> None:
    gpu, sw = gpu_and_stack("rdna4_rx9070xt_torch25_rocm62_hsa_override")
    sw = dataclasses.replace(sw, torch_arch_list=[*sw.torch_arch_list, "gfx1200", "gfx1201"])
    rules = check_rules(gpu, sw)
    assert rules.status == "partial"
    assert has(rules.reasons, "already ships gfx1201", "only does harm")
    assert rules.remedy == "unset HSA_OVERRIDE_GFX_VERSION"


def test_rdna4_on_a_wheel_with_gfx1201_is_supported() -> None:
    gpu, sw = gpu_and_stack("rdna4_rx9070xt_torch25_rocm62")
    sw = dataclasses.replace(sw, torch="2.12.1+rocm7.2", torch_build="rocm 7.2",
                             torch_arch_list=["gfx942", "gfx1100", "gfx1200", "gfx1201:xnack-"])
    rules = check_rules(gpu, sw)
    assert rules.status == "supported"
    assert has(rules.works, "gfx1201 code objects")


def test_rtx5090_on_cu126_wheel_predicts_no_kernel_image_with_cu128_remedy() -> None:
    gpu, sw = gpu_and_stack("rtx5090_torch26_cu126")
    rules = check_rules(gpu, sw)
    verdict = verdict_for(gpu, sw, None)

    assert verdict.status == "unsupported"
    assert rules.predicted_error == NO_KERNEL_IMAGE
    assert has(verdict.fails, "runs on sm_120")
    assert has(verdict.reasons, "no kernel image is available for execution on the device")
    # The driver (570.133.07) supports CUDA 12.8, so a cu128 wheel is the one to install.
    assert "cu128" in verdict.remedy
    assert "https://download.pytorch.org/whl/cu128" in verdict.remedy
    assert "first shipped in torch 2.7.0 cu128" in verdict.remedy
    assert "needs driver >= 570.26" in verdict.remedy


def test_rtx5090_remedy_names_a_driver_update_when_no_wheel_fits_the_driver() -> None:
    gpu, sw = gpu_and_stack("rtx5090_torch26_cu126")
    sw = dataclasses.replace(sw, nvidia_driver="560.35.03", cuda_driver_api="12.6")
    gpu = dataclasses.replace(gpu, driver_version="560.35.03")
    rules = check_rules(gpu, sw)
    assert rules.status == "unsupported"
    assert "that this driver supports" not in rules.remedy
    assert "needs driver >= 5" in rules.remedy  # cu128: 570.26, cu130: 580.65.06


def test_rtx5090_smoke_agreeing_and_disagreeing() -> None:
    gpu, sw = gpu_and_stack("rtx5090_torch26_cu126")
    failed = smoke("cuda:0", [], failure_class="missing_kernel_image", detail=NO_KERNEL_IMAGE)
    agree = verdict_for(gpu, sw, failed)
    assert agree.status == "unsupported"
    assert has(agree.reasons, "smoke test agrees")

    passed = verdict_for(gpu, sw, smoke("cuda:0", ["float32", "bfloat16"]))
    assert passed.status == "partial"
    assert has(passed.reasons, "disagree", "rules predict 'unsupported'", "smoke test passed")


def test_h100_on_current_cu128_wheel_is_supported() -> None:
    gpu, sw = gpu_and_stack("h100_torch28_cu128")
    verdict = verdict_for(gpu, sw, None)
    assert verdict.status == "supported"
    assert has(verdict.works, "sm_90 cubin runs on sm_90")
    assert has(verdict.works, "driver 570.172.08", "supports torch's CUDA 12.8")
    assert not verdict.fails
    assert verdict.remedy is None

    measured = verdict_for(gpu, sw, smoke("cuda:0", ["float32", "float16", "bfloat16"]))
    assert measured.status == "supported"
    assert has(measured.reasons, "smoke test agrees (supported)")


def test_h100_rules_ok_but_smoke_finds_nan_says_they_disagree() -> None:
    gpu, sw = gpu_and_stack("h100_torch28_cu128")
    verdict = verdict_for(gpu, sw, smoke("cuda:0", ["float32"], {"bfloat16": "silent_nan"}))
    assert verdict.status == "partial"
    assert has(verdict.reasons, "disagree", "rules predict 'supported'", "found NaN/Inf")
    assert has(verdict.fails, "bfloat16: silent_nan")
    assert "NaN/Inf" in verdict.remedy

    dead = verdict_for(gpu, sw, smoke("cuda:0", [], failure_class="out_of_memory"))
    assert dead.status == "unsupported"
    assert has(dead.reasons, "disagree", "failed (out_of_memory)")
    assert "free device memory" in dead.remedy


def test_apple_m3_on_mps_is_supported_with_bf16_on_macos14() -> None:
    gpu, sw = gpu_and_stack("apple_m3max_mps")
    verdict = verdict_for(gpu, sw, None)
    assert verdict.status == "supported"
    assert {"float32 tensors", "float16 tensors", "bfloat16 tensors"} <= set(verdict.works)
    assert has(verdict.reasons, "float64 is not available on MPS")
    assert smoke_device_for(gpu) == "mps"


def test_apple_mps_on_macos13_loses_bfloat16() -> None:
    gpu, sw = gpu_and_stack("apple_m3max_mps")
    sw = dataclasses.replace(sw, os="macOS-13.6.7-arm64-arm-64bit")
    verdict = verdict_for(gpu, sw, None)
    assert verdict.status == "partial"
    assert has(verdict.fails, "bfloat16", "macOS 14.0+")
    assert "update macOS to 14.0+" in verdict.remedy


def test_apple_mps_with_unknown_macos_leaves_bf16_to_the_smoke_test() -> None:
    gpu, sw = gpu_and_stack("apple_m3max_mps")
    sw = dataclasses.replace(sw, os="unknown")
    rules = check_rules(gpu, sw)
    assert rules.status == "supported"
    assert "bfloat16 tensors" not in rules.works
    assert has(rules.reasons, "bfloat16", "decided by the smoke test")


def test_sm89_with_a_driver_older_than_cuda12_is_a_driver_problem() -> None:
    gpu, sw = gpu_and_stack("rtx4090_old_driver_torch28_cu128")
    rules = check_rules(gpu, sw)
    verdict = verdict_for(gpu, sw, None)
    assert verdict.status == "unsupported"
    assert rules.predicted_error == DRIVER_INSUFFICIENT
    assert has(verdict.works, "sm_86 cubin runs on sm_89")  # kernels exist; the driver is the gap
    assert has(verdict.fails, "driver 520.61.05", "cannot run torch's CUDA 12.8")
    assert has(verdict.reasons, ">= 525.60.13", "minor version compatibility")
    assert "update the NVIDIA driver to >= 570.26" in verdict.remedy


def test_sm89_with_a_cuda12_driver_runs_under_minor_version_compatibility() -> None:
    gpu, sw = gpu_and_stack("rtx4090_old_driver_torch28_cu128")
    sw = dataclasses.replace(sw, nvidia_driver="550.144.03", cuda_driver_api="12.4")
    rules = check_rules(gpu, sw)
    assert rules.status == "partial"
    assert rules.predicted_error is None
    assert has(rules.reasons, "CUDA minor version compatibility", "limited feature set")
    assert "update the NVIDIA driver to >= 570.26" in rules.remedy


@pytest.mark.parametrize(("driver", "expected"), [
    ("560.35.03", "partial"),  # 12.x family, below the 12.8 toolkit driver
    ("570.26", "supported"),
    ("575.57.08", "supported"),
    ("470.256.02", "unsupported"),  # CUDA 11 driver
])
def test_driver_checked_from_version_alone(driver: str, expected: str) -> None:
    gpu, sw = gpu_and_stack("h100_torch28_cu128")
    sw = dataclasses.replace(sw, nvidia_driver=driver, cuda_driver_api=None)
    assert check_rules(gpu, sw).status == expected


def test_ptx_only_device_needs_a_full_driver() -> None:
    gpu, sw = gpu_and_stack("h100_torch28_cu128")
    gpu = dataclasses.replace(gpu, name="NVIDIA B200", arch="sm_100")
    sw = dataclasses.replace(sw, torch_arch_list=["sm_80", "sm_90", "compute_90"])
    jit = check_rules(gpu, sw)
    assert jit.status == "supported"
    assert has(jit.works, "JIT-compiled from compute_90")

    old = dataclasses.replace(sw, nvidia_driver="550.144.03", cuda_driver_api="12.4")
    rules = check_rules(gpu, old)
    assert rules.status == "unsupported"
    assert rules.predicted_error == UNSUPPORTED_PTX


@pytest.mark.parametrize(("device", "arch_list", "how", "entry"), [
    ("sm_89", ["sm_80", "sm_86"], "cubin", "sm_86"),  # same major, higher minor
    ("sm_86", ["sm_89"], None, None),  # a cubin never runs on a lower minor
    ("sm_90", ["sm_90a"], "cubin", "sm_90a"),
    ("sm_100", ["sm_90a", "compute_90a"], None, None),  # arch-specific: that exact chip only
    ("sm_103", ["sm_100f"], "cubin", "sm_100f"),  # family-specific: same family
    ("sm_103", ["sm_100a"], None, None),
    ("sm_120", ["sm_100", "sm_90"], None, None),  # other major: no cubin runs
    ("sm_121", ["sm_120"], "cubin", "sm_120"),
    ("sm_90", ["sm_80", "compute_80"], "ptx", "compute_80"),  # PTX JITs forward
    ("sm_75", ["sm_80", "compute_80"], None, None),  # ...never backward
    ("sm_120", ["sm_90", "sm_120", "compute_120"], "cubin", "sm_120"),  # cubin beats PTX
])
def test_cuda_arch_matching(device: str, arch_list: list[str], how: str | None,
                            entry: str | None) -> None:
    match = match_cuda_kernels(parse_cuda_arch(device), arch_list)
    assert (match.how, match.entry) == (how, entry)


def test_cpu_only_torch_with_an_nvidia_gpu_names_the_wheel_to_install() -> None:
    gpu, sw = gpu_and_stack("rtx5090_torch26_cu126")
    sw = dataclasses.replace(sw, torch="2.6.0+cpu", torch_build="cpu", torch_arch_list=[],
                             torch_cuda_runtime=None)
    verdict = verdict_for(gpu, sw, None)
    assert verdict.status == "unsupported"
    assert has(verdict.fails, "'cpu' build")
    assert has(verdict.reasons, "cannot drive NVIDIA GeForce RTX 5090")
    assert "--index-url https://download.pytorch.org/whl/cu128" in verdict.remedy


def test_missing_torch_is_unsupported_with_install_remedy() -> None:
    gpu, sw = gpu_and_stack("rdna4_rx9070xt_torch25_rocm62")
    sw = dataclasses.replace(sw, torch=None, torch_build=None, torch_arch_list=[])
    verdict = verdict_for(gpu, sw, None)
    assert verdict.status == "unsupported"
    assert has(verdict.reasons, "PyTorch is not installed")
    assert "whl/rocm7.2" in verdict.remedy


def test_xpu_rules_defer_to_the_smoke_test() -> None:
    gpu = GpuInfo(index=0, vendor="intel", name="Intel Arc B580", backend="xpu", source="torch")
    sw = SoftwareStack(python="3.12.3", os="Linux", strata="0.1.0", torch="2.8.0+xpu",
                       torch_build="xpu")
    assert check_rules(gpu, sw).status == "unknown"
    assert smoke_device_for(gpu) == "xpu:0"
    verdict = verdict_for(gpu, sw, smoke("xpu:0", ["float32", "bfloat16"]))
    assert verdict.status == "supported"
    assert has(verdict.reasons, "verdict from the smoke test")
    assert verdict_for(gpu, sw, None).status == "unknown"


def test_unknown_backend_has_no_rules() -> None:
    gpu = GpuInfo(index=0, vendor="other", name="Mystery NPU", backend="npu")
    sw = SoftwareStack(python="3.12", os="Linux", strata="0.1.0", torch="2.8.0")
    rules = check_rules(gpu, sw)
    assert rules.status == "unknown"
    assert has(rules.reasons, "no support rules for backend 'npu'")


def test_cpu_verdict_comes_from_the_smoke_test_alone() -> None:
    sw = SoftwareStack(python="3.12", os="Linux", strata="0.1.0", torch="2.13.0+cpu")
    ok = smoke("cpu", ["float32", "bfloat16"])
    verdict = verdict_for(None, sw, ok)
    assert verdict == cpu_verdict(ok)
    assert verdict.device == "cpu"
    assert verdict.status == "supported"
    assert verdict.works == ["float32 (smoke)", "bfloat16 (smoke)"]

    missing = smoke("cpu", [], failure_class="no_torch", detail="No module named 'torch'")
    no_torch = cpu_verdict(missing)
    assert no_torch.status == "unsupported"
    assert "install PyTorch" in no_torch.remedy
    assert cpu_verdict(None).status == "unknown"
    assert cpu_verdict(None, sw).status == "unknown"
    without_torch = cpu_verdict(None, dataclasses.replace(sw, torch=None))
    assert without_torch.status == "unsupported"
    assert has(without_torch.reasons, "PyTorch is not installed")


# --- parsers and facts ------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "gfx"), [
    ("11.0.0", "gfx1100"), ("10.3.0", "gfx1030"), ("9.0.10", "gfx90a"), ("12.0.1", "gfx1201"),
    ("11", None), ("", None),
])
def test_override_to_gfx(value: str, gfx: str | None) -> None:
    assert override_to_gfx(value) == gfx


def test_version_tuple() -> None:
    assert version_tuple("2.5.1+rocm6.2") == (2, 5, 1)
    assert version_tuple("570.26") == (570, 26)
    assert version_tuple("535.104.05") > version_tuple("535.54.03")
    assert version_tuple(None) == ()


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        if "status" in node:
            found.append((path, node))
        for key, value in node.items():
            found += _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _walk(value, f"{path}[{i}]")
    return found


def test_every_fact_carries_a_source_and_a_status() -> None:
    facts = json.loads(FACTS_PATH.read_text())
    entries = _walk(facts)
    assert len(entries) > 20
    for path, entry in entries:
        assert entry["status"] in {"verified", "inferred", "unverified"}, path
        source = entry.get("source")
        assert source and source["url"].startswith("https://") and source["says"], path
    sections = [k for k in facts if k not in {"schema", "about"}]
    for section in sections:
        assert "https://" in json.dumps(facts[section]), section


def test_unverified_wheel_facts_are_never_offered_as_remedy() -> None:
    facts = copy.deepcopy(load_facts())
    wheels = facts["cuda_wheels"]["entries"]
    facts["cuda_wheels"]["entries"] = [w for w in wheels if w["status"] != "verified"]
    gpu, sw = gpu_and_stack("rtx5090_torch26_cu126")
    rules = check_rules(gpu, sw, facts)
    assert rules.status == "unsupported"
    assert "no official wheel known to ship sm_120" in rules.remedy
    assert "torch 2.7 cu128 (pip install" not in rules.remedy
