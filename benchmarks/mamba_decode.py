"""A Mamba block's decode step on this host: the lab's kernels vs torch eager, side by side
in one run (issue 28: the causal conv1d inside a real model path).

  python benchmarks/mamba_decode.py [--models mamba-130m,mamba-2.8b] [--steps 200]

One Mamba-1 mixer step (the `step` of mamba_ssm's Mamba block, batch 1, float32 weights):
in_proj (a matvec to 2 x d_inner), the causal depthwise conv's state update and output,
SiLU, x_proj and dt_proj (matvecs), the selective-scan state update, the SiLU gate and
out_proj. The lab arm runs the four matvecs as `linear_f32` (c.avx2), the conv step as
`conv1d_causal_step` (c.avx2) and the gate as `silu_mul` (c.avx2), each bound once to static
buffers as a decode loop binds them; the scan and the two small elementwise steps are the same
torch code in both arms. Sizes are the published configs (d_model, expand 2, d_state 16,
d_conv 4, dt_rank = ceil(d_model / 16)). Both arms must give the same output (checked); the
figure is the median step time over --steps steps after warm-up, and their ratio. Prints;
asserts nothing (speed goals are benchmarks, not tests).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

# name -> d_model (state-spaces/mamba-*-hf config.json: hidden_size; expand 2, d_state 16)
MODELS = {"mamba-130m": 768, "mamba-370m": 1024, "mamba-1.4b": 2048, "mamba-2.8b": 2560}


@dataclass
class Block:
    d_model: int
    d_inner: int
    d_state: int = 16
    d_conv: int = 4

    @property
    def dt_rank(self) -> int:
        return math.ceil(self.d_model / 16)


def weights(b: Block, seed: int = 0) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float = 1.0) -> Any:
        return (torch.randn(*shape, generator=g) * scale).contiguous()

    return {"in_proj": r(2 * b.d_inner, b.d_model, scale=b.d_model ** -0.5),
            "conv_w": r(b.d_inner, b.d_conv, scale=0.5), "conv_b": r(b.d_inner, scale=0.1),
            "x_proj": r(b.dt_rank + 2 * b.d_state, b.d_inner, scale=b.d_inner ** -0.5),
            "dt_proj": r(b.d_inner, b.dt_rank, scale=b.dt_rank ** -0.5),
            "dt_bias": r(b.d_inner, scale=0.1),
            "A_log": torch.log(torch.arange(1, b.d_state + 1, dtype=torch.float32)
                               ).repeat(b.d_inner, 1),
            "D": torch.ones(b.d_inner),
            "out_proj": r(b.d_model, b.d_inner, scale=b.d_inner ** -0.5)}


def torch_step(b: Block, w: dict[str, Any], conv: Any, ssm: Any, h: Any) -> Any:
    """mamba_ssm's Mamba.step, in torch eager (conv state of d_conv positions, newest last)."""
    import torch
    import torch.nn.functional as F

    x, z = F.linear(h, w["in_proj"]).chunk(2, dim=-1)
    conv.copy_(torch.roll(conv, shifts=-1, dims=-1))
    conv[:, :, -1] = x
    x = F.silu(torch.sum(conv * w["conv_w"], dim=-1) + w["conv_b"])
    return _after_conv(b, w, ssm, x, z, lambda v, m: F.linear(v, m),
                       lambda zz, yy: yy * F.silu(zz))


def _after_conv(b: Block, w: dict[str, Any], ssm: Any, x: Any, z: Any, linear: Any,
                gate: Any) -> Any:
    import torch
    import torch.nn.functional as F

    dt, B, C = torch.split(linear(x, w["x_proj"]), [b.dt_rank, b.d_state, b.d_state], dim=-1)
    dt = F.softplus(linear(dt.contiguous(), w["dt_proj"]) + w["dt_bias"])
    A = -torch.exp(w["A_log"])
    dA = torch.exp(dt.unsqueeze(-1) * A)
    ssm.mul_(dA).add_(x.unsqueeze(-1) * dt.unsqueeze(-1) * B.unsqueeze(1))
    y = (ssm @ C.unsqueeze(-1)).squeeze(-1) + w["D"] * x
    return linear(gate(z.contiguous(), y.contiguous()), w["out_proj"])


