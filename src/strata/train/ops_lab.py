"""The model's hot ops on the kernel lab's verified kernels (`strata train --kernels lab`).

Each forward/backward pair is a `torch.library.custom_op` with `register_autograd` and
`register_fake`: autograd and torch.compile see one opaque op whose forward and backward
are lab kernels chosen by dispatch for this host and device (a verified implementation when
one wins or is the only verified one; else torch, reported as such). The kernels write
packed outputs (docs/kernels-abi.md): a backward with several gradients returns them as one
flat buffer, split here.

Layouts: the lab's ops take one sequence (attention q [H,T,D]) or rows ([R,C]); the model's
batch is folded in — rows = B*T; attention heads = B*H (query head b*H+h reads kv head
b*Hkv + h//(H/Hkv), exactly the lab's GQA rule on the folded index); rope positions = B*T
with cos/sin repeated per batch element.

The projections (x·Wᵀ) run on the lab's matmul only where dispatch picks one from what this
host already verified and benchmarked (LabOps.linear); else on torch, as nn.Linear would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from strata.errors import InputError

# The lab ops training needs: forward op -> its backward op.
PAIRS = {"rmsnorm": "rmsnorm_backward", "silu_mul": "silu_mul_backward",
         "rope": "rope_backward", "attention_lse": "attention_backward",
         "cross_entropy_fused": None}


@dataclass
class _Lab:
    """The dispatched kernels, set by LabOps (custom ops are module-level, like torch's)."""

    choices: dict[str, Any] = field(default_factory=dict)  # op -> strata.kernels.Choice

    def run(self, op: str, size: int, *inputs: torch.Tensor, **params: Any) -> torch.Tensor:
        if inputs[0].dtype == torch.float64:  # the float64 path: gradcheck of the plumbing
            return reference(op, *inputs, **params)
        out = torch.empty(size, dtype=torch.float32, device=inputs[0].device)
        return self.choices[op].run_packed(out, *inputs, **params)


def reference(op: str, *inputs: torch.Tensor, **params: Any) -> torch.Tensor:
    """The op's float64 reference, flat: what `torch.autograd.gradcheck` differentiates
    through (the packing, folding and autograd wiring here are what it checks)."""
    from strata.kernels.spec import get_spec

    if op in F64_CLOSED_FORM:  # eager paths that compute in float32
        return F64_CLOSED_FORM[op](*inputs, **params)
    # backward references run autograd, which cannot record inside a custom op (autograd is
    # off below it): their closed-form eager paths compute the same in the input's dtype
    spec = get_spec(op)
    backward = op in PAIRS.values()
    return ((spec.eager if backward and spec.eager else spec.reference)(*inputs, **params)
            .reshape(-1))


def _attention_backward_f64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor,
                            scale: float) -> torch.Tensor:
    """[dq | dk | dv] of causal GQA attention from the saved lse, written out (FA2's
    equations): P = exp(S - lse), dV = Pᵀ dO, dS = P (dO Vᵀ - rowsum(dO∘O)), dQ = s dS K,
    dK = s dSᵀ Q; dk, dv summed over the query heads of each kv head."""
    h, t, _ = q.shape
    g = h // k.shape[0]
    kk, vv = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    p = torch.exp((scale * q @ kk.transpose(1, 2)).masked_fill(~mask, float("-inf"))
                  - lse[..., None])
    dv = (p.transpose(1, 2) @ do).unflatten(0, (-1, g)).sum(1)
    ds = p * (do @ vv.transpose(1, 2) - (do * o).sum(-1, keepdim=True))
    dq = scale * ds @ kk
    dk = (scale * ds.transpose(1, 2) @ q).unflatten(0, (-1, g)).sum(1)
    return torch.cat([dq.reshape(-1), dk.reshape(-1), dv.reshape(-1)])


