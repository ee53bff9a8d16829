"""One decode step with every kernel call bound once: the per-token cost is the kernels.

A decode step makes ~13 kernel calls per layer; binding each call anew (contract, ctypes
arguments) cost about as much as the kernels themselves on a 135M model. Here the step's
buffers are allocated once per KV cache and every call is bound to them up front
(`strata.kernels.Choice.bound`), so a token is: the embedding row into `x`, the position
into the rope and attention inputs, then the bound calls in order, with the K/V writes into
the cache and the residual adds as the only torch work between them.

With T = 1 the [T, H, D] rows the projections produce are already the [H, T, D] layout
attention takes, and its [H, T, D] output is the [T, H·D] row the output projection reads:
no transposing copies.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from strata.hardware.devices import sync
from strata.lab.plan import linear_op

if TYPE_CHECKING:
    from strata.lab.model import LabModel

Call = tuple[str, Callable[[], Any]]  # (op, bound kernel call)


@dataclass
class Buffers:
    x: torch.Tensor  # [1, hidden] the residual stream
    h: torch.Tensor  # [1, hidden] a normalised copy
    q: torch.Tensor  # [1, H*D]
    k: torch.Tensor  # [1, Hkv*D]
    v: torch.Tensor
    qr: torch.Tensor  # [1, H, D] = [H, 1, D] after rope
    kr: torch.Tensor  # [1, Hkv, D]
    o: torch.Tensor  # [H, 1, D] = [1, H*D]
    proj: torch.Tensor  # [1, hidden] attention or MLP output
    gate: torch.Tensor  # [1, ffn]
    up: torch.Tensor
    act: torch.Tensor
    cos: torch.Tensor  # [1, D/2] this position's rope row
    sin: torch.Tensor
    logits: torch.Tensor  # [1, vocab]

    @classmethod
    def allocate(cls, m: LabModel) -> Buffers:
        s, dev = m.weights.spec, m.device

        def z(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.float32, device=dev)

        d = s.head_dim
        return cls(x=z(1, s.hidden), h=z(1, s.hidden), q=z(1, s.n_heads * d),
                   k=z(1, s.n_kv_heads * d), v=z(1, s.n_kv_heads * d),
                   qr=z(1, s.n_heads, d), kr=z(1, s.n_kv_heads, d), o=z(s.n_heads, 1, d),
                   proj=z(1, s.hidden), gate=z(1, s.ffn), up=z(1, s.ffn), act=z(1, s.ffn),
                   cos=z(1, d // 2), sin=z(1, d // 2), logits=z(1, m.vocab))


@dataclass
class LayerCalls:
    """One layer's bound calls, in order, split where torch glue runs between them."""

    qkv: list[Call]  # attn_norm, q, k, v projections
    biases: tuple[torch.Tensor | None, ...]  # qwen2's q/k/v biases (glue adds)
    rope: list[Call]  # q, k
    attend: list[Call]  # attention over the cache (after the K/V write), output projection
    mlp: list[Call]  # ffn_norm, gate, up, silu_mul, down


