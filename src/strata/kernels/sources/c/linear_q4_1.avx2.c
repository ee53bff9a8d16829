// strata-kernel: op=linear_q4_1 dialect=c entry=strata_linear_q4_1 requires=avx2,fma,f16c
/* GGUF q4_1 linear layer with ggml's numerics (vec_dot_q4_1_q8_1), AVX2/FMA/F16C and OpenMP:
 * out[b,n] = sum over 32-blocks of f32(d_w) * d_x * sum_j nib_j * q_x[j] + f32(m_w) * s_x.
 *
 * linear_q4_0.avx2.c's program (strata_q8_0x.h, strata_q8_0x_run.h: x quantised in pairs of
 * blocks, integer block dots by vpmaddubsw, tiles and threads) with a 20-byte block (fp16 d,
 * fp16 min m, then q4_0's 16 nibble bytes), unsigned weights (OFFSET 0) and x's q8_1 sum
 * term s_x = fp16(amax/127 * sum q_x): one more FMA per block pair, m_w against s_x.
 */
#include "strata_q8_0x.h"

#define BLOCK_BYTES 20
#define OFFSET 0   /* q4_1: value d * nibble + m */
#define MIN_TERM 1

static inline __attribute__((always_inline)) void weight_pair(const uint8_t *p, const int two,
                                                              __m256i *lo, __m256i *hi,
                                                              __m256 *wd) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m128i a = _mm_loadu_si128((const __m128i *)(p + 4));
    const __m256i bytes = two ? _mm256_inserti128_si256(
                                    _mm256_castsi128_si256(a),
                                    _mm_loadu_si128((const __m128i *)(p + BLOCK_BYTES + 4)), 1)
                              : _mm256_zextsi128_si256(a);
    *lo = _mm256_and_si256(bytes, low4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
    *wd = q8_0x_half_pair(p, two, 0, BLOCK_BYTES);
}


#include "strata_q8_0x_run.h"

void strata_linear_q4_1(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    q8_0x_run(out, x, w, B, N, K);
}
