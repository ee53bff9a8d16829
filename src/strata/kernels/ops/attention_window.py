"""attention_window: sliding-window causal attention of T new queries over a KV cache, GQA
(Gemma 3's local layers, Mistral-style windows).

attention_cached with a window: q [H,T,D]; k, v [Hkv,C,D]; pos int64 [2]: P = pos[0] rows
precede the T queries, whose own keys and values are already at rows P..P+T-1 (P + T ≤ C),
and W = pos[1] ≥ 1 limits query t to rows max(0, P+t-W+1)..P+t — llama.cpp's standard SWA
mask (a key is hidden once the query is W or more positions past it). The window is a tensor
value, not a parameter, so dispatch reads it from every call like P ("P" and "W" in the
shape dict): an external kernel serves only the windows it was verified at.

The verifier poisons both sides: rows from P+T on and rows before P-W+1 (which no query
sees) hold NaN (even seeds) or large values (odd seeds), so a kernel that ignores the window
or pos is wrong by far. Tolerance: attention_cached's (float32 sums in another order).
"""

import math

from strata.kernels.ops._clauses import gqa
from strata.kernels.ops._shapes import attention_heads, lab_rows, smallest_model, unique
from strata.kernels.spec import Clause, KernelSpec, Tolerance, as_made, floats, register


def _hidden(p, t, w):
    """Rows no query sees: before the first query's window, and from P+T on."""
    return max(0, p - w + 1), p + t


def _inputs(s, dtype, seed, device):
    import torch

    h, hkv, t, p, c, d, w = s["H"], s["Hkv"], s["T"], s["P"], s["C"], s["D"], s["W"]
    q = floats((h, t, d), dtype, seed, device)
    k = floats((hkv, c, d), dtype, seed, device, offset=1)
    v = floats((hkv, c, d), dtype, seed, device, offset=2)
    before, after = _hidden(p, t, w)
    fill = float("nan") if seed % 2 == 0 else 1e4
    for rows in (slice(0, before), slice(after, c)):
        k[:, rows] = fill
        v[:, rows] = -fill
    return [q, k, v, torch.tensor([p, w], dtype=torch.int64, device=device)]


def _seen(t, p, w, device):
    """(first row any query sees, mask [T, rows from it to P+T): True where attended)."""
    import torch

    lo = max(0, p - w + 1)
    keys = torch.arange(lo, p + t, device=device)[None, :]
    query = torch.arange(p, p + t, device=device)[:, None]
    return lo, (keys <= query) & (keys > query - w)


def _reference(q, k, v, pos, scale):
    import torch

    p, w, t = int(pos[0]), int(pos[1]), q.shape[1]
    lo, mask = _seen(t, p, w, q.device)
    groups = q.shape[0] // k.shape[0]
    k = k[:, lo:p + t].repeat_interleave(groups, dim=0)
    v = v[:, lo:p + t].repeat_interleave(groups, dim=0)
    scores = (q @ k.transpose(-1, -2)) * scale
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


def _eager(q, k, v, pos, scale):
    import torch.nn.functional as F

    t = q.shape[1]
    # on the meta device (the contract's shape check) pos has no value: the whole cache
    meta = pos.device.type == "meta"
    p, w = (k.shape[1] - t, k.shape[1]) if meta else (int(pos[0]), int(pos[1]))
    lo, mask = _seen(t, p, w, q.device)
    out = F.scaled_dot_product_attention(q[None], k[None, :, lo:p + t], v[None, :, lo:p + t],
                                         attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0]


def _poison(inputs, shape, seed):
    """Rows before P-W+1 and from P+T on set to NaN, ±inf or ±1e30 (seed 0, 1, 2)."""
    _, k, v, _ = inputs
    before, after = _hidden(shape["P"], shape["T"], shape["W"])
    fill = (float("nan"), float("inf"), 1e30)[seed % 3]
    for rows in (slice(0, before), slice(after, k.shape[1])):
        k[:, rows] = fill
        v[:, rows] = -fill