@dataclass
class DecodeStep:
    model: LabModel
    buf: Buffers
    layers: list[LayerCalls] = field(default_factory=list)
    head: list[Call] = field(default_factory=list)

    @staticmethod
    def fits(m: LabModel) -> bool:
        """Is every layer the plain dense one bound here (no q/k norms, experts, other
        activations or embedding scale)? Other layers decode through the forward pass."""
        a = m.weights.arch
        return not (m.weights.moe or a.has("q_norm") or a.has("k_norm")
                    or a.activation != "silu" or a.embed_scale != "none")

    @classmethod
    def build(cls, m: LabModel) -> DecodeStep:
        step = cls(m, Buffers.allocate(m))
        step.layers = [step._layer(i) for i in range(m.weights.spec.n_layers)]
        b, w = step.buf, m.weights
        step.head = [step._bind("rmsnorm", b.h, b.x, w.tensors["output_norm.weight"].data,
                                eps=step._eps),
                     step._linear(b.logits, b.h, w.head())]
        return step

    @property
    def _eps(self) -> float:
        return float(self.model.weights.config["rms_norm_eps"])

    def _bind(self, op: str, out: torch.Tensor, *inputs: torch.Tensor, **params: Any) -> Call:
        return op, self.model.kernels.choices[op].bound(out, *inputs, **params)

    def _linear(self, out: torch.Tensor, x: torch.Tensor, w: Any) -> Call:
        return self._bind(linear_op(w.kind), out, x, w.data)

    def _layer(self, i: int) -> LayerCalls:
        m, b, t = self.model, self.buf, self.model.weights.tensors
        s, cache, p = m.weights.spec, m.cache, f"blk.{i}."
        assert cache is not None
        d = s.head_dim
        bias = tuple(t[p + f"attn_{n}.bias"].data if p + f"attn_{n}.bias" in t else None
                     for n in "qkv")
        return LayerCalls(
            qkv=[self._bind("rmsnorm", b.h, b.x, t[p + "attn_norm.weight"].data,
                            eps=self._eps),
                 self._linear(b.q, b.h, t[p + "attn_q.weight"]),
                 self._linear(b.k, b.h, t[p + "attn_k.weight"]),
                 self._linear(b.v, b.h, t[p + "attn_v.weight"])],
            biases=bias,
            rope=[self._bind("rope", b.qr, b.q.view(1, s.n_heads, d), b.cos, b.sin),
                  self._bind("rope", b.kr, b.k.view(1, s.n_kv_heads, d), b.cos, b.sin)],
            attend=[self._bind("attention_cached", b.o, b.qr.view(s.n_heads, 1, d),
                               cache.k[i], cache.v[i], m._pos_t, scale=1.0 / math.sqrt(d)),
                    self._linear(b.proj, b.o.view(1, s.n_heads * d),
                                 t[p + "attn_output.weight"])],
            mlp=[self._bind("rmsnorm", b.h, b.x, t[p + "ffn_norm.weight"].data,
                            eps=self._eps),
                 self._linear(b.gate, b.h, t[p + "ffn_gate.weight"]),
                 self._linear(b.up, b.h, t[p + "ffn_up.weight"]),
                 self._bind("silu_mul", b.act, b.gate, b.up),
                 self._linear(b.proj, b.act, t[p + "ffn_down.weight"])])

    # -- one token ------------------------------------------------------------------------

    def __call__(self, token: int) -> torch.Tensor:
        m, b = self.model, self.buf
        assert m.cache is not None and m.rope is not None
        pos, d = m.pos, m.weights.spec.head_dim
        b.x.copy_(m._embed_ids([token]))
        m._pos_t.fill_(pos)
        b.cos.copy_(m.rope.cos[pos:pos + 1])
        b.sin.copy_(m.rope.sin[pos:pos + 1])
        run = self._timed if m.kernels.profile else _run
        for i, layer in enumerate(self.layers):
            run(layer.qkv)
            for out, bias in zip((b.q, b.k, b.v), layer.biases, strict=True):
                if bias is not None:
                    out.add_(bias)
            run(layer.rope)
            m.cache.k[i][:, pos].copy_(b.kr[0])
            m.cache.v[i][:, pos].copy_(b.v.view(-1, d))
            run(layer.attend)
            b.x.add_(b.proj)
            run(layer.mlp)
            b.x.add_(b.proj)
        run(self.head)
        m.pos += 1
        return b.logits.clone()

    def _timed(self, calls: list[Call]) -> None:
        k = self.model.kernels
        for op, call in calls:
            sync(k.device)
            t0 = time.perf_counter()
            call()
            sync(k.device)
            k.seconds[op] += time.perf_counter() - t0
            k.calls[op] += 1


def _run(calls: list[Call]) -> None:
    for _op, call in calls:
        call()

