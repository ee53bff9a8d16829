"""What each backend does with a model's memory: one entry per backend in BACKENDS.

A backend's entry says which form of the model it reads, in which dtype it holds the weights
and K/V on each device kind, whether a GPU can hold part of the layers (llama.cpp's -ngl),
and the memory rules per device kind (strata.fit.memory).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from strata.errors import InputError
from strata.fit.memory import LLAMACPP_CPU, LLAMACPP_GPU, TORCH_CPU, TORCH_GPU, DeviceRules
from strata.fit.weights import QuantSpec, as_float, at_quant
from strata.hardware.profile import HostProfile
from strata.models.source import ResolvedModel
from strata.models.spec import ModelSpec

DEVICE_KINDS = ("cpu", "gpu")


@dataclass
class Runtime:
    """The model as a backend holds it on one device kind."""

    spec: ModelSpec
    kv_type: str  # element type of the K/V cache
    runtime_dtype: str | None  # dtype the weights are converted to (None: as stored)
    notes: list[str] = field(default_factory=list)


RuntimeFor = Callable[[ResolvedModel, HostProfile, str, str | None], Runtime]
QuantFor = Callable[[ResolvedModel, Runtime, str], QuantSpec]


@dataclass(frozen=True)
class BackendRules:
    name: str
    kv_types: tuple[str, ...]  # accepted --kv-type values; () = K/V in the model's dtype
    quants: tuple[str, ...]  # weight storage choices the backend runs
    layer_split: bool  # a GPU can hold some of the layers (llama.cpp -ngl)
    devices: dict[str, DeviceRules]  # device kind -> memory rules
    runtime: RuntimeFor
    quant: QuantFor


# -- llama.cpp --------------------------------------------------------------------------------


def _llamacpp_runtime(model: ResolvedModel, _host: HostProfile, _kind: str,
                      kv_type: str | None) -> Runtime:
    kv = kv_type or "f16"
    if "gguf" in model.artefacts:
        spec = model.spec_for("gguf")
        notes = []
    else:
        spec = model.spec
        notes = [f"llama.cpp reads GGUF: figures assume {model.ref} converted at its stored "
                 "types (convert_hf_to_gguf.py)"]
    assert spec is not None
    block = 32  # q8_0 and q4_0 quantise K/V rows of each head in 32-element blocks
    if kv != "f16" and spec.head_dim % block:
        raise InputError(f"--kv-type {kv}: llama.cpp cannot quantise this model's KV cache "
                         f"(head_dim {spec.head_dim} is not a multiple of the {kv} block, "
                         f"{block}); use --kv-type f16")
    return Runtime(spec, kv, None, notes)


def _llamacpp_quant(model: ResolvedModel, rt: Runtime, quant: str) -> QuantSpec:
    return at_quant(model, rt.spec, quant)


# -- torch ------------------------------------------------------------------------------------

# Checkpoint storage -> the float dtype it stands for; transformers dequantises a quantised
# GGUF to float16 (the torch backend counts it so).
_CHECKPOINT_DTYPE = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _torch_dtype(spec: ModelSpec, host: HostProfile, kind: str) -> tuple[str, str]:
    """(dtype, why): the torch backend's own "auto" rule, applied to the host being planned."""
    try:
        import torch

        from strata.backends.torch_backend import DTYPES, choose_dtype
    except ImportError as exc:
        raise InputError(f"--backend torch: PyTorch is not installed ({exc}); install the "
                         "extra: pip install 'strata[torch]'") from exc
    ckpt = _CHECKPOINT_DTYPE.get(spec.main_dtype(), "float16")
    device = torch.device("cpu" if kind == "cpu" else "cuda")
    choice = choose_dtype("auto", device, DTYPES[ckpt], spec.weight_bytes(),
                          set(host.cpu.isa), host.cpu.ram_available_bytes or 0)
    return str(choice.dtype).removeprefix("torch."), choice.rule


def _torch_runtime(model: ResolvedModel, host: HostProfile, kind: str,
                   kv_type: str | None) -> Runtime:
    if kv_type is not None:
        raise InputError(f"--kv-type {kv_type}: the torch backend keeps K/V in the model's "
                         "dtype; --kv-type applies to --backend llamacpp")
    spec = model.spec_for("hf") if "hf" in model.artefacts else model.spec
    assert spec is not None
    dtype, why = _torch_dtype(spec, host, kind)
    return Runtime(as_float(spec, dtype), dtype, dtype, [f"torch on {kind}: {why}"])


def _torch_quant(_model: ResolvedModel, rt: Runtime, quant: str) -> QuantSpec:
    dtype = {"f32": "float32", "f16": "float16"}[quant]
    return QuantSpec(quant, as_float(rt.spec, dtype), True)


BACKENDS: dict[str, BackendRules] = {
    "llamacpp": BackendRules("llamacpp", ("f16", "q8_0", "q4_0"), ("f32", "f16", "q8_0", "q4_0"),
                             True, {"cpu": LLAMACPP_CPU, "gpu": LLAMACPP_GPU},
                             _llamacpp_runtime, _llamacpp_quant),
    # torch runs weights unquantised: its choices are float dtypes (bf16 weighs as f16)
    "torch": BackendRules("torch", (), ("f32", "f16"), False,
                          {"cpu": TORCH_CPU, "gpu": TORCH_GPU}, _torch_runtime, _torch_quant),
}


def backend_rules(name: str) -> BackendRules:
    rules = BACKENDS.get(name)
    if rules is None:
        raise InputError(f"--backend {name}: fit plans for {', '.join(BACKENDS)}")
    return rules
