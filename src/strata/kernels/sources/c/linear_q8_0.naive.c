// strata-kernel: op=linear_q8_0 dialect=c entry=strata_linear_q8_0
/* Reference GGUF q8_0 linear layer with ggml's numerics, portable C:
 * out[b,n] = sum over 32-blocks of f32(d_w) * f32(d_x) * sum_j q_w[j] * q_x[j].
 *
 * Each 32-block of a row of x is first quantised to q8_0 the way ggml's AVX2 path does
 * (docs/kernels-abi.md, linear_q8_0): amax = max |x|, d_x = fp16(amax / 127) (round to
 * nearest even), id = amax ? 127 / amax : 0 (float32), q_x = round_half_even(x * id). The
 * block dot is exact integer arithmetic; the scaled block sums accumulate in float32.
 * A q8_0 weight block is 34 bytes: a little-endian fp16 scale d_w, then 32 int8 q_w.
 * x is quantised once per call into a malloc'd buffer; rows are split over OpenMP threads.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_half.h"

#define QK 32
#define BLOCK_BYTES 34

/* One 32-block of x -> q8_0: int8 values and the float32 value of the fp16 scale. */
static void quantize_block(const float *x, int8_t *q, float *d) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) {
        const float a = fabsf(x[j]);
        if (a > amax) amax = a;
    }
    *d = half_to_float(float_to_half(amax / 127.0f));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    /* nearbyintf rounds half to even in the default rounding mode */
    for (int j = 0; j < QK; j++) q[j] = (int8_t)nearbyintf(x[j] * id);
}

void strata_linear_q8_0(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    const int64_t nblocks = K / QK;
    int8_t *qx = malloc((size_t)(B * K) + 1);
    float *dx = malloc((size_t)(B * nblocks + 1) * sizeof(float));
    if (!qx || !dx) { free(qx); free(dx); return; }  /* out stays NaN: fails loudly */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < B * nblocks; i++) quantize_block(x + i * QK, qx + i * QK, dx + i);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *row = w + n * nblocks * BLOCK_BYTES;
        for (int64_t b = 0; b < B; b++) {
            float sum = 0.0f;
            for (int64_t blk = 0; blk < nblocks; blk++) {
                const uint8_t *p = row + blk * BLOCK_BYTES;
                const int8_t *qw = (const int8_t *)(p + 2), *qb = qx + (b * nblocks + blk) * QK;
                int32_t isum = 0;
                for (int j = 0; j < QK; j++) isum += (int32_t)qw[j] * (int32_t)qb[j];
                const float d = half_to_float((uint16_t)(p[0] | (p[1] << 8))) *
                                dx[b * nblocks + blk];
                sum += d * (float)isum;
            }
            out[b * N + n] = sum;
        }
    }
    free(qx);
    free(dx);
}
