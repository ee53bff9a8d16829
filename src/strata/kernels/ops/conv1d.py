"""conv1d: general 1-D convolution in torch's layout (NCL), with stride, zero padding,
dilation and groups, + bias: exactly `torch.nn.functional.conv1d(x, w, b, S, P, D, G)`.
Whisper's audio front-end is two of them (kernel 3, the second with stride 2), sized from
the published configs (models/data/audio_configs.json).

x [N,C,L]; w [O,C/G,K]; b [O]; geom int64 [3] = [S, P, D] -> out [N,O,Lo],
Lo = (L + 2P - D·(K-1) - 1)//S + 1: out[n,o,t] = b[o] + Σ_{c,k} w[o,c,k]·x[n, g·C/G + c,
t·S - P + k·D], g = o // (O/G), x outside [0, L) read as 0. Per image it is
w[O, C·K] @ cols[C·K, Lo] (im2col). The Mamba conv (conv1d_causal) is the depthwise, causal,
stride-1 case with its own op.
"""

from strata.kernels.ops import _conv2d, _kernelbench
from strata.kernels.ops._clauses import ragged
from strata.kernels.spec import Clause, KernelSpec, Shape, as_made, floats, register

KEYS = ("N", "C", "L", "O", "K", "G", "S", "P", "D")
GEOM = ("S", "P", "D")  # geom's values, in order


def _shape(*values: int) -> Shape:
    return dict(zip(KEYS, values, strict=True))


def out_len(s: Shape) -> int:
    return (s["L"] + 2 * s["P"] - s["D"] * (s["K"] - 1) - 1) // s["S"] + 1


def _flops(s: Shape) -> float:
    return 2.0 * s["N"] * out_len(s) * s["O"] * s["K"] * (s["C"] // s["G"])


def _bytes(s: Shape, e: int) -> float:
    return float(e * (s["N"] * s["C"] * s["L"] + s["O"] * (s["C"] // s["G"]) * s["K"]
                      + s["O"] + s["N"] * s["O"] * out_len(s)))


def _whisper(frames: int | None = None) -> list[Shape]:
    """conv1 and conv2 of each published Whisper (frames: the published 3000, or fewer)."""
    import json
    from importlib import resources

    text = resources.files("strata.models").joinpath("data", "audio_configs.json").read_text()
    shapes = []
    for m in json.loads(text)["models"].values():
        n = frames or m["frames"]
        shapes += [_shape(1, m["mels"], n, m["d_model"], 3, 1, 1, 1, 1),
                   _shape(1, m["d_model"], n, m["d_model"], 3, 1, 2, 1, 1)]
    return shapes


def _inputs(s, dtype, seed, device):
    return [floats((s["N"], s["C"], s["L"]), dtype, seed, device),
            floats((s["O"], s["C"] // s["G"], s["K"]), dtype, seed, device, offset=1),
            floats((s["O"],), dtype, seed, device, offset=2), _conv2d.geom(s, device, GEOM)]


def _conv(x, w, b, geom):
    import torch.nn.functional as F

    s, p, d = _conv2d.geom_values(geom)
    return F.conv1d(x, w, b, s, p, d, x.shape[1] // w.shape[1])


def _dims(out, x, w, b, geom):
    dims = {"N": int(x.shape[0]), "C": int(x.shape[1]), "L": int(x.shape[2]),
            "O": int(w.shape[0]), "K": int(w.shape[2]),
            "G": int(x.shape[1]) // max(1, int(w.shape[1]))}
    return {**dims, **_conv2d.geom_dims(geom, GEOM)}


CLAUSES = (
    Clause("padding", "Zero padding: outputs whose window reaches before 0 or past L read "
           "zeros there (P = geom[1] on both ends); a kernel that clamps, wraps around, or "
           "writes only the interior is wrong.", _shape(1, 3, 7, 4, 3, 1, 1, 1, 1), as_made),
    Clause("stride_dilation", "The stride S = geom[0] and the dilation D = geom[2] are read "
           "at call time: output t reads x at t·S - P + k·D for k < K; a kernel that assumes "
           "S = 1 or D = 1 is wrong.", _shape(1, 3, 17, 4, 3, 1, 2, 2, 2), as_made),
    Clause("groups", "Groups G = C / w.shape[1]: output channel o reads only the C/G input "
           "channels of its group g = o // (O/G) (not o % G); depthwise (G = C) included.",
           _shape(1, 4, 9, 8, 3, 4, 1, 1, 1), as_made),
    ragged(_shape(2, 5, 23, 19, 3, 1, 1, 1, 1), "N, C, L and O"),
)

SPEC = register(KernelSpec(
    name="conv1d",
    summary="1-D convolution, NCL (torch's conv1d), stride, padding, dilation, groups, + bias",
    inputs=("x", "w", "b", "geom"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["N"], s["O"], out_len(s)),
    reference=_conv,
    flops=_flops,
    bytes=_bytes,
    sizes=lambda o, x, w, b, g: (x.shape[0], x.shape[1], x.shape[2], w.shape[0], w.shape[2],
                                 x.shape[1] // max(1, w.shape[1]), o.shape[2]),
    dims=_dims,
    per_shape=True,
    clauses=CLAUSES,
    shapes={
        "verify": [_shape(1, 1, 1, 1, 1, 1, 1, 0, 1), _shape(1, 3, 10, 5, 3, 1, 1, 1, 1),
                   _shape(2, 4, 13, 6, 3, 1, 2, 1, 1), _shape(1, 6, 20, 6, 5, 6, 1, 2, 1),
                   _shape(1, 4, 30, 8, 3, 2, 3, 0, 4), _shape(1, 3, 9, 4, 1, 1, 1, 0, 1),
                   _shape(1, 70, 37, 67, 3, 1, 2, 1, 1)],
        # Whisper's front-end, 30 s of audio (models/data/audio_configs.json)
        "llm": _whisper(),
        "figure": _whisper(),
        # the smallest two at a 10 s window: a served call's float64 check stays < 1 s
        "serve": _whisper(1000)[:2],
        # KernelBench's level-1 conv1d problems (ops/_kernelbench.py names each)
        "kernelbench": _kernelbench.unique(_kernelbench.CONV1D),
    },
))
