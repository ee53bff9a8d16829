"""attention_sinks: gpt-oss's attention, a learned "sink" logit per head in the softmax, of T
new queries over a KV cache, GQA, with or without a sliding window (both gpt-oss layer kinds).

q [H,T,D]; k, v [Hkv,C,D]; pos int64 [2]: P = pos[0] rows precede the T queries, whose own keys
and values are already at rows P..P+T-1 (P + T ≤ C), and W = pos[1]: query t (at row P+t)
sees rows max(0, P+t-W+1)..P+t when W > 0 (llama.cpp's standard SWA mask, as
attention_window), rows 0..P+t when W = 0 (as attention_cached); sinks [H], the call's float
dtype; scale, the scores' factor. With s_j = scale·q·k_j over the rows query t sees and
m = max(max_j s_j, sinks[h]):

    out[h,t] = Σ_j e^(s_j - m)·v_j / (Σ_j e^(s_j - m) + e^(sinks[h] - m))

The sink is one more logit in the softmax's denominator, taken as given (not multiplied by
scale) and with no value row: it only takes weight away from the keys. That is ggml's CPU
numerics for gpt-oss (ggml-cpu/ops.cpp): soft_max with sinks scales the scores (wp =
scale·kq + mask), then takes max = MAX(max, sk[head]) and adds expf(sk[head] - max) to the
sum, no value; flash_attn_ext merges the raw sink into the running max and sum after the
keys (ms = expf(M - s) rescales the accumulated values, vs = expf(s - M) joins the sum,
nothing joins the values). A sink of -inf is no sink (weight e^-inf = 0): the op is then
attention_window (W > 0) or attention_cached (W = 0). The kv head of query head h is
h // (H/Hkv), and sinks are indexed by the query head.

Like attention_window, W is a tensor value read at every call ("P" and "W" in the shape dict),
and the verifier poisons the rows no query sees: before the first query's window (W > 0) and
from P+T on, NaN (even seeds) or large values (odd seeds). Tolerance: attention_window's.
"""

import math

from strata.kernels.ops._clauses import gqa
from strata.kernels.ops._shapes import attention_heads, lab_rows, smallest_model, unique
from strata.kernels.ops.attention_window import window_dims
from strata.kernels.ops.attention_window import window_shape as _shape
from strata.kernels.spec import Clause, KernelSpec, Tolerance, as_made, floats, register

WINDOW = 128  # gpt-oss's sliding window (its GGUF's gpt-oss.attention.sliding_window)
SINK_SCALE = 2.0  # sinks spread about as wide as the scores, so they take real weight


def _hidden(p, t, w):
    """Rows no query sees: before the first query's window (W > 0), and from P+T on."""
    return (max(0, p - w + 1) if w > 0 else 0), p + t


def _inputs(s, dtype, seed, device):
    import torch

    h, hkv, t, p, c, d, w = s["H"], s["Hkv"], s["T"], s["P"], s["C"], s["D"], s["W"]
    q = floats((h, t, d), dtype, seed, device)
    k = floats((hkv, c, d), dtype, seed, device, offset=1)
    v = floats((hkv, c, d), dtype, seed, device, offset=2)
    sinks = floats((h,), dtype, seed, device, scale=SINK_SCALE, offset=3)
    before, after = _hidden(p, t, w)
    fill = float("nan") if seed % 2 == 0 else 1e4
    for rows in (slice(0, before), slice(after, c)):
        k[:, rows] = fill
        v[:, rows] = -fill
    return [q, k, v, torch.tensor([p, w], dtype=torch.int64, device=device), sinks]


def _seen(t, p, w, device):
    """(first row any query sees, mask [T, rows from it to P+T): True where attended)."""
    import torch

    lo = _hidden(p, t, w)[0]
    keys = torch.arange(lo, p + t, device=device)[None, :]
    query = torch.arange(p, p + t, device=device)[:, None]
    mask = keys <= query
    return lo, (mask & (keys > query - w)) if w > 0 else mask


