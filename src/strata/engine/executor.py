"""The inference executor: a layer range of a declared architecture over a KV cache.

    weights = read_range(path, first, last, device)      # strata.engine.weights, as stored
    ex = Executor.build(weights, ops.make("lab", weights, device), device)
    ex.reset(capacity)
    out = ex.forward(ids_or_activations, pos, logits_from=0)

The layers themselves are `strata.engine.graph` (shared with `strata train`); this adds the
state: the weights as the ops hold them, a KV cache per local layer, the RoPE tables and the
position. `-B lab` is an executor over every layer with the lab's ops (strata.lab.model adds
prefill chunking and the bound decode step); a ring stage is one over its layers with the
ops its member chose (strata.ring.runtime.stage).

Layouts: activations [T, hidden] float32; the cache of a local layer is k, v [Hkv, C, D],
filled up to the position after the last forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from strata.engine import graph
from strata.engine.ops import Ops
from strata.engine.rope import Rope
from strata.engine.weights import ModelWeights, Stored


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
    net: graph.Net = field(init=False)

    def __post_init__(self) -> None:
        w, s = self.weights, self.weights.spec
        self.net = graph.Net(w.arch, graph.Shape(s.hidden, s.n_heads, s.n_kv_heads, s.head_dim,
                                                 s.n_experts_used),
                             float(w.config["rms_norm_eps"]), self.held, self.ops, w.moe,
                             bool(w.config.get("expert_weights_norm", True)))

    @classmethod
    def build(cls, weights: ModelWeights, ops: Ops, device: torch.device, **kw: Any
              ) -> Any:
        held = {name: ops.prepare(name, w) for name, w in weights.tensors.items()}
        for name, h in held.items():  # a weight the ops re-laid out (lab's x8) replaces the
            if isinstance(h, Stored):  # file's copy: one copy of the bytes, and every reader
                weights.tensors[name] = h  # of weights.tensors sees what the ops hold
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
        cache, rope = self.cache, self.rope
        if cache is None or rope is None:
            raise RuntimeError("reset(capacity) before forward")
        t = x.shape[0]
        if pos < 0 or pos + t > cache.capacity:
            raise ValueError(f"positions {pos}..{pos + t} exceed the cache's "
                             f"{cache.capacity}")
        h = graph.embed(self.net, x.to(self.device)) if self.is_first else \
            x.to(self.device, torch.float32).contiguous()
        self._pos_t.fill_(pos)
        cos, sin = rope.cos[pos:pos + t], rope.sin[pos:pos + t]
        for local, i in enumerate(range(self.first, self.last)):
            kv = graph.KV(cache.k[local], cache.v[local], pos, self._pos_t)
            h = graph.layer(self.net, i, h, cos, sin, kv)
        self.pos = pos + t
        if not self.is_last:
            return h
        if logits_from is None:
            return None
        return graph.head(self.net, h[logits_from:].contiguous())
