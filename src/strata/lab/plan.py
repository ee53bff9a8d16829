"""Planning for `-B lab`: which verified kernel would serve each op of a model on a device,
and which ops have none — from the model's metadata and the stored verdicts alone (nothing is
loaded, built or verified; docs/architecture.md §7 dispatch).

    ops, unread = ops_for(["Q8_0", "F32"])      # the lab ops, the storage types none reads
    cov = coverage(spec, "rocm:0", host)        # host: a KernelHost
    cov.verdict  # "runs on lab kernels" | "runs here once these kernels exist: ..."

Works on a recorded probe too (a RecordedHost: HostCaps of a GPU that is not here), so
`strata fit MODEL -B lab` can say what a device the vendor stack cannot drive still lacks.
No torch import here: `strata fit` plans without loading anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from strata.errors import InputError
from strata.kernels.dispatch import FALLBACK, KERNEL, VENDOR, Decision, resolve
from strata.models.spec import ModelSpec

if TYPE_CHECKING:
    from strata.fit.backends import FitSection
    from strata.kernels.capability import KernelHost
    from strata.models.source import ResolvedModel

# GGML storage type of a 2-D weight -> the lab op that multiplies activations by it
LINEAR_OPS = {"F32": "linear_f32", "F16": "linear_f16", "Q8_0": "linear_q8_0",
              "Q4_0": "linear_q4_0", "Q5_0": "linear_q5_0", "Q4_1": "linear_q4_1",
              "Q5_1": "linear_q5_1", "Q4_K": "linear_q4_K", "Q5_K": "linear_q5_K",
              "Q6_K": "linear_q6_K", "MXFP4": "linear_mxfp4"}
# storage types -B lab repacks at load into strata's x8 layout (kernels/ops/_kquant_x8.py)
# where a SIMD x8 kernel serves (engine/ops_lab.py: repacks), and the op multiplying by each
REPACKED = {"Q4_K": "Q4_Kx8", "Q6_K": "Q6_Kx8"}
X8_OPS = {"Q4_Kx8": "linear_q4_Kx8", "Q6_Kx8": "linear_q6_Kx8"}


def linear_op(kind: str) -> str:
    """The lab op multiplying by a weight held as `kind` (a file type or an x8 layout)."""
    return X8_OPS.get(kind) or LINEAR_OPS[kind]

# the ops every layer runs whatever the weights' types (a Llama's; layer_ops: any arch's)
LAYER_OPS = ("rmsnorm", "rope", "attention_cached", "silu_mul")
# activation of a gated MLP -> the lab op that computes act(gate) * up
GLU_OPS = {"silu": "silu_mul", "gelu": "gelu_mul", "swiglu_oai": "swiglu_oai"}
WINDOW_OP = "attention_window"  # the sliding-window layers' attention
SINK_OP = "attention_sinks"  # gpt-oss's attention (sinks; windowed or not), every layer's
# K/V cache element type (llama.cpp's -ctk/-ctv names) -> the suffix of the attention ops
# that read such a cache
KV_CACHE_OPS = {"f32": "", "f16": "_f16", "q8_0": "_q8_0"}


def attention_op(sinks: bool, windowed: bool, kv: str = "f32") -> str:
    """The attention op of a layer: with sinks (either kind of layer), windowed, or plain
    causal — over a cache of element type `kv` (a KV_CACHE_OPS key)."""
    base = SINK_OP if sinks else WINDOW_OP if windowed else "attention_cached"
    if kv not in KV_CACHE_OPS:
        raise InputError(f"K/V cache type {kv}: the lab's attention reads a "
                         f"{', '.join(KV_CACHE_OPS)} cache")
    return base + KV_CACHE_OPS[kv]


def layer_ops(arch: str | None = None, windowed: bool = False, kv: str = "f32") -> list[str]:
    """The ops every layer of architecture `arch` runs (a Llama's when it is not declared):
    its MLP's gate op, and the sliding-window attention where some layers are windowed (or
    the attention with sinks, which serves both kinds of layer), each attention op the one
    that reads a `kv` cache."""
    from strata.models import arch as registry

    a = registry.find(arch)
    glu = GLU_OPS.get(a.activation, "silu_mul") if a is not None else "silu_mul"
    out = [op if op != "silu_mul" else glu for op in LAYER_OPS]
    if a is not None and a.has("sinks"):
        out = [SINK_OP if op == "attention_cached" else op for op in out]
    elif windowed:
        out = [*out, WINDOW_OP]
    suffix = KV_CACHE_OPS[kv]
    return [op + suffix if op.startswith("attention_") else op for op in out]
# storage types of 1-D tensors (norms, biases) the loader widens to float32 itself
VECTOR_TYPES = ("F32", "F16")

NO_KERNEL_TORCH = "torch fallback (no verified kernel)"  # torch's op serves it here
NO_KERNEL = "none"  # and torch cannot run on this device either
# what an op's state is on a device
SERVED = "served"  # a verified kernel (or torch eager, faster than every verified one)
UNVERIFIED = "unverified"  # an implementation runs here but has no verdict yet
MISSING = "missing"  # nothing verified can run here: a kernel has to be written (or fixed)
RUNS = "runs on lab kernels"
ONCE = "runs here once these kernels exist"
VERIFY_HINT = "-B lab verifies the built-ins on first use, or: strata kernels verify OP"


def ops_for(types: Iterable[str], layer: Iterable[str] = LAYER_OPS
            ) -> tuple[list[str], list[str]]:
    """(lab ops a model whose 2-D weights have these storage types runs — `layer`'s ops,
    a Llama's by default — the storage types no lab op reads), in a stable order."""
    kinds = sorted(set(types))
    linear = [LINEAR_OPS[k] for k in kinds if k in LINEAR_OPS]
    return [*layer, *linear], [k for k in kinds if k not in LINEAR_OPS]


def matrix_types(spec: ModelSpec) -> list[str]:
    """Storage types of the model's 2-D weights (the embedding included: load() reads it)."""
    return [t.dtype for t in spec.tensors if len(t.shape) == 2]


@dataclass(frozen=True)
class OpPlan:
    """One op on one device: what would serve it, and why."""

    op: str
    kernel: str  # implementation name, "torch eager", NO_KERNEL_TORCH or NO_KERNEL
    outcome: str  # dispatch's kernel | vendor | fallback
    state: str  # SERVED | UNVERIFIED | MISSING
    why: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Coverage:
    """Every op a model needs on one device, and what stops it running there."""

    device: str
    ops: list[OpPlan]
    unread: list[str] = field(default_factory=list)  # storage types no lab op reads
    blockers: list[str] = field(default_factory=list)  # not about kernels (architecture)
    notes: list[str] = field(default_factory=list)  # the vendor stack's verdict on the device
    # optional ops: strata's own layouts of some types (REPACKED), used where they serve
    layouts: list[OpPlan] = field(default_factory=list)

    def _in(self, state: str) -> list[str]:
        return [p.op for p in self.ops if p.state == state]

    @property
    def missing(self) -> list[str]:
        """Ops no verified kernel can serve here, and none waits for a verdict."""
        return self._in(MISSING)

    @property
    def unverified(self) -> list[str]:
        return self._in(UNVERIFIED)

    @property
    def runs(self) -> bool:
        return not (self.missing or self.unverified or self.unread or self.blockers)

    @property
    def verdict(self) -> str:
        if self.blockers:
            return "does not run on lab: " + "; ".join(self.blockers)
        needs = [*self.missing, *(f"a lab op reading {t} weights" for t in self.unread)]
        pending = ", ".join(self.unverified)
        if needs:
            then = f"; and once these are verified: {pending}" if pending else ""
            return f"{ONCE}: {', '.join(needs)}{then}"
        if pending:
            return f"runs on lab kernels once these are verified: {pending} ({VERIFY_HINT})"
        return RUNS

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "verdict": self.verdict, "runs": self.runs,
                "ops": [p.to_dict() for p in self.ops],
                "layouts": [p.to_dict() for p in self.layouts], "missing": self.missing,
                "unverified": self.unverified, "unread_types": self.unread,
                "blockers": self.blockers, "notes": self.notes}


