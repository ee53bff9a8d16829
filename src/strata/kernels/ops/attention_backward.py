"""attention_backward: dq, dk, dv of causal GQA attention from the forward's saved o and lse.

Inputs q [H,T,D], k/v [Hkv,T,D], o [H,T,D], lse float32 [H,T] (attention_lse's outputs
for these q, k, v), dout [H,T,D] (the gradient of o); params scale. One output buffer, packed:
out = [dq (H*T*D) | dk (Hkv*T*D) | dv (Hkv*T*D)], row-major; dk and dv are summed over the
H/Hkv query heads that share a kv head. Flash-attention-2 recomputation, per query row t:
    p_s   = exp(scale * q_t.k_s - lse_t)           (s <= t; no T x T matrix is stored)
    delta = dout_t . o_t                           (= sum_s p_s * dout_t.v_s)
    ds_s  = p_s * (dout_t.v_s - delta)
    dq_t  = scale * sum_s ds_s k_s,  dk_s += scale * ds_s q_t,  dv_s += p_s dout_t
"""

from strata.kernels.ops._attention_grad import (
    VERIFY_SHAPES,
    eager_backward,
    eager_forward,
    figure_shape,
    forward,
    qkv,
    scale_for,
    serve_shapes,
    train_shapes,
)
from strata.kernels.ops._clauses import GQA_BACKWARD, causal, gqa
from strata.kernels.spec import KernelSpec, Tolerance, dims_of, floats, register

CLAUSES = (causal({"H": 2, "Hkv": 1, "T": 9, "D": 8}),
           gqa({"H": 6, "Hkv": 2, "T": 5, "D": 8}, GQA_BACKWARD))


def _inputs(s, dtype, seed, device):
    """q, k, v, dout at random; o and lse are the float64 forward of the (dtype-rounded)
    q, k, v, rounded to dtype: exactly what a training forward hands its backward."""
    import torch

    q, k, v = qkv(s, dtype, seed, device)
    dout = floats((s["H"], s["T"], s["D"]), dtype, seed, device, offset=3)
    o, lse = forward(*(t.to("cpu", torch.float64) for t in (q, k, v)),
                     scale_for(s, {})["scale"])
    # lse stays float32 whatever the dtype: 16-bit would shift every p by ~1% (as in
    # attention_lse's float32 output)
    return [q, k, v, o.to(dtype=q.dtype, device=device).contiguous(),
            lse.to(dtype=torch.float32, device=device).contiguous(), dout]


def _derive(inputs, scale):
    """After the benchmark mixes fresh inputs, o and lse are recomputed from the new q, k,
    v (they are functions of them; a linear mix of two forwards is no forward)."""
    q, k, v, o, lse, _ = inputs
    o_new, lse_new = eager_forward(q, k, v, scale)
    o.copy_(o_new)
    lse.copy_(lse_new)


def _reference(q, k, v, o, lse, dout, scale):
    """torch autograd through the materialised forward (o and lse are the forward's own
    outputs by contract, so the reference recomputes them rather than trusting them)."""
    import torch

    with torch.enable_grad():
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        out, _ = forward(qg, kg, vg, scale)
        dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
    return torch.cat([dq.reshape(-1), dk.reshape(-1), dv.reshape(-1)])


def _eager(q, k, v, o, lse, dout, scale):
    import torch

    dq, dk, dv = eager_backward(q, k, v, o, lse, dout, scale)
    return torch.cat([dq.reshape(-1), dk.reshape(-1), dv.reshape(-1)])


def _flops(s):
    # five T x T x D products over the causal half: q.k^T and dout.v^T recomputed, then
    # dv = p^T dout, dk = ds^T q, dq = ds k: 5 * 2 * H * D * T(T+1)/2
    return 5.0 * s["H"] * s["D"] * s["T"] * (s["T"] + 1)


def _bytes(s, e):
    htd, kvtd = s["H"] * s["T"] * s["D"], s["Hkv"] * s["T"] * s["D"]
    # read q, o, dout, k, v, lse; write dq, dk, dv
    return float(e * (4 * htd + 4 * kvtd + s["H"] * s["T"]))


SPEC = register(KernelSpec(
    name="attention_backward",
    summary="causal GQA attention gradients from saved lse, packed: out = [dq | dk | dv]",
    inputs=("q", "k", "v", "o", "lse", "dout"),
    make_inputs=_inputs,
    derive=_derive,
    out_shape=lambda s: (s["H"] * s["T"] * s["D"] + 2 * s["Hkv"] * s["T"] * s["D"],),
    reference=_reference,
    eager=_eager,
    scale_params=scale_for,
    flops=_flops,
    bytes=_bytes,
    sizes=lambda out, q, k, v, o, lse, dout: (q.shape[0], k.shape[0], q.shape[1], q.shape[2]),
    dims=dims_of(H=(1, 0), Hkv=(2, 0), T=(1, 1), D=(1, 2)),
    clauses=CLAUSES,
    shapes={"verify": VERIFY_SHAPES, "llm": train_shapes(), "figure": [figure_shape()],
            "serve": serve_shapes()},
    # float32 scores of heavy-tailed inputs reach |s| ~ 1e2-1e3; their rounding moves each
    # p by ~|s| * 2^-24 * sqrt(D) relative, ds = p * (dout.v - delta) subtracts two dot
    # products of similar size, and dq/dk/dv sum up to T (x group) such terms. Measured
    # against the float64 autograd: torch's own float32 CPU flash backward needs atol
    # 3.1e-4 * rms at T=512 (ours 9e-5), so 1e-3: 3x torch's error, while a masking or
    # grouping bug is off by ~1 * rms.
    tolerances={"float32": Tolerance(1e-3, 1e-4), "bfloat16": Tolerance(4e-2, 4e-2),
                "float16": Tolerance(4e-3, 4e-3)},
))
