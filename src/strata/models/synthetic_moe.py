"""Mixture-of-experts layout of synthetic models: the tensors and metadata llama.cpp expects.

Two MoE layouts, as the vendored llama.cpp loads them (src/models/qwen3moe.cpp and the
expert branch of src/models/llama.cpp's load_arch_tensors):

  every MoE layer   blk.N.ffn_gate_inp.weight   router, (n_experts, hidden)
                    blk.N.ffn_gate_exps.weight  (n_experts, expert_ffn, hidden)   3-D: one
                    blk.N.ffn_up_exps.weight    (n_experts, expert_ffn, hidden)   slice per
                    blk.N.ffn_down_exps.weight  (n_experts, hidden, expert_ffn)   expert
  qwen3moe adds     blk.N.attn_q_norm.weight / attn_k_norm.weight  (head_dim,) per-head RMS norm
                    and has no dense FFN and no shared expert
  llama (Mixtral)   experts are feed_forward_length wide; no expert_feed_forward_length key

Metadata: {arch}.expert_count and {arch}.expert_used_count (both required by llama.cpp's
MoE archs), and {arch}.expert_feed_forward_length for qwen3moe, as llama.cpp's converter
writes them. The router stays F32 at every quant: the converter stores ffn_gate_inp as F32
and llama-quantize never quantises it (routing is sensitive to it); experts take the
quant like every other matrix.

A Hugging Face checkpoint stores one tensor per expert instead (Qwen3Moe:
mlp.experts.E.gate_proj, Mixtral: block_sparse_moe.experts.E.w1/w3/w2); inside strata such a
tensor is named blk.N.ffn_gate.E.weight (llama.cpp's old per-expert GGUF name).
"""

from __future__ import annotations

import re
from typing import Any

from strata.models.presets import Preset

# Layout entry: (GGUF name, shape in PyTorch order, role: "matrix", "norm", "bias", "router").
Entry = tuple[str, tuple[int, ...], str]

# Archs whose converter writes {arch}.expert_feed_forward_length (Mixtral's does not: its
# experts are feed_forward_length wide).
EXPERT_FFN_KEY_ARCHS = frozenset({"qwen3moe", "gpt-oss"})
# Archs llama.cpp runs with routed experts and strata can write.
MOE_ARCHS = frozenset({"llama", "qwen3moe", "gpt-oss"})
# gpt-oss's biases of the router and of every expert's matrices ([E, N] per matrix)
_BIAS_SHAPES = {"router_bias": lambda e, f, h: (e,), "gate_exps_bias": lambda e, f, h: (e, f),
                "up_exps_bias": lambda e, f, h: (e, f), "down_exps_bias": lambda e, f, h: (e, h)}

_MERGED = re.compile(r"^(blk\.\d+\.ffn_(?:gate|up|down))_exps\.weight$")


def moe_ffn_layout(p: Preset, blk: str, arch: Any = None) -> list[Entry]:
    """Router and the three merged expert tensors of one layer (and their biases, where
    the architecture `arch` declares them: gpt-oss)."""
    if p.arch not in MOE_ARCHS:
        raise ValueError(f"preset {p.name}: arch {p.arch!r} has no MoE layout "
                         f"(MoE archs: {', '.join(sorted(MOE_ARCHS))})")
    e, f, h = p.n_experts, p.expert_ffn, p.hidden
    out: list[Entry] = [(blk + "ffn_gate_inp.weight", (e, h), "router"),
                        (blk + "ffn_gate_exps.weight", (e, f, h), "matrix"),
                        (blk + "ffn_up_exps.weight", (e, f, h), "matrix"),
                        (blk + "ffn_down_exps.weight", (e, h, f), "matrix")]
    for x in arch.layer if arch is not None else ():
        if x.role in _BIAS_SHAPES:
            out.append((blk + x.suffix, _BIAS_SHAPES[x.role](e, f, h), "bias"))
    return out


def per_expert(layout: list[Entry]) -> list[Entry]:
    """`layout` with each merged 3-D expert tensor split into one 2-D tensor per expert
    (blk.N.ffn_gate.E.weight), as Hugging Face checkpoints store them."""
    out: list[Entry] = []
    for name, shape, role in layout:
        m = _MERGED.match(name)
        if m is None:
            out.append((name, shape, role))
        else:
            out += [(f"{m.group(1)}.{e}.weight", shape[1:], role) for e in range(shape[0])]
    return out


_FUSED = re.compile(r"^(blk\.\d+\.)ffn_(gate|up|down)_exps\.(weight|bias)$")


def fused_gate_up(layout: list[Entry]) -> list[Entry]:
    """`layout` with each layer's experts as transformers' GptOss holds them: gate and up
    fused into one gate_up tensor [E, hidden, 2·ffn] (x @ W: gate in the even columns, up in
    the odd) with an [E, 2·ffn] bias, down as [E, ffn, hidden] with its [E, hidden] bias.
    Named blk.N.ffn_gate_up_exps.* / ffn_down_exps.* (the architecture's transformers_names
    give the checkpoint's names)."""
    out: list[Entry] = []
    for name, shape, role in layout:
        m = _FUSED.match(name)
        if m is None:
            out.append((name, shape, role))
            continue
        blk, proj, kind = m.groups()
        if proj == "up":  # its half of gate_up was placed with gate's
            continue
        fused = "gate_up" if proj == "gate" else "down"
        wide = 2 if proj == "gate" else 1
        new = ((shape[0], shape[2], wide * shape[1]) if kind == "weight"
               else (shape[0], wide * shape[1]))
        out.append((f"{blk}ffn_{fused}_exps.{kind}", new, role))
    return out


# How each Arch.transformers_experts value lays a checkpoint's experts out
HF_EXPERT_LAYOUTS: dict[str, Any] = {"per_expert": per_expert, "fused_gate_up": fused_gate_up}


def add_moe_metadata(w: Any, p: Preset) -> None:
    """The expert keys of a gguf.GGUFWriter (nothing for a dense preset)."""
    if not p.is_moe:
        return
    w.add_expert_count(p.n_experts)
    w.add_expert_used_count(p.n_experts_used)
    if p.arch in EXPERT_FFN_KEY_ARCHS:
        w.add_expert_feed_forward_length(p.expert_ffn)
