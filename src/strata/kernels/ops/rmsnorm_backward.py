"""rmsnorm_backward: the gradients of rmsnorm (x / sqrt(mean(x^2) + eps) * w) for training.

One output buffer holds both results, packed: out = [dx (rows*cols) | dw (cols)], row-major.
With r = 1/sqrt(mean(x^2) + eps) per row and g = dy * w:
    dx = r * g - x * r^3 * mean(g * x)        (row-local)
    dw = sum over rows of dy * x * r          (a reduction across rows: the part that races)
"""

from strata.kernels.ops._shapes import unique
from strata.kernels.ops._training import serve_rows_by, training_dims
from strata.kernels.ops.rmsnorm import NEAR_EPS, near_eps, zero_row
from strata.kernels.spec import Clause, KernelSpec, Tolerance, dims_of, floats, register

EPS = 1e-5
CLAUSES = (
    Clause("zero_row", "A row of zeros gives finite gradients: r = 1/sqrt(eps), dx = r·dy·w, "
           "and the row adds nothing to dw.", {"rows": 3, "cols": 33}, zero_row),
    Clause("near_eps", NEAR_EPS, {"rows": 3, "cols": 40}, near_eps(EPS)),
)


def _inputs(s, dtype, seed, device):
    shape = (s["rows"], s["cols"])
    return [floats(shape, dtype, seed, device, scale=2.0),
            floats((s["cols"],), dtype, seed, device, offset=1),
            floats(shape, dtype, seed, device, offset=2)]


def _reference(x, w, dy, eps):
    import torch

    with torch.enable_grad():
        xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
        y = xg * torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + eps) * wg
        dx, dw = torch.autograd.grad(y, (xg, wg), dy)
    return torch.cat([dx.reshape(-1), dw.reshape(-1)])


def _eager(x, w, dy, eps):
    """What PyTorch runs for this backward on the CPU (F.rms_norm decomposes there), written
    straight into one packed buffer so the baseline pays no extra concatenation."""
    import torch

    rows, cols = x.shape
    out = x.new_empty(rows * cols + cols)
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    xhat, g = x * rstd, dy * w
    dx = out[: rows * cols].view(rows, cols)
    torch.mul(xhat, (g * xhat).mean(-1, keepdim=True), out=dx)  # g's part along xhat
    torch.sub(g, dx, out=dx)
    dx.mul_(rstd)
    torch.sum(dy * xhat, dim=0, out=out[rows * cols:])
    return out


def _shapes() -> list[dict[str, int]]:
    return unique([{"rows": d.tokens, "cols": d.hidden} for d in training_dims()])


SPEC = register(KernelSpec(
    name="rmsnorm_backward",
    summary="rmsnorm's gradients, packed: out = [dx (rows*cols) | dw (cols)]",
    inputs=("x", "w", "dy"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["rows"] * s["cols"] + s["cols"],),
    reference=_reference,
    eager=_eager,
    params={"eps": EPS},
    # per element: x^2 and g*x accumulations (4), g (1), dx (3), dw's dy*x*r accumulation (3)
    flops=lambda s: 11.0 * s["rows"] * s["cols"],
    bytes=lambda s, e: float(e * (3 * s["rows"] * s["cols"] + 2 * s["cols"])),
    sizes=lambda o, x, w, dy: tuple(x.shape),
    dims=dims_of(rows=(1, 0), cols=(1, 1)),
    clauses=CLAUSES,
    # dx subtracts two terms of the same size (r*g and the projection onto x), and dw sums
    # `rows` float32 products: both lose more than one rounding against the float64 oracle,
    # so 4x the elementwise default (still far below what a missing term or row costs).
    tolerances={"float32": Tolerance(4e-5, 4e-5), "bfloat16": Tolerance(3e-2, 3e-2),
                "float16": Tolerance(4e-3, 4e-3)},
    shapes={
        # the last is large enough for the avx2 kernel's threaded path, so the verifier's
        # 1 / default / oversubscribed thread counts meet the cross-row dw reduction
        "verify": [{"rows": 1, "cols": 1}, {"rows": 3, "cols": 7}, {"rows": 5, "cols": 33},
                   {"rows": 2, "cols": 1000}, {"rows": 67, "cols": 257},
                   {"rows": 67, "cols": 7919}],
        "llm": _shapes(),
        "figure": [{"rows": 4096, "cols": 2048}],
        "serve": serve_rows_by("hidden"),
    },
))
