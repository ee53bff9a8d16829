"""One decode step with every kernel call bound once: the per-token cost is the kernels.

A decode step makes ~13 kernel calls per layer; binding each call anew (contract, ctypes
arguments) cost about as much as the kernels themselves on a 135M model. Here the step's
buffers are allocated once per KV cache and every call is bound to them up front
(`strata.kernels.Choice.bound`), so a token is: the embedding row into `x`, the position
into the rope and attention inputs, then the bound calls in order, with the K/V writes into
the cache and the residual and bias adds between them. All of that is one program
(`lab/runner.py`): strata's C runner takes the in-process kernels and that glue in a single
call per stretch (~0.9 ms/token less than calling each from Python on a 30-layer model);
what it cannot take (a confined kernel, a torch stand-in, the MoE routing) runs from Python
in place. The profile mode runs every step from Python, each kernel timed.

With T = 1 the [T, H, D] rows the projections produce are already the [H, T, D] layout
attention takes, and its [H, T, D] output is the [T, H·D] row the output projection reads:
no transposing copies.

The declared variants bind too: per-head q/k norms (qwen3, gemma3: rmsnorm over the [H, D]
rows), Gemma's post-attention and post-MLP norms, the MLP's gate op (silu_mul or gelu_mul),
the embedding scale (glue: one multiply) and sliding-window layers (attention_window over
their short cache, their own RoPE rows, their K/V written at the cache's row of the position),
gpt-oss's attention sinks (attention_sinks on both kinds of layer) and output-projection
bias, and routed experts (`lab/decode_moe.py`: every expert bound, the chosen ones run).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from strata.engine import graph
from strata.engine.executor import KV_NAMES
from strata.hardware.devices import sync
from strata.lab import decode_moe, runner
from strata.lab.plan import GLU_OPS, attention_op, linear_op

if TYPE_CHECKING:
    from strata.engine.executor import Executor
    from strata.lab.kernels import Kernels

Call = tuple[str, Callable[[], Any]]  # (op, bound kernel call)


@dataclass
class Buffers:
    x: torch.Tensor  # [1, hidden] the residual stream
    h: torch.Tensor  # [1, hidden] a normalised copy
    qkv: torch.Tensor  # [1, (H + 2 Hkv) D]: q, k, v side by side (phi3 fills it at once)
    q: torch.Tensor  # [1, H*D], a view of qkv
    k: torch.Tensor  # [1, Hkv*D]
    v: torch.Tensor
    qr: torch.Tensor  # [1, H, D] = [H, 1, D] after rope
    kr: torch.Tensor  # [1, Hkv, D]
    o: torch.Tensor  # [H, 1, D] = [1, H*D]
    proj: torch.Tensor  # [1, hidden] attention or MLP output
    gate_up: torch.Tensor  # [1, 2 ffn]: gate, up side by side (phi3 fills it at once)
    gate: torch.Tensor  # [1, ffn], a view of gate_up
    up: torch.Tensor
    act: torch.Tensor
    cos: torch.Tensor  # [1, D/2] this position's rope row
    sin: torch.Tensor
    cos_w: torch.Tensor  # the windowed layers' rope row (their own base)
    sin_w: torch.Tensor
    qn: torch.Tensor  # [H, D] q after its per-head norm
    kn: torch.Tensor  # [Hkv, D]
    post: torch.Tensor  # [1, hidden] a branch's output after its post-norm
    logits: torch.Tensor  # [1, vocab]

    @classmethod
    def allocate(cls, m: Executor) -> Buffers:
        s, dev = m.weights.spec, m.device

        def z(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.float32, device=dev)

        d, hd, kvd = s.head_dim, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
        qkv, gate_up = z(1, hd + 2 * kvd), z(1, 2 * s.ffn)
        return cls(x=z(1, s.hidden), h=z(1, s.hidden), qkv=qkv, q=qkv[:, :hd],
                   k=qkv[:, hd:hd + kvd], v=qkv[:, hd + kvd:],
                   qr=z(1, s.n_heads, d), kr=z(1, s.n_kv_heads, d), o=z(s.n_heads, 1, d),
                   proj=z(1, s.hidden), gate_up=gate_up, gate=gate_up[:, :s.ffn],
                   up=gate_up[:, s.ffn:], act=z(1, s.ffn),
                   cos=z(1, d // 2), sin=z(1, d // 2), cos_w=z(1, d // 2), sin_w=z(1, d // 2),
                   qn=z(s.n_heads, d), kn=z(s.n_kv_heads, d), post=z(1, s.hidden),
                   logits=z(1, m.vocab if m.is_last else 0))


@dataclass
class LayerCalls:
    """One layer's bound calls, in order, split where torch glue runs between them."""

    qkv: list[Call]  # attn_norm, q, k, v projections
    biases: tuple[torch.Tensor | None, ...]  # qwen2's q/k/v biases (glue adds)
    rope: list[Call]  # q/k head norms where declared, then the rotation of q and k
    attend: list[Call]  # attention over the cache (after the K/V write), output projection
    mlp: list[Call]  # ffn_norm, gate, up, the gate op, down
    post_attn: list[Call]  # Gemma's post-norms (the residual adds `post`), else empty
    post_mlp: list[Call]
    windowed: bool  # a sliding-window layer
    o_bias: torch.Tensor | None = None  # gpt-oss's output-projection bias (glue adds)
    moe: decode_moe.MoeCalls | None = None  # routed experts (then `mlp` is empty)


