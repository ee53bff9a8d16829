// strata-kernel: op=linear_q8_0 dialect=c entry=strata_linear_q8_0 requires=avx2,fma,f16c
/* GGUF q8_0 linear layer with ggml's numerics, AVX2/FMA/F16C and OpenMP: strata_q8_0.h
 * holds the program (x quantised as ggml's quantize_row_q8_0, exact integer block dots,
 * one float32 accumulator per output in block order) and says why it is laid out so. */
#include "strata_q8_0.h"

void strata_linear_q8_0(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    q8_0_run(out, x, w, B, N, K, RN, 0, q8_0_group_avx2);
}
