"""silu_mul_backward: the gradients of the SwiGLU gate silu(a) * b for training.

One output buffer holds both results, packed: out = [da (rows*cols) | db (rows*cols)].
With s = sigmoid(a):  da = dy * b * s * (1 + a * (1 - s)),  db = dy * a * s.
"""

from strata.kernels.ops._clauses import ragged, saturate
from strata.kernels.ops._shapes import unique
from strata.kernels.ops._training import serve_rows_by, training_dims
from strata.kernels.spec import Clause, KernelSpec, dims_of, floats, register

CLAUSES = (
    Clause("saturation", "A large |a| (±89 to ±1e4, where e^|a| overflows float32) "
           "saturates: da tends to dy·b for a ≫ 0, da and db to 0 for a ≪ 0, never NaN.",
           {"rows": 4, "cols": 33}, saturate),
    ragged({"rows": 3, "cols": 7}, "n = rows·cols"),
)


def _inputs(s, dtype, seed, device):
    shape = (s["rows"], s["cols"])
    return [floats(shape, dtype, seed, device, scale=3.0),
            floats(shape, dtype, seed, device, offset=1),
            floats(shape, dtype, seed, device, offset=2)]


def _reference(a, b, dy):
    import torch
    import torch.nn.functional as F

    with torch.enable_grad():
        ag, bg = a.detach().requires_grad_(), b.detach().requires_grad_()
        da, db = torch.autograd.grad(F.silu(ag) * bg, (ag, bg), dy)
    return torch.cat([da.reshape(-1), db.reshape(-1)])


def _eager(a, b, dy):
    """The ops autograd runs for silu(a) * b (silu_backward, a product), written straight
    into one packed buffer so the baseline pays no extra concatenation."""
    import torch
    import torch.nn.functional as F

    n = a.numel()
    out = a.new_empty(2 * n)
    torch.ops.aten.silu_backward.grad_input(dy * b, a, grad_input=out[:n].view_as(a))
    torch.mul(dy, F.silu(a), out=out[n:].view_as(a))
    return out


def _shapes() -> list[dict[str, int]]:
    return unique([{"rows": d.tokens, "cols": d.ffn} for d in training_dims()])


SPEC = register(KernelSpec(
    name="silu_mul_backward",
    summary="silu(a) * b's gradients, packed: out = [da (rows*cols) | db (rows*cols)]",
    inputs=("a", "b", "dy"),
    make_inputs=_inputs,
    out_shape=lambda s: (2 * s["rows"] * s["cols"],),
    reference=_reference,
    eager=_eager,
    # per element: sigmoid (exp, add, divide: 3), silu and db (2), da's 5 multiply/adds
    flops=lambda s: 10.0 * s["rows"] * s["cols"],
    bytes=lambda s, e: 5.0 * e * s["rows"] * s["cols"],
    sizes=lambda o, a, b, dy: (a.numel(),),
    dims=dims_of(rows=(1, 0), cols=(1, 1)),
    clauses=CLAUSES,
    # the default tolerance: elementwise, no reduction; measured worst errors are under a
    # fifth of it (da's two terms s and a*s*(1-s) partly cancel, the vectorised exp is ~2 ulp)
    shapes={
        "verify": [{"rows": 1, "cols": 1}, {"rows": 3, "cols": 7}, {"rows": 5, "cols": 33},
                   {"rows": 2, "cols": 1000}, {"rows": 4, "cols": 257}],
        "llm": _shapes(),
        "figure": [{"rows": 4096, "cols": 8192}],
        "serve": serve_rows_by("ffn"),
    },
))
