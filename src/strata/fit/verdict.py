"""Per-device verdicts: fits / fits with N of L layers on the GPU (-ngl N) / does not fit,
the largest context that fits, and the quantisations that would fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from strata.fit.backends import BackendRules, Runtime
from strata.fit.memory import (
    CTX_PAD,
    LayerBytes,
    Memory,
    Shape,
    Share,
    llamacpp_split,
    memory,
    whole,
)
from strata.hardware.profile import HostProfile
from strata.models.spec import ModelSpec

if TYPE_CHECKING:
    from strata.fit.experts import ExpertOffload

MAX_CTX = 10_000_000  # --ctx upper bound, and the search cap for a model with no ctx_max
GiB = 2**30

FITS, PARTIAL, NO, UNKNOWN = "fits", "partial", "does not fit", "unknown"


@dataclass(frozen=True)
class Budget:
    """Memory one device of the host offers."""

    device: str  # "cpu", "cuda:0" (roofline device names)
    kind: str  # "cpu" or "gpu"
    name: str
    available: int | None
    basis: str


def budgets(host: HostProfile) -> list[Budget]:
    cpu = host.cpu
    out = [Budget("cpu", "cpu", cpu.model or cpu.arch, cpu.ram_available_bytes,
                  "RAM available when probed")]
    out += [Budget(g.key, "gpu", g.name, g.memory_total_bytes,
                   "GPU memory total (the probe records no free figure: other processes' use "
                   "is not subtracted)") for g in host.gpus]
    return out


@dataclass
class Placement:
    ngl: int | None  # llama.cpp -ngl; None where the backend has no layer split
    blocks: int  # transformer blocks on the row's device
    output: bool  # the output layer runs on the row's device
    device: Memory  # on the row's device
    host: Memory | None = None  # RAM a GPU row also needs (layers left on the CPU, logits)

    def to_dict(self) -> dict[str, Any]:
        return {"ngl": self.ngl, "blocks": self.blocks, "output_layer": self.output,
                "device": self.device.to_dict(),
                "host": self.host.to_dict() if self.host else None}


@dataclass(frozen=True)
class Case:
    """One question: this model, as this backend holds it, sized for this shape."""

    spec: ModelSpec
    shape: Shape
    rules: BackendRules

    @property
    def layers(self) -> LayerBytes:
        return LayerBytes.of(self.spec)

    @property
    def full_ngl(self) -> int:
        return self.spec.n_layers + 1  # llama.cpp counts the output layer as one more

    def with_ctx(self, ctx: int) -> Case:
        return replace(self, shape=replace(self.shape, ctx=ctx))

    def with_spec(self, spec: ModelSpec) -> Case:
        return replace(self, spec=spec)


def on_cpu(case: Case) -> Placement:
    """Everything in RAM (llama.cpp -ngl 0, torch --device cpu)."""
    share = whole(case.spec)
    mem = memory(case.spec, case.shape, share, case.rules.devices["cpu"])
    return Placement(0 if case.rules.layer_split else None, share.blocks, True, mem)


def on_gpu(case: Case, ngl: int | None, layers: LayerBytes | None = None) -> Placement:
    """`ngl` layers on one GPU (llama.cpp), or the whole model (ngl None: torch)."""
    spec = case.spec
    if ngl is None:  # no layer split: the GPU holds it all, the host only runs the process
        gpu, cpu = whole(spec), Share(0, 0, False)
    else:
        gpu, cpu = llamacpp_split(spec, layers or case.layers, ngl)
    return Placement(ngl, gpu.blocks, gpu.output,
                     memory(spec, case.shape, gpu, case.rules.devices["gpu"]),
                     memory(spec, case.shape, cpu, case.rules.devices["cpu"]))


def _within(mem: Memory | None, budget: Budget | None) -> bool:
    if mem is None:
        return True
    return budget is not None and budget.available is not None and mem.total <= budget.available


def most_layers(case: Case, gpu: Budget) -> int:
    """Largest -ngl whose GPU share fits the GPU (0: not even the output layer does)."""
    layers = case.layers
    for ngl in range(case.full_ngl, 0, -1):
        if _within(on_gpu(case, ngl, layers).device, gpu):
            return ngl
    return 0


@dataclass
class Verdict:
    verdict: str
    placement: Placement
    reason: str


def _need(mem: Memory, budget: Budget, what: str) -> str:
    return (f"{what} needs {mem.total / GiB:.2f} GiB, {budget.available / GiB:.2f} GiB "
            f"available" if budget.available is not None else f"{what}: size unknown")


def cpu_verdict(case: Case, cpu: Budget) -> Verdict:
    place = on_cpu(case)
    if cpu.available is None:
        return Verdict(UNKNOWN, place, "the probe could not read the available RAM")
    ok = _within(place.device, cpu)
    return Verdict(FITS if ok else NO, place, _need(place.device, cpu, "the whole model"))


def gpu_verdict(case: Case, gpu: Budget, ram: Budget) -> Verdict:
    if gpu.available is None:
        return Verdict(UNKNOWN, on_gpu(case, _full(case)),
                       "the probe could not read this GPU's memory")
    if not case.rules.layer_split:
        place = on_gpu(case, None)
        ok = _within(place.device, gpu) and _within(place.host, ram)
        return Verdict(FITS if ok else NO, place, _need(place.device, gpu, "the whole model"))
    ngl = most_layers(case, gpu)
    if ngl == 0:
        place = on_gpu(case, 1)
        return Verdict(NO, place, _need(place.device, gpu, "even the output layer alone"))
    place = on_gpu(case, ngl)
    if not _within(place.host, ram):
        assert place.host is not None
        left = case.spec.n_layers - place.blocks
        return Verdict(NO, place, _need(place.host, ram, f"with -ngl {ngl}, RAM for the {left} "
                                                         "layers left on the CPU"))
    if ngl == case.full_ngl:
        return Verdict(FITS, place, _need(place.device, gpu, "full offload"))
    full = _need(on_gpu(case, case.full_ngl).device, gpu, "full offload")
    return Verdict(PARTIAL, place, f"{full}: {place.blocks} of {case.spec.n_layers} layers fit")


def _full(case: Case) -> int | None:
    return case.full_ngl if case.rules.layer_split else None


def fits_whole(case: Case, budget: Budget, ram: Budget) -> bool:
    """The whole model on this device (GPU: full offload, and its host side fits in RAM)."""
    if budget.kind == "cpu":
        return _within(on_cpu(case).device, budget)
    place = on_gpu(case, _full(case))
    return _within(place.device, budget) and _within(place.host, ram)


def largest_ctx(case: Case, fits: Callable[[Case], bool]) -> tuple[int | None, bool]:
    """(largest context that fits, whether that is the model's own limit).

    Memory grows with the context, so a bisection over multiples of llama.cpp's 256-cell KV
    granularity finds it; a model without a trained context is searched up to MAX_CTX.
    """
    cap = case.spec.ctx_max if case.spec.ctx_max > 0 else MAX_CTX
    if fits(case.with_ctx(cap)):
        return cap, case.spec.ctx_max > 0
    lo, hi = 0, cap // CTX_PAD  # invariant: lo fits (0 = nothing), hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(case.with_ctx(mid * CTX_PAD)):
            lo = mid
        else:
            hi = mid
    return (lo * CTX_PAD or None), False


@dataclass
class DeviceFit:
    budget: Budget
    verdict: str
    placement: Placement
    reason: str
    n_layers: int
    max_ctx: int | None  # largest context with the whole model on this device
    max_ctx_is_model_limit: bool
    quants: list[str] = field(default_factory=list)  # that fit whole at the requested ctx
    runtime_notes: list[str] = field(default_factory=list)
    # a MoE model that a GPU cannot hold whole: experts on the CPU, the rest on the GPU
    expert_offload: ExpertOffload | None = None

    @property
    def verdict_text(self) -> str:
        return VERDICT_TEXT[self.verdict](self)

    def to_dict(self) -> dict[str, Any]:
        b = self.budget
        return {"device": b.device, "kind": b.kind, "name": b.name, "available": b.available,
                "available_basis": b.basis, "verdict": self.verdict,
                "verdict_text": self.verdict_text, "reason": self.reason,
                "n_layers": self.n_layers, "placement": self.placement.to_dict(),
                "max_ctx": self.max_ctx, "max_ctx_is_model_limit": self.max_ctx_is_model_limit,
                "quants_that_fit": self.quants, "notes": self.runtime_notes,
                "expert_offload": self.expert_offload.to_dict() if self.expert_offload
                else None}


def _partial_text(row: DeviceFit) -> str:
    p = row.placement
    head = " + output layer" if p.output else ""
    return f"fits with {p.blocks} of {row.n_layers} layers{head} on the GPU (-ngl {p.ngl})"


def _fits_text(row: DeviceFit) -> str:
    if row.placement.ngl is None:
        return "fits"
    return "fits (-ngl 0, CPU only)" if row.budget.kind == "cpu" else \
        f"fits: all {row.n_layers} layers + output on the GPU (-ngl {row.placement.ngl})"


VERDICT_TEXT: dict[str, Callable[[DeviceFit], str]] = {
    FITS: _fits_text,
    PARTIAL: _partial_text,
    NO: lambda row: "does not fit",
    UNKNOWN: lambda row: "unknown (memory size not probed)",
}


def evaluate(case: Case, budget: Budget, ram: Budget,
             quant_cases: dict[str, Case], runtime: Runtime) -> DeviceFit:
    """Verdict, largest context and fitting quantisations of one device."""
    v = cpu_verdict(case, budget) if budget.kind == "cpu" else gpu_verdict(case, budget, ram)

    def fits_here(c: Case) -> bool:
        return budget.available is not None and fits_whole(c, budget, ram)

    max_ctx, at_limit = largest_ctx(case, fits_here) if budget.available is not None \
        else (None, False)
    quants = [q for q, qc in quant_cases.items() if fits_here(qc)]
    return DeviceFit(budget, v.verdict, v.placement, v.reason, case.spec.n_layers, max_ctx,
                     at_limit, quants, list(runtime.notes))