def _sink_softmax(q, k, v, sinks, scale, p, w):
    """softmax over [scores..., sink] with the sink's column dropped, times v."""
    import torch

    t = q.shape[1]
    lo, mask = _seen(t, p, w, q.device)
    groups = q.shape[0] // k.shape[0]
    k = k[:, lo:p + t].repeat_interleave(groups, dim=0)
    v = v[:, lo:p + t].repeat_interleave(groups, dim=0)
    scores = ((q @ k.transpose(-1, -2)) * scale).masked_fill(~mask, float("-inf"))
    sink = sinks.reshape(-1, 1, 1).expand(*scores.shape[:-1], 1).to(scores.dtype)
    probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
    return probs @ v


def _reference(q, k, v, pos, sinks, scale):
    return _sink_softmax(q, k, v, sinks, scale, int(pos[0]), int(pos[1]))


def _eager(q, k, v, pos, sinks, scale):
    # on the meta device (the contract's shape check) pos has no value: the whole cache
    meta = pos.device.type == "meta"
    p, w = (k.shape[1] - q.shape[1], 0) if meta else (int(pos[0]), int(pos[1]))
    return _sink_softmax(q, k, v, sinks, scale, p, w)


def _poison(inputs, shape, seed):
    """Rows before P-W+1 (W > 0) and from P+T on set to NaN, ±inf or ±1e30 (seed 0, 1, 2)."""
    k, v = inputs[1], inputs[2]
    before, after = _hidden(shape["P"], shape["T"], shape["W"])
    fill = (float("nan"), float("inf"), 1e30)[seed % 3]
    for rows in (slice(0, before), slice(after, k.shape[1])):
        k[:, rows] = fill
        v[:, rows] = -fill


SCORE_TARGET = 120.0  # the largest |score| a query attends in the large_sink case
SINK_ABOVE = (30.0, 1e3, 1e4)  # how far above its head's largest score a large sink sits


