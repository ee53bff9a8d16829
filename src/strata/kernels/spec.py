"""KernelSpec: what an op computes, on which inputs, how exactly, and what it costs.

A spec is the oracle side of the kernel lab (docs/architecture.md §8, llm.c's pattern): a PyTorch
reference (run in float64 on small shapes to judge candidates), the vendor path used as
the speed baseline (`eager`), an input generator with several distributions, per-dtype
tolerances, and FLOP/byte formulas for the roofline. Specs register themselves by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Shape = dict[str, int]
Tensors = list[Any]  # torch tensors; torch is imported lazily (docs/architecture.md §2)


@dataclass(frozen=True)
class Tolerance:
    """|out - ref| <= atol + rtol*|ref| (+ floor), elementwise."""

    atol: float
    rtol: float
    # per element, what the op's own numerics leave open (KernelSpec.slack of the inputs)
    floor: Any = field(default=None, compare=False)


# Distributions the generator cycles through by seed: kernels that only work for
# standard-normal inputs (e.g. no max-subtraction in softmax) fail on the others.
DISTRIBUTIONS = ("normal", "uniform", "heavy")

@dataclass(frozen=True)
class Clause:
    """One promise of an op's ABI (ignore index, masks, unread rows, empty rows, extreme
    values, ragged sizes...) with a verification case of its own: verification makes the
    inputs of `shape` for each seed, calls `apply(inputs, shape, seed)` (which mutates them
    in place so the case exercises the promise), re-derives dependent inputs (`derive`), then
    judges the candidate against the float64 reference exactly as a normal case. `text` is
    the promise as docs/kernels-abi.md states it (its "Clauses" section lists every one)."""

    name: str  # short id, e.g. "ignore_index"
    text: str  # the ABI promise it checks, one sentence
    shape: Shape  # a small (verify-sized) shape that exercises it
    apply: Callable[..., None]  # (inputs, shape, seed) -> None, in place
    seeds: tuple[int, ...] = (0, 1)


def as_made(inputs: Tensors, shape: Shape, seed: int) -> None:
    """A clause's `apply` when the clause's shape alone exercises it (ragged sizes)."""


DEFAULT_TOLERANCES = {
    "float32": Tolerance(1e-5, 1e-5),
    "bfloat16": Tolerance(2e-2, 2e-2),
    "float16": Tolerance(2e-3, 2e-3),
}


@dataclass(frozen=True)
class KernelSpec:
    name: str
    summary: str
    inputs: tuple[str, ...]  # names, in call order (docs/kernels-abi.md)
    make_inputs: Callable[[Shape, str, int, str], Tensors]  # shape, dtype, seed, device
    out_shape: Callable[[Shape], tuple[int, ...]]
    reference: Callable[..., Any]  # (*inputs, **params) -> tensor; any float dtype
    flops: Callable[[Shape], float]
    bytes: Callable[[Shape, int], float]  # shape, bytes per float element
    shapes: dict[str, list[Shape]]  # named sets; "verify" must exist (small, ragged)
    sizes: Callable[..., tuple[int, ...]]  # (out, *inputs) -> int64 size args of the C ABI
    params: dict[str, Any] = field(default_factory=dict)  # eps, scale, ...
    eager: Callable[..., Any] | None = None  # vendor path; defaults to the reference
    out_dtype: str | None = None  # fixed output dtype (e.g. float32 losses); None: input's
    tolerances: dict[str, Tolerance] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    scale_params: Callable[[Shape, dict[str, Any]], dict[str, Any]] | None = None
    # (inputs, **params) -> None: recomputes, in place, inputs that are functions of the
    # others (attention_backward's o and lse of q, k, v) after the benchmark's input
    # stream mixed fresh ones; None: the inputs are independent
    derive: Callable[..., None] | None = None
    # input name -> the one dtype that input always has, whatever the call's float dtype
    # (linear_f16's weight is float16 next to float32 activations). make_inputs produces it;
    # the contract demands exactly it and leaves it out of the "one float dtype" rule.
    fixed_dtypes: dict[str, str] = field(default_factory=dict)
    # the promises of the op's ABI row, each fed by a verification case of its own (Clause)
    clauses: tuple[Clause, ...] = ()
    # (out, *inputs) -> the call's named shape (the keys of the op's shape sets): what
    # dispatch checks against the shapes an external kernel was verified at. Reads only
    # tensor shapes, except attention_cached's P (pos[0], omitted on the meta device).
    dims: Callable[..., Shape] | None = None
    # (*inputs) -> per-element absolute error the reference's own numerics leave open at
    # float32, added to atol/rtol (gelu_mul: the fp16 step of a subnormal GELU times b);
    # None: atol/rtol say it all
    slack: Callable[..., Any] | None = None
    # dispatch per call shape (convolutions: a 1x1 layer is a GEMM, a 7x7 stride-2 stem or a
    # depthwise layer is not, and different kernels win them): `strata.kernels` resolves each
    # new call shape from the benchmarks at that shape; other ops take one kernel for all
    per_shape: bool = False

    def params_for(self, shape: Shape) -> dict[str, Any]:
        """Params for one shape (attention's scale depends on the head dim)."""
        return self.scale_params(shape, dict(self.params)) if self.scale_params else \
            dict(self.params)

    def tolerance(self, dtype: str) -> Tolerance:
        return self.tolerances.get(dtype, DEFAULT_TOLERANCES["float32"])

    def tolerance_for(self, dtype: str, inputs: Any) -> Tolerance:
        """The dtype's tolerance, plus the per-element slack these inputs call for."""
        tol = self.tolerance(dtype)
        if self.slack is None or dtype != "float32":
            return tol
        return Tolerance(tol.atol, tol.rtol, self.slack(*inputs))

    def vendor(self) -> Callable[..., Any]:
        return self.eager or self.reference

    def clause_cases(self) -> list[tuple[Clause, Shape, int]]:
        """(clause, shape, seed) of every clause's verification cases, in clause order."""
        return [(c, dict(c.shape), seed) for c in self.clauses for seed in c.seeds]

    def shape_set(self, name: str) -> list[Shape]:
        from strata.errors import InputError

        if name not in self.shapes:
            raise InputError(f"--shapes {name}: op {self.name} has the sets "
                             f"{', '.join(self.shapes)}")
        return self.shapes[name]


SPECS: dict[str, KernelSpec] = {}


def register(spec: KernelSpec) -> KernelSpec:
    SPECS[spec.name] = spec
    return spec


def all_specs() -> dict[str, KernelSpec]:
    import strata.kernels.ops  # noqa: F401  (each op module registers its spec)

    return SPECS


def get_spec(op: str) -> KernelSpec:
    from strata.errors import InputError

    specs = all_specs()
    if op not in specs:
        raise InputError(f"OP {op}: unknown op (choose from {', '.join(specs)})")
    return specs[op]


def dims_of(**where: tuple[int, int]) -> Callable[..., Shape]:
    """A spec's `dims`: each shape name -> (index into (out, *inputs), axis)."""

    def dims(*tensors: Any) -> Shape:
        return {name: int(tensors[i].shape[axis]) for name, (i, axis) in where.items()}

    return dims


def shape_label(shape: Shape) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


def parse_shape(spec: KernelSpec, text: str) -> Shape:
    """A shape written as its label ("N=1 H=56 ..." or comma-separated), with exactly the op's
    dims, each a non-negative integer; InputError otherwise."""
    from strata.errors import InputError

    want = list(spec.shapes["verify"][0])
    example = shape_label(spec.shapes["verify"][-1])
    shape: Shape = {}
    for part in text.replace(",", " ").split():
        key, eq, value = part.partition("=")
        if not eq or not value.strip().isdigit():
            raise InputError(f"--shape {text}: write each dim as NAME=INTEGER, e.g. {example}")
        shape[key.strip()] = int(value)
    if sorted(shape) != sorted(want):
        raise InputError(f"--shape {text}: {spec.name} takes the dims {' '.join(want)} "
                         f"(e.g. {example})")
    return {k: shape[k] for k in want}


# -- input generation helpers shared by the op modules --------------------------------------

def generator(seed: int) -> Any:
    import torch

    return torch.Generator().manual_seed(seed)


def floats(size: Sequence[int], dtype: str, seed: int, device: str, *,
           scale: float = 1.0, offset: int = 0) -> Any:
    """Random floats whose distribution depends on the seed (normal, uniform, heavy-tailed).

    Generated in float32 on the CPU from a seeded generator so every device and dtype sees
    the same values, then cast and moved.
    """
    import torch

    g = generator(seed * 7919 + offset)
    kind = DISTRIBUTIONS[seed % len(DISTRIBUTIONS)]
    if kind == "normal":
        t = torch.randn(*size, generator=g)
    elif kind == "uniform":
        t = torch.rand(*size, generator=g) * 4 - 2
    else:  # heavy tails: a few large values among small ones
        t = torch.randn(*size, generator=g) * torch.exp(torch.randn(*size, generator=g))
    return (t * scale).to(dtype=getattr(torch, dtype), device=device).contiguous()