@dataclass
class DecodeStep:
    model: Executor  # with the lab's ops (LabModel, or a ring stage's executor)
    buf: Buffers
    layers: list[LayerCalls] = field(default_factory=list)
    head: list[Call] = field(default_factory=list)
    experts: decode_moe.ExpertBuffers | None = None
    # (position, 0): what attention_sinks reads on a layer that attends to every position
    full_t: torch.Tensor = field(default_factory=lambda: torch.zeros(2, dtype=torch.int64))
    program: runner.Program = field(default_factory=lambda: runner.Program([]))

    @classmethod
    def build(cls, m: Executor) -> DecodeStep:
        step = cls(m, Buffers.allocate(m))
        s = m.weights.spec
        step.full_t = step.full_t.to(m.device)
        if m.weights.moe:
            step.experts = decode_moe.ExpertBuffers.allocate(s.n_experts, s.expert_ffn,
                                                             s.hidden, m.device)
        step.layers = [step._layer(i) for i in range(m.first, m.last)]
        b, w = step.buf, m.weights
        if m.is_last:  # a ring stage before the last hands its residual stream on instead
            step.head = [step._bind("rmsnorm", b.h, b.x, w.tensors["output_norm.weight"].data,
                                    eps=step._eps),
                         step._linear(b.logits, b.h, w.head())]
        step.program = runner.Program(step._steps())
        return step

    @property
    def glu_op(self) -> str:
        return GLU_OPS[self.model.weights.arch.activation]

    @property
    def _eps(self) -> float:
        return float(self.model.weights.config["rms_norm_eps"])

    def _bind(self, op: str, out: torch.Tensor, *inputs: torch.Tensor, **params: Any) -> Call:
        return op, self.kernels.choices[op].bound(out, *inputs, **params)

    def _linear(self, out: torch.Tensor, x: torch.Tensor, w: Any) -> Call:
        return self._bind(linear_op(w.kind), out, x, w.data)

    def _layer(self, i: int) -> LayerCalls:
        m, b, net = self.model, self.buf, self.model.net
        s, cache, local = m.weights.spec, m.cache, i - m.first
        assert cache is not None
        d, h, hkv = s.head_dim, s.n_heads, s.n_kv_heads
        windowed = cache.windowed[local]
        cos, sin = (b.cos_w, b.sin_w) if windowed else (b.cos, b.sin)
        rope, rotated = [], []
        for role, src, normed, heads in (("q_norm", b.q, b.qn, h), ("k_norm", b.k, b.kn, hkv)):
            if net.opt(i, role) is not None:  # the heads' norm, then rope reads its output
                rope.append(self._bind("rmsnorm", normed, src.view(-1, d), net.w(i, role),
                                       eps=self._eps))
                src = normed
            rotated.append(src.view(1, heads, d))
        rope += [self._bind("rope", b.qr, rotated[0], cos, sin),
                 self._bind("rope", b.kr, rotated[1], cos, sin)]
        attend = self._attend(i, windowed)
        fused = "qkv" in net.roles  # phi3: one matrix each for q/k/v and for gate/up
        projections = [self._linear(b.qkv, b.h, net.w(i, "qkv"))] if fused else \
            [self._linear(out, b.h, net.w(i, r)) for out, r in ((b.q, "q"), (b.k, "k"),
                                                                 (b.v, "v"))]

        def gate_up() -> list[Call]:  # the dense MLP's
            if "gate_up" in net.roles:
                return [self._linear(b.gate_up, b.h, net.w(i, "gate_up"))]
            return [self._linear(b.gate, b.h, net.w(i, "gate")),
                    self._linear(b.up, b.h, net.w(i, "up"))]

        ffn_norm = self._bind("rmsnorm", b.h, b.x, net.w(i, "ffn_norm"), eps=self._eps)
        return LayerCalls(
            qkv=[self._bind("rmsnorm", b.h, b.x, net.w(i, "attn_norm"), eps=self._eps),
                 *projections],
            biases=tuple(net.opt(i, f"{n}_bias") for n in "qkv"),
            rope=rope,
            attend=[attend, self._linear(b.proj, b.o.view(1, h * d), net.w(i, "o"))],
            mlp=[] if m.weights.moe else [ffn_norm, *gate_up(),
                                          self._bind(self.glu_op, b.act, b.gate, b.up),
                                          self._linear(b.proj, b.act, net.w(i, "down"))],
            post_attn=self._post(i, "attn_post_norm"), post_mlp=self._post(i, "ffn_post_norm"),
            windowed=windowed, o_bias=net.opt(i, "o_bias"),
            moe=decode_moe.bind_layer(self, i, self.experts, b.h, ffn_norm)
            if self.experts is not None else None)

    def _attend(self, i: int, windowed: bool) -> Call:
        """Layer i's attention over its cache: attention_sinks where the layer has sinks
        (its position tensor holds the window, 0 on a global layer), else attention_cached
        or, windowed, attention_window — each the *_f16 op over a float16 cache."""
        m, b, cache = self.model, self.buf, self.model.cache
        assert cache is not None
        s, local = m.weights.spec, i - m.first
        q, k, v = b.qr.view(s.n_heads, 1, s.head_dim), cache.k[local], cache.v[local]
        scale = 1.0 / math.sqrt(s.head_dim)
        sinks = m.net.opt(i, "sinks")
        op = attention_op(sinks is not None, windowed, KV_NAMES[k.dtype])
        if sinks is not None:
            return self._bind(op, b.o, q, k, v, m._row_t if windowed else self.full_t,
                              sinks, scale=scale)
        return self._bind(op, b.o, q, k, v, m._row_t if windowed else m._pos_t, scale=scale)

    def _post(self, i: int, role: str) -> list[Call]:
        w = self.model.net.opt(i, role)
        b = self.buf
        return [] if w is None else [self._bind("rmsnorm", b.post, b.proj, w, eps=self._eps)]

    # -- the program: every layer's calls and glue, in order --------------------------------

    def _steps(self) -> list[runner.Step]:
        m, b, cache = self.model, self.buf, self.model.cache
        assert cache is not None
        d = m.weights.spec.head_dim

        def kernels(calls: list[Call]) -> list[runner.Step]:
            return [runner.kernel_step(op, call) for op, call in calls]

        steps: list[runner.Step] = []
        for i, layer in enumerate(self.layers):
            steps += kernels(layer.qkv)
            steps += [runner.add_step(out, bias)
                      for out, bias in zip((b.q, b.k, b.v), layer.biases, strict=True)
                      if bias is not None]
            steps += kernels(layer.rope)
            at = m._row_t if layer.windowed else m._pos_t  # the cache row of this position
            steps += [runner.kv_step(cache.k[i], b.kr[0], at),
                      runner.kv_step(cache.v[i], b.v.view(-1, d), at)]
            steps += kernels(layer.attend)
            if layer.o_bias is not None:
                steps.append(runner.add_step(b.proj, layer.o_bias))
            steps += kernels(layer.post_attn)
            steps.append(runner.add_step(b.x, b.post if layer.post_attn else b.proj))
            steps += kernels(layer.mlp)
            if layer.moe is not None:
                steps.append(runner.Step(runner.GLUE, functools.partial(self._moe, layer.moe)))
            steps += kernels(layer.post_mlp)
            steps.append(runner.add_step(b.x, b.post if layer.post_mlp else b.proj))
        return steps + kernels(self.head)

    def _moe(self, calls: decode_moe.MoeCalls) -> None:
        assert self.experts is not None
        calls(self._timed if self.kernels.profile else _run, self.experts, self.buf.proj)

    # -- one token ------------------------------------------------------------------------

    def __call__(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        """Position `pos` through the model's (or the stage's) layers: x is the token id [1]
        on the first range, the previous range's residual stream [1, hidden] otherwise.
        Returns the logits [1, vocab] on the last range, else the residual stream."""
        m, b, cache = self.model, self.buf, self.model.cache
        assert cache is not None and m.rope is not None and m.rope_windowed is not None
        if not 0 <= pos < cache.capacity:
            raise ValueError(f"position {pos} is outside the cache's {cache.capacity}")
        if m.is_first:  # the embedding scale included (graph.embed)
            b.x.copy_(graph.embed(m.net, x.to(m.device)))
        else:
            b.x.copy_(x.reshape(b.x.shape))
        cache.slide(pos, 1)
        m._pos_t.fill_(pos)
        m._row_t[0] = pos - cache.base  # a windowed layer's row of this position
        self.full_t[0] = pos
        b.cos.copy_(m.rope.cos[pos:pos + 1])
        b.sin.copy_(m.rope.sin[pos:pos + 1])
        b.cos_w.copy_(m.rope_windowed.cos[pos:pos + 1])
        b.sin_w.copy_(m.rope_windowed.sin[pos:pos + 1])
        if self.kernels.profile:  # each kernel timed on its own, the glue untimed between
            for s in self.program.steps:
                if s.op == runner.GLUE:
                    s.call()
                else:
                    self._timed([(s.op, s.call)])
        else:
            self.program()
        m.pos = pos + 1
        return b.logits.clone() if m.is_last else b.x.clone()

    @property
    def kernels(self) -> Kernels:
        return self.model.ops.kernels  # type: ignore[attr-defined]

    def _timed(self, calls: list[Call]) -> None:
        k = self.kernels
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

