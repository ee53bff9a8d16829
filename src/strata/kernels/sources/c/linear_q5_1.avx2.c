// strata-kernel: op=linear_q5_1 dialect=c entry=strata_linear_q5_1 requires=avx2,fma,f16c
/* GGUF q5_1 linear layer with ggml's numerics (vec_dot_q5_1_q8_1), AVX2/FMA/F16C and OpenMP:
 * out[b,n] = sum over 32-blocks of f32(d_w) * d_x * sum_j q_j * q_x[j] + f32(m_w) * s_x, with
 * q_j = nibble + 16 * fifth bit (the K-quant mixes' fallback for Q5_K on odd widths).
 *
 * linear_q4_0.avx2.c's program (strata_q8_0x.h, strata_q8_0x_run.h: x quantised in pairs of
 * blocks, integer block dots by vpmaddubsw, tiles and threads) with a 24-byte block (fp16 d,
 * fp16 min m, qh: a little-endian uint32 whose bit j is weight j's fifth bit, then the 16
 * nibble bytes; the fifth bits OR'd in as linear_q5_0 does), unsigned weights (OFFSET 0:
 * pair sums <= 2*31*127, two of them as int16 <= 15748) and x's q8_1 sum
 * term s_x = fp16(amax/127 * sum q_x): one more FMA per block pair, m_w against s_x.
 */
#include "strata_q8_0x.h"

#define BLOCK_BYTES 24
#define OFFSET 0   /* q5_1: value d * (nibble + 16 * bit) + m */
#define MIN_TERM 1

static inline __attribute__((always_inline)) void weight_pair(const uint8_t *p, const int two,
                                                              __m256i *lo, __m256i *hi,
                                                              __m256 *wd) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m128i a = _mm_loadu_si128((const __m128i *)(p + 8));
    const __m256i bytes = two ? _mm256_inserti128_si256(
                                    _mm256_castsi128_si256(a),
                                    _mm_loadu_si128((const __m128i *)(p + BLOCK_BYTES + 8)), 1)
                              : _mm256_zextsi128_si256(a);
    uint32_t qa, qb = 0;
    memcpy(&qa, p + 4, sizeof qa);
    if (two) memcpy(&qb, p + BLOCK_BYTES + 4, sizeof qb);
    *lo = _mm256_or_si256(_mm256_and_si256(bytes, low4),
                          q8_0x_fifth_bits((qa & 0xFFFFu) | (qb << 16)));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4),
                          q8_0x_fifth_bits((qa >> 16) | (qb & 0xFFFF0000u)));
    *wd = q8_0x_half_pair(p, two, 0, BLOCK_BYTES);
}


#include "strata_q8_0x_run.h"

void strata_linear_q5_1(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    q8_0x_run(out, x, w, B, N, K);
}
