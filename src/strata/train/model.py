"""A Llama in plain, readable PyTorch modules whose hot ops go through an `Ops` object.

Parameter names and layouts are transformers' LlamaForCausalLM ones (model.embed_tokens,
model.layers.N.self_attn.q_proj, ..., model.norm, lm_head), so exporting is writing the state
dict as it is; RoPE rotates halves like transformers (llama.cpp's adjacent pairs are the
export's business). No biases; the head is tied to the embedding unless cfg.tied is False.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import nn

from strata.train.presets import ModelConfig


class Ops(Protocol):
    """The model's hot ops. Shapes: rmsnorm x [..., C], w [C]; silu_mul a, b [..., F];
    rope x [B, T, H, D] with cos/sin [T, D/2] (rotate-half pairs (i, i + D/2));
    attention causal, q [B, H, T, D], k/v [B, Hkv, T, D] -> [B, H, T, D];
    cross_entropy logits [N, V], targets int64 [N] -> mean loss (a 0-d tensor);
    linear x [..., K], weight [N, K] -> x·Wᵀ [..., N] (every projection and the head)."""

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor: ...

    def silu_mul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor: ...

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor: ...

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  scale: float) -> torch.Tensor: ...

    def cross_entropy(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor: ...

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor: ...


class Linear(nn.Linear):
    """nn.Linear without bias whose matmul goes through the ops (the lab's matmul where
    dispatch picks one): same parameter name and layout, so state dicts and the export are
    untouched."""

    def __init__(self, n_in: int, n_out: int, ops: Ops) -> None:
        super().__init__(n_in, n_out, bias=False)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.linear(x, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, ops: Ops) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rmsnorm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: Ops) -> None:
        super().__init__()
        d, kv = cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.q_proj = Linear(cfg.hidden, cfg.hidden, ops)
        self.k_proj = Linear(cfg.hidden, kv, ops)
        self.v_proj = Linear(cfg.hidden, kv, ops)
        self.o_proj = Linear(cfg.hidden, cfg.hidden, ops)
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, d
        self.ops = ops

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # RoPE on [B, T, H, D], the layout the projection produces (no copy), then heads first
        q = self.ops.rope(self.q_proj(x).view(b, t, self.n_heads, self.head_dim), cos, sin)
        k = self.ops.rope(self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim)
        o = self.ops.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                               1.0 / math.sqrt(self.head_dim))
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: Ops) -> None:
        super().__init__()
        self.gate_proj = Linear(cfg.hidden, cfg.ffn, ops)
        self.up_proj = Linear(cfg.hidden, cfg.ffn, ops)
        self.down_proj = Linear(cfg.ffn, cfg.hidden, ops)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_mul(self.gate_proj(x), self.up_proj(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: Ops) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.eps, ops)
        self.self_attn = Attention(cfg, ops)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.eps, ops)
        self.mlp = MLP(cfg, ops)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """transformers' `model.` prefix: embedding, blocks, final norm."""

    def __init__(self, cfg: ModelConfig, ops: Ops) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(Block(cfg, ops) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps, ops)


def rope_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [ctx, D/2] in float32, computed as transformers' LlamaRotaryEmbedding does
    (inv_freq = 1 / theta^(2i/D), angle = position * inv_freq)."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    angles = torch.arange(cfg.ctx, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


class Llama(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: Ops) -> None:
        super().__init__()
        self.cfg = cfg
        self.ops = ops
        self.model = Backbone(cfg, ops)
        self.lm_head = Linear(cfg.hidden, cfg.vocab, ops)
        if cfg.tied:
            self.lm_head.weight = self.model.embed_tokens.weight
        cos, sin = rope_tables(cfg)
        # not persistent: the state dict holds weights only, exactly transformers' names
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self, seed: int | None = None) -> None:
        """GPT-2 style: N(0, 0.02) matrices and embedding, the two residual projections
        scaled by 1/sqrt(2 * n_layers) so the residual stream's variance does not grow with
        depth; norms at 1."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        resid = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            with torch.no_grad():
                if p.ndim == 1:
                    p.fill_(1.0)
                else:
                    std = resid if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                    p.copy_(torch.randn(p.shape, generator=gen) * std)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids int64 [B, T] (T <= cfg.ctx) -> (logits [B, T, V], mean loss or None)."""
        t = ids.shape[1]
        if t > self.cfg.ctx:
            raise ValueError(f"{t} tokens exceed the model's context of {self.cfg.ctx}")
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.model.embed_tokens(ids)
        for block in self.model.layers:
            x = block(x, cos, sin)
        logits = self.lm_head(self.model.norm(x))
        if targets is None:
            return logits, None
        loss = self.ops.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


def param_count(model: nn.Module) -> int:
    """Distinct parameters (a tied head counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def matmul_params(cfg: ModelConfig) -> int:
    """Weights that take part in a matmul per token: every projection and the head (the
    embedding lookup is a gather, but a tied head still multiplies its matrix)."""
    kv = cfg.n_kv_heads * cfg.head_dim
    per_layer = 2 * cfg.hidden * cfg.hidden + 2 * cfg.hidden * kv + 3 * cfg.hidden * cfg.ffn
    return cfg.n_layers * per_layer + cfg.vocab * cfg.hidden


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token for MFU (PaLM appendix B, as nanoGPT): 6 N for the matmul
    weights (2 forward + 4 backward per weight) plus 12 * layers * width * context for the
    attention scores and their weighted sum, forward and backward, at the full context
    (the causal half is not discounted, by the usual convention)."""
    return 6.0 * matmul_params(cfg) + 12.0 * cfg.n_layers * cfg.hidden * cfg.ctx
