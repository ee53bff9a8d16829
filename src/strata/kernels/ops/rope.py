"""rope: rotary position embedding as Llama applies it (rotate-half over (i, i + D/2))."""

from strata.kernels.ops._shapes import (
    attention_heads,
    lab_rows,
    largest_model,
    smallest_model,
    unique,
)
from strata.kernels.ops._training import trained_dims
from strata.kernels.spec import Clause, KernelSpec, dims_of, floats, register

THETA = 10000.0
CLAUSE_THETA = 500000.0  # Llama 3's base: tables no kernel may assume


def tables(positions, head_dim: int, dtype, device, theta: float = THETA):
    """cos/sin [T, D/2] for integer positions, as HF Llama builds them (float32 math)."""
    import torch

    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = positions.to(torch.float32)[:, None] * inv[None, :]
    return angles.cos().to(dtype=dtype, device=device), angles.sin().to(dtype=dtype,
                                                                         device=device)


def _inputs(s, dtype, seed, device):
    import torch

    t, d = s["T"], s["D"]
    positions = torch.arange(t) + 1000 * (seed % 3)  # also positions deep into the context
    cos, sin = tables(positions, d, getattr(torch, dtype), device)
    return [floats((t, s["H"], d), dtype, seed, device), cos.contiguous(), sin.contiguous()]


def given_tables(inputs, shape, seed):
    """cos/sin (inputs[1], inputs[2]) replaced by the tables of positions 0, 37, 74, ...
    with θ = CLAUSE_THETA: row 0 is cos 1, sin 0."""
    import torch

    cos, sin = inputs[1], inputs[2]
    c, s = tables(torch.arange(shape["T"]) * 37, shape["D"], cos.dtype, cos.device,
                  theta=CLAUSE_THETA)
    cos.copy_(c)
    sin.copy_(s)


TABLES = ("cos and sin are applied as given, row t to token t: any θ or frequency scaling "
          "(here θ = 500000, positions 0, 37, 74, ...), and position 0's row (cos 1, sin 0) "
          "leaves x unchanged.")
CLAUSES = (Clause("tables", TABLES, {"T": 5, "H": 3, "D": 16}, given_tables),)


def _serve():
    """-B lab ropes q and k of every token: decode of the largest model, a prefill chunk of
    the smallest; training ropes batch x ctx positions at once."""
    decode, chunk = lab_rows()
    big, small = largest_model(), smallest_model()
    train = max(trained_dims(), key=lambda d: d.tokens)
    return unique([{"T": decode, "H": big.heads, "D": big.head_dim},
                   {"T": chunk, "H": small.heads, "D": small.head_dim},
                   {"T": train.tokens, "H": train.heads, "D": train.head_dim}])


def _reference(x, cos, sin):
    import torch

    half = x.shape[-1] // 2
    c = torch.cat([cos, cos], dim=-1)[:, None, :]
    s = torch.cat([sin, sin], dim=-1)[:, None, :]
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * c + rotated * s


SPEC = register(KernelSpec(
    name="rope",
    summary="rotary embedding, rotate-half (Llama/NeoX layout)",
    inputs=("x", "cos", "sin"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["T"], s["H"], s["D"]),
    reference=_reference,
    flops=lambda s: 3.0 * s["T"] * s["H"] * s["D"],
    bytes=lambda s, e: float(e * (2 * s["T"] * s["H"] * s["D"] + s["T"] * s["D"])),
    sizes=lambda o, x, c, s: tuple(x.shape),
    dims=dims_of(T=(1, 0), H=(1, 1), D=(1, 2)),
    clauses=CLAUSES,
    shapes={
        "verify": [{"T": 1, "H": 1, "D": 2}, {"T": 5, "H": 3, "D": 16},
                   {"T": 17, "H": 2, "D": 64}, {"T": 3, "H": 5, "D": 6}],
        "llm": unique([{"T": t, "H": h, "D": d} for h, _, d in attention_heads()
                       for t in (1, 128)]),
        "figure": [{"T": t, "H": 32, "D": 128} for t in (1, 128)],
        "serve": _serve(),
    },
))
