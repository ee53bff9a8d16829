"""qwen2: Qwen 2 / 2.5 — q/k/v biases, NeoX RoPE on rows as stored."""

from strata.models.arch import register
from strata.models.arch.spec import ATTENTION, DENSE_MLP, QKV_BIASES, Arch

ARCH = register(Arch("qwen2", (*ATTENTION, *QKV_BIASES, *DENSE_MLP), rope="neox",
                     model_type="qwen2",
                     transformers_extra={"use_sliding_window": False,
                                         "sliding_window": None}))
