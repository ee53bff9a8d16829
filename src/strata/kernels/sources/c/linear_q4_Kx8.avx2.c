// strata-kernel: op=linear_q4_Kx8 dialect=c entry=strata_linear_q4_Kx8 requires=avx2,fma,f16c
/* linear_q4_K's arithmetic (ggml's vec_dot_q4_K_q8_K, x quantised to q8_K) on strata's x8
 * layout (strata_x8.h): one 32-bit lane per weight row, eight rows per register.
 *
 * Per group super-block: the 8 rows' d and dmin are one F16C conversion each; their packed
 * scales are 3 planes of 32 B, unpacked for all 8 rows at once by the get_scale_min_k4
 * mask-and-shift rule on 32-bit lanes (lane r: sc[r][0..3] | sc[r][4..7], the same for the
 * mins). A qs slice of 32 B holds 4 bytes (8 weights: 4 of sub-block 2c in the low nibbles,
 * 4 of 2c+1 in the high ones) of each row: vpmaddubsw against the 4 matching q_x bytes
 * broadcast to every lane gives each row its pair sums, summed in int16 over the 8 slices of
 * a sub-block (|sum| <= 8*2*15*127 < 2^15), then one vpmaddwd against the sub-block's scale
 * (a byte shuffle puts each row's scale in its lane) gives int32. The min term is four
 * vpmaddwd of (m_j, m_j+1) against (bsum32_j, bsum32_j+1). d_x*d and d_x*dmin are rounded
 * to float32 as ggml rounds them; one FMA each per super-block and lane. No horizontal sums:
 * lane r is output row r. */
#include "strata_kquant.h"
#include "strata_q4k_row.h"
#include "strata_x8k.h"

#define BLOCK_BYTES 144
#define SUPERBLOCK q4k_superblock_avx2  /* the file-layout dot (strata_kquant_run.h) */

static inline __attribute__((always_inline)) void group_sb(__m256 acc[2], const uint8_t *p,
                                                           const xsb *x, int64_t nsb,
                                                           int64_t s, const int nb) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const x8_q4k_scales u = x8_q4k_unpack(p);
    const uint8_t *qs = p + 128;
    __m256i sumi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    _Pragma("GCC unroll 16")
    for (int c = 0; c < 4; c++) {
        const __m256i src = c < 2 ? u.sc_lo : u.sc_hi;
        const int i = (2 * c) % 4;  /* byte of sub-block 2c (2c+1: i+1) in its lane */
        const __m256i s_lo = _mm256_shuffle_epi8(src, x8_lane_bytes(i, i));
        const __m256i s_hi = _mm256_shuffle_epi8(src, x8_lane_bytes(i + 1, i + 1));
        __m256i alo[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        __m256i ahi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        _Pragma("GCC unroll 16")
        for (int k = 0; k < 8; k++) {
            const __m256i wv = _mm256_loadu_si256((const __m256i *)(qs + 32 * (8 * c + k)));
            const __m256i lo = _mm256_and_si256(wv, low4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), low4);
            _Pragma("GCC unroll 16")
            for (int b = 0; b < nb; b++) {
                const int8_t *q = x[b * nsb + s].q + 64 * c + 4 * k;
                alo[b] = _mm256_add_epi16(alo[b], _mm256_maddubs_epi16(lo, x8_bcast4(q)));
                ahi[b] = _mm256_add_epi16(ahi[b], _mm256_maddubs_epi16(hi, x8_bcast4(q + 32)));
            }
        }
        _Pragma("GCC unroll 16")
        for (int b = 0; b < nb; b++)
            sumi[b] = _mm256_add_epi32(sumi[b], _mm256_add_epi32(_mm256_madd_epi16(alo[b], s_lo),
                                                                 _mm256_madd_epi16(ahi[b], s_hi)));
    }
    x8_q4k_finish(acc, p, x, nsb, s, sumi, &u, nb);
}

#include "strata_x8run.h"

void strata_linear_q4_Kx8(float *out, const float *x, const uint8_t *w,
                          int64_t B, int64_t N, int64_t K) {
    x8_run(out, x, w, B, N, K);
}
