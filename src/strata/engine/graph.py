"""The forward pass of a declared architecture, as plain functions of a `Net`.

A `Net` is everything a layer reads besides its activations: the architecture (which
variant each part runs), the shapes, the weights as an ops backend holds them (by GGUF name)
and the ops. `embed`, `layer` and `head` are the whole model; the inference executor
(`executor.py`: a KV cache, a layer range) and `strata train` (its parameters, autograd ops,
no cache) both call them, so a fix or a new variant lands once.

Shapes: activations [..., T, C] (T tokens, optional leading batch dims). A layer's attention
either extends a KV cache (`KV`: the layer's k, v [Hkv, C, D] filled up to pos + T, queries at
positions [pos, pos + T)) or, without one, is causal over the layer's own T keys (training).
A windowed layer's cache (`KV.window` > 0) holds the last positions only: its row r is
position base + r, `pos` is a row, and each query sees the `window` rows up to its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from strata.engine import kvcache, moe
from strata.engine.ops import Ops
from strata.models.arch.spec import Arch
from strata.models.spec import OUTPUT, TOKEN_EMBD

OUTPUT_NORM = "output_norm.weight"


@dataclass(frozen=True)
class Shape:
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_experts_used: int = 0


@dataclass(frozen=True)
class Net:
    arch: Arch
    shape: Shape
    eps: float
    held: Mapping[str, Any]  # GGUF name -> the weight as `ops` holds it
    ops: Ops
    moe: bool = False
    renormalise: bool = True  # expert weights divided by their sum (expert_weights_norm)
    roles: dict[str, str] = field(default_factory=dict)  # role -> GGUF suffix

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", {x.role: x.suffix for x in self.arch.layer})

    def w(self, layer: int, role: str) -> Any:
        return self.held[f"blk.{layer}.{self.roles[role]}"]

    def opt(self, layer: int, role: str) -> Any:
        """The layer's `role` tensor, or None where the architecture or file has none."""
        suffix = self.roles.get(role)
        name = f"blk.{layer}.{suffix}"
        return self.held[name] if suffix is not None and name in self.held else None


@dataclass
class KV:
    """One layer's cache and where this forward's queries sit in it."""

    k: torch.Tensor  # [Hkv, C, row(D)] (strata.engine.kvcache: D values, or q8_0 blocks)
    v: torch.Tensor
    pos: int  # the cache row of the first query
    pos_t: torch.Tensor  # the same row as an int64 tensor (what lab kernels read); a
    # windowed layer's holds (row, window), what attention_window reads
    window: int = 0  # > 0: each query attends to its last `window` positions only


def embed(net: Net, ids: torch.Tensor) -> torch.Tensor:
    x = net.ops.embed(net.held[TOKEN_EMBD], ids)
    scale = net.arch.embedding_scale(net.shape.hidden)
    return x * scale if scale != 1.0 else x


def layer(net: Net, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
          kv: KV | None) -> torch.Tensor:
    """Layer `i` on x [..., T, C]; cos/sin [T, D/2] the rows of x's positions."""
    a = attention(net, i, norm(net, x, net.w(i, "attn_norm")), cos, sin, kv)
    x = x + post_norm(net, i, "attn_post_norm", a)
    h = norm(net, x, net.w(i, "ffn_norm"))
    return x + post_norm(net, i, "ffn_post_norm", experts(net, i, h) if net.moe
                         else mlp(net, i, h))


def head(net: Net, x: torch.Tensor) -> torch.Tensor:
    """Logits of x [..., T, C]: the final norm, then the head (token_embd where tied)."""
    w = net.held[OUTPUT] if OUTPUT in net.held else net.held[TOKEN_EMBD]
    return net.ops.linear(norm(net, x, net.held[OUTPUT_NORM]), w)


def norm(net: Net, x: torch.Tensor, w: Any) -> torch.Tensor:
    return net.ops.rmsnorm(x, w, net.eps)


def post_norm(net: Net, i: int, role: str, x: torch.Tensor) -> torch.Tensor:
    """Gemma's norm of a branch's output before the residual add, where declared."""
    w = net.opt(i, role)
    return x if w is None else norm(net, x, w)


