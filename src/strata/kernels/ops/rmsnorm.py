"""rmsnorm: x / sqrt(mean(x^2) + eps) * w (every Llama/Qwen layer, twice)."""

from strata.kernels.ops._shapes import hidden_sizes, lab_rows_by, rows_by, unique
from strata.kernels.ops._training import serve_rows_by
from strata.kernels.spec import Clause, KernelSpec, dims_of, floats, register

EPS = 1e-6


def _inputs(s, dtype, seed, device):
    return [floats((s["rows"], s["cols"]), dtype, seed, device, scale=2.0),
            floats((s["cols"],), dtype, seed, device, offset=1)]


def zero_row(inputs, shape, seed):
    """x's rows 0, 3, 6, ... all zeros (x is inputs[0])."""
    inputs[0][0::3] = 0.0


def near_eps(eps: float):
    """Every row of x scaled to an RMS of sqrt(eps) times 0.5, 1 or 2 (by row)."""

    def apply(inputs, shape, seed):
        import torch

        x = inputs[0]
        rms = x.double().pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-30)
        factor = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64).repeat(x.shape[0])
        x.copy_((x.double() * (eps ** 0.5 * factor[:x.shape[0], None] / rms)).to(x.dtype))

    return apply


ZERO_ROW = ("A row of zeros gives zeros: eps keeps 1/sqrt(mean(x²) + eps) finite.")
NEAR_EPS = ("eps is added to the mean square inside the square root: rows whose mean square "
            "is near eps depend on it.")
CLAUSES = (
    Clause("zero_row", ZERO_ROW, {"rows": 3, "cols": 33}, zero_row),
    Clause("near_eps", NEAR_EPS, {"rows": 3, "cols": 40}, near_eps(EPS)),
)


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
    params={"eps": EPS},
    flops=lambda s: 4.0 * s["rows"] * s["cols"],
    bytes=lambda s, e: float(e * (2 * s["rows"] * s["cols"] + s["cols"])),
    sizes=lambda o, x, w: tuple(x.shape),
    dims=dims_of(rows=(1, 0), cols=(1, 1)),
    clauses=CLAUSES,
    shapes={
        "verify": [{"rows": 1, "cols": 1}, {"rows": 3, "cols": 7}, {"rows": 5, "cols": 33},
                   {"rows": 2, "cols": 1000}, {"rows": 4, "cols": 257}],
        "llm": rows_by(hidden_sizes()),
        "figure": rows_by([2048, 4096]),
        # the lab (decode .. a prefill chunk) and training (batch x ctx rows)
        "serve": unique(lab_rows_by("hidden") + serve_rows_by("hidden")),
    },
))
