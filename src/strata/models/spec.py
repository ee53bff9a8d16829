"""ModelSpec: the shapes and exact per-tensor bytes of a model, whatever its source.

The roofline explanation stands on this: bytes read per decoded token come from the
actual stored tensor types (quantisation included), never from a params x bits guess.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

# Names (GGUF convention) of the token-embedding table and the output head.
TOKEN_EMBD = "token_embd.weight"
OUTPUT = "output.weight"

# Routed-expert tensors (mixture of experts), llama.cpp naming: the merged 3-D form
# "blk.N.ffn_{gate,up,down,gate_up}_exps.*" of today's converters (one slice per expert), and
# the per-expert form "blk.N.ffn_{gate,up,down}.E.weight" of old Mixtral GGUFs, which is also
# how strata names the per-expert tensors of a Hugging Face checkpoint. The router
# (ffn_gate_inp) and shared experts (*_shexp) are read for every token: not matched here.
EXPERT_TENSOR = re.compile(r"^blk\.\d+\.ffn_(?:[a-z]+_)*exps\."  # merged: one 3-D tensor
                           r"|^blk\.\d+\.ffn_(?:gate|up|down)\.\d+\.")  # one expert

# Fields only a mixture-of-experts spec carries (left out of a dense spec's dict).
MOE_FIELDS = ("n_experts", "n_experts_used", "expert_ffn")


def is_expert_tensor(name: str) -> bool:
    """True for a routed expert's weights (only n_experts_used of n_experts are read)."""
    return EXPERT_TENSOR.match(name) is not None


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
    # Mixture of experts (all 0 for a dense model): routed experts per MoE layer, how many
    # each token uses, and one expert's FFN width (moe_intermediate_size).
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn: int = 0
    # llama.cpp's name of the file's mix ("Q4_K_M", from general.file_type); None where the
    # source does not say (a Hugging Face checkpoint, an old GGUF)
    file_type: str | None = None
    # {arch}.attention.sliding_window: positions a windowed layer attends to (0: none); which
    # layers are windowed is the architecture's rule (windowed_layers)
    sliding_window: int = 0

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def windowed_layers(self) -> int:
        """Layers attending to the last `sliding_window` positions only, by the declared
        architecture's rule (0 for an architecture strata has not declared)."""
        if not self.sliding_window:
            return 0
        from strata.models import arch as registry

        a = registry.find(self.arch)
        return sum(a.windowed(i, self.sliding_window) for i in range(self.n_layers)) if a else 0

    # -- sizes ---------------------------------------------------------------------------
    def params(self) -> int:
        return sum(t.elements for t in self.tensors)

    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def tensor(self, name: str) -> TensorInfo | None:
        return next((t for t in self.tensors if t.name == name), None)

    def bytes_by_type(self) -> dict[str, int]:
        """Stored bytes per storage type, largest first (a K-quant file is a mix)."""
        by_type: dict[str, int] = {}
        for t in self.tensors:
            by_type[t.dtype] = by_type.get(t.dtype, 0) + t.nbytes
        return dict(sorted(by_type.items(), key=lambda kv: -kv[1]))

    def main_dtype(self) -> str:
        """The storage type holding most bytes (what a kernel mostly reads)."""
        return next(iter(self.bytes_by_type()), "?")

    def quant_label(self) -> str:
        """What people call the model's quantisation: the file's own mix name where it has
        one ("Q4_K_M": its largest type may be Q5_0 or Q8_0), else the largest type."""
        return self.file_type or self.main_dtype()

    # -- mixture of experts ----------------------------------------------------------------
    def expert_tensors(self) -> list[TensorInfo]:
        """The routed experts' tensors (all experts, every layer); [] for a dense model."""
        return [t for t in self.tensors if is_expert_tensor(t.name)] if self.is_moe else []

    def expert_bytes(self) -> int:
        """Stored bytes of all routed experts (every expert of every layer): memory, not
        traffic — a decoded token reads n_experts_used of them per layer."""
        return sum(t.nbytes for t in self.expert_tensors())

    def bytes_per_expert(self) -> int:
        """Stored bytes of one routed expert summed over the layers (experts of a layer have
        the same shapes and types, so this is exact)."""
        return self.expert_bytes() // self.n_experts if self.is_moe else 0

    def active_expert_bytes(self) -> int:
        """Expert bytes one decoded token reads: n_experts_used experts in every MoE layer."""
        return self.n_experts_used * self.bytes_per_expert()

    def shared_weight_bytes(self) -> int:
        """Bytes of everything but the routed experts (attention, norms, router, shared
        experts, embedding and head): the whole model when dense."""
        return self.weight_bytes() - self.expert_bytes()

    def expert_params(self) -> int:
        return sum(t.elements for t in self.expert_tensors())

    # -- roofline inputs (docs/architecture.md §5) ---------------------------------------
    def active_weight_bytes(self) -> int:
        """Weight bytes one decoded token reads.

        Every shared tensor (router included), and of the routed experts only the
        n_experts_used a token is sent to per layer. The token-embedding table is a lookup
        (one row), not a stream — unless it is tied to the output head, in which case the
        head streams it whole.
        """
        total = self.active_expert_bytes()
        for t in self.tensors:
            if self.is_moe and is_expert_tensor(t.name):
                continue
            if t.name == TOKEN_EMBD and not self.tied_embeddings:
                total += t.nbytes // max(1, t.shape[0])  # one row of (vocab, hidden)
            else:
                total += t.nbytes
        return total

    def streamed_weight_bytes(self) -> int:
        """The roofline's name for active_weight_bytes(): weight bytes per decoded token."""
        return self.active_weight_bytes()

    def kv_bytes(self, ctx: int, bytes_per_elem: float) -> float:
        """KV cache bytes at `ctx` tokens: 2 (K and V) x layers x kv_heads x head_dim x ctx."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * ctx * bytes_per_elem

    def bytes_per_decoded_token(self, depth: int, kv_bytes_per_elem: float) -> float:
        return self.streamed_weight_bytes() + self.kv_bytes(depth, kv_bytes_per_elem)

    def active_params(self) -> int:
        """Parameters that do multiply-adds per token: the embedding lookup does none, and
        of the routed experts only n_experts_used of n_experts work (the router does)."""
        n = self.params()
        if self.is_moe:
            n -= self.expert_params() * (self.n_experts - self.n_experts_used) // self.n_experts
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
        d.update(params=self.params(), weight_bytes=self.weight_bytes(), dtype=self.main_dtype(),
                 quant=self.quant_label(), bytes_by_type=self.bytes_by_type())
        if self.is_moe:
            d.update(expert_bytes=self.expert_bytes(),
                     active_weight_bytes=self.active_weight_bytes(),
                     active_params=self.active_params())
        else:  # a dense spec's dict is what it was before MoE existed
            for key in MOE_FIELDS:
                d.pop(key)
        if not self.sliding_window:  # and one without a window what it was before them
            d.pop("sliding_window")
        return d
