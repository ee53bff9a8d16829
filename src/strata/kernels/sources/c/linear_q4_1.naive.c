// strata-kernel: op=linear_q4_1 dialect=c entry=strata_linear_q4_1
/* Reference GGUF q4_1 linear layer with ggml's numerics, portable C (ggml's
 * vec_dot_q4_1_q8_1): x quantised to q8_1 (strata_q8_1.h), then per 32-block
 * f32(d_w)*d_x * sum_j q_w[j]*q_x[j] + f32(m_w)*s_x, q_w the unsigned nibble.
 * A q4_1 block is 20 bytes: fp16 d, fp16 m, then 16 bytes; byte j holds weight j in its low
 * nibble and weight j+16 in its high nibble. */
#include "strata_q8_1.h"

#define BLOCK_BYTES 20

static int32_t dot(const uint8_t *p, const int8_t *q) {
    int32_t isum = 0;
    for (int j = 0; j < QK8_1 / 2; j++)
        isum += (int32_t)(p[4 + j] & 0x0F) * q[j] + (int32_t)(p[4 + j] >> 4) * q[j + 16];
    return isum;
}

void strata_linear_q4_1(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    q8_1_linear(out, x, w, B, N, K, BLOCK_BYTES, dot);
}
