// strata-kernel: op=linear_q5_0 dialect=c entry=strata_linear_q5_0 requires=avx2,fma,f16c
/* GGUF q5_0 linear layer with ggml's numerics, AVX2/FMA/F16C and OpenMP:
 * out[b,n] = sum over 32-blocks of f32(d_w) * f32(d_x) * sum_j (q_j - 16) * q_x[j], with
 * q_j = nibble + 16 * fifth bit (ggml's vec_dot_q5_0_q8_0).
 *
 * x is quantised to q8_0 and laid out in pairs of blocks by strata_q8_0x.h (as for
 * linear_q4_0, with c = -16 * sum q_x); the tiling and threads are strata_q8_0x_run.h's.
 * Here: a 22-byte q5_0 block holds the fp16 scale, qh (a little-endian uint32: bit j is
 * weight j's fifth bit) and 16 nibble bytes (weight j low, weight j+16 high). The fifth bits
 * become bytes of 16 with one shuffle, and, compare (bits 0..15 with the low nibbles, 16..31
 * with the high ones) and are OR'd in: unsigned 0..31 values against the signed q_x in
 * vpmaddubsw (pair sums <= 2*31*127, two of them added as int16 <= 15748).
 */
#include "strata_q8_0x.h"

#define BLOCK_BYTES 22
#define OFFSET 16  /* q5_0: nibble + 16 * bit - 16 */

/* The q5_0 blocks at p and p + 22 (p + 22 only when `two`): their unsigned 5-bit values in
 * weight order against an xpair (weights 0..15 of both | weights 16..31 of both) and their
 * scales (4 lanes each). The second half is zero when there is no second block. */
static inline __attribute__((always_inline)) void weight_pair(const uint8_t *p, const int two,
                                                              __m256i *lo, __m256i *hi,
                                                              __m256 *wd) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m128i a = _mm_loadu_si128((const __m128i *)(p + 6));
    const __m256i bytes = two ? _mm256_inserti128_si256(_mm256_castsi128_si256(a),
                                                        _mm_loadu_si128((const __m128i *)(p + 28)),
                                                        1)
                              : _mm256_zextsi128_si256(a);
    uint32_t qa, qb = 0;
    memcpy(&qa, p + 2, sizeof qa);
    if (two) memcpy(&qb, p + BLOCK_BYTES + 2, sizeof qb);
    *lo = _mm256_or_si256(_mm256_and_si256(bytes, low4),
                          q8_0x_fifth_bits((qa & 0xFFFFu) | (qb << 16)));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4),
                          q8_0x_fifth_bits((qa >> 16) | (qb & 0xFFFF0000u)));
    int16_t ha, hb = 0;
    memcpy(&ha, p, sizeof ha);
    if (two) memcpy(&hb, p + BLOCK_BYTES, sizeof hb);
    *wd = _mm256_cvtph_ps(_mm_blend_epi16(_mm_set1_epi16(ha), _mm_set1_epi16(hb), 0xF0));
}

#include "strata_q8_0x_run.h"

void strata_linear_q5_0(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    q8_0x_run(out, x, w, B, N, K);
}
