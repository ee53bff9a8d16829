"""Dialect `c`: C compiled at run time into a shared library, called on data pointers."""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.kernels.capability import HostCaps, c_compiler_present
from strata.kernels.dialects.base import Dialect, abi_args, checked_library
from strata.kernels.static_check import check_c_source
from strata.native import DEFAULT_FLAGS, build_shared

# Compiler flags that enable an ISA feature a variant declares (-march=native already covers
# the host; the explicit flag makes a variant's build fail loudly where the CPU lacks it).
ISA_FLAGS = {"avx2": "-mavx2", "fma": "-mfma", "f16c": "-mf16c", "avx512f": "-mavx512f",
             "avx512bw": "-mavx512bw", "avx512vl": "-mavx512vl", "avx512_bf16": "-mavx512bf16",
             "avx512_vnni": "-mavx512vnni", "avx_vnni": "-mavxvnni"}


def flags_for(isa: tuple[str, ...]) -> tuple[str, ...]:
    return (*DEFAULT_FLAGS, *(ISA_FLAGS[f] for f in isa if f in ISA_FLAGS))


class CKernel:
    def __init__(self, fn: Any, spec: Any) -> None:
        self.fn, self.spec = fn, spec

    def bind(self, out: Any, inputs: list[Any], params: dict[str, Any]) -> Callable[[], None]:
        args, fn = abi_args(self.spec, out, inputs, params), self.fn
        fn.argtypes = [type(a) for a in args]
        tensors = (out, *inputs)  # held by the thunk: its raw pointers must stay valid

        def call() -> None:
            fn(*args)

        call.tensors = tensors  # type: ignore[attr-defined]
        # entry point and raw arguments, for strata's decode-step runner (lab/runner.py):
        # pointers and sizes as integers, then the float params
        call.native = (ctypes.cast(fn, ctypes.c_void_p).value,  # type: ignore[attr-defined]
                       [a.value or 0 for a in args if not isinstance(a, ctypes.c_float)],
                       [a.value for a in args if isinstance(a, ctypes.c_float)])
        return call


def header_flags(impl: Any) -> tuple[str, ...]:
    """Where `#include "strata_simd.h"` is found (the shared headers' folder, for external
    kernels too: their private copies live elsewhere), and the shared headers' bytes as a
    define, so the build cache (keyed by the source and the flags) rebuilds a library when
    a header it includes changes."""
    from strata.kernels.impl import C_HEADERS

    headers = impl.headers()
    flags: tuple[str, ...] = ("-iquote", str(C_HEADERS))
    if headers:
        digest = hashlib.sha256(b"".join(h.name.encode() + b"\0" + h.read_bytes()
                                         for h in headers)).hexdigest()[:16]
        flags += (f"-DSTRATA_HEADERS_SHA256=0x{digest}",)
    return flags


def build_c(impl: Any) -> Path:
    """Compile (cached) and check what the library links to, before anything loads it."""
    flags = flags_for(impl.requires.isa)
    return checked_library(build_shared(impl.source, (*flags, *header_flags(impl))), "c",
                           flags)


def load_c(impl: Any, spec: Any, device: str) -> CKernel:
    # In a sandboxed worker the parent has built and checked the library (no compiler may
    # run there); elsewhere (dispatch in the user's process) build and check it here.
    built = impl.extra.get("library")
    lib = ctypes.CDLL(built if built else str(build_c(impl)))
    try:
        fn = getattr(lib, impl.entry)
    except AttributeError:
        raise LookupError(f"{impl.source.name} defines no function {impl.entry}") from None
    fn.restype = None
    return CKernel(fn, spec)


@dataclass(frozen=True)
class CDialect(Dialect):
    def prepare(self, impl: Any, caps: HostCaps) -> dict[str, str]:
        return {"library": str(build_c(impl))}


DIALECT = CDialect(name="c", suffixes=(".c", ".cc", ".cpp"), default_device="cpu",
                   tools=("cc",), summary="C/C++ compiled at run time (cc -O3 -march=native)",
                   loader=load_c, static_checker=check_c_source,
                   tool_probes={"cc": c_compiler_present})
