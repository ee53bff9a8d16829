"""PyTorch + transformers: Hugging Face directories and GGUF (dequantised), on CPU/CUDA/MPS."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strata.backends.base import BackendDescriptor, LoadConfig, Scoring
from strata.models.source import ResolvedModel

if TYPE_CHECKING:
    from strata.fit.backends import BackendRules, Runtime
    from strata.fit.weights import QuantSpec
    from strata.hardware.profile import HostProfile
    from strata.models.spec import ModelSpec

# Checkpoint storage -> the float dtype it stands for; transformers dequantises a quantised
# GGUF to float16 (the torch backend counts it so).
CHECKPOINT_DTYPE = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _device(config: LoadConfig) -> str:
    # The torch backend reports the device it resolved; this is only the fallback, and it
    # keeps the rule strata applied before descriptors existed (CPU unless layers offloaded).
    return "cuda:0" if config.n_gpu_layers > 0 else "cpu"


def _dtype(spec: ModelSpec, host: HostProfile, kind: str) -> tuple[str, str]:
    """(dtype, why): the torch backend's own "auto" rule, applied to the host being planned."""
    from strata.errors import InputError

    try:
        import torch

        from strata.backends.torch_backend import DTYPES, choose_dtype
    except ImportError as exc:
        raise InputError(f"--backend torch: PyTorch is not installed ({exc}); install the "
                         "extra: pip install 'strata[torch]'") from exc
    ckpt = CHECKPOINT_DTYPE.get(spec.main_dtype(), "float16")
    device = torch.device("cpu" if kind == "cpu" else "cuda")
    choice = choose_dtype("auto", device, DTYPES[ckpt], spec.weight_bytes(),
                          set(host.cpu.isa), host.cpu.ram_available_bytes or 0)
    return str(choice.dtype).removeprefix("torch."), choice.rule


def _runtime(model: ResolvedModel, host: HostProfile, kind: str,
             kv_type: str | None) -> Runtime:
    from strata.errors import InputError
    from strata.fit.backends import Runtime
    from strata.fit.weights import as_float

    if kv_type is not None:
        raise InputError(f"--kv-type {kv_type}: the torch backend keeps K/V in the model's "
                         "dtype; --kv-type applies to --backend llamacpp")
    spec = model.spec_for("hf") if "hf" in model.artefacts else model.spec
    assert spec is not None
    dtype, why = _dtype(spec, host, kind)
    return Runtime(as_float(spec, dtype), dtype, dtype, [f"torch on {kind}: {why}"])


def _quant(_model: ResolvedModel, rt: Runtime, quant: str) -> QuantSpec:
    from strata.fit.weights import QuantSpec, as_float

    dtype = {"f32": "float32", "f16": "float16"}[quant]
    return QuantSpec(quant, as_float(rt.spec, dtype), True)


def _fit() -> BackendRules:
    from strata.fit.backends import BackendRules
    from strata.fit.memory import TORCH_CPU, TORCH_GPU

    # torch runs weights unquantised: its choices are float dtypes (bf16 weighs as f16)
    return BackendRules("torch", (), ("f32", "f16"), False,
                        {"cpu": TORCH_CPU, "gpu": TORCH_GPU}, _runtime, _quant)


def _gguf_first(model: ResolvedModel) -> ResolvedModel:
    """The model restricted to its GGUF form when it has one: a synthetic model's safetensors
    hold *different* random weights, and a real model's GGUF is what was quantised."""
    if "gguf" not in model.artefacts:
        return model
    return ResolvedModel(ref=model.ref, kind=model.kind, spec=model.spec_for("gguf"),
                         model_name=model.model_name,
                         artefacts={"gguf": model.artefacts["gguf"]})


# quality: float32 on the CPU, so the figure measures the weights, not the arithmetic
SCORING = Scoring(config=lambda _ctx: LoadConfig(device="cpu", dtype="float32"),
                  form=_gguf_first)

def _check(model: ResolvedModel) -> str | None:
    """A GGUF (and no Hugging Face copy) whose architecture strata's GGUF loader for torch
    cannot map onto a transformers class (strata.models.gguf_torch.ARCHS' rule)."""
    if "hf" in model.artefacts or "gguf" not in model.artefacts:
        return None
    from strata.models import arch

    spec = model.spec_for("gguf") or model.spec
    found = arch.find(spec.arch) if spec is not None else None
    if spec is None or (found is not None and found.model_type and found.experts != "always"):
        return None
    return (f"strata's GGUF loader for torch does not run {spec.arch} (no transformers class "
            "for it from a GGUF); --backend llamacpp runs it")


DESCRIPTOR = BackendDescriptor(
    name="torch", factory="strata.backends.torch_backend:TorchBackend", accepts=("hf", "gguf"),
    help="Hugging Face dir or GGUF through PyTorch/transformers", order=20,
    options=("threads", "device", "dtype"), device=_device, fit=_fit, scoring=SCORING,
    check=_check)
