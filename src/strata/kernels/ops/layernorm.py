"""layernorm over the last dim (biased variance), with weight and bias."""

from strata.kernels.ops._shapes import hidden_sizes, rows_by
from strata.kernels.spec import KernelSpec, floats, register


def _inputs(s, dtype, seed, device):
    c = s["cols"]
    return [floats((s["rows"], c), dtype, seed, device, scale=2.0),
            floats((c,), dtype, seed, device, offset=1),
            floats((c,), dtype, seed, device, offset=2)]


def _reference(x, w, b, eps):
    import torch.nn.functional as F

    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


SPEC = register(KernelSpec(
    name="layernorm",
    summary="(x - mean) / sqrt(var + eps) * w + b over the last dim",
    inputs=("x", "w", "b"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["rows"], s["cols"]),
    reference=_reference,
    params={"eps": 1e-5},
    flops=lambda s: 8.0 * s["rows"] * s["cols"],
    bytes=lambda s, e: float(e * (2 * s["rows"] * s["cols"] + 2 * s["cols"])),
    sizes=lambda o, x, w, b: tuple(x.shape),
    shapes={
        "verify": [{"rows": 1, "cols": 1}, {"rows": 3, "cols": 7}, {"rows": 5, "cols": 33},
                   {"rows": 2, "cols": 1000}, {"rows": 4, "cols": 257}],
        "llm": rows_by(hidden_sizes()),
        "figure": rows_by([2048, 4096]),
    },
))