def _chosen(decision: Decision) -> tuple[str, str]:
    return SERVED, next((t.reason for t in decision.trace if t.verdict == "chosen"), "")


# rejection reason prefix -> the op's state, closest to serving first: an implementation
# waiting for its verdict, then one that failed it; anything else cannot run on the device
_REJECTED = {"not verified": UNVERIFIED, "failed verification": MISSING}


def _fallback(decision: Decision) -> tuple[str, str]:
    rejected = [t for t in decision.trace if t.verdict == "rejected"]
    for prefix, state in _REJECTED.items():
        entry = next((t for t in rejected if t.reason.startswith(prefix)), None)
        if entry is not None:
            return state, f"{entry.impl}: {entry.reason}"
    if not rejected:
        return MISSING, f"no implementation of {decision.op} exists"
    return MISSING, f"none of {len(rejected)} implementations runs on {decision.device} " \
                    f"({'; '.join(sorted({t.reason for t in rejected}))})"


def _kernel(decision: Decision) -> str:
    if decision.outcome == FALLBACK:
        # where the vendor stack cannot drive the device, torch's op is no stand-in either
        return NO_KERNEL if decision.notes else NO_KERNEL_TORCH
    return decision.chosen if decision.outcome == KERNEL else "torch eager"


# dispatch outcome -> (the op's state, why), from its decision
_WHY = {KERNEL: _chosen, VENDOR: _chosen, FALLBACK: _fallback}


