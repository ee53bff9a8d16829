"""A synthetic model as a Hugging Face directory: config.json from the preset and
safetensors of random weights, streamed like the GGUF writer."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.errors import InputError
from strata.models.hf import hf_name
from strata.models.synthetic import (
    BOS_ID,
    EOS_ID,
    PREFIX,
    QUANTS,
    RandomPool,
    SyntheticModel,
    TensorPlan,
    _stream_tensor,
)


@dataclass(frozen=True)
class HfArch:
    """What transformers needs to know an architecture by."""

    architecture: str
    model_type: str
    extra: dict[str, Any]
    moe_style: str = "mlp"  # how the checkpoint names experts (hf.MOE_STYLES)
    expert_count_key: str = "num_experts"  # config.json's routed-expert count
    expert_ffn_key: str | None = "moe_intermediate_size"  # None: intermediate_size says


HF_ARCHS: dict[str, HfArch] = {
    "llama": HfArch("LlamaForCausalLM", "llama", {"mlp_bias": False}),
    "qwen2": HfArch("Qwen2ForCausalLM", "qwen2",
                    {"use_sliding_window": False, "sliding_window": None}),
    "qwen3": HfArch("Qwen3ForCausalLM", "qwen3",
                    {"use_sliding_window": False, "sliding_window": None}),
    "phi3": HfArch("Phi3ForCausalLM", "phi3", {"resid_pdrop": 0.0, "embd_pdrop": 0.0,
                                                "attention_dropout": 0.0, "pad_token_id": None}),
    # Gemma's norms multiply by 1 + w: the written ones are 2 there (random weights anyway)
    "gemma3": HfArch("Gemma3ForCausalLM", "gemma3_text",
                     {"hidden_activation": "gelu_pytorch_tanh", "rope_local_base_freq": 10000.0,
                      "final_logit_softcapping": None, "attn_logit_softcapping": None}),
}
# Mixture-of-experts presets, by llama.cpp arch: a llama arch with experts is Mixtral.
HF_MOE_ARCHS: dict[str, HfArch] = {
    "llama": HfArch("MixtralForCausalLM", "mixtral",
                    {"sliding_window": None, "output_router_logits": False,
                     "router_aux_loss_coef": 0.02}, moe_style="block_sparse_moe",
                    expert_count_key="num_local_experts", expert_ffn_key=None),
    "qwen3moe": HfArch("Qwen3MoeForCausalLM", "qwen3_moe",
                       {"decoder_sparse_step": 1, "mlp_only_layers": [],
                        "norm_topk_prob": True, "use_sliding_window": False,
                        "sliding_window": None, "output_router_logits": False,
                        "router_aux_loss_coef": 0.001}),
    # experts fused as GptOss holds them (Arch.transformers_experts), router mlp.router
    "gpt-oss": HfArch("GptOssForCausalLM", "gpt_oss",
                      {"swiglu_alpha": 1.702, "swiglu_limit": 7.0, "output_router_logits": False,
                       "router_aux_loss_coef": 0.001},
                      expert_count_key="num_local_experts", expert_ffn_key=None),
}


def _moe_config(model: SyntheticModel, arch: HfArch) -> dict[str, Any]:
    p = model.preset
    if not p.is_moe:
        return {}
    ffn = {arch.expert_ffn_key or "intermediate_size": p.expert_ffn}
    return {arch.expert_count_key: p.n_experts, "num_experts_per_tok": p.n_experts_used, **ffn}


def _arch_config(model: SyntheticModel) -> dict[str, Any]:
    """The window, Gemma's query scale and the RoPE scaling, where the preset has them."""
    p, out = model.preset, {}
    if p.sliding_window:
        out.update(sliding_window=p.sliding_window, query_pre_attn_scalar=p.head_dim)
    if p.rope_scaling:
        out["rope_scaling"] = dict(p.rope_scaling)
        if "original_max_position_embeddings" in p.rope_scaling:  # Phi-3 reads it here
            out["original_max_position_embeddings"] = \
                p.rope_scaling["original_max_position_embeddings"]
    return out


def hf_arch(model: SyntheticModel) -> HfArch:
    p = model.preset
    arch = (HF_MOE_ARCHS if p.is_moe else HF_ARCHS).get(p.arch)
    if arch is None:
        known = HF_MOE_ARCHS if p.is_moe else HF_ARCHS
        raise InputError(f"{model.ref}: no Hugging Face layout for arch {p.arch!r}"
                         f"{' with experts' if p.is_moe else ''} (synthetic HF models "
                         f"support: {', '.join(known)})")
    return arch


_TORCH_DTYPE = {"F16": "float16", "F32": "float32"}


def hf_label(model: SyntheticModel) -> str:
    # Not model.ref: @q8_0 and @q4_0 share one F16 directory, so its bytes must not say
    # which of them wrote it.
    return f"{PREFIX}{model.preset.name} ({QUANTS[model.quant].hf} weights)"


def hf_config(model: SyntheticModel) -> dict[str, Any]:
    p, arch = model.preset, hf_arch(model)
    return {
        "architectures": [arch.architecture], "model_type": arch.model_type,
        "hidden_size": p.hidden, "intermediate_size": p.ffn,
        "num_hidden_layers": p.n_layers, "num_attention_heads": p.n_heads,
        "num_key_value_heads": p.n_kv_heads, "head_dim": p.head_dim,
        "vocab_size": p.vocab, "max_position_embeddings": p.ctx_max,
        "rms_norm_eps": p.norm_eps, "rope_theta": p.rope_theta,
        "tie_word_embeddings": p.tied_embeddings, "attention_bias": p.qkv_bias,
        "hidden_act": "silu", "torch_dtype": _TORCH_DTYPE[QUANTS[model.quant].hf],
        "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "use_cache": True,
        "strata_synthetic": hf_label(model), **arch.extra, **_moe_config(model, arch),
        **_arch_config(model),
    }


def safetensors_header(tensors: Sequence[TensorPlan], metadata: dict[str, str],
                       moe_style: str = "mlp", names: dict[str, str] | None = None) -> bytes:
    """8-byte length + JSON header (padded with spaces to 8 bytes, as safetensors does)."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for t in tensors:
        header[hf_name(t.name, moe_style, names)] = {
            "dtype": t.storage.name, "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob


def _names(model: SyntheticModel) -> dict[str, str]:
    from strata.models import arch

    return dict(arch.get(model.preset.arch).transformers_names)


def write_hf(model: SyntheticModel, folder: Path) -> None:
    tensors, style = model.hf_tensors(), hf_arch(model).moe_style
    (folder / "config.json").write_text(json.dumps(hf_config(model), indent=2) + "\n")
    pool = RandomPool(model.seed("hf"), max(t.nbytes for t in tensors))
    with open(folder / "model.safetensors", "wb") as out:
        out.write(safetensors_header(tensors, {"format": "pt",
                                               "strata_synthetic": hf_label(model)}, style,
                                     _names(model)))
        for t in tensors:
            _stream_tensor(out, t, pool)
