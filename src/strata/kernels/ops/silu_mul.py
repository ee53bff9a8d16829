"""silu_mul: silu(a) * b, the SwiGLU gate of every Llama/Qwen MLP."""

from strata.kernels.ops._shapes import ffn_sizes, hidden_sizes, rows_by
from strata.kernels.spec import KernelSpec, floats, register


def _inputs(s, dtype, seed, device):
    shape = (s["rows"], s["cols"])
    return [floats(shape, dtype, seed, device, scale=3.0),
            floats(shape, dtype, seed, device, offset=1)]


def _reference(a, b):
    import torch.nn.functional as F

    return F.silu(a) * b


SPEC = register(KernelSpec(
    name="silu_mul",
    summary="silu(a) * b (SwiGLU gate)",
    inputs=("a", "b"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["rows"], s["cols"]),
    reference=_reference,
    flops=lambda s: 5.0 * s["rows"] * s["cols"],
    bytes=lambda s, e: 3.0 * e * s["rows"] * s["cols"],
    sizes=lambda o, a, b: (a.numel(),),
    shapes={
        "verify": [{"rows": 1, "cols": 1}, {"rows": 3, "cols": 7}, {"rows": 5, "cols": 33},
                   {"rows": 2, "cols": 1000}, {"rows": 4, "cols": 257}],
        "llm": rows_by(ffn_sizes()),
        "figure": rows_by(hidden_sizes()[-2:]) if len(hidden_sizes()) > 1 else rows_by([2048]),
    },
))
