/* strata_im2col.h: the im2col lowerings the convolution kernels share (portable C +
 * OpenMP): `conv1d_im2col` (conv1d's patch matrix, cols[c*K + k][t] = x[c, t*S - P + k*D],
 * zero outside [0, L)). Everything is `static`: each kernel's library keeps its own copy. */
#ifndef STRATA_IM2COL_H
#define STRATA_IM2COL_H

#include <stdint.h>

static void conv1d_im2col(float *cols, const float *x, int64_t cg, int64_t L, int64_t K,
                          int64_t S, int64_t P, int64_t D, int64_t Lo) {
#pragma omp parallel for schedule(static) if (cg * K * Lo > 65536)
    for (int64_t row = 0; row < cg * K; row++) {
        const int64_t c = row / K, k = row % K;
        const float *src = x + c * L;
        float *dst = cols + row * Lo;
        for (int64_t t = 0; t < Lo; t++) {
            const int64_t s = t * S - P + k * D;
            dst[t] = s >= 0 && s < L ? src[s] : 0.0f;
        }
    }
}

#endif
