"""decode_attention: one query per head over a KV cache (the decode step's attention)."""

import math

from strata.kernels.ops._clauses import gqa, large_scores
from strata.kernels.ops._shapes import attention_heads, largest_model, smallest_model, unique
from strata.kernels.spec import KernelSpec, Tolerance, dims_of, floats, register

CLAUSES = (gqa({"H": 6, "Hkv": 2, "S": 11, "D": 8}),
           large_scores({"H": 4, "Hkv": 2, "S": 13, "D": 8}, causal_mask=False))


def _inputs(s, dtype, seed, device):
    h, hkv, n, d = s["H"], s["Hkv"], s["S"], s["D"]
    return [floats((h, d), dtype, seed, device),
            floats((hkv, n, d), dtype, seed, device, offset=1),
            floats((hkv, n, d), dtype, seed, device, offset=2)]


def _reference(q, k, v, scale):
    import torch

    groups = q.shape[0] // k.shape[0]
    k = k.repeat_interleave(groups, dim=0)
    v = v.repeat_interleave(groups, dim=0)
    p = torch.softmax(torch.einsum("hd,hsd->hs", q, k) * scale, dim=-1)
    return torch.einsum("hs,hsd->hd", p, v)


def _eager(q, k, v, scale):
    import torch.nn.functional as F

    out = F.scaled_dot_product_attention(q[None, :, None], k[None], v[None], scale=scale,
                                         enable_gqa=True)
    return out[0, :, 0]


def _serve():
    # no lab step runs it (-B lab decodes with attention_cached at T = 1): a decode at the
    # llm set's deepest cache, of the largest and the smallest model
    return unique([{"H": m.heads, "Hkv": m.kv_heads, "S": 4096, "D": m.head_dim}
                   for m in (largest_model(), smallest_model())])


SPEC = register(KernelSpec(
    name="decode_attention",
    summary="single-query attention over a KV cache, GQA",
    inputs=("q", "k", "v"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["H"], s["D"]),
    reference=_reference,
    eager=_eager,
    scale_params=lambda s, p: {**p, "scale": 1.0 / math.sqrt(s["D"])},
    flops=lambda s: 4.0 * s["H"] * s["S"] * s["D"],
    bytes=lambda s, e: float(e * (2 * s["H"] * s["D"] + 2 * s["Hkv"] * s["S"] * s["D"])),
    sizes=lambda o, q, k, v: (q.shape[0], k.shape[0], k.shape[1], q.shape[1]),
    dims=dims_of(H=(1, 0), Hkv=(2, 0), S=(2, 1), D=(1, 1)),
    clauses=CLAUSES,
    shapes={
        "verify": [{"H": 1, "Hkv": 1, "S": 1, "D": 4}, {"H": 4, "Hkv": 2, "S": 40, "D": 16},
                   {"H": 2, "Hkv": 1, "S": 100, "D": 64}, {"H": 3, "Hkv": 3, "S": 7, "D": 8}],
        "llm": unique([{"H": h, "Hkv": kv, "S": n, "D": d}
                       for h, kv, d in attention_heads() for n in (512, 4096)]),
        "figure": [{"H": 32, "Hkv": 8, "S": n, "D": 128} for n in (512, 4096)],
        "serve": _serve(),
    },
    tolerances={"float32": Tolerance(1e-5, 1e-4), "bfloat16": Tolerance(2e-2, 2e-2),
                "float16": Tolerance(2e-3, 2e-3)},
))
