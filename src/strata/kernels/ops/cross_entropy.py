"""cross_entropy: per-row logsumexp(logits) - logits[target] (fused log-softmax + NLL).

Every target lies in [0, V): unlike cross_entropy_fused (training's op, which defines an
ignored target), this op promises nothing for a target outside it (the reference, torch's
F.cross_entropy, raises on some and ignores -100).
"""

from strata.kernels.ops._shapes import lab_rows, rows_by, vocab_sizes
from strata.kernels.spec import Clause, KernelSpec, dims_of, floats, generator, register

LARGE_LOGITS = ("Rows of large logits (|x| up to a few 1e3, where an unshifted exp overflows "
                "float32) are exact: logsumexp is taken relative to the row's max.")


def large_logits(inputs, shape, seed):
    """Odd rows of the logits (inputs[0]) x25 (make_inputs already scales row 0)."""
    inputs[0][1::2] *= 25


def _inputs(s, dtype, seed, device):
    import torch

    logits = floats((s["rows"], s["V"]), dtype, seed, device, scale=4.0)
    if s["rows"] > 1:  # large logits: an unshifted exp overflows
        logits[0] = logits[0] * 25
    target = torch.randint(0, s["V"], (s["rows"],), generator=generator(seed)).to(device)
    return [logits, target]


def _reference(logits, target):
    import torch.nn.functional as F

    return F.cross_entropy(logits, target, reduction="none")


def _serve():
    # no lab or training step runs it (training runs cross_entropy_fused): a decode row over
    # the largest vocabulary, 64 rows (the llm set's most) over the smallest
    return [{"rows": lab_rows()[0], "V": max(vocab_sizes())},
            {"rows": 64, "V": min(vocab_sizes())}]


SPEC = register(KernelSpec(
    name="cross_entropy",
    summary="per-row logsumexp(logits) - logits[target]",
    inputs=("logits", "target"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["rows"],),
    out_dtype="float32",
    reference=_reference,
    flops=lambda s: 4.0 * s["rows"] * s["V"],
    bytes=lambda s, e: float(e * s["rows"] * s["V"] + 12 * s["rows"]),
    sizes=lambda o, logits, t: tuple(logits.shape),
    dims=dims_of(rows=(1, 0), V=(1, 1)),
    clauses=(Clause("large_logits", LARGE_LOGITS, {"rows": 4, "V": 257}, large_logits),),
    shapes={
        "verify": [{"rows": 1, "V": 1}, {"rows": 1, "V": 10}, {"rows": 3, "V": 1000},
                   {"rows": 5, "V": 257}],
        "llm": rows_by(vocab_sizes(), rows=(8, 64), names=("rows", "V")),
        "figure": rows_by([32000, 151936], rows=(8,), names=("rows", "V")),
        "serve": _serve(),
    },
))
