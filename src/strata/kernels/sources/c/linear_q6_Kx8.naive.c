// strata-kernel: op=linear_q6_Kx8 dialect=c entry=strata_linear_q6_Kx8
/* Reference linear_q6_Kx8, portable C: each row's super-block rebuilt from strata's x8
 * layout (strata_x8.h) and dotted exactly as linear_q6_K.naive.c (ggml's
 * vec_dot_q6_K_q8_K with x quantised to q8_K). Rows over OpenMP threads. */
#include "strata_q6k.h"
#include "strata_x8.h"

void strata_linear_q6_Kx8(float *out, const float *x, const uint8_t *w,
                          int64_t B, int64_t N, int64_t K) {
    x8_linear(out, x, w, B, N, K, 210, X8_Q6K, X8_Q6K_FIELDS, q6k_superblock);
}
