/* strata_x8k.h: what the SIMD x8-layout K-quant kernels (linear_q4_Kx8, linear_q6_Kx8 .avx2.c
 * and .avx512vnni.c) share around their integer dots: the 8 rows' scales and mins unpacked
 * for one group super-block, the q6_K weights of one step, the min and -32 terms, and the
 * float32 finish (f32(d_x*d) as ggml rounds it, then the FMA, lane r = output row r).
 * strata_x8.h describes the layout. Include after strata_kquant.h. Hashed with each user. */
#ifndef STRATA_X8K_H
#define STRATA_X8K_H

#include "strata_kquant.h"

/* per 32-bit lane: bytes i0 and i1 of the lane, each zero-extended to int16 */
static inline __m256i x8_lane_bytes(int i0, int i1) {
    const char z = (char)0x80;
    return _mm256_setr_epi8(i0, z, i1, z, 4 + i0, z, 4 + i1, z, 8 + i0, z, 8 + i1, z,
                            12 + i0, z, 12 + i1, z, i0, z, i1, z, 4 + i0, z, 4 + i1, z,
                            8 + i0, z, 8 + i1, z, 12 + i0, z, 12 + i1, z);
}

/* the 4 bytes at p in every 32-bit lane */
static inline __m256i x8_bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* q4_K: the 8 rows' 6-bit scales and mins, lane r holding row r's bytes for sub-blocks 0..3
 * (lo) and 4..7 (hi): get_scale_min_k4's mask-and-shift on the 3 planes of packed bytes */
typedef struct {
    __m256i sc_lo, sc_hi, mn_lo, mn_hi;
} x8_q4k_scales;

static inline x8_q4k_scales x8_q4k_unpack(const uint8_t *p) {
    const __m256i m3f = _mm256_set1_epi32(0x3F3F3F3F), m0f = _mm256_set1_epi32(0x0F0F0F0F);
    const __m256i m03 = _mm256_set1_epi32(0x03030303);
    const __m256i u0 = _mm256_loadu_si256((const __m256i *)(p + 32));
    const __m256i u1 = _mm256_loadu_si256((const __m256i *)(p + 64));
    const __m256i u2 = _mm256_loadu_si256((const __m256i *)(p + 96));
    x8_q4k_scales out;
    out.sc_lo = _mm256_and_si256(u0, m3f);
    out.mn_lo = _mm256_and_si256(u1, m3f);
    const __m256i top_sc = _mm256_and_si256(_mm256_srli_epi32(u0, 6), m03);  /* bits 4-5 */
    const __m256i top_mn = _mm256_and_si256(_mm256_srli_epi32(u1, 6), m03);
    out.sc_hi = _mm256_or_si256(_mm256_and_si256(u2, m0f), _mm256_slli_epi32(top_sc, 4));
    out.mn_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), m0f),
                                _mm256_slli_epi32(top_mn, 4));
    return out;
}

/* q4_K: acc[b] += f32(d_x*d)*sumi[b] - f32(d_x*dmin)*sum_j m_j*bsum32_j, per row lane */
static inline void x8_q4k_finish(
        __m256 acc[2], const uint8_t *p, const xsb *x, int64_t nsb, int64_t s, const __m256i
        sumi[2], const x8_q4k_scales *u, const int nb) __attribute__((always_inline));

static inline void x8_q4k_finish(
        __m256 acc[2], const uint8_t *p, const xsb *x, int64_t nsb, int64_t s, const __m256i
        sumi[2], const x8_q4k_scales *u, const int nb) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));
    const __m256i m01 = _mm256_shuffle_epi8(u->mn_lo, x8_lane_bytes(0, 1));
    const __m256i m23 = _mm256_shuffle_epi8(u->mn_lo, x8_lane_bytes(2, 3));
    const __m256i m45 = _mm256_shuffle_epi8(u->mn_hi, x8_lane_bytes(0, 1));
    const __m256i m67 = _mm256_shuffle_epi8(u->mn_hi, x8_lane_bytes(2, 3));
    for (int b = 0; b < nb; b++) {
        const xsb *xb = x + b * nsb + s;
        __m256i msum = _mm256_madd_epi16(m01, x8_bcast4(xb->bsum32));
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(m23, x8_bcast4(xb->bsum32 + 2)));
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(m45, x8_bcast4(xb->bsum32 + 4)));
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(m67, x8_bcast4(xb->bsum32 + 6)));
        const __m256 dx = _mm256_set1_ps(xb->d);
        acc[b] = _mm256_fmadd_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(sumi[b]), acc[b]);
        acc[b] = _mm256_fnmadd_ps(_mm256_mul_ps(dx, dmin), _mm256_cvtepi32_ps(msum), acc[b]);
    }
}

/* q6_K: sumi[b] = -32 * sum_j sc_j * bsum_j per row lane (the offset of q - 32, through
 * the activations' bsums); scales at p + 16 as [j][row] int8 */
static inline void x8_q6k_offsets(
        __m256i sumi[2], const uint8_t *p, const xsb *x, int64_t nsb, int64_t s, const int nb)
    __attribute__((always_inline));

static inline void x8_q6k_offsets(
        __m256i sumi[2], const uint8_t *p, const xsb *x, int64_t nsb, int64_t s, const int nb) {
    __m256i off[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int j = 0; j < 16; j += 2) {  /* (sc_j, sc_j+1) of each row against (bsum_j, _j+1) */
        const __m128i v = _mm_loadu_si128((const __m128i *)(p + 16 + 8 * j));
        const __m256i sp = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, _mm_srli_si128(v, 8)));
        for (int b = 0; b < nb; b++)
            off[b] = _mm256_add_epi32(off[b],
                                      _mm256_madd_epi16(sp, x8_bcast4(x[b * nsb + s].bsums + j)));
    }
    for (int b = 0; b < nb; b++)
        sumi[b] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off[b], 5));
}

/* q6_K: the weights (0..63) of groups 4h+0..3 at one step, from its three slices at st
 * (ql, ql + 32, qh: ggml's bit assignment, strata_q6k.h) */
static inline void x8_q6k_step(const uint8_t *st, __m256i w[4]) __attribute__((always_inline));

static inline void x8_q6k_step(const uint8_t *st, __m256i w[4]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), hmask = _mm256_set1_epi8(0x30);
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)st);
    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(st + 32));
    const __m256i hb = _mm256_loadu_si256((const __m256i *)(st + 64));
    w[0] = _mm256_or_si256(_mm256_and_si256(l0, low4),
                           _mm256_and_si256(_mm256_slli_epi16(hb, 4), hmask));
    w[1] = _mm256_or_si256(_mm256_and_si256(l1, low4),
                           _mm256_and_si256(_mm256_slli_epi16(hb, 2), hmask));
    w[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                           _mm256_and_si256(hb, hmask));
    w[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                           _mm256_and_si256(_mm256_srli_epi16(hb, 2), hmask));
}

/* q6_K: acc[b] += f32(d_x*d) * sumi[b], per row lane */
static inline void x8_q6k_finish(
        __m256 acc[2], const uint8_t *p, const xsb *x, int64_t nsb, int64_t s, const __m256i
        sumi[2], const int nb) __attribute__((always_inline));

static inline void x8_q6k_finish(
        __m256 acc[2], const uint8_t *p, const xsb *x, int64_t nsb, int64_t s, const __m256i
        sumi[2], const int nb) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    for (int b = 0; b < nb; b++) {
        const __m256 dx = _mm256_set1_ps(x[b * nsb + s].d);
        acc[b] = _mm256_fmadd_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(sumi[b]), acc[b]);
    }
}

#endif /* STRATA_X8K_H */