def _seen_scores(q, k, shape):
    """float64 scores [H, T, rows] of every query over the rows it sees (others -inf)."""
    import torch

    p, t, w = shape["P"], shape["T"], shape["W"]
    lo, mask = _seen(t, p, w, "cpu")
    qf = q.detach().to("cpu", torch.float64)
    kf = k.detach().to("cpu", torch.float64)[:, lo:p + t]
    kf = kf.repeat_interleave(qf.shape[0] // kf.shape[0], dim=0)
    s = (qf @ kf.transpose(-1, -2)) / math.sqrt(qf.shape[-1])
    return s.masked_fill(~mask, float("-inf"))


def _large_sink(inputs, shape, seed):
    """q scaled so the largest |score| seen is SCORE_TARGET; the sinks of even heads set
    SINK_ABOVE[...] over their head's largest score (odd heads keep theirs)."""
    import torch

    q, k, sinks = inputs[0], inputs[1], inputs[4]
    s = _seen_scores(q, k, shape)
    q.mul_(SCORE_TARGET / float(s.masked_fill(s == float("-inf"), 0.0).abs().max()))
    top = _seen_scores(q, k, shape).amax(dim=(1, 2))
    for h in range(0, q.shape[0], 2):
        big = float(top[h]) + SINK_ABOVE[(h // 2 + seed) % len(SINK_ABOVE)]
        sinks[h] = torch.tensor(big, dtype=sinks.dtype)


def _negative_sink(inputs, shape, seed):
    """Sinks -inf, -1e30 and -1e4 (head h: the (h + seed) % 3rd)."""
    sinks = inputs[4]
    for h in range(sinks.shape[0]):
        sinks[h] = (float("-inf"), -1e30, -1e4)[(h + seed) % 3]


def _dims(out, q, k, v, pos, sinks):
    """attention_window's: P and W are pos's two values, the sinks add no dimension."""
    return window_dims(out, q, k, v, pos)


def _keys(s):
    """Σ_t min(W, P + t + 1) (W = 0: P + t + 1): query-key pairs over the T queries."""
    return sum(min(s["W"], s["P"] + t + 1) if s["W"] > 0 else s["P"] + t + 1
               for t in range(s["T"]))


def _read(s):
    """Cache rows read: the union of the queries' windows."""
    lo, end = _hidden(s["P"], s["T"], s["W"])
    return end - lo


CLAUSES = (
    Clause("outside_window", "With W > 0, rows before P-W+1 (outside every query's window) "
           "and from P+T on are never read: NaN, ±inf or ±1e30 there change nothing.",
           _shape(2, 1, 3, 9, 16, 8, 4), _poison, seeds=(0, 1, 2)),
    Clause("no_window", "W = 0 is no window: query t attends every row 0..P+t, and rows from "
           "P+T on are never read (NaN, ±inf or ±1e30 there change nothing).",
           _shape(2, 1, 3, 6, 12, 8, 0), _poison, seeds=(0, 1, 2)),
    Clause("window_per_query", "Each query has its own window: query t sees rows "
           "P+t-W+1..P+t, so consecutive queries drop one row each.",
           _shape(2, 1, 6, 2, 8, 8, 3), as_made),
    Clause("large_sink", "A sink far above every score (by 30 to 1e4, scores up to ±120) takes "
           "all but a vanishing share of the weight: the output tends to 0, with no overflow "
           "and no NaN.", _shape(4, 2, 3, 5, 10, 8, 4), _large_sink),
    Clause("negative_sink", "A sink of -inf, -1e30 or -1e4 takes no weight: the output is the "
           "plain softmax attention, with no NaN (-inf - -inf never computed).",
           _shape(3, 1, 3, 4, 9, 8, 3), _negative_sink),
    gqa(_shape(6, 2, 2, 5, 9, 8, 4)),
)


def _serve():
    """-B lab's calls at the smallest model's heads: a decode step and a prefill chunk from
    an empty cache, each on a windowed layer (gpt-oss's window, the decode at a full
    window) and on a full-attention one (W = 0)."""
    decode, chunk = lab_rows()
    small = smallest_model()
    h, kv, d = small.heads, small.kv_heads, small.head_dim
    return [_shape(h, kv, decode, 1022, 1023, d, WINDOW), _shape(h, kv, decode, 1022, 1023, d, 0),
            _shape(h, kv, chunk, 0, chunk, d, WINDOW), _shape(h, kv, chunk, 0, chunk, d, 0)]


SPEC = register(KernelSpec(
    name="attention_sinks",
    summary="attention of T queries over a KV cache with a sink logit per head, optional "
            "sliding window, GQA (gpt-oss)",
    inputs=("q", "k", "v", "pos", "sinks"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["H"], s["T"], s["D"]),
    reference=_reference,
    eager=_eager,
    scale_params=lambda s, p: {**p, "scale": 1.0 / math.sqrt(s["D"])},
    flops=lambda s: 4.0 * s["H"] * s["D"] * _keys(s),
    bytes=lambda s, e: float(e * (2 * s["H"] * s["T"] * s["D"] + 2 * s["Hkv"] * _read(s)
                                  * s["D"] + s["H"]) + 16),
    sizes=lambda o, q, k, v, pos, sinks: (q.shape[0], k.shape[0], q.shape[1], k.shape[1],
                                          q.shape[2]),
    dims=_dims,
    clauses=CLAUSES,
    shapes={
        "verify": [_shape(1, 1, 1, 0, 1, 4, 0), _shape(1, 1, 1, 0, 1, 4, 1),
                   _shape(4, 2, 1, 37, 45, 16, 8), _shape(4, 2, 1, 37, 45, 16, 0),
                   _shape(2, 1, 5, 0, 9, 64, 3), _shape(3, 3, 7, 12, 20, 8, 100),
                   _shape(4, 1, 3, 30, 33, 20, 0), _shape(6, 2, 9, 5, 17, 12, 7),
                   _shape(2, 1, 70, 3, 80, 8, 33),  # query rows in more than one block
                   # enough work (> 2^18 multiply-adds) for the C kernels' thread team
                   _shape(4, 2, 4, 600, 610, 100, WINDOW), _shape(4, 2, 4, 170, 180, 100, 0)],
        "llm": unique([_shape(h, kv, t, p, p + t + 16, d, w) for h, kv, d in attention_heads()
                       for t, p in ((1, 1023), (128, 384)) for w in (WINDOW, 0)]),
        "figure": [_shape(64, 8, 1, 1023, 1024, 64, WINDOW), _shape(64, 8, 1, 1023, 1024, 64, 0),
                   _shape(64, 8, 128, 384, 512, 64, WINDOW)],
        "serve": _serve(),
    },
    tolerances={"float32": Tolerance(5e-5, 1e-4), "bfloat16": Tolerance(2e-2, 2e-2),
                "float16": Tolerance(2e-3, 2e-3)},
))
