"""RoPE tables: cos/sin [C, D/2] for every position up to a cache's capacity, computed once.

Angles in float64 then rounded to float32, so late positions keep their precision. Llama 3.x
frequency factors (rope_freqs.weight, or Phi-3's LongRoPE factors) divide the frequencies, as
ggml's rope does; linear scaling divides them by its factor; an attention factor (Phi-3's
{arch}.rope.scaling.attn_factor) multiplies every cos and sin, as ggml_rope_ext's attn_factor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from strata.errors import InputError
from strata.models.arch.spec import ROPE_FREQS


@dataclass
class Rope:
    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def build(cls, head_dim: int, config: dict[str, Any], freqs: np.ndarray | None,
              positions: int, device: torch.device) -> Rope:
        d = head_dim
        inv = 1.0 / (float(config["rope_theta"]) **
                     (torch.arange(0, d, 2, dtype=torch.float64) / d))
        if freqs is not None:
            factors = torch.from_numpy(np.asarray(freqs, dtype=np.float64))
            if factors.shape != inv.shape:
                raise InputError(f"{ROPE_FREQS}: {factors.numel()} factors for "
                                 f"{inv.numel()} rotary frequencies")
            inv = inv / factors
        scaling = config.get("rope_scaling") or {}
        if scaling.get("rope_type") == "linear":
            inv = inv / float(scaling["factor"])
        angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv[None, :]
        mscale = float(config.get("rope_attn_factor") or 1.0)
        return cls((angles.cos() * mscale).float().to(device).contiguous(),
                   (angles.sin() * mscale).float().to(device).contiguous())
