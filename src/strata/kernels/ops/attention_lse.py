"""attention_lse: causal GQA attention for training: the output and each query's logsumexp.

One float32 output buffer (whatever the input dtype), packed: out = [o (H*T*D) | lse (H*T)],
both row-major. lse[h,t] is the natural-log logsumexp of query t's scaled, causally masked
scores, log sum_{s<=t} exp(scale * q[h,t].k[g,s]); attention_backward recomputes the
probabilities from it (p = exp(scale*q.k - lse)) instead of keeping a T x T matrix per head.
"""

from strata.kernels.ops._attention_grad import (
    VERIFY_SHAPES,
    eager_forward,
    figure_shape,
    forward,
    qkv,
    scale_for,
    serve_shapes,
    train_shapes,
)
from strata.kernels.ops._clauses import causal, gqa, large_scores
from strata.kernels.spec import KernelSpec, Tolerance, dims_of, register

CLAUSES = (causal({"H": 2, "Hkv": 1, "T": 9, "D": 8}),
           gqa({"H": 6, "Hkv": 2, "T": 5, "D": 8}),
           large_scores({"H": 4, "Hkv": 2, "T": 7, "D": 8}, causal_mask=True))


def _reference(q, k, v, scale):
    import torch

    o, lse = forward(q, k, v, scale)
    return torch.cat([o.reshape(-1), lse.reshape(-1)])


def _eager(q, k, v, scale):
    import torch

    o, lse = eager_forward(q, k, v, scale)
    return torch.cat([o.reshape(-1).float(), lse.reshape(-1).float()])


def _flops(s):
    # q*k^T and p*v over the causal half (2 * 2 * H * D * T(T+1)/2), as `attention`
    return 2.0 * s["H"] * s["D"] * s["T"] * (s["T"] + 1)


SPEC = register(KernelSpec(
    name="attention_lse",
    summary="causal GQA attention + per-query logsumexp, packed: out = [o | lse]",
    inputs=("q", "k", "v"),
    make_inputs=qkv,
    out_shape=lambda s: (s["H"] * s["T"] * s["D"] + s["H"] * s["T"],),
    out_dtype="float32",  # lse must stay float32 for the backward; o shares its buffer
    reference=_reference,
    eager=_eager,
    scale_params=scale_for,
    flops=_flops,
    bytes=lambda s, e: float(e * (2 * s["H"] * s["T"] * s["D"] + 2 * s["Hkv"] * s["T"] * s["D"]
                                  + s["H"] * s["T"])),
    sizes=lambda o, q, k, v: (q.shape[0], k.shape[0], q.shape[1], q.shape[2]),
    dims=dims_of(H=(1, 0), Hkv=(2, 0), T=(1, 1), D=(1, 2)),
    clauses=CLAUSES,
    shapes={"verify": VERIFY_SHAPES, "llm": train_shapes(), "figure": [figure_shape()],
            "serve": serve_shapes()},
    # As `attention`: o is a convex mix of v rows (float32 sums of up to T terms), and lse
    # is a float32 max plus the log of a float32 sum; the atol term scales with the packed
    # buffer's RMS, which lse (|lse| ~ log T + max score) can lift above 1.
    tolerances={"float32": Tolerance(1e-5, 1e-4), "bfloat16": Tolerance(2e-2, 2e-2),
                "float16": Tolerance(2e-3, 2e-3)},
))
