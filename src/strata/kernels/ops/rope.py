"""rope: rotary position embedding as Llama applies it (rotate-half over (i, i + D/2))."""

from strata.kernels.ops._shapes import attention_heads, unique
from strata.kernels.spec import KernelSpec, floats, register

THETA = 10000.0


def tables(positions, head_dim: int, dtype, device):
    """cos/sin [T, D/2] for integer positions, as HF Llama builds them (float32 math)."""
    import torch

    inv = 1.0 / THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = positions.to(torch.float32)[:, None] * inv[None, :]
    return angles.cos().to(dtype=dtype, device=device), angles.sin().to(dtype=dtype,
                                                                         device=device)


def _inputs(s, dtype, seed, device):
    import torch

    t, d = s["T"], s["D"]
    positions = torch.arange(t) + 1000 * (seed % 3)  # also positions deep into the context
    cos, sin = tables(positions, d, getattr(torch, dtype), device)
    return [floats((t, s["H"], d), dtype, seed, device), cos.contiguous(), sin.contiguous()]


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
    shapes={
        "verify": [{"T": 1, "H": 1, "D": 2}, {"T": 5, "H": 3, "D": 16},
                   {"T": 17, "H": 2, "D": 64}, {"T": 3, "H": 5, "D": 6}],
        "llm": unique([{"T": t, "H": h, "D": d} for h, _, d in attention_heads()
                       for t in (1, 128)]),
        "figure": [{"T": t, "H": 32, "D": 128} for t in (1, 128)],
    },
))
