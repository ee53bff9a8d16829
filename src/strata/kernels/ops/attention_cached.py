"""attention_cached: causal attention of T new queries over a KV cache (prefill with depth,
and decode at T = 1), GQA.

q [H,T,D]; k, v [Hkv,C,D] (the cache, C rows allocated); pos int64 [1]: P = pos[0] rows
precede the T queries, whose own keys and values are already written at rows P..P+T-1
(P + T ≤ C). Query t attends rows 0..P+t; rows from P+T on are never read. Head h reads kv
head h // (H/Hkv). pos is a tensor so one compiled call serves every step; the shape dict
names its value "P".

The verifier fills the unused rows (P+T..C-1) with NaN (even seeds) or with large values
(odd seeds): a kernel that reads past P+t, or ignores pos, is wrong by far.

Tolerance (float32: atol 5e-5·max(1, rms), rtol 1e-4): float32 dot products, exp and sums
in another order than the float64 oracle. The error grows with the number of keys and with
the size of the scores (each exp(s - max) carries a relative error of about 2⁻²⁴·|s|): at
the llm shapes (up to 4096 keys, D = 128) with heavy-tailed inputs torch's own float32 SDPA,
the vendor path, is off the oracle by up to 2.1e-5·rms (the AVX2 kernel by 6e-6), beyond
attention's 1e-5. A mask or position error (pos ignored, a row too many, not causal) is off
by O(rms).
"""

import math

from strata.kernels.ops._clauses import gqa
from strata.kernels.ops._shapes import (
    attention_heads,
    lab_rows,
    largest_model,
    smallest_model,
    unique,
)
from strata.kernels.spec import Clause, KernelSpec, Tolerance, as_made, floats, register


def _inputs(s, dtype, seed, device):
    import torch

    h, hkv, t, p, c, d = s["H"], s["Hkv"], s["T"], s["P"], s["C"], s["D"]
    q = floats((h, t, d), dtype, seed, device)
    k = floats((hkv, c, d), dtype, seed, device, offset=1)
    v = floats((hkv, c, d), dtype, seed, device, offset=2)
    if p + t < c:  # rows never to be read: poison them
        fill = float("nan") if seed % 2 == 0 else 1e4
        k[:, p + t:] = fill
        v[:, p + t:] = -fill
    pos = torch.tensor([p], dtype=torch.int64, device=device)
    return [q, k, v, pos]


