"""What a kernel must do and may not do, derived from the lab itself: the ABI signature (from
the op's naive C kernel), the float64 reference's source, the shapes and integer sizes the
verifier passes, the tolerance, and the rules of the static check, link check and sandbox.
Prompt templates are filled from here so the prompt cannot drift from what the judge does.
"""

from __future__ import annotations

import inspect
import platform
import re
import textwrap
from typing import TYPE_CHECKING, Any

from strata.errors import InputError

if TYPE_CHECKING:
    from strata.kernels.spec import KernelSpec

FENCES = {"c": "c", "triton": "python", "cuda": "cuda"}
COMMENT = {"c": "//", "triton": "#", "cuda": "//"}
DTYPE = "float32"  # the dtype every dialect verifies and the benchmark times by default


def entry_for(op: str, dialect: str) -> str:
    """The function a kernel defines: the dialect's rule (one for declarations and prompts)."""
    from strata.kernels.dialects import get_dialect

    return get_dialect(dialect).default_entry(op)


def declaration(op: str, dialect: str, requires: str) -> str:
    extra = f" requires={requires}" if requires else ""
    if dialect == "triton":
        extra = f" dtypes={DTYPE}"
    return f"{COMMENT[dialect]} strata-kernel: op={op} dialect={dialect} " \
           f"entry={entry_for(op, dialect)}{extra}"


def _c_signature(op: str) -> str:
    """The C ABI line, read from the op's naive C file (the lab's own reference kernel,
    written from docs/kernels-abi.md)."""
    from strata.kernels.impl import builtin_implementations

    for impl in builtin_implementations():
        if impl.op == op and impl.dialect == "c" and impl.source is not None:
            m = re.search(rf"^void\s+{impl.entry}\s*\(([^)]*)\)", impl.source.read_text(),
                          re.M)
            if m:
                return f"void {impl.entry}({' '.join(m.group(1).split())});"
    raise InputError(f"OP {op}: no built-in C kernel states its ABI signature")


def abi_signature(op: str, dialect: str) -> str:
    from strata.kernels.spec import get_spec

    spec = get_spec(op)
    if dialect == "triton":
        names = ", ".join(("out", *spec.inputs, *spec.params))
        return f"def launch({names}) -> None:"
    c = _c_signature(spec.name)
    if dialect == "cuda":
        return 'extern "C" int ' + c[len("void "):-2] + ", cudaStream_t stream);"
    return c


def reference_source(spec: KernelSpec) -> str:
    """The reference function's source, the lab helpers it calls (dequantise...) and the
    constants they read, so the model sees the whole oracle."""
    seen, consts = [spec.reference], {}
    for fn in seen:  # grows while walking: helpers of helpers
        found = inspect.getclosurevars(fn)
        for name, value in {**found.nonlocals, **found.globals}.items():
            seen.extend(f for f in _lab_functions(value, fn) if f not in seen)
            if isinstance(value, int | float | str | dict | tuple):
                consts[name] = value
    lines = [f"{k} = {v!r}" for k, v in consts.items()]
    parts = ["\n".join(lines)] if lines else []
    parts += [textwrap.dedent(inspect.getsource(fn)).strip() for fn in reversed(seen)]
    return "\n\n".join(parts)


def _lab_functions(value: Any, fn: Any) -> list[Any]:
    """Functions of the ops package that `fn` reaches through `value` (a function or one of
    the package's modules)."""
    if inspect.isfunction(value) and value.__module__.startswith("strata.kernels.ops"):
        return [value]
    if inspect.ismodule(value) and value.__name__.startswith("strata.kernels.ops"):
        return [f for n in fn.__code__.co_names
                if inspect.isfunction(f := getattr(value, n, None))]
    return []


def _dims(t: Any) -> str:
    return f"{str(t.dtype).replace('torch.', '')}[{', '.join(str(n) for n in t.shape)}]"


def shape_lines(spec: KernelSpec, shapes: list[dict[str, int]]) -> str:
    from strata.kernels.spec import shape_label

    lines = []
    for shape in shapes:
        inputs = spec.make_inputs(shape, DTYPE, 0, "cpu")
        out = _out_like(spec, shape)
        sizes = ", ".join(str(int(n)) for n in spec.sizes(out, *inputs))
        params = ", ".join(f"{k}={v:g}" for k, v in spec.params_for(shape).items())
        tensors = ", ".join(f"{n} {_dims(t)}" for n, t in zip(spec.inputs, inputs, strict=True))
        lines.append(f"- {shape_label(shape)}: {tensors} -> out {_dims(out)}; "
                     f"sizes ({sizes}){'; ' + params if params else ''}")
    return "\n".join(lines)


