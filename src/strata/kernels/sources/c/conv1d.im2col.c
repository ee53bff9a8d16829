// strata-kernel: op=conv1d dialect=c entry=strata_conv1d requires=avx2,fma
/* conv1d (NCL) as im2col + the lab's matmul (strata_sgemm.h, matmul.avx2.c's GEMM).
 *
 * Per image and group: cols[c*K + k][t] = x[n, g*cg + c, t*S - P + k*D] (zero outside
 * [0, L)), then out[n, g*og:(g+1)*og] = w_g[og, cg*K] @ cols (w is [O, C/G*K] row-major: the
 * GEMM's a as it is), then the bias. Whisper's kernel-3 convs make cols 3x the input.
 *
 * Scratch is allocated and freed inside the call; there is no global state. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_conv.h"
#include "strata_sgemm.h"

void strata_conv1d(float *out, const float *x, const float *w, const float *b,
                   const int64_t *geom, int64_t N, int64_t C, int64_t L, int64_t O, int64_t K,
                   int64_t G, int64_t Lo) {
    const int64_t S = geom[0], P = geom[1], D = geom[2], cg = C / G, og = O / G;
    if (N <= 0 || O <= 0 || Lo <= 0) return;
    float *cols = malloc((size_t)(cg * K * Lo) * sizeof(float));
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + (n * C + g * cg) * L;
            float *o = out + (n * O + g * og) * Lo;
            if (cols) {
                conv1d_im2col(cols, xg, cg, L, K, S, P, D, Lo);
                strata_sgemm(o, w + g * og * cg * K, cols, og, Lo, cg * K);
                for (int64_t r = 0; r < og; r++)
                    for (int64_t t = 0; t < Lo; t++) o[r * Lo + t] += b[g * og + r];
                continue;
            }
            /* out of memory for scratch: the plain loop */
            conv1d_plain(o, xg, w + g * og * cg * K, b + g * og, cg, og, L, K, S, P, D, Lo);
        }
    free(cols);
}
