// strata-kernel: op=conv1d dialect=c entry=strata_conv1d requires=avx512f,fma
/* conv1d (NCL) as im2col + the AVX-512 GEMM of the lab's conv engine (strata_conv2d.h's
 * gemm_nn_run: a 6 x 64 register tile over depth-major packed columns); c.im2col is the same
 * lowering on the AVX2 GEMM of matmul (strata_sgemm.h).
 *
 * strata_conv.h's conv1d_lowered: per image and group, cols[c*K + k][t] = x[n, g*cg + c,
 * t*S - P + k*D] (zero outside [0, L)), then w_g[og, cg*K] @ cols, then the bias.
 *
 * Scratch is allocated and freed inside the call; there is no global state. */
#include <stdint.h>
#include "strata_conv.h"
#include "strata_conv2d.h"

void strata_conv1d(float *out, const float *x, const float *w, const float *b,
                   const int64_t *geom, int64_t N, int64_t C, int64_t L, int64_t O, int64_t K,
                   int64_t G, int64_t Lo) {
    conv1d_lowered(out, x, w, b, geom, N, C, L, O, K, G, Lo, gemm_nn_run);
}
