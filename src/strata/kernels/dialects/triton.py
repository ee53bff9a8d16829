"""Dialect `triton`: Python files with @triton.jit kernels and a `launch` function.

On a GPU they compile and run for real; on a CPU-only host the worker sets
TRITON_INTERPRET=1, so correctness is still verified but timings mean nothing.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from strata.hardware.vendors import get_vendor
from strata.kernels.capability import HostCaps, Requires, triton_installed
from strata.kernels.dialects.base import Dialect
from strata.kernels.static_check import check_python


class TritonKernel:
    def __init__(self, launch: Callable[..., Any]) -> None:
        self.launch = launch

    def bind(self, out: Any, inputs: list[Any], params: dict[str, Any]) -> Callable[[], None]:
        launch = self.launch

        def call() -> None:
            launch(out, *inputs, **params)

        return call


def load_triton(impl: Any, spec: Any, device: str) -> TritonKernel:
    module_name = f"strata_kernel_{impl.op}_{impl.name.replace('.', '_')}"
    loader = importlib.util.spec_from_file_location(module_name, impl.source)
    if loader is None or loader.loader is None:
        raise ImportError(f"cannot import {impl.source}")
    module = importlib.util.module_from_spec(loader)
    sys.modules[module_name] = module  # triton.jit inspects the defining module
    loader.loader.exec_module(module)
    launch = getattr(module, impl.entry, None)
    if not callable(launch):
        raise LookupError(f"{impl.source.name} defines no function {impl.entry}")
    return TritonKernel(launch)


def _triton_compiles_for(kind: str) -> bool:
    """Whether Triton has a GPU backend for this device kind (its vendor file says)."""
    vendor = get_vendor(kind)
    return vendor is not None and vendor.triton


@dataclass(frozen=True)
class TritonDialect(Dialect):
    def run_device(self, requires: Requires, caps: HostCaps) -> str | None:
        gpus = [d for d in caps.devices if _triton_compiles_for(d.kind)]
        fitting = [d for d in gpus if requires.arch is None or requires.arch.contains(d.arch)]
        if fitting:
            return fitting[0].key
        return "cpu" if requires.device in ("any", "cpu") else None  # the interpreter

    def untimed_reason(self, device: str) -> str | None:
        return "not timed: interpreter (no GPU)" if device == "cpu" else None


DIALECT = TritonDialect(name="triton", suffixes=(".py",), default_device="any",
                        tools=("triton",), summary="Triton (GPU; TRITON_INTERPRET=1 on CPU)",
                        loader=load_triton, static_checker=check_python,
                        tool_probes={"triton": triton_installed},
                        entry_template="launch")  # a host-side launcher, not the @jit kernel
