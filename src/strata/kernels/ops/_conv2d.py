"""Shared by the conv2d ops: the published vision layers they are measured at
(models/data/vision_configs.json, sourced), the geometry input, the reference and the shape
sets. Stride and padding travel in a small int64 tensor `geom` = [S, P] (like
attention_cached's pos): the C ABI passes tensors and sizes, and the judge can vary them."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from strata.kernels.ops._clauses import ragged
from strata.kernels.spec import Clause, Shape, as_made


@lru_cache(maxsize=1)
def vision_configs() -> dict[str, dict[str, Any]]:
    text = resources.files("strata.models").joinpath("data", "vision_configs.json").read_text()
    return json.loads(text)["models"]


KEYS = ("N", "H", "W", "C", "O", "K", "G", "S", "P")


def layer_shapes(only: str | None = None) -> list[Shape]:
    """One image (N = 1) through every published layer (of the model `only`, or of all),
    deduplicated, in file order."""
    seen: dict[tuple[int, ...], Shape] = {}
    for name, model in vision_configs().items():
        if only is not None and name != only:
            continue
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


def geom(s: Shape, device: str, keys: tuple[str, ...] = ("S", "P")) -> Any:
    """The int64 geom input of a conv op: the shape's `keys` (conv1d adds its dilation D)."""
    import torch

    return torch.tensor([s[k] for k in keys], dtype=torch.int64, device=device)


def geom_values(geom_t: Any) -> tuple[int, ...]:
    """geom's values; NotImplementedError on the meta device, where it has none (the
    contract's shape check then does not judge the call, as for any op meta cannot run)."""
    if geom_t.device.type == "meta":
        raise NotImplementedError("geom has no value on the meta device")
    return tuple(int(v) for v in geom_t.tolist())


def stride_pad(geom_t: Any) -> tuple[int, int]:
    stride, pad = geom_values(geom_t)
    return stride, pad


def geom_dims(geom_t: Any, keys: tuple[str, ...] = ("S", "P")) -> dict[str, int]:
    """A call's geometry dims read from geom, none on the meta device (a spec's `dims`)."""
    return {} if geom_t.device.type == "meta" else dict(zip(keys, geom_values(geom_t),
                                                            strict=True))


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


def _shape(n: int, h: int, w: int, c: int, o: int, k: int, g: int, s: int, p: int) -> Shape:
    return dict(zip(KEYS, (n, h, w, c, o, k, g, s, p), strict=True))


# Small and ragged: 1x1 to 7x7, stride 1, 2 and 4 (= K, a patch embedding), padding 0 to 3,
# dense, grouped and depthwise, and C, O past a 64-wide block.
VERIFY = [_shape(1, 1, 1, 1, 1, 1, 1, 1, 0), _shape(1, 5, 7, 3, 5, 3, 1, 1, 1),
          _shape(2, 9, 6, 4, 6, 3, 1, 2, 1), _shape(1, 11, 9, 3, 8, 7, 1, 2, 3),
          _shape(1, 8, 8, 5, 7, 1, 1, 1, 0), _shape(1, 7, 6, 6, 9, 1, 1, 2, 0),
          _shape(1, 12, 8, 3, 5, 4, 1, 4, 0), _shape(1, 9, 10, 6, 6, 7, 6, 1, 3),
          _shape(1, 7, 7, 4, 6, 3, 2, 1, 1), _shape(1, 6, 9, 70, 67, 3, 1, 1, 1),
          # depthwise rows wide enough for whole runs of interior pixels, stride 1 and 2
          _shape(1, 4, 21, 19, 19, 3, 19, 1, 1), _shape(1, 5, 37, 5, 5, 3, 5, 2, 1)]


def shape_sets() -> dict[str, list[Shape]]:
    return {"verify": VERIFY,
            # every conv2d layer of the published vision models (vision_configs.json)
            "llm": layer_shapes(), "serve": serve(),
            # the issue's goal (>= 0.8x oneDNN): ResNet-50's 3x3 and 1x1 layers
            "figure": [s for s in layer_shapes("resnet-50") if s["K"] in (1, 3)]}


def clauses(w_axis: int) -> tuple[Clause, ...]:
    """The conv2d promises; `w_axis` is the weight's C/G axis in the op's layout."""
    return (
        Clause("padding", "Zero padding: output pixels whose K x K window reaches past the "
               "image's edge read zeros there (P = geom[1] on every side); a kernel that clamps "
               "to the edge, wraps around, or writes only the interior is wrong.",
               _shape(1, 5, 6, 3, 4, 3, 1, 1, 1), as_made),
        Clause("stride", "The stride S = geom[0] is read at call time: output (i, j) reads "
               "rows i·S-P.. and columns j·S-P..; a kernel that assumes S = 1 (or S = K) is "
               "wrong.", _shape(1, 9, 8, 3, 5, 3, 1, 2, 1), as_made),
        Clause("groups", f"Groups G = C / w.shape[{w_axis}]: output channel o reads only the "
               "C/G input channels of its group g = o // (O/G) (consecutive output channels "
               "share a group, not o % G); depthwise (G = C) included.",
               _shape(1, 6, 5, 4, 8, 3, 4, 1, 1), as_made),
        ragged(_shape(2, 7, 9, 5, 19, 3, 1, 1, 1), "N, H, W, C and O"),
    )
