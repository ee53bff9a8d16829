"""Weight bytes of a model at other storage types, from metadata only.

A synthetic preset is exact at every listed quantisation (the writer's own tensor plan, no
file written). A GGUF or Hugging Face model is exact at its own storage type and estimated at
the others from its tensors' element counts: matrices at the quantisation's bytes per weight
(q8_0 34/32, q4_0 18/32, f16 2, f32 4; a matrix whose rows are not whole blocks falls back to
f16, as llama.cpp's quantizer does), 1-D tensors (norms, biases) and a mixture of experts'
router (ffn_gate_inp, which llama.cpp's quantizer never quantises) at f32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from strata.models.source import ResolvedModel
from strata.models.spec import ModelSpec, TensorInfo
from strata.models.synthetic import QUANTS, STORAGES, SyntheticModel, parse_ref

# Storage-type names of the float dtypes a torch model runs in.
FLOAT_STORAGE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_FLOAT_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


@dataclass(frozen=True)
class QuantSpec:
    quant: str  # "f32", "f16", "q8_0", "q4_0"
    spec: ModelSpec
    exact: bool  # False: estimated from element counts


ROUTER = ".ffn_gate_inp.weight"  # MoE router: kept at F32 (llama-quantize skips it)


def _storage_for(t: TensorInfo, quant: str) -> tuple[str, int]:
    q = QUANTS[quant]
    if len(t.shape) < 2 or t.name.endswith(ROUTER):
        return "F32", STORAGES["F32"].nbytes(t.elements)
    matrix = STORAGES[q.matrix]
    storage = matrix if t.shape[-1] % matrix.block == 0 else STORAGES[q.fallback]
    return storage.name, storage.nbytes(t.elements)


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


def at_quant(model: ResolvedModel, spec: ModelSpec, quant: str) -> QuantSpec:
    """The model's GGUF weights at `quant`: exact where the source knows, else estimated."""
    exact = EXACT_AT.get(model.kind)
    if exact is not None:
        return QuantSpec(quant, exact(model, quant), True)
    if spec.main_dtype() == QUANTS[quant].matrix:
        return QuantSpec(quant, spec, True)
    return QuantSpec(quant, requantised(spec, quant), False)
