"""Shared spec builder for the quantised matrix-vector products (q8_0, q4_0)."""

from strata.kernels.ops import _quant
from strata.kernels.ops._clauses import ragged, special_scales
from strata.kernels.ops._shapes import ffn_sizes, hidden_sizes, smallest_model, unique
from strata.kernels.spec import KernelSpec, Tolerance, dims_of, floats, register


def serve_shapes() -> list[dict[str, int]]:
    """No lab step runs it (-B lab runs linear_<type>): a decode row and a small batch (8,
    the llm set's most) through the smallest model's FFN up and down projections."""
    m = smallest_model()
    return [{"B": 1, "N": m.ffn, "K": m.hidden}, {"B": 8, "N": m.hidden, "K": m.ffn}]


def _spec(kind: str) -> KernelSpec:
    block = _quant.BLOCK_BYTES[kind]

    def inputs(s, dtype, seed, device):
        w = _quant.random_blocks(kind, s["N"], s["K"], seed).to(device)
        return [w, floats((s["B"], s["K"]), dtype, seed, device)]

    def reference(w, x):
        return x @ _quant.dequantize(kind, w, x.shape[-1], x.dtype).T

    def weight_bytes(s):
        return s["N"] * s["K"] // _quant.QK * block

    h = hidden_sizes()
    llm = unique([{"B": b, "N": n, "K": k} for k in h for n in (k,) for b in (1, 8)]
                 + [{"B": 1, "N": f, "K": k} for k, f in zip(h, ffn_sizes(), strict=False)])
    return KernelSpec(
        name=f"matvec_{kind}",
        summary=f"x @ dequant({kind} weight)^T in one pass",
        inputs=("w", "x"),
        make_inputs=inputs,
        out_shape=lambda s: (s["B"], s["N"]),
        reference=reference,
        flops=lambda s: 2.0 * s["B"] * s["N"] * s["K"],
        bytes=lambda s, e: float(weight_bytes(s) + e * s["B"] * (s["K"] + s["N"])),
        sizes=lambda o, w, x: (x.shape[0], w.shape[0], x.shape[1]),
        dims=dims_of(B=(2, 0), N=(1, 0), K=(2, 1)),
        clauses=(special_scales(kind, 0, {"B": 3, "N": 12, "K": 128}),
                 ragged({"B": 2, "N": 13, "K": 64}, "B and N (K: a multiple of 32)")),
        shapes={
            "verify": [{"B": 1, "N": 1, "K": 32}, {"B": 1, "N": 7, "K": 96},
                       {"B": 3, "N": 40, "K": 64}, {"B": 2, "N": 33, "K": 256}],
            "llm": llm,
            "figure": [{"B": 1, "N": 4096, "K": 4096}],
            "serve": serve_shapes(),
        },
        tolerances={"float32": Tolerance(1e-5, 1e-4), "bfloat16": Tolerance(2e-2, 2e-2),
                    "float16": Tolerance(2e-3, 2e-3)},
    )


def register_matvec(kind: str) -> KernelSpec:
    return register(_spec(kind))
