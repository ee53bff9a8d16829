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

Layouts: activations [T, hidden] float32; the cache of a local layer is k, v [Hkv, C, D]
(float32 or float16; q8_0: [Hkv, C, D/32·34] blocks — `kv_dtype`, strata.engine.kvcache),
filled up to the position after the last forward. A sliding-window layer (gemma3's local
layers) holds only what its queries can still see: window - 1 + `chunk` rows, row r being
position `Cache.base` + r; when a forward would write past the end, the last window - 1
rows move to the front (amortised: one row copied per position written). A forward of more
than `chunk` positions runs in chunks of `chunk`, so the rows always fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from strata.engine import graph, kvcache
from strata.engine.ops import Ops
from strata.engine.rope import Rope
from strata.engine.weights import ModelWeights, Stored

CHUNK = 512  # positions one forward step writes at most (llama.cpp's default n_ubatch)
# K/V cache element types (llama.cpp's -ctk/-ctv names) live in strata.engine.kvcache;
# re-exported here, where the cache is
KV_DTYPES, KV_NAMES, kv_dtype = kvcache.KV_DTYPES, kvcache.KV_NAMES, kvcache.kv_dtype


@dataclass
class Cache:
    k: list[torch.Tensor]  # per local layer [Hkv, C, row(D)] (a windowed layer: fewer rows)
    v: list[torch.Tensor]
    capacity: int  # positions
    window: int = 0  # > 0: the windowed layers see their last `window` positions only
    windowed: list[bool] = field(default_factory=list)  # per local layer
    base: int = 0  # the position a windowed layer's row 0 holds

    @classmethod
    def allocate(cls, shape: tuple[int, int, int], windowed: list[bool], window: int,
                 chunk: int, device: torch.device, dtype: torch.dtype = torch.float32
                 ) -> Cache:
        hkv, capacity, d = shape
        d = kvcache.KV_TYPES[KV_NAMES[dtype]].row(d)  # q8_0: the blocks' bytes
        rows = [cls.rows(capacity, window, chunk) if w else capacity for w in windowed]
        return cls([torch.zeros((hkv, r, d), device=device, dtype=dtype) for r in rows],
                   [torch.zeros((hkv, r, d), device=device, dtype=dtype) for r in rows],
                   capacity, window if any(windowed) else 0, list(windowed))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    @staticmethod
    def rows(capacity: int, window: int, chunk: int = CHUNK) -> int:
        """Rows a windowed layer holds for a `capacity`-position cache (what fit and the
        ring's memory check count)."""
        return min(capacity, window - 1 + chunk) if window > 0 else capacity

    def slide(self, pos: int, t: int) -> None:
        """Make the windowed layers' rows hold positions pos - window + 1 .. pos + t - 1
        (everything queries at pos .. pos + t - 1 see), moving the rows still seen to the
        front when the new ones would not fit."""
        if not self.window:
            return
        keep_from = max(0, pos - self.window + 1)
        if keep_from < self.base:
            raise ValueError(f"position {pos}: the sliding-window cache no longer holds "
                             f"position {keep_from}; reset() to start again")
        rows = next(k.shape[1] for k, w in zip(self.k, self.windowed, strict=True) if w)
        if pos + t - self.base <= rows:
            return
        n, src = pos - keep_from, keep_from - self.base
        for k, v, w in zip(self.k, self.v, self.windowed, strict=True):
            if w:
                k[:, :n] = k[:, src:src + n].clone()
                v[:, :n] = v[:, src:src + n].clone()
        self.base = keep_from


