"""RoPE tables: cos/sin [C, D/2] for every position up to a cache's capacity, computed once.

Angles in float64 then rounded to float32, so late positions keep their precision. Llama 3.x
frequency factors (rope_freqs.weight, or Phi-3's LongRoPE factors) divide the frequencies, as
ggml's rope does; linear scaling divides them by its factor; an attention factor (Phi-3's
{arch}.rope.scaling.attn_factor) multiplies every cos and sin, as ggml_rope_ext's attn_factor.

YaRN (gpt-oss: factor 32 over a 4 096-position original context), as ggml's rope_yarn: pair
i's angle blends the interpolated one (divided by the factor) and the extrapolated one
(unscaled) by a ramp that is 1 (extrapolate) below the correction dimension of `beta_fast`
rotations per original context, 0 (interpolate) above that of `beta_slow`, linear between
(both dimensions floored/ceiled and clamped, as ggml_rope_yarn_corr_dims); and every cos and
sin is multiplied by 1 + 0.1·ln(factor).
"""

from __future__ import annotations

import math
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
        mscale = float(config.get("rope_attn_factor") or 1.0)
        if scaling.get("rope_type") == "linear":
            inv = inv / float(scaling["factor"])
        if scaling.get("rope_type") == "yarn":
            inv, yarn_scale = _yarn(inv, d, float(config["rope_theta"]), scaling)
            mscale *= yarn_scale
        angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv[None, :]
        return cls((angles.cos() * mscale).float().to(device).contiguous(),
                   (angles.sin() * mscale).float().to(device).contiguous())


def _yarn(inv: torch.Tensor, dims: int, base: float, scaling: dict[str, Any]
          ) -> tuple[torch.Tensor, float]:
    """(the YaRN-blended inverse frequencies, the cos/sin scale); see the module docstring."""
    factor = float(scaling["factor"])
    original = float(scaling["original_max_position_embeddings"])

    def corr_dim(rotations: float) -> float:
        return dims * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(0.0, math.floor(corr_dim(float(scaling.get("beta_fast", 32.0)))))
    high = min(dims - 1.0, math.ceil(corr_dim(float(scaling.get("beta_slow", 1.0)))))
    pair = torch.arange(inv.numel(), dtype=torch.float64)
    extrapolate = 1.0 - ((pair - low) / max(0.001, high - low)).clamp(0.0, 1.0)
    blended = inv / factor * (1.0 - extrapolate) + inv * extrapolate
    return blended, 1.0 + 0.1 * math.log(factor)
