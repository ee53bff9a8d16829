"""A GGUF as a transformers model in PyTorch, read by strata's own bounds-checked reader.

transformers' GGUF loading refuses valid files (a pad token id of 0xFFFFFFFF: "Padding_idx must
be within num_embeddings") and hides what it does to the weights. Here every step is ours and
visible:

  * the header is walked and validated by strata.models.gguf (one InputError line when it is
    damaged); each tensor's bytes are read bounds-checked and dequantised to float32 by gguf-py
    (`gguf.quants.dequantize`, the reference implementation of every GGML block format);
  * the transformers config is built from the GGUF metadata alone (head counts, head size,
    rope base and scaling, RMS-norm epsilon, special token ids that exist in the vocabulary);
  * llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute) reorders the rows of
    attn_q / attn_k of the `llama` architecture so its RoPE can rotate adjacent pairs:
        w.reshape(n_head, 2, head_dim // 2, *rest).swapaxes(1, 2).reshape(w.shape)
    with n_head = the KV head count for attn_k. transformers rotates half-split pairs, so the
    permutation is undone here (qwen2 files are written unpermuted: llama.cpp uses NEOX RoPE);
  * with no output.weight the head is tied to token_embd.weight (what llama.cpp does);
  * `rope_freqs.weight` (Llama 3.x frequency factors) divides the rotary frequencies, as
    ggml's rope does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from strata.errors import InputError
from strata.models.arch.spec import ROPE_FREQS, ROPE_LONG, ROPE_SHORT
from strata.models.gguf import (
    Shard,
    read_tensor_bytes,
    scan_or_input_error,
    shards,
    spec_from_layout,
)
from strata.models.spec import ModelSpec


@dataclass(frozen=True)
class ArchRule:
    """How one llama.cpp architecture maps onto a transformers model class."""

    model_type: str  # transformers' AutoConfig key
    permuted_qk: bool  # did llama.cpp's converter permute the Q/K rows?
    extra: dict[str, Any] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # transformers' own layer names
    norm_offset: float = 0.0  # added to every norm weight by the converter (Gemma's 1)
    windowed: bool = False  # some layers see a sliding window (the file says how wide)


def rule_of(a: Any) -> ArchRule:
    """The transformers-side rule of a declared architecture (strata.models.arch)."""
    return ArchRule(a.model_type or a.name, a.permuted_qk, dict(a.transformers_extra),
                    dict(a.transformers_names), a.norm_offset, a.swa_pattern is not None)


def _transformers_archs() -> dict[str, ArchRule]:
    """The declared architectures (strata.models.arch) a transformers class runs from a
    dense GGUF: every one with a model_type whose layers are not all experts."""
    from strata.models import arch

    return {name: rule_of(arch.get(name)) for name in arch.names()
            if arch.get(name).model_type and arch.get(name).experts != "always"}


ARCHS: dict[str, ArchRule] = _transformers_archs()


@dataclass
class GgufWeights:
    """Everything a transformers model needs from one GGUF: config values and float32 tensors
    under transformers' names (Q/K already unpermuted)."""

    path: Path
    spec: ModelSpec
    rule: ArchRule
    config: dict[str, Any]
    tensors: dict[str, np.ndarray]
    rope_freqs: np.ndarray | None = None
    stored: dict[str, str] = field(default_factory=dict)  # transformers name -> GGML type


# -- metadata --------------------------------------------------------------------------------


def float_key(kv: dict[str, Any], key: str, default: float) -> float:
    value = kv.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"GGUF metadata {key} = {value!r} is not a number")
    return float(value)


def _token_id(kv: dict[str, Any], key: str, vocab: int) -> int | None:
    """A special token id that exists in the vocabulary; llama.cpp ignores ids outside it
    (converters write 0xFFFFFFFF for "none"), so do we."""
    value = kv.get(f"tokenizer.ggml.{key}")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
        return None
    return value


