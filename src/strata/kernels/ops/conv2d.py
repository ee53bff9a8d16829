"""conv2d: 2-D convolution in torch's default layout (NCHW), with stride, zero padding and
groups (depthwise included), + bias: exactly `torch.nn.functional.conv2d(x, w, b, S, P, 1,
G)`, what a KernelBench conv problem or a torch vision model calls.

x [N,C,H,W]; w [O,C/G,K,K] (OIHW); b [O]; geom int64 [2] = [S, P] -> out [N,O,Ho,Wo],
Ho = (H + 2P - K)//S + 1: out[n,o,i,j] = b[o] + Σ_{c,kh,kw} w[o,c,kh,kw]·x[n, g·C/G + c,
i·S-P+kh, j·S-P+kw] with g = o // (O/G), x outside the image read as 0. In this layout it is
w[O, C·K·K] @ cols[C·K·K, Ho·Wo] per image, cols the im2col matrix (Caffe's lowering): a
GEMM whose rows are output channels. conv2d_nhwc is the same op channels-last.
"""

from strata.kernels.ops import _conv2d, _kernelbench
from strata.kernels.spec import KernelSpec, floats, register


def _inputs(s, dtype, seed, device):
    return [floats((s["N"], s["C"], s["H"], s["W"]), dtype, seed, device),
            floats((s["O"], s["C"] // s["G"], s["K"], s["K"]), dtype, seed, device, offset=1),
            floats((s["O"],), dtype, seed, device, offset=2), _conv2d.geom(s, device)]


def _conv(x, w, b, geom):
    import torch.nn.functional as F

    stride, pad = _conv2d.stride_pad(geom)
    return F.conv2d(x, w, b, stride, pad, 1, x.shape[1] // w.shape[1])


def _dims(out, x, w, b, geom):
    dims = {"N": int(x.shape[0]), "H": int(x.shape[2]), "W": int(x.shape[3]),
            "C": int(x.shape[1]), "O": int(w.shape[0]), "K": int(w.shape[2]),
            "G": int(x.shape[1]) // max(1, int(w.shape[1]))}
    return {**dims, **_conv2d.geom_dims(geom)}


SPEC = register(KernelSpec(
    name="conv2d",
    summary="2-D convolution, NCHW x, OIHW w (torch's conv2d), stride, padding, groups, + bias",
    inputs=("x", "w", "b", "geom"),
    make_inputs=_inputs,
    out_shape=lambda s: (s["N"], s["O"], *_conv2d.out_hw(s)),
    reference=_conv,
    flops=_conv2d.flops,
    bytes=_conv2d.nbytes,
    sizes=lambda o, x, w, b, g: (x.shape[0], x.shape[2], x.shape[3], x.shape[1], w.shape[0],
                                 w.shape[2], x.shape[1] // max(1, w.shape[1]), o.shape[2],
                                 o.shape[3]),
    dims=_dims,
    per_shape=True,
    clauses=_conv2d.clauses(w_axis=1),
    # + KernelBench's level-1 conv2d problems (ops/_kernelbench.py names each)
    shapes={**_conv2d.shape_sets(), "kernelbench": _kernelbench.unique(_kernelbench.CONV2D)},
))