def _reference(q, k, v, pos, scale):
    import torch

    p, t = int(pos[0]), q.shape[1]
    groups = q.shape[0] // k.shape[0]
    k = k[:, :p + t].repeat_interleave(groups, dim=0)
    v = v[:, :p + t].repeat_interleave(groups, dim=0)
    scores = (q @ k.transpose(-1, -2)) * scale  # [H, T, P+T]
    mask = torch.ones(t, p + t, dtype=torch.bool, device=q.device).triu(p + 1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v


def _eager(q, k, v, pos, scale):
    import torch
    import torch.nn.functional as F

    t = q.shape[1]
    # On the meta device (the contract's shape check) pos has no value: take the whole cache.
    p = k.shape[1] - t if pos.device.type == "meta" else int(pos[0])
    mask = torch.ones(t, p + t, dtype=torch.bool, device=q.device).tril(p)
    out = F.scaled_dot_product_attention(q[None], k[None, :, :p + t], v[None, :, :p + t],
                                         attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0]


def _poison(inputs, shape, seed):
    """Cache rows P+T..C-1 of k and v set to NaN, ±inf or ±1e30 (seed 0, 1, 2)."""
    _, k, v, _ = inputs
    p, t = shape["P"], shape["T"]
    fill = (float("nan"), float("inf"), 1e30)[seed % 3]
    k[:, p + t:] = fill
    v[:, p + t:] = -fill


def _dims(out, q, k, v, pos):
    """The call's shape; P is pos[0] (one int64 read), left out on the meta device (no
    value there)."""
    dims = {"H": int(q.shape[0]), "Hkv": int(k.shape[0]), "T": int(q.shape[1])}
    if pos.device.type != "meta":
        dims["P"] = int(pos[0])
    return {**dims, "C": int(k.shape[1]), "D": int(q.shape[2])}


def _keys(s):
    """Σ_t (P + t + 1): query-key pairs over the T queries."""
    return s["T"] * s["P"] + s["T"] * (s["T"] + 1) / 2


def _shape(h, hkv, t, p, c, d):
    return {"H": h, "Hkv": hkv, "T": t, "P": p, "C": c, "D": d}


CLAUSES = (
    Clause("unread_rows", "Cache rows from P+T on are never read: NaN, ±inf or ±1e30 there "
           "change nothing.", {"H": 2, "Hkv": 1, "T": 3, "P": 4, "C": 12, "D": 8}, _poison,
           seeds=(0, 1, 2)),
    Clause("pos", "P is read from pos[0] at call time: query t attends cache rows 0..P+t, "
           "the P rows before the queries' own included.",
           {"H": 2, "Hkv": 1, "T": 3, "P": 9, "C": 12, "D": 8}, as_made),
    gqa({"H": 6, "Hkv": 2, "T": 2, "P": 5, "C": 9, "D": 8}),
)


def _serve():
    """-B lab's calls: a decode step of the largest model at the llm set's deepest cache
    (4095 rows), the first decode step (P = 0) of the smallest, and a full prefill chunk
    (lab_rows) of the smallest from an empty cache."""
    decode, chunk = lab_rows()
    big, small = largest_model(), smallest_model()
    return [_shape(big.heads, big.kv_heads, decode, 4095, 4096, big.head_dim),
            _shape(small.heads, small.kv_heads, decode, 0, 1, small.head_dim),
            _shape(small.heads, small.kv_heads, chunk, 0, chunk, small.head_dim)]


def _llm():
    # Decode at depth 511 and 4095 (T = 1), and a 128-token prefill chunk from 0 and at
    # depth 384; the cache holds a few rows more than used.
    return unique([_shape(h, kv, t, p, p + t + 16, d) for h, kv, d in attention_heads()
                   for t, p in ((1, 511), (1, 4095), (128, 0), (128, 384))])


SPEC = register(KernelSpec(
    name="attention_cached",
    summary="causal attention of T queries over a KV cache after P positions, GQA",
    inputs=("q", "k", "v", "pos"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["H"], s["T"], s["D"]),
    reference=_reference,
    eager=_eager,
    scale_params=lambda s, p: {**p, "scale": 1.0 / math.sqrt(s["D"])},
    flops=lambda s: 4.0 * s["H"] * s["D"] * _keys(s),
    bytes=lambda s, e: float(e * (2 * s["H"] * s["T"] * s["D"]
                                  + 2 * s["Hkv"] * (s["P"] + s["T"]) * s["D"]) + 8),
    sizes=lambda o, q, k, v, pos: (q.shape[0], k.shape[0], q.shape[1], k.shape[1],
                                   q.shape[2]),
    dims=_dims,
    clauses=CLAUSES,
    shapes={
        "verify": [_shape(1, 1, 1, 0, 1, 4), _shape(4, 2, 1, 37, 45, 16),
                   _shape(2, 1, 5, 0, 9, 64), _shape(3, 3, 7, 12, 20, 8),
                   _shape(4, 1, 3, 30, 33, 20), _shape(6, 2, 9, 5, 17, 12),
                   _shape(2, 1, 70, 3, 80, 8),  # query rows in more than one block
                   # enough work (> 2^18 multiply-adds) for the C kernels' thread team
                   _shape(4, 2, 4, 170, 180, 100)],
        "llm": _llm(),
        "figure": [_shape(32, 8, 1, 4095, 4096, 128), _shape(32, 8, 128, 384, 512, 128)],
        "serve": _serve(),
    },
    tolerances={"float32": Tolerance(5e-5, 1e-4), "bfloat16": Tolerance(2e-2, 2e-2),
                "float16": Tolerance(2e-3, 2e-3)},
))
