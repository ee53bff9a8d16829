// strata-kernel: op=linear_mxfp4 dialect=c entry=strata_linear_mxfp4
/* Reference GGUF MXFP4 linear layer with ggml's numerics, portable C (ggml's
 * vec_dot_mxfp4_q8_0): out[b,n] = sum over 32-blocks of f32(2^(e-128) * d_x) * isum,
 * isum = sum_j kv[c_j] * q_x[j] (integer, exact).
 *
 * A 17-byte MXFP4 block is an E8M0 exponent byte e, then 16 bytes: byte j holds the 4-bit
 * code of weight j in its low nibble and that of weight j+16 in its high nibble. A code c
 * stands for kv[c], the e2m1 value doubled (bit 3 the sign: 8 is -0, magnitudes 0..7 map to
 * 0, 1, 2, 3, 4, 6, 8, 12), and the block scale is halved to match: 2^(e-128) for every e
 * (e = 0, 1: the float32 subnormals 2^-128, 2^-127; 255: 2^127).
 * x is quantised to q8_0 as ggml's AVX2 path does, by strata_q8_1.h's q8_1_quantize (q8_1's
 * q_x and d_x are q8_0's; its s_x goes unused here), once per call into a malloc'd buffer;
 * the scaled block sums accumulate in float32; rows are split over OpenMP threads.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_q8_1.h"

#define QK 32
#define BLOCK_BYTES 17

static const int8_t KV[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e-128) as float32, from its bits: a normal number (e-1) << 23 for e >= 2, the
 * subnormals 2^-128 (bit 21) and 2^-127 (bit 22) for e = 0, 1. */
static float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

void strata_linear_mxfp4(float *out, const float *x, const uint8_t *w,
                         int64_t B, int64_t N, int64_t K) {
    const int64_t nblocks = K / QK;
    q8_1_block *qx = malloc((size_t)(B * nblocks + 1) * sizeof(q8_1_block));
    if (!qx) return;  /* out stays NaN: fails loudly */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < B * nblocks; i++) q8_1_quantize(x + i * QK, qx + i);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *row = w + n * nblocks * BLOCK_BYTES;
        for (int64_t b = 0; b < B; b++) {
            float sum = 0.0f;
            for (int64_t blk = 0; blk < nblocks; blk++) {
                const uint8_t *p = row + blk * BLOCK_BYTES;
                const q8_1_block *y = qx + b * nblocks + blk;
                int32_t isum = 0;
                for (int j = 0; j < QK / 2; j++)
                    isum += KV[p[1 + j] & 0x0F] * (int32_t)y->q[j] +
                            KV[p[1 + j] >> 4] * (int32_t)y->q[j + QK / 2];
                const float d = e8m0_half(p[0]) * y->d;  /* float32, as ggml */
                sum += d * (float)isum;
            }
            out[b * N + n] = sum;
        }
    }
    free(qx);
}
