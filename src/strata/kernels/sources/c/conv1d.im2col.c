// strata-kernel: op=conv1d dialect=c entry=strata_conv1d requires=avx2,fma
/* conv1d (NCL) as im2col + the lab's matmul (strata_sgemm.h, matmul.avx2.c's GEMM).
 *
 * strata_conv.h's conv1d_lowered: per image and group, cols[c*K + k][t] = x[n, g*cg + c,
 * t*S - P + k*D] (zero outside [0, L)), then w_g[og, cg*K] @ cols, then the bias. Whisper's
 * kernel-3 convs make cols 3x the input.
 *
 * Scratch is allocated and freed inside the call; there is no global state. */
#include <stdint.h>
#include "strata_conv.h"
#include "strata_sgemm.h"

static int sgemm(float *out, const float *a, const float *b, int64_t M, int64_t N, int64_t K) {
    strata_sgemm(out, a, b, M, N, K);
    return 1;
}

void strata_conv1d(float *out, const float *x, const float *w, const float *b,
                   const int64_t *geom, int64_t N, int64_t C, int64_t L, int64_t O, int64_t K,
                   int64_t G, int64_t Lo) {
    conv1d_lowered(out, x, w, b, geom, N, C, L, O, K, G, Lo, sgemm);
}
