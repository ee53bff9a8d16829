"""The plain-PyTorch implementation of the model's hot ops: the parity twin and the speed
baseline of the lab's kernels (`--kernels torch`). Each op is written the way transformers'
Llama computes it, so the model equals LlamaForCausalLM to float32 rounding."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class TorchOps:
    """Stateless; every method has the shapes of strata.train.model.Ops."""

    name = "torch"

    @staticmethod
    def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        # in float32 whatever the activation dtype, then back (LlamaRMSNorm does the same)
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return w * y.to(x.dtype)

    @staticmethod
    def silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.silu(a) * b

    @staticmethod
    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate-half RoPE: x [B, T, H, D], cos/sin [T, D/2]; pair i is (x[i], x[i + D/2])."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        c = cos[:, None, :].to(x.dtype)
        s = sin[:, None, :].to(x.dtype)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    @staticmethod
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  scale: float) -> torch.Tensor:
        """Causal attention, q [B, H, T, D], k/v [B, Hkv, T, D] (GQA: query head h reads KV
        head h // (H / Hkv)) -> [B, H, T, D]."""
        groups = q.shape[1] // k.shape[1]
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    @staticmethod
    def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss over rows: logits [N, V] (computed in float32), targets int64 [N]."""
        return F.cross_entropy(logits.float(), targets)

    @staticmethod
    def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x [..., K] · weight [N, K]ᵀ: nn.Linear without bias, exactly."""
        return F.linear(x, weight)
