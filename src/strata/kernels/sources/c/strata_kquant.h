/* strata_kquant.h: what the AVX2 K-quant linear kernels (linear_q4_K, linear_q5_K,
 * linear_q6_K .avx2.c) share: x quantised to q8_K and laid out for the dots, the 6-bit scale
 * and min unpacking of q4_K/q5_K, and the tiled, threaded driver. Hashed with each user.
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

#endif /* STRATA_KQUANT_H */
