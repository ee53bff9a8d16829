"""softmax over the last dim (attention scores, sampling over the vocabulary)."""

from strata.kernels.ops._shapes import hidden_sizes, lab_rows, rows_by, smallest_model, vocab_sizes
from strata.kernels.spec import Clause, KernelSpec, dims_of, floats, register


def _inputs(s, dtype, seed, device):
    x = floats((s["rows"], s["cols"]), dtype, seed, device, scale=3.0)
    if s["rows"] > 1:  # one row of large logits: kernels that skip the max-subtraction overflow
        x[-1] = x[-1] * 20
    return [x]


def _large(inputs, shape, seed):
    """Odd rows x100: logits up to ~1e3, far past float32's exp range."""
    inputs[0][1::2] *= 100


def _neg_inf(inputs, shape, seed):
    """Even rows: the first min(cols - 1, 9) entries -inf (a whole leading vector block);
    odd rows: every third entry from the second on. Column 0 of an odd row and the last
    column of every row stay finite."""
    x = inputs[0]
    lead = min(x.shape[1] - 1, 9)
    x[0::2, :lead] = float("-inf")
    x[1::2, 1:-1:3] = float("-inf")


CLAUSES = (
    Clause("large_logits", "Rows of large logits (|x| up to ~1e3, where an unshifted exp "
           "overflows float32) are exact: the softmax is taken relative to the row's max.",
           {"rows": 4, "cols": 37}, _large),
    Clause("neg_inf", "-inf entries (masked logits) get probability 0, also when a whole "
           "leading block of a row is -inf (no inf - inf); a row of only -inf is outside "
           "the contract.", {"rows": 4, "cols": 40}, _neg_inf),
)


def _serve():
    # no lab or training step runs softmax: the lab's rows over the smallest model's width,
    # and one decode row over the largest vocabulary (sampling)
    decode, chunk = lab_rows()
    return [{"rows": chunk, "cols": smallest_model().hidden},
            {"rows": decode, "cols": max(vocab_sizes())}]


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
    dims=dims_of(rows=(1, 0), cols=(1, 1)),
    clauses=CLAUSES,
    shapes={
        "verify": [{"rows": 1, "cols": 1}, {"rows": 3, "cols": 7}, {"rows": 5, "cols": 33},
                   {"rows": 2, "cols": 1000}, {"rows": 4, "cols": 257}],
        "llm": rows_by(vocab_sizes()) + rows_by(hidden_sizes(), rows=(32,)),
        "figure": [*rows_by([32000]), {"rows": 32, "cols": 4096}],
        "serve": _serve(),
    },
))
