"""The mixture-of-experts parts of a ring stage: routing, the routed experts, q/k norms.

The two MoE layouts strata writes and llama.cpp runs (see strata.models.synthetic_moe):
  qwen3moe  per-head RMS norm of q and k (attn_q_norm / attn_k_norm) before RoPE, NeoX
            (rotate-half) RoPE on the rows as stored, no dense FFN, no shared expert
  llama     Mixtral: the Llama attention, experts in place of the dense FFN
Both route the same way in llama.cpp's build_moe_ffn (gating SOFTMAX): probabilities =
softmax over all experts of the router's logits, the top k of them chosen, and their weights
renormalised to sum to 1 (llama.cpp's graphs pass norm_w=true for both archs;
transformers' Qwen3Moe calls it norm_topk_prob, Mixtral's softmax over the top-k logits is the
same number). A file that says {arch}.expert_weights_norm = false is taken at its word.

Every expert of a layer is held by the stage that holds the layer (memory counts them all);
the forward runs, per expert, only the tokens routed to it (time counts the active ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from strata.errors import InputError
from strata.models.gguf_torch import ArchRule
from strata.models.spec import ModelSpec

# Architectures a stage runs only with experts (llama with experts is Mixtral: gguf_torch's
# "llama" rule already covers its attention). qwen3moe's converter does not permute Q/K rows:
# llama.cpp rotates them NeoX-style, which is the stage's rotate-half on the stored rows.
MOE_ARCHS: dict[str, ArchRule] = {"qwen3moe": ArchRule("qwen3_moe", permuted_qk=False)}
# Archs whose attention RMS-normalises every q and k head (llama.cpp: attn_q_norm/attn_k_norm)
QK_NORM_ARCHS = frozenset({"qwen3moe"})

MOE_BLOCK_TENSORS = frozenset({
    "attn_q_norm.weight", "attn_k_norm.weight", "ffn_gate_inp.weight",
    "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
})


@dataclass(frozen=True)
class Routing:
    """How a MoE layer picks and weighs its experts."""

    n_experts: int
    n_used: int
    renormalise: bool  # top-k weights divided by their sum (norm_topk_prob)


def routing(path: Any, spec: ModelSpec, kv: dict[str, Any]) -> Routing | None:
    """The routing of a MoE file (None for a dense one); InputError for one a stage cannot
    run (experts on an arch without a MoE graph here, or k outside 1..n_experts)."""
    if not spec.is_moe:
        if spec.arch in MOE_ARCHS:
            raise InputError(f"MODEL {path}: {spec.arch} without {spec.arch}.expert_count")
        return None
    if spec.arch not in ("llama", *MOE_ARCHS):
        raise InputError(f"MODEL {path}: strata ring runs mixture-of-experts llama "
                         f"(Mixtral) and {', '.join(MOE_ARCHS)}, not {spec.arch} with experts")
    if not 1 <= spec.n_experts_used <= spec.n_experts:
        raise InputError(f"MODEL {path}: {spec.n_experts_used} experts per token of "
                         f"{spec.n_experts}")
    norm = kv.get(f"{spec.arch}.expert_weights_norm", True)
    return Routing(spec.n_experts, spec.n_experts_used, bool(norm))


def head_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm over the last axis (one head's D values) of q or k [H, T, D]."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def route(h: torch.Tensor, router: torch.Tensor, r: Routing
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [T, k], weights [T, k]) of every token: softmax over all experts, top k,
    renormalised when the file says so (llama.cpp's build_moe_ffn, gating SOFTMAX)."""
    probs = F.softmax(h @ router.T, dim=-1)
    weights, ids = torch.topk(probs, r.n_used, dim=-1)
    if r.renormalise:
        weights = weights / weights.sum(-1, keepdim=True)
    return ids, weights


def moe_ffn(h: torch.Tensor, w: dict[str, torch.Tensor], p: str, r: Routing) -> torch.Tensor:
    """The routed SwiGLU experts of layer prefix `p` on normed activations h [T, hidden]: each
    expert runs on the tokens routed to it only, its output scaled by the token's weight."""
    ids, weights = route(h, w[p + "ffn_gate_inp.weight"], r)
    gate, up, down = (w[p + f"ffn_{n}_exps.weight"] for n in ("gate", "up", "down"))
    out = torch.zeros_like(h)
    # one pass per expert that some token chose (a decoded token: k experts, no more)
    for e in torch.unique(ids).tolist():
        tokens, slot = torch.nonzero(ids == e, as_tuple=True)
        x = h[tokens]
        y = (F.silu(x @ gate[e].T) * (x @ up[e].T)) @ down[e].T
        out.index_add_(0, tokens, y * weights[tokens, slot, None])
    return out
