"""Software stack: Python, torch build and its compiled arch list, llama.cpp, Triton, drivers."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
from typing import Any

from strata import __version__
from strata.hardware.profile import SoftwareStack

# Environment variables that change which kernels a GPU stack picks; recorded because
# they explain results (HSA_OVERRIDE_GFX_VERSION is the RDNA4 story).
RELEVANT_ENV = ("HSA_OVERRIDE_GFX_VERSION", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                "CUDA_VISIBLE_DEVICES", "PYTORCH_ROCM_ARCH", "TORCH_CUDA_ARCH_LIST",
                "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def probe_software() -> SoftwareStack:
    sw = SoftwareStack(python=platform.python_version(),
                       os=f"{platform.system()} {platform.release()}", strata=__version__)
    sw.env = {k: os.environ[k] for k in RELEVANT_ENV if k in os.environ}
    for fill in (_fill_torch, _fill_llama_cpp, _fill_triton, _fill_drivers):
        try:
            fill(sw)
        except Exception as exc:  # a broken optional install must not end the probe
            sw.unknown[fill.__name__.removeprefix("_fill_")] = f"{type(exc).__name__}: {exc}"
    return sw


def _fill_torch(sw: SoftwareStack) -> None:
    try:
        import torch
    except ImportError:
        sw.unknown["torch"] = "not installed (pip install 'strata[torch]')"
        return
    sw.torch = torch.__version__.split("+")[0]
    sw.torch_cuda_runtime = torch.version.cuda
    sw.torch_hip_runtime = getattr(torch.version, "hip", None)
    sw.torch_build = torch_build_name(sw.torch_cuda_runtime, sw.torch_hip_runtime)
    sw.torch_arch_list = torch_arch_list(torch)


def torch_build_name(cuda: str | None, hip: str | None) -> str:
    if hip:
        return "rocm " + ".".join(hip.split(".")[:2])
    if cuda:
        return f"cuda {cuda}"
    return "cpu"


def torch_arch_list(torch: Any) -> list[str]:
    """The archs the torch build carries kernels for.

    `torch.cuda.get_arch_list()` returns [] when no device is visible, but the compiled list
    is what decides whether a device *would* work, so read the build flags directly.
    """
    flags = getattr(torch._C, "_cuda_getArchFlags", None)
    text = flags() if flags else None
    if text:
        return [a.strip() for a in text.replace(";", " ").split() if a.strip()]
    return list(torch.cuda.get_arch_list())


def _fill_llama_cpp(sw: SoftwareStack) -> None:
    sw.llama_cpp = _dist_version("llama_cpp_python")
    if sw.llama_cpp is None:
        sw.unknown["llama_cpp"] = "llama-cpp-python not installed"
        return
    import llama_cpp

    info = llama_cpp.llama_print_system_info()
    sw.llama_cpp_features = info.decode() if isinstance(info, bytes) else str(info)
    # the binding's version says little about the llama.cpp inside it: name that too
    from strata.backends.llamacpp import build_info, llama_cpp_version

    version = llama_cpp_version()
    sw.llama_cpp_version = None if version == "unknown" else version
    sw.llama_cpp_commit = build_info()["llama_cpp_commit"]
    if sw.llama_cpp_commit is None:
        sw.unknown["llama_cpp_commit"] = "this build of llama.cpp does not record its commit"


def llama_cpp_text(sw: SoftwareStack) -> str:
    """llama.cpp's own version and commit, then the binding's: one line for probe and
    report ("0.5.0-dev, commit 0c1e570 (llama-cpp-python 0.3.36)")."""
    if not sw.llama_cpp:
        return "not installed"
    own = ", ".join(filter(None, [sw.llama_cpp_version, sw.llama_cpp_commit and
                                  f"commit {sw.llama_cpp_commit}"]))
    binding = f"llama-cpp-python {sw.llama_cpp}"
    return f"{own} ({binding})" if own else binding


def _fill_triton(sw: SoftwareStack) -> None:
    sw.triton = _dist_version("triton") or _dist_version("pytorch-triton-rocm")
    if sw.triton is None:
        sw.unknown["triton"] = "not installed"


def _fill_drivers(sw: SoftwareStack) -> None:
    from strata.hardware.gpu.nvidia import cuda_driver_api

    sw.cuda_driver_api = cuda_driver_api()
    nv_version = _read_first("/proc/driver/nvidia/version")
    if nv_version:
        # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.124.06  ..."
        parts = [p for p in nv_version.split() if p[:1].isdigit() and "." in p]
        sw.nvidia_driver = parts[0] if parts else None
    amd = _read_first("/sys/module/amdgpu/version")
    sw.amd_driver = amd.strip() if amd else None


def _read_first(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.readline()
    except OSError:
        return None
