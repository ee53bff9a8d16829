"""conv2d_nhwc_relu: conv2d_nhwc with its bias and a ReLU fused, out = max(0, conv + b) — the
conv + (folded batch-norm) + ReLU of every ResNet block's first two layers, in one pass over
the output instead of two.

Inputs, geometry and clauses are conv2d_nhwc's (ops/conv2d_nhwc.py); only the output differs:
negative sums become 0. The shapes are the ResNet-50 layers that a ReLU follows (every layer
but the 1x1 expansions and projections that feed the residual add).
"""

from strata.kernels.ops import _conv2d
from strata.kernels.ops.conv2d_nhwc import SPEC as CONV
from strata.kernels.spec import KernelSpec, register


def _relu(x, w, b, geom):
    import torch

    return torch.relu(CONV.reference(x, w, b, geom))


def _followed_by_relu() -> list[dict[str, int]]:
    """ResNet-50's layers whose output a ReLU takes: the stem, the 1x1 reductions and 3x3s
    (the expansions and projections go into the residual add first)."""
    return [s for s in _conv2d.layer_shapes("resnet-50") if s["O"] <= s["C"] or s["K"] > 1]


SPEC = register(KernelSpec(
    name="conv2d_nhwc_relu",
    summary="conv2d_nhwc with bias and ReLU fused: max(0, conv + b), channels-last",
    inputs=CONV.inputs,
    make_inputs=CONV.make_inputs,
    out_shape=CONV.out_shape,
    reference=_relu,
    eager=_relu,
    flops=CONV.flops,
    bytes=CONV.bytes,
    sizes=CONV.sizes,
    dims=CONV.dims,
    per_shape=True,
    clauses=CONV.clauses,
    shapes={**_conv2d.shape_sets(), "llm": _followed_by_relu(),
            "figure": [s for s in _followed_by_relu() if s["K"] in (1, 3)]},
))
