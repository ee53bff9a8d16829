"""cross_entropy: per-row logsumexp(logits) - logits[target] (fused log-softmax + NLL)."""

from strata.kernels.ops._shapes import rows_by, vocab_sizes
from strata.kernels.spec import KernelSpec, floats, generator, register


def _inputs(s, dtype, seed, device):
    import torch

    logits = floats((s["rows"], s["V"]), dtype, seed, device, scale=4.0)
    if s["rows"] > 1:  # large logits: an unshifted exp overflows
        logits[0] = logits[0] * 25
    target = torch.randint(0, s["V"], (s["rows"],), generator=generator(seed)).to(device)
    return [logits, target]


def _reference(logits, target):
    import torch.nn.functional as F

    return F.cross_entropy(logits, target, reduction="none")


SPEC = register(KernelSpec(
    name="cross_entropy",
    summary="per-row logsumexp(logits) - logits[target]",
    inputs=("logits", "target"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["rows"],),
    out_dtype="float32",
    reference=_reference,
    flops=lambda s: 4.0 * s["rows"] * s["V"],
    bytes=lambda s, e: float(e * s["rows"] * s["V"] + 12 * s["rows"]),
    sizes=lambda o, logits, t: tuple(logits.shape),
    shapes={
        "verify": [{"rows": 1, "V": 1}, {"rows": 1, "V": 10}, {"rows": 3, "V": 1000},
                   {"rows": 5, "V": 257}],
        "llm": rows_by(vocab_sizes(), rows=(8, 64), names=("rows", "V")),
        "figure": rows_by([32000, 151936], rows=(8,), names=("rows", "V")),
    },
))
