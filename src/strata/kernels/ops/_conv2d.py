"""Shared by the conv2d ops: the published vision layers they are measured at
(models/data/vision_configs.json, sourced), the geometry input, the reference and the shape
sets. Stride and padding travel in a small int64 tensor `geom` = [S, P] (like
attention_cached's pos): the C ABI passes tensors and sizes, and the judge can vary them."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from strata.kernels.spec import Shape


@lru_cache(maxsize=1)
def vision_configs() -> dict[str, dict[str, Any]]:
    text = resources.files("strata.models").joinpath("data", "vision_configs.json").read_text()
    return json.loads(text)["models"]


KEYS = ("N", "H", "W", "C", "O", "K", "G", "S", "P")


def layer_shapes() -> list[Shape]:
    """One image (N = 1) through every published layer, deduplicated, in file order."""
    seen: dict[tuple[int, ...], Shape] = {}
    for model in vision_configs().values():
        for layer in model["layers"]:
            s = {"N": 1, "H": layer["H"], "W": layer["H"], **{k: layer[k] for k in
                                                             ("C", "O", "K", "G", "S", "P")}}
            seen.setdefault(tuple(s[k] for k in KEYS), {k: s[k] for k in KEYS})
    return list(seen.values())


def out_hw(s: Shape) -> tuple[int, int]:
    return ((s["H"] + 2 * s["P"] - s["K"]) // s["S"] + 1,
            (s["W"] + 2 * s["P"] - s["K"]) // s["S"] + 1)


def flops(s: Shape) -> float:
    ho, wo = out_hw(s)
    return 2.0 * s["N"] * ho * wo * s["O"] * s["K"] * s["K"] * (s["C"] // s["G"])


def nbytes(s: Shape, e: int) -> float:
    ho, wo = out_hw(s)
    return float(e * (s["N"] * s["H"] * s["W"] * s["C"] + s["O"] * s["K"] * s["K"]
                      * (s["C"] // s["G"]) + s["O"] + s["N"] * ho * wo * s["O"]))


def geom(s: Shape, device: str) -> Any:
    import torch

    return torch.tensor([s["S"], s["P"]], dtype=torch.int64, device=device)


def stride_pad(geom_t: Any) -> tuple[int, int]:
    """(S, P) from geom; NotImplementedError on the meta device, where it has no value (the
    contract's shape check then does not judge the call, as for any op meta cannot run)."""
    if geom_t.device.type == "meta":
        raise NotImplementedError("geom has no value on the meta device")
    return int(geom_t[0]), int(geom_t[1])


KINDS = {  # what a served conv call is, by its geometry: one published layer of each
    "3x3": lambda s: s["K"] == 3 and s["G"] == 1,
    "1x1": lambda s: s["K"] == 1 and s["G"] == 1,
    "patch embedding": lambda s: s["K"] == s["S"] > 1,
    "depthwise": lambda s: s["G"] == s["C"] > 1,
}


def serve(limit: float = 5e8) -> list[Shape]:
    """The first published layer of each kind, small enough for a served call's float64
    check (at most four shapes)."""
    small = [s for s in layer_shapes() if flops(s) <= limit]
    return [next(s for s in small if kind(s)) for kind in KINDS.values()]
