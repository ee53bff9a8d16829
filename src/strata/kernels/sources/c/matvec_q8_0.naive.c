// strata-kernel: op=matvec_q8_0 dialect=c entry=strata_matvec_q8_0
/* Reference GGUF q8_0 matrix-vector product: out[b,n] = sum_k deq(w)[n,k] * x[b,k].
 *
 * A q8_0 block is 34 bytes: a little-endian fp16 scale d, then 32 int8 values q; each
 * weight is d*q. Dequantisation and the dot product happen in one pass, accumulating in
 * fp32 (per block first, then scaled by d, as the optimised variants do). Portable C only
 * (OpenMP over rows when available).
 */
#include <stdint.h>
#include <string.h>
#include "strata_half.h"

#define QK 32
#define BLOCK_BYTES 34

static float row_dot(const uint8_t *row, const float *x, int64_t nblocks) {
    float sum = 0.0f;
    for (int64_t blk = 0; blk < nblocks; blk++) {
        const uint8_t *p = row + blk * BLOCK_BYTES;
        const float d = half_to_float((uint16_t)(p[0] | (p[1] << 8)));
        const int8_t *q = (const int8_t *)(p + 2);
        const float *xb = x + blk * QK;
        float bsum = 0.0f;
        for (int j = 0; j < QK; j++) bsum += (float)q[j] * xb[j];
        sum += d * bsum;
    }
    return sum;
}

void strata_matvec_q8_0(float *out, const uint8_t *w, const float *x,
                        int64_t B, int64_t N, int64_t K) {
    const int64_t nblocks = K / QK;
    /* rows are independent; the pragma is ignored by a compiler without OpenMP */
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < B; b++)
            out[b * N + n] = row_dot(w + n * nblocks * BLOCK_BYTES, x + b * K, nblocks);
}
