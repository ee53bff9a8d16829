"""matmul: out[M,N] = a[M,K] @ b[K,N] (the projection workhorse of prefill)."""

from strata.kernels.ops._clauses import ragged
from strata.kernels.ops._shapes import hidden_sizes, unique
from strata.kernels.ops._training import trained_dims
from strata.kernels.spec import KernelSpec, Tolerance, dims_of, floats, register


def _inputs(s, dtype, seed, device):
    return [floats((s["M"], s["K"]), dtype, seed, device),
            floats((s["K"], s["N"]), dtype, seed, device, offset=1)]


def _reference(a, b):
    return a @ b


def _llm():
    # Decode (1 row), a small batch (8) and a prefill chunk (128) through a square projection.
    return unique([{"M": m, "N": h, "K": h} for h in hidden_sizes() for m in (1, 8, 128)])


def _serve():
    """Training's projections (train/ops_lab.py's linear; the lab runs linear_* instead):
    the forward and dx have M = batch x ctx rows, the weight gradient dW = dyᵀ·x has
    K = batch x ctx. Widths are the smallest preset's (the row range is the point; the
    float64 oracle stays fast)."""
    rows = max(d.tokens for d in trained_dims())
    h = min(d.hidden for d in trained_dims())
    return [{"M": rows, "N": h, "K": h}, {"M": h, "N": h, "K": rows}]


SPEC = register(KernelSpec(
    name="matmul",
    summary="out = a @ b (fp32 accumulate)",
    inputs=("a", "b"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["M"], s["N"]),
    reference=_reference,
    flops=lambda s: 2.0 * s["M"] * s["N"] * s["K"],
    bytes=lambda s, e: float(e * (s["M"] * s["K"] + s["K"] * s["N"] + s["M"] * s["N"])),
    sizes=lambda o, a, b: (a.shape[0], b.shape[1], a.shape[1]),
    dims=dims_of(M=(1, 0), N=(2, 1), K=(1, 1)),
    clauses=(ragged({"M": 5, "N": 13, "K": 19}, "M, N and K"),),
    shapes={
        "verify": [{"M": 1, "N": 1, "K": 1}, {"M": 7, "N": 13, "K": 5},
                   {"M": 33, "N": 70, "K": 17}, {"M": 5, "N": 257, "K": 100},
                   {"M": 64, "N": 64, "K": 64}],
        "llm": _llm(),
        "figure": [{"M": m, "N": 4096, "K": 4096} for m in (1, 8, 128)]
        + [{"M": 2048, "N": 2048, "K": 2048}],
        "gpu": [{"M": 4096, "N": 4096, "K": 4096}],
        "serve": _serve(),
    },
    tolerances={"float32": Tolerance(1e-5, 1e-5), "bfloat16": Tolerance(2e-2, 2e-2),
                "float16": Tolerance(2e-3, 2e-3)},
))
