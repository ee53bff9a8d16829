"""conv2d_nhwc: 2-D convolution in the channels-last layout (what oneDNN and cuDNN run fastest,
torch's `channels_last`), with stride, zero padding and groups (depthwise included), + bias.

x [N,H,W,C]; w [O,K,K,C/G] (OHWI: torch's channels_last weight, a view of its OIHW
tensor); b [O]; geom int64 [2] = [S, P] -> out [N,Ho,Wo,O], Ho = (H + 2P - K)//S + 1:
out[n,i,j,o] = b[o] + Σ_{kh,kw,c} w[o,kh,kw,c]·x[n, i·S-P+kh, j·S-P+kw, g·C/G + c] with
g = o // (O/G), x outside the image read as 0. With G = 1 it is a GEMM of the K·K·C patch
of every output pixel against the weight rows (im2col + matmul, or the same product
formed in registers: a direct, "implicit GEMM" convolution).
"""

from strata.kernels.ops import _conv2d
from strata.kernels.ops._clauses import ragged
from strata.kernels.spec import Clause, KernelSpec, as_made, floats, register

PADDING = ("Zero padding: output pixels whose K x K window reaches past the image's edge read "
           "zeros there (P = geom[1] on every side); a kernel that clamps to the edge, wraps "
           "around, or writes only the interior is wrong.")
STRIDE = ("The stride S = geom[0] is read at call time: output (i, j) reads rows i·S-P.. and "
          "columns j·S-P..; a kernel that assumes S = 1 (or S = K) is wrong.")
GROUPS = ("Groups G = C / w.shape[3]: output channel o reads only the C/G input channels of "
          "its group g = o // (O/G) (consecutive output channels share a group, not o % G); "
          "depthwise (G = C) included.")
CLAUSES = (
    Clause("padding", PADDING, {"N": 1, "H": 5, "W": 6, "C": 3, "O": 4, "K": 3, "G": 1,
                                "S": 1, "P": 1}, as_made),
    Clause("stride", STRIDE, {"N": 1, "H": 9, "W": 8, "C": 3, "O": 5, "K": 3, "G": 1,
                              "S": 2, "P": 1}, as_made),
    Clause("groups", GROUPS, {"N": 1, "H": 6, "W": 5, "C": 4, "O": 8, "K": 3, "G": 4,
                              "S": 1, "P": 1}, as_made),
    ragged({"N": 2, "H": 7, "W": 9, "C": 5, "O": 19, "K": 3, "G": 1, "S": 1, "P": 1},
           "N, H, W, C and O"),
)


def _inputs(s, dtype, seed, device):
    return [floats((s["N"], s["H"], s["W"], s["C"]), dtype, seed, device),
            floats((s["O"], s["K"], s["K"], s["C"] // s["G"]), dtype, seed, device, offset=1),
            floats((s["O"],), dtype, seed, device, offset=2), _conv2d.geom(s, device)]


def _nchw(x, w, b, geom):
    """torch's conv2d on channels_last views (no copy): what a torch user runs."""
    import torch.nn.functional as F

    stride, pad = _conv2d.stride_pad(geom)
    groups = x.shape[3] // w.shape[3]
    y = F.conv2d(x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2), b, stride, pad, 1, groups)
    return y.permute(0, 2, 3, 1)


def _dims(out, x, w, b, geom):
    dims = {"N": int(x.shape[0]), "H": int(x.shape[1]), "W": int(x.shape[2]),
            "C": int(x.shape[3]), "O": int(w.shape[0]), "K": int(w.shape[1]),
            "G": int(x.shape[3]) // max(1, int(w.shape[3]))}
    if geom.device.type != "meta":
        dims["S"], dims["P"] = int(geom[0]), int(geom[1])
    return dims


SPEC = register(KernelSpec(
    name="conv2d_nhwc",
    summary="2-D convolution, channels-last (NHWC x, OHWI w), stride, padding, groups, + bias",
    inputs=("x", "w", "b", "geom"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["N"], *_conv2d.out_hw(s), s["O"]),
    reference=_nchw,
    eager=_nchw,
    flops=_conv2d.flops,
    bytes=_conv2d.nbytes,
    sizes=lambda o, x, w, b, g: (x.shape[0], x.shape[1], x.shape[2], x.shape[3], w.shape[0],
                                 w.shape[1], x.shape[3] // max(1, w.shape[3]), o.shape[1],
                                 o.shape[2]),
    dims=_dims,
    clauses=CLAUSES,
    shapes={
        "verify": [{"N": 1, "H": 1, "W": 1, "C": 1, "O": 1, "K": 1, "G": 1, "S": 1, "P": 0},
                   {"N": 1, "H": 5, "W": 7, "C": 3, "O": 5, "K": 3, "G": 1, "S": 1, "P": 1},
                   {"N": 2, "H": 9, "W": 6, "C": 4, "O": 6, "K": 3, "G": 1, "S": 2, "P": 1},
                   {"N": 1, "H": 11, "W": 9, "C": 3, "O": 8, "K": 7, "G": 1, "S": 2, "P": 3},
                   {"N": 1, "H": 8, "W": 8, "C": 5, "O": 7, "K": 1, "G": 1, "S": 1, "P": 0},
                   {"N": 1, "H": 7, "W": 6, "C": 6, "O": 9, "K": 1, "G": 1, "S": 2, "P": 0},
                   {"N": 1, "H": 12, "W": 8, "C": 3, "O": 5, "K": 4, "G": 1, "S": 4, "P": 0},
                   {"N": 1, "H": 9, "W": 10, "C": 6, "O": 6, "K": 7, "G": 6, "S": 1, "P": 3},
                   {"N": 1, "H": 7, "W": 7, "C": 4, "O": 6, "K": 3, "G": 2, "S": 1, "P": 1},
                   {"N": 1, "H": 6, "W": 9, "C": 70, "O": 67, "K": 3, "G": 1, "S": 1, "P": 1}],
        # every conv2d layer of the published vision models (models/data/vision_configs.json)
        "llm": _conv2d.layer_shapes(),
        "figure": _conv2d.layer_shapes(),
        "serve": _conv2d.serve(),
    },
))
