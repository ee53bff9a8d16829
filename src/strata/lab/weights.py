"""A GGUF's tensors as `-B lab` reads them: every layer, as stored (strata.engine.weights).

Mixture-of-experts files included: the engine's executor routes each token to its experts
and multiplies by those experts' blocks only, on the lab's linear kernels.
"""

from __future__ import annotations

from pathlib import Path

import torch

from strata.engine.weights import ModelWeights, Stored, read_range
from strata.models.spec import TOKEN_EMBD

__all__ = ["TOKEN_EMBD", "ModelWeights", "Stored", "read_weights"]


def read_weights(path: Path, device: torch.device) -> ModelWeights:
    """Every tensor of a GGUF as stored, on `device`; InputError lines for architectures,
    storage types or files the lab cannot run."""
    return read_range(path, None, None, device, where="-B lab")
