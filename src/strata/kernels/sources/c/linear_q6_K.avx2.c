// strata-kernel: op=linear_q6_K dialect=c entry=strata_linear_q6_K requires=avx2,fma,f16c
/* GGUF q6_K linear layer with ggml's numerics, AVX2/FMA/F16C and OpenMP (the arithmetic of
 * ggml_vec_dot_q6_K_q8_K; docs/kernels-abi.md, linear_q6_K):
 *   per 256-value super-block  f32(d_x*d) * sum_j sc_j * sum_v (q_v - 32)*q_x.
 *
 * 1. x is quantised once per call to q8_K (strata_q8k.h, ggml's reference rounding).
 * 2. A super-block's 256 six-bit weights are 8 groups of 32 in weight order; with ql, qh
 *    the 64 and 32 bytes of half h: group 4h+0 = ql[0..31] & 15 | (qh & 3) << 4, 4h+1 =
 *    ql[32..63] & 15 | (qh >> 2 & 3) << 4, 4h+2 = ql[0..31] >> 4 | (qh >> 4 & 3) << 4, 4h+3 =
 *    ql[32..63] >> 4 | (qh >> 6) << 4. Group g covers sub-blocks 2g and 2g+1 (16 each).
 * 3. Integer dots: vpmaddubsw of the unsigned 0..63 weights against the signed q_x (pair
 *    sums <= 2*63*127), vpmaddwd against [sc_2g x8 | sc_2g+1 x8] as int16; the -32 offset
 *    is one vpmaddwd of the 16 scales against the 16 bsums of x, times 32, subtracted:
 *    sum (q-32)*q_x*sc = sum q*q_x*sc - 32*sum sc*bsum (exact integers). One conversion
 *    and FMA per super-block and x row.
 * 4. Tiling and threads: strata_kquant_run.h (fixed-order sums whatever the thread count).
 */
#include "strata_kquant.h"

#define BLOCK_BYTES 210
#define SUPERBLOCK q6k_superblock_avx2  /* the file-layout dot (strata_kquant_run.h) */

#include "strata_q6k_avx2.h"

#include "strata_kquant_run.h"

void strata_linear_q6_K(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    kquant_run(out, x, w, B, N, K);
}
