"""A model on lab kernels: the engine's executor over every layer with the lab's ops, plus
prompt chunking and the bound decode step.

The forward pass is `strata.engine.executor` (one definition for lab, ring and the torch
twin) with `strata.engine.ops_lab`: rmsnorm, one `linear_<type>` per weight storage type
(decode is B = 1, prefill B = the chunk's tokens), rope, the cached attention, silu_mul and
the output head, each dispatched per device. Glue in torch: views and transposing copies into
the attention layout, writes into the KV cache, the embedding lookup (a row dequantised per
token) and the residual and bias adds — what torch computes is observed per decode step
(`lab/accounting.py`) and reported.

Prompts are processed in chunks of `ubatch` tokens (llama.cpp's n_ubatch), so activation
memory stays bounded for long prompts. A decode step binds every kernel call once per cache
(`lab/decode.py`; routed experts: every expert's calls, `lab/decode_moe.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from strata.engine.executor import Executor
from strata.lab.kernels import Kernels

UBATCH = 512


@dataclass
class LabModel(Executor):
    ubatch: int = UBATCH
    threads: int = 0  # the thread team it was loaded with (hardware/threads.py)
    _step: Any = None  # lab.decode.DecodeStep, built on the first decode after a new cache

    @property
    def kernels(self) -> Kernels:
        return self.ops.kernels  # type: ignore[attr-defined]

    def _on_new_cache(self) -> None:
        self._step = None  # bound to the old cache

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
        """One token after the cache: its logits [1, vocab]."""
        from strata.lab.decode import DecodeStep

        assert self.cache is not None, "reset() first"
        if self.pos + 1 > self.cache.capacity:
            raise ValueError(f"{self.pos + 1} positions exceed the cache's "
                             f"{self.cache.capacity}")
        if self._step is None:
            self._step = DecodeStep.build(self)
        return self._step(torch.tensor([token], dtype=torch.long), self.pos)

    def _forward(self, tokens: list[int], logits_from: int | None) -> torch.Tensor | None:
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        return self.forward(ids, self.pos, logits_from)
