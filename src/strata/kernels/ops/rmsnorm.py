"""rmsnorm: x / sqrt(mean(x^2) + eps) * w (every Llama/Qwen layer, twice)."""

from strata.kernels.ops._shapes import hidden_sizes, rows_by
from strata.kernels.spec import KernelSpec, floats, register


def _inputs(s, dtype, seed, device):
    return [floats((s["rows"], s["cols"]), dtype, seed, device, scale=2.0),
            floats((s["cols"],), dtype, seed, device, offset=1)]


def _reference(x, w, eps):
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _eager(x, w, eps):
    import torch.nn.functional as F

    return F.rms_norm(x, (x.shape[-1],), w, eps)


SPEC = register(KernelSpec(
    name="rmsnorm",
    summary="x / sqrt(mean(x^2) + eps) * w over the last dim",
    inputs=("x", "w"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["rows"], s["cols"]),
    reference=_reference,
    eager=_eager,
    params={"eps": 1e-6},
    flops=lambda s: 4.0 * s["rows"] * s["cols"],
    bytes=lambda s, e: float(e * (2 * s["rows"] * s["cols"] + s["cols"])),
    sizes=lambda o, x, w: tuple(x.shape),
    shapes={
        "verify": [{"rows": 1, "cols": 1}, {"rows": 3, "cols": 7}, {"rows": 5, "cols": 33},
                   {"rows": 2, "cols": 1000}, {"rows": 4, "cols": 257}],
        "llm": rows_by(hidden_sizes()),
        "figure": rows_by([2048, 4096]),
    },
))
