// strata-kernel: op=linear_q6_K dialect=c entry=strata_linear_q6_K
/* Reference GGUF q6_K linear layer with ggml's numerics, portable C (ggml's
 * vec_dot_q6_K_q8_K): x's rows quantised to q8_K (strata_q8k.h), then per 256-value
 * super-block f32(d_x*d) * sum_j sc_j * sum_v (q_v - 32)*q_x (integer sums exact),
 * accumulated in float32 over the super-blocks.
 * A q6_K super-block is 210 bytes: ql[128], qh[64], int8 scales[16], fp16 d (last). Half h
 * (0, 1) uses ql[64h..64h+63] and qh[32h..32h+31]: for l < 32, weights 128h+l, +32, +64, +96
 * take ql[l] & 15, ql[l+32] & 15, ql[l] >> 4, ql[l+32] >> 4 as low bits and bits 0-1, 2-3,
 * 4-5, 6-7 of qh[l] as high bits; weight v's scale is scales[v / 16]. */
#include "strata_q6k.h"

#define BLOCK_BYTES 210

void strata_linear_q6_K(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    q8k_linear(out, x, w, B, N, K, BLOCK_BYTES, q6k_superblock);
}