def _out_like(spec: KernelSpec, shape: dict[str, int]) -> Any:
    import torch

    return torch.empty(spec.out_shape(shape), dtype=getattr(torch, spec.out_dtype or DTYPE))


def tolerance_text(spec: KernelSpec, dtypes: tuple[str, ...] = (DTYPE,)) -> str:
    lines = []
    for dtype in dtypes:
        tol = spec.tolerance(dtype)
        lines.append(f"- {dtype}: |out - ref| <= {tol.atol:g} * max(1, rms(ref)) + "
                     f"{tol.rtol:g} * |ref|  (atol={tol.atol:g}, rtol={tol.rtol:g}; rms over "
                     "the finite reference values)")
    return "\n".join(lines)


# -- the rules ---------------------------------------------------------------------------------

def _names(pattern: str) -> str:
    """A readable list of what one static-check regex matches."""
    text = re.sub(r"#\\s\*include\\s\*\[<\\\"\]|\[>\\\"\]|\\b|\\s\*\\\(|\\s\*", "", pattern)
    text = re.sub(r"\[\\w/\.?\]\+|\\w[+*]", "*", text)
    text = text.replace("(?:", "").replace(")?", "").replace(")", "").replace("\\.", ".")
    return ", ".join(dict.fromkeys(n for n in text.split("|") if n))


def static_rules(dialect: str) -> list[str]:
    from strata.kernels import static_check as sc

    if dialect == "triton":
        return [f"imports only {', '.join(sorted(sc.ALLOWED_IMPORTS))}",
                f"no {', '.join(sorted(sc.FORBIDDEN_NAMES))}; no dunder introspection",
                "torch attributes are dtypes only (" + ", ".join(sorted(sc.TORCH_DTYPES)) +
                "): no torch/F/nn function",
                "outside @triton.jit no tensor compute method (" +
                ", ".join(sorted(sc.VENDOR_METHODS)) + ") and no @ operator"]
    rules = [f"refused if it {why}: {_names(pattern)}" for pattern, why in sc._C_RULES
             if not (dialect == "cuda" and why == "contains inline assembly")]
    return rules


def link_rules(dialect: str) -> str:
    from strata.kernels import elfcheck as ec

    math = ", ".join(ec._MATH)
    variants = {*ec._MATH, *(m + "f" for m in ec._MATH), *(m + "l" for m in ec._MATH)}
    other = sorted(n for n in ec.C_ALLOWED - variants if not n.startswith("_"))
    text = (f"the built library may import only libm ({math}, and their f/l variants), "
            f"{', '.join(other)}, GOMP_* (OpenMP); nothing else resolves")
    if dialect == "cuda":
        cuda = sorted(n for n in ec.CUDA_ALLOWED - ec.C_ALLOWED if n.startswith("cuda"))
        text += f"; CUDA runtime: {', '.join(cuda)}, __cuda* (registration)"
    return text + ". No constructors/destructors, no ifuncs, no extra libraries"


def sandbox_rules(dialect: str) -> list[str]:
    from strata.kernels import checks, confine
    from strata.kernels.sandbox import CPU_ADDRESS_SPACE, SandboxPolicy

    denied = sorted(confine._DENY.get(platform.machine(), confine._DENY["x86_64"]))
    return [f"runs in a sandboxed worker: Landlock (no file writes outside a private scratch "
            f"directory, no TCP), seccomp (denied: {', '.join(denied)}, and exec on CPU jobs); "
            f"time limit {SandboxPolicy().timeout_s:g} s, address space "
            f"{CPU_ADDRESS_SPACE >> 30} GiB (CPU)",
            f"runtime guards: a torch op during the call ({checks.CALLS_TORCH}), a patched "
            f"timer ({checks.PATCHED_TIMER}), a thread left running ({checks.LEFT_THREAD}), "
            f"writes after return ({checks.ASYNC_WRITE}), writes past a buffer "
            f"({checks.OUT_OF_BOUNDS}), modified inputs ({checks.MODIFIED_INPUTS})",
            "a time faster than this host's roofline allows is disqualified as implausible"]


def rules_text(op: str, dialect: str, requires: str) -> str:
    from strata.kernels.impl import HEADER_LINES

    lines = [f"Declaration: within the first {HEADER_LINES} lines, "
             f"`{declaration(op, dialect, requires)}` "
             "(requires= lists ISA features you use, or a device and arch range)."]
    lines += [f"- static check: {r}" for r in static_rules(dialect)]
    if dialect in ("c", "cuda"):
        lines.append(f"- link check: {link_rules(dialect)}")
    lines += [f"- {r}" for r in sandbox_rules(dialect)]
    return "\n".join(lines)
