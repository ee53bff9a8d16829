"""KernelBench's level-1 convolution problems that the lab's conv ops express (square kernels;
conv2d without dilation), as shape sets named "kernelbench" (`strata kernels eval --ops
kernelbench-conv`).

Source: ScalingIntelligence/KernelBench, KernelBench/level1/, at the release the KernelBench
paper evaluated (commit bb27f278, 2024-10-24); #50 did not exist then and comes from HEAD
(423217d9, whose level-1 files last changed in b6c52595). Later commits scaled the sizes up
for datacenter GPUs (b08d9597, 76b487e2). Each problem runs at batch 1: KernelBench's batch
(16, 256 for #50) multiplies the same per-image work, and a 2-core host's benchmark keeps
several input sets in memory. KernelBench builds its convs with bias=False; the lab's ops
always add b, which the verifier fills with random values (a bias-free kernel is wrong).
"""

from __future__ import annotations

# problem -> the layer, in the conv2d op's keys (N, H, W, C, O, K, G, S, P)
CONV2D = {
    "50_conv_standard_2D__square_input__square_kernel (AlexNet conv1; HEAD)":
        dict(N=1, H=224, W=224, C=3, O=96, K=11, G=1, S=4, P=2),
    "55_conv_standard_2D__asymmetric_input__square_kernel":
        dict(N=1, H=128, W=256, C=3, O=64, K=3, G=1, S=1, P=0),
    "63_conv_standard_2D__square_input__square_kernel":
        dict(N=1, H=256, W=256, C=3, O=64, K=3, G=1, S=1, P=0),
    "82_conv_depthwise_2D_square_input_square_kernel":
        dict(N=1, H=256, W=256, C=3, O=3, K=3, G=3, S=1, P=0),
    "84_conv_depthwise_2D_asymmetric_input_square_kernel":
        dict(N=1, H=128, W=256, C=3, O=3, K=3, G=3, S=1, P=0),
    "86_conv_depthwise_separable_2D (its depthwise conv)":
        dict(N=1, H=256, W=256, C=3, O=3, K=3, G=3, S=1, P=0),
    "86_conv_depthwise_separable_2D (its pointwise conv)":
        dict(N=1, H=254, W=254, C=3, O=64, K=1, G=1, S=1, P=0),
    "87_conv_pointwise_2D":
        dict(N=1, H=256, W=256, C=3, O=64, K=1, G=1, S=1, P=0),
}

# problem -> the layer, in the conv1d op's keys (N, C, L, O, K, G, S, P, D)
CONV1D = {
    "67_conv_standard_1D": dict(N=1, C=3, L=512, O=64, K=3, G=1, S=1, P=0, D=1),
    "76_conv_standard_1D_dilated_strided__": dict(N=1, C=3, L=256, O=64, K=3, G=1, S=3, P=0,
                                                  D=4),
}


def unique(shapes: dict[str, dict[str, int]]) -> list[dict[str, int]]:
    seen: dict[tuple[int, ...], dict[str, int]] = {}
    for s in shapes.values():
        seen.setdefault(tuple(s.values()), s)
    return list(seen.values())
