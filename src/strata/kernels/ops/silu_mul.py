"""silu_mul: silu(a) * b, the SwiGLU gate of every Llama/Qwen MLP."""

from strata.kernels.ops._clauses import ragged, saturate
from strata.kernels.ops._shapes import ffn_sizes, hidden_sizes, lab_rows_by, rows_by, unique
from strata.kernels.ops._training import serve_rows_by
from strata.kernels.spec import Clause, KernelSpec, dims_of, floats, register

CLAUSES = (
    Clause("saturation", "A large |a| (±89 to ±1e4, where e^|a| overflows float32) "
           "saturates: silu(a)·b tends to a·b for a ≫ 0 and to 0 for a ≪ 0, never NaN.",
           {"rows": 4, "cols": 33}, saturate),
    ragged({"rows": 3, "cols": 7}, "n = rows·cols"),
)


def gate_inputs(s, dtype, seed, device):
    """a (the gate, spread ±3 so silu/gelu curve) and b, [rows, cols] (gelu_mul's too)."""
    shape = (s["rows"], s["cols"])
    return [floats(shape, dtype, seed, device, scale=3.0),
            floats(shape, dtype, seed, device, offset=1)]


# the elementwise gates' shapes (gelu_mul's too): -B lab's and training's calls are served
SHAPES = {
    "verify": [{"rows": 1, "cols": 1}, {"rows": 3, "cols": 7}, {"rows": 5, "cols": 33},
               {"rows": 2, "cols": 1000}, {"rows": 4, "cols": 257}],
    "llm": rows_by(ffn_sizes()),
    "figure": rows_by(hidden_sizes()[-2:]) if len(hidden_sizes()) > 1 else rows_by([2048]),
    "serve": unique(lab_rows_by("ffn") + serve_rows_by("ffn")),
}


def _reference(a, b):
    import torch.nn.functional as F

    return F.silu(a) * b


SPEC = register(KernelSpec(
    name="silu_mul",
    summary="silu(a) * b (SwiGLU gate)",
    inputs=("a", "b"),
    make_inputs=gate_inputs,
    out_shape=lambda s: (s["rows"], s["cols"]),
    reference=_reference,
    flops=lambda s: 5.0 * s["rows"] * s["cols"],
    bytes=lambda s, e: 3.0 * e * s["rows"] * s["cols"],
    sizes=lambda o, a, b: (a.numel(),),
    dims=dims_of(rows=(1, 0), cols=(1, 1)),
    clauses=CLAUSES,
    shapes=SHAPES,
))
