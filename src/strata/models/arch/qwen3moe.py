"""qwen3moe: every q and k head RMS-normed before NeoX RoPE, no biases, and every layer's
tokens routed to experts (no dense FFN, no shared expert)."""

from strata.models.arch import register
from strata.models.arch.spec import ATTENTION, EXPERTS, QK_NORMS, Arch

ARCH = register(Arch("qwen3moe", (*ATTENTION, *QK_NORMS, *EXPERTS), rope="neox",
                     experts="always", model_type="qwen3_moe"))
