"""Shared by the causal depthwise conv1d ops: the published model sizes they are measured at
(models/data/ssm_configs.json, sourced), the reference and the inputs."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from strata.kernels.spec import floats


@lru_cache(maxsize=1)
def ssm_configs() -> dict[str, dict[str, Any]]:
    text = resources.files("strata.models").joinpath("data", "ssm_configs.json").read_text()
    return json.loads(text)["models"]


def conv_channels() -> list[tuple[int, int]]:
    """(channels, kernel width) of each published state-space model, deduplicated."""
    return sorted({(m["conv_channels"], m["d_conv"]) for m in ssm_configs().values()})


def weights(s: dict[str, int], dtype: str, seed: int, device: str) -> list[Any]:
    """w [C,K] (each channel's own filter) and b [C]."""
    return [floats((s["C"], s["K"]), dtype, seed, device, offset=1),
            floats((s["C"],), dtype, seed, device, offset=2)]


def causal_conv(x: Any, w: Any, b: Any) -> Any:
    """out[b,c,t] = b[c] + Σ_k w[c,k]·x[b,c,t-(K-1)+k], x before t = 0 read as 0."""
    import torch.nn.functional as F

    k = w.shape[1]
    return F.conv1d(F.pad(x, (k - 1, 0)), w.unsqueeze(1), b, groups=x.shape[1])
