"""What each decoder block of a model costs a ring stage: the bytes it holds (weights + KV
cache at the context) and the bytes one decoded token reads, plus the first and the last
stage's extras. strata.ring.plan.partition splits by these, strata.ring.plan.timing turns
them into seconds."""

from __future__ import annotations

import re
from dataclasses import dataclass

from strata.fit.memory import LayerBytes
from strata.models.spec import TOKEN_EMBD, ModelSpec, is_expert_tensor

_BLOCK = re.compile(r"^(?:blk|model\.layers)\.(\d+)\.")  # fit.memory's block naming


@dataclass(frozen=True)
class LayerCosts:
    """Bytes per block, and what the first and last stages hold beside their blocks."""

    mem: tuple[int, ...]  # per block: weights + KV cache at ctx
    read: tuple[float, ...]  # per block: bytes one decoded token reads
    kv: tuple[int, ...]  # per block: the KV part of mem
    embed_mem: int  # first stage: token embedding (and any other non-block tensor)
    embed_read: float  # one embedding row per token (a lookup, not a stream)
    head_mem: int  # last stage: final norm + head (tied: a copy of the embedding)
    head_read: float  # the head streams whole
    tied_copy: int  # that copy: not needed when one member holds both ends

    @classmethod
    def of(cls, spec: ModelSpec, ctx: int, kv_elem_bytes: float) -> LayerCosts:
        groups = LayerBytes.of(spec)  # the same grouping `strata fit` places by
        n = spec.n_layers
        kv = [int(spec.kv_bytes(ctx, kv_elem_bytes) / n)] * n if n else []
        read = [float(k) for k in kv]  # decode at depth ctx reads the whole cache
        used = spec.n_experts_used / spec.n_experts if spec.is_moe else 1.0
        embed_read = 0.0
        for t in spec.tensors:
            m = _BLOCK.match(t.name)
            if m and int(m.group(1)) < n:
                share = used if spec.is_moe and is_expert_tensor(t.name) else 1.0
                read[int(m.group(1))] += t.nbytes * share
            elif t.name == TOKEN_EMBD:
                embed_read += t.nbytes / max(1, t.shape[0])  # one (hidden,) row of (vocab, hidden)
            elif t.name not in ("output.weight", "output_norm.weight"):
                embed_read += t.nbytes  # e.g. rope_freqs: small, read whole
        embd = spec.tensor(TOKEN_EMBD)
        tied = embd.nbytes if spec.tensor("output.weight") is None and embd is not None else 0
        return cls(tuple(b + k for b, k in zip(groups.blocks, kv, strict=True)), tuple(read),
                   tuple(kv), groups.input, embed_read, groups.output, float(groups.output),
                   tied)

    @property
    def n(self) -> int:
        return len(self.mem)

    def need(self, k: int) -> int:
        """Bytes k members hold together (one member keeps a tied head's single table)."""
        return sum(self.mem) + self.embed_mem + self.head_mem - (self.tied_copy if k == 1 else 0)
