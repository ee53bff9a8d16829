/* strata_q8_0x.h: what the AVX2 linear kernels with 4/5-bit weights (linear_q4_0,
 * linear_q5_0, linear_q4_1, linear_q5_1, linear_mxfp4 .avx2.c) share: x quantised to q8_0
 * as ggml's AVX2 quantize_row_q8_0 does (q8_1 for the min types: the same q_x and d_x, plus
 * s_x = fp16(amax/127 * sum q_x) with the float32 amax/127), in pairs of blocks laid out for
 * the weights, and (in strata_q8_0x_run.h) the tiled, threaded driver. Hashed with each user.
 *
 * A kernel defines BLOCK_BYTES, OFFSET (its weights are unsigned value - OFFSET) and
 *   static inline void weight_pair(const uint8_t *p, int two, __m256i *lo, __m256i *hi,
 *                                  __m256 *wd)
 * (the blocks at p and p + BLOCK_BYTES as unsigned values against an xpair, and their
 * scales) between including this header and strata_q8_0x_run.h, whose q8_0x_run(out, x,
 * w, B, N, K) does the rest; MIN_TERM 1 for blocks with an fp16 min at byte 2 (value
 * d*q + m: q4_1, q5_1); LANE_OFFSET 1 to take the offset back in every int32 lane of a
 * block's dot (-OFFSET times the sum of the 8 q_x that lane multiplies), not in one lane
 * for the whole block: every lane then holds a true partial sum of q_w*q_x. mxfp4 needs it
 * (its table values + 12 with OFFSET 12; scales up to 2^127): one lane's correction would
 * leave the others at 12 * a partial sum of q_x * the scale, which overflows or swamps the
 * row before the float32 sum of the lanes cancels it. */
#ifndef STRATA_Q8_0X_H
#define STRATA_Q8_0X_H

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_simd.h"

#define QK 32
#define RN 4              /* weight rows per group (the tile at B = 1) */
#define RNB 2             /* weight rows per tile for B > 1 */
#define RB 4              /* rows of x per tile (B > 1) */
#define CHUNK_GROUPS 16   /* weight-row groups per scheduling chunk */

/* Two consecutive 32-blocks of x (a pair), laid out for the weight pair they meet: the
 * first 16 values of block 2p | of block 2p+1 (lo), the last 16 of each (hi), the blocks'
 * scales d_x four times each, the correction c = -OFFSET * sum(q_x) in lanes 0 and 4
 * (OFFSET: what the weight format subtracts from its unsigned values) and q8_1's s_x in
 * lanes 0 and 4 (the min types' term m_w*s_x; 0 elsewhere). */
typedef struct {
    __m256i lo, hi;
    __m256 d;
    __m256i c;
    __m256 s;
} xpair;

/* One 32-block of x quantised into half `h` (0: block 2p, 1: block 2p+1) of pair `out`;
 * per_lane: c as LANE_OFFSET asks (strata_q8_0x_run.h). */
static inline void q8_0x_quantize(const float *x, xpair *out, int h, int offset,
                                  int per_lane) {
    __m256i iv[4];
    float d;
    const float amax = q8_round_block(x, iv, &d);
    const __m256i i0 = iv[0], i1 = iv[1], i2 = iv[2], i3 = iv[3];
    /* sum of the 32 values (each in [-127, 127]) from the int32 lanes */
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
    /* the packs work per 128-bit lane: dwords end up in order 0,4,1,5,2,6,3,7 */
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    const __m256i q = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    int8_t *lo = (int8_t *)&out->lo, *hi = (int8_t *)&out->hi;
    float *dd = (float *)&out->d;
    int32_t *cc = (int32_t *)&out->c;
    float *ss = (float *)&out->s;
    _mm_store_si128((__m128i *)(lo + 16 * h), _mm256_castsi256_si128(q));
    _mm_store_si128((__m128i *)(hi + 16 * h), _mm256_extracti128_si256(q, 1));
    for (int j = 0; j < 4; j++) {
        dd[4 * h + j] = d;
        cc[4 * h + j] = 0;
        ss[4 * h + j] = 0.0f;
    }
    cc[4 * h] = -offset * _mm_cvtsi128_si32(s4);
    if (per_lane) {
        /* int32 lane j of a block's dot sums the products of q_x[4j..4j+3] and
         * q_x[16+4j..16+4j+3] (vpmaddubsw, vpmaddwd over lo and hi): with a[i] = q[i] +
         * q[16+i] and b[i] = q[8+i] + q[24+i], lane j < 2 takes a[4j..4j+3], j >= 2
         * b[4(j-2)..4(j-2)+3]; two hadds leave A0 B0 A0 B0 | A1 B1 A1 B1 (the four sums). */
        const __m256i a = _mm256_add_epi32(i0, i2), b = _mm256_add_epi32(i1, i3);
        __m256i hs = _mm256_hadd_epi32(a, b);
        hs = _mm256_hadd_epi32(hs, hs);
        hs = _mm256_permutevar8x32_epi32(hs, _mm256_setr_epi32(0, 4, 1, 5, 0, 4, 1, 5));
        int32_t part[8];
        _mm256_storeu_si256((__m256i *)part, hs);
        for (int j = 0; j < 4; j++) cc[4 * h + j] = -offset * part[j];
    }
    const float s_x = (amax / 127.0f) * (float)_mm_cvtsi128_si32(s4);
    ss[4 * h] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(s_x), _MM_FROUND_TO_NEAREST_INT)));
}

/* Byte i of the result is 16 where bit i of `bits` is set, else 0 (the fifth bits of
 * q5_0/q5_1 weights). */
static inline __m256i q8_0x_fifth_bits(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread),
                                       bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10));
}

/* The fp16 values at byte `at` of the blocks at p and p + block (four lanes each; 0 for the
 * second when there is none): a weight pair's scales (at 0) or mins (at 2). */
static inline __m256 q8_0x_half_pair(const uint8_t *p, const int two, const int at,
                                     const int64_t block) {
    int16_t ha, hb = 0;
    memcpy(&ha, p + at, sizeof ha);
    if (two) memcpy(&hb, p + block + at, sizeof hb);
    return _mm256_cvtph_ps(_mm_blend_epi16(_mm_set1_epi16(ha), _mm_set1_epi16(hb), 0xF0));
}

#endif /* STRATA_Q8_0X_H */
