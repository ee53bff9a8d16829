// strata-kernel: op=conv2d_nhwc dialect=c entry=strata_conv2d_nhwc requires=avx512f,fma
/* Direct conv2d in NHWC with AVX-512: strata_conv2d.h's engine (an implicit GEMM with a
 * 6 x 64 register tile, per-call weight packing, a depthwise path) on the ABI's tensors. */
#include <stdint.h>
#include "strata_conv2d.h"

void strata_conv2d_nhwc(float *out, const float *x, const float *w, const float *b,
                        const int64_t *geom, int64_t N, int64_t H, int64_t W, int64_t C,
                        int64_t O, int64_t K, int64_t G, int64_t Ho, int64_t Wo) {
    conv2d_nhwc_run(out, x, w, b, geom[0], geom[1], N, H, W, C, O, K, G, Ho, Wo);
}
