"""softmax over the last dim (attention scores, sampling over the vocabulary)."""

from strata.kernels.ops._shapes import hidden_sizes, rows_by, vocab_sizes
from strata.kernels.spec import KernelSpec, floats, register


def _inputs(s, dtype, seed, device):
    x = floats((s["rows"], s["cols"]), dtype, seed, device, scale=3.0)
    if s["rows"] > 1:  # one row of large logits: kernels that skip the max-subtraction overflow
        x[-1] = x[-1] * 20
    return [x]


def _reference(x):
    import torch

    return torch.softmax(x, dim=-1)


SPEC = register(KernelSpec(
    name="softmax",
    summary="softmax over the last dim",
    inputs=("x",),
    make_inputs=_inputs,
    out_shape=lambda s: (s["rows"], s["cols"]),
    reference=_reference,
    flops=lambda s: 5.0 * s["rows"] * s["cols"],
    bytes=lambda s, e: 2.0 * e * s["rows"] * s["cols"],
    sizes=lambda o, x: tuple(x.shape),
    shapes={
        "verify": [{"rows": 1, "cols": 1}, {"rows": 3, "cols": 7}, {"rows": 5, "cols": 33},
                   {"rows": 2, "cols": 1000}, {"rows": 4, "cols": 257}],
        "llm": rows_by(vocab_sizes()) + rows_by(hidden_sizes(), rows=(32,)),
        "figure": [*rows_by([32000]), {"rows": 32, "cols": 4096}],
    },
))
