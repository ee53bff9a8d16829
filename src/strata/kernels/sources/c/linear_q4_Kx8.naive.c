// strata-kernel: op=linear_q4_Kx8 dialect=c entry=strata_linear_q4_Kx8
/* Reference linear_q4_Kx8, portable C: each row's super-block rebuilt from strata's x8
 * layout (strata_x8.h) and dotted exactly as linear_q4_K.naive.c (ggml's
 * vec_dot_q4_K_q8_K with x quantised to q8_K). Rows over OpenMP threads. */
#include "strata_half.h"
#include "strata_x8.h"

void strata_linear_q4_Kx8(float *out, const float *x, const uint8_t *w,
                          int64_t B, int64_t N, int64_t K) {
    x8_linear(out, x, w, B, N, K, 144, X8_Q4K, X8_Q4K_FIELDS, q8k_superblock_q4k);
}
