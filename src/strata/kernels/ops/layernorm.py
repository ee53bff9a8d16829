"""layernorm over the last dim (biased variance), with weight and bias."""

from strata.kernels.ops._shapes import hidden_sizes, lab_rows_by, rows_by
from strata.kernels.spec import Clause, KernelSpec, dims_of, floats, register


def _inputs(s, dtype, seed, device):
    c = s["cols"]
    return [floats((s["rows"], c), dtype, seed, device, scale=2.0),
            floats((c,), dtype, seed, device, offset=1),
            floats((c,), dtype, seed, device, offset=2)]


def _constant_rows(inputs, shape, seed):
    """Row 0 all zeros, row 1 all 1.5 (variance exactly 0)."""
    x = inputs[0]
    x[0::3] = 0.0
    x[1::3] = 1.5


CLAUSES = (
    Clause("constant_row", "A constant row (variance 0, e.g. all zeros) gives b: eps keeps "
           "1/sqrt(var + eps) finite.", {"rows": 3, "cols": 33}, _constant_rows),
)


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
    dims=dims_of(rows=(1, 0), cols=(1, 1)),
    clauses=CLAUSES,
    shapes={
        "verify": [{"rows": 1, "cols": 1}, {"rows": 3, "cols": 7}, {"rows": 5, "cols": 33},
                   {"rows": 2, "cols": 1000}, {"rows": 4, "cols": 257}],
        "llm": rows_by(hidden_sizes()),
        "figure": rows_by([2048, 4096]),
        # no lab or training step runs layernorm: the lab's rows, as rmsnorm's
        "serve": lab_rows_by("hidden"),
    },
))
