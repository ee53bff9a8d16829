"""A Llama-family model on lab kernels: prefill and decode over a KV cache.

The forward pass is lab ops through dispatch (`lab/kernels.py`): rmsnorm, one `linear_<type>`
per weight storage type (decode is B = 1, prefill B = the chunk's tokens), rope, the cached
attention (prefill with depth and decode alike), silu_mul and the output head. Glue in
torch: views and transposing copies into the attention layout, writes into the KV cache, the
embedding lookup (a row dequantised per token) and the residual adds (and qwen2's q/k/v bias
adds) — what torch computes is observed per decode step (`lab/accounting.py`) and reported.

Layouts: activations are rows [T, C] (float32); the cache of a layer is k, v [Hkv, C, D]
with C its capacity, filled up to `self.pos`. Prompts are processed in chunks of `ubatch`
tokens (llama.cpp's n_ubatch), so activation memory stays bounded for long prompts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from strata.kernels.ops import _quant
from strata.lab.kernels import Kernels
from strata.lab.plan import LINEAR_OPS
from strata.lab.weights import TOKEN_EMBD, LabWeights, Stored

UBATCH = 512


@dataclass
class Cache:
    k: list[torch.Tensor]  # per layer [Hkv, C, D]
    v: list[torch.Tensor]
    capacity: int


@dataclass
class Rope:
    """cos/sin tables [C, D/2] for every position up to the capacity, computed once."""

    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def build(cls, w: LabWeights, positions: int, device: torch.device) -> Rope:
        d = w.spec.head_dim
        inv = 1.0 / (float(w.config["rope_theta"]) **
                     (torch.arange(0, d, 2, dtype=torch.float64) / d))
        if w.rope_freqs is not None:  # Llama 3.x frequency factors divide the frequencies
            inv = inv / torch.from_numpy(w.rope_freqs).double()
        scaling = w.config.get("rope_scaling") or {}
        if scaling.get("rope_type") == "linear":
            inv = inv / float(scaling["factor"])
        angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv[None, :]
        return cls(angles.cos().float().to(device).contiguous(),
                   angles.sin().float().to(device).contiguous())


@dataclass
class LabModel:
    weights: LabWeights
    kernels: Kernels
    device: torch.device
    ubatch: int = UBATCH
    threads: int = 0  # the thread team it was loaded with (lab/threads.py)
    cache: Cache | None = None
    rope: Rope | None = None
    pos: int = 0
    _pos_t: torch.Tensor = field(default_factory=lambda: torch.zeros(1, dtype=torch.int64))
    _step: Any = None  # lab.decode.DecodeStep, built on the first decode after a new cache

    # -- the cache ------------------------------------------------------------------------

    def reset(self, capacity: int) -> None:
        """A fresh, empty KV cache of `capacity` positions (reused when big enough)."""
        s = self.weights.spec
        if self.cache is None or self.cache.capacity < capacity:
            shape = (s.n_kv_heads, capacity, s.head_dim)
            self.cache = Cache([torch.zeros(shape, device=self.device)
                                for _ in range(s.n_layers)],
                               [torch.zeros(shape, device=self.device)
                                for _ in range(s.n_layers)], capacity)
            self.rope = Rope.build(self.weights, capacity, self.device)
            self._pos_t = torch.zeros(1, dtype=torch.int64, device=self.device)
            self._step = None  # bound to the old cache
        self.pos = 0

    # -- the public steps -------------------------------------------------------------------

    def prefill(self, tokens: list[int], logits_from: int | None = None) -> torch.Tensor:
        """Process `tokens` after what the cache holds. Returns float32 logits of the last
        token [1, vocab], or of every token from index `logits_from` on."""
        outs = []
        for start in range(0, len(tokens), self.ubatch):
            chunk = tokens[start:start + self.ubatch]
            first = None if logits_from is None else max(0, logits_from - start)
            last = logits_from is None and start + len(chunk) == len(tokens)
            if first is not None and first < len(chunk):
                outs.append(self._forward(chunk, first))
            elif last:
                outs.append(self._forward(chunk, len(chunk) - 1))
            else:
                self._forward(chunk, None)
        return torch.cat(outs) if outs else torch.empty(0, self.vocab, device=self.device)

    def decode(self, token: int) -> torch.Tensor:
        """One token after the cache: its logits [1, vocab] (every kernel call bound once
        per cache: lab/decode.py)."""
        from strata.lab.decode import DecodeStep

        assert self.cache is not None, "reset() first"
        if self.pos + 1 > self.cache.capacity:
            raise ValueError(f"{self.pos + 1} positions exceed the cache's "
                             f"{self.cache.capacity}")
        if self._step is None:
            self._step = DecodeStep.build(self)
        return self._step(token)

    @property
    def vocab(self) -> int:
        return self.weights.head().shape[0]

    # -- the forward pass ----------------------------------------------------------------

    def _forward(self, tokens: list[int], logits_from: int | None) -> torch.Tensor | None:
        assert self.cache is not None and self.rope is not None, "reset() first"
        t = len(tokens)
        if self.pos + t > self.cache.capacity:
            raise ValueError(f"{self.pos + t} positions exceed the cache's "
                             f"{self.cache.capacity}")
        x = self._embed(tokens)
        self._pos_t.fill_(self.pos)
        for layer in range(self.weights.spec.n_layers):
            x = self._layer(layer, x)
        self.pos += t
        if logits_from is None:
            return None
        h = self._norm(x[logits_from:].contiguous(), "output_norm.weight")
        return self._linear(h, self.weights.head())

    def _layer(self, i: int, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(i, self._norm(x, f"blk.{i}.attn_norm.weight"))
        return x + self._mlp(i, self._norm(x, f"blk.{i}.ffn_norm.weight"))

    def _attention(self, i: int, h: torch.Tensor) -> torch.Tensor:
        s, w, k_ = self.weights.spec, self.weights.tensors, f"blk.{i}."
        t, d = h.shape[0], s.head_dim
        q = self._proj(h, k_ + "attn_q").view(t, s.n_heads, d)
        k = self._proj(h, k_ + "attn_k").view(t, s.n_kv_heads, d)
        v = self._proj(h, k_ + "attn_v").view(t, s.n_kv_heads, d)
        cos, sin = (tab[self.pos:self.pos + t] for tab in (self.rope.cos, self.rope.sin))
        q = self._rope(q, cos, sin)
        k = self._rope(k, cos, sin)
        cache = self.cache
        cache.k[i][:, self.pos:self.pos + t].copy_(k.transpose(0, 1))
        cache.v[i][:, self.pos:self.pos + t].copy_(v.transpose(0, 1))
        qh = q.transpose(0, 1).contiguous()  # [H, T, D]
        o = torch.empty_like(qh)
        self.kernels.call("attention_cached", o, qh, cache.k[i], cache.v[i], self._pos_t,
                          scale=1.0 / math.sqrt(d))
        return self._linear(o.transpose(0, 1).reshape(t, s.n_heads * d).contiguous(),
                            w[k_ + "attn_output.weight"])

    def _proj(self, h: torch.Tensor, name: str) -> torch.Tensor:
        out = self._linear(h, self.weights.tensors[name + ".weight"])
        bias = self.weights.tensors.get(name + ".bias")
        if bias is not None:  # qwen2's q/k/v biases: glue adds (counted by accounting)
            out += bias.data
        return out

    def _mlp(self, i: int, h: torch.Tensor) -> torch.Tensor:
        w, k_ = self.weights.tensors, f"blk.{i}."
        gate = self._linear(h, w[k_ + "ffn_gate.weight"])
        up = self._linear(h, w[k_ + "ffn_up.weight"])
        act = torch.empty_like(gate)
        self.kernels.call("silu_mul", act, gate, up)
        return self._linear(act, w[k_ + "ffn_down.weight"])

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        out = torch.empty_like(x)
        self.kernels.call("rmsnorm", out, x, self.weights.tensors[name].data,
                          eps=float(self.weights.config["rms_norm_eps"]))
        return out

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        self.kernels.call("rope", out, x.contiguous(), cos, sin)
        return out

    def _linear(self, x: torch.Tensor, w: Stored) -> torch.Tensor:
        out = torch.empty(x.shape[0], w.shape[0], dtype=torch.float32, device=self.device)
        self.kernels.call(LINEAR_OPS[w.kind], out, x, w.data)
        return out

    def _embed(self, tokens: list[int]) -> torch.Tensor:
        """Rows of token_embd for `tokens`, as float32 [T, hidden] (glue: a lookup, plus
        dequantising the looked-up rows of a quantised table — counted)."""
        table = self.weights.tensors[TOKEN_EMBD]
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        rows = table.data.index_select(0, ids)
        if table.kind.lower() in _quant.BLOCK_BYTES:
            return _quant.dequantize(table.kind.lower(), rows, table.shape[1],
                                     torch.float32).contiguous()
        return rows.float().contiguous()
