"""ModelSpec: the shapes and exact per-tensor bytes of a model, whatever its source.

The roofline explanation stands on this: bytes read per decoded token come from the
actual stored tensor types (quantisation included), never from a params x bits guess.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Names (GGUF convention) of the token-embedding table and the output head.
TOKEN_EMBD = "token_embd.weight"
OUTPUT = "output.weight"


@dataclass(frozen=True)
class TensorInfo:
    name: str  # GGUF naming: "blk.0.attn_q.weight", "token_embd.weight", ...
    shape: tuple[int, ...]  # PyTorch (row-major) order: (out_features, in_features); GGUF's
    # ne[] lists dimensions the other way round
    dtype: str  # storage type: "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", ...
    nbytes: int  # exact bytes as stored

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class ModelSpec:
    name: str
    arch: str  # "llama", "qwen2", ...
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden: int
    ffn: int
    vocab: int
    ctx_max: int
    tied_embeddings: bool
    tensors: list[TensorInfo] = field(default_factory=list)
    source: str = ""  # "gguf", "hf", "synthetic", "endpoint"
    notes: list[str] = field(default_factory=list)  # caveats, e.g. "torch runs it unquantised"

    # -- sizes ---------------------------------------------------------------------------
    def params(self) -> int:
        return sum(t.elements for t in self.tensors)

    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def tensor(self, name: str) -> TensorInfo | None:
        return next((t for t in self.tensors if t.name == name), None)

    def main_dtype(self) -> str:
        """The storage type holding most bytes (what people call the model's quant)."""
        by_type: dict[str, int] = {}
        for t in self.tensors:
            by_type[t.dtype] = by_type.get(t.dtype, 0) + t.nbytes
        return max(by_type, key=by_type.__getitem__) if by_type else "?"

    # -- roofline inputs (docs/architecture.md §5) ---------------------------------------
    def streamed_weight_bytes(self) -> int:
        """Weight bytes one decoded token reads.

        The token-embedding table is a lookup (one row), not a stream — unless it is tied to
        the output head, in which case the head streams it whole.
        """
        total = 0
        for t in self.tensors:
            if t.name == TOKEN_EMBD and not self.tied_embeddings:
                total += t.nbytes // max(1, t.shape[0])  # one row of (vocab, hidden)
            else:
                total += t.nbytes
        return total

    def kv_bytes(self, ctx: int, bytes_per_elem: float) -> float:
        """KV cache bytes at `ctx` tokens: 2 (K and V) x layers x kv_heads x head_dim x ctx."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * ctx * bytes_per_elem

    def bytes_per_decoded_token(self, depth: int, kv_bytes_per_elem: float) -> float:
        return self.streamed_weight_bytes() + self.kv_bytes(depth, kv_bytes_per_elem)

    def active_params(self) -> int:
        """Parameters that do multiply-adds per token (the embedding lookup does none)."""
        n = self.params()
        embd = self.tensor(TOKEN_EMBD)
        if embd is not None and not self.tied_embeddings:
            n -= embd.elements
        return n

    def head_params(self) -> int:
        """Parameters of the output head (the embedding table when tied)."""
        head = self.tensor(OUTPUT) or (self.tensor(TOKEN_EMBD) if self.tied_embeddings else None)
        return head.elements if head is not None else 0

    def flops_per_token(self, ctx: int, logits_share: float = 1.0) -> float:
        """2 x active params + attention (QK^T and AV: 2 x 2 x layers x heads x head_dim x ctx).

        `logits_share` is the fraction of tokens whose logits are computed: a prompt of N
        tokens needs the output head for its last token only (1 / N), a decode step for each.
        """
        attention = 4 * self.n_layers * self.n_heads * self.head_dim * ctx
        head = self.head_params()
        return 2 * (self.active_params() - head + head * logits_share) + attention

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tensors"] = len(self.tensors)
        d.update(params=self.params(), weight_bytes=self.weight_bytes(), dtype=self.main_dtype())
        return d
