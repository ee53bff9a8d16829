/* strata_q6k_avx2.h: the AVX2 q6_K super-block dot on the file's layout (ggml's
 * vec_dot_q6_K_q8_K arithmetic; linear_q6_K.avx2.c explains it), shared by
 * linear_q6_K.avx2.c and linear_q6_Kx8.avx2.c (its N % 8 last rows). Include after
 * strata_kquant.h with BLOCK_BYTES 210. Hashed with each user. */
#ifndef STRATA_Q6K_AVX2_H
#define STRATA_Q6K_AVX2_H

#include "strata_kquant.h"

/* The 8 groups of 32 six-bit weights (0..63) of a super-block, in weight order. */
static inline void weights6(const uint8_t *p, __m256i q[8]) __attribute__((always_inline));

static inline void weights6(const uint8_t *p, __m256i q[8]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x03);
    for (int h = 0; h < 2; h++) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(p + 64 * h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
        const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(hb, two), 4);
        const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), two), 4);
        const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), two), 4);
        const __m256i h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), two), 4);
        q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, low4), h0);
        q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, low4), h1);
        q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), h2);
        q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4), h3);
    }
}

/* acc[r][b] += the super-block `s` of weight rows r < nr against x rows b < nb. */
static inline void q6k_superblock_avx2(
        __m256 acc[RMAX][RB], const uint8_t *w, int64_t row_bytes, const xsb *x, int64_t nsb,
        int64_t s, const int nr, const int nb) __attribute__((always_inline));

static inline void q6k_superblock_avx2(
        __m256 acc[RMAX][RB], const uint8_t *w, int64_t row_bytes, const xsb *x, int64_t nsb,
        int64_t s, const int nr, const int nb) {
    for (int r = 0; r < nr; r++) {
        const uint8_t *p = w + r * row_bytes + s * BLOCK_BYTES;
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)(p + 192));  /* int8 scales */
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        __m256i q[8];
        weights6(p, q);
        __m256i sumi[RB];
        for (int b = 0; b < nb; b++) {
            const xsb *xb = x + b * nsb + s;
            /* -32 * sum_j sc_j * bsum_j, as 8 int32 lanes */
            const __m256i off = _mm256_madd_epi16(sc16,
                                                  _mm256_load_si256((const __m256i *)xb->bsums));
            sumi[b] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5));
        }
        for (int g = 0; g < 8; g++) {
            /* [sc_2g x8 | sc_2g+1 x8] as int16: one byte shuffle, one widening */
            const __m256i scg = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                sc8, _mm_set_epi8(2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1,
                                  2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g, 2 * g, 2 * g, 2 * g,
                                  2 * g, 2 * g, 2 * g, 2 * g)));
            for (int b = 0; b < nb; b++) {
                const xsb *xb = x + b * nsb + s;
                const __m256i qx = _mm256_load_si256((const __m256i *)(xb->q + 32 * g));
                sumi[b] = _mm256_add_epi32(sumi[b],
                                           _mm256_madd_epi16(_mm256_maddubs_epi16(q[g], qx), scg));
            }
        }
        const __m256 d = half_at(p + 208);
        for (int b = 0; b < nb; b++) {
            const __m256 dx = _mm256_set1_ps(x[b * nsb + s].d);
            /* f32(d_x*d): ggml's rounded product, then the FMA */
            acc[r][b] = _mm256_fmadd_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(sumi[b]),
                                        acc[r][b]);
        }
    }
}

#endif /* STRATA_Q6K_AVX2_H */
