"""llama.cpp (llama-cpp-python): GGUF models, CPU with optional GPU layer offload (-ngl)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strata.backends.base import BackendDescriptor, LoadConfig, Scoring
from strata.models.source import ResolvedModel

if TYPE_CHECKING:
    from strata.fit.backends import BackendRules, Runtime
    from strata.fit.weights import QuantSpec
    from strata.hardware.profile import HostProfile

KV_BLOCK = 32  # q8_0 and q4_0 quantise K/V rows of each head in 32-element blocks


def _device(config: LoadConfig) -> str:
    # llama.cpp does not report where it ran; with any layer offloaded the decode runs at
    # the first GPU's speed, so that is the roofline to explain it against.
    return "cuda:0" if config.n_gpu_layers > 0 else "cpu"


def _runtime(model: ResolvedModel, _host: HostProfile, _kind: str,
             kv_type: str | None) -> Runtime:
    from strata.errors import InputError
    from strata.fit.backends import Runtime

    kv = kv_type or "f16"
    if "gguf" in model.artefacts:
        spec = model.spec_for("gguf")
        notes = []
    else:
        spec = model.spec
        notes = [f"llama.cpp reads GGUF: figures assume {model.ref} converted at its stored "
                 "types (convert_hf_to_gguf.py)"]
    assert spec is not None
    if kv != "f16" and spec.head_dim % KV_BLOCK:
        raise InputError(f"--kv-type {kv}: llama.cpp cannot quantise this model's KV cache "
                         f"(head_dim {spec.head_dim} is not a multiple of the {kv} block, "
                         f"{KV_BLOCK}); use --kv-type f16")
    return Runtime(spec, kv, None, notes)


def _quant(model: ResolvedModel, rt: Runtime, quant: str) -> QuantSpec:
    from strata.fit.weights import at_quant

    return at_quant(model, rt.spec, quant)


def _fit() -> BackendRules:
    from strata.fit.backends import BackendRules

    # what users choose between: llama.cpp's mixes, sized by its per-tensor rules
    from strata.fit.memory import LLAMACPP_CPU, LLAMACPP_GPU, llamacpp_window_cells
    from strata.models.mixes import MIXES

    return BackendRules("llamacpp", ("f16", "q8_0", "q4_0"), tuple(MIXES), True,
                        {"cpu": LLAMACPP_CPU, "gpu": LLAMACPP_GPU}, _runtime, _quant,
                        window_cells=llamacpp_window_cells)


# quality: the GGUF as llama.cpp runs it (quantised kernels, f16 KV cache: its defaults),
# context sized to --ctx
SCORING = Scoring(config=lambda ctx: LoadConfig(n_ctx=ctx, batch=max(ctx, 512)),
                  form=lambda model: model)

DESCRIPTOR = BackendDescriptor(
    name="llamacpp", factory="strata.backends.llamacpp:LlamaCppBackend", accepts=("gguf",),
    help="GGUF through llama.cpp", order=10,
    options=("threads", "n_gpu_layers", "batch", "ubatch", "flash_attn", "kv_type", "kv_type_v",
             "n_ctx"),
    device=_device, fit=_fit, scoring=SCORING)