def proj(net: Net, i: int, role: str, h: torch.Tensor) -> torch.Tensor:
    out = net.ops.linear(h, net.w(i, role))
    bias = net.opt(i, role + "_bias")
    return out if bias is None else out + bias  # biases: glue adds


def head_norm(net: Net, i: int, role: str, x: torch.Tensor) -> torch.Tensor:
    """RMS norm of every head of q or k [..., T, H, D] (qwen3's q/k norms), if declared."""
    w = net.opt(i, role)
    if w is None:
        return x
    return norm(net, x.reshape(-1, x.shape[-1]), w).view(x.shape)


def attention(net: Net, i: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              kv: KV | None) -> torch.Tensor:
    s, lead, t = net.shape, h.shape[:-2], h.shape[-2]
    d = s.head_dim
    q, k, v = qkv(net, i, h)
    q = head_norm(net, i, "q_norm", q.reshape(*lead, t, s.n_heads, d))
    k = head_norm(net, i, "k_norm", k.reshape(*lead, t, s.n_kv_heads, d))
    v = v.reshape(*lead, t, s.n_kv_heads, d)
    q, k = net.ops.rope(q, cos, sin), net.ops.rope(k, cos, sin)
    if kv is None:  # causal over these T keys alone: [..., Hkv, T, D]
        keys, values, pos, pos_t, window = k.transpose(-3, -2), v.transpose(-3, -2), 0, None, 0
    else:
        kind = kvcache.of(kv.k)  # rounded (f16) or quantised (q8_0) as it is written
        kind.store(kv.k[:, kv.pos:kv.pos + t], k.transpose(0, 1))
        kind.store(kv.v[:, kv.pos:kv.pos + t], v.transpose(0, 1))
        keys, values, pos, pos_t, window = kv.k, kv.v, kv.pos, kv.pos_t, kv.window
    o = net.ops.attention(q.transpose(-3, -2), keys, values, pos, pos_t, 1.0 / math.sqrt(d),
                          window, net.opt(i, "sinks"))
    return proj(net, i, "o", o.transpose(-3, -2).reshape(*lead, t, s.n_heads * d))


def qkv(net: Net, i: int, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The q, k and v projections of h: three matrices, or one fused (phi3's attn_qkv)."""
    if "qkv" not in net.roles:
        return proj(net, i, "q", h), proj(net, i, "k", h), proj(net, i, "v", h)
    s = net.shape
    sizes = [s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim, s.n_kv_heads * s.head_dim]
    return proj(net, i, "qkv", h).split(sizes, dim=-1)


def mlp(net: Net, i: int, h: torch.Tensor) -> torch.Tensor:
    if "gate_up" in net.roles:  # phi3: one matrix, the gate's rows first
        gate, up = net.ops.linear(h, net.w(i, "gate_up")).chunk(2, dim=-1)
    else:
        gate = net.ops.linear(h, net.w(i, "gate"))
        up = net.ops.linear(h, net.w(i, "up"))
    return net.ops.linear(net.ops.glu(net.arch.activation, gate, up), net.w(i, "down"))


def experts(net: Net, i: int, h: torch.Tensor) -> torch.Tensor:
    """The routed experts of rows h [T, C] (strata.engine.moe.route picks and weighs them);
    each expert runs on the tokens routed to it only (a decoded token: k experts)."""
    ids, weights = moe.route(proj(net, i, "router", h), net.shape.n_experts_used,
                             net.renormalise, net.arch.gating)
    out = torch.zeros_like(h)
    for e in torch.unique(ids).tolist():
        tokens, slot = torch.nonzero(ids == e, as_tuple=True)
        x = h[tokens].contiguous()
        a = net.ops.glu(net.arch.activation, expert_proj(net, i, "gate_exps", e, x),
                        expert_proj(net, i, "up_exps", e, x))
        y = expert_proj(net, i, "down_exps", e, a)
        out.index_add_(0, tokens, y * weights[tokens, slot, None])
    return out


def expert_proj(net: Net, i: int, role: str, e: int, x: torch.Tensor) -> torch.Tensor:
    """Expert e's `role` matrix times rows x, plus its bias where the file has one."""
    out = net.ops.linear(x, net.ops.expert(net.w(i, role), e))
    bias = net.opt(i, role + "_bias")
    return out if bias is None else out + net.ops.expert(bias, e)
