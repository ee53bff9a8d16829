"""The routed-experts part of the bound decode step (`lab/decode.py`): every expert's calls
bound once per KV cache, the chosen ones run per token.

A decoded token's MoE layer is: the norm and the router's linear (bound calls), the router's
bias and the routing (glue: a top-k of E logits, strata.engine.moe by the architecture's
gating), then for each of the k chosen experts its gate and up projections, their biases
(gpt-oss; glue adds), the gate op and the down projection (bound calls), the down bias and the
weighted sum into the layer's output (glue). Binding all E experts' calls costs E·4 bound
calls per layer of memory (a few hundred bytes each) and nothing per token; only the k chosen
experts' weights are read, as in the forward pass (`engine/graph.py: experts`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from strata.engine import moe

Call = tuple[str, Callable[[], Any]]  # (op, bound kernel call)
Run = Callable[[list[Call]], None]


@dataclass
class ExpertBuffers:
    router: torch.Tensor  # [1, n_experts] the router's logits
    gate: torch.Tensor  # [1, expert_ffn]
    up: torch.Tensor
    act: torch.Tensor
    out: torch.Tensor  # [1, hidden] one expert's output

    @classmethod
    def allocate(cls, n_experts: int, expert_ffn: int, hidden: int, device: torch.device
                 ) -> ExpertBuffers:
        def z(n: int) -> torch.Tensor:
            return torch.zeros((1, n), dtype=torch.float32, device=device)

        return cls(z(n_experts), z(expert_ffn), z(expert_ffn), z(expert_ffn), z(hidden))


@dataclass
class ExpertCalls:
    """One expert of one layer: its projections, the gate op and down, bound."""

    up: list[Call]  # gate and up projections
    down: list[Call]  # the gate op, the down projection
    biases: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]  # gate/up/down


@dataclass
class MoeCalls:
    """One layer's routed experts; `__call__` leaves the layer's output in `out`."""

    router: list[Call]  # the norm, then the router's linear
    router_bias: torch.Tensor | None
    experts: list[ExpertCalls]
    n_used: int
    renormalise: bool
    gating: str

    def __call__(self, run: Run, buf: ExpertBuffers, out: torch.Tensor) -> None:
        run(self.router)
        if self.router_bias is not None:
            buf.router.add_(self.router_bias)
        ids, weights = moe.route(buf.router, self.n_used, self.renormalise, self.gating)
        out.zero_()
        for e, weight in zip(ids[0].tolist(), weights[0].tolist(), strict=True):
            expert = self.experts[e]
            run(expert.up)
            gate_b, up_b, down_b = expert.biases
            if gate_b is not None:
                buf.gate.add_(gate_b)
            if up_b is not None:
                buf.up.add_(up_b)
            run(expert.down)
            if down_b is not None:
                buf.out.add_(down_b)
            out.add_(buf.out, alpha=weight)


def bind_layer(step: Any, i: int, buf: ExpertBuffers, h: torch.Tensor, norm: Call
               ) -> MoeCalls:
    """Layer i's MoeCalls for a DecodeStep `step` (its _bind/_linear, its model), reading the
    normalised row `h` that `norm` writes."""
    m = step.model
    net, w = m.net, m.weights
    ops = net.ops

    def expert(e: int) -> ExpertCalls:
        gate, up, down = (ops.expert(net.w(i, r), e) for r in ("gate_exps", "up_exps",
                                                                "down_exps"))
        biases = tuple(None if (b := net.opt(i, f"{r}_bias")) is None else ops.expert(b, e)
                       for r in ("gate_exps", "up_exps", "down_exps"))
        return ExpertCalls(
            up=[step._linear(buf.gate, h, gate), step._linear(buf.up, h, up)],
            down=[step._bind(step.glu_op, buf.act, buf.gate, buf.up),
                  step._linear(buf.out, buf.act, down)],
            biases=biases)  # type: ignore[arg-type]

    return MoeCalls(router=[norm, step._linear(buf.router, h, net.w(i, "router"))],
                    router_bias=net.opt(i, "router_bias"),
                    experts=[expert(e) for e in range(w.spec.n_experts)],
                    n_used=w.spec.n_experts_used, renormalise=net.renormalise,
                    gating=w.arch.gating)
