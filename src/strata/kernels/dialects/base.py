"""The dialect contract: how implementations of one language are built, loaded and called.

`load` runs where the kernel runs (inside the sandboxed worker for verification and
benchmarks); it returns a `Kernel` whose `bind` pre-computes everything a call needs, so the
timed thunk is just the call (docs/architecture.md §8: one timing path for every dialect).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from strata.kernels.capability import HostCaps, Requires


class Kernel(Protocol):
    def bind(self, out: Any, inputs: list[Any], params: dict[str, Any]) -> Callable[[], None]:
        """A no-argument thunk that computes the op into `out`."""
        ...


@dataclass(frozen=True)
class Dialect:
    name: str
    suffixes: tuple[str, ...]
    default_device: str
    tools: tuple[str, ...] = ()
    summary: str = ""
    loader: Callable[..., Kernel] | None = field(default=None, compare=False)
    # source text -> findings, for external kernels before anything runs (static_check.py)
    static_checker: Callable[[str], list[str]] | None = field(default=None, compare=False)
    # tool name -> "is it on this host?", merged into HostCaps.tools (capability.py)
    tool_probes: dict[str, Callable[[], bool]] = field(default_factory=dict, compare=False)
    # the function a kernel of this dialect defines by default (docs/kernels-abi.md)
    entry_template: str = "strata_{op}"

    def default_entry(self, op: str) -> str:
        return self.entry_template.format(op=op)

    def requires(self, declared: Requires) -> Requires:
        """The declaration plus the tools this dialect always needs."""
        tools = tuple(dict.fromkeys((*declared.tools, *self.tools)))
        return Requires(declared.device, declared.arch, declared.isa, tools)

    def run_device(self, requires: Requires, caps: HostCaps) -> str | None:
        """Device key this implementation runs on here (None: nowhere)."""
        dev = requires.matching_device(caps)
        return dev.key if dev else None

    def untimed_reason(self, device: str) -> str | None:
        """Why timings on `device` would be meaningless (e.g. an interpreter), else None."""
        return None

    def compile_only(self, requires: Requires, caps: HostCaps) -> bool:
        """True when the device is missing but the source can still be compile-checked."""
        return False

    def load(self, impl: Any, spec: Any, device: str) -> Kernel:
        assert self.loader is not None, f"dialect {self.name} cannot load kernels"
        return self.loader(impl, spec, device)

    def prepare(self, impl: Any, caps: HostCaps) -> dict[str, str]:
        """Parent-side work before a sandboxed job (trusted process, may run compilers):
        build, check what the build links to, and return what the worker needs to load it
        without running a tool (kept in `impl.extra`). Raises CompileError or
        KernelRefused."""
        return {}


def prepared(impl: Any, caps: HostCaps) -> Any:
    """`impl` built and checked by its dialect (Dialect.prepare), carrying what the
    sandboxed worker needs to load it in `extra`. Raises CompileError or KernelRefused."""
    from dataclasses import replace

    from strata.kernels.dialects import get_dialect

    extra = get_dialect(impl.dialect).prepare(impl, caps)
    return replace(impl, extra={**impl.extra, **extra})


class KernelRefused(Exception):
    """A built kernel that must not be loaded (elfcheck findings); reason is a checks code."""

    def __init__(self, reason: str, findings: list[str]) -> None:
        super().__init__(findings[0])
        self.reason, self.findings = reason, findings


def checked_library(lib: Path, dialect: str, flags: tuple[str, ...]) -> Path:
    """`lib` if its ELF imports and load-time code are allowed, else KernelRefused."""
    from strata.kernels.checks import FORBIDDEN_LINK
    from strata.kernels.elfcheck import check_library

    findings = check_library(lib, dialect, flags)
    if findings:
        raise KernelRefused(FORBIDDEN_LINK, findings)
    return lib


def abi_args(spec: Any, out: Any, inputs: list[Any], params: dict[str, Any]) -> list[Any]:
    """The C ABI's arguments (docs/kernels-abi.md): data pointers of out and the inputs,
    the op's int64 sizes, then its float params in the op's order (contract.param_names:
    its defaults, then the per-shape ones), as ctypes values built once per bind."""
    import ctypes

    from strata.kernels.contract import param_names

    order = [k for k in param_names(spec) if k in params]
    order += [k for k in params if k not in order]
    return [*(ctypes.c_void_p(t.data_ptr()) for t in (out, *inputs)),
            *(ctypes.c_int64(int(n)) for n in spec.sizes(out, *inputs)),
            *(ctypes.c_float(float(params[k])) for k in order)]


def source_text(path: Path) -> str:
    return path.read_text("utf-8", errors="replace")
