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
from strata.kernels.ops.cross_entropy import LARGE_LOGITS, large_logits
from strata.kernels.spec import Clause, KernelSpec, Tolerance, dims_of, floats, generator, register

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
    """Closed form, in the logits' dtype: loss = logsumexp - x[target], dlogits = softmax -
    onehot (F.cross_entropy's value and gradient); a row whose target lies outside [0, V)
    gets loss 0 and a zero gradient row (F.cross_entropy would raise for most of them)."""
    import torch

    ok = (target >= 0) & (target < logits.shape[1])
    safe = target.where(ok, 0)[:, None]
    lse = torch.logsumexp(logits, dim=-1)
    loss = (lse - logits.gather(1, safe)[:, 0]).where(ok, 0.0)
    dlogits = torch.softmax(logits, dim=-1)
    dlogits.scatter_add_(1, safe, -torch.ones_like(safe, dtype=dlogits.dtype))
    dlogits = dlogits.where(ok[:, None], 0.0)
    return torch.cat([loss, dlogits.reshape(-1)])


def _ignored_targets(inputs, shape, seed):
    """Targets of rows r % 6 in {0, 1, 3} set to -100 (ignore_index), V and -1."""
    target, v = inputs[1], shape["V"]
    target[0::6] = -100
    target[1::6] = v + seed  # V, V + 1: just past the end
    target[3::6] = -1


CLAUSES = (
    Clause("ignore_index", "A target outside [0, V) (ignore_index -100, -1, V, ...) gives "
           "loss 0 and a zero gradient row.", {"rows": 6, "V": 33}, _ignored_targets),
    Clause("large_logits", LARGE_LOGITS, {"rows": 4, "V": 257}, large_logits),
)


def _serve():
    """Training's loss over batch x ctx rows: the most rows with the smallest vocabulary, and
    one batch's rows with the largest (one call of both at once would make the float64
    oracle slow)."""
    try:
        from strata.train.presets import PRESETS
        found = [(p.batch, p.batch * p.model.ctx, p.model.vocab)
                 for name, p in PRESETS.items() if name in ("tiny", "small")]
    except ImportError:
        found = [(16, 16 * 128, 1024)]
    return unique([{"rows": max(r for _, r, _ in found), "V": min(v for _, _, v in found)},
                   {"rows": min(b for b, _, _ in found), "V": max(v for _, _, v in found)}])


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
    dims=dims_of(rows=(1, 0), V=(1, 1)),
    clauses=CLAUSES,
    shapes={
        "verify": [{"rows": 1, "V": 1}, {"rows": 1, "V": 10}, {"rows": 3, "V": 1000},
                   {"rows": 5, "V": 257},
                   # enough work (> 2^20) for the avx2 kernel's threaded path
                   {"rows": 259, "V": 4099}],
        "llm": _shapes(),
        "figure": [_shapes()[0]],
        "serve": _serve(),
    },
    # dlogits are probabilities (|.| <= 1, mostly ~1/V) computed as exp(x - max) / sum in
    # float32, so their error is a few ulp of 1 at most: the default 1e-5 atol holds. The
    # loss is lse - x[target] where |lse| reaches ~1e3 for the 25x-scaled row: a float32
    # lse carries ~1e-7 relative error of that, hence rtol 1e-4 on the loss-sized values.
    tolerances={"float32": Tolerance(1e-5, 1e-4), "bfloat16": Tolerance(2e-2, 2e-2),
                "float16": Tolerance(2e-3, 2e-3)},
))