@dataclass
class Executor:
    weights: ModelWeights
    ops: Ops
    device: torch.device
    held: dict[str, Any] = field(default_factory=dict)  # name -> the weight as ops hold it
    cache: Cache | None = None
    rope: Rope | None = None
    rope_windowed: Rope | None = None  # the windowed layers' tables (their own RoPE base)
    pos: int = 0  # positions the cache holds
    chunk: int = CHUNK  # positions a forward step writes at most (longer forwards split)
    # the K/V cache's element type (strata.engine.kvcache): float32, float16 (half the bytes;
    # llama.cpp's default -ctk/-ctv f16: each row rounded once, when it is written) or uint8
    # q8_0 blocks (-ctk/-ctv q8_0: a row quantised once, when it is written)
    kv_dtype: torch.dtype = torch.float32
    _pos_t: torch.Tensor = field(default_factory=lambda: torch.zeros(1, dtype=torch.int64))
    # a windowed layer's (row of the first query, window), what attention_window reads
    _row_t: torch.Tensor = field(default_factory=lambda: torch.zeros(2, dtype=torch.int64))
    net: graph.Net = field(init=False)

    def __post_init__(self) -> None:
        w, s = self.weights, self.weights.spec
        self.net = graph.Net(w.arch, graph.Shape(s.hidden, s.n_heads, s.n_kv_heads, s.head_dim,
                                                 s.n_experts_used),
                             float(w.config["rms_norm_eps"]), self.held, self.ops, w.moe,
                             bool(w.config.get("expert_weights_norm", True)))
        kvcache.KV_TYPES[self.kv].check(s.head_dim)  # q8_0: heads of whole blocks

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
    def kv(self) -> str:
        """The K/V cache's element type by its -ctk name (f32, f16, q8_0)."""
        return KV_NAMES[self.kv_dtype]

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
            self.cache, self.rope, self.rope_windowed, self.pos = None, None, None, 0
            return
        if self.cache is None or self.cache.capacity < capacity:
            windowed = [self.weights.windowed(i) for i in range(self.first, self.last)]
            self.cache = Cache.allocate((s.n_kv_heads, capacity, s.head_dim), windowed,
                                        self.weights.window, self.chunk, self.device,
                                        self.kv_dtype)
            config = self.weights.config
            self.rope = Rope.build(s.head_dim, config, self.weights.frequency_factors(capacity),
                                   capacity, self.device)
            base = self.weights.arch.swa_rope_base
            self.rope_windowed = self.rope if base is None else Rope.build(
                s.head_dim, {**config, "rope_theta": base, "rope_scaling": None}, None,
                capacity, self.device)  # llama.cpp: no scaling on the windowed layers
            self._pos_t = torch.zeros(1, dtype=torch.int64, device=self.device)
            self._row_t = torch.tensor([0, self.cache.window], dtype=torch.int64,
                                       device=self.device)
            self._on_new_cache()
        self.pos, self.cache.base = 0, 0

    def _on_new_cache(self) -> None:
        """Subclasses drop what they bound to the old cache."""

    # -- the forward pass ----------------------------------------------------------------

    def forward(self, x: torch.Tensor, pos: int, logits_from: int | None = 0
                ) -> torch.Tensor | None:
        """Run positions [pos, pos + T) through the range's layers.

        x: int64 token ids [T] on the first range, float32 activations [T, hidden] otherwise.
        Returns activations [T, hidden] on a range that is not the last; on the last, the
        float32 logits of rows [logits_from, T) — None when `logits_from` is None."""
        cache, rope, local_rope = self.cache, self.rope, self.rope_windowed
        if cache is None or rope is None or local_rope is None:
            raise RuntimeError("reset(capacity) before forward")
        t = x.shape[0]
        if pos < 0 or pos + t > cache.capacity:
            raise ValueError(f"positions {pos}..{pos + t} exceed the cache's "
                             f"{cache.capacity}")
        if t > self.chunk:  # long prompts in chunks (llama.cpp's n_ubatch): bounded
            # activations and attention scores, and what the windowed rows have room for
            return self._in_chunks(x, pos, logits_from)
        h = graph.embed(self.net, x.to(self.device)) if self.is_first else \
            x.to(self.device, torch.float32).contiguous()
        cache.slide(pos, t)
        self._pos_t.fill_(pos)
        self._row_t[0] = pos - cache.base
        for local, i in enumerate(range(self.first, self.last)):
            if cache.windowed[local]:
                kv = graph.KV(cache.k[local], cache.v[local], pos - cache.base, self._row_t,
                              cache.window)
                table = local_rope
            else:
                kv, table = graph.KV(cache.k[local], cache.v[local], pos, self._pos_t), rope
            h = graph.layer(self.net, i, h, table.cos[pos:pos + t], table.sin[pos:pos + t], kv)
        self.pos = pos + t
        if not self.is_last:
            return h
        if logits_from is None:
            return None
        return graph.head(self.net, h[logits_from:].contiguous())

    def _in_chunks(self, x: torch.Tensor, pos: int, logits_from: int | None
                   ) -> torch.Tensor | None:
        outs = []
        for start in range(0, x.shape[0], self.chunk):
            part = x[start:start + self.chunk]
            first = None if logits_from is None else max(0, logits_from - start)
            out = self.forward(part, pos + start,
                               first if first is None or first < part.shape[0] else None)
            if out is not None:
                outs.append(out)
        if not outs:
            return None
        return torch.cat(outs)
