"""Expert routing as llama.cpp's build_moe_ffn does it, by the architecture's gating.

    softmax          probabilities = softmax over every expert of the router's logits; the
                     top k chosen; their weights renormalised to sum to 1 (llama.cpp's graphs
                     pass norm_w=true for qwen3moe and Mixtral; transformers' Qwen3Moe calls
                     it norm_topk_prob, and Mixtral's softmax over the top-k logits is the
                     same number). A file that says {arch}.expert_weights_norm = false is
                     taken at its word.
    softmax_weight   (gpt-oss) the top k of the raw logits chosen, their weights the softmax
                     over those k alone (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT, no
                     renormalisation after)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Router = Callable[[torch.Tensor, int, bool], tuple[torch.Tensor, torch.Tensor]]


def _softmax(logits: torch.Tensor, n_used: int, renormalise: bool
             ) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(logits, dim=-1)
    weights, ids = torch.topk(probs, n_used, dim=-1)
    if renormalise:
        weights = weights / weights.sum(-1, keepdim=True)
    return ids, weights


def _softmax_weight(logits: torch.Tensor, n_used: int, renormalise: bool
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    top, ids = torch.topk(logits, n_used, dim=-1)
    return ids, torch.softmax(top, dim=-1)


GATINGS: dict[str, Router] = {"softmax": _softmax, "softmax_weight": _softmax_weight}


def route(logits: torch.Tensor, n_used: int, renormalise: bool, gating: str = "softmax"
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [T, k], weights [T, k]) of every token from router logits [T, E]."""
    return GATINGS[gating](logits, n_used, renormalise)
