"""attention: causal prefill attention with grouped KV heads (GQA)."""

import math

from strata.kernels.ops._clauses import causal, gqa, large_scores
from strata.kernels.ops._shapes import attention_heads, lab_rows, smallest_model, unique
from strata.kernels.spec import KernelSpec, Tolerance, dims_of, floats, register

ATTENTION_DIMS = dims_of(H=(1, 0), Hkv=(2, 0), T=(1, 1), D=(1, 2))
CLAUSES = (causal({"H": 2, "Hkv": 1, "T": 9, "D": 8}),
           gqa({"H": 6, "Hkv": 2, "T": 5, "D": 8}),
           large_scores({"H": 4, "Hkv": 2, "T": 7, "D": 8}, causal_mask=True))


def _inputs(s, dtype, seed, device):
    h, hkv, t, d = s["H"], s["Hkv"], s["T"], s["D"]
    return [floats((h, t, d), dtype, seed, device),
            floats((hkv, t, d), dtype, seed, device, offset=1),
            floats((hkv, t, d), dtype, seed, device, offset=2)]


def _reference(q, k, v, scale):
    import torch

    groups = q.shape[0] // k.shape[0]
    k = k.repeat_interleave(groups, dim=0)
    v = v.repeat_interleave(groups, dim=0)
    scores = (q @ k.transpose(-1, -2)) * scale
    t = q.shape[1]
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v


def _eager(q, k, v, scale):
    import torch.nn.functional as F

    out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True,
                                         scale=scale, enable_gqa=True)
    return out[0]


def _flops(s):
    # q*k^T and p*v over the causal half: 2 * 2 * H * D * T(T+1)/2
    return 2.0 * s["H"] * s["D"] * s["T"] * (s["T"] + 1)


def _serve():
    # no lab or training step runs it (-B lab runs attention_cached): a full prefill chunk
    # of the smallest model
    m = smallest_model()
    return [{"H": m.heads, "Hkv": m.kv_heads, "T": lab_rows()[1], "D": m.head_dim}]


SPEC = register(KernelSpec(
    name="attention",
    summary="causal prefill attention, GQA",
    inputs=("q", "k", "v"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["H"], s["T"], s["D"]),
    reference=_reference,
    eager=_eager,
    scale_params=lambda s, p: {**p, "scale": 1.0 / math.sqrt(s["D"])},
    flops=_flops,
    bytes=lambda s, e: float(e * (2 * s["H"] * s["T"] * s["D"]
                                  + 2 * s["Hkv"] * s["T"] * s["D"])),
    sizes=lambda o, q, k, v: (q.shape[0], k.shape[0], q.shape[1], q.shape[2]),
    dims=ATTENTION_DIMS,
    clauses=CLAUSES,
    shapes={
        "verify": [{"H": 1, "Hkv": 1, "T": 1, "D": 4}, {"H": 4, "Hkv": 2, "T": 5, "D": 16},
                   {"H": 2, "Hkv": 1, "T": 17, "D": 64}, {"H": 3, "Hkv": 3, "T": 33, "D": 8}],
        "llm": unique([{"H": h, "Hkv": kv, "T": 128, "D": d}
                       for h, kv, d in attention_heads()]),
        "figure": [{"H": 32, "Hkv": 8, "T": 128, "D": 128}],
        "serve": _serve(),
    },
    tolerances={"float32": Tolerance(1e-5, 1e-4), "bfloat16": Tolerance(2e-2, 2e-2),
                "float16": Tolerance(2e-3, 2e-3)},
))
