"""cross_entropy_fused: the per-row loss and the gradient of the logits in one pass.

Inputs logits [R,V], target int64 [R]. One float32 output buffer, packed:
out = [loss (R) | dlogits (R*V)], row-major, with per row r
    loss[r]    = logsumexp(logits[r]) - logits[r, target[r]]
    dlogits[r] = softmax(logits[r]) - onehot(target[r])      (= d loss[r] / d logits[r])
The upstream scale (1/N of a mean, the loss's incoming gradient) is the autograd wrapper's
to apply. Kernels walk a row in chunks of the vocabulary (a max/sum pass, then a pass that
writes exp(x - max) / sum): no probability matrix beyond one row chunk is ever held. A
target outside [0, V) (e.g. ignore_index -100) gives loss 0 and a zero gradient row.
"""

from strata.kernels.ops._shapes import unique
from strata.kernels.spec import KernelSpec, Tolerance, floats, generator, register

# A vocabulary of a real tokenizer (Llama 2's 32000) for the larger training shape.
LARGER_VOCAB, LARGER_ROWS = 32000, 1024


def _inputs(s, dtype, seed, device):
    import torch

    logits = floats((s["rows"], s["V"]), dtype, seed, device, scale=4.0)
    if s["rows"] > 1:  # large logits: an unshifted exp overflows
        logits[0] = logits[0] * 25
    target = torch.randint(0, s["V"], (s["rows"],), generator=generator(seed)).to(device)
    return [logits, target]


def _reference(logits, target):
    """torch autograd of F.cross_entropy (reduction none) per row."""
    import torch
    import torch.nn.functional as F

    with torch.enable_grad():
        x = logits.detach().requires_grad_()
        loss = F.cross_entropy(x, target, reduction="none")
        (dlogits,) = torch.autograd.grad(loss.sum(), x)
    return torch.cat([loss.detach(), dlogits.reshape(-1)])


def _eager(logits, target):
    """What PyTorch's autograd runs: log_softmax + nll forward, then log_softmax's backward
    (exp(log p) minus the one-hot) for a unit upstream gradient, in float32."""
    import torch

    rows = logits.shape[0]
    out = torch.empty(rows + logits.numel(), dtype=torch.float32, device=logits.device)
    logp = torch.log_softmax(logits.float(), dim=-1)
    ok = (target >= 0) & (target < logits.shape[1])
    safe = target.where(ok, 0)[:, None]
    torch.neg(logp.gather(1, safe)[:, 0].where(ok, 0.0), out=out[:rows])
    d = out[rows:].view(logp.shape)
    torch.exp(logp, out=d)
    d.scatter_add_(1, safe, -ok.to(d.dtype)[:, None])
    d.mul_(ok[:, None])
    return out


def _shapes():
    try:
        from strata.train.presets import PRESETS
        found = [(p.batch * p.model.ctx, p.model.vocab) for name, p in PRESETS.items()
                 if name in ("tiny", "small")]
    except ImportError:  # the plan's `tiny` until strata.train exists
        found = [(16 * 128, 1024)]
    found.append((LARGER_ROWS, LARGER_VOCAB))
    return unique([{"rows": r, "V": v} for r, v in found])


SPEC = register(KernelSpec(
    name="cross_entropy_fused",
    summary="per-row cross-entropy loss and dlogits in one pass, packed: out = [loss | dlogits]",
    inputs=("logits", "target"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["rows"] + s["rows"] * s["V"],),
    out_dtype="float32",
    reference=_reference,
    eager=_eager,
    # per element: max, subtract, exp and sum (pass 1), subtract, exp, scale (pass 2)
    flops=lambda s: 7.0 * s["rows"] * s["V"],
    # logits read twice (max/sum, then gradient) unless a row stays in cache: count once;
    # dlogits written; target (int64) read and loss (float32) written per row
    bytes=lambda s, e: float(e * s["rows"] * s["V"] + 4 * s["rows"] * s["V"] + 12 * s["rows"]),
    sizes=lambda o, logits, t: tuple(logits.shape),
    shapes={
        "verify": [{"rows": 1, "V": 1}, {"rows": 1, "V": 10}, {"rows": 3, "V": 1000},
                   {"rows": 5, "V": 257},
                   # enough work (> 2^20) for the avx2 kernel's threaded path
                   {"rows": 259, "V": 4099}],
        "llm": _shapes(),
        "figure": [_shapes()[0]],
    },
    # dlogits are probabilities (|.| <= 1, mostly ~1/V) computed as exp(x - max) / sum in
    # float32, so their error is a few ulp of 1 at most: the default 1e-5 atol holds. The
    # loss is lse - x[target] where |lse| reaches ~1e3 for the 25x-scaled row: a float32
    # lse carries ~1e-7 relative error of that, hence rtol 1e-4 on the loss-sized values.
    tolerances={"float32": Tolerance(1e-5, 1e-4), "bfloat16": Tolerance(2e-2, 2e-2),
                "float16": Tolerance(2e-3, 2e-3)},
))
