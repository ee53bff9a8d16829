"""rope_backward: the gradient of rotate-half RoPE for training (the inverse rotation).

RoPE rotates each pair (i, i + D/2) by the position's angle, so its gradient rotates dy back:
for i < D/2, dx[i] = dy[i]*c[i] + dy[i+D/2]*s[i] and dx[i+D/2] = dy[i+D/2]*c[i] - dy[i]*s[i]
(the forward op with sin negated). out = dx [T,H,D].
"""

from strata.kernels.ops import rope
from strata.kernels.ops._shapes import unique
from strata.kernels.ops._training import trained_dims, training_dims
from strata.kernels.spec import Clause, KernelSpec, dims_of, floats, register

CLAUSES = (Clause("tables", rope.TABLES, {"T": 5, "H": 3, "D": 16}, rope.given_tables),)


def _inputs(s, dtype, seed, device):
    x, cos, sin = rope.SPEC.make_inputs(s, dtype, seed, device)  # the same angle tables
    return [floats(tuple(x.shape), dtype, seed, device, offset=3), cos, sin]


def _reference(dy, cos, sin):
    import torch

    with torch.enable_grad():
        x = torch.zeros_like(dy).requires_grad_()
        (dx,) = torch.autograd.grad(rope._reference(x, cos, sin), (x,), dy)
    return dx


def _eager(dy, cos, sin):
    """What autograd runs for the forward's torch formula: dy*c plus the cat's and the
    rotation's backward (dy*s rotated back)."""
    import torch

    half = dy.shape[-1] // 2
    c = torch.cat([cos, cos], dim=-1)[:, None, :]
    s = torch.cat([sin, sin], dim=-1)[:, None, :]
    ds = dy * s
    return dy * c + torch.cat([ds[..., half:], -ds[..., :half]], dim=-1)


def _shapes() -> list[dict[str, int]]:
    # the training step ropes q (H heads) and k (the KV heads) over batch*ctx positions
    return unique([{"T": d.tokens, "H": h, "D": d.head_dim} for d in training_dims()
                   for h in (d.heads, d.kv_heads)])


def _serve() -> list[dict[str, int]]:
    """What a training step ropes back: q's heads and k's kv heads over batch x ctx."""
    return unique([{"T": d.tokens, "H": h, "D": d.head_dim} for d in trained_dims()
                   for h in (d.heads, d.kv_heads)])[-2:]


SPEC = register(KernelSpec(
    name="rope_backward",
    summary="rotate-half RoPE's gradient: dy rotated back (sin negated)",
    inputs=("dy", "cos", "sin"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["T"], s["H"], s["D"]),
    reference=_reference,
    eager=_eager,
    flops=lambda s: 3.0 * s["T"] * s["H"] * s["D"],
    bytes=lambda s, e: float(e * (2 * s["T"] * s["H"] * s["D"] + s["T"] * s["D"])),
    sizes=lambda o, dy, c, s: tuple(dy.shape),
    dims=dims_of(T=(1, 0), H=(1, 1), D=(1, 2)),
    clauses=CLAUSES,
    # the default tolerance: two products and one sum per element, like the forward
    shapes={
        "verify": [{"T": 1, "H": 1, "D": 2}, {"T": 5, "H": 3, "D": 16},
                   {"T": 17, "H": 2, "D": 64}, {"T": 3, "H": 5, "D": 6},
                   {"T": 33, "H": 3, "D": 34}],
        "llm": _shapes(),
        "figure": [{"T": 4096, "H": 32, "D": 128}],
        "serve": _serve(),
    },
))