class LabOps:
    """The lab's built-in C kernels, each bound once per (op, shape) to static buffers."""

    def __init__(self) -> None:
        from strata.kernels.dialects.c import load_c
        from strata.kernels.registry import builtin_implementations
        from strata.kernels.spec import get_spec

        self.kernels = {}
        for op in ("linear_f32", "conv1d_causal_step", "silu_mul"):
            impl = next(i for i in builtin_implementations() if i.op == op and
                        i.name == "c.avx2")
            self.kernels[op] = load_c(impl, get_spec(op), "cpu")
        self.bound: dict[tuple[Any, ...], tuple[Any, list[Any], Any]] = {}

    def run(self, op: str, out_shape: tuple[int, ...], *inputs: Any,
            dynamic: tuple[int, ...] = (0,)) -> Any:
        """Call `op`; the inputs at `dynamic` are copied into the bound buffers, the others
        (weights, the persistent conv state) are bound as they are, once."""
        import torch

        key = (op, out_shape, *(t.data_ptr() if i not in dynamic else tuple(t.shape)
                                for i, t in enumerate(inputs)))
        if key not in self.bound:
            out = torch.empty(out_shape)
            bufs = [torch.empty_like(t) if i in dynamic else t for i, t in enumerate(inputs)]
            self.bound[key] = (out, bufs, self.kernels[op].bind(out, bufs, {}))
        out, bufs, call = self.bound[key]
        for i in dynamic:
            bufs[i].copy_(inputs[i])
        call()
        return out


def lab_step(b: Block, w: dict[str, Any], ops: LabOps, state: Any, ssm: Any, h: Any) -> Any:
    """The same step with the lab's kernels; the conv state holds d_conv - 1 positions (the
    newest input is x itself), as conv1d_causal_step's ABI does."""
    import torch.nn.functional as F

    def linear(v: Any, m: Any) -> Any:
        return ops.run("linear_f32", (v.shape[0], m.shape[0]), v, m)

    x, z = linear(h, w["in_proj"]).chunk(2, dim=-1)
    n = b.d_inner * (b.d_conv - 1)
    packed = ops.run("conv1d_causal_step", (n + b.d_inner,), state, x, w["conv_w"],
                     w["conv_b"], dynamic=(1,))
    state.copy_(packed[:n].view_as(state))
    x = F.silu(packed[n:].view(1, b.d_inner))
    return _after_conv(b, w, ssm, x, z, linear,
                       lambda zz, yy: ops.run("silu_mul", tuple(zz.shape), zz, yy,
                                              dynamic=(0, 1)))


def median_step(step: Any, steps: int) -> float:
    for _ in range(10):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mamba-130m,mamba-2.8b",
                    help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--steps", type=int, default=200, help="timed decode steps per arm")
    args = ap.parse_args()
    import torch

    ops = LabOps()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch 1, float32")
    print(f"{'model':12} {'torch eager ms':>15} {'lab ms':>8} {'speedup':>8}  max |diff|")
    for name in args.models.split(","):
        b = Block(MODELS[name], 2 * MODELS[name])
        w = weights(b)
        tokens = torch.randn(8, 1, b.d_model, generator=torch.Generator().manual_seed(1))
        # both arms from the same zero state over the same 8 tokens: the outputs must agree
        conv, ssm_t = torch.zeros(1, b.d_inner, b.d_conv), torch.zeros(1, b.d_inner, b.d_state)
        state, ssm_l = torch.zeros(1, b.d_inner, b.d_conv - 1), torch.zeros_like(ssm_t)
        diff = 0.0
        for h in tokens:
            a = torch_step(b, w, conv, ssm_t, h)
            c = lab_step(b, w, ops, state, ssm_l, h)
            diff = max(diff, float((a - c).abs().max()))
        if diff > 1e-3:
            print(f"{name}: the arms disagree (max |diff| {diff:.3g}); not timed")
            continue
        h = tokens[0]
        t_torch = median_step(partial(torch_step, b, w, conv, ssm_t, h), args.steps)
        t_lab = median_step(partial(lab_step, b, w, ops, state, ssm_l, h), args.steps)
        print(f"{name:12} {t_torch * 1e3:15.3f} {t_lab * 1e3:8.3f} {t_torch / t_lab:7.2f}x"
              f"  {diff:.2g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
