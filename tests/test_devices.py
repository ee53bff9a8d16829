"""Typed devices: every device key the kernel lab builds from a recorded probe reaches torch
as a device string torch accepts, of the right type (an AMD GPU is a "cuda" device to
PyTorch), and is timed and synchronised by its vendor's runtime. Real torch, recorded probes."""

from __future__ import annotations

import json
import pkgutil
from pathlib import Path

import pytest
import torch

from strata.hardware import vendors
from strata.hardware.profile import HostProfile
from strata.hardware.support import smoke_device_for
from strata.kernels.capability import GPU_KINDS, HostCaps, host_caps
from strata.kernels.dialects import get_dialect
from strata.kernels.registry import builtin_implementations
from strata.kernels.timing import clock_for
from strata.measure.timer import CudaEventClock, HostClock

PROBES = Path(__file__).parent / "fixtures" / "probes"
# What PyTorch calls each vendor's devices; ROCm builds reuse the cuda device type.
TORCH_TYPE = {"nvidia": "cuda", "amd": "cuda", "apple": "mps", "intel": "xpu"}


def recorded(name: str) -> tuple[HostProfile, HostCaps]:
    profile = HostProfile.from_dict(json.loads((PROBES / f"{name}.json").read_text()))
    caps = host_caps(profile)
    caps.tools = {"cc", "triton", "nvcc"}  # every dialect may pick its device
    return profile, caps


ALL_PROBES = sorted(p.stem for p in PROBES.glob("*.json"))


def lab_device_keys(caps: HostCaps) -> set[str]:
    """Every device key the lab hands out: the host's devices and each built-in
    implementation's run device (what verify/bench put into a worker job)."""
    keys = {d.key for d in caps.devices}
    for impl in builtin_implementations():
        key = get_dialect(impl.dialect).run_device(impl.requires, caps)
        if key:
            keys.add(key)
    return keys


@pytest.mark.parametrize("name", ALL_PROBES)
def test_every_lab_device_key_is_a_torch_device_of_the_vendors_type(name: str) -> None:
    profile, caps = recorded(name)
    by_key = {d.key: d for d in caps.devices}
    for key in lab_device_keys(caps):
        device = torch.device(vendors.torch_device(key))  # raises for a key torch rejects
        kind = by_key[key].kind
        vendor = vendors.get_vendor(kind)
        assert vendor is not None
        assert device.type == TORCH_TYPE.get(vendor.vendor, "cpu"), (name, key)
    for gpu in profile.gpus:  # the smoke test takes the same translation
        assert torch.device(smoke_device_for(gpu)).type == TORCH_TYPE[gpu.vendor]


def test_amd_gpu_runs_lab_kernels_as_a_cuda_device() -> None:
    """The bug this fixes: the lab named the RX 9070 XT 'rocm:0', which torch rejects."""
    _, caps = recorded("rdna4_rx9070xt_torch25_rocm62")
    triton = next(i for i in builtin_implementations() if i.dialect == "triton")
    key = get_dialect("triton").run_device(triton.requires, caps)
    assert key == "rocm:0"  # strata's name: stored results, dispatch and verdicts use it
    with pytest.raises(RuntimeError):
        torch.device(key)
    gpu = caps.device(key)
    assert gpu is not None and gpu.torch_key == "cuda:0"
    assert torch.device(gpu.torch_key) == torch.device("cuda", 0)
    # Timed with HIP events like a CUDA device, not with the wall clock.
    assert isinstance(clock_for(gpu.torch_key), CudaEventClock)


def test_the_cuda_dialect_never_runs_on_an_amd_gpu() -> None:
    _, caps = recorded("rdna4_rx9070xt_torch25_rocm62")
    cuda = next(i for i in builtin_implementations() if i.dialect == "cuda")
    assert get_dialect("cuda").run_device(cuda.requires, caps) is None


def test_nvidia_and_cpu_keys_pass_through_unchanged() -> None:
    _, caps = recorded("h100_torch28_cu128")
    assert [d.key for d in caps.devices] == ["cpu", "cuda:0"]
    assert [d.torch_key for d in caps.devices] == ["cpu", "cuda:0"]
    _, mac = recorded("apple_m3max_mps")
    assert [d.torch_key for d in mac.devices] == ["cpu", "mps"]


@pytest.mark.parametrize("key,want", [("rocm:1", "cuda:1"), ("cuda:2", "cuda:2"),
                                      ("mps:0", "mps"), ("xpu:0", "xpu:0"), ("cpu", "cpu"),
                                      ("mps", "mps")])
def test_torch_device_translation(key: str, want: str) -> None:
    assert vendors.torch_device(key) == want
    torch.device(want)


def test_every_vendor_file_registers_itself() -> None:
    modules = {m.name for m in pkgutil.iter_modules(vendors.__path__)} - {"base", "rules"}
    registered = {v.vendor for v in vendors.all_vendors()}
    assert registered == modules == {"nvidia", "amd", "apple", "intel", "cpu"}
    assert set(GPU_KINDS) == {"cuda", "rocm", "mps", "xpu"}


def test_cpu_runtime_on_real_torch() -> None:
    device = vendors.Device(vendors.get_vendor("cpu"))  # type: ignore[arg-type]
    assert (device.key, device.torch_key) == ("cpu", "cpu")
    device.sync()  # nothing to wait for, and nothing raised
    assert isinstance(device.clock(), HostClock) and isinstance(clock_for("cpu"), HostClock)
    assert device.memory() is None
    assert vendors.runtime_for("cuda:0") is vendors.get_vendor("rocm").runtime  # type: ignore
    with pytest.raises(KeyError):
        vendors.runtime_for("tpu:0")


def test_one_resolver_names_an_amd_gpu_rocm_for_strata_and_cuda_for_torch() -> None:
    """The lab, train and the lab backend built "cuda:0" from torch's device type, so on an
    AMD GPU their verdict and roofline lookups (stored under "rocm:0") missed; the resolver
    reads torch's build (recorded in the probe) instead."""
    from strata.hardware.devices import key_for, resolve

    profile, caps = recorded("rdna4_rx9070xt_torch25_rocm62")
    hip = profile.software.torch_hip_runtime is not None
    dev = resolve(torch.device("cuda", 0), hip=hip)
    assert dev.key == "rocm:0" and caps.device(dev.key) is not None
    assert torch.device(dev.torch) == torch.device("cuda", 0)
    assert resolve("rocm:0").torch == "cuda:0"  # a strata key resolves either way
    nvidia, nv_caps = recorded("h100_torch28_cu128")
    assert nvidia.software.torch_hip_runtime is None
    assert key_for("cuda:0", hip=False) == "cuda:0" and nv_caps.device("cuda:0") is not None
    assert resolve("mps").key == "mps:0" and resolve("mps").torch == "mps"
    assert resolve("cpu").is_cpu and key_for(torch.device("cpu")) == "cpu"
    with pytest.raises(KeyError, match="no vendor file"):
        resolve("tpu:0")
