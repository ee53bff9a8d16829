// strata-kernel: op=linear_q4_K dialect=c entry=strata_linear_q4_K
/* Reference GGUF q4_K linear layer with ggml's numerics, portable C (ggml's
 * vec_dot_q4_K_q8_K): x's rows quantised to q8_K (strata_q8k.h), then per 256-value
 * super-block
 *   f32(d_x*d) * sum_j sc_j * sum_v q_v*q_x  -  f32(d_x*dmin) * sum_j m_j * (bsum_2j + bsum_2j+1)
 * with the integer sums exact, accumulated in float32 over the super-blocks.
 * A q4_K super-block is 144 bytes: fp16 d, fp16 dmin, 12 bytes of packed 6-bit scales and
 * mins, 128 bytes of nibbles (chunk c of 32 bytes: low nibbles are weights 64c..64c+31 of
 * sub-block 2c, high nibbles weights 64c+32.. of sub-block 2c+1). Rows over OpenMP threads. */
#include "strata_half.h"
#include "strata_q8k.h"

#define BLOCK_BYTES 144

void strata_linear_q4_K(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    q8k_linear(out, x, w, B, N, K, BLOCK_BYTES, q8k_superblock_q4k);
}
