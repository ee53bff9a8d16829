"""Dialect `cuda`: CUDA C++ compiled with nvcc into a shared library, called with device
pointers and the current stream. Without a GPU the source is still compile-checked."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.kernels.capability import HostCaps, Requires, nvcc_present
from strata.kernels.dialects.base import Dialect, abi_args, checked_library
from strata.kernels.static_check import check_cuda_source
from strata.native import build_cuda

# Architectures compiled when no device says which one to target (a compile check).
CHECK_ARCHS = ("sm_80", "sm_90")


def archs_for(requires: Requires, device_arch: str | None) -> tuple[str, ...]:
    if device_arch:
        return (device_arch,)
    low = f"sm_{requires.arch.low}" if requires.arch else CHECK_ARCHS[0]
    return tuple(dict.fromkeys((low, *CHECK_ARCHS[1:])))


class CudaKernel:
    def __init__(self, fn: Any, spec: Any) -> None:
        self.fn, self.spec = fn, spec

    def bind(self, out: Any, inputs: list[Any], params: dict[str, Any]) -> Callable[[], None]:
        import torch

        stream = ctypes.c_void_p(torch.cuda.current_stream(out.device).cuda_stream)
        args, fn = [*abi_args(self.spec, out, inputs, params), stream], self.fn
        fn.argtypes = [type(a) for a in args]

        tensors = (out, *inputs)  # held by the thunk: its raw pointers must stay valid

        def call() -> None:
            code = fn(*args)
            if code:
                raise RuntimeError(f"CUDA launch failed: cudaError {code}")

        call.tensors = tensors  # type: ignore[attr-defined]
        return call


def build_checked(impl: Any, device_arch: str | None = None) -> Path:
    """nvcc build (cached) whose imports and constructors passed elfcheck."""
    archs = archs_for(impl.requires, device_arch)
    return checked_library(build_cuda(impl.source, archs), "cuda", archs)


def compile_cuda(impl: Any, device_arch: str | None = None) -> ctypes.CDLL:
    return ctypes.CDLL(str(build_checked(impl, device_arch)))


def load_cuda(impl: Any, spec: Any, device: str) -> CudaKernel:
    built = impl.extra.get("library")
    if built:
        lib = ctypes.CDLL(built)
    else:
        import torch

        major, minor = torch.cuda.get_device_capability(device)
        lib = compile_cuda(impl, f"sm_{major}{minor}")
    fn = getattr(lib, impl.entry, None)
    if fn is None:
        raise LookupError(f"{impl.source.name} defines no function {impl.entry}")
    fn.restype = ctypes.c_int
    return CudaKernel(fn, spec)


@dataclass(frozen=True)
class CudaDialect(Dialect):
    def compile_only(self, requires: Requires, caps: HostCaps) -> bool:
        return "nvcc" in caps.tools

    def prepare(self, impl: Any, caps: HostCaps) -> dict[str, str]:
        """Build for the GPU it will run on (or the check architectures without one)."""
        dev = impl.requires.matching_device(caps)
        arch = dev.arch if dev is not None and (dev.arch or "").startswith("sm_") else None
        return {"library": str(build_checked(impl, arch))}


DIALECT = CudaDialect(name="cuda", suffixes=(".cu",), default_device="cuda",
                      tools=("nvcc",), summary="CUDA C++ via nvcc (compile-checked without a GPU)",
                      loader=load_cuda, static_checker=check_cuda_source,
                      tool_probes={"nvcc": nvcc_present})
