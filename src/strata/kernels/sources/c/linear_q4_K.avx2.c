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

#define BLOCK_BYTES 144

/* acc[r][b] += the super-block `s` of weight rows r < nr against x rows b < nb. */
static inline __attribute__((always_inline)) void superblock(__m256 acc[RMAX][RB],
                                                             const uint8_t *w, int64_t row_bytes,
                                                             const xsb *x, int64_t nsb,
                                                             int64_t s, const int nr,
                                                             const int nb) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int r = 0; r < nr; r++) {
        const uint8_t *p = w + r * row_bytes + s * BLOCK_BYTES;
        const __m128i sm8 = kquant_scales_mins(p + 4);
        const __m256i sm16 = _mm256_cvtepu8_epi16(sm8);  /* 8 scales | 8 mins as int16 */
        const __m128i mins = _mm256_extracti128_si256(sm16, 1);
        uint8_t sc[16];
        _mm_storeu_si128((__m128i *)sc, sm8);
        __m256i sumi[RB];
        for (int b = 0; b < nb; b++) sumi[b] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i bytes = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * c));
            const __m256i lo = _mm256_and_si256(bytes, low4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
            const __m256i sc_lo = _mm256_set1_epi16(sc[2 * c]);
            const __m256i sc_hi = _mm256_set1_epi16(sc[2 * c + 1]);
            for (int b = 0; b < nb; b++) {
                const xsb *xb = x + b * nsb + s;
                const __m256i q0 = _mm256_load_si256((const __m256i *)(xb->q + 64 * c));
                const __m256i q1 = _mm256_load_si256((const __m256i *)(xb->q + 64 * c + 32));
                const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, q0), sc_lo);
                const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, q1), sc_hi);
                sumi[b] = _mm256_add_epi32(sumi[b], _mm256_add_epi32(p0, p1));
            }
        }
        const __m256 d = half_at(p), dmin = half_at(p + 2);
        for (int b = 0; b < nb; b++) {
            const xsb *xb = x + b * nsb + s;
            const __m256 dx = _mm256_set1_ps(xb->d);
            const __m128i msum = _mm_madd_epi16(mins, _mm_load_si128((const __m128i *)xb->bsum32));
            /* f32(d_x*d) and f32(d_x*dmin): ggml's rounded products, then the FMAs */
            acc[r][b] = _mm256_fmadd_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(sumi[b]),
                                        acc[r][b]);
            acc[r][b] = _mm256_fnmadd_ps(_mm256_mul_ps(dx, dmin),
                                         _mm256_cvtepi32_ps(_mm256_zextsi128_si256(msum)),
                                         acc[r][b]);
        }
    }
}

#include "strata_kquant_run.h"

void strata_linear_q4_K(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    kquant_run(out, x, w, B, N, K);
}
