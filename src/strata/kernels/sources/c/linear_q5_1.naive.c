// strata-kernel: op=linear_q5_1 dialect=c entry=strata_linear_q5_1
/* Reference GGUF q5_1 linear layer with ggml's numerics, portable C (ggml's
 * vec_dot_q5_1_q8_1): x quantised to q8_1 (strata_q8_1.h), then per 32-block
 * f32(d_w)*d_x * sum_j q_w[j]*q_x[j] + f32(m_w)*s_x, q_w = nibble + 16 * fifth bit.
 * A q5_1 block is 24 bytes: fp16 d, fp16 m, qh (a little-endian uint32: bit j is weight j's
 * fifth bit), then 16 bytes; byte j holds weight j in its low nibble, weight j+16 in its high
 * nibble. */
#include "strata_q8_1.h"

#define BLOCK_BYTES 24

static int32_t dot(const uint8_t *p, const int8_t *q) {
    const uint32_t qh = (uint32_t)p[4] | ((uint32_t)p[5] << 8) | ((uint32_t)p[6] << 16) |
                        ((uint32_t)p[7] << 24);
    int32_t isum = 0;
    for (int j = 0; j < QK8_1 / 2; j++) {
        const int32_t lo = (p[8 + j] & 0x0F) | (((qh >> j) & 1) << 4);
        const int32_t hi = (p[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        isum += lo * q[j] + hi * q[j + 16];
    }
    return isum;
}

void strata_linear_q5_1(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    q8_1_linear(out, x, w, B, N, K, BLOCK_BYTES, dot);
}
