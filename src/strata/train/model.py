"""The trainable Llama: the engine's declared `llama` architecture over parameters, through
an `Ops` object with autograd.

The forward pass is `strata.engine.graph` — the one every executor runs (-B lab, ring stages)
— over the architecture declared in `strata.models.arch.llama`, without a KV cache (causal
attention over the sequence), with this package's ops (`ops_torch`: plain PyTorch, or
`ops_lab`: the lab's kernels as autograd ops) adapted to the engine's ops protocol.
The modules here only hold the parameters: their names and layouts are transformers'
LlamaForCausalLM ones (model.embed_tokens, model.layers.N.self_attn.q_proj, ..., model.norm,
lm_head), so exporting is writing the state dict as it is, and each maps to the GGUF name
the graph reads (strata.models.gguf_torch.hf_name). RoPE rotates halves like transformers
(llama.cpp's adjacent pairs are the export's business). No biases; the head is tied to the
embedding unless cfg.tied is False.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from strata.engine import graph
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


# -- the parameters, under transformers' names (the forward is strata.engine.graph) --------


def _linear(n_in: int, n_out: int) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=False)


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        kv = cfg.n_kv_heads * cfg.head_dim
        self.q_proj = _linear(cfg.hidden, cfg.hidden)
        self.k_proj = _linear(cfg.hidden, kv)
        self.v_proj = _linear(cfg.hidden, kv)
        self.o_proj = _linear(cfg.hidden, cfg.hidden)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = _linear(cfg.hidden, cfg.ffn)
        self.up_proj = _linear(cfg.hidden, cfg.ffn)
        self.down_proj = _linear(cfg.ffn, cfg.hidden)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden)
        self.mlp = MLP(cfg)


class Backbone(nn.Module):
    """transformers' `model.` prefix: embedding, blocks, final norm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden)


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
        self.model = Backbone(cfg)
        self.lm_head = _linear(cfg.hidden, cfg.vocab)
        if cfg.tied:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.net = _net(self, cfg, ops)
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
        x = graph.embed(self.net, ids)
        for i in range(self.cfg.n_layers):
            x = graph.layer(self.net, i, x, cos, sin, None)
        logits = graph.head(self.net, x)
        if targets is None:
            return logits, None
        loss = self.ops.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


class _EngineOps:
    """This package's ops (autograd) as the engine's ops backend: the weights are the
    parameters themselves, the attention is causal over the sequence (no cache)."""

    def __init__(self, ops: Ops) -> None:
        self.ops = ops
        self.name = f"train-{getattr(ops, 'name', 'ops')}"

    def prepare(self, name: str, w: Any) -> Any:
        return w

    def nbytes(self, held: torch.Tensor) -> int:
        return held.numel() * held.element_size()

    def embed(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, table)

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.ops.linear(x, w)

    def expert(self, w: Any, e: int) -> Any:
        raise NotImplementedError("strata train builds dense models")

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return self.ops.rmsnorm(x, w, eps)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.ops.rope(x, cos, sin)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int,
                  pos_t: Any, scale: float, window: int = 0, sinks: Any = None
                  ) -> torch.Tensor:
        return self.ops.attention(q, k, v, scale)  # no cache: pos is 0, causal over T

    def glu(self, activation: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.ops.silu_mul(gate, up)  # the llama declaration's SwiGLU


class _Params(Mapping):
    """GGUF name -> the module parameter it is, looked up at each use (so `.to()`, a loaded
    state dict or a wrapper's replaced parameters are always the ones computed with)."""

    def __init__(self, slots: dict[str, nn.Module]) -> None:
        self._slots = slots

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._slots[name].weight

    def __contains__(self, name: object) -> bool:
        return name in self._slots

    def __iter__(self) -> Iterator[str]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)


def _net(model: nn.Module, cfg: ModelConfig, ops: Ops) -> graph.Net:
    """The engine's view of `model`: the declared llama architecture, each tensor it reads
    (dense layers, no biases) bound to the module holding it under transformers' name."""
    from strata.models import arch
    from strata.models.gguf_torch import hf_name

    llama = arch.get("llama")
    names = ["token_embd.weight", "output_norm.weight", "output.weight",
             *(f"blk.{i}.{x.suffix}" for i in range(cfg.n_layers)
               for x in llama.roles(moe=False) if not x.optional)]
    slots = {n: model.get_submodule(hf_name(Path("strata train"), n).removesuffix(".weight"))
             for n in names}
    shape = graph.Shape(cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)
    return graph.Net(llama, shape, cfg.eps, _Params(slots), _EngineOps(ops))


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