def _rope_scaling(path: Path, kv: dict[str, Any], arch: str) -> dict[str, Any] | None:
    kind = kv.get(f"{arch}.rope.scaling.type", "none")
    factor = float_key(kv, f"{arch}.rope.scaling.factor", 0.0)
    if kind == "none" or (kind in ("linear", "yarn") and factor in (0.0, 1.0)):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":  # llama.cpp's defaults where the file says nothing
        original = kv.get(f"{arch}.rope.scaling.original_context_length") or \
            kv.get(f"{arch}.context_length")
        if not isinstance(original, int) or original <= 0:
            raise InputError(f"MODEL {path}: YaRN scaling without an original context length "
                             f"({arch}.rope.scaling.original_context_length)")
        return {"rope_type": "yarn", "factor": factor,
                "original_max_position_embeddings": original,
                "beta_fast": float_key(kv, f"{arch}.rope.scaling.yarn_beta_fast", 32.0),
                "beta_slow": float_key(kv, f"{arch}.rope.scaling.yarn_beta_slow", 1.0)}
    raise InputError(f"MODEL {path}: rope scaling {kind!r} is not supported by strata's GGUF "
                     "loader for torch; use --backend llamacpp")


def llama_config(path: Path, spec: ModelSpec, kv: dict[str, Any], rule: ArchRule,
            vocab: int, biases: bool) -> dict[str, Any]:
    arch = spec.arch
    if spec.n_kv_heads == 0 or spec.n_heads % spec.n_kv_heads:
        raise InputError(f"MODEL {path}: {spec.n_heads} attention heads cannot be shared by "
                         f"{spec.n_kv_heads} KV heads")
    rope_dims = kv.get(f"{arch}.rope.dimension_count", spec.head_dim)
    if rope_dims != spec.head_dim:  # transformers' Llama rotates the whole head
        raise InputError(f"MODEL {path}: RoPE over {rope_dims} of {spec.head_dim} head "
                         "dimensions is not supported by strata's GGUF loader for torch; use "
                         "--backend llamacpp")
    add_bos = kv.get("tokenizer.ggml.add_bos_token", True)
    return {
        "model_type": rule.model_type,
        "vocab_size": vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn,
        "num_hidden_layers": spec.n_layers,
        "num_attention_heads": spec.n_heads,
        "num_key_value_heads": spec.n_kv_heads,
        "head_dim": spec.head_dim,
        # 0 = the file does not say; nothing in the forward pass depends on it without scaling
        "max_position_embeddings": spec.ctx_max or 1 << 20,
        "rms_norm_eps": float_key(kv, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": float_key(kv, f"{arch}.rope.freq_base", 10000.0),
        "rope_scaling": _rope_scaling(path, kv, arch),
        "tie_word_embeddings": spec.tied_embeddings,
        "attention_bias": biases,
        "bos_token_id": _token_id(kv, "bos_token_id", vocab) if add_bos is not False else None,
        "eos_token_id": _token_id(kv, "eos_token_id", vocab),
        "pad_token_id": _token_id(kv, "padding_token_id", vocab),
        **_windowed(spec, rule),
        **rule.extra,
    }


def _windowed(spec: ModelSpec, rule: ArchRule) -> dict[str, Any]:
    """transformers' keys of a sliding-window architecture: the window, and Gemma's query
    scale (query_pre_attn_scalar^-1/2 = the head size's, as llama.cpp scales them)."""
    if not rule.windowed:
        return {}
    return {"sliding_window": spec.sliding_window or None,
            "query_pre_attn_scalar": spec.head_dim}


# -- tensors ---------------------------------------------------------------------------------


def hf_name(path: Path, name: str, names: dict[str, str] | None = None) -> str:
    """transformers' name for a GGUF tensor (`names`: the architecture's own); InputError
    for one the model has no place for."""
    from strata.models import hf

    parts = name.split(".", 2)
    layer = len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and \
        (parts[2] in hf.LAYER_NAMES or parts[2] in (names or {}))
    if name in hf.GLOBAL_NAMES or layer:
        return hf.hf_name(name, names=names)
    raise InputError(f"MODEL {path}: tensor {name!r} has no place in a transformers model "
                     "of this architecture (a mixture-of-experts or other variant?); use "
                     "--backend llamacpp")


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's converter permutation (see the module docstring): rows of each
    head go from llama.cpp's interleaved pairs back to transformers' half split."""
    rows = w.shape[0]
    if n_head <= 0 or rows % (2 * n_head):
        raise ValueError(f"{rows} rows are not {n_head} heads of an even size")
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def dequantize(path: Path, shard: Shard, index: int) -> tuple[np.ndarray, str]:
    """(float32 values in PyTorch's shape, GGML type name) of one tensor."""
    import gguf

    t = shard.layout.tensors[index]
    qtype = gguf.GGMLQuantizationType(t.type_id)  # scan() has checked the id is known
    raw = read_tensor_bytes(shard, index)
    shape = tuple(reversed(t.ne))
    if qtype == gguf.GGMLQuantizationType.F32:
        # a copy: the read buffer is immutable, and torch wants tensors it may write
        return raw.view(np.float32).reshape(shape).copy(), qtype.name
    if qtype == gguf.GGMLQuantizationType.F16:
        return raw.view(np.float16).astype(np.float32).reshape(shape), qtype.name
    try:  # one row of blocks per output row: gguf-py dequantises the last axis
        values = gguf.quants.dequantize(raw.reshape(_n_rows(shape), -1), qtype)
    except NotImplementedError:
        raise InputError(f"MODEL {path}: tensor {t.name!r} is stored as {qtype.name}, which "
                         "gguf-py cannot dequantise; use --backend llamacpp") from None
    return values.astype(np.float32, copy=False).reshape(shape), qtype.name


def _n_rows(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1


def _unpermute_qk(name: str, values: np.ndarray, spec: ModelSpec) -> np.ndarray:
    if ".self_attn.q_proj." in name:
        return unpermute_rows(values, spec.n_heads)
    if ".self_attn.k_proj." in name:
        return unpermute_rows(values, spec.n_kv_heads)
    return values


def read_gguf_weights(path: Path) -> GgufWeights:
    """Validate, map and dequantise every tensor of a Llama-family GGUF (split files too)."""
    layout, sizes = scan_or_input_error(path)
    arch = layout.kv.get("general.architecture")
    rule = ARCHS.get(arch) if isinstance(arch, str) else None
    if rule is None:  # before the metadata checks: other architectures name other keys
        raise InputError(f"MODEL {path}: strata's GGUF loader for torch runs the "
                         f"{', '.join(ARCHS)} architectures, not {arch}; use --backend "
                         "llamacpp, which runs GGUF natively")
    files = shards(path, layout, sizes)
    spec = spec_from_layout(path, layout, [p for s in files
                                           for p in zip(s.layout.tensors, s.sizes, strict=True)])
    tensors: dict[str, np.ndarray] = {}
    stored: dict[str, str] = {}
    rope_freqs, longrope = None, {}
    for shard in files:
        for i, t in enumerate(shard.layout.tensors):
            if t.name == ROPE_FREQS:
                rope_freqs = dequantize(path, shard, i)[0].reshape(-1)
                continue
            if t.name in _LONGROPE:
                longrope[_LONGROPE[t.name]] = dequantize(path, shard, i)[0].reshape(-1).tolist()
                continue
            name = hf_name(path, t.name, rule.names)
            values, stored[name] = dequantize(path, shard, i)
            if rule.norm_offset and t.name.endswith("norm.weight"):
                values = values - np.float32(rule.norm_offset)
            tensors[name] = _unpermute_qk(name, values, spec) if rule.permuted_qk else values
    embd = tensors.get("model.embed_tokens.weight")
    if embd is None or embd.ndim != 2:
        raise InputError(f"MODEL {path}: no 2-D token_embd.weight tensor")
    biases = any(n.endswith("_proj.bias") for n in tensors)
    config = llama_config(path, spec, layout.kv, rule, embd.shape[0], biases)
    if longrope:
        config.update(_longrope_config(path, spec, layout.kv, longrope))
    return GgufWeights(path, spec, rule, config, tensors, rope_freqs, stored)


# Phi-3's LongRoPE factor tensors -> transformers' rope_scaling keys
_LONGROPE = {ROPE_LONG: "long_factor", ROPE_SHORT: "short_factor"}


def _longrope_config(path: Path, spec: ModelSpec, kv: dict[str, Any],
                     factors: dict[str, list[float]]) -> dict[str, Any]:
    """transformers' LongRoPE config from the GGUF's factor tensors: its attention factor
    is √(1 + ln(max / original) / ln(original)), what Phi-3's converter wrote as
    rope.scaling.attn_factor. transformers picks the long factors by sequence length,
    llama.cpp by context size: the two agree while both stay within the original context."""
    original = kv.get(f"{spec.arch}.rope.scaling.original_context_length")
    if not isinstance(original, int) or original <= 0 or len(factors) != 2:
        raise InputError(f"MODEL {path}: LongRoPE factors without both sets and "
                         f"{spec.arch}.rope.scaling.original_context_length")
    factor = (spec.ctx_max or original) / original
    return {"rope_scaling": {"rope_type": "longrope", "factor": factor, **factors},
            "original_max_position_embeddings": original}


# -- the torch model -------------------------------------------------------------------------


def build_model(weights: GgufWeights, device: Any, dtype: Any,
                attn_implementation: str = "sdpa") -> Any:
    """The transformers model holding `weights` on `device` in `dtype`, in eval mode.

    Built on the meta device and then handed the tensors (assign=True): the weights exist once
    in memory, never as a random initialisation plus a copy.
    """
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**weights.config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation=attn_implementation)
    state = {name: torch.from_numpy(values).to(device=device, dtype=dtype)
             for name, values in weights.tensors.items()}
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.unexpected_keys:
        raise InputError(f"MODEL {weights.path}: tensors the model has no place for: "
                         f"{', '.join(result.unexpected_keys[:3])}")
    if config.tie_word_embeddings:
        model.tie_weights()
    _rotary_on(model, device, weights.rope_freqs)
    _scalar_buffers(model, device)
    missing = [n for n, p in [*model.named_parameters(), *model.named_buffers()] if p.is_meta]
    if missing:
        raise InputError(f"MODEL {weights.path}: the GGUF lacks tensors a {weights.spec.arch} "
                         f"model needs: {', '.join(missing[:3])}")
    return model.eval()


def _scalar_buffers(model: Any, device: Any) -> None:
    """Computed scalar buffers left on meta (Gemma's embedding scale, √hidden): transformers
    keeps each one's value beside it as `scalar_<name>`."""
    import torch

    for module in model.modules():
        for name, buf in list(module.named_buffers(recurse=False)):
            scalar = getattr(module, f"scalar_{name}", None)
            if buf is not None and buf.is_meta and isinstance(scalar, (int, float)):
                setattr(module, name, torch.tensor(scalar, device=device))


def _rotary_on(model: Any, device: Any, freq_factors: np.ndarray | None) -> None:
    """The rotary embedding's frequencies are computed buffers, not weights: compute them on
    the real device (they were left on meta), divided by the GGUF's frequency factors."""
    import torch

    inner = model.model
    with torch.device(device):  # the constructor's own device argument varies by release
        rotary = type(inner.rotary_emb)(config=model.config)
    if freq_factors is not None:
        factors = torch.from_numpy(freq_factors.astype(np.float32)).to(device)
        if factors.shape != rotary.inv_freq.shape:
            raise InputError(f"{ROPE_FREQS}: {factors.numel()} factors for "
                             f"{rotary.inv_freq.numel()} rotary frequencies")
        rotary.inv_freq = rotary.inv_freq / factors
        if hasattr(rotary, "original_inv_freq"):
            rotary.original_inv_freq = rotary.inv_freq
    inner.rotary_emb = rotary


def load_gguf_model(path: Path, device: Any, dtype: Any,
                    attn_implementation: str = "sdpa") -> tuple[Any, GgufWeights]:
    """(model, what was read) for a Llama-family GGUF; InputError lines for any bad file."""
    weights = read_gguf_weights(path)
    model = build_model(weights, device, dtype, attn_implementation)
    weights.tensors.clear()  # the model holds them now (as torch tensors in `dtype`)
    return model, weights
