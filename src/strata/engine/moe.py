"""Expert routing as llama.cpp's build_moe_ffn does it (gating SOFTMAX).

probabilities = softmax over every expert of the router's logits; the top k chosen; their
weights renormalised to sum to 1 (llama.cpp's graphs pass norm_w=true for qwen3moe and
Mixtral; transformers' Qwen3Moe calls it norm_topk_prob, and Mixtral's softmax over the top-k
logits is the same number). A file that says {arch}.expert_weights_norm = false is taken at
its word.
"""

from __future__ import annotations

import torch


def route(logits: torch.Tensor, n_used: int, renormalise: bool
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [T, k], weights [T, k]) of every token from router logits [T, E]."""
    probs = torch.softmax(logits, dim=-1)
    weights, ids = torch.topk(probs, n_used, dim=-1)
    if renormalise:
        weights = weights / weights.sum(-1, keepdim=True)
    return ids, weights
