// strata-kernel: op=matvec_q4_0 dialect=c entry=strata_matvec_q4_0
/* Reference GGUF q4_0 matrix-vector product: out[b,n] = sum_k deq(w)[n,k] * x[b,k].
 *
 * A q4_0 block is 18 bytes: a little-endian fp16 scale d, then 16 bytes; byte j holds
 * weight j in its low nibble and weight j+16 in its high nibble; each weight is
 * d*(nibble-8). Dequantisation and the dot product happen in one pass, accumulating in
 * fp32. Portable C only (OpenMP over rows when available).
 */
#include <stdint.h>
#include <string.h>
#include "strata_half.h"

#define QK 32
#define BLOCK_BYTES 18

static float row_dot(const uint8_t *row, const float *x, int64_t nblocks) {
    float sum = 0.0f;
    for (int64_t blk = 0; blk < nblocks; blk++) {
        const uint8_t *p = row + blk * BLOCK_BYTES;
        const float d = half_to_float((uint16_t)(p[0] | (p[1] << 8)));
        const uint8_t *qs = p + 2;
        const float *xb = x + blk * QK;
        float bsum = 0.0f;
        for (int j = 0; j < QK / 2; j++) {
            bsum += (float)((int)(qs[j] & 0x0F) - 8) * xb[j];
            bsum += (float)((int)(qs[j] >> 4) - 8) * xb[j + QK / 2];
        }
        sum += d * bsum;
    }
    return sum;
}

void strata_matvec_q4_0(float *out, const uint8_t *w, const float *x,
                        int64_t B, int64_t N, int64_t K) {
    const int64_t nblocks = K / QK;
    /* rows are independent; the pragma is ignored by a compiler without OpenMP */
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < B; b++)
            out[b * N + n] = row_dot(w + n * nblocks * BLOCK_BYTES, x + b * K, nblocks);
}
