/* strata_kquant.h: what the AVX2 K-quant linear kernels (linear_q4_K, linear_q5_K,
 * linear_q6_K .avx2.c) share: x quantised to q8_K and laid out for the dots, the 6-bit scale
 * and min unpacking and the super-block dot of q4_K/q5_K (kquant_superblock_45), and the
 * tiled, threaded driver. Hashed with each user.
 *
 * A kernel defines BLOCK_BYTES and
 *   static inline void superblock(__m256 acc[RMAX][RB], const uint8_t *w, int64_t row_bytes,
 *                                 const xsb *x, int64_t nsb, int64_t s, int nr, int nb)
 * (acc[r][b] += super-block s of weight rows r < nr against x rows b < nb) between
 * including this header and strata_kquant_run.h, whose kquant_run(out, x, w, B, N, K) then
 * does the rest: RN weight rows x 1 at decode, RNB x RB tiles for B > 1, weight rows split
 * over threads in contiguous chunks; each output is one thread's fixed-order sum, so results
 * do not depend on the thread count. */
#ifndef STRATA_KQUANT_H
#define STRATA_KQUANT_H

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_simd.h"
#include "strata_q8k.h"

#define RN 1              /* weight rows per tile at B = 1: one sequential stream per row
                             (4-row tiles ran at half the bandwidth on rows of 8 super-blocks) */
#define RNB 2             /* weight rows per tile for B > 1 */
#define RMAX (RN > RNB ? RN : RNB)
#define RB 2              /* x rows per tile for B > 1 */
#define CHUNK_ROWS 16     /* weight rows per scheduling chunk */

/* One x super-block as the dots read it: q_x (32-byte aligned), its 16 bsums, the 8 sums of
 * 32 (bsum_2j + bsum_2j+1: q4_K/q5_K's min term), d_x. */
typedef struct {
    int8_t q[QK_K];
    int16_t bsums[16];
    int16_t bsum32[8];
    float d;
    float pad[3];
} xsb;

static inline void kquant_prepare_x(const q8k_block *in, xsb *out) {
    memcpy(out->q, in->q, QK_K);
    memcpy(out->bsums, in->bsums, sizeof out->bsums);
    for (int j = 0; j < 8; j++) out->bsum32[j] = (int16_t)(in->bsums[2 * j] + in->bsums[2 * j + 1]);
    out->d = in->d;
}

/* The 8 scales (bytes 0..7) and 8 mins (bytes 8..15) of a q4_K/q5_K super-block's 12 packed
 * bytes: the get_scale_min_k4 rule, four sub-blocks per 32-bit mask-and-shift step. */
static inline __m128i kquant_scales_mins(const uint8_t *s) {
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    const uint32_t sc_lo = u0 & 0x3F3F3F3Fu, m_lo = u1 & 0x3F3F3F3Fu;
    const uint32_t sc_hi = (u2 & 0x0F0F0F0Fu) | (((u0 >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((u2 >> 4) & 0x0F0F0F0Fu) | (((u1 >> 6) & 0x03030303u) << 4);
    return _mm_set_epi32((int)m_hi, (int)m_lo, (int)sc_hi, (int)sc_lo);
}

/* acc[r][b] += super-block s of q4_K (five = 0) or q5_K (five = 1: qh[32] before the
 * nibbles, each weight's fifth bit added as 16) weight rows r < nr against x rows b < nb;
 * always inlined: nr, nb, five are constants at each call. */
static inline void kquant_superblock_45(__m256 acc[RMAX][RB], const uint8_t *w, int64_t row_bytes,
                                      const xsb *x, int64_t nsb, int64_t s, const int nr,
                                      const int nb, const int five)
    __attribute__((always_inline));

static inline void kquant_superblock_45(__m256 acc[RMAX][RB], const uint8_t *w, int64_t row_bytes,
                                      const xsb *x, int64_t nsb, int64_t s, const int nr,
                                      const int nb, const int five) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int r = 0; r < nr; r++) {
        const uint8_t *p = w + r * row_bytes + s * (five ? 176 : 144);
        const __m128i sm8 = kquant_scales_mins(p + 4);
        const __m256i sm16 = _mm256_cvtepu8_epi16(sm8);  /* 8 scales | 8 mins as int16 */
        const __m128i mins = _mm256_extracti128_si256(sm16, 1);
        uint8_t sc[16];
        _mm_storeu_si128((__m128i *)sc, sm8);
        __m256i sumi[RB];
        for (int b = 0; b < nb; b++) sumi[b] = _mm256_setzero_si256();
        const __m256i hbits = five ? _mm256_loadu_si256((const __m256i *)(p + 16))
                                   : _mm256_setzero_si256();
        const __m256i one = _mm256_set1_epi8(1);
        for (int c = 0; c < 4; c++) {
            const __m256i bytes = _mm256_loadu_si256((const __m256i *)(p + (five ? 48 : 16) +
                                                                        32 * c));
            __m256i lo = _mm256_and_si256(bytes, low4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
            if (five) {
                const __m256i b_lo = _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c), one);
                const __m256i b_hi = _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c + 1), one);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(b_lo, 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(b_hi, 4));
            }
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

#endif /* STRATA_KQUANT_H */
