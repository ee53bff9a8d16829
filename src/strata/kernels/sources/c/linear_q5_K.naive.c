// strata-kernel: op=linear_q5_K dialect=c entry=strata_linear_q5_K
/* Reference GGUF q5_K linear layer with ggml's numerics, portable C (ggml's
 * vec_dot_q5_K_q8_K): x's rows quantised to q8_K (strata_q8k.h), then per 256-value
 * super-block
 *   f32(d_x*d) * sum_j sc_j * sum_v q_v*q_x  -  f32(d_x*dmin) * sum_j m_j * (bsum_2j + bsum_2j+1)
 * with the integer sums exact, accumulated in float32 over the super-blocks.
 * A q5_K super-block is 176 bytes: fp16 d, fp16 dmin, 12 bytes of packed 6-bit scales and
 * mins, qh[32] (the fifth bit: bit 2c of qh[l] for weight 64c+l, bit 2c+1 for 64c+32+l),
 * then 128 bytes of nibbles laid out as q4_K's. Rows over OpenMP threads. */
#include "strata_half.h"
#include "strata_q8k.h"

#define BLOCK_BYTES 176

static float superblock(const uint8_t *p, const q8k_block *y) {
    return q8k_superblock_45(p, y, 1);
}

void strata_linear_q5_K(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    q8k_linear(out, x, w, B, N, K, BLOCK_BYTES, superblock);
}
