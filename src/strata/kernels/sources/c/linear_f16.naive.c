// strata-kernel: op=linear_f16 dialect=c entry=strata_linear_f16
/* Portable reference of ggml's F16 linear: out[b,n] = sum_k f16(x[b,k]) * w[n,k], x [B,K]
 * float32, w [N,K] IEEE binary16 (a GGUF F16 weight as stored). Each activation is first
 * rounded to binary16 (round to nearest, ties to even), as ggml converts the activation row
 * before its F16 dot product; the products (exact in float32) are summed in double here.
 * Conversions are done by bit manipulation (no F16C needed). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_half.h"

void strata_linear_f16(float *out, const float *x, const uint16_t *w, int64_t B, int64_t N,
                       int64_t K) {
    if (B <= 0 || N <= 0) return;
    float *xh = (float *)malloc((size_t)(K > 0 ? K : 1) * sizeof(float));
    if (!xh) return;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t k = 0; k < K; k++) xh[k] = half_to_float(float_to_half(x[b * K + k]));
        for (int64_t n = 0; n < N; n++) {
            const uint16_t *wr = w + n * K;
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) acc += (double)xh[k] * half_to_float(wr[k]);
            out[b * N + n] = (float)acc;
        }
    }
    free(xh);
}
