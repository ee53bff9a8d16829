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
from strata.kernels.spec import KernelSpec, floats, register

CLAUSES = _conv2d.clauses(w_axis=3)


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
    return {**dims, **_conv2d.geom_dims(geom)}


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
    per_shape=True,
    clauses=CLAUSES,
    shapes=_conv2d.shape_sets(),
))
