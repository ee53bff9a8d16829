"""The tensors and metadata of a synthetic preset, from its architecture's declaration.

Every layer holds the tensors its architecture declares (strata.models.arch): attention,
q/k/v biases where the preset has them, per-head q/k norms and Gemma's post-norms where the
architecture declares them, and the dense MLP or the routed experts (synthetic_moe). The
llama.cpp names are the declaration's, so a new architecture needs no change here.

What is not a weight is metadata llama.cpp reads: the sliding window of windowed layers and
the RoPE scaling (linear, YaRN, LongRoPE). Llama 3.x files carry their frequency factors as a
tensor, rope_freqs.weight, computed by llama.cpp's converter (convert_hf_to_gguf.py,
LlamaModel) from the config's rope_scaling; a preset with `"rope_type": "llama3"` gets the
same values.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from strata.models.arch.spec import EXPERT_ROLES, ROPE_FREQS, ROPE_LONG, ROPE_SHORT
from strata.models.presets import Preset
from strata.models.spec import OUTPUT, TOKEN_EMBD
from strata.models.synthetic_moe import Entry, moe_ffn_layout

# declared layer role -> its shape in a preset, PyTorch order (p: the preset)
_SHAPES = {
    "attn_norm": lambda p: (p.hidden,), "ffn_norm": lambda p: (p.hidden,),
    "attn_post_norm": lambda p: (p.hidden,), "ffn_post_norm": lambda p: (p.hidden,),
    "q": lambda p: (p.n_heads * p.head_dim, p.hidden),
    "k": lambda p: (p.n_kv_heads * p.head_dim, p.hidden),
    "v": lambda p: (p.n_kv_heads * p.head_dim, p.hidden),
    "o": lambda p: (p.hidden, p.n_heads * p.head_dim),
    "q_bias": lambda p: (p.n_heads * p.head_dim,),
    "k_bias": lambda p: (p.n_kv_heads * p.head_dim,),
    "v_bias": lambda p: (p.n_kv_heads * p.head_dim,),
    "o_bias": lambda p: (p.hidden,), "sinks": lambda p: (p.n_heads,),
    "q_norm": lambda p: (p.head_dim,), "k_norm": lambda p: (p.head_dim,),
    "qkv": lambda p: ((p.n_heads + 2 * p.n_kv_heads) * p.head_dim, p.hidden),
    "gate_up": lambda p: (2 * p.ffn, p.hidden),
    "gate": lambda p: (p.ffn, p.hidden), "up": lambda p: (p.ffn, p.hidden),
    "down": lambda p: (p.hidden, p.ffn),
}
# the order a layer's tensors are written in (llama.cpp's converters write this order; the
# files of the presets that predate the declarations keep their bytes)
_ORDER = ("attn_norm", "qkv", "q", "k", "v", "q_bias", "k_bias", "v_bias", "q_norm", "k_norm", "o",
          "o_bias", "sinks", "attn_post_norm", "ffn_norm", "gate_up", "gate", "up", "down",
          "router", "gate_exps", "up_exps", "down_exps", "router_bias", "gate_exps_bias",
          "up_exps_bias", "down_exps_bias", "ffn_post_norm")


def _role_kind(role: str) -> str:
    if role.endswith("_bias") or role == "sinks":  # float32 vectors, random values
        return "bias"
    return "norm" if role.endswith("norm") else "matrix"


def layout(p: Preset) -> list[Entry]:
    """(GGUF name, shape, role) of every tensor; role "matrix", "norm", "bias", "router" or
    "values" (written as computed: rope_freqs)."""
    from strata.models import arch as registry

    a = registry.get(p.arch, "a synthetic preset")
    out: list[Entry] = [(TOKEN_EMBD, (p.vocab, p.hidden), "matrix")]
    out += [(name, (p.head_dim // 2,), "values") for name in rope_values(p)]
    for i in range(p.n_layers):
        blk = f"blk.{i}."
        experts_done = False
        for x in sorted(a.roles(p.is_moe), key=lambda x: _ORDER.index(x.role)):
            if x.role.endswith("_bias") and not p.qkv_bias:
                continue
            if x.role in EXPERT_ROLES:
                if not experts_done:  # the router and the merged expert tensors at once
                    out += moe_ffn_layout(p, blk, a)
                    experts_done = True
                continue
            out.append((blk + x.suffix, _SHAPES[x.role](p), _role_kind(x.role)))
    out.append(("output_norm.weight", (p.hidden,), "norm"))
    if not p.tied_embeddings:  # tied: llama.cpp and transformers reuse token_embd as head
        out.append((OUTPUT, (p.vocab, p.hidden), "matrix"))
    return out


def rope_values(p: Preset) -> dict[str, np.ndarray]:
    """The computed RoPE tensors of a preset, by GGUF name: Llama 3's rope_freqs, or
    Phi-3's LongRoPE long and short factors (the config's lists, as its converter writes
    them)."""
    s = p.rope_scaling or {}
    if s.get("rope_type") == "longrope":
        return {ROPE_LONG: np.asarray(s["long_factor"], dtype=np.float32),
                ROPE_SHORT: np.asarray(s["short_factor"], dtype=np.float32)}
    factors = rope_factors(p)
    return {} if factors is None else {ROPE_FREQS: factors}


def rope_factors(p: Preset) -> np.ndarray | None:
    """Llama 3.x frequency factors (one per rotary pair) as llama.cpp's converter computes
    them: 1 for short wavelengths, `factor` for long ones, a smooth blend between."""
    s = p.rope_scaling or {}
    if s.get("rope_type") != "llama3":
        return None
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), \
        float(s["high_freq_factor"])
    old = float(s["original_max_position_embeddings"])
    freqs = 1.0 / (p.rope_theta ** (np.arange(0, p.head_dim, 2, dtype=np.float32)
                                    / p.head_dim))
    out = []
    for f in freqs.astype(np.float64):
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def add_arch_metadata(w: Any, p: Preset) -> None:
    """The sliding window and RoPE scaling keys of a gguf.GGUFWriter, where set: linear
    scaling's factor; LongRoPE's original context and attention factor
    √(1 + ln(scale) / ln(original)), scale = ctx_max / original, as Phi-3's converter writes
    them."""
    if p.sliding_window:
        w.add_sliding_window(p.sliding_window)
    s = p.rope_scaling or {}
    if s.get("rope_type") == "linear":
        w.add_rope_scaling_type(__import__("gguf").RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(s["factor"]))
    if s.get("rope_type") == "yarn":  # gpt-oss's converter writes these three
        w.add_rope_scaling_type(__import__("gguf").RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(s["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(s["original_max_position_embeddings"]))
    if s.get("rope_type") == "longrope":
        original = int(s["original_max_position_embeddings"])
        scale = p.ctx_max / original
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