def window_dims(out, q, k, v, pos):
    """The call's shape; P and W are pos's two values (one read), left out on the meta
    device (no values there)."""
    dims = {"H": int(q.shape[0]), "Hkv": int(k.shape[0]), "T": int(q.shape[1])}
    if pos.device.type != "meta":
        dims["P"], dims["W"] = (int(x) for x in pos[:2].tolist())
    return {**dims, "C": int(k.shape[1]), "D": int(q.shape[2])}


def _keys(s):
    """Σ_t min(W, P + t + 1): query-key pairs over the T queries."""
    return sum(min(s["W"], s["P"] + t + 1) for t in range(s["T"]))


def window_shape(h, hkv, t, p, c, d, w):
    return {"H": h, "Hkv": hkv, "T": t, "P": p, "C": c, "D": d, "W": w}


CLAUSES = (
    Clause("outside_window", "Rows before P-W+1 (outside every query's window) and from P+T "
           "on are never read: NaN, ±inf or ±1e30 there change nothing.",
           {"H": 2, "Hkv": 1, "T": 3, "P": 9, "C": 16, "D": 8, "W": 4}, _poison,
           seeds=(0, 1, 2)),
    Clause("window_per_query", "Each query has its own window: query t sees rows "
           "P+t-W+1..P+t, so consecutive queries drop one row each.",
           {"H": 2, "Hkv": 1, "T": 6, "P": 2, "C": 8, "D": 8, "W": 3}, as_made),
    gqa({"H": 6, "Hkv": 2, "T": 2, "P": 5, "C": 9, "D": 8, "W": 4}),
)


def _serve():
    """-B lab's calls on a windowed layer: a decode step at a full window of 512 and a
    prefill chunk from an empty cache, at the smallest model's heads."""
    decode, chunk = lab_rows()
    small = smallest_model()
    return [window_shape(small.heads, small.kv_heads, decode, 1022, 1023, small.head_dim, 512),
            window_shape(small.heads, small.kv_heads, chunk, 0, chunk, small.head_dim, 512)]


SPEC = register(KernelSpec(
    name="attention_window",
    summary="sliding-window causal attention of T queries over a KV cache, GQA",
    inputs=("q", "k", "v", "pos"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["H"], s["T"], s["D"]),
    reference=_reference,
    eager=_eager,
    scale_params=lambda s, p: {**p, "scale": 1.0 / math.sqrt(s["D"])},
    flops=lambda s: 4.0 * s["H"] * s["D"] * _keys(s),
    bytes=lambda s, e: float(e * (2 * s["H"] * s["T"] * s["D"]
                                  + 2 * s["Hkv"] * min(s["P"] + s["T"], s["W"] + s["T"])
                                  * s["D"]) + 8),
    sizes=lambda o, q, k, v, pos: (q.shape[0], k.shape[0], q.shape[1], k.shape[1],
                                   q.shape[2]),
    dims=window_dims,
    clauses=CLAUSES,
    shapes={
        "verify": [window_shape(1, 1, 1, 0, 1, 4, 1), window_shape(4, 2, 1, 37, 45, 16, 8),
                   window_shape(2, 1, 5, 0, 9, 64, 3), window_shape(3, 3, 7, 12, 20, 8, 100),
                   window_shape(4, 1, 3, 30, 33, 20, 5), window_shape(6, 2, 9, 5, 17, 12, 7),
                   window_shape(2, 1, 70, 3, 80, 8, 33),
                   window_shape(4, 2, 4, 600, 610, 100, 512)],  # the C kernels' thread team
        "llm": unique([window_shape(h, kv, t, p, p + t + 16, d, 512) for h, kv, d in
                       attention_heads() for t, p in ((1, 1023), (128, 384))]),
        "figure": [window_shape(8, 4, 1, 1023, 1024, 256, 512),
                   window_shape(8, 4, 128, 384, 512, 256, 512)],
        "serve": _serve(),
    },
    tolerances={"float32": Tolerance(5e-5, 1e-4), "bfloat16": Tolerance(2e-2, 2e-2),
                "float16": Tolerance(2e-3, 2e-3)},
))
