// strata-kernel: op=linear_q4_K dialect=c entry=strata_linear_q4_K requires=avx2,fma,f16c
/* GGUF q4_K linear layer with ggml's numerics, AVX2/FMA/F16C and OpenMP (the arithmetic of
 * ggml_vec_dot_q4_K_q8_K; docs/kernels-abi.md, linear_q4_K):
 *   per 256-value super-block  f32(d_x*d) * sum_j sc_j * sum_v q_v*q_x
 *                            - f32(d_x*dmin) * sum_j m_j * (bsum_2j + bsum_2j+1).
 *
 * 1. x is quantised once per call to q8_K (strata_q8k.h, ggml's reference rounding); each
 *    super-block keeps its 8 sums of 32 q_x (bsum_2j + bsum_2j+1) as int16 for the min term.
 * 2. Scales and mins: the 12 packed bytes become 8 six-bit scales and 8 six-bit mins with
 *    four 32-bit mask-and-shift steps (the get_scale_min_k4 rule, four sub-blocks at once).
 * 3. Integer dots: a chunk of 32 weight bytes holds 64 weights (low nibbles: sub-block 2c,
 *    high nibbles: 2c+1); vpmaddubsw takes the unsigned nibbles against the signed q_x (pair
 *    sums <= 2*15*127), vpmaddwd against the sub-block's scale broadcast as int16 gives int32
 *    lanes of sc*pairs, summed over the 4 chunks (|sum| < 2^31). The min term is one
 *    vpmaddwd of the 8 mins against the 8 bsum pairs. One conversion and two FMAs per
 *    super-block and x row fold both into a float32 accumulator.
 * 4. Tiling and threads: strata_kquant_run.h (fixed-order sums whatever the thread count).
 */
#include "strata_kquant.h"
#include "strata_q4k_row.h"

#define BLOCK_BYTES 144
#define SUPERBLOCK q4k_superblock_avx2  /* the file-layout dot (strata_kquant_run.h) */

#include "strata_kquant_run.h"

void strata_linear_q4_K(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    kquant_run(out, x, w, B, N, K);
}
