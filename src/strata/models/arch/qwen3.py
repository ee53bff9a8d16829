"""qwen3: Qwen 3 dense — every q and k head RMS-normed before NeoX RoPE, no biases, SwiGLU."""

from strata.models.arch import register
from strata.models.arch.spec import ATTENTION, DENSE_MLP, QK_NORMS, Arch

ARCH = register(Arch("qwen3", (*ATTENTION, *QK_NORMS, *DENSE_MLP), rope="neox",
                     model_type="qwen3",
                     transformers_extra={"use_sliding_window": False, "sliding_window": None}))