def _cross_entropy_fused_f64(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[loss | softmax - onehot] in closed form (the op's definition, docs/kernels-abi.md)."""
    logp = torch.log_softmax(logits, dim=-1)
    loss = -logp.gather(1, target[:, None])[:, 0]
    grad = logp.exp()
    grad[torch.arange(len(target)), target] -= 1.0
    return torch.cat([loss, grad.reshape(-1)])


F64_CLOSED_FORM = {"cross_entropy_fused": _cross_entropy_fused_f64,
                   "attention_backward": _attention_backward_f64}


LAB = _Lab()


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).contiguous()


def _fake(x: torch.Tensor) -> torch.Tensor:
    """A fake output shaped like x but contiguous, as every real output here is (a view of a
    packed buffer): empty_like would keep the strides of a transposed input (the model's
    q/k/v are [B,T,H,D] transposed), and torch.compile would then plan views the real
    output cannot take."""
    return x.new_empty(x.shape)


# -- rmsnorm -----------------------------------------------------------------------------------

@torch.library.custom_op("strata::rmsnorm", mutates_args=())
def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    rows = _rows(x)
    return LAB.run("rmsnorm", rows.numel(), rows, w.contiguous(), eps=eps).view(x.shape)


@rmsnorm.register_fake
def _(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return _fake(x)


def _rmsnorm_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, w, eps = inputs
    ctx.save_for_backward(x, w)
    ctx.eps = eps


# Backward kernels are custom ops too: torch.compile traces the backward with fake tensors,
# and only an opaque op keeps it from reaching into a kernel's data pointers. Outputs that
# share the packed buffer are cloned (a custom op's outputs may not alias each other).
@torch.library.custom_op("strata::rmsnorm_backward", mutates_args=())
def rmsnorm_backward(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    rows = _rows(x)
    packed = LAB.run("rmsnorm_backward", rows.numel() + w.numel(), rows, w.contiguous(),
                     _rows(dy), eps=eps)
    return packed[:rows.numel()].view(x.shape), packed[rows.numel():].view(w.shape).clone()


@rmsnorm_backward.register_fake
def _(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor,
      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _fake(x), _fake(w)


def _rmsnorm_backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
    x, w = ctx.saved_tensors
    dx, dw = rmsnorm_backward(x, w, dy, ctx.eps)
    return dx, dw, None


rmsnorm.register_autograd(_rmsnorm_backward, setup_context=_rmsnorm_setup)


# -- silu_mul ----------------------------------------------------------------------------------

@torch.library.custom_op("strata::silu_mul", mutates_args=())
def silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ra, rb = _rows(a), _rows(b)
    return LAB.run("silu_mul", ra.numel(), ra, rb).view(a.shape)


@silu_mul.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _fake(a)


def _silu_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(*inputs)


@torch.library.custom_op("strata::silu_mul_backward", mutates_args=())
def silu_mul_backward(a: torch.Tensor, b: torch.Tensor,
                      dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = a.numel()
    packed = LAB.run("silu_mul_backward", 2 * n, _rows(a), _rows(b), _rows(dy))
    return packed[:n].view(a.shape), packed[n:].view(b.shape).clone()


@silu_mul_backward.register_fake
def _(a: torch.Tensor, b: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _fake(a), _fake(b)


def _silu_backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
    a, b = ctx.saved_tensors
    return silu_mul_backward(a, b, dy)


silu_mul.register_autograd(_silu_backward, setup_context=_silu_setup)


# -- rope --------------------------------------------------------------------------------------

def _folded_tables(cos: torch.Tensor, sin: torch.Tensor, batch: int) -> tuple[torch.Tensor,
                                                                           torch.Tensor]:
    return cos.repeat(batch, 1).contiguous(), sin.repeat(batch, 1).contiguous()


@torch.library.custom_op("strata::rope", mutates_args=())
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    b, t, h, d = x.shape
    c, s = _folded_tables(cos, sin, b)
    return LAB.run("rope", x.numel(), x.reshape(b * t, h, d).contiguous(), c, s).view(x.shape)


@rope.register_fake
def _(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return _fake(x)


def _rope_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, cos, sin = inputs
    ctx.save_for_backward(cos, sin)


@torch.library.custom_op("strata::rope_backward", mutates_args=())
def rope_backward(dy: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    b, t, h, d = dy.shape
    c, s = _folded_tables(cos, sin, b)
    dx = LAB.run("rope_backward", dy.numel(), dy.reshape(b * t, h, d).contiguous(), c, s)
    return dx.view(dy.shape)


@rope_backward.register_fake
def _(dy: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return _fake(dy)


def _rope_backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
    cos, sin = ctx.saved_tensors
    return rope_backward(dy.contiguous(), cos, sin), None, None


rope.register_autograd(_rope_backward, setup_context=_rope_setup)


# -- attention ---------------------------------------------------------------------------------

@torch.library.custom_op("strata::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [B,H,T,D], lse [B,H,T]): the lse is what the backward recomputes from."""
    b, h, t, d = q.shape
    hkv = k.shape[1]
    n = q.numel()
    packed = LAB.run("attention_lse", n + b * h * t, q.reshape(b * h, t, d).contiguous(),
                     k.reshape(b * hkv, t, d).contiguous(),
                     v.reshape(b * hkv, t, d).contiguous(), scale=scale)
    return packed[:n].view(q.shape), packed[n:].view(b, h, t).clone()  # outputs must not alias


@attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
      scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _fake(q), q.new_empty(q.shape[:3])


def _attn_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    q, k, v, scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.scale = scale


@torch.library.custom_op("strata::attention_backward", mutates_args=())
def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor, do: torch.Tensor,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, h, t, d = q.shape
    hkv = k.shape[1]
    nq, nk = q.numel(), k.numel()

    def fold(x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.reshape(b * heads, t, d).contiguous()

    packed = LAB.run("attention_backward", nq + 2 * nk, fold(q, h), fold(k, hkv), fold(v, hkv),
                     fold(o, h), lse.reshape(b * h, t).contiguous(), fold(do, h),
                     scale=scale)
    return (packed[:nq].view(q.shape), packed[nq:nq + nk].view(k.shape).clone(),
            packed[nq + nk:].view(v.shape).clone())


@attention_backward.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
      do: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _fake(q), _fake(k), _fake(v)


def _attn_backward(ctx: Any, do: torch.Tensor, _dlse: Any) -> tuple[Any, ...]:
    q, k, v, o, lse = ctx.saved_tensors
    return (*attention_backward(q, k, v, o, lse, do.contiguous(), ctx.scale), None)


attention.register_autograd(_attn_backward, setup_context=_attn_setup)


# -- cross entropy -----------------------------------------------------------------------------

@torch.library.custom_op("strata::cross_entropy", mutates_args=())
def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor,
                                                                       torch.Tensor]:
    """(loss per row, dloss/dlogits per row): one fused pass over the vocabulary."""
    r = logits.shape[0]
    packed = LAB.run("cross_entropy_fused", r + logits.numel(), logits.contiguous(),
                     targets.contiguous())
    # outputs must not alias and must sit at storage offset 0 like their fakes: the loss is
    # a view at 0, dlogits (after it in the packed buffer) a copy
    return packed[:r], packed[r:].view(logits.shape).clone()


@cross_entropy.register_fake
def _(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return logits.new_empty(logits.shape[:1]), _fake(logits)


def _ce_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(output[1])  # dlogits: an output, used only here


def _ce_backward(ctx: Any, dloss: torch.Tensor, _ddlogits: Any) -> tuple[Any, ...]:
    (dlogits,) = ctx.saved_tensors
    return dloss[:, None] * dlogits, None


cross_entropy.register_autograd(_ce_backward, setup_context=_ce_setup)


# -- linear: the projections' matmul ----------------------------------------------------------
# Only when dispatch picks a lab matmul (LabOps.linear): the lab's op is out[M,N] = a[M,K] @
# b[K,N] on contiguous operands, so Wᵀ, dyᵀ are laid out contiguously per call (a copy of a
# weight-sized matrix, small next to the matmul itself).

@torch.library.custom_op("strata::linear", mutates_args=())
def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y = x·Wᵀ: x [..., K], w [N, K] -> [..., N]."""
    a, n = _rows(x), w.shape[0]
    y = LAB.run("matmul", a.shape[0] * n, a, w.t().contiguous())
    return y.view(*x.shape[:-1], n)


@linear.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], w.shape[0]))


def _linear_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(*inputs)


@torch.library.custom_op("strata::linear_backward", mutates_args=())
def linear_backward(x: torch.Tensor, w: torch.Tensor,
                    dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx = dy·W, dW = dyᵀ·x), both on the same lab matmul; two buffers, so no aliasing."""
    a, g = _rows(x), _rows(dy)
    dx = LAB.run("matmul", a.numel(), g, w.contiguous())
    dw = LAB.run("matmul", w.numel(), g.t().contiguous(), a)
    return dx.view(x.shape), dw.view(w.shape)


@linear_backward.register_fake
def _(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _fake(x), _fake(w)


def _linear_backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
    x, w = ctx.saved_tensors
    return linear_backward(x, w, dy)


linear.register_autograd(_linear_backward, setup_context=_linear_setup)


# -- the Ops the model calls -------------------------------------------------------------------

class LabOps:
    """strata.train.model.Ops on lab kernels. `served()` says which implementation serves
    each op and why (dispatch's decision), for the run record."""

    name = "lab"

    def __init__(self, device: str, conn: Any,
                 say: Callable[[str], None] = lambda m: None) -> None:
        from strata.host import this_host
        from strata.kernels import choose
        from strata.kernels.ensure import ensure_verified

        self.device = device
        host = this_host(conn)
        ensure_verified(host, needed_ops(), device, say, " for training")
        # matmul is resolved from what this host already verified and benchmarked, never
        # verified here: ensure_verified would sandbox-verify its built-ins on a fresh home,
        # and dispatch then picks a verified, unbenchmarked built-in at unknown speed, while
        # on CPUs torch's matmul is the faster one at the projection shapes
        # (benchmarks/train_speed.py --matmul). Nothing verified: dispatch's fallback
        # decision is the record, and torch serves the projections.
        LAB.choices = choose(host, (*needed_ops(), MATMUL), device)
        self.decisions = {op: c.decision for op, c in LAB.choices.items()}
        self.lab_matmul = self.decisions[MATMUL].impl is not None

    @staticmethod
    def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return rmsnorm(_float32(x), w, eps)

    @staticmethod
    def silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return silu_mul(_float32(a), _float32(b))

    @staticmethod
    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return rope(_float32(x), cos.float().contiguous(), sin.float().contiguous())

    @staticmethod
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  scale: float) -> torch.Tensor:
        return attention(_float32(q), _float32(k), _float32(v), scale)[0]

    @staticmethod
    def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return cross_entropy(_float32(logits), targets)[0].mean()

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The projections: the lab's matmul where dispatch chose one, else torch's, exactly
        what nn.Linear (no bias) computes."""
        if self.lab_matmul:
            return linear(_float32(x), w)
        return torch.nn.functional.linear(x, w)

    def served(self) -> dict[str, dict[str, Any]]:
        """op -> {implementation, outcome, why}: what the run record stores — each hot op's
        dispatch decision, and matmul's (the projections): a lab kernel when dispatch chose
        one, else "torch.eager" with dispatch's outcome and reason."""
        out = {}
        for op, d in self.decisions.items():
            chosen = next((t.reason for t in d.trace if t.verdict in ("chosen", "fallback")),
                          "")
            out[op] = {"impl": d.chosen, "outcome": d.outcome, "why": chosen}
        return out


# The projections' op: dispatched like the others but not in needed_ops(), which LabOps
# verifies on first use (see LabOps.__init__).
MATMUL = "matmul"


def needed_ops() -> list[str]:
    return [op for pair in PAIRS.items() for op in pair if op]


def _float32(x: torch.Tensor) -> torch.Tensor:
    if x.dtype not in (torch.float32, torch.float64):
        raise InputError(f"--kernels lab: the lab's {x.device.type} kernels here are float32; "
                         f"got {x.dtype} (use --dtype float32 or --kernels torch)")
    return x
