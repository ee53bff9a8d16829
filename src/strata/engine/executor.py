"""The one forward pass: any registered architecture, any layer range, any ops backend.

    weights = read_range(path, first, last, device)      # strata.engine.weights, as stored
    ex = Executor.build(weights, ops.make("lab", weights, device), device)
    ex.reset(capacity)
    out = ex.forward(ids_or_activations, pos, logits_from=0)

`-B lab` is an executor over every layer with the lab's ops (strata.lab.model adds prefill
chunking and the bound decode step); a ring stage is an executor over its layers with the
ops its member chose (strata.ring.stage). What a layer does follows from the architecture's
declaration (strata.models.arch): q/k/v biases where the file has them, q/k norms where
declared, a gated MLP (SwiGLU/GeGLU) or routed experts, the embedding scale.

Layouts: activations [T, hidden] float32; the cache of a local layer is k, v [Hkv, C, D],
filled up to the position after the last forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from strata.engine import moe
from strata.engine.ops import Ops
from strata.engine.rope import Rope
from strata.engine.weights import OUTPUT_NORM, ModelWeights
from strata.models.spec import TOKEN_EMBD


@dataclass
class Cache:
    k: list[torch.Tensor]  # per local layer [Hkv, C, D]
    v: list[torch.Tensor]
    capacity: int


@dataclass
class Executor:
    weights: ModelWeights
    ops: Ops
    device: torch.device
    held: dict[str, Any] = field(default_factory=dict)  # name -> the weight as ops hold it
    cache: Cache | None = None
    rope: Rope | None = None
    pos: int = 0  # positions the cache holds
    _pos_t: torch.Tensor = field(default_factory=lambda: torch.zeros(1, dtype=torch.int64))

    @classmethod
    def build(cls, weights: ModelWeights, ops: Ops, device: torch.device, **kw: Any
              ) -> Any:
        held = {name: ops.prepare(name, w) for name, w in weights.tensors.items()}
        return cls(weights, ops, device, held, **kw)

    # -- what it holds ------------------------------------------------------------------

    @property
    def first(self) -> int:
        return self.weights.first

    @property
    def last(self) -> int:
        return self.weights.last

    @property
    def is_first(self) -> bool:
        return self.first == 0

    @property
    def is_last(self) -> bool:
        return self.last == self.weights.spec.n_layers

    @property
    def vocab(self) -> int:
        return int(self.weights.config["vocab_size"])

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights as held (a tied head counted once)."""
        unique = {id(h): h for h in self.held.values()}
        return sum(self.ops.nbytes(h) for h in unique.values())

    def _w(self, layer: int, role: str) -> Any:
        return self.held[f"blk.{layer}.{self._suffix[role]}"]

    def _opt(self, layer: int, role: str) -> Any:
        suffix = self._suffix.get(role)
        return None if suffix is None else self.held.get(f"blk.{layer}.{suffix}")

    @cached_property
    def _suffix(self) -> dict[str, str]:
        return {x.role: x.suffix for x in self.weights.arch.layer}

    # -- the cache ----------------------------------------------------------------------

    def reset(self, capacity: int) -> None:
        """An empty KV cache of `capacity` positions (the old one reused when big enough);
        capacity 0 frees it."""
        s = self.weights.spec
        if capacity <= 0:
            self.cache, self.rope, self.pos = None, None, 0
            return
        if self.cache is None or self.cache.capacity < capacity:
            shape = (s.n_kv_heads, capacity, s.head_dim)
            n = self.last - self.first
            self.cache = Cache([torch.zeros(shape, device=self.device) for _ in range(n)],
                               [torch.zeros(shape, device=self.device) for _ in range(n)],
                               capacity)
            self.rope = Rope.build(s.head_dim, self.weights.config, self.weights.rope_freqs,
                                   capacity, self.device)
            self._pos_t = torch.zeros(1, dtype=torch.int64, device=self.device)
            self._on_new_cache()
        self.pos = 0

    def _on_new_cache(self) -> None:
        """Subclasses drop what they bound to the old cache."""

    # -- the forward pass ----------------------------------------------------------------

    def forward(self, x: torch.Tensor, pos: int, logits_from: int | None = 0
                ) -> torch.Tensor | None:
        """Run positions [pos, pos + T) through the range's layers.

        x: int64 token ids [T] on the first range, float32 activations [T, hidden] otherwise.
        Returns activations [T, hidden] on a range that is not the last; on the last, the
        float32 logits of rows [logits_from, T) — None when `logits_from` is None."""
        if self.cache is None or self.rope is None:
            raise RuntimeError("reset(capacity) before forward")
        t = x.shape[0]
        if pos < 0 or pos + t > self.cache.capacity:
            raise ValueError(f"positions {pos}..{pos + t} exceed the cache's "
                             f"{self.cache.capacity}")
        h = self._embed(x.to(self.device)) if self.is_first else \
            x.to(self.device, torch.float32).contiguous()
        self._pos_t.fill_(pos)
        for local, layer in enumerate(range(self.first, self.last)):
            h = self._layer(layer, local, h, pos)
        self.pos = pos + t
        if not self.is_last:
            return h
        if logits_from is None:
            return None
        out = self._norm(h[logits_from:].contiguous(), self.held[OUTPUT_NORM])
        head = self.held.get("output.weight", self.held.get(TOKEN_EMBD))
        return self.ops.linear(out, head)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.ops.embed(self.held[TOKEN_EMBD], ids)
        scale = self.weights.arch.embedding_scale(self.weights.spec.hidden)
        return x * scale if scale != 1.0 else x

    def _layer(self, i: int, local: int, x: torch.Tensor, pos: int) -> torch.Tensor:
        x = x + self._attention(i, local, self._norm(x, self._w(i, "attn_norm")), pos)
        h = self._norm(x, self._w(i, "ffn_norm"))
        return x + (self._experts(i, h) if self.weights.moe else self._mlp(i, h))

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.ops.rmsnorm(x, w, self._eps)

    @property
    def _eps(self) -> float:
        return float(self.weights.config["rms_norm_eps"])

    def _proj(self, i: int, role: str, h: torch.Tensor) -> torch.Tensor:
        out = self.ops.linear(h, self._w(i, role))
        bias = self._opt(i, role + "_bias")
        return out if bias is None else out + bias  # biases: glue adds

    def _head_norm(self, i: int, role: str, x: torch.Tensor) -> torch.Tensor:
        """RMS norm of every head of q or k [T, H, D] (qwen3's q/k norms), if declared."""
        w = self._opt(i, role)
        if w is None:
            return x
        t, heads, d = x.shape
        return self._norm(x.reshape(t * heads, d), w).view(t, heads, d)

    def _attention(self, i: int, local: int, h: torch.Tensor, pos: int) -> torch.Tensor:
        s, cache, rope = self.weights.spec, self.cache, self.rope
        assert cache is not None and rope is not None
        t, d = h.shape[0], s.head_dim
        q = self._head_norm(i, "q_norm", self._proj(i, "q", h).view(t, s.n_heads, d))
        k = self._head_norm(i, "k_norm", self._proj(i, "k", h).view(t, s.n_kv_heads, d))
        v = self._proj(i, "v", h).view(t, s.n_kv_heads, d)
        cos, sin = rope.cos[pos:pos + t], rope.sin[pos:pos + t]
        q, k = self.ops.rope(q, cos, sin), self.ops.rope(k, cos, sin)
        cache.k[local][:, pos:pos + t].copy_(k.transpose(0, 1))
        cache.v[local][:, pos:pos + t].copy_(v.transpose(0, 1))
        o = self.ops.attention(q.transpose(0, 1).contiguous(), cache.k[local],
                               cache.v[local], pos, self._pos_t, 1.0 / math.sqrt(d))
        return self.ops.linear(o.transpose(0, 1).reshape(t, s.n_heads * d).contiguous(),
                               self._w(i, "o"))

    def _mlp(self, i: int, h: torch.Tensor) -> torch.Tensor:
        gate = self.ops.linear(h, self._w(i, "gate"))
        up = self.ops.linear(h, self._w(i, "up"))
        act = self.ops.glu(self.weights.arch.activation, gate, up)
        return self.ops.linear(act, self._w(i, "down"))

    def _experts(self, i: int, h: torch.Tensor) -> torch.Tensor:
        """The routed experts (strata.engine.moe.route picks and weighs them); each expert
        runs on the tokens routed to it only (a decoded token: k experts)."""
        ids, weights = moe.route(self.ops.linear(h, self._w(i, "router")),
                                 self.weights.spec.n_experts_used,
                                 bool(self.weights.config.get("expert_weights_norm", True)))
        gate, up, down = (self._w(i, r) for r in ("gate_exps", "up_exps", "down_exps"))
        out = torch.zeros_like(h)
        for e in torch.unique(ids).tolist():
            tokens, slot = torch.nonzero(ids == e, as_tuple=True)
            x = h[tokens].contiguous()
            a = self.ops.glu(self.weights.arch.activation,
                             self.ops.linear(x, self.ops.expert(gate, e)),
                             self.ops.linear(x, self.ops.expert(up, e)))
            y = self.ops.linear(a, self.ops.expert(down, e))
            out.index_add_(0, tokens, y * weights[tokens, slot, None])
        return out
