"""Shared parts of attention_lse and attention_backward: inputs, the materialised float64
forward, the vendor (eager) paths and the training shapes.

Layout as `attention`: q [H,T,D], k/v [Hkv,T,D], causal, head h reads kv head h // (H/Hkv).
A training batch folds into the head axis exactly: with q [B*H,T,D] and k/v [B*Hkv,T,D],
head b*H + h reads kv head (b*H + h) // (H/Hkv) = b*Hkv + h // (H/Hkv), i.e. its own
sequence's kv head, so one call covers a whole batch (the training shapes below do that).
"""

from __future__ import annotations

import math
from typing import Any

from strata.kernels.ops._shapes import unique
from strata.kernels.spec import floats

# Ragged: T=1, head dims off every vector width, group sizes 1, 2 and 3, and one shape with
# enough work for the avx2 kernels' threaded paths (lse: 2 products x H*T*(T+1)/2*D > 2^20
# multiply-adds; backward: 5 products > 2^21), small enough for Triton's interpreter.
VERIFY_SHAPES = [{"H": 1, "Hkv": 1, "T": 1, "D": 4}, {"H": 4, "Hkv": 2, "T": 5, "D": 16},
                 {"H": 2, "Hkv": 1, "T": 17, "D": 64}, {"H": 6, "Hkv": 2, "T": 33, "D": 12},
                 {"H": 3, "Hkv": 3, "T": 9, "D": 35}, {"H": 8, "Hkv": 4, "T": 97, "D": 24}]

# One wider model than the presets (4 sequences of 512 tokens, 16 heads of 64 sharing 4
# kv heads): a shape whose K/V/dK/dV no longer sit in L2.
LARGER = {"B": 4, "heads": 16, "kv_heads": 4, "head_dim": 64, "ctx": 512}


def qkv(s: dict[str, int], dtype: str, seed: int, device: str) -> list[Any]:
    h, hkv, t, d = s["H"], s["Hkv"], s["T"], s["D"]
    return [floats((h, t, d), dtype, seed, device),
            floats((hkv, t, d), dtype, seed, device, offset=1),
            floats((hkv, t, d), dtype, seed, device, offset=2)]


def scale_for(s: dict[str, int], params: dict[str, Any]) -> dict[str, Any]:
    return {**params, "scale": 1.0 / math.sqrt(s["D"])}


def forward(q: Any, k: Any, v: Any, scale: float) -> tuple[Any, Any]:
    """(o, lse) with the whole score matrix materialised: differentiable, any dtype."""
    import torch

    groups = q.shape[0] // k.shape[0]
    k = k.repeat_interleave(groups, dim=0)
    v = v.repeat_interleave(groups, dim=0)
    scores = (q @ k.transpose(-1, -2)) * scale
    t = q.shape[1]
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse[..., None]) @ v, lse


def _expand(k: Any, v: Any, groups: int) -> tuple[Any, Any]:
    return (k.repeat_interleave(groups, dim=0)[None], v.repeat_interleave(groups, dim=0)[None])


def eager_forward(q: Any, k: Any, v: Any, scale: float) -> tuple[Any, Any]:
    """What PyTorch runs for a training forward that saves lse: on the CPU its fused flash
    kernel (the one SDPA's autograd uses there; GQA by expanding k/v as SDPA does),
    elsewhere the materialised composition above."""
    import torch

    if q.device.type != "cpu" or q.shape[1] == 0:
        return forward(q, k, v, scale)
    ke, ve = _expand(k, v, q.shape[0] // k.shape[0])
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q[None], ke, ve, 0.0, True, scale=scale)
    return o[0], lse[0]


def eager_backward(q: Any, k: Any, v: Any, o: Any, lse: Any, dout: Any, scale: float) -> \
        tuple[Any, Any, Any]:
    """(dq, dk, dv) as PyTorch computes them from a saved (o, lse): the CPU flash backward,
    dk/dv of the expanded heads summed per kv group; elsewhere autograd through the
    materialised forward (recomputed: no saved graph is handed in)."""
    import torch

    hkv, groups = k.shape[0], q.shape[0] // k.shape[0]
    if q.device.type == "cpu" and q.shape[1] > 0:
        ke, ve = _expand(k, v, groups)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout[None], q[None], ke, ve, o[None], lse[None], 0.0, True, scale=scale)
        dq, dk, dv = dq[0], dk[0], dv[0]
    else:
        with torch.enable_grad():
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            dq, dk, dv = torch.autograd.grad(forward(qg, kg, vg, scale)[0], (qg, kg, vg),
                                             dout)
        return dq, dk, dv
    shape = (hkv, groups, *dk.shape[1:])
    return dq, dk.reshape(shape).sum(1), dv.reshape(shape).sum(1)


def train_shapes() -> list[dict[str, int]]:
    """The training presets' attention, batch folded into heads (see the module doc), plus
    one larger model."""
    try:
        from strata.train.presets import PRESETS
        models = [(p.batch, p.model.n_heads, p.model.n_kv_heads, p.model.head_dim, p.model.ctx)
                  for name, p in PRESETS.items() if name in ("tiny", "small")]
    except ImportError:  # the plan's `tiny` until strata.train exists
        models = [(16, 4, 2, 32, 128)]
    models.append(tuple(LARGER.values()))  # type: ignore[arg-type]
    return unique([{"H": b * h, "Hkv": b * kv, "T": t, "D": d} for b, h, kv, d, t in models])


def serve_shapes() -> list[dict[str, int]]:
    """What `strata train` runs, in two cheap shapes whose box holds every preset's call:
    the most folded heads (batch x heads) at the shortest context, and one sequence's heads
    at the longest context (the float64 oracle of the largest call of both would take
    seconds)."""
    try:
        from strata.train.presets import PRESETS
        models = [(p.batch, p.model.n_heads, p.model.n_kv_heads, p.model.head_dim, p.model.ctx)
                  for name, p in PRESETS.items() if name in ("tiny", "small")]
    except ImportError:  # the plan's `tiny` until strata.train exists
        models = [(16, 4, 2, 32, 128)]
    b, h, kv, _, _ = max(models, key=lambda m: m[0] * m[1])
    _, h1, kv1, d1, t = max(models, key=lambda m: m[4])
    return unique([{"H": b * h, "Hkv": b * kv, "T": min(m[4] for m in models),
                    "D": max(m[3] for m in models)},
                   {"H": h1, "Hkv": kv1, "T": t, "D": d1}])


def figure_shape() -> dict[str, int]:
    return train_shapes()[0]