def plan_op(op: str, device: str, host: KernelHost) -> tuple[OpPlan, list[str]]:
    """(what would serve `op` on `device`, the vendor stack's notes on the device)."""
    decision = resolve(op, device, host)
    state, why = _WHY[decision.outcome](decision)
    return OpPlan(op, _kernel(decision), decision.outcome, state, why), decision.notes


def _blockers(spec: ModelSpec) -> list[str]:
    from strata.models import arch

    out = []
    if arch.find(spec.arch) is None:
        out.append(f"the lab runs the {', '.join(arch.names())} architectures, not "
                   f"{spec.arch}")
    vectors = sorted({t.dtype for t in spec.tensors if len(t.shape) < 2} - set(VECTOR_TYPES))
    if vectors:
        out.append(f"1-D tensors stored as {', '.join(vectors)} (the lab reads "
                   f"{', '.join(VECTOR_TYPES)})")
    return out


def coverage(spec_or_types: ModelSpec | Iterable[str], device: str,
             host: KernelHost, kv: str = "f32") -> Coverage:
    """What would serve each op of the model on `device` (a dispatch device key: cpu,
    cuda:0, rocm:0) of `host` over a `kv` K/V cache, by the verdicts stored for it."""
    is_spec = isinstance(spec_or_types, ModelSpec)
    types = matrix_types(spec_or_types) if is_spec else list(spec_or_types)
    layer = layer_ops(spec_or_types.arch, spec_or_types.windowed_layers() > 0, kv) \
        if is_spec else layer_ops(kv=kv)
    ops, unread = ops_for(types, layer)
    cov = Coverage(device, [], unread, _blockers(spec_or_types) if is_spec else [])
    for op in ops:
        plan, notes = plan_op(op, device, host)
        cov.ops.append(plan)
        cov.notes = cov.notes or notes
    for kind in sorted(set(types) & set(REPACKED)):  # never a blocker: the file's op serves
        cov.layouts.append(plan_op(X8_OPS[REPACKED[kind]], device, host)[0])
    return cov


def host_coverage(spec: ModelSpec, host: KernelHost, kv: str = "f32") -> list[Coverage]:
    """Coverage on every device of the host (cpu first)."""
    return [coverage(spec, d.key, host, kv) for d in host.caps.devices]


# -- strata fit -B lab ----------------------------------------------------------------------

COLUMNS = ("op", "kernel", "why")


def section(cov: Coverage, ref: str) -> FitSection:
    from strata.fit.backends import FitSection

    lines = [*cov.notes, f"lab on {cov.device}: {cov.verdict}"]  # notes name the device
    optional = [(p.op, p.kernel, f"optional x8 layout (repacked at load): {p.state}")
                for p in cov.layouts]
    return FitSection(f"strata fit · {ref} · lab kernels on {cov.device}", COLUMNS,
                      [*((p.op, p.kernel, p.why) for p in cov.ops), *optional], lines,
                      {"coverage": cov.to_dict()})


def fit_sections(model: ResolvedModel, host: KernelHost, kv: str) -> list[FitSection]:
    """The op coverage of every device of this host over a `kv` K/V cache (the lab
    backend's `sections` rule)."""
    spec = model.spec_for("gguf")
    assert spec is not None  # the lab's runtime rule refused a model without a GGUF form
    return [section(c, model.ref) for c in host_coverage(spec, host, kv)]
