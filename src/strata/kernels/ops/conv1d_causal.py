"""conv1d_causal: the causal depthwise conv1d of Mamba/Mamba-2 and hybrid models (prefill).

x [B,C,T], w [C,K], b [C] -> out [B,C,T]: each channel c is filtered by its own K taps over
the last K positions, x before t = 0 read as zeros (causal padding), plus its bias. A small
memory-bound op (2K FLOPs per element) that torch runs through its general convolution.
"""

from strata.kernels.ops._clauses import as_made, ragged
from strata.kernels.ops._conv import causal_conv, conv_channels, weights
from strata.kernels.spec import Clause, KernelSpec, dims_of, floats, register

PAD = ("Causal padding: the first K-1 positions of every row read zeros before t = 0 (a "
       "kernel that reads before the row's start, wraps around, or skips them is wrong), "
       "also when T < K.")
CLAUSES = (
    Clause("causal_start", PAD, {"B": 2, "C": 5, "T": 3, "K": 4}, as_made),
    ragged({"B": 1, "C": 7, "T": 13, "K": 3}, "C and T"),
)


def _inputs(s, dtype, seed, device):
    return [floats((s["B"], s["C"], s["T"]), dtype, seed, device), *weights(s, dtype, seed,
                                                                            device)]


def _eager(x, w, b):
    """What Mamba does: torch's conv1d padded on both sides, the tail cut."""
    import torch.nn.functional as F

    k = w.shape[1]
    return F.conv1d(x, w.unsqueeze(1), b, padding=k - 1, groups=x.shape[1])[..., :x.shape[2]]


SPEC = register(KernelSpec(
    name="conv1d_causal",
    summary="causal depthwise conv1d over [B,C,T] with K taps per channel, + bias",
    inputs=("x", "w", "b"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["B"], s["C"], s["T"]),
    reference=causal_conv,
    eager=_eager,
    flops=lambda s: 2.0 * s["B"] * s["C"] * s["T"] * s["K"],
    bytes=lambda s, e: float(e * (2 * s["B"] * s["C"] * s["T"] + s["C"] * (s["K"] + 1))),
    sizes=lambda o, x, w, b: (x.shape[0], x.shape[1], x.shape[2], w.shape[1]),
    dims=dims_of(B=(1, 0), C=(1, 1), T=(1, 2), K=(2, 1)),
    clauses=CLAUSES,
    shapes={
        "verify": [{"B": 1, "C": 1, "T": 1, "K": 2}, {"B": 2, "C": 5, "T": 3, "K": 4},
                   {"B": 1, "C": 7, "T": 13, "K": 3}, {"B": 2, "C": 33, "T": 40, "K": 4},
                   {"B": 1, "C": 19, "T": 257, "K": 2}],
        # a prefill chunk of each published state-space model (models/data/ssm_configs.json)
        "llm": [{"B": 1, "C": c, "T": 512, "K": k} for c, k in conv_channels()],
        "figure": [{"B": 1, "C": c, "T": 512, "K": k} for c, k in conv_channels()[-1:]],
        "serve": [{"B": 1, "C": c, "T": 64, "K": k} for c, k in conv_channels()[:2]],
    },
))
