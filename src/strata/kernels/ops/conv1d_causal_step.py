"""conv1d_causal_step: one decode step of the causal depthwise conv1d, with its rolling state.

state [B,C,K-1] (the last K-1 inputs of each channel, oldest first), x [B,C] (this token),
w [C,K], b [C] -> out [B·C·(K-1) + B·C] = [the new state | y]: y[b,c] = b[c] +
Σ_{k<K-1} w[c,k]·state[b,c,k] + w[c,K-1]·x[b,c], and the new state is the old one shifted by
one with x appended (what Mamba's decode keeps per sequence). Torch runs it as a roll, a copy,
a multiply and a sum; the lab's kernel is one pass over C·K floats.
"""

from strata.kernels.ops._clauses import as_made
from strata.kernels.ops._conv import conv_channels, weights
from strata.kernels.spec import Clause, KernelSpec, dims_of, floats, register

ROLL = ("The new state is the old one shifted by one position with x appended as the newest "
        "(oldest first): a kernel that returns y but leaves the state, or appends at the "
        "front, is wrong.")
CLAUSES = (
    Clause("roll", ROLL, {"B": 2, "C": 5, "K": 4}, as_made),
    Clause("width_two", "K = 2 keeps a state of one position: the state is x itself.",
           {"B": 1, "C": 9, "K": 2}, as_made),
)


def _inputs(s, dtype, seed, device):
    return [floats((s["B"], s["C"], s["K"] - 1), dtype, seed, device, offset=3),
            floats((s["B"], s["C"]), dtype, seed, device), *weights(s, dtype, seed, device)]


def _reference(state, x, w, b):
    """[new state | y], flat."""
    import torch

    window = torch.cat([state, x.unsqueeze(-1)], dim=-1)  # [B,C,K]
    y = (window * w).sum(-1) + b
    return torch.cat([window[..., 1:].reshape(-1), y.reshape(-1)])


def _eager(state, x, w, b):
    """Mamba's torch decode path (causal_conv1d_update's fallback): roll, write, reduce."""
    import torch

    full = torch.cat([state[..., :1], state], dim=-1)  # Mamba keeps K slots; the oldest goes
    window = torch.roll(full, shifts=-1, dims=-1)
    window[..., -1] = x
    y = torch.sum(window * w, dim=-1) + b
    return torch.cat([window[..., 1:].reshape(-1), y.reshape(-1)])


SPEC = register(KernelSpec(
    name="conv1d_causal_step",
    summary="one decode step of the causal depthwise conv1d: [new state | y]",
    inputs=("state", "x", "w", "b"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["B"] * s["C"] * (s["K"] - 1) + s["B"] * s["C"],),
    reference=_reference,
    eager=_eager,
    flops=lambda s: 2.0 * s["B"] * s["C"] * s["K"],
    bytes=lambda s, e: float(e * (2 * s["B"] * s["C"] * (s["K"] - 1) + 2 * s["B"] * s["C"]
                                  + s["C"] * (s["K"] + 1))),
    sizes=lambda o, state, x, w, b: (x.shape[0], x.shape[1], w.shape[1]),
    dims=dims_of(B=(2, 0), C=(2, 1), K=(3, 1)),
    clauses=CLAUSES,
    shapes={
        "verify": [{"B": 1, "C": 1, "K": 2}, {"B": 2, "C": 5, "K": 4},
                   {"B": 1, "C": 7, "K": 3}, {"B": 3, "C": 33, "K": 4},
                   {"B": 1, "C": 257, "K": 4}],
        # one token of each published state-space model (models/data/ssm_configs.json)
        "llm": [{"B": 1, "C": c, "K": k} for c, k in conv_channels()],
        "figure": [{"B": 1, "C": c, "K": k} for c, k in conv_channels()],
        "serve": [{"B": 1, "C": c, "K": k} for c, k in conv_channels()[:2]],
    },
))
