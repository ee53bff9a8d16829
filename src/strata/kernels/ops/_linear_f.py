"""Shared spec builder for the float-weight linears (linear_f32, linear_f16): out = x @ wᵀ
with the weight as GGUF stores it, [N, K] row-major (ne0 = K)."""

from strata.kernels.ops._clauses import ragged
from strata.kernels.ops._shapes import ffn_sizes, hidden_sizes, lab_rows, smallest_model, unique
from strata.kernels.spec import Clause, KernelSpec, Tolerance, dims_of, floats

# Small and ragged: B = 1 (decode) and B > 1 (prefill rows; 17: the batched Triton path),
# N and K off every block size; the last two are just big enough (> 2^18 multiply-adds)
# for the C kernels' thread team.
VERIFY = [{"B": 1, "N": 1, "K": 1}, {"B": 1, "N": 7, "K": 5}, {"B": 1, "N": 37, "K": 100},
          {"B": 3, "N": 33, "K": 70}, {"B": 5, "N": 66, "K": 131},
          {"B": 9, "N": 19, "K": 257}, {"B": 17, "N": 45, "K": 83},
          {"B": 1, "N": 515, "K": 520}, {"B": 3, "N": 181, "K": 500}]


def llm_shapes() -> list[dict[str, int]]:
    """Decode (1 row), a small batch (8) and a prefill chunk (128) through the square
    projections; decode through the FFN up (N = ffn) and down (K = ffn) projections."""
    h, f = hidden_sizes(), ffn_sizes()
    return unique([{"B": b, "N": n, "K": n} for n in h for b in (1, 8, 128)]
                  + [{"B": 1, "N": ff, "K": k} for k, ff in zip(h, f, strict=False)]
                  + [{"B": 1, "N": k, "K": ff} for k, ff in zip(h, f, strict=False)])


def serve_shapes() -> list[dict[str, int]]:
    """-B lab's row range (a decode row, a full prefill chunk) through the smallest model's
    FFN down projection and square projections: the rows are the point; wider N and K would
    only slow the float64 oracle (the llm benchmarks reach them)."""
    decode, chunk = lab_rows()
    m = smallest_model()
    return [{"B": decode, "N": m.hidden, "K": m.ffn}, {"B": chunk, "N": m.hidden, "K": m.hidden}]


RAGGED = ragged({"B": 3, "N": 13, "K": 19}, "B, N and K")
DIMS = dims_of(B=(1, 0), N=(2, 0), K=(1, 1))  # (out, x [B,K], w [N,K])


FIGURE = [{"B": b, "N": 4096, "K": 4096} for b in (1, 8, 128)] + \
    [{"B": 1, "N": 14336, "K": 4096}]


def linear_spec(name: str, summary: str, w_dtype: str | None, w_bytes: int | None,
                reference, eager, tolerances: dict[str, Tolerance],
                clauses: tuple[Clause, ...] = (RAGGED,)) -> KernelSpec:
    """`w_dtype`: the weight's fixed dtype (None: the call's float dtype, like x);
    `w_bytes`: its bytes per element (None: the call's element size)."""

    def inputs(s, dtype, seed, device):
        x = floats((s["B"], s["K"]), dtype, seed, device)
        w = floats((s["N"], s["K"]), w_dtype or dtype, seed, device, offset=1)
        return [x, w]

    def nbytes(s, e):
        return float((w_bytes or e) * s["N"] * s["K"] + e * s["B"] * (s["K"] + s["N"]))

    return KernelSpec(
        name=name,
        summary=summary,
        inputs=("x", "w"),
        make_inputs=inputs,
        out_shape=lambda s: (s["B"], s["N"]),
        reference=reference,
        eager=eager,
        flops=lambda s: 2.0 * s["B"] * s["N"] * s["K"],
        bytes=nbytes,
        sizes=lambda o, x, w: (x.shape[0], w.shape[0], x.shape[1]),
        shapes={"verify": VERIFY, "llm": llm_shapes(), "figure": FIGURE,
                "serve": serve_shapes()},
        dims=DIMS,
        clauses=clauses,
        tolerances=tolerances,
        fixed_dtypes={"w": w_dtype} if w_dtype else {},
    )
