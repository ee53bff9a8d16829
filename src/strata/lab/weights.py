"""A GGUF's tensors as `-B lab` reads them: every layer, as stored (strata.engine.weights).

`-B lab` runs dense models; a mixture-of-experts file is refused here in one line (the
engine's executor routes experts — a ring stage runs them — but the lab's plan, bound
decode step and accounting are per dense layer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from strata.engine.weights import ModelWeights, Stored, read_range
from strata.errors import InputError
from strata.models.spec import TOKEN_EMBD

__all__ = ["TOKEN_EMBD", "ModelWeights", "Stored", "read_weights", "refuse_experts"]


def read_weights(path: Path, device: torch.device) -> ModelWeights:
    """Every tensor of a GGUF as stored, on `device`; InputError lines for architectures,
    storage types or files the lab cannot run."""
    from strata.models.gguf import scan_or_input_error

    layout, _sizes = scan_or_input_error(path)
    refuse_experts(path, layout.kv.get("general.architecture"), layout.kv)
    return read_range(path, None, None, device, where="-B lab")


def refuse_experts(path: Path, arch: Any, kv: dict[str, Any]) -> None:
    """A mixture-of-experts GGUF ({arch}.expert_count > 0): one line, not a failure on the
    3-D expert tensors."""
    experts = kv.get(f"{arch}.expert_count")
    if isinstance(experts, int) and experts > 0:
        used = kv.get(f"{arch}.expert_used_count")
        raise InputError(f"MODEL {path}: a mixture-of-experts model ({experts} experts, {used} "
                         "per token): -B lab runs dense models only; use --backend llamacpp "
                         "(or strata ring, whose stages route experts)")
