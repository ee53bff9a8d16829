"""The kernel lab's ops: weights as stored, every op dispatched per device (docs §7).

Each call goes to the fastest verified kernel of the device (`strata.lab.kernels.Kernels`;
the built-ins are verified on first use), into an output allocated here. Torch is glue only:
the embedding lookup (the looked-up rows of a quantised table dequantised), and whatever the
executor does between ops (residual adds, the K/V writes, routing) — counted by
`strata.lab.accounting` where `-B lab` reports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from strata.engine.executor import KV_NAMES
from strata.engine.weights import ModelWeights, Stored, is_bias
from strata.errors import InputError
from strata.kernels.dispatch import KERNEL
from strata.lab.kernels import Kernels
from strata.lab.plan import (
    GLU_OPS,
    LINEAR_OPS,
    REPACKED,
    X8_OPS,
    attention_op,
    layer_ops,
    linear_op,
)


def lab_ops_for(weights: ModelWeights, kv: str = "f32") -> list[str]:
    """The lab ops a layer range runs over a `kv` K/V cache: the layer's own, one linear per
    matrix storage type."""
    matrices = {n: w for n, w in weights.tensors.items()
                if len(w.shape) >= 2 and not is_bias(n)}
    kinds = sorted({w.kind for w in matrices.values()})
    unread = [k for k in kinds if k not in LINEAR_OPS]
    if unread:
        first = next(n for n, w in matrices.items() if w.kind == unread[0])
        raise InputError(f"ops lab: no lab op multiplies {', '.join(unread)} weights yet "
                         f"({first} is {unread[0]}; strata fit MODEL -B lab lists what is "
                         "missing); use the torch ops (dequantised) or --backend llamacpp")
    windowed = any(weights.windowed(i) for i in range(weights.first, weights.last))
    layer = layer_ops(weights.arch.name, windowed, kv)
    x8 = [X8_OPS[REPACKED[k]] for k in kinds if k in REPACKED]  # used where they pay
    return [*layer, *(LINEAR_OPS[k] for k in kinds), *x8]


@dataclass
class LabOps:
    kernels: Kernels
    name: str = "lab"
    # (row, 0): what attention_sinks reads for a layer that attends to every position
    _full: torch.Tensor | None = None

    @classmethod
    def for_weights(cls, weights: ModelWeights, device: torch.device,
                    say: Callable[[str], None], conn: Any = None, kv: str = "f32"
                    ) -> LabOps:
        from strata.paths import default_db_path
        from strata.store import open_db

        ops = lab_ops_for(weights, kv)
        return cls(Kernels.resolve(ops, device, conn or open_db(default_db_path()), say))

    @property
    def device(self) -> torch.device:
        return self.kernels.device

    def prepare(self, name: str, w: Stored) -> Stored | torch.Tensor:
        # matrices as stored (the kernels read the blocks), Q4_K/Q6_K moved into the x8
        # layout where that pays (the same bytes); norms and biases are the float32 vectors
        # the ops and the glue take
        if len(w.shape) == 1 or is_bias(name):  # gpt-oss's expert biases [E, N] too
            return w.data
        if len(w.shape) == 2 and self.repacks(w.kind):
            from strata.kernels.ops import _kquant_x8

            kind = LINEAR_OPS[w.kind].removeprefix("linear_")
            packed = _kquant_x8.pack(kind, w.data, w.shape[1])
            return Stored(REPACKED[w.kind], packed, w.shape)
        return w

    def repacks(self, kind: str) -> bool:
        """Whether `kind` runs in the x8 layout here: where its x8 op is served by a SIMD
        kernel that needs at least the CPU features of the file-layout op's (a portable x8
        kernel gathers each row's bytes and loses to a tuned row kernel; the layout is what
        should make the difference, not a weaker instruction set)."""
        if kind not in REPACKED:
            return False
        row = self.kernels.choices.get(LINEAR_OPS[kind])
        x8 = self.kernels.choices.get(X8_OPS[REPACKED[kind]])
        if not (row and x8 and row.decision.outcome == KERNEL == x8.decision.outcome):
            return False
        row_isa, x8_isa = (set(c.decision.impl.requires.isa) for c in (row, x8))
        return bool(x8_isa) and x8_isa >= row_isa

    def nbytes(self, held: Stored | torch.Tensor) -> int:
        if isinstance(held, Stored):
            return held.nbytes
        return held.numel() * held.element_size()

    def embed(self, table: Stored, ids: torch.Tensor) -> torch.Tensor:
        from strata.kernels.ops import _kquant, _quant

        kind = linear_op(table.kind).removeprefix("linear_")  # q8_0, q4_K, q6_Kx8 ...
        if table.kind in X8_OPS:  # the ids' rows back in the file's layout
            from strata.kernels.ops import _kquant_x8

            kind = kind.removesuffix("x8")
            rows = _kquant_x8.rows(kind, table.data, ids, table.shape[1])
        else:
            rows = table.data.index_select(0, ids)
        for blocks in (_quant, _kquant):  # the looked-up rows' values, as the kernels read them
            if kind in blocks.BLOCK_BYTES:
                return blocks.dequantize(kind, rows, table.shape[1], torch.float32).contiguous()
        return rows.float().contiguous()

    def linear(self, x: torch.Tensor, w: Stored) -> torch.Tensor:
        out = torch.empty(x.shape[0], w.shape[-2], dtype=torch.float32, device=x.device)
        self.kernels.call(linear_op(w.kind), out, x.contiguous(), w.data)
        return out

    def expert(self, w: Stored | torch.Tensor, e: int) -> Stored | torch.Tensor:
        return w[e] if isinstance(w, torch.Tensor) else w.expert(e)  # a bias, or a matrix

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        self.kernels.call("rmsnorm", out, x, w, eps=eps)
        return out

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        self.kernels.call("rope", out, x, cos, sin)
        return out

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int,
                  pos_t: torch.Tensor, scale: float, window: int = 0,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
        q = q.contiguous()
        out = torch.empty_like(q)
        op = attention_op(sinks is not None, window > 0, KV_NAMES[k.dtype])
        if sinks is not None:  # (row, window) either way; a window of 0: every position
            self.kernels.call(op, out, q, k, v, pos_t if window > 0 else self._rows(pos),
                              sinks, scale=scale)
        else:  # pos_t holds (row, window) for the windowed op
            self.kernels.call(op, out, q, k, v, pos_t, scale=scale)
        return out

    def _rows(self, pos: int) -> torch.Tensor:
        if self._full is None:
            self._full = torch.zeros(2, dtype=torch.int64, device=self.device)
        self._full[0] = pos
        return self._full

    def glu(self, activation: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate = gate.contiguous()  # phi3's halves of one fused output are strided views
        out = torch.empty_like(gate)
        self.kernels.call(GLU_OPS[activation], out, gate, up.contiguous())
        return out
