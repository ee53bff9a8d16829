"""Weight bytes of a model at other storage types, from metadata only.

llama.cpp's mixes (Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q4_0, Q3_K_M, Q2_K, F16) are exact for any
model whose tensors carry llama.cpp's names (a GGUF file, a synthetic preset): llama.cpp's own
per-tensor rules (models/mixes.py) give every tensor's type from names and shapes, and the
type gives its bytes. Other sources (a Hugging Face checkpoint's names) and other types
(f32) are estimated from element counts: matrices at the type's bytes per weight (a matrix
whose rows are not whole blocks at the type llama.cpp falls back to), 1-D tensors (norms,
biases) and a mixture of experts' router (ffn_gate_inp, which llama.cpp's quantizer never
quantises) at f32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from strata.models import mixes
from strata.models.source import ResolvedModel
from strata.models.spec import ModelSpec, TensorInfo
from strata.models.synthetic import QUANTS, SyntheticModel, parse_ref

# Storage-type names of the float dtypes a torch model runs in.
FLOAT_STORAGE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_FLOAT_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


@dataclass(frozen=True)
class QuantSpec:
    quant: str  # "f32", "f16", "q8_0", "q4_k_m", ...
    spec: ModelSpec
    exact: bool  # False: estimated from element counts


ROUTER = ".ffn_gate_inp.weight"  # MoE router: kept at F32 (llama-quantize skips it)


def _storage_for(t: TensorInfo, quant: str) -> tuple[str, int]:
    q = QUANTS[quant]
    if len(t.shape) < 2 or t.name.endswith(ROUTER):
        return "F32", mixes.nbytes("F32", t.elements)
    dtype = q.matrix if t.shape[-1] % mixes.BLOCKS[q.matrix][0] == 0 else q.fallback
    return dtype, mixes.nbytes(dtype, t.elements)


def requantised(spec: ModelSpec, quant: str) -> ModelSpec:
    """`spec` with every tensor re-stored at `quant` (an estimate: same shapes, new types)."""
    tensors = []
    for t in spec.tensors:
        dtype, nbytes = _storage_for(t, quant)
        tensors.append(TensorInfo(t.name, t.shape, dtype, nbytes))
    return replace(spec, tensors=tensors, notes=[*spec.notes, f"weights estimated at {quant}"])


def as_float(spec: ModelSpec, dtype: str) -> ModelSpec:
    """`spec` held entirely in a float dtype ("float32", "bfloat16", ...), as torch holds it."""
    storage = FLOAT_STORAGE[dtype]
    size = _FLOAT_BYTES[storage]
    tensors = [TensorInfo(t.name, t.shape, storage, t.elements * size) for t in spec.tensors]
    return replace(spec, tensors=tensors)


def _synthetic(model: ResolvedModel, quant: str) -> ModelSpec:
    preset = parse_ref(model.ref).preset
    return SyntheticModel(preset, quant).gguf_spec()  # the tensor plan only: nothing is written


# Sources that know their exact bytes at any quantisation; others are estimated.
EXACT_AT: dict[str, Callable[[ResolvedModel, str], ModelSpec]] = {"synthetic": _synthetic}


def _llama_names(spec: ModelSpec) -> bool:
    """Tensors named as llama.cpp names them (blk.N.attn_v.weight): its rules apply."""
    return any(t.name.startswith("blk.") for t in spec.tensors)


def at_mix(spec: ModelSpec, mix: mixes.Mix) -> ModelSpec:
    """`spec` stored as llama-quantize would store it at `mix` (exact: llama.cpp's rules)."""
    if spec.file_type == mix.name:
        return spec  # as stored
    return replace(spec, tensors=mixes.requantised(spec, mix), file_type=mix.name,
                   notes=[*spec.notes, f"weights at {mix.name} by llama.cpp's per-tensor rules"])


def at_quant(model: ResolvedModel, spec: ModelSpec, quant: str) -> QuantSpec:
    """The model's GGUF weights at `quant`: exact where the source or llama.cpp's rules
    know, else estimated."""
    exact = EXACT_AT.get(model.kind)
    if exact is not None:
        return QuantSpec(quant, exact(model, quant), True)
    mix = mixes.MIXES.get(quant)
    if mix is not None and _llama_names(spec):
        return QuantSpec(quant, at_mix(spec, mix), True)
    if spec.quant_label() == QUANTS[quant].matrix:
        return QuantSpec(quant, spec, True)
    return QuantSpec(quant, requantised(spec, quant), False)
