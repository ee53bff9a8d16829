// strata-kernel: op=linear_q5_0 dialect=c entry=strata_linear_q5_0
/* Reference GGUF q5_0 linear layer with ggml's numerics, portable C:
 * out[b,n] = sum over 32-blocks of f32(d_w) * f32(d_x) * sum_j q_w[j] * q_x[j],
 * with q_w = nibble + 16 * fifth bit - 16 (ggml's vec_dot_q5_0_q8_0).
 *
 * Each 32-block of a row of x is first quantised to q8_0 the way ggml's AVX2 path does
 * (docs/kernels-abi.md, linear_q5_0): amax = max |x|, d_x = fp16(amax / 127) (round to
 * nearest even), id = amax ? 127 / amax : 0 (float32), q_x = round_half_even(x * id). The
 * block dot is exact integer arithmetic; the scaled block sums accumulate in float32.
 * A q5_0 weight block is 22 bytes: a little-endian fp16 scale d_w, qh (a little-endian
 * uint32: bit j is weight j's fifth bit), then 16 bytes; byte j holds weight j in its low
 * nibble and weight j+16 in its high nibble.
 * x is quantised once per call into a malloc'd buffer; rows are split over OpenMP threads.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_half.h"

#define QK 32
#define BLOCK_BYTES 22

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

void strata_linear_q5_0(float *out, const float *x, const uint8_t *w,
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
                const int8_t *qb = qx + (b * nblocks + blk) * QK;
                const uint32_t qh = (uint32_t)p[2] | ((uint32_t)p[3] << 8) |
                                    ((uint32_t)p[4] << 16) | ((uint32_t)p[5] << 24);
                int32_t isum = 0;
                for (int j = 0; j < QK / 2; j++) {
                    const int32_t lo = (int32_t)((p[6 + j] & 0x0F) | (((qh >> j) & 1) << 4)) - 16;
                    const int32_t hi = (int32_t)((p[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
                    isum += lo * (int32_t)qb[j] + hi * (int32_t)qb[j + QK / 2];
                }
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
